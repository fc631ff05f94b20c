"""The fp32 model's graph coloured by one metric, as inline SVG for the HTML report.

The nodes and colours are those of the DOT artifact (:mod:`.dot`): one node per op, filled with the
metric's visq slot colour (gray when the op was not compared), plus the graph's inputs and outputs.
Each compared node links to its row in the report (``#<anchor>``). Graphviz lays the graph out
here (``dot -Tsvg``); :mod:`.drawing` falls back to the built-in layered layout (:mod:`.layout`)
when ``dot`` is missing or fails. Graphviz's SVG is parsed and rebuilt from an allow-list of
elements and attributes, so the page holds only markup this module chose, whatever the tensor names are.
"""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass

import onnx

from pytest_qaccuracy.analysis.results import ComparisonResult
from pytest_qaccuracy.numbers import format_metric
from pytest_qaccuracy.report._palette import DARK, error_map, metric_slots, slot_color
from pytest_qaccuracy.report.dot import _ops, label
from pytest_qaccuracy.report.tables import shorten

#: Fill of an op that was not compared (Graphviz's X11 ``gray``, as in the DOT artifact).
GRAY = "#c0c0c0"
#: Longest label line; the full name is in the node's tooltip.
LABEL_WIDTH = 30
GRAPHVIZ_TIMEOUT = 60.0
SVG_NS = "http://www.w3.org/2000/svg"

_ALLOWED_TAGS = frozenset({"svg", "g", "polygon", "polyline", "path", "ellipse", "text", "rect", "line"})
_ALLOWED_ATTRS = frozenset(
    {"id", "class", "fill", "stroke", "stroke-width", "stroke-dasharray", "points", "d", "cx", "cy", "rx", "ry"}
    | {"x", "y", "width", "height", "viewBox", "transform", "text-anchor", "font-family", "font-size"}
    | {"font-weight", "font-style", "x1", "x2", "y1", "y2"}
)


@dataclass(frozen=True, slots=True)
class GraphNode:
    """One drawn node: an op, or a graph input or output (``kind``)."""

    kind: str
    lines: tuple[str, ...]
    title: str
    fill: str | None = None
    tensor: str | None = None
    anchor: str | None = None

    @property
    def dark(self) -> bool:
        return self.fill in DARK


@dataclass(frozen=True, slots=True)
class Graph:
    """Nodes in model order and edges as ``(source index, target index)``."""

    nodes: tuple[GraphNode, ...]
    edges: tuple[tuple[int, int], ...]
    metric: str


def build_graph(
    model: onnx.ModelProto, result: ComparisonResult, metric: str, anchors: Mapping[str, str] | None = None
) -> Graph:
    """The nodes and edges of ``model``'s main graph coloured by ``metric`` of ``result``.

    Args:
        model: the fp32 model.
        result: the comparison.
        metric: the metric that colours the nodes (same slots as its visq.json).
        anchors: fp32 tensor name -> id of its row in the page; a node links to its tensor's row.
    """
    graph, anchors = model.graph, anchors or {}
    errors = error_map(result, metric)
    slots = metric_slots(result, metric, errors)
    ops, producer, constants = _ops(graph)
    nodes: list[GraphNode] = []
    index: dict[str, int] = {}
    for graph_input in graph.input:
        if graph_input.name not in constants:
            index[graph_input.name] = len(nodes)
            nodes.append(GraphNode("input", (shorten(graph_input.name, LABEL_WIDTH),), graph_input.name))
    for node_id, node in ops:
        index[node_id] = len(nodes)
        nodes.append(_op_node(node_id, node, errors, slots, metric, anchors))
    edges: dict[tuple[int, int], None] = {}
    producer.update((name, name) for name in index if name not in producer)
    for node_id, node in ops:
        for name in node.input:
            if name and name not in constants and name in producer:
                edges[(index[producer[name]], index[node_id])] = None
    for graph_output in graph.output:
        nodes.append(GraphNode("output", (shorten(graph_output.name, LABEL_WIDTH),), graph_output.name))
        if graph_output.name in producer:
            edges[(index[producer[graph_output.name]], len(nodes) - 1)] = None
    return Graph(tuple(nodes), tuple(edges), metric)


def _op_node(
    node_id: str,
    node: onnx.NodeProto,
    errors: Mapping[str, float],
    slots: list,
    metric: str,
    anchors: Mapping[str, str],
) -> GraphNode:
    tensor = next((o for o in node.output if o in errors), None)
    lines = (shorten(node_id, LABEL_WIDTH), node.op_type)
    if tensor is None:
        return GraphNode("op", lines, f"{node_id} ({node.op_type}): not compared", GRAY)
    text = f"{metric.upper()} {format_metric(metric, errors[tensor])}"
    title = f"{node_id} ({node.op_type})\n{text}"
    return GraphNode("op", (*lines, text), title, slot_color(slots, errors[tensor]), tensor, anchors.get(tensor))


def graph_dot(graph: Graph) -> str:
    """DOT text for Graphviz's layout: node ids ``n<i>``; labels, fills and ids of our choosing."""
    lines = [
        "digraph G {",
        '  graph [rankdir=TB, nodesep=0.2, ranksep=0.3, bgcolor="transparent"];',
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10, margin="0.08,0.03",'
        ' fillcolor="white", color="#57606a", penwidth=0.8];',
        '  edge [color="#8c959f", arrowsize=0.6];',
    ]
    for i, node in enumerate(graph.nodes):
        attrs = [f"id=n{i}", f"label={label(chr(10).join(node.lines))}"]
        if node.kind != "op":
            attrs += ["shape=plaintext", 'style=""']
        else:
            attrs.append(f'fillcolor="{node.fill}"')
            if node.dark:
                attrs.append("fontcolor=white")
        lines.append(f"  n{i} [{', '.join(attrs)}];")
    lines += [f"  n{a} -> n{b};" for a, b in graph.edges]
    return "\n".join([*lines, "}"]) + "\n"


def graphviz_svg(graph: Graph, dot: str | None = None) -> str | None:
    """Graphviz's drawing of ``graph``, sanitised; None when ``dot`` is missing, fails or times out."""
    dot = dot or shutil.which("dot")
    if dot is None:
        return None
    try:
        done = subprocess.run(
            [dot, "-Tsvg"], input=graph_dot(graph).encode(), capture_output=True, timeout=GRAPHVIZ_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    try:
        root = ET.fromstring(done.stdout)
    except ET.ParseError:
        return None
    return sanitize_svg(root, graph)


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _clean(element: ET.Element) -> list[ET.Element]:
    """A copy of ``element`` with allowed tags and attributes only (no links, scripts or handlers).

    Graphviz wraps linked or tooltipped nodes in ``<a>``; its content is kept, in place of the link.
    """
    tag = _local(element.tag)
    if tag == "a":
        return [copy for child in element for copy in _clean(child)]
    if tag not in _ALLOWED_TAGS:  # Graphviz's titles are our node ids; nodes get theirs in decorate_node
        return []
    copy = ET.Element(tag, {k: v for k, v in element.attrib.items() if k in _ALLOWED_ATTRS})
    copy.text = element.text if tag == "text" else None
    copy.extend(c for child in element for c in _clean(child))
    return [copy]


def sanitize_svg(root: ET.Element, graph: Graph) -> str:
    """Graphviz's SVG rebuilt from allowed elements, each node group given our title, data and link."""
    if _local(root.tag) != "svg":
        raise ValueError("not an SVG document")
    (svg,) = _clean(root)
    svg.set("class", "graph")
    for group in svg.iter("g"):
        node_id = group.get("id", "")
        if group.get("class") == "node" and node_id[1:].isdigit() and int(node_id[1:]) < len(graph.nodes):
            decorate_node(group, graph.nodes[int(node_id[1:])])
    return serialize(svg)


def decorate_node(group: ET.Element, node: GraphNode) -> None:
    """Give a node group its tooltip, ``data-*`` attributes and link (children move into the ``<a>``)."""
    group.attrib.pop("id", None)
    group.set("class", f"node {node.kind}")
    shapes = [c for c in group if c.tag in ("polygon", "path", "rect", "ellipse")]
    for shape in shapes[:1]:
        shape.set("class", "shape")
    if node.fill is not None:
        group.set("data-color", node.fill)
    if node.tensor is not None:
        group.set("data-tensor", node.tensor)
    children = list(group)
    for child in children:
        group.remove(child)
    title = ET.SubElement(group, "title")
    title.text = node.title
    holder = group
    if node.anchor is not None:
        holder = ET.SubElement(group, "a", {"href": f"#{node.anchor}", "data-anchor": node.anchor})
    holder.extend(children)


def serialize(svg: ET.Element) -> str:
    """Markup of an element tree in the SVG namespace, without an XML declaration."""
    svg.set("xmlns", SVG_NS)
    return ET.tostring(svg, encoding="unicode", short_empty_elements=True)
