"""Models whose outputs need more than (records, classes) scores, built with onnx.helper:
a YOLO-style detector head with one concatenated output, and an skl2onnx-style classifier."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

BOXES, CLASSES = 4, 6  # detector: box coordinates and class scores in one output (N, 10, 64)
FEATURES, LABELS, STEPS = 12, 10, 4  # classifier: inputs, classes, sequence steps


def detector(path: Path) -> Path:
    rng = np.random.default_rng(0)

    def init(name: str, value: np.ndarray) -> onnx.TensorProto:
        return numpy_helper.from_array(np.asarray(value, np.float32), name)

    c = 8
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["f"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["f"], ["fr"], name="relu"),
        helper.make_node("Conv", ["fr", "wb", "bb"], ["box"], name="box_conv"),
        helper.make_node("Relu", ["box"], ["boxr"], name="box_relu"),
        helper.make_node("Mul", ["boxr", "pixels"], ["boxes"], name="box_scale"),
        helper.make_node("Conv", ["fr", "wc", "bc"], ["cls"], name="cls_conv"),
        helper.make_node("Sigmoid", ["cls"], ["probs"], name="sigmoid"),
        helper.make_node("Concat", ["boxes", "probs"], ["cat"], axis=1, name="cat"),
        helper.make_node("Reshape", ["cat", "shape"], ["output0"], name="flatten"),
    ]
    inits = [
        init("w1", rng.standard_normal((c, 3, 3, 3)) * 0.4),
        init("b1", rng.standard_normal(c) * 0.1),
        init("wb", rng.standard_normal((BOXES, c, 1, 1)) * 0.5),
        init("bb", np.full(BOXES, 0.5)),
        init("pixels", 60.0),
        init("wc", rng.standard_normal((CLASSES, c, 1, 1)) * 0.8),
        init("bc", rng.standard_normal(CLASSES) * 0.5),
        numpy_helper.from_array(np.array([0, BOXES + CLASSES, -1], np.int64), "shape"),
    ]
    graph = helper.make_graph(
        nodes,
        "detector",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["N", BOXES + CLASSES, 64])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def classifier(path: Path) -> Path:
    """skl2onnx's layout: ``label`` int64 (N,) and ``probabilities`` float (N, 10); and a sequence
    ``steps`` (N, 4, 10) of per-step class scores (a CTC head)."""
    rng = np.random.default_rng(7)
    w = numpy_helper.from_array((rng.standard_normal((FEATURES, LABELS)) * 0.6).astype(np.float32), "w")
    ws = numpy_helper.from_array((rng.standard_normal((FEATURES, STEPS * LABELS)) * 0.6).astype(np.float32), "ws")
    shape = numpy_helper.from_array(np.array([0, STEPS, LABELS], np.int64), "shape")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
        helper.make_node("ArgMax", ["logits"], ["label"], axis=1, keepdims=0),
        helper.make_node("MatMul", ["x", "ws"], ["flat"]),
        helper.make_node("Reshape", ["flat", "shape"], ["steps"]),
    ]
    graph = helper.make_graph(
        nodes,
        "classifier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", FEATURES])],
        [
            helper.make_tensor_value_info("label", TensorProto.INT64, ["N"]),
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", LABELS]),
            helper.make_tensor_value_info("steps", TensorProto.FLOAT, ["N", STEPS, LABELS]),
        ],
        [w, ws, shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path
