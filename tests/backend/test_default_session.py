"""int8 QDQ models in onnxruntime's default x86 session, bit for bit (issue 32).

Without ``session.qdqisint8allowed=1`` onnxruntime turns single int8 Q -> DQ pairs into uint8 and
leaves int8 and mixed-type Conv/MatMul/Gemm groups in float, after removing Identity nodes and
redundant DQ -> Q pairs; its float kernels then decide the last bits. A SiLU block (``a * sigmoid(a)``
reads one Q/DQ pair twice, as in YOLOv8) and a classifier tail (Softmax -> Identity -> a graph output,
as skl2onnx writes it) exercise each rule; the host preset must equal onnxruntime in both sessions.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from backend_models import ort_session, quantize_qdq
from onnx import TensorProto, helper, numpy_helper

from pytest_qaccuracy.backend import IntegerSession, get_scheme
from pytest_qaccuracy.backend.scheme import for_onnxruntime


def _float_net() -> onnx.ModelProto:
    rng = np.random.default_rng(7)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.4, (8, 3, 3, 3)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(0, 0.2, (8,)).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.normal(0, 0.3, (8, 8, 3, 3)).astype(np.float32), "w2"),
        numpy_helper.from_array(rng.normal(0, 0.1, (8 * 8 * 8, 10)).astype(np.float32), "fc"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["a"], ["s"]),
        helper.make_node("Mul", ["a", "s"], ["silu"]),  # a is read three times: its pair stays int8
        helper.make_node("Conv", ["a", "w2"], ["c"], pads=[1, 1, 1, 1]),  # int8 in, int8 out: float
        helper.make_node("Sigmoid", ["c"], ["s2"]),
        helper.make_node("Mul", ["c", "s2"], ["silu2"]),
        helper.make_node("Add", ["silu", "silu2"], ["sum"]),
        helper.make_node("Flatten", ["sum"], ["flat"]),
        helper.make_node("MatMul", ["flat", "fc"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["soft"], axis=1),
        helper.make_node("Identity", ["soft"], ["probabilities"]),
    ]
    graph = helper.make_graph(
        nodes,
        "silu_classifier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", 10])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("s8")
    calibration = np.random.default_rng(8).normal(0, 1, (16, 3, 8, 8)).astype(np.float32)
    quantized = quantize_qdq(_float_net(), calibration, folder, activation="int8", per_channel=True)
    path = folder / "s8s8.onnx"
    onnx.save(quantized, path)
    return path


RECORDS = np.random.default_rng(9).normal(0, 1, (12, 3, 8, 8)).astype(np.float32)


@pytest.mark.parametrize("int8_allowed", [False, True])
def test_the_host_preset_equals_onnxruntime_in_both_sessions(model: Path, int8_allowed: bool) -> None:
    scheme = get_scheme("onnxruntime")
    if int8_allowed:
        scheme = scheme.replace(name=scheme.name, qdq_int8_to_uint8=False)
    want = ort_session(model, int8_fusion=int8_allowed).run(None, {"x": RECORDS})[0]
    got = IntegerSession(model, scheme).run(None, {"x": RECORDS})[0]
    np.testing.assert_array_equal(got, want)


def test_the_default_session_fuses_what_onnxruntime_fuses(model: Path, tmp_path: Path) -> None:
    """The QLinear ops of the plan are those of onnxruntime's optimized graph in the default session."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    theirs = sorted(n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node if "QLinear" in n.op_type)
    ours = sorted(s.op.split("::")[1] for s in IntegerSession(model).plan() if "QLinear" in s.op)
    assert ours == theirs


def _softmax_tail() -> onnx.ModelProto:
    """skl2onnx's classifier tail as onnxruntime's quantizer writes it (the corpus's digits MLP): an int8
    Softmax group, then ``DQ -> Identity -> Q -> DQ`` to the graph output ``probabilities``, read again by
    an ArgMax."""
    s8 = np.int8
    inits = [
        numpy_helper.from_array(np.array(0.1, np.float32), "xs"),
        numpy_helper.from_array(np.array(0, s8), "xz"),
        numpy_helper.from_array(np.array(1 / 255, np.float32), "ps"),
        numpy_helper.from_array(np.array(-128, s8), "pz"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("Softmax", ["xd"], ["soft"], axis=-1),
        helper.make_node("QuantizeLinear", ["soft", "ps", "pz"], ["sq"]),
        helper.make_node("DequantizeLinear", ["sq", "ps", "pz"], ["sd"]),
        helper.make_node("Identity", ["sd"], ["si"]),
        helper.make_node("QuantizeLinear", ["si", "ps", "pz"], ["pq"]),
        helper.make_node("DequantizeLinear", ["pq", "ps", "pz"], ["probabilities"]),
        helper.make_node("ArgMax", ["probabilities"], ["label"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "tail",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 10])],
        [
            helper.make_tensor_value_info("label", TensorProto.INT64, ["N", 1]),
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", 10]),
        ],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_a_softmax_tail_to_a_graph_output_runs_as_this_onnxruntime_release() -> None:
    """onnxruntime 1.19 and later remove the tail's redundant pair first, so the Softmax's pair, which
    then ends in a graph output, stays int8 and the Softmax runs in float (a confident row: 255 / 255);
    1.18 converts the pair as it stands and fuses the group into a uint8 QLinearSoftmax (its inverse scale
    floor(1 / (1/255)) = 254: 254 / 255). The host preset equals the installed onnxruntime, whichever."""
    model = _softmax_tail()
    x = np.array([[12.0] + [0.0] * 9, [1.0, 2.0, 3.0, 0.5, 0.0, -1.0, 2.0, 0.2, 0.1, 0.0]], np.float32)
    vnni = get_scheme("onnxruntime-vnni")
    top = {}
    for release in ((1, 18), (1, 19)):
        got = IntegerSession(model, for_onnxruntime(vnni, release)).run(["probabilities"], {"x": x})[0]
        top[release] = round(float(got[0, 0]) * 255)
    assert top == {(1, 18): 254, (1, 19): 255}
    want = ort_session(model, int8_fusion=False).run(["label", "probabilities"], {"x": x})
    got = IntegerSession(model, get_scheme("onnxruntime")).run(["label", "probabilities"], {"x": x})
    for w, g in zip(want, got, strict=True):
        np.testing.assert_array_equal(g, w)
