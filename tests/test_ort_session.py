"""The one onnxruntime session factory: its defaults reach every session, each caller's settings too."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from pytest_qaccuracy.backend.agreement import onnxruntime_session
from pytest_qaccuracy.errors import ModelError
from pytest_qaccuracy.ort_session import first_line, make_session
from pytest_qaccuracy.runtime import OrtRunner, RuntimeOptions


def _relu() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _settings(session) -> dict[str, object]:
    options = session.get_session_options()
    return {
        "threads": options.intra_op_num_threads,
        "level": options.graph_optimization_level,
        "log": options.log_severity_level,
        "spinning": options.get_session_config_entry("session.intra_op.allow_spinning"),
    }


def test_defaults_and_caller_settings(tmp_path) -> None:
    model = _relu()
    path = tmp_path / "relu.onnx"
    onnx.save(model, str(path))
    x = np.array([-1.0, 2.0], np.float32)
    for source in (model, model.SerializeToString(), path, str(path)):
        session = make_session(source, threads=1, optimization="disable")
        assert _settings(session) == {
            "threads": 1,
            "level": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "log": 4,
            "spinning": "0",
        }
        assert session.run(None, {"x": x})[0].tolist() == [0.0, 2.0]
    assert session.get_providers() == ["CPUExecutionProvider"]
    # a caller's entry is added, and may override a default
    session = make_session(model, config={"session.qdqisint8allowed": 1, "session.intra_op.allow_spinning": "1"})
    assert session.get_session_options().get_session_config_entry("session.qdqisint8allowed") == "1"
    assert _settings(session)["spinning"] == "1"
    assert _settings(session)["level"] == ort.GraphOptimizationLevel.ORT_ENABLE_ALL


def test_callers_keep_their_settings() -> None:
    """The runner takes its options; the agreement check fuses int8 QDQ groups with every optimization."""
    runner = OrtRunner(_relu(), ["y"], RuntimeOptions(optimization="basic", threads=2), "relu")
    assert _settings(runner._session) == {
        "threads": 2,
        "level": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "log": 4,
        "spinning": "0",
    }
    session = onnxruntime_session(_relu(), ["x"], threads=1)
    assert _settings(session)["level"] == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert session.get_session_options().get_session_config_entry("session.qdqisint8allowed") == "1"
    assert [o.name for o in session.get_outputs()] == ["y", "x"]


def test_load_failure() -> None:
    broken = _relu()
    broken.graph.node[0].op_type = "NoSuchOp"
    with pytest.raises(Exception) as info:
        make_session(broken)
    assert "NoSuchOp" in first_line(info.value) and "\n" not in first_line(info.value)
    with pytest.raises(ModelError, match=r"^relu: onnxruntime cannot load the model \(.*NoSuchOp"):
        OrtRunner(broken, ["y"], RuntimeOptions(), "relu")
    assert first_line(ValueError("")) == "ValueError"


@pytest.mark.parametrize(
    ("version", "expected"),
    [("1.18.0", ort.ExecutionOrder.DEFAULT), ("1.19.2", ort.ExecutionOrder.PRIORITY_BASED), (None, None)],
)
def test_node_order_only_where_onnxruntime_runs_it_right(monkeypatch, version, expected) -> None:
    """``in_node_order`` asks for the priority-based order, except on onnxruntime 1.18, whose
    priority-based order gave wrong sums on the comparison's merged graph: there the default order runs."""
    if version is not None:
        monkeypatch.setattr(ort, "__version__", version)
    else:
        expected = (
            ort.ExecutionOrder.PRIORITY_BASED
            if tuple(map(int, ort.__version__.split(".")[:2])) >= (1, 19)
            else ort.ExecutionOrder.DEFAULT
        )
    session = make_session(_relu(), in_node_order=True)
    assert session.get_session_options().execution_order == expected
    assert make_session(_relu()).get_session_options().execution_order == ort.ExecutionOrder.DEFAULT


def test_fetch_takes_graph_inputs_from_the_feeds() -> None:
    """A graph input asked for comes from the feeds, never from onnxruntime (1.22 hands back a view of
    the feed's memory that outlives the feed); the rest comes from the session, in the asked order."""
    from pytest_qaccuracy.ort_session import fetch

    asked_of_session = []

    class Session:
        def run(self, names, feeds):
            asked_of_session.append(list(names))
            return [np.full(2, i, np.float32) for i, _ in enumerate(names)]

    x = np.array([-1.0, 2.0], np.float32)
    got = fetch(Session(), ["y", "x", "z"], {"x": x})
    assert asked_of_session == [["y", "z"]]
    assert got[1] is x and got[0].tolist() == [0, 0] and got[2].tolist() == [1, 1]
    assert fetch(Session(), ["x"], {"x": x})[0] is x and asked_of_session == [["y", "z"]], "no run at all"


def test_a_runner_keeps_an_input_it_returns(tmp_path) -> None:
    """The input tensor a runner returns holds the batch's values after the batch's own arrays are gone
    (onnxruntime 1.22 returned freed memory here: every record of this test read garbage)."""
    from pytest_qaccuracy.data.binding import Batch

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    runner = OrtRunner(model, ["y", "x"], RuntimeOptions(), "relu")
    rng = np.random.default_rng(0)
    records = [rng.standard_normal((1, 2)).astype(np.float32) for _ in range(64)]
    want = np.concatenate(records)
    values = runner.run(Batch(0, [{"x": r.copy()} for r in records]))
    junk = [np.full((64, 2), 7.0, np.float32) for _ in range(8)]  # reuse whatever memory was freed
    np.testing.assert_array_equal(values["x"], want)
    np.testing.assert_array_equal(values["y"], np.maximum(want, 0))
    assert junk[0][0, 0] == 7.0


def _wait(pid: int, seconds: float) -> int | None:
    """The child's wait status, or None (and the child killed) when it has not ended within ``seconds``."""
    import os
    import signal
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork on this platform")
def test_a_forked_child_never_collects_the_parents_garbage_sessions() -> None:
    """A session with intra-op threads, garbage in a reference cycle when the process forks, must not
    be destroyed by the child's garbage collection (it joins threads the child does not have: the
    child hung, or died with SIGSEGV); the parent still collects it."""
    import gc
    import os
    import weakref

    class Holder:
        pass

    gc.collect()
    gc.disable()
    try:
        holder = Holder()
        holder.session = make_session(_relu(), threads=2)
        holder.session.run(None, {"x": np.ones(2, np.float32)})
        holder.cycle = holder
        alive = weakref.ref(holder)
        del holder
        pid = os.fork()
        if pid == 0:  # the child: collect everything, then leave without running the parent's atexit
            gc.enable()
            gc.collect()
            os._exit(0)
        status = _wait(pid, seconds=60)
    finally:
        gc.enable()
    assert status is not None, "the forked child hung"
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"the forked child died: status {status}"
    assert alive() is not None  # not collected in the parent yet: it was garbage at the fork
    gc.collect()
    assert alive() is None, "the parent collects its own garbage after the fork"
