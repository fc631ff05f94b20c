"""Bit-exactness against onnxruntime on QDQ models (uint8, and int8 with ``session.qdqisint8allowed=1``).

Float nets are quantized by ``onnxruntime.quantization.quantize_static``; every 8-bit tensor that both
runtimes produce is compared (``check_agreement``), plus the float graph outputs bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from backend_models import (
    assert_same,
    float_net,
    ort_session,
    quantize_qdq,
    random_q,
)
from onnx import TensorProto, helper, numpy_helper

from pytest_qaccuracy.backend import IntegerSession, get_scheme
from pytest_qaccuracy.backend.agreement import AgreementResult, check_agreement

NETS = {
    "conv-pool-act": ["Conv", "ConvRelu", "DepthwiseConv", "AveragePool", "MaxPool", "Sigmoid", "LeakyRelu"],
    "residual": ["Conv", "Add", "Conv", "Mul", "Concat", "Transpose", "Relu"],
    "data-movement": ["Conv", "Resize", "Clip", "Reshape", "Split", "ConvTranspose", "Conv"],
}


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    return rng.normal(0, 1, (16, 8, 12, 12)).astype(np.float32), rng.normal(0, 1.2, (6, 8, 12, 12)).astype(np.float32)


@pytest.mark.parametrize("net", NETS)
@pytest.mark.parametrize("activation", ["uint8", "int8"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_quantized_net_agrees(net, activation, per_channel, data, tmp_path: Path) -> None:
    calibration, records = data
    model = quantize_qdq(
        float_net(NETS[net], opset=18), calibration, tmp_path, activation=activation, per_channel=per_channel
    )
    result = check_agreement(model, {"input": records})
    assert result.ok, result.summary()
    assert len(result.tensors) >= 10 and all(t.mismatches == 0 for t in result.tensors)
    # session.qdqisint8allowed=1 fuses int8 activations as int8; the preset then keeps them too
    int8_fused = get_scheme("onnxruntime").replace(name="onnxruntime", qdq_int8_to_uint8=False)
    want = ort_session(model).run(None, {"input": records})[0]
    got = IntegerSession(model, int8_fused).run(None, {"input": records})[0]
    assert_same(got, want, "softmax output")
    # a default x86 session runs int8 activations as uint8 (QDQS8ToU8), as the preset does by default
    want = ort_session(model, int8_fusion=False).run(None, {"input": records})[0]
    got = IntegerSession(model).run(None, {"input": records})[0]
    assert_same(got, want, "softmax output, default session")


def test_qoperator_net_agrees(data, tmp_path: Path) -> None:
    calibration, records = data
    model = quantize_qdq(float_net(NETS["residual"]), calibration, tmp_path, quant_format="QOperator", per_channel=True)
    assert any(n.op_type == "QLinearConv" for n in model.graph.node)
    result = check_agreement(model, {"input": records})
    assert result.ok, result.summary()


def _qdq_group(op_type: str, x_params, y_params, *, extra_inputs=(), dtype=np.uint8, **attrs) -> onnx.ModelProto:
    """``x -> DQ -> op -> Q -> y`` with constant parameters; extra inputs are (name, array) initializers."""
    tt = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits = [
        numpy_helper.from_array(np.float32(x_params[0]), "xs"),
        numpy_helper.from_array(np.array(x_params[1], dtype), "xz"),
        numpy_helper.from_array(np.float32(y_params[0]), "ys"),
        numpy_helper.from_array(np.array(y_params[1], dtype), "yz"),
    ]
    inits += [numpy_helper.from_array(np.asarray(v), n) for n, v in extra_inputs]
    nodes = [
        helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xf"]),
        helper.make_node(op_type, ["xf", *(n for n, _ in extra_inputs)], ["yf"], **attrs),
        helper.make_node("QuantizeLinear", ["yf", "ys", "yz"], ["y"]),
    ]
    graph = helper.make_graph(nodes, op_type, [helper.make_tensor_value_info("x", tt, None)],
                              [helper.make_tensor_value_info("y", tt, None)], inits)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


GROUPS = {
    "relu-zp-not-min": ("Relu", (0.05, 100), (0.03, 7), (), {}),
    "relu-implied": ("Relu", (0.05, 100), (0.05, 0), (), {}),
    "clip-narrow": ("Clip", (0.05, 100), (0.02, 60), (("lo", np.float32(-1.0)), ("hi", np.float32(2.5))), {}),
    "maxpool-requant": ("MaxPool", (0.05, 100), (0.07, 3), (), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    "maxpool-same": ("MaxPool", (0.05, 100), (0.05, 100), (), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "reshape-requant": ("Reshape", (0.05, 100), (0.11, 9), (("shape", np.array([0, -1], np.int64)),), {}),
    "transpose-same": ("Transpose", (0.05, 100), (0.05, 100), (), {"perm": [0, 2, 3, 1]}),
    "resize-nearest": (
        "Resize",
        (0.05, 100),
        (0.06, 1),
        (("roi", np.zeros(0, np.float32)), ("scales", np.array([1, 1, 2, 3], np.float32))),
        {"mode": "nearest"},
    ),
    "sigmoid": ("Sigmoid", (0.05, 100), (1 / 256, 0), (), {}),
    "softmax": ("Softmax", (0.05, 100), (1 / 256, 0), (), {"axis": 1}),
    "global-average-pool": ("GlobalAveragePool", (0.5, 101), (0.5, 3), (), {}),
}


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qdq_group(group, dtype) -> None:
    op_type, xp, yp, extra, attrs = GROUPS[group]
    if dtype == np.int8:
        xp, yp = (xp[0], xp[1] - 128), (yp[0], yp[1] - 128)
    model = _qdq_group(op_type, xp, yp, extra_inputs=extra, dtype=dtype, **attrs)
    x = random_q(np.random.default_rng(1), dtype, (3, 4, 6, 6))
    want = ort_session(model).run(None, {"x": x})[0]
    got = IntegerSession(model).run(None, {"x": x})[0]
    assert_same(got, want, group)


def test_intermediate_inside_fused_group_matches_unfused_runtime(data, tmp_path: Path) -> None:
    """Asking for a float tensor inside a QDQ group leaves that group unfused, as ORT does for an output."""
    calibration, records = data
    model = quantize_qdq(float_net(["Conv", "Conv"]), calibration, tmp_path)
    conv_out = next(n.output[0] for n in model.graph.node if n.op_type == "Conv")
    q_out = next(n.output[0] for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == conv_out)
    extended = onnx.ModelProto()
    extended.CopyFrom(model)
    extended.graph.output.extend([helper.make_tensor_value_info(conv_out, TensorProto.FLOAT, None),
                                  helper.make_empty_tensor_value_info(q_out)])  # fmt: skip
    want = ort_session(extended).run([conv_out, q_out], {"input": records})
    session = IntegerSession(model)
    got = session.run([conv_out, q_out], {"input": records})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    assert_same(got[1], want[1], q_out)
    fused = session.run([q_out], {"input": records})[0]  # fused path: exact integer kernel
    assert np.count_nonzero(fused != got[1]) <= 2  # the float path may differ at rare exact ties


def test_agreement_reports_first_divergence(data, tmp_path: Path) -> None:
    calibration, records = data
    model = quantize_qdq(float_net(NETS["residual"]), calibration, tmp_path)
    result = check_agreement(model, {"input": records}, scheme="glow")
    assert not result.ok and result.first_divergence is not None
    first = next(t for t in result.tensors if t.tensor == result.first_divergence)
    assert all(t.max_steps == 0 for t in result.tensors if t.order < first.order)
    assert "first divergence at" in result.summary()
    assert AgreementResult.from_dict(result.to_dict()) == result
    loose = check_agreement(model, {"input": records}, scheme="glow", max_steps=255)
    assert loose.ok


def test_agreement_checker_streams_batches(data, tmp_path: Path) -> None:
    from pytest_qaccuracy.backend.agreement import AgreementChecker

    calibration, records = data
    model = quantize_qdq(float_net(NETS["residual"]), calibration, tmp_path)
    checker = AgreementChecker(model, scheme="tflite", max_steps=1)
    for start in range(0, len(records), 2):
        checker.update({"input": records[start : start + 2]})
    streamed = checker.result()
    whole = check_agreement(model, {"input": records}, scheme="tflite", max_steps=1)
    assert streamed == whole and streamed.records == len(records)


@pytest.mark.parametrize("per_channel", [False, True])
def test_qdq_groups_become_integer_kernels(per_channel: bool, data, tmp_path: Path) -> None:
    calibration, _ = data
    model = quantize_qdq(float_net(NETS["conv-pool-act"]), calibration, tmp_path, per_channel=per_channel)
    ops = [step.op for step in IntegerSession(model).plan()]
    for fused in ("ai.onnx::QLinearConv", "ai.onnx::QLinearMatMul", "com.microsoft::QGemm",
                  "com.microsoft::QLinearAveragePool", "com.microsoft::QLinearSigmoid",
                  "com.microsoft::QLinearLeakyRelu", "com.microsoft::QLinearGlobalAveragePool",
                  "com.microsoft::QLinearSoftmax"):  # fmt: skip
        assert fused in ops
    assert not {"ai.onnx::Conv", "ai.onnx::MatMul", "ai.onnx::Gemm", "ai.onnx::Sigmoid"} & set(ops)


def _fan_out_net() -> onnx.ModelProto:
    """``c1`` feeds two convs whose sum feeds ``c4``: an int8 tensor read by two nodes."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    for name, source, cin, cout in (("c1", "x", 8, 8), ("c2", "c1", 8, 8), ("c3", "c1", 8, 8), ("c4", "s", 8, 4)):
        inits.append(numpy_helper.from_array(rng.normal(0, 0.3, (cout, cin, 3, 3)).astype(np.float32), f"{name}_w"))
        nodes.append(helper.make_node("Conv", [source, f"{name}_w"], [name], name=name, pads=[1, 1, 1, 1]))
    nodes.insert(3, helper.make_node("Add", ["c2", "c3"], ["s"], name="add"))
    graph = helper.make_graph(
        nodes,
        "fan_out",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 8, 10, 10])],
        [helper.make_tensor_value_info("c4", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_default_session_fuses_the_int8_groups_onnxruntime_fuses(tmp_path: Path) -> None:
    """A default x86 session converts an int8 QDQ pair to uint8 only when its DequantizeLinear has one
    reader; a Conv whose input and output then differ in type stays in float. The plan must fuse the
    same groups as onnxruntime's optimized graph (here: c1, c2, c3 in float; the Add and c4 fused)."""
    rng = np.random.default_rng(1)
    calibration = rng.normal(0, 1, (16, 8, 10, 10)).astype(np.float32)
    model = quantize_qdq(_fan_out_net(), calibration, tmp_path, activation="int8", per_channel=True)
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    theirs = [n.op_type for n in onnx.load(tmp_path / "optimized.onnx").graph.node if "Conv" in n.op_type]
    ours = [step.op.split("::")[1] for step in IntegerSession(model).plan() if "Conv" in step.op]
    assert sorted(ours) == sorted(theirs) == ["Conv", "Conv", "Conv", "QLinearConv"]
    records = rng.normal(0, 1.2, (6, 8, 10, 10)).astype(np.float32)
    assert_same(IntegerSession(model).run(None, {"x": records})[0], session.run(None, {"x": records})[0], "c4")
