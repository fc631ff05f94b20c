"""A Graphviz DOT graph of the fp32 model coloured by one metric, in the manner of ONE's visq DotBuilder.

* a ``color_table`` legend node (HTML-like label, one row per colour slot);
* one node per op, named by its first output tensor; compared ops are ``style=filled`` with the slot
  colour and ``xlabel="METRIC: value"``, ops that were not compared are gray;
* graph inputs and outputs are plain nodes; edges go producer -> consumer;
* initializers and ``Constant`` ops are left out.

Graphviz is not needed to write the file; ``dot -Tsvg x.dot`` or any DOT viewer renders it.
"""

from __future__ import annotations

import html
import os
from pathlib import Path

import onnx

from pytest_qaccuracy.analysis.results import ComparisonResult
from pytest_qaccuracy.atomic import atomic_write_text
from pytest_qaccuracy.numbers import format_fixed
from pytest_qaccuracy.report._palette import DARK, Slot, error_map, metric_slots, slot_color
from pytest_qaccuracy.report.visq import visq_document

GRAY = "gray"
_CONSTANT_OPS = frozenset({"Constant"})


def quote(text: str) -> str:
    """``text`` as a DOT double-quoted string that displays as ``text`` when used as a label.

    DOT only unescapes ``\\"`` in IDs, but labels (``\\N`` included) treat backslashes as escapes,
    so backslashes are doubled and newlines become ``\\n``.
    """
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "").replace("\n", "\\n")
    return f'"{escaped}"'


def label(text: str) -> str:
    """``text`` as a quoted DOT label; ``&`` becomes ``&amp;`` because Graphviz decodes entities in labels."""
    return quote(text.replace("&", "&amp;"))


def _legend(metric: str, slots: list[Slot]) -> str:
    name = html.escape(metric)
    rows = []
    for s in slots:
        text = f"{name}: {format_fixed(s.begin)} ~ {format_fixed(s.end)}"
        if s.color in DARK:
            text = f'<font color="white">{text}</font>'
        rows.append(f'<tr><td bgcolor="{s.color}">{text}</td></tr>')
    return f'<<table border="0" cellborder="1" cellspacing="0" cellpadding="4">{"".join(rows)}</table>>'


def _unique(base: str, taken: set[str]) -> str:
    name, i = base, 1
    while name in taken:
        name, i = f"{base} ({i})", i + 1
    return name


def _ops(graph: onnx.GraphProto) -> tuple[list[tuple[str, onnx.NodeProto]], dict[str, str], set[str]]:
    """The drawn ops as ``(node id, node)``, the producer node id of each tensor, and the constant tensors."""
    # a sparse initializer has no name of its own: it is named by its values tensor (onnx.proto)
    constants = {init.name for init in graph.initializer} | {s.values.name for s in graph.sparse_initializer}
    producer: dict[str, str] = {}
    ops: list[tuple[str, onnx.NodeProto]] = []
    for index, node in enumerate(graph.node):
        outputs = [o for o in node.output if o]
        if node.op_type in _CONSTANT_OPS and node.domain in ("", "ai.onnx"):
            constants.update(outputs)
            continue
        node_id = outputs[0] if outputs else node.name or f"{node.op_type}_{index}"
        producer.update((o, node_id) for o in outputs)
        ops.append((node_id, node))
    return ops, producer, constants


def dot_document(model: onnx.ModelProto, result: ComparisonResult, metric: str) -> str:
    """The DOT text of ``model`` (the fp32 model) coloured by ``metric`` of ``result``.

    Args:
        model: the fp32 model the comparison ran on (only its main graph is drawn).
        result: the comparison.
        metric: a metric of the result; colours come from the same slots as its visq.json.

    Returns:
        A ``digraph`` named after the fp32 model file, ending with a newline.

    Raises:
        InputError: ``metric`` is not one of the result's metrics.
    """
    visq_document(result, metric)  # validates the metric with the same message
    graph = model.graph
    errors = error_map(result, metric)
    slots = metric_slots(result, metric, errors)
    metric_label = metric.upper()
    ops, producer, constants = _ops(graph)
    taken = set(producer.values()) | {i.name for i in graph.input if i.name not in constants}

    lines = [f"digraph {quote(Path(result.fp32_model).name)} {{", "  forcelabels=true;"]
    legend = _unique("color_table", taken)
    taken.add(legend)
    lines.append(f"  {quote(legend)} [shape=none, margin=0, label={_legend(metric_label, slots)}];")
    for graph_input in graph.input:
        if graph_input.name not in constants:
            lines.append(f"  {quote(graph_input.name)} [shape=plaintext, label={label(graph_input.name)}];")
            producer[graph_input.name] = graph_input.name
    for node_id, node in ops:
        value = next((errors[o] for o in node.output if o in errors), None)
        text = label(f"{node_id}\n{node.op_type}")
        if value is None:
            lines.append(f"  {quote(node_id)} [label={text}, style=filled, fillcolor={GRAY}];")
        else:
            color, xlabel = slot_color(slots, value), label(f"{metric_label}: {format_fixed(value)}")
            font = ", fontcolor=white" if color in DARK else ""
            attrs = f'label={text}, style=filled, fillcolor="{color}"{font}, xlabel={xlabel}'
            lines.append(f"  {quote(node_id)} [{attrs}];")
    edges: dict[tuple[str, str], None] = {}
    for node_id, node in ops:
        for name in node.input:
            if name and name not in constants and name in producer:
                edges[(producer[name], node_id)] = None
    for graph_output in graph.output:
        out_id = _unique(graph_output.name, taken)
        taken.add(out_id)
        lines.append(f"  {quote(out_id)} [shape=plaintext, label={label(graph_output.name)}];")
        if graph_output.name in producer:
            edges[(producer[graph_output.name], out_id)] = None
    lines += [f"  {quote(src)} -> {quote(dst)};" for src, dst in edges]
    lines.append("}")
    return "\n".join(lines) + "\n"


def write_dot(path: str | os.PathLike[str], model: onnx.ModelProto, result: ComparisonResult, metric: str) -> Path:
    """Write :func:`dot_document` to ``path`` atomically; returns the path."""
    return atomic_write_text(path, dot_document(model, result, metric))
