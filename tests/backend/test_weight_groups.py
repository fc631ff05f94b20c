"""16-bit activations with 8-bit weights: the float MatMul/Gemm on dequantized weights, as onnxruntime runs it.

onnxruntime 1.32 rewrites a DequantizeLinear of constant weights feeding a MatMul/Gemm into
``com.microsoft::MatMulNBits`` (int8 blocks of the activations, accuracy level 4); 1.18 runs the float
GEMM as written. The host preset runs each such group on this machine's onnxruntime, so both agree bit
for bit; the other x86 family's preset refuses a group this onnxruntime rewrites.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from backend_models import assert_same, ort_session
from onnx import TensorProto, helper, numpy_helper

from pytest_qaccuracy.backend import IntegerSession
from pytest_qaccuracy.backend.agreement import check_agreement
from pytest_qaccuracy.backend.host import host_preset
from pytest_qaccuracy.errors import ModelError, UnsupportedOpError


def _mlp() -> onnx.ModelProto:
    """x[N, 40] -> Gemm (bias) -> Relu -> MatMul -> Softmax: K = 40 and 32, one block and a partial one."""
    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.3, (40, 32)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(0, 0.1, (32,)).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.normal(0, 0.3, (32, 10)).astype(np.float32), "w2"),
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="gemm"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["logits"], name="matmul"),
        helper.make_node("Softmax", ["logits"], ["y"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 40])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 10])], inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


class _Reader:
    def __init__(self, batches: list[np.ndarray]):
        self.batches = iter(batches)

    def get_next(self) -> dict[str, np.ndarray] | None:
        batch = next(self.batches, None)
        return None if batch is None else {"x": batch}


def _quantized(tmp_path: Path, activation: str, per_channel: bool) -> onnx.ModelProto:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    calibration = np.random.default_rng(4).normal(0, 1, (32, 40)).astype(np.float32)
    onnx.save(_mlp(), tmp_path / "float.onnx")
    dst = tmp_path / f"{activation}_{int(per_channel)}.onnx"
    quantize_static(
        str(tmp_path / "float.onnx"),
        str(dst),
        _Reader([calibration[i : i + 8] for i in range(0, 32, 8)]),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QInt16 if activation == "int16" else QuantType.QUInt16,
        weight_type=QuantType.QInt8 if activation == "int16" else QuantType.QUInt8,
        per_channel=per_channel,
        calibrate_method=CalibrationMethod.MinMax,
    )
    return onnx.load(str(dst))


def _onnxruntime_ops(model: onnx.ModelProto, tmp_path: Path) -> list[str]:
    """The op types of onnxruntime's optimized graph (default session, all optimizations)."""
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node]


RECORDS = np.random.default_rng(5).normal(0, 1.1, (24, 40)).astype(np.float32)


@pytest.mark.parametrize("activation", ["int16", "uint16"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_16_bit_activations_agree_with_onnxruntime(activation: str, per_channel: bool, tmp_path: Path) -> None:
    model = _quantized(tmp_path, activation, per_channel)
    assert {i.data_type for i in model.graph.initializer if i.name.endswith("zero_point")} >= {
        TensorProto.INT16 if activation == "int16" else TensorProto.UINT16
    }
    session = IntegerSession(model)
    groups = [s for s in session.plan() if s.op in ("ai.onnx::Gemm", "ai.onnx::MatMul")]
    assert [s.runner for s in groups] == ["onnxruntime", "onnxruntime"]
    # grouped with their weight DequantizeLinear where onnxruntime fuses them (1.32), as written otherwise (1.18)
    fuses = "MatMulNBits" in _onnxruntime_ops(model, tmp_path)
    assert [any(n.endswith("DequantizeLinear") for n in s.fused_from) for s in groups] == [fuses, fuses]
    # the default session (what is deployed) and the agreement gate's session, every 16-bit tensor
    want = ort_session(model, int8_fusion=False).run(None, {"x": RECORDS})[0]
    assert_same(session.run(None, {"x": RECORDS})[0], want, "softmax output, default session")
    result = check_agreement(model, {"x": RECORDS})
    assert result.ok, result.summary()
    assert len(result.tensors) >= 4 and all(t.mismatches == 0 for t in result.tensors)


def test_the_float_gemm_is_not_what_onnxruntime_computes(tmp_path: Path) -> None:
    """Where onnxruntime fuses the weights (MatMulNBits), the GEMM as written (numpy's float kernels)
    is many steps away from it: the grouping is what makes the host preset exact."""
    model = _quantized(tmp_path, "int16", False)
    if "MatMulNBits" not in _onnxruntime_ops(model, tmp_path):
        pytest.skip(f"onnxruntime {ort.__version__} runs the float GEMM as written (no MatMulNBits)")
    numpy_floats = IntegerSession(model, "onnxruntime").scheme.replace(name="numpy floats", float_kernels="numpy")
    result = check_agreement(model, {"x": RECORDS}, scheme=numpy_floats)
    first = result.tensors[1] if len(result.tensors) > 1 else result.tensors[0]
    assert not result.ok and max(t.max_steps for t in result.tensors) > 5, (first, result.summary())


def test_other_family_preset_refuses_a_group_onnxruntime_rewrites(tmp_path: Path) -> None:
    model = _quantized(tmp_path, "int16", True)
    if "MatMulNBits" not in _onnxruntime_ops(model, tmp_path):
        pytest.skip(f"onnxruntime {ort.__version__} runs the float GEMM as written (no MatMulNBits)")
    host = host_preset()
    other = "onnxruntime-vnni" if host == "onnxruntime-avx2" else "onnxruntime-avx2"
    with pytest.raises(UnsupportedOpError) as info:
        IntegerSession(model, other)
    message = str(info.value)
    assert "\n" not in message
    for part in ("node 'gemm'", "int8 weights", "activations int16", "MatMulNBits", f"'{host}'", f"'{other}'"):
        assert part in message, message


def test_a_weight_dequantize_with_two_readers_is_not_grouped(tmp_path: Path) -> None:
    """onnxruntime fuses a weight DequantizeLinear with one reader only; so does the grouping."""
    model = _quantized(tmp_path, "int16", False)
    gemm = next(n for n in model.graph.node if n.op_type == "Gemm")
    model.graph.output.append(helper.make_tensor_value_info(gemm.input[1], TensorProto.FLOAT, None))
    session = IntegerSession(model)
    plan = {s.node: s for s in session.plan()}
    assert plan["gemm"].fused_from == ()
    want = ort_session(model, int8_fusion=False).run(None, {"x": RECORDS})
    for got, theirs, name in zip(session.run(None, {"x": RECORDS}), want, ["y", gemm.input[1]], strict=True):
        assert_same(got, theirs, name)


@pytest.mark.parametrize("kind", [TensorProto.INT4, TensorProto.UINT4])
def test_4_bit_weights_in_the_microsoft_domain_are_refused_with_their_type(kind: int) -> None:
    """quantize_static writes 4-bit weights below opset 21 as com.microsoft DequantizeLinear: refused in
    one line that names the node, the domain, the tensor and its 4-bit type."""
    weights = helper.make_tensor("w", kind, [4, 3], list(range(12)) if kind == TensorProto.UINT4 else [-4, 3] * 6)
    inits = [weights, numpy_helper.from_array(np.float32(0.5), "s")]
    nodes = [
        helper.make_node("DequantizeLinear", ["w", "s"], ["wf"], name="w_dq", domain="com.microsoft"),
        helper.make_node("MatMul", ["x", "wf"], ["y"], name="mm"),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], inits,
    )  # fmt: skip
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    name = "int4" if kind == TensorProto.INT4 else "uint4"
    if tuple(map(int, onnx.__version__.split(".")[:2])) < (1, 19):
        with pytest.raises(ModelError) as old:  # onnx before 1.19 has no numpy type for 4-bit tensors
            IntegerSession(model)
        assert f"tensor 'w' is {name.upper()}" in str(old.value) and "\n" not in str(old.value)
        return
    with pytest.raises(UnsupportedOpError) as info:
        IntegerSession(model)
    message = str(info.value)
    assert "\n" not in message
    for part in ("node 'w_dq'", "com.microsoft::DequantizeLinear", f"tensor 'w' is {name}", "not support"):
        assert part in message, message


@pytest.mark.parametrize("activation", ["int16", "uint16"])
def test_a_group_output_asked_for_is_what_onnxruntime_then_computes(activation: str, tmp_path: Path) -> None:
    """With the Gemm's float output as a graph output (and a QuantizeLinear reading it), onnxruntime 1.32
    computes the float GEMM; the emulation asked for it (as a graph output, or by name) does the same."""
    model = _quantized(tmp_path, activation, False)
    gemm = next(n for n in model.graph.node if n.op_type == "Gemm")
    quantized = next(
        n.output[0] for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == gemm.output[0]
    )
    model.graph.output.append(helper.make_tensor_value_info(gemm.output[0], TensorProto.FLOAT, None))
    model.graph.output.append(onnx.ValueInfoProto(name=quantized))
    names = ["y", gemm.output[0], quantized]
    want = ort_session(model, int8_fusion=False).run(names, {"x": RECORDS})
    as_outputs = IntegerSession(model).run(names, {"x": RECORDS})
    for got, theirs, name in zip(as_outputs, want, names, strict=True):
        assert_same(got, theirs, name)
    model.graph.output.pop()
    model.graph.output.pop()
    by_name = IntegerSession(model).run(names, {"x": RECORDS})
    for got, theirs, name in zip(by_name, want, names, strict=True):
        assert_same(got, theirs, f"{name} (asked by name)")


def test_a_weight_only_group_is_refused_naming_its_float_activation(tmp_path: Path) -> None:
    """A float activation times a DequantizeLinear'd int8 weight (weight-only quantization): no
    DequantizeLinear produces the activation, so the refusal names the graph input's own type."""
    weights = np.random.default_rng(6).integers(-8, 8, (40, 32)).astype(np.int8)
    inits = [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(np.full(32, 0.05, np.float32), "s")]
    nodes = [
        helper.make_node("DequantizeLinear", ["w", "s"], ["wd"], name="dq", axis=1),
        helper.make_node("MatMul", ["x", "wd"], ["y"], name="mm"),
    ]
    graph = helper.make_graph(
        nodes, "weight_only", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 40])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 32])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    if "MatMulNBits" not in _onnxruntime_ops(model, tmp_path):
        pytest.skip(f"onnxruntime {ort.__version__} runs the float MatMul as written (no MatMulNBits)")
    host = host_preset()
    other = "onnxruntime-vnni" if host == "onnxruntime-avx2" else "onnxruntime-avx2"
    with pytest.raises(UnsupportedOpError) as info:
        IntegerSession(model, other)
    assert str(info.value).startswith(
        "node 'mm' (ai.onnx::MatMul, int8 weights from DequantizeLinear 'dq', activations float32): "
        f"onnxruntime {ort.__version__} runs it as com.microsoft::MatMulNBits"
    )
