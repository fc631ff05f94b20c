"""Unit tests of the layer-wise error writers: the visq colour rules, visq.json, the DOT text, the
report graph, its sanitiser and the built-in layout. Expected values are worked by hand from the
rules in docs/report.md (nine uniform YlOrRd-9 slots, reversed for higher-is-better metrics) and
from small graphs drawn on paper; nothing is copied from the code's output."""

from __future__ import annotations

import itertools
import json
import math
import stat
import xml.etree.ElementTree as ET

import pytest
from onnx import TensorProto, helper

from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.report import drawing, graph
from pytest_qaccuracy.report._palette import (
    YLORRD9,
    Slot,
    color_slots,
    error_map,
    higher_is_better,
    metric_names,
    metric_range,
    metric_slots,
    slot_color,
)
from pytest_qaccuracy.report.dot import _legend, _ops, _unique, dot_document, label, quote, write_dot
from pytest_qaccuracy.report.graph import GRAY, Graph, GraphNode, build_graph, decorate_node, graph_dot, sanitize_svg
from pytest_qaccuracy.report.layout import (
    _arrow,
    _curve,
    _spread,
    _with_dummies,
    layered_svg,
    node_size,
    order_layers,
    place,
    ranks,
    x_positions,
)
from pytest_qaccuracy.report.visq import visq_document, write_visq

from .conftest import build_result, chain_model

SVG = "{http://www.w3.org/2000/svg}"
LIGHT, DARKEST = "#ffffcc", "#800026"


# --- _palette: metrics, direction, values -------------------------------------------------------


def test_metric_names_definitions_first_then_new_keys_in_order():
    result = build_result(
        [("a", "Conv", {"mse": 1.0, "zz": 2.0}), ("b", "Relu", {"yy": 1.0, "zz": 3.0})],
        outputs=[("o", {"xx": 1.0, "mse": 2.0})],
        definitions={"mse": "m", "tae": "t"},
    )
    # outputs are read before layers; each name once
    assert metric_names(result) == ["mse", "tae", "xx", "zz", "yy"]


def test_higher_is_better_result_first_then_defaults():
    result = build_result([("a", "Conv", {"mse": 1.0})], definitions={"mse": "m"}, higher_is_better={"mse": 1})
    assert higher_is_better(result, "mse") is True  # the result's word, as a bool
    result = build_result([("a", "Conv", {"sqnr": 1.0})], definitions={"sqnr": "m"}, higher_is_better={"sqnr": False})
    assert higher_is_better(result, "sqnr") is False  # the result overrides the built-in default
    result = build_result([("a", "Conv", {"mse": 1.0})], definitions={"mse": "m"}, higher_is_better={})
    assert higher_is_better(result, "cosine") is True and higher_is_better(result, "sqnr") is True
    assert higher_is_better(result, "mse") is False and higher_is_better(result, "whatever") is False


def test_error_map_layers_then_outputs_finite_only():
    result = build_result(
        [
            ("a", "Conv", {"mse": 0.5}),
            ("b", "Relu", {"mse": None}),
            ("c", "Relu", {"mse": math.nan}),
            ("d", "Relu", {"mse": math.inf}),
            ("a", "Relu", {"mse": 9.0}),  # a second row for the same tensor: the first wins
            ("e", "Relu", {"tae": 1.0}),  # no value of this metric
        ],
        outputs=[("a", {"mse": 7.0}), ("c", {"mse": 0.25}), ("o", {"mse": 2.0})],
        definitions={"mse": "m", "tae": "t"},
    )
    values = error_map(result, "mse")
    # c has no finite layer value, so its output value is the one shown
    assert values == {"a": 0.5, "c": 0.25, "o": 2.0}
    assert list(values) == ["a", "c", "o"]


# --- _palette: ranges and slots -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("metric", "values", "higher", "expected"),
    [
        ("mse", [3.0, 1.0, 2.0], False, (1.0, 3.0)),
        ("mse", [3.0, math.nan, 1.0, math.inf], False, (1.0, 3.0)),  # non-finite values are left out
        ("mse", [], False, (0.0, 1.0)),
        ("mse", [math.nan], True, (0.0, 1.0)),
        ("mpeir", [5.0, 7.0], False, (0.0, 1.0)),  # fixed, whatever the values
        ("srmse", [2.0, 3.0], False, (0.0, 3.0)),
        ("srmse", [-1.0, 3.0], False, (-1.0, 3.0)),
        ("srmse", [0.0, 0.0], False, (0.0, 1.0)),
        ("sqnr", [20.0, 40.0], True, (20.0, 40.0)),
        # all equal: widened by |v|/2 towards the bad side, so the values sit at the good end
        ("mse", [4.0, 4.0], False, (4.0, 6.0)),
        ("sqnr", [4.0], True, (2.0, 4.0)),
        ("mse", [-4.0], False, (-4.0, -2.0)),
        ("cosine", [-4.0], True, (-6.0, -4.0)),
        ("mse", [0.0], False, (0.0, 1.0)),
        ("cosine", [0.0], True, (-1.0, 0.0)),
        # subnormal: half of it is zero, so the width is 1
        ("mse", [5e-324], False, (5e-324, 1.0 + 5e-324)),
        ("cosine", [5e-324], True, (5e-324 - 1.0, 5e-324)),
    ],
)
def test_metric_range(metric, values, higher, expected):
    assert metric_range(metric, values, higher) == expected


def test_metric_range_defaults_to_lower_is_better():
    assert metric_range("mse", [2.0]) == (2.0, 3.0)


def test_color_slots_nine_uniform_slots():
    slots = color_slots(0.1, 1.0)
    assert [s.color for s in slots] == list(YLORRD9)
    assert slots[0].begin == 0.1 and slots[-1].end == 1.0  # exact ends
    for i, s in enumerate(slots):
        assert s.begin == pytest.approx(0.1 + 0.1 * i) and s.end == pytest.approx(0.2 + 0.1 * i)
    assert all(a.end == b.begin for a, b in itertools.pairwise(slots))


def test_color_slots_reversed_when_higher_is_better():
    slots = color_slots(0.0, 9.0, higher_better=True)
    assert [s.color for s in slots] == list(reversed(YLORRD9))
    assert [s.begin for s in slots] == pytest.approx(list(range(9)))
    assert slots[0].color == DARKEST and slots[-1].color == LIGHT


def test_slot_color_edges_inclusive_and_outside_values():
    slots = color_slots(0.0, 9.0)
    assert slot_color(slots, -5.0) == YLORRD9[0]
    assert slot_color(slots, 0.0) == YLORRD9[0]
    assert slot_color(slots, 1.0) == YLORRD9[0]  # the shared edge belongs to the first slot holding it
    assert slot_color(slots, 1.5) == YLORRD9[1]
    assert slot_color(slots, 4.0) == YLORRD9[3]
    assert slot_color(slots, 8.5) == YLORRD9[8]
    assert slot_color(slots, 9.0) == YLORRD9[8]
    assert slot_color(slots, 100.0) == YLORRD9[8]
    gap = [Slot(0.0, 1.0, "a"), Slot(2.0, 3.0, "b"), Slot(4.0, 5.0, "c")]
    assert slot_color(gap, 1.5) == "c"  # in no slot and above the first: the last colour
    assert slot_color(gap, 2.0) == "b"  # a slot's begin is inside it


def test_metric_slots_from_the_error_map_or_given_values():
    result = build_result(
        [("a", "Conv", {"sqnr": 10.0}), ("b", "Relu", {"sqnr": 19.0})], definitions={"sqnr": "s"}, higher_is_better={}
    )
    slots = metric_slots(result, "sqnr")
    assert (slots[0].begin, slots[-1].end, slots[0].color) == (10.0, 19.0, DARKEST)
    slots = metric_slots(result, "sqnr", {"x": 0.0, "y": 90.0})
    assert (slots[0].begin, slots[-1].end) == (0.0, 90.0) and slots[1].begin == pytest.approx(10.0)


# --- visq.json ----------------------------------------------------------------------------------


def mse_result(**kwargs):
    return build_result(
        [("a", "Conv", {"mse": 0.0}), ("b", "Relu", {"mse": 0.9})],
        outputs=[("out", {"mse": 0.45})],
        definitions={"mse": "m"},
        **kwargs,
    )


def test_visq_document_layout():
    doc = visq_document(mse_result(), "mse")
    assert list(doc) == ["meta", "error"] and list(doc["meta"]) == ["model", "metric", "colorscheme"]
    assert doc["meta"]["model"] == "net.onnx" and doc["meta"]["metric"] == "MSE"
    assert doc["error"] == [{"a": 0.0, "b": 0.9, "out": 0.45}]
    scheme = doc["meta"]["colorscheme"]
    assert [set(s) for s in scheme] == [{"b", "e", "c"}] * 9
    assert [s["c"] for s in scheme] == list(YLORRD9)
    assert scheme[0]["b"] == 0.0 and scheme[-1]["e"] == 0.9
    assert scheme[4]["b"] == pytest.approx(0.4) and scheme[4]["e"] == pytest.approx(0.5)


def test_visq_document_model_name_and_title():
    doc = visq_document(mse_result(fp32_model="/a/b/deep.onnx"), "mse")
    assert doc["meta"]["model"] == "deep.onnx" and "title" not in doc["meta"]
    doc = visq_document(mse_result(), "mse", model_name="", title="")
    assert doc["meta"]["model"] == "" and doc["meta"]["title"] == ""  # given, even empty
    assert list(doc["meta"]) == ["model", "metric", "title", "colorscheme"]
    doc = visq_document(mse_result(), "mse", model_name="m.circle", title="T")
    assert (doc["meta"]["model"], doc["meta"]["title"]) == ("m.circle", "T")


def test_visq_unknown_metric_names_the_choices():
    with pytest.raises(InputError, match=r"^no metric 'MSE' in the comparison of models/net.int8.onnx; it has mse$"):
        visq_document(mse_result(), "MSE")
    empty = build_result([("a", "Conv", {})], definitions={})
    with pytest.raises(InputError, match=r"; it has none$"):
        visq_document(empty, "mse")


def test_write_visq_round_trip(tmp_path):
    path = write_visq(tmp_path / "net.mse.visq.json", mse_result(), "mse", model_name="m.onnx", title="t")
    assert path == tmp_path / "net.mse.visq.json"
    doc = json.loads(path.read_text())
    assert doc["meta"]["model"] == "m.onnx" and doc["meta"]["title"] == "t" and doc["meta"]["metric"] == "MSE"
    assert doc["error"] == [{"a": 0.0, "b": 0.9, "out": 0.45}] and len(doc["meta"]["colorscheme"]) == 9


# --- DOT ----------------------------------------------------------------------------------------


def test_quote_and_label():
    assert quote("a\r\nb") == '"a\\nb"'  # carriage returns are dropped
    assert quote('\\"') == '"\\\\\\""'
    assert label("a&b") == '"a&amp;b"' and label('x"&') == '"x\\"&amp;"'


def test_unique():
    assert _unique("n", set()) == "n"
    assert _unique("n", {"n"}) == "n (1)"
    assert _unique("n", {"n", "n (1)"}) == "n (2)"
    assert _unique("n", {"n", "n (1)", "n (2)"}) == "n (3)"


def test_legend_rows():
    slots = color_slots(0.0, 9.0)
    text = _legend("A<B", slots)
    assert text.startswith('<<table border="0" cellborder="1" cellspacing="0" cellpadding="4"><tr>')
    assert text.endswith("</tr></table>>")
    assert '<tr><td bgcolor="#ffffcc">A&lt;B: 0.0000 ~ 1.0000</td></tr>' in text
    assert '<tr><td bgcolor="#fc4e2a">A&lt;B: 5.0000 ~ 6.0000</td></tr>' in text  # slot 5: dark text
    assert '<tr><td bgcolor="#e31a1c"><font color="white">A&lt;B: 6.0000 ~ 7.0000</font></td></tr>' in text
    assert text.count('<font color="white">') == 3
    assert text.count("</tr><tr>") == 8  # nine rows, nothing between them


def ops_graph():
    """x -> A -> (p, '') ; Constant k ; custom-domain Constant c2 ; B(p, k, w, c2, '', s, ghost) -> no
    outputs ; C(p) -> q ; D() -> () unnamed. w is an initializer and an input, s a sparse initializer
    (named by its values: a SparseTensorProto has no name of its own), ghost is produced by nothing."""
    nodes = [
        helper.make_node("Relu", ["x"], ["p", ""], name="A"),
        helper.make_node("Constant", [], ["k"], value=helper.make_tensor("v", TensorProto.FLOAT, [], [1.0])),
        helper.make_node("Constant", [], ["c2"], domain="my.ops"),
        helper.make_node("Constant", [], ["c3"], domain="ai.onnx"),
        helper.make_node("Sink", ["p", "k", "w", "c2", "", "s", "ghost"], [], name="B", domain="my.ops"),
        helper.make_node("Relu", ["p"], ["q"], name=""),
        helper.make_node("Noop", [], [], domain="my.ops"),
    ]
    sparse = helper.make_sparse_tensor(
        helper.make_tensor("s", TensorProto.FLOAT, [1], [1.0]),
        helper.make_tensor("si", TensorProto.INT64, [1], [0]),
        [2],
    )
    g = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [1]),
        ],
        [
            helper.make_tensor_value_info("q", TensorProto.FLOAT, [1]),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
        ],
        initializer=[helper.make_tensor("w", TensorProto.FLOAT, [1], [1.0])],
        sparse_initializer=[sparse],
    )
    return helper.make_model(g)


def test_ops_skips_constants_and_names_nodes():
    ops, producer, constants = _ops(ops_graph().graph)
    assert [node_id for node_id, _ in ops] == ["p", "c2", "B", "q", "Noop_6"]
    assert producer == {"p": "p", "c2": "c2", "q": "q"}
    assert constants == {"w", "s", "k", "c3"}


def test_dot_document_of_a_small_graph():
    result = build_result([("p", "Relu", {"mse": 2.0}), ("q", "Relu", {"mse": 20.0})], definitions={"mse": "m"})
    text = dot_document(ops_graph(), result, "mse")
    lines = text.split("\n")
    assert text.endswith("}\n") and lines[0] == 'digraph "net.onnx" {' and lines[1] == "  forcelabels=true;"
    assert lines[2].startswith('  "color_table" [shape=none, margin=0, label=<<table ')
    assert lines[3:] == [
        '  "x" [shape=plaintext, label="x"];',  # w is an initializer: not drawn
        '  "p" [label="p\\nRelu", style=filled, fillcolor="#ffffcc", xlabel="MSE: 2.0000"];',
        '  "c2" [label="c2\\nConstant", style=filled, fillcolor=gray];',
        '  "B" [label="B\\nSink", style=filled, fillcolor=gray];',
        '  "q" [label="q\\nRelu", style=filled, fillcolor="#800026", fontcolor=white, xlabel="MSE: 20.0000"];',
        '  "Noop_6" [label="Noop_6\\nNoop", style=filled, fillcolor=gray];',
        '  "q (1)" [shape=plaintext, label="q"];',
        '  "x (1)" [shape=plaintext, label="x"];',
        '  "x" -> "p";',
        '  "p" -> "B";',
        '  "c2" -> "B";',
        '  "p" -> "q";',
        '  "q" -> "q (1)";',
        '  "x" -> "x (1)";',
        "}",
        "",
    ]


def test_dot_outputs_listed_twice_get_two_nodes():
    model = chain_model([("y", "Relu")])
    model.graph.output.append(model.graph.output[0])
    result = build_result([("y", "Relu", {"mse": 1.0})], definitions={"mse": "m"})
    lines = dot_document(model, result, "mse").split("\n")
    assert lines[-6:] == [
        '  "y (2)" [shape=plaintext, label="y"];',
        '  "x" -> "y";',
        '  "y" -> "y (1)";',
        '  "y" -> "y (2)";',
        "}",
        "",
    ]
    assert lines[-7] == '  "y (1)" [shape=plaintext, label="y"];'


def test_dot_unknown_metric_and_write(tmp_path):
    result = build_result([("p", "Relu", {"mse": 2.0})], definitions={"mse": "m"})
    with pytest.raises(InputError, match="no metric 'tae'"):
        dot_document(ops_graph(), result, "tae")
    path = write_dot(tmp_path / "g.dot", ops_graph(), result, "mse")
    assert path == tmp_path / "g.dot" and path.read_text() == dot_document(ops_graph(), result, "mse")


# --- the report graph ---------------------------------------------------------------------------


def sqnr_result():
    return build_result(
        [("p", "Relu", {"sqnr": 10.0}), ("q", "Relu", {"sqnr": 19.0})], definitions={"sqnr": "s"}, higher_is_better={}
    )


def test_build_graph_nodes_and_edges():
    g = build_graph(ops_graph(), sqnr_result(), "sqnr", {"p": "row-p"})
    assert g.metric == "sqnr"
    kinds = [(n.kind, n.lines, n.title, n.fill, n.tensor, n.anchor) for n in g.nodes]
    assert kinds == [
        ("input", ("x",), "x", None, None, None),
        ("op", ("p", "Relu", "SQNR 10.00 dB"), "p (Relu)\nSQNR 10.00 dB", DARKEST, "p", "row-p"),
        ("op", ("c2", "Constant"), "c2 (Constant): not compared", GRAY, None, None),
        ("op", ("B", "Sink"), "B (Sink): not compared", GRAY, None, None),
        ("op", ("q", "Relu", "SQNR 19.00 dB"), "q (Relu)\nSQNR 19.00 dB", LIGHT, "q", None),
        ("op", ("Noop_6", "Noop"), "Noop_6 (Noop): not compared", GRAY, None, None),
        ("output", ("q",), "q", None, None, None),
        ("output", ("x",), "x", None, None, None),
    ]
    assert g.edges == ((0, 1), (1, 3), (2, 3), (1, 4), (4, 6), (0, 7))
    assert [n.dark for n in g.nodes] == [False, True, False, False, False, False, False, False]


def test_build_graph_without_anchors_and_long_names():
    long = "t" * 40
    model = chain_model([(long, "Conv")])
    result = build_result([(long, "Conv", {"sqnr": 5.0})], definitions={"sqnr": "s"})
    g = build_graph(model, result, "sqnr")
    op = g.nodes[1]
    assert op.lines[0] == "t" * 14 + "…" + "t" * 15 and len(op.lines[0]) == graph.LABEL_WIDTH
    assert op.title.startswith(long + " (Conv)\n") and op.anchor is None
    assert g.nodes[2].lines == (op.lines[0],) and g.nodes[2].title == long
    model.graph.input[0].name = "i" * 40
    model.graph.node[0].input[0] = "i" * 40
    g = build_graph(model, result, "sqnr")
    assert g.nodes[0].lines == ("i" * 14 + "…" + "i" * 15,) and g.nodes[0].title == "i" * 40
    assert g.edges == ((0, 1), (1, 2))


def test_graph_dot_text():
    nodes = (
        GraphNode("input", ("x",), "x"),
        GraphNode("op", ("a", "Relu"), "a", LIGHT),
        GraphNode("op", ('b"', "Relu"), "b", DARKEST),
        GraphNode("output", ("y",), "y"),
    )
    text = graph_dot(Graph(nodes, ((0, 1), (1, 2), (2, 3)), "mse"))
    lines = text.split("\n")
    assert lines[0] == "digraph G {" and text.endswith("}\n")
    # Graphviz reads attribute names case-sensitively: these lines give the boxes and grey edges
    assert lines[1:4] == [
        '  graph [rankdir=TB, nodesep=0.2, ranksep=0.3, bgcolor="transparent"];',
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10, margin="0.08,0.03",'
        ' fillcolor="white", color="#57606a", penwidth=0.8];',
        '  edge [color="#8c959f", arrowsize=0.6];',
    ]
    assert lines[4:] == [
        '  n0 [id=n0, label="x", shape=plaintext, style=""];',
        '  n1 [id=n1, label="a\\nRelu", fillcolor="#ffffcc"];',
        '  n2 [id=n2, label="b\\"\\nRelu", fillcolor="#800026", fontcolor=white];',
        '  n3 [id=n3, label="y", shape=plaintext, style=""];',
        "  n0 -> n1;",
        "  n1 -> n2;",
        "  n2 -> n3;",
        "}",
        "",
    ]


def tiny_graph():
    return Graph(
        (GraphNode("op", ("a",), "a (Relu)", LIGHT, "a", "row-a"), GraphNode("output", ("a",), "a")), ((0, 1),), "mse"
    )


def script(tmp_path, body):
    path = tmp_path / "fake-dot"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_graphviz_svg_failures_give_none(tmp_path, monkeypatch):
    g = tiny_graph()
    assert graph.graphviz_svg(g, str(tmp_path / "missing")) is None  # OSError
    assert graph.graphviz_svg(g, script(tmp_path, "cat >/dev/null; exit 1")) is None
    assert graph.graphviz_svg(g, script(tmp_path, "cat >/dev/null; echo '<svg'")) is None  # not XML
    monkeypatch.setattr(graph, "GRAPHVIZ_TIMEOUT", 0.2)
    slow = "cat >/dev/null; sleep 3; echo '<svg xmlns=\"http://www.w3.org/2000/svg\"/>'"
    assert graph.graphviz_svg(g, script(tmp_path, slow)) is None  # it would answer, too late
    monkeypatch.setattr(graph.shutil, "which", lambda name: None)
    assert graph.graphviz_svg(g) is None


def test_graphviz_svg_reads_stdin_and_sanitises(tmp_path):
    # a fake dot that draws one node group per id it finds in the DOT text on stdin
    body = (
        "ids=$(grep -o '^  n[0-9]* \\[' | tr -d ' [')\n"
        'echo \'<svg xmlns="http://www.w3.org/2000/svg" onload="x()">\'\n'
        'for i in $ids; do echo "<g id=\\"$i\\" class=\\"node\\"><polygon points=\\"0,0\\"/></g>"; done\n'
        "echo '</svg>'"
    )
    text = graph.graphviz_svg(tiny_graph(), script(tmp_path, body))
    assert text is not None and "onload" not in text
    root = ET.fromstring(text)
    assert root.get("class") == "graph"
    groups = root.findall(f"{SVG}g")
    assert [g.get("class") for g in groups] == ["node op", "node output"]
    assert groups[0].find(f"{SVG}a").get("href") == "#row-a"


def test_sanitize_svg_rules():
    root = ET.fromstring(
        '<svg xmlns="http://www.w3.org/2000/svg" width="10" style="x" viewBox="0 0 1 1">'
        '<g id="graph0" class="graph"><title>G</title>'
        '<g id="n0" class="node"><title>n0</title><text x="1" fill="red" onclick="y">keep</text></g>'
        '<g id="n2" class="node"><polygon points="1"/></g>'
        '<g class="node"><polygon points="2"/></g>'
        '<rect id="n1" class="node" x="3"/>'
        '<g id="nx" class="node"><rect x="1"/></g>'
        '<g id="n1" class="edge"><path d="M0"/></g>'
        '<a><g id="n1" class="node"><ellipse cx="1"/></g></a>'
        "<rect>tail text</rect><image href='x'/></g></svg>"
    )
    nodes = (GraphNode("op", ("a",), "first", "#fed976", "a"), GraphNode("input", ("x",), "second"))
    text = sanitize_svg(root, Graph(nodes, (), "mse"))
    assert text.startswith('<svg width="10" viewBox="0 0 1 1" class="graph" xmlns="http://www.w3.org/2000/svg">')
    out = ET.fromstring(text)
    outer = out.find(f"{SVG}g")
    assert outer.get("id") == "graph0" and outer.get("class") == "graph"  # not a node: left as is
    groups = outer.findall(f"{SVG}g")
    assert [(g.get("id"), g.get("class")) for g in groups] == [
        (None, "node op"),
        ("n2", "node"),  # no such node: there are two
        (None, "node"),  # no id
        ("nx", "node"),  # not a node id
        ("n1", "edge"),
        (None, "node input"),  # the <a> wrapper is dropped, its content kept
    ]
    first = groups[0]
    assert first.get("data-color") == "#fed976" and first.get("data-tensor") == "a"
    assert first.find(f"{SVG}title").text == "first"
    kept = first.find(f"{SVG}text")
    assert kept.attrib == {"x": "1", "fill": "red"} and kept.text == "keep"
    assert "data-color" not in groups[5].attrib and "data-tensor" not in groups[5].attrib
    assert outer.find(f"{SVG}rect[@x='3']").attrib == {"id": "n1", "class": "node", "x": "3"}  # not a <g>
    assert out.find(f".//{SVG}rect[@x]") is not None and all(r.text is None for r in out.iter(f"{SVG}rect"))
    assert out.find(f".//{SVG}image") is None and "title>G<" not in text
    with pytest.raises(ValueError, match=r"^not an SVG document$"):
        sanitize_svg(ET.fromstring("<html/>"), Graph(nodes, (), "mse"))


def test_decorate_node_moves_children_into_the_link():
    group = ET.Element("g", {"id": "n0", "class": "node"})
    for tag in ("text", "path", "polygon", "text"):
        ET.SubElement(group, tag)
    decorate_node(group, GraphNode("op", ("a",), "tip", "#ffffcc", "a", "row-3"))
    assert group.attrib == {"class": "node op", "data-color": "#ffffcc", "data-tensor": "a"}
    title, link = list(group)
    assert (title.tag, title.text) == ("title", "tip")
    assert link.tag == "a" and link.attrib == {"href": "#row-3", "data-anchor": "row-3"}
    assert [c.tag for c in link] == ["text", "path", "polygon", "text"]
    assert [c.get("class") for c in link] == [None, "shape", None, None]  # only the first shape
    oval = ET.Element("g")
    for tag in ("text", "ellipse", "rect"):
        ET.SubElement(oval, tag)
    decorate_node(oval, GraphNode("input", ("x",), "x"))
    assert [c.get("class") for c in oval][1:] == [None, "shape", None]  # after the title
    plain = ET.Element("g")
    ET.SubElement(plain, "text")
    decorate_node(plain, GraphNode("output", ("y",), "y"))
    assert plain.attrib == {"class": "node output"} and [c.tag for c in plain] == ["title", "text"]


# --- built-in layout ----------------------------------------------------------------------------


def test_node_size():
    # widest line 3 characters * 6.4 + 2 * 10 padding; 2 lines * 13 + 2 * 6 padding
    assert node_size(["abc", "de"]) == pytest.approx((39.2, 38.0))


def test_ranks():
    # longest path: 0,1,2 then 4 at 3; the source 3 moves down to just above its consumer 4;
    # the backward edge (4, 0) is ignored; 5 has no edges and stays on top
    assert ranks(6, [(0, 1), (1, 2), (2, 4), (3, 4), (4, 0)]) == [0, 1, 2, 2, 3, 0]
    assert ranks(3, [(0, 2), (1, 2), (0, 1)]) == [0, 1, 2]
    assert ranks(0, []) == []
    assert ranks(2, [(0, 0), (0, 1)]) == [0, 1]  # a node reading its own output: the loop is ignored


def test_with_dummies():
    rank, unit, chains = _with_dummies([0, 1, 3], [(0, 1), (0, 2), (1, 2)])
    assert rank == [0, 1, 3, 1, 2, 2]
    assert chains == [[0, 1], [0, 3, 4, 2], [1, 5, 2]]
    assert unit == [(0, 1), (0, 3), (3, 4), (4, 2), (1, 5), (5, 2)]


def test_order_layers_untangles_a_crossing():
    # 0 -> 3 and 1 -> 2 cross when layer 1 is [2, 3]; the sweeps put 3 first
    assert order_layers([0, 0, 1, 1], [(0, 3), (1, 2)]) == [[0, 1], [3, 2]]
    # only the upward sweeps sort the top layer: 2 moves next to its successor's position 0
    assert order_layers([0, 0, 0, 1], [(2, 3)]) == [[0, 2, 1], [3]]
    assert order_layers([], []) == []
    # 3 reads 0, 1 and 2 (mean position 1), 4 reads 2 (position 2): 3 goes first
    assert order_layers([0, 0, 0, 1, 1], [(0, 3), (1, 3), (2, 3), (2, 4)]) == [[0, 1, 2], [3, 4]]
    # five layers; in the top one and the fourth, only the last node has a successor (at position
    # 0): the upward sweeps move it next to the first node, in both layers
    # [[0, 1, 2], [3, 4, 5], [6]], 2 -> 3, 2 -> 4, 5 -> 6: up, 5 moves before 4 (next to 6); down, 5
    # (at 1, no predecessor) moves before 3 and 4 (both under 2, at 2); later sweeps keep that
    assert order_layers([0, 0, 0, 1, 1, 1, 2], [(2, 3), (2, 4), (5, 6)]) == [[0, 1, 2], [5, 3, 4], [6]]
    rank = [0, 0, 0, 1, 2, 3, 3, 3, 4]
    assert order_layers(rank, [(2, 3), (3, 4), (7, 8)]) == [[0, 2, 1], [3], [4], [5, 7, 6], [8]]


def test_spread_keeps_order_gap_and_mean():
    desired = {0: 0.0, 1: 0.0, 2: 100.0}
    _spread([0, 1, 2], desired, [10.0, 10.0, 10.0])
    # packed: 0, 28 (10 + gap 18), 100; mean shift (0 - 28 + 0) / 3
    shift = -28.0 / 3
    assert desired == pytest.approx({0: shift, 1: 28.0 + shift, 2: 100.0 + shift})
    one = {5: 3.0}
    _spread([5], one, [0, 0, 0, 0, 0, 7.0])
    assert one == {5: 3.0}


def test_x_positions_centres_a_chain_and_a_fork():
    # a chain of widths 10 and 30: both end up on the centre of the first
    assert x_positions([[0], [1]], [(0, 1)], [10.0, 30.0]) == pytest.approx([5.0, 5.0])
    # 0 -> 1 and 0 -> 2: the children straddle their parent, 28 apart (10 + 18 gap)
    xs = x_positions([[0], [1, 2]], [(0, 1), (0, 2)], [10.0, 10.0, 10.0])
    assert xs[2] - xs[1] == pytest.approx(28.0) and (xs[1] + xs[2]) / 2 == pytest.approx(xs[0])


def test_x_positions_packs_unlinked_nodes():
    # widths 10, 20, 30 with 18 between: centres 5, 10 + 18 + 10, 10 + 18 + 20 + 18 + 15
    assert x_positions([[0, 1, 2]], [], [10.0, 20.0, 30.0]) == pytest.approx([5.0, 38.0, 81.0])


def test_x_positions_upward_sweeps_pull_parents():
    # 0 -> 1 -> 3, and 2 beside 3 with no edge; all 10 wide. Packed: 5; 5; 5, 33. Down: 3 wants 5,
    # the pair is spread to -9, 19 around its mean. Up (bottom first): 1 moves over 3 (19), then 0
    # over 1 (19). Then nothing moves.
    xs = x_positions([[0], [1], [2, 3]], [(0, 1), (1, 3)], [10.0] * 4)
    assert xs == pytest.approx([19.0, 19.0, -9.0, 19.0])
    # 0 -> 2 only: down spreads 1, 2 to -9, 19; up moves 0 over 2
    assert x_positions([[0], [1, 2]], [(0, 2)], [10.0] * 3) == pytest.approx([19.0, -9.0, 19.0])


def test_x_positions_alternate_sweeps():
    # Six sweeps, even ones down (to the mean of predecessors, top layer first), odd ones up (to the
    # mean of successors, bottom layer first); every node is 10 wide, so a pair sits 28 apart at least.
    # [[0], [1, 2], [3]], 0 -> 2 -> 3: down: 2 over 0 at 5, the pair spread to -9, 19; 3 over 2 at 19.
    # Up: 0 over 2 at 19. Then nothing moves.
    assert x_positions([[0], [1, 2], [3]], [(0, 2), (2, 3)], [10.0] * 4) == pytest.approx([19, -9, 19, 19])
    # [[0, 1], [2], [3, 4]], 1 -> 2 -> 3: each round halves the pull. Down: 2 at 33, the pair 3, 4 at
    # 19, 47. Up: 2 at 19; 0, 1 want 5, 19: spread to -2, 26. Down: 2 at 26; 3, 4 at 22.5, 50.5. Up: 2 at
    # 22.5; 0, 1 at -3.75, 24.25. Down: 2 at 24.25; 3, 4 at 23.375, 51.375. Up: 2 at 23.375; 0, 1 at
    # -4.1875, 23.8125.
    xs = x_positions([[0, 1], [2], [3, 4]], [(1, 2), (2, 3)], [10.0] * 5)
    assert xs == pytest.approx([-4.1875, 23.8125, 23.375, 23.375, 51.375])
    # [[0], [1, 2], [3, 4]], 0 -> 2 and 1 -> 4 (worked the same way, sweep by sweep)
    xs = x_positions([[0], [1, 2], [3, 4]], [(0, 2), (1, 4)], [10.0] * 5)
    assert xs == pytest.approx([32.78125, 4.78125, 32.78125, -22.5625, 5.4375])


def test_place_a_chain():
    nodes = (GraphNode("op", ("ab",), "a", LIGHT), GraphNode("op", ("abcd",), "b", LIGHT))
    placed = place(Graph(nodes, ((0, 1),), "mse"))
    # widths 2*6.4+20 = 32.8 and 4*6.4+20 = 45.6; heights 13+12 = 25
    assert placed.width == pytest.approx([32.8, 45.6]) and placed.height == [25.0, 25.0]
    # centred on one x; the wider one touches the margin: x = 8 + 45.6/2
    assert placed.x == pytest.approx([30.8, 30.8])
    # rows: top 8, then 8 + 25 + 34 = 67; centres half a row lower
    assert placed.y == pytest.approx([20.5, 79.5])
    assert placed.paths == [[pytest.approx((30.8, 33.0)), pytest.approx((30.8, 67.0))]]
    assert placed.size == pytest.approx((61.6, 100.0))


def test_place_bends_through_dummies():
    nodes = tuple(GraphNode("op", ("abcd",), str(i), LIGHT) for i in range(3))
    placed = place(Graph(nodes, ((0, 1), (1, 2), (0, 2)), "mse"))
    assert len(placed.paths[2]) == 3 and placed.paths[2][1][1] == pytest.approx(placed.y[1])
    assert len(placed.x) == 4  # three nodes and one dummy
    # widths 45.6 and the dummy 0: layer 1 is [1, dummy], spread 45.6 / 2 + 18 = 40.8 apart around
    # the centre of 0 and 2; then everything moves right so node 1's left side is at the margin
    assert placed.x == pytest.approx([51.2, 30.8, 51.2, 71.6])
    assert placed.size == pytest.approx((82.0, 8 + 25 * 3 + 34 * 2 + 8))
    # the edge 0 -> 2 ends on top of node 2, not at the dummy
    assert placed.paths[2][-1] == pytest.approx((51.2, placed.y[2] - 12.5))


def test_place_empty_graph():
    placed = place(Graph((), (), "mse"))
    assert placed.size == (8.0, 8.0) and placed.paths == [] and placed.x == []


def test_curve_and_arrow():
    assert _curve([(0.0, 0.0), (10.0, 20.0)]) == "M0.0,0.0 C0.0,10.0 10.0,10.0 10.0,20.0"
    assert _curve([(0, 0), (0, 10), (4, 30)]) == "M0.0,0.0 C0.0,5.0 0.0,5.0 0.0,10.0 C0.0,20.0 4.0,20.0 4.0,30.0"
    assert _arrow([(0.0, 0.0), (10.0, 20.0)]) == "6.5,13.0 13.5,13.0 10.0,20.0"
    assert _arrow([(0.0, 0.0), (1.0, 1.0), (10.0, 20.0)]) == "6.5,13.0 13.5,13.0 10.0,20.0"  # the last point


def test_layered_svg_of_a_chain():
    nodes = (
        GraphNode("input", ("x",), "x"),
        GraphNode("op", ("ab", "Conv"), "tip", DARKEST, "ab", "row-0"),
    )
    root = ET.fromstring(layered_svg(Graph(nodes, ((0, 1),), "mse")))
    assert root.get("class") == "graph layered"
    # widths 26.4 and 45.6 (Conv is 4 characters) -> size 61.6; heights 25 and 38 -> 8+25+34+38+8
    assert (root.get("width"), root.get("height"), root.get("viewBox")) == ("62", "113", "0 0 61.6 113.0")
    edges, first, second = list(root)
    assert edges.get("class") == "edges"
    (edge,) = edges
    path, arrow = list(edge)
    # like Graphviz's: <g class="edge"> with a grey stroke and a grey arrow head
    assert edge.get("class") == "edge"
    assert path.get("stroke").lower() == arrow.get("fill").lower() == "#8c959f"
    assert path.get("d") == "M30.8,33.0 C30.8,50.0 30.8,50.0 30.8,67.0" and path.get("fill") == "none"
    assert arrow.get("points") == "27.3,60.0 34.3,60.0 30.8,67.0"
    assert first.attrib == {"class": "node input"} and first.find(f"{SVG}rect") is None
    (text,) = first.iter(f"{SVG}text")
    assert text.attrib == {"x": "30.8", "y": "24.5", "text-anchor": "middle"} and text.text == "x"
    assert second.attrib == {"class": "node op", "data-color": DARKEST, "data-tensor": "ab"}
    link = second.find(f"{SVG}a")
    rect = link.find(f"{SVG}rect")
    assert rect.attrib == {
        "x": "8.0",
        "y": "67.0",
        "width": "45.6",
        "height": "38.0",
        "rx": "4",
        "fill": DARKEST,
        "stroke": "#57606a",
        "class": "shape",
    }
    texts = link.findall(f"{SVG}text")
    # two lines centred on y = 86: baselines at 86 - 6.5 + 4 and 13 lower, white on the dark fill
    assert [(t.get("y"), t.get("fill"), t.text) for t in texts] == [("83.5", "white", "ab"), ("96.5", "white", "Conv")]


def test_layered_svg_op_without_fill_is_white():
    root = ET.fromstring(layered_svg(Graph((GraphNode("op", ("a",), "a"),), (), "mse")))
    assert root.find(f".//{SVG}rect").get("fill") == "white"


# --- choosing the engine ------------------------------------------------------------------------


def test_render_graph_engines(monkeypatch):
    g = tiny_graph()
    calls = []

    def fake(graph_, dot=None):
        calls.append(graph_)
        return fake.svg

    monkeypatch.setattr(drawing, "graphviz_svg", fake)
    fake.svg = "<svg/>"
    drawn = drawing.render_graph(g)
    assert (drawn.svg, drawn.engine, drawn.nodes) == ("<svg/>", "graphviz", 2)
    assert drawing.render_graph(g, "graphviz").engine == "graphviz"
    fake.svg = None  # Graphviz missing or failing
    assert drawing.render_graph(g, "graphviz") is None
    drawn = drawing.render_graph(g, "auto")
    assert drawn.engine == "built-in" and drawn.svg.startswith('<svg class="graph layered"') and drawn.nodes == 2
    calls.clear()
    fake.svg = "<svg/>"
    assert drawing.render_graph(g, "built-in").engine == "built-in" and calls == []


def test_render_graph_size_limit(monkeypatch):
    monkeypatch.setattr(drawing, "graphviz_svg", lambda graph_, dot=None: None)
    monkeypatch.setattr(drawing, "layered_svg", lambda graph_: "<svg/>")
    node = GraphNode("input", ("x",), "x")
    assert drawing.render_graph(Graph((node,) * 3000, (), "mse")).nodes == 3000  # the limit is drawn
    assert drawing.render_graph(Graph((node,) * 3001, (), "mse")) is None
