"""The consumer probe of ``auto`` (``analysis/calibration/probe.py``): which consumers are copied, how
the copies and outputs are named, and every score against numpy's fake quantization of the same
records with onnxruntime's scale and zero point (``compute_scale_zp``)."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization.quant_utils import compute_scale_zp

from pytest_qaccuracy.analysis.calibration.probe import (
    ProbeEntry,
    ProbeScores,
    _copyable,
    build_probe,
    output_names,
)

W = np.array([0.5, -2.0, 1.5, 3.0], np.float32)


def _net() -> onnx.ModelProto:
    """x[N, 4] -> Relu (r), Mul by W (m), Shape (s, int64), LayerNormalization (ln, its mean output
    left out, inv); y = r + m. Outputs y, s, ln, inv."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Mul", ["x", "w"], ["m"], name="mul"),
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["ln", "", "inv"], name="norm", axis=-1),
        helper.make_node("Add", ["r", "m"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
            helper.make_tensor_value_info("ln", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("inv", TensorProto.FLOAT, ["N", 1]),
        ],
        [
            numpy_helper.from_array(W, "w"),
            numpy_helper.from_array(np.ones(4, np.float32), "gamma"),
            numpy_helper.from_array(np.zeros(4, np.float32), "beta"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _fake(x: np.ndarray, lo: float, hi: float, kind: str) -> np.ndarray:
    """QuantizeLinear then DequantizeLinear with onnxruntime's scale and zero point of (lo, hi)."""
    qmin, qmax, dtype = (0, 255, np.uint8) if kind == "uint8" else (-128, 127, np.int8)
    zero, scale = compute_scale_zp(np.float32(lo), np.float32(hi), dtype(qmin), dtype(qmax))
    scale, zero = np.float32(scale), float(zero)
    q = np.clip(np.round(x / scale) + zero, qmin, qmax)  # round half to even, as QuantizeLinear
    return ((q - zero) * scale).astype(np.float32)


def _layer_norm(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    mean = x.mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + 1e-5)


def _relative(changed: np.ndarray, original: np.ndarray) -> tuple[float, float]:
    c, o = changed.astype(np.float64), original.astype(np.float64)
    return float(np.sum((c - o) ** 2)), float(np.sum(o * o))


def _records() -> list[np.ndarray]:
    rng = np.random.default_rng(4)
    records = [rng.standard_normal((2, 4)).astype(np.float32) * 2 for _ in range(5)]
    records[2][1, 3] = 9.0  # one outlier: the narrow range clips it
    return records


@pytest.mark.parametrize("kind", ["uint8", "int8"])
def test_probe_scores_are_each_consumers_relative_error_summed(kind):
    """x is read by Relu, Mul and LayerNormalization (Shape gives integers: not scored); y is read by
    nothing: scored on itself. Each score is sum over consumers of (sum over records of the squared
    error) / (sum over records of the consumer's energy), as numpy gives them."""
    model = _net()
    candidates = {"x": [(-5.0, 9.0), (-2.0, 2.5)], "y": [(-8.0, 30.0), (0.0, 4.0), (-1.0, 1.0)]}
    probe, entries = build_probe(model, candidates, kind)
    names = output_names(entries)
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    sums = ProbeScores(entries)
    for x in _records():
        sums.add(dict(zip(names, session.run(names, {"x": x}), strict=True)))
    got = sums.by_tensor()
    assert list(got) == ["x", "y"]
    assert [r for r, _ in got["x"]] == candidates["x"] and [r for r, _ in got["y"]] == candidates["y"]

    def consumers(x: np.ndarray) -> list[np.ndarray]:
        return [np.maximum(x, 0), x * W, _layer_norm(x)]

    for k, (lo, hi) in enumerate(candidates["x"]):
        err, energy = np.zeros(3), np.zeros(3)
        for x in _records():
            for i, (c, o) in enumerate(zip(consumers(_fake(x, lo, hi, kind)), consumers(x), strict=True)):
                e, s = _relative(c, o)
                err[i], energy[i] = err[i] + e, energy[i] + s
        assert got["x"][k][1] == pytest.approx(float(np.sum(err / energy)), rel=1e-4)
    for k, (lo, hi) in enumerate(candidates["y"]):
        err = energy = 0.0
        for x in _records():
            y = np.maximum(x, 0) + x * W
            e, s = _relative(_fake(y, lo, hi, kind), y)
            err, energy = err + e, energy + s
        assert got["y"][k][1] == pytest.approx(err / energy, rel=1e-4)
    assert got["x"][1][1] > got["x"][0][1]  # the clipping range is worse: the scores differ
    # the probe model computes the fp32 outputs first, as they were
    fp32 = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = _records()[0]
    for a, b in zip(fp32.run(None, {"x": x}), session.run(None, {"x": x})[:4], strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_probe_graph_copies_the_float_consumers_and_names_every_output():
    model = _net()
    before = model.SerializeToString()
    probe, entries = build_probe(model, {"x": [(-5.0, 9.0), (-2.0, 2.5)], "y": [(-8.0, 30.0)]}, "uint8")
    assert model.SerializeToString() == before  # the fp32 model is left as it was
    assert [o.name for o in probe.graph.output[:4]] == ["y", "s", "ln", "inv"]
    tag = "qaccuracy_probe/0/1"
    assert entries[1] == ProbeEntry(
        "x",
        (-2.0, 2.5),
        (f"{tag}/err0", f"{tag}/err1", f"{tag}/err2"),
        ("qaccuracy_probe/energy/0", "qaccuracy_probe/energy/1", "qaccuracy_probe/energy/2"),
    )
    assert entries[0].energies == entries[1].energies  # one energy per consumer output, shared
    assert entries[2] == ProbeEntry("y", (-8.0, 30.0), ("qaccuracy_probe/1/0/err0",), ("qaccuracy_probe/energy/3",))
    added = [o.name for o in probe.graph.output[4:]]
    assert sorted(added) == sorted(output_names(entries))
    assert len(added) == len(set(added)) == 3 * 2 + 1 + 4
    nodes = {n.name: n for n in probe.graph.node}
    copies = [n for n in probe.graph.node if n.name.startswith(tag + "/")]
    assert [n.name for n in copies] == [f"{tag}/0/relu", f"{tag}/1/mul", f"{tag}/2/norm"]
    assert list(nodes[f"{tag}/1/mul"].input) == [f"{tag}/fake", "w"]
    assert list(nodes[f"{tag}/2/norm"].output) == [f"{tag}/2/out0", "", f"{tag}/2/out2"]
    assert nodes[f"{tag}/2/norm"].attribute[0].i == -1  # attributes copied
    assert not any(n.op_type == "Shape" and n.name != "shape" for n in probe.graph.node)
    quantize = next(n for n in probe.graph.node if n.output[0] == f"{tag}/q")
    assert quantize.op_type == "QuantizeLinear" and list(quantize.input) == ["x", f"{tag}/scale", f"{tag}/zero"]
    dequantize = next(n for n in probe.graph.node if n.output[0] == f"{tag}/fake")
    assert dequantize.op_type == "DequantizeLinear" and list(dequantize.input) == [
        f"{tag}/q",
        f"{tag}/scale",
        f"{tag}/zero",
    ]
    inits = {t.name: numpy_helper.to_array(t) for t in probe.graph.initializer}
    zero, scale = compute_scale_zp(np.float32(-2.0), np.float32(2.5), np.uint8(0), np.uint8(255))
    assert inits[f"{tag}/scale"].dtype == np.float32 and inits[f"{tag}/scale"] == np.float32(scale)
    assert inits[f"{tag}/zero"].dtype == np.uint8 and inits[f"{tag}/zero"] == zero
    err = next(n for n in probe.graph.node if n.output[0] == f"{tag}/err1")
    diff = next(n for n in probe.graph.node if n.output[0] == f"{tag}/err1/diff")
    assert (err.op_type, list(err.input)) == ("ReduceSumSquare", [f"{tag}/err1/diff"])
    assert (diff.op_type, list(diff.input)) == ("Sub", [f"{tag}/1/out0", "m"])
    assert err.attribute[0].name == "keepdims" and err.attribute[0].i == 0
    energy = next(n for n in probe.graph.node if n.output[0] == "qaccuracy_probe/energy/1")
    assert (energy.op_type, list(energy.input), energy.attribute[0].i) == ("ReduceSumSquare", ["m"], 0)


def test_int8_ranges_give_int8_parameters():
    probe, _ = build_probe(_net(), {"x": [(-5.0, 9.0)]}, "int8")
    inits = {t.name: numpy_helper.to_array(t) for t in probe.graph.initializer}
    zero, scale = compute_scale_zp(np.float32(-5.0), np.float32(9.0), np.int8(-128), np.int8(127))
    assert inits["qaccuracy_probe/0/0/zero"].dtype == np.int8 and inits["qaccuracy_probe/0/0/zero"] == zero
    assert inits["qaccuracy_probe/0/0/scale"] == np.float32(scale)


def _loop_net() -> onnx.ModelProto:
    """x read by a Loop (a subgraph: never copied) and by Neg; the Loop's output by Relu."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Identity", ["v_in"], ["v_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [2]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [2]),
        ],
    )
    nodes = [
        helper.make_node("Loop", ["trips", "", "x"], ["looped"], name="loop", body=body),
        helper.make_node("Neg", ["x"], ["n"], name="neg"),
        helper.make_node("Relu", ["looped"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "loop",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("n", TensorProto.FLOAT, [2]),
        ],
        [numpy_helper.from_array(np.array(1, np.int64), "trips")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_nodes_with_subgraphs_are_not_copied_and_a_tensor_without_copyable_readers_is_scored_on_itself():
    probe, entries = build_probe(_loop_net(), {"x": [(-1.0, 1.0)], "looped": [(-1.0, 1.0)]}, "uint8")
    copies = [n.name for n in probe.graph.node if n.name.startswith("qaccuracy_probe/")]
    assert copies == ["qaccuracy_probe/0/0/0/neg", "qaccuracy_probe/1/0/0/relu"]
    assert entries[0].errors == ("qaccuracy_probe/0/0/err0",)
    only = _loop_net()
    del only.graph.node[1]  # x read by the Loop alone: scored on itself
    del only.graph.output[1]
    probe, entries = build_probe(only, {"x": [(-1.0, 1.0)]}, "uint8")
    assert not any(n.name.startswith("qaccuracy_probe/") for n in probe.graph.node)
    sub = next(n for n in probe.graph.node if n.output[0] == "qaccuracy_probe/0/0/err0/diff")
    assert list(sub.input) == ["qaccuracy_probe/0/0/fake", "x"]
    assert entries[0].energies == ("qaccuracy_probe/energy/0",)
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.array([0.3, -2.0], np.float32)
    err, energy = session.run(list(output_names(entries)), {"x": x})
    e, s = _relative(_fake(x, -1.0, 1.0, "uint8"), x)
    assert float(err) == pytest.approx(e, rel=1e-5) and float(energy) == pytest.approx(s, rel=1e-6)


def test_copyable_means_no_graph_attribute():
    body = helper.make_graph([], "b", [], [])
    assert _copyable(helper.make_node("Relu", ["x"], ["y"], alpha=1.0))
    assert not _copyable(helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=body))
    graphs = onnx.AttributeProto(name="branches", type=onnx.AttributeProto.GRAPHS)
    graphs.graphs.extend([body])
    node = helper.make_node("Custom", ["x"], ["y"])
    node.attribute.append(graphs)
    assert not _copyable(node)


def test_scores_divide_each_consumers_sum_and_treat_no_energy_apart():
    entries = [
        ProbeEntry("t", (0.0, 1.0), ("e1", "e2"), ("s1", "s2")),
        ProbeEntry("t", (0.0, 2.0), ("e3", "e4"), ("s1", "zero")),
        ProbeEntry("u", (0.0, 3.0), ("e5",), ("zero",)),
        ProbeEntry("u", (0.0, 4.0), ("missing",), ("also missing",)),
        ProbeEntry("v", (0.0, 5.0), ("e5",), ("never reported",)),
    ]
    sums = ProbeScores(entries)
    for values in (
        {"e1": np.float32(1.0), "e2": np.float32(0.5), "s1": np.float32(4.0), "s2": np.float32(2.0)},
        {"e1": np.float32(1.0), "e2": np.float32(0.5), "s1": np.float32(4.0), "s2": np.float32(2.0)},
        {"e3": np.float32(2.0), "e4": np.float32(0.0), "zero": np.float32(0.0), "e5": np.float32(0.25)},
    ):
        sums.add(values)
    assert sums.sums == {"e1": 2.0, "e2": 1.0, "s1": 8.0, "s2": 4.0, "e3": 2.0, "e4": 0.0, "zero": 0.0, "e5": 0.25}
    assert all(type(v) is float for v in sums.sums.values())
    assert sums.score(entries[0]) == 2.0 / 8.0 + 1.0 / 4.0
    assert sums.score(entries[1]) == 2.0 / 8.0  # no error where there is no energy: nothing added
    assert sums.score(entries[2]) == math.inf  # an error where there is no energy
    assert sums.score(entries[3]) == 0.0  # never reported: no error
    assert sums.score(entries[4]) == math.inf  # an energy never reported is no energy
    assert sums.by_tensor()["v"] == [((0.0, 5.0), math.inf)]
    assert {k: v for k, v in sums.by_tensor().items() if k != "v"} == {
        "t": [((0.0, 1.0), 0.5), ((0.0, 2.0), 0.25)],
        "u": [((0.0, 3.0), math.inf), ((0.0, 4.0), 0.0)],
    }


def test_scores_sum_in_float64():
    sums = ProbeScores([])
    for _ in range(3):
        sums.add({"e": np.float32(0.1)})
    assert sums.sums["e"] == 3 * float(np.float32(0.1))


def test_output_names_lists_each_output_once_in_order():
    entries = [
        ProbeEntry("t", (0.0, 1.0), ("e1", "e2"), ("s1", "s2")),
        ProbeEntry("t", (0.0, 2.0), ("e3",), ("s1",)),
    ]
    assert output_names(entries) == ["e1", "e2", "s1", "s2", "e3"]
    assert output_names([]) == []


def test_a_consumer_whose_output_type_is_unknown_is_copied_as_a_float_one():
    """A node of a domain onnx cannot infer leaves its output untyped: it is taken for float."""
    graph = helper.make_graph(
        [
            helper.make_node("Mystery", ["x"], ["m"], name="mystery", domain="my.domain"),
            helper.make_node("Relu", ["m"], ["y"], name="relu"),
        ],
        "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("my.domain", 1)]
    probe, _ = build_probe(helper.make_model(graph, opset_imports=opsets), {"x": [(-1.0, 1.0)]}, "uint8")
    copies = [n for n in probe.graph.node if n.name.startswith("qaccuracy_probe/")]
    assert [(n.name, n.domain) for n in copies] == [("qaccuracy_probe/0/0/0/mystery", "my.domain")]
    sub = next(n for n in probe.graph.node if n.output[0] == "qaccuracy_probe/0/0/err0/diff")
    assert list(sub.input) == ["qaccuracy_probe/0/0/0/out0", "m"]
