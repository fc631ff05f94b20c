"""Tensor matching on small hand-made graphs: what is a candidate, how the structure walk treats
unmatched, dropped and folded nodes, each quantized tensor matched once, the reported fields.

Every expected match below is read off the hand-made graph (which tensor holds which value)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pytest_qaccuracy.model import ModelPair, match_tensors
from pytest_qaccuracy.model.matching import Matcher

F = TensorProto.FLOAT
n = helper.make_node


def model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    """A model from nodes; ``inputs``/``outputs`` are ``(name, elem_type)`` with shape ``[2, 4]``."""
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(name, t, [2, 4]) for name, t in inputs],
        [helper.make_tensor_value_info(name, t, None) for name, t in outputs],
        list(inits),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def init(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, np.float32 if isinstance(value, float) else None), name)


SCALE = [init("s", np.float32(0.05)), init("z", np.uint8(128))]


def fields(matching) -> list[tuple]:
    return [(m.fp32, m.quantized, m.capture, m.matched_by) for m in matching.matches]


# -- the zoo: every reported field ------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["qdq_u8", "qop_u8"])
def test_zoo_matches_report_node_op_order_and_names(zoo, variant):
    matching = ModelPair(zoo["fp32"], zoo[variant]).matching
    fp32 = onnx.load(str(zoo["fp32"]))
    order = {out: (i, node) for i, node in enumerate(fp32.graph.node) for out in node.output}
    for m in matching.matches[1:]:  # after the graph input: the fp32 node that makes the tensor
        i, node = order[m.fp32]
        assert (m.node, m.op_type, m.order) == (node.name, node.op_type, i)
        assert m.node  # the zoo names its nodes
    x = matching.matches[0]
    assert (x.fp32, x.node, x.op_type, x.order) == ("x", None, "input", -1)
    by_name = {m.fp32: m for m in matching.matches}
    if variant == "qdq_u8":  # integer captured, the DequantizeLinear output reported
        assert by_name["x"].quantized == "x_DequantizeLinear_Output"
        assert by_name["add1"].quantized == "add1_DequantizeLinear_Output"
    else:  # QOperator tensors are read by the next QLinear op, not by a DequantizeLinear
        assert by_name["x"].quantized == by_name["x"].capture == "x_quantized"
        assert by_name["add1"].quantized == by_name["add1"].capture == "add1_quantized"
        assert by_name["logits"].quantized == "logits"  # the output's DequantizeLinear
    assert matching.unmatched_quantized == []


def test_user_mapping_takes_its_tensor_away_from_the_name_pass(zoo):
    fp32, quant = onnx.load(str(zoo["fp32"])), onnx.load(str(zoo["qdq_u8"]))
    # the user points conv2 at add1's integer tensor: conv2 reports it; add1, whose tensor it is,
    # stays unmatched rather than sharing it; every later tensor is still matched by name
    matching = match_tensors(fp32, quant, {"conv2": "add1_QuantizeLinear_Output"})
    by_name = {m.fp32: m for m in matching.matches}
    assert (by_name["conv2"].capture, by_name["conv2"].quantized, by_name["conv2"].matched_by) == (
        "add1_QuantizeLinear_Output",
        "add1_DequantizeLinear_Output",
        "user",
    )
    assert float(by_name["conv2"].params.scale) > 0
    assert matching.unmatched_fp32 == ["conv1", "add1"]
    later = ["cat1", "pool1", "conv3", "sig1", "gap", "flat", "gemm", "logits"]
    assert [by_name[name].matched_by for name in later] == ["name"] * len(later)
    # conv2 mapped to its own tensor: nothing else changes
    matching = match_tensors(fp32, quant, {"conv2": "conv2_DequantizeLinear_Output"})
    assert matching.unmatched_fp32 == ["conv1"]
    assert [m.matched_by for m in matching.matches if m.fp32 != "conv2"] == ["name"] * 11


# -- candidates -----------------------------------------------------------------------------------


def test_candidates_are_float_activations_only():
    """A Constant node, a constant subgraph (weights times a constant) and an integer output
    (ArgMax, its type known only by shape inference) are no activations."""
    w = init("w", np.ones((4, 4), np.float32))
    two = init("two", np.float32(2))
    fp32 = model(
        [
            n("Constant", [], ["c"], value=helper.make_tensor("v", F, [], [1.0])),
            n("Mul", ["w", "two"], ["w2"]),
            n("MatMul", ["x", "w2"], ["y"], name="mm"),
            n("Add", ["y", "c"], ["y1"]),
            n("ArgMax", ["y1"], ["am"], axis=1),
            n("Cast", ["am"], ["amf"], to=F),
        ],
        [("x", F)],
        [("amf", F)],
        [w, two],
    )
    matching = match_tensors(fp32, fp32)
    assert fields(matching) == [("y", "y", "y", "name"), ("y1", "y1", "y1", "name"), ("amf", "amf", "amf", "name")]
    assert (matching.matches[0].node, matching.matches[1].node) == ("mm", None)  # unnamed node: None
    assert matching.unmatched_fp32 == []
    # of the quantized side's tensors, only am is a computed one that nothing matched
    assert matching.unmatched_quantized == ["am"]


# -- the structure walk ---------------------------------------------------------------------------


def _walk_pair() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """fp32: n = Neg(x), r = Relu(n), s = Sigmoid(x), s2 = Identity(s), i = Identity(x),
    i2 = Identity(i), t = Tanh(i). The other model computes Abs where fp32 has Neg, has no
    Identity, keeps the name s and renames the rest."""
    fp32 = model(
        [
            n("Neg", ["x"], ["n"]),
            n("Relu", ["n"], ["r"]),
            n("Sigmoid", ["x"], ["s"]),
            n("Identity", ["s"], ["s2"]),
            n("Identity", ["x"], ["i"]),
            n("Identity", ["i"], ["i2"]),
            n("Tanh", ["i"], ["t"]),
        ],
        [("x", F)],
        [("r", F), ("s2", F), ("i2", F), ("t", F)],
    )
    other = model(
        [n("Abs", ["x"], ["qa"]), n("Relu", ["qa"], ["qr"]), n("Sigmoid", ["x"], ["s"]), n("Tanh", ["x"], ["qt"])],
        [("x", F)],
        [("qr", F), ("s", F), ("qt", F)],
    )
    return fp32, other


def test_structure_walk_goes_past_unmatched_nodes_and_through_dropped_ones():
    fp32, other = _walk_pair()
    matching = match_tensors(fp32, other)
    assert fields(matching) == [
        ("s", "s", "s", "name"),
        ("i", "x", "x", "structure"),  # a dropped Identity holds its input: the graph input x
        ("t", "qt", "qt", "structure"),  # Tanh(Identity(x)) is Tanh(x)
    ]
    # n has no counterpart (Abs is not Neg), so neither has r; s2 and i2 would only repeat a
    # tensor already matched (each quantized tensor is reported once)
    assert matching.unmatched_fp32 == ["n", "r", "s2", "i2"]
    assert matching.unmatched_quantized == ["qa", "qr"]


def test_a_quantized_input_taken_by_a_dropped_node_is_not_reported_twice():
    fp32 = model([n("Identity", ["x"], ["i"]), n("Relu", ["i"], ["r"])], [("x", F)], [("r", F)])
    quant = model(
        [
            n("QuantizeLinear", ["x", "s", "z"], ["xq"]),
            n("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
            n("Relu", ["xd"], ["qr"]),
        ],
        [("x", F)],
        [("qr", F)],
        SCALE,
    )
    matching = match_tensors(fp32, quant)
    assert fields(matching) == [("i", "xd", "xq", "structure"), ("r", "qr", "qr", "structure")]
    assert float(matching.matches[0].params.scale) == pytest.approx(0.05)


def test_graph_inputs_after_unquantized_ones_are_reported():
    """Inputs in order: an integer one and a float one that the model does not quantize are
    skipped, the quantized one after them is reported."""
    fp32 = model(
        [n("Cast", ["ids"], ["c"], to=F), n("Add", ["m", "c"], ["a"]), n("Relu", ["x"], ["r"])],
        [("ids", TensorProto.INT64), ("m", F), ("x", F)],
        [("a", F), ("r", F)],
    )
    quant = model(
        [
            n("Cast", ["ids"], ["c"], to=F),
            n("Add", ["m", "c"], ["a"]),
            n("QuantizeLinear", ["x", "s", "z"], ["xq"]),
            n("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
            n("Relu", ["xd"], ["r"]),
        ],
        [("ids", TensorProto.INT64), ("m", F), ("x", F)],
        [("a", F), ("r", F)],
        SCALE,
    )
    matching = match_tensors(fp32, quant)
    assert [(m.fp32, m.op_type, m.capture) for m in matching.matches] == [
        ("x", "input", "xq"),
        ("c", "Cast", "c"),
        ("a", "Add", "a"),
        ("r", "Relu", "r"),
    ]


def test_a_second_output_the_fp32_node_lacks_is_ignored():
    """fp32 Dropout has one output, the other model's two (with the mask): the data output matches."""
    fp32 = model([n("Dropout", ["x"], ["d"]), n("Relu", ["d"], ["r"])], [("x", F)], [("r", F)])
    other = model([n("Dropout", ["x"], ["qd", "mask"]), n("Relu", ["qd"], ["qr"])], [("x", F)], [("qr", F)])
    matching = match_tensors(fp32, other)
    assert fields(matching) == [("d", "qd", "qd", "structure"), ("r", "qr", "qr", "structure")]
    assert matching.unmatched_quantized == []  # the mask is no activation


# -- activations folded into the op before them ---------------------------------------------------


def _conv_relu_fp32() -> onnx.ModelProto:
    """x0 = Relu(x), a = MatMul(x0, w), b = Relu(a)."""
    w = init("w", np.eye(4, dtype=np.float32))
    return model(
        [n("Relu", ["x"], ["x0"]), n("MatMul", ["x0", "w"], ["a"]), n("Relu", ["a"], ["b"])],
        [("x", F)],
        [("b", F)],
        [w],
    )


def test_a_folded_relu_takes_the_match_of_the_op_before_it():
    """The quantized MatMul already applies the Relu (its output range starts at 0), its
    quantized output is renamed: b is that tensor, a has no counterpart of its own."""
    quant = model(
        [
            n("Relu", ["x"], ["x0"]),
            n("MatMul", ["x0", "w"], ["a"]),
            n("QuantizeLinear", ["a", "s", "z"], ["aq"]),
            n("DequantizeLinear", ["aq", "s", "z"], ["out"]),
        ],
        [("x", F)],
        [("out", F)],
        [init("w", np.eye(4, dtype=np.float32)), *SCALE],
    )
    fp32 = _conv_relu_fp32()
    matching = match_tensors(fp32, quant)
    assert fields(matching) == [("x0", "x0", "x0", "name"), ("b", "out", "aq", "name")]
    assert matching.unmatched_fp32 == ["a"]
    # a model output is captured as the float tensor itself, not the value the next layer reads
    matcher = Matcher(fp32, quant)
    assert matcher.resolve("a", follow_quantize=False) == ("a", "a", None)
    reported, capture, params = matcher.resolve("a")
    assert (reported, capture, float(params.scale)) == ("out", "aq", pytest.approx(0.05))


def test_a_relu_kept_in_the_quantized_model_is_matched_to_its_own_output():
    """Here the quantized model keeps its Relu (after Q/DQ): a keeps its match, b gets the Relu's."""
    quant = model(
        [
            n("Relu", ["x"], ["x0"]),
            n("MatMul", ["x0", "w"], ["a"]),
            n("QuantizeLinear", ["a", "s", "z"], ["aq"]),
            n("DequantizeLinear", ["aq", "s", "z"], ["ad"]),
            n("Relu", ["ad"], ["rb"]),
        ],
        [("x", F)],
        [("rb", F)],
        [init("w", np.eye(4, dtype=np.float32)), *SCALE],
    )
    matching = match_tensors(_conv_relu_fp32(), quant)
    assert fields(matching) == [("x0", "x0", "x0", "name"), ("a", "ad", "aq", "name"), ("b", "rb", "rb", "structure")]
    assert matching.unmatched_fp32 == []


def test_an_integer_graph_output_without_a_reader_is_matched_with_its_params():
    """QOperator model ending in a QLinearMatMul whose uint8 output is the graph output."""
    w = np.eye(4, dtype=np.float32)
    fp32 = model([n("MatMul", ["x", "w"], ["y"])], [("x", F)], [("y", F)], [init("w", w)])
    quant = model(
        [
            n("QuantizeLinear", ["x", "s", "z"], ["x_quantized"]),
            n("QLinearMatMul", ["x_quantized", "s", "z", "wq", "ws", "wz", "ys", "z"], ["y_quantized"]),
        ],
        [("x", F)],
        [("y_quantized", TensorProto.UINT8)],
        [*SCALE, init("wq", w.astype(np.uint8)), init("ws", np.float32(1)), init("wz", np.uint8(0)), init("ys", 0.25)],
    )
    matching = match_tensors(fp32, quant)
    assert fields(matching) == [
        ("x", "x_quantized", "x_quantized", "name"),
        ("y", "y_quantized", "y_quantized", "name"),
    ]
    assert float(matching.matches[1].params.scale) == 0.25


def test_a_model_that_shape_inference_refuses_is_matched_without_inferred_types(monkeypatch):
    """onnx's inference rarely raises with strict_mode=False (a model over protobuf's 2 GB, say); when
    it does, the matcher reads the model as given: types only from its declarations."""
    from pytest_qaccuracy.model import matching

    fp32 = model([n("Relu", ["x"], ["r"]), n("ArgMax", ["r"], ["am"], axis=1)], [("x", F)], [("am", TensorProto.INT64)])
    calls = []

    def refuse(proto, strict_mode=False):
        calls.append(proto)
        raise onnx.shape_inference.InferenceError("[ShapeInferenceError] too large")

    monkeypatch.setattr(matching.onnx.shape_inference, "infer_shapes", refuse)
    assert matching._with_types(fp32) is fp32
    assert not fp32.graph.value_info  # nothing inferred, nothing added
    found = match_tensors(fp32, fp32)
    assert len(calls) == 3  # both sides of the pair, after the direct call
    assert fields(found) == [("r", "r", "r", "name")]  # r: its type unknown, read as a float activation


# -- an integer tensor that shape inference cannot type: its zero point tells the codes ----------------

F8 = TensorProto.FLOAT8E4M3FN
#: onnxruntime's contrib domain (its own QuantizeLinear and DequantizeLinear, for types or opsets the
#: standard ones lack): onnx's inference does not type what its ops write, and skips them (onnx 1.16
#: crashes inferring a standard DequantizeLinear whose input has no type)
MS = "com.microsoft"


def zero(name: str, kind: int) -> onnx.TensorProto:
    return helper.make_tensor(name, kind, [], [0])


def untyped(nodes, extra_inits=()) -> onnx.ModelProto:
    """x (float) through ``nodes``; onnxruntime's contrib ops leave their integer outputs untyped."""
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", F, [2, 4])],
        [helper.make_tensor_value_info("y", F, None)],
        [init("s", np.float32(0.05)), *extra_inits],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])


FP32 = model([n("Relu", ["x"], ["y"])], [("x", F)], [("y", F)])


@pytest.mark.parametrize(("kind", "codes"), [(TensorProto.UINT8, True), (TensorProto.INT8, True), (F8, False)])
def test_an_untyped_integer_reads_its_codes_from_the_dequantize_zero_point(kind, codes):
    """q comes from an op inference cannot type; the DequantizeLinear that reads it at input 0 has the
    zero point: numbers numpy can subtract from (u8, s8) are captured as q, float8 codes after the DQ."""
    nodes = [n("MakeCodes", ["x"], ["q"], domain=MS), n("DequantizeLinear", ["q", "s", "z"], ["y"], domain=MS)]
    quant = untyped(nodes, [zero("z", kind)])
    matcher = Matcher(FP32, quant)
    assert "q" not in matcher.q.elem_types
    assert matcher._zero_point("q") == "z"
    assert matcher._numpy_codes("q") is codes
    captured = matcher.resolve("y")
    assert captured[:2] == (("y", "q") if codes else ("y", "y"))
    assert (captured[2] is not None) is codes


def test_an_untyped_integer_reads_the_quantize_zero_point_first():
    """The producing QuantizeLinear's zero point (float8) is read before its DequantizeLinear's; a DQ
    without one adds nothing, and neither does a node reading q at another input."""
    quant = untyped(
        [
            n("QuantizeLinear", ["x", "s", "z8"], ["q"], domain=MS),
            n("DequantizeLinear", ["q", "s"], ["y"], domain=MS),
            n("DequantizeLinear", ["q", "s", "zu"], ["y2"], domain=MS),
        ],
        [zero("z8", F8), zero("zu", TensorProto.UINT8)],
    )
    matcher = Matcher(FP32, quant)
    assert matcher._zero_point("q") == "z8"
    assert matcher._numpy_codes("q") is False
    # follow_quantize: x is read by the QuantizeLinear; float8 codes are captured after a DQ
    assert matcher.resolve("x") == ("y", "y", None)
    assert matcher._integer_params("x") is None  # a float tensor, though a QuantizeLinear reads it


def test_an_untyped_integer_without_a_dequantize_has_the_quantize_zero_point_alone():
    quant = untyped(
        [n("QuantizeLinear", ["x", "s", "z8"], ["q"], domain=MS), n("Cast", ["q"], ["y"], to=F)], [zero("z8", F8)]
    )
    matcher = Matcher(FP32, quant)
    assert matcher._zero_point("q") == "z8"
    assert matcher.resolve("x") == ("x", "x", None)  # no DQ to capture after: the float tensor itself


def test_only_a_quantize_producer_and_dequantize_readers_at_input_0_give_a_zero_point():
    """Another producer's third input, another consumer's, and a DQ that reads q as its scale are not
    zero points of q: the DQ reading it at input 0 gives it (u8, numbers)."""
    quant = untyped(
        [
            n("MakeCodes", ["x", "s", "z8"], ["q"], domain=MS),
            n("Mix", ["q", "s", "z8"], ["m"], domain=MS),
            n("DequantizeLinear", ["s", "q", "z8"], ["odd"], domain=MS),
            n("DequantizeLinear", ["q", "s", "zu"], ["y"], domain=MS),
        ],
        [zero("z8", F8), zero("zu", TensorProto.UINT8)],
    )
    matcher = Matcher(FP32, quant)
    assert matcher._zero_point("q") == "zu"
    assert matcher._numpy_codes("q") is True
    assert matcher._integer_params("q") is not None  # u8 codes: dequantized in numpy


def test_a_typed_integer_is_read_by_its_type_not_a_missing_zero_point():
    """q typed float8 (a graph input) and read by a DQ without a zero point: its type decides."""
    graph = helper.make_graph(
        [n("DequantizeLinear", ["q", "s"], ["y"])],
        "g",
        [helper.make_tensor_value_info("q", F8, [2, 4])],
        [helper.make_tensor_value_info("y", F, None)],
        [init("s", np.float32(0.05))],
    )
    quant = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    matcher = Matcher(FP32, quant)
    assert matcher._zero_point("q") is None
    assert matcher._numpy_codes("q") is False
    assert matcher._integer_params("q") is None  # float8 codes: no parameters to dequantize in numpy
    assert matcher.resolve("y") == ("y", "y", None)
