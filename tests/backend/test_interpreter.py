"""IntegerSession behaviour: API shape, intermediates, streaming callback, batching, errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from backend_models import assert_same, float_net, node_model, ort_session, quantize_qdq, random_q, with_outputs
from onnx import TensorProto, helper, numpy_helper

from pytest_qaccuracy.backend import IntegerSession, KernelError, Scheme, get_scheme
from pytest_qaccuracy.backend.registry import kernel
from pytest_qaccuracy.errors import InputError, ModelError, UnsupportedOpError


@pytest.fixture(scope="module")
def qdq_model(tmp_path_factory: pytest.TempPathFactory) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    calibration = rng.normal(0, 1, (8, 8, 10, 10)).astype(np.float32)
    return quantize_qdq(float_net(["Conv", "Add", "MaxPool"], size=10), calibration, tmp_path_factory.mktemp("m"))


@pytest.fixture(scope="module")
def records() -> np.ndarray:
    return np.random.default_rng(1).normal(0, 1, (5, 8, 10, 10)).astype(np.float32)


def test_inputs_and_outputs_look_like_onnxruntime(qdq_model: onnx.ModelProto) -> None:
    ours, theirs = IntegerSession(qdq_model), ort_session(qdq_model)
    for a, b in zip(ours.get_inputs() + ours.get_outputs(), theirs.get_inputs() + theirs.get_outputs(), strict=True):
        assert (a.name, a.type) == (b.name, b.type)
        assert a.shape == b.shape


def test_run_without_names_returns_every_graph_output_in_graph_order() -> None:
    """``run(None, ...)`` is ``run(<all graph outputs>, ...)``, as in onnxruntime: not just the first one."""
    v = np.random.default_rng(5).normal(0, 3, (4, 6)).astype(np.float32)
    dql = node_model("DynamicQuantizeLinear", [("v", np.float32, v.shape)], {}, np.uint8, n_outputs=3)
    session = IntegerSession(dql)
    names = [o.name for o in dql.graph.output]
    everything = session.run(None, {"v": v})
    assert len(everything) == len(names) == 3
    for name, got, want in zip(names, everything, session.run(names, {"v": v}), strict=True):
        assert_same(np.asarray(got), np.asarray(want), name)


def test_loads_from_path_and_rejects_bad_files(qdq_model: onnx.ModelProto, tmp_path: Path) -> None:
    onnx.save(qdq_model, tmp_path / "m.onnx")
    assert IntegerSession(tmp_path / "m.onnx", "tflite").scheme == get_scheme("tflite")
    (tmp_path / "bad.onnx").write_bytes(b"not a model")
    with pytest.raises(ModelError):
        IntegerSession(tmp_path / "bad.onnx")


def test_batch_equals_records_one_by_one(qdq_model: onnx.ModelProto, records: np.ndarray) -> None:
    session = IntegerSession(qdq_model)
    batch = session.run(None, {"input": records})[0]
    singles = np.concatenate([session.run(None, {"input": records[i : i + 1]})[0] for i in range(len(records))])
    assert_same(batch, singles, "batched vs single records")


def test_intermediate_tensors_and_callback(qdq_model: onnx.ModelProto, records: np.ndarray) -> None:
    session = IntegerSession(qdq_model)
    q_outputs = [n.output[0] for n in qdq_model.graph.node if n.op_type == "QuantizeLinear"]
    dq_outputs = [
        n.output[0] for n in qdq_model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in q_outputs
    ]
    seen: dict[str, np.ndarray] = {}
    final = session.run(None, {"input": records}, on_tensor=lambda name, value: seen.setdefault(name, value))[0]
    assert set(q_outputs) <= set(seen) and set(dq_outputs) <= set(seen)
    assert not any(name.startswith("qaccuracy::") for name in seen)
    picked = session.run(q_outputs[1:3] + dq_outputs[:1], {"input": records})
    for name, value in zip(q_outputs[1:3] + dq_outputs[:1], picked, strict=True):
        assert_same(value, seen[name], name)
        assert value.dtype == (np.float32 if name in dq_outputs else np.uint8)
    assert_same(final, seen[qdq_model.graph.output[0].name], "graph output")


def test_feed_and_name_errors(qdq_model: onnx.ModelProto, records: np.ndarray) -> None:
    session = IntegerSession(qdq_model)
    with pytest.raises(InputError, match="missing input 'input'"):
        session.run(None, {})
    with pytest.raises(InputError, match="expected float32, got float64"):
        session.run(None, {"input": records.astype(np.float64)})
    with pytest.raises(InputError, match="unknown tensor name"):
        session.run(["nope"], {"input": records})
    with pytest.raises(InputError, match="unknown input"):
        session.run(None, {"input": records, "extra": records})


def test_unsupported_op_names_node_and_op() -> None:
    node = helper.make_node("FancyOp", ["x"], ["y"], name="my_node", domain="example.custom")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])  # fmt: skip
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("example.custom", 1)]
    )
    with pytest.raises(UnsupportedOpError, match=r"node 'my_node'.*example\.custom::FancyOp"):
        IntegerSession(model)


def test_kernel_failure_names_node_not_numpy() -> None:
    x = random_q(np.random.default_rng(2), np.uint8, (1, 4, 5, 5))
    inits = {"xs": np.float32(0.1), "xz": np.uint8(0), "w": np.ones((2, 3, 3, 3), np.int8), "ws": np.float32(0.1),
             "wz": np.int8(0), "ys": np.float32(0.1), "yz": np.uint8(0)}  # fmt: skip
    model = node_model("QLinearConv", [("x", np.uint8, x.shape)], inits, np.uint8)  # 4 channels vs 3 in w
    model.graph.node[0].name = "conv_bad"
    with pytest.raises(KernelError, match=r"node 'conv_bad' \(ai.onnx::QLinearConv\) failed: ValueError"):
        IntegerSession(model).run(None, {"x": x})


def test_float_ops_fall_back_to_onnx_reference() -> None:
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    model = node_model("Erf", [("x", np.float32, x.shape)], {}, np.float32)
    np.testing.assert_allclose(
        IntegerSession(model).run(None, {"x": x})[0], ort_session(model).run(None, {"x": x})[0], rtol=1e-6
    )


def test_registering_a_kernel_twice_raises() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        kernel("", "QLinearConv", 10)(lambda *a, **k: ())


def test_custom_scheme_changes_results(qdq_model: onnx.ModelProto, records: np.ndarray) -> None:
    ort_like = IntegerSession(qdq_model).run(None, {"input": records})[0]
    shift_only = IntegerSession(qdq_model, Scheme(name="shift", multiplier="power2", rounding="floor")).run(
        None, {"input": records}
    )[0]
    assert not np.array_equal(ort_like, shift_only)


def test_core_does_not_import_pytest() -> None:
    code = "import sys, pytest_qaccuracy.backend, pytest_qaccuracy.backend.agreement; print('pytest' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def test_qoperator_weights_from_initializers_are_not_copied_per_run() -> None:
    """Initializers are shared, never mutated by kernels."""
    rng = np.random.default_rng(3)
    w = random_q(rng, np.int8, (4, 3, 3, 3))
    inits = {"xs": np.float32(0.1), "xz": np.uint8(3), "w": w, "ws": np.float32(0.01), "wz": np.int8(0),
             "ys": np.float32(0.2), "yz": np.uint8(1)}  # fmt: skip
    model = node_model("QLinearConv", [("x", np.uint8, (2, 3, 6, 6))], inits, np.uint8)
    session = IntegerSession(model)
    x = random_q(rng, np.uint8, (2, 3, 6, 6))
    first = session.run(None, {"x": x})[0]
    assert_same(session.run(None, {"x": x})[0], first)
    assert_same(numpy_helper.to_array(model.graph.initializer[2]), w)


def test_float_tensors_removed_by_fusion_can_still_be_asked_for(
    qdq_model: onnx.ModelProto, records: np.ndarray
) -> None:
    """Conv outputs (before an implied Relu or a QuantizeLinear) exist only if their group stays unfused."""
    session = IntegerSession(qdq_model)
    interiors = [n.output[0] for n in qdq_model.graph.node if n.op_type in ("Conv", "Add", "MaxPool")]
    values = session.run(interiors, {"input": records})
    want = ort_session(with_outputs(qdq_model, interiors)).run(interiors, {"input": records})
    for name, got, ref in zip(interiors, values, want, strict=True):
        assert got.dtype == np.float32, name
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
