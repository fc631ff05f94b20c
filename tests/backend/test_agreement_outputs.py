"""The agreement gate sees what the checks see (issue 32, item 2): every model output and every tensor
the checks read is compared, float ones in units in the last place, so a gate cannot pass while the
outputs differ although every 8-bit tensor agrees."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pytest_qaccuracy.backend import get_scheme
from pytest_qaccuracy.backend.agreement import AgreementChecker, check_agreement, steps_apart

#: the onnxruntime preset with numpy's exact exp for float Sigmoid instead of MLAS's polynomial: its
#: 8-bit tensors are onnxruntime's, its float Sigmoid is not
EXACT_EXP = get_scheme("onnxruntime").replace(float_kernels="numpy")
X = np.random.default_rng(0).normal(0, 3, (4, 64)).astype(np.float32)


def _sigmoid_model(output_in_float: bool) -> onnx.ModelProto:
    """x -> Q -> DQ -> Sigmoid, the Sigmoid's output a float graph output (or quantized again)."""
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
        helper.make_node("Sigmoid", ["xd"], ["y" if output_in_float else "sig"]),
    ]
    if not output_in_float:
        nodes += [
            helper.make_node("QuantizeLinear", ["sig", "ys", "z"], ["yq"]),
            helper.make_node("DequantizeLinear", ["yq", "ys", "z"], ["y"]),
        ]
    inits = [
        numpy_helper.from_array(np.float32(0.05), "s"),
        numpy_helper.from_array(np.float32(1 / 255), "ys"),
        numpy_helper.from_array(np.uint8(0), "z"),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64])]
    graph = helper.make_graph(nodes, "sigmoid", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_a_float_output_that_differs_fails_the_gate_although_every_8_bit_tensor_agrees() -> None:
    result = check_agreement(_sigmoid_model(True), {"x": X}, scheme=EXACT_EXP)
    by_name = {t.tensor: t for t in result.tensors}
    assert by_name["xq"].mismatches == 0  # the only 8-bit tensor agrees
    assert not result.ok and result.first_divergence == "y"
    assert by_name["y"].elements == X.size and 0 < by_name["y"].mismatches <= X.size
    assert "first divergence at 'y'" in result.summary()


def test_a_float_output_the_emulation_computes_as_onnxruntime_passes() -> None:
    """The same float Sigmoid quantized again: its table reproduces onnxruntime's QLinearSigmoid."""
    result = check_agreement(_sigmoid_model(False), {"x": X}, scheme="onnxruntime")
    assert result.ok and {t.tensor for t in result.tensors} >= {"xq", "y"}, result.summary()


def test_tensors_the_checks_read_are_compared_too() -> None:
    """A float interior tensor named by the caller is compared (and asked for on both sides)."""
    model = _sigmoid_model(False)
    checker = AgreementChecker(model, scheme=EXACT_EXP, tensors=["sig"])
    checker.update({"x": X})
    result = checker.result()
    assert "sig" in {t.tensor for t in result.tensors}
    assert not AgreementChecker(model, scheme=EXACT_EXP).watched.count("sig")


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_float_steps_are_units_in_the_last_place(dtype: type) -> None:
    a = np.array([1.0, -2.5, 0.0, 3.0, np.nan, np.nan, 7.0], dtype)
    b = a.copy()
    b[0] = np.nextafter(a[0], dtype(2))  # one ulp up
    b[1] = np.nextafter(np.nextafter(a[1], dtype(0)), dtype(0))  # two ulps toward zero
    b[2] = -a[2]  # -0.0 and 0.0 are the same point of the line
    b[3] = np.nextafter(a[3], dtype(-9))
    b[6] = np.nan
    apart = steps_apart(a, b)
    assert apart[:6].tolist() == [1, 2, 0, 1, 0, 0]
    assert apart[6] == np.iinfo(np.int64).max  # a number against NaN
    small = np.array([np.finfo(dtype).smallest_subnormal], dtype)
    assert steps_apart(small, -small).tolist() == [2]  # across zero: +s, 0, -s


def test_integer_steps_are_integer_units() -> None:
    assert steps_apart(np.array([0, 255], np.uint8), np.array([3, 250], np.uint8)).tolist() == [3, 5]
    assert steps_apart(np.array([-7], np.int64), np.array([7], np.int64)).tolist() == [14]


def _s8s8_conv_model() -> onnx.ModelProto:
    """x -> Q(int8) -> DQ -> Conv(int8 weights) -> Q(int8) -> DQ -> y: int8 activations, which a default
    x86 session runs as uint8 and the gate's ``session.qdqisint8allowed=1`` session keeps as int8."""
    rng = np.random.default_rng(32)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"]),
        helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["c", "ys", "xz"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "ys", "xz"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.float32(0.03), "xs"),
        numpy_helper.from_array(np.int8(3), "xz"),
        numpy_helper.from_array(rng.integers(-127, 128, (8, 4, 3, 3)).astype(np.int8), "w"),
        numpy_helper.from_array(np.float32(0.01), "ws"),
        numpy_helper.from_array(np.int8(0), "wz"),
        numpy_helper.from_array(np.float32(0.05), "ys"),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 8, 8])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, 8, 8])]
    graph = helper.make_graph(nodes, "s8s8_conv", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


S8_X = np.random.default_rng(1).normal(0, 1.5, (3, 4, 8, 8)).astype(np.float32)


def _x86_host() -> str:
    """This host's x86 preset (the default session's sums differ between the two families)."""
    host = get_scheme("onnxruntime").name
    if not host.startswith(("onnxruntime-avx2", "onnxruntime-vnni")):
        pytest.skip(f"an x86 host's default session: this host's preset is {host}")
    return host


def test_the_pairs_default_session_is_compared_when_int8_activations_run_as_uint8() -> None:
    """On x86 a default session runs int8 QDQ activations as uint8, which the gate's int8-allowed session
    does not: the outputs are then also compared as the pair computes them, against onnxruntime's
    default session, and named so. Against this host's onnxruntime, so with this host's x86 preset
    (``onnxruntime-avx2`` or ``onnxruntime-vnni``: the default session's u8 x s8 sums saturate on one
    and not on the other)."""
    host = _x86_host()
    result = check_agreement(_s8s8_conv_model(), {"x": S8_X}, scheme=host)
    by_name = {t.tensor: t for t in result.tensors}
    assert result.ok, result.summary()
    assert by_name["y (default session)"].elements == 3 * 8 * 8 * 8
    assert list(by_name)[-1] == "y (default session)"  # after every tensor of the int8-allowed run
    # ARM64 keeps int8 activations (QDQIsInt8Allowed): one session, nothing added; nor for uint8 models
    arm = check_agreement(_s8s8_conv_model(), {"x": S8_X}, scheme="onnxruntime-arm64")
    assert not any(t.tensor.endswith("(default session)") for t in arm.tensors)
    unsigned = check_agreement(_sigmoid_model(False), {"x": X}, scheme=host)
    assert not any(t.tensor.endswith("(default session)") for t in unsigned.tensors)


def test_a_default_session_that_differs_fails_the_gate_although_the_int8_run_agrees() -> None:
    """The emulation of the pair's own session made wrong (its requantization multiplier a power of two):
    every tensor of the gate's int8-allowed run still agrees, and the gate fails on the pair's output."""
    from pytest_qaccuracy.backend import IntegerSession

    host = _x86_host()
    checker = AgreementChecker(_s8s8_conv_model(), scheme=host)
    wrong = get_scheme(host).replace(multiplier="power2")
    checker.deployed = IntegerSession(checker.proto, wrong)
    checker.update({"x": S8_X})
    result = checker.result()
    by_name = {t.tensor: t for t in result.tensors}
    assert all(t.mismatches == 0 for name, t in by_name.items() if not name.endswith("(default session)"))
    assert not result.ok and result.first_divergence == "y (default session)"
    assert by_name["y (default session)"].mismatches > 0
    assert "first divergence at 'y (default session)'" in result.summary()
