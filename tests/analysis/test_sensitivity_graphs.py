"""Sensitivity experiments on graphs beyond the zoo's conv net.

- a transformer block prepared by onnxruntime's ``quant_pre_process``: 3-D MatMuls become
  Reshape -> Gemm -> Reshape with constant shapes, so the graph bakes in its batch of 1 and some
  tensors have no record axis at all;
- an ``If`` whose branches read an outer tensor (not an input of the node), and one weight
  initializer shared by three MatMuls.

Goldens are independent of the library: onnxruntime runs the whole models record by record, and the
subgraph model's partial configuration is recomputed in numpy from the quantization parameters.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from pytest_qaccuracy.analysis.calibration import CalibrationOptions, compute_ranges
from pytest_qaccuracy.analysis.sensitivity import node_sensitivity
from pytest_qaccuracy.data.binding import Batch
from pytest_qaccuracy.model import ModelPair
from pytest_qaccuracy.runtime import OrtRunner, RuntimeOptions
from pytest_qaccuracy.runtime.ort_runner import bakes_batch
from tests.modelzoo import quantize, write_h5

L, D, H, E = 10, 12, 2, 6  # tokens, model width, heads, head width
RECORDS = 5
_ORT = tuple(int(part) for part in ort.__version__.split(".")[:2])
#: quant_pre_process turns the block's 3-D MatMuls into Reshape -> Gemm -> Reshape from onnxruntime 1.21 on
#: (1.20.1 and older keep the MatMuls: the tests of that layout do not apply there)
needs_gemm_rewrite = pytest.mark.skipif(
    _ORT < (1, 21), reason=f"onnxruntime {ort.__version__}: quant_pre_process keeps 3-D MatMuls (from 1.21: Gemm)"
)


def _const(name: str, value: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(value, name)


def _attention(path: Path) -> Path:
    """One self-attention block with a static batch of 1; head shapes computed with Shape/Gather/Concat."""
    rng = np.random.default_rng(3)
    inits = [
        _const("wqkv", (rng.standard_normal((D, 3 * H * E)) * 0.3).astype(np.float32)),
        _const("bqkv", (rng.standard_normal(3 * H * E) * 0.1).astype(np.float32)),
        _const("wo", (rng.standard_normal((H * E, D)) * 0.3).astype(np.float32)),
        _const("bo", (rng.standard_normal(D) * 0.1).astype(np.float32)),
        _const("tail", np.array([3, H, E], np.int64)),
        _const("he", np.array([H * E], np.int64)),
        _const("i0", np.array([0], np.int64)),
        _const("i1", np.array([1], np.int64)),
    ]
    node = helper.make_node
    nodes = [
        node("MatMul", ["x", "wqkv"], ["mm"]),
        node("Add", ["mm", "bqkv"], ["qkv"]),
        node("Shape", ["x"], ["shape"]),
        node("Gather", ["shape", "i0"], ["n"], axis=0),
        node("Gather", ["shape", "i1"], ["l"], axis=0),
        node("Concat", ["n", "l", "tail"], ["heads_shape"], axis=0),
        node("Reshape", ["qkv", "heads_shape"], ["heads"]),
        node("Transpose", ["heads"], ["perm"], perm=[2, 0, 3, 1, 4]),
        node("Split", ["perm"], ["q", "k", "v"], axis=0, num_outputs=3),
        node("Squeeze", ["q", "i0"], ["q2"]),
        node("Squeeze", ["k", "i0"], ["k2"]),
        node("Squeeze", ["v", "i0"], ["v2"]),
        node("Transpose", ["k2"], ["kt"], perm=[0, 1, 3, 2]),
        node("MatMul", ["q2", "kt"], ["att"]),
        node("Softmax", ["att"], ["p"], axis=-1),
        node("MatMul", ["p", "v2"], ["ctx"]),
        node("Transpose", ["ctx"], ["ctxt"], perm=[0, 2, 1, 3]),
        node("Concat", ["n", "l", "he"], ["flat_shape"], axis=0),
        node("Reshape", ["ctxt", "flat_shape"], ["merged"]),
        node("MatMul", ["merged", "wo"], ["mo"]),
        node("Add", ["mo", "bo"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, L, D])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, L, D])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def _subgraph_net(path: Path) -> Path:
    """``If`` branches that read the outer ``h1``; one weight ``w`` read by three MatMuls."""
    rng = np.random.default_rng(4)
    branch = {
        name: helper.make_graph(
            [helper.make_node(op, ["h1"], [f"{name}_out"])],
            name,
            [],
            [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, None)],
        )
        for name, op in (("then", "Relu"), ("else", "Neg"))
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h1"], name="mm1"),
        helper.make_node("ReduceMean", ["x"], ["mean"], keepdims=0, name="mean"),
        helper.make_node("Greater", ["mean", "lim"], ["cond"], name="gt"),
        helper.make_node("If", ["cond"], ["branch"], then_branch=branch["then"], else_branch=branch["else"], name="if"),
        helper.make_node("MatMul", ["branch", "w"], ["h2"], name="mm2"),
        helper.make_node("Add", ["h2", "h1"], ["h3"], name="add"),
        helper.make_node("MatMul", ["h3", "w"], ["y"], name="mm3"),
    ]
    w = (rng.standard_normal((D, D)) * 0.3).astype(np.float32)
    graph = helper.make_graph(
        nodes,
        "subgraph_net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", D])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", D])],
        [_const("w", w), _const("lim", np.array(-100.0, np.float32))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> tuple[Path, Path, Path, np.ndarray]:
    """(fp32 after quant_pre_process, its QDQ model, data, records) of the attention block."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    root = tmp_path_factory.mktemp("attention")
    fp32 = root / "attention.pre.onnx"
    quant_pre_process(str(_attention(root / "attention.onnx")), str(fp32))
    records = np.random.default_rng(5).standard_normal((RECORDS, 1, L, D)).astype(np.float32)
    return fp32, quantize(fp32, root / "attention.qdq.onnx", records), write_h5(root / "d.h5", records), records


@needs_gemm_rewrite
def test_quant_pre_process_bakes_the_batch_in(prepared):
    """The premise: the prepared graph reshapes around a Gemm to constant shapes (no -1, no 0)."""
    fp32, qdq, _, _ = prepared
    model = onnx.load(str(fp32))
    assert "Gemm" in {n.op_type for n in model.graph.node}
    assert bakes_batch(model) and bakes_batch(onnx.load(str(qdq)))
    assert not bakes_batch(onnx.load(str(_attention(fp32.parent / "raw.onnx"))))  # shapes from Shape


@needs_gemm_rewrite
def test_a_baked_batch_runs_record_by_record(prepared):
    fp32, _, _, records = prepared
    runner = OrtRunner(onnx.load(str(fp32)), ["y", "gemm_input_reshape_arg"], RuntimeOptions(), "m")
    batch = Batch(0, [{"x": r} for r in records[:3]])
    assert [len(u) for u in runner.units(batch)] == [1, 1, 1] and not runner.batching
    out = runner.run(batch)
    assert out["y"].shape == (3, L, D) and out["gemm_input_reshape_arg"].shape == (3 * L, D)


@pytest.mark.parametrize("mode", ["single", "leave-one-out"])
def test_sensitivity_on_a_quant_pre_processed_transformer(prepared, mode, capfd):
    """Both modes run (records stacked on axis 0 would make onnxruntime fail in Reshape, which splits
    an axis that holds tokens), print nothing, and agree with whole-model runs and the naive strategy."""
    fp32, qdq, data, records = prepared
    pair = ModelPair(fp32, qdq)
    reuse = node_sensitivity(pair, data, mode=mode, metrics="cosine,mse")
    naive = node_sensitivity(pair, data, mode=mode, metrics="cosine,mse", strategy="naive")
    assert capfd.readouterr().err == ""
    assert len(reuse.nodes) >= 5
    assert {n.node: n.metrics["mse"] for n in reuse.nodes} == pytest.approx(
        {n.node: n.metrics["mse"] for n in naive.nodes}, rel=1e-6, abs=1e-12
    )
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    f, q = (ort.InferenceSession(str(p), so, providers=["CPUExecutionProvider"]) for p in (fp32, qdq))
    ref = np.stack([f.run(None, {"x": r})[0] for r in records]).astype(np.float64)
    test = np.stack([q.run(None, {"x": r})[0] for r in records]).astype(np.float64)
    cosine = (ref * test).sum() / np.sqrt((ref**2).sum() * (test**2).sum())
    assert reuse.baseline["cosine"] == pytest.approx(cosine, rel=1e-6)
    assert reuse.baseline["mse"] == pytest.approx(((ref - test) ** 2).mean(), rel=1e-5)


@pytest.mark.parametrize("strategy", ["reuse", "naive"])
def test_each_float_weight_is_its_own_in_a_graph_of_unnamed_nodes(tmp_path, strategy):
    """Exporters often leave nodes unnamed: the fp32 weight a quantized MatMul stands for is found by
    the weight's name and shape, not by matching the (empty) node names, which took the first
    MatMul's (12, 36) weight for the last MatMul's (12, 12) one and gave a graph onnxruntime refuses."""
    fp32 = _attention(tmp_path / "attention.onnx")
    assert not any(n.name for n in onnx.load(str(fp32)).graph.node)
    records = np.random.default_rng(5).standard_normal((RECORDS, 1, L, D)).astype(np.float32)
    qdq = quantize(fp32, tmp_path / "attention.qdq.onnx", records)
    data = write_h5(tmp_path / "d.h5", records)
    result = node_sensitivity(ModelPair(fp32, qdq), data, mode="leave-one-out", metrics="mse", strategy=strategy)
    assert len(result.nodes) >= 5
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    f, q = (ort.InferenceSession(str(p), so, providers=["CPUExecutionProvider"]) for p in (fp32, qdq))
    ref = np.stack([f.run(None, {"x": r})[0] for r in records]).astype(np.float64)
    test = np.stack([q.run(None, {"x": r})[0] for r in records]).astype(np.float64)
    assert result.baseline["mse"] == pytest.approx(((ref - test) ** 2).mean(), rel=1e-5)


def test_mse_calibration_of_a_baked_batch_is_silent(prepared, capfd):
    fp32, _, data, _ = prepared
    result = compute_ranges(fp32, data, CalibrationOptions(method="mse"), RuntimeOptions(batch_size=4))
    assert result.records == RECORDS and "y" in result.ranges
    assert capfd.readouterr().err == ""


def _fq(x: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> np.ndarray:
    """QuantizeLinear then DequantizeLinear to uint8 (round half to even, as onnxruntime)."""
    return ((np.clip(np.round(x / scale) + zero, 0, 255) - zero) * scale).astype(np.float32)


@pytest.mark.parametrize("strategy", ["reuse", "naive"])
def test_subgraph_reads_and_shared_weights(tmp_path, strategy):
    """mm1 alone quantized: the If reads the changed h1 from outer scope, so it must be recomputed
    (not taken from the float cache by the reuse strategy); the golden is numpy on the parameters."""
    fp32 = _subgraph_net(tmp_path / "sub.onnx")
    records = np.random.default_rng(6).standard_normal((RECORDS, 1, D)).astype(np.float32)
    qdq = quantize(fp32, tmp_path / "sub.qdq.onnx", records)
    data = tmp_path / "sub.npz"
    np.savez(data, x=records[:, 0])
    result = node_sensitivity(ModelPair(fp32, qdq), data, metrics="mse", nodes=["mm1"], strategy=strategy)

    init = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(qdq)).graph.initializer}
    w = numpy_helper.to_array(next(t for t in onnx.load(str(fp32)).graph.initializer if t.name == "w"))
    # onnxruntime 1.18 quantizes a MatMul weight with the activation type (uint8, zero point 128)
    w_q = (init["w_quantized"].astype(np.float32) - init["w_zero_point"].astype(np.float32)) * init["w_scale"]
    x = records[:, 0]
    h1 = _fq(x, init["x_scale"], init["x_zero_point"]) @ w_q
    y = ((np.maximum(h1, 0) @ w) + _fq(h1, init["h1_scale"], init["h1_zero_point"])) @ w
    h1_ref = x @ w
    y_ref = ((np.maximum(h1_ref, 0) @ w) + h1_ref) @ w
    (node,) = result.nodes
    assert node.node == "mm1"
    assert node.metrics["mse"] == pytest.approx(float(((y - y_ref) ** 2).mean()), rel=1e-4)
