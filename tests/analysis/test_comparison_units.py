"""Unit tests of the comparison's own modules, in pytest's own process (the `comparison` mutation
group, docs/testing.md): the per-tensor trackers and the layer rankings of `compare.py`, the output
statistics of `outputs.py` (scores, top-k plans, elements outside a tolerance, task values),
the edge index of `partial.py` and the gate plumbing of `agreement_pass.py`.

Expected values are worked by hand from the documented formulas (docs/metrics.md, the docstrings'
rules), never read back from the code under test.
"""

from __future__ import annotations

import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from pytest_qaccuracy.analysis import agreement_pass as agreement_module
from pytest_qaccuracy.analysis import compare as compare_module
from pytest_qaccuracy.analysis.agreement_pass import AgreementPass
from pytest_qaccuracy.analysis.compare import first_jump, worst_layers
from pytest_qaccuracy.analysis.outputs import (
    OutputMeasure,
    OutputStats,
    RelativeStats,
    TaskRun,
    TaskValue,
    _finite,
    _integer_outputs,
    _RelativeTracker,
    measure_outputs,
    parse_scores,
    plan_topk,
)
from pytest_qaccuracy.analysis.partial import OUTPUT, QdqGraph, QuantizedNode, dirty_nodes
from pytest_qaccuracy.analysis.results import ComparisonResult, LayerResult
from pytest_qaccuracy.analysis.slices import SliceSpec
from pytest_qaccuracy.backend.agreement import SESSION_CONFIG
from pytest_qaccuracy.backend.scheme import get_scheme
from pytest_qaccuracy.data import load_dataset
from pytest_qaccuracy.data.binding import Batch
from pytest_qaccuracy.errors import CheckError, DataError, InputError, ModelError
from pytest_qaccuracy.metrics.task import TaskContext, TaskSpec
from pytest_qaccuracy.metrics.topk import ScoreLayout
from pytest_qaccuracy.model import ModelPair
from pytest_qaccuracy.model.quant_params import QuantParams
from pytest_qaccuracy.runtime import RuntimeOptions

# -- compare.py: rankings ------------------------------------------------------------------------


def _result(values: list[float | None], metric: str = "sqnr", higher: bool | None = None, orders=None):
    orders = list(range(len(values))) if orders is None else orders
    layers = [
        LayerResult(f"t{order}", f"t{order}_q", None, None, order, {metric: value})
        for order, value in zip(orders, values, strict=True)
    ]
    better = {} if higher is None else {metric: higher}
    return ComparisonResult("a", "b", "d", 1, {metric: metric}, [], layers, higher_is_better=better)


def _orders(layers) -> list[int]:
    return [layer.order for layer in layers]


def test_worst_layers_rank_by_the_metrics_direction_with_undefined_last() -> None:
    assert _orders(worst_layers(_result([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], "mse"), "mse")) == [5, 4, 3, 2, 1]
    result = _result([0.5, None, 2.0, 1.0], "mse", higher=False)
    assert _orders(worst_layers(result, "mse")) == [2, 3, 0, 1]
    assert _orders(worst_layers(result, "mse", count=2)) == [2, 3]
    # a metric not in higher_is_better ranks as lower-is-better
    assert _orders(worst_layers(_result([0.5, None, 2.0, 1.0], "mse"), "mse", 3)) == [2, 3, 0]
    cosine = _result([0.9, 0.5, None, 0.99, 0.7], "cosine", higher=True)
    assert _orders(worst_layers(cosine, "cosine")) == [1, 4, 0, 3, 2]
    assert _orders(worst_layers(cosine, "cosine", 1)) == [1]


def test_first_jump_in_sqnr_is_a_drop_of_six_db_against_the_layer_before() -> None:
    # steps 2, 7: the third layer (order 2) is the jump
    assert first_jump(_result([40.0, 38.0, 31.0, 20.0], higher=True)).order == 2
    # exactly 6 dB is a jump, before a larger one
    assert first_jump(_result([40.0, 34.0, 20.0], higher=True)).order == 1
    # no step reaches 6 dB: the largest worsening (5.5 dB into order 1)
    assert first_jump(_result([40.0, 34.5, 30.0], higher=True)).order == 1
    # a smaller factor finds the first 5.5 dB step
    assert first_jump(_result([40.0, 44.0, 38.5, 30.0], higher=True), factor_db=5.5).order == 2
    # nothing worsens
    assert first_jump(_result([30.0, 35.0, 40.0], higher=True)) is None
    assert first_jump(_result([30.0, 30.0], higher=True)) is None
    assert first_jump(_result([], higher=True)) is None
    # topological order, not list order; undefined layers are skipped (40 -> 30 is a 10 dB step)
    assert first_jump(_result([30.0, 40.0, 39.0], higher=True, orders=[2, 0, 1])).order == 2
    assert first_jump(_result([40.0, None, 30.0], higher=True)).order == 2


def test_first_jump_elsewhere_is_an_error_that_at_least_doubles() -> None:
    # mse: relative steps 0.5 then exactly 1.0
    assert first_jump(_result([0.25, 0.375, 0.75], "mse", higher=False), "mse").order == 2
    # steps 0.5, 0.5: no jump, the first of the largest steps
    assert first_jump(_result([0.25, 0.375, 0.5625], "mse", higher=False), "mse").order == 1
    # a metric not in higher_is_better is an error (lower is better)
    assert first_jump(_result([0.25, 0.375, 0.75], "mse"), "mse").order == 2
    assert first_jump(_result([0.75, 0.375], "mse"), "mse") is None
    # an error improving is no worsening
    assert first_jump(_result([0.5, 0.25], "mse", higher=False), "mse") is None
    # from an error of 0 the step is measured against 1e-12: 2e-12 is a jump already
    assert first_jump(_result([0.0, 2e-12, 2e-10], "mse", higher=False), "mse").order == 1
    # higher-is-better: the distance from 1 doubles (1/16 -> 3/32 is half again, 3/32 -> 3/16 doubles)
    assert first_jump(_result([0.9375, 0.90625, 0.8125], "cosine", higher=True), "cosine").order == 2
    assert first_jump(_result([0.9375, 0.96875], "cosine", higher=True), "cosine") is None
    # at exactly 1 the distance is 1e-12
    assert first_jump(_result([1.0, 1.0 - 2e-12, 1.0 - 2e-10], "cosine", higher=True), "cosine").order == 1
    # the dB rule is sqnr's alone: 10 -> 4 drops 6 but grows the distance from 1 by 6/9 only
    assert first_jump(_result([10.0, 4.0, -6.0], "cosine", higher=True), "cosine").order == 2


def test_worsening_formulas() -> None:
    worsening = compare_module._worsening
    assert worsening(40.0, 31.0, "sqnr", True) == 9.0
    assert worsening(0.25, 0.75, "mse", False) == 2.0
    assert worsening(0.0, 3e-12, "mse", False) == pytest.approx(3.0)
    assert worsening(-0.5, -0.25, "x", False) == 0.5  # against |before|
    assert worsening(0.75, 0.5, "cosine", True) == 1.0
    assert worsening(1.0, 1.0 - 1e-12, "cosine", True) == pytest.approx(1.0, rel=1e-3)
    assert worsening(1.5, 1.0, "x", True) == 1.0  # |1 - before|


# -- compare.py: the trackers ---------------------------------------------------------------------


def test_a_trackers_target_names_what_it_compares() -> None:
    assert compare_module._tracker("conv1", "c", None, ["mse"]).target == "layer 'conv1'"
    assert compare_module._tracker("y", "y", None, ["mse"], worst=True).target == "output 'y'"
    view = SliceSpec("boxes", "y[:, 0]")
    assert compare_module._tracker("y", "y", None, ["mse"], worst=True, view=view).target == "output 'boxes'"


def test_a_tracker_keeps_the_five_worst_records_of_each_metric() -> None:
    tracker = compare_module._tracker("y", "y", None, ["mse", "cosine"], worst=True)
    ref = np.ones((4, 2), np.float32)
    # per-record mse: record r's error d in one of two elements -> d^2 / 2
    errors = [0.0, 2.0, 1.0, 3.0]
    test = ref.copy()
    test[:, 0] += errors
    tracker.update(ref, test, 0)
    test2 = np.ones((3, 2), np.float32)
    test2[:, 0] += [4.0, 0.5, 0.25]
    tracker.update(np.ones((3, 2), np.float32), test2, 4)
    worst = tracker.worst_records()
    # records 4 (8.0), 3 (4.5), 1 (2.0), 2 (0.5), 5 (0.125); records 6 and 0 drop out
    assert worst["mse"] == [(4, 8.0), (3, 4.5), (1, 2.0), (2, 0.5), (5, 0.125)]
    # cosine is higher-is-better: the lowest first; per record, f = (1, 1), q = (1 + d, 1)
    cos = {r: (2 + d) / (math.sqrt(2) * math.sqrt((1 + d) ** 2 + 1)) for r, d in enumerate([*errors, 4.0, 0.5, 0.25])}
    expected = sorted(cos.items(), key=lambda rv: rv[1])[:5]
    assert [r for r, _ in worst["cosine"]] == [r for r, _ in expected]
    assert [v for _, v in worst["cosine"]] == pytest.approx([v for _, v in expected], rel=1e-6)
    values, undefined = tracker.results()
    assert values["mse"] == pytest.approx((0 + 2 + 0.5 + 4.5 + 8 + 0.125 + 0.03125) / 7)
    assert undefined == {}
    # a layer keeps no worst records
    layer = compare_module._tracker("conv", "conv", None, ["mse"])
    layer.update(ref, test, 0)
    assert layer.worst is None and layer.worst_records() == {}


def test_a_tracker_says_why_a_metric_is_undefined_and_names_a_shape_misfit() -> None:
    tracker = compare_module._tracker("y", "y", None, ["mse", "srmse"])
    tracker.update(np.zeros((2, 3), np.float32), np.ones((2, 3), np.float32), 0)
    values, undefined = tracker.results()
    assert values == {"mse": 1.0, "srmse": None}
    assert list(undefined) == ["srmse"] and undefined["srmse"]
    bad = compare_module._tracker("y", "y", None, ["mse"])
    bad.update(np.zeros((2, 3), np.float32), np.zeros((2, 4), np.float32), 0)
    assert bad.problem == "shape (3,) in the fp32 model but (4,) in the quantized model"


class _Raises:
    """A metric whose update raises ``error``."""

    higher_is_better = False

    def __init__(self, error: Exception) -> None:
        self.error = error

    def update(self, pair) -> None:
        raise self.error


def test_a_fold_names_the_tensor_of_an_unforeseen_error_and_passes_ours_on() -> None:
    ref, test = {"a": np.zeros((2, 2), np.float32)}, {"a_q": np.zeros((2, 2), np.float32)}
    with ThreadPoolExecutor(1) as pool:
        tracker = compare_module._tracker("a", "a_q", None, ["mse"])
        tracker.metrics = {"x": _Raises(ValueError("boom"))}
        with pytest.raises(CheckError) as err:
            compare_module._fold(pool, [tracker], ref, test, 0, 2)
        assert str(err.value) == "layer 'a': ValueError: boom"
        tracker.metrics = {"x": _Raises(DataError("ours"))}
        with pytest.raises(DataError, match=r"^ours$"):
            compare_module._fold(pool, [tracker], ref, test, 0, 2)
        tracker.problem = "shape"  # a tensor with a problem is not folded again
        compare_module._fold(pool, [tracker], ref, test, 0, 2)


def test_a_scalar_tensor_is_the_value_of_every_record_of_the_batch() -> None:
    out = compare_module._per_record(np.float32(2.5), 3)
    assert out.shape == (3,) and out.tolist() == [2.5, 2.5, 2.5]
    value = np.zeros((2, 4))
    assert compare_module._per_record(value, 2) is value
    tracker = compare_module._tracker("sr", "sr", None, ["max_abs"])
    with ThreadPoolExecutor(1) as pool:
        compare_module._fold(pool, [tracker], {"sr": np.float32(1.0)}, {"sr": np.float32(1.5)}, 0, 3)
    assert tracker.results()[0] == {"max_abs": 0.5}


def test_workers_threads_and_the_whole_tensor_reason() -> None:
    assert compare_module._workers(RuntimeOptions(threads=3)) == 3
    assert compare_module._workers(RuntimeOptions(threads=0)) == max(1, os.cpu_count() or 1)
    assert compare_module._whole_tensor_reason("integer") == "numpy: the integer backend"
    assert compare_module._whole_tensor_reason("onnxruntime") is None


def _opsets(*pairs: tuple[str, int]) -> onnx.ModelProto:
    graph = helper.make_graph([], "g", [], [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in pairs])


def test_own_opset_compares_the_default_domains_versions() -> None:
    own = compare_module._own_opset
    same = SimpleNamespace(fp32=_opsets(("com.microsoft", 1), ("", 13)), quantized=_opsets(("", 13)))
    assert own(same)
    assert not own(SimpleNamespace(fp32=_opsets(("", 13)), quantized=_opsets(("", 17))))
    assert not own(SimpleNamespace(fp32=_opsets(("com.microsoft", 13)), quantized=_opsets(("", 13))))
    # a model without a default-domain opset is not at opset 1
    assert not own(SimpleNamespace(fp32=_opsets(("com.microsoft", 1)), quantized=_opsets(("", 1))))
    assert own(SimpleNamespace(fp32=_opsets(("com.microsoft", 1)), quantized=_opsets(("ai.onnx.ml", 2))))


# -- outputs.py ----------------------------------------------------------------------------------


def test_scores_name_an_output_and_maybe_its_class_axis() -> None:
    outputs = ["logits", "a:b", "x:1"]
    assert parse_scores(None, outputs) is None
    assert parse_scores("logits", outputs) == ("logits", None)
    assert parse_scores("logits:1", outputs) == ("logits", 1)
    assert parse_scores("logits:-1", outputs) == ("logits", -1)
    assert parse_scores("a:b:2", outputs) == ("a:b", 2)
    assert parse_scores("x:1", outputs) == ("x:1", None)  # an output's own name is taken whole
    # an axis int() cannot read is no axis: said as such, not as int()'s own error
    for text in (
        "logits:x",
        "logits:",
        "other:1",
        "a",
        "logits:1.5",
        "logits:--1",
        "logits:X1",
        "logits:\u00b2",
        "logits:-",
    ):
        with pytest.raises(ValueError) as err:
            parse_scores(text, outputs)
        assert str(err.value) == f"scores: no output {text!r} (outputs: logits, a:b, x:1)"


def test_a_named_score_output_is_counted_on_its_axis_or_says_why_not() -> None:
    logits = np.zeros((4, 10), np.float32)
    seq = np.zeros((4, 3, 10), np.float32)
    assert plan_topk({"logits": logits, "seq": seq}, "logits") == ({"logits": ScoreLayout("scores", 1, 1)}, {})
    # without an axis: (records, classes), else classes last
    assert plan_topk({"seq": seq}, "seq") == ({"seq": ScoreLayout("scores", 2, 3)}, {})
    assert plan_topk({"seq": seq}, "seq:1") == ({"seq": ScoreLayout("scores", 1, 10)}, {})
    one = np.zeros((4, 1), np.float32)
    assert plan_topk({"p": one}, "p") == ({}, {"p": "output 'p' float32 (4, 1): 1 class on axis 1"})
    assert plan_topk({"seq": seq}, "seq:0") == (
        {},
        {"seq": "output 'seq' float32 (4, 3, 10): class axis 0 is not an axis after the records"},
    )
    assert plan_topk({"p": one}, "q") == ({}, {"q": "scores: no output 'q' (outputs: p)"})


def test_unnamed_scores_are_the_float_record_class_outputs_else_labels() -> None:
    outputs = {
        "logits": np.zeros((4, 10), np.float32),
        "boxes": np.zeros((4, 3, 4), np.float32),
        "label": np.zeros((4,), np.int64),
        "p": np.zeros((4, 1), np.float32),
    }
    found, problems = plan_topk(outputs)
    assert found == {"logits": ScoreLayout("scores", 1, 1)}
    hint = '; to count per position: scores = "boxes" (classes last) or "boxes:<axis>"'
    assert problems == {
        "boxes": "output 'boxes' float32 (4, 3, 4): not class scores (records, classes)" + hint,
        "label": "output 'label' int64 (4,): labels labels per record",
        "p": "output 'p' float32 (4, 1): not class scores (records, classes)",
    }
    # without class scores, integer labels one per record
    labels = {"label": np.zeros((4,), np.int64), "mask": np.zeros((4, 5), np.int32)}
    assert plan_topk(labels) == (
        {"label": ScoreLayout("labels", 0, 1)},
        {"mask": "output 'mask' int32 (4, 5): labels labels per position (5 per record)"},
    )
    # only the first ``automatic`` outputs (views come after the outputs)
    assert plan_topk(outputs, automatic=1) == ({"logits": ScoreLayout("scores", 1, 1)}, {})
    assert plan_topk(dict(list(outputs.items())[2:]), automatic=1) == ({"label": ScoreLayout("labels", 0, 1)}, {})


def test_elements_outside_the_tolerance_are_counted_with_the_worst_first() -> None:
    # bound = 0.5 + 0.1 * |f|: (0.6, 1.5) and (0.7, 0.9); |q - f| = (0.2, 2.0) and (1.5, 0.7)
    tracker = _RelativeTracker(rtol=0.1, atol=0.5)
    ref = np.array([[1.0, 10.0], [2.0, -4.0]], np.float32)
    test = np.array([[1.2, 12.0], [3.5, -4.7]], np.float32)
    tracker.update(ref, test, 3)
    stats = tracker.result()
    assert (stats.rtol, stats.atol, stats.violations, stats.elements) == (0.1, 0.5, 2, 4)
    assert stats.max_abs == 2.0 and stats.max_rel == 0.75
    # excess over the bound: 0.8 (record 4, [0]) then 0.5 (record 3, [1])
    assert stats.worst == [(4, "[0]", 3.5, 2.0), (3, "[1]", 12.0, 10.0)]
    # a batch within the tolerance adds elements only
    tracker.update(ref, ref, 5)
    again = tracker.result()
    assert (again.violations, again.elements, again.max_abs, again.max_rel) == (2, 8, 2.0, 0.75)


def test_the_five_worst_elements_ties_first_element_first_and_nan_is_kept() -> None:
    tracker = _RelativeTracker(rtol=0.0, atol=0.5)
    tracker.update(np.zeros((1, 7), np.float32), np.ones((1, 7), np.float32), 0)
    stats = tracker.result()
    assert stats.violations == 7 and stats.max_abs == 1.0 and stats.max_rel == math.inf
    assert stats.worst == [(0, f"[{i}]", 1.0, 0.0) for i in range(5)]
    # a larger excess in a later record takes the lead; the smallest of the kept ties drops out
    tracker.update(np.zeros((2, 1), np.float32), np.array([[0.25], [3.0]], np.float32), 1)
    assert tracker.result().worst == [(2, "[0]", 3.0, 0.0), *[(0, f"[{i}]", 1.0, 0.0) for i in range(4)]]
    # a NaN is outside, and max_abs keeps it
    nan = _RelativeTracker(rtol=0.0, atol=0.5)
    nan.update(np.ones((1, 2), np.float32), np.array([[np.nan, 5.0]], np.float32), 0)
    nan.update(np.ones((1, 1), np.float32), np.array([[2.0]], np.float32), 1)
    stats = nan.result()
    assert stats.violations == 3 and math.isnan(stats.max_abs) and math.isnan(stats.max_rel)
    assert stats.worst[0][:2] == (0, "[0]") and math.isnan(stats.worst[0][2])
    assert stats.worst[1:] == [(0, "[1]", 5.0, 1.0), (1, "[0]", 2.0, 1.0)]


def test_a_task_values_drop_is_in_its_metrics_direction() -> None:
    assert TaskValue("acc", "m", "targets", 4, True, 0.75, 0.5).drop == 0.25
    assert TaskValue("err", "m", "targets", 4, False, 0.25, 0.75).drop == 0.5
    assert TaskValue("err", "m", "targets", 4, False, 0.75, 0.25).drop == -0.5
    assert TaskValue("acc", "m", "fp32", 4, True, None, 0.5).drop is None
    assert TaskValue("acc", "m", "fp32", 4, True, 0.5, None).drop is None


def test_finite_reads_numbers_and_refuses_the_rest() -> None:
    assert _finite(np.float32(2.5)) == 2.5 and _finite("3") == 3.0 and _finite(1) == 1.0
    for value in (None, "x", [1, 2], math.inf, -math.inf, math.nan, np.float64("nan")):
        assert _finite(value) is None


class Recorder:
    """A task metric that records its calls and fails where told (``fail``)."""

    def __init__(
        self, fail: str = "", against: str | None = None, log: bool = False, state: str = "", sides: str = "both"
    ) -> None:
        if log:
            LOG.append(self)
        self.higher_is_better = {"hits": True, "misses": False}
        if fail == "create":
            raise RuntimeError("cannot\nsecond line")
        self.fail, self.calls = fail, []
        self.state = {} if against is None else {"against": against}
        if state == "list":  # a state that is no mapping says nothing of what the metric scored against
            self.state = ["against", "labels"]
        self.sides, self.tests = sides, []

    def begin(self, context: TaskContext) -> None:
        self.context = context
        self.calls.append(("begin", context.outputs, context.records))
        if self.fail == "begin":
            raise RuntimeError("first line\nsecond line")

    def update(self, ref, test, targets) -> None:
        self.calls.append(("update", sorted(ref), targets))
        self.tests.append(sorted(test))
        if self.fail == "update":
            raise ValueError("")

    def merge(self, other) -> None:
        raise AssertionError("never merged in a pass")

    def compute(self) -> dict:
        if self.fail == "compute":
            raise KeyError("hits")
        values = {"fp32": {"hits": 3, "misses": 1.5}, "quantized": {"hits": np.float32(2.0), "misses": math.inf}}
        return values if self.sides == "both" else {"fp32": values["fp32"]}


class NoBegin:
    """A task metric without the optional begin."""

    def __init__(self) -> None:
        self.higher_is_better = {"count": True}
        self.seen = 0

    def update(self, ref, test, targets) -> None:
        self.seen += 1

    def merge(self, other) -> None:
        raise AssertionError("never merged in a pass")

    def compute(self) -> dict:
        return {"fp32": {"count": self.seen}, "quantized": {"count": self.seen}}


RECORDER = "tests.analysis.test_comparison_units:Recorder"
LOG: list[Recorder] = []  # the recorders made with log=True, newest last


def _spec(**options) -> TaskSpec:
    return TaskSpec.parse({"metric": RECORDER, **options})


def test_a_task_run_feeds_each_metric_its_records_targets_and_reads_both_sides() -> None:
    run = TaskRun([_spec(), _spec(against="labels", suffix="b")], ["t0", "t1", "t2", "t3"])
    run.begin(TaskContext(("y",), {}, 4))
    run.update({"y": 0}, {"y": 1}, 0, 1)
    run.update({"y": 0}, {"y": 1}, 1, 3)
    assert run.metrics[0].calls == [
        ("begin", ("y",), 4),
        ("update", ["y"], ["t0"]),
        ("update", ["y"], ["t1", "t2", "t3"]),
    ]
    values = run.result()
    assert values == {
        "hits": TaskValue("hits", RECORDER, "targets", 4, True, 3.0, 2.0),
        "misses": TaskValue("misses", RECORDER, "targets", 4, False, 1.5, None),
        "hits_b": TaskValue("hits_b", f"{RECORDER}(against='labels')", "labels", 4, True, 3.0, 2.0),
        "misses_b": TaskValue("misses_b", f"{RECORDER}(against='labels')", "labels", 4, False, 1.5, None),
    }
    # without targets the quantized side is scored against the fp32 model's predictions
    alone = TaskRun([_spec()], None)
    alone.begin(TaskContext(("y",), {}, 2))
    alone.update({"y": 0}, {"y": 1}, 0, 2)
    assert alone.metrics[0].calls[-1] == ("update", ["y"], None)
    assert alone.result()["hits"].against == "fp32" and alone.result()["hits"].records == 2


def test_a_task_run_refuses_targets_that_do_not_fit_and_a_metric_it_cannot_create() -> None:
    with pytest.raises(DataError) as err:
        TaskRun([_spec()], [1, 2, 3]).begin(TaskContext(("y",), {}, 2))
    assert str(err.value) == "3 task targets for 2 records"
    with pytest.raises(InputError) as err:
        TaskRun([_spec(fail="create")], None).begin(TaskContext(("y",), {}, 2))
    assert str(err.value) == f"task metric '{RECORDER}(fail='create')': cannot create it (RuntimeError: cannot)"


@pytest.mark.parametrize(
    ("fail", "where", "error"),
    [
        ("begin", "before the first batch", "RuntimeError: first line"),
        ("update", "on records 2..4", "ValueError: "),
        ("compute", "computing its values", "KeyError: 'hits'"),
    ],
)
def test_a_task_metric_that_raises_is_named_with_where_in_one_line(fail: str, where: str, error: str) -> None:
    label = f"{RECORDER}(fail='{fail}')"
    line = f"task metric '{label}' {where}: {error}"
    run = TaskRun([_spec(fail=fail)], None)
    with pytest.raises(CheckError) as err:
        run.begin(TaskContext(("y",), {}, 5))
        run.update({"y": 0}, {"y": 0}, 2, 3)
        run.result()
    assert str(err.value) == line
    # kept: the metric is set aside (never called again), the other goes on, its values carry the line
    kept = TaskRun([_spec(fail=fail), _spec(suffix="ok")], None, keep_errors=True)
    kept.begin(TaskContext(("y",), {}, 5))
    kept.update({"y": 0}, {"y": 0}, 2, 3)
    kept.update({"y": 0}, {"y": 0}, 0, 1)
    values = kept.result()
    assert kept.errors == {0: line}
    calls = [c[0] for c in kept.metrics[0].calls]
    assert calls == {"begin": ["begin"], "update": ["begin", "update"], "compute": ["begin", "update", "update"]}[fail]
    assert values["hits"] == TaskValue("hits", label, "fp32", 4, True, None, None, line)
    assert values["misses"].error == line and values["misses"].fp32 is None
    assert values["hits_ok"] == TaskValue("hits_ok", RECORDER, "fp32", 4, True, 3.0, 2.0)
    # on one record
    one = TaskRun([_spec(fail="update")], None)
    one.begin(TaskContext(("y",), {}, 5))
    with pytest.raises(CheckError, match=r"on record 3: ValueError"):
        one.update({"y": 0}, {"y": 0}, 3, 1)


# -- partial.py ----------------------------------------------------------------------------------


def test_a_quantized_nodes_edges_by_kind() -> None:
    node = QuantizedNode("conv", "Conv", 3, 0, frozenset({(3, 1)}), frozenset({(3, 0)}), frozenset({(OUTPUT, 0)}))
    assert node.edges("weight") == {(3, 1)}
    assert node.edges("activation") == {(3, 0), (OUTPUT, 0)}
    assert node.edges("node") == node.edges() == {(3, 1), (3, 0), (OUTPUT, 0)}
    with pytest.raises(ValueError) as err:
        node.edges("weights")
    assert str(err.value) == "unknown edge kind 'weights'; expected node, weight or activation"


def _node(op: str, inputs: list[str], outputs: list[str]) -> onnx.NodeProto:
    return helper.make_node(op, inputs, outputs, name=f"{op}_{outputs[0]}")


def test_dirty_nodes_are_those_a_change_reaches_and_the_clean_tensors_they_read() -> None:
    dq = _node("DequantizeLinear", ["w_q", "s"], ["w"])
    conv = _node("MatMul", ["x", "w"], ["a"])
    relu = _node("Relu", ["a"], ["b"])
    add = _node("Add", ["b", "x"], ["c"])
    nodes = [dq, conv, relu, add]
    constants = {"w_q", "s"}
    # the same model: nothing to recompute
    assert dirty_nodes(nodes, nodes, constants) == ([], set())
    # only the last node reads another tensor: it alone, from the cached b and the input x
    cached = [dq, conv, relu, _node("Add", ["b", "y"], ["c"])]
    assert dirty_nodes(nodes, cached, constants) == ([add], {"b", "x"})
    # the MatMul changes: everything after it, and the weight's DequantizeLinear (computed from
    # constants alone, it has no record axis to read from the cache) with it
    cached = [dq, _node("MatMul", ["x", "w2"], ["a"]), relu, add]
    assert dirty_nodes(nodes, cached, constants) == (nodes, {"x"})
    # a node the cache lacks is dirty; an empty optional input is no tensor
    clip = _node("Clip", ["c", "", "hi"], ["d"])
    hi = _node("Constant", [], ["hi"])
    assert dirty_nodes([*nodes, hi, clip], nodes, constants) == ([hi, clip], {"c"})


X_SCALE, W_SCALE, Y_SCALE = 0.5, 0.25, 0.2
W_CODES = np.array([[2, -4], [6, 8]], np.int8)
W_FLOAT = np.array([[0.55, -1.05], [1.45, 2.1]], np.float32)


def _qdq_matmul(mid: str = "m") -> onnx.ModelProto:
    """y = Q/DQ(Q/DQ(x) @ DQ(w)): a MatMul named ``mm`` writing ``mid``, quantized in QDQ form (its
    output pair ``q<mid>``/``dq<mid>``, the codes ``<mid>q``)."""
    tensor = numpy_helper.from_array
    inits = [tensor(np.float32(X_SCALE), "sx"), tensor(np.float32(W_SCALE), "sw"), tensor(np.float32(Y_SCALE), "sy")]
    inits += [tensor(np.int8(0), "z"), tensor(W_CODES, "w_quantized")]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "z"], ["xq"], name="qx"),
        helper.make_node("DequantizeLinear", ["xq", "sx", "z"], ["xd"], name="dqx"),
        helper.make_node("DequantizeLinear", ["w_quantized", "sw", "z"], ["wd"], name="dqw"),
        helper.make_node("MatMul", ["xd", "wd"], [mid], name="mm"),
        helper.make_node("QuantizeLinear", [mid, "sy", "z"], [f"{mid}q"], name=f"q{mid}"),
        helper.make_node("DequantizeLinear", [f"{mid}q", "sy", "z"], ["y"], name=f"dq{mid}"),
    ]
    graph = helper.make_graph(nodes, "g", [_X], [_Y], inits)
    return helper.make_model(graph, opset_imports=_OPSET)


_X = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2])
_Y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 2])
_OPSET = [helper.make_opsetid("", 13)]


def _qdq_pair() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """:func:`_qdq_matmul` and its fp32 model."""
    fp32_graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "f",
        [_X],
        [_Y],
        [numpy_helper.from_array(W_FLOAT, "w")],
    )
    return _qdq_matmul(), helper.make_model(fp32_graph, opset_imports=_OPSET)


def _fake_quant(value: np.ndarray, scale: float) -> np.ndarray:
    """QuantizeLinear then DequantizeLinear to int8 with zero point 0 (ONNX: round half to even)."""
    return (np.clip(np.rint(value / np.float32(scale)), -128, 127) * np.float32(scale)).astype(np.float32)


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(["y"], {"x": x})[0]


def test_a_qdq_graph_indexes_its_edges_and_builds_each_partial_model() -> None:
    quantized, fp32 = _qdq_pair()
    graph = QdqGraph(quantized, fp32)
    act, weight, out = (3, 0), (3, 1), (OUTPUT, 0)
    assert graph.kinds == {act: "activation", weight: "weight", out: "activation"}
    assert graph.sources == {act: "x", weight: "wd::float", out: "m"}
    assert graph.quantized_tensor == {act: "x", out: "m"}
    assert graph.unremovable == [] and graph.all_edges == {act, weight, out}
    assert graph.nodes == [QuantizedNode("mm", "MatMul", 3, 0, frozenset({weight}), frozenset({act}), frozenset({out}))]
    assert graph.edges_of(["mm"], "weight") == {weight} and graph.edges_of(["mm"]) == {act, weight, out}
    x = np.array([[1.3, -0.7]], np.float32)
    xd, wd = _fake_quant(x, X_SCALE), W_CODES.astype(np.float32) * np.float32(W_SCALE)
    for enabled, expected in [
        ({act, weight, out}, _fake_quant(xd @ wd, Y_SCALE)),
        (set(), x @ W_FLOAT),
        ({act, weight}, xd @ wd),
        ({weight, out}, _fake_quant(x @ wd, Y_SCALE)),
        ({act, out}, _fake_quant(xd @ W_FLOAT, Y_SCALE)),
    ]:
        model = graph.build(frozenset(enabled))
        np.testing.assert_allclose(_run(model, x), expected, rtol=1e-6, err_msg=str(enabled))
        assert [o.name for o in model.graph.output] == ["y"]
        assert model.opset_import == quantized.opset_import and model.ir_version == quantized.ir_version
    # an internal tensor exposed too
    model = graph.build(frozenset({act, weight, out}), extra_outputs=["m", "y"])
    assert [o.name for o in model.graph.output] == ["y", "m"]
    # with every edge on, the model's own nodes and weights; off, the float weight and an Identity
    assert [n.name for n in graph.build(graph.all_edges).graph.node] == ["qx", "dqx", "dqw", "mm", "qm", "dqm"]
    off = graph.build(frozenset())
    assert [n.name for n in off.graph.node] == ["mm", "y::float"]
    assert [t.name for t in off.graph.initializer] == ["wd::float"]


def test_a_weight_whose_fp32_value_has_another_shape_cannot_be_removed() -> None:
    """The fp32 'w' (found by the node's name and by the weight's) is (3, 2), the quantized one (2, 2):
    no fp32 value stands for it, so its edge is unremovable, as without the fp32 model."""
    fp32_graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "f",
        [_X],
        [_Y],
        [numpy_helper.from_array(np.ones((3, 2), np.float32), "w")],
    )
    graph = QdqGraph(_qdq_matmul(), helper.make_model(fp32_graph, opset_imports=_OPSET))
    assert graph.unremovable == ["dqw -> mm"]
    assert (3, 1) not in graph.kinds and graph.float_weights == {}


def test_a_qdq_graph_without_the_fp32_model_cannot_remove_a_weight_and_names_nodes() -> None:
    quantized, _ = _qdq_pair()
    graph = QdqGraph(quantized, name="pair.onnx")
    assert graph.unremovable == ["dqw -> mm"]
    assert graph.nodes[0].weights == frozenset() and graph.nodes[0].inputs == {(3, 0)}
    with pytest.raises(ModelError) as err:
        graph.node("conv")
    assert str(err.value) == "pair.onnx: no quantized node 'conv'; quantized nodes: mm"
    _, fp32 = _qdq_pair()
    with pytest.raises(ModelError) as err:
        QdqGraph(fp32, name="f.onnx")
    assert str(err.value).startswith("f.onnx: sensitivity analysis needs a QDQ model (")
    assert "this model is float. Quantize with quant_format=QuantFormat.QDQ" in str(err.value)


def test_the_worst_elements_are_the_largest_excesses_across_batches() -> None:
    # one record of 20 elements, excesses 0, 1 or 2 over atol 0.5 in an irregular order: the five
    # worst are the largest excesses, ties in element order (Python's sort is stable)
    codes = [0, 2, 1, 2, 0, 1, 2, 2, 1, 0, 2, 1, 1, 2, 0, 2, 1, 0, 2, 1]
    test = np.array([[0.75 + c for c in codes]], np.float32)  # |q - f| = 0.75 + code
    tracker = _RelativeTracker(rtol=0.0, atol=0.5)
    tracker.update(np.zeros_like(test), test, 0)
    expected = sorted(range(20), key=lambda i: -codes[i])[:5]
    assert [w[1] for w in tracker.result().worst] == [f"[{i}]" for i in expected]
    assert tracker.result().max_abs == 2.75
    # below 1: the largest difference is its own (not a start of 1)
    small = _RelativeTracker(rtol=0.0, atol=0.125)
    small.update(np.zeros((1, 2), np.float32), np.array([[0.25, 0.5]], np.float32), 0)
    assert small.result().max_abs == 0.5 and small.result().max_rel == math.inf
    # a kept heap of excesses 1..5: an element of excess 1.5 replaces the smallest only
    heap = _RelativeTracker(rtol=0.0, atol=0.5)
    heap.update(np.zeros((5, 1), np.float32), np.array([[1.5], [2.5], [3.5], [4.5], [5.5]], np.float32), 0)
    heap.update(np.zeros((1, 1), np.float32), np.array([[2.0]], np.float32), 5)
    assert [w[0] for w in heap.result().worst] == [4, 3, 2, 1, 5]
    heap.update(np.zeros((1, 1), np.float32), np.array([[1.0]], np.float32), 6)  # smaller than all kept
    assert [w[0] for w in heap.result().worst] == [4, 3, 2, 1, 5]


def test_tied_worst_elements_of_a_large_batch_are_the_first_ones() -> None:
    # 256 elements with excesses 0.25, 0.5, 0.75, 1 repeating: the five worst are the first five of
    # excess 1 (elements 3, 7, 11, ...), as assert_relative lists them, even where numpy's default
    # sort would put other equal excesses first
    test = np.tile(np.array([0.75, 1.0, 1.25, 1.5], np.float32), 64)[None]
    tracker = _RelativeTracker(rtol=0.0, atol=0.5)
    tracker.update(np.zeros_like(test), test, 0)
    assert [w[1] for w in tracker.result().worst] == [f"[{i}]" for i in (3, 7, 11, 15, 19)]


def test_output_stats_write_task_values_by_name_and_read_back() -> None:
    stats = OutputStats(
        {"y": {"records": 4}},
        {"y": RelativeStats(0.1, 0.5, 2, 4, 2.0, 0.75, [(4, "[0]", 3.5, 2.0)])},
        {"z": "why"},
        {
            "hits": TaskValue("hits", "m", "targets", 4, True, 0.75, 0.5),
            "miss": TaskValue("miss", "m", "fp32", 4, False, None, None, "task metric 'm' on record 0: E: x"),
        },
    )
    data = stats.to_dict()
    assert data["task"] == {
        "hits": {
            "metric": "m",
            "against": "targets",
            "records": 4,
            "higher_is_better": True,
            "fp32": 0.75,
            "quantized": 0.5,
            "drop": 0.25,
        },
        "miss": {
            "metric": "m",
            "against": "fp32",
            "records": 4,
            "higher_is_better": False,
            "fp32": None,
            "quantized": None,
            "drop": None,
            "error": "task metric 'm' on record 0: E: x",
        },
    }
    back = OutputStats.from_dict(json.loads(json.dumps(data)))
    assert back == stats and back.task["hits"].name == "hits" and back.task["miss"].name == "miss"


# -- outputs.py: the measure folded into a pass ---------------------------------------------------


class _Data:
    """What OutputMeasure reads of a dataset: its labels, its targets and its length."""

    def __init__(self, labels=None, targets=None, records: int = 4) -> None:
        self._labels, self._targets, self.records = labels, targets, records

    def labels(self):
        return self._labels

    def targets(self):
        return self._targets

    def __len__(self) -> int:
        return self.records


SCORES = np.array([[3, 1, 0], [0, 3, 1], [1, 0, 3], [3, 0, 1]], np.float32)


def test_a_measure_counts_outputs_and_views_with_the_datasets_labels_as_task_targets() -> None:
    measure = OutputMeasure(
        atol=0.5, slices=[SliceSpec("first", "y[:, 0:2]")], tasks=[_spec()], metadata={"chars": "ab"}
    )
    measure.begin(_Data(labels=np.array([0, 1, 2, 1], np.int64)), ["y"])
    assert measure.names == ["y", "first"]
    assert measure.tasks.targets == [0, 1, 2, 1] and {type(t) for t in measure.tasks.targets} == {int}
    assert measure.tasks.keep_errors is False
    context = measure.tasks.metrics[0].context
    assert context == TaskContext(("y", "first"), {"chars": "ab"}, 4)
    assert sorted(measure.relative) == ["first", "y"]
    assert (measure.relative["y"].rtol, measure.relative["y"].atol) == (0.0, 0.5)
    test = SCORES.copy()
    test[0, 2] += 1.0  # record 0: the last class moves by 1 (outside 0.5), outside the view
    test[3, 1] += 4.0  # record 3: class 1 wins in the quantized model, inside the view
    measure.update({"y": SCORES[:2]}, {"y": test[:2]}, 0, 2)
    measure.update({"y": SCORES[2:]}, {"y": test[2:]}, 2, 2)
    stats = measure.result()
    assert list(stats.topk) == ["y"] and stats.problems == {}
    assert stats.relative["y"].violations == 2 and stats.relative["y"].elements == 12
    assert stats.relative["y"].worst == [(3, "[1]", 4.0, 0.0), (0, "[2]", 1.0, 0.0)]
    assert stats.relative["first"].violations == 1 and stats.relative["first"].elements == 8
    assert stats.relative["first"].worst == [(3, "[1]", 4.0, 0.0)]
    # the task metric saw both outputs and the view, and each batch's labels
    calls = measure.tasks.metrics[0].calls
    assert calls[1:] == [("update", ["first", "y"], [0, 1]), ("update", ["first", "y"], [2, 1])]
    assert stats.task["hits"] == TaskValue("hits", RECORDER, "targets", 4, True, 3.0, 2.0)


def test_a_measures_targets_are_given_else_the_datasets_else_its_labels_else_none() -> None:
    labels = np.array([1, 0], np.int64)
    given = OutputMeasure(tasks=[_spec()], targets=["a", "b"], keep_task_errors=True)
    given.begin(_Data(labels, targets=["c", "d"], records=2), ["y"])
    assert given.tasks.targets == ["a", "b"] and given.tasks.keep_errors is True
    stored = OutputMeasure(tasks=[_spec()])
    stored.begin(_Data(labels, targets=["c", "d"], records=2), ["y"])
    assert stored.tasks.targets == ["c", "d"]
    # explicit labels win over the dataset's, and become the targets
    named = OutputMeasure(labels=np.array([5, 6]), tasks=[_spec()])
    named.begin(_Data(labels, records=2), ["y"])
    assert named.tasks.targets == [5, 6] and named.labels.tolist() == [5, 6]
    alone = OutputMeasure(tasks=[_spec()])
    alone.begin(_Data(records=2), ["y"])
    assert alone.tasks.targets is None and alone.labels is None
    assert OutputMeasure().tasks is None
    # rtol alone or atol alone count elements; neither counts none
    rtol = OutputMeasure(rtol=0.25)
    rtol.begin(_Data(), ["y", "z"])
    assert {n: (r.rtol, r.atol) for n, r in rtol.relative.items()} == {"y": (0.25, 0.0), "z": (0.25, 0.0)}
    plain = OutputMeasure()
    plain.begin(_Data(), ["y"])
    assert plain.relative == {} and plain.names == ["y"]
    with pytest.raises(InputError) as err:
        OutputMeasure(slices=[SliceSpec("v", "w[:, 0]")]).begin(_Data(), ["y"])
    assert str(err.value) == "slice 'v': no output 'w' (outputs: y)"


def test_integer_outputs_are_found_with_their_parameters() -> None:
    quantized, _ = _qdq_pair()
    quantized.graph.output.append(helper.make_tensor_value_info("mq", onnx.TensorProto.INT8, [1, 2]))
    quantized.graph.output.append(helper.make_tensor_value_info("xq", onnx.TensorProto.INT8, [1, 2]))
    pair = SimpleNamespace(quantized=quantized, output_pairs=lambda: [("y", "y"), ("m", "mq"), ("x", "xq")])
    found = _integer_outputs(pair)
    assert sorted(found) == ["mq", "xq"]
    assert float(found["mq"].scale) == np.float32(Y_SCALE) and int(found["mq"].zero_point) == 0
    assert float(found["xq"].scale) == X_SCALE
    # a float output or one of unknown type has none
    floats = SimpleNamespace(quantized=quantized, output_pairs=lambda: [("y", "y"), ("n", "nope")])
    assert _integer_outputs(floats) == {}


def test_output_values_leave_views_out_and_dequantize_integer_outputs() -> None:
    params = QuantParams(np.array(0.5, np.float32), np.array(2, np.uint8))
    y = compare_module._tracker("y", "y_q", params, ["mse"], worst=True)
    z = compare_module._tracker("z", "z", None, ["mse"], worst=True)
    w = compare_module._tracker("w", "w", params, ["mse"], worst=True)
    w.dequantized = True  # taken as the model gives it
    view = compare_module._tracker("y", "y_q", params, ["mse"], worst=True, view=SliceSpec("v", "y[:, 0]"))
    ref = {"y": np.array([1.0]), "z": np.array([2.0]), "w": np.array([3.0])}
    test = {"y_q": np.array([6], np.uint8), "z": np.array([2.5]), "w": np.array([3.5])}
    fp32, quantized = compare_module._output_values([y, z, w, view], ref, test)
    assert fp32 == ref
    assert list(quantized) == ["y", "z", "w"]
    assert quantized["y"].tolist() == [2.0] and quantized["z"].tolist() == [2.5] and quantized["w"].tolist() == [3.5]


def test_measure_outputs_runs_both_models_and_dequantizes_an_integer_output(tmp_path) -> None:
    quantized, fp32 = _qdq_pair()
    # the quantized model gives its output as int8 codes (scale 0.2): measured dequantized
    quantized.graph.node.remove(quantized.graph.node[-1])
    quantized.graph.output[0].CopyFrom(helper.make_tensor_value_info("mq", onnx.TensorProto.INT8, [None, 2]))
    fp32.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "n"
    quantized.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "n"
    fp32.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "n"
    onnx.helper.set_model_props(fp32, {"chars": "ab"})
    x = np.array([[1.3, -0.7], [0.2, 0.9], [-1.1, 0.4]], np.float32)
    np.savez(tmp_path / "data.npz", x=x)
    pair = ModelPair(fp32, quantized)
    f = x @ W_FLOAT
    q = _fake_quant(_fake_quant(x, X_SCALE) @ (W_CODES.astype(np.float32) * np.float32(W_SCALE)), Y_SCALE)
    with load_dataset(tmp_path / "data.npz") as data:
        for _ in range(2):  # the caller's dataset stays open
            stats = measure_outputs(
                pair,
                data,
                atol=0.01,
                rtol=0.5,
                labels=np.array([0, 1, 1]),
                slices=[SliceSpec("first", "y[:, 0:1]")],
                tasks=[_spec(log=True), _spec(fail="update", suffix="bad")],
                targets=["a", "b", "c"],
                keep_task_errors=True,
                options=RuntimeOptions(batch_size=2),
            )
        # a task metric that raises stops the measure unless told to keep its error
        with pytest.raises(CheckError, match=r"on records 0\.\.1: ValueError"):
            measure_outputs(pair, data, tasks=[_spec(fail="update")], options=RuntimeOptions(batch_size=2))
    outside = np.abs(q - f) > 0.01 + 0.5 * np.abs(f)
    assert stats.relative["y"].violations == np.count_nonzero(outside) > 0
    assert (stats.relative["y"].rtol, stats.relative["y"].atol) == (0.5, 0.01)
    assert stats.relative["y"].max_abs == pytest.approx(float(np.abs(q - f)[outside].max()), rel=1e-5)
    assert stats.relative["first"].elements == 3 and stats.relative["y"].elements == 6
    assert stats.relative["first"].violations == np.count_nonzero(outside[:, :1])
    worst = stats.relative["y"].worst[0]
    record, index = np.unravel_index(int(np.argmax(np.where(outside, np.abs(q - f) - 0.5 * np.abs(f), -1))), q.shape)
    assert worst[:2] == (int(record), f"[{index}]") and worst[2] == pytest.approx(float(q[record, index]))
    # the labels and the task targets as given, the fp32 model's metadata for the task metric
    assert stats.topk["y"]["records"] == 3
    assert stats.task["hits"] == TaskValue("hits", f"{RECORDER}(log=True)", "targets", 3, True, 3.0, 2.0)
    bad = f"{RECORDER}(fail='update')"
    assert stats.task["hits_bad"].error == f"task metric '{bad}' on records 0..1: ValueError: "
    recorder = LOG[-1]
    assert recorder.context == TaskContext(("y", "first"), {"chars": "ab"}, 3)
    assert recorder.tests == [["first", "y"], ["first", "y"]]
    assert stats.topk["y"]["labelled"] == 3 and stats.topk["y"]["k"]["1"]["fp32_accuracy"] is not None
    assert [c[2] for c in recorder.calls[1:]] == [["a", "b"], ["c"]]


def test_an_output_that_other_nodes_read_keeps_its_pair_for_them() -> None:
    quantized, fp32 = _qdq_pair()
    # r = Relu(y) reads the quantized model's output y: with y's pair removed, y is the float
    # MatMul and r still reads the pair's value, moved aside to y::quantized
    quantized.graph.node.append(helper.make_node("Relu", ["y"], ["r"], name="relu"))
    quantized.graph.output.append(helper.make_tensor_value_info("r", onnx.TensorProto.FLOAT, [1, 2]))
    graph = QdqGraph(quantized, fp32)
    model = graph.build(graph.all_edges - {(OUTPUT, 0)})
    x = np.array([[1.3, -0.7]], np.float32)
    m = _fake_quant(x, X_SCALE) @ (W_CODES.astype(np.float32) * np.float32(W_SCALE))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    y, r = session.run(["y", "r"], {"x": x})
    np.testing.assert_allclose(y, m, rtol=1e-6)
    np.testing.assert_allclose(r, np.maximum(_fake_quant(m, Y_SCALE), 0), rtol=1e-6)
    nodes = {n.name: n for n in model.graph.node}
    assert list(nodes["dqm"].output) == ["y::quantized"] and list(nodes["relu"].input) == ["y::quantized"]
    assert list(nodes["mm"].input) == ["xd", "wd"]  # untouched nodes are the model's own


def _relu_chain(count: int) -> onnx.ModelProto:
    """x -> (Q/DQ -> Relu r<i>) * count: each Relu owns its input's edge and the next one's."""
    nodes = []
    for i in range(count):
        nodes += [
            helper.make_node("QuantizeLinear", [f"t{i}", "s", "zp"], [f"q{i}"], name=f"q{i}"),
            helper.make_node("DequantizeLinear", [f"q{i}", "s", "zp"], [f"d{i}"], name=f"dq{i}"),
            helper.make_node("Relu", [f"d{i}"], [f"t{i + 1}"], name=f"r{i}"),
        ]
    inits = [numpy_helper.from_array(np.float32(0.5), "s"), numpy_helper.from_array(np.uint8(0), "zp")]
    x = helper.make_tensor_value_info("t0", onnx.TensorProto.FLOAT, [1, 2])
    y = helper.make_tensor_value_info(f"t{count}", onnx.TensorProto.FLOAT, [1, 2])
    graph = helper.make_graph(nodes, "chain", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_a_graphs_nodes_edges_together_and_an_unknown_name_lists_twenty() -> None:
    graph = QdqGraph(_relu_chain(22), name="chain.onnx")
    assert [n.name for n in graph.nodes] == [f"r{i}" for i in range(22)]
    first = graph.node("r0")
    assert (first.index, first.order, first.inputs, first.outputs) == (2, 0, {(2, 0)}, {(5, 0)})
    assert graph.node("r21").outputs == frozenset() and graph.node("r21").order == 21
    assert graph.edges_of(["r0", "r1"]) == {(2, 0), (5, 0), (8, 0)}
    assert graph.edges_of(["r0", "r1"], "weight") == frozenset()
    assert graph.edges_of([]) == frozenset()
    with pytest.raises(ModelError) as err:
        graph.node("r22")
    listed = ", ".join(f"r{i}" for i in range(20))
    assert str(err.value) == f"chain.onnx: no quantized node 'r22'; quantized nodes: {listed}"


# -- agreement_pass.py: the gate's plumbing, with a stand-in checker --------------------------------


class _Checker:
    """What AgreementPass reads of an AgreementChecker: the emulation's 8-bit tensor ``q0`` is twice
    the input, onnxruntime's its input plus one; folds are recorded."""

    def __init__(self, names=("q0",), stacks: bool = True, fail: str = "") -> None:
        self.names, self.stacks, self.fail = list(names), stacks, fail
        self.emulations: list[dict] = []
        self.folds: list[tuple] = []

    def emulate(self, feeds, tensors=None):
        self.emulations.append(feeds)
        if self.fail == "emulate":
            raise RuntimeError("no kernel")
        ours = {"q0": feeds["t0"] * 2}
        return (None if tensors is None else [feeds["t0"] for _ in tensors]), ours

    def onnxruntime_values(self, feeds):
        return {"q0": feeds["t0"] + 1}

    def fold(self, ours, values, records: int) -> None:
        if self.fail == "fold":
            raise ValueError("mismatch")
        self.folds.append((ours["q0"].tolist(), np.asarray(values["q0"]).tolist(), records))

    def plans_alike(self, tensors) -> bool:
        return True

    def result(self) -> str:
        return "measured"


def _batch(start: int, *rows: list[float]) -> Batch:
    return Batch(start, [{"t0": np.array([row], np.float32)} for row in rows])


def test_the_gates_emulation_runs_stacked_or_record_by_record_and_keeps_its_error() -> None:
    stacked = AgreementPass(_Checker())
    assert stacked.emulated(_batch(0, [1, 2], [3, 4]))["q0"].tolist() == [[2, 4], [6, 8]]
    assert len(stacked.checker.emulations) == 1
    apart = AgreementPass(_Checker(stacks=False))
    assert apart.emulated(_batch(0, [1, 2], [3, 4]))["q0"].tolist() == [[2, 4], [6, 8]]
    assert [f["t0"].tolist() for f in apart.checker.emulations] == [[[1, 2]], [[3, 4]]]
    failing = AgreementPass(_Checker(fail="emulate"))
    assert failing.emulated(_batch(0, [1, 2])) is None
    assert str(failing.error) == "no kernel" and failing.result() is None
    assert failing.emulated(_batch(1, [1, 2])) is None and len(failing.checker.emulations) == 1


def test_a_merged_graph_fetches_the_gates_tensors_with_its_config_or_the_gate_declines() -> None:
    chain = _relu_chain(2)  # uint8 activations: the comparison's session computes the gate's
    gate = AgreementPass(_Checker())
    options = RuntimeOptions(session_config={"session.qdqisint8allowed": "1"})
    first = _batch(0, [1, 2])
    tensors, merged = gate.merged_tensors(chain, options, first)
    assert tensors == ["q0"] and merged.session_config == {"session.qdqisint8allowed": "1"}
    tensors, merged = gate.merged_tensors(chain, RuntimeOptions(), first)
    assert tensors == ["q0"] and merged.session_config == SESSION_CONFIG
    assert merged == replace(RuntimeOptions(), session_config=SESSION_CONFIG)
    gate.fold(first, {"q0": np.array([[7, 8]])})  # the first batch's emulation is not run again
    gate.fold(_batch(1, [5, 6]), {"q0": np.array([[9, 9]])})
    assert len(gate.checker.emulations) == 2
    assert gate.checker.folds == [([[2, 4]], [[7, 8]], 1), ([[10, 12]], [[9, 9]], 1)]
    assert gate.mode == "merged" and gate.result() == "measured" and not gate.declined
    # int8 activations: the gate shares nothing and declines
    quantized, _ = _qdq_pair()
    declined = AgreementPass(_Checker())
    assert declined.merged_tensors(quantized, RuntimeOptions(), first) == ([], RuntimeOptions())
    declined.fold(first, {})
    assert declined.declined and declined.result() is None and declined.checker.emulations == []
    # a model without 8-bit tensors for the gate: onnxruntime's values come from the gate's own run
    none = AgreementPass(_Checker(names=()))
    assert none.merged_tensors(chain, RuntimeOptions(), first) == ([], RuntimeOptions())
    none.fold(first, {"q0": np.array([[0, 0]])})
    assert none.checker.folds == [([[2, 4]], [[2, 3]], 1)] and none.mode is None
    failing = AgreementPass(_Checker(fail="fold"))
    failing.merged_tensors(chain, RuntimeOptions(), first)
    failing.fold(first, {"q0": np.array([[7, 8]])})
    assert str(failing.error) == "mismatch" and failing.result() is None


def test_the_gated_runner_shares_the_comparisons_session_or_runs_it_alone() -> None:
    chain = _relu_chain(2)
    x = _batch(3, [1.0, -2.0])
    relu = np.maximum(np.rint(np.array([[1.0, -2.0]]) / 0.5).clip(0, 255) * 0.5, 0)
    gate = AgreementPass(_Checker())
    runner = gate.runner(chain, ["t1", "t1"], RuntimeOptions(), "chain")
    values = runner.run(x)
    assert runner._inner.label == "chain"
    assert list(values) == ["t1"] and values["t1"].tolist() == relu.tolist()
    # the shared session fetched the gate's tensor q0 (the uint8 codes of the input) with its config
    assert runner._inner.tensors == ["t1", "q0"] and runner._inner.options.session_config == SESSION_CONFIG
    assert gate.checker.folds == [([[2.0, -4.0]], [[2, 0]], 1)] and gate.mode == "shared"
    # the emulation failed on the first batch: the comparison's own session, nothing folded
    failing = AgreementPass(_Checker(fail="emulate"))
    alone = failing.runner(chain, ["t1"], RuntimeOptions(), "chain")
    assert alone.run(x)["t1"].tolist() == relu.tolist()
    assert alone._inner.tensors == ["t1"] and alone._inner.options.session_config == {}
    assert alone._inner.label == "chain"
    assert alone.shared is False and failing.result() is None and failing.checker.folds == []
    # int8 activations on onnxruntime: the gate declines and the runner is the comparison's own
    quantized, _ = _qdq_pair()
    declined = AgreementPass(_Checker())
    plain = declined.runner(quantized, ["y"], RuntimeOptions(), "pair")
    assert declined.declined and plain._inner.label == "pair" and declined.checker.emulations == []
    assert plain.run(Batch(0, [{"x": np.array([[1.3, -0.7]], np.float32)}]))["y"].shape == (1, 2)


def _gate_scheme(name: str | None):
    """The scheme an AgreementChecker of preset ``name`` runs: int8 QDQ activations never as uint8."""
    scheme = get_scheme(name)
    return SimpleNamespace(session=SimpleNamespace(scheme=scheme.replace(name=scheme.name, qdq_int8_to_uint8=False)))


def test_the_comparisons_emulation_is_the_gates_when_only_the_uint8_rewrite_differs_and_changes_nothing() -> None:
    same = agreement_module._same_emulation
    chain = _relu_chain(2)  # uint8 activations
    signed, _ = _qdq_pair()  # int8 activations
    assert get_scheme(None).qdq_int8_to_uint8 and not get_scheme("onnxruntime-arm64").qdq_int8_to_uint8
    assert same(chain, None, _gate_scheme(None)) and same(chain, "onnxruntime", _gate_scheme("onnxruntime"))
    # the comparison runs int8 activations as uint8, the gate does not: the same only without any
    assert not same(signed, None, _gate_scheme(None))
    # a preset that never rewrites: the same on signed activations too
    assert same(signed, "onnxruntime-arm64", _gate_scheme("onnxruntime-arm64"))
    # another scheme is another emulation
    assert not same(chain, "tflite", _gate_scheme(None)) and not same(chain, None, _gate_scheme("tflite"))


def test_on_the_integer_backend_one_emulated_run_serves_the_comparison_and_the_gate() -> None:
    chain = _relu_chain(2)
    checker = _Checker()
    checker.session = _gate_scheme(None).session
    gate = AgreementPass(checker)
    runner = gate.runner(chain, ["t1", "t2"], RuntimeOptions(), "chain", backend="integer")
    assert runner.emulated and (runner.scheme_name, runner.capture) == (get_scheme(None).name, "emulated")
    values = runner.run(_batch(0, [1.0, 2.0], [3.0, 4.0]))
    assert {k: v.tolist() for k, v in values.items()} == {"t1": [[1, 2], [3, 4]], "t2": [[1, 2], [3, 4]]}
    assert checker.folds == [([[2, 4], [6, 8]], [[2, 3], [4, 5]], 2)] and gate.mode == "emulation shared"
    checker.fail = "fold"  # a fold that fails is kept, and the gate folds no more
    runner.run(_batch(2, [1.0, 1.0]))
    assert str(gate.error) == "mismatch" and gate.result() is None
    checker.fail = ""
    runner.run(_batch(3, [1.0, 1.0]))
    assert len(checker.folds) == 1
    # another scheme on the integer backend: the gate declines, the runner is the comparison's own
    other = AgreementPass(_Checker())
    other.checker.session = _gate_scheme("tflite").session
    own = other.runner(chain, ["t1"], RuntimeOptions(), "chain", backend="integer")
    assert other.declined and not own.emulated and own.capture == own._inner.capture
    assert own.scheme_name == get_scheme(None).name


def test_inputs_read_directly_are_no_edges_and_a_cut_model_names_its_new_inputs() -> None:
    chain = _relu_chain(2)
    chain.graph.node.append(helper.make_node("Add", ["t0", "t2"], ["sum"], name="add"))
    chain.graph.output[0].name = "sum"
    graph = QdqGraph(chain)
    assert [n.name for n in graph.nodes] == ["r0", "r1"] and graph.unremovable == []
    assert graph.all_edges == {(2, 0), (5, 0)}
    relu = graph.view.nodes[5]
    model = graph.make_model([relu], ["t0", "d1"], ["t2"])
    assert [v.name for v in model.graph.input] == ["t0", "d1"]
    assert model.graph.input[0] == chain.graph.input[0]  # an input of the model keeps its type
    assert not model.graph.input[1].HasField("type")
    assert [t.name for t in model.graph.initializer] == [] and model.graph.name == "chain_partial"


def test_a_task_run_without_metrics_a_begin_a_state_mapping_or_a_side() -> None:
    empty = TaskRun([], None)
    assert empty.result() == {}
    run = TaskRun(
        [TaskSpec.parse("tests.analysis.test_comparison_units:NoBegin"), _spec(state="list", sides="fp32")], None
    )
    run.begin(TaskContext(("y",), {}, 2))
    run.update({"y": 0}, {"y": 0}, 0, 2)
    values = run.result()
    assert values["count"].fp32 == 1.0 and values["count"].quantized == 1.0
    label = f"{RECORDER}(sides='fp32', state='list')"
    assert values["hits"] == TaskValue("hits", label, "fp32", 2, True, 3.0, None)


def test_a_measure_before_any_output_is_empty_and_names_an_output_it_cannot_fold() -> None:
    measure = OutputMeasure()
    measure.update({"y": SCORES}, {"y": SCORES}, 0, 4)
    assert measure.result() == OutputStats({}, {}, {}, {})
    bad = OutputMeasure(atol=0.5)
    bad.begin(_Data(), ["y"])
    with pytest.raises(CheckError) as err:
        bad.update({"y": np.zeros((2, 3), np.float32)}, {"y": np.zeros((2, 4), np.float32)}, 0, 2)
    assert str(err.value).startswith("output 'y': ValueError: operands could not be broadcast")


def test_an_extra_output_keeps_its_node_alive_in_a_partial_model() -> None:
    quantized, fp32 = _qdq_pair()
    graph = QdqGraph(quantized, fp32)
    model = graph.build(frozenset({(3, 0), (3, 1)}), extra_outputs=["mq"])  # y's pair removed: mq is dead
    x = np.array([[1.3, -0.7]], np.float32)
    m = _fake_quant(x, X_SCALE) @ (W_CODES.astype(np.float32) * np.float32(W_SCALE))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    y, mq = session.run(["y", "mq"], {"x": x})
    np.testing.assert_allclose(y, m, rtol=1e-6)
    assert mq.tolist() == np.clip(np.rint(m / np.float32(Y_SCALE)), -128, 127).astype(np.int8).tolist()


def test_a_clip_folded_into_the_pair_after_a_matmul_is_redone_without_the_pair() -> None:
    # fp32: r = Clip(x @ w, -0.5, 1.0); quantized: the MatMul writes r itself and the Q/DQ pair on r
    # clamps; without that pair the fp32 model's Clip is re-inserted after the MatMul
    tensor = numpy_helper.from_array
    quantized = _qdq_matmul("r")
    x, y, opset = _X, _Y, _OPSET
    fp32_nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        helper.make_node("Clip", ["m", "lo", "hi"], ["r"], name="clip"),
        helper.make_node("Identity", ["r"], ["y"], name="out"),
    ]
    fp32_inits = [tensor(W_FLOAT, "w"), tensor(np.float32(-0.5), "lo"), tensor(np.float32(1.0), "hi")]
    fp32 = helper.make_model(helper.make_graph(fp32_nodes, "f", [x], [y], fp32_inits), opset_imports=opset)
    graph = QdqGraph(quantized, fp32)
    assert graph.sources[(OUTPUT, 0)] == "r::refolded" and graph.quantized_tensor[(OUTPUT, 0)] == "r"
    assert sorted(graph.float_weights) == ["hi", "lo", "wd::float"]
    model = graph.build(frozenset({(3, 0), (3, 1)}))
    assert [n.name for n in model.graph.node] == ["qx", "dqx", "dqw", "mm", "r::refolded", "y::float"]
    xs = np.array([[1.3, -0.7]], np.float32)
    m = _fake_quant(xs, X_SCALE) @ (W_CODES.astype(np.float32) * np.float32(W_SCALE))
    np.testing.assert_allclose(_run(model, xs), np.clip(m, -0.5, 1.0), rtol=1e-6)
    # with the pair the model is the quantized one: the Clip is not there
    assert "r::refolded" not in [n.name for n in graph.build(graph.all_edges).graph.node]


def test_a_weight_quantized_in_the_graph_and_an_output_that_cannot_go_back_to_float() -> None:
    tensor = numpy_helper.from_array
    inits = [tensor(np.float32(W_SCALE), "sw"), tensor(np.int8(0), "z"), tensor(W_FLOAT, "w"), tensor(W_CODES, "c")]
    nodes = [
        helper.make_node("QuantizeLinear", ["w", "sw", "z"], ["wq"], name="qw"),
        helper.make_node("DequantizeLinear", ["wq", "sw", "z"], ["wd"], name="dqw"),
        helper.make_node("MatMul", ["x", "wd"], ["y"], name="mm"),
        helper.make_node("DequantizeLinear", ["c", "sw", "z"], ["k"], name="dqc"),
    ]
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2])
    outs = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1, 2]) for n in ("y", "k")]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], outs, inits), opset_imports=[helper.make_opsetid("", 13)]
    )
    graph = QdqGraph(model)
    assert graph.sources == {(2, 1): "w"} and graph.kinds == {(2, 1): "weight"}
    assert graph.unremovable == ["dqc -> graph output 'k'"]
    with pytest.raises(ModelError) as err:
        QdqGraph(_qdq_pair()[1])
    assert str(err.value) == (
        "model: sensitivity analysis needs a QDQ model (QuantizeLinear/DequantizeLinear pairs around float ops); "
        "this model is float. Quantize with quant_format=QuantFormat.QDQ, or compare QOperator models layer by "
        "layer with `qaccuracy compare`"
    )
