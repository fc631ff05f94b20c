"""Unit tests of ``runtime/`` and ``ort_session.py``, run in-process (the mutation group ``runtime``):
options and their messages, the backend switch, the session factory's settings, the batching of a
runner against record-by-record runs, and the merged graph's pieces against values computed here."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from pytest_qaccuracy import ort_session
from pytest_qaccuracy.data.binding import Batch
from pytest_qaccuracy.errors import InputError, ModelError
from pytest_qaccuracy.ort_session import (
    check_fetchable,
    fetch,
    first_line,
    make_session,
    spin_during_run,
    version_tuple,
)
from pytest_qaccuracy.runtime import (
    BACKENDS,
    CAPTURE_MODES,
    OPTIMIZATION_LEVELS,
    OrtRunner,
    RuntimeOptions,
    make_runner,
)
from pytest_qaccuracy.runtime.ort_runner import BatchUnits, _close, _with_outputs


def _model(nodes, inputs, outputs, opset: int = 13, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _one_record_reshape() -> onnx.ModelProto:
    """A model with a dynamic batch axis whose Reshape to [3] takes one record only."""
    return _model(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        initializers=[helper.make_tensor("shape", TensorProto.INT64, [1], [3])],
    )


def _relu(batch=None) -> onnx.ModelProto:
    """y = Relu(x) + 1 with a middle tensor ``r``; x of shape (batch, 3)."""
    return _model(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "one"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])],
        initializers=[helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])],
    )


def _records(n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, 3)).astype(np.float32)} for _ in range(n)]


# -- options ----------------------------------------------------------------------------------------


def test_runtime_options_defaults_and_bounds() -> None:
    options = RuntimeOptions()
    assert options.providers == ("CPUExecutionProvider",)
    assert options.optimization == "all" and options.threads == 0 and dict(options.session_config) == {}
    assert OPTIMIZATION_LEVELS == ("disable", "basic", "extended", "all")
    RuntimeOptions(batch_size=1, threads=0)  # the smallest allowed
    with pytest.raises(InputError, match=r"^batch size must be >= 1, got 0$"):
        RuntimeOptions(batch_size=0)
    with pytest.raises(InputError, match=r"^threads must be >= 0, got -1$"):
        RuntimeOptions(threads=-1)
    with pytest.raises(InputError, match=r"^at least one execution provider is needed$"):
        RuntimeOptions(providers=())
    with pytest.raises(InputError, match=r"^optimization must be one of disable, basic, extended, all, got 'ALL'$"):
        RuntimeOptions(optimization="ALL")


def test_for_capture() -> None:
    options = RuntimeOptions(optimization="basic", threads=2, batch_size=3)
    assert options.for_capture("deployed") is options
    reference = options.for_capture("reference")
    assert reference == RuntimeOptions(optimization="disable", threads=2, batch_size=3)
    assert set(CAPTURE_MODES) == {"deployed", "reference"}
    with pytest.raises(InputError, match=r"^capture mode must be one of deployed, reference, got 'x'$"):
        options.for_capture("x")


def test_make_runner_backends() -> None:
    model = _relu()
    runner = make_runner(model, ["y"], RuntimeOptions(threads=1), "m")
    assert isinstance(runner, OrtRunner) and runner.label == "m" and runner.tensors == ["y"]
    assert BACKENDS == ("onnxruntime", "integer")
    with pytest.raises(InputError, match=r"^a scheme applies to the integer backend only$"):
        make_runner(model, ["y"], RuntimeOptions(), "m", scheme="onnxruntime")
    with pytest.raises(InputError, match=r"^unknown backend 'numpy'; expected one of onnxruntime, integer$"):
        make_runner(model, ["y"], RuntimeOptions(), "m", backend="numpy")


# -- the session factory ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1.18.0", (1, 18)), ("1.20.0.dev20240101", (1, 20)), ("2", (2, 0)), ("1.x", (1, 0)), ("1.26rc1", (1, 261))],
)
def test_version_tuple(text, expected) -> None:
    assert version_tuple(text) == expected


@pytest.mark.parametrize(("version", "spins"), [("1.25.9", False), ("1.26.0", True), ("2.0.0", True)])
def test_spin_during_run_only_where_it_is_bounded(monkeypatch, version, spins) -> None:
    monkeypatch.setattr(ort, "__version__", version)
    expected = {
        "session.intra_op.allow_spinning": "1",
        "session.intra_op.spin_duration_us": "50",
        "session.force_spinning_stop": "1",
    }
    assert spin_during_run() == (expected if spins else {})


@pytest.mark.parametrize("level", OPTIMIZATION_LEVELS)
def test_every_optimization_level_and_memory_pattern(level) -> None:
    session = make_session(_relu(), optimization=level, mem_pattern=False)
    options = session.get_session_options()
    assert options.graph_optimization_level == getattr(
        ort.GraphOptimizationLevel, ort_session.GRAPH_OPTIMIZATION[level]
    )
    assert options.enable_mem_pattern is False
    assert make_session(_relu()).get_session_options().enable_mem_pattern is True


def test_the_optimized_model_is_written_where_asked(tmp_path) -> None:
    path = tmp_path / "opt.onnx"
    make_session(_relu(), optimized_model_path=path)
    assert [n.op_type for n in onnx.load(str(path)).graph.node] == ["Relu", "Add"]


def test_check_fetchable_names_the_int4_tensor() -> None:
    class Output:
        def __init__(self, name, kind):
            self.name, self.type = name, kind

    class Session:
        def get_outputs(self):
            return [Output("a", "tensor(float)"), Output("b", "tensor(int4)"), Output("c", "tensor(uint4)")]

    check_fetchable(Session(), ["a"])
    check_fetchable(Session(), [])
    with pytest.raises(
        ModelError,
        match=r"^tensor 'b' is int4: int4 tensors are not supported \(onnxruntime cannot return them to Python\)$",
    ):
        check_fetchable(Session(), ["a", "b"])
    with pytest.raises(ModelError, match=r"^tensor 'c' is uint4: uint4"):
        check_fetchable(Session(), ["c"])


def test_fetch_reraises_what_onnxruntime_raised_after_checking_types() -> None:
    session = make_session(_relu())
    with pytest.raises(Exception, match="nope") as info:
        fetch(session, ["nope"], {"x": np.zeros((1, 3), np.float32)})
    assert not isinstance(info.value, ModelError)
    got = fetch(session, ["y", "x"], {"x": np.array([[-1, 0, 2]], np.float32)})
    assert [g.tolist() for g in got] == [[[1, 1, 3]], [[-1, 0, 2]]]


def test_first_line() -> None:
    assert first_line(ValueError("  one\ntwo\n")) == "one"
    assert first_line(KeyError()) == "KeyError"
    assert first_line(RuntimeError("\n  \n")) == "RuntimeError"


def test_fork_hooks_freeze_only_when_nothing_is_frozen(monkeypatch) -> None:
    calls = []

    class Gc:
        count = 0

        def get_freeze_count(self):
            return self.count

        def freeze(self):
            calls.append("freeze")

        def unfreeze(self):
            calls.append("unfreeze")

    fake = Gc()
    monkeypatch.setattr(ort_session, "gc", fake)
    monkeypatch.setattr(ort_session, "_froze_for_fork", False)
    ort_session._freeze_before_fork()
    assert ort_session._froze_for_fork is True and calls == ["freeze"]
    ort_session._unfreeze_after_fork()
    assert calls == ["freeze", "unfreeze"]
    fake.count = 5  # the caller froze its own objects: kept frozen
    ort_session._freeze_before_fork()
    assert ort_session._froze_for_fork is False
    ort_session._unfreeze_after_fork()
    assert calls == ["freeze", "unfreeze"]


# -- OrtRunner --------------------------------------------------------------------------------------


def _one_by_one(model: onnx.ModelProto, records, names) -> dict[str, np.ndarray]:
    """Each record run alone by a plain onnxruntime session, concatenated."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    runs = [session.run(names, r) for r in records]
    return {n: np.concatenate([run[i] for run in runs]) for i, n in enumerate(names)}


class _Counting:
    """Wraps a runner's session, counting the records of each run."""

    def __init__(self, runner) -> None:
        self.runner, self.sizes = runner, []
        self.inner = runner._session
        runner._session = self

    def run(self, names, feeds):
        self.sizes.append(len(next(iter(feeds.values()))))
        return self.inner.run(names, feeds)

    def get_outputs(self):
        return self.inner.get_outputs()


def test_a_dynamic_batch_runs_whole_without_a_probe() -> None:
    runner = OrtRunner(_relu("N"), ["y", "r", "y"], RuntimeOptions(), "m")
    assert runner.tensors == ["y", "r"] and runner.dynamic and runner.batching and not runner._relaxed
    counting = _Counting(runner)
    records = _records(3)
    got = runner.run(Batch(0, records))
    expected = _one_by_one(_with_outputs(_relu("N"), ["r"], False), records, ["y", "r"])
    assert list(got) == ["y", "r"]
    for name in got:
        np.testing.assert_array_equal(got[name], expected[name])
    assert counting.sizes == [3] and runner._verified
    runner.run(Batch(3, _records(2, seed=1)))
    runner.run(Batch(5, _records(1, seed=2)))
    assert counting.sizes == [3, 2, 1]


def test_a_dynamic_batch_that_fails_stacked_runs_one_record_at_a_time(caplog) -> None:
    """A dynamic model whose Reshape takes one record: the first stacked run fails, then every record
    runs once, alone."""
    model = _one_record_reshape()
    runner = OrtRunner(model, ["y"], RuntimeOptions(), "m")
    counting = _Counting(runner)
    records = _records(3)
    with caplog.at_level(logging.INFO, logger="pytest_qaccuracy.runtime.ort_runner"):
        got = runner.run(Batch(0, records))
    assert caplog.messages == ["m: the model does not batch; running one record at a time"]
    np.testing.assert_array_equal(got["y"], np.concatenate([r["x"][0] for r in records]))
    assert counting.sizes == [3, 1, 1, 1] and runner.batching is False
    assert runner.units(Batch(7, records[:2])) == [Batch(7, [records[0]]), Batch(8, [records[1]])]


def test_a_fixed_batch_of_one_is_freed_and_checked_on_two_records() -> None:
    runner = OrtRunner(_relu(1), ["y"], RuntimeOptions(), "m")
    assert not runner.dynamic and runner._relaxed and runner.batching
    counting = _Counting(runner)
    records = _records(4)
    got = runner.run(Batch(0, records))
    np.testing.assert_array_equal(got["y"], _one_by_one(_relu(1), records, ["y"])["y"])
    assert counting.sizes == [2, 1, 1, 4] and runner.batching and runner._verified


def test_a_fixed_batch_of_one_that_mixes_records_falls_back_to_its_own_shape(caplog) -> None:
    """ReduceMax over the records axis too: stacked records give one row, the check sees it, and the
    session is made again with the declared batch of 1."""
    model = _model(
        [helper.make_node("ReduceMax", ["x"], ["y"], keepdims=1)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])],
    )
    runner = OrtRunner(model, ["y"], RuntimeOptions(), "m")
    assert runner._relaxed and runner.batching
    records = _records(3)
    with caplog.at_level(logging.INFO, logger="pytest_qaccuracy.runtime.ort_runner"):
        got = runner.run(Batch(0, records))
    assert caplog.messages == ["m: the model does not batch; running one record at a time"]
    np.testing.assert_array_equal(got["y"], np.array([[r["x"].max()] for r in records], np.float32))
    assert runner.batching is False
    dim = runner._session.get_inputs()[0].shape[0]
    assert dim == 1, "the session was made again with the declared batch"


def test_a_fixed_batch_of_two_never_stacks() -> None:
    model = _relu(2)
    runner = OrtRunner(model, ["y"], RuntimeOptions(), "m")
    assert not runner.dynamic and not runner._relaxed and not runner.batching
    records = [{"x": np.arange(6, dtype=np.float32).reshape(2, 3) - 2}, {"x": np.ones((2, 3), np.float32)}]
    got = runner.run(Batch(0, records))
    np.testing.assert_array_equal(got["y"], np.concatenate([np.maximum(r["x"], 0) + 1 for r in records]))


def test_runner_failures_name_the_model(monkeypatch) -> None:
    runner = OrtRunner(_relu("N"), ["y"], RuntimeOptions(), "lbl")
    with pytest.raises(ModelError, match=r"^lbl: onnxruntime failed to run \(\[ONNXRuntimeError\].*\)$"):
        runner.run(Batch(0, [{"x": np.zeros((1, 4), np.float32)}]))

    def int4(session, names, feeds):
        raise ModelError("tensor 't' is int4")

    monkeypatch.setattr("pytest_qaccuracy.runtime.ort_runner.fetch", int4)
    with pytest.raises(ModelError, match=r"^lbl: tensor 't' is int4$"):
        runner.run(Batch(0, _records(1)))


def test_with_outputs_adds_each_tensor_once_to_a_copy() -> None:
    model = _relu(1)
    out = _with_outputs(model, ["r", "y", "r"], True)
    assert [o.name for o in out.graph.output] == ["y", "r"]
    assert out.graph.input[0].type.tensor_type.shape.dim[0].dim_param
    assert [o.name for o in model.graph.output] == ["y"]
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1
    kept = _with_outputs(model, ["r"], False)
    assert kept.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1


def test_close() -> None:
    a = np.array([0.0, np.nan, 100.0], np.float32)
    assert _close(a, a.copy())
    assert not _close(a, a[:2])
    assert _close(a, a + np.float32(1e-5) * np.array([0, 0, 100], np.float32) + np.float32(9e-6))
    assert not _close(a, a + np.array([2e-5, 0, 0], np.float32))
    assert not _close(a, a * np.float32(1.0002))
    i = np.array([-128, 0, 127], np.int8)
    assert _close(i, np.array([-127, 1, 126], np.int8))
    assert not _close(i, np.array([-126, 0, 127], np.int8))
    assert _close(np.zeros(0, np.int8), np.zeros(0, np.int8))
    big = np.array([100.0], np.float32)
    assert _close(big, big * np.float32(1 + 5e-5)), "relative 1e-4"
    wide = np.array([2**60], np.int64)
    assert not _close(wide, wide + 2) and not _close(wide + 2, wide), "int64 codes compared exactly"
    assert _close(wide, wide + 1)


def test_batch_units_is_abstract() -> None:
    units = BatchUnits()
    with pytest.raises(NotImplementedError):
        units._run({})
    with pytest.raises(NotImplementedError):
        units._verify(Batch(0, []))


# -- IntegerRunner ----------------------------------------------------------------------------------


def _qdq(batch, last=None) -> onnx.ModelProto:
    """x -> QuantizeLinear (uint8) -> DequantizeLinear -> Relu -> ``last`` (Transpose, if given) -> y."""
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
        helper.make_node("Relu", ["xd"], ["r"]),
        helper.make_node("Transpose", ["r"], ["y"], perm=[1, 0])
        if last
        else helper.make_node("Identity", ["r"], ["y"]),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializers=[
            helper.make_tensor("s", TensorProto.FLOAT, [], [0.05]),
            helper.make_tensor("z", TensorProto.UINT8, [], [100]),
        ],
    )


def _ort(model, records, names):
    return _one_by_one(_with_outputs(model, names, False), records, names)


def test_the_integer_runner_equals_onnxruntime_and_stacks_a_dynamic_batch() -> None:
    from pytest_qaccuracy.backend import IntegerSession
    from pytest_qaccuracy.runtime.integer import IntegerRunner

    model = _qdq("N")
    runner = make_runner(model, ["y", "xq", "y"], RuntimeOptions(threads=1), "int", backend="integer")
    assert isinstance(runner, IntegerRunner) and runner.tensors == ["y", "xq"] and runner.label == "int"
    assert runner.backend == "integer" and runner.capture == "emulated"
    assert runner.scheme_name == IntegerSession(model, scheme="onnxruntime").scheme.name
    assert runner.batching and runner._verified
    records = _records(3)
    got = runner.run(Batch(0, records))
    want = _ort(model, records, ["y", "xq"])
    assert list(got) == ["y", "xq"]
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    assert runner.units(Batch(0, records)) == [Batch(0, records)]


def test_the_integer_runner_checks_a_freed_batch_and_falls_back(caplog) -> None:
    from pytest_qaccuracy.runtime.integer import IntegerRunner

    records = _records(3)
    stacks = IntegerRunner(_qdq(1), ["y"], "onnxruntime", "a")
    assert stacks.batching and not stacks._verified
    got = stacks.run(Batch(0, records))
    np.testing.assert_array_equal(got["y"], _ort(_qdq(1), records, ["y"])["y"])
    assert stacks.batching and stacks._verified

    mixes = IntegerRunner(_qdq(1, last="Transpose"), ["y", "r"], "onnxruntime", "b")
    assert mixes.batching and not mixes._verified
    with caplog.at_level(logging.INFO, logger="pytest_qaccuracy.runtime.integer"):
        got = mixes.run(Batch(0, records))
    assert caplog.messages == ["b: the model does not batch; running one record at a time"]
    assert mixes.batching is False
    want = _ort(_qdq(1, last="Transpose"), records, ["y", "r"])
    np.testing.assert_array_equal(got["r"], want["r"])
    np.testing.assert_array_equal(got["y"], want["y"])  # (3, 1) per record, joined on axis 0


# -- the merged graph's statistics against numpy ----------------------------------------------------

Q_TYPES = {
    np.uint8: TensorProto.UINT8,
    np.int8: TensorProto.INT8,
    np.int16: TensorProto.INT16,
    np.int32: TensorProto.INT32,
}


def _stat_pair(dims, scale, zero_point, opset: int, axis: int | None = 1):
    """fp32: t = x * w, y = Relu(t); quantized: t the same, t_q = clip(round(t / s) + z) cast to the
    zero point's type (the capture), t_d = (t_q - z) * s, y = Relu(t_d). ``x`` is (N, *dims)."""
    rank = len(dims) + 1
    rng = np.random.default_rng(3)
    w = rng.uniform(0.5, 2.0, (1, *dims)).astype(np.float32)
    scale, zero_point = np.asarray(scale, np.float32), np.asarray(zero_point)
    shape = [1] * rank
    if scale.size > 1:
        shape[axis % rank] = scale.size
    info = np.iinfo(zero_point.dtype)
    inits = [
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(scale.reshape(shape), "s"),
        numpy_helper.from_array(zero_point.astype(np.float32).reshape(shape), "zf"),
        numpy_helper.from_array(np.array(info.min, np.float32), "lo"),
        numpy_helper.from_array(np.array(info.max, np.float32), "hi"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", *dims])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", *dims])
    f_graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["t"]), helper.make_node("Relu", ["t"], ["y"])], "f", [x], [y], inits[:1]
    )
    q_nodes = [
        helper.make_node("Mul", ["x", "w"], ["t"]),
        helper.make_node("Div", ["t", "s"], ["ts"]),
        helper.make_node("Round", ["ts"], ["tr"]),
        helper.make_node("Add", ["tr", "zf"], ["tz"]),
        helper.make_node("Clip", ["tz", "lo", "hi"], ["tc"]),
        helper.make_node("Cast", ["tc"], ["t_q"], to=Q_TYPES[zero_point.dtype.type]),
        helper.make_node("Cast", ["t_q"], ["qf"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["qf", "zf"], ["qc"]),
        helper.make_node("Mul", ["qc", "s"], ["t_d"]),
        helper.make_node("Relu", ["t_d"], ["y"]),
    ]
    q_graph = helper.make_graph(q_nodes, "q", [x], [y], inits)
    models = []
    for graph in (f_graph, q_graph):
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 7
        models.append(model)
    return models


ALL_SUMS = frozenset({"ref_sq", "ref_abs", "test_sq", "sq_err", "abs_err"})


@pytest.mark.parametrize(
    "case",
    [
        # per-channel uint8 through DequantizeLinear, every statistic, per-channel bounds
        {"dims": (4, 6, 70), "scale": [0.02, 0.03, 0.05, 0.04], "zp": np.array([128, 120, 130, 100], np.uint8),
         "opset": 13, "fields": ALL_SUMS | {"max_abs_err"}, "spans": True, "steps": True, "cross": True,
         "bounds": "channel"},
        # per-tensor int8 at opset 18 (axes as inputs), extremes of f - q, one range: the If node
        {"dims": (3, 5), "scale": 0.05, "zp": np.int8(3), "opset": 18, "fields": frozenset({"sq_err", "ref_min",
         "ref_max", "max_abs_err"}), "bounds": "tensor"},
        # int16 below opset 13 per channel on the last axis: the Sub/Mul dequantization; rank 2 spans
        {"dims": (6,), "scale": [0.01, 0.02, 0.03, 0.04, 0.05, 0.06], "zp": np.zeros(6, np.int16), "axis": -1,
         "opset": 11, "fields": frozenset({"abs_err", "test_sq"}), "spans": True, "steps": True,
         "check_shapes": False},
        # int32 per tensor at opset 11 (no axes input)
        {"dims": (2, 2, 3), "scale": 0.5, "zp": np.int32(-2), "opset": 11, "fields": frozenset({"ref_abs",
         "max_abs_err", "ref_min", "ref_max"}), "bounds": "tensor", "spans": True},
    ],
    ids=["u8-channel-13", "s8-tensor-18", "s16-channel-11", "s32-tensor-11"],
)  # fmt: skip
def test_reduced_statistics_equal_numpy(case) -> None:
    from pytest_qaccuracy.model.quant_params import QuantParams
    from pytest_qaccuracy.runtime.reduction_graph import CROSS, ReducedRunner, ReductionSpec, _block

    dims, axis, opset = case["dims"], case.get("axis", 1), case["opset"]
    f_model, q_model = _stat_pair(dims, case["scale"], case["zp"], opset, axis)
    scale = np.asarray(case["scale"], np.float32)
    params = QuantParams(scale, np.asarray(case["zp"]), axis if scale.size > 1 else None)
    rank = len(dims) + 1
    bounds = None
    shape = [1] * rank
    if case.get("bounds") == "channel":
        shape[1] = dims[0]
        bounds = (np.linspace(-1.5, -0.5, dims[0]).reshape(shape), np.linspace(0.5, 1.5, dims[0]).reshape(shape))
    elif case.get("bounds") == "tensor":
        bounds = (np.array(-1.0).reshape(shape), np.array(1.0).reshape(shape))
    spec = ReductionSpec(
        "t", "t_q", params, dims, Q_TYPES[np.asarray(case["zp"]).dtype.type], case["fields"],
        steps=case.get("steps", False), bounds=bounds, spans=case.get("spans", False),
        check_shapes=case.get("check_shapes", True), cross=case.get("cross", False),
    )  # fmt: skip
    options = RuntimeOptions(threads=1)
    runner = ReducedRunner(f_model, q_model, ["x"], [spec], ["t", "x"], ["t_q"], options, options, "pair")
    rng = np.random.default_rng(7)
    scales = [0.1, 1.0] if bounds is not None else [1.0, 1.0]  # the first batch stays inside one range
    for start, records in ((0, 3), (3, 2)):
        x = (rng.standard_normal((records, *dims)) * scales[start > 0]).astype(np.float32)
        ref, test, (stats,) = runner.run(Batch(start, [{"x": x[i : i + 1]} for i in range(records)]))
        np.testing.assert_array_equal(ref["x"], x)
        f, q = ref["t"], test["t_q"]
        np.testing.assert_array_equal(f, x * numpy_helper.to_array(f_model.graph.initializer[0]))
        assert q.dtype == np.asarray(case["zp"]).dtype
        deq = params.dequantize(q)
        d = f - deq
        flat = {"f": f.reshape(records, -1).astype(np.float64), "q": deq.reshape(records, -1).astype(np.float64),
                "d": d.reshape(records, -1).astype(np.float64)}  # fmt: skip
        f64, q64, d64 = flat["f"], flat["q"], flat["d"]
        want = {"ref_sq": (f64**2).sum(1), "ref_abs": np.abs(f64).sum(1), "test_sq": (q64**2).sum(1)}
        want |= {"sq_err": (d64**2).sum(1), "abs_err": np.abs(d64).sum(1), CROSS: (f64 * d64).sum(1)}
        order = [n for n in ("ref_sq", "ref_abs", "test_sq", "sq_err", "abs_err") if n in case["fields"]]
        if spec.cross:
            order = [n for n in order if n != "test_sq"] + [CROSS]
        assert spec.sum_fields == tuple(order)
        blocks = int(np.prod(dims)) // _block(dims)
        sums = stats["sums"].reshape(records, len(order), blocks).astype(np.float64).sum(-1)
        for i, name in enumerate(order):
            np.testing.assert_allclose(sums[:, i], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
        expected = set()
        if "abs_err" in case["fields"] and "max_abs_err" in case["fields"]:
            np.testing.assert_array_equal(stats["max_abs"], np.abs(d).reshape(records, -1).max(1))
            expected.add("max_abs")
        elif "max_abs_err" in case["fields"]:
            np.testing.assert_array_equal(stats["max_diff"], d.reshape(records, -1).max(1))
            np.testing.assert_array_equal(stats["min_diff"], d.reshape(records, -1).min(1))
            expected |= {"max_diff", "min_diff"}
        if spec.spans:
            np.testing.assert_array_equal(stats["span_min1"], f.reshape(records, dims[0], -1).min(2))
            np.testing.assert_array_equal(stats["span_max1"], f.reshape(records, dims[0], -1).max(2))
            expected |= {"span_min1", "span_max1"}
            if rank > 2:
                np.testing.assert_array_equal(stats["span_min_rest"], f.min(1))
                np.testing.assert_array_equal(stats["span_max_rest"], f.max(1))
                expected |= {"span_min_rest", "span_max_rest"}
        elif {"ref_min", "ref_max"} & case["fields"]:
            np.testing.assert_array_equal(stats["ref_min"], f.reshape(records, -1).min(1))
            np.testing.assert_array_equal(stats["ref_max"], f.reshape(records, -1).max(1))
            expected |= {"ref_min", "ref_max"}
        if spec.steps:
            step = scale.astype(np.float64).reshape([-1 if i == axis % rank else 1 for i in range(rank)])
            steps = np.abs(f.astype(np.float64) - deq.astype(np.float64)) / step
            np.testing.assert_array_equal(stats["steps"], steps.reshape(records, -1).max(1))
            expected.add("steps")
        if bounds is not None:
            outside = (f < bounds[0]) | (f >= bounds[1])
            counts = outside.reshape(records, -1).sum(1)
            np.testing.assert_array_equal(stats["saturated"], counts)
            assert stats["saturated"].shape == (records,)
            if start == 0 and case.get("bounds") == "tensor":
                assert counts.sum() == 0
            else:
                assert counts.sum() > 0
            expected.add("saturated")
        if spec.check_shapes:
            np.testing.assert_array_equal(stats["qshape"], (records, *dims))
            expected.add("qshape")
        assert set(stats) == expected | {"sums"}
        for name in expected - {"qshape", "span_min1", "span_max1", "span_min_rest", "span_max_rest"}:
            assert stats[name].shape == (records,), name


# -- merging ------------------------------------------------------------------------------------------


def test_rename_graph_prefixes_every_name_but_the_kept_ones_in_subgraphs_too() -> None:
    from pytest_qaccuracy.runtime.reduction_graph import _domain_nodes, _rename_graph

    then = helper.make_graph([helper.make_node("Identity", ["a"], ["b"], name="inner")], "then", [], [
        helper.make_tensor_value_info("b", TensorProto.FLOAT, None)])  # fmt: skip
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["c"], domain="d")], "else", [], [
        helper.make_tensor_value_info("c", TensorProto.FLOAT, None)])  # fmt: skip
    loop = helper.make_graph([helper.make_node("Abs", ["x"], ["e"], domain="d")], "body", [], [])
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="first"),
        helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other),
        helper.make_node("Scan", ["", "x"], ["z"], domain="d", body=loop, num_scan_inputs=1),
    ]
    sparse = helper.make_sparse_tensor(
        helper.make_tensor("sv", TensorProto.FLOAT, [1], [1.0]),
        helper.make_tensor("si", TensorProto.INT64, [1], [0]),
        [2],
    )
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        initializer=[helper.make_tensor("cond", TensorProto.BOOL, [], [True])],
        value_info=[helper.make_tensor_value_info("a", TensorProto.FLOAT, [2])], sparse_initializer=[sparse],
    )  # fmt: skip
    _rename_graph(graph, "p/", {"x"})
    assert [v.name for v in graph.input] == ["x"] and [v.name for v in graph.output] == ["p/y"]
    assert [v.name for v in graph.value_info] == ["p/a"] and [t.name for t in graph.initializer] == ["p/cond"]
    assert (graph.sparse_initializer[0].values.name, graph.sparse_initializer[0].indices.name) == ("p/sv", "p/si")
    assert [(n.name, list(n.input), list(n.output)) for n in graph.node] == [
        ("p/first", ["x"], ["p/a"]), ("", ["p/cond"], ["p/y"]), ("", ["", "x"], ["p/z"])]  # fmt: skip
    branches = {a.name: a.g for a in graph.node[1].attribute}
    assert [(n.name, list(n.input), list(n.output)) for n in branches["then_branch"].node] == [
        ("p/inner", ["p/a"], ["p/b"])]  # fmt: skip
    assert [o.name for o in branches["else_branch"].output] == ["p/c"]
    assert [n.op_type for n in _domain_nodes(graph, "d")] == ["Neg", "Scan", "Abs"]
    assert [n.op_type for n in _domain_nodes(graph, "")] == ["Relu", "If", "Identity"]


def _opset_model(version: int, ops=("Relu",), ir: int = 8, domain_versions=None) -> onnx.ModelProto:
    nodes = [helper.make_node(op, ["x"], [f"y{i}"]) for i, op in enumerate(ops)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [1, 2]) for i in range(len(ops))],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", version)] + [
        helper.make_opsetid(d, v) for d, v in (domain_versions or {}).items()
    ]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = ir
    return model


def test_merged_opsets_take_the_higher_version_where_nothing_changes() -> None:
    from pytest_qaccuracy.runtime.reduction_graph import ReductionUnavailable, merged_opsets, same_opsets

    assert merged_opsets(_opset_model(15, ("Sigmoid",)), _opset_model(17, ("Relu",))) == {"": 17}
    assert merged_opsets(_opset_model(17, ("Relu",)), _opset_model(15, ("Sigmoid",))) == {"": 17}
    assert merged_opsets(_opset_model(13, ("Relu",), domain_versions={"x.y": 1}), _opset_model(13)) == {
        "": 13,
        "x.y": 1,
    }
    with pytest.raises(ReductionUnavailable, match=r"^the models import different versions of 'ai\.onnx': Relu changes "
                       r"between opset 13 and 17$"):  # fmt: skip
        merged_opsets(_opset_model(13, ("Relu",)), _opset_model(17, ("Sigmoid",)))
    with pytest.raises(ReductionUnavailable, match="Relu changes between opset 13 and 17"):
        merged_opsets(_opset_model(17, ("Sigmoid",)), _opset_model(13, ("Relu",)))
    # the lower model is converted, whichever it is
    f, q = same_opsets(_opset_model(13, ("Relu",)), _opset_model(17, ("Sigmoid",)))
    assert [o.version for o in f.opset_import if o.domain in ("", "ai.onnx")] == [17] and q.opset_import[
        0
    ].version == 17
    f, q = same_opsets(_opset_model(17, ("Sigmoid",)), _opset_model(13, ("Relu",)))
    assert [o.version for o in q.opset_import if o.domain in ("", "ai.onnx")] == [17] and f.opset_import[
        0
    ].version == 17
    same = _opset_model(15, ("Sigmoid",))
    assert same_opsets(same, _opset_model(17)) == (same, same_opsets(same, _opset_model(17))[1])
    # a custom domain that differs cannot be converted
    with pytest.raises(ReductionUnavailable, match=r"^the models import different versions of 'x\.y'"):
        g = _opset_model(13, domain_versions={"x.y": 1})
        g.graph.node.append(helper.make_node("Custom", ["x"], ["c"], domain="x.y"))
        same_opsets(g, _opset_model(13, domain_versions={"x.y": 2}))
    # the default domain converted, then the custom domain still differs
    with pytest.raises(ReductionUnavailable, match=r"^the models import different versions of 'ai\.onnx': Relu changes "
                       r"between opset 13 and 17, and onnx cannot convert it \(.+\)$"):  # fmt: skip
        same_opsets(
            _opset_model(17, ("Relu",), domain_versions={"x.y": 2}),
            _with_node(_opset_model(13, ("Relu",), domain_versions={"x.y": 1}), "x.y"),
        )
    # a model without the default domain is never converted
    no_default = _with_node(_opset_model(13, (), domain_versions={"x.y": 1}), "x.y")
    del no_default.opset_import[0]
    with pytest.raises(ReductionUnavailable, match=r"^the models import different versions of 'x\.y': Custom of domain "
                       r"'x\.y' is unknown to onnx at versions 1 and 2$"):  # fmt: skip
        same_opsets(no_default, _opset_model(13, (), domain_versions={"x.y": 2}))


def _with_node(model: onnx.ModelProto, domain: str) -> onnx.ModelProto:
    model.graph.node.append(helper.make_node("Custom", ["x"], ["c"], domain=domain))
    return model


def test_merge_models_shares_inputs_and_functions_and_keeps_the_higher_ir() -> None:
    from pytest_qaccuracy.runtime.reduction_graph import ReductionUnavailable, merge_models

    f, q = _opset_model(13, ("Relu",), ir=3), _opset_model(13, ("Sigmoid",), ir=8)
    w = helper.make_tensor("w", TensorProto.FLOAT, [1], [2.0])
    f.graph.initializer.append(w)
    f.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [1]))  # IR < 4 lists it as an input
    fn = helper.make_function(
        "local", "fn", ["a"], ["b"], [helper.make_node("Neg", ["a"], ["b"])], [helper.make_opsetid("", 13)]
    )
    f.functions.append(fn)
    q.functions.append(fn)
    merged = merge_models(f, q, ["x"])
    assert [v.name for v in merged.graph.input] == ["x", "f/w"] and [t.name for t in merged.graph.initializer] == [
        "f/w"
    ]
    assert [(n.op_type, list(n.input), list(n.output)) for n in merged.graph.node] == [
        ("Relu", ["x"], ["f/y0"]), ("Sigmoid", ["x"], ["q/y0"])]  # fmt: skip
    assert len(merged.graph.output) == 0 and merged.graph.name == "qaccuracy_pair"
    assert merged.ir_version == 8 and merge_models(q, f, ["x"]).ir_version == 8 and len(merged.functions) == 1
    assert merged.producer_name == "pytest-qaccuracy"
    other = helper.make_function(
        "local", "fn", ["a"], ["b"], [helper.make_node("Abs", ["a"], ["b"])], [helper.make_opsetid("", 13)]
    )
    q.functions[0].CopyFrom(other)
    with pytest.raises(ReductionUnavailable, match=r"^both models define a different local function local:fn$"):
        merge_models(f, q, ["x"])


def test_the_builder_names_constants_and_reductions_per_opset() -> None:
    from pytest_qaccuracy.runtime.reduction_graph import STAT_PREFIX, _Builder

    graph = onnx.GraphProto()
    b = _Builder(graph, 13, ["x"])
    assert b.scoped("f/", "x") == "x" and b.scoped("f/", "t") == "f/t"
    assert b.name("a") == f"{STAT_PREFIX}1/a" and b.name("b") == f"{STAT_PREFIX}2/b"
    first = b.ints([0, 1])
    assert b.ints((0, 1)) == first and b.ints([1]) != first
    sub = _Builder(onnx.GraphProto(), 13, ["x"], parent=b)
    assert sub.ints([0, 1]) == first and sub.name("c") == f"{STAT_PREFIX}5/c"
    assert len(sub.graph.initializer) == 0
    summed = b.reduce("ReduceSum", "t", [1], "s")
    maxed = b.reduce("ReduceMax", "t", [1, 2], "m", keepdims=1)
    nodes = {n.output[0]: n for n in graph.node}
    assert list(nodes[summed].input) == ["t", b.ints([1])]
    assert list(nodes[maxed].input) == ["t"]
    attrs = {a.name: helper.get_attribute_value(a) for a in nodes[maxed].attribute}
    assert attrs == {"axes": [1, 2], "keepdims": 1}
    assert helper.get_attribute_value(nodes[summed].attribute[0]) == 0
    old = _Builder(onnx.GraphProto(), 12, [])
    node = old.graph.node
    old.reduce("ReduceSum", "t", [1], "s")
    assert list(node[0].input) == ["t"]
    new = _Builder(onnx.GraphProto(), 18, [])
    new.reduce("ReduceMin", "t", [1], "s")
    assert len(new.graph.node[0].input) == 2
    cast = b.cast("t", TensorProto.DOUBLE)
    assert helper.get_attribute_value(nodes.get(cast) or graph.node[-1].attribute[0]) == TensorProto.DOUBLE


def test_an_opset_before_9_is_refused() -> None:
    from pytest_qaccuracy.runtime.reduction_graph import ReductionUnavailable, build_reduction_model

    with pytest.raises(ReductionUnavailable, match=r"^opset 8 is older than the reduction nodes need \(9\)$"):
        build_reduction_model(_opset_model(8), _opset_model(8), ["x"], [], [])
    model = build_reduction_model(
        _opset_model(9), _opset_model(9), ["x"], [], [("f/", "y0"), ("q/", "y0"), ("f/", "x")]
    )
    assert [o.name for o in model.graph.output] == ["f/y0", "q/y0", "x"]


def test_broadcast() -> None:
    from pytest_qaccuracy.runtime.reduction_graph import _broadcast

    assert _broadcast(np.array([2.0]), 4, 1).shape == ()
    assert _broadcast(np.arange(3.0), 4, None).shape == (1, 3, 1, 1)
    assert _broadcast(np.arange(3.0), 4, -1).shape == (1, 1, 1, 3)
    assert _broadcast(np.arange(3.0), 4, 2).shape == (1, 1, 3, 1)


# -- ReducedRunner ----------------------------------------------------------------------------------


def _spec(dims, **kwargs):
    from pytest_qaccuracy.model.quant_params import QuantParams
    from pytest_qaccuracy.runtime.reduction_graph import ReductionSpec

    params = QuantParams(np.array(0.05, np.float32), np.array(3, np.int8))
    return ReductionSpec("t", "t_q", params, dims, TensorProto.INT8, frozenset({"sq_err"}), **kwargs)


def _fix_batch(model: onnx.ModelProto, size: int) -> onnx.ModelProto:
    for value in [*model.graph.input, *model.graph.output]:
        value.type.tensor_type.shape.dim[0].dim_value = size
    return model


def test_a_fixed_batch_runs_record_by_record_and_adds_up_the_shapes() -> None:
    from pytest_qaccuracy.runtime.reduction_graph import ReducedRunner

    f, q = (_fix_batch(m, 2) for m in _stat_pair((3,), 0.05, np.int8(3), 13))
    options = RuntimeOptions(threads=1)
    runner = ReducedRunner(f, q, ["x"], [_spec((3,))], ["t"], ["t_q"], options, options, "pair")
    assert not runner.dynamic and not runner._relaxed and not runner.batching
    rng = np.random.default_rng(1)
    records = [{"x": rng.standard_normal((2, 3)).astype(np.float32)} for _ in range(3)]
    ref, test, (stats,) = runner.run(Batch(0, records))
    np.testing.assert_array_equal(ref["t"][:2], records[0]["x"] * numpy_helper.to_array(f.graph.initializer[0]))
    assert ref["t"].shape == (6, 3) and test["t_q"].shape == (6, 3) and stats["sums"].shape == (6, 1)
    assert stats["qshape"].tolist() == [6, 3]


def test_a_dynamic_pair_runs_its_first_batch_once() -> None:
    from pytest_qaccuracy.runtime.reduction_graph import ReducedRunner

    f, q = _stat_pair((3,), 0.05, np.int8(3), 13)
    options = RuntimeOptions(threads=1)
    runner = ReducedRunner(f, q, ["x"], [_spec((3,))], [], ["t_q"], options, options, "pair")
    counting = _Counting(runner)
    records = _records(4)
    _, test, _ = runner.run(Batch(0, records))
    assert counting.sizes == [4] and runner.batching and runner._verified
    runner.run(Batch(4, records[:3]))
    assert counting.sizes == [4, 3] and test["t_q"].shape == (4, 3)


def test_reduced_runner_failures_say_why(monkeypatch) -> None:
    from pytest_qaccuracy.runtime import reduction_graph
    from pytest_qaccuracy.runtime.reduction_graph import ReducedRunner, ReductionUnavailable

    f, q = _stat_pair((3,), 0.05, np.int8(3), 13)
    options = RuntimeOptions(threads=1)
    runner = ReducedRunner(f, q, ["x"], [_spec((3,))], [], [], options, options, "lbl")
    with pytest.raises(
        ModelError, match=r"^lbl: onnxruntime failed to run the merged graph \(\[ONNXRuntimeError\].+\)$"
    ):
        runner.run(Batch(0, [{"x": np.zeros((1, 4), np.float32)}]))
    with monkeypatch.context() as m:
        m.setattr(reduction_graph, "fetch", lambda *a: (_ for _ in ()).throw(ModelError("tensor 't' is int4")))
        with pytest.raises(ModelError, match=r"^lbl: tensor 't' is int4$"):
            runner.run(Batch(0, _records(1)))
    broken = _stat_pair((3,), 0.05, np.int8(3), 13)[1]
    broken.graph.node[2].op_type = "NoSuchOp"
    with pytest.raises(
        ReductionUnavailable, match=r"^onnxruntime cannot save the optimized quantized model \(.*NoSuchOp"
    ):
        ReducedRunner(f, broken, ["x"], [_spec((3,))], [], [], options, options, "lbl")
    with pytest.raises(ReductionUnavailable, match=r"^onnxruntime cannot save the optimized fp32 model \("):
        ReducedRunner(broken, q, ["x"], [_spec((3,))], [], [], options, options, "lbl")
    with monkeypatch.context() as m:
        m.setattr(reduction_graph, "build_reduction_model", lambda *a: 1 / 0)
        with pytest.raises(
            ReductionUnavailable, match=r"^the merged graph cannot be built \(ZeroDivisionError: division by zero\)$"
        ):
            ReducedRunner(f, q, ["x"], [_spec((3,))], [], [], options, options, "lbl")
    make = reduction_graph.make_session

    def refuse_merged(model, **kwargs):
        if kwargs.get("in_node_order"):
            raise RuntimeError("refused\nstack")
        return make(model, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(reduction_graph, "make_session", refuse_merged)
        with pytest.raises(ReductionUnavailable, match=r"^onnxruntime cannot load the merged graph \(refused\)$"):
            ReducedRunner(f, q, ["x"], [_spec((3,))], [], [], options, options, "lbl")


def test_the_merged_session_takes_the_fp32_options_unoptimized_in_node_order(monkeypatch) -> None:
    from pytest_qaccuracy.runtime import reduction_graph
    from pytest_qaccuracy.runtime.reduction_graph import ReducedRunner

    calls = []
    make = reduction_graph.make_session

    def kept(model, **kwargs):
        calls.append({k: v for k, v in kwargs.items() if k != "optimized_model_path"})
        return make(model, **kwargs)

    monkeypatch.setattr(reduction_graph, "make_session", kept)
    monkeypatch.setattr(reduction_graph, "spin_during_run", lambda: {"spin": "1", "both": "spin"})
    f, q = _stat_pair((3,), 0.05, np.int8(3), 13)
    options = RuntimeOptions(threads=1, optimization="basic", session_config={"both": "mine"})
    q_options = RuntimeOptions(threads=2, optimization="disable")
    ReducedRunner(f, q, ["x"], [_spec((3,))], [], [], options, q_options, "lbl")
    base = {"providers": ("CPUExecutionProvider",)}
    assert calls == [
        {**base, "threads": 1, "optimization": "basic", "config": {"both": "mine"}},
        {**base, "threads": 2, "optimization": "disable", "config": {}},
        {**base, "threads": 1, "optimization": "disable", "config": {"spin": "1", "both": "mine"},
         "in_node_order": True, "mem_pattern": False},
    ]  # fmt: skip


def test_units_of_a_dynamic_runner_check_two_stacked_records_only() -> None:
    """A caller that asks for the units first (feeding one model's tensors to another): a dynamic model
    is checked by one stacked run of two records, without single runs, if that run succeeds."""
    runner = OrtRunner(_relu("N"), ["y"], RuntimeOptions(), "m")
    counting = _Counting(runner)
    records = _records(3)
    assert runner.units(Batch(2, records)) == [Batch(2, records)]
    assert counting.sizes == [2] and runner._verified and runner.batching


def test_units_of_a_dynamic_runner_that_fails_stacked_are_single_records() -> None:
    model = _one_record_reshape()
    runner = OrtRunner(model, ["y"], RuntimeOptions(), "m")
    session = runner._session
    counting = _Counting(runner)
    records = _records(3)
    assert runner.units(Batch(0, records)) == [Batch(i, [r]) for i, r in enumerate(records)]
    assert counting.sizes == [2, 1, 1] and runner.batching is False and runner._session is counting
    assert counting.inner is session


def test_the_integer_runner_runs_records_alone_when_stacked_ones_fail(caplog) -> None:
    from pytest_qaccuracy.runtime.integer import IntegerRunner

    runner = IntegerRunner(_qdq(1), ["y"], "onnxruntime", "c")
    run, sizes = runner.session.run, []

    def refuse_stacked(names, feeds):
        sizes.append(len(feeds["x"]))
        if len(feeds["x"]) > 1:
            raise InputError("stacked records refused")
        return run(names, feeds)

    runner.session.run = refuse_stacked
    records = _records(3)
    with caplog.at_level(logging.INFO, logger="pytest_qaccuracy.runtime.integer"):
        got = runner.run(Batch(0, records))
    assert caplog.messages == ["c: the model does not batch; running one record at a time"]
    assert runner.batching is False
    assert sizes == [2, 1, 1, 1, 1, 1]
    np.testing.assert_array_equal(got["y"], _ort(_qdq(1), records, ["y"])["y"])


def test_the_integer_runner_takes_its_scheme_and_threads() -> None:
    from pytest_qaccuracy.runtime.integer import IntegerRunner

    runner = make_runner(_qdq("N"), ["y"], RuntimeOptions(threads=1), "t", backend="integer", scheme="tflite")
    assert runner.scheme_name == "tflite" and runner.session.threads == 1
    assert IntegerRunner(_qdq("N"), ["y"], "onnxruntime", "t").session.threads == 0


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
def test_the_integer_runner_keeps_nan_records_stacked_and_joins_two_single_runs() -> None:
    """A requested input with NaN in it is the same stacked as alone; a model that mixes its records
    (y - max over the records) runs a batch of two as two runs, joined."""
    from pytest_qaccuracy.runtime.integer import IntegerRunner

    records = _records(2)
    records[1]["x"][0, 1] = np.nan
    nan = IntegerRunner(_qdq(1), ["x", "y"], "onnxruntime", "n")
    got = nan.run(Batch(0, records))
    assert nan.batching is True
    np.testing.assert_array_equal(got["x"], np.concatenate([r["x"] for r in records]))

    mixing = _qdq(1)
    mixing.graph.node[-1].CopyFrom(helper.make_node("ReduceMax", ["r"], ["m"], axes=[0], keepdims=1))
    mixing.graph.node.append(helper.make_node("Sub", ["r", "m"], ["y"]))
    runner = IntegerRunner(mixing, ["y"], "onnxruntime", "m")
    got = runner.run(Batch(0, _records(2, seed=4)))
    assert runner.batching is False
    np.testing.assert_array_equal(got["y"], _ort(mixing, _records(2, seed=4), ["y"])["y"])  # zeros: one record each


def _structure(model: onnx.ModelProto) -> list[str]:
    """The reduction nodes of a merged graph as ``op:hint`` (subgraphs' nodes indented by ``>``)."""
    from pytest_qaccuracy.runtime.reduction_graph import STAT_PREFIX

    def walk(graph, depth):
        for node in graph.node:
            if node.name.startswith(STAT_PREFIX):
                ints = (onnx.AttributeProto.INT, onnx.AttributeProto.INTS)
                attrs = ",".join(f"{a.name}={helper.get_attribute_value(a)}" for a in node.attribute if a.type in ints)
                yield ">" * depth + f"{node.op_type}:{node.name.split('/', 2)[2]}" + (f"[{attrs}]" if attrs else "")
            for a in node.attribute:
                if a.HasField("g"):
                    yield ">" * (depth + 1) + "graph:" + a.g.name.split("_", 2)[2]
                    yield from walk(a.g, depth + 1)

    return list(walk(model.graph, 0))


def test_the_saturation_count_runs_only_in_batches_that_leave_the_range_where_it_can() -> None:
    """One range, float32-exact counts, opset 11 and extremes already reduced: an If node around the
    count; otherwise (a range per channel, a record of 2^24 elements or more, no extremes) the count
    always runs, in int64 counts from 2^24 elements."""
    from pytest_qaccuracy.runtime.reduction_graph import build_reduction_model

    f, q = _stat_pair((3,), 0.05, np.int8(3), 13)

    def nodes(dims, fields, bounds_size=1, opset_=13, spans=False):
        low = np.full(bounds_size, -1.0).reshape([1, bounds_size] + [1] * (len(dims) - 1))
        spec = _spec(dims, bounds=(low, -low), spans=spans)
        spec.fields = frozenset(fields)
        for m in (f, q):
            m.opset_import[0].version = opset_
        return [n for n in _structure(build_reduction_model(f, q, ["x"], [spec], [])) if not n.startswith(">")]

    count = ["Less:below", "Greater:above", "Or:outside", "Cast:cast[to=1]", "ReduceSum:saturated[keepdims=0]"]
    guarded = ["ReduceMin:batch_min[keepdims=0]", "Less:batch_below", "ReduceMax:batch_max[keepdims=0]",
               "Greater:batch_above", "Or:batch_outside", "If:saturated"]  # fmt: skip
    assert nodes((3,), {"ref_min", "ref_max"})[-6:] == guarded
    spec = _spec((3,), bounds=(-np.ones((1, 1)), np.ones((1, 1))))
    spec.fields = frozenset({"ref_min", "ref_max"})
    model = build_reduction_model(f, q, ["x"], [spec], [])
    branches = [n for n in _structure(model) if n.startswith(">")]
    made = [o for n in model.graph.node for o in n.output] + [t.name for t in model.graph.initializer]
    for node in model.graph.node:
        for a in node.attribute:
            if a.HasField("g"):
                assert a.g.name.startswith("qaccuracy_") and "/" not in a.g.name
                made += [o for n in a.g.node for o in n.output] + [t.name for t in a.g.initializer]
    assert len(made) == len(set(made)), "every name made once, in the graph and its branches"
    hints = [t.name.split("/", 2)[2] for t in model.graph.initializer if t.name.startswith("qaccuracy/")]
    assert sorted(hints) == ["high", "ints", "ints", "ints", "low", "scale", "zero_point"]
    assert branches == [
        ">graph:branch",
        ">Shape:shape",
        ">Slice:records",
        ">ConstantOfShape:zeros",
        ">graph:branch",
        *[">" + n for n in count],
    ]  # else, then
    assert nodes((3,), {"ref_min", "ref_max"}, opset_=11)[-6:] == guarded
    spanned = nodes((3, 2), {"sq_err"}, spans=True)
    assert spanned[-6:] == guarded and "ReduceMin:span_min" in "".join(spanned)
    for plain in (nodes((3,), {"sq_err"}), nodes((3,), {"ref_min", "ref_max"}, bounds_size=3),
                  nodes((3,), {"ref_min", "ref_max"}, opset_=10)):  # fmt: skip
        assert "If:saturated" not in plain and plain[-5:-1] == count[:4]
    big = nodes((1, 4096, 4096), {"ref_min", "ref_max"})
    assert "If:saturated" not in big and "Cast:cast[to=7]" in big
    below = nodes((1, 4096, 4095), {"ref_min", "ref_max"})
    assert below[-6:] == guarded


def test_the_reduction_nodes_of_two_specs() -> None:
    """The merged graph's reduction nodes in their run order, by op and name (a name says what a node
    computes, for whoever reads the graph or onnxruntime's message about one of its nodes)."""
    from pytest_qaccuracy.model.quant_params import QuantParams
    from pytest_qaccuracy.runtime.reduction_graph import ReductionSpec, build_reduction_model

    scale, zp = np.array([0.02, 0.03, 0.05, 0.04], np.float32), np.array([128, 120, 130, 100], np.uint8)
    f, q = _stat_pair((4, 6, 70), scale, zp, 13)
    low = np.linspace(-1.5, -0.5, 4).reshape(1, 4, 1, 1)
    fields = ALL_SUMS | {"max_abs_err"}
    spec = ReductionSpec("t", "t_q", QuantParams(scale, zp, 1), (4, 6, 70), TensorProto.UINT8, fields,
                         steps=True, bounds=(low, -low), spans=True, cross=True)  # fmt: skip
    summed = ["ReduceSum:sum[keepdims=0]"]
    assert _structure(build_reduction_model(f, q, ["x"], [spec], [])) == [
        "Shape:shape", "DequantizeLinear:dequantized[axis=1]", "Reshape:blocks", "Mul:square", *summed, "Abs:abs",
        *summed, "Reshape:blocks", "Sub:diff", "Mul:square", *summed, "Abs:abs", *summed, "Mul:cross", *summed,
        "Concat:sums[axis=1]", "ReduceMax:max_abs[axes=[1, 2],keepdims=0]",
        "ReduceMin:span_min[axes=[2, 3],keepdims=0]", "ReduceMin:span_min_rest[axes=[1],keepdims=0]",
        "ReduceMax:span_max[axes=[2, 3],keepdims=0]", "ReduceMax:span_max_rest[axes=[1],keepdims=0]",
        "Cast:cast[to=11]", "Cast:cast[to=11]", "Sub:diff64", "Abs:abs", "Div:steps",
        "ReduceMax:steps_max[axes=[1, 2, 3],keepdims=0]",
        "Less:below", "Greater:above", "Or:outside", "Cast:cast[to=1]", "ReduceSum:saturated[keepdims=0]",
    ]  # fmt: skip
    f, q = _stat_pair((3, 5), 0.05, np.int16(3), 11)
    spec = ReductionSpec("t", "t_q", QuantParams(np.array(0.05, np.float32), np.array(3, np.int16)), (3, 5),
                         TensorProto.INT16, frozenset({"sq_err", "ref_min", "ref_max", "max_abs_err"}))  # fmt: skip
    assert _structure(build_reduction_model(f, q, ["x"], [spec], [])) == [
        "Shape:shape", "Cast:cast[to=1]", "Sub:centred", "Mul:dequantized", "Reshape:blocks", "Reshape:blocks",
        "Sub:diff", "Mul:square", "ReduceSum:sum[axes=[2],keepdims=0]", "ReduceMax:max[axes=[1, 2],keepdims=0]",
        "ReduceMin:min[axes=[1, 2],keepdims=0]", "ReduceMin:min[axes=[1, 2],keepdims=0]",
        "ReduceMax:max[axes=[1, 2],keepdims=0]",
    ]  # fmt: skip


def test_same_is_close() -> None:
    from pytest_qaccuracy.runtime.reduction_graph import _same

    a = np.array([1.0, 2.0], np.float32)
    assert _same(a, a.copy()) and _same(a, a + np.float32(1e-6))
    assert not _same(a, a + 1) and not _same(a, a[:1])


def test_units_of_a_relaxed_pair_check_the_first_batch() -> None:
    from pytest_qaccuracy.runtime.reduction_graph import ReducedRunner

    f, q = (_fix_batch(m, 1) for m in _stat_pair((3,), 0.05, np.int8(3), 13))
    options = RuntimeOptions(threads=1)
    runner = ReducedRunner(f, q, ["x"], [_spec((3,))], [], [], options, options, "pair")
    assert runner._relaxed and runner.batching and not runner._verified
    counting = _Counting(runner)
    records = _records(3)
    assert runner.units(Batch(0, records)) == [Batch(0, records)]
    assert counting.sizes == [3, 1] and runner._verified and runner.batching


def test_same_meaning_reads_each_domains_schemas() -> None:
    from pytest_qaccuracy.runtime.reduction_graph import ReductionUnavailable, _domain_nodes, merged_opsets

    ml = helper.make_node("LabelEncoder", ["x"], ["z"], domain="ai.onnx.ml")
    f, q = _opset_model(13, domain_versions={"ai.onnx.ml": 1}), _opset_model(13, domain_versions={"ai.onnx.ml": 2})
    f.graph.node.append(ml)
    with pytest.raises(ReductionUnavailable, match=r"^the models import different versions of 'ai\.onnx\.ml': "
                       r"LabelEncoder changes between opset 1 and 2$"):  # fmt: skip
        merged_opsets(f, q)
    with pytest.raises(ReductionUnavailable, match=r"LabelEncoder changes between opset 1 and 2$"):
        merged_opsets(q, f)  # the lower model's ops decide, whichever comes first
    q.graph.node.append(ml)
    assert merged_opsets(q, _opset_model(13, domain_versions={"ai.onnx.ml": 1})) == {"": 13, "ai.onnx.ml": 2}
    unknown = _opset_model(13, ())
    unknown.graph.node.append(helper.make_node("NoSuchOp", ["x"], ["z"]))
    with pytest.raises(ReductionUnavailable, match=r"^the models import different versions of 'ai\.onnx': NoSuchOp of "
                       r"domain 'ai\.onnx' is unknown to onnx at versions 13 and 17$"):  # fmt: skip
        merged_opsets(unknown, _opset_model(17))
    inner = [helper.make_graph([helper.make_node("Neg", ["x"], ["n"], domain="d")], f"b{i}", [], []) for i in range(2)]
    custom = helper.make_node("Custom", ["x"], ["c"], domain="e", bodies=inner)
    graph = helper.make_graph([custom], "g", [], [])
    assert [n.op_type for n in _domain_nodes(graph, "d")] == ["Neg", "Neg"]
    assert [n.op_type for n in _domain_nodes(graph, "e")] == ["Custom"]


def test_a_value_on_a_bound_counts_as_outside_only_at_the_top() -> None:
    """``saturated`` counts ``f < low`` or ``f >= high``: exactly ``high`` is outside, exactly ``low`` inside."""
    from pytest_qaccuracy.runtime.reduction_graph import ReducedRunner

    f, q = _stat_pair((4,), 0.05, np.int8(3), 13)
    for model in (f, q):
        model.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.ones((1, 4), np.float32), "w"))
    below = np.nextafter(np.float32(-1), np.float32(-2))
    x = np.array([[-1.0, 1.0, 0.5, 0.0], [below, np.nextafter(np.float32(1), np.float32(0)), 2.0, -3.0]], np.float32)
    options = RuntimeOptions(threads=1)
    for fields in ({"sq_err"}, {"ref_min", "ref_max"}):  # the count alone, and guarded by the extremes
        spec = _spec((4,), bounds=(np.full((1, 1), -1.0), np.full((1, 1), 1.0)))
        spec.fields = frozenset(fields)
        runner = ReducedRunner(f, q, ["x"], [spec], ["t"], [], options, options, "pair")
        ref, _, (stats,) = runner.run(Batch(0, [{"x": x[:1]}, {"x": x[1:]}]))
        np.testing.assert_array_equal(ref["t"], x)
        assert stats["saturated"].tolist() == [1, 3]


def test_float32_at_least_rounds_up_only_where_float32_falls_below() -> None:
    from pytest_qaccuracy.runtime.reduction_graph import float32_at_least

    values = np.array([0.7, -0.7, 0.5, -2.0, 3.5e38])
    got = float32_at_least(values)
    assert got.dtype == np.float32
    want = [np.nextafter(np.float32(0.7), np.float32(1)), np.float32(-0.7), 0.5, -2.0, np.inf]
    assert got.tolist() == [float(w) for w in want]


def test_the_dequantization_nodes_per_opset_and_type() -> None:
    """DequantizeLinear where the opset has it for the parameters (per tensor from 10, per channel from
    13) and the zero point has the codes' 8-bit type; else (q - zero point) * scale in float32."""
    from pytest_qaccuracy.model.quant_params import QuantParams
    from pytest_qaccuracy.runtime.reduction_graph import STAT_PREFIX, _Builder, _dequantize

    def built(opset, scale, zp, q_type, axis=None):
        b = _Builder(onnx.GraphProto(), opset, [])
        _dequantize(b, "q", QuantParams(np.asarray(scale, np.float32), np.asarray(zp), axis), 3, q_type)
        nodes = [f"{n.op_type}{[helper.get_attribute_value(a) for a in n.attribute]}" for n in b.graph.node]
        consts = {t.name.split("/", 2)[2]: numpy_helper.to_array(t) for t in b.graph.initializer}
        assert all(t.name.startswith(STAT_PREFIX) for t in b.graph.initializer)
        return nodes, consts

    nodes, consts = built(10, 0.5, np.int8(3), TensorProto.INT8)
    assert nodes == ["DequantizeLinear[]"] and consts["scale"].shape == () and consts["zero_point"].dtype == np.int8
    assert built(13, [0.5], np.array([3], np.uint8), TensorProto.UINT8)[0] == ["DequantizeLinear[]"]
    nodes, consts = built(13, [0.5, 0.25], np.array([3, 4], np.uint8), TensorProto.UINT8, axis=-1)
    assert nodes == ["DequantizeLinear[2]"] and consts["scale"].shape == (2,) and consts["zero_point"].shape == (2,)
    assert built(13, [0.5, 0.25], np.array([3, 4], np.uint8), TensorProto.UINT8)[0] == ["DequantizeLinear[1]"]
    mul = ["Cast[1]", "Sub[]", "Mul[]"]
    nodes, consts = built(12, [0.5, 0.25], np.array([3, 4], np.uint8), TensorProto.UINT8, axis=1)
    assert nodes == mul and consts["scale"].shape == (1, 2, 1) and consts["zero_point"].dtype == np.float32
    assert built(9, 0.5, np.int8(3), TensorProto.INT8)[0] == mul
    assert built(13, 0.5, np.uint8(3), TensorProto.INT8)[0] == mul  # the zero point's type is not the codes'
    assert built(13, 0.5, np.int16(3), TensorProto.INT16)[0] == mul


def test_rank_2_spans_are_the_tensor_itself() -> None:
    from pytest_qaccuracy.runtime.reduction_graph import _Builder, _span_nodes

    b = _Builder(onnx.GraphProto(), 13, [])
    out: dict[str, str] = {}
    _span_nodes(b, "ReduceMin", "f", (5,), out)
    assert [(n.op_type, n.name.split("/", 2)[2]) for n in b.graph.node] == [("Identity", "span_min")]
    assert list(out) == ["span_min1"]


def test_a_relaxed_pair_whose_records_mix_runs_them_one_at_a_time_at_their_own_batch() -> None:
    """fp32 and quantized y = t + t[0]: stacked, every record's y gets the first record's t; the last
    record's own run says so, and the pair runs again at its declared batch of 1."""
    from pytest_qaccuracy.runtime.reduction_graph import ReducedRunner

    f, q = (_fix_batch(m, 1) for m in _stat_pair((3,), 0.05, np.int8(3), 13))
    for model in (f, q):
        model.graph.initializer.append(numpy_helper.from_array(np.array([0], np.int64), "first"))
        relu = model.graph.node[-1]
        source = relu.input[0]
        model.graph.node.remove(relu)
        model.graph.node.append(helper.make_node("Gather", [source, "first"], ["t0"], axis=0))
        model.graph.node.append(helper.make_node("Add", [source, "t0"], ["y"]))
    options = RuntimeOptions(threads=1)
    runner = ReducedRunner(f, q, ["x"], [_spec((3,))], ["y"], ["y", "x"], options, options, "pair")
    counting = _Counting(runner)
    records = _records(3)
    ref, test, _ = runner.run(Batch(0, records))
    assert counting.sizes == [3, 1] and runner.batching is False and runner._session is not counting
    assert runner._session.get_inputs()[0].shape[0] == 1, "made again at the declared batch"
    x = np.concatenate([r["x"] for r in records])
    np.testing.assert_array_equal(test["x"], x)
    np.testing.assert_array_equal(ref["y"], 2 * x * numpy_helper.to_array(f.graph.initializer[0]))


def test_a_relaxed_pair_checks_its_first_batch_of_two_once_and_a_single_record_not_at_all() -> None:
    from pytest_qaccuracy.runtime.reduction_graph import ReducedRunner

    f, q = (_fix_batch(m, 1) for m in _stat_pair((3,), 0.05, np.int8(3), 13))
    options = RuntimeOptions(threads=1)
    runner = ReducedRunner(f, q, ["x"], [_spec((3,))], [], [], options, options, "pair")
    counting = _Counting(runner)
    records = _records(3)
    runner.run(Batch(0, records[:1]))
    assert counting.sizes == [1] and not runner._verified
    runner.run(Batch(1, records[1:]))
    assert counting.sizes == [1, 2, 1] and runner._verified and runner.batching
