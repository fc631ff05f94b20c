"""The graph the interpreter runs: steps (nodes with resolved attributes), constants and tensor types."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

#: Prefix of tensors that QDQ fusion creates; they are never reported to callers.
INTERNAL_PREFIX = "qaccuracy::"


@dataclass(slots=True)
class Step:
    """One node to run: op identity, wiring, attributes as Python values, and its source node."""

    name: str
    domain: str
    op_type: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    proto: onnx.NodeProto | None = None
    #: names of the original nodes this step replaces (QDQ fusion), for messages
    fused: tuple[str, ...] = ()

    def describe(self) -> str:
        fused = f" (fused from {', '.join(self.fused)})" if self.fused else ""
        return f"node '{self.name}' ({self.domain or 'ai.onnx'}::{self.op_type}){fused}"


def attribute_value(attr: onnx.AttributeProto) -> Any:
    """An attribute as a Python value: ints, floats, strings, lists, numpy arrays for tensors."""
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode("utf-8") for v in value]
    return value


def steps_from_graph(graph: onnx.GraphProto) -> list[Step]:
    steps = []
    for index, node in enumerate(graph.node):
        name = node.name or f"{node.op_type}_{index}"
        attrs = {a.name: attribute_value(a) for a in node.attribute}
        steps.append(Step(name, node.domain, node.op_type, list(node.input), list(node.output), attrs, node))
    return steps


def tensor_types(model: onnx.ModelProto) -> dict[str, np.dtype]:
    """numpy dtype of every tensor whose type is known (inputs, initializers, inferred value infos)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # contrib ops or odd models: fall back to what the model declares
        inferred = model
    types: dict[str, np.dtype] = {}
    graph = inferred.graph
    for value in [*graph.input, *graph.output, *graph.value_info]:
        elem = value.type.tensor_type.elem_type
        if elem:
            with contextlib.suppress(KeyError, TypeError):
                types[value.name] = np.dtype(helper.tensor_dtype_to_np_dtype(elem))
    for init in graph.initializer:
        with contextlib.suppress(KeyError, TypeError):
            types[init.name] = np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type))
    return types
