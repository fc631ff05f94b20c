"""Unit tests of ``pytest_qaccuracy.model`` (all but matching): batch, cut, graph, loading, pair, quant_params.

Every model here is a few nodes built with ``onnx.helper``; the expected values are worked out by hand
from the ONNX spec or computed by onnx's own reference evaluator (``onnx.reference``), never read back
from the library.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from pytest_qaccuracy.errors import InputError, ModelError
from pytest_qaccuracy.model import GraphView, InputSpec, ModelPair, graph_inputs, load_model
from pytest_qaccuracy.model.batch import FREE_BATCH, bakes_batch, batch_dims, free_batch, stacking
from pytest_qaccuracy.model.cut import cut_pair, measurable
from pytest_qaccuracy.model.graph import attribute, live_nodes, node_reads, renamed_node
from pytest_qaccuracy.model.loading import ELEM_TYPE_NAMES, value_spec
from pytest_qaccuracy.model.quant_params import QuantParams, detect_format, find_quant_params

OPSET = [helper.make_opsetid("", 21)]
F = TensorProto.FLOAT


def _vi(name: str, shape=None, elem: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, inits=(), value_info=(), opset=OPSET) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits), value_info=list(value_info))
    return helper.make_model(graph, opset_imports=opset, ir_version=10)


def _const(value, name: str) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


# --- batch.py ---------------------------------------------------------------------------------------


def test_batch_dims_reads_each_fed_input_first_dim():
    no_shape = onnx.ValueInfoProto(name="a")
    no_shape.type.tensor_type.elem_type = F  # a tensor type without a shape field
    unknown = _vi("d", [3, 4])
    unknown.type.tensor_type.shape.dim[0].Clear()  # neither dim_value nor dim_param
    model = _model(
        [],
        [no_shape, _vi("w", [7]), _vi("b", [1, 3]), _vi("c", ["N", 3]), unknown, _vi("s", [])],
        [_vi("out", [1])],
        [_const(np.zeros(7, np.float32), "w")],  # an initializer listed as an input is not fed
    )
    assert batch_dims(model) == [None, 1, "N", None, None]


def _reshaper(shape, *, constant_node: bool = False, data: str = "x") -> onnx.ModelProto:
    """x -> Relu -> Reshape(shape): the shape an initializer, or a Constant node's value."""
    nodes = [helper.make_node("Relu", ["x"], ["r"])]
    inits = [_const(np.zeros((1, 4), np.float32), "k")]
    shape_t = _const(np.array(shape, np.int64), "shape")
    if constant_node:
        nodes.append(helper.make_node("Constant", [], ["shape"], value=shape_t))
    else:
        inits.append(shape_t)
    nodes.append(helper.make_node("Reshape", ["r" if data == "x" else data, "shape"], ["y"]))
    return _model(nodes, [_vi("x", [1, 4])], [_vi("y")], inits)


@pytest.mark.parametrize(
    ("shape", "constant_node", "data", "baked"),
    [
        ([1, 4], False, "x", True),  # 4 elements whatever the batch: baked
        ([1, 4], True, "x", True),  # the same shape from a Constant node
        ([-1, 4], False, "x", False),  # -1 takes the rest: stacks
        ([0, 4], False, "x", False),  # 0 copies the input's dimension: stacks
        ([4, -1], True, "x", False),
        ([1, 4], False, "k", False),  # a Reshape of a weight has no records in it
    ],
)
def test_bakes_batch_when_a_constant_shape_fixes_a_computed_tensor(shape, constant_node, data, baked):
    assert bakes_batch(_reshaper(shape, constant_node=constant_node, data=data)) is baked


def test_bakes_batch_ignores_shapes_it_cannot_read():
    # a Reshape whose shape is computed from the input (Shape) is not a constant
    shape_of = _model(
        [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Reshape", ["x", "s"], ["y"])],
        [_vi("x", [1, 4])],
        [_vi("y")],
    )
    assert not bakes_batch(shape_of)
    # a Constant without a tensor ``value`` (value_ints) does not count as a known shape
    ints = _model(
        [
            helper.make_node("Constant", [], ["s"], value_ints=[1, 4]),
            helper.make_node("Reshape", ["x", "s"], ["y"]),
        ],
        [_vi("x", [1, 4])],
        [_vi("y")],
    )
    assert not bakes_batch(ints)
    # opset 1's Reshape takes its shape as an attribute: one input only
    attr = _model(
        [helper.make_node("Reshape", ["x"], ["y"], shape=[1, 4])],
        [_vi("x", [1, 4])],
        [_vi("y")],
        opset=[helper.make_opsetid("", 1)],
    )
    assert not bakes_batch(attr)
    # an empty optional input does not make a node read the records: Clip(k, '', '') is folded,
    # and the Reshape of its output reads no record either
    folded = _model(
        [
            helper.make_node("Clip", ["k", "", ""], ["kc"]),
            helper.make_node("Reshape", ["kc", "shape"], ["y"]),
            helper.make_node("Relu", ["x"], ["z"]),
        ],
        [_vi("x", [1, 4])],
        [_vi("y"), _vi("z")],
        [_const(np.zeros((1, 4), np.float32), "k"), _const(np.array([1, 4], np.int64), "shape")],
    )
    assert not bakes_batch(folded)
    # ... while a Constant feeding a Reshape of the records is read like an initializer, even after
    # a node that reads both a record and nothing at all (an empty optional input)
    clipped = _model(
        [
            helper.make_node("Clip", ["x", "", ""], ["c"]),
            helper.make_node("Constant", [], ["s"], value=_const(np.array([2, 2], np.int64), "v")),
            helper.make_node("Reshape", ["c", "s"], ["y"]),
        ],
        [_vi("x", [1, 4])],
        [_vi("y")],
    )
    assert bakes_batch(clipped)


def test_free_batch_makes_declared_batch_one_symbolic_in_a_copy():
    model = _model(
        [helper.make_node("Add", ["x", "b"], ["y"]), helper.make_node("Relu", ["u"], ["v"])],
        [_vi("x", [1, 3]), _vi("b", [1, 3]), _vi("u", [2, 3]), _vi("one", [1]), _vi("sym", [1, "C"])],
        [_vi("y", [1, 3]), _vi("v", ["M", 3]), _vi("s", [])],
        [_const(np.zeros((1, 3), np.float32), "b")],
        value_info=[_vi("mid", [1, 5]), _vi("untyped")],
    )
    before = model.SerializeToString()
    freed = free_batch(model)
    assert model.SerializeToString() == before  # the original is untouched

    def first(values):
        out = {}
        for v in values:
            dims = v.type.tensor_type.shape.dim
            out[v.name] = (dims[0].dim_value, dims[0].dim_param) if dims else None
        return out

    assert first(freed.graph.input) == {
        "x": (0, FREE_BATCH),
        "b": (1, ""),
        "u": (2, ""),
        "one": (0, FREE_BATCH),  # rank 1: the one dimension is the batch
        "sym": (0, FREE_BATCH),  # whatever the dimensions after the first
    }
    assert freed.graph.input[4].type.tensor_type.shape.dim[1].dim_param == "C"
    assert first(freed.graph.output) == {"y": (0, FREE_BATCH), "v": (0, "M"), "s": None}
    assert first(freed.graph.value_info) == {"mid": (0, FREE_BATCH), "untyped": None}
    assert freed.graph.input[0].type.tensor_type.shape.dim[1].dim_value == 3


def _adder(*batches) -> onnx.ModelProto:
    names = [f"x{i}" for i in range(len(batches))]
    nodes = [helper.make_node("Sum", names, ["y"])]
    return _model(nodes, [_vi(n, [b, 2]) for n, b in zip(names, batches, strict=True)], [_vi("y", [batches[0], 2])])


def test_stacking_picks_the_model_and_whether_records_stack():
    dynamic = _adder("N", None)
    assert stacking(dynamic) == (dynamic, True) and stacking(dynamic)[0] is dynamic
    ones = _adder(1, 1)
    freed, stacks = stacking(ones)
    assert stacks and freed is not ones
    assert [v.type.tensor_type.shape.dim[0].dim_param for v in freed.graph.input] == [FREE_BATCH] * 2
    for fixed in (_adder(2), _adder(1, 2), _adder(1, "N")):
        model, stacks = stacking(fixed)
        assert model is fixed and not stacks
    baked = _reshaper([1, 4])
    assert stacking(baked)[0] is baked and stacking(baked)[1] is False
    dynamic_baked = _reshaper([1, 4])
    dynamic_baked.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    assert stacking(dynamic_baked) == (dynamic_baked, False)


def test_a_freed_model_runs_stacked_records_as_one_by_one():
    ones = _adder(1, 1)
    freed, _ = stacking(ones)
    onnx.checker.check_model(freed, full_check=True)
    a, b = np.arange(6, dtype=np.float32).reshape(3, 2), np.ones((3, 2), np.float32)
    (y,) = ReferenceEvaluator(freed).run(None, {"x0": a, "x1": b})
    np.testing.assert_array_equal(y, a + 1)


# --- graph.py ---------------------------------------------------------------------------------------


def _view_model() -> onnx.ModelProto:
    seq = onnx.ValueInfoProto(name="seq")
    seq.type.sequence_type.elem_type.tensor_type.elem_type = F
    nodes = [
        helper.make_node("Constant", [], ["c"], value=_const(np.array([1.5, 2.5], np.float32), "cv"), name="const"),
        helper.make_node("Constant", [], ["cf"], value_float=3.0, name="constf"),
        helper.make_node("Add", ["x", "c"], ["a"], name="add"),
        helper.make_node("Clip", ["a", "", "hi"], ["clip"], name="clip"),
        helper.make_node("Split", ["clip"], ["s0", "", "s2"], axis=0, name="split"),
        helper.make_node("Mul", ["s0", "a"], ["m"], name="mul"),
    ]
    return helper.make_model(
        helper.make_graph(
            nodes,
            "view",
            [_vi("x", [2]), _vi("hi", [], TensorProto.DOUBLE), _vi("k", [3], TensorProto.INT8)],
            [_vi("m", [1]), _vi("s2", [1], TensorProto.FLOAT16)],
            [_const(np.array(2.0, np.float64), "hi"), _const(np.array([1, 2, 3], np.int32), "w")],
            value_info=[_vi("a", [2], TensorProto.UINT8), seq],
        ),
        opset_imports=[helper.make_opsetid("com.microsoft", 1), helper.make_opsetid("ai.onnx", 13)],
        ir_version=8,
    )


def test_graph_view_indexes_producers_consumers_and_names():
    view = GraphView(_view_model())
    assert [n.name for n in view.nodes] == ["const", "constf", "add", "clip", "split", "mul"]
    assert {k: (i, n.name) for k, (i, n) in view.producer.items()} == {
        "c": (0, "const"),
        "cf": (1, "constf"),
        "a": (2, "add"),
        "clip": (3, "clip"),
        "s0": (4, "split"),
        "s2": (4, "split"),
        "m": (5, "mul"),
    }
    assert {k: [(i, n.name, p) for i, n, p in v] for k, v in view.consumers.items()} == {
        "x": [(2, "add", 0)],
        "c": [(2, "add", 1)],
        "a": [(3, "clip", 0), (5, "mul", 1)],
        "hi": [(3, "clip", 2)],
        "clip": [(4, "split", 0)],
        "s0": [(5, "mul", 0)],
    }
    assert view.consumers.get("") is None
    assert set(view.initializers) == {"hi", "w"}
    assert view.input_names == ["x", "k"]
    assert view.output_names == ["m", "s2"]
    assert view.elem_types == {
        "hi": TensorProto.DOUBLE,  # the input's declared type (here the same as the initializer's)
        "w": TensorProto.INT32,
        "x": F,
        "k": TensorProto.INT8,
        "m": F,
        "s2": TensorProto.FLOAT16,
        "a": TensorProto.UINT8,
    }
    assert view.activations() == ["a", "clip", "s0", "s2", "m"]
    assert view.opset == 13  # the ai.onnx entry, not com.microsoft's


def test_graph_view_elem_types_prefer_the_declared_value_over_the_initializer():
    model = _model([], [_vi("w", [1], TensorProto.FLOAT16)], [_vi("w", [1], TensorProto.FLOAT16)])
    model.graph.initializer.append(_const(np.array([1], np.int64), "w"))
    model.graph.initializer.append(_const(np.array([1], np.int8), "v"))
    assert GraphView(model).elem_types == {"w": TensorProto.FLOAT16, "v": TensorProto.INT8}


def test_graph_view_constants():
    view = GraphView(_view_model())
    np.testing.assert_array_equal(view.constant("c"), np.array([1.5, 2.5], np.float32))
    assert view.constant("c").dtype == np.float32
    hi = view.constant("hi")
    assert hi.dtype == np.float64 and hi.shape == () and hi == 2.0
    np.testing.assert_array_equal(view.constant("w"), [1, 2, 3])
    assert view.constant("cf") is None  # a Constant with value_float, not a tensor ``value``
    assert view.constant("a") is None and view.constant("x") is None and view.constant("nowhere") is None
    assert view.is_constant("c") and view.is_constant("cf") and view.is_constant("w") and view.is_constant("hi")
    assert not view.is_constant("a") and not view.is_constant("x") and not view.is_constant("nowhere")


@pytest.mark.parametrize(
    ("opsets", "version"),
    [
        ([helper.make_opsetid("", 11)], 11),
        ([helper.make_opsetid("com.microsoft", 1), helper.make_opsetid("", 19)], 19),
        ([helper.make_opsetid("ai.onnx.ml", 3)], 0),
        ([], 0),
    ],
)
def test_graph_view_opset(opsets, version):
    model = _model([], [_vi("x", [1])], [_vi("x", [1])])
    del model.opset_import[:]
    model.opset_import.extend(opsets)
    assert GraphView(model).opset == version


def test_graph_view_never_changes_the_model():
    model = _view_model()
    before = model.SerializeToString()
    view = GraphView(model)
    view.producer, view.consumers, view.elem_types, view.input_names, view.activations()
    view.constant("c"), view.constant("w")
    assert model.SerializeToString() == before


def _branch(nodes, outputs, name="b", inputs=(), inits=()) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, list(inputs), [_vi(o) for o in outputs], list(inits))


def test_node_reads_counts_what_subgraphs_take_from_outside():
    then = _branch([helper.make_node("Add", ["outer", "inner_w"], ["t"])], ["t"], inits=[_const(1.0, "inner_w")])
    # the else branch reads its own node's output ``e1`` (not from outside) and ``outer2``
    other = _branch(
        [helper.make_node("Neg", ["outer2"], ["e1"]), helper.make_node("Abs", ["e1"], ["e2"])],
        ["e2"],
    )
    node = helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)
    assert node_reads(node) == {"cond", "outer", "outer2"}
    # a Loop body's own inputs are not outside reads; a nested If inside it reaches out two levels
    inner = _branch([helper.make_node("Identity", ["far"], ["i"])], ["i"])
    body = _branch(
        [
            helper.make_node("Add", ["v_in", "near"], ["v_out"]),
            helper.make_node("If", ["c_in"], ["z"], then_branch=inner, else_branch=inner),
        ],
        ["c_in", "v_out"],
        inputs=[_vi("iter", [], TensorProto.INT64), _vi("c_in", [], TensorProto.BOOL), _vi("v_in")],
    )
    loop = helper.make_node("Loop", ["trip", "", "v0"], ["v_final"], body=body)
    assert node_reads(loop) == {"trip", "v0", "near", "far"}
    # a GRAPHS attribute (a list of graphs) is read too
    listed = helper.make_node("Custom", ["a", ""], ["b"], domain="x")
    listed.attribute.append(helper.make_attribute("bodies", [inner, then]))
    assert listed.attribute[0].type == onnx.AttributeProto.GRAPHS
    assert node_reads(listed) == {"a", "far", "outer"}


def test_renamed_node_renames_inside_subgraphs_in_a_copy():
    then = _branch([helper.make_node("Add", ["outer", "keep"], ["t"])], ["t"])
    other = _branch([helper.make_node("Neg", ["outer"], ["e"])], ["e"])
    node = helper.make_node("If", ["cond"], ["y", "z"], then_branch=then, else_branch=other, name="if")
    listed = helper.make_node("Custom", ["outer"], ["o"], domain="x", name="custom")
    listed.attribute.append(helper.make_attribute("bodies", [then, other]))
    names = {"outer": "OUTER", "y": "Y", "cond": "COND", "e": "E"}
    before = node.SerializeToString()
    copy = renamed_node(node, names)
    assert node.SerializeToString() == before
    assert copy.name == "if" and list(copy.input) == ["COND"] and list(copy.output) == ["Y", "z"]
    then_copy, other_copy = attribute(copy, "then_branch"), attribute(copy, "else_branch")
    assert list(then_copy.node[0].input) == ["OUTER", "keep"] and list(then_copy.node[0].output) == ["t"]
    assert list(other_copy.node[0].input) == ["OUTER"] and list(other_copy.node[0].output) == ["E"]
    assert renamed_node(node, {}, name="other").name == "other"
    renamed = renamed_node(listed, names)
    assert list(renamed.input) == ["OUTER"]
    assert [list(g.node[0].input) for g in renamed.attribute[0].graphs] == [["OUTER", "keep"], ["OUTER"]]
    assert [list(g.node[0].output) for g in renamed.attribute[0].graphs] == [["t"], ["E"]]


def test_live_nodes_walks_back_from_the_outputs():
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="a"),
        helper.make_node("Split", ["a"], ["b", "", "c"], name="split"),
        helper.make_node("Neg", ["c"], ["d"], name="d"),
        helper.make_node("Abs", ["x"], ["e"], name="e"),
        helper.make_node("Sum", ["d", "b"], ["f"], name="f"),
    ]
    assert [n.name for n in live_nodes(nodes, ["d"])] == ["a", "split", "d"]
    assert [n.name for n in live_nodes(nodes, ["e", "d"])] == ["a", "split", "d", "e"]
    assert [n.name for n in live_nodes(nodes, ["f"])] == ["a", "split", "d", "f"]
    assert live_nodes(nodes, [""]) == [] and live_nodes(nodes, ["x"]) == []


def test_attribute_reads_a_value_or_gives_the_default():
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], group=2, auto_pad="SAME_UPPER")
    assert attribute(node, "pads") == [1, 1, 1, 1]
    assert attribute(node, "group") == 2
    assert attribute(node, "auto_pad") == b"SAME_UPPER"
    assert attribute(node, "strides") is None
    assert attribute(node, "strides", [1, 1]) == [1, 1]


# --- loading.py -------------------------------------------------------------------------------------


def test_elem_type_names_are_numpy_dtype_names():
    for elem, name in ELEM_TYPE_NAMES.items():
        assert np.dtype(helper.tensor_dtype_to_np_dtype(elem)).name == name
    # every ONNX type that is a numpy dtype of its own (not bfloat16, float8, 4-bit or strings)
    ints = {f"{sign}int{bits}" for sign in ("", "u") for bits in (8, 16, 32, 64)}
    assert set(ELEM_TYPE_NAMES.values()) == {"float16", "float32", "float64", "bool", *ints}


def test_value_spec_and_graph_inputs():
    unknown = _vi("u", [3, 4])
    unknown.type.tensor_type.shape.dim[1].Clear()
    no_shape = onnx.ValueInfoProto(name="n")
    no_shape.type.tensor_type.elem_type = TensorProto.INT64
    model = _model(
        [],
        [_vi("x", [1, "N", 3]), _vi("w", [2]), unknown, no_shape, _vi("h", [2], TensorProto.BFLOAT16)],
        [_vi("y")],
        [_const(np.zeros(2, np.float32), "w")],
    )
    assert graph_inputs(model) == [
        InputSpec("x", "float32", (1, "N", 3)),
        InputSpec("u", "float32", (3, None)),
        InputSpec("n", "int64", ()),
        InputSpec("h", "TensorProto.BFLOAT16", (2,)),
    ]
    assert value_spec(_vi("b", [0], TensorProto.BOOL)) == InputSpec("b", "bool", (0,))


@pytest.mark.parametrize(
    ("shape", "text"),
    [((1, "N", None, 3), "(1, N, ?, 3)"), ((5,), "(5,)"), ((None,), "(?,)"), ((), "()"), ((0, 2), "(0, 2)")],
)
def test_describe_shape(shape, text):
    assert InputSpec("x", "float32", shape).describe_shape() == text


def _tiny() -> onnx.ModelProto:
    w = _const(np.arange(8, dtype=np.float32), "w")
    return _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x", [8])], [_vi("y", [8])], [w])


def test_load_model_reads_a_file_and_its_external_data(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_tiny(), str(path))
    model = load_model(str(path))  # a str path too
    assert model.graph.node[0].op_type == "Add"
    sub = tmp_path / "sub"
    sub.mkdir()
    onnx.save(_tiny(), str(tmp_path / "e.onnx"), save_as_external_data=True, location="sub/w.bin", size_threshold=0)
    loaded = load_model(tmp_path / "e.onnx")
    (w,) = loaded.graph.initializer
    assert w.data_location == TensorProto.DEFAULT
    np.testing.assert_array_equal(numpy_helper.to_array(w), np.arange(8))


def test_load_model_refuses_what_is_not_a_model(tmp_path):
    with pytest.raises(ModelError, match=rf"^{tmp_path}: a folder, not an ONNX model file$"):
        load_model(tmp_path)
    with pytest.raises(ModelError, match=r"^.*nope\.onnx: model file not found$"):
        load_model(tmp_path / "nope.onnx")
    (tmp_path / "empty.onnx").write_bytes(b"")
    with pytest.raises(ModelError, match=r"^.*empty\.onnx: empty file, not an ONNX model$"):
        load_model(tmp_path / "empty.onnx")
    (tmp_path / "bad.onnx").write_bytes(b"\x00\xffgarbage")
    with pytest.raises(ModelError, match=r"^.*bad\.onnx: not a readable ONNX model \(DecodeError: .*\)$"):
        load_model(tmp_path / "bad.onnx")
    (tmp_path / "nograph.onnx").write_bytes(onnx.ModelProto(ir_version=8).SerializeToString())
    with pytest.raises(ModelError, match=r"^.*nograph\.onnx: no graph, not an ONNX model$"):
        load_model(tmp_path / "nograph.onnx")


def _external(tmp_path, location: str) -> str:
    """Save the tiny model with external data, then point its weight at ``location``."""
    path = tmp_path / "m.onnx"
    onnx.save(_tiny(), str(path), save_as_external_data=True, location="w.bin", size_threshold=0)
    proto = onnx.load(str(path), load_external_data=False)
    for entry in proto.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = location
    if not location:
        kept = [e for e in proto.graph.initializer[0].external_data if e.key != "location"]
        del proto.graph.initializer[0].external_data[:]
        proto.graph.initializer[0].external_data.extend(kept)
    onnx.save(proto, str(path))
    return str(path)


@pytest.mark.parametrize(
    ("location", "message"),
    [
        ("/etc/w.bin", r"initializer 'w' points at external data '/etc/w\.bin' outside the model's folder "),
        ("", r"initializer 'w' points at external data '' outside the model's folder "),
        ("x/../../w.bin", r"initializer 'w' points at external data 'x/\.\./\.\./w\.bin' outside"),
        ("gone.bin", r"external data file 'gone\.bin' of 'w' not found$"),
        ("sub", r"external data file 'sub' of 'w' not found$"),  # a folder, not a file
    ],
)
def test_load_model_keeps_external_data_in_the_folder(tmp_path, location, message):
    (tmp_path / "sub").mkdir()
    path = _external(tmp_path, location)
    with pytest.raises(ModelError, match=rf"^.*m\.onnx: {message}"):
        load_model(path)


def test_load_model_checks_every_external_tensor_after_inline_ones(tmp_path):
    """A small tensor kept inside the file comes first; the large one after it points outside."""
    small = _const(np.array([3], np.int64), "small")
    model = _model(
        [helper.make_node("Add", ["x", "w"], ["y"]), helper.make_node("Identity", ["small"], ["k"])],
        [_vi("x", [64])],
        [_vi("y", [64]), _vi("k", [1], TensorProto.INT64)],
        [small, _const(np.arange(64, dtype=np.float32), "w")],
    )
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="w.bin", size_threshold=100)
    proto = onnx.load(str(path), load_external_data=False)
    assert [t.data_location for t in proto.graph.initializer] == [TensorProto.DEFAULT, TensorProto.EXTERNAL]
    np.testing.assert_array_equal(numpy_helper.to_array(load_model(path).graph.initializer[1]), np.arange(64))
    for entry in proto.graph.initializer[1].external_data:
        if entry.key == "location":
            entry.value = "../w.bin"
    onnx.save(proto, str(path))
    with pytest.raises(ModelError, match=r"initializer 'w' points at external data '\.\./w\.bin' outside"):
        load_model(path)


def test_load_model_names_the_model_when_external_data_is_unreadable(tmp_path):
    path = _external(tmp_path, "w.bin")
    (tmp_path / "w.bin").write_bytes(b"\x00" * 8)  # 2 floats where the tensor needs 8
    with pytest.raises(ModelError, match=r"^.*m\.onnx: cannot load external data \(.*\)$"):
        load_model(path)


def test_load_model_names_the_tensor_whose_external_data_is_longer_than_its_shape(tmp_path):
    """Without a 'length' entry onnx reads the external file to its end: 40 bytes for 8 floats (32)."""
    path = tmp_path / "m.onnx"
    onnx.save(_tiny(), str(path), save_as_external_data=True, location="w.bin", size_threshold=0)
    proto = onnx.load(str(path), load_external_data=False)
    kept = [e for e in proto.graph.initializer[0].external_data if e.key != "length"]
    del proto.graph.initializer[0].external_data[:]
    proto.graph.initializer[0].external_data.extend(kept)
    onnx.save(proto, str(path))
    with open(tmp_path / "w.bin", "ab") as extra:
        extra.write(b"\x00" * 8)
    with pytest.raises(ModelError) as info:
        load_model(path)
    assert str(info.value) == (
        f"{path}: cannot load external data ('w' has 40 bytes of data, its shape and type need 32)"
    )


def test_load_model_reads_packed_4_bit_external_data_without_a_size_check(tmp_path):
    """INT4 packs two values a byte: 8 values are 4 bytes, not 8 items of an item size."""
    packed = helper.make_tensor("w", TensorProto.INT4, [8], bytes([0x21, 0x43, 0x65, 0xF7]), raw=True)
    model = _model([helper.make_node("Identity", ["w"], ["y"])], [], [_vi("y", [8], TensorProto.INT4)], [packed])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="w.bin", size_threshold=0)
    assert (tmp_path / "w.bin").stat().st_size == 4
    loaded = load_model(path)
    np.testing.assert_array_equal(numpy_helper.to_array(loaded.graph.initializer[0]), [1, 2, 3, 4, 5, 6, 7, -1])


def test_load_model_checks_tensors_inside_subgraphs(tmp_path):
    then = _branch([helper.make_node("Identity", ["k"], ["t"])], ["t"], inits=[_const(np.ones(8, np.float32), "k")])
    model = _model(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=then)],
        [_vi("c", [], TensorProto.BOOL)],
        [_vi("y")],
    )
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="k.bin", size_threshold=0)
    proto = onnx.load(str(path), load_external_data=False)
    inner = proto.graph.node[0].attribute[0].g.initializer[0]
    assert inner.data_location == TensorProto.EXTERNAL
    for entry in inner.external_data:
        if entry.key == "location":
            entry.value = "../k.bin"
    onnx.save(proto, str(path))
    with pytest.raises(ModelError, match=r"initializer 'k' points at external data '\.\./k\.bin'"):
        load_model(path)


# --- pair.py ----------------------------------------------------------------------------------------


def _pair_models(q_output: int = F, q_outputs=("y", "n"), inputs=None):
    """fp32: x -> Mul(w) -> Relu -> Sigmoid -> y, x2 -> Neg -> n (and Abs -> a, which the QDQ model lacks);
    QDQ: the same with Q/DQ around x and around the Relu's output."""
    inputs = inputs or [_vi("x", ["N", 4]), _vi("x2", ["N", 4])]
    w = _const(np.full(4, 2.0, np.float32), "w")
    fp32 = _model(
        [
            helper.make_node("Mul", ["x", "w"], ["m"], name="mul"),
            helper.make_node("Relu", ["m"], ["r"], name="relu"),
            helper.make_node("Sigmoid", ["r"], ["y"], name="sig"),
            helper.make_node("Neg", ["x2"], ["n"], name="neg"),
            helper.make_node("Abs", ["x"], ["a"], name="abs"),
            helper.make_node("Abs", ["a"], ["a2"]),  # no name
        ],
        [*inputs, _vi("unused", [4])],
        [_vi("y", ["N", 4]), _vi("n", ["N", 4])],
        [w, _const(np.zeros(4, np.float32), "unused")],
        value_info=[_vi("m", ["N", 4]), _vi("r", ["N", 4], TensorProto.DOUBLE), _vi("a", ["N", 4])],
    )
    fp32.functions.append(
        helper.make_function("local", "F", ["i"], ["o"], [helper.make_node("Neg", ["i"], ["o"])], OPSET)
    )
    s, z = _const(np.array(0.05, np.float32), "s"), _const(np.array(128, np.uint8), "z")
    qdq = _model(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["x_q"]),
            helper.make_node("DequantizeLinear", ["x_q", "s", "z"], ["x_dq"]),
            helper.make_node("Mul", ["x_dq", "w"], ["m"], name="mul"),
            helper.make_node("Relu", ["m"], ["r"], name="relu"),
            helper.make_node("QuantizeLinear", ["r", "s", "z"], ["r_q"]),
            helper.make_node("DequantizeLinear", ["r_q", "s", "z"], ["r_dq"]),
            helper.make_node("Sigmoid", ["r_dq"], ["y"], name="sig"),
            helper.make_node("Neg", ["x2"], ["n"], name="neg"),
        ],
        list(inputs),
        [_vi(q_outputs[0], ["N", 4], q_output), _vi(q_outputs[1], ["N", 4])],
        [w, s, z],
    )
    return fp32, qdq


def test_pair_from_protos_takes_default_names():
    fp32, qdq = _pair_models()
    pair = ModelPair(fp32, qdq)
    assert str(pair.fp32_path) == "fp32.onnx" and str(pair.quantized_path) == "quantized.onnx"
    assert pair.name == "quantized" and pair.mapping == {} and pair.format == "qdq"
    assert pair.inputs == [InputSpec("x", "float32", ("N", 4)), InputSpec("x2", "float32", ("N", 4))]
    assert pair.output_pairs() == [("y", "y"), ("n", "n")]
    assert ModelPair(fp32, qdq, {"m": "m"}).mapping == {"m": "m"}


def test_pair_from_files_is_named_after_the_quantized_file(tmp_path):
    fp32, qdq = _pair_models()
    onnx.save(fp32, str(tmp_path / "net.onnx"))
    onnx.save(qdq, str(tmp_path / "net.int8.onnx"))
    mapping = {"r": "r_dq"}
    pair = ModelPair(str(tmp_path / "net.onnx"), tmp_path / "net.int8.onnx", mapping)
    mapping["m"] = "x"  # the pair keeps its own copy
    assert pair.fp32_path == tmp_path / "net.onnx" and pair.quantized_path == tmp_path / "net.int8.onnx"
    assert pair.name == "net.int8" and pair.mapping == {"r": "r_dq"}
    with pytest.raises(ModelError, match=r"nope\.onnx: model file not found"):
        ModelPair(tmp_path / "net.onnx", tmp_path / "nope.onnx")


def test_output_pairs_go_by_name_else_by_position():
    fp32, qdq = _pair_models(q_outputs=("n", "y"))  # the same names in another order
    assert ModelPair(fp32, qdq).output_pairs() == [("y", "y"), ("n", "n")]
    qdq.graph.output[0].name = "n_q"
    assert ModelPair(fp32, qdq).output_pairs() == [("y", "n_q"), ("n", "y")]


def test_pair_outputs_must_agree_in_count_and_be_numbers():
    fp32, qdq = _pair_models()
    del qdq.graph.output[1]
    with pytest.raises(ModelError, match=r"^fp32\.onnx has 2 output\(s\) \['y', 'n'\], quantized\.onnx has 1 \['y'\]$"):
        ModelPair(fp32, qdq)
    fp32, qdq = _pair_models(q_output=TensorProto.INT4)
    with pytest.raises(
        ModelError,
        match=r"^quantized\.onnx: output 'y' is int4, codes that cannot be compared as numbers; "
        "end the model with its DequantizeLinear$",
    ):
        ModelPair(fp32, qdq)
    fp32, qdq = _pair_models(q_output=TensorProto.FLOAT8E4M3FN)
    with pytest.raises(ModelError, match=r"output 'y' is float8e4m3fn, codes"):
        ModelPair(fp32, qdq)
    fp32, qdq = _pair_models(q_output=TensorProto.UINT8)  # 8-bit codes are numbers
    assert ModelPair(fp32, qdq).output_pairs() == [("y", "y"), ("n", "n")]


@pytest.mark.parametrize(
    ("quantized_inputs", "message"),
    [
        ([("x", ["N", 4]), ("x3", ["N", 4])], r"input names differ: fp32\.onnx has \['x', 'x2'\], quantized\.onnx has"),
        ([("x2", ["N", 4]), ("x", ["N", 4])], r"input names differ"),  # the order counts
        ([("x", ["N", 4]), ("x2", ["N", 4, 1])], r"^input 'x2': shape \(N, 4\) in fp32\.onnx but \(N, 4, 1\) in"),
        ([("x", ["N", 4]), ("x2", ["N"])], r"^input 'x2': shape \(N, 4\) in fp32\.onnx but \(N,\) in quantized"),
        ([("x", [2, 4]), ("x2", ["N", 3])], r"^input 'x2': shape \(N, 4\) in fp32\.onnx but \(N, 3\) in quantized"),
    ],
)
def test_pair_inputs_must_agree_in_order_rank_and_fixed_dims(quantized_inputs, message):
    fp32, _ = _pair_models()
    _, qdq = _pair_models(inputs=[_vi(n, s) for n, s in quantized_inputs])
    with pytest.raises(ModelError, match=message):
        ModelPair(fp32, qdq)


def test_pair_inputs_may_differ_where_a_dim_is_symbolic():
    fp32, _ = _pair_models(inputs=[_vi("x", [1, 4]), _vi("x2", ["N", None])])
    _, qdq = _pair_models(inputs=[_vi("x", ["B", 4]), _vi("x2", [3, "M"])])
    assert [s.name for s in ModelPair(fp32, qdq).inputs] == ["x", "x2"]
    fp32, _ = _pair_models(inputs=[_vi("x", [1, 4]), _vi("x2", [2, 4], TensorProto.DOUBLE)])
    _, qdq = _pair_models(inputs=[_vi("x", [1, 4]), _vi("x2", [2, 4])])
    with pytest.raises(ModelError, match=r"^input 'x2': dtype float64 in fp32\.onnx but float32 in quantized\.onnx$"):
        ModelPair(fp32, qdq)


# --- cut.py -----------------------------------------------------------------------------------------


def test_measurable_lists_node_outputs_and_model_outputs_not_inputs():
    pair = ModelPair(*_pair_models())
    assert measurable(pair) == {"m": "m", "r": "r_dq", "y": "y", "n": "n"}
    fp32, qdq = _pair_models()
    qdq.graph.output[1].name = "n_q"
    qdq.graph.node[-1].output[0] = "n_q"
    assert measurable(ModelPair(fp32, qdq))["n"] == "n_q"


def _run(model: onnx.ModelProto, **feeds) -> list[np.ndarray]:
    return ReferenceEvaluator(model).run(None, feeds)


def test_cut_pair_ends_both_models_at_the_chosen_tensor():
    pair = ModelPair(*_pair_models())
    cut = cut_pair(pair, ["r"])
    assert cut.fp32_path == pair.fp32_path and cut.quantized_path == pair.quantized_path
    assert [o.name for o in cut.fp32.graph.output] == ["r"] and [o.name for o in cut.quantized.graph.output] == ["r_dq"]
    assert [n.name for n in cut.fp32.graph.node] == ["mul", "relu"]
    assert [n.op_type for n in cut.quantized.graph.node] == [
        "QuantizeLinear",
        "DequantizeLinear",
        "Mul",
        "Relu",
        "QuantizeLinear",
        "DequantizeLinear",
    ]
    # inputs: every fed input stays (a dataset binds them all), a weight listed as input only if read
    assert [v.name for v in cut.fp32.graph.input] == ["x", "x2"]
    assert [t.name for t in cut.fp32.graph.initializer] == ["w"]
    assert sorted(t.name for t in cut.quantized.graph.initializer) == ["s", "w", "z"]
    assert [v.name for v in cut.fp32.graph.value_info] == ["m", "r"]  # not 'a': the cut does not need it
    # the outputs' element types come from the models (r is declared double in fp32, inferred in QDQ)
    assert cut.fp32.graph.output[0].type.tensor_type.elem_type == TensorProto.DOUBLE
    assert cut.quantized.graph.output[0].type.tensor_type.elem_type == F
    for model, source in ((cut.fp32, pair.fp32), (cut.quantized, pair.quantized)):
        assert model.ir_version == 10 and list(model.opset_import) == list(source.opset_import)
        assert model.graph.name == "g"
    assert [f.name for f in cut.fp32.functions] == ["F"] and len(cut.quantized.functions) == 0
    x = np.array([[-1.0, 0.3, 1.02, 7.0]], np.float32)
    x2 = np.zeros((1, 4), np.float32)
    (r,) = _run(cut.fp32, x=x, x2=x2)
    np.testing.assert_array_equal(r, np.maximum(2 * x, 0))
    (r_dq,) = _run(cut.quantized, x=x, x2=x2)
    (y, _) = _run(pair.quantized, x=x, x2=x2)
    np.testing.assert_allclose(1 / (1 + np.exp(-r_dq)), y, rtol=1e-6)  # what the Sigmoid reads


def test_cut_pair_resolves_nodes_quantized_names_and_repeats_in_order():
    pair = ModelPair(*_pair_models())
    cut = cut_pair(pair, ["n", "relu", "r_dq", "r", "sig", "y"])
    assert [o.name for o in cut.fp32.graph.output] == ["n", "r", "y"]
    assert [o.name for o in cut.quantized.graph.output] == ["n", "r_dq", "y"]
    assert [o.type.tensor_type.elem_type for o in cut.fp32.graph.output] == [F, TensorProto.DOUBLE, F]
    assert [n.name for n in cut.fp32.graph.node] == ["mul", "relu", "sig", "neg"]
    # the Sigmoid's input in the quantized model is 'r_dq', which the cut outputs as well
    (n, r, y) = _run(cut.fp32, x=np.ones((1, 4), np.float32), x2=np.ones((1, 4), np.float32))
    np.testing.assert_array_equal(n, -np.ones((1, 4)))
    np.testing.assert_array_equal(r, np.full((1, 4), 2.0))
    np.testing.assert_allclose(y, np.full((1, 4), 1 / (1 + np.exp(-2.0))), rtol=1e-6)


def test_cut_pair_keeps_the_user_mapping():
    fp32, qdq = _pair_models()
    pair = ModelPair(fp32, qdq, {"m": "m"})
    cut = cut_pair(pair, ["r"])
    assert cut.mapping == {"m": "m"}
    assert {m.fp32: m.matched_by for m in cut.matching.matches}["m"] == "user"
    assert {m.fp32: m.matched_by for m in cut_pair(ModelPair(fp32, qdq), ["r"]).matching.matches}["m"] == "name"


def test_cut_pair_leaves_an_unknown_type_unset():
    fp32, qdq = _pair_models()
    for model in (fp32, qdq):  # an op of an unknown domain: no type to infer for its output
        model.graph.node.append(helper.make_node("Mystery", ["x2"], ["u"], name="mystery", domain="x.y"))
        model.opset_import.append(helper.make_opsetid("x.y", 1))
    cut = cut_pair(ModelPair(fp32, qdq), ["u", "n"])
    for model in (cut.fp32, cut.quantized):
        assert [o.name for o in model.graph.output] == ["u", "n"]
        assert not model.graph.output[0].HasField("type")
        assert model.graph.output[1].type.tensor_type.elem_type == F


def test_cut_pair_refuses_names_it_cannot_measure_at():
    pair = ModelPair(*_pair_models())
    with pytest.raises(InputError, match=r"^no tensor to cut the models at: give at least one tensor or node name$"):
        cut_pair(pair, [])
    with pytest.raises(
        InputError, match=r"^cannot measure at 'x2': it is an input of fp32\.onnx, which both models share$"
    ):
        cut_pair(pair, ["r", "x2"])
    with pytest.raises(
        InputError,
        match=r"^cannot measure at 'abs': the output\(s\) of this node of fp32\.onnx \(a\) have no counterpart "
        r"in quantized\.onnx; measure at the node after it$",
    ):
        cut_pair(pair, ["abs"])
    with pytest.raises(
        InputError,
        match=r"^cannot measure at 'sigg': not a tensor or node of fp32\.onnx with a counterpart in "
        r"quantized\.onnx; close names: sig$",
    ):
        cut_pair(pair, ["sigg"])
    with pytest.raises(InputError, match=r"with a counterpart in quantized\.onnx$"):
        cut_pair(pair, ["zzzz"])
    # 'reab' and 'relu' share 're': a ratio of 2 * 2 / 8 = 0.5, just close enough
    with pytest.raises(InputError, match=r"quantized\.onnx; close names: relu$"):
        cut_pair(pair, ["reab"])
    # 'a' exists in fp32 but has no counterpart, 'x_q' only in the QDQ model; 'unused' is a weight that
    # fp32.onnx lists among its graph inputs: not an input both models share (the message said so before)
    for name in ("a", "unused", "x_q"):
        with pytest.raises(InputError, match=rf"^cannot measure at '{name}': not a tensor or node"):
            cut_pair(pair, [name])


def test_cut_pair_names_every_output_of_a_node_without_counterpart():
    fp32, qdq = _pair_models()
    fp32.graph.node.append(helper.make_node("Split", ["x2"], ["p1", "p2"], axis=1, num_outputs=2, name="split"))
    with pytest.raises(InputError, match=r"'split': the output\(s\) of this node of fp32\.onnx \(p1, p2\) have no"):
        cut_pair(ModelPair(fp32, qdq), ["split"])


def test_cut_pair_hints_at_most_five_close_names():
    fp32, qdq = _pair_models()
    for model in (fp32, qdq):
        for i in range(6):  # six Neg nodes named 'neg0'..'neg5' on x2
            model.graph.node.append(helper.make_node("Neg", ["x2"], [f"t{i}"], name=f"neg{i}"))
    pair = ModelPair(fp32, qdq)
    assert [o.name for o in cut_pair(pair, ["neg3"]).quantized.graph.output] == ["t3"]
    with pytest.raises(InputError, match="close names: ") as info:
        cut_pair(pair, ["negx"])  # 'neg' is closest; 'neg0'..'neg5' tie behind it
    close = str(info.value).split("close names: ")[1].split(", ")
    assert close[0] == "neg" and len(close) == 5 and set(close[1:]) < {f"neg{i}" for i in range(6)}


# --- quant_params.py --------------------------------------------------------------------------------


def _reference_dequantize(q, scale, zero_point, axis=None) -> np.ndarray:
    """DequantizeLinear as onnx's reference evaluator computes it."""
    inputs = [numpy_helper.from_array(np.asarray(scale, np.float32), "s")]
    inputs.append(numpy_helper.from_array(np.asarray(zero_point, q.dtype), "z"))
    kwargs = {} if axis is None else {"axis": axis}
    node = helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], **kwargs)
    elem = helper.np_dtype_to_tensor_dtype(q.dtype)
    model = _model([node], [_vi("q", list(q.shape), elem)], [_vi("y")], inputs)
    return ReferenceEvaluator(model).run(None, {"q": q})[0]


def test_per_tensor_scale():
    assert QuantParams(np.array([0.25]), np.array([3])).per_tensor_scale == 0.25
    assert QuantParams(np.array([[0.5]]), np.array([3])).per_tensor_scale == 0.5
    assert QuantParams(np.array([0.25, 0.5]), np.array([0, 0]), 0).per_tensor_scale is None


def test_dequantize_per_tensor_is_dequantize_linear():
    q = np.array([[0, 1, 127], [128, 200, 255]], np.uint8)
    params = QuantParams(np.array(0.1, np.float64), np.array(128, np.uint8))
    got = params.dequantize(q)
    assert got.dtype == np.float32 and got.shape == (2, 3)
    np.testing.assert_array_equal(got, _reference_dequantize(q, 0.1, 128))
    np.testing.assert_array_equal(got[1, 0], 0.0)  # the zero point
    q8 = np.array([-128, -3, 0, 127], np.int8)
    np.testing.assert_array_equal(
        QuantParams(np.array([0.02]), np.array([-3], np.int8)).dequantize(q8), _reference_dequantize(q8, 0.02, -3)
    )


@pytest.mark.parametrize("axis", [None, 1, -3, 0, 2, -1])
def test_dequantize_per_channel_is_dequantize_linear(axis):
    rng = np.random.default_rng(1)
    q = rng.integers(-128, 128, (3, 4, 5)).astype(np.int8)
    size = q.shape[1 if axis is None else axis]
    scale = rng.uniform(0.01, 1.0, size)
    zp = rng.integers(-5, 6, size).astype(np.int8)
    got = QuantParams(scale, zp, axis).dequantize(q)
    np.testing.assert_array_equal(got, _reference_dequantize(q, scale, zp, axis))


def test_dequantize_int32_codes_in_float32():
    q = np.array([1000, -7, 0], np.int32)
    got = QuantParams(np.array(0.5), np.array(0, np.int32)).dequantize(q)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, _reference_dequantize(q, 0.5, 0))


@pytest.mark.parametrize("shape", [(), (2,), (2, 3)])
def test_dequantize_a_one_element_scale_of_any_rank_keeps_the_codes_shape(shape):
    q = np.arange(np.prod(shape), dtype=np.uint8).reshape(shape) + 10
    got = QuantParams(np.full((1, 1, 1), 0.25), np.full((1, 1, 1), 2, np.uint8)).dequantize(q)
    assert got.shape == shape and got.dtype == np.float32
    np.testing.assert_array_equal(got, (q.astype(np.float64) - 2) * 0.25)  # exact: multiples of 1/4


def test_dequantize_writes_into_out():
    q = np.array([[1, 2], [3, 4]], np.uint16)
    out = np.full((2, 2), np.nan, np.float32)
    got = QuantParams(np.array(0.5), np.array(1, np.uint16)).dequantize(q, out=out)
    assert got is out
    np.testing.assert_array_equal(out, [[0.0, 0.5], [1.0, 1.5]])
    out = np.full((2, 2), np.nan, np.float32)
    got = QuantParams(np.array([0.5, 2.0]), np.array([1, 2], np.uint16), 0).dequantize(q, out=out)
    assert got is out
    np.testing.assert_array_equal(out, [[0.0, 0.5], [2.0, 4.0]])


def _view(nodes, inits=(), inputs=()) -> GraphView:
    graph = helper.make_graph(nodes, "q", [_vi(n) for n in inputs], [], list(inits))
    return GraphView(helper.make_model(graph, opset_imports=OPSET))


S = _const(np.array(0.5, np.float32), "s")
Z = _const(np.array(7, np.uint8), "z")
S2 = _const(np.array(0.25, np.float32), "s2")
Z2 = _const(np.array(-2, np.int8), "z2")
S3 = _const(np.array(2.0, np.float32), "s3")
Z3 = _const(np.array(9, np.uint8), "z3")
CHANNELS = _const(np.array([0.1, 0.2, 0.3], np.float32), "sc")
CHANNELS_ZP = _const(np.array([1, 2, 3], np.int8), "zc")


def _expect(found: QuantParams | None, scale, zero_point, axis=None, dtype=None) -> None:
    assert found is not None
    assert found.scale.dtype == np.float64
    np.testing.assert_array_equal(found.scale, np.asarray(scale, np.float32).astype(np.float64))
    np.testing.assert_array_equal(found.zero_point, zero_point)
    if dtype is not None:
        assert found.zero_point.dtype == dtype
    assert found.axis == axis


def test_quant_params_of_a_quantize_linear_output():
    view = _view(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
            helper.make_node("QuantizeLinear", ["x", "s"], ["q_nozp"]),
            helper.make_node("QuantizeLinear", ["x", "s", ""], ["q_empty"]),
            helper.make_node("QuantizeLinear", ["w", "sc", "zc"], ["w_q"], axis=0),
            helper.make_node("QuantizeLinear", ["x", "sc", "zc"], ["x_q"]),
            helper.make_node("QuantizeLinear", ["x", "x", "z"], ["computed"]),
            helper.make_node("QuantizeLinear", ["w", "two"], ["two_q"], axis=0),
        ],
        [S, Z, CHANNELS, CHANNELS_ZP, _const(np.array([0.5, 0.25], np.float32), "two")],
        ["x", "w"],
    )
    _expect(find_quant_params(view, "q"), 0.5, 7, dtype=np.uint8)
    # no zero point: 0 as uint8, the spec's default type, in the scale's shape
    _expect(find_quant_params(view, "q_nozp"), 0.5, 0, dtype=np.uint8)
    assert find_quant_params(view, "q_nozp").zero_point.shape == ()
    _expect(find_quant_params(view, "q_empty"), 0.5, 0, dtype=np.uint8)
    _expect(find_quant_params(view, "w_q"), [0.1, 0.2, 0.3], [1, 2, 3], axis=0, dtype=np.int8)
    _expect(find_quant_params(view, "two_q"), [0.5, 0.25], [0, 0], axis=0)  # two channels: per channel too
    _expect(find_quant_params(view, "x_q"), [0.1, 0.2, 0.3], [1, 2, 3], axis=1)  # the spec's default axis
    assert find_quant_params(view, "computed") is None  # a scale that is not a constant
    assert find_quant_params(view, "x") is None  # the float input


def test_quant_params_of_a_dequantize_linear_input():
    view = _view(
        [
            helper.make_node("DequantizeLinear", ["a", "s", "z"], ["a_dq"]),
            helper.make_node("DequantizeLinear", ["b", "sc"], ["b_dq"], axis=-1),
            helper.make_node("DequantizeLinear", ["c", "sc", "zc"], ["c_dq"]),
            helper.make_node("DequantizeLinear", ["d", "s2", "z2"], ["d_dq"], axis=0),
            helper.make_node("Mul", ["s", "s"], ["s_sq"]),
        ],
        [S, Z, S2, Z2, CHANNELS, CHANNELS_ZP],
        ["a", "b", "c", "d"],
    )
    _expect(find_quant_params(view, "a"), 0.5, 7)
    _expect(find_quant_params(view, "b"), [0.1, 0.2, 0.3], [0, 0, 0], axis=-1, dtype=np.uint8)
    _expect(find_quant_params(view, "c"), [0.1, 0.2, 0.3], [1, 2, 3], axis=1)
    _expect(find_quant_params(view, "d"), 0.25, -2, axis=None)  # one scale: no axis
    assert find_quant_params(view, "a_dq") is None  # the float output
    assert find_quant_params(view, "s") is None  # a scale read by position 1, not a quantized tensor


@pytest.mark.parametrize(
    ("op", "positions"),
    [
        ("QLinearConv", ((0, 1, 2), (3, 4, 5), (6, 7))),
        ("QLinearMatMul", ((0, 1, 2), (3, 4, 5), (6, 7))),
        ("QGemm", ((0, 1, 2), (3, 4, 5), (7, 8))),  # input 6 is C, the bias
        ("QLinearAdd", ((0, 1, 2), (3, 4, 5), (6, 7))),
        ("QLinearMul", ((0, 1, 2), (3, 4, 5), (6, 7))),
        ("QLinearWhere", ((1, 2, 3), (4, 5, 6), (7, 8))),  # input 0 is the condition
        ("QLinearSigmoid", ((0, 1, 2), (3, 4))),
        ("QLinearLeakyRelu", ((0, 1, 2), (3, 4))),
        ("QLinearSoftmax", ((0, 1, 2), (3, 4))),
        ("QLinearAveragePool", ((0, 1, 2), (3, 4))),
        ("QLinearGlobalAveragePool", ((0, 1, 2), (3, 4))),
        ("QLinearReduceMean", ((0, 1, 2), (3, 4))),
    ],
)
def test_quant_params_of_qlinear_operands_per_the_op_specs(op, positions):
    """Each operand and the output get the (scale, zero point) the spec places at their positions;
    the parameters are three distinct pairs, so a position off by one reads another one."""
    *operands, (out_s, out_z) = positions
    width = max(out_z, *(z for _, _, z in operands)) + 1
    names = [f"in{i}" for i in range(width)]
    pairs = [("s", "z", 0.5, 7), ("s2", "z2", 0.25, -2)]
    for (t, s, z), (sname, zname, _, _) in zip(operands, pairs[: len(operands)], strict=True):
        names[t], names[s], names[z] = f"t{t}", sname, zname
    names[out_s], names[out_z] = "s3", "z3"
    view = _view([helper.make_node(op, names, ["y", "extra"], domain="com.microsoft")], [S, Z, S2, Z2, S3, Z3])
    for (t, _, _), (_, _, scale, zp) in zip(operands, pairs[: len(operands)], strict=True):
        _expect(find_quant_params(view, f"t{t}"), scale, zp)
    _expect(find_quant_params(view, "y"), 2.0, 9)
    assert find_quant_params(view, "extra") is None  # only output 0 is the quantized result
    for name in names:
        if name.startswith("in"):
            assert find_quant_params(view, name) is None


def test_quant_params_of_qlinear_concat():
    """QLinearConcat: (Y scale, Y zp) at 0 and 1, then (tensor, scale, zp) per input from 2."""
    node = helper.make_node(
        "QLinearConcat", ["s3", "z3", "a", "s", "z", "b", "s2", "z2", "c", "s", ""], ["y"], domain="com.microsoft"
    )
    view = _view([node], [S, Z, S2, Z2, S3, Z3])
    _expect(find_quant_params(view, "y"), 2.0, 9)
    _expect(find_quant_params(view, "a"), 0.5, 7)
    _expect(find_quant_params(view, "b"), 0.25, -2)
    _expect(find_quant_params(view, "c"), 0.5, 0, dtype=np.uint8)
    no_zp = _view([helper.make_node("QLinearConcat", ["s3", "", "a", "s", "z"], ["y"])], [S, Z, S3])
    _expect(find_quant_params(no_zp, "y"), 2.0, 0, dtype=np.uint8)
    # the output's own scale position is not an operand: 's3' is read at position 0
    for name in ("s3", "z3", "s", "z", "s2", "z2"):
        assert find_quant_params(view, name) is None


def test_quant_params_pass_through_integer_ops():
    nodes = [
        helper.make_node("DequantizeLinear", ["a", "s", "z"], ["a_dq"]),
        helper.make_node("QuantizeLinear", ["x", "s2", "z2"], ["q"]),
        helper.make_node("MaxPool", ["q"], ["pooled"], kernel_shape=[2]),
        helper.make_node("Flatten", ["pooled"], ["flat"]),
        helper.make_node("Relu", ["q"], ["relu"]),  # not a pass-through op
        helper.make_node("Reshape", ["", "shape"], ["empty_first"]),
    ]
    view = _view(nodes, [S, Z, S2, Z2], ["x"])
    _expect(find_quant_params(view, "flat"), 0.25, -2)
    _expect(find_quant_params(view, "pooled"), 0.25, -2)
    assert find_quant_params(view, "relu") is None
    assert find_quant_params(view, "empty_first") is None
    # a consumer's parameters come first: a DequantizeLinear reading the pass-through output
    nodes.append(helper.make_node("DequantizeLinear", ["flat", "s", "z"], ["flat_dq"]))
    _expect(find_quant_params(_view(nodes, [S, Z, S2, Z2], ["x"]), "flat"), 0.5, 7)


def test_quant_params_pass_through_stops_after_64_ops():
    def chain(length: int) -> GraphView:
        nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["t0"])]
        nodes += [helper.make_node("Identity", [f"t{i}"], [f"t{i + 1}"]) for i in range(length)]
        return _view(nodes, [S, Z], ["x"])

    _expect(find_quant_params(chain(64), "t64"), 0.5, 7)
    assert find_quant_params(chain(65), "t65") is None
    _expect(find_quant_params(chain(65), "t1"), 0.5, 7)
    assert find_quant_params(chain(3), "t3", _depth=62) is None
    _expect(find_quant_params(chain(3), "t3", _depth=61), 0.5, 7)


#: a QOperator op between a QuantizeLinear and a DequantizeLinear
QOP = [("QuantizeLinear", ["x", "s"]), ("QLinearAdd", ["q"]), ("DequantizeLinear", ["a", "s"])]


@pytest.mark.parametrize(
    ("ops", "fmt"),
    [
        ([("QuantizeLinear", ["x", "s"]), ("DequantizeLinear", ["q", "s"]), ("Conv", ["dq", "w"])], "qdq"),
        ([("DequantizeLinear", ["x", "s"]), ("Relu", ["dq"])], "qdq"),
        ([("QuantizeLinear", ["x", "s"]), ("Relu", ["q"])], "float"),  # no DequantizeLinear
        ([("Conv", ["x", "w"])], "float"),
        ([("QuantizeLinear", ["x", "s"]), ("QLinearConv", ["q"]), ("DequantizeLinear", ["c", "s"])], "qoperator"),
        ([("MatMulInteger", ["x", "w"])], "qoperator"),
        # QOperator ops next to a float Conv/MatMul/Gemm fed by a DequantizeLinear: both formats
        ([*QOP, ("Conv", ["w", "dq"])], "mixed"),
        ([*QOP, ("MatMul", ["dq", "w"])], "mixed"),
        ([*QOP, ("Gemm", ["dq", "w"])], "mixed"),
        # ... but not when the float op reads no DequantizeLinear, for another float op, or with no QuantizeLinear
        ([*QOP, ("Conv", ["x", "w"])], "qoperator"),
        ([*QOP, ("Add", ["dq", "w"])], "qoperator"),
        ([*QOP[1:], ("Conv", ["dq", "w"])], "qoperator"),
    ],
)
def test_detect_format(ops, fmt):
    outputs = {"QuantizeLinear": "q", "DequantizeLinear": "dq", "QLinearConv": "c", "QLinearAdd": "a"}
    nodes = [helper.make_node(op, inputs, [outputs.get(op, f"{op}_out")]) for op, inputs in ops]
    assert detect_format(_view(nodes)) == fmt
