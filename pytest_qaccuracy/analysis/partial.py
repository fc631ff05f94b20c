"""Partial quantization of a QDQ model: which Q/DQ pairs each node owns, and models with some removed.

A QDQ model quantizes a tensor where a ``DequantizeLinear`` output feeds a node. Each such *edge*
(consumer node, input position) is one quantization point; a graph output produced by a
``DequantizeLinear`` is an edge too. Removing an edge makes its consumer read the float value the
pair stood for: the ``QuantizeLinear`` input for activations, the fp32 model's initializer for
weights. A *quantized node* is a compute node with its edges: its inputs read through a
DequantizeLinear (activations and weights) and the edges fed by the Q/DQ pair on its outputs.

Any set of enabled edges describes one partially quantized model (:meth:`QdqGraph.build`);
:func:`dirty_nodes` finds what such a model recomputes against a cached configuration, which is what
lets an experiment run only the part of the graph its change reaches.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import onnx
from onnx import numpy_helper

from pytest_qaccuracy.errors import ModelError
from pytest_qaccuracy.model.graph import GraphView, live_nodes, node_reads, renamed_node
from pytest_qaccuracy.model.quant_params import detect_format

#: Ops that only carry quantization (never "quantized nodes" themselves).
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
#: Activations a quantizer may fold into the Q/DQ pair after a node.
FOLDED = ("Relu", "Clip")
#: Consumer index of an edge that is a graph output (position = output index).
OUTPUT = -1

Edge = tuple[int, int]  # (consumer node index or OUTPUT, input position or output index)


@dataclass(frozen=True, slots=True)
class QuantizedNode:
    """A compute node of a QDQ model and the quantization edges it owns.

    ``weights`` are edges whose DequantizeLinear reads a constant; ``inputs`` are activation edges
    on the node's inputs; ``outputs`` are the edges fed by the Q/DQ pair on its outputs.
    """

    name: str
    op_type: str
    index: int
    order: int
    weights: frozenset[Edge]
    inputs: frozenset[Edge]
    outputs: frozenset[Edge]

    def edges(self, kind: str = "node") -> frozenset[Edge]:
        """Edges of one kind: ``node`` (all), ``weight`` or ``activation``."""
        if kind == "weight":
            return self.weights
        if kind == "activation":
            return self.inputs | self.outputs
        if kind == "node":
            return self.weights | self.inputs | self.outputs
        raise ValueError(f"unknown edge kind {kind!r}; expected node, weight or activation")


class QdqGraph:
    """Index of a QDQ model's quantization edges and quantized nodes.

    Args:
        quantized: the QDQ model.
        fp32: the fp32 model, where the float weights of weight edges are looked up.

    Raises:
        ModelError: the model is not a QDQ model (QOperator models cannot be partially quantized).
    """

    def __init__(self, quantized: onnx.ModelProto, fp32: onnx.ModelProto | None = None, name: str = "model") -> None:
        self.model = quantized
        self.view = GraphView(quantized)
        self.name = name
        fmt = detect_format(self.view)
        if fmt != "qdq":
            raise ModelError(
                f"{name}: sensitivity analysis needs a QDQ model (QuantizeLinear/DequantizeLinear pairs around "
                f"float ops); this model is {fmt}. Quantize with quant_format=QuantFormat.QDQ, or compare "
                "QOperator models layer by layer with `qaccuracy compare`"
            )
        self._fp32 = GraphView(fp32) if fp32 is not None else None
        self.float_weights: dict[str, onnx.TensorProto] = {}
        self.sources: dict[Edge, str] = {}
        self.kinds: dict[Edge, str] = {}
        self.unremovable: list[str] = []
        self.quantized_tensor: dict[Edge, str] = {}  # activation edge -> the tensor its Q reads
        self._restore: dict[int, list[onnx.NodeProto]] = {}  # node index -> re-inserted Relu/Clip before it
        self._restored: dict[str, str] = {}
        self._index_edges()

    # -- indexing -------------------------------------------------------------------------------

    def _index_edges(self) -> None:
        view = self.view
        for i, node in enumerate(view.nodes):
            if node.op_type in QDQ_OPS:
                continue
            for pos, name in enumerate(node.input):
                self._add_edge((i, pos), name, node, pos)
        for k, name in enumerate(view.output_names):
            self._add_edge((OUTPUT, k), name, None, k)

    def _add_edge(self, edge: Edge, tensor: str, consumer: onnx.NodeProto | None, pos: int) -> None:
        found = self.view.producer.get(tensor)
        if not tensor or not found or found[1].op_type != "DequantizeLinear":
            return
        dq = found[1]
        upstream = self.view.producer.get(dq.input[0])
        if upstream and upstream[1].op_type == "QuantizeLinear":
            source = upstream[1].input[0]
            if self.view.is_constant(source):  # a float weight quantized in the graph: Q(w) -> DQ
                self.sources[edge], self.kinds[edge] = source, "weight"
                return
            self.quantized_tensor[edge] = source
            self.sources[edge], self.kinds[edge] = self._activation_source(source, tensor), "activation"
            return
        if self.view.is_constant(dq.input[0]):
            weight = self._float_weight(dq, consumer, pos)
            if weight is not None:
                self.sources[edge], self.kinds[edge] = weight, "weight"
                return
        where = consumer.name if consumer is not None else f"graph output {tensor!r}"
        self.unremovable.append(f"{dq.name} -> {where}")

    def _activation_source(self, tensor: str, dequantized: str) -> str:
        """The float value a Q/DQ pair on ``tensor`` stands for (``dequantized``: the pair's output).

        A quantizer may fold a Relu/Clip into the range of the Q after a Conv (the pair then clamps,
        and the Conv writes the Relu's output name). Without the pair the clamp must be redone: the
        fp32 model's Relu/Clip producing ``tensor`` is re-inserted after the quantized producer. When
        the Relu's output is a graph output, onnxruntime gives its name to the pair's output instead
        (the Conv writes ``<name>_QuantizeLinear_Input``), so the fp32 Relu is looked up by that name.
        """
        if tensor in self._restored:
            return self._restored[tensor]
        found = self.view.producer.get(tensor)
        fp32 = None
        if self._fp32 is not None:
            fp32 = self._fp32.producer.get(tensor) or self._fp32.producer.get(dequantized)
        if not found or not fp32 or fp32[1].op_type not in FOLDED or found[1].op_type == fp32[1].op_type:
            return tensor
        act = onnx.NodeProto()
        act.CopyFrom(fp32[1])
        act.name = f"{tensor}::refolded"
        act.input[0], act.output[0] = tensor, f"{tensor}::refolded"
        for name in act.input[1:]:
            if name and name not in self.float_weights and self._fp32.is_constant(name):
                self.float_weights[name] = numpy_helper.from_array(self._fp32.constant(name), name)
        self._restore.setdefault(found[0] + 1, []).append(act)
        self._restored[tensor] = act.output[0]
        return act.output[0]

    def _float_weight(self, dq: onnx.NodeProto, consumer: onnx.NodeProto | None, pos: int) -> str | None:
        """Name of an initializer holding the fp32 value a weight DequantizeLinear stands for."""
        name = f"{dq.output[0]}::float"
        if name in self.float_weights:
            return name
        if self._fp32 is None:
            return None
        fp32 = self._fp32
        candidates = []
        if consumer is not None and consumer.name:  # unnamed nodes (many exporters) say nothing
            named = [n for n in fp32.nodes if n.name == consumer.name]
            if len(named) == 1 and named[0].op_type == consumer.op_type and pos < len(named[0].input):
                candidates.append(named[0].input[pos])
        candidates += [dq.output[0], dq.input[0].removesuffix("_quantized")]
        quantized = self.view.constant(dq.input[0])
        value = next(
            (
                v
                for v in (fp32.constant(c) for c in candidates if fp32.is_constant(c))
                if v is not None and (quantized is None or v.shape == quantized.shape)
            ),
            None,
        )
        if value is None:
            return None
        self.float_weights[name] = numpy_helper.from_array(value, name)
        return name

    @cached_property
    def nodes(self) -> list[QuantizedNode]:
        """Quantized nodes in topological order (``order`` counts quantized nodes only)."""
        view, out = self.view, []
        by_consumer: dict[int, list[Edge]] = {}
        for edge in self.sources:
            by_consumer.setdefault(edge[0], []).append(edge)
        for i, node in enumerate(view.nodes):
            if node.op_type in QDQ_OPS or node.op_type == "Constant":
                continue
            own = by_consumer.get(i, [])
            weights = frozenset(e for e in own if self.kinds[e] == "weight")
            inputs = frozenset(e for e in own if self.kinds[e] == "activation")
            outputs = frozenset(e for e, t in self.quantized_tensor.items() if t in node.output and e not in own)
            if weights or inputs or outputs:
                out.append(
                    QuantizedNode(
                        node.name or f"{node.op_type}_{i}", node.op_type, i, len(out), weights, inputs, outputs
                    )
                )
        return out

    @cached_property
    def all_edges(self) -> frozenset[Edge]:
        return frozenset(self.sources)

    def node(self, name: str) -> QuantizedNode:
        for node in self.nodes:
            if node.name == name:
                return node
        known = ", ".join(n.name for n in self.nodes[:20])
        raise ModelError(f"{self.name}: no quantized node {name!r}; quantized nodes: {known}")

    def edges_of(self, names: Iterable[str], kind: str = "node") -> frozenset[Edge]:
        edges: frozenset[Edge] = frozenset()
        for name in names:
            edges |= self.node(name).edges(kind)
        return edges

    # -- building -------------------------------------------------------------------------------

    def wiring(self, enabled: frozenset[Edge], keep: Sequence[str] = ()) -> tuple[list[onnx.NodeProto], list[str]]:
        """Nodes (rewired copies, dead ones dropped) and graph output tensors for ``enabled`` edges."""
        nodes = []
        for i, node in enumerate(self.view.nodes):
            nodes.extend(self._restore.get(i, ()))
            disabled = [(pos, self.sources[(i, pos)]) for pos in range(len(node.input)) if (i, pos) in self.sources]
            disabled = [(pos, src) for pos, src in disabled if (i, pos) not in enabled]
            if disabled:
                node = onnx.NodeProto()
                node.CopyFrom(self.view.nodes[i])
                for pos, src in disabled:
                    node.input[pos] = src
            nodes.append(node)
        nodes.extend(self._restore.get(len(self.view.nodes), ()))
        outputs = [
            name if (OUTPUT, k) in enabled or (OUTPUT, k) not in self.sources else self.sources[(OUTPUT, k)]
            for k, name in enumerate(self.view.output_names)
        ]
        return live_nodes(nodes, [*outputs, *keep]), outputs

    def build(self, enabled: frozenset[Edge], extra_outputs: Sequence[str] = ()) -> onnx.ModelProto:
        """A whole model with only ``enabled`` edges quantized; its outputs keep the original names.

        ``extra_outputs`` are internal tensors to expose as well (kept alive, appended to the outputs).
        """
        extra = [name for name in extra_outputs if name not in self.view.output_names]
        nodes, outputs = self.wiring(enabled, extra)
        # an output that other nodes also read keeps its pair for them: that pair's tensor moves aside
        produced = {o for node in nodes for o in node.output}
        aside = {
            n: f"{n}::quantized"
            for n, t in zip(self.view.output_names, outputs, strict=True)
            if t != n and n in produced
        }
        nodes = _with_tensors_renamed(nodes, aside) if aside else nodes
        renamed = []
        for name, tensor in zip(self.view.output_names, outputs, strict=True):
            if tensor != name:
                renamed.append(onnx.helper.make_node("Identity", [tensor], [name], name=f"{name}::float"))
        return self.make_model(nodes + renamed, self.view.input_names, [*self.view.output_names, *extra])

    def make_model(
        self,
        nodes: Sequence[onnx.NodeProto],
        inputs: Sequence[str] | Sequence[onnx.ValueInfoProto],
        outputs: Sequence[str],
    ) -> onnx.ModelProto:
        """A model of ``nodes`` with the initializers they read (the quantized model's or float weights)."""
        used = {name for node in nodes for name in node_reads(node)}
        inits = [t for t in self.model.graph.initializer if t.name in used]
        inits += [t for name, t in self.float_weights.items() if name in used]
        originals = {v.name: v for v in self.model.graph.input}
        graph_inputs = [
            v if isinstance(v, onnx.ValueInfoProto) else originals.get(v, onnx.ValueInfoProto(name=v)) for v in inputs
        ]
        graph = onnx.helper.make_graph(
            list(nodes),
            f"{self.model.graph.name}_partial",
            graph_inputs,
            [onnx.ValueInfoProto(name=o) for o in outputs],
            inits,
        )
        model = onnx.helper.make_model(graph, opset_imports=list(self.model.opset_import))
        model.ir_version = self.model.ir_version
        model.functions.extend(self.model.functions)
        return model


def _with_tensors_renamed(nodes: Sequence[onnx.NodeProto], names: dict[str, str]) -> list[onnx.NodeProto]:
    """``nodes``, with copies of those that read or write a tensor of ``names`` using its new name."""
    return [renamed_node(n, names) if (node_reads(n) | set(n.output)) & names.keys() else n for n in nodes]


def dirty_nodes(
    nodes: Sequence[onnx.NodeProto], cached: Sequence[onnx.NodeProto], constants: set[str]
) -> tuple[list[onnx.NodeProto], set[str]]:
    """Nodes of a model whose outputs differ from a cached model's, and the clean tensors they read.

    A node is clean when the cached model has a node with the same outputs and inputs, all of them
    clean or constant: its outputs then equal the cached values. Tensors computed from constants
    alone (a weight's DequantizeLinear, a Constant) are never read from the cache: their nodes are
    recomputed with the dirty ones, since they have no batch axis to split records on. Returns
    (dirty nodes in order, clean non-constant tensors read by dirty nodes).
    """
    signature = {tuple(n.output): tuple(n.input) for n in cached}
    reads = {id(n): node_reads(n) for n in nodes}  # subgraphs read outer tensors without inputs
    folded = set(constants)  # constants and what is computed from constants alone
    for node in nodes:
        if all(name in folded for name in reads[id(node)]):
            folded.update(o for o in node.output if o)
    dirty_tensors: set[str] = set()
    dirty_ids = set()
    for node in nodes:
        same = signature.get(tuple(node.output)) == tuple(node.input)
        if same and not reads[id(node)] & dirty_tensors:
            continue
        dirty_ids.add(id(node))
        dirty_tensors.update(o for o in node.output if o)
    producers = {o: n for n in nodes for o in n.output if o}
    boundary: set[str] = set()
    pending = [name for n in nodes if id(n) in dirty_ids for name in reads[id(n)]]
    while pending:
        name = pending.pop()
        if not name or name in dirty_tensors or name in constants:
            continue
        source = producers.get(name)
        if name in folded and source is not None:
            if id(source) not in dirty_ids:
                dirty_ids.add(id(source))
                pending.extend(reads[id(source)])
        else:
            boundary.add(name)
    return [n for n in nodes if id(n) in dirty_ids], boundary
