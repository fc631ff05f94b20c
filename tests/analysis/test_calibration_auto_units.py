"""``auto``'s steps one by one (``analysis/calibration/auto.py``), on hand-made statistics, stand-in
sessions and evaluators: every expected value is worked out here from the documented rules
(docs/calibration.md, "auto"), not read from the code under test."""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization.quant_utils import compute_scale_zp

from pytest_qaccuracy.analysis.calibration import auto as A
from pytest_qaccuracy.analysis.calibration import candidates as C
from pytest_qaccuracy.analysis.calibration.observers import ExtremaObserver
from pytest_qaccuracy.analysis.calibration.options import CalibrationResult
from pytest_qaccuracy.analysis.calibration.probe import ProbeEntry
from pytest_qaccuracy.data.progress import reporting
from pytest_qaccuracy.errors import InputError, ModelError
from pytest_qaccuracy.runtime import RuntimeOptions
from tests.progress_recorders import CallRecorder

# --- Choice ------------------------------------------------------------------------------------


def test_choice_sqnr_is_minus_ten_log10_of_the_error_and_infinite_without_error():
    assert A.Choice("a", 0.1).sqnr_db == pytest.approx(10.0)
    assert A.Choice("a", 0.001).sqnr_db == pytest.approx(30.0)
    assert A.Choice("a", 2.0).sqnr_db == pytest.approx(-3.0103, abs=1e-4)
    assert A.Choice("a", 0.0).sqnr_db == math.inf
    assert A.Choice("a", -1e-300).sqnr_db == math.inf  # never the log of a negative
    assert isinstance(A.Choice("a", 0.5).sqnr_db, float)


# --- the statistics passes ---------------------------------------------------------------------


def _passes(batches: list[dict[str, np.ndarray]]):
    """``passes`` as the calibrator gives it: every call yields (values, record count) per batch."""

    def passes():
        for values in batches:
            yield values, len(next(iter(values.values())))

    return passes


def test_extrema_pass_keeps_global_and_per_record_extrema_and_the_smallest_magnitude():
    a1 = np.array([[[-2.0, 3.0]], [[0.5, 1.5]]], np.float32)  # two records
    a2 = np.array([[[np.nan, np.nan]], [[-4.0, -0.25]], [[1.0, 7.0]]], np.float32)  # an all-NaN record
    b1 = np.array([[[5.0, 6.0]], [[2.0, 9.0]]], np.float32)  # positive: min |x| is the least min
    b2 = np.array([[[-3.0, -1.0]], [[-8.0, -2.5]], [[3.0, 4.0]]], np.float32)
    batches = [{"a": a1, "b": b1}, {"a": a2, "b": b2}]
    progress = CallRecorder()
    with reporting(progress):
        got = A.extrema_pass(_passes(batches), ["a", "b"], 5)
    assert got.observed == {"a": (-4.0, 7.0), "b": (-8.0, 9.0)}
    assert list(got.per_record["a"].mins) == [-2.0, 0.5, -4.0, 1.0]  # the NaN record is left out
    assert list(got.per_record["a"].maxs) == [3.0, 1.5, -0.25, 7.0]
    assert list(got.per_record["b"].mins) == [5.0, 2.0, -3.0, -8.0, 3.0]
    assert got.smallest_magnitude == {"a": 0.25, "b": 1.0}
    assert progress.calls == [("start", ("calibrate", 5)), ("advance", 2), ("advance", 3), ("finish", None)]


def test_extrema_pass_smallest_magnitude_of_a_mixed_sign_batch_is_the_least_absolute_value():
    x = np.array([[[-3.0, 0.125, 2.0]], [[-0.0625, 4.0, -5.0]]], np.float32)
    got = A.extrema_pass(_passes([{"x": x}]), ["x"], 2)
    assert got.smallest_magnitude == {"x": 0.0625}


def test_extrema_pass_names_the_tensors_never_finite_five_at_most():
    good = np.ones((2, 1, 3), np.float32)
    nan = np.full((2, 1, 3), np.nan, np.float32)
    names = ["ok", "n1", "n2", "n3", "n4", "n5", "n6"]
    batch = {n: (good if n == "ok" else nan) for n in names}
    with pytest.raises(InputError) as info:
        A.extrema_pass(_passes([batch]), names, 2)
    assert str(info.value) == (
        "tensor(s) ['n1', 'n2', 'n3', 'n4', 'n5'] held no finite value on any record; cannot calibrate them"
    )


def _extrema(values: Mapping[str, np.ndarray]) -> A.Extrema:
    """The first pass's answer, worked out here: whole-tensor extrema and min |x|."""
    observed = {n: (float(v.min()), float(v.max())) for n, v in values.items()}
    per_record = {}
    for n, v in values.items():
        per_record[n] = ExtremaObserver()
        flat = v.reshape(len(v), -1).astype(np.float64)
        per_record[n].update(flat.min(axis=1), flat.max(axis=1))
    smallest = {n: float(np.abs(v).min()) for n, v in values.items()}
    return A.Extrema(observed, per_record, smallest)


def _histogram(values: np.ndarray, bound: float, bins: int) -> np.ndarray:
    """Counts of [-bound, bound] in ``bins`` equal bins (values clipped in), by np.histogram."""
    return np.histogram(np.clip(values.astype(np.float64), -bound, bound), bins, (-bound, bound))[0]


def test_histogram_pass_folds_every_kind_over_the_larger_end():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 1, 50)).astype(np.float32)
    x[2, 0, 4] = -9.0  # the larger end is the minimum: the bound is 9
    y = np.abs(rng.standard_normal((6, 1, 20))).astype(np.float32) + 0.5
    values = {"x": x, "y": y}
    extrema = _extrema(values)
    batches = [{"x": x[:4], "y": y[:4], "other": x[:4]}, {"x": x[4:], "y": y[4:], "other": x[4:]}]
    progress = CallRecorder()
    with reporting(progress):
        stats = A.histogram_pass(_passes(batches), ["x", "y"], extrema, 6)
    assert progress.calls == [("start", ("calibrate", 6)), ("advance", 4), ("advance", 2), ("finish", None)]
    assert list(stats) == ["x", "y"]  # "other" is no tensor asked for
    for name, v in values.items():
        s = stats[name]
        bound = max(abs(v.min()), abs(v.max()))
        assert s.observed == extrema.observed[name] and s.per_record is extrema.per_record[name]
        assert s.kl.bound == bound and s.kl.bins == 8001 and s.mse.bound == bound and s.mse.bins == 2047
        # np.histogram's float edges and the observer's integer bins may differ on an edge: compare totals
        # and allow a value to move one bin at most
        for h, bins in ((s.kl, 8001), (s.mse, 2047)):
            assert h.counts.sum() == v.size
            want = _histogram(v, bound, bins)
            assert np.abs(np.cumsum(h.counts) - np.cumsum(want)).max() <= 1
        magnitude = np.abs(v.reshape(-1))
        assert s.magnitude.range == (np.float32(magnitude.min()), np.float32(bound))
        np.testing.assert_array_equal(
            s.magnitude.counts, np.histogram(magnitude, 2048, (magnitude.min(), np.float32(bound)))[0]
        )
    assert stats["x"].kl.bound == 9.0


def test_histogram_pass_folds_only_the_kinds_asked_for():
    x = np.linspace(-1, 2, 60, dtype=np.float32).reshape(3, 1, 20)
    extrema = _extrema({"x": x})
    for kinds in (("kl",), ("mse",), ("magnitude",), ("kl", "magnitude"), ()):
        s = A.histogram_pass(_passes([{"x": x}]), ["x"], extrema, 3, kinds)["x"]
        assert (s.kl is not None, s.mse is not None, s.magnitude is not None) == tuple(
            k in kinds for k in C.HISTOGRAM_KINDS
        )
        for h in (s.kl, s.mse):
            if h is not None:
                assert h.counts.sum() == 60
        if s.magnitude is not None:
            assert s.magnitude.counts.sum() == 60


def test_histogram_pass_refuses_an_unknown_kind():
    x = np.ones((1, 2), np.float32)
    with pytest.raises(ValueError) as info:
        A.histogram_pass(_passes([{"x": x}]), ["x"], _extrema({"x": x}), 1, ("kl", "entropy", "other"))
    assert str(info.value) == "unknown histogram kind 'entropy'; expected one of kl, mse, magnitude"


def test_all_candidates_is_every_rule_of_every_tensor():
    rng = np.random.default_rng(8)
    values = {"a": rng.standard_normal((20, 1, 30)).astype(np.float32), "b": rng.random((20, 1, 30)) + 1.0}
    extrema = _extrema(values)
    stats = A.histogram_pass(_passes([values]), ["a", "b"], extrema, 20)
    options = C.CandidateOptions(0, 255)
    got = A.all_candidates(stats, options)
    assert list(got) == ["a", "b"]
    for name in values:
        assert got[name] == C.candidate_ranges(stats[name], options)
        assert got[name]["minmax"] == extrema.observed[name]


# --- the evaluator -----------------------------------------------------------------------------


class Session:
    """A stand-in onnxruntime session: ``fn(name, feeds)`` per asked output; records its calls."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self.calls: list[tuple[list[str], dict[str, Any]]] = []

    def run(self, names, feeds):
        self.calls.append((list(names), dict(feeds)))
        return [self.fn(name, feeds) for name in names]


class Bound:
    """A stand-in bound dataset: records in order, and their count."""

    def __init__(self, records: list[dict[str, np.ndarray]]) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def iter_records(self):
        yield from self.records


def _model(outputs: Mapping[str, int], inputs: tuple[str, ...] = ("x",)) -> onnx.ModelProto:
    """A model whose graph has the given outputs (name -> element type); only its signature is read."""
    graph = helper.make_graph(
        [],
        "sig",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in inputs],
        [helper.make_tensor_value_info(n, t, [2]) for n, t in outputs.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _double(path_or_none=None) -> onnx.ModelProto:
    """y = 2 x, a real model onnxruntime runs."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["y"])],
        "double",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.array(2.0, np.float32), "two")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_only_float_outputs_are_measured():
    model = _model(
        {
            "f": TensorProto.FLOAT,
            "i": TensorProto.INT64,
            "d": TensorProto.DOUBLE,
            "h": TensorProto.FLOAT16,
            "b": TensorProto.BOOL,
        }
    )
    evaluator = A.Evaluator(model, Bound([]), RuntimeOptions())
    assert evaluator.outputs == ["f", "d", "h"]
    assert A._is_float(model, "f") and not A._is_float(model, "i") and not A._is_float(model, "b")
    assert A._is_float(model, "not an output")  # a value the graph does not type counts as float


def test_errors_are_the_mean_over_outputs_of_squared_error_over_energy():
    """Two float outputs and one integer output; records given to the quantized runs with each
    choice's extra feeds. Per choice: mean over the float outputs of sum (q - y)^2 / sum y^2."""
    fp32 = _model({"u": TensorProto.FLOAT, "n": TensorProto.INT64, "v": TensorProto.FLOAT})
    records = [{"x": np.array([1.0, 2.0], np.float32)}, {"x": np.array([-1.0, 3.0], np.float32)}]
    ref = {"u": lambda x: x, "v": lambda x: 3 * x}
    reference = Session(lambda name, feeds: ref[name](feeds["x"]) if name in ref else np.float32(7))
    noise = {"p": {"u": 0.5, "v": 0.0}, "q": {"u": 0.0, "v": -1.0}}

    def quantized(name, feeds):
        return ref[name](feeds["x"]) + noise[feeds["which"]][name]

    runs = {c: (Session(quantized), {"which": c}) for c in noise}
    evaluator = A.Evaluator(fp32, Bound(records), RuntimeOptions(threads=1))
    progress = CallRecorder()
    with reporting(progress):
        got = evaluator.errors(runs, (reference, ["extra"], None))
    energy_u = 1 + 4 + 1 + 9
    energy_v = 9 * energy_u
    assert got == {
        "p": pytest.approx((4 * 0.25 / energy_u + 0.0) / 2, rel=1e-12),
        "q": pytest.approx((0.0 + 4 * 1.0 / energy_v) / 2, rel=1e-12),
    }
    assert evaluator.passes == 1
    assert progress.calls == [("start", ("auto: measure", 2)), ("advance", 1), ("advance", 1), ("finish", None)]
    # the reference is asked for the float outputs and the probe's, the quantized runs for the outputs
    assert [c[0] for c in reference.calls] == [["u", "v", "extra"]] * 2
    for name, (session, _) in runs.items():
        assert [c[0] for c in session.calls] == [["u", "v"]] * 2
        assert [c[1]["which"] for c in session.calls] == [name, name]
        np.testing.assert_array_equal(session.calls[1][1]["x"], records[1]["x"])
    assert evaluator.errors(runs, (reference, [], None)) == got and evaluator.passes == 2


def test_an_output_without_energy_counts_its_squared_error():
    fp32 = _model({"u": TensorProto.FLOAT, "z": TensorProto.FLOAT})
    records = [{"x": np.array([1.0, -1.0], np.float32)}]
    reference = Session(lambda name, feeds: feeds["x"] if name == "u" else np.zeros(2, np.float32))
    quantized = Session(lambda name, feeds: feeds["x"] * 2 if name == "u" else np.full(2, 0.5, np.float32))
    evaluator = A.Evaluator(fp32, Bound(records), RuntimeOptions())
    got = evaluator.errors({"c": (quantized, {})}, (reference, [], None))
    assert got["c"] == pytest.approx((2 / 2 + 0.5) / 2, rel=1e-12)  # u: 2 / 2; z: 0.25 + 0.25 unscaled


def test_the_probe_rides_along_and_its_sums_are_folded():
    fp32 = _model({"u": TensorProto.FLOAT})
    records = [{"x": np.array([1.0, 2.0], np.float32)}, {"x": np.array([3.0, 4.0], np.float32)}]
    entry = ProbeEntry("x", (0.0, 1.0), ("e",), ("s",))
    values = {"u": lambda x: x, "e": lambda x: np.float32(x[0]), "s": lambda x: np.float32(x[1])}
    probe = Session(lambda name, feeds: values[name](feeds["x"]))
    from pytest_qaccuracy.analysis.calibration.probe import ProbeScores

    sums = ProbeScores([entry])
    evaluator = A.Evaluator(fp32, Bound(records), RuntimeOptions())
    got = evaluator.errors({"same": (Session(lambda name, feeds: feeds["x"]), {})}, (probe, ["e", "s"], sums))
    assert got == {"same": 0.0}
    assert sums.sums == {"e": 4.0, "s": 6.0}


def test_without_a_probe_the_fp32_model_is_the_reference():
    fp32 = _double()
    records = [{"x": np.array([1.0, 2.0], np.float32)}, {"x": np.array([0.0, -1.0], np.float32)}]
    evaluator = A.Evaluator(fp32, Bound(records), RuntimeOptions())
    quantized = Session(lambda name, feeds: 2 * feeds["x"] + 1)
    got = evaluator.errors({"c": (quantized, {})})
    assert got == {"c": pytest.approx(4 / (4 + 16 + 0 + 4), rel=1e-7)}
    reference = evaluator._reference
    assert reference is not None
    evaluator.errors({"c": (quantized, {})})
    assert evaluator._reference is reference  # made once


def test_wins_count_records_where_a_run_is_below_the_one_it_is_measured_against():
    """Per record: mean over outputs of squared error / that record's energy (1 where it has none);
    strictly below the rival's counts, ties do not."""
    fp32 = _model({"u": TensorProto.FLOAT, "z": TensorProto.FLOAT})
    x = [np.array([1.0, 1.0], np.float32), np.array([2.0, 0.0], np.float32), np.array([1.0, 0.0], np.float32)]
    records = [{"x": v, "i": np.array(i)} for i, v in enumerate(x)]
    reference = Session(lambda name, feeds: feeds["x"] if name == "u" else np.zeros(2, np.float32))
    # per-record errors (u over energy, z unscaled), chosen so that the pooled error and the count disagree
    offsets = {
        "minmax": [(0.1, 0.0), (0.1, 0.0), (0.1, 0.0)],
        "a": [(0.0, 0.0), (0.0, 0.0), (3.0, 0.0)],  # better on two records, far worse on the third
        "b": [(0.1, 0.0), (0.0, 0.1), (0.0, 0.0)],  # record 0 ties, record 1 worse on z, record 2 better
    }

    def run_of(name):
        def fn(out, feeds):
            base = feeds["x"] if out == "u" else np.zeros(2, np.float32)
            return base + offsets[name][int(feeds["i"])][out == "z"]

        return Session(fn)

    runs = {name: (run_of(name), {}) for name in offsets}
    evaluator = A.Evaluator(fp32, Bound(records), RuntimeOptions())
    got = evaluator.errors(runs, (reference, [], None), against="minmax")
    assert evaluator.wins == {"minmax": 0, "a": 2, "b": 1}
    energy_u = 2 + 4 + 1
    assert got["a"] == pytest.approx((2 * 9 / energy_u + 0) / 2, rel=1e-12)
    assert got["a"] > got["minmax"]  # worse pooled, better on most records
    evaluator.errors(runs, (reference, [], None))
    assert evaluator.wins == {"minmax": 0, "a": 0, "b": 0}  # recounted every pass, none without a rival


@pytest.mark.parametrize(
    ("threads", "cpus", "session_threads"), [(0, 4, 1), (0, 2, 1), (0, 1, 0), (0, None, 0), (2, 4, 2), (3, 1, 3)]
)
def test_sessions_are_single_threaded_when_onnxruntime_chooses_on_several_cores(
    monkeypatch, threads, cpus, session_threads
):
    made = []
    monkeypatch.setattr(A.os, "cpu_count", lambda: cpus)
    monkeypatch.setattr(A, "make_session", lambda model, **kw: made.append((model, kw)) or object())
    options = RuntimeOptions(threads=threads, optimization="basic", providers=("CPUExecutionProvider",))
    evaluator = A.Evaluator(_double(), Bound([]), options)
    assert evaluator._workers == ((cpus or 1) if threads == 0 else 1)
    assert evaluator.options is options and evaluator.wins == {} and evaluator.passes == 0
    model, other = _double(), _double()
    first = evaluator.session(model)
    assert evaluator.session(model) is first and len(made) == 1  # one session per model object
    assert evaluator.session(other) is not first and len(made) == 2
    assert made[0] == (
        model,
        {"providers": ("CPUExecutionProvider",), "threads": session_threads, "optimization": "basic"},
    )


def test_a_model_onnxruntime_cannot_load_or_run_is_one_model_error():
    broken = _double()
    broken.graph.node[0].op_type = "NoSuchOperator"
    evaluator = A.Evaluator(_double(), Bound([]), RuntimeOptions())
    with pytest.raises(ModelError) as info:
        evaluator.session(broken, "probe model")
    message = str(info.value)
    assert message.startswith("auto calibration: onnxruntime cannot load the probe model (")
    assert "\n" not in message and message.endswith(")")
    assert "NoSuchOperator" in message  # onnxruntime's reason, first line
    records = [{"x": np.ones(2, np.float32)}]
    with pytest.raises(ModelError, match=r"cannot load the fp32 model \(.*NoSuchOperator"):
        A.Evaluator(broken, Bound(records), RuntimeOptions()).errors({"c": (Session(lambda n, f: f["x"]), {})})
    with pytest.raises(ModelError, match=r"cannot load the quantized model \("):
        A.Evaluator(_double(), Bound([]), RuntimeOptions()).session(broken)

    class Failing:
        def run(self, names, feeds):
            raise RuntimeError("bad input\nsecond line")

    with pytest.raises(ModelError) as info:
        A._run(Failing(), ["y"], {}, "fp32 model")
    assert str(info.value) == "auto calibration: onnxruntime failed to run the fp32 model (bad input)"
    records = [{"x": np.ones(2, np.float32)}]
    evaluator = A.Evaluator(_double(), Bound(records), RuntimeOptions())
    with pytest.raises(ModelError, match=r"failed to run the quantized model \(bad input\)"):
        evaluator.errors({"c": (Failing(), {})})
    with pytest.raises(ModelError, match=r"failed to run the fp32 model \(bad input\)"):
        evaluator.errors({"c": (Session(lambda n, f: f["x"]), {})}, (Failing(), [], None))


def test_run_passes_names_and_feeds_and_returns_arrays():
    session = Session(lambda name, feeds: [1, 2] if name == "a" else 3.5)
    got = A._run(session, ("a", "b"), {"x": 1}, "fp32 model")
    assert session.calls == [(["a", "b"], {"x": 1})]
    assert [type(v) for v in got] == [np.ndarray, np.ndarray] and got[0].tolist() == [1, 2] and got[1] == 3.5


def test_choice_runs_feed_each_choice_its_parameters():
    class Params:
        def feeds(self, ranges):
            return {"fed": dict(ranges)}

    session = object()
    got = A.choice_runs(session, Params(), {"a": {"t": (0.0, 1.0)}, "b": {"t": (0.0, 2.0)}})
    assert got == {"a": (session, {"fed": {"t": (0.0, 1.0)}}), "b": (session, {"fed": {"t": (0.0, 2.0)}})}


# --- distinct candidates, finalists, the majority ----------------------------------------------


def test_distinct_groups_the_rules_whose_ranges_quantize_alike():
    """onnxruntime's range always holds 0: (0.5, 8) and (0, 8) give the same scale and zero point."""
    ranges = {"minmax": (0.5, 8.0), "kl": (0.0, 8.0), "mse": (0.0, 6.0), "percentile": (1.0, 8.0), "x": (-1.0, 6.0)}
    assert A.distinct(ranges, "uint8") == {
        (0.5, 8.0): ["minmax", "kl", "percentile"],
        (0.0, 6.0): ["mse"],
        (-1.0, 6.0): ["x"],
    }
    for lo, hi in ((0.0, 8.0), (1.0, 8.0)):
        assert compute_scale_zp(np.float32(lo), np.float32(hi), np.uint8(0), np.uint8(255)) == compute_scale_zp(
            np.float32(0.5), np.float32(8.0), np.uint8(0), np.uint8(255)
        )


def test_distinct_uses_the_activation_type():
    """(-1, 1) and (-1, 1.002): one uint8 step apart only in int8's zero point? Both types' own
    scale and zero point decide, as compute_scale_zp gives them."""
    ranges = {"a": (-1.0, 1.0), "b": (-1.0, 1.002)}

    def key(lo, hi, qmin, qmax, dtype):
        z, s = compute_scale_zp(np.float32(lo), np.float32(hi), dtype(qmin), dtype(qmax))
        return float(s), float(z)

    for kind, (qmin, qmax, dtype) in {"uint8": (0, 255, np.uint8), "int8": (-128, 127, np.int8)}.items():
        same = key(*ranges["a"], qmin, qmax, dtype) == key(*ranges["b"], qmin, qmax, dtype)
        assert len(A.distinct(ranges, kind)) == (1 if same else 2)
    assert len(A.distinct({"a": (0.0, 1.0), "b": (0.0, 1.0)}, "int8")) == 1


def test_ranges_of_reads_each_tensors_rule():
    found = {"t": {"minmax": (0.0, 1.0), "kl": (0.0, 0.5)}, "u": {"minmax": (-1.0, 1.0), "kl": (-0.5, 0.5)}}
    assert A.ranges_of({"t": "kl", "u": "minmax"}, found) == {"t": (0.0, 0.5), "u": (-1.0, 1.0)}
    assert A.ranges_of({}, found) == {}


def test_finalists_are_every_choice_min_max_and_onnxruntimes_percentile_first():
    evaluated = {"kl": ({}, 1.0), "minmax": ({}, 3.0), "mse": ({}, 1.5), "ort-percentile": ({}, 2.0), "x": ({}, 9.0)}
    assert A.finalists(evaluated) == ["minmax", "ort-percentile", "kl", "mse", "x"]
    assert A.finalists({"minmax": ({}, 1.0), "ort-percentile": ({}, 2.0)}) == ["minmax", "ort-percentile"]
    # ort-percentile measured once under another rule's name: not a finalist of its own
    assert A.finalists({"mse": ({}, 1.0), "minmax": ({}, 3.0)}) == ["minmax", "mse"]


def test_majority_needs_more_than_half_the_records():
    final = ["minmax", "a", "b", "c"]
    assert A.majority(final, {"minmax": 0, "a": 5, "b": 4, "c": 6}, 10) == ["minmax", "c"]
    assert A.majority(final, {"a": 4, "b": 5}, 9) == ["minmax", "b"]
    assert A.majority(["a", "minmax"], {"a": 1}, 1) == ["a", "minmax"]
    assert A.majority(["a", "minmax"], {}, 1) == ["minmax"]  # no count: no win


# --- choose: the whole-model choices -----------------------------------------------------------

RULES = list(C.CANDIDATES)


class Params:
    """A stand-in parameterized model: its tensors, and feeds that are the ranges themselves."""

    def __init__(self, tensors: list[str]) -> None:
        self.tensors = tensors
        self.model = object()

    def feeds(self, ranges):
        return {"ranges": dict(ranges)}


class FakeEvaluator:
    """Each choice's output error is the sum of its tensors' costs (a table by upper end); the probe,
    when given, is filled with ``scores`` (tensor -> upper end -> score)."""

    def __init__(self, costs, scores, records: int = 8) -> None:
        self.costs, self.scores = costs, scores
        self.bound = Bound([{}] * records)
        self.passes = 0
        self.calls: list[tuple[list[str], bool]] = []
        self.labels: list[tuple[Any, ...]] = []

    def session(self, model, label="quantized model", optimization=""):
        self.labels.append((model, label, optimization) if optimization else (model, label))
        return ("session", label)

    def errors(self, runs, probe=None, against=None):
        self.passes += 1
        self.calls.append((list(runs), probe is not None))
        if probe is not None:
            session, names, sums = probe
            assert session == ("session", "probe model")
            assert names == list(dict.fromkeys(n for e in sums.entries for n in (*e.errors, *e.energies)))
            for e in sums.entries:
                sums.sums[e.errors[0]] = self.scores[e.tensor][e.range[1]]
                sums.sums[e.energies[0]] = 1.0
        out = {}
        for name, (session, feeds) in runs.items():
            assert session == ("session", "quantized model")
            out[name] = sum(self.costs[t][hi] for t, (_, hi) in feeds["ranges"].items())
        return out


@pytest.fixture
def fake_probe(monkeypatch):
    """build_probe replaced: one entry per (tensor, distinct range), its arguments recorded."""
    calls = []

    def build(fp32, candidates, activation_type):
        calls.append((fp32, {t: list(r) for t, r in candidates.items()}, activation_type))
        entries = [
            ProbeEntry(t, r, (f"err/{t}/{k}",), (f"energy/{t}",))
            for t, ranges in candidates.items()
            for k, r in enumerate(ranges)
        ]
        return "probe", entries

    monkeypatch.setattr(A, "build_probe", build)
    return calls


def _found(his: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, tuple[float, float]]]:
    return {t: {rule: (0.0, float(h[rule])) for rule in RULES} for t, h in his.items()}


def test_choose_measures_each_rule_then_the_per_tensor_winners_and_the_groups_that_helped(fake_probe):
    """Upper ends per rule (lower end 0): moving-average is percentile's on every tensor (measured
    once), ort-percentile is min/max's but on t4. Costs add over tensors; the probe's scores pick
    t2 -> kl, t3 -> kl (which hurts the whole model), t4 -> ort-percentile; t5 has one range."""
    his = {
        t: {"minmax": 8, "percentile": 7, "moving-average": 7, "kl": 4, "mse": 6, "ort-percentile": 8}
        for t in ("t1", "t2", "t3", "t4")
    }
    his["t4"] = {**his["t4"], "ort-percentile": 5}
    his["t5"] = dict.fromkeys(RULES, 3)
    found = _found(his)
    costs = {
        "t1": {8: 1.0, 7: 0.75, 6: 0.5, 4: 2.0},
        "t2": {8: 1.0, 7: 0.75, 6: 0.5, 4: 0.125},
        "t3": {8: 1.0, 7: 0.75, 6: 0.5, 4: 3.0},
        "t4": {8: 1.0, 7: 0.75, 6: 0.5, 5: 0.25, 4: 3.0},
        "t5": {3: 0.0},
    }
    scores = {
        "t1": {8: 1.0, 7: 0.75, 6: 0.5, 4: 2.0},
        "t2": {8: 1.0, 7: 0.75, 6: 0.5, 4: 0.125},
        "t3": {8: 1.0, 7: 0.75, 6: 0.5, 4: 0.0625},
        "t4": {8: 1.0, 7: 0.75, 6: 0.5, 5: 0.25, 4: 3.0},
    }
    tensors = ["t1", "t2", "t3", "t4", "t5"]
    evaluator = FakeEvaluator(costs, scores, records=8)
    fp32 = onnx.ModelProto()
    evaluated, report = A.choose(evaluator, fp32, Params(tensors), found, "uint8")
    # the probe: every tensor with more than one distinct range, its ranges in rule order
    (called,) = fake_probe
    assert called[0] is fp32 and called[2] == "uint8"
    assert called[1] == {
        **{t: [(0.0, 8.0), (0.0, 7.0), (0.0, 4.0), (0.0, 6.0)] for t in ("t1", "t2", "t3")},
        "t4": [(0.0, 8.0), (0.0, 7.0), (0.0, 4.0), (0.0, 6.0), (0.0, 5.0)],
    }
    uniform = {"minmax": 4.0, "percentile": 3.0, "kl": 8.125, "mse": 2.0, "ort-percentile": 3.25}
    groups = {
        "per-tensor": 0.5 + 0.125 + 3.0 + 0.25,
        "mse + per-tensor group 1/3": 0.5 + 0.125 + 0.5 + 0.5,
        "mse + per-tensor group 2/3": 0.5 + 0.5 + 3.0 + 0.5,
        "mse + per-tensor group 3/3": 0.5 + 0.5 + 0.5 + 0.25,
    }
    together = "mse + per-tensor groups 1/3, 3/3"
    assert evaluator.calls == [(list(uniform), True), (list(groups), False), ([together], False)]
    expected = {**uniform, **groups, together: 0.5 + 0.125 + 0.5 + 0.25}
    assert {name: e for name, (_, e) in evaluated.items()} == expected
    assert list(evaluated) == list(expected)
    mse = dict.fromkeys(tensors, "mse")
    assert evaluated["mse"][0] == mse and evaluated["minmax"][0] == dict.fromkeys(tensors, "minmax")
    assert evaluated["per-tensor"][0] == {**mse, "t2": "kl", "t3": "kl", "t4": "ort-percentile"}
    assert evaluated["mse + per-tensor group 2/3"][0] == {**mse, "t3": "kl"}
    assert evaluated[together][0] == {**mse, "t2": "kl", "t4": "ort-percentile"}
    assert report["records"] == 8 and report["passes"] == 2 + 3
    assert [s["choice"] for s in report["steps"]] == list(expected)
    for step in report["steps"]:
        error = expected[step["choice"]]
        sqnr = pytest.approx(-10 * math.log10(error), rel=1e-12)
        assert step == {"choice": step["choice"], "output_error": error, "output_sqnr_db": sqnr}
    winners = {t: report["tensors"][t]["winner"] for t in tensors}
    assert winners == {"t1": "mse", "t2": "kl", "t3": "kl", "t4": "ort-percentile", "t5": "minmax"}
    t4 = report["tensors"]["t4"]["candidates"]
    assert list(t4) == RULES
    assert t4["percentile"] == {"range": [0.0, 7.0], "score": 0.75}
    assert t4["moving-average"] == {"range": [0.0, 7.0], "score": 0.75}  # its range's score, under both names
    assert t4["ort-percentile"] == {"range": [0.0, 5.0], "score": 0.25}
    assert report["tensors"]["t5"]["candidates"]["kl"] == {"range": [0.0, 3.0], "score": 0.0}
    # the probe's session at onnxruntime's basic level, the parameterized model's at the options' own
    assert evaluator.labels == [(evaluator.labels[0][0], "quantized model"), ("probe", "probe model", "basic")]


def test_choose_splits_many_differing_tensors_into_four_groups_and_keeps_one_that_helped(fake_probe):
    """Six tensors whose winner differs from the best rule: four contiguous groups (2, 2, 1, 1); one
    group helps alone, so no combination is tried."""
    tensors = [f"t{i}" for i in range(6)]
    his = {
        t: {"minmax": 8, "percentile": 6, "moving-average": 6, "kl": 6, "mse": 6, "ort-percentile": 6} for t in tensors
    }
    costs = {t: {8: 1.0, 6: 2.0} for t in tensors}
    costs["t4"] = {8: 0.5, 6: 2.0}  # group 3/4 = [t4] is the one that helps
    costs["t0"] = {8: 1.5, 6: 2.0}
    scores = {t: {8: 0.0, 6: 1.0} for t in tensors}  # the probe prefers the wider range everywhere
    evaluator = FakeEvaluator(costs, scores)
    found = _found(his)
    evaluated, report = A.choose(evaluator, onnx.ModelProto(), Params(tensors), found, "uint8")
    # every rule but minmax gives the same model: measured once, as percentile
    assert evaluator.calls[0] == (["minmax", "percentile"], True)
    assert evaluated["minmax"][1] == 1.5 + 4 * 1.0 + 0.5 and evaluated["percentile"][1] == 12.0
    # the best is minmax: the winners (minmax everywhere) differ from it nowhere
    assert len(evaluator.calls) == 1 and list(evaluated) == ["minmax", "percentile"]

    costs2 = {t: {8: 2.0, 6: 1.0} for t in tensors}
    costs2["t4"] = {8: 0.5, 6: 1.0}
    evaluator = FakeEvaluator(costs2, scores)
    evaluated, report = A.choose(evaluator, onnx.ModelProto(), Params(tensors), found, "uint8")
    names = [
        "per-tensor",
        "percentile + per-tensor group 1/4",
        "percentile + per-tensor group 2/4",
        "percentile + per-tensor group 3/4",
        "percentile + per-tensor group 4/4",
    ]
    assert evaluator.calls[1] == (names, False) and len(evaluator.calls) == 2
    pct = dict.fromkeys(tensors, "percentile")
    assert evaluated[names[1]][0] == {**pct, "t0": "minmax", "t1": "minmax"}
    assert evaluated[names[2]][0] == {**pct, "t2": "minmax", "t3": "minmax"}
    assert evaluated[names[3]][0] == {**pct, "t4": "minmax"}
    assert evaluated[names[4]][0] == {**pct, "t5": "minmax"}
    assert evaluated[names[3]][1] == 5 * 1.0 + 0.5 and evaluated["per-tensor"][1] == 5 * 2.0 + 0.5
    assert report["passes"] == 4


def test_choose_with_two_differing_tensors_tries_two_groups_and_keeps_only_strict_gains(fake_probe):
    """a and b's winner (kl) differs from the best rule (minmax; c makes kl bad as a whole): two
    groups of one. Group 1 lowers the error, group 2 only ties it: kept alone, nothing combined."""
    tensors = ["a", "b", "c"]
    his = {t: {**dict.fromkeys(RULES, 5), "kl": 3} for t in tensors}
    costs = {"a": {5: 1.0, 3: 0.5}, "b": {5: 1.0, 3: 1.0}, "c": {5: 1.0, 3: 5.0}}
    scores = {"a": {5: 1.0, 3: 0.5}, "b": {5: 1.0, 3: 0.5}, "c": {5: 0.5, 3: 1.0}}
    evaluator = FakeEvaluator(costs, scores)
    evaluated, _ = A.choose(evaluator, onnx.ModelProto(), Params(tensors), _found(his), "uint8")
    groups = ["per-tensor", "minmax + per-tensor group 1/2", "minmax + per-tensor group 2/2"]
    assert evaluator.calls == [(["minmax", "kl"], True), (groups, False)]
    assert evaluated["minmax + per-tensor group 1/2"] == ({"a": "kl", "b": "minmax", "c": "minmax"}, 2.5)
    assert evaluated["minmax + per-tensor group 2/2"] == ({"a": "minmax", "b": "kl", "c": "minmax"}, 3.0)
    assert evaluated["minmax"][1] == 3.0


def test_choose_with_one_differing_tensor_tries_it_whole_only(fake_probe):
    tensors = ["a", "b"]
    his = {"a": dict.fromkeys(RULES, 5), "b": {**dict.fromkeys(RULES, 5), "kl": 3}}
    costs = {"a": {5: 1.0}, "b": {5: 1.0, 3: 2.0}}
    scores = {"b": {5: 1.0, 3: 0.5}}
    evaluator = FakeEvaluator(costs, scores)
    evaluated, _report = A.choose(evaluator, onnx.ModelProto(), Params(tensors), _found(his), "int8")
    assert fake_probe[0][1] == {"b": [(0.0, 5.0), (0.0, 3.0)]} and fake_probe[0][2] == "int8"
    assert evaluator.calls == [(["minmax", "kl"], True), (["per-tensor"], False)]
    assert evaluated["per-tensor"] == ({"a": "minmax", "b": "kl"}, 3.0)


def test_choose_without_anything_to_probe_measures_min_max_alone(fake_probe):
    tensors = ["a", "b"]
    his = {t: dict.fromkeys(RULES, 2) for t in tensors}
    evaluator = FakeEvaluator({t: {2: 0.25} for t in tensors}, {})
    evaluated, report = A.choose(evaluator, onnx.ModelProto(), Params(tensors), _found(his), "uint8")
    assert fake_probe == [] and evaluator.calls == [(["minmax"], False)]
    assert evaluated == {"minmax": ({"a": "minmax", "b": "minmax"}, 0.5)}
    assert [s["choice"] for s in report["steps"]] == ["minmax"]
    assert report["tensors"]["a"]["winner"] == "minmax" and report["passes"] == 3


def test_choose_breaks_ties_by_rule_order(fake_probe):
    """Equal scores: the earlier rule wins the tensor; equal errors: the earlier rule is the best."""
    his = {"a": {**dict.fromkeys(RULES, 4), "percentile": 3, "kl": 2}}
    costs = {"a": {4: 1.0, 3: 1.0, 2: 1.0}}
    scores = {"a": {4: 0.5, 3: 0.25, 2: 0.25}}
    evaluator = FakeEvaluator(costs, scores)
    evaluated, report = A.choose(evaluator, onnx.ModelProto(), Params(["a"]), _found(his), "uint8")
    assert report["tensors"]["a"]["winner"] == "percentile"
    # the best rule is minmax (ties at 1.0): percentile differs, and is tried
    assert evaluated["per-tensor"][0] == {"a": "percentile"}


# --- verified_choice ---------------------------------------------------------------------------


def _tiny(value: float) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "c"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        [numpy_helper.from_array(np.array([value], np.float32), "c")],
    )
    return helper.make_model(graph)


class RealEvaluator:
    """errors and wins given per model (by its constant), as the real runs would give them."""

    def __init__(self, error_of: Mapping[float, float], wins_of: Mapping[float, int], records: int) -> None:
        self.error_of, self.wins_of = error_of, wins_of
        self.bound = Bound([{}] * records)
        self.calls: list[tuple[list[str], str | None]] = []
        self.wins: dict[str, int] = {}

    def session(self, model, label="quantized model"):
        return float(numpy_helper.to_array(model.graph.initializer[0])[0])

    def sessions(self, models):
        return {name: self.session(model) for name, model in models.items()}

    def errors(self, runs, probe=None, against=None):
        self.calls.append((list(runs), against))
        assert all(feeds == {} for _, feeds in runs.values())
        self.wins = {name: self.wins_of[c] for name, (c, _) in runs.items()}
        return {name: self.error_of[c] for name, (c, _) in runs.items()}


def test_verified_choice_keeps_min_max_unless_another_is_better_on_most_records():
    models = {"minmax": _tiny(0.0), "ort-percentile": _tiny(1.0), "mse": _tiny(2.0)}
    written = []
    # mse is the least error but better on only 4 of 8 records; ort-percentile is worse
    evaluator = RealEvaluator({0.0: 0.5, 1.0: 0.75, 2.0: 0.25}, {0.0: 0, 1.0: 7, 2.0: 4}, 8)
    report = {"steps": [{"choice": "earlier"}], "passes": 3}
    got = A.verified_choice(evaluator, ["minmax", "ort-percentile", "mse"], models, written.append, report)
    assert got == A.Choice("minmax", 0.5) and written == []
    assert evaluator.calls == [(["minmax", "ort-percentile", "mse"], "minmax")]
    assert report["passes"] == 3
    assert report["steps"][1:] == [
        {
            "choice": f"{name}, as onnxruntime runs it",
            "output_error": e,
            "output_sqnr_db": pytest.approx(-10 * math.log10(e), rel=1e-12),
            "verified": True,
            "better_than_minmax_on": w,
        }
        for name, e, w in (("minmax", 0.5, 0), ("ort-percentile", 0.75, 7), ("mse", 0.25, 4))
    ]


def test_verified_choice_keeps_a_better_choice_that_onnxruntime_writes_the_same():
    models = {"minmax": _tiny(0.0), "ort-percentile": _tiny(1.0), "mse": _tiny(2.0)}
    written = []

    def write(name):
        written.append(name)
        return _tiny(2.0)  # the same nodes and values: the model measured

    evaluator = RealEvaluator({0.0: 0.5, 1.0: 0.25, 2.0: 0.125}, {0.0: 0, 1.0: 5, 2.0: 5}, 8)
    report = {"steps": [], "passes": 0}
    got = A.verified_choice(evaluator, ["minmax", "ort-percentile", "mse"], models, write, report)
    assert got == A.Choice("mse", 0.125) and written == ["mse"] and len(evaluator.calls) == 1
    assert report["passes"] == 0 and not any("measured_again" in s for s in report["steps"])


def test_verified_choice_ties_go_to_the_earlier_finalist():
    models = {"minmax": _tiny(0.0), "ort-percentile": _tiny(1.0), "mse": _tiny(2.0)}
    evaluator = RealEvaluator({0.0: 0.5, 1.0: 0.25, 2.0: 0.25}, {0.0: 0, 1.0: 5, 2.0: 5}, 8)
    got = A.verified_choice(
        evaluator, ["minmax", "ort-percentile", "mse"], models, lambda n: models[n], {"steps": [], "passes": 0}
    )
    assert got.name == "ort-percentile"


@pytest.mark.parametrize(
    ("again_error", "again_wins", "kept"),
    [(0.375, 5, True), (0.625, 5, False), (0.375, 4, False), (0.5, 8, False)],
)
def test_verified_choice_measures_onnxruntimes_write_again_when_it_differs(again_error, again_wins, kept):
    """onnxruntime's write of the chosen model differs (constant 3 instead of 2): it is run next to
    min/max, its step replaced; kept only if better than min/max on most records and pooled."""
    models = {"minmax": _tiny(0.0), "ort-percentile": _tiny(1.0), "mse": _tiny(2.0)}
    evaluator = RealEvaluator(
        {0.0: 0.5, 1.0: 0.75, 2.0: 0.125, 3.0: again_error}, {0.0: 0, 1.0: 0, 2.0: 6, 3.0: again_wins}, 8
    )
    report = {"steps": [{"choice": "earlier"}], "passes": 4}
    got = A.verified_choice(evaluator, ["minmax", "ort-percentile", "mse"], models, lambda n: _tiny(3.0), report)
    assert evaluator.calls == [(["minmax", "ort-percentile", "mse"], "minmax"), (["minmax", "mse"], "minmax")]
    assert got == (A.Choice("mse", again_error) if kept else A.Choice("minmax", 0.5))
    assert report["passes"] == 5
    assert numpy_helper.to_array(models["mse"].graph.initializer[0])[0] == 3.0  # onnxruntime's model kept
    assert report["steps"][3] == {
        "choice": "mse, as onnxruntime runs it",
        "output_error": again_error,
        "output_sqnr_db": pytest.approx(-10 * math.log10(again_error), rel=1e-12),
        "verified": True,
        "better_than_minmax_on": again_wins,
        "measured_again": True,
    }
    assert (
        report["steps"][1]["choice"] == "minmax, as onnxruntime runs it" and "measured_again" not in report["steps"][2]
    )


# --- the line the command prints ---------------------------------------------------------------


def test_selection_line_names_the_choice_min_max_the_better_choices_and_counts_the_rest():
    suffix = ", as onnxruntime runs it"
    selection = {
        "chosen": "minmax",
        "output_sqnr_db": 20.794,
        "records": 16,
        "steps": [
            {"choice": "minmax", "output_sqnr_db": 99.0},  # not verified: left out
            {"choice": "minmax" + suffix, "output_sqnr_db": 20.794, "verified": True, "better_than_minmax_on": 0},
            {"choice": "ort-percentile" + suffix, "output_sqnr_db": 14.256, "verified": True},
            {"choice": "mse" + suffix, "output_sqnr_db": 29.831, "verified": True, "better_than_minmax_on": 3},
            {"choice": "kl" + suffix, "output_sqnr_db": 25.0, "verified": True},
        ],
    }
    assert A.selection_line(selection) == (
        "auto chose minmax: output SQNR 20.79 dB on the 16 calibration record(s) as onnxruntime runs it "
        "(mse 29.83 dB but better than minmax on only 3 of 16 records, and 1 more better choice on too few "
        "records; 1 other choice no better)"
    )
    # the best refused choice is named wherever it stands; the others are counted
    reversed_steps = {**selection, "steps": selection["steps"][::-1]}
    assert A.selection_line(reversed_steps) == A.selection_line(selection)
    third = {"choice": "y" + suffix, "output_sqnr_db": 21.0, "verified": True, "better_than_minmax_on": 8}
    assert A.selection_line({**selection, "steps": [*selection["steps"], third]}).endswith(
        "(mse 29.83 dB but better than minmax on only 3 of 16 records, and 2 more better choices on too few "
        "records; 1 other choice no better)"
    )
    below = {"choice": "x" + suffix, "output_sqnr_db": 1.0, "verified": True}
    chose_kl = {**selection, "chosen": "kl", "output_sqnr_db": 25.0, "steps": [*selection["steps"], below]}
    assert A.selection_line(chose_kl) == (
        "auto chose kl: output SQNR 25.00 dB on the 16 calibration record(s) as onnxruntime runs it "
        "(minmax 20.79 dB; mse 29.83 dB but better than minmax on only 3 of 16 records; 2 other choices no better)"
    )
    alone = {"chosen": "mse", "output_sqnr_db": 30.0, "records": 1, "steps": [selection["steps"][3]]}
    assert A.selection_line(alone) == (
        "auto chose mse: output SQNR 30.00 dB on the 1 calibration record(s) as onnxruntime runs it"
    )
    equal = {**alone, "chosen": "minmax", "output_sqnr_db": 29.831}
    assert A.selection_line(equal).endswith("runs it (1 other choice no better)")


# --- the warning against min/max -----------------------------------------------------------------


def _plain_error(fp32: Path, quantized: Path, records: np.ndarray) -> float:
    """sum (q - y)^2 / sum y^2 over the records, by plain onnxruntime sessions."""
    import onnxruntime as ort

    a = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"])
    b = ort.InferenceSession(str(quantized), providers=["CPUExecutionProvider"])
    err = energy = 0.0
    for x in records:
        y = a.run(None, {"x": x})[0].astype(np.float64)
        q = b.run(None, {"x": x})[0].astype(np.float64)
        err, energy = err + np.sum((q - y) ** 2), energy + np.sum(y * y)
    return err / energy


@pytest.mark.parametrize("per_channel", [False, True])
def test_check_against_minmax_warns_with_both_sqnrs_only_when_min_max_is_better(tmp_path, per_channel):
    """The written model against onnxruntime's own MinMax model (its calibrator, through
    quantize_static), both run here: a warning with both SQNRs when min/max is better, else None."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    from pytest_qaccuracy.analysis.calibration import CalibrationOptions, compute_ranges, quantize_with_ranges
    from pytest_qaccuracy.analysis.calibration.options import CalibrationResult
    from pytest_qaccuracy.analysis.calibration.reader import DatasetReader
    from tests.modelzoo import mlp

    rng = np.random.default_rng(6)
    fp32 = mlp(
        tmp_path / "mlp.onnx", rng.standard_normal((4, 3)).astype(np.float32), rng.random((3, 2)).astype(np.float32)
    )
    records = rng.standard_normal((12, 1, 4)).astype(np.float32)
    data = tmp_path / "d.npz"
    np.savez(data, x=records)

    def ort_minmax(name: str, **extra) -> Path:
        """onnxruntime's own MinMax model of the records."""
        out = tmp_path / name
        quantize_static(
            str(fp32),
            str(out),
            DatasetReader(data, fp32),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QUInt8,
            per_channel=per_channel,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
            **extra,
        )
        return out

    theirs = ort_minmax("ort-minmax.onnx")
    observed = compute_ranges(fp32, data).ranges
    clipped = {t: (lo / 4, hi / 4) for t, (lo, hi) in observed.items()}
    result = CalibrationResult("percentile", 12, clipped, observed)
    options = CalibrationOptions(method="percentile", per_channel=per_channel)
    written = quantize_with_ranges(fp32, tmp_path / "p.onnx", result, options)
    mine, plain = _plain_error(fp32, written, records), _plain_error(fp32, theirs, records)
    assert mine > plain
    progress = CallRecorder()
    with reporting(progress):
        warning = A.check_against_minmax(fp32, written, result, data, options, RuntimeOptions())
    assert warning == (
        f"percentile ranges give an output SQNR of {-10 * np.log10(mine):.2f} dB on the 12 calibration record(s), "
        f"below min/max's {-10 * np.log10(plain):.2f} dB; --method auto chooses per tensor by measured effect"
    )
    assert progress.calls[0] == ("start", ("calibrate: check", 12))
    same = CalibrationResult("minmax", 12, observed, observed)
    assert A.check_against_minmax(fp32, theirs, same, data, options, RuntimeOptions()) is None
    # the exclusions reach the min/max model: onnxruntime's MinMax model without mm2 quantized
    kept = ort_minmax("ort-minmax-kept.onnx", nodes_to_exclude=["mm2"])
    other = CalibrationResult("kl", 12, observed, observed)
    plain, kept_error = _plain_error(fp32, theirs, records), _plain_error(fp32, kept, records)
    assert kept_error != plain
    warning = A.check_against_minmax(fp32, theirs, other, data, options, RuntimeOptions(), ["mm2"])
    # onnxruntime 1.32: leaving mm2 in float is better; 1.18 (per tensor): worse, no warning
    assert warning == (
        None
        if plain <= kept_error
        else f"kl ranges give an output SQNR of {-10 * np.log10(plain):.2f} dB on the 12 calibration record(s), "
        f"below min/max's {-10 * np.log10(kept_error):.2f} dB; --method auto chooses per tensor by measured effect"
    )


# --- auto_ranges: the whole choice on a small model ---------------------------------------------


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """An MLP and 10 records, one of them with a spike (so that the rules disagree)."""
    from tests.modelzoo import mlp

    root = tmp_path_factory.mktemp("small")
    rng = np.random.default_rng(9)
    fp32 = mlp(root / "mlp.onnx", rng.standard_normal((6, 5)).astype(np.float32), rng.random((5, 3)).astype(np.float32))
    records = rng.standard_normal((10, 1, 6)).astype(np.float32)
    records[4, 0, 2] = 25.0
    np.savez(root / "d.npz", x=records)
    return fp32, root / "d.npz"


def test_auto_ranges_reports_every_pass_and_the_chosen_ranges(small, tmp_path, monkeypatch):
    from pytest_qaccuracy.analysis.calibration import CalibrationOptions, compute_ranges, quantize_with_ranges

    fp32, data = small
    measured = []
    real = A.Evaluator.errors

    def counting(self, runs, probe=None, against=None):
        measured.append(list(runs))
        return real(self, runs, probe, against)

    monkeypatch.setattr(A.Evaluator, "errors", counting)
    options = CalibrationOptions(method="auto")
    result = compute_ranges(fp32, data, options)
    selection = result.selection
    # two statistics passes, then every pass of the evaluator (the last: the finalists)
    assert selection["passes"] == 2 + len(measured) and selection["records"] == 10
    assert measured[-1][:2] == ["minmax", "ort-percentile"]
    verified = [s for s in selection["steps"] if s.get("verified")]
    assert [s["choice"].removesuffix(", as onnxruntime runs it") for s in verified] == measured[-1]
    chosen = next(s for s in verified if s["choice"].startswith(selection["chosen"] + ","))
    assert selection["output_sqnr_db"] == chosen["output_sqnr_db"]
    observed = compute_ranges(fp32, data).ranges
    assert result.observed == observed
    for tensor, entry in selection["tensors"].items():
        assert entry["chosen"] == list(result.ranges[tensor])
        assert entry["candidates"]["minmax"]["range"] == list(observed[tensor])
    assert set(result.ranges) == set(observed)
    if selection["chosen"] == "minmax":
        assert result.ranges == observed
    fresh = quantize_with_ranges(fp32, tmp_path / "fresh.onnx", replace(result, model=None), options)
    assert result.model == fresh.read_bytes()  # the model auto returns is onnxruntime's write of its choice


def test_auto_ranges_writes_the_exclusions_and_the_format_asked_for(small, tmp_path):
    from pytest_qaccuracy.analysis.calibration import CalibrationOptions, calibrate

    fp32, data = small
    options = CalibrationOptions(method="auto", quant_format="qoperator", activation_type="int8")
    calibrate(fp32, data, tmp_path / "q.onnx", options, nodes_to_exclude=["mm2"])
    model = onnx.load(str(tmp_path / "q.onnx"))
    ops = {n.name: n.op_type for n in model.graph.node}
    assert ops["mm2"] == "MatMul" and "QLinearMatMul" in ops.values()  # mm2 left in float, mm1 quantized
    zero = next(t for t in model.graph.initializer if t.name.endswith("zero_point") and t.name.startswith("x"))
    assert numpy_helper.to_array(zero).dtype == np.int8


def test_wins_weigh_each_output_by_that_records_energy():
    """Three outputs of very different energies on each record (u, v, and z without any): a run's
    per-record error is the mean over outputs of squared error / that output's energy on the record
    (1 where it has none), so a large error on a loud output can beat a small one on a quiet output."""
    fp32 = _model({"u": TensorProto.FLOAT, "v": TensorProto.FLOAT, "z": TensorProto.FLOAT})
    # energies of u and v: (100, 1), (4, .25), (1, 1), and record 3 as record 0
    reference = {0: (10.0, 1.0, 0.0), 1: (2.0, 0.5, 0.0), 2: (1.0, 1.0, 0.0), 3: (10.0, 1.0, 0.0)}
    squared = {  # squared errors per record and output
        "minmax": {0: (0.0, 0.008, 0.0), 1: (0.4, 0.0, 0.0), 2: (0.03, 0.0, 0.0), 3: (0.0, 0.008, 0.0)},
        "a": {0: (0.5, 0.0, 0.0), 1: (0.0, 0.03, 0.0), 2: (0.0, 0.0, 0.04), 3: (0.5, 0.0, 0.0)},
    }
    names = ("u", "v", "z")
    records = [{"i": np.array(i)} for i in range(4)]

    def ref(name, feeds):
        return np.array([reference[int(feeds["i"])][names.index(name)]])

    def run_of(run):
        def fn(name, feeds):
            i = int(feeds["i"])
            return ref(name, feeds) + np.sqrt(squared[run][i][names.index(name)])

        return Session(fn)

    evaluator = A.Evaluator(fp32, Bound(records), RuntimeOptions())
    got = evaluator.errors({r: (run_of(r), {}) for r in squared}, (Session(ref), [], None), against="minmax")
    # records 0 and 3: a .005 / 3 against .008 / 3 (wins; unscaled, .5 would lose); record 1: .03 / .25
    # = .12 against .4 / 4 = .1 (unscaled v, .03 would win); record 2: .04 (z, unscaled) against .03
    assert evaluator.wins == {"minmax": 0, "a": 2}
    energy = (100 + 4 + 1 + 100, 1 + 0.25 + 1 + 1)
    assert got["a"] == pytest.approx((2 * 0.5 / energy[0] + 0.03 / energy[1] + 0.04) / 3, rel=1e-9)


def test_pooled_errors_divide_by_energies_below_one_too():
    fp32 = _model({"u": TensorProto.FLOAT})
    records = [{"x": np.array([0.5, 0.0], np.float32)}]
    evaluator = A.Evaluator(fp32, Bound(records), RuntimeOptions())
    got = evaluator.errors(
        {"c": (Session(lambda n, f: f["x"] + np.float32(0.1)), {})}, (Session(lambda n, f: f["x"]), [], None)
    )
    assert got["c"] == pytest.approx(2 * 0.1**2 / 0.25, rel=1e-5)


def test_verified_choice_replaces_the_step_of_the_finalist_measured_again():
    """The finalist chosen is the middle one (onnxruntime's percentile): its step is the one replaced."""
    models = {"minmax": _tiny(0.0), "ort-percentile": _tiny(1.0), "mse": _tiny(2.0)}
    evaluator = RealEvaluator({0.0: 0.5, 1.0: 0.25, 2.0: 0.375, 3.0: 0.125}, {0.0: 0, 1.0: 6, 2.0: 6, 3.0: 7}, 8)
    report = {"steps": [{"choice": "a"}, {"choice": "b"}], "passes": 0}
    got = A.verified_choice(evaluator, ["minmax", "ort-percentile", "mse"], models, lambda n: _tiny(3.0), report)
    assert got == A.Choice("ort-percentile", 0.125)
    assert [s["choice"] for s in report["steps"]] == [
        "a",
        "b",
        "minmax, as onnxruntime runs it",
        "ort-percentile, as onnxruntime runs it",
        "mse, as onnxruntime runs it",
    ]
    assert report["steps"][3]["measured_again"] is True and report["steps"][3]["output_error"] == 0.125
    assert "measured_again" not in report["steps"][4] and report["steps"][4]["output_error"] == 0.375


def test_auto_reports_each_pass_to_the_progress(small):
    from pytest_qaccuracy.analysis.calibration import CalibrationOptions, compute_ranges

    fp32, data = small
    progress = CallRecorder()
    with reporting(progress):
        result = compute_ranges(fp32, data, CalibrationOptions(method="auto"))
    starts = [what for kind, what in progress.calls if kind == "start"]
    passes = result.selection["passes"]
    assert starts == [("calibrate", 10), ("calibrate", 10)] + [("auto: measure", 10)] * (passes - 2)
    assert sum(n for kind, n in progress.calls if kind == "advance") == 10 * passes


@pytest.mark.parametrize(("form", "formats"), [("qdq", ["QDQ"]), ("qoperator", ["QDQ", "QOperator"])])
def test_when_min_max_is_chosen_its_model_is_written_once_in_the_form_asked(
    small, tmp_path, monkeypatch, form, formats
):
    """The choices are measured on the QDQ form; onnxruntime writes the min/max model once more only
    for another form (docs/calibration.md, Cost), and that model is the one returned."""
    import onnxruntime.quantization as oq

    from pytest_qaccuracy.analysis.calibration import CalibrationOptions, compute_ranges, quantize_with_ranges

    fp32, data = small
    monkeypatch.setattr(A, "verified_choice", lambda evaluator, final, models, write, report: A.Choice("minmax", 0.5))
    seen = []
    real = oq.quantize_static

    def spy(*args, **kwargs):
        seen.append(kwargs["quant_format"].name)
        return real(*args, **kwargs)

    spy.__signature__ = inspect.signature(real)
    monkeypatch.setattr(oq, "quantize_static", spy)
    options = CalibrationOptions(method="auto", quant_format=form)
    result = compute_ranges(fp32, data, options)
    assert seen == formats
    observed = compute_ranges(fp32, data).ranges
    assert result.ranges == observed and result.selection["chosen"] == "minmax"
    fresh = quantize_with_ranges(fp32, tmp_path / "fresh.onnx", CalibrationResult("minmax", 10, observed), options)
    assert result.model == fresh.read_bytes()


def test_auto_candidates_follow_the_options_given(small):
    """Each candidate is the method of that name with the same options (not the defaults)."""
    from pytest_qaccuracy.analysis.calibration import CalibrationOptions, compute_ranges

    fp32, data = small
    settings = {"percentiles": (5.0, 90.0), "moving_average": (3, 0.5), "quantized_bins": 63}
    result = compute_ranges(fp32, data, CalibrationOptions(method="auto", **settings))
    for method in ("percentile", "moving-average", "kl"):
        ranges = compute_ranges(fp32, data, CalibrationOptions(method=method, **settings)).ranges
        default = compute_ranges(fp32, data, CalibrationOptions(method=method)).ranges
        assert ranges != default  # the settings matter on these records
        for tensor, entry in result.selection["tensors"].items():
            assert entry["candidates"][method]["range"] == pytest.approx(list(ranges[tensor]), rel=1e-6), (
                method,
                tensor,
            )


# --- qdq_params' helpers -------------------------------------------------------------------------


@pytest.fixture
def uncached():
    """scale_zero_point remembers its answers (lru_cache): start without them, so that the test
    computes what it checks (mutmut forks each mutant from a process whose cache is already full)."""
    from pytest_qaccuracy.analysis.calibration import qdq_params

    qdq_params.scale_zero_point.cache_clear()
    return qdq_params


@pytest.mark.parametrize(
    ("lo", "hi", "kind"),
    [
        (-1.0, 3.0, "uint8"),
        (0.5, 8.0, "uint8"),
        (-6.0, -2.0, "int8"),
        (-2.5, 7.25, "int8"),
        (0.0, 0.0, "uint8"),
        (-0.7, 0.3, "uint8"),  # the float32 ends give another scale than float64 ones would
    ],
)
def test_scale_zero_point_is_compute_scale_zp_over_the_whole_type(uncached, lo, hi, kind):
    qmin, qmax, dtype = (0, 255, np.uint8) if kind == "uint8" else (-128, 127, np.int8)
    zero, scale = compute_scale_zp(np.float32(lo), np.float32(hi), dtype(qmin), dtype(qmax))
    got = uncached.scale_zero_point(lo, hi, kind)
    assert got == (np.float32(scale), dtype(zero))
    assert type(got[0]) is np.float32 and type(got[1]) is dtype


def test_scale_zero_point_by_hand(uncached):
    """(-1, 3) in uint8: scale 4 / 255, zero point 0 - (-1) / scale = 63.75 -> 64; int8: 64 - 128."""
    assert uncached.scale_zero_point(-1.0, 3.0, "uint8") == (np.float32(4 / 255), np.uint8(64))
    assert uncached.scale_zero_point(-1.0, 3.0, "int8") == (np.float32(4 / 255), np.int8(-64))


def test_holds_needs_one_scale_and_the_zero_point_of_the_type(uncached):
    scale, zero = uncached.scale_zero_point(-1.0, 3.0, "uint8")

    def holds(s, z) -> bool:
        return uncached._holds(numpy_helper.from_array(s), numpy_helper.from_array(z), (-1.0, 3.0), "uint8")

    assert holds(np.array(scale), np.array(zero))
    assert not holds(np.array([scale, scale]), np.array(zero))  # per channel
    assert not holds(np.array(scale * np.float32(2)), np.array(zero))  # another scale, same zero point
    assert not holds(np.array(scale), np.array(zero + 1, np.uint8))  # same scale, another zero point
    assert not holds(np.array(scale), np.array(64, np.int16))  # the zero point's value, another type


def test_adjusted_ranges_apply_onnxruntimes_relu_clip_and_softmax_rules():
    """A Relu's or Clip's input read by that node alone takes the output's range; a Softmax output is
    [0, 1]; an input read by two nodes keeps its own."""
    from pytest_qaccuracy.analysis.calibration.qdq_params import adjusted_ranges

    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["a"], ["ra"]),
            helper.make_node("Clip", ["b"], ["cb"]),
            helper.make_node("Clip", ["c"], ["cc"]),
            helper.make_node("Neg", ["c"], ["nc"]),
            helper.make_node("Softmax", ["d"], ["sd"]),
            helper.make_node("Sigmoid", ["e"], ["se"]),
        ],
        "rules",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in "abcde"],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("ra", "cb", "cc", "nc", "sd", "se")],
    )
    ranges = {
        "a": (-3.0, 4.0),
        "ra": (0.0, 4.0),
        "b": (-5.0, 9.0),
        "cb": (0.0, 6.0),
        "c": (-2.0, 2.0),
        "cc": (0.0, 1.0),
        "sd": (0.0, 0.75),
        "e": (-1.0, 1.0),
        "se": (0.25, 0.75),
    }
    got = adjusted_ranges(helper.make_model(graph), ranges)
    assert got == {**ranges, "a": (0.0, 4.0), "b": (0.0, 6.0), "sd": (0.0, 1.0)}
    assert ranges["a"] == (-3.0, 4.0)  # the ranges given are not changed


def _relu_qdq(x_scale: float, x_zero: int) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """fp32 ``Relu(x)`` and its QDQ form with the input pair ``x_scale``/``x_zero`` (uint8)."""
    fp32 = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "fp32",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    qdq = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero_point"], ["x_q"]),
            helper.make_node("DequantizeLinear", ["x_q", "x_scale", "x_zero_point"], ["x_dq"]),
            helper.make_node("Relu", ["x_dq"], ["y"]),
        ],
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [
            numpy_helper.from_array(np.float32(x_scale), "x_scale"),
            numpy_helper.from_array(np.uint8(x_zero), "x_zero_point"),
        ],
    )
    opset = [helper.make_opsetid("", 13)]
    return helper.make_model(fp32, opset_imports=opset), helper.make_model(qdq, opset_imports=opset)


def test_a_patched_model_keeps_a_pair_that_is_not_onnxruntimes_plain_rule():
    """x's range (-1, 1) gives onnxruntime's uint8 pair (2/255, 128); moved to (-2, 2) it becomes
    (4/255, 128). A written pair of 0.5 is some other rule's: patched leaves it as written."""
    from pytest_qaccuracy.analysis.calibration.qdq_params import ParamModel

    base = {"x": (-1.0, 1.0)}
    plain_scale, plain_zero = compute_scale_zp(np.float32(-1), np.float32(1), np.uint8(0), np.uint8(255))[::-1]
    fp32, plain = _relu_qdq(float(plain_scale), int(plain_zero))
    moved = ParamModel(plain, fp32, base, "uint8").patched(plain, {"x": (-2.0, 2.0)})
    values = {t.name: numpy_helper.to_array(t) for t in moved.graph.initializer}
    assert values["x_scale"] == np.float32(np.float32(4) / np.float32(255)) and values["x_zero_point"] == 128
    fp32, other = _relu_qdq(0.5, 128)
    kept = ParamModel(other, fp32, base, "uint8").patched(other, {"x": (-2.0, 2.0)})
    values = {t.name: numpy_helper.to_array(t) for t in kept.graph.initializer}
    assert values["x_scale"] == np.float32(0.5) and values["x_zero_point"] == 128


# --- a weight's scale raised for its int32 bias (qdq_params) ------------------------------------

_BIAS_LEAST = 1.0001 * 2.0 / (2.0**32 - 2.0)  # the least bias scale per unit of |b|


def _ort_raise(x_scale, scale, bias, per_channel):
    """onnxruntime's own ``_adjust_weight_scale_for_int32_bias`` (it reads nothing of its quantizer)."""
    from onnxruntime.quantization.qdq_quantizer import QDQQuantizer

    done, new = QDQQuantizer._adjust_weight_scale_for_int32_bias(
        None, np.asarray(x_scale, np.float32), scale.copy(), "w", numpy_helper.from_array(bias, "b"), per_channel
    )
    return new if done else scale


def test_a_weight_scale_is_raised_where_its_bias_would_not_fit_int32():
    """Worked by hand: input scale 0.5, bias 1 in both channels: the least bias scale is 1.0001 x 2 /
    (2^32 - 2); channel 0's 0.5 x 1e-10 is below it and is raised to twice it (by the ratio); channel
    1's 0.5 x 1 is not; a zero scale, or a zero input scale, is never raised (no positive product)."""
    from pytest_qaccuracy.analysis.calibration.qdq_params import raised_scale

    bias = np.array([1.0, 1.0, 1.0], np.float32)
    got = raised_scale(np.array([1e-10, 1.0, 0.0], np.float32), np.float32(0.5), bias, per_channel=True)
    assert got.dtype == np.float32
    assert got[0] == np.float32(np.float64(np.float32(1e-10)) * (_BIAS_LEAST / (0.5 * np.float64(np.float32(1e-10)))))
    assert got[0] == pytest.approx(2 * _BIAS_LEAST, rel=1e-6) and got[1] == 1.0 and got[2] == 0.0
    unchanged = raised_scale(np.array([1e-10], np.float32), np.float32(0.0), bias[:1], per_channel=True)
    assert unchanged[0] == np.float32(1e-10)
    # per tensor: the bias's largest magnitude, 0 included: -3 among (-3, 1) needs three times the scale of 1
    one = raised_scale(np.array(1e-12, np.float32), np.float32(0.5), np.array([-3.0, 1.0], np.float32), False)
    assert one.shape == () and one == pytest.approx(2 * 3 * _BIAS_LEAST, rel=1e-6)
    positive = raised_scale(np.array(1e-12, np.float32), np.float32(0.5), np.array([2.0, 1.0], np.float32), False)
    assert positive == pytest.approx(2 * 2 * _BIAS_LEAST, rel=1e-6)


@pytest.mark.parametrize("per_channel", [True, False])
def test_raised_scales_are_onnxruntimes_bit_for_bit(per_channel):
    from pytest_qaccuracy.analysis.calibration.qdq_params import raised_scale, raises_weight_scales

    if not raises_weight_scales(False):
        pytest.skip("this onnxruntime (1.18) raises no weight scale: nothing to compare with")
    rng = np.random.default_rng(3)
    for trial in range(40):
        n = 7 if per_channel else 1
        # scales spread across the boundary: some raised, some not, some zero
        scale = (10.0 ** rng.uniform(-13, -6, n)).astype(np.float32)
        scale[rng.random(n) < 0.1] = 0.0
        bias = (rng.standard_normal(n if per_channel else 5) * 10.0 ** rng.uniform(-3, 2)).astype(np.float32)
        x = np.float32(10.0 ** rng.uniform(-4, 0))
        want = _ort_raise(x, scale if per_channel else scale.reshape(()), bias, per_channel)
        got = raised_scale(scale if per_channel else scale.reshape(()), x, bias, per_channel)
        assert got.shape == np.shape(want) and np.array_equal(got, want), trial


@pytest.mark.parametrize("data_type", [TensorProto.INT8, TensorProto.INT16])
def test_a_symmetric_scale_is_onnxruntimes_per_channel_and_per_tensor(data_type):
    """Against onnxruntime's ``compute_data_quant_params`` (symmetric), channel by channel along
    each axis, and per tensor; an all-zero channel gets 1.0, a one-signed channel's range takes 0."""
    from pytest_qaccuracy.analysis.calibration.qdq_params import raises_weight_scales

    if not raises_weight_scales(False):
        pytest.skip("copies the quantizer that raises weight scales; onnxruntime 1.18's is never patched")
    from onnxruntime.quantization.quant_utils import compute_data_quant_params

    from pytest_qaccuracy.analysis.calibration.qdq_params import symmetric_scale

    rng = np.random.default_rng(4)
    w = (rng.standard_normal((5, 3, 2, 2)) * 0.2).astype(np.float32)
    w[1] = 0.0
    w[2] = np.abs(w[2])  # all positive
    w[3] = -np.abs(w[3]) * 1e-40  # tiny and negative: a subnormal scale, below float32's smallest normal
    w[4] = 0.0
    w[4, 0, 0, 0] = np.float32(127) * np.finfo(np.float32).tiny  # a scale of exactly the smallest normal: kept
    for axis in range(w.ndim):
        got = symmetric_scale(w, axis, data_type)
        want = [compute_data_quant_params(w.take(i, axis).ravel(), data_type, True)[1] for i in range(w.shape[axis])]
        assert got.dtype == np.float32 and np.array_equal(got, np.array(want, np.float32)), axis
    assert symmetric_scale(w, None, data_type).shape == ()
    assert symmetric_scale(w, None, data_type) == compute_data_quant_params(w.ravel(), data_type, True)[1]
    assert symmetric_scale(w, 0, data_type)[1] == 1.0 and symmetric_scale(w, 0, data_type)[3] == 1.0
    if data_type == TensorProto.INT8:
        assert symmetric_scale(w, 0, data_type)[4] == np.finfo(np.float32).tiny


@pytest.mark.parametrize("dtype", [np.int8, np.int16])
def test_a_weight_is_quantized_as_onnxruntime_quantizes_it(dtype):
    """Against onnxruntime's ``quantize_nparray`` with zero point 0: halves to even, the type's full
    range as the clip (-128 for int8, though the symmetric scale spans -127..127)."""
    from pytest_qaccuracy.analysis.calibration.qdq_params import raises_weight_scales

    if not raises_weight_scales(False):
        pytest.skip("copies the quantizer that raises weight scales; onnxruntime 1.18's is never patched")
    from onnxruntime.quantization.quant_utils import quantize_nparray

    from pytest_qaccuracy.analysis.calibration.qdq_params import quantize_weight

    onnx_type = TensorProto.INT8 if dtype == np.int8 else TensorProto.INT16
    rng = np.random.default_rng(6)
    w = (rng.standard_normal((4, 9)) * 2).astype(np.float32)
    w[0, :4] = [0.5, 1.5, -2.5, -1e5]  # ties, and a value far past the range
    scale = np.array([0.25, 0.01, 1e-4, 3.0], np.float32)
    got = quantize_weight(w, scale.reshape(4, 1), np.dtype(dtype))
    want = np.stack([quantize_nparray(onnx_type, w[i], scale[i], dtype(0)) for i in range(4)])
    assert got.dtype == dtype and np.array_equal(got, want)
    assert got[0, 3] == np.iinfo(dtype).min
    # float32 division, as onnxruntime divides: a float64 one rounds some quotients the other way
    many = rng.uniform(-1, 1, 200_000).astype(np.float32)
    step = np.float32(3e-3)
    want = quantize_nparray(onnx_type, many, step, dtype(0))
    assert np.array_equal(quantize_weight(many, step, np.dtype(dtype)), want)
    assert not np.array_equal(np.round(many.astype(np.float64) / np.float64(step)), want.astype(np.float64))
    assert list(quantize_weight(w[0, :3], np.float32(1.0), np.dtype(dtype))) == [0, 2, -2]


def _small_weights_models(tmp_path: Path, per_channel: bool, make: Any = None, records: np.ndarray | None = None):
    """The min/max QDQ model of ``make`` (default ``small_weights_net``) as onnxruntime writes it, its
    ParamModel, and the ranges ten times wider (a raised weight scale is its own there)."""
    from pytest_qaccuracy.analysis.calibration import CalibrationOptions, compute_ranges
    from pytest_qaccuracy.analysis.calibration.qdq_params import ParamModel
    from pytest_qaccuracy.analysis.calibration.quantize import quantize_with_ranges
    from pytest_qaccuracy.model.loading import load_model
    from tests.modelzoo import random_inputs, small_weights_net

    fp32 = (make or small_weights_net)(tmp_path / "net.onnx")
    np.savez(tmp_path / "calib.npz", x=random_inputs(8) if records is None else records)
    observed = compute_ranges(fp32, tmp_path / "calib.npz").ranges
    form = CalibrationOptions(activation_type="int8", per_channel=per_channel)
    qdq = load_model(quantize_with_ranges(fp32, tmp_path / "qdq.onnx", CalibrationResult("m", 8, observed), form))
    params = ParamModel(qdq, load_model(fp32), observed, "int8")
    wider = {t: (10 * observed[t][0], 10 * observed[t][1]) for t in params.tensors}
    return qdq, params, wider


def _values(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _set(model: onnx.ModelProto, name: str, value: np.ndarray) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    target = next(t for t in out.graph.initializer if t.name == name)
    target.CopyFrom(numpy_helper.from_array(value, name))
    return out


@pytest.mark.parametrize("per_channel", [True, False])
def test_a_weight_that_does_not_check_out_is_left_as_written(tmp_path, per_channel):
    """The raise is redone only where the written model agrees with it: a written scale that the
    rule does not give at the min/max input scale, a written weight that the scale does not give, a
    non-zero zero point, or a weight shared by two biases stay as written (the bias is still
    quantized again); untouched, the same model has conv2's scale lowered and its weight quantized again."""
    from pytest_qaccuracy.analysis.calibration.qdq_params import raises_weight_scales

    if not raises_weight_scales(False):
        pytest.skip("this onnxruntime (1.18) raises no weight scale")
    qdq, params, wider = _small_weights_models(tmp_path, per_channel)
    written = _values(qdq)
    moved = _values(params.patched(qdq, wider))
    assert not np.array_equal(moved["w2_scale"], written["w2_scale"])
    assert not np.array_equal(moved["w2_quantized"], written["w2_quantized"])
    tampered = {
        "scale": _set(qdq, "w2_scale", written["w2_scale"] * np.float32(2)),
        "weight": _set(qdq, "w2_quantized", np.flip(written["w2_quantized"], axis=0).copy()),
        "zero point": _set(qdq, "w2_zero_point", np.ones_like(written["w2_zero_point"])),
    }
    for what, model in tampered.items():
        before, after = _values(model), _values(params.patched(model, wider))
        assert np.array_equal(after["w2_scale"], before["w2_scale"]), what
        assert np.array_equal(after["w2_quantized"], before["w2_quantized"]), what
        assert not np.array_equal(after["b2_quantized"], before["b2_quantized"]), what


def test_a_weight_two_biases_share_is_left_as_written(tmp_path):
    """onnxruntime raises a shared weight's scale for each bias in turn; the patch does not redo that
    and leaves the weight as written (the bias is still quantized again)."""
    from tests.modelzoo import random_inputs, shared_weight_net

    records = random_inputs(4, size=8, seed=9)[:, :, :2]
    qdq, params, wider = _small_weights_models(tmp_path, True, shared_weight_net, records)
    before, after = _values(qdq), _values(params.patched(qdq, wider))
    scale = next(n for n in before if n.startswith("w") and n.endswith("_scale"))
    quantized = next(n for n in before if n.startswith("w") and n.endswith("_quantized"))
    assert np.array_equal(after[scale], before[scale]) and np.array_equal(after[quantized], before[quantized])
    assert not np.array_equal(after["b1_quantized"], before["b1_quantized"])


class _Floats:
    """What ``ParamModel._raise_weight`` reads of its model: the fp32 initializers by name."""

    def __init__(self, floats: Mapping[str, onnx.TensorProto]) -> None:
        self._floats = dict(floats)


def _ort_written(w: np.ndarray, bias: np.ndarray, x: float, per_channel: bool) -> tuple[np.ndarray, np.ndarray]:
    """onnxruntime's own weight scale and int8 weight for input scale ``x`` (its symmetric scale per
    channel along axis 0 or per tensor, raised for the bias, the weight quantized with it)."""
    from onnxruntime.quantization.quant_utils import compute_data_quant_params, quantize_nparray

    rows = [w[i] for i in range(w.shape[0])] if per_channel else [w]
    plain = np.array([compute_data_quant_params(r.ravel(), TensorProto.INT8, True)[1] for r in rows], np.float32)
    scale = _ort_raise(np.float32(x), plain if per_channel else plain.reshape(()), bias, per_channel)
    q = [
        quantize_nparray(TensorProto.INT8, r.ravel(), s, np.int8(0)).reshape(r.shape)
        for r, s in zip(rows, scale.reshape(-1), strict=True)
    ]
    return scale, np.stack(q) if per_channel else q[0]


def _weight_case(per_channel: bool):
    """Channel 0 about 1e-9 (raised at both input scales), 1 about 1e-7 (raised at 0.01, not at
    0.1), 2 plain; biases of three magnitudes. Per tensor: every channel about 1e-7."""
    rng = np.random.default_rng(12)
    w = rng.standard_normal((3, 2, 2)).astype(np.float32)
    w *= np.array([1e-9, 1e-7, 0.5] if per_channel else [1e-7] * 3, np.float32).reshape(3, 1, 1)
    bias = np.array([0.5, 0.25, 0.1], np.float32)
    scale, q = _ort_written(w, bias, 0.01, per_channel)
    inits = {
        "w_quantized": numpy_helper.from_array(q, "w_quantized"),
        "w_scale": numpy_helper.from_array(scale, "w_scale"),
        "w_zero_point": numpy_helper.from_array(np.zeros(scale.shape, np.int8), "w_zero_point"),
    }
    return w, bias, inits


@pytest.mark.parametrize("per_channel", [True, False])
def test_a_raised_weight_is_set_as_onnxruntime_sets_it_for_the_new_input_scale(per_channel):
    """Written for input scale 0.01 by onnxruntime's own functions; patched for 0.1: the scale and
    int8 weight onnxruntime gives for 0.1 (channel 1 back to its own scale; per tensor, raised less)."""
    from pytest_qaccuracy.analysis.calibration.qdq_params import ParamModel, Weight, raises_weight_scales

    if not raises_weight_scales(False):
        pytest.skip("this onnxruntime (1.18) raises no weight scale")
    w, bias, inits = _weight_case(per_channel)
    floats = _Floats({"w": numpy_helper.from_array(w, "w")})
    weight = Weight("w_quantized", "w_zero_point", 0)
    ParamModel._raise_weight(floats, inits, weight, "w_scale", bias, np.float32(0.01), np.float32(0.1))
    scale, q = _ort_written(w, bias, 0.1, per_channel)
    assert np.array_equal(numpy_helper.to_array(inits["w_scale"]), scale)
    assert numpy_helper.to_array(inits["w_scale"]).dtype == np.float32
    assert np.array_equal(numpy_helper.to_array(inits["w_quantized"]), q)
    was, _ = _ort_written(w, bias, 0.01, per_channel)
    assert not np.array_equal(scale, was)  # the case moves the scale


@pytest.mark.parametrize(
    "change",
    [
        "no float weight",
        "no quantized weight",
        "no zero point",
        "uint8 weight",
        "non-zero zero point",
        "no axis",
        "axis past the rank",
        "negative axis",
        "channels and scales differ",
        "bias and scales differ",
        "written scale not onnxruntime's",
        "written weight not from its scale",
    ],
)
def test_a_weight_that_does_not_check_out_by_hand_is_left_as_written(change):
    """Each thing ``_raise_weight`` must find before it moves a weight, taken away in turn from the
    per-channel case that moves (previous test): the weight and its scale stay as written."""
    from pytest_qaccuracy.analysis.calibration.qdq_params import ParamModel, Weight, raises_weight_scales

    if not raises_weight_scales(False):
        pytest.skip("this onnxruntime (1.18) raises no weight scale")
    w, bias, inits = _weight_case(True)
    floats = {"w": numpy_helper.from_array(w, "w")}
    axis = 0
    q = numpy_helper.to_array(inits["w_quantized"])
    if change == "no float weight":
        floats = {}
    elif change == "no quantized weight":
        del inits["w_quantized"]
    elif change == "no zero point":
        del inits["w_zero_point"]
    elif change == "uint8 weight":
        inits["w_quantized"] = numpy_helper.from_array(q.view(np.uint8), "w_quantized")
    elif change == "non-zero zero point":
        inits["w_zero_point"] = numpy_helper.from_array(np.array([0, 1, 0], np.int8), "w_zero_point")
    elif change in ("no axis", "axis past the rank", "negative axis"):
        axis = {"no axis": None, "axis past the rank": 3, "negative axis": -3}[change]
    elif change == "channels and scales differ":
        floats = {"w": numpy_helper.from_array(np.concatenate([w, w]), "w")}
    elif change == "bias and scales differ":
        bias = np.concatenate([bias, bias])
    elif change == "written scale not onnxruntime's":
        scale = numpy_helper.to_array(inits["w_scale"]).copy()
        scale[2] *= np.float32(1.5)
        inits["w_scale"] = numpy_helper.from_array(scale, "w_scale")
    elif change == "written weight not from its scale":
        moved = q.copy()
        moved[1, 0, 0] += 1
        inits["w_quantized"] = numpy_helper.from_array(moved, "w_quantized")
    before = {k: numpy_helper.to_array(v).copy() for k, v in inits.items()}
    weight = Weight("w_quantized", "w_zero_point", axis)
    ParamModel._raise_weight(_Floats(floats), inits, weight, "w_scale", bias, np.float32(0.01), np.float32(0.1))
    after = {k: numpy_helper.to_array(v) for k, v in inits.items()}
    assert before.keys() == after.keys() and all(np.array_equal(before[k], after[k]) for k in before), change


def test_sessions_are_made_in_the_pool_once_per_model(monkeypatch):
    """``Evaluator.sessions`` builds every distinct model's session in its worker threads (onnxruntime
    releases the GIL while it builds), once per model object, and names each as given."""
    import threading

    made: list[tuple[int, str]] = []

    def fake_session(model, options, label):
        made.append((id(model), threading.current_thread().name))
        return object()

    monkeypatch.setattr(A, "_session", fake_session)
    evaluator = A.Evaluator(_tiny(0.0), Bound([{}]), RuntimeOptions(threads=0))
    one, two = _tiny(1.0), _tiny(2.0)
    got = evaluator.sessions({"a": one, "b": two, "a again": one})
    assert sorted(i for i, _ in made) == sorted([id(one), id(two)])
    assert all(name != threading.main_thread().name for _, name in made)
    assert got["a"] is got["a again"] is evaluator.session(one) and got["b"] is not got["a"]
    assert len(made) == 2  # asked again, not made again


def test_a_session_is_made_at_the_optimization_asked_for_else_the_options_own():
    """The probe's session is made at onnxruntime's basic level (``PROBE_OPTIMIZATION``), every other
    session at the level the runtime options give; the level reaches onnxruntime's own options."""
    import onnxruntime as ort

    evaluator = A.Evaluator(_tiny(0.0), Bound([{}]), RuntimeOptions(optimization="extended"))
    probe, quantized = _tiny(1.0), _tiny(2.0)
    levels = ort.GraphOptimizationLevel
    got = evaluator.session(probe, "probe model", "basic").get_session_options().graph_optimization_level
    assert got == levels.ORT_ENABLE_BASIC
    got = evaluator.session(quantized).get_session_options().graph_optimization_level
    assert got == levels.ORT_ENABLE_EXTENDED


def test_each_writer_raises_weight_scales_only_where_its_onnxruntime_does(tmp_path, monkeypatch):
    """The QDQ writer (``QDQQuantizer``) and the QOperator writer (``ONNXQuantizer``) learnt the
    raise in different releases (1.20 has it in QDQ only): without it in one writer, a model of that
    form keeps its weight as written while the other form's moves."""
    from onnxruntime.quantization.onnx_quantizer import ONNXQuantizer
    from onnxruntime.quantization.qdq_quantizer import QDQQuantizer

    from pytest_qaccuracy.analysis.calibration import CalibrationOptions
    from pytest_qaccuracy.analysis.calibration.qdq_params import raises_weight_scales
    from pytest_qaccuracy.analysis.calibration.quantize import quantize_with_ranges
    from pytest_qaccuracy.model.loading import load_model

    if not (raises_weight_scales(False) and raises_weight_scales(True)):
        pytest.skip("needs an onnxruntime whose two writers raise weight scales (1.32 does)")
    qdq, params, wider = _small_weights_models(tmp_path, False)
    form = CalibrationOptions(activation_type="int8", quant_format="qoperator")  # as the QDQ model's
    written = quantize_with_ranges(
        tmp_path / "net.onnx", tmp_path / "qop.onnx", CalibrationResult("m", 8, params._base), form
    )
    qop = load_model(written)
    qop_scale = next(t.name for t in qop.graph.initializer if t.name.startswith("w2") and t.name.endswith("scale"))
    for missing, moves in ((ONNXQuantizer, {"qdq"}), (QDQQuantizer, {"qop"})):
        with monkeypatch.context() as patch:
            patch.delattr(missing, "_adjust_weight_scale_for_int32_bias")
            assert raises_weight_scales(missing is ONNXQuantizer) is False
            assert raises_weight_scales(missing is QDQQuantizer) is True
            moved = set()
            for form, model, scale in (("qdq", qdq, "w2_scale"), ("qop", qop, qop_scale)):
                before, after = _values(model), _values(params.patched(model, wider))
                if not np.array_equal(before[scale], after[scale]):
                    moved.add(form)
            assert moved == moves, missing.__name__
