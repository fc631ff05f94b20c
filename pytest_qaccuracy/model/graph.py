"""Read-only views of an ONNX graph: producers, consumers, constants, value types, topological order."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property

import numpy as np
import onnx
from onnx import numpy_helper


class GraphView:
    """Index of one model's main graph. Built once; never mutates the model."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.graph = model.graph

    @cached_property
    def nodes(self) -> list[onnx.NodeProto]:
        return list(self.graph.node)

    @cached_property
    def producer(self) -> dict[str, tuple[int, onnx.NodeProto]]:
        """Tensor name -> (node index, node) that outputs it."""
        return {out: (i, node) for i, node in enumerate(self.nodes) for out in node.output if out}

    @cached_property
    def consumers(self) -> dict[str, list[tuple[int, onnx.NodeProto, int]]]:
        """Tensor name -> [(node index, node, input position)]."""
        table: dict[str, list[tuple[int, onnx.NodeProto, int]]] = defaultdict(list)
        for i, node in enumerate(self.nodes):
            for pos, name in enumerate(node.input):
                if name:
                    table[name].append((i, node, pos))
        return table

    @cached_property
    def initializers(self) -> dict[str, onnx.TensorProto]:
        return {t.name: t for t in self.graph.initializer}

    @cached_property
    def input_names(self) -> list[str]:
        init = self.initializers
        return [v.name for v in self.graph.input if v.name not in init]

    @cached_property
    def output_names(self) -> list[str]:
        return [v.name for v in self.graph.output]

    @cached_property
    def elem_types(self) -> dict[str, int]:
        """Tensor name -> ONNX element type, from inputs, outputs, value_info and initializers."""
        types = {t.name: t.data_type for t in self.graph.initializer}
        for value in [*self.graph.input, *self.graph.output, *self.graph.value_info]:
            if value.type.HasField("tensor_type"):
                types[value.name] = value.type.tensor_type.elem_type
        return types

    def constant(self, name: str) -> np.ndarray | None:
        """The value of an initializer or a Constant node's output; None for a computed tensor."""
        if name in self.initializers:
            return numpy_helper.to_array(self.initializers[name])
        found = self.producer.get(name)
        if found and found[1].op_type == "Constant":
            for attr in found[1].attribute:
                if attr.name == "value":
                    return numpy_helper.to_array(attr.t)
        return None

    def is_constant(self, name: str) -> bool:
        found = self.producer.get(name)
        return name in self.initializers or (found is not None and found[1].op_type == "Constant")

    def activations(self) -> list[str]:
        """Node outputs that are computed from inputs (not constants), in topological order."""
        return [out for node in self.nodes if node.op_type != "Constant" for out in node.output if out]

    @cached_property
    def opset(self) -> int:
        return next((o.version for o in self.model.opset_import if o.domain in ("", "ai.onnx")), 0)


def node_reads(node: onnx.NodeProto) -> set[str]:
    """Tensors a node reads: its inputs and, for If/Loop/Scan, what its subgraphs take from outside."""
    names = {x for x in node.input if x}
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for graph in graphs:
            inner_names = {t.name for t in graph.initializer} | {v.name for v in graph.input}
            for inner in graph.node:
                names |= node_reads(inner) - inner_names
            names -= {o for inner in graph.node for o in inner.output}
    return names


def renamed_node(node: onnx.NodeProto, names: Mapping[str, str], name: str | None = None) -> onnx.NodeProto:
    """A copy of ``node`` reading and writing ``names`` under their new names, inside its If/Loop/Scan
    subgraphs too (ONNX names are unique across scopes, so an inner name never shadows an outer one)."""
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    if name is not None:
        copy.name = name
    _rename_in(copy, names)
    return copy


def _rename_in(node: onnx.NodeProto, names: Mapping[str, str]) -> None:
    node.input[:] = [names.get(x, x) for x in node.input]
    node.output[:] = [names.get(x, x) for x in node.output]
    for attr in node.attribute:
        for graph in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
            for inner in graph.node:
                _rename_in(inner, names)


def live_nodes(nodes: Sequence[onnx.NodeProto], outputs: Iterable[str]) -> list[onnx.NodeProto]:
    """The nodes (in order) that ``outputs`` need: a walk backwards from them over what nodes read."""
    needed = set(outputs)
    keep = []
    for node in reversed(nodes):
        if any(o in needed for o in node.output if o):
            keep.append(node)
            needed |= node_reads(node)
    return keep[::-1]


def attribute(node: onnx.NodeProto, name: str, default=None):
    """An attribute's Python value, or ``default`` when the node does not set it."""
    for attr in node.attribute:
        if attr.name == name:
            return onnx.helper.get_attribute_value(attr)
    return default
