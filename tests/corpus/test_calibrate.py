"""Every calibration method, per tensor and per channel, writes a model that onnxruntime runs."""

from __future__ import annotations

import numpy as np
import pytest
from corpus_helpers import MODEL_NAMES, run_cli

pytestmark = pytest.mark.corpus

METHODS = ["minmax", "moving-average", "percentile", "kl", "mse"]


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_calibrate(corpus, name, method, per_channel, tmp_path, capsys):
    entry = corpus[name]
    out = tmp_path / f"{method}.onnx"
    argv = ["calibrate", entry.fp32, "--data", entry.data("smoke"), "--method", method, "--out", out]
    argv += ["--per-channel"] if per_channel else []
    code, stdout, stderr = run_cli(argv, capsys)
    assert code == 0, stderr
    assert "Traceback" not in stderr and "[ONNXRuntimeError]" not in stderr, stderr
    assert f"with {method}" in stdout
    # the written model loads in onnxruntime and runs on the smoke record
    import onnxruntime as ort

    from pytest_qaccuracy.data import bind_dataset, load_dataset
    from pytest_qaccuracy.model.loading import graph_inputs, load_model

    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    with load_dataset(entry.data("smoke")) as dataset:
        feeds = next(bind_dataset(dataset, graph_inputs(load_model(out))).iter_records())
    outputs = session.run(None, feeds)
    assert len(outputs) == len(session.get_outputs())
    assert all(np.isfinite(o).all() for o in outputs if o.dtype.kind == "f")


RECIPES = {
    "u8s8": {},
    "s8s8_pc": {"activation_type": "int8", "per_channel": True},
    "qop_u8s8": {"quant_format": "qoperator"},
}


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_a_patched_choice_is_the_model_onnxruntime_writes(corpus, name, recipe, tmp_path):
    """``auto`` measures each choice as the min/max model with the choice's parameters set
    (``ParamModel.patched``): on every corpus model and recipe that is onnxruntime's own model of the
    choice, node for node and value for value, for ranges narrower (ONE's percentile) and wider (twice
    min/max) than min/max's, including the weight scales onnxruntime raises for int32 biases (the
    PP-OCRv4 detector's and recognizer's per-channel depthwise weights)."""
    from dataclasses import replace

    import onnx

    from pytest_qaccuracy.analysis.calibration import CalibrationOptions, compute_ranges
    from pytest_qaccuracy.analysis.calibration.options import CalibrationResult
    from pytest_qaccuracy.analysis.calibration.qdq_params import ParamModel, same_model
    from pytest_qaccuracy.analysis.calibration.quantize import quantize_with_ranges, with_opset_for
    from pytest_qaccuracy.model.loading import load_model

    entry = corpus[name]
    form = CalibrationOptions(**RECIPES[recipe])
    proto, converted = with_opset_for(onnx.load(str(entry.fp32)), form)
    fp32 = tmp_path / "opset13.onnx" if converted else entry.fp32
    if converted:
        onnx.save(proto, str(fp32))
    data = entry.data("calib")  # percentile ranges differ from min/max only over several records
    observed = compute_ranges(fp32, data).ranges
    narrower = compute_ranges(fp32, data, CalibrationOptions(method="percentile")).ranges
    minmax = CalibrationResult("minmax", 1, observed)
    qdq = load_model(quantize_with_ranges(fp32, tmp_path / "qdq.onnx", minmax, replace(form, quant_format="qdq")))
    params = ParamModel(qdq, load_model(fp32), observed, form.activation_type)
    base = (
        qdq if form.quant_format == "qdq" else load_model(quantize_with_ranges(fp32, tmp_path / "b.onnx", minmax, form))
    )
    choices = {
        "narrower": {t: narrower[t] for t in params.tensors},
        "wider": {t: (2 * observed[t][0], 2 * observed[t][1]) for t in params.tensors},
    }
    for choice, ranges in choices.items():
        result = CalibrationResult(choice, 1, {**observed, **ranges})
        written = load_model(quantize_with_ranges(fp32, tmp_path / f"{choice}.onnx", result, form))
        assert not same_model(base, written), choice
        assert same_model(params.patched(base, ranges), written), choice
