"""The ``onnx-reference`` preset against ``onnx.reference.ReferenceEvaluator``: zero mismatches.

The cases include dense exact ties with odd zero points, where the reference (zero point added before
rounding, float64) and onnxruntime (after rounding, float32) disagree; the test also checks that they
do disagree there, so it cannot pass by accident.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from backend_models import assert_same, float_net, integer_tensors, node_model, quantize_qdq, random_q
from onnx.reference import ReferenceEvaluator

from pytest_qaccuracy.backend import IntegerSession

f32 = np.float32


def _tie_conv(dtype) -> tuple:
    rng = np.random.default_rng(0)
    x = (rng.integers(-4, 5, (2, 6, 7, 7)) + 4).astype(dtype)  # small values >= 0: no saturation, many ties
    w = rng.integers(-4, 5, (4, 6, 1, 1)).astype(np.int8)
    inits = {"xs": f32(0.5), "xz": np.array(3, dtype), "w": w, "ws": f32(0.5),
             "wz": np.int8(0), "ys": f32(1.0), "yz": np.array(61, dtype)}  # fmt: skip
    return node_model("QLinearConv", [("x", dtype, x.shape)], inits, dtype), {"x": x}


def _tie_matmul(dtype) -> tuple:
    rng = np.random.default_rng(1)
    a = (rng.integers(-3, 4, (3, 5, 20)) + 3).astype(dtype)  # >= 0: a negative value would wrap in uint8
    b = rng.integers(-3, 4, (20, 6)).astype(np.int8)
    inits = {"as": f32(0.5), "az": np.array(3, dtype), "b": b, "bs": f32(0.5),
             "bz": np.int8(0), "ys": f32(1.0), "yz": np.array(61, dtype)}  # fmt: skip
    return node_model("QLinearMatMul", [("a", dtype, a.shape)], inits, dtype), {"a": a}


@pytest.mark.parametrize("build", [_tie_conv, _tie_matmul])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qoperator_ties_match_reference(build, dtype) -> None:
    model, feeds = build(dtype)
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    # nothing saturates (onnx < 1.22's reference QLinearMatMul would wrap instead; the spec saturates)
    assert np.iinfo(dtype).min < want.min() and want.max() < np.iinfo(dtype).max
    got = IntegerSession(model, "onnx-reference").run(None, feeds)[0]
    assert_same(got, want, "onnx-reference preset")
    ort_like = IntegerSession(model, "onnxruntime").run(None, feeds)[0]
    assert np.count_nonzero(ort_like != want) > want.size // 20  # ties: the presets really differ


ONNX = tuple(int(p) for p in re.findall(r"\d+", onnx.__version__)[:2])


@pytest.mark.parametrize(
    "wz",
    [
        pytest.param(np.uint8(2), id="per-tensor"),
        pytest.param(
            np.array([1, 2, 3, 4], np.uint8),
            marks=pytest.mark.skipif(
                ONNX < (1, 20),
                reason="onnx < 1.20's reference ConvInteger has no per-channel w_zero_point (`if w_zero_point:` "
                "on an array raises); onnx 1.20 added it",
            ),
            id="per-channel",
        ),
    ],
)
def test_integer_ops_match_reference(wz: np.ndarray) -> None:
    rng = np.random.default_rng(2)
    x = random_q(rng, np.uint8, (2, 3, 6, 6))
    inits = {"w": random_q(rng, np.uint8, (4, 3, 3, 3)), "xz": np.uint8(9), "wz": wz}
    conv = node_model("ConvInteger", [("x", np.uint8, x.shape)], inits, np.int32, input_order=["x", "w", "xz", "wz"],
                      pads=[1, 1, 1, 1])  # fmt: skip
    assert_same(
        IntegerSession(conv, "onnx-reference").run(None, {"x": x})[0], ReferenceEvaluator(conv).run(None, {"x": x})[0]
    )
    v = rng.normal(0, 3, (5, 7)).astype(f32)
    dql = node_model("DynamicQuantizeLinear", [("v", np.float32, v.shape)], {}, np.uint8, n_outputs=3)
    for got, want in zip(
        IntegerSession(dql, "onnx-reference").run(None, {"v": v}),
        ReferenceEvaluator(dql).run(None, {"v": v}),
        strict=True,
    ):
        assert_same(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("activation", ["uint8", "int8"])
def test_qdq_net_matches_reference_tensor_by_tensor(activation, tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    calibration = rng.normal(0, 1, (8, 8, 10, 10)).astype(f32)
    records = rng.normal(0, 1, (3, 8, 10, 10)).astype(f32)
    ops = ["Conv", "Add", "AveragePool", "MaxPool", "Sigmoid", "Concat"]
    model = quantize_qdq(
        float_net(ops, size=10, opset=21), calibration, tmp_path, activation=activation, per_channel=True
    )
    names = integer_tensors(model) + [o.name for o in model.graph.output]
    want = ReferenceEvaluator(model).run(names, {"input": records})
    got = IntegerSession(model, "onnx-reference").run(names, {"input": records})
    for name, g, w in zip(names, got, want, strict=True):
        assert_same(g, w, name)
