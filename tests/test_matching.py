"""Tensor matching: ORT naming for QDQ and QOperator, structure for renamed graphs, user mappings."""

from __future__ import annotations

import onnx
import pytest

from pytest_qaccuracy.errors import ModelError
from pytest_qaccuracy.model import ModelPair, match_tensors

# The zoo's fp32 activations; conv1 is folded with relu1 by every ORT format (Conv+Relu fusion).
COMPARED = ["relu1", "conv2", "add1", "cat1", "pool1", "conv3", "sig1", "gap", "flat", "gemm", "logits"]


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
    if variant.startswith("qdq"):
        assert by_name["conv2"].quantized == "conv2_DequantizeLinear_Output"
        assert by_name["conv2"].capture == "conv2_QuantizeLinear_Output"
        assert by_name["logits"].quantized == "logits"
    else:
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
    assert {m.matched_by for m in structural.values() if m.fp32 != "logits"} == {"structure"}
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
