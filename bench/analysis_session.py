"""What the end-of-session analysis adds to a failing pytest session (issue 31 item 6).

    python bench/analysis_session.py example                       # the bundled example suite
    QACCURACY_CORPUS_DIR=.corpus python bench/analysis_session.py ppocr_rec --data test
    python bench/analysis_session.py ppocr_rec --repeat 3 --option=--qaccuracy-analysis-budget=4x
    python bench/analysis_session.py chunks --blocks 12 --records 32   # what the deadline's chunks cost

Runs the same failing session side by side, alternately, as a user would (``python -m pytest`` in a
subprocess, a fresh interpreter each time): once with the plugin's defaults (analysis ``recipe``,
budget 2x each failing pair's check time) and once with ``--qaccuracy-analysis=off``. ``example``
is ``pytest example_suites`` (its broken pair is an expected failure, which the analysis covers); a
corpus model is a one-pair project: its fp32 model against ``--variant`` (default ``qdq_u8s8``,
per-tensor uint8/int8 MinMax) on its ``--data`` records, failing ``min_cosine=0.99``. Prints one row
per session kind (median wall seconds over ``--repeat`` runs) and their ratio, and the analysis'
own seconds and budget from summary.json (the pair's ``sensitivity.seconds`` and ``budget``).

``chunks`` times ``analyse_pair`` on ``bench/sensitivity.py``'s residual net (its QDQ model, 32
records, batches of 8, the fp32 outputs kept by a comparison, as in pytest) without a deadline and
with one it meets (the unbounded time times ``--slack``), alternately in this process: what running
the ranking in chunks costs when the deadline does not stop it (more passes of the cached model,
smaller experiment sessions).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

PAIR_MODULE = """
import pytest


@pytest.mark.qaccuracy(fp32={fp32!r}, quantized={quantized!r}, data={data!r}, min_cosine=0.99)
def test_pair(qaccuracy):
    qaccuracy.check()
"""


def _project(model: str, variant: str, data: str, work: Path) -> tuple[Path, list[str]]:
    """The folder to run pytest in and its arguments."""
    if model == "example":
        shutil.copytree(ROOT / "example_suites", work / "example_suites")
        return work / "example_suites", []
    entry = Path(os.environ.get("QACCURACY_CORPUS_DIR", ".corpus")).resolve() / model
    files = {"fp32": entry / "fp32.onnx", "quantized": entry / f"{variant}.onnx", "data": entry / f"{data}.npz"}
    for path in files.values():
        if not path.is_file():
            raise SystemExit(f"{path}: not found (build the corpus, or set QACCURACY_CORPUS_DIR)")
    (work / "test_pair.py").write_text(PAIR_MODULE.format(**{k: str(v) for k, v in files.items()}))
    (work / "pytest.ini").write_text("[pytest]\n")
    return work, []


def _session(folder: Path, args: list[str], out: Path) -> tuple[float, list[dict]]:
    """Wall seconds of one pytest session, and its pairs' analysis entries from summary.json."""
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--qaccuracy-artifacts-dir={out}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    began = time.perf_counter()
    done = subprocess.run([*command, *args], cwd=folder, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - began
    if done.returncode not in (0, 1):
        raise SystemExit(f"pytest exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    entries = [{"id": p["id"], **p["sensitivity"]} for p in summary["pairs"] if p.get("sensitivity")]
    return seconds, entries


def chunks(blocks: int, records: int, repeat: int, slack: float) -> None:
    """Print the median seconds of ``analyse_pair`` unbounded and with a deadline it meets, and their ratio."""
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(ROOT))
    from sensitivity import prepare

    from pytest_qaccuracy.analysis.compare import compare
    from pytest_qaccuracy.analysis.deadline import Deadline
    from pytest_qaccuracy.analysis.reference_cache import ReferenceCache
    from pytest_qaccuracy.analysis.sensitivity_report import analyse_pair
    from pytest_qaccuracy.model import ModelPair
    from pytest_qaccuracy.runtime import RuntimeOptions

    with tempfile.TemporaryDirectory(prefix="qaccuracy-bench-") as tmp:
        paths = prepare(Path(tmp), records, blocks, 32)
        pair, options = ModelPair(paths["fp32"], paths["quantized"]), RuntimeOptions(batch_size=8)

        reference = ReferenceCache([o.name for o in pair.fp32.graph.output])
        compare(pair, paths["data"], "cosine", options=options, layers=False, reference=reference)

        def timed(deadline: Deadline | None) -> tuple[float, object]:
            began = time.perf_counter()
            report = analyse_pair(
                pair,
                paths["data"],
                "cosine",
                target="cosine>=0.999",
                options=options,
                reference=reference,
                deadline=deadline,
            )
            return time.perf_counter() - began, report

        base, _ = timed(None)  # warm-up, and the deadline's scale
        free, bounded, chunked = [], [], None
        for _ in range(repeat):
            free.append(timed(None)[0])
            seconds, chunked = timed(Deadline.after(slack * base))
            bounded.append(seconds)
    nodes = len(chunked.sensitivity.nodes)
    assert chunked.stopped is None, chunked.stopped  # the deadline was met: every node measured
    a, b = statistics.median(free), statistics.median(bounded)
    head = f"chunks: {nodes} nodes, {records} records"
    print(f"{head}; no deadline {a:.2f}s, deadline {slack:g}x met {b:.2f}s, ratio {b / a:.2f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="example (the bundled suite) or a corpus model folder (ppocr_rec)")
    parser.add_argument("--variant", default="qdq_u8s8", help="the corpus model's quantized file stem")
    parser.add_argument("--data", default="test", help="the corpus model's records: test, calib or smoke")
    parser.add_argument("--repeat", type=int, default=3, help="sessions of each kind, alternated")
    parser.add_argument("--option", action="append", default=[], help="a pytest option for the default session")
    parser.add_argument("--blocks", type=int, default=12, help="chunks: residual blocks of the bench net")
    parser.add_argument("--records", type=int, default=32, help="chunks: records analysed")
    parser.add_argument("--slack", type=float, default=2.0, help="chunks: the deadline, in unbounded times")
    args = parser.parse_args(argv)
    if args.model == "chunks":
        chunks(args.blocks, args.records, args.repeat, args.slack)
        return
    with tempfile.TemporaryDirectory(prefix="qaccuracy-bench-") as tmp:
        work = Path(tmp)
        folder, base = _project(args.model, args.variant, args.data, work)
        kinds = {"analysis off": [*base, "--qaccuracy-analysis=off"], "defaults": [*base, *args.option]}
        walls: dict[str, list[float]] = {k: [] for k in kinds}
        entries: list[list[dict]] = []
        for _ in range(args.repeat):
            for kind, extra in kinds.items():
                seconds, found = _session(folder, extra, work / "out")
                walls[kind].append(seconds)
                if kind == "defaults":
                    entries.append(found)
                print(f"{kind}: {seconds:.2f}s", file=sys.stderr)
    off, on = (statistics.median(walls[k]) for k in kinds)
    print(f"{args.model}: analysis off {off:.2f}s, defaults {on:.2f}s (median of {args.repeat}), ratio {on / off:.2f}")
    for run in entries:
        for e in run:
            parts = [f"analysis {e['seconds']}s of budget {e['budget']}s"]
            if e.get("stopped") or e.get("error"):
                parts.append(e.get("stopped") or e.get("error"))
            recipe = e.get("recipe") or {}
            parts.append(
                f"recipe: {recipe.get('note') or ('met' if recipe.get('met') else 'not met')}"
                f" ({float(recipe.get('seconds') or 0):.2f}s)"
                if recipe
                else "no recipe"
            )
            print(f"  {e['id']}: " + "; ".join(parts))


if __name__ == "__main__":
    main()
