"""Layer-wise comparison: pytest-qaccuracy against onnxruntime's qdq_loss_debug, side by side.

Builds a conv net with 50+ Conv layers at 256x256 (``--net detector``: dense residual stages,
53 convs; ``--net mobile``: MobileNetV2-style inverted residuals with a top-down head, 54 convs;
see ``netzoo``), quantizes it with onnxruntime (QDQ, uint8 activations), and times in separate
processes, so that each peak RSS is its own:

- ``floor``: plain inference of both models over all records (no intermediate tensors);
- ``one_read``: as ``floor``, with every tensor ``compare`` matches read once inside onnxruntime
  (one ReduceMax over the whole batch per tensor, fp32 and quantized side; no statistic leaves
  onnxruntime): the least any layer-wise comparison of these tensors can cost on onnxruntime's CPU
  provider short of changing its kernels. Its graphs are built before the clock starts;
- ``one_read_fp32``: as ``one_read``, with only the fp32 model's tensors read (where the cost is);
- ``ort_debug``: qdq_loss_debug (modify_model_output_intermediate_tensors, collect_activations,
  create_activation_matching, compute_activation_error);
- ``ours_sqnr_deployed`` / ``ours_sqnr_reference``: ``compare`` computing what qdq_loss_debug
  computes, the SQNR of every matched tensor: in the default ``deployed`` capture (the quantized
  model as onnxruntime deploys it, fused integer kernels) and in ``reference`` capture (fake
  quantization with optimizations off: qdq_loss_debug's own semantics, so its SQNRs must agree);
- ``ours_reference`` / ``ours_deployed``: ``compare`` in both capture modes, all ten metrics, and
  every artifact ``qaccuracy compare --json --out-dir`` writes (JSON, visq.json, DOT, report.html);
- ``ours_deployed_big``: the same with 8x the records, to show that peak RSS does not grow;
- ``ours_numpy_sqnr_deployed`` / ``ours_numpy_deployed``: as without ``numpy``, but the layer sums
  computed in numpy from whole tensors (the path before the merged graph, and the fallback).

Each ``ours`` row says where the layer sums were computed (``ComparisonResult.reduction``).

``--net ppocr_det`` takes PP-OCRv4's text detector from the real-model corpus instead (fp32 and its
u8s8 QDQ file as ``scripts/build_corpus.py`` writes them, 128x192, batch fixed at 1; its calibration
records repeated to ``--records``).

Usage: python bench/compare_vs_ort_debug.py [--net detector] [--records 32] [--size 256] [--batch-size 8]
       [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import netzoo  # noqa: E402

METHODS = (
    "floor",
    "one_read",
    "one_read_fp32",
    "ort_debug",
    "ours_sqnr_deployed",
    "ours_sqnr_reference",
    "ours_reference",
    "ours_deployed",
    "ours_deployed_big",
    "ours_numpy_sqnr_deployed",
    "ours_numpy_deployed",
)


class _Reader:
    """CalibrationDataReader over an array of records."""

    def __init__(self, records: np.ndarray) -> None:
        self._it = iter([{"x": r} for r in records])

    def get_next(self):
        return next(self._it, None)

    def __iter__(self):  # collect_activations iterates the reader
        return self

    def __next__(self):
        item = self.get_next()
        if item is None:
            raise StopIteration
        return item


NETS = {"detector": netzoo.detector, "mobile": netzoo.mobile_detector}
#: real models of the corpus (``python scripts/build_corpus.py``): their fp32 and u8s8 QDQ files, and records
CORPUS = {"ppocr_det": HERE.parent / ".corpus" / "ppocr_det"}


def _prepare_corpus(work: Path, records: int, net: str) -> None:
    """A corpus model as built there (batch fixed at 1), and its calibration records repeated to ``records``."""
    import shutil

    import h5py

    folder = CORPUS[net]
    if not (folder / "qdq_u8s8.onnx").exists():
        sys.exit(f"{folder}: not built; run python scripts/build_corpus.py")
    shutil.copy(folder / "fp32.onnx", work / "det.onnx")
    shutil.copy(folder / "qdq_u8s8.onnx", work / "det.qdq.onnx")
    source = sorted((folder / "calib" / "x").glob("*.npy"), key=lambda f: int(f.stem))
    for name, count in (("data", records), ("data_big", records * 8)):
        with h5py.File(work / f"{name}.h5", "w") as f:
            for i in range(count):
                f.create_dataset(f"value/{i}/0", data=np.load(source[i % len(source)]))


def prepare(work: Path, records: int, size: int, net: str = "detector") -> None:
    import h5py
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    logging.getLogger().setLevel(logging.ERROR)
    if net in CORPUS:
        _prepare_corpus(work, records, net)
        return
    fp32 = NETS[net](work / "det.onnx", size=size)
    quantize_static(
        str(fp32),
        str(work / "det.qdq.onnx"),
        _Reader(netzoo.images(16, size, seed=7)),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
    )
    for name, count in (("data", records), ("data_big", records * 8)):
        with h5py.File(work / f"{name}.h5", "w") as f:
            for start in range(0, count, 32):  # write in chunks: never hold the big set in memory
                chunk = netzoo.images(min(32, count - start), size, seed=100 + start)
                for i, r in enumerate(chunk):
                    f.create_dataset(f"value/{start + i}/0", data=r)


def _records(work: Path, name: str = "data") -> np.ndarray:
    import h5py

    with h5py.File(work / f"{name}.h5", "r") as f:
        return np.stack([f["value"][str(i)]["0"][()] for i in range(len(f["value"]))])


def _read_once(work: Path, quantized: bool = True) -> tuple[str, str]:
    """Both models with a ReduceMax on every tensor ``compare`` matches (fp32 and ``deployed`` capture
    names; the quantized model untouched unless ``quantized``), saved beside them; their file names."""
    import onnx

    from pytest_qaccuracy.model import ModelPair

    pair = ModelPair(work / "det.onnx", work / "det.qdq.onnx")
    sides = (
        (pair.fp32, [m.fp32 for m in pair.matching.matches], "read_fp32.onnx"),
        (pair.quantized, [m.capture for m in pair.matching.matches], "read_qdq.onnx"),
    )
    for model, names, file in sides:
        augmented = onnx.ModelProto()
        augmented.CopyFrom(model)
        for i, name in enumerate(dict.fromkeys(names)):
            augmented.graph.node.append(onnx.helper.make_node("ReduceMax", [name], [f"read_{i}"], keepdims=0))
            augmented.graph.output.append(onnx.ValueInfoProto(name=f"read_{i}"))
        onnx.save(augmented, str(work / file))
    return "read_fp32.onnx", "read_qdq.onnx" if quantized else "det.qdq.onnx"


def run_floor(work: Path, batch: int, models: tuple[str, str] = ("det.onnx", "det.qdq.onnx")) -> dict:
    import onnxruntime as ort

    x = _records(work)
    start = time.perf_counter()
    for model in models:
        session = ort.InferenceSession(str(work / model), providers=["CPUExecutionProvider"])
        stacked = x.reshape(len(x), *x.shape[2:])
        step = 1 if session.get_inputs()[0].shape[0] == 1 else batch  # a model that fixes its batch at 1
        for i in range(0, len(stacked), step):
            session.run(None, {"x": stacked[i : i + step]})
    return {"seconds": time.perf_counter() - start}


def run_ort_debug(work: Path, batch: int) -> dict:
    from onnxruntime.quantization import qdq_loss_debug as dbg

    x = _records(work)
    start = time.perf_counter()
    dbg.modify_model_output_intermediate_tensors(str(work / "det.onnx"), str(work / "aug_fp32.onnx"))
    dbg.modify_model_output_intermediate_tensors(str(work / "det.qdq.onnx"), str(work / "aug_qdq.onnx"))
    float_acts = dbg.collect_activations(str(work / "aug_fp32.onnx"), _Reader(x))
    qdq_acts = dbg.collect_activations(str(work / "aug_qdq.onnx"), _Reader(x))
    matched = dbg.create_activation_matching(qdq_acts, float_acts)
    errors = dbg.compute_activation_error(matched)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tensors": len(errors), "xmodel_sqnr": {k: v["xmodel_err"] for k, v in errors.items()}}


def run_ours(
    work: Path,
    batch: int,
    capture: str,
    data: str = "data",
    metrics: list[str] | None = None,
    numpy_sums: bool = False,
) -> dict:
    import onnxruntime  # noqa: F401  (imported before the clock starts, as in the other methods)

    import pytest_qaccuracy.analysis.compare as compare_module
    from pytest_qaccuracy.model import ModelPair
    from pytest_qaccuracy.report.artifacts import write_comparison_artifacts
    from pytest_qaccuracy.runtime import RuntimeOptions

    if numpy_sums:  # the whole-tensor path: the merged graph never built
        compare_module.start_reduced = lambda *args: (None, "numpy: the bench's whole-tensor rows")
    start = time.perf_counter()
    pair = ModelPair(work / "det.onnx", work / "det.qdq.onnx")
    options = RuntimeOptions(batch_size=batch)
    result = compare_module.compare(pair, work / f"{data}.h5", metrics=metrics, options=options, capture=capture)
    if metrics is None:  # every artifact, as qaccuracy compare --json --out-dir writes them
        write_comparison_artifacts(result, pair.fp32, json_path=work / f"{capture}.json", out_dir=work / "artifacts")
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "tensors": len(result.layers),
        "records": result.records,
        "reduction": result.reduction,
        "sqnr": {layer.tensor: layer.metrics["sqnr"] for layer in result.layers},
    }


def worker(method: str, work: Path, batch: int) -> None:
    if method == "floor":
        out = run_floor(work, batch)
    elif method.startswith("one_read"):
        out = run_floor(work, batch, _read_once(work, quantized=method == "one_read"))
    elif method == "ort_debug":
        out = run_ort_debug(work, batch)
    elif method == "ours_numpy_sqnr_deployed":
        out = run_ours(work, batch, "deployed", metrics=["sqnr"], numpy_sums=True)
    elif method == "ours_numpy_deployed":
        out = run_ours(work, batch, "deployed", numpy_sums=True)
    elif method.startswith("ours_sqnr_"):
        out = run_ours(work, batch, method.removeprefix("ours_sqnr_"), metrics=["sqnr"])
    elif method == "ours_deployed_big":
        out = run_ours(work, batch, "deployed", "data_big")
    else:
        out = run_ours(work, batch, method.removeprefix("ours_"))
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))


def _run_worker(method: str, work: Path, batch: int) -> dict:
    """One method in a fresh process (so its peak RSS is its own); its JSON line."""
    command = [sys.executable, __file__, "--worker", method, "--work", str(work), "--batch-size", str(batch)]
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode:
        sys.exit(f"{method} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--net", choices=(*NETS, *CORPUS), default="detector")
    parser.add_argument("--records", type=int, default=32)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--repeat", type=int, default=1, help="runs per method: fastest wall time, largest RSS")
    parser.add_argument("--worker", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    methods = args.methods.split(",")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        parser.error(f"unknown --methods {', '.join(unknown)}; choose from {', '.join(METHODS)}")
    if args.worker:
        worker(args.worker, args.work, args.batch_size)
        return
    from tabulate import tabulate

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        prepare(work, args.records, args.size, args.net)
        print(
            f"model: {args.net}, {netzoo.count_convs(work / 'det.onnx')} Conv layers, "
            f"input {'as built' if args.net in CORPUS else f'3x{args.size}x{args.size}'}, "
            f"{args.records} records, batch {args.batch_size}"
        )
        results: dict[str, dict] = {}
        for _ in range(args.repeat):  # methods interleaved, so a busy moment does not favour one of them
            for method in methods:
                out = _run_worker(method, work, args.batch_size)
                best = results.setdefault(method, out)
                if out["seconds"] < best["seconds"]:
                    results[method] = {**out, "peak_rss_mb": max(out["peak_rss_mb"], best["peak_rss_mb"])}
                else:
                    best["peak_rss_mb"] = max(out["peak_rss_mb"], best["peak_rss_mb"])
    floor = results.get("floor", {}).get("seconds")
    debug = results.get("ort_debug", {}).get("seconds")
    rows = []
    for method, r in results.items():
        records = args.records * (8 if method.endswith("_big") else 1)
        rows.append(
            [
                method,
                records,
                f"{r['seconds']:.2f}",
                f"{r['peak_rss_mb']:.0f}",
                f"{r['seconds'] / floor:.2f}x" if floor else "",
                f"{r['seconds'] / debug:.3f}x" if debug and method.startswith("ours") else "",
            ]
        )
    print(tabulate(rows, headers=["method", "records", "wall s", "peak RSS MB", "vs floor", "vs ort_debug"]))
    for method, r in results.items():
        if r.get("reduction"):
            print(f"{method}: layer sums: {r['reduction']}")
    for method in ("ours_sqnr_reference", "ours_reference"):
        if "ort_debug" in results and method in results:
            theirs, ours = results["ort_debug"]["xmodel_sqnr"], results[method]["sqnr"]
            common = [k for k in theirs if k in ours and ours[k] is not None]
            diff = max(abs(theirs[k] - ours[k]) for k in common) if common else float("nan")
            print(f"SQNR of {method} vs qdq_loss_debug on {len(common)} common tensors: max |diff| = {diff:.2e} dB")
    if "ours_deployed" in results and "ours_deployed_big" in results:
        small, big = results["ours_deployed"]["peak_rss_mb"], results["ours_deployed_big"]["peak_rss_mb"]
        print(f"peak RSS with {args.records * 8} records / with {args.records}: {big / small:.3f}")


if __name__ == "__main__":
    main()
