"""The report graph drawn as SVG: Graphviz when it is installed, else the built-in layered layout.

This module sits over :mod:`.graph` (the nodes, Graphviz's drawing, sanitising) and :mod:`.layout`
(the built-in layout, which draws a :class:`~.graph.Graph`), and chooses between them.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_qaccuracy.report.graph import Graph, graphviz_svg
from pytest_qaccuracy.report.layout import layered_svg

#: Graphs with more nodes are not drawn (the layout and the page would get too slow).
MAX_NODES = 3000


@dataclass(frozen=True, slots=True)
class GraphSvg:
    """The drawn graph: SVG markup and the layout engine that placed it (``graphviz`` or ``built-in``)."""

    svg: str
    engine: str
    nodes: int


def render_graph(graph: Graph, engine: str = "auto") -> GraphSvg | None:
    """``graph`` as sanitised SVG markup, or None when it has more than :data:`MAX_NODES` nodes.

    Args:
        graph: what to draw.
        engine: ``graphviz`` or ``built-in``; ``auto`` uses Graphviz when ``dot`` is on PATH and falls
            back to the built-in layout when it is not or fails.
    """
    if len(graph.nodes) > MAX_NODES:
        return None
    if engine in ("auto", "graphviz"):
        svg = graphviz_svg(graph)
        if svg is not None or engine == "graphviz":
            return None if svg is None else GraphSvg(svg, "graphviz", len(graph.nodes))
    return GraphSvg(layered_svg(graph), "built-in", len(graph.nodes))
