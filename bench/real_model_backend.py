"""The integer backend on a real quantized model against onnxruntime, side by side, both CPU families.

    python scripts/build_corpus.py                    # once: the real-model corpus under .corpus/
    python bench/real_model_backend.py                # PP-OCRv4 text detector, QOperator, 32 records
    python bench/real_model_backend.py --model .corpus/yolov8n/qop_u8s8.onnx --data .corpus/yolov8n/calib.h5

The dataset's records are repeated up to ``--records`` and run as one batch: a model whose inputs fix
the batch at 1 runs as a copy with a free batch axis, or record by record when its graph bakes the
batch. Times are the fastest of ``--repeat`` runs, interleaved: onnxruntime's default CPU session
(what a deployment runs), the integer backend with this machine's preset (its outputs compared with
onnxruntime's bit for bit), and with the other x86 family's preset (the int16 pair saturation of
CPUs without VNNI, or exact sums), whose outputs match onnxruntime on a CPU of that family
(``tests/backend/goldens``, ``.ci/avx2``), not on this one. ``session.plan()`` says which nodes ran
where: the last line counts them.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OTHER_FAMILY = {"onnxruntime-vnni": "onnxruntime-avx2", "onnxruntime-avx2": "onnxruntime-vnni"}


def _batch(data: Path, model: Path, records: int) -> dict[str, np.ndarray]:
    """``records`` records of ``data`` (repeated when it holds fewer), stacked per model input."""
    from pytest_qaccuracy.data import bind_dataset, load_dataset
    from pytest_qaccuracy.model.loading import graph_inputs, load_model

    dataset = load_dataset(data)
    try:
        bound = bind_dataset(dataset, graph_inputs(load_model(model)))
        stacked = next(iter(bound.iter_batches(len(bound)))).stacked()
    finally:
        dataset.close()
    repeat = -(-records // len(bound))
    return {k: np.concatenate([v] * repeat)[:records] for k, v in stacked.items()}


def _free_batch(model: Path, folder: Path) -> Path | None:
    """A copy of ``model`` whose inputs and outputs take any batch (the corpus fixes it at 1 before
    ``quant_pre_process``), or None when onnxruntime cannot run the copy on two records."""
    import onnx
    import onnxruntime as ort

    proto = onnx.load(str(model))
    for value in [*proto.graph.input, *proto.graph.output]:
        dims = value.type.tensor_type.shape.dim
        if dims:
            dims[0].dim_param = "N"
    del proto.graph.value_info[:]  # inferred for batch 1; onnxruntime infers them again
    path = folder / f"{model.stem}.any_batch.onnx"
    onnx.save(proto, str(path))
    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feeds = {i.name: np.zeros([2, *i.shape[1:]], np.float32) for i in session.get_inputs()}
        session.run(None, feeds)
    except Exception:  # a graph that bakes its batch (a Reshape to fixed shapes)
        return None
    return path


def _run_all(run, feeds: dict[str, np.ndarray], per_record: bool) -> list[np.ndarray]:
    if not per_record:
        return [np.asarray(o) for o in run(feeds)]
    n = len(next(iter(feeds.values())))
    parts = [run({k: v[i : i + 1] for k, v in feeds.items()}) for i in range(n)]
    return [np.concatenate([np.asarray(p[j]) for p in parts]) for j in range(len(parts[0]))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / ".corpus/ppocr_det/qop_u8s8.onnx")
    parser.add_argument("--data", type=Path, default=None, help="default: the model folder's calib data")
    parser.add_argument("--records", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads of both (0: every core)")
    args = parser.parse_args()
    logging.getLogger().setLevel(logging.ERROR)
    if not args.model.exists():
        sys.exit(f"{args.model}: not found; build the corpus first: python scripts/build_corpus.py")
    folder = args.model.parent
    layouts = [folder / name for name in ("calib.h5", "calib.npz", "calib")]  # the corpus writes one of them
    data = args.data or next((p for p in layouts if p.exists()), None)
    if data is None:
        sys.exit(f"{folder}: no calibration data ({', '.join(p.name for p in layouts)}); pass --data")

    import onnxruntime as ort

    from pytest_qaccuracy.backend import IntegerSession

    feeds = _batch(data, args.model, args.records)
    model, fixed = args.model, False
    probe = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    if any(i.shape[0] == 1 for i in probe.get_inputs()):
        tmp = tempfile.TemporaryDirectory()
        model = _free_batch(args.model, Path(tmp.name)) or args.model
        fixed = model == args.model
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    deployed = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    host = IntegerSession(model, "onnxruntime", threads=args.threads)
    other = IntegerSession(model, OTHER_FAMILY[host.scheme.name], threads=args.threads)
    runners = {
        "onnxruntime": lambda f: deployed.run(None, f),
        host.scheme.name: lambda f: host.run(None, f),
        other.scheme.name: lambda f: other.run(None, f),
    }
    best = dict.fromkeys(runners, float("inf"))
    outputs: dict[str, list[np.ndarray]] = {}
    for _ in range(args.repeat):
        for name, run in runners.items():
            start = time.perf_counter()
            outputs[name] = _run_all(run, feeds, fixed)
            best[name] = min(best[name], time.perf_counter() - start)
    want = outputs["onnxruntime"]
    values = sum(o.size for o in want)
    mismatches = {
        name: sum(int(np.count_nonzero(a != b)) for a, b in zip(got, want, strict=True))
        for name, got in outputs.items()
    }
    where = Counter(step.runner for step in host.plan())
    print(
        f"{args.model} ({data.name}), {args.records} records"
        f"{' one by one (batch fixed at 1)' if fixed else ' as one batch'}; onnxruntime {ort.__version__}; "
        f"host preset {host.scheme.name}; {values} output values"
    )
    print("\n| runtime | time | / onnxruntime | outputs differing from this host's onnxruntime |")
    print("|---|---|---|---|")
    for name, seconds in best.items():
        note = "" if name != other.scheme.name else " (the other CPU family: expected to differ here)"
        print(f"| {name} | {seconds * 1000:.0f} ms | {seconds / best['onnxruntime']:.2f}x | {mismatches[name]}{note} |")
    if where:
        print("\nnodes by where they run (host preset): " + ", ".join(f"{k}: {v}" for k, v in sorted(where.items())))


if __name__ == "__main__":
    main()
