"""Tensor matching: ORT naming for QDQ and QOperator, structure for renamed graphs, user mappings."""

from __future__ import annotations

import onnx
import pytest

from pytest_qaccuracy.errors import ModelError
from pytest_qaccuracy.model import ModelPair, match_tensors

# The zoo's fp32 activations; conv1 is folded with relu1 by every ORT format (Conv+Relu fusion).
# The graph input x comes first: every format quantizes it (x -> QuantizeLinear).
COMPARED = ["x", "relu1", "conv2", "add1", "cat1", "pool1", "conv3", "sig1", "gap", "flat", "gemm", "logits"]


def _rename_all(model: onnx.ModelProto, keep: set[str]) -> onnx.ModelProto:
    """A copy whose every tensor but graph inputs/outputs and ``keep`` is renamed (another toolchain)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    io = {v.name for v in out.graph.input} | {v.name for v in out.graph.output} | keep
    names = {}

    def new(name: str) -> str:
        if not name or name in io:
            return name
        return names.setdefault(name, f"t{len(names)}")

    for node in out.graph.node:
        node.input[:] = [new(x) for x in node.input]
        node.output[:] = [new(x) for x in node.output]
        node.name = f"n_{node.name}"
    for init in out.graph.initializer:
        init.name = new(init.name)
    del out.graph.value_info[:]
    return out


@pytest.mark.parametrize("variant", ["qdq_u8", "qdq_s8_pc", "qop_u8", "qop_s8_pc"])
def test_ort_quantized_models_match_every_activation_by_name(zoo, variant):
    pair = ModelPair(zoo["fp32"], zoo[variant])
    matching = pair.matching
    assert [m.fp32 for m in matching.matches] == COMPARED
    assert {m.matched_by for m in matching.matches} == {"name"}
    assert matching.unmatched_fp32 == ["conv1"]  # listed, never dropped silently
    assert all(m.params is not None for m in matching.matches)  # every capture is an integer tensor
    by_name = {m.fp32: m for m in matching.matches}
    assert (by_name["x"].node, by_name["x"].op_type, by_name["x"].order) == (None, "input", -1)
    if variant.startswith("qdq"):
        assert by_name["x"].capture == "x_QuantizeLinear_Output"
        assert by_name["conv2"].quantized == "conv2_DequantizeLinear_Output"
        assert by_name["conv2"].capture == "conv2_QuantizeLinear_Output"
        assert by_name["logits"].quantized == "logits"
    else:
        assert by_name["x"].capture == "x_quantized"
        assert by_name["conv2"].capture == "conv2_quantized"
        assert by_name["relu1"].capture == "conv1_quantized"  # Relu folded into QLinearConv
    assert pair.format == ("qdq" if variant.startswith("qdq") else "qoperator")


@pytest.mark.parametrize("variant", ["qdq_u8", "qop_u8"])
def test_renamed_graphs_are_matched_by_structure(zoo, variant):
    fp32 = onnx.load(str(zoo["fp32"]))
    renamed = _rename_all(onnx.load(str(zoo[variant])), keep=set())
    matching = match_tensors(fp32, renamed)
    structural = {m.fp32: m for m in matching.matches}
    reference = {m.fp32: m for m in match_tensors(fp32, onnx.load(str(zoo[variant]))).matches}
    assert set(structural) == set(reference)
    assert {m.matched_by for m in structural.values() if m.fp32 not in ("logits", "x")} == {"structure"}
    for name, m in structural.items():  # the same quantity: same scale and zero point
        assert float(m.params.scale.reshape(-1)[0]) == float(reference[name].params.scale.reshape(-1)[0])
        assert int(m.params.zero_point.reshape(-1)[0]) == int(reference[name].params.zero_point.reshape(-1)[0])


def test_user_mapping_wins_and_is_checked(zoo):
    fp32, quant = onnx.load(str(zoo["fp32"])), onnx.load(str(zoo["qdq_u8"]))
    renamed = _rename_all(quant, keep=set())
    auto = {m.fp32: m.capture for m in match_tensors(fp32, renamed).matches}
    target = next(n.output[0] for n in renamed.graph.node if n.output[0] == auto["conv2"])
    mapped = match_tensors(fp32, renamed, {"conv2": target})
    assert {m.fp32: m.matched_by for m in mapped.matches}["conv2"] == "user"
    with pytest.raises(ModelError, match="user mapping: 'nope' is not a float activation of the fp32 model"):
        match_tensors(fp32, quant, {"nope": "conv2"})
    with pytest.raises(ModelError, match="user mapping: 'missing' is not a tensor of the quantized model"):
        match_tensors(fp32, quant, {"conv2": "missing"})


def test_unmatched_quantized_tensors_are_listed(zoo):
    fp32 = onnx.load(str(zoo["fp32"]))
    quant = onnx.load(str(zoo["qdq_u8"]))
    extra = onnx.helper.make_node("Neg", ["add1_DequantizeLinear_Output"], ["extra_neg"], name="extra")
    quant.graph.node.append(extra)
    matching = match_tensors(fp32, quant)
    assert "extra_neg" in matching.unmatched_quantized


def _hand_made_pair(tmp_path):
    """fp32 Conv-Relu-Conv, and a hand-made QDQ version named like an exporter's output:
    float weights go through QuantizeLinear/DequantizeLinear, every tensor has another name."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)
    w2 = (rng.standard_normal((4, 4, 1, 1)) * 0.3).astype(np.float32)

    def graph(nodes, inits):
        return helper.make_model(
            helper.make_graph(
                nodes,
                "g",
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 8, 8])],
                inits,
            ),
            opset_imports=[helper.make_opsetid("", 17)],
            ir_version=8,
        )

    fp32 = graph(
        [
            helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1] * 4),
            helper.make_node("Relu", ["a"], ["b"]),
            helper.make_node("Conv", ["b", "w2"], ["y"]),
        ],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    s, z = (
        numpy_helper.from_array(np.array(0.02, np.float32), "s"),
        numpy_helper.from_array(np.array(128, np.uint8), "z"),
    )
    ws, wz = (
        numpy_helper.from_array(np.array(0.01, np.float32), "ws"),
        numpy_helper.from_array(np.array(0, np.int8), "wz"),
    )
    q = helper.make_node
    quant = graph(
        [
            q("QuantizeLinear", ["x", "s", "z"], ["/in/q"]),
            q("DequantizeLinear", ["/in/q", "s", "z"], ["/in/dq"]),
            q("QuantizeLinear", ["W1", "ws", "wz"], ["/w1/q"]),
            q("DequantizeLinear", ["/w1/q", "ws", "wz"], ["/w1/dq"]),
            q("Conv", ["/in/dq", "/w1/dq"], ["/conv1/out"], pads=[1] * 4),
            q("Relu", ["/conv1/out"], ["/relu/out"]),
            q("QuantizeLinear", ["/relu/out", "s", "z"], ["/relu/q"]),
            q("DequantizeLinear", ["/relu/q", "s", "z"], ["/relu/dq"]),
            q("QuantizeLinear", ["W2", "ws", "wz"], ["/w2/q"]),
            q("DequantizeLinear", ["/w2/q", "ws", "wz"], ["/w2/dq"]),
            q("Conv", ["/relu/dq", "/w2/dq"], ["y"]),
        ],
        [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2"), s, z, ws, wz],
    )
    onnx.save(fp32, str(tmp_path / "f.onnx"))
    onnx.save(quant, str(tmp_path / "q.onnx"))
    return tmp_path / "f.onnx", tmp_path / "q.onnx"


def test_hand_made_qdq_models_match_by_structure_and_compare(tmp_path):
    import numpy as np
    from modelzoo import write_h5

    from pytest_qaccuracy.analysis.compare import compare

    fp32, quant = _hand_made_pair(tmp_path)
    pair = ModelPair(fp32, quant)
    matches = {m.fp32: m for m in pair.matching.matches}
    assert matches["a"].capture == "/conv1/out" and matches["a"].params is None  # float, not quantized
    assert matches["b"].capture == "/relu/q" and matches["b"].quantized == "/relu/dq"
    assert matches["b"].matched_by == "structure"
    data = write_h5(tmp_path / "d.h5", np.random.default_rng(1).standard_normal((4, 1, 3, 8, 8)).astype(np.float32))
    result = compare(pair, data, metrics="lsb,sqnr", capture="reference")
    relu = next(layer for layer in result.layers if layer.tensor == "b")
    assert relu.scale == pytest.approx(0.02, rel=1e-6)
    # independently: expose the fp32 'b' and the quantized '/relu/dq' and compute SQNR by hand
    import onnxruntime as ort

    def run(path, name):
        model = onnx.load(str(path))
        model.graph.output.append(onnx.ValueInfoProto(name=name))
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        x = np.random.default_rng(1).standard_normal((4, 3, 8, 8)).astype(np.float32)
        return session.run([name], {"x": x})[0].astype(np.float64)

    f, q = run(fp32, "b"), run(quant, "/relu/dq")
    expected = 20 * np.log10(np.linalg.norm(f) / np.linalg.norm(f - q))
    assert relu.metrics["sqnr"] == pytest.approx(expected, rel=1e-6)
    assert relu.metrics["lsb"] == pytest.approx(np.abs(f - q).max() / np.float32(0.02), rel=1e-6)


def _dynamic_pair(tmp_path):
    """fp32 Conv(bias)-Relu-Flatten-MatMul-Relu-MatMul and its onnxruntime dynamic quantization:
    each Conv/MatMul becomes DynamicQuantizeLinear -> ConvInteger/MatMulInteger (an int32
    accumulator without a scale) -> Cast -> Mul(scale product) [-> Add(bias)]."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(3)
    inits = {
        "w": rng.standard_normal((4, 2, 3, 3)).astype(np.float32) * 0.5,
        "b": rng.standard_normal(4).astype(np.float32),
        "m1": rng.standard_normal((64, 16)).astype(np.float32) * 0.3,
        "m2": rng.standard_normal((16, 5)).astype(np.float32) * 0.3,
    }
    n = helper.make_node
    graph = helper.make_graph(
        [
            n("Conv", ["x", "w", "b"], ["conv"], pads=[1] * 4),
            n("Relu", ["conv"], ["relu0"]),
            n("Flatten", ["relu0"], ["flat"]),
            n("MatMul", ["flat", "m1"], ["mm1"]),
            n("Relu", ["mm1"], ["relu1"]),
            n("MatMul", ["relu1", "m2"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "f.onnx")
    quantize_dynamic(tmp_path / "f.onnx", tmp_path / "q.onnx", weight_type=QuantType.QUInt8)
    return onnx.load(str(tmp_path / "f.onnx")), onnx.load(str(tmp_path / "q.onnx"))


def test_renamed_dynamic_quantization_matches_the_rescaled_float_tensors(tmp_path):
    import numpy as np
    import onnxruntime as ort

    fp32, quant = _dynamic_pair(tmp_path)
    assert {"ConvInteger", "MatMulInteger", "DynamicQuantizeLinear"} <= {n.op_type for n in quant.graph.node}
    renamed = _rename_all(quant, keep=set())
    new_name = {
        old: new
        for a, b in zip(quant.graph.node, renamed.graph.node, strict=True)
        for old, new in zip(a.output, b.output, strict=True)
    }
    by_name = {m.fp32: m for m in match_tensors(fp32, quant).matches}
    # the quantizer keeps every fp32 name on the float tensor that holds the same quantity
    assert {k: m.capture for k, m in by_name.items()} == {k: k for k in ("conv", "relu0", "flat", "mm1", "relu1", "y")}
    matching = match_tensors(fp32, renamed)
    structural = {m.fp32: m for m in matching.matches}
    assert {k: m.capture for k, m in structural.items()} == {k: new_name.get(k, k) for k in by_name}
    assert all(m.params is None for m in structural.values())  # all float: dynamic scales are computed at run time
    assert matching.unmatched_fp32 == []
    # independently of the matcher: the captured tensors hold the fp32 values up to quantization error
    x = np.random.default_rng(4).standard_normal((3, 2, 4, 4)).astype(np.float32)

    def run(model, names):
        model = onnx.shape_inference.infer_shapes(model)
        for i, node in enumerate(model.graph.node):
            node.name = f"node{i}"  # the renamed copy's names repeat
        model.graph.output.extend(onnx.ValueInfoProto(name=name) for name in names)
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return dict(zip(names, session.run(names, {"x": x}), strict=True))

    ref = run(fp32, [k for k in structural if k != "y"])
    got = run(renamed, [m.capture for k, m in structural.items() if k != "y"])
    for name, ref_value in ref.items():
        value = got[structural[name].capture].astype(np.float64)
        sqnr = 20 * np.log10(np.linalg.norm(ref_value) / np.linalg.norm(ref_value - value))
        assert sqnr > 20, name


def _accumulator_pair(tail: str) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """fp32 MatMul, and a quantized MatMulInteger whose int32 accumulator is read by ``tail``:
    "dequantize" (a DequantizeLinear with the product scale) or "cast" (a Cast and nothing else)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    f = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["mm"])],
        "f",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("mm", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(w, "w")],
    )
    inits = [
        numpy_helper.from_array(w.astype(np.uint8), "wq"),
        numpy_helper.from_array(np.array(0, np.uint8), "wz"),
        numpy_helper.from_array(np.array(0.5, np.float32), "s"),
        numpy_helper.from_array(np.array(0, np.int32), "z32"),
    ]
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        helper.make_node("MatMulInteger", ["xq", "wq", "xz", "wz"], ["acc"]),
    ]
    if tail == "dequantize":
        nodes.append(helper.make_node("DequantizeLinear", ["acc", "s", "z32"], ["out"]))
    else:
        nodes.append(helper.make_node("Cast", ["acc"], ["out"], to=TensorProto.FLOAT))
    q = helper.make_graph(
        nodes,
        "q",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 3])],
        inits,
    )

    def model(graph: onnx.GraphProto) -> onnx.ModelProto:
        return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])

    return model(f), model(q)


def test_an_int32_accumulator_is_matched_only_with_a_scale():
    fp32, quant = _accumulator_pair("dequantize")
    matching = match_tensors(fp32, quant)
    (match,) = matching.matches
    assert (match.fp32, match.capture, match.quantized, match.matched_by) == ("mm", "acc", "out", "structure")
    assert float(match.params.scale) == 0.5 and int(match.params.zero_point) == 0
    # a Cast alone gives raw integer sums, not the MatMul's value: listed as unmatched on both sides
    fp32, quant = _accumulator_pair("cast")
    matching = match_tensors(fp32, quant)
    assert matching.matches == []
    assert matching.unmatched_fp32 == ["mm"]
    assert matching.unmatched_quantized == ["acc", "out"]
