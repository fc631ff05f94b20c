"""Ops without a kernel of ours: onnxruntime runs them node by node, ``onnx.reference`` only as the last resort."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from backend_models import assert_same, ort_session, quantize_qdq
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from pytest_qaccuracy.backend import IntegerSession


def _upsampling_net(seed: int = 0) -> onnx.ModelProto:
    """Conv -> ConvTranspose (stride 2) -> Div by a constant -> Tanh: a decoder head, no kernel of ours for
    the last three."""
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 0.3, (8, 4, 3, 3)).astype(np.float32)
    wt = rng.normal(0, 0.3, (8, 4, 2, 2)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["input", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("ConvTranspose", ["r", "wt"], ["up"], strides=[2, 2]),
        helper.make_node("Div", ["up", "three"], ["d"]),
        helper.make_node("Tanh", ["d"], ["output"]),
    ]
    inits = [
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(np.zeros(8, np.float32), "b"),
        numpy_helper.from_array(wt, "wt"),
        numpy_helper.from_array(np.float32(3.0), "three"),
    ]
    graph = helper.make_graph(
        nodes,
        "decoder",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["n", 4, 10, 10])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["n", 4, 20, 20])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> onnx.ModelProto:
    calibration = np.random.default_rng(1).normal(0, 1, (16, 4, 10, 10)).astype(np.float32)
    return quantize_qdq(_upsampling_net(), calibration, tmp_path_factory.mktemp("fallback"))


def _runners(session: IntegerSession) -> dict[str, str]:
    """op type -> runner of its step; ops folded into a table (``tables.py``) map to ``table``."""
    graph = session.model.graph
    op_of = {node.name or f"{node.op_type}_{i}": node.op_type for i, node in enumerate(graph.node)}
    runners = {}
    for step in session.plan():
        runners[step.op.split("::")[1]] = step.runner
        if step.op == "ai.qaccuracy::Table":
            runners.update({op_of[name]: "table" for name in step.fused_from if name in op_of})
    return runners


def test_ops_without_a_kernel_run_in_onnxruntime_and_match_it(quantized: onnx.ModelProto) -> None:
    session = IntegerSession(quantized, "onnxruntime")
    runners = _runners(session)
    assert runners["QLinearConv"] == "kernel"
    assert runners["ConvTranspose"] == "onnxruntime"
    # Div and Tanh, each between a DequantizeLinear and a QuantizeLinear, act on one 8-bit tensor: their
    # onnxruntime nodes run once on the 256 values, and the run looks the results up
    assert runners["Div"] == runners["Tanh"] == "table"
    batch = np.random.default_rng(2).normal(0, 1, (5, 4, 10, 10)).astype(np.float32)
    (got,) = session.run(None, {"input": batch})
    (want,) = ort_session(quantized).run(None, {"input": batch})
    assert_same(got, want, "decoder output")
    d_name = next(n.output[0] for n in quantized.graph.node if n.op_type == "Div")
    got_d, got_out = session.run([d_name, "output"], {"input": batch})  # asked for: the nodes run themselves
    assert_same(got_out, want, "decoder output with the Div output asked for")
    assert got_d.dtype == np.float32 and got_d.shape == (5, 4, 20, 20)


def test_the_reference_preset_keeps_onnx_reference(quantized: onnx.ModelProto) -> None:
    runners = _runners(IntegerSession(quantized, "onnx-reference"))
    assert runners["ConvTranspose"] == "onnx.reference"
    assert runners["Tanh"] == "table"  # a table built by onnx.reference's Tanh on the 256 values


def test_an_op_onnxruntime_lacks_falls_back_to_onnx_reference_and_says_so(tmp_path: Path) -> None:
    """A training op (``ai.onnx.preview.training``) is not in onnxruntime's inference kernels."""
    node = helper.make_node(
        "Adagrad",
        ["r", "t", "x", "g", "h"],
        ["x_new", "h_new"],
        domain="ai.onnx.preview.training",
        decay_factor=0.1,
        epsilon=1e-5,
        norm_coefficient=0.01,
    )
    inputs = [
        helper.make_tensor_value_info("r", TensorProto.FLOAT, []),
        helper.make_tensor_value_info("t", TensorProto.INT64, []),
        *(helper.make_tensor_value_info(n, TensorProto.FLOAT, [3]) for n in "xgh"),
    ]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3]) for n in ("x_new", "h_new")]
    model = helper.make_model(
        helper.make_graph([node], "adagrad", inputs, outputs),
        opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("ai.onnx.preview.training", 1)],
        ir_version=8,
    )
    session = IntegerSession(model, "onnxruntime")
    assert [step.runner for step in session.plan()] == ["onnx.reference"]
    rng = np.random.default_rng(3)
    feeds = {
        "r": np.float32(0.1),
        "t": np.int64(2),
        "x": rng.normal(0, 1, 3).astype(np.float32),
        "g": rng.normal(0, 1, 3).astype(np.float32),
        "h": rng.uniform(0, 1, 3).astype(np.float32),  # accumulated squared gradients
    }
    got = session.run(None, feeds)
    want = ReferenceEvaluator(model).run(None, feeds)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_graph_of_one_op_without_a_kernel_is_one_onnxruntime_step(tmp_path: Path) -> None:
    node = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.INT32)
    model = helper.make_model(
        helper.make_graph(
            [node],
            "cast",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
            [helper.make_tensor_value_info("y", TensorProto.INT32, [None])],
        ),
        opset_imports=[helper.make_opsetid("", 13)],
        ir_version=8,
    )
    session = IntegerSession(model, "onnxruntime")
    assert [step.runner for step in session.plan()] == ["onnxruntime"]
    (y,) = session.run(None, {"x": np.array([1.7, -2.5, 3e9], np.float32)})
    (want,) = ort_session(model).run(None, {"x": np.array([1.7, -2.5, 3e9], np.float32)})
    np.testing.assert_array_equal(y, want)
    assert y.dtype == np.int32


def _excluded_conv_net(seed: int = 0) -> onnx.ModelProto:
    """conv0 -> Relu -> conv1 (kept float by the quantizer) -> Relu -> up (ConvTranspose) -> Add -> conv2."""
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return rng.normal(0, 0.3, shape).astype(np.float32)

    nodes = [
        helper.make_node("Conv", ["input", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1], name="conv0"),
        helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
        helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("ConvTranspose", ["r1", "wt", "bt"], ["up"], strides=[2, 2], name="up"),
        helper.make_node("Add", ["up", "up"], ["sum"], name="add"),
        helper.make_node("Conv", ["sum", "w2"], ["output"], pads=[1, 1, 1, 1], name="conv2"),
    ]
    inits = [
        numpy_helper.from_array(w(8, 4, 3, 3), "w0"),
        numpy_helper.from_array(w(8), "b0"),
        numpy_helper.from_array(w(8, 8, 3, 3), "w1"),
        numpy_helper.from_array(w(8), "b1"),
        numpy_helper.from_array(w(8, 4, 2, 2), "wt"),
        numpy_helper.from_array(w(4), "bt"),
        numpy_helper.from_array(w(4, 4, 3, 3), "w2"),
    ]
    graph = helper.make_graph(
        nodes,
        "excluded",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["n", 4, 10, 10])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["n", 4, 20, 20])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_float_weights_between_qdq_are_quantized_as_onnxruntime_does(tmp_path: Path) -> None:
    """onnxruntime 1.21 and later (but not 1.22) quantize the weights of a Conv or ConvTranspose the
    quantizer left in float between a DequantizeLinear and a QuantizeLinear (``WeightBiasQuantization``):
    the emulation follows the installed onnxruntime, and without the rewrite it would not match it."""
    import onnxruntime as ort

    calibration = np.random.default_rng(1).normal(0, 1, (16, 4, 10, 10)).astype(np.float32)
    model = quantize_qdq(_excluded_conv_net(), calibration, tmp_path, nodes_to_exclude=["conv1"])
    batch = np.random.default_rng(2).normal(0, 1, (4, 4, 10, 10)).astype(np.float32)
    (want,) = ort_session(model).run(None, {"input": batch})
    session = IntegerSession(model, "onnxruntime")
    (got,) = session.run(None, {"input": batch})
    assert_same(got, want, "output")
    version = tuple(int(p) for p in ort.__version__.split(".")[:2])
    newer = version >= (1, 21) and version != (1, 22)  # 1.22.x leaves them in float (measured)
    assert session.scheme.quantize_float_weights is newer
    fused = {step.fused_from for step in session.plan() if "conv1" in step.fused_from}
    assert bool(fused) is newer  # conv1 runs as an integer convolution exactly when onnxruntime quantizes it
    if newer:
        plain = IntegerSession(model, session.scheme.replace(quantize_float_weights=False))
        (float_conv,) = plain.run(None, {"input": batch})
        assert not np.array_equal(float_conv, want)
