"""Tensor matching: ORT naming for QDQ and QOperator, structure for renamed graphs, user mappings."""

from __future__ import annotations

import onnx
import pytest

from pytest_qaccuracy.errors import ModelError
from pytest_qaccuracy.model import ModelPair, match_tensors

# The zoo's fp32 activations; conv1 is folded with relu1 by every ORT format (Conv+Relu fusion).
# The graph input x comes first: every format quantizes it (x -> QuantizeLinear), issue 17.
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
