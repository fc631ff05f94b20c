"""Recipe search cost against one comparison, on a corpus pair (issue 31's bench row).

    QACCURACY_CORPUS_DIR=.corpus python bench/recipe.py ppocr_rec --target cosine>=0.99 --factor 10

Times one ``compare`` of the model's ``qdq_u8s8`` pair on the ``test`` records (what ``qaccuracy
compare`` does), then runs the recipe search (calibration on ``calib``, verdicts on ``test``) with a
budget of ``factor`` times that, and prints one row: the comparison's seconds, the search's seconds,
their ratio, the experiments run, and the best recipe's figure and cost.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a corpus model folder name, e.g. ppocr_rec")
    parser.add_argument("--target", default="cosine>=0.99")
    parser.add_argument("--factor", type=float, default=10.0, help="budget as a multiple of one comparison")
    parser.add_argument("--methods", default=None, help="calibration methods the search tries (default all)")
    args = parser.parse_args()

    from pytest_qaccuracy.analysis.compare import compare
    from pytest_qaccuracy.analysis.recipe import Budget, parse_checks, search_recipe
    from pytest_qaccuracy.model import ModelPair

    root = Path(os.environ.get("QACCURACY_CORPUS_DIR", ".corpus")) / args.model
    data = {p.stem: p for p in root.iterdir() if p.stem in ("calib", "test")}
    began = time.monotonic()
    compare(ModelPair(root / "fp32.onnx", root / "qdq_u8s8.onnx"), data["test"])
    compared = time.monotonic() - began
    began = time.monotonic()

    def on_step(step, best) -> None:
        kind = "estimate" if step.estimated else "verified"
        figure = step.measured.get("onnxruntime")
        print(
            f"  {time.monotonic() - began:6.1f}s step {step.index} [{step.phase}] {kind} {step.change[:60]}: "
            f"margin {step.margin}, {figure}, {step.seconds:.1f}s",
            file=sys.stderr,
            flush=True,
        )

    def on_note(text: str) -> None:
        print(f"  {time.monotonic() - began:6.1f}s {text}", file=sys.stderr, flush=True)

    result = search_recipe(
        root / "fp32.onnx",
        data["calib"],
        data["test"],
        parse_checks([args.target]),
        budget=Budget(seconds=compared * args.factor),
        methods=None if args.methods is None else args.methods.split(","),
        on_step=on_step,
        on_note=on_note,
    )
    searched = time.monotonic() - began
    best = result.best_step
    figure = None if best is None else best.measured.get("onnxruntime")
    print("| model | compare s | search s | ratio | experiments | met | best | cost |")
    print(
        f"| {args.model} | {compared:.1f} | {searched:.1f} | {searched / compared:.1f} | {len(result.steps)} | "
        f"{result.met} | {figure} | {None if best is None else round(best.cost, 4)} |"
    )


if __name__ == "__main__":
    main()
