"""Output statistics (top-k counts, elements outside rtol/atol) against a direct numpy computation."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from pytest_qaccuracy.analysis.outputs import OutputStats, measure_outputs
from pytest_qaccuracy.model import ModelPair
from pytest_qaccuracy.runtime import RuntimeOptions

from .conftest import EXAMPLES


def _run(name: str, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(EXAMPLES / "models" / name), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]


def test_measure_outputs_matches_numpy() -> None:
    data = np.load(EXAMPLES / "data" / "digits_test.npz")
    x, labels = data["x"], data["labels"]
    ref, test = _run("digits_cnn.onnx", x), _run("digits_cnn.broken.onnx", x)
    pair = ModelPair(EXAMPLES / "models" / "digits_cnn.onnx", EXAMPLES / "models" / "digits_cnn.broken.onnx")
    stats = measure_outputs(
        pair, EXAMPLES / "data" / "digits_test.npz", ks=(1, 5), rtol=0.1, atol=0.5, options=RuntimeOptions(batch_size=7)
    )
    counts = stats.topk["logits"]
    assert counts["records"] == counts["labelled"] == 300
    top1 = counts["k"]["1"]
    assert top1["agreement"] == pytest.approx((ref.argmax(1) == test.argmax(1)).mean())
    assert top1["fp32_accuracy"] == pytest.approx((ref.argmax(1) == labels).mean())
    assert top1["quantized_accuracy"] == pytest.approx((test.argmax(1) == labels).mean())
    margin = np.abs(test - ref) - (0.5 + 0.1 * np.abs(ref))
    rel = stats.relative["logits"]
    assert rel.violations == int((margin > 0).sum()) and rel.elements == ref.size
    record, index = np.unravel_index(int(margin.argmax()), margin.shape)
    assert rel.worst[0][:2] == (int(record), f"[{int(index)}]")
    assert rel.worst[0][2] == pytest.approx(float(test[record, index]), rel=1e-6)
    assert OutputStats.from_dict(stats.to_dict()) == stats


def test_integer_outputs_are_dequantized(tmp_path) -> None:
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(EXAMPLES / "models" / "digits_cnn.qdq.onnx"))
    del model.graph.node[-1]  # drop the final DequantizeLinear: the model now outputs uint8 codes
    model.graph.output[0].CopyFrom(
        helper.make_tensor_value_info("logits_QuantizeLinear_Output", TensorProto.UINT8, ["N", 10])
    )
    onnx.save(model, str(tmp_path / "codes.onnx"))
    data = EXAMPLES / "data" / "digits_test.npz"
    fp32 = EXAMPLES / "models" / "digits_cnn.onnx"
    codes = measure_outputs(ModelPair(fp32, tmp_path / "codes.onnx"), data, rtol=0.0, atol=0.5)
    floats = measure_outputs(ModelPair(fp32, EXAMPLES / "models" / "digits_cnn.qdq.onnx"), data, rtol=0.0, atol=0.5)
    assert codes.topk == floats.topk
    assert codes.relative["logits"].violations == floats.relative["logits"].violations
