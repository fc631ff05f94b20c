"""What a recipe costs at deployment: the work its non-int8 nodes do in a wider type.

A node's work is its multiply-accumulates (Conv, ConvTranspose, MatMul, Gemm: output elements times
the reduction length) or, for every other op, its output elements (one operation each). A recipe's
cost is ``sum(work(n) * weight[precision(n)])`` over its nodes, with weights ``int8 = 0``, ``int16``
and ``float`` configurable (:data:`DEFAULT_WEIGHTS`: both 1). Every target a search measures on is
onnxruntime's CPU provider (this host, or an emulated preset of it), and there a 16-bit QDQ node runs
in float between its Q/DQ pairs (no 16-bit integer kernels): it costs what a float node does, so by
default the search never pays for 16-bit (float is at least as accurate at the same cost).
``int16=0.5`` models accelerators with 16-bit integer units, where a 16-bit node does half the extra
work of a float one. Global choices (calibration, per-channel, 7-bit weights, types) cost nothing:
they change no node's type. Costs are reported as a fraction of the whole model in float
(``relative``), so 0.02 means "2 % of the model's work stays wide".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from pytest_qaccuracy.analysis.recipe.space import Recipe
from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.model.graph import GraphView

#: The weights a search uses unless given others (onnxruntime's CPU provider: 16-bit runs in float).
DEFAULT_WEIGHTS = {"int16": 1.0, "float": 1.0}
#: Ops whose work is output elements times a reduction length, and how to read that length.
_MAC_OPS = {"Conv", "ConvTranspose", "MatMul", "Gemm"}


def node_work(model: onnx.ModelProto) -> dict[str, float]:
    """Work of every named node of ``model`` (shape-inferred): MACs, or output elements."""
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = _shapes(inferred)
    work = {}
    for node in GraphView(inferred).nodes:
        if not node.name:
            continue
        out = shapes.get(node.output[0]) if node.output else None
        elements = float(np.prod(out)) if out is not None else 1.0
        work[node.name] = elements * _reduction(node, shapes)
    return work


def _shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """Known static shapes (unknown dimensions count as 1)."""
    table = {}
    for value in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        dims = value.type.tensor_type.shape.dim if value.type.HasField("tensor_type") else None
        if dims is not None and value.type.tensor_type.HasField("shape"):
            table[value.name] = tuple(d.dim_value if d.dim_value > 0 else 1 for d in dims)
    for init in model.graph.initializer:
        table[init.name] = tuple(init.dims)
    return table


def _reduction(node: onnx.NodeProto, shapes: Mapping[str, tuple[int, ...]]) -> float:
    """Multiply-accumulates per output element (1 for ops that are not products)."""
    if node.op_type not in _MAC_OPS or len(node.input) < 2:
        return 1.0
    weight = shapes.get(node.input[1])
    if not weight:
        return 1.0
    if node.op_type == "Conv":  # (M, C/group, kh, kw): C/group * kh * kw products per output
        return float(np.prod(weight[1:]))
    if node.op_type == "ConvTranspose":  # (C, M/group, kh, kw): C/group * kh * kw / strides per output
        group = next((a.i for a in node.attribute if a.name == "group"), 1) or 1
        strides = next((list(a.ints) for a in node.attribute if a.name == "strides"), [1])
        return float(np.prod(weight[2:])) * weight[0] / group / float(np.prod(strides))
    if node.op_type == "Gemm":
        trans_b = any(a.name == "transB" and a.i for a in node.attribute)
        return float(weight[1] if trans_b else weight[0])
    return float(weight[-2] if len(weight) >= 2 else weight[0])  # MatMul: (..., K, N)


@dataclass(frozen=True, slots=True)
class CostModel:
    """Weights of the wide precisions; ``work``: node -> MACs or elements (:func:`node_work`)."""

    work: Mapping[str, float]
    int16: float = 1.0
    float: float = 1.0

    def __post_init__(self) -> None:
        if not 0 <= self.int16 <= self.float:
            raise InputError(
                f"cost weights must satisfy 0 <= int16 <= float, got int16={self.int16}, float={self.float}"
            )

    @property
    def total(self) -> float:
        return float(sum(self.work.values())) or 1.0

    def node(self, node: str, precision: str) -> float:
        weight = {"int8": 0.0, "int16": self.int16, "float": self.float}[precision]
        return weight * self.work.get(node, 1.0)

    def absolute(self, recipe: Recipe) -> float:
        return sum(self.node(n, "int16") for n in recipe.int16) + sum(self.node(n, "float") for n in recipe.float)

    def relative(self, recipe: Recipe) -> float:
        """The recipe's cost as a fraction of the whole model in float."""
        return self.absolute(recipe) / (self.total * self.float if self.float else self.total)


def parse_weights(text: str) -> dict[str, float]:
    """``"int16=0.5,float=1"`` -> weights; InputError naming the bad part otherwise."""
    weights = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if name.strip() not in ("int16", "float"):
            raise InputError(f"cost weight {part!r}: expected int16=W or float=W")
        try:
            weights[name.strip()] = float(value)
        except ValueError:
            raise InputError(f"cost weight {part!r}: {value!r} is not a number") from None
    return weights
