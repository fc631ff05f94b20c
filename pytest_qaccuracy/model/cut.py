"""A model pair cut at intermediate tensors, so that an analysis measures there, not at the outputs.

Horizon's accuracy debug tool calls this ``output_node``: node sensitivity measured on a chosen
layer instead of on the model outputs, to ask "which nodes spoil this layer" (for example the
backbone's last feature map, before a head that hides the error). Both models of the pair are cut:
their graph outputs become the chosen fp32 tensors and their quantized counterparts (found by
:mod:`.matching`; a ``DequantizeLinear`` output where the quantizer put a pair, so the measured value
is the one the next layer reads), and every node that the new outputs do not need is dropped.
Nodes after the cut are then no longer part of the pair: an analysis neither runs nor reports them.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence

import onnx

from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.model.graph import live_nodes, node_reads
from pytest_qaccuracy.model.pair import ModelPair


def cut_pair(pair: ModelPair, names: Sequence[str]) -> ModelPair:
    """``pair`` with both models ending at ``names``: fp32 tensors, fp32 node names (their outputs),
    quantized-model tensors that have an fp32 counterpart, or model outputs.

    The cut pair keeps the original file paths (results still name the models they came from).

    Raises:
        InputError: a name is neither a matched tensor nor a node with a matched output; the message
            lists close names that would do.
    """
    if not names:
        raise InputError("no tensor to cut the models at: give at least one tensor or node name")
    chosen = _resolve(pair, names)
    fp32 = _ending_at(pair.fp32, [f for f, _ in chosen], pair.matcher.f.elem_types)
    quantized = _ending_at(pair.quantized, [q for _, q in chosen], pair.matcher.q.elem_types)
    cut = ModelPair(fp32, quantized, pair.mapping)
    cut.fp32_path, cut.quantized_path = pair.fp32_path, pair.quantized_path
    return cut


def measurable(pair: ModelPair) -> dict[str, str]:
    """Every fp32 tensor an analysis can be measured at, with its quantized counterpart (not the
    graph inputs: nothing lies before them to analyse)."""
    table = {m.fp32: m.quantized for m in pair.matching.matches if m.node is not None}
    table.update(pair.output_pairs())
    return table


def _resolve(pair: ModelPair, names: Sequence[str]) -> list[tuple[str, str]]:
    """(fp32 tensor, quantized tensor) for every requested name, in order, without repeats."""
    table = measurable(pair)
    by_quantized = {q: f for f, q in table.items()}
    node_outputs = {n.name: [o for o in n.output if o in table] for n in pair.fp32.graph.node if n.name}
    chosen: list[tuple[str, str]] = []
    for name in names:
        if name in table:
            found = [name]
        elif name in by_quantized:
            found = [by_quantized[name]]
        elif node_outputs.get(name):
            found = node_outputs[name]
        else:
            raise InputError(_unknown(pair, name, [*table, *(n for n, outs in node_outputs.items() if outs)]))
        chosen.extend((f, table[f]) for f in found if (f, table[f]) not in chosen)
    return chosen


def _unknown(pair: ModelPair, name: str, known: Iterable[str]) -> str:
    inputs = {spec.name for spec in pair.inputs}  # fed inputs, not weights listed as inputs
    if name in inputs:
        return f"cannot measure at {name!r}: it is an input of {pair.fp32_path.name}, which both models share"
    node = next((n for n in pair.fp32.graph.node if n.name == name), None)
    if node is not None:  # e.g. a Conv whose Relu the quantizer folded: its own output has no counterpart
        return (
            f"cannot measure at {name!r}: the output(s) of this node of {pair.fp32_path.name} "
            f"({', '.join(node.output)}) have no counterpart in {pair.quantized_path.name}; "
            "measure at the node after it"
        )
    close = difflib.get_close_matches(name, list(known), n=5, cutoff=0.5)
    hint = f"; close names: {', '.join(close)}" if close else ""
    return (
        f"cannot measure at {name!r}: not a tensor or node of {pair.fp32_path.name} with a counterpart in "
        f"{pair.quantized_path.name}{hint}"
    )


def _ending_at(model: onnx.ModelProto, outputs: Sequence[str], types: dict[str, int]) -> onnx.ModelProto:
    """A copy of ``model`` whose graph outputs are ``outputs``, without the nodes they do not need."""
    keep = live_nodes(list(model.graph.node), outputs)
    needed = set(outputs).union(*(node_reads(n) for n in keep))
    weights = {t.name for t in model.graph.initializer}
    graph = onnx.helper.make_graph(
        keep,
        model.graph.name,
        [v for v in model.graph.input if v.name in needed or v.name not in weights],  # data binds every input
        [_value_info(name, types.get(name)) for name in outputs],
        [t for t in model.graph.initializer if t.name in needed],
        value_info=[v for v in model.graph.value_info if v.name in needed],
    )
    cut = onnx.helper.make_model(graph, opset_imports=list(model.opset_import))
    cut.ir_version = model.ir_version
    cut.functions.extend(model.functions)
    return cut


def _value_info(name: str, elem_type: int | None) -> onnx.ValueInfoProto:
    if elem_type is None:
        return onnx.ValueInfoProto(name=name)
    return onnx.helper.make_tensor_value_info(name, elem_type, None)
