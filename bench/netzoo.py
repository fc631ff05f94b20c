"""Benchmark models with 50+ Conv layers, built with onnx.helper.

- :func:`detector`: dense residual stages of 8-64 channels (much compute per activation byte);
- :func:`mobile_detector`: a MobileNetV2-style backbone (inverted residuals: 1x1 expansion x6,
  depthwise 3x3, 1x1 projection) with a DB-like top-down head, the shape of deployed int8 text
  detectors: wide activations at high resolution, little compute per activation byte.
"""

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

    def conv(self, x: str, cin: int, cout: int, k: int = 3, stride: int = 1, relu: bool = True, group: int = 1) -> str:
        i = self.convs = self.convs + 1
        std = np.sqrt(2.0 / (cin // group * k * k))
        w = (self.rng.standard_normal((cout, cin // group, k, k)) * std).astype(np.float32)
        self.inits += [
            numpy_helper.from_array(w, f"w{i}"),
            numpy_helper.from_array((self.rng.standard_normal(cout) * 0.05).astype(np.float32), f"b{i}"),
        ]
        pad = k // 2
        out = f"conv{i}"
        self.nodes.append(
            helper.make_node(
                "Conv", [x, f"w{i}", f"b{i}"], [out], pads=[pad] * 4, strides=[stride] * 2, group=group, name=out
            )
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

    def inverted_residual(self, x: str, cin: int, cout: int, stride: int, expand: int) -> str:
        """MobileNetV2's block: 1x1 expansion, depthwise 3x3, linear 1x1 projection, residual if shapes agree."""
        hidden = cin * expand
        y = self.conv(x, cin, hidden, k=1) if expand > 1 else x
        y = self.conv(y, hidden, hidden, stride=stride, group=hidden)
        y = self.conv(y, hidden, cout, k=1, relu=False)
        if stride == 1 and cin == cout:
            return self.op("Add", [x, y], f"res{self.convs}")
        return y

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
    return _save(b, path, "detector", size, size // 4)


def mobile_detector(path: Path, size: int = 256, seed: int = 0) -> Path:
    """Stem, MobileNetV2 stages (expansion 6) down to 1/32, a top-down head back to 1/4: 54 Conv layers."""
    b = _Builder(seed)
    x, cin = b.conv("x", 3, 16, stride=2), 16
    stages = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2))
    features = {}
    for expand, cout, count, stride in stages:
        for i in range(count):
            x, cin = b.inverted_residual(x, cin, cout, stride if i == 0 else 1, expand), cout
        features[cout] = x
    scales = b.op("Constant", [], "up_scales", value=numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32)))
    top = b.conv(features[160], 160, 32, k=1)
    for width in (96, 32, 24):  # from 1/32 up to 1/16, 1/8, 1/4
        lateral = b.conv(features[width], width, 32, k=1)
        top = b.op("Resize", [top, "", scales], f"up{width}", mode="nearest")
        top = b.op("Add", [top, lateral], f"fpn{width}")
    x = b.conv(top, 32, 32)
    x = b.conv(x, 32, 1, k=1, relu=False)
    b.op("Sigmoid", [x], "prob")
    return _save(b, path, "mobile_detector", size, size // 4)


def _save(b: _Builder, path: Path, name: str, size: int, out_size: int) -> Path:
    graph = helper.make_graph(
        b.nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, size, size])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, ["N", 1, out_size, out_size])],
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
