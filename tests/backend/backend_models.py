"""Shared builders for the integer-backend tests: one-node models, quantized nets, real runtimes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

MS = "com.microsoft"


def tensor_type(dtype: np.dtype | type) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def node_model(
    op_type: str,
    inputs: Sequence[tuple[str, np.dtype | type, Sequence[int | None]]],
    initializers: dict[str, np.ndarray],
    output_dtype: np.dtype | type,
    *,
    domain: str = "",
    n_outputs: int = 1,
    model_opset: int = 13,
    input_order: Sequence[str] | None = None,
    **attrs: object,
) -> onnx.ModelProto:
    """A model of one node. Inputs are listed by name in ``input_order`` ("" for an absent one)."""
    names = list(input_order) if input_order is not None else [n for n, _, _ in inputs] + list(initializers)
    outputs = [f"y{i}" if i else "y" for i in range(n_outputs)]
    node = helper.make_node(op_type, names, outputs, domain=domain, **attrs)
    graph = helper.make_graph(
        [node],
        op_type,
        [helper.make_tensor_value_info(n, tensor_type(d), list(s)) for n, d, s in inputs],
        [helper.make_tensor_value_info(o, tensor_type(output_dtype), None) for o in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in initializers.items()],
    )
    opsets = [helper.make_opsetid("", model_opset)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def ort_session(model: onnx.ModelProto | str | Path, *, int8_fusion: bool = True) -> ort.InferenceSession:
    """onnxruntime with deployed kernels and full optimizations (int8 QDQ fusion on when asked)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = 1
    if int8_fusion:
        options.add_session_config_entry("session.qdqisint8allowed", "1")
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort_session(model).run(None, feeds)


def random_q(rng: np.random.Generator, dtype: np.dtype | type, shape: Sequence[int]) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, size=tuple(shape)).astype(dtype)


def assert_same(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    """Bit-exact equality with a short message (count, first positions, values)."""
    __tracebackhide__ = True
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    diff = got != want
    if diff.any():
        where = np.argwhere(diff)[:5]
        pairs = ", ".join(f"{tuple(int(i) for i in w)}: {got[tuple(w)]} vs {want[tuple(w)]}" for w in where)
        pytest.fail(f"{what}: {int(diff.sum())} / {diff.size} elements differ; first: {pairs}")


# -- float nets quantized by onnxruntime.quantization ------------------------------------------


class _Reader:
    def __init__(self, name: str, batches: list[np.ndarray]):
        self._items = iter([{name: b} for b in batches])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._items, None)


def quantize_qdq(
    model: onnx.ModelProto,
    calibration: np.ndarray,
    tmp_path: Path,
    *,
    activation: str = "uint8",
    per_channel: bool = False,
    quant_format: str = "QDQ",
    extra_options: dict | None = None,
    nodes_to_exclude: Sequence[str] = (),
) -> onnx.ModelProto:
    """Quantize a float model with ``quantize_static`` (QDQ or QOperator), minmax calibration."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    src = tmp_path / "float.onnx"
    dst = tmp_path / f"quant_{activation}_{quant_format}_{int(per_channel)}.onnx"
    onnx.save(model, src)
    name = model.graph.input[0].name
    quantize_static(
        str(src),
        str(dst),
        _Reader(name, [calibration[i : i + 4] for i in range(0, len(calibration), 4)]),
        quant_format=QuantFormat.QDQ if quant_format == "QDQ" else QuantFormat.QOperator,
        activation_type=QuantType.QUInt8 if activation == "uint8" else QuantType.QInt8,
        weight_type=QuantType.QInt8,
        per_channel=per_channel,
        calibrate_method=CalibrationMethod.MinMax,
        extra_options=extra_options or {},
        nodes_to_exclude=list(nodes_to_exclude),
    )
    return onnx.load(str(dst))


def float_net(ops: Sequence[str], channels: int = 8, size: int = 12, seed: int = 0, opset: int = 13) -> onnx.ModelProto:
    """A small float CNN whose layers are ``ops`` in sequence (each keeps the NCHW shape)."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    current = "input"
    skip = None
    for i, op in enumerate(ops):
        out = f"t{i}"
        if op in ("Conv", "ConvRelu"):
            w = rng.normal(0, 0.3, (channels, channels, 3, 3)).astype(np.float32)
            b = rng.normal(0, 0.1, channels).astype(np.float32)
            inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
            conv_out = f"c{i}" if op == "ConvRelu" else out
            nodes.append(helper.make_node("Conv", [current, f"w{i}", f"b{i}"], [conv_out], pads=[1, 1, 1, 1]))
            if op == "ConvRelu":
                nodes.append(helper.make_node("Relu", [conv_out], [out]))
        elif op == "DepthwiseConv":
            w = rng.normal(0, 0.5, (channels, 1, 3, 3)).astype(np.float32)
            inits.append(numpy_helper.from_array(w, f"w{i}"))
            nodes.append(helper.make_node("Conv", [current, f"w{i}"], [out], pads=[1, 1, 1, 1], group=channels))
        elif op == "Add":
            nodes.append(helper.make_node("Add", [current, skip or current], [out]))
        elif op == "Mul":
            nodes.append(helper.make_node("Mul", [current, skip or current], [out]))
        elif op == "AveragePool":
            nodes.append(helper.make_node("AveragePool", [current], [out], kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
        elif op == "MaxPool":
            nodes.append(helper.make_node("MaxPool", [current], [out], kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
        elif op in ("Sigmoid", "Relu"):
            nodes.append(helper.make_node(op, [current], [out]))
        elif op == "LeakyRelu":
            nodes.append(helper.make_node(op, [current], [out], alpha=0.1))
        elif op == "Concat":
            nodes.append(helper.make_node("Concat", [current, skip or current], [f"cat{i}"], axis=1))
            w = rng.normal(0, 0.3, (channels, 2 * channels, 1, 1)).astype(np.float32)
            inits.append(numpy_helper.from_array(w, f"w{i}"))
            nodes.append(helper.make_node("Conv", [f"cat{i}", f"w{i}"], [out]))
        elif op == "Transpose":
            nodes.append(helper.make_node("Transpose", [current], [f"tr{i}"], perm=[0, 1, 3, 2]))
            nodes.append(helper.make_node("Transpose", [f"tr{i}"], [out], perm=[0, 1, 3, 2]))
        elif op == "Resize":  # nearest x2 up, then 2x2 average pool back down
            inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), f"sc{i}"))
            nodes.append(helper.make_node("Resize", [current, "", f"sc{i}"], [f"up{i}"], mode="nearest"))
            nodes.append(helper.make_node("AveragePool", [f"up{i}"], [out], kernel_shape=[2, 2], strides=[2, 2]))
        elif op == "Clip":
            inits += [
                numpy_helper.from_array(np.float32(-0.5), f"lo{i}"),
                numpy_helper.from_array(np.float32(0.8), f"hi{i}"),
            ]
            nodes.append(helper.make_node("Clip", [current, f"lo{i}", f"hi{i}"], [out]))
        elif op == "Reshape":
            inits += [numpy_helper.from_array(np.array([0, channels, -1], np.int64), f"s{i}a"),
                      numpy_helper.from_array(np.array([0, channels, size, size], np.int64), f"s{i}b")]  # fmt: skip
            nodes.append(helper.make_node("Reshape", [current, f"s{i}a"], [f"r{i}"]))
            nodes.append(helper.make_node("Unsqueeze", [f"r{i}", f"ax{i}"], [f"u{i}"]))
            nodes.append(helper.make_node("Squeeze", [f"u{i}", f"ax{i}"], [f"q{i}"]))
            nodes.append(helper.make_node("Reshape", [f"q{i}", f"s{i}b"], [out]))
            inits.append(numpy_helper.from_array(np.array([1], np.int64), f"ax{i}"))
        elif op == "Split":
            nodes.append(helper.make_node("Split", [current], [f"p{i}", f"h{i}"], axis=1, num_outputs=2))
            nodes.append(helper.make_node("Concat", [f"h{i}", f"p{i}"], [out], axis=1))
        elif op == "ConvTranspose":
            w = rng.normal(0, 0.3, (channels, channels, 3, 3)).astype(np.float32)
            inits.append(numpy_helper.from_array(w, f"w{i}"))
            nodes.append(helper.make_node("ConvTranspose", [current, f"w{i}"], [out], pads=[1, 1, 1, 1]))
        else:
            raise ValueError(op)
        skip = current
        current = out
    # head: global pool, flatten, gemm, matmul, softmax
    inits += [
        numpy_helper.from_array(rng.normal(0, 0.3, (channels, 10)).astype(np.float32), "fc_w"),
        numpy_helper.from_array(rng.normal(0, 0.1, 10).astype(np.float32), "fc_b"),
        numpy_helper.from_array(rng.normal(0, 0.3, (10, 6)).astype(np.float32), "mm_w"),
    ]
    nodes += [
        helper.make_node("GlobalAveragePool", [current], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["fc"]),
        helper.make_node("MatMul", ["fc", "mm_w"], ["mm"]),
        helper.make_node("Softmax", ["mm"], ["prob"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "net",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", channels, size, size])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def integer_tensors(model: onnx.ModelProto) -> list[str]:
    """Names of the 8-bit tensors that quantized nodes produce (QuantizeLinear and QOperator outputs)."""
    producers = {"QuantizeLinear", "QLinearConv", "QLinearMatMul", "QGemm", "QLinearAdd", "QLinearMul",
                 "QLinearAveragePool", "QLinearGlobalAveragePool", "QLinearConcat", "QLinearSigmoid",
                 "QLinearLeakyRelu", "QLinearSoftmax", "MaxPool"}  # fmt: skip
    inits = {i.name for i in model.graph.initializer}
    return [n.output[0] for n in model.graph.node if n.op_type in producers and n.output[0] not in inits]


def with_outputs(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """A copy of ``model`` whose graph also outputs ``names`` (types left to inference)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    have = {o.name for o in copy.graph.output}
    for name in names:
        if name not in have:
            copy.graph.output.append(helper.make_empty_tensor_value_info(name))
    return copy
