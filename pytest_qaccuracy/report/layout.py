"""A built-in layered layout for the report's graph, used when Graphviz is not installed.

Sugiyama's scheme, kept small: longest-path layers (sources pulled down next to their first
consumer), a dummy node on every layer an edge crosses, barycentric ordering in alternating sweeps,
then x positions pulled towards the mean of each node's neighbours without overlaps. Edges are
drawn as smooth curves through their dummy nodes. The SVG mirrors Graphviz's structure (one
``<g class="node">`` per node) so the page treats both alike.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from pytest_qaccuracy.report.graph import Graph, decorate_node, serialize

CHAR_WIDTH = 6.4
LINE_HEIGHT = 13.0
PAD_X, PAD_Y = 10.0, 6.0
GAP_X, GAP_Y = 18.0, 34.0
MARGIN = 8.0
SWEEPS = 6


@dataclass(frozen=True, slots=True)
class Placed:
    """Node centres and sizes, and each edge's polyline (source bottom, dummies, target top)."""

    x: list[float]
    y: list[float]
    width: list[float]
    height: list[float]
    paths: list[list[tuple[float, float]]]
    size: tuple[float, float]


def node_size(lines: Sequence[str]) -> tuple[float, float]:
    return max(len(line) for line in lines) * CHAR_WIDTH + 2 * PAD_X, len(lines) * LINE_HEIGHT + 2 * PAD_Y


def ranks(count: int, edges: Sequence[tuple[int, int]]) -> list[int]:
    """Longest-path layer of each node; a source sits just above its nearest consumer.

    Nodes come in topological order (ONNX requires it); an edge that points backwards is ignored.
    """
    preds: list[list[int]] = [[] for _ in range(count)]
    succs: list[list[int]] = [[] for _ in range(count)]
    for a, b in edges:
        if a < b:
            preds[b].append(a)
            succs[a].append(b)
    rank = [0] * count
    for v in range(count):
        rank[v] = max((rank[u] + 1 for u in preds[v]), default=0)
    for v in range(count):
        if not preds[v] and succs[v]:
            rank[v] = max(0, min(rank[s] for s in succs[v]) - 1)
    return rank


def _with_dummies(
    rank: list[int], edges: Sequence[tuple[int, int]]
) -> tuple[list[int], list[tuple[int, int]], list[list[int]]]:
    """Ranks including one dummy per crossed layer, the unit-length edges, and each edge's chain."""
    rank = list(rank)
    unit: list[tuple[int, int]] = []
    chains: list[list[int]] = []
    for a, b in edges:
        chain = [a]
        for r in range(rank[a] + 1, rank[b]):
            rank.append(r)
            chain.append(len(rank) - 1)
        chain.append(b)
        unit += list(pairwise(chain))
        chains.append(chain)
    return rank, unit, chains


def order_layers(rank: list[int], unit: Sequence[tuple[int, int]]) -> list[list[int]]:
    """Nodes of each layer, left to right, after barycentric sweeps down and up."""
    layers: list[list[int]] = [[] for _ in range(max(rank, default=-1) + 1)]
    for v, r in enumerate(rank):
        layers[r].append(v)
    preds: list[list[int]] = [[] for _ in rank]
    succs: list[list[int]] = [[] for _ in rank]
    for a, b in unit:
        preds[b].append(a)
        succs[a].append(b)
    position = {v: i for layer in layers for i, v in enumerate(layer)}
    for sweep in range(SWEEPS):
        down = sweep % 2 == 0
        for layer in layers[1:] if down else layers[-2::-1]:
            near = preds if down else succs

            def key(v: int, near: list[list[int]] = near) -> float:
                return sum(position[u] for u in near[v]) / len(near[v]) if near[v] else position[v]

            layer.sort(key=key)
            position.update((v, i) for i, v in enumerate(layer))
    return layers


def _spread(layer: list[int], desired: dict[int, float], width: list[float]) -> None:
    """Move ``layer``'s nodes to their desired x in order, without overlaps, keeping the mean shift zero."""
    xs = [desired[v] for v in layer]
    for i in range(1, len(layer)):
        xs[i] = max(xs[i], xs[i - 1] + (width[layer[i - 1]] + width[layer[i]]) / 2 + GAP_X)
    shift = sum(desired[v] - x for v, x in zip(layer, xs, strict=True)) / max(len(layer), 1)
    desired.update((v, x + shift) for v, x in zip(layer, xs, strict=True))


def x_positions(layers: list[list[int]], unit: Sequence[tuple[int, int]], width: list[float]) -> list[float]:
    """Centres: packed left to right, then pulled towards the mean of their neighbours, layer by layer."""
    x = {}
    for layer in layers:
        left = 0.0
        for v in layer:
            x[v] = left + width[v] / 2
            left += width[v] + GAP_X
    preds: dict[int, list[int]] = {}
    succs: dict[int, list[int]] = {}
    for a, b in unit:
        preds.setdefault(b, []).append(a)
        succs.setdefault(a, []).append(b)
    for sweep in range(SWEEPS):
        near = preds if sweep % 2 == 0 else succs
        for layer in layers if sweep % 2 == 0 else layers[::-1]:
            desired = {v: sum(x[u] for u in near[v]) / len(near[v]) if v in near else x[v] for v in layer}
            _spread(layer, desired, width)
            x.update(desired)
    return [x[v] for v in range(len(width))]


def place(graph: Graph) -> Placed:
    """Positions of every node and the route of every edge, in pixels from the top left."""
    sizes = [node_size(node.lines) for node in graph.nodes]
    rank, unit, chains = _with_dummies(ranks(len(sizes), graph.edges), graph.edges)
    width = [w for w, _ in sizes] + [0.0] * (len(rank) - len(sizes))
    height = [h for _, h in sizes] + [0.0] * (len(rank) - len(sizes))
    layers = order_layers(rank, unit)
    xs = x_positions(layers, unit, width)
    row = [max((height[v] for v in layer), default=0.0) for layer in layers]
    tops = [MARGIN + sum(row[:r]) + GAP_Y * r for r in range(len(layers))]
    ys = [tops[rank[v]] + row[rank[v]] / 2 for v in range(len(rank))]
    left = min((xs[v] - width[v] / 2 for v in range(len(rank))), default=0.0) - MARGIN
    xs = [x - left for x in xs]
    paths = []
    for chain in chains:
        a, b = chain[0], chain[-1]
        middle = [(xs[v], ys[v]) for v in chain[1:-1]]
        paths.append([(xs[a], ys[a] + height[a] / 2), *middle, (xs[b], ys[b] - height[b] / 2)])
    right = max((xs[v] + width[v] / 2 for v in range(len(rank))), default=0.0) + MARGIN
    bottom = (tops[-1] + row[-1] + MARGIN) if layers else MARGIN
    return Placed(xs, ys, width, height, paths, (right, bottom))


def _curve(points: list[tuple[float, float]]) -> str:
    """A path through ``points`` with vertical tangents at each point (cubic segments)."""
    (x0, y0), parts = points[0], [f"M{points[0][0]:.1f},{points[0][1]:.1f}"]
    for x1, y1 in points[1:]:
        mid = (y0 + y1) / 2
        parts.append(f"C{x0:.1f},{mid:.1f} {x1:.1f},{mid:.1f} {x1:.1f},{y1:.1f}")
        x0, y0 = x1, y1
    return " ".join(parts)


def _arrow(points: list[tuple[float, float]]) -> str:
    x, y = points[-1]
    return f"{x - 3.5:.1f},{y - 7:.1f} {x + 3.5:.1f},{y - 7:.1f} {x:.1f},{y:.1f}"


def _node(node_index: int, graph: Graph, placed: Placed) -> ET.Element:
    node, x, y = graph.nodes[node_index], placed.x[node_index], placed.y[node_index]
    w, h = placed.width[node_index], placed.height[node_index]
    group = ET.Element("g", {"class": "node"})
    if node.kind == "op":
        rect = {"x": f"{x - w / 2:.1f}", "y": f"{y - h / 2:.1f}", "width": f"{w:.1f}", "height": f"{h:.1f}"}
        ET.SubElement(group, "rect", {**rect, "rx": "4", "fill": node.fill or "white", "stroke": "#57606a"})
    first = y - (len(node.lines) - 1) * LINE_HEIGHT / 2 + 4
    for i, line in enumerate(node.lines):
        attrs = {"x": f"{x:.1f}", "y": f"{first + i * LINE_HEIGHT:.1f}", "text-anchor": "middle"}
        if node.dark:
            attrs["fill"] = "white"
        ET.SubElement(group, "text", attrs).text = line
    decorate_node(group, node)
    return group


def layered_svg(graph: Graph) -> str:
    """``graph`` drawn with the built-in layout, as SVG markup (``class="graph layered"``)."""
    placed = place(graph)
    width, height = placed.size
    svg = ET.Element(
        "svg",
        {
            "class": "graph layered",
            "width": f"{width:.0f}",
            "height": f"{height:.0f}",
            "viewBox": f"0 0 {width:.1f} {height:.1f}",
        },
    )
    edges = ET.SubElement(svg, "g", {"class": "edges"})
    for path in placed.paths:
        edge = ET.SubElement(edges, "g", {"class": "edge"})
        ET.SubElement(edge, "path", {"d": _curve(path), "fill": "none", "stroke": "#8c959f"})
        ET.SubElement(edge, "polygon", {"points": _arrow(path), "fill": "#8c959f"})
    for i in range(len(graph.nodes)):
        svg.append(_node(i, graph, placed))
    return serialize(svg)
