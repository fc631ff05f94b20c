"""Small real models for the tests: built with onnx.helper, quantized with onnxruntime.quantization."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _init(rng: np.random.Generator, name: str, shape: tuple[int, ...], scale: float = 0.3) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def conv_net(
    path: Path,
    channels: int = 8,
    size: int = 16,
    classes: int = 10,
    batch: int | str = "N",
    seed: int = 0,
    opset: int = 17,
) -> Path:
    """Conv-Relu, Conv, residual Add, Concat, MaxPool, Conv, GlobalAveragePool, Flatten, Gemm, MatMul."""
    rng = np.random.default_rng(seed)
    c = channels
    inits = [
        _init(rng, "w1", (c, 3, 3, 3)),
        _init(rng, "b1", (c,), 0.1),
        _init(rng, "w2", (c, c, 3, 3), 0.2),
        _init(rng, "b2", (c,), 0.1),
        _init(rng, "w3", (c, 2 * c, 1, 1), 0.3),
        _init(rng, "b3", (c,), 0.1),
        _init(rng, "wg", (classes, c), 0.5),
        _init(rng, "bg", (classes,), 0.1),
        _init(rng, "wm", (classes, classes), 0.5),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["conv1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["conv1"], ["relu1"], name="relu1"),
        helper.make_node("Conv", ["relu1", "w2", "b2"], ["conv2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Add", ["conv2", "relu1"], ["add1"], name="add1"),
        helper.make_node("Concat", ["add1", "relu1"], ["cat1"], axis=1, name="cat1"),
        helper.make_node("MaxPool", ["cat1"], ["pool1"], kernel_shape=[2, 2], strides=[2, 2], name="pool1"),
        helper.make_node("Conv", ["pool1", "w3", "b3"], ["conv3"], name="conv3"),
        helper.make_node("Sigmoid", ["conv3"], ["sig1"], name="sig1"),
        helper.make_node("GlobalAveragePool", ["sig1"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], axis=1, name="flat"),
        helper.make_node("Gemm", ["flat", "wg", "bg"], ["gemm"], transB=1, name="gemm"),
        helper.make_node("MatMul", ["gemm", "wm"], ["logits"], name="matmul"),
    ]
    graph = helper.make_graph(
        nodes,
        "conv_net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, classes])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def small_weights_net(path: Path) -> Path:
    """Two Convs whose int32 biases onnxruntime cannot hold at the weights' own scales: conv1's
    channels 0 and 1 (weights about 1e-9 and 1e-7; the rest plain), all of conv2 (about 1e-7), each
    with a bias of 0.5. onnxruntime raises those weight scales so that input scale x weight scale
    stays above 1.0001 x 2|b| / (2^32 - 2); at ten times the input scale, the 1e-7 weights need no raise."""
    rng = np.random.default_rng(11)
    w1 = rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * np.float32(0.3)
    w1[0] *= np.float32(1e-9 / 0.3)
    w1[1] *= np.float32(1e-7 / 0.3)
    inits = {
        "w1": w1,
        "b1": np.array([0.5, 0.5, 0.1, -0.1], np.float32),
        "w2": rng.standard_normal((2, 4, 3, 3)).astype(np.float32) * np.float32(1e-7),
        "b2": np.array([0.5, -0.5], np.float32),
    }
    return two_convs(path, [("x", "w1", "b1", "c1"), ("r1", "w2", "b2", "y")], inits, (3, 16), (2, 16), relu=True)


def shared_weight_net(path: Path) -> Path:
    """Two Convs reading one weight (about 1e-7, so onnxruntime raises its scale for either bias)."""
    w = (np.random.default_rng(8).standard_normal((2, 2, 3, 3)) * 1e-7).astype(np.float32)
    inits = {"w": w, "b1": np.array([0.5, -0.5], np.float32), "b2": np.array([0.25, 0.5], np.float32)}
    return two_convs(path, [("x", "w", "b1", "c1"), ("c1", "w", "b2", "y")], inits, (2, 8), (2, 8))


def two_convs(
    path: Path,
    convs: list[tuple[str, str, str, str]],
    inits: dict[str, np.ndarray],
    x: tuple[int, int],
    y: tuple[int, int],
    relu: bool = False,
) -> Path:
    """Two 3x3 Convs (input, weight, bias, output each; padded), a Relu from ``c1`` to ``r1`` between
    them if ``relu``; input ``x`` and output ``y`` of (channels, size)."""
    nodes = [
        helper.make_node("Conv", list(c[:3]), [c[3]], pads=[1, 1, 1, 1], name=f"conv{i + 1}")
        for i, c in enumerate(convs)
    ]
    if relu:
        nodes.insert(1, helper.make_node("Relu", ["c1"], ["r1"], name="relu1"))
    graph = helper.make_graph(
        nodes,
        path.stem,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", x[0], x[1], x[1]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", y[0], y[1], y[1]])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def random_inputs(count: int, size: int = 16, seed: int = 1, batch_axis: bool = True) -> np.ndarray:
    rng = np.random.default_rng(seed)
    shape = (count, 1, 3, size, size) if batch_axis else (count, 3, size, size)
    return rng.standard_normal(shape).astype(np.float32)


class ArrayReader:
    """A CalibrationDataReader over an array of records (record axis first)."""

    def __init__(self, name: str, records: np.ndarray) -> None:
        self._items = iter([{name: r} for r in records])

    def get_next(self):
        return next(self._items, None)


def quantize(
    fp32: Path,
    out: Path,
    records: np.ndarray,
    fmt: str = "qdq",
    activation: str = "uint8",
    weight: str = "int8",
    per_channel: bool = False,
    **extra,
) -> Path:
    """Quantize ``fp32`` statically with ORT, calibrated on ``records`` (each with the batch axis)."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    types = {"uint8": QuantType.QUInt8, "int8": QuantType.QInt8}
    quantize_static(
        str(fp32),
        str(out),
        ArrayReader("x", records),
        quant_format=QuantFormat.QDQ if fmt == "qdq" else QuantFormat.QOperator,
        activation_type=types[activation],
        weight_type=types[weight],
        per_channel=per_channel,
        **extra,
    )
    return out


def write_h5(path: Path, records: np.ndarray, labels: np.ndarray | None = None) -> Path:
    """Write records (record axis first, one input) in ONE's layout value/<record>/0."""
    import h5py

    with h5py.File(path, "w") as f:
        group = f.create_group("value")
        for i, record in enumerate(records):
            group.create_dataset(f"{i}/0", data=record)
        if labels is not None:
            f.create_dataset("labels", data=labels)
    return path


def mlp(path: Path, w1: np.ndarray, w2: np.ndarray) -> Path:
    """x[N, in] -> MatMul(w1, name mm1) -> Relu -> MatMul(w2, name mm2) -> y[N, out]: tensors h, r, y."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", w1.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", w2.shape[1]])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path
