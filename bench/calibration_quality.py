"""Output accuracy of every calibration method against onnxruntime's own, on the corpus's real models.

    python scripts/build_corpus.py          # once: .corpus/ (or $QACCURACY_CORPUS_DIR)
    python bench/calibration_quality.py [--models ppocr_rec,yolov8n] [--recipes u8s8,s8s8_pc]
                                        [--methods ort-minmax,...,auto] [--eval-records 128]
                                        [--calib-records N] [--json OUT]

``--models`` also takes the bench nets ``net:detector`` and ``net:mobile_detector`` (``bench/netzoo.py``,
128x128, random weights): 16 calibration images (seed 1) and the held-out ones (seed 3).

``--calib-records N`` calibrates every method on N records made by the corpus's own maker with the
calibration seed (1) instead of the corpus's ``calib`` set (8-24 records; the digits: the first N
training digits), for every method alike: how far a choice made on the calibration records carries
over depends on how many there are.

For each model and recipe, every method calibrates on the corpus's ``calib`` records and onnxruntime's
``quantize_static`` writes the QDQ model (ours through ``qaccuracy``'s calibration, onnxruntime's
``ort-minmax``/``ort-entropy``/``ort-percentile`` through its own calibrators, fed the same records by
``DatasetReader``). Each model is then run by onnxruntime on **held-out records made with another
seed** (``scripts/corpus_data.py``, seed 3; the digits' 48 held-out test digits), never the
calibration records, and compared with the fp32 model: SQNR of the worst float output
(``10 log10(sum x^2 / sum (x - q)^2)`` over all held-out records) and its cosine similarity. Each
row keeps every float output's per-record sums, from which ``--markdown`` draws a 95 % paired
bootstrap interval of ``auto``'s margin over the best of onnxruntime's calibrators.

Recipes: ``u8s8`` (uint8 activations, int8 weights per tensor: the corpus's ``qdq_u8s8``),
``s8s8_pc`` (int8 activations, int8 weights per channel: ``qdq_s8s8_pc``; opset < 13 models are
converted first, for every method alike) and ``qop_u8s8`` (the QOperator form of ``u8s8``: the
corpus's ``qop_u8s8``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

MODELS = ("ppocr_cls", "ppocr_det", "ppocr_rec", "yolov8n", "silero_vad", "minilm_l3", "digits_mlp")
METHODS = ("ort-minmax", "ort-entropy", "ort-percentile", "minmax", "percentile", "moving-average", "kl", "mse", "auto")
#: the held-out records' seed: the corpus's calibration records use 1 and its test records 2
EVAL_SEED = 3
CALIB_SEED = 1
#: each corpus model's record maker in ``scripts/corpus_data.py`` (the digits are read, not made)
MAKERS = {
    "ppocr_cls": "text_orientation",
    "ppocr_det": "text_pages",
    "ppocr_rec": "text_lines",
    "yolov8n": "scenes",
    "silero_vad": "speech",
    "minilm_l3": "sentences",
}


def held_out(name: str, count: int, folder: Path) -> Path:
    """A ``.npz`` of held-out records for a corpus model (its own maker, another seed)."""
    import corpus_data

    if name == "digits_mlp":
        inputs = corpus_data.digits("test")[0]
    else:
        inputs = getattr(corpus_data, MAKERS[name])(count, EVAL_SEED)[0]
    path = folder / f"{name}.eval.npz"
    np.savez(path, **inputs)
    return path


def calibration_records(name: str, count: int, folder: Path) -> Path:
    """A ``.npz`` of ``count`` calibration records for a corpus model: its maker, the calibration seed."""
    import corpus_data

    if name == "digits_mlp":
        from sklearn.datasets import load_digits

        if not 0 < count <= 1200:
            raise SystemExit(f"--calib-records: the digits have 1200 training records, not {count}")
        features = (load_digits().data[:count] / 16.0).astype(np.float32)
        inputs = {"input": features[:, np.newaxis]}
    else:
        inputs = getattr(corpus_data, MAKERS[name])(count, CALIB_SEED)[0]
    path = folder / f"{name}.calib.npz"
    np.savez(path, **inputs)
    return path


def bench_net(name: str, folder: Path, count: int, calib_count: int = 16) -> tuple[Path, Path, Path]:
    """A bench net (``net:detector``, ``net:mobile_detector``), its calibration and held-out images."""
    sys.path.insert(0, str(ROOT / "bench"))
    import netzoo

    kind = name.split(":", 1)[1]
    model = getattr(netzoo, kind)(folder / f"{kind}.onnx", size=128)
    calib, held = folder / f"{kind}.calib.npz", folder / f"{kind}.eval.npz"
    np.savez(calib, x=netzoo.images(calib_count, size=128, seed=CALIB_SEED)[:, 0])
    np.savez(held, x=netzoo.images(count, size=128, seed=EVAL_SEED)[:, 0])
    return model, calib, held


def model_data(name: str, folder: Path, eval_records: int, calib_records: int | None = None) -> tuple[Path, ...]:
    """A row's fp32 model, calibration records (the corpus's, or ``calib_records`` made ones) and
    held-out records: a corpus model (``$QACCURACY_CORPUS_DIR``, default ``.corpus/``) or a bench net."""
    if name.startswith("net:"):
        return bench_net(name, folder, eval_records, calib_records or 16)
    corpus = Path(os.environ.get("QACCURACY_CORPUS_DIR", ROOT / ".corpus"))
    meta = json.loads((corpus / name / "model.json").read_text())
    fp32, calib = corpus / name / "fp32.onnx", corpus / name / meta["data"]["calib"]
    if calib_records:
        calib = calibration_records(name, calib_records, folder)
    return fp32, calib, held_out(name, eval_records, folder)


def quantize(method: str, fp32: Path, calib: Path, out: Path, recipe: str) -> float:
    """Calibrate and write the QDQ model; the seconds it took."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    from pytest_qaccuracy.analysis.calibration import CalibrationOptions, compute_ranges, quantize_with_ranges
    from pytest_qaccuracy.analysis.calibration.quantize import with_opset_for
    from pytest_qaccuracy.analysis.calibration.reader import DatasetReader
    from pytest_qaccuracy.model.loading import load_model

    per_channel = recipe == "s8s8_pc"
    activation = "int8" if per_channel else "uint8"
    form = "qoperator" if recipe == "qop_u8s8" else "qdq"
    start = time.perf_counter()
    if method.startswith("ort-"):
        import onnx

        proto, _ = with_opset_for(load_model(fp32), CalibrationOptions(per_channel=per_channel))
        source = out.with_suffix(".fp32.onnx")
        onnx.save(proto, str(source))
        kind = {"ort-minmax": "MinMax", "ort-entropy": "Entropy", "ort-percentile": "Percentile"}[method]
        quantize_static(
            str(source),
            str(out),
            DatasetReader(calib, source),
            quant_format=QuantFormat.QDQ if form == "qdq" else QuantFormat.QOperator,
            per_channel=per_channel,
            activation_type=QuantType.QInt8 if per_channel else QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=getattr(CalibrationMethod, kind),
        )
    else:
        options = CalibrationOptions(
            method=method, activation_type=activation, per_channel=per_channel, quant_format=form
        )
        quantize_with_ranges(fp32, out, compute_ranges(fp32, calib, options), options)
    return time.perf_counter() - start


def outputs(model: Path, records: list[dict[str, np.ndarray]]) -> dict[str, list[np.ndarray]]:
    """Each output's values, record by record."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    runs = [session.run(names, r) for r in records]
    return {n: [np.ravel(run[i]) for run in runs] for i, n in enumerate(names)}


def per_record(reference: dict[str, list[np.ndarray]], quantized: dict[str, list[np.ndarray]]) -> dict[str, list]:
    """Each float output's ``[sum x^2, sum (x - q)^2]`` record by record: what the bootstrap resamples."""
    sums = {}
    for name, xs in reference.items():
        if xs[0].dtype.kind != "f":
            continue
        sums[name] = []
        for x, q in zip(xs, quantized[name], strict=True):
            x = x.astype(np.float64)
            sums[name].append([float(np.sum(x * x)), float(np.sum(np.square(x - q)))])
    return sums


def sqnr_of(sums: dict[str, np.ndarray]) -> float:
    """SQNR in dB of the worst output, from ``{output: (records, 2) array of [energy, noise]}``."""
    worst = np.inf
    for pairs in sums.values():
        energy, noise = pairs.sum(axis=0)
        worst = min(worst, 10 * np.log10(energy / noise) if noise > 0 else np.inf)
    return float(worst)


def margin_interval(got: dict[str, dict], resamples: int = 2000, seed: int = 0) -> tuple[float, float] | None:
    """95 % paired-bootstrap interval of ``auto``'s SQNR minus the best of onnxruntime's calibrators,
    the same held-out records drawn for every method (the best is taken again in each resample)."""
    theirs = [m for m, row in got.items() if m.startswith("ort-") and row.get("per_record")]
    if "auto" not in got or not got["auto"].get("per_record") or not theirs:
        return None
    arrays = {m: {o: np.asarray(v) for o, v in got[m]["per_record"].items()} for m in [*theirs, "auto"]}
    count = len(next(iter(arrays["auto"].values())))
    rng = np.random.default_rng(seed)
    margins = []
    for _ in range(resamples):
        pick = rng.integers(0, count, count)
        drawn = {m: {o: a[pick] for o, a in outs.items()} for m, outs in arrays.items()}
        margins.append(sqnr_of(drawn["auto"]) - max(sqnr_of(drawn[m]) for m in theirs))
    low, high = np.percentile(margins, [2.5, 97.5])
    return float(low), float(high)


def cosine(reference: dict[str, list[np.ndarray]], quantized: dict[str, list[np.ndarray]]) -> float:
    """Cosine similarity of the worst float output, over all records."""
    worst = 1.0
    for name, xs in reference.items():
        if xs[0].dtype.kind != "f":
            continue
        x, q = np.concatenate(xs).astype(np.float64), np.concatenate(quantized[name]).astype(np.float64)
        norms = np.linalg.norm(x) * np.linalg.norm(q)
        worst = min(worst, float(x @ q / norms) if norms > 0 else float(np.array_equal(x, q)))
    return worst


def markdown(rows: list[dict]) -> str:
    """One line per model and recipe: SQNR (dB) of each method, onnxruntime's best, auto's margin and,
    where the rows have their per-record sums, the margin's 95 % paired-bootstrap interval."""
    methods = list(dict.fromkeys(r["method"] for r in rows))
    table: dict[tuple[str, str], dict[str, dict]] = {}
    for r in rows:
        table.setdefault((r["model"], r["recipe"]), {})[r["method"]] = r
    head = ["model", "recipe", *methods, "onnxruntime's best", "auto - best", "95 % interval"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (model, recipe), got in table.items():
        sqnr = {m: row.get("sqnr_db") for m, row in got.items()}
        theirs = [v for m, v in sqnr.items() if m.startswith("ort-") and v is not None]
        best = max(theirs) if theirs else None
        cells = [f"{sqnr[m]:.2f}" if sqnr.get(m) is not None else "-" for m in methods]
        margin = sqnr.get("auto")
        delta = f"{margin - best:+.2f}" if margin is not None and best is not None else "-"
        interval = margin_interval(got)
        spread = f"{interval[0]:+.2f} .. {interval[1]:+.2f}" if interval else "-"
        shown = f"{best:.2f}" if best is not None else "-"
        lines.append(f"| {model} | {recipe} | " + " | ".join(cells) + f" | {shown} | {delta} | {spread} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--recipes", default="u8s8,s8s8_pc,qop_u8s8")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--eval-records", type=int, default=128)
    parser.add_argument("--calib-records", type=int, help="calibrate on this many made records, not the corpus's")
    parser.add_argument("--json", type=Path, help="write every row here")
    parser.add_argument("--markdown", type=Path, metavar="ROWS.json", help="print the table of a --json file and stop")
    args = parser.parse_args()
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return
    from pytest_qaccuracy.data import bind_dataset, load_dataset
    from pytest_qaccuracy.model.loading import graph_inputs, load_model

    rows = []
    with tempfile.TemporaryDirectory(prefix="qaccuracy-bench-") as tmp:
        folder = Path(tmp)
        for name in args.models.split(","):
            fp32, calib, data = model_data(name, folder, args.eval_records, args.calib_records)
            records = list(bind_dataset(load_dataset(data), graph_inputs(load_model(fp32))).iter_records())
            reference = outputs(fp32, records)
            for recipe in args.recipes.split(","):
                for method in args.methods.split(","):
                    out = folder / f"{name}.{recipe}.{method}.onnx"
                    try:
                        seconds = quantize(method, fp32, calib, out, recipe)
                        got = outputs(out, records)
                        sums = per_record(reference, got)
                        sqnr = sqnr_of({o: np.asarray(v) for o, v in sums.items()})
                        row = {"sqnr_db": sqnr, "cosine": cosine(reference, got), "seconds": seconds}
                        row["per_record"] = sums
                    except Exception as exc:  # a method onnxruntime refuses is a row, not the end
                        row = {"error": str(exc).splitlines()[0][:200]}
                    row |= {"model": name, "recipe": recipe, "method": method, "eval_records": len(records)}
                    row["calib_records"] = args.calib_records
                    rows.append(row)
                    if "error" in row:
                        figures = row["error"]
                    else:
                        figures = f"{row['sqnr_db']:7.2f} dB  cos {row['cosine']:.5f}  {row['seconds']:6.1f} s"
                    print(f"{name:11s} {recipe:8s} {method:15s} {figures}")
                    sys.stdout.flush()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
