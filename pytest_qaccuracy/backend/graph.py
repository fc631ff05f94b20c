"""The graph the interpreter runs: steps (nodes with resolved attributes), constants and tensor types."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from pytest_qaccuracy.errors import ModelError

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
    #: the original steps that run together in one onnxruntime session (``weight_groups.py``)
    group: tuple[Step, ...] = ()

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
            _check_representable(value.name, elem)
            with contextlib.suppress(KeyError, TypeError):
                types[value.name] = np.dtype(helper.tensor_dtype_to_np_dtype(elem))
    for init in graph.initializer:
        _check_representable(init.name, init.data_type)
        with contextlib.suppress(KeyError, TypeError):
            types[init.name] = np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type))
    return types


#: float8, 4-bit, 2-bit and float4 element types (those this onnx knows); onnx.reference runs them for us
_NARROW_TYPES = {
    getattr(onnx.TensorProto, name): name
    for name in (
        "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "FLOAT8E8M0",
        "UINT4", "INT4", "FLOAT4E2M1", "UINT2", "INT2",
    )
    if hasattr(onnx.TensorProto, name)
}  # fmt: skip
#: onnx >= 1.19 gives those types their own numpy dtypes (ml_dtypes). Older onnx maps them to int8/uint8/float32
#: in ``helper`` while ``numpy_helper.to_array`` returns float32 (1.16) or its own structured dtypes (1.17, 1.18),
#: so feeds, initializers and ``onnx.reference`` disagree on their representation and 4-bit values are not
#: even saturated to their range.
NARROW_TYPES_SUPPORTED = np.dtype(helper.tensor_dtype_to_np_dtype(onnx.TensorProto.FLOAT8E4M3FN)) != np.float32


def _check_representable(name: str, elem: int) -> None:
    if elem in _NARROW_TYPES and not NARROW_TYPES_SUPPORTED:
        raise ModelError(
            f"tensor '{name}' is {_NARROW_TYPES[elem]}: float8, 4-bit, 2-bit and float4 tensors need onnx >= 1.19 "
            f"(onnx {onnx.__version__} has no numpy dtype for them)"
        )
