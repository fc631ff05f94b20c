"""Benchmark models: a detector-like conv net with 50+ Conv layers, built with onnx.helper."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class _Builder:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.convs = 0

    def conv(self, x: str, cin: int, cout: int, k: int = 3, stride: int = 1, relu: bool = True) -> str:
        i = self.convs = self.convs + 1
        std = np.sqrt(2.0 / (cin * k * k))
        w = (self.rng.standard_normal((cout, cin, k, k)) * std).astype(np.float32)
        self.inits += [
            numpy_helper.from_array(w, f"w{i}"),
            numpy_helper.from_array((self.rng.standard_normal(cout) * 0.05).astype(np.float32), f"b{i}"),
        ]
        pad = k // 2
        out = f"conv{i}"
        self.nodes.append(
            helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [out], pads=[pad] * 4, strides=[stride] * 2, name=out)
        )
        if relu:
            self.nodes.append(helper.make_node("Relu", [out], [f"relu{i}"], name=f"relu{i}"))
            return f"relu{i}"
        return out

    def block(self, x: str, c: int) -> str:
        y = self.conv(self.conv(x, c, c), c, c, relu=False)
        out = f"res{self.convs}"
        self.nodes.append(helper.make_node("Add", [x, y], [out], name=out))
        self.nodes.append(helper.make_node("Relu", [out], [out + "_relu"], name=out + "_relu"))
        return out + "_relu"

    def op(self, op_type: str, inputs: list[str], out: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out


def detector(path: Path, size: int = 256, widths=(8, 16, 32, 64), blocks=(4, 6, 6, 7), seed: int = 0) -> Path:
    """Stem, four residual stages with stride-2 transitions, an upsampling head: 53 Conv layers."""
    b = _Builder(seed)
    x = b.conv("x", 3, widths[0], stride=2)
    features = []
    for stage, (width, count) in enumerate(zip(widths, blocks, strict=True)):
        if stage:
            x = b.conv(x, widths[stage - 1], width, stride=2)
        for _ in range(count):
            x = b.block(x, width)
        features.append(x)
    scales = b.op("Constant", [], "up_scales", value=numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32)))
    up = b.op("Resize", [features[3], "", scales], "up3", mode="nearest")
    x = b.conv(b.op("Concat", [up, features[2]], "cat3", axis=1), widths[3] + widths[2], widths[2], k=1)
    up = b.op("Resize", [x, "", scales], "up2", mode="nearest")
    x = b.conv(b.op("Concat", [up, features[1]], "cat2", axis=1), widths[2] + widths[1], widths[1], k=1)
    x = b.conv(x, widths[1], 1, k=1, relu=False)
    b.op("Sigmoid", [x], "prob")
    graph = helper.make_graph(
        b.nodes,
        "detector",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, size, size])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, ["N", 1, size // 4, size // 4])],
        b.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def images(count: int, size: int = 256, seed: int = 1) -> np.ndarray:
    """Smooth random images (record axis first, each with a batch axis of 1)."""
    rng = np.random.default_rng(seed)
    coarse = rng.standard_normal((count, 1, 3, size // 16, size // 16)).astype(np.float32)
    return np.repeat(np.repeat(coarse, 16, axis=3), 16, axis=4) + 0.1 * rng.standard_normal(
        (count, 1, 3, size, size)
    ).astype(np.float32)


def count_convs(path: Path) -> int:
    return sum(n.op_type == "Conv" for n in onnx.load(str(path)).graph.node)
