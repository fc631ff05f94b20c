"""Elementwise groups on one 8-bit tensor run as a 256-entry table (``backend/tables.py``).

The expected values come from onnxruntime running the same model (these float ops and QOperator
elementwise ops give the same results on every x86 CPU family); the plan shows that the tables ran.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from pytest_qaccuracy.backend import IntegerSession

MS = "com.microsoft"
SHAPE = [3, 5, 7, 9]  # 945 values: not a multiple of any SIMD width, so vector tails are covered


def _model(nodes, inits: dict[str, np.ndarray], elem: int, opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "tables",
        [helper.make_tensor_value_info("x", elem, SHAPE)],
        [helper.make_tensor_value_info("y", elem, SHAPE)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)], ir_version=8
    )


def _float_island(op: str, dtype: type, **attrs) -> onnx.ModelProto:
    """``DequantizeLinear -> op -> QuantizeLinear`` (a QOperator model's float island)."""
    zp = 3 if dtype == np.uint8 else -3
    inits = {"s": np.float32(0.047), "z": dtype(zp), "s2": np.float32(0.0071), "z2": dtype(zp + 1)}
    inits["six"] = np.float32(6)
    second = ["six"] if op == "Div" else []
    nodes = [
        helper.make_node("DequantizeLinear", ["x", "s", "z"], ["f"]),
        helper.make_node(op, ["f", *second], ["g"], **attrs),
        helper.make_node("QuantizeLinear", ["g", "s2", "z2"], ["y"]),
    ]
    return _model(nodes, inits, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))


def _hardswish(dtype: type) -> onnx.ModelProto:
    """``x * hardsigmoid(x)`` in QOperator form: a diamond (``x`` read twice) that is still elementwise."""
    zp = 128 if dtype == np.uint8 else 0
    inits = {"s": np.float32(0.05), "z": dtype(zp), "sh": np.float32(1 / 255), "zh": dtype(zp - 128)}
    inits |= {"so": np.float32(0.04), "zo": dtype(zp - 20)}
    nodes = [
        helper.make_node("DequantizeLinear", ["x", "s", "z"], ["f"]),
        helper.make_node("HardSigmoid", ["f"], ["hs"], alpha=1 / 6, beta=0.5),
        helper.make_node("QuantizeLinear", ["hs", "sh", "zh"], ["h"]),
        helper.make_node("QLinearMul", ["x", "s", "z", "h", "sh", "zh", "so", "zo"], ["y"], domain=MS),
    ]
    return _model(nodes, inits, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))


def _affine(dtype: type) -> onnx.ModelProto:
    """``(c * x) + d`` by one-element constants, as QLinearMul then QLinearAdd (PP-LCNet's affine blocks)."""
    zp = 7 if dtype == np.uint8 else -7
    one = lambda v: np.array([v], dtype)  # noqa: E731
    inits = {"s": np.float32(0.02), "z": dtype(zp), "c": one(zp + 90), "cs": np.float32(0.011), "cz": dtype(zp)}
    inits |= {"ms": np.float32(0.015), "mz": dtype(zp + 2), "d": one(zp + 40), "ds": np.float32(0.009)}
    inits |= {"ys": np.float32(0.02), "yz": dtype(zp - 5)}
    nodes = [
        helper.make_node("QLinearMul", ["c", "cs", "cz", "x", "s", "z", "ms", "mz"], ["m"], domain=MS),
        helper.make_node("QLinearAdd", ["m", "ms", "mz", "d", "ds", "cz", "ys", "yz"], ["y"], domain=MS),
    ]
    return _model(nodes, inits, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))


def _every_value(dtype: type) -> np.ndarray:
    info = np.iinfo(dtype)
    values = np.arange(info.min, int(info.max) + 1)
    return np.resize(np.random.default_rng(0).permutation(values), SHAPE).astype(dtype)


MODELS = {
    "div": lambda d: _float_island("Div", d),
    "hardsigmoid": lambda d: _float_island("HardSigmoid", d, alpha=0.2, beta=0.5),
    "tanh": lambda d: _float_island("Tanh", d),
    "hardswish": _hardswish,
    "affine": _affine,
}


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("name", MODELS)
def test_a_group_runs_as_one_table_and_matches_onnxruntime(name: str, dtype: type) -> None:
    model = MODELS[name](dtype)
    x = _every_value(dtype)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    session = IntegerSession(model, "onnxruntime")
    assert [step.op for step in session.plan()] == ["ai.qaccuracy::Table"]  # the whole group, one step
    (got,) = session.run(None, {"x": x})
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_a_tensor_asked_for_keeps_its_steps() -> None:
    """Asking for a tensor inside the group runs the steps themselves: the tensor is there, and the
    output is the same."""
    model = _float_island("Div", np.uint8)
    x = _every_value(np.uint8)
    session = IntegerSession(model, "onnxruntime")
    (y,) = session.run(None, {"x": x})
    g, y2 = session.run(["g", "y"], {"x": x})
    np.testing.assert_array_equal(y, y2)
    f32 = lambda v: np.float32(v)  # noqa: E731
    np.testing.assert_array_equal(g, (x.astype(np.float32) - f32(3)) * f32(0.047) / f32(6))


def test_a_graph_output_inside_the_island_ends_the_group() -> None:
    """When the float tensor inside the island is also a graph output, the group ends there (a table of
    floats) and the QuantizeLinear after it runs as its own step; both outputs match onnxruntime."""
    model = _float_island("Div", np.uint8)
    model.graph.output.append(helper.make_tensor_value_info("g", TensorProto.FLOAT, SHAPE))
    x = _every_value(np.uint8)
    session = IntegerSession(model, "onnxruntime")
    assert [step.op for step in session.plan()] == ["ai.qaccuracy::Table", "ai.onnx::QuantizeLinear"]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for got, expected in zip(session.run(None, {"x": x}), want, strict=True):
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("shape", [[], [1], [3, 5, 17]])
def test_dequantize_linear_by_table_matches_onnxruntime(dtype: type, shape: list[int]) -> None:
    """A per-tensor 8-bit DequantizeLinear is a 256-entry lookup: every value, and a 0-d tensor, as
    onnxruntime gives them."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits = [
        numpy_helper.from_array(np.float32(0.0173), "s"),
        numpy_helper.from_array(np.array(-9 if dtype == np.int8 else 131, dtype), "z"),
    ]
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"])],
        "dq",
        [helper.make_tensor_value_info("x", elem, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    info = np.iinfo(dtype)
    size = int(np.prod(shape))
    x = np.resize(np.arange(info.min, int(info.max) + 1), size).astype(dtype).reshape(shape)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    (got,) = IntegerSession(model, "onnxruntime").run(None, {"x": x})
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def _conv_then_island(elem_dtype: type = np.uint8) -> onnx.ModelProto:
    """QLinearConv -> DequantizeLinear -> HardSigmoid -> QuantizeLinear (PP-LCNet's conv + hardswish half)."""
    rng = np.random.default_rng(4)
    w = rng.integers(-90, 90, (6, 3, 3, 3)).astype(np.int8)
    inits = {
        "xs": np.float32(0.02), "xz": np.uint8(128), "w": w, "ws": np.float32(0.004), "wz": np.int8(0),
        "ys": np.float32(0.05), "yz": np.uint8(120), "b": rng.integers(-500, 500, 6).astype(np.int32),
        "hs": np.float32(1 / 255), "hz": np.uint8(0),
    }  # fmt: skip
    nodes = [
        helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("DequantizeLinear", ["c", "ys", "yz"], ["f"]),
        helper.make_node("HardSigmoid", ["f"], ["g"], alpha=1 / 6, beta=0.5),
        helper.make_node("QuantizeLinear", ["g", "hs", "hz"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "conv_island",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [4, 3, 9, 11])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [4, 6, 9, 11])],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_a_table_after_a_convolution_runs_as_its_own_step() -> None:
    """The group after a QLinearConv is one table step after the convolution, with onnxruntime's
    values; asking for the tensor between them gives it too."""
    model = _conv_then_island()
    x = np.random.default_rng(5).integers(0, 256, (4, 3, 9, 11)).astype(np.uint8)
    ort_session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = ort_session.run(None, {"x": x})
    session = IntegerSession(model, "onnxruntime")
    conv, table = session.plan()
    assert conv.op == "ai.onnx::QLinearConv" and table.runner == "table" and len(table.fused_from) == 3
    (got,) = session.run(None, {"x": x})
    np.testing.assert_array_equal(got, want)
    c, y = session.run(["c", "y"], {"x": x})
    np.testing.assert_array_equal(y, want)
    assert c.dtype == np.uint8 and c.shape == (4, 6, 9, 11)


@pytest.mark.parametrize("scheme", ["onnxruntime", "tflite", "onnx-reference"])
def test_a_table_after_a_convolution_gives_the_steps_values_under_every_preset(scheme: str) -> None:
    """As a table or not (the convolution's output asked for), the output is the same under each preset."""
    model = _conv_then_island()
    x = np.random.default_rng(6).integers(0, 256, (4, 3, 9, 11)).astype(np.uint8)
    session = IntegerSession(model, scheme)
    (fused,) = session.run(None, {"x": x})
    _, separate = session.run(["c", "y"], {"x": x})
    np.testing.assert_array_equal(fused, separate)
