"""The emulated integer backend, every preset, on the QDQ and QOperator forms of every model."""

from __future__ import annotations

import json
import math

import pytest
from corpus_helpers import MODEL_NAMES, VARIANTS, run_cli

from pytest_qaccuracy.presets import NAMES

pytestmark = pytest.mark.corpus


@pytest.mark.parametrize("variant", ["qdq_u8s8", "qop_u8s8"])
@pytest.mark.parametrize("preset", NAMES)
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_integer_backend(corpus, name, preset, variant, tmp_path, capsys):
    """The quantized model on the integer backend against fp32: outputs with finite metrics or a reason."""
    entry = corpus[name]
    out = tmp_path / "result.json"
    argv = ["compare", entry.fp32, entry.model(variant), "--data", entry.data("smoke"), "--backend", "integer"]
    argv += ["--scheme", preset]
    code, _, stderr = run_cli([*argv, "--outputs-only", "--metrics", "cosine,sqnr", "--json", out], capsys)
    assert code == 0, stderr
    assert "Traceback" not in stderr and "Warning" not in stderr, stderr
    result = json.loads(out.read_text())
    assert result["backend"] == "integer"
    for output in result["outputs"]:
        for metric, value in output["metrics"].items():
            assert (value is not None and math.isfinite(value)) or output["undefined"].get(metric), output


@pytest.mark.parametrize("session", ["default", "qdqisint8allowed"])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_host_preset_is_bit_exact_with_onnxruntime(corpus, name, variant, session):
    """The ``onnxruntime`` preset (the probe's answer: this host's CPU family) against this host's
    onnxruntime with the same session options, record by record, on every model, variant and session
    option, over the test records: not one output value differs (issue 32).

    In the default session onnxruntime turns single int8 Q -> DQ pairs into uint8 and leaves int8 and
    mixed-type Conv/MatMul/Gemm groups in float (the preset's ``qdq_int8_to_uint8``); with
    ``session.qdqisint8allowed=1`` it fuses int8 groups as int8 (the preset told so). Float ops run on
    this host's onnxruntime (docs/backend.md).
    """
    import numpy as np

    from pytest_qaccuracy.backend import IntegerSession, get_scheme
    from pytest_qaccuracy.data import bind_dataset, load_dataset
    from pytest_qaccuracy.model.batch import stacking
    from pytest_qaccuracy.model.loading import graph_inputs, load_model
    from pytest_qaccuracy.ort_session import make_session

    entry = corpus[name]
    model, _ = stacking(load_model(entry.model(variant)))
    scheme = get_scheme("onnxruntime")
    config = {}
    if session == "qdqisint8allowed":
        scheme = scheme.replace(name=scheme.name, qdq_int8_to_uint8=False)
        config = {"session.qdqisint8allowed": "1"}
    deployed = make_session(model, config=config)
    emulated = IntegerSession(model, scheme)
    names = [o.name for o in deployed.get_outputs()]
    differing: dict[str, int] = {}
    values = 0
    dataset = load_dataset(entry.data("test"))
    try:
        for batch in bind_dataset(dataset, graph_inputs(model)).iter_batches(1):
            feeds = batch.stacked()
            for output, want, got in zip(names, deployed.run(names, feeds), emulated.run(names, feeds), strict=True):
                values += np.asarray(want).size
                count = int(np.count_nonzero(np.asarray(want) != np.asarray(got)))
                if count:
                    differing[output] = differing.get(output, 0) + count
    finally:
        dataset.close()
    assert values and not differing, f"{name} {variant} {session}: {differing} of {values} values differ"


def _quantize_corpus(entry, tmp_path, **options):
    """``entry``'s fp32 model quantized by onnxruntime's ``quantize_static`` (QDQ) on its calibration
    records, with ``options`` (activation and weight types)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    from pytest_qaccuracy.data import bind_dataset, load_dataset
    from pytest_qaccuracy.model.loading import graph_inputs, load_model

    fp32 = load_model(entry.fp32)
    dataset = load_dataset(entry.data("calib"))
    try:
        feeds = [batch.stacked() for batch in bind_dataset(dataset, graph_inputs(fp32)).iter_batches(1)]
    finally:
        dataset.close()

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.records = iter(feeds)

        def get_next(self):
            return next(self.records, None)

    out = tmp_path / "typed.onnx"
    quantize_static(str(entry.fp32), str(out), Reader(), quant_format=QuantFormat.QDQ, **options)
    return out


@pytest.mark.parametrize("activations", ["QInt16", "QUInt16"])
def test_16_bit_activations_on_a_real_model_are_bit_exact(corpus, activations, tmp_path):
    """The corpus MLP with 16-bit activations and int8 weights, as ``quantize_static`` writes it: the host
    preset computes onnxruntime's default session to the bit (onnxruntime 1.32 fuses these MatMuls into
    ``MatMulNBits``, which the host preset runs as onnxruntime does; issue 32 item 3)."""
    import numpy as np
    from onnxruntime.quantization import QuantType

    from pytest_qaccuracy.backend import IntegerSession
    from pytest_qaccuracy.data import bind_dataset, load_dataset
    from pytest_qaccuracy.model.loading import graph_inputs, load_model
    from pytest_qaccuracy.ort_session import make_session

    entry = corpus["digits_mlp"]
    path = _quantize_corpus(
        entry, tmp_path, activation_type=getattr(QuantType, activations), weight_type=QuantType.QInt8
    )
    model = load_model(path)
    deployed, emulated = make_session(model), IntegerSession(model)
    names = [o.name for o in deployed.get_outputs()]
    dataset = load_dataset(entry.data("test"))
    values = differing = 0
    try:
        for batch in bind_dataset(dataset, graph_inputs(model)).iter_batches(1):
            feeds = batch.stacked()
            for want, got in zip(deployed.run(names, feeds), emulated.run(names, feeds), strict=True):
                values += np.asarray(want).size
                differing += int(np.count_nonzero(np.asarray(want) != np.asarray(got)))
    finally:
        dataset.close()
    assert values and differing == 0, f"{differing} of {values} values differ"


def test_int4_weights_from_quantize_static_are_refused_naming_the_type(corpus, tmp_path, capsys):
    """int4 weights as ``quantize_static`` writes them (com.microsoft Q/DQ below opset 21) on the corpus
    MLP: the integer backend refuses with one line naming the tensor and its type, exit 2."""
    from onnxruntime.quantization import QuantType

    if not hasattr(QuantType, "QInt4"):
        pytest.skip("this onnxruntime's quantizer writes no int4")
    entry = corpus["digits_mlp"]
    path = _quantize_corpus(entry, tmp_path, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt4)
    argv = ["compare", entry.fp32, path, "--data", entry.data("smoke"), "--backend", "integer", "--outputs-only"]
    code, _, stderr = run_cli(argv, capsys)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, stderr
    assert lines[0].startswith("error: ") and "is int4" in lines[0] and "integer backend does not support" in lines[0]
