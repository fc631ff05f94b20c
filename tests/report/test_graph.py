"""The report's coloured graph: nodes and colours, Graphviz and the built-in layout, and sanitised SVG."""

from __future__ import annotations

import re
import shutil
import xml.etree.ElementTree as ET

import pytest
from browser import find_chromium, run_chromium

from pytest_qaccuracy.report.drawing import render_graph
from pytest_qaccuracy.report.graph import GRAY, Graph, GraphNode, build_graph, sanitize_svg
from pytest_qaccuracy.report.html import ReportPair, write_html
from pytest_qaccuracy.report.html_data import comparison_view
from pytest_qaccuracy.report.layout import place, ranks

from .conftest import chain_model

HOSTILE = 'a"b</text><script>alert(1)</script>&amp;'
ENGINES = ["built-in", pytest.param("graphviz", marks=pytest.mark.skipif(not shutil.which("dot"), reason="no dot"))]


def anchors(result):
    return {x.tensor: f"row-{x.order}" for x in result.layers}


def test_nodes_colours_and_links(small_result, small_model):
    graph = build_graph(small_model, small_result, "sqnr", anchors(small_result))
    assert [(n.kind, n.lines[0]) for n in graph.nodes] == [
        ("input", "x"),
        *[("op", t) for t in ("conv1_out", "relu1_out", "conv2_out", "pool_out", "logits")],
        ("output", "logits"),
    ]
    ops = {n.lines[0]: n for n in graph.nodes if n.kind == "op"}
    assert ops["conv2_out"].fill == "#800026" and ops["conv2_out"].dark  # the worst SQNR, 20 dB
    assert ops["relu1_out"].fill == "#ffffcc" and ops["relu1_out"].lines[2] == "SQNR 40.00 dB"
    assert ops["pool_out"].fill == GRAY and ops["pool_out"].anchor is None  # not compared: no row
    assert ops["logits"].anchor == "row-3"
    assert graph.edges == tuple((i, i + 1) for i in range(6))  # initializers are not drawn


@pytest.mark.parametrize("engine", ENGINES)
def test_hostile_names_stay_text(make_result, engine):
    model = chain_model([(HOSTILE, "Conv"), ("y", "Relu")])
    result = make_result([(HOSTILE, "Conv", {"sqnr": 30.0}), ("y", "Relu", {"sqnr": 20.0})])
    drawn = render_graph(build_graph(model, result, "sqnr", anchors(result)), engine)
    assert drawn is not None and drawn.engine == engine
    root = ET.fromstring(drawn.svg)  # well-formed
    tags = {element.tag.rsplit("}", 1)[-1] for element in root.iter()}
    assert tags <= {"svg", "g", "a", "title", "rect", "path", "polygon", "ellipse", "text", "polyline"}, tags
    assert not [k for e in root.iter() for k in e.attrib if k.startswith("on")]
    assert {e.get("href") for e in root.iter() if e.tag.endswith("a")} == {"#row-0", "#row-1"}
    texts = [e.text for e in root.iter() if e.tag.endswith("text")]
    assert any(t and t.startswith('a"b</text>') for t in texts)  # shortened, but the name as text
    assert "<script" not in drawn.svg


def test_sanitize_drops_what_graphviz_never_needs():
    svg = ET.fromstring(
        '<svg xmlns="http://www.w3.org/2000/svg" xmlns:x="http://www.w3.org/1999/xlink" onload="alert(1)">'
        "<script>alert(2)</script><foreignObject><div/></foreignObject>"
        '<g id="n0" class="node"><title>n0</title><a x:href="javascript:alert(3)"><polygon fill="#ffffcc"/>'
        '<text onclick="alert(4)">conv</text></a></g></svg>'
    )
    graph = Graph((GraphNode("op", ("conv",), "conv (Conv)", "#ffffcc", "conv", "row-0"),), (), "sqnr")
    text = sanitize_svg(svg, graph)
    assert "alert" not in text and "script" not in text and "foreignObject" not in text
    assert '<g class="node op" data-color="#ffffcc" data-tensor="conv"><title>conv (Conv)</title>' in text
    assert '<a href="#row-0" data-anchor="row-0"><polygon fill="#ffffcc" class="shape" />' in text


def test_layered_layout_keeps_layers_and_order():
    nodes = tuple(GraphNode("op", (f"n{i}", "Conv"), f"n{i}", "#ffffcc") for i in range(6))
    edges = ((0, 1), (0, 2), (1, 3), (2, 3), (0, 3), (3, 4), (3, 5))
    rank = ranks(6, edges)
    assert rank == [0, 1, 1, 2, 3, 3] and all(rank[a] < rank[b] for a, b in edges)
    placed = place(Graph(nodes, edges, "sqnr"))
    for layer in ({1, 2}, {4, 5}):  # same layer: same height, no overlap
        a, b = sorted(layer, key=lambda v: placed.x[v])
        assert placed.y[a] == placed.y[b] and placed.x[b] - placed.x[a] >= (placed.width[a] + placed.width[b]) / 2
    assert len(placed.paths[4]) == 3  # 0 -> 3 crosses layer 1: it bends through a dummy node there
    assert min(placed.x[v] - placed.width[v] / 2 for v in range(6)) >= 0


def test_large_graphs_are_not_drawn(monkeypatch, small_result, small_model):
    monkeypatch.setattr("pytest_qaccuracy.report.drawing.MAX_NODES", 3)
    assert render_graph(build_graph(small_model, small_result, "sqnr")) is None


@pytest.mark.parametrize("engine", ENGINES)
def test_browser_graph_links_to_rows(tmp_path, small_result, small_model, engine):
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("no headless Chromium found (apt-get install -y chromium)")
    path = write_html(tmp_path / "r.html", [ReportPair(small_result, model=small_model)], engine=engine)
    page = run_chromium(chromium, tmp_path, path.as_uri(), "--dump-dom")
    assert page.console == [] and 'data-ready="1"' in page.dom
    ids = set(re.findall(r'\sid="([^"]+)"', page.dom))
    links = re.findall(r'<a href="#(pair-0-layer-\d)" data-anchor', page.dom)
    assert sorted(links) == [f"pair-0-layer-{i}" for i in range(4)] and set(links) <= ids
    fills = re.findall(r'<g class="node op" data-color="(#[0-9a-f]{6})"', page.dom)
    cells = [x["color"]["sqnr"] for x in comparison_view(small_result)["layers"]]  # the table's SQNR colours
    assert fills == [*cells[:3], GRAY, cells[3]]
    assert 'graph-src" id=' not in page.dom  # the holder was moved into the section and removed
