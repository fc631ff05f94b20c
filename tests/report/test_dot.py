"""DOT graph: structure parsed from the text, hostile names, and a real Graphviz render when available."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import onnx
import pytest
from onnx import TensorProto, helper

from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.numbers import format_fixed
from pytest_qaccuracy.report.dot import dot_document, quote, write_dot

QUOTED = r'"(?:[^"\\]|\\.)*"'
NODE = re.compile(rf"^  ({QUOTED}) \[(.*)\];$")
EDGE = re.compile(rf"^  ({QUOTED}) -> ({QUOTED});$")
ATTR = re.compile(rf"(\w+)=({QUOTED}|<<.*>>|[^,\]]+)")


def unquote(text: str) -> str:
    """Inverse of the writer's escaping (what a label shows)."""
    out, i, body = [], 0, text[1:-1]
    while i < len(body):
        if body[i] == "\\":
            out.append("\n" if body[i + 1] == "n" else body[i + 1])
            i += 2
        else:
            out.append(body[i])
            i += 1
    return "".join(out)


def parse(text: str) -> tuple[dict[str, dict[str, str]], list[tuple[str, str]]]:
    lines = text.splitlines()
    assert lines[0].startswith("digraph ") and lines[0].endswith(" {") and lines[-1] == "}"
    nodes, edges = {}, []
    for line in lines[1:-1]:
        if m := EDGE.match(line):
            edges.append((unquote(m[1]), unquote(m[2])))
        elif m := NODE.match(line):
            attrs = {k: unquote(v) if v.startswith('"') else v for k, v in ATTR.findall(m[2])}
            nodes[unquote(m[1])] = attrs
        else:
            assert line == "  forcelabels=true;", line
    return nodes, edges


def make_model(names: dict[str, str] | None = None) -> onnx.ModelProto:
    """x -> Conv(W) -> c -> Relu -> r -> Add(r, Constant k) -> a -> Split -> (s0, s1) -> Concat -> y."""
    n = {k: k for k in ("x", "c", "r", "k", "a", "s0", "s1", "y")} | (names or {})
    w = helper.make_tensor("W", TensorProto.FLOAT, [2, 1, 1, 1], [1.0, 2.0])
    nodes = [
        helper.make_node("Conv", [n["x"], "W"], [n["c"]], name="conv"),
        helper.make_node("Relu", [n["c"]], [n["r"]], name="relu"),
        helper.make_node("Constant", [], [n["k"]], value=helper.make_tensor("kv", TensorProto.FLOAT, [], [1.0])),
        helper.make_node("Add", [n["r"], n["k"]], [n["a"]], name="add"),
        helper.make_node("Split", [n["a"]], [n["s0"], n["s1"]], axis=1, num_outputs=2, name="split"),
        helper.make_node("Concat", [n["s0"], n["s1"]], [n["y"]], axis=1, name="concat"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n["x"], TensorProto.FLOAT, [1, 1, 4, 4])],
        [helper.make_tensor_value_info(n["y"], TensorProto.FLOAT, [1, 2, 4, 4])],
        initializer=[w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.fixture
def result(make_result):
    rows = [("c", "Conv", {"mse": 0.001}), ("r", "Relu", {"mse": 0.004}), ("s1", "Split", {"mse": 0.01})]
    return make_result(rows, outputs=[("y", {"mse": 0.0046})], definitions={"mse": "x"})


def test_structure(result):
    nodes, edges = parse(dot_document(make_model(), result, "mse"))
    assert set(nodes) == {"color_table", "x", "c", "r", "a", "s0", "y", "y (1)"}
    assert nodes["color_table"]["shape"] == "none"
    legend = nodes["color_table"]["label"]
    assert legend.count("<tr>") == 9 and legend.startswith("<<table") and legend.endswith("</table>>")
    assert '<td bgcolor="#ffffcc">MSE: 0.0010 ~ 0.0020</td>' in legend
    assert '<td bgcolor="#800026"><font color="white">MSE: 0.0090 ~ 0.0100</font></td>' in legend
    # compared ops: filled with the slot colour and an xlabel; the range is 0.001..0.01, step 0.001
    assert nodes["c"] == {"label": "c\nConv", "style": "filled", "fillcolor": "#ffffcc", "xlabel": "MSE: 0.0010"}
    assert nodes["r"]["fillcolor"] == "#fed976"  # 0.004 is the end of slot 2 (inclusive)
    assert nodes["y"]["fillcolor"] == "#feb24c" and nodes["y"]["xlabel"] == "MSE: 0.0046"
    # Split is named by its first output; its second output was compared, so it is coloured
    assert nodes["s0"]["fillcolor"] == "#800026" and nodes["s0"]["label"] == "s0\nSplit"
    assert nodes["s0"]["fontcolor"] == "white"
    assert nodes["a"]["fillcolor"] == "gray" and "xlabel" not in nodes["a"]
    assert nodes["x"] == {"shape": "plaintext", "label": "x"}
    assert nodes["y (1)"] == {"shape": "plaintext", "label": "y"}
    assert "k" not in nodes and "W" not in nodes
    assert edges == [("x", "c"), ("c", "r"), ("r", "a"), ("a", "s0"), ("s0", "y"), ("y", "y (1)")]


def test_higher_is_better_colours(make_result):
    result = make_result([("c", "Conv", {"cosine": 0.9}), ("r", "Relu", {"cosine": 0.99})], definitions={"cosine": "x"})
    nodes, _ = parse(dot_document(make_model(), result, "cosine"))
    assert nodes["c"]["fillcolor"] == "#800026" and nodes["r"]["fillcolor"] == "#ffffcc"
    assert nodes["c"]["xlabel"] == "COSINE: 0.9000"


def test_degenerate_and_tiny_values(make_result):
    result = make_result([("c", "Conv", {"mse": 0.0}), ("r", "Relu", {"mse": 0.0})], definitions={"mse": "x"})
    nodes, _ = parse(dot_document(make_model(), result, "mse"))
    assert nodes["c"]["fillcolor"] == "#ffffcc" and nodes["c"]["xlabel"] == "MSE: 0.0000"
    assert format_fixed(1.5e-6) == "1.5000e-06" and format_fixed(0.0128) == "0.0128"


def test_quote():
    assert quote('a"b') == r'"a\"b"'
    assert quote("a\\b") == r'"a\\b"'
    assert quote("a\\") == r'"a\\"'
    assert quote("two\nlines") == r'"two\nlines"'


HOSTILE = {"x": 'in"put\\', "c": 'a"b</script>', "r": "<b>&amp;", "y": "color_table"}


def test_hostile_names(make_result):
    result = make_result(
        [(HOSTILE["c"], "Conv", {"mse": 0.1}), (HOSTILE["r"], "Relu", {"mse": 0.2})], definitions={"m<&>": "x"}
    )
    with pytest.raises(InputError, match="no metric 'tae'"):
        dot_document(make_model(HOSTILE), result, "tae")
    result = make_result(
        [(HOSTILE["c"], "Conv", {"m<&>": 0.1}), (HOSTILE["r"], "Relu", {"m<&>": 0.2})], definitions={"m<&>": "x"}
    )
    nodes, edges = parse(dot_document(make_model(HOSTILE), result, "m<&>"))
    assert HOSTILE["c"] in nodes and HOSTILE["x"] in nodes
    assert nodes[HOSTILE["c"]]["xlabel"] == "M<&amp;>: 0.1000"  # Graphviz decodes entities in labels
    assert nodes[HOSTILE["r"]]["label"] == "<b>&amp;amp;\nRelu"
    assert "M&lt;&amp;&gt;: " in nodes["color_table (1)"]["label"]  # the output is named color_table
    assert (HOSTILE["x"], HOSTILE["c"]) in edges


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz 'dot' is not installed")
@pytest.mark.parametrize("hostile", [False, True])
def test_graphviz_renders(make_result, tmp_path, hostile):
    names = HOSTILE if hostile else {}
    c, r = names.get("c", "c"), names.get("r", "r")
    result = make_result([(c, "Conv", {"mse": 0.1}), (r, "Relu", {"mse": 0.3})], definitions={"mse": "x"})
    path = write_dot(tmp_path / "net.mse.dot", make_model(names), result, "mse")
    done = subprocess.run(["dot", "-Tjson", str(path)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    graph = json.loads(done.stdout)
    assert len(graph["objects"]) == 8 and len(graph["edges"]) == 6
    fills = sorted(o.get("fillcolor", "") for o in graph["objects"])
    assert fills.count("gray") == 3 and "#ffffcc" in fills and "#800026" in fills
    svg = subprocess.run(["dot", "-Tsvg", str(path)], capture_output=True, text=True, timeout=60, check=True).stdout
    if hostile:
        assert "a&quot;b&lt;/script&gt;" in svg or 'a"b&lt;/script&gt;' in svg
        assert "&lt;b&gt;&amp;amp;" in svg  # the name shows literally as <b>&amp;
