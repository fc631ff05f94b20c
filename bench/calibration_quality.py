"""Output accuracy of every calibration method against onnxruntime's own, on the corpus's real models.

    python scripts/build_corpus.py          # once: .corpus/ (or $QACCURACY_CORPUS_DIR)
    python bench/calibration_quality.py [--models ppocr_rec,yolov8n] [--recipes u8s8,s8s8_pc]
                                        [--methods ort-minmax,...,auto] [--eval-records 16] [--json OUT]

For each model and recipe, every method calibrates on the corpus's ``calib`` records and onnxruntime's
``quantize_static`` writes the QDQ model (ours through ``qaccuracy``'s calibration, onnxruntime's
``ort-minmax``/``ort-entropy``/``ort-percentile`` through its own calibrators, fed the same records by
``DatasetReader``). Each model is then run by onnxruntime on **held-out records made with another
seed** (``scripts/corpus_data.py``, seed 3; the digits' 48 held-out test digits), never the
calibration records, and compared with the fp32 model: SQNR of the worst float output
(``10 log10(sum x^2 / sum (x - q)^2)`` over all held-out records) and its cosine similarity.

Recipes: ``u8s8`` (uint8 activations, int8 weights per tensor: the corpus's ``qdq_u8s8``) and
``s8s8_pc`` (int8 activations, int8 weights per channel: ``qdq_s8s8_pc``; opset < 13 models are
converted first, for every method alike).
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


def held_out(name: str, count: int, folder: Path) -> Path:
    """A ``.npz`` of held-out records for a corpus model (its own maker, another seed)."""
    import corpus_data

    makers = {
        "ppocr_cls": corpus_data.text_orientation,
        "ppocr_det": corpus_data.text_pages,
        "ppocr_rec": corpus_data.text_lines,
        "yolov8n": corpus_data.scenes,
        "silero_vad": corpus_data.speech,
        "minilm_l3": corpus_data.sentences,
    }
    inputs = corpus_data.digits("test")[0] if name == "digits_mlp" else makers[name](count, EVAL_SEED)[0]
    path = folder / f"{name}.eval.npz"
    np.savez(path, **inputs)
    return path


def quantize(method: str, fp32: Path, calib: Path, out: Path, recipe: str) -> float:
    """Calibrate and write the QDQ model; the seconds it took."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    from pytest_qaccuracy.analysis.calibration import CalibrationOptions, compute_ranges, quantize_with_ranges
    from pytest_qaccuracy.analysis.calibration.quantize import with_opset_for
    from pytest_qaccuracy.analysis.calibration.reader import DatasetReader
    from pytest_qaccuracy.model.loading import load_model

    per_channel = recipe == "s8s8_pc"
    activation = "int8" if per_channel else "uint8"
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
            quant_format=QuantFormat.QDQ,
            per_channel=per_channel,
            activation_type=QuantType.QInt8 if per_channel else QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=getattr(CalibrationMethod, kind),
        )
    else:
        options = CalibrationOptions(method=method, activation_type=activation, per_channel=per_channel)
        quantize_with_ranges(fp32, out, compute_ranges(fp32, calib, options), options)
    return time.perf_counter() - start


def outputs(model: Path, records: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    runs = [session.run(names, r) for r in records]
    return {n: np.concatenate([np.ravel(run[i]) for run in runs]) for i, n in enumerate(names)}


def accuracy(reference: dict[str, np.ndarray], quantized: dict[str, np.ndarray]) -> tuple[float, float]:
    """(SQNR in dB, cosine) of the worst float output."""
    sqnr, cosine = np.inf, 1.0
    for name, x in reference.items():
        if x.dtype.kind != "f":
            continue
        x, q = x.astype(np.float64), quantized[name].astype(np.float64)
        noise = np.sum((x - q) ** 2)
        sqnr = min(sqnr, 10 * np.log10(np.sum(x * x) / noise) if noise > 0 else np.inf)
        norms = np.linalg.norm(x) * np.linalg.norm(q)
        cosine = min(cosine, float(x @ q / norms) if norms > 0 else float(np.array_equal(x, q)))
    return float(sqnr), cosine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--recipes", default="u8s8,s8s8_pc")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--eval-records", type=int, default=16)
    parser.add_argument("--json", type=Path, help="write every row here")
    args = parser.parse_args()
    from pytest_qaccuracy.data import bind_dataset, load_dataset
    from pytest_qaccuracy.model.loading import graph_inputs, load_model

    corpus = Path(os.environ.get("QACCURACY_CORPUS_DIR", ROOT / ".corpus"))
    rows = []
    with tempfile.TemporaryDirectory(prefix="qaccuracy-bench-") as tmp:
        folder = Path(tmp)
        for name in args.models.split(","):
            meta = json.loads((corpus / name / "model.json").read_text())
            fp32, calib = corpus / name / "fp32.onnx", corpus / name / meta["data"]["calib"]
            data = held_out(name, args.eval_records, folder)
            records = list(bind_dataset(load_dataset(data), graph_inputs(load_model(fp32))).iter_records())
            reference = outputs(fp32, records)
            for recipe in args.recipes.split(","):
                for method in args.methods.split(","):
                    out = folder / f"{name}.{recipe}.{method}.onnx"
                    try:
                        seconds = quantize(method, fp32, calib, out, recipe)
                        sqnr, cosine = accuracy(reference, outputs(out, records))
                        row = {"sqnr_db": sqnr, "cosine": cosine, "seconds": seconds}
                    except Exception as exc:  # a method onnxruntime refuses is a row, not the end
                        row = {"error": str(exc).splitlines()[0][:200]}
                    row |= {"model": name, "recipe": recipe, "method": method, "eval_records": len(records)}
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
