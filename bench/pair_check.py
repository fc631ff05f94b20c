"""The pytest pair check's comparison, output statistics, agreement gate and sensitivity: apart or in one pass.

A pair check compares the pair layer by layer (all metrics) and measures its outputs (top-k,
``rtol``/``atol``). *two passes*: ``compare`` then ``measure_outputs`` (each model runs twice);
*one pass*: ``compare(..., measure=OutputMeasure(...))`` (each model runs once; the figures are
identical, ``tests/analysis/test_one_pass.py``). *floor*: plain inference of both models.
With ``--gate``: *gate apart* is the one pass (the quantized model on ``--backend``) then
``dataset_agreement`` (the gate's own pass: the quantized model on onnxruntime and on the integer
backend); *gate folded* is ``compare(..., measure=..., agreement=AgreementPass(...))``
(``tests/analysis/test_agreement_pass.py``).
With ``--sensitivity``: ``analyse_pair`` (ranking, sweep to cosine>=0.999, cumulative curves) running
the fp32 model itself (*sensitivity alone*) or reading the outputs a comparison kept
(*sensitivity kept*, the time of the analysis only).
Interleaved, fastest of ``--repeat`` (wall seconds after imports and model building).

Usage: python bench/pair_check.py [--net mobile] [--records 32] [--size 256] [--batch-size 8] [--repeat 3]
       [--gate [--backend integer]] [--sensitivity]
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


#: the quantized model's backend in the gate rows (``--backend``)
BACKEND = {"name": "onnxruntime"}


def gate_apart(work: Path, batch: int) -> None:
    from pytest_qaccuracy.analysis.compare import compare
    from pytest_qaccuracy.analysis.outputs import OutputMeasure
    from pytest_qaccuracy.backend.agreement import dataset_agreement
    from pytest_qaccuracy.model import ModelPair
    from pytest_qaccuracy.runtime import RuntimeOptions

    pair, options = ModelPair(work / "det.onnx", work / "det.qdq.onnx"), RuntimeOptions(batch_size=batch)
    measure = OutputMeasure([1], None, 0.1, 0.05)
    compare(pair, work / "data.h5", None, options, measure=measure, backend=BACKEND["name"])
    measure.result()
    dataset_agreement(work / "det.qdq.onnx", work / "data.h5", batch_size=batch)


def gate_folded(work: Path, batch: int) -> None:
    from pytest_qaccuracy.analysis.agreement_pass import AgreementPass
    from pytest_qaccuracy.analysis.compare import compare
    from pytest_qaccuracy.analysis.outputs import OutputMeasure
    from pytest_qaccuracy.backend.agreement import AgreementChecker
    from pytest_qaccuracy.model import ModelPair
    from pytest_qaccuracy.runtime import RuntimeOptions

    pair, options = ModelPair(work / "det.onnx", work / "det.qdq.onnx"), RuntimeOptions(batch_size=batch)
    measure, gate = OutputMeasure([1], None, 0.1, 0.05), AgreementPass(AgreementChecker(work / "det.qdq.onnx"))
    compare(pair, work / "data.h5", None, options, measure=measure, agreement=gate, backend=BACKEND["name"])
    measure.result(), gate.result()


def _analyse(work: Path, batch: int, reference) -> float:
    from pytest_qaccuracy.analysis.sensitivity_report import analyse_pair
    from pytest_qaccuracy.model import ModelPair
    from pytest_qaccuracy.runtime import RuntimeOptions

    pair, options = ModelPair(work / "det.onnx", work / "det.qdq.onnx"), RuntimeOptions(batch_size=batch)
    start = time.perf_counter()
    analyse_pair(pair, work / "data.h5", "cosine", target="cosine>=0.999", options=options, reference=reference)
    return time.perf_counter() - start


def sensitivity_alone(work: Path, batch: int) -> float:
    return _analyse(work, batch, None)


def sensitivity_kept(work: Path, batch: int) -> float:
    from pytest_qaccuracy.analysis.compare import compare
    from pytest_qaccuracy.analysis.reference_cache import ReferenceCache
    from pytest_qaccuracy.model import ModelPair
    from pytest_qaccuracy.runtime import RuntimeOptions

    pair, options = ModelPair(work / "det.onnx", work / "det.qdq.onnx"), RuntimeOptions(batch_size=batch)
    reference = ReferenceCache([f for f, _ in pair.output_pairs()])
    # the pytest session's pass (with a gate it takes the path that keeps the outputs)
    compare(pair, work / "data.h5", None, options, reference=reference, layers=False)
    assert reference.held_batches, "the comparison kept no outputs"
    return _analyse(work, batch, reference)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--net", default="mobile", choices=("mobile", "detector"))
    parser.add_argument("--records", type=int, default=32)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--gate", action="store_true", help="also the agreement gate, apart and folded")
    parser.add_argument("--sensitivity", action="store_true", help="also the sensitivity analysis")
    parser.add_argument("--backend", default="onnxruntime", choices=("onnxruntime", "integer"), help="of the gate rows")
    args = parser.parse_args()
    BACKEND["name"] = args.backend
    logging.getLogger().setLevel(logging.ERROR)
    import onnxruntime  # noqa: F401  (before the clock starts)

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        prepare(work, args.records, args.size, args.net)
        best: dict[str, float] = {}
        runs = [("floor", run_floor), ("two passes", two_passes), ("one pass", one_pass)]
        if args.gate:
            runs += [("gate apart", gate_apart), ("gate folded", gate_folded)]
        if args.sensitivity:
            runs += [("sensitivity alone", sensitivity_alone), ("sensitivity kept", sensitivity_kept)]
        for _ in range(args.repeat):
            for name, run in runs:
                start = time.perf_counter()
                timed = run(work, args.batch_size)
                seconds = timed if isinstance(timed, float) else time.perf_counter() - start
                best[name] = min(best.get(name, float("inf")), seconds)
    print(f"{args.net} {args.size}x{args.size}, {args.records} records, batch {args.batch_size}")
    for name, seconds in best.items():
        print(f"{name:>17}: {seconds:6.2f} s  {seconds / best['floor']:5.2f}x floor")


if __name__ == "__main__":
    main()
