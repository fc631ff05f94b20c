"""Sensitivity on an attention block: MatMul weights, Transpose, Softmax (range fixed to [0, 1]), LayerNorm."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from pytest_qaccuracy.analysis.partial import QdqGraph
from pytest_qaccuracy.analysis.sensitivity import node_sensitivity
from pytest_qaccuracy.model import ModelPair


def attention(path, d: int = 16, seq: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)

    def weight(name: str) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32), name)

    inits = [weight("wq"), weight("wk"), weight("wv"), weight("wo")]
    inits.append(numpy_helper.from_array(np.ones(d, np.float32), "g"))
    inits.append(numpy_helper.from_array(np.zeros(d, np.float32), "b"))
    inits.append(numpy_helper.from_array(np.array(1 / np.sqrt(d), np.float32), "sc"))
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="q"),
        helper.make_node("MatMul", ["x", "wk"], ["k"], name="k"),
        helper.make_node("MatMul", ["x", "wv"], ["v"], name="v"),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1], name="kt"),
        helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores"),
        helper.make_node("Mul", ["s", "sc"], ["ss"], name="scale"),
        helper.make_node("Softmax", ["ss"], ["p"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["p", "v"], ["a"], name="attn"),
        helper.make_node("MatMul", ["a", "wo"], ["o"], name="proj"),
        helper.make_node("Add", ["o", "x"], ["r"], name="residual"),
        helper.make_node("LayerNormalization", ["r", "g", "b"], ["y"], axis=-1, name="ln"),
    ]
    graph = helper.make_graph(
        nodes,
        "attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", seq, d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", seq, d])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def block(tmp_path_factory):
    import modelzoo

    logging.getLogger().setLevel(logging.ERROR)
    root = tmp_path_factory.mktemp("attention")
    rng = np.random.default_rng(1)
    fp32 = attention(root / "attn.onnx")
    calib = rng.standard_normal((8, 1, 8, 16)).astype(np.float32)
    quant = modelzoo.quantize(fp32, root / "attn.qdq.onnx", calib)
    data = root / "data.npz"
    np.savez(data, x=rng.standard_normal((10, 1, 8, 16)).astype(np.float32))
    return ModelPair(fp32, quant), data


def test_every_compute_node_is_quantized_and_removing_all_pairs_gives_fp32(block):
    pair, _ = block
    qg = QdqGraph(pair.quantized, pair.fp32)
    assert [n.name for n in qg.nodes] == [n.name for n in pair.fp32.graph.node]
    assert len(qg.node("ln").weights) == 2 and len(qg.node("residual").inputs) == 2
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    x = np.random.default_rng(2).standard_normal((3, 8, 16)).astype(np.float32)

    def run(model):
        session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return session.run(None, {"x": x})

    np.testing.assert_allclose(run(qg.build(frozenset()))[0], run(pair.fp32)[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", ["single", "leave-one-out"])
def test_reuse_equals_naive_on_attention(block, mode):
    pair, data = block
    fast = node_sensitivity(pair, data, mode, metrics="mse,cosine")
    slow = node_sensitivity(pair, data, mode, metrics="mse,cosine", strategy="naive")
    assert [n.node for n in fast.nodes] == [n.node for n in slow.nodes]
    for a, b in zip(fast.nodes, slow.nodes, strict=True):
        assert a.metrics["mse"] == pytest.approx(b.metrics["mse"], rel=1e-9, abs=1e-15)
    assert all(n.metrics["mse"] > 0 for n in fast.nodes)


def two_heads(path, d: int = 16, seed: int = 0):
    """x -> MatMul -> Relu -> (MatMul -> y1, MatMul -> y2): two outputs."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array((rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32), name)
        for name in ("w0", "w1", "w2")
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["h"], name="trunk"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w1"], ["y1"], name="head1"),
        helper.make_node("MatMul", ["r", "w2"], ["y2"], name="head2"),
    ]
    outputs = [helper.make_tensor_value_info(y, TensorProto.FLOAT, ["N", d]) for y in ("y1", "y2")]
    graph = helper.make_graph(
        nodes, "two_heads", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", d])], outputs, inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_two_outputs_each_measured_and_averaged(tmp_path):
    import modelzoo

    logging.getLogger().setLevel(logging.ERROR)
    rng = np.random.default_rng(3)
    fp32 = two_heads(tmp_path / "two.onnx")
    quant = modelzoo.quantize(fp32, tmp_path / "two.qdq.onnx", rng.standard_normal((8, 1, 16)).astype(np.float32))
    data = tmp_path / "data.npz"
    np.savez(data, x=rng.standard_normal((9, 1, 16)).astype(np.float32))
    pair = ModelPair(fp32, quant)
    fast = node_sensitivity(pair, data, "single", metrics="mse")
    slow = node_sensitivity(pair, data, "single", metrics="mse", strategy="naive")
    head1 = next(n for n in fast.nodes if n.node == "head1")
    assert set(head1.outputs) == {"y1", "y2"}
    # head1's pairs are its own edges (its read of r, its weight, its output): head2 still reads float r
    assert head1.outputs["y1"]["mse"] > 0 and head1.outputs["y2"]["mse"] == 0.0
    trunk = next(n for n in fast.nodes if n.node == "trunk")  # the trunk's output pair feeds both heads
    assert trunk.outputs["y1"]["mse"] > 0 and trunk.outputs["y2"]["mse"] > 0
    assert head1.metrics["mse"] == pytest.approx((head1.outputs["y1"]["mse"] + head1.outputs["y2"]["mse"]) / 2)
    for a, b in zip(fast.nodes, slow.nodes, strict=True):
        assert a.node == b.node and a.metrics["mse"] == pytest.approx(b.metrics["mse"], rel=1e-9, abs=1e-15)
