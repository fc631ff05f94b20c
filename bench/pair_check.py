"""The pytest pair check's comparison and output statistics: two passes over the data, or one.

A pair check compares the pair layer by layer (all metrics) and measures its outputs (top-k,
``rtol``/``atol``). *two passes*: ``compare`` then ``measure_outputs`` (each model runs twice);
*one pass*: ``compare(..., measure=OutputMeasure(...))`` (each model runs once; the figures are
identical, ``tests/analysis/test_one_pass.py``). *floor*: plain inference of both models.
Interleaved, fastest of ``--repeat`` (wall seconds after imports and model building).

Usage: python bench/pair_check.py [--net mobile] [--records 32] [--size 256] [--batch-size 8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from compare_vs_ort_debug import prepare, run_floor  # noqa: E402


def two_passes(work: Path, batch: int) -> None:
    from pytest_qaccuracy.analysis.compare import compare
    from pytest_qaccuracy.analysis.outputs import measure_outputs
    from pytest_qaccuracy.model import ModelPair
    from pytest_qaccuracy.runtime import RuntimeOptions

    pair, options = ModelPair(work / "det.onnx", work / "det.qdq.onnx"), RuntimeOptions(batch_size=batch)
    compare(pair, work / "data.h5", None, options)
    measure_outputs(pair, work / "data.h5", [1], None, 0.1, 0.05, options)


def one_pass(work: Path, batch: int) -> None:
    from pytest_qaccuracy.analysis.compare import compare
    from pytest_qaccuracy.analysis.outputs import OutputMeasure
    from pytest_qaccuracy.model import ModelPair
    from pytest_qaccuracy.runtime import RuntimeOptions

    pair, options = ModelPair(work / "det.onnx", work / "det.qdq.onnx"), RuntimeOptions(batch_size=batch)
    measure = OutputMeasure([1], None, 0.1, 0.05)
    compare(pair, work / "data.h5", None, options, measure=measure)
    measure.result()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--net", default="mobile", choices=("mobile", "detector"))
    parser.add_argument("--records", type=int, default=32)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    logging.getLogger().setLevel(logging.ERROR)
    import onnxruntime  # noqa: F401  (before the clock starts)

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        prepare(work, args.records, args.size, args.net)
        best: dict[str, float] = {}
        for _ in range(args.repeat):
            for name, run in (("floor", run_floor), ("two passes", two_passes), ("one pass", one_pass)):
                start = time.perf_counter()
                run(work, args.batch_size)
                best[name] = min(best.get(name, float("inf")), time.perf_counter() - start)
    print(f"{args.net} {args.size}x{args.size}, {args.records} records, batch {args.batch_size}")
    for name, seconds in best.items():
        print(f"{name:>10}: {seconds:6.2f} s  {seconds / best['floor']:5.2f}x floor")


if __name__ == "__main__":
    main()
