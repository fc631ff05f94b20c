"""Unit tests of the interpreter's parts (``backend/fusion.py``, ``backend/fallback.py``,
``backend/interpreter.py``, ``backend/agreement.py``), for the ``interpreter`` mutation group.

The fusion tests build step lists by hand and check the rewrite against onnxruntime's QDQ selector
rules as its transformers state them (which groups become which QOperator node, with which inputs in
which order); the end-to-end tests compare with onnxruntime run on the same model, ``onnx.reference``, or
values worked out by hand.
"""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import numpy as np
import onnx
import onnx.reference
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from pytest_qaccuracy.backend import IntegerSession, KernelError, agreement
from pytest_qaccuracy.backend.agreement import (
    AgreementChecker,
    AgreementResult,
    TensorAgreement,
    dataset_agreement,
    float_step,
    shares_deployed_session,
    signed_activations,
    steps_apart,
)
from pytest_qaccuracy.backend.fallback import OnnxruntimeNode, _one_node_model, reference_kernel
from pytest_qaccuracy.backend.fusion import fuse_qdq
from pytest_qaccuracy.backend.graph import INTERNAL_PREFIX, NARROW_TYPES_SUPPORTED, Step, steps_from_graph
from pytest_qaccuracy.backend.host import host_preset
from pytest_qaccuracy.backend.registry import INTERNAL_DOMAIN
from pytest_qaccuracy.data import load_dataset
from pytest_qaccuracy.data.progress import reporting
from pytest_qaccuracy.errors import InputError, ModelError, UnsupportedOpError

#: onnx 1.19 and later have numpy types for 4-bit tensors; before, they are refused when types are read
_NARROW = NARROW_TYPES_SUPPORTED

U8, I8, I32 = np.dtype(np.uint8), np.dtype(np.int8), np.dtype(np.int32)


def _constants(**extra: np.ndarray) -> dict[str, np.ndarray]:
    """Per-tensor parameters: ``s``/``z`` (0.1, 128), ``s2``/``z2`` (0.2, 100), ``zs`` (int8 0)."""
    base = {
        "s": np.array(0.1, np.float32),
        "z": np.array(128, np.uint8),
        "s2": np.array(0.2, np.float32),
        "z2": np.array(100, np.uint8),
        "zs": np.array(0, np.int8),
    }
    return base | extra


def _dq(x: str, s: str = "s", z: str = "z", out: str | None = None, **attrs: object) -> Step:
    return Step(f"dq_{x}", "", "DequantizeLinear", [x, s, z], [out or f"{x}_f"], dict(attrs))


def _q(x: str, out: str, s: str = "s", z: str = "z", **attrs: object) -> Step:
    return Step(f"q_{out}", "", "QuantizeLinear", [x, s, z], [out], dict(attrs))


def _fuse(
    steps: list[Step],
    constants: dict[str, np.ndarray],
    types: dict[str, np.dtype],
    outputs: set[str] | None = None,
    keep: set[str] | None = None,
    opset: int = 13,
    int8_allowed: bool = True,
) -> list[Step]:
    return fuse_qdq(steps, constants, types, outputs or {"y"}, keep or set(), opset, int8_allowed)


def _ops(steps: list[Step]) -> list[str]:
    return [s.op_type for s in steps]


def _conv_group(bias: Step | None = None, w_type: np.dtype = I8, **w_attrs: object) -> tuple[list[Step], dict]:
    steps = [_dq("x"), _dq("w", "sw", "zw", **w_attrs)]
    inputs = ["x_f", "w_f"]
    if bias is not None:
        steps.append(bias)
        inputs.append(bias.outputs[0])
    steps += [Step("conv", "", "Conv", inputs, ["c"], {"pads": [1, 1, 1, 1]}), _q("c", "y")]
    types = {"x": U8, "w": w_type, "b": I32, "y": U8, "bf": I8}
    return steps, types


# --- QDQ fusion: the QOperator groups --------------------------------------------------------------------


def test_a_conv_group_becomes_qlinearconv_with_its_parameters_in_onnx_order() -> None:
    consts = _constants(w=np.ones((2, 3, 1, 1), np.int8), sw=np.array(0.5, np.float32), zw=np.array(0, np.int8))
    steps, types = _conv_group()
    fused = _fuse(steps, consts, types)
    assert _ops(fused) == ["DequantizeLinear", "DequantizeLinear", "QLinearConv"]
    conv = fused[-1]
    assert conv.inputs == ["x", "s", "z", "w", "sw", "zw", "s", "z"]
    assert (conv.name, conv.domain, conv.outputs, conv.attrs) == ("conv", "", ["y"], {"pads": [1, 1, 1, 1]})
    assert conv.fused == ("conv", "q_y")


def test_a_conv_bias_joins_only_from_an_int32_dequantize() -> None:
    consts = _constants(w=np.ones((2, 3, 1, 1), np.int8), sw=np.array(0.5, np.float32), zw=np.array(0, np.int8))
    consts["b"] = np.zeros(2, np.int32)
    consts["bf"] = np.zeros(2, np.int8)
    steps, types = _conv_group(Step("dq_b", "", "DequantizeLinear", ["b", "sb"], ["b_f"]))
    assert _fuse(steps, consts, types)[-1].inputs[-1] == "b"
    steps, types = _conv_group(Step("dq_b", "", "DequantizeLinear", ["bf", "sb"], ["b_f"]))
    assert "Conv" in _ops(_fuse(steps, consts, types))  # an int8 bias: not onnxruntime's QLinearConv
    steps, types = _conv_group(Step("neg", "", "Neg", ["bias_in"], ["b_f"]))
    assert "Conv" in _ops(_fuse(steps, consts, types))  # a float bias: the group stays float
    steps, types = _conv_group()
    steps[2].inputs.append("b_const")  # a float initializer: no producer at all
    assert "Conv" in _ops(_fuse(steps, consts, types))


@pytest.mark.parametrize(("axis", "fuses"), [(0, True), (-4, True), (1, False), (-3, False)])
def test_conv_weights_fuse_per_tensor_or_per_output_channel_only(axis: int, fuses: bool) -> None:
    consts = _constants(w=np.ones((2, 2, 1, 1), np.int8), sw=np.array([0.5, 0.25], np.float32), zw=np.zeros(2, np.int8))
    steps, types = _conv_group(axis=axis)
    assert ("QLinearConv" in _ops(_fuse(steps, consts, types))) is fuses


def test_a_per_axis_weight_whose_rank_is_unknown_or_a_blocked_one_is_not_fused() -> None:
    per_channel = {"sw": np.array([0.5, 0.25], np.float32), "zw": np.zeros(2, np.int8)}
    steps, types = _conv_group(axis=-4)
    assert "Conv" in _ops(_fuse(steps, _constants(**per_channel), types))  # w computed: no rank
    steps, types = _conv_group(axis=0, block_size=2)
    consts = _constants(w=np.ones((2, 2, 1, 1), np.int8), **per_channel)
    assert "Conv" in _ops(_fuse(steps, consts, types))
    steps, types = _conv_group(axis=0, block_size=0)  # block_size 0 is "not blocked"
    assert "QLinearConv" in _ops(_fuse(steps, consts, types))


def test_per_axis_activations_or_outputs_are_not_fused() -> None:
    vec = {"sv": np.array([0.1, 0.2], np.float32), "zv": np.array([1, 2], np.uint8)}
    consts = _constants(w=np.ones((2, 2, 1, 1), np.int8), sw=np.array(0.5, np.float32), zw=np.zeros((), np.int8))
    consts |= vec
    steps, types = _conv_group()
    steps[-1] = _q("c", "y", "sv", "zv")
    assert "Conv" in _ops(_fuse(steps, consts, types))
    steps, types = _conv_group()
    steps[0] = _dq("x", "sv", "zv")
    assert "Conv" in _ops(_fuse(steps, consts, types))
    steps, types = _conv_group()
    steps[-1] = _q("c", "y", "missing", "z")  # a computed scale: unknown granularity
    assert "Conv" in _ops(_fuse(steps, consts, types))


def _matmul_steps(op: str = "MatMul", **attrs: object) -> list[Step]:
    return [_dq("a"), _dq("b", "sb", "zb"), Step("mm", "", op, ["a_f", "b_f"], ["m"], dict(attrs)), _q("m", "y")]


@pytest.mark.parametrize(("axis", "fuses"), [(1, True), (-1, True), (0, False), (-2, False)])
def test_matmul_weights_fuse_per_tensor_or_per_column(axis: int, fuses: bool) -> None:
    consts = _constants(b=np.ones((3, 2), np.int8), sb=np.array([0.5, 0.25], np.float32), zb=np.zeros(2, np.int8))
    fused = _fuse(_matmul_steps(), consts, {"a": U8, "b": I8, "y": U8})
    for d in fused:
        if d.op_type == "DequantizeLinear" and d.inputs[0] == "b":
            d.attrs["axis"] = axis
    fused = _fuse(
        [*_matmul_steps()[:1], _dq("b", "sb", "zb", axis=axis), *_matmul_steps()[2:]],
        consts,
        {"a": U8, "b": I8, "y": U8},
    )
    assert ("QLinearMatMul" in _ops(fused)) is fuses
    if fuses:
        assert fused[-1].inputs == ["a", "s", "z", "b", "sb", "zb", "s", "z"]
        assert (fused[-1].name, fused[-1].domain, fused[-1].op_type) == ("mm", "", "QLinearMatMul")


def test_a_matmul_weight_without_an_axis_is_per_axis_on_axis_1() -> None:
    """DequantizeLinear's default axis is 1: a MatMul's per-column weights."""
    consts = _constants(b=np.ones((3, 2), np.int8), sb=np.array([0.5, 0.25], np.float32), zb=np.zeros(2, np.int8))
    assert "QLinearMatMul" in _ops(_fuse(_matmul_steps(), consts, {"a": U8, "b": I8, "y": U8}))


@pytest.mark.parametrize(("trans_b", "axis", "fuses"), [(0, 1, True), (0, 0, False), (1, 0, True), (1, 1, False)])
def test_gemm_weights_fuse_per_output_column_whichever_way_they_are_stored(
    trans_b: int, axis: int, fuses: bool
) -> None:
    consts = _constants(b=np.ones((2, 2), np.int8), sb=np.array([0.5, 0.25], np.float32), zb=np.zeros(2, np.int8))
    steps = _matmul_steps("Gemm", transB=trans_b)
    steps[1] = _dq("b", "sb", "zb", axis=axis)
    fused = _fuse(steps, consts, {"a": U8, "b": I8, "y": U8})
    assert ("QGemm" in _ops(fused)) is fuses


def test_a_gemm_group_becomes_qgemm_with_its_bias_and_attributes() -> None:
    consts = _constants(b=np.ones((2, 2), np.int8), sb=np.array(0.5, np.float32), zb=np.zeros((), np.int8))
    consts["c"] = np.zeros(2, np.int32)
    types = {"a": U8, "b": I8, "c": I32, "y": U8}
    steps = _matmul_steps("Gemm", alpha=2.0, transA=1, transB=1, beta=1.0)
    fused = _fuse(steps, consts, types)
    assert (fused[-1].name, fused[-1].domain, fused[-1].op_type) == ("mm", "com.microsoft", "QGemm")
    assert fused[-1].inputs == ["a", "s", "z", "b", "sb", "zb", "", "s", "z"]
    assert fused[-1].attrs == {"alpha": 2.0, "transA": 1, "transB": 1}
    with_bias = _matmul_steps("Gemm", beta=1.0)
    with_bias.insert(2, Step("dq_c", "", "DequantizeLinear", ["c", "sc"], ["c_f"]))
    with_bias[3].inputs.append("c_f")
    fused = _fuse(with_bias, consts, types)
    assert fused[-1].inputs[6] == "c"
    with_bias[3].attrs["beta"] = 0.5  # a scaled bias: onnxruntime leaves the group in float
    assert "Gemm" in _ops(_fuse(with_bias, consts, types))
    with_bias[3].attrs["beta"] = 1.0
    types["c"] = I8
    assert "Gemm" in _ops(_fuse(with_bias, consts, types))
    with_bias[2] = Step("neg", "", "Neg", ["cc"], ["c_f"])
    types["c"] = I32
    assert "Gemm" in _ops(_fuse(with_bias, consts, types))
    with_bias.pop(2)  # "c_f" has no producer
    assert "Gemm" in _ops(_fuse(with_bias, consts, types))


@pytest.mark.parametrize("op", ["Conv", "MatMul", "Gemm"])
def test_int8_activations_fuse_only_where_int8_is_allowed(op: str) -> None:
    consts = _constants(b=np.ones((2, 2, 1, 1), np.int8), sb=np.array(0.5, np.float32), zb=np.zeros((), np.int8))
    steps = _matmul_steps(op)
    for s in steps:
        if s.op_type in ("DequantizeLinear", "QuantizeLinear") and s.inputs[1] == "s":
            s.inputs[2] = "zs"
    types = {"a": I8, "b": I8, "y": I8}
    assert op not in _ops(_fuse(steps, consts, types, int8_allowed=True))
    assert op in _ops(_fuse(steps, consts, types, int8_allowed=False))
    mixed = {"a": U8, "b": I8, "y": I8}  # input and output activations of two types
    assert op in _ops(_fuse(steps, consts, mixed, int8_allowed=True))


# --- binary, unary and concat groups ----------------------------------------------------------------------


def _binary_steps(op: str) -> list[Step]:
    return [_dq("a"), _dq("b", "s2", "z2"), Step("op", "", op, ["a_f", "b_f"], ["t"]), _q("t", "y")]


@pytest.mark.parametrize(("op", "fused_op"), [("Add", "QLinearAdd"), ("Mul", "QLinearMul")])
def test_add_and_mul_groups_become_their_microsoft_ops(op: str, fused_op: str) -> None:
    fused = _fuse(_binary_steps(op), _constants(), {"a": U8, "b": U8, "y": U8})
    assert (fused[-1].name, fused[-1].domain, fused[-1].op_type) == ("op", "com.microsoft", fused_op)
    assert fused[-1].inputs == ["a", "s", "z", "b", "s2", "z2", "s", "z"]
    assert fused[-1].outputs == ["y"]
    # int8 next to uint8: QLinearAdd takes one type
    assert op in _ops(_fuse(_binary_steps(op), _constants(), {"a": U8, "b": I8, "y": U8}))
    assert op in _ops(_fuse(_binary_steps(op), _constants(), {"a": U8, "b": U8, "y": I8}))
    # int8 groups fuse even where int8 Conv/MatMul groups stay float
    assert fused_op in _ops(_fuse(_binary_steps(op), _constants(), {"a": I8, "b": I8, "y": I8}, int8_allowed=False))


def test_a_quantize_without_a_zero_point_leaves_the_fused_zero_point_empty() -> None:
    steps = _binary_steps("Add")
    steps[-1].inputs = ["t", "s"]
    steps[1].inputs = ["b", "s2"]
    fused = _fuse(steps, _constants(), {"a": U8, "b": U8, "y": U8})
    assert fused[-1].op_type == "QLinearAdd"
    assert fused[-1].inputs == ["a", "s", "z", "b", "s2", "", "s", ""]


def _unary_steps(op: str, *extra: str, **attrs: object) -> list[Step]:
    return [_dq("a"), Step("op", "", op, ["a_f", *extra], ["t"], dict(attrs)), _q("t", "y", "s2", "z2")]


def test_an_average_pool_group_keeps_its_pooling_attributes_only() -> None:
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [0, 0, 1, 1], "ceil_mode": 1,
             "count_include_pad": 1, "auto_pad": "NOTSET"}  # fmt: skip
    fused = _fuse(_unary_steps("AveragePool", dilations=[1, 1], **attrs), _constants(), {"a": U8, "y": U8})
    assert (fused[-1].domain, fused[-1].op_type) == ("com.microsoft", "QLinearAveragePool")
    assert fused[-1].attrs == attrs
    assert fused[-1].inputs == ["a", "s", "z", "s2", "z2"]
    dilated = _unary_steps("AveragePool", dilations=[1, 2], kernel_shape=[2, 2])
    assert "AveragePool" in _ops(_fuse(dilated, _constants(), {"a": U8, "y": U8}))
    assert "AveragePool" in _ops(_fuse(_unary_steps("AveragePool"), _constants(), {"a": U8, "y": I8}))


@pytest.mark.parametrize(
    ("opset", "attrs", "axis"), [(12, {}, 1), (13, {}, -1), (11, {"axis": 2}, 2), (13, {"axis": 0}, 0)]
)
def test_a_softmax_group_gets_the_default_axis_of_its_opset(opset: int, attrs: dict, axis: int) -> None:
    fused = _fuse(_unary_steps("Softmax", **attrs), _constants(), {"a": U8, "y": U8}, opset=opset)
    assert (fused[-1].op_type, fused[-1].attrs) == ("QLinearSoftmax", {"axis": axis, "opset": opset})


def test_relu_and_clip_groups_become_lookups_with_their_bounds() -> None:
    types = {"a": U8, "y": U8}
    fused = _fuse(_unary_steps("Relu"), _constants(), types)  # z2 = 100: the Relu is not implied
    assert (fused[-1].domain, fused[-1].op_type, fused[-1].attrs) == (
        INTERNAL_DOMAIN,
        "QLinearLookup",
        {"function": "Relu"},
    )
    assert fused[-1].inputs == ["a", "s", "z", "s2", "z2"]
    consts = _constants(lo=np.array(-1.0, np.float32))
    fused = _fuse(_unary_steps("Clip", "lo", ""), consts, types)
    assert fused[-1].op_type == "QLinearLookup"
    assert fused[-1].inputs == ["a", "s", "z", "s2", "z2", "lo", ""]
    assert fused[-1].attrs == {"function": "Clip"}
    fused = _fuse(_unary_steps("Clip", min=-1.0, max=2.0), consts, types)
    assert fused[-1].attrs == {"min": -1.0, "max": 2.0, "function": "Clip"}


@pytest.mark.parametrize(
    ("op", "fused_op", "attrs"),
    [
        ("Sigmoid", "QLinearSigmoid", {}),
        ("LeakyRelu", "QLinearLeakyRelu", {"alpha": 0.2}),
        ("GlobalAveragePool", "QLinearGlobalAveragePool", {}),
    ],
)
def test_other_unary_groups(op: str, fused_op: str, attrs: dict) -> None:
    fused = _fuse(_unary_steps(op, **attrs), _constants(), {"a": U8, "y": U8})
    assert (fused[-1].domain, fused[-1].op_type, fused[-1].attrs) == ("com.microsoft", fused_op, attrs)
    assert (fused[-1].name, fused[-1].outputs, fused[-1].fused) == ("op", ["y"], ("op", "q_y"))
    assert fused[-1].inputs == ["a", "s", "z", "s2", "z2"]


def test_a_concat_group_lists_the_output_parameters_first() -> None:
    cat = Step("cat", "", "Concat", ["a_f", "b_f", "c_f"], ["t"], {"axis": 1})
    steps = [_dq("a"), _dq("b", "s2", "z2"), _dq("c", "s2", "z"), cat, _q("t", "y", "s2", "z2")]
    types = {"a": U8, "b": U8, "c": U8, "y": U8}
    fused = _fuse(steps, _constants(), types)
    assert (fused[-1].name, fused[-1].domain, fused[-1].op_type) == ("cat", "com.microsoft", "QLinearConcat")
    assert fused[-1].attrs == {"axis": 1}
    assert fused[-1].inputs == ["s2", "z2", "a", "s", "z", "b", "s2", "z2", "c", "s2", "z"]
    del steps[3].attrs["axis"]
    assert _fuse(steps, _constants(), types)[-1].attrs == {"axis": 0}
    types["c"] = I8
    assert "Concat" in _ops(_fuse(steps, _constants(), types))
    steps[2] = Step("neg", "", "Neg", ["cc"], ["c_f"])  # one float input: no QLinearConcat
    assert "Concat" in _ops(_fuse(steps, _constants(), {"a": U8, "b": U8, "y": U8}))


# --- when a group is left alone ----------------------------------------------------------------------------


def test_a_group_whose_float_tensor_is_kept_or_read_twice_is_not_fused() -> None:
    types = {"a": U8, "b": U8, "y": U8}
    assert "Add" in _ops(_fuse(_binary_steps("Add"), _constants(), types, keep={"t"}))
    assert "Add" in _ops(_fuse(_binary_steps("Add"), _constants(), types, outputs={"t", "y"}))
    twice = [*_binary_steps("Add"), Step("neg", "", "Neg", ["t"], ["n"])]
    assert "Add" in _ops(_fuse(twice, _constants(), types))
    as_scale = [*_binary_steps("Add")[:3], Step("q_y", "", "QuantizeLinear", ["x", "t", "z"], ["y"])]
    assert "Add" in _ops(_fuse(as_scale, _constants(), types))  # the float tensor is read as a scale
    assert "Add" in _ops(_fuse(_binary_steps("Add"), _constants(), {"a": U8, "b": U8, "y": I32}))
    assert "Add" in _ops(_fuse(_binary_steps("Add"), _constants(), {"a": U8, "b": U8}))  # output type unknown


def test_only_standard_dequantize_of_8_bit_tensors_feeds_a_group() -> None:
    types = {"a": U8, "b": U8, "y": U8}
    steps = _binary_steps("Add")
    steps[0].domain = "com.microsoft"
    assert "Add" in _ops(_fuse(steps, _constants(), types))
    steps[0].domain = "ai.onnx"
    assert "QLinearAdd" in _ops(_fuse(steps, _constants(), types))
    assert "Add" in _ops(_fuse(_binary_steps("Add"), _constants(), {"a": I32, "b": U8, "y": U8}))
    steps = _binary_steps("Add")
    steps[0].op_type = "QuantizeLinear"  # a float produced by another op
    assert "Add" in _ops(_fuse(steps, _constants(), types))


def test_ops_of_other_domains_or_without_outputs_are_left_alone() -> None:
    types = {"a": U8, "b": U8, "y": U8}
    steps = _binary_steps("Add")
    steps[2].domain = "custom"
    assert "Add" in _ops(_fuse(steps, _constants(), types))
    steps[2].domain = "ai.onnx"
    assert "QLinearAdd" in _ops(_fuse(steps, _constants(), types))
    steps = _unary_steps("Relu")
    steps[1].outputs = [""]
    assert "Relu" in _ops(_fuse(steps, _constants(), {"a": U8, "y": U8}))


def test_an_op_without_a_rule_stays_and_a_multi_output_rule_op_too() -> None:
    assert "Neg" in _ops(_fuse(_unary_steps("Neg"), _constants(), {"a": U8, "y": U8}))
    steps = _unary_steps("Softmax")
    steps[1].outputs = ["t", "extra"]
    assert "Softmax" in _ops(_fuse(steps, _constants(), {"a": U8, "y": U8}))


# --- activations that the QuantizeLinear implies ------------------------------------------------------------


def _act_steps(op: str, *extra: str, z: str = "z", **attrs: object) -> list[Step]:
    """``x -> Neg -> act -> Q``: no DequantizeLinear, so only the activation removal can change it."""
    return [Step("neg", "", "Neg", ["x"], ["n"]), Step("act", "", op, ["n", *extra], ["t"], dict(attrs)),
            _q("t", "y", "s", z)]  # fmt: skip


@pytest.mark.parametrize(
    ("z", "zp_type", "removed"), [(0, U8, True), (1, U8, False), (-128, I8, True), (-127, I8, False)]
)
def test_a_relu_goes_when_the_zero_point_is_the_lowest_value(z: int, zp_type: np.dtype, removed: bool) -> None:
    consts = _constants(zq=np.array(z, zp_type))
    fused = _fuse(_act_steps("Relu", z="zq"), consts, {"y": zp_type})
    assert ("Relu" not in _ops(fused)) is removed
    if removed:
        assert fused[-1].inputs[0] == "n"


def test_a_relu_without_a_zero_point_goes_for_uint8_only() -> None:
    steps = _act_steps("Relu")
    steps[-1].inputs = ["t", "s"]
    assert "Relu" not in _ops(_fuse(steps, _constants(), {"y": U8}))
    assert "Relu" in _ops(_fuse(steps, _constants(), {"y": I8}))


# scale 6/255, zero point 0: the QuantizeLinear's range is [0, 6]; scale 0.1, zero point 128: [-12.8, 12.7]
@pytest.mark.parametrize(
    ("attrs", "removed"),
    [
        ({"min": 0.0, "max": 6.0}, True),
        ({"min": 0.0, "max": 5.9}, False),
        ({"min": 0.1, "max": 6.0}, False),
        ({"min": -1.0, "max": 7.0}, True),
        ({"max": 6.0}, True),
        ({"min": 0.0}, True),
        ({}, True),
        ({"min": 0.0, "max": 6.0 - 1e-7}, True),  # within the 1e-6 tolerance
    ],
)
def test_a_clip_goes_when_the_quantize_range_lies_within_its_bounds(attrs: dict, removed: bool) -> None:
    consts = _constants(s6=np.array(6 / 255, np.float32), z0=np.array(0, np.uint8))
    steps = _act_steps("Clip", **attrs)
    steps[-1].inputs = ["t", "s6", "z0"]
    assert ("Clip" not in _ops(_fuse(steps, consts, {"y": U8}))) is removed


def test_clip_bounds_given_as_inputs() -> None:
    consts = _constants(lo=np.array(-12.8, np.float32), hi=np.array(12.7, np.float32), lo2=np.array(-12.0, np.float32))
    types = {"y": U8}
    assert "Clip" not in _ops(_fuse(_act_steps("Clip", "lo", "hi"), consts, types))
    assert "Clip" not in _ops(_fuse(_act_steps("Clip", "", "hi"), consts, types))
    assert "Clip" not in _ops(_fuse(_act_steps("Clip", "lo"), consts, types))
    assert "Clip" in _ops(_fuse(_act_steps("Clip", "lo2", "hi"), consts, types))
    assert "Clip" in _ops(_fuse(_act_steps("Clip", "computed", "hi"), consts, types))  # not a constant
    assert "Clip" in _ops(_fuse(_act_steps("Clip", "lo", "computed"), consts, types))


def test_an_activation_stays_before_a_per_axis_or_shared_or_kept_quantize() -> None:
    consts = _constants(sv=np.array([0.1, 0.2], np.float32), zv=np.zeros(2, np.uint8), z0=np.array(0, np.uint8))
    steps = _act_steps("Relu", z="z0")
    assert "Relu" not in _ops(_fuse(steps, consts, {"y": U8}))
    assert "Relu" in _ops(_fuse(steps, consts, {"y": U8}, keep={"t"}))
    assert "Relu" in _ops(_fuse(steps, consts, {"y": U8}, outputs={"t"}))
    per_axis = _act_steps("Relu", z="zv")
    per_axis[-1].inputs[1] = "sv"
    assert "Relu" in _ops(_fuse(per_axis, consts, {"y": U8}))
    custom = _act_steps("Relu", z="z0")
    custom[1].domain = "custom"
    assert "Relu" in _ops(_fuse(custom, consts, {"y": U8}))


# --- data movement ---------------------------------------------------------------------------------------


def _moving(op: str, outs: tuple[str, ...] = ("t",), **attrs: object) -> list[Step]:
    return [_dq("a"), Step("mv", "", op, ["a_f", "shape"], list(outs), dict(attrs))]


def test_a_reshape_between_equal_parameters_runs_on_the_integers() -> None:
    steps = [*_moving("Reshape"), _q("t", "y")]
    fused = _fuse(steps, _constants(), {"a": U8, "y": U8})
    assert _ops(fused) == ["DequantizeLinear", "Reshape"]
    assert (fused[1].inputs, fused[1].outputs, fused[1].fused) == (["a", "shape"], ["y"], ("mv", "q_y"))
    assert (fused[1].name, fused[1].domain, fused[1].attrs) == ("mv", "", {})


def test_a_reshape_between_other_parameters_is_followed_by_a_requantize() -> None:
    steps = [*_moving("Transpose", perm=[1, 0]), _q("t", "y", "s2", "z2")]
    fused = _fuse(steps, _constants(), {"a": U8, "y": U8})
    assert _ops(fused) == ["DequantizeLinear", "Transpose", "Requantize"]
    tmp = f"{INTERNAL_PREFIX}t"
    assert fused[1].outputs == [tmp] and fused[1].attrs == {"perm": [1, 0]}
    requantize = fused[2]
    assert (requantize.name, requantize.domain) == ("mv/requantize", INTERNAL_DOMAIN)
    assert requantize.inputs == [tmp, "s", "z", "s2", "z2"]
    assert requantize.outputs == ["y"]
    assert requantize.fused == ("mv", "q_y")


def test_a_split_to_two_quantizes_fuses_both_in_graph_order() -> None:
    steps = [*_moving("Split", ("t0", "t1")), _q("t1", "y1", "s2", "z2"), Step("mid", "", "Neg", ["u"], ["v"]),
             _q("t0", "y0")]  # fmt: skip
    fused = _fuse(steps, _constants(), {"a": U8, "y0": U8, "y1": U8}, outputs={"y0", "y1"})
    assert _ops(fused) == ["DequantizeLinear", "Neg", "Split", "Requantize"]
    split = fused[2]
    assert split.outputs == ["y0", f"{INTERNAL_PREFIX}t1"]
    assert split.fused == fused[3].fused == ("mv", "q_y1", "q_y0")


@pytest.mark.parametrize("zero", [np.array([0], np.uint8), np.array([0], np.int64), np.zeros(1, np.int32)])
def test_an_absent_zero_point_equals_a_zero_one_of_any_type(zero: np.ndarray) -> None:
    steps = [*_moving("Flatten"), _q("t", "y", "s", "z0")]
    steps[0].inputs = ["a", "s"]
    fused = _fuse(steps, _constants(z0=zero), {"a": U8, "y": U8})
    assert _ops(fused) == ["DequantizeLinear", "Flatten"]
    steps[0].inputs = ["a", "s", "z"]  # 128 against 0
    assert "Requantize" in _ops(_fuse(steps, _constants(z0=zero), {"a": U8, "y": U8}))


def test_computed_parameters_always_take_a_requantize() -> None:
    steps = [*_moving("Squeeze"), _q("t", "y")]
    steps[0].inputs = ["a", "s", "zc"]
    steps[-1].inputs = ["t", "s", "zc"]
    assert "Squeeze" in _ops(_fuse(steps, _constants(zc=np.array(128, np.uint8)), {"a": U8, "y": U8}))
    # zero points not constants: not per tensor, so no fusion at all
    assert _ops(_fuse(steps, _constants(), {"a": U8, "y": U8})) == ["DequantizeLinear", "Squeeze", "QuantizeLinear"]


@pytest.mark.parametrize(
    ("op", "attrs", "outs", "fuses"),
    [
        ("Resize", {}, ("t",), True),
        ("Resize", {"mode": "nearest"}, ("t",), True),
        ("Resize", {"mode": "linear"}, ("t",), False),
        ("MaxPool", {"kernel_shape": [2, 2]}, ("t",), True),
        ("MaxPool", {"kernel_shape": [2, 2]}, ("t", "idx"), False),
        ("Gather", {"axis": 1}, ("t",), True),
        ("Slice", {}, ("t",), True),
        ("Unsqueeze", {}, ("t",), True),
    ],
)
def test_which_data_ops_run_on_the_integers(op: str, attrs: dict, outs: tuple[str, ...], fuses: bool) -> None:
    steps = [*_moving(op, outs, **attrs), _q("t", "y")]
    assert (op not in _ops(_fuse(steps, _constants(), {"a": U8, "y": U8})) or fuses) is fuses
    assert ("QuantizeLinear" not in _ops(_fuse(steps, _constants(), {"a": U8, "y": U8}))) is fuses


def test_a_data_op_needs_a_per_tensor_dequantize_and_quantize_of_one_type() -> None:
    consts = _constants(sv=np.array([0.1, 0.2], np.float32), zv=np.zeros(2, np.uint8))
    plain = [*_moving("Reshape"), _q("t", "y")]
    assert "QuantizeLinear" in _ops(_fuse(plain, consts, {"a": U8, "y": I8}))
    per_axis_q = [*_moving("Reshape"), _q("t", "y", "sv", "zv")]
    assert "QuantizeLinear" in _ops(_fuse(per_axis_q, consts, {"a": U8, "y": U8}))
    per_axis_dq = [_dq("a", "sv", "zv"), *_moving("Reshape")[1:], _q("t", "y")]
    assert "QuantizeLinear" in _ops(_fuse(per_axis_dq, consts, {"a": U8, "y": U8}))
    no_dq = [Step("neg", "", "Neg", ["a"], ["a_f"]), *_moving("Reshape")[1:], _q("t", "y")]
    assert "QuantizeLinear" in _ops(_fuse(no_dq, consts, {"a": U8, "y": U8}))
    no_inputs = [Step("mv", "", "Reshape", [], ["t"]), _q("t", "y")]
    assert "QuantizeLinear" in _ops(_fuse(no_inputs, consts, {"a": U8, "y": U8}))
    split = [*_moving("Split", ("t0", "t1")), _q("t0", "y")]  # one output without a QuantizeLinear
    assert "Split" in _ops(_fuse(split, consts, {"a": U8, "y": U8}))


# --- agreement: its records and units ----------------------------------------------------------------------


def _tensor(name: str, order: int, mismatches: int, max_steps: int, unit: str = "steps") -> TensorAgreement:
    return TensorAgreement(name, order, 10, mismatches, max_steps, unit)


@pytest.mark.parametrize(
    ("unit", "n", "text"),
    [
        ("steps", 1, "1 step"),
        ("steps", 3, "3 steps"),
        ("steps", 0, "0 steps"),
        ("steps", 2, "2 steps"),
        ("ulps", 1, "1 ulp"),
        ("ulps", 7, "7 ulps"),
    ],
)
def test_a_tensor_says_its_differences_in_its_unit(unit: str, n: int, text: str) -> None:
    assert _tensor("t", 0, 1, n, unit).steps() == text
    assert _tensor("t", 0, 1, 99, unit).steps(n) == text


def test_a_result_summary_names_the_rule_and_the_first_divergence() -> None:
    tensors = (_tensor("a", 0, 0, 0), _tensor("b", 1, 3, 5), _tensor("c", 2, 4, 1, "ulps"))
    result = AgreementResult("m.onnx", "tflite", 2, 8, tensors, "b")
    assert not result.ok
    assert result.num_mismatched_tensors == 2
    assert result.summary() == (
        "integer emulation (tflite) within 2 step(s) of onnxruntime: first divergence at 'b' (order 1): "
        "3 / 10 elements differ, max 5 steps; 2 tensors differ"
    )
    loose = result.with_max_steps(5)
    assert (loose.ok, loose.max_steps_allowed, loose.first_divergence, loose.records) == (True, 5, None, 8)
    assert loose.summary() == "integer emulation (tflite) within 5 step(s) of onnxruntime: ok on 3 tensors"
    assert result.with_max_steps(4).first_divergence == "b"
    assert result.with_max_steps(0).first_divergence == "b"  # "a" differs by 0 steps
    assert list(result.to_dict()) == ["model", "scheme", "max_steps_allowed", "records", "first_divergence", "tensors"]
    assert result.to_dict()["tensors"][2] == {
        "tensor": "c", "order": 2, "elements": 10, "mismatches": 4, "max_steps": 1, "unit": "ulps"
    }  # fmt: skip


def test_a_shape_mismatch_diverges_whatever_the_tolerance() -> None:
    result = AgreementResult("m", "s", 0, 1, (_tensor("a", 0, 0, 0), _tensor("b", 1, 10, -1)), "b")
    assert result.with_max_steps(1000).first_divergence == "b"
    assert AgreementResult("m", "s", 0, 1, (), None).summary().endswith(": ok on 0 tensors")


def test_integer_tensors_are_apart_by_their_difference_of_codes() -> None:
    got = steps_apart(np.array([3, 250, 0], np.uint8), np.array([5, 250, 255], np.uint8))
    assert got.dtype == np.int64 and got.tolist() == [2, 0, 255]
    assert steps_apart(np.array([-1, 127], np.int8), np.array([255, 0], np.uint8)).tolist() == [256, 127]


def test_float_tensors_with_a_step_count_whole_steps_and_any_difference_as_one() -> None:
    big = np.iinfo(np.int64).max
    ours = np.array([1.0, 1.05, 2.0, np.nan, np.nan, 0.0, 1.0], np.float32)
    theirs = np.array([1.0, 1.0, 1.0, np.nan, 1.0, 0.25, np.nan], np.float32)
    assert steps_apart(ours, theirs, 0.25).tolist() == [0, 1, 4, 0, big, 1, big]
    # 43 steps of 0.1 in float32 are 4.3000002: still 43, not 44
    assert steps_apart(np.array([4.3], np.float32), np.array([0.0], np.float32), 0.1).tolist() == [43]
    assert steps_apart(np.array([1e10], np.float32), np.array([0.0], np.float32), 1e-30).tolist() == [2**62]
    # a step, but an integer on one side: equal or not
    assert steps_apart(np.array([1.0, 2.0], np.float32), np.array([1, 3], np.int32), 0.5).tolist() == [0, big]


def test_float_tensors_without_a_step_count_units_in_the_last_place() -> None:
    big = np.iinfo(np.int64).max
    one = np.float32(1.0)
    ours = np.array([np.nextafter(one, np.float32(2)), 0.0, 1.0, np.nan, np.nan, 1.0], np.float32)
    theirs = np.array([1.0, -0.0, -1.0, np.nan, 1.0, np.nan], np.float32)
    # 1.0 is 0x3f800000: +1.0 and -1.0 are that many ulps from 0 on each side
    assert steps_apart(ours, theirs).tolist() == [1, 0, 2 * 0x3F800000, 0, big, big]
    tiny = np.array([np.float32(1e-45)], np.float32)  # the smallest subnormal on each side of zero
    assert steps_apart(tiny, -tiny).tolist() == [2]
    half = np.float16(1.0)
    assert steps_apart(np.array([np.nextafter(half, np.float16(0))]), np.array([half])).tolist() == [1]
    # float32 against float64: equal values or not
    assert steps_apart(np.array([1.0, 0.1], np.float32), np.array([1.0, 0.1], np.float64)).tolist() == [0, big]
    assert steps_apart(np.array([1, 2], np.int32), np.array([1.0, 2.5], np.float32)).tolist() == [0, big]
    strided = np.arange(8, dtype=np.float32)[::2]
    assert steps_apart(strided, strided.copy()).tolist() == [0, 0, 0, 0]


def test_records_are_the_batch_axis_of_the_first_feed() -> None:
    assert agreement._records({}) == 0
    assert agreement._records({"a": np.zeros((3, 2)), "b": np.zeros((5,))}) == 3


def _model(nodes: list, inits: list, inputs: list | None = None, outputs: tuple[str, ...] = ("y",)) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        inputs if inputs is not None else [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_the_float_step_is_the_largest_scale_of_the_nearest_dequantize_up_the_chain() -> None:
    scale = numpy_helper.from_array(np.array([0.1, -0.3], np.float32), "s")
    nodes = [
        helper.make_node("Neg", ["x"], ["n"]),
        helper.make_node("DequantizeLinear", ["q", "s"], ["d"], axis=0),
        helper.make_node("Add", ["d", "bias"], ["a"]),
        helper.make_node("Relu", ["a"], ["y"]),
        helper.make_node("Constant", [], ["cs"], value=numpy_helper.from_array(np.array(0.5, np.float32))),
        helper.make_node("DequantizeLinear", ["q", "cs"], ["d2"]),
        helper.make_node("Identity", ["d2"], ["y2"]),
        helper.make_node("DequantizeLinear", ["q", "n"], ["d3"]),  # a computed scale: walk on from its input
        helper.make_node("Shape", ["bias"], ["shape"]),  # only constant inputs
    ]
    inits = [scale, numpy_helper.from_array(np.zeros(2, np.float32), "bias")]
    model = _model(nodes, inits)
    assert float_step(model, "y") == pytest.approx(0.3)
    assert float_step(model, "y2") == 0.5
    assert float_step(model, "d3") is None  # "q" is a graph input
    assert float_step(model, "n") is None
    assert float_step(model, "x") is None
    assert float_step(model, "shape") is None


def _zero(name: str, dtype: type) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(0, dtype), name)


def test_signed_activations_are_int8_quantize_outputs_or_int8_dequantize_inputs() -> None:
    s = numpy_helper.from_array(np.array(0.1, np.float32), "s")
    q_i8 = helper.make_node("QuantizeLinear", ["x", "s", "zi"], ["q"])
    q_u8 = helper.make_node("QuantizeLinear", ["x", "s", "zu"], ["q"])
    dq = helper.make_node("DequantizeLinear", ["q", "s", "zi"], ["y"])
    assert signed_activations(_model([q_i8], [s, _zero("zi", np.int8)]))
    assert not signed_activations(_model([q_u8], [s, _zero("zu", np.uint8)]))
    assert not signed_activations(_model([helper.make_node("QuantizeLinear", ["x", "s"], ["q"])], [s]))
    assert signed_activations(_model([q_u8, dq], [s, _zero("zu", np.uint8), _zero("zi", np.int8)]))
    weights = numpy_helper.from_array(np.ones(4, np.int8), "q")
    assert not signed_activations(_model([dq], [s, _zero("zi", np.int8), weights]))
    constant = helper.make_node("Constant", [], ["zi"], value=_zero("v", np.int8))
    assert signed_activations(_model([constant, q_i8], [s]))
    empty = helper.make_node("Constant", [], ["zi"], value_float=0.0)  # no tensor value: type unknown
    assert not signed_activations(_model([empty, q_i8], [s]))
    assert not signed_activations(_model([helper.make_node("Constant", [], [], value_float=0.0), q_u8], [s]))


def _options(**changes: object) -> SimpleNamespace:
    base = {"providers": ("CPUExecutionProvider",), "optimization": "all", "threads": 0, "session_config": {}}
    return SimpleNamespace(**(base | changes))


def test_a_session_is_shared_with_the_gate_only_when_it_computes_the_same() -> None:
    s = numpy_helper.from_array(np.array(0.1, np.float32), "s")
    unsigned = _model([helper.make_node("QuantizeLinear", ["x", "s", "zu"], ["y"])], [s, _zero("zu", np.uint8)])
    signed = _model([helper.make_node("QuantizeLinear", ["x", "s", "zi"], ["y"])], [s, _zero("zi", np.int8)])
    assert shares_deployed_session(unsigned, _options())
    assert shares_deployed_session(unsigned, _options(session_config={"session.qdqisint8allowed": "1"}))
    assert not shares_deployed_session(signed, _options())
    assert not shares_deployed_session(unsigned, _options(session_config={"session.qdqisint8allowed": "0"}))
    assert not shares_deployed_session(unsigned, _options(session_config={"session.other": "1"}))
    assert not shares_deployed_session(unsigned, _options(providers=("CUDAExecutionProvider", "CPUExecutionProvider")))
    assert not shares_deployed_session(unsigned, _options(optimization="basic"))
    assert not shares_deployed_session(unsigned, _options(threads=2))


# --- fallbacks: onnx.reference and onnxruntime one node at a time ---------------------------------------------


def test_a_reference_step_without_a_proto_is_built_from_its_attributes() -> None:
    run = reference_kernel(Step("lr", "", "LeakyRelu", ["x"], ["y"], {"alpha": 0.5}), {"": 13})
    (y,) = run([np.array([-2.0, 0.0, 3.0], np.float32)])
    np.testing.assert_array_equal(y, np.array([-1.0, 0.0, 3.0], np.float32))  # 0.5 x below 0, not 0.01 x


def test_a_reference_step_rewired_after_its_proto_runs_as_the_step_says() -> None:
    """Fusion and the int8 conversion rename inputs and outputs: then the step's wiring and attributes count."""
    proto = helper.make_node("LeakyRelu", ["a"], ["y"], alpha=0.1)
    for inputs, outputs in ((["b"], ["y"]), (["a"], ["z"])):
        run = reference_kernel(Step("lr", "", "LeakyRelu", inputs, outputs, {"alpha": 0.5}, proto), {"": 13})
        np.testing.assert_array_equal(run([np.array([-2.0], np.float32)])[0], np.array([-1.0], np.float32))
    run = reference_kernel(Step("lr", "", "LeakyRelu", ["a"], ["y"], {"alpha": 0.5}, proto), {"": 13})
    np.testing.assert_array_equal(run([np.array([-2.0], np.float32)])[0], np.array([-0.2], np.float32))


def test_a_reference_step_keeps_its_proto_where_the_attributes_cannot_be_rebuilt() -> None:
    """A tensor attribute is a numpy array in ``Step.attrs``: the proto, unchanged, is what runs."""
    value = np.array([[1, 2], [3, 4]], np.int64)
    model = _model([helper.make_node("Constant", [], ["y"], value=numpy_helper.from_array(value))], [], inputs=[])
    (step,) = steps_from_graph(model.graph)
    (got,) = reference_kernel(step, {"": 13})([])
    np.testing.assert_array_equal(got, value)


def test_a_reference_step_of_another_domain_runs_at_that_domain_opset() -> None:
    step = Step("b", "ai.onnx.ml", "Binarizer", ["x"], ["y"], {"threshold": 0.5})
    (y,) = reference_kernel(step, {"": 13, "ai.onnx.ml": 3})([np.array([0.2, 0.7, 0.5], np.float32)])
    np.testing.assert_array_equal(y, np.array([0.0, 1.0, 0.0], np.float32))


def test_a_reference_step_runs_at_the_model_opset() -> None:
    """Upsample, an op of opset 9 (Resize replaced it in 10)."""
    step = Step("u", "", "Upsample", ["x", "scales"], ["y"], {"mode": "nearest"})
    x = np.array([[[[1.0, 2.0]]]], np.float32)
    (y,) = reference_kernel(step, {"": 9})([x, np.array([1, 1, 1, 2], np.float32)])
    np.testing.assert_array_equal(y, np.array([[[[1.0, 1.0, 2.0, 2.0]]]], np.float32))


def test_an_empty_resize_input_is_handed_over_as_absent() -> None:
    step = Step("r", "", "Resize", ["x", "roi", "scales", "sizes"], ["y"], {"mode": "nearest"})
    run = reference_kernel(step, {"": 13})
    x = np.array([[[[1.0, 2.0]]]], np.float32)
    want = np.array([[[[1.0, 1.0, 2.0, 2.0]]]], np.float32)
    empty = np.zeros(0, np.float32)
    np.testing.assert_array_equal(run([x, empty, np.array([1, 1, 1, 2], np.float32), None])[0], want)
    np.testing.assert_array_equal(run([x, empty, empty, np.array([1, 1, 1, 4], np.int64)])[0], want)


def test_an_op_onnx_reference_lacks_is_unsupported_with_its_domain_and_opset() -> None:
    with pytest.raises(UnsupportedOpError, match=r"node 'f': .* custom::Frobnicate at opset 3 \(onnx\.reference: "):
        reference_kernel(Step("f", "custom", "Frobnicate", ["x"], ["y"]), {"": 13, "custom": 3})
    with pytest.raises(UnsupportedOpError, match=r"other::Frobnicate at opset 1 \(onnx\.reference: "):
        reference_kernel(Step("f", "other", "Frobnicate", ["x"], ["y"]), {"": 13})


def test_a_node_with_a_subgraph_does_not_run_alone_in_onnxruntime() -> None:
    branch = helper.make_graph([helper.make_node("Identity", ["x"], ["o"])], "b", [], [])
    proto = helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)
    step = Step("if", "", "If", ["c"], ["y"], {}, proto)
    with pytest.raises(
        ValueError, match=r"^subgraphs may read outer-scope tensors that a one-node model does not have$"
    ):
        OnnxruntimeNode(step, [np.dtype(bool)], {"": 13}, 8, 1)


def test_an_onnxruntime_node_builds_a_session_per_input_type_signature() -> None:
    step = Step("add", "", "Add", ["a", "b"], ["y"])
    node = OnnxruntimeNode(step, [None, np.dtype(np.float32)], {"": 13}, 8, 1)
    assert node._sessions == {}  # a type unknown: built on the first run
    (y,) = node([np.array([1.5], np.float32), np.array([2.0], np.float32)])
    np.testing.assert_array_equal(y, np.array([3.5], np.float32))
    (y,) = node([np.array([1, 2], np.int32), np.array([3, 4], np.int32)])
    assert y.dtype == np.int32 and y.tolist() == [4, 6]
    assert len(node._sessions) == 2
    known = OnnxruntimeNode(step, [np.dtype(np.float32), np.dtype(np.float32)], {"": 13}, 8, 1)
    assert len(known._sessions) == 1  # built up front, so that a node it cannot run fails at once


def test_an_onnxruntime_node_keeps_constant_inputs_as_initializers() -> None:
    step = Step("add", "", "Add", ["a", "w"], ["y"])
    w = np.array([10.0, 20.0], np.float32)
    node = OnnxruntimeNode(step, [np.dtype(np.float32), w.dtype], {"": 13}, 8, 1, {"w": w, "other": w})
    assert list(node.fixed) == [1]
    (y,) = node([np.array([1.0, 2.0], np.float32), None])  # the constant is not fed
    np.testing.assert_array_equal(y, np.array([11.0, 22.0], np.float32))
    first = OnnxruntimeNode(Step("sub", "", "Sub", ["w", "a"], ["y"]), [w.dtype, w.dtype], {"": 13}, 8, 1, {"w": w})
    (y,) = first([None, np.array([1.0, 2.0], np.float32)])  # the inputs after a constant one are fed
    np.testing.assert_array_equal(y, np.array([9.0, 18.0], np.float32))


def test_an_onnxruntime_node_runs_with_step_attributes_and_skips_unnamed_outputs() -> None:
    step = Step("lr", "", "LeakyRelu", ["x"], ["y"], {"alpha": 0.5})
    (y,) = OnnxruntimeNode(step, [np.dtype(np.float32)], {"": 13}, 8, 1)([np.array([-2.0, 4.0], np.float32)])
    np.testing.assert_array_equal(y, np.array([-1.0, 4.0], np.float32))
    dropout = Step("drop", "", "Dropout", ["x"], ["y", ""], {})  # the mask not asked for
    y, mask = OnnxruntimeNode(dropout, [np.dtype(np.float32)], {"": 13}, 8, 1)([np.array([3.0, 1.0], np.float32)])
    assert mask is None and y.tolist() == [3.0, 1.0]


def test_a_one_node_model_needs_the_type_of_every_fed_input() -> None:
    step = Step("add", "", "Add", ["a", "b"], ["y"])
    with pytest.raises(ValueError, match=r"^input 'b' has no known type$"):
        _one_node_model(step, ("<f4",), {"": 13}, 8)
    model = _one_node_model(step, ("<f4",), {"": 13}, 8, {1: np.ones(2, np.float32)})
    assert [i.name for i in model.graph.initializer] == ["in1"]
    assert [i.name for i in model.graph.input] == ["in0"]
    clip = _one_node_model(Step("c", "", "Clip", ["x", "", "hi"], ["y"]), ("<f4", None, "<f4"), {"": 13}, 8)
    assert list(clip.graph.node[0].input) == ["in0", "", "in2"]


@pytest.mark.parametrize("with_proto", [True, False])
def test_a_reference_step_in_the_default_domain_spelled_ai_onnx_runs(with_proto: bool) -> None:
    """onnx.reference knows the default domain as "" only; "ai.onnx" is the same domain (a bug: UnsupportedOpError)."""
    proto = helper.make_node("LeakyRelu", ["x"], ["y"], domain="ai.onnx", alpha=0.5)
    step = Step("lr", "ai.onnx", "LeakyRelu", ["x"], ["y"], {"alpha": 0.5}, proto if with_proto else None)
    (y,) = reference_kernel(step, {"": 13})([np.array([-2.0], np.float32)])
    np.testing.assert_array_equal(y, np.array([-1.0], np.float32))
    with pytest.raises(UnsupportedOpError, match=r"ai\.onnx::Frobnicate at opset 13 \(onnx\.reference: "):
        reference_kernel(Step("f", "ai.onnx", "Frobnicate", ["x"], ["y"]), {"": 13})


def test_the_reference_preset_runs_a_model_whose_nodes_say_ai_onnx() -> None:
    """The same model on onnxruntime: Tanh has no kernel of ours, so the preset runs it in onnx.reference."""
    node = helper.make_node("Tanh", ["x"], ["y"], domain="ai.onnx")
    model = _model([node], [], inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])])
    x = np.array([0.5, -1.0, 3.0], np.float32)
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    session = IntegerSession(model, "onnx-reference")
    assert [s.runner for s in session.plan()] == ["onnx.reference"]
    np.testing.assert_allclose(session.run(None, {"x": x})[0], want, rtol=1e-6)


# --- the session ------------------------------------------------------------------------------------------


def _qdq_chain(ops: tuple[str, ...] = ("Tanh", "Exp"), zero: np.ndarray | None = None) -> onnx.ModelProto:
    """x -> Q -> DQ -> ops... -> Q -> DQ -> y, nodes named after their op (lower case)."""
    z = np.uint8(128) if zero is None else zero
    names = ["xd", *(f"{op.lower()}_out" for op in ops)]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q_in"),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dq_in"),
        *(helper.make_node(op, [a], [b], name=op.lower()) for op, a, b in zip(ops, names, names[1:], strict=False)),
        helper.make_node("QuantizeLinear", [names[-1], "s", "z"], ["yq"], name="q_out"),
        helper.make_node("DequantizeLinear", ["yq", "s", "z"], ["y"], name="dq_out"),
    ]
    inits = [numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(z, "z")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])]
    return _model(nodes, inits, inputs=inputs)


def test_a_table_step_is_named_after_the_first_node_it_replaces() -> None:
    model = _qdq_chain()
    session = IntegerSession(model, "onnxruntime")
    tables = [s for s in session.plan() if s.runner == "table"]
    assert len(tables) == 1
    (table,) = tables
    assert table.op == "ai.qaccuracy::Table"
    assert len(table.fused_from) >= 2 and table.node == table.fused_from[0]
    assert {"tanh", "exp"} <= set(table.fused_from)
    x = np.random.default_rng(4).normal(0, 2, (3, 6)).astype(np.float32)
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], want)


def test_the_default_session_reports_int8_tensors_run_as_uint8_with_their_int8_values() -> None:
    """x86's default session runs int8 QDQ activations as uint8 (``int8_to_uint8``); ``on_tensor`` sees
    the model's int8 values, here the first QuantizeLinear's, as onnx.reference computes them."""
    model = _qdq_chain(("Tanh", "Exp"), np.int8(3))
    x = np.random.default_rng(5).normal(0, 4, (3, 6)).astype(np.float32)
    q = onnx.reference.ReferenceEvaluator(helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]))
    (want,) = q.run(None, {"x": x, "s": np.float32(0.05), "z": np.int8(3)})
    for scheme in ("onnxruntime-avx2", "onnxruntime-vnni", "onnxruntime-arm64"):
        seen: dict[str, np.ndarray] = {}
        IntegerSession(model, scheme).run(["y"], {"x": x}, on_tensor=seen.setdefault)
        assert seen["xq"].dtype == np.int8, scheme
        np.testing.assert_array_equal(seen["xq"], want)
        assert "y" in seen and seen["y"].dtype == np.float32


@pytest.mark.parametrize("threads", [-1, 1.5, True, "2", None])
def test_threads_must_be_a_non_negative_integer(threads: object) -> None:
    with pytest.raises(InputError, match=rf"^threads must be an integer >= 0, got {re.escape(repr(threads))}$"):
        IntegerSession(_qdq_chain(), threads=threads)  # type: ignore[arg-type]


@pytest.mark.parametrize("threads", [0, 1, np.int64(2)])
def test_threads_take_integers_of_any_kind(threads: int) -> None:
    assert IntegerSession(_qdq_chain(), threads=threads).threads == threads


def test_feeds_are_checked_against_the_declared_inputs() -> None:
    model = _qdq_chain()
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 6
    session = IntegerSession(model)
    good = np.zeros((2, 6), np.float32)
    assert session.run(None, {"x": good})[0].shape == (2, 6)
    with pytest.raises(InputError, match=r"^input 'x': invalid rank, got 1 \[6\], expected 2$"):
        session.run(None, {"x": np.zeros(6, np.float32)})
    with pytest.raises(
        InputError, match=r"^input 'x': invalid dimensions \(index 1: got 5, expected 6\) for shape \['N', 6\]$"
    ):
        session.run(None, {"x": np.zeros((2, 5), np.float32)})
    with pytest.raises(InputError, match=r"^input 'x': expected float32, got float64$"):
        session.run(None, {"x": good.astype(np.float64)})
    with pytest.raises(InputError, match=r"^missing input 'x'$"):
        session.run(None, {})
    with pytest.raises(InputError, match=r"^unknown input\(s\) \['w', 'z'\]; the model takes \['x'\]$"):
        session.run(None, {"x": good, "z": good, "w": good})
    with pytest.raises(InputError, match=r"^unknown tensor name\(s\) \['nope'\]: not produced by the model$"):
        session.run(["y", "nope"], {"x": good})


def test_a_declared_dimension_of_zero_or_a_symbol_takes_any_size() -> None:
    model = _qdq_chain()
    shape = model.graph.input[0].type.tensor_type.shape
    shape.dim[0].dim_value = 0
    shape.dim[1].dim_param = "C"
    assert IntegerSession(model).run(None, {"x": np.zeros((2, 3), np.float32)})[0].shape == (2, 3)
    del model.graph.input[0].type.tensor_type.shape.dim[:]
    model.graph.input[0].type.tensor_type.ClearField("shape")  # no shape at all: any rank
    assert IntegerSession(model).run(None, {"x": np.zeros(4, np.float32)})[0].shape == (4,)


def test_inputs_and_outputs_describe_names_shapes_and_types() -> None:
    model = _qdq_chain()
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.DOUBLE
    session = IntegerSession(_qdq_chain())
    (x,) = session.get_inputs()
    assert (x.name, x.shape, x.type) == ("x", ["N", 6], "tensor(float)")
    assert [(o.name, o.shape, o.type) for o in session.get_outputs()] == [("y", [], "tensor(float)")]
    int8 = _model([], [], inputs=[helper.make_tensor_value_info("x", TensorProto.INT8, [None, 3])], outputs=())
    assert [(v.shape, v.type) for v in IntegerSession(int8).get_inputs()] == [([None, 3], "tensor(int8)")]


def test_an_onnxruntime_node_runs_in_its_domain_at_the_model_opsets() -> None:
    """com.microsoft's Gelu, x * Phi(x) worked out with math.erf; Upsample, an op of opset 9 only."""
    gelu = Step("g", "com.microsoft", "Gelu", ["x"], ["y"])
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    (y,) = OnnxruntimeNode(gelu, [np.dtype(np.float32)], {"": 13, "com.microsoft": 1}, 8, 1)([x])
    want = [0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.tolist()]
    np.testing.assert_allclose(y, want, rtol=1e-6)
    upsample = Step("u", "", "Upsample", ["x", "scales"], ["y"], {"mode": "nearest"})
    node = OnnxruntimeNode(upsample, [np.dtype(np.float32)] * 2, {"": 9}, 8, 1)
    (y,) = node([np.array([[[[1.0, 2.0]]]], np.float32), np.array([1, 1, 1, 2], np.float32)])
    np.testing.assert_array_equal(y, np.array([[[[1.0, 1.0, 2.0, 2.0]]]], np.float32))


class _Progress:
    """A progress line that writes down what it is told."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def start(self, label: str, total: int) -> None:
        self.calls.append(("start", label, total))

    def advance(self, records: int) -> None:
        self.calls.append(("advance", records))

    def finish(self) -> None:
        self.calls.append(("finish",))

    def close(self) -> None:
        pass


def test_dataset_agreement_streams_batches_with_its_options_and_progress(tmp_path) -> None:
    x = np.random.default_rng(6).normal(0, 2, (5, 6)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x)
    progress = _Progress()
    with reporting(progress):  # type: ignore[arg-type]
        result = dataset_agreement(_qdq_chain(), tmp_path / "d.npz", batch_size=2, max_steps=3, tensors=["tanh_out"])
    assert progress.calls == [("start", "agreement", 5), ("advance", 2), ("advance", 2), ("advance", 1), ("finish",)]
    assert (result.records, result.max_steps_allowed, result.model) == (5, 3, "g")
    assert "tanh_out" in [t.tensor for t in result.tensors]
    assert result == dataset_agreement(_qdq_chain(), tmp_path / "d.npz", max_steps=3, tensors=["tanh_out"])


def test_dataset_agreement_leaves_a_given_dataset_open(tmp_path) -> None:
    np.savez(tmp_path / "d.npz", x=np.random.default_rng(7).normal(0, 2, (4, 6)).astype(np.float32))
    dataset = load_dataset(tmp_path / "d.npz")
    try:
        first = dataset_agreement(_qdq_chain(), dataset)
        assert first.records == 4
        assert dataset_agreement(_qdq_chain(), dataset) == first  # read again: not closed
    finally:
        dataset.close()


def test_dataset_agreement_runs_a_model_with_a_baked_batch_one_record_at_a_time(tmp_path) -> None:
    """A Reshape to a constant shape fixes the batch: records cannot be stacked."""
    model = _qdq_chain()
    model.graph.node[0].input[0] = "xr"
    model.graph.node.insert(0, helper.make_node("Reshape", ["x", "shape"], ["xr"]))
    model.graph.initializer.append(numpy_helper.from_array(np.array([1, 6], np.int64), "shape"))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    x = np.random.default_rng(8).normal(0, 2, (3, 1, 6)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x)
    progress = _Progress()
    with reporting(progress):  # type: ignore[arg-type]
        result = dataset_agreement(model, tmp_path / "d.npz", batch_size=2)
    assert result.records == 3
    assert progress.calls == [("start", "agreement", 3), ("advance", 1), ("advance", 1), ("advance", 1), ("finish",)]


def _graph_model(nodes: list, inits: list, inputs: list, outputs: list[str], version: int = 10) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], inits
    )
    opsets = [helper.make_opsetid("", 13), helper.make_opsetid("custom", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=version)


@pytest.mark.parametrize(("op", "hint"), [("Foo", False), ("DequantizeLinear", True), ("QuantizeLinear", True)])
def test_a_4_bit_tensor_that_no_runner_takes_is_named_in_the_error(op: str, hint: bool) -> None:
    w = helper.make_tensor("w", TensorProto.INT4, [4], [1, -2, 3, -4])
    node = helper.make_node(op, ["w", "s"], ["y"], domain="custom", name="n")
    model = _graph_model([node], [w, numpy_helper.from_array(np.float32(0.5), "s")], [], ["y"])
    if not _NARROW:
        with pytest.raises(ModelError, match=r"^tensor 'w' is INT4: .* need onnx >= 1\.19"):
            IntegerSession(model)
        return
    with pytest.raises(UnsupportedOpError) as caught:
        IntegerSession(model)
    message = str(caught.value)
    assert message.startswith(
        f"node 'n' (custom::{op}): tensor 'w' is int4, which the integer backend does not support in this op and "
        "domain (neither onnxruntime alone nor onnx.reference runs the node)"
    )
    assert message.endswith("at opset 21 or later take 4-bit types") is hint
    assert message.endswith("runs the node)") is not hint


def test_a_4_bit_graph_input_is_found_too_and_other_types_keep_the_plain_error() -> None:
    inputs = [helper.make_tensor_value_info(n, t, [4]) for n, t in (("w", TensorProto.UINT4), ("v", TensorProto.FLOAT))]
    node = helper.make_node("Foo", ["v", "w"], ["y"], domain="custom", name="n")
    if _NARROW:
        with pytest.raises(UnsupportedOpError, match=r"^node 'n' \(custom::Foo\): tensor 'w' is uint4, "):
            IntegerSession(_graph_model([node], [], inputs, ["y"]))
    else:  # onnx < 1.19 has no numpy type for it: refused when the types are read
        with pytest.raises(ModelError, match=r"^tensor 'w' is UINT4: .* need onnx >= 1\.19"):
            IntegerSession(_graph_model([node], [], inputs, ["y"]))
    floats = [helper.make_tensor_value_info("v", TensorProto.FLOAT, [4])]
    node = helper.make_node("Foo", ["v"], ["y"], domain="custom", name="n")
    with pytest.raises(UnsupportedOpError, match=r"^node 'n': no integer-backend kernel for custom::Foo at opset 1 "):
        IntegerSession(_graph_model([node], [], floats, ["y"]))


def test_a_tensor_that_nothing_produces_is_named_when_the_run_needs_it() -> None:
    node = helper.make_node("Neg", ["ghost"], ["y"], name="neg")
    session = IntegerSession(
        _graph_model([node], [], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])], ["y"])
    )
    with pytest.raises(
        KernelError, match=r"^node 'neg' \(ai\.onnx::Neg\): input\(s\) \['ghost'\] were never produced$"
    ):
        session.run(None, {"x": np.zeros(2, np.float32)})


def test_a_kernel_that_leaves_a_case_to_the_fallback_runs_it_there_every_time() -> None:
    """MaxPool with its Indices output: our kernel raises NotHandled, onnxruntime computes both outputs."""
    node = helper.make_node("MaxPool", ["x"], ["y", "idx"], kernel_shape=[2, 2], name="pool")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("idx", TensorProto.INT64, None),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    x = np.random.default_rng(9).normal(0, 1, (1, 1, 4, 4)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    session = IntegerSession(model, "tflite")  # numpy float kernels: ours is bound
    assert [s.runner for s in session.plan()] == ["kernel"]
    for _ in range(2):
        got = session.run(None, {"x": x})
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)


def test_an_attribute_the_kernel_does_not_take_is_refused() -> None:
    node = helper.make_node("Relu", ["x"], ["y"], name="r", bogus=1)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])]
    with pytest.raises(
        UnsupportedOpError, match=r"^node 'r': .*Relu at opset 13 \(attribute\(s\) \['bogus'\] not supported\)"
    ):
        IntegerSession(_graph_model([node], [], inputs, ["y"]), "tflite")


def test_internal_tensors_are_not_reported_and_everything_else_once_in_order() -> None:
    """A Transpose between other parameters runs on the integers into an internal tensor, then a Requantize."""
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
        helper.make_node("Transpose", ["xd"], ["t"], perm=[1, 0]),
        helper.make_node("QuantizeLinear", ["t", "s2", "z"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "s2", "z"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(np.float32(0.1), "s2"),
             numpy_helper.from_array(np.uint8(128), "z")]  # fmt: skip
    model = _model(nodes, inits, inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])])
    session = IntegerSession(model, "onnxruntime")
    assert [s.op for s in session.plan()][2:4] == ["ai.onnx::Transpose", "ai.qaccuracy::Requantize"]
    seen: list[str] = []
    x = np.random.default_rng(10).normal(0, 2, (2, 3)).astype(np.float32)
    (y,) = session.run(None, {"x": x}, on_tensor=lambda name, value: seen.append(name))
    assert seen == ["xq", "xd", "yq", "y"]  # not the Transpose's internal integer output, nor "t"
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(y, want)


def test_a_reference_step_keeps_the_semantics_of_the_model_opset() -> None:
    """Squeeze-11 takes its axes as an attribute; Squeeze-13 takes them as an input (a bug: the node was
    evaluated alone, at onnx.reference's latest versions, and squeezed every unit axis)."""
    step = Step("sq", "", "Squeeze", ["x"], ["y"], {"axes": [0]})
    (y,) = reference_kernel(step, {"": 11})([np.zeros((1, 1, 3), np.float32)])
    assert y.shape == (1, 3)
    proto = helper.make_node("Squeeze", ["x"], ["y"], axes=[0])
    (y,) = reference_kernel(Step("sq", "", "Squeeze", ["x"], ["y"], {"axes": [0]}, proto), {"": 11})(
        [np.zeros((1, 1, 3), np.float32)]
    )
    assert y.shape == (1, 3)


def test_a_reference_step_returns_none_for_an_output_not_asked_for() -> None:
    step = Step("d", "", "Dropout", ["x"], ["y", ""])
    y, mask = reference_kernel(step, {"": 13})([np.array([1.0, 2.0], np.float32)])
    assert mask is None and y.tolist() == [1.0, 2.0]
    step = Step("d", "", "Dropout", ["x"], ["", "m"])
    y, mask = reference_kernel(step, {"": 13})([np.array([1.0, 2.0], np.float32)])
    assert y is None and mask.tolist() == [True, True]


def test_plans_alike_unless_an_output_is_a_fusion_interior_or_an_int8_activation() -> None:
    checker = AgreementChecker(_qdq_chain(("Relu",)), scheme="tflite")  # DQ -> Relu -> Q: one lookup step
    assert checker.plans_alike(["y", "yq", "xq", "xd"])
    assert not checker.plans_alike(["relu_out"])
    signed = AgreementChecker(_qdq_chain(("Relu",), np.int8(0)), scheme="tflite")
    assert signed.plans_alike(["y"])
    assert not signed.plans_alike(["xq"])  # an int8 activation
    assert not signed.plans_alike(["relu_out"])


@pytest.mark.parametrize(
    ("scale", "lo", "hi", "removed"),
    [
        (4.0, 0.0, 1020.0 - 2e-6, True),  # within 1e-6 of the range, in units of a scale above 1
        (4.0, 0.0, 1020.0 - 5e-6, False),
        (0.5, 0.0, 127.5 - 0.9e-6, True),  # 1e-6 for a scale below 1
        (0.5, 0.0, 127.5 - 1.5e-6, False),
        (1.0, 1e-6, 255.0 - 1e-6, True),  # exactly on both edges
        (1.0, 1.1e-6, 255.0, False),
    ],
)
def test_the_clip_bounds_may_miss_the_range_by_a_millionth_of_a_step(
    scale: float, lo: float, hi: float, removed: bool
) -> None:
    consts = _constants(sc=np.array(scale, np.float32), z0=np.array(0, np.uint8))
    steps = _act_steps("Clip", min=lo, max=hi)
    steps[-1].inputs = ["t", "sc", "z0"]
    assert ("Clip" not in _ops(_fuse(steps, consts, {"y": U8}))) is removed


def test_dataset_agreement_runs_32_records_a_batch_by_default(tmp_path) -> None:
    np.savez(tmp_path / "d.npz", x=np.random.default_rng(11).normal(0, 2, (40, 6)).astype(np.float32))
    progress = _Progress()
    with reporting(progress):  # type: ignore[arg-type]
        assert dataset_agreement(_qdq_chain(), tmp_path / "d.npz").records == 40
    assert progress.calls == [("start", "agreement", 40), ("advance", 32), ("advance", 8), ("finish",)]


def test_a_float_op_on_onnxruntime_keeps_its_constant_inputs_as_initializers() -> None:
    """Under this machine's preset, float ops run in onnxruntime node by node, their constant inputs
    (a Conv's weights) initializers as in the whole model, so that onnxruntime picks the same kernels."""
    w = np.random.default_rng(12).normal(0, 0.3, (4, 2, 3, 3)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], name="conv")
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 6, 6])]
    model = _model([node], [numpy_helper.from_array(w, "w")], inputs=inputs)
    session = IntegerSession(model, host_preset())
    (bound,) = session._plan(frozenset())
    assert bound.runner == "onnxruntime"
    assert list(bound.run.fixed) == [1]
    np.testing.assert_array_equal(bound.run.fixed[1], w)
    x = np.random.default_rng(13).normal(0, 1, (2, 2, 6, 6)).astype(np.float32)
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], want)


def test_a_tensor_of_another_shape_counts_every_element_and_diverges_for_good() -> None:
    checker = AgreementChecker(_qdq_chain(("Relu",)), scheme="onnxruntime", max_steps=100)
    feeds = {"x": np.random.default_rng(14).normal(0, 2, (3, 6)).astype(np.float32)}
    _, ours = checker.emulate(feeds)
    assert checker.names == ["xq", "yq", "y"]  # the 8-bit tensors, then the watched float output
    theirs = checker.onnxruntime_values(feeds)
    checker.fold(ours, theirs, 3)
    wrong = dict(theirs, yq=theirs["yq"].reshape(-1))
    checker.fold(ours, wrong, 3)
    shifted = dict(theirs, xq=(theirs["xq"].astype(np.int64) + 2).clip(0, 255).astype(np.uint8))
    checker.fold(ours, shifted, 3)
    checker.fold(ours, theirs, 3)
    result = checker.result()
    by_name = {t.tensor: t for t in result.tensors}
    assert result.records == 12
    assert (by_name["yq"].elements, by_name["yq"].mismatches, by_name["yq"].max_steps) == (72, 18, -1)
    assert by_name["xq"].elements == 72 and by_name["xq"].max_steps == 2
    assert by_name["xq"].mismatches == int(np.count_nonzero(shifted["xq"] != theirs["xq"]))
    assert result.first_divergence == "yq" and not result.ok
    assert by_name["y"].unit == "steps" and by_name["y"].max_steps == 0


def test_a_float_tensor_no_quantized_tensor_feeds_is_compared_in_ulps() -> None:
    model = _qdq_chain(("Relu",))
    model.graph.node.append(helper.make_node("Neg", ["x"], ["n"]))
    model.graph.output.append(helper.make_tensor_value_info("n", TensorProto.FLOAT, None))
    feeds = {"x": np.random.default_rng(15).normal(0, 2, (3, 6)).astype(np.float32)}
    checker = AgreementChecker(model, scheme="onnxruntime")
    checker.update(feeds)
    _, ours = checker.emulate({"x": feeds["x"][:0]})  # no records: nothing to add
    checker.fold(ours, {name: value[:0] for name, value in checker.onnxruntime_values(feeds).items()}, 0)
    by_name = {t.tensor: t for t in checker.result().tensors}
    assert (by_name["n"].unit, by_name["n"].steps()) == ("ulps", "0 ulps")
    assert (by_name["y"].unit, by_name["xq"].unit) == ("steps", "steps")
    assert by_name["n"].elements == 18 and checker.result().records == 3


def test_the_default_session_tensors_are_judged_in_the_steps_of_their_model_tensor() -> None:
    host = host_preset()
    if not host.startswith(("onnxruntime-avx2", "onnxruntime-vnni")):
        pytest.skip(f"an x86 host's default session: this host's preset is {host}")
    checker = AgreementChecker(_qdq_chain(("Relu",), np.int8(0)), scheme=host, tensors=["xd"])
    checker.update({"x": np.random.default_rng(16).normal(0, 2, (3, 6)).astype(np.float32)})
    by_name = {t.tensor: t for t in checker.result().tensors}
    assert by_name["y (default session)"].unit == "steps"
    assert by_name["xd (default session)"].unit == "steps"
    assert by_name["xd (default session)"].elements == 18


def test_two_nans_are_level_whatever_their_sign_or_payload() -> None:
    nan, minus_nan = np.float32(np.nan), -np.float32(np.nan)
    assert np.signbit(minus_nan) and not np.signbit(nan)
    assert steps_apart(np.array([nan], np.float32), np.array([minus_nan], np.float32)).tolist() == [0]
    assert steps_apart(np.array([nan], np.float32), np.array([minus_nan], np.float32), 0.5).tolist() == [0]


def test_the_float_step_follows_the_first_computed_input_whatever_its_position() -> None:
    nodes = [
        helper.make_node("DequantizeLinear", ["q", "s"], ["d"]),
        helper.make_node("Mul", ["c", "d"], ["y"]),  # a constant first, the computed input second
    ]
    inits = [numpy_helper.from_array(np.float32(0.25), "s"), numpy_helper.from_array(np.float32(2.0), "c")]
    assert float_step(_model(nodes, inits), "y") == 0.25


def test_a_checker_names_its_model_and_scheme() -> None:
    model = _qdq_chain(("Relu",))
    model.graph.name = ""
    checker = AgreementChecker(model, scheme="tflite")
    checker.update({"x": np.zeros((2, 6), np.float32)})
    result = checker.result()
    assert (result.model, result.scheme, result.records) == ("model", "tflite", 2)
    assert AgreementChecker(_qdq_chain(("Relu",)), scheme="tflite").label == "g"


def test_a_quantize_reading_the_float_tensor_as_its_zero_point_is_not_the_group_output() -> None:
    steps = [*_binary_steps("Add")[:3], Step("q_y", "", "QuantizeLinear", ["x", "s", "t"], ["y"])]
    assert "Add" in _ops(_fuse(steps, _constants(), {"a": U8, "b": U8, "y": U8}))


def test_conv_weights_must_be_8_bit() -> None:
    consts = _constants(w=np.ones((2, 3, 1, 1), np.int32), sw=np.array(0.5, np.float32), zw=np.array(0, np.int32))
    steps, types = _conv_group(w_type=I32)
    assert "Conv" in _ops(_fuse(steps, consts, types))


def test_feed_errors_name_at_most_five_unknown_tensors_and_every_wrong_dimension() -> None:
    model = _qdq_chain()
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[0].dim_value = 1
    dims[1].dim_value = 6
    session = IntegerSession(model)
    with pytest.raises(InputError, match=r"^unknown tensor name\(s\) \['a', 'b', 'c', 'd', 'e'\]: not produced"):
        session.run(list("abcdef"), {"x": np.zeros((1, 6), np.float32)})
    with pytest.raises(
        InputError, match=r"\(index 0: got 2, expected 1, index 1: got 5, expected 6\) for shape \[1, 6\]$"
    ):
        session.run(None, {"x": np.zeros((2, 5), np.float32)})


def test_a_relu_in_the_default_domain_spelled_ai_onnx_is_removed_too() -> None:
    steps = _act_steps("Relu", z="z0")
    steps[1].domain = "ai.onnx"
    assert "Relu" not in _ops(_fuse(steps, _constants(z0=np.array(0, np.uint8)), {"y": U8}))


def test_a_step_of_another_domain_does_not_stop_the_groups_after_it() -> None:
    steps = [Step("custom", "custom", "Foo", ["u"], ["v"]), *_binary_steps("Add")]
    assert "QLinearAdd" in _ops(_fuse(steps, _constants(), {"a": U8, "b": U8, "y": U8}))


def test_the_reference_preset_runs_float_ops_with_a_kernel_of_ours_in_onnx_reference() -> None:
    node = helper.make_node("Relu", ["x"], ["y"], name="relu")
    model = _model([node], [], inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])])
    assert [s.runner for s in IntegerSession(model, "onnx-reference").plan()] == ["onnx.reference"]
    assert [s.runner for s in IntegerSession(model, "tflite").plan()] == ["kernel"]


def test_an_omitted_optional_output_is_neither_stored_nor_reported() -> None:
    """LayerNormalization's Mean left out (``""``) between Y and InvStdDev: the run reports only the
    named outputs, each with its value as the formula gives it (epsilon 1e-5)."""
    scale = numpy_helper.from_array(np.ones(6, np.float32), "g")
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g"], ["d", "", "isd"], name="ln"),
        helper.make_node("Relu", ["d"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes, "ln", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6])], [scale],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    x = np.arange(6, dtype=np.float32).reshape(1, 6)
    seen: dict[str, np.ndarray] = {}
    (y,) = IntegerSession(model).run(None, {"x": x}, on_tensor=seen.setdefault)
    assert list(seen) == ["d", "isd", "y"]
    inv_std = 1 / math.sqrt(np.var(np.arange(6)) + 1e-5)  # variance 17.5 / 6
    np.testing.assert_allclose(seen["isd"].reshape(-1), [inv_std], rtol=1e-6)
    np.testing.assert_allclose(y, np.maximum((np.arange(6) - 2.5) * inv_std, 0).reshape(1, 6), rtol=1e-6, atol=1e-6)


def test_the_float_step_is_found_up_a_chain_of_any_length_and_a_cycle_ends() -> None:
    """300 float ops after the DequantizeLinear: its scale (the walk stopped after 256 before, and the
    tensor was judged in ulps); a cycle (no valid model has one) gives None instead of looping."""
    scale = numpy_helper.from_array(np.array(0.25, np.float32), "s")
    chain = [helper.make_node("DequantizeLinear", ["q", "s"], ["t0"])]
    chain += [helper.make_node("Neg", [f"t{i}"], [f"t{i + 1}"]) for i in range(300)]
    assert float_step(_model(chain, [scale]), "t300") == 0.25
    cycle = [helper.make_node("Neg", ["b"], ["a"]), helper.make_node("Neg", ["a"], ["b"])]
    assert float_step(_model(cycle, []), "a") is None


def test_a_sequence_output_is_left_out_of_the_compared_tensors() -> None:
    """SplitToSequence's output is a list, no tensor: the gate compares the Relu output only."""
    nodes = [
        helper.make_node("SplitToSequence", ["x"], ["s"], axis=1, name="split"),
        helper.make_node("Relu", ["x"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes, "seq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6]),
         helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    result = agreement.check_agreement(model, {"x": np.arange(6, dtype=np.float32).reshape(1, 6) - 2})
    assert result.ok
    assert [(t.tensor, t.elements, t.mismatches) for t in result.tensors] == [("y", 6, 0)]
