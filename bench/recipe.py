"""Recipe search cost against one comparison, and its recipe against the greedy float list (issue 31).

    QACCURACY_CORPUS_DIR=.corpus python bench/recipe.py ppocr_rec --target cosine>=0.99 --factor 10
    QACCURACY_CORPUS_DIR=.corpus python bench/recipe.py yolov8n --variant qdq_s8s8_pc --greedy
    python bench/recipe.py detector --target cosine>=0.999 --greedy        # a bench net (netzoo)

Times one ``compare`` of the pair (the corpus model's ``--variant``, default ``qdq_u8s8``, on its
``test`` records, what ``qaccuracy compare`` does; a bench net: its onnxruntime QDQ model, uint8/int8
per-tensor MinMax, on 16 held-out images), then runs the recipe search from the pair's own choices
(calibration on ``calib``, verdicts on ``test``) with a budget of ``factor`` times that (``--factor 0``:
unbounded). Prints one row: the comparison's seconds, the search's, their ratio, the experiments
(verified) and estimates, the best recipe's figure and cost (``--cost``: the weights, as ``qaccuracy
recipe``'s; rows measured before 2026-11-29 used ``--cost int16=0.5``, the default then). ``--greedy``
adds today's greedy suggestion (``qaccuracy sensitivity --sweep --target``: the ranked nodes kept in
float one by one on the quantized graph, up to 10) with its cost in the same cost model, its sweep's
figure (an estimate) and the figure of its list written by ``quantize_static(nodes_to_exclude=...)``
from the pair's own choices and measured on the held-out records. Progress on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

BENCH_NETS = ("detector", "mobile")


def _bench_net(net: str, work: Path, size: int) -> dict[str, Path]:
    """A bench net quantized as ``compare_vs_ort_debug.prepare`` does, with calibration (its 16
    images) and held-out (16 other images) records as npz files."""
    import netzoo
    import numpy as np
    from compare_vs_ort_debug import NETS, prepare

    prepare(work, 16, size, net)
    calib, held = netzoo.images(16, size, seed=7), netzoo.images(16, size, seed=1000)
    fp32 = work / "det.onnx"
    if not fp32.exists():  # prepare names every net's files the same way
        NETS[net](fp32, size=size)
    np.savez(work / "calib.npz", x=np.stack(calib))
    np.savez(work / "test.npz", x=np.stack(held))
    return {"fp32": fp32, "quantized": work / "det.qdq.onnx", "calib": work / "calib.npz", "test": work / "test.npz"}


def _greedy(paths: dict[str, Path], target: str, weights: dict[str, float]) -> tuple[str, float | None, object, object]:
    """Today's greedy suggestion on the quantized graph: its text, its cost, the sweep's figure (an
    estimate: every edge of a listed node dequantized), and the figure of the same list written by
    ``quantize_static(nodes_to_exclude=...)`` with the pair's own choices, measured on the held-out
    records (what a user who pastes the list gets; None when there is no list)."""
    from pytest_qaccuracy.analysis.recipe.build import RecipeBuilder
    from pytest_qaccuracy.analysis.recipe.checks import parse_checks
    from pytest_qaccuracy.analysis.recipe.cost import CostModel, node_work
    from pytest_qaccuracy.analysis.recipe.measure import Evaluator
    from pytest_qaccuracy.analysis.recipe.pair import starting_recipe
    from pytest_qaccuracy.analysis.sensitivity_report import analyse_pair
    from pytest_qaccuracy.model import ModelPair
    from pytest_qaccuracy.model.loading import load_model
    from pytest_qaccuracy.runtime import RuntimeOptions

    report = analyse_pair(ModelPair(paths["fp32"], paths["quantized"]), paths["test"], "cosine", target=target)
    sweep = report.sweep
    if sweep is None or sweep.suggestion is None:
        best = sweep.steps[-1].metrics if sweep is not None and sweep.steps else None
        return sweep.nodes_to_exclude() if sweep is not None else "no sweep", None, best, None
    cost = CostModel(node_work(load_model(paths["fp32"])), **weights)
    recipe = replace(starting_recipe(paths["quantized"]), float=frozenset(sweep.suggestion))
    out = Path(tempfile.mkdtemp(prefix="qaccuracy-bench-greedy-")) / "greedy.onnx"
    RecipeBuilder(paths["fp32"], paths["calib"], RuntimeOptions()).write(recipe, out)
    verdict = Evaluator(paths["fp32"], paths["test"], parse_checks([target]), ["onnxruntime"], RuntimeOptions())
    return sweep.nodes_to_exclude(), cost.relative(recipe), sweep.steps[-1].metrics, verdict.measure(out).measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "model", help=f"a corpus model folder name (ppocr_rec) or a bench net ({', '.join(BENCH_NETS)})"
    )
    parser.add_argument("--variant", default="qdq_u8s8", help="the corpus model's quantized file stem")
    parser.add_argument("--target", default="cosine>=0.99")
    parser.add_argument("--factor", type=float, default=10.0, help="budget as a multiple of one comparison (0: none)")
    parser.add_argument("--methods", default=None, help="calibration methods the search tries (default all)")
    parser.add_argument("--cost", default="int16=1,float=1", help="cost weights, as qaccuracy recipe's --cost")
    parser.add_argument("--size", type=int, default=64, help="a bench net's image size")
    parser.add_argument("--greedy", action="store_true", help="also run today's greedy --sweep/--target")
    args = parser.parse_args()

    from pytest_qaccuracy.analysis.compare import compare
    from pytest_qaccuracy.analysis.recipe import Budget, parse_checks, search_recipe
    from pytest_qaccuracy.analysis.recipe.cost import parse_weights
    from pytest_qaccuracy.analysis.recipe.pair import starting_recipe
    from pytest_qaccuracy.model import ModelPair

    weights = parse_weights(args.cost)
    work = Path(tempfile.mkdtemp(prefix="qaccuracy-bench-recipe-"))
    if args.model in BENCH_NETS:
        paths = _bench_net(args.model, work, args.size)
    else:
        root = Path(os.environ.get("QACCURACY_CORPUS_DIR", ".corpus")) / args.model
        found = {p.stem: p for p in root.iterdir() if p.stem in ("calib", "test")}
        paths = {"fp32": root / "fp32.onnx", "quantized": root / f"{args.variant}.onnx", **found}
    began = time.monotonic()
    result = compare(ModelPair(paths["fp32"], paths["quantized"]), paths["test"])
    compared = time.monotonic() - began
    pair_cosine = min(o.metrics.get("cosine", float("nan")) for o in result.outputs)
    print(
        f"pair {args.model} {paths['quantized'].name}: compare {compared:.1f}s, cosine {pair_cosine:.6g}",
        file=sys.stderr,
    )
    if args.greedy:
        began = time.monotonic()
        text, cost, best, verified = _greedy(paths, args.target, weights)
        print(
            f"greedy ({time.monotonic() - began:.1f}s): {text[:300]}; cost {cost}; last step {best} (estimated); "
            f"quantize_static with this list: {verified}",
            file=sys.stderr,
        )
    began = time.monotonic()

    def on_step(step, best) -> None:
        kind = "estimate" if step.estimated else "verified"
        figure = step.measured.get("onnxruntime")
        print(
            f"  {time.monotonic() - began:6.1f}s step {step.index} [{step.phase}] {kind} {step.change[:60]}: "
            f"margin {step.margin}, cost {step.cost:.4g}, {figure}, {step.seconds:.1f}s"
            + (f", skipped: {step.skipped}" if step.skipped else ""),
            file=sys.stderr,
            flush=True,
        )

    def on_note(text: str) -> None:
        print(f"  {time.monotonic() - began:6.1f}s {text}", file=sys.stderr, flush=True)

    result = search_recipe(
        paths["fp32"],
        paths["calib"],
        paths["test"],
        parse_checks([args.target]),
        start=starting_recipe(paths["quantized"]),
        budget=Budget(seconds=compared * args.factor) if args.factor > 0 else None,
        methods=None if args.methods is None else args.methods.split(","),
        weights=weights,
        on_step=on_step,
        on_note=on_note,
    )
    searched = time.monotonic() - began
    best = result.best_step
    figure = None if best is None else best.measured.get("onnxruntime")
    verified = sum(not s.estimated for s in result.steps)
    print("| model | compare s | search s | ratio | experiments (estimates) | met | best | cost |")
    print(
        f"| {args.model} | {compared:.1f} | {searched:.1f} | {searched / compared:.1f} | {verified} "
        f"({len(result.steps) - verified}) | {result.met} | {figure} | "
        f"{None if best is None else round(best.cost, 4)} |"
    )
    if best is not None:
        recipe = best.recipe
        print(
            f"recipe: method={recipe.method} per_channel={recipe.per_channel} reduce_range={recipe.reduce_range} "
            f"activation_type={recipe.activation_type} weight_type={recipe.weight_type} float={len(recipe.float)} "
            f"int16={len(recipe.int16)} ({sorted(recipe.float)[:8]}...)"
        )


if __name__ == "__main__":
    main()
