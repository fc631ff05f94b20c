"""The recipe search (``analysis/recipe/search.py``) piece by piece, in process: the budget's text and
its bookkeeping on a clock moved by hand, the steps and the result's JSON form, which step beats
which, experiments and estimates on stand-ins for onnxruntime's writer and the evaluator, the global
moves and space, the node phase's assignments in cost order (worked out by hand), its prefix search,
pruning and widening on stand-in estimators, and the argument checks of ``search_recipe``. A real
search object is made on the example suite's small digits CNN (its cost model and node names); what
would take seconds (writing and measuring models) is a stand-in."""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import onnx
import pytest

from pytest_qaccuracy.analysis.recipe import estimate as estimate_module
from pytest_qaccuracy.analysis.recipe import search as search_module
from pytest_qaccuracy.analysis.recipe.build import method_rank
from pytest_qaccuracy.analysis.recipe.checks import parse_checks
from pytest_qaccuracy.analysis.recipe.cost import CostModel
from pytest_qaccuracy.analysis.recipe.measure import HOST, Verdict
from pytest_qaccuracy.analysis.recipe.search import (
    Budget,
    RecipeResult,
    RecipeSearch,
    Step,
    _better,
    _first_line,
    _head_may_pass,
    _name,
    _names,
    _OutOfBudget,
    assignment_cost,
    cost_ordered,
    held_out,
    search_recipe,
)
from pytest_qaccuracy.analysis.recipe.space import Recipe
from pytest_qaccuracy.errors import InputError, QAccuracyError
from pytest_qaccuracy.runtime import RuntimeOptions
from tests.ort_features import needs_cache, old_ort_refuses_moves
from tests.progress_recorders import Clock

SUITE = Path(__file__).resolve().parents[2] / "example_suites"
FP32 = SUITE / "models" / "digits_cnn.onnx"
QDQ = SUITE / "models" / "digits_cnn.qdq.onnx"
CALIB = SUITE / "data" / "digits_calib.npz"
TEST = SUITE / "data" / "digits_test.npz"
COSINE = parse_checks(["cosine>=0.5"])
#: the digits CNN's work per node (MACs for conv1, conv2 and fc, elements for the rest): 24704 in all
TOTAL = 4608 + 512 + 128 + 18432 + 256 + 64 + 64 + 640


def _step(
    index: int = 0,
    passed: bool = False,
    margin: float | None = None,
    cost: float = 0.0,
    seconds: float = 0.0,
    skipped: str | None = None,
    estimated: bool = False,
    recipe: Recipe | None = None,
) -> Step:
    return Step(index, "p", "c", recipe or Recipe(), cost, {}, passed, margin, seconds, skipped, estimated=estimated)


# -- Budget ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds", "experiments"),
    [
        ("90s", 90.0, None),
        ("10m", 600.0, None),
        ("1h", 3600.0, None),
        ("1.5m", 90.0, None),
        ("5 s", 5.0, None),
        ("2", None, 2),
        ("40", None, 40),
        ("2.0", None, 2),
        ("10m,40", 600.0, 40),
        (" 40 , 2h ", 7200.0, 40),
        ("3,,", None, 3),
        ("", None, None),
        (None, None, None),
    ],
)
def test_budget_parse_reads_times_and_experiments(text, seconds, experiments):
    budget = Budget.parse(text)
    assert (budget.seconds, budget.experiments) == (seconds, experiments)
    assert budget.experiments is None or type(budget.experiments) is int


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0", "budget '0': expected a time (90s, 10m, 1h) or a number of experiments (40)"),
        ("0s", "budget '0s': expected a time"),
        ("0.0m", "budget '0.0m': expected a time"),
        ("-3", "budget '-3': expected a time"),
        ("10x", "budget '10x': expected a time"),
        ("10M", "budget '10M': expected a time"),
        ("s", "budget 's': expected a time"),
        ("1.5", "budget '1.5': a number of experiments is a whole number"),
        ("10s, 1m", "budget '10s, 1m': at most one time (10m,40 for both)"),
        ("3,4", "budget '3,4': at most one number of experiments (10m,40 for both)"),
        ("3,1h,bad", "budget 'bad': expected a time"),
    ],
)
def test_budget_parse_refuses_with_the_part_named(text, message):
    with pytest.raises(InputError) as info:
        Budget.parse(text)
    assert str(info.value).startswith(message)


def test_budget_parse_a_time_after_a_count_is_both():
    assert Budget.parse("7,30s") == Budget(30.0, 7)


@pytest.mark.parametrize(
    ("budget", "text"),
    [
        (Budget(), "unbounded"),
        (Budget(90.0), "90s"),
        (Budget(1.5, 3), "1.5s, 3 experiments"),
        (Budget(None, 40), "40 experiments"),
        (Budget(0.0, 0), "0s, 0 experiments"),
    ],
)
def test_budget_text(budget, text):
    assert str(budget) == text


# -- steps and the result ------------------------------------------------------------------------------


def _result(best: int | None = 1, **fields) -> RecipeResult:
    steps = [
        Step(0, "start", "starting recipe", Recipe(), 0.0, {HOST: {"y": {"cosine": 0.4}}}, False, -0.2, 1.5),
        Step(
            1,
            "nodes",
            "float +conv1",
            Recipe(float=frozenset({"conv1"})),
            0.25,
            {HOST: {"y": {"cosine": 0.75}}},
            True,
            0.5,
            2.0,
        ),
        Step(2, "global", "per_channel=True", Recipe(per_channel=True), 0.0, {}, False, None, 0.0, "refused", True),
    ]
    values = dict(
        fp32="m.onnx",
        calibration="c.npz",
        evaluation="e.npz",
        records=7,
        checks=parse_checks(["cosine>=0.5", "mse<=2"]),
        targets=[HOST],
        weights={"int16": 0.5, "float": 1.0},
        steps=steps,
        best=best,
        stopped="budget",
        seconds=12.5,
        note="budget reached (1 experiments)",
        arguments={"per_channel": False},
        model="best.onnx",
        ranges={"x": (0.0, 1.0)},
        convert_opset=13,
        held_out=False,
    )
    values.update(fields)
    return RecipeResult(**values)


def test_best_step_and_met():
    result = _result()
    assert result.best_step is result.steps[1] and result.met is True
    first = _result(best=0)
    assert first.best_step is first.steps[0] and first.met is False
    assert _result(best=None).best_step is None and _result(best=None).met is False


def test_result_to_dict_field_by_field():
    result = _result()
    data = result.to_dict()
    assert list(data) == [
        "schema_version",
        "kind",
        "fp32_model",
        "calibration",
        "evaluation",
        "held_out",
        "records",
        "checks",
        "check_fields",
        "targets",
        "weights",
        "met",
        "best",
        "stopped",
        "seconds",
        "note",
        "quantize_static",
        "convert_opset",
        "steps",
    ]
    assert data["schema_version"] == 1 and data["kind"] == "recipe"
    assert (data["fp32_model"], data["calibration"], data["evaluation"]) == ("m.onnx", "c.npz", "e.npz")
    assert data["held_out"] is False and data["records"] == 7
    assert data["checks"] == ["cosine >= 0.5", "mse <= 2"]
    assert data["check_fields"][0]["metric"] == "cosine" and data["check_fields"][0]["value"] == 0.5
    assert data["check_fields"][1]["metric"] == "mse" and data["check_fields"][1]["higher_is_better"] is False
    assert data["targets"] == [HOST] and data["weights"] == {"int16": 0.5, "float": 1.0}
    assert data["met"] is True and data["best"] == 1 and data["stopped"] == "budget"
    assert data["seconds"] == 12.5 and data["note"] == "budget reached (1 experiments)"
    assert data["quantize_static"] == {"per_channel": False} and data["convert_opset"] == 13
    assert data["steps"][1]["recipe"]["float"] == ["conv1"] and data["steps"][1]["margin"] == 0.5
    assert data["steps"][2]["estimated"] is True and data["steps"][2]["skipped"] == "refused"
    assert "model" not in data and "ranges" not in data  # the files of one run, not the answer
    assert _result(best=0).to_dict()["met"] is False


def test_result_from_dict_reads_back_every_field():
    result = _result()
    back = RecipeResult.from_dict(result.to_dict())
    assert back.fp32 == "m.onnx" and back.calibration == "c.npz" and back.evaluation == "e.npz"
    assert back.records == 7 and type(back.records) is int
    assert back.checks == result.checks and back.targets == [HOST]
    assert back.weights == {"int16": 0.5, "float": 1.0}
    assert back.steps == result.steps
    assert back.best == 1 and back.stopped == "budget" and back.seconds == 12.5
    assert back.note == "budget reached (1 experiments)" and back.arguments == {"per_channel": False}
    assert back.convert_opset == 13 and back.held_out is False
    assert back.model is None and back.ranges is None
    assert back == result  # model and ranges are not compared


def test_result_from_dict_defaults_and_conversions():
    data = _result(held_out=True, convert_opset=None).to_dict()
    for key in ("note", "quantize_static", "convert_opset", "held_out"):
        del data[key]
    data["records"], data["seconds"] = "3", 4
    back = RecipeResult.from_dict(data)
    assert back.note == "" and back.arguments is None and back.convert_opset is None
    assert back.held_out is True and back.records == 3 and back.seconds == 4.0 and type(back.seconds) is float
    data["held_out"] = 0
    assert RecipeResult.from_dict(data).held_out is False


def test_step_round_trip_with_and_without_a_margin():
    step = _step(3, margin=None, skipped="why", estimated=True)
    assert Step.from_dict(step.to_dict()) == step
    verified = Step(4, "nodes", "x", Recipe(int16=frozenset({"a"})), 0.5, {HOST: {"y": {"cosine": 1.0}}}, True, 2, 1.0)
    back = Step.from_dict(verified.to_dict())
    assert back == verified and type(back.margin) is float and back.estimated is False


# -- which step is better --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "better"),
    [
        (_step(passed=True, margin=1.0), None, True),
        (_step(skipped="no"), None, False),
        (_step(passed=True, margin=1.0, estimated=True), None, False),
        (_step(passed=True, margin=1.0, estimated=True), _step(margin=-1.0), False),
        (_step(passed=True, margin=1.0, skipped="no"), _step(margin=-1.0), False),
        (_step(passed=True, margin=0.1, cost=0.9), _step(margin=-0.01, cost=0.0), True),
        (_step(margin=-0.01, cost=0.0), _step(passed=True, margin=0.1, cost=0.9), False),
        (_step(passed=True, margin=0.1, cost=0.2), _step(passed=True, margin=0.5, cost=0.3), True),
        (_step(passed=True, margin=0.5, cost=0.3), _step(passed=True, margin=0.1, cost=0.2), False),
        (_step(passed=True, margin=0.5, cost=0.2), _step(passed=True, margin=0.1, cost=0.2), True),
        (_step(passed=True, margin=0.1, cost=0.2), _step(passed=True, margin=0.5, cost=0.2), False),
        (_step(passed=True, margin=0.1, cost=0.2), _step(passed=True, margin=0.1, cost=0.2), False),
        (_step(passed=True, margin=0.0, cost=0.2), _step(passed=True, margin=None, cost=0.2), False),
        (_step(passed=True, margin=0.1, cost=0.2), _step(passed=True, margin=None, cost=0.2), True),
        (_step(passed=True, margin=None, cost=0.2), _step(passed=True, margin=0.1, cost=0.2), False),
        (_step(passed=True, margin=None, cost=0.2), _step(passed=True, margin=-0.1, cost=0.2), True),
        (_step(margin=-0.1), _step(margin=-0.2), True),
        (_step(margin=-0.2), _step(margin=-0.1), False),
        (_step(margin=-0.2), _step(margin=-0.2), False),
        (_step(margin=-1e9), _step(margin=None), True),
        (_step(margin=None), _step(margin=-1e9), False),
        (_step(margin=None), _step(margin=None), False),
        (_step(margin=-0.5, cost=0.9), _step(margin=-0.6, cost=0.0), True),
    ],
)
def test_better(a, b, better):
    assert _better(a, b) is better


# -- a search on stand-ins -----------------------------------------------------------------------------


class _Builder:
    """onnxruntime's writer's stand-in: ``write`` writes ``content(recipe)`` (the recipe's text by
    default) and takes ``pace`` seconds of the clock; ``failures`` maps a recipe to what it raises."""

    def __init__(self, clock: Clock, pace: float = 1.0, content=None, calibrators=None) -> None:
        self.clock, self.pace, self.content = clock, pace, content or (lambda recipe: repr(recipe))
        self.calibrators = calibrators or {}
        self.failures: dict[Recipe, BaseException] = {}
        self.written: list[Recipe] = []
        self.folded: list[str] = []
        self.weights = {"conv1": ("conv1.weight", 0), "conv2": ("conv2.weight", 0), "fc": ("fc.weight", 0)}

    def write(self, recipe: Recipe, out) -> Path:
        self.written.append(recipe)
        self.clock.now += self.pace
        if recipe in self.failures:
            raise self.failures[recipe]
        Path(out).write_text(self.content(recipe))
        return Path(out)

    def write_seconds(self, recipe: Recipe) -> float:
        return self.calibrators.get(recipe.method, 0.0)


class _Evaluator:
    """The evaluator's stand-in: a written model's margin is ``margins(text)`` on every target asked
    (the host alone for estimates); each measurement takes ``pace`` seconds of the clock."""

    def __init__(self, clock: Clock, margins, pace: float = 2.0) -> None:
        self.clock, self.margins, self.pace = clock, margins, pace
        self.calls: list[tuple[str, tuple | None]] = []

    def measure(self, path, targets=None) -> Verdict:
        self.clock.now += self.pace
        text = Path(path).read_text() if Path(path).suffix == ".onnx" and not _is_onnx(path) else "onnx"
        self.calls.append((Path(path).name, targets))
        margin = self.margins(text)
        if isinstance(margin, BaseException):
            raise margin
        return Verdict(
            {t: {"y": {"cosine": 0.5 + margin / 2}} for t in (targets or (HOST, "other"))}, margin >= 0, margin
        )


def _is_onnx(path) -> bool:
    return Path(path).read_bytes()[:1] == b"\x08"  # an onnx model starts with its ir_version's tag


def _search(tmp_path, monkeypatch, budget=None, methods=("minmax",), vary=search_module.VARY, **kwargs):
    """A RecipeSearch of the digits CNN on a clock moved by hand; steps and notes recorded."""
    clock = Clock()
    monkeypatch.setattr(search_module, "time", SimpleNamespace(monotonic=clock.monotonic))
    calls, notes = [], []
    search = RecipeSearch(
        FP32,
        CALIB,
        TEST,
        COSINE,
        [HOST],
        tmp_path,
        kwargs.pop("start", Recipe()),
        budget or Budget(),
        kwargs.pop("weights", {"int16": 1.0, "float": 1.0}),
        methods,
        RuntimeOptions(),
        4,
        kwargs.pop("exhaustive_nodes", 16),
        lambda step, best: calls.append((step, best)),
        notes.append,
        vary,
    )
    search.calls, search.notes, search.clock = calls, notes, clock
    return search


def test_a_search_refuses_an_unknown_choice_to_vary(tmp_path, monkeypatch):
    with pytest.raises(InputError, match=r"cannot vary 'bits'; the choices are per_channel, reduce_range, method, "):
        _search(tmp_path, monkeypatch, vary=("method", "bits", "colour"))


def test_a_search_refuses_an_unknown_method(tmp_path, monkeypatch):
    with pytest.raises(InputError, match="unknown calibration method 'best'"):
        _search(tmp_path, monkeypatch, methods=("minmax", "best"))


def test_a_new_search_starts_its_clock_and_holds_its_arguments(tmp_path, monkeypatch):
    clock = Clock()
    clock.now = 5.0
    monkeypatch.setattr(search_module, "time", SimpleNamespace(monotonic=clock.monotonic))
    options = RuntimeOptions(batch_size=3)
    search = RecipeSearch(
        str(FP32), CALIB, TEST, COSINE, (HOST,), str(tmp_path), Recipe(), Budget(3.0), {"int16": 0.5, "float": 2.0},
        ("minmax",), options, 4, 16, None, None, ("method",),
    )  # fmt: skip
    assert search.builder.fp32 == FP32 and search.builder.calibration == CALIB and search.builder.options is options
    assert search.options is options and search.calibration == CALIB and search.evaluation == TEST
    assert search.seen == {} and search.verdicts == {} and search.estimates == {} and search.base_models == {}
    assert search.global_rows == {} and search.fingerprints == {}
    assert search.started == 5.0 and search.fp32 == FP32 and search.workdir == tmp_path
    assert search.targets == [HOST] and search.vary == ("method",) and search.methods == ["minmax"]
    assert (search.cost.int16, search.cost.float) == (0.5, 2.0)
    assert search.cost.total == TOTAL
    assert search.steps == [] and search.best is None and search.evaluator is None and search.edits is None
    assert search.statistics_seconds == 0.0 and search.extended is False
    assert search.tasks == [] and search.task_targets is None
    search._note("nobody listens")  # no on_note: nothing happens


# -- the budget's bookkeeping ----------------------------------------------------------------------------


def test_longest_of_each_kind(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch)
    assert search._longest(False) == 0.0 and search._longest(True) == 0.0
    search.steps += [_step(seconds=3.0), _step(seconds=5.0, estimated=True), _step(seconds=2.0)]
    assert search._longest(False) == 3.0 and search._longest(True) == 5.0


def test_check_budget_stops_before_the_time_runs_out(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch, budget=Budget(10.0))
    search.builder = _Builder(search.clock, calibrators={"ort-minmax": 2.0})
    search.clock.now = 9.9
    search._check_budget()  # step 0 always runs: nothing expected of it, even its calibrator
    search._check_budget(recipe=Recipe(method="ort-minmax"))
    search.clock.now = 10.0
    with pytest.raises(_OutOfBudget):
        search._check_budget()
    search.steps += [_step(seconds=3.0), _step(seconds=1.0, estimated=True)]
    search.clock.now = 6.9
    search._check_budget()  # 6.9 + 3 < 10
    search._check_budget(recipe=Recipe())  # no calibrator of its own
    with pytest.raises(_OutOfBudget):
        search._check_budget(recipe=Recipe(method="ort-minmax"))  # 6.9 + 3 + 2 >= 10
    search.clock.now = 7.0
    with pytest.raises(_OutOfBudget):
        search._check_budget()  # 7 + 3 = 10: at the budget is over it
    search._check_budget(estimate=True)  # 7 + 1
    search.clock.now = 8.9
    search._check_budget(estimate=True)
    search.clock.now = 9.0
    with pytest.raises(_OutOfBudget):
        search._check_budget(estimate=True)


def test_check_budget_counts_verified_experiments_only(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch, budget=Budget(experiments=2))
    search.clock.now = 1e9  # no time budget
    search.steps += [_step(), _step(estimated=True), _step(estimated=True)]
    search._check_budget()
    search.steps.append(_step())
    with pytest.raises(_OutOfBudget):
        search._check_budget()
    search._check_budget(estimate=True)  # estimates are not experiments


def test_unbounded_budget_never_stops(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch)
    search.clock.now = 1e12
    search.steps += [_step(seconds=1e9)] * 3
    search._check_budget()
    assert search._estimates_left() is None and search._ranking_left() is None
    assert search._room_for(1e9) is True and search._room_for_estimate() is True


def test_time_left_for_estimates_ranking_and_experiments(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch, budget=Budget(100.0))
    search.clock.now = 20.0
    assert search._estimates_left() == 80.0
    assert search._ranking_left() == 80.0
    search.steps += [_step(seconds=8.0), _step(seconds=2.0, estimated=True), _step(seconds=4.0)]
    assert search._estimates_left() == 70.0  # 100 - 20 - 1.25 * 8
    assert search._ranking_left() == 56.0  # 70 - 3 * 2 - 8
    assert search._room_for(9.9) is True and search._room_for(10.0) is False  # 20 + 10 * 8 = 100
    assert search._room_for_estimate() is True
    search.steps.append(_step(seconds=70.0, estimated=True))
    assert search._room_for_estimate() is False  # 70 left is not more than 70
    search.steps.append(_step(seconds=8.0 + 0.8, estimated=False))  # 100 - 20 - 11 = 69
    assert search._estimates_left() == pytest.approx(69.0)
    search.steps[-2] = _step(seconds=68.0, estimated=True)
    assert search._room_for_estimate() is True


# -- experiments and estimates ---------------------------------------------------------------------------


def test_measure_writes_measures_and_keeps_the_best_model_only(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch)
    margins = {"start": -0.5, "better": -0.25, "worse": -0.75}
    search.builder = _Builder(
        search.clock, content=lambda r: "start" if r == Recipe() else "better" if r.per_channel else "worse"
    )
    search.evaluator = _Evaluator(search.clock, lambda text: margins[text])
    first = search.measure(Recipe(), "start", "starting recipe")
    assert first == Step(
        0, "start", "starting recipe", Recipe(), 0.0, {HOST: {"y": {"cosine": 0.25}}, "other": {"y": {"cosine": 0.25}}},
        False, -0.5, 3.0,
    )  # fmt: skip
    assert search.best is first and search.calls == [(first, first)] and search.seen == {Recipe(): first}
    assert search.model_path(0) == tmp_path / "step0.onnx" and search.model_path(0).read_text() == "start"
    assert search.measure(Recipe(), "again", "again") is first  # the earlier experiment
    assert len(search.steps) == 1 and search.builder.written == [Recipe()]
    worse = search.measure(Recipe(reduce_range=True), "global", "reduce_range=True")
    assert worse.index == 1 and worse.margin == -0.75 and search.best is first
    assert not search.model_path(1).exists() and search.model_path(0).exists()  # not the best: removed
    better = search.measure(Recipe(per_channel=True, float=frozenset({"fc"})), "nodes", "x")
    assert better.index == 2 and search.best is better and better.cost == 640 / TOTAL
    assert not search.model_path(0).exists() and search.model_path(2).read_text() == "better"
    assert search.calls[-1] == (better, better) and search.calls[1] == (worse, first)
    assert search.steps == [first, worse, better]


def test_measure_reuses_the_verdict_of_an_equal_model(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch)
    search.builder = _Builder(search.clock, content=lambda r: "same")
    search.evaluator = _Evaluator(search.clock, lambda text: 0.5)
    one = search.measure(Recipe(), "start", "a")
    two = search.measure(Recipe(per_channel=True), "global", "b")
    assert len(search.evaluator.calls) == 1 and two.margin == 0.5 and two.passed
    assert two.seconds == 1.0 and one.seconds == 3.0  # the second wrote its model only
    assert search.best is one  # equal cost and margin: the first stays


def test_measure_stands_a_failure_as_a_skipped_step(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch)
    search.builder = _Builder(search.clock)
    search.builder.failures = {
        Recipe(): QAccuracyError("  onnxruntime refused\nthe rest  "),
        Recipe(per_channel=True): ValueError("bad model\nmore"),
    }
    search.evaluator = _Evaluator(search.clock, lambda text: 1.0)
    first = search.measure(Recipe(), "start", "s")
    assert first.skipped == "onnxruntime refused" and first.measured == {} and not first.passed
    assert first.margin is None and first.cost == 0.0 and search.best is None
    assert search.calls == [(first, None)] and not search.model_path(0).exists()
    second = search.measure(Recipe(per_channel=True), "global", "g")
    assert second.skipped == "ValueError: bad model" and search.evaluator.calls == []
    search.evaluator.margins = lambda text: RuntimeError("a target cannot run it")
    third = search.measure(Recipe(reduce_range=True), "global", "r")
    assert third.skipped == "RuntimeError: a target cannot run it"
    search.evaluator.margins = lambda text: InputError("bad records")
    assert search.measure(Recipe(weight_type="uint8"), "global", "w").skipped == "bad records"


def test_measure_checks_the_budget_first(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch, budget=Budget(experiments=1))
    search.builder = _Builder(search.clock)
    search.evaluator = _Evaluator(search.clock, lambda text: -1.0)
    search.measure(Recipe(), "start", "s")
    with pytest.raises(_OutOfBudget):
        search.measure(Recipe(per_channel=True), "global", "g")
    assert search.builder.written == [Recipe()]
    assert search.measure(Recipe(), "start", "s") is search.steps[0]  # a known one costs nothing


def test_a_step_of_no_verdict(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch)
    search.clock.now = 7.5
    recipe = Recipe(int16=frozenset({"conv2"}))
    step = search._step(3, "ph", "ch", recipe, None, 2.5, "why")
    assert step == Step(3, "ph", "ch", recipe, 18432 / TOTAL, {}, False, None, 5.0, "why", estimated=False)
    verdict = Verdict({HOST: {}}, True, 0.0)
    step = search._step(4, "ph", "ch", recipe, verdict, 7.5, None, estimated=True)
    assert step.measured is verdict.measured and step.passed and step.margin == 0.0 and step.estimated
    assert step.seconds == 0.0


def _model():
    return onnx.load(str(FP32))


def test_estimate_runs_the_edited_model_on_the_host(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch)
    search.evaluator = _Evaluator(search.clock, lambda text: -0.125)
    made = []
    first = search.estimate(Recipe(per_channel=True), "global", "per_channel=True", lambda: made.append(1) or _model())
    assert first == Step(
        0, "global", "per_channel=True", Recipe(per_channel=True), 0.0, {HOST: {"y": {"cosine": 0.4375}}}, False,
        -0.125, 2.0, estimated=True,
    )  # fmt: skip
    assert search.evaluator.calls == [("estimate.onnx", (HOST,))]
    assert not (tmp_path / "estimate.onnx").exists()
    assert search.calls == [(first, None)] and search.best is None and search.estimates == {first.recipe: first}
    again = search.estimate(Recipe(per_channel=True), "x", "y", lambda: made.append(2) or _model())
    assert again is first and made == [1] and len(search.steps) == 1


def test_estimate_of_a_refused_recipe_is_skipped_unrun(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch)
    search.evaluator = _Evaluator(search.clock, lambda text: 1.0)
    search.best = _step(passed=True, margin=1.0)
    made = []
    refused = Recipe(activation_type="int8", weight_type="uint8")
    step = search.estimate(refused, "global", "weight_type=uint8", lambda: made.append(1) or _model())
    assert step.skipped == "onnxruntime's quantize_static refuses int8 activations with uint8 weights"
    assert made == [] and search.evaluator.calls == [] and step.estimated and step.margin is None
    assert search.calls == [(step, search.best)]


def test_estimate_stands_a_failure_as_a_skipped_row(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch)
    search.evaluator = _Evaluator(search.clock, lambda text: QAccuracyError("cannot run\nat all"))
    assert search.estimate(Recipe(), "g", "a", _model).skipped == "cannot run"
    search.evaluator.margins = lambda text: KeyError("x")
    assert search.estimate(Recipe(per_channel=True), "g", "b", _model).skipped == "KeyError: 'x'"

    def broken():
        raise ValueError("no model")

    assert search.estimate(Recipe(reduce_range=True), "g", "c", broken).skipped == "ValueError: no model"
    assert not (tmp_path / "estimate.onnx").exists()
    assert [s.index for s in search.steps] == [0, 1, 2] and all(s.estimated for s in search.steps)


def test_estimate_checks_the_estimate_budget(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch, budget=Budget(10.0, experiments=1))
    search.evaluator = _Evaluator(search.clock, lambda text: -1.0)
    search.steps.append(_step())  # one experiment done: estimates go on
    search.estimate(Recipe(), "g", "a", _model)  # 2 s
    search.clock.now = 7.9
    search.estimate(Recipe(per_channel=True), "g", "b", _model)
    with pytest.raises(_OutOfBudget):
        search.estimate(Recipe(reduce_range=True), "g", "c", _model)  # 9.9 + 2 >= 10


def test_measured_margin_saves_runs_and_removes_the_model(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch)
    search.evaluator = _Evaluator(search.clock, lambda text: 0.25)
    assert search._measured_margin(_model()) == 0.25
    assert search.evaluator.calls == [("estimate.onnx", (HOST,))] and not (tmp_path / "estimate.onnx").exists()
    search.evaluator.margins = lambda text: ValueError("no")
    with pytest.raises(ValueError):
        search._measured_margin(_model())
    assert not (tmp_path / "estimate.onnx").exists()


# -- global moves and the global space ---------------------------------------------------------------------


def test_global_moves_in_order_the_histogram_methods_last_cheapest_first(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch, methods=("minmax", "kl", "percentile", "mse", "ort-minmax"))
    moves = list(search._global_moves(Recipe()))
    assert moves == [
        ("per_channel=True", Recipe(per_channel=True)),
        ("reduce_range=True", Recipe(reduce_range=True)),
        ("method=percentile", Recipe(method="percentile")),
        ("method=ort-minmax", Recipe(method="ort-minmax")),
        ("activation_type=int8", Recipe(activation_type="int8")),
        ("weight_type=uint8", Recipe(weight_type="uint8")),
        ("method=mse", Recipe(method="mse")),
        ("method=kl", Recipe(method="kl")),
    ]
    other = Recipe(method="mse", per_channel=True, reduce_range=True, activation_type="int8", weight_type="uint8")
    assert list(search._global_moves(other)) == [
        ("per_channel=False", replace(other, per_channel=False)),
        ("reduce_range=False", replace(other, reduce_range=False)),
        ("method=minmax", replace(other, method="minmax")),
        ("method=percentile", replace(other, method="percentile")),
        ("method=ort-minmax", replace(other, method="ort-minmax")),
        ("activation_type=uint8", replace(other, activation_type="uint8")),
        ("weight_type=int8", replace(other, weight_type="int8")),
        ("method=kl", replace(other, method="kl")),
    ]


def test_global_space_is_the_product_of_the_varied_choices_best_first(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch, vary=("per_channel", "activation_type", "weight_type"))
    f, t = False, True
    space = search.global_space(Recipe())
    expected = [
        Recipe(per_channel=f),
        Recipe(per_channel=f, weight_type="uint8"),
        Recipe(per_channel=f, activation_type="int8"),
        Recipe(per_channel=t),
        Recipe(per_channel=t, weight_type="uint8"),
        Recipe(per_channel=t, activation_type="int8"),
    ]  # the refused int8 activations with uint8 weights left out
    assert space == expected
    # by margin: a verified one first, else an estimate; skipped and unknown ones last in order
    search.seen[Recipe(per_channel=t)] = _step(margin=-0.1)
    search.estimates[Recipe(activation_type="int8")] = _step(margin=-0.05, estimated=True)
    search.estimates[Recipe(per_channel=t, activation_type="int8")] = _step(margin=None, estimated=True)
    search.seen[Recipe(weight_type="uint8")] = _step(margin=2.0, skipped="refused")
    search.estimates[Recipe(per_channel=t, weight_type="uint8")] = _step(margin=-3.0, estimated=True)
    search.seen[Recipe(per_channel=t, weight_type="uint8")] = _step(margin=-0.2)  # verified beats its estimate
    base = Recipe(float=frozenset({"fc"}), flipped=frozenset({"conv1"}))
    assert search.global_space(base) == [
        Recipe(flipped=frozenset({"conv1"})),  # the base first, its nodes dropped (not its flips)
        Recipe(activation_type="int8"),
        Recipe(per_channel=t),
        Recipe(per_channel=t, weight_type="uint8"),
        Recipe(),
        Recipe(weight_type="uint8"),
        Recipe(per_channel=t, activation_type="int8"),
    ]
    # the base in the space: first, once
    assert search.global_space(Recipe(per_channel=t, int16=frozenset({"fc"})))[:2] == [
        Recipe(per_channel=t),
        Recipe(activation_type="int8"),
    ]
    assert len(search.global_space(Recipe(per_channel=t))) == 6


def test_global_space_of_the_methods_and_reduce_range_from_the_start(tmp_path, monkeypatch):
    start = Recipe(method="kl", reduce_range=True, activation_type="int8", weight_type="int8")
    search = _search(
        tmp_path, monkeypatch, methods=("minmax", "kl", "mse"), vary=("method", "reduce_range"), start=start
    )
    assert search.global_space(start) == [
        replace(start, method=m, reduce_range=r) for m in ("kl", "minmax", "mse") for r in (True, False)
    ]
    nothing = _search(tmp_path, monkeypatch, vary=(), start=start)
    assert nothing.global_space(start) == [start]
    assert nothing.global_space(Recipe()) == [Recipe(), start]


def test_global_space_of_each_type_from_the_start(tmp_path, monkeypatch):
    start = Recipe(per_channel=True, activation_type="int8", weight_type="int8")
    search = _search(tmp_path, monkeypatch, vary=("per_channel", "activation_type", "weight_type"), start=start)
    assert search.global_space(start) == [
        start,
        replace(start, activation_type="uint8"),
        replace(start, activation_type="uint8", weight_type="uint8"),
        replace(start, per_channel=False),
        replace(start, per_channel=False, activation_type="uint8"),
        replace(start, per_channel=False, activation_type="uint8", weight_type="uint8"),
    ]


# -- the node phase's pieces --------------------------------------------------------------------------------


def test_candidates_are_the_quantized_nodes_the_fp32_model_names(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch)
    search.base_models[Recipe()] = QDQ
    # the QDQ model fuses each Relu into its Conv: no relu1, relu2
    assert search._candidates(Recipe()) == ["conv1", "pool1", "conv2", "pool2", "flatten", "fc"]
    search.cost = CostModel({"conv2": 1.0, "fc": 1.0, "relu1": 1.0})
    assert search._candidates(Recipe()) == ["conv2", "fc"]


def test_base_model_is_the_estimated_one_else_the_verified_one_written_again(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch)
    search.builder = _Builder(search.clock)
    search.base_models[Recipe(per_channel=True)] = Path("global.onnx")
    assert search._base_model(Recipe(per_channel=True)) == Path("global.onnx")
    search.seen[Recipe()] = _step(index=3)
    search.model_path(3).write_text("kept")
    assert search._base_model(Recipe()) == tmp_path / "step3.onnx" and search.builder.written == []
    search.model_path(3).unlink()
    assert search._base_model(Recipe()) == tmp_path / "step3.onnx"
    assert search.builder.written == [Recipe()] and search.model_path(3).read_text() == repr(Recipe())


def test_assignment_cost_sums_the_node_costs_rounded():
    cost = CostModel({"a": 0.1, "b": 0.2, "c": 1.0}, int16=0.5, float=1.0)
    assert assignment_cost(["a", "b"], ["float", "float"], cost) == 0.3  # 0.1 + 0.2 is 0.30000000000000004
    assert assignment_cost(["a", "b", "c"], ["int8", "float", "int16"], cost) == 0.7
    assert assignment_cost(["x"], ["float"], cost) == 1.0  # a node without work counts as one
    assert assignment_cost([], [], cost) == 0.0
    with pytest.raises(ValueError):
        assignment_cost(["a", "b"], ["float"], cost)


def test_cost_ordered_three_levels_by_hand():
    """a costs 1 (int16 0.5), b costs 2 (int16 1): ties at cost 1 go lexicographic on the levels'
    ranks ((int8, int16) before (float, int8)), at cost 2 to fewer wide nodes ((int8, float) before
    (float, int16))."""
    cost = CostModel({"a": 1.0, "b": 2.0}, int16=0.5, float=1.0)
    assert list(cost_ordered(["a", "b"], ["int8", "int16", "float"], cost)) == [
        ("int8", "int8"),  # 0
        ("int16", "int8"),  # 0.5
        ("int8", "int16"),  # 1
        ("float", "int8"),  # 1
        ("int16", "int16"),  # 1.5
        ("int8", "float"),  # 2, one wide node
        ("float", "int16"),  # 2, two
        ("int16", "float"),  # 2.5
        ("float", "float"),  # 3
    ]


def test_cost_ordered_two_levels_and_free_int16():
    cost = CostModel({"a": 3.0, "b": 1.0, "c": 2.0}, int16=1.0, float=1.0)
    assert list(cost_ordered(["a", "b", "c"], ["int8", "float"], cost)) == [
        ("int8", "int8", "int8"),  # 0
        ("int8", "float", "int8"),  # 1
        ("int8", "int8", "float"),  # 2
        ("float", "int8", "int8"),  # 3, one wide node
        ("int8", "float", "float"),  # 3, two
        ("float", "float", "int8"),  # 4
        ("float", "int8", "float"),  # 5
        ("float", "float", "float"),  # 6
    ]
    free = CostModel({"a": 1.0, "b": 1.0}, int16=0.0, float=1.0)
    assert list(cost_ordered(["a", "b"], ["int8", "int16", "float"], free))[:4] == [
        ("int8", "int8"),
        ("int8", "int16"),  # cost 0, one wide node: lexicographic (0, 1) before (1, 0)
        ("int16", "int8"),
        ("int16", "int16"),  # cost 0, two wide nodes
    ]
    assert list(cost_ordered([], ["int8", "float"], free)) == [()]
    assert len(list(cost_ordered(["a", "b"], ["int8", "int16", "float"], free))) == 9


def test_cost_ordered_equal_sums_tie_on_fewer_wide_nodes():
    """0.1 + 0.2 is 0.30000000000000004 in floats, less than c's 0.3000000000000001: rounded, the
    two cost the same and c alone (one wide node) comes first."""
    cost = CostModel({"a": 0.1, "b": 0.2, "c": 0.3000000000000001}, int16=1.0, float=1.0)
    order = list(cost_ordered(["a", "b", "c"], ["int8", "float"], cost))
    assert order[:5] == [
        ("int8", "int8", "int8"),
        ("float", "int8", "int8"),
        ("int8", "float", "int8"),
        ("int8", "int8", "float"),
        ("float", "float", "int8"),
    ]


@pytest.mark.parametrize(
    ("estimator", "head", "required", "expected"),
    [
        (SimpleNamespace(base=-0.5, gains={"a": 0.25, "b": 0.125}), ["a", "b"], 0.0, True),  # -0.5 + 0.5
        (SimpleNamespace(base=-0.5, gains={"a": 0.25, "b": 0.125}), ["a", "b"], 1e-9, False),
        (SimpleNamespace(base=-0.5, gains={"a": 0.25, "b": 0.125}), ["b"], -0.25, True),  # -0.5 + 0.25
        (SimpleNamespace(base=-0.5, gains={"a": 0.25, "b": 0.125}), ["b"], -0.2, False),
        (SimpleNamespace(base=-0.5, gains={"a": -1.0}), ["a"], -0.5, True),  # a loss counts as no gain
        (SimpleNamespace(base=-0.5, gains={"a": -1.0}), ["a"], -0.4, False),
        (SimpleNamespace(base=-0.5, gains={"a": 1.0}), ["z"], -0.4, False),  # no gain known: none
        (SimpleNamespace(base=-0.5, gains={"a": 1.0}), ["z", "a"], 1.5, True),
        (SimpleNamespace(base=None, gains={"a": 0.0}), ["a"], 5.0, True),
        (SimpleNamespace(base=-0.5, gains={}), ["a"], 5.0, True),
        (SimpleNamespace(base=-math.inf, gains={"a": 0.0}), ["a"], 5.0, True),
        (SimpleNamespace(base=math.nan, gains={"a": 0.0}), ["a"], 5.0, True),
        (SimpleNamespace(gains={"a": 0.0}), ["a"], 5.0, True),
        (SimpleNamespace(base=-0.5), ["a"], 5.0, True),
    ],
)
def test_head_may_pass(estimator, head, required, expected):
    assert _head_may_pass(estimator, head, required) is expected


def test_names_and_first_line():
    assert _names(["a", "b", "c"]) == "a,b,c"
    assert _names(["a", "b", "c", "d", "e"]) == "a,b,c (+2 more)"
    assert _names(["a", "b"], shown=1) == "a (+1 more)"
    assert _names([]) == ""
    assert _first_line(ValueError("  first\nsecond ")) == "first"
    assert _first_line(ValueError("")) == "ValueError"
    assert _first_line(KeyError()) == "KeyError"
    assert _first_line(ValueError("x" * 400)) == "x" * 300


def test_held_out_and_name(tmp_path):
    data = tmp_path / "d.npz"
    data.write_bytes(b"x")
    (tmp_path / "e.npz").write_bytes(b"x")
    link = tmp_path / "link.npz"
    os.symlink(data, link)
    dataset = SimpleNamespace(name="set")
    assert held_out(dataset, dataset) is False
    assert held_out(dataset, SimpleNamespace(name="set")) is True
    assert held_out(str(data), data) is False
    assert held_out(data, link) is False
    assert held_out(data, tmp_path / "e.npz") is True
    assert held_out(data, tmp_path / "missing.npz") is True
    assert held_out(str(data), dataset) is True and held_out(dataset, data) is True
    assert _name(dataset) == "set"
    assert _name(SimpleNamespace(name="")) == "namespace(name='')"
    assert _name(data) == "d.npz" and _name(str(data)) == "d.npz"


# -- exhaustive -----------------------------------------------------------------------------------------------


def _rule_search(search, passes, margin=None):
    """``search.measure`` stands in: a recipe passes when ``passes(recipe)``; each call recorded."""
    asked = []

    def measure(recipe, phase, change):
        asked.append((recipe, phase, change))
        ok = passes(recipe)
        step = Step(len(search.steps), phase, change, recipe, search.cost.relative(recipe), {}, ok,
                    margin(recipe) if margin else (0.5 if ok else -0.5), 1.0)  # fmt: skip
        search.steps.append(step)
        search.clock.now += 1.0
        if _better(step, search.best):
            search.best = step
        return step

    search.measure = measure
    return asked


def test_exhaustive_first_under_the_base_then_cheaper_under_every_global_recipe(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch, vary=("per_channel",))
    search.cost = CostModel({"a": 1.0, "b": 2.0}, int16=0.5, float=1.0)
    # per tensor: b must be float; per channel: a wide enough
    asked = _rule_search(search, lambda r: "b" in r.float if not r.per_channel else r.precision("a") != "int8")
    search._exhaustive(Recipe(), ["a", "b"], ["int8", "int16", "float"])

    def p(recipe, **nodes):
        return recipe.with_nodes(nodes), "exhaustive", recipe.with_nodes(nodes).changes_from(Recipe())

    pc = Recipe(per_channel=True)
    assert asked == [
        p(Recipe()),
        p(Recipe(), a="int16"),
        p(Recipe(), b="int16"),
        p(Recipe(), a="float"),
        p(Recipe(), a="int16", b="int16"),
        p(Recipe(), b="float"),  # passes at cost 2: the bound
        p(Recipe()),  # then every cheaper assignment under each global recipe
        p(pc),
        p(Recipe(), a="int16"),
        p(pc, a="int16"),  # passes: the joint optimum
    ]
    assert search.notes == ["cheaper assignments under each of 2 global recipe(s), best estimated first"]


def test_exhaustive_stops_at_the_bound_and_with_a_single_global_recipe(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch, vary=("per_channel",))
    search.cost = CostModel({"a": 1.0, "b": 2.0}, int16=1.0, float=1.0)
    asked = _rule_search(search, lambda r: "b" in r.float)  # the same under per channel
    search._exhaustive(Recipe(), ["a", "b"], ["int8", "float"])
    floats = [sorted(r.float) for r, _, _ in asked]
    pcs = [r.per_channel for r, _, _ in asked]
    # (int8, int8) 0, (float, int8) 1, (int8, float) 2 passes; then those cheaper than 2 on both
    assert floats == [[], ["a"], ["b"], [], [], ["a"], ["a"]]
    assert pcs == [False, False, False, False, True, False, True]
    single = _search(tmp_path, monkeypatch, vary=())
    single.cost = search.cost
    asked = _rule_search(single, lambda r: "a" in r.float)
    single._exhaustive(Recipe(), ["a", "b"], ["int8", "float"])
    assert [sorted(r.float) for r, _, _ in asked] == [[], ["a"]] and single.notes == []


def test_exhaustive_with_no_pass_tries_everything_under_every_recipe(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch, vary=("per_channel",))
    search.cost = CostModel({"a": 1.0}, int16=1.0, float=1.0)
    asked = _rule_search(search, lambda r: False)
    search._exhaustive(Recipe(), ["a"], ["int8", "float"])
    assert [(sorted(r.float), r.per_channel) for r, _, _ in asked] == [
        ([], False),
        (["a"], False),
        ([], False),
        ([], True),
        (["a"], False),
        (["a"], True),
    ]


# -- node phase dispatch ------------------------------------------------------------------------------------


def _dispatch(search, nodes, moved=None):
    done = []
    search._candidates = lambda base: done.append(("candidates", base)) or nodes
    search._weight_phase = lambda base, found: done.append(("weights", base, found)) or (moved or base)
    search._exhaustive = lambda base, found, levels: done.append(("exhaustive", base, found, levels))
    search._guided = lambda base, found, widen: done.append(("guided", base, found, widen))
    return done


def test_node_phase_chooses_exhaustive_or_guided_and_the_levels(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch, exhaustive_nodes=2)
    base, moved = Recipe(), Recipe(flipped=frozenset({"a"}))
    done = _dispatch(search, ["a", "b"], moved)
    search._node_phase(base)
    assert done == [
        ("candidates", base),
        ("weights", base, ["a", "b"]),
        ("exhaustive", moved, ["a", "b"], ["int8", "float"]),  # int16 costs what float does: no 16-bit level
    ]
    assert search.notes == ["2 candidate node(s): every assignment of int8/float in order of cost"]
    search.cost = CostModel(search.cost.work, int16=0.5, float=1.0)
    done = _dispatch(search, ["a", "b"])
    search._node_phase(base)
    assert done[2] == ("exhaustive", base, ["a", "b"], ["int8", "int16", "float"])
    done = _dispatch(search, ["a", "b", "c"])
    search._node_phase(base)
    assert done[2] == ("guided", base, ["a", "b", "c"], True)
    search.cost = CostModel(search.cost.work, int16=1.0, float=1.0)
    done = _dispatch(search, ["a", "b", "c"])
    search._node_phase(base)
    assert done[2] == ("guided", base, ["a", "b", "c"], False)


def test_node_phase_without_candidates_or_after_a_free_pass(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch)
    done = _dispatch(search, [])
    search._node_phase(Recipe())
    assert done == [("candidates", Recipe())]
    done = _dispatch(search, ["a"])
    search.best = _step(passed=True, margin=0.1, cost=0.0)
    search._node_phase(Recipe())
    assert [d[0] for d in done] == ["candidates", "weights"]
    search.best = _step(passed=True, margin=0.1, cost=0.1)
    done = _dispatch(search, ["a"])
    search._node_phase(Recipe())
    assert [d[0] for d in done] == ["candidates", "weights", "exhaustive"]
    search.best = _step(passed=False, margin=-0.1, cost=0.0)
    done = _dispatch(search, ["a"])
    search._node_phase(Recipe())
    assert [d[0] for d in done] == ["candidates", "weights", "exhaustive"]


# -- the prefix search ------------------------------------------------------------------------------------------


class _Estimator:
    """The estimator's stand-in: a float set's estimated margin is ``margin(set)``; every call recorded."""

    def __init__(self, margin, base=None, gains=None) -> None:
        self.margin, self.base, self.gains = margin, base, gains or {}
        self.asked: list[tuple[list[list[str]], str]] = []
        self.dropped: list[tuple[list[str], list[str]]] = []

    def margins(self, floats, what):
        self.asked.append(([list(f) for f in floats], what))
        return [self.margin(set(f)) for f in floats]

    def droppable_margins(self, kept, nodes):
        self.dropped.append((list(kept), list(nodes)))
        return [self.margin(set(kept) - {n}) for n in nodes]


ORDER = [f"n{i}" for i in range(10)]


def test_estimated_boundary_short_prefixes_then_bisection(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch)
    estimator = _Estimator(lambda f: (len(f) - 5) / 10)  # 5 nodes or more pass, margin grows with them
    assert search._estimated_boundary(estimator, ORDER, 0, 0.0) == (5, 0.0)
    assert estimator.asked == [
        ([ORDER], "bisecting"),
        ([ORDER[:1], ORDER[:2], ORDER[:4], ORDER[:8]], "short prefixes"),
        ([ORDER[:6]], "bisecting"),
        ([ORDER[:5]], "bisecting"),
    ]
    assert search.notes == [
        "bisecting 10 ordered node(s) on estimates (margin >= 0)",
        "estimating the order's head: the top 1, 2, 4, 8 node(s)",
        "estimated boundary: the top 5 node(s) in float (estimated margin 0)",
    ]


def test_estimated_boundary_past_a_known_miss_and_a_required_margin(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch)
    estimator = _Estimator(lambda f: (len(f) - 5) / 10)
    assert search._estimated_boundary(estimator, ORDER, 5, 0.201) == (8, pytest.approx(0.3))
    assert (
        estimator.asked
        == [
            ([ORDER], "bisecting"),
            ([ORDER[:6], ORDER[:7], ORDER[:9]], "short prefixes"),  # 5 + 8 is past the order
            ([ORDER[:8]], "bisecting"),
        ]
    )
    assert search.notes[:2] == [
        "bisecting 5 ordered node(s) on estimates (margin >= 0.201)",
        "estimating the order's head: the top 1, 2, 4 node(s)",
    ]
    assert search.notes[2] == "estimated boundary: the top 8 node(s) in float (estimated margin 0.3)"


def test_estimated_boundary_when_the_whole_order_misses_or_no_time(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch)
    estimator = _Estimator(lambda f: -0.5)
    assert search._estimated_boundary(estimator, ORDER, 0, 0.0) == (10, None)
    assert estimator.asked == [([ORDER], "bisecting")]
    timed = _search(tmp_path, monkeypatch, budget=Budget(10.0))
    timed.steps.append(_step(seconds=8.0))  # 10 - 1.25 * 8 = 0 left: not more than an estimate's 0
    estimator = _Estimator(lambda f: 1.0)
    assert timed._estimated_boundary(estimator, ORDER, 0, 0.0) == (10, None)
    assert estimator.asked == [] and timed.notes == ["no time left to bisect: verifying every ordered node in float"]


def test_estimated_boundary_skips_the_head_when_no_node_gains_enough(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch)
    estimator = _Estimator(lambda f: (len(f) - 5) / 10, base=-1.0, gains={"n0": 0.25})
    assert search._estimated_boundary(estimator, ORDER, 0, 0.0) == (5, 0.0)
    assert [what for _, what in estimator.asked] == ["bisecting"] * 5  # no head: bisection alone
    assert [len(f[0]) for f, _ in estimator.asked] == [10, 5, 2, 3, 4]


def test_estimated_boundary_head_passing_at_once_and_the_full_order_alone(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch)
    estimator = _Estimator(lambda f: 0.25 if len(f) in (1, 10) else -0.25)
    assert search._estimated_boundary(estimator, ORDER, 0, 0.0) == (1, 0.25)
    assert [len(f) for f in estimator.asked[1][0]] == [1, 2, 4, 8] and len(estimator.asked) == 2
    estimator = _Estimator(lambda f: 0.0)
    assert search._estimated_boundary(estimator, ORDER[:2], 1, 0.0) == (2, 0.0)  # nothing between
    assert estimator.asked == [([ORDER[:2]], "bisecting")]


def test_estimated_boundary_stops_bisecting_when_time_runs_out(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch, budget=Budget(100.0))
    search.steps.append(_step(seconds=8.0))  # 90 s left for estimates

    def margin(f):
        search.clock.now += 20.0  # each estimate: 20 s
        search.steps.append(_step(seconds=20.0, estimated=True))
        return (len(f) - 5) / 10

    estimator = _Estimator(margin, base=-1.0, gains={"n0": 0.25})  # no head
    # 10 at 20 s (70 left), 5 at 40 s (50 left), 2 at 60 s (30 left), 3 at 80 s: 10 left, not more than 20
    assert search._estimated_boundary(estimator, ORDER, 0, 0.0) == (5, 0.0)
    assert [len(f[0]) for f, _ in estimator.asked] == [10, 5, 2, 3]
    search = _search(tmp_path, monkeypatch, budget=Budget(100.0))
    search.steps.append(_step(seconds=8.0))
    estimator = _Estimator(margin)  # the head's four estimates leave no time for bisection
    assert search._estimated_boundary(estimator, ORDER, 0, 0.0) == (8, pytest.approx(0.3))
    assert len(estimator.asked) == 2


def test_verified_prefix_asks_more_of_the_estimate_after_a_miss(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch)
    estimator = _Estimator(lambda f: (len(f) - 5) / 10)
    asked = _rule_search(search, lambda r: len(r.float) >= 7, margin=lambda r: (len(r.float) - 7) / 10)
    step = search._verified_prefix(Recipe(), estimator, ORDER)
    assert step.passed and sorted(step.recipe.float) == sorted(ORDER[:8])
    # estimated 0 at 5, verified -0.2: the next must be estimated at 0.2 more (plus 0.001)
    assert [(sorted(r.float), c) for r, _, c in asked] == [
        (sorted(ORDER[:5]), "float: top 5"),
        (sorted(ORDER[:8]), "float: top 8"),
    ]
    assert {p for _, p, _ in asked} == {"nodes"}


def test_verified_prefix_gives_up_after_the_whole_order_or_a_skip(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch)
    estimator = _Estimator(lambda f: -0.5)  # even all of them estimated to miss
    asked = _rule_search(search, lambda r: False)
    assert search._verified_prefix(Recipe(), estimator, ORDER) is None
    assert [len(r.float) for r, _, _ in asked] == [10]
    search = _search(tmp_path, monkeypatch)
    estimator = _Estimator(lambda f: (len(f) - 5) / 10)
    asked = _rule_search(search, lambda r: False, margin=lambda r: None)  # a skipped experiment
    assert search._verified_prefix(Recipe(), estimator, ORDER) is None
    assert [len(r.float) for r, _, _ in asked] == [5]


def test_verified_prefix_all_in_float_after_the_retries(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch)
    order = [f"n{i}" for i in range(40)]
    estimator = _Estimator(lambda f: 1.0 if len(f) >= 2 else -1.0)  # always optimistic
    asked = _rule_search(search, lambda r: len(r.float) == 40, margin=lambda r: 0.0 if len(r.float) == 40 else -1.0)
    step = search._verified_prefix(Recipe(), estimator, order)
    # required 0 -> 2.001 (estimated 1, verified -1) -> unreachable: the whole order each time after
    assert [(len(r.float), c) for r, _, c in asked] == [(2, "float: top 2"), (40, "float: top 40")]
    assert step.passed
    search = _search(tmp_path, monkeypatch)
    estimator = _Estimator(lambda f: 0.0)  # estimated at exactly what is asked: 0, then 0.001, ...
    asked = _rule_search(search, lambda r: len(r.float) == 40, margin=lambda r: 0.0 if len(r.float) == 40 else -1e-4)
    search._verified_prefix(Recipe(), estimator, order)
    assert [(len(r.float), c) for r, _, c in asked] == [(1, "float: top 1"), (40, "float: top 40")]


@pytest.mark.parametrize("last", [True, False])
def test_verified_prefix_three_tries_then_all_in_float(tmp_path, monkeypatch, last):
    """Estimated 0.01 a node, verified 0.001 short each time: required 0 -> 1 node (0.01); then
    0.012 -> 2 nodes (0.02); then 0.034 -> 3 misses, 4 passes (0.04); then every node."""
    search = _search(tmp_path, monkeypatch)
    order = [f"n{i}" for i in range(40)]
    estimator = _Estimator(lambda f: len(f) / 100)
    asked = _rule_search(
        search, lambda r: last and len(r.float) == 40, margin=lambda r: 0.0 if last and len(r.float) == 40 else -0.001
    )
    step = search._verified_prefix(Recipe(), estimator, order)
    assert [(len(r.float), c) for r, _, c in asked] == [
        (1, "float: top 1"),
        (2, "float: top 2"),
        (4, "float: top 4"),
        (40, "float: all 40"),
    ]
    assert (step is search.steps[-1]) if last else step is None


# -- pruning ------------------------------------------------------------------------------------------------------


WORK = {"a": 8.0, "b": 4.0, "c": 2.0, "d": 1.0}


def test_prune_round_estimates_alone_then_together_then_verifies_halving(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch)
    search.cost = CostModel(WORK)
    # estimated: a must stay float, and one more node with it
    estimator = _Estimator(lambda f: 0.5 if "a" in f and len(f) >= 2 else -0.5)
    # verified: three float nodes at least
    asked = _rule_search(search, lambda r: len(r.float) >= 3)
    passing = _step(passed=True, margin=0.5, recipe=Recipe(float=frozenset(WORK)))
    missed: set[str] = set()
    found = search._prune_round(estimator, passing, lambda n: WORK[n], missed)
    assert estimator.dropped == [(list(passing.recipe.float), ["a", "b", "c", "d"])]
    assert missed == {"a"}
    # the longest run of b, c, d estimated to pass together: 2 of 3 (mid 2 passes, mid 3 misses)
    assert [sorted(f[0]) for f, _ in estimator.asked] == [["a", "d"], ["a"]]
    assert [what for _, what in estimator.asked] == ["pruning", "pruning"]
    assert [(sorted(r.float), p, c) for r, p, c in asked] == [
        (["a", "d"], "prune", "float -b,c"),
        (["a", "c", "d"], "prune", "float -b"),
    ]
    assert found is search.steps[-1] and sorted(found.recipe.float) == ["a", "c", "d"]
    assert search.notes == ["pruning: estimating 4 of 4 float node(s) quantized again"]


def test_prune_round_with_nothing_left_to_estimate_or_nothing_that_passes(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch)
    search.cost = CostModel(WORK)
    estimator = _Estimator(lambda f: -0.5)
    passing = _step(passed=True, recipe=Recipe(float=frozenset({"a", "b"})))
    assert search._prune_round(estimator, passing, lambda n: WORK[n], {"a", "b"}) is None
    assert estimator.dropped == [] and search.notes == []
    missed: set[str] = set()
    asked = _rule_search(search, lambda r: False)
    assert search._prune_round(estimator, passing, lambda n: WORK[n], missed) is None
    assert missed == {"a", "b"} and asked == [] and estimator.asked == []
    # estimated to pass, verified to miss: halved down to none
    estimator = _Estimator(lambda f: 0.5)
    passing = _step(passed=True, recipe=Recipe(float=frozenset(WORK)))
    assert search._prune_round(estimator, passing, lambda n: WORK[n], set()) is None
    assert [len(r.float) for r, _, _ in asked] == [0, 2, 3]  # 4 dropped, then 2, then 1
    assert [c for _, _, c in asked] == ["float -a,b,c (+1 more)", "float -a,b", "float -a"]


def test_prune_round_estimates_what_the_budget_affords(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch, budget=Budget(100.0))
    search.cost = CostModel(WORK)
    search.clock.now = 40.0
    # the median estimate takes 3 s (of 1, 2, 3, 4), the longest experiment 23 s:
    # (60 - 2 * 23) / 2 / 3 = 2.33: the two costliest
    search.steps += [_step(seconds=s, estimated=True) for s in (4.0, 1.0, 3.0, 2.0)] + [_step(seconds=23.0)]
    estimator = _Estimator(lambda f: -0.5)
    search._prune_round(estimator, _step(recipe=Recipe(float=frozenset(WORK))), lambda n: WORK[n], set())
    assert estimator.dropped[0][1] == ["a", "b"]
    assert search.notes == ["pruning: estimating 2 of 4 float node(s) quantized again"]
    search.steps = [_step(seconds=25.0)]  # no estimate yet: 1 s a node; (60 - 50) / 2 / 1 = 5
    estimator = _Estimator(lambda f: -0.5)
    search._prune_round(estimator, _step(recipe=Recipe(float=frozenset(WORK))), lambda n: WORK[n], {"b"})
    assert estimator.dropped[0][1] == ["a", "c", "d"]
    search.steps = [_step(seconds=30.0)]  # nothing affordable: none estimated
    estimator = _Estimator(lambda f: -0.5)
    assert search._prune_round(estimator, _step(recipe=Recipe(float=frozenset(WORK))), lambda n: WORK[n], set()) is None
    assert estimator.dropped == []
    search.steps = [_step(seconds=0.0, estimated=True), _step(seconds=0.0)]  # instant estimates: 1 ms each
    monkeypatch.setattr(estimate_module, "PRUNE_NODES", 3)
    estimator = _Estimator(lambda f: -0.5)
    search._prune_round(estimator, _step(recipe=Recipe(float=frozenset(WORK))), lambda n: WORK[n], set())
    assert estimator.dropped[0][1] == ["a", "b", "c"]  # at most PRUNE_NODES


def test_prune_round_checks_the_budget_while_bisecting(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch, budget=Budget(100.0))
    search.cost = CostModel(WORK)
    # the median estimate 1 s: 5 / 2 / 1 = 2 nodes affordable; the longest, 10 s, does not fit
    search.steps += [_step(seconds=s, estimated=True) for s in (1.0, 10.0, 1.0)]
    search.clock.now = 95.0
    estimator = _Estimator(lambda f: 0.5)
    with pytest.raises(_OutOfBudget):
        search._prune_round(estimator, _step(recipe=Recipe(float=frozenset({"a"}))), lambda n: WORK[n], set())


def test_prune_goes_on_while_a_round_passes_or_misses_new_nodes(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch)
    first, second = _step(index=1), _step(index=2)
    script = iter([(second, set()), (None, {"x"}), (None, set()), (first, set())])
    rounds = []

    def round_(estimator, passing, cost, missed):
        rounds.append((passing, set(missed)))
        found, new = next(script)
        missed |= new
        return found

    search._prune_round = round_
    search._prune("estimator", first, len)
    assert rounds == [(first, set()), (second, set()), (second, {"x"})]


# -- guided -------------------------------------------------------------------------------------------------------


class _GuidedEstimator(_Estimator):
    made: ClassVar[list] = []

    def __init__(self, *args, order=None, margin=lambda f: 0.5, **kwargs) -> None:
        super().__init__(margin)
        self.args = args
        self.given_order = order
        self.exited = False
        _GuidedEstimator.made.append(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.exited = True

    def order(self, nodes, cost, left):
        self.ordered = (list(nodes), [cost(n) for n in nodes], left())
        return list(reversed(nodes))


def _all_in_float(search, base, order):
    step = search.measure(base.with_nodes({n: "float" for n in order}), "nodes", "float: all")
    return step if step.passed else None


def _guided(tmp_path, monkeypatch, passes, budget=None, widen=True, prefix=_all_in_float, work=None):
    work = work or WORK
    search = _search(tmp_path, monkeypatch, budget=budget)
    search.cost = CostModel(work, int16=0.5, float=1.0)
    search.base_models[Recipe()] = Path("base.onnx")
    _GuidedEstimator.made = []
    monkeypatch.setattr(estimate_module, "Estimator", _GuidedEstimator)
    asked = _rule_search(search, passes)
    pruned, search.given = [], []

    def verified_prefix(base, estimator, order):
        search.given.append(("prefix", estimator, order))
        return prefix(search, base, order)

    def prune(estimator, passing, cost):
        search.given.append(("prune", estimator))
        pruned.append((passing, [cost(n) for n in work]))

    search._verified_prefix, search._prune = verified_prefix, prune
    search._guided(Recipe(), list(work), widen)
    return search, asked, pruned


def test_guided_orders_verifies_prunes_then_widens_all_float_nodes(tmp_path, monkeypatch):
    search, asked, pruned = _guided(tmp_path, monkeypatch, lambda r: True)
    (estimator,) = _GuidedEstimator.made
    assert estimator.args == (
        FP32, Path("base.onnx"), TEST, COSINE, search.options, 4, search._note, search._measured_margin,
    )  # fmt: skip
    assert estimator.exited
    assert search.given == [("prefix", estimator, ["d", "c", "b", "a"]), ("prune", estimator)]
    assert estimator.ordered == (["a", "b", "c", "d"], [8.0, 4.0, 2.0, 1.0], None)
    assert pruned == [(search.steps[0], [8.0, 4.0, 2.0, 1.0])]
    assert [(sorted(r.float), sorted(r.int16), p, c) for r, p, c in asked] == [
        (["a", "b", "c", "d"], [], "nodes", "float: all"),
        ([], ["a", "b", "c", "d"], "widen", "float -> int16: a,b,c (+1 more)"),  # passes: done
    ]


def test_guided_widens_the_costliest_half_after_a_miss(tmp_path, monkeypatch):
    _, asked, _ = _guided(tmp_path, monkeypatch, lambda r: len(r.float) >= 2)
    assert [(sorted(r.float), sorted(r.int16), c) for r, _, c in asked[1:]] == [
        ([], ["a", "b", "c", "d"], "float -> int16: a,b,c (+1 more)"),
        (["c", "d"], ["a", "b"], "float -> int16: a,b"),
    ]
    _, asked, _ = _guided(tmp_path, monkeypatch, lambda r: True, widen=False)
    assert len(asked) == 1


def test_guided_widens_the_costliest_float_nodes_first(tmp_path, monkeypatch):
    work = {"a": 1.0, "b": 2.0, "c": 4.0, "d": 8.0}
    _, asked, _ = _guided(tmp_path, monkeypatch, lambda r: len(r.float) >= 2, work=work)
    assert [(sorted(r.float), sorted(r.int16), c) for r, _, c in asked[1:]] == [
        ([], ["a", "b", "c", "d"], "float -> int16: d,c,b (+1 more)"),
        (["a", "b"], ["c", "d"], "float -> int16: d,c"),
    ]


def test_guided_widens_from_the_best_keeping_its_16_bit_nodes(tmp_path, monkeypatch):
    def prefix(search, base, order):
        return search.measure(base.with_nodes({"a": "float", "b": "float", "c": "int16"}), "nodes", "x")

    _, asked, _ = _guided(tmp_path, monkeypatch, lambda r: len(r.float) >= 1, prefix=prefix)
    assert [(sorted(r.float), sorted(r.int16), c) for r, _, c in asked[1:]] == [
        ([], ["a", "b", "c"], "float -> int16: a,b"),
        (["b"], ["a", "c"], "float -> int16: a"),
    ]


def test_guided_widens_one_float_node_once(tmp_path, monkeypatch):
    def prefix(search, base, order):
        return search.measure(base.with_nodes({"b": "float"}), "nodes", "x")

    _, asked, _ = _guided(tmp_path, monkeypatch, lambda r: not r.int16, prefix=prefix)
    assert [(sorted(r.float), sorted(r.int16), c) for r, _, c in asked[1:]] == [([], ["b"], "float -> int16: b")]


def test_guided_stops_without_a_verified_prefix_or_a_float_node(tmp_path, monkeypatch):
    _, asked, pruned = _guided(tmp_path, monkeypatch, lambda r: False)
    assert len(asked) == 1 and pruned == []  # no pass: no pruning, no widening
    assert _GuidedEstimator.made[0].exited
    _, asked, pruned = _guided(tmp_path, monkeypatch, lambda r: True, prefix=lambda search, base, order: None)
    assert asked == [] and pruned == []

    def sixteen(search, base, order):
        return search.measure(base.with_nodes({"a": "int16"}), "nodes", "x")

    _, asked, pruned = _guided(tmp_path, monkeypatch, lambda r: True, prefix=sixteen)
    assert len(asked) == 1 and len(pruned) == 1  # a pass with no float node: nothing to widen


def test_guided_widens_only_with_room_for_two_experiments(tmp_path, monkeypatch):
    # each verified experiment takes 1 s of the clock: widening needs twice that left
    _, asked, _ = _guided(tmp_path, monkeypatch, lambda r: len(r.float) >= 2, budget=Budget(3.5))
    assert [p for _, p, _ in asked] == ["nodes", "widen"]  # 1 + 2 * 1 < 3.5; then 2 + 2 is not
    _, asked, _ = _guided(tmp_path, monkeypatch, lambda r: True, budget=Budget(3.0))
    assert [p for _, p, _ in asked] == ["nodes"]  # 1 + 2 * 1 is not less than 3
    _, asked, _ = _guided(tmp_path, monkeypatch, lambda r: len(r.float) >= 2, budget=Budget(4.5))
    assert [p for _, p, _ in asked] == ["nodes", "widen", "widen"]
    assert _GuidedEstimator.made[0].ordered[2] == 4.5  # the ranking's time left: nothing measured yet


# -- search_recipe's checks ----------------------------------------------------------------------------------------


@needs_cache
def test_search_recipe_refuses_a_quantized_model(tmp_path):
    with pytest.raises(InputError, match=r"a qdq model is already quantized; the recipe search needs the fp32 model"):
        search_recipe(QDQ, CALIB, TEST, ["cosine>=0.99"], workdir=tmp_path)


@needs_cache
def test_search_recipe_refuses_a_bad_starting_recipe(tmp_path):
    with pytest.raises(InputError, match="unknown calibration method 'best'"):
        search_recipe(FP32, CALIB, TEST, ["cosine>=0.99"], start=Recipe(method="best"), workdir=tmp_path)
    with pytest.raises(
        InputError,
        match=r"starting recipe activation_type=int8 weight_type=uint8: onnxruntime's quantize_static refuses",
    ):
        search_recipe(FP32, CALIB, TEST, ["cosine>=0.99"], start=Recipe(activation_type="int8", weight_type="uint8"))
    assert os.listdir(tmp_path) == []


@needs_cache
def test_search_recipe_refuses_bad_checks_and_tasks(tmp_path):
    with pytest.raises(InputError):
        search_recipe(FP32, CALIB, TEST, ["cosine>>1"], workdir=tmp_path)
    with pytest.raises(InputError, match="nosuchmetric"):
        search_recipe(FP32, CALIB, TEST, ["cosine>=0.99"], tasks=["nosuchmetric"], workdir=tmp_path)


class _Run:
    """``RecipeSearch`` as search_recipe makes it: its arguments kept, ``run`` a stand-in."""

    made: ClassVar[list] = []

    def __init__(self, *args) -> None:
        self.args = args
        _Run.made.append(self)

    def run(self):
        workdir = Path(self.args[5])
        assert workdir.is_dir()
        (workdir / "best.onnx").write_bytes(b"model")
        return _result(model=str(workdir / "best.onnx"))


@needs_cache
def test_search_recipe_fills_in_the_defaults_and_cleans_up(tmp_path, monkeypatch):
    monkeypatch.setattr(search_module, "RecipeSearch", _Run)
    _Run.made = []
    result = search_recipe(FP32, CALIB, TEST, ["cosine>=0.99"], weights={"int16": 0.5})
    (run,) = _Run.made
    fp32, calibration, evaluation, checks, targets, workdir, start, budget, weights, methods, options = run.args[:11]
    assert (fp32, calibration, evaluation, targets) == (FP32, CALIB, TEST, (HOST,))
    assert [str(c) for c in checks] == ["cosine >= 0.99"]
    assert start == Recipe() and budget == Budget() and weights == {"int16": 0.5, "float": 1.0}
    assert methods == search_module.default_methods() and options == RuntimeOptions()
    assert run.args[11:] == (4, 16, None, None, search_module.VARY, (), None)
    assert Path(workdir).name.startswith("qaccuracy-recipe-") and not Path(workdir).exists()  # removed
    assert result.model == str(Path(workdir) / "best.onnx")


@needs_cache
def test_search_recipe_passes_its_arguments_and_writes_the_model_out(tmp_path, monkeypatch):
    monkeypatch.setattr(search_module, "RecipeSearch", _Run)
    _Run.made = []
    out = tmp_path / "out.onnx"
    work = tmp_path / "work"
    work.mkdir()
    steps, notes = (lambda s, b: None), (lambda t: None)
    result = search_recipe(
        FP32, CALIB, TEST, parse_checks(["mse<=1"]), ["onnxruntime", "x"], work, Recipe(per_channel=True),
        Budget(5.0), {"float": 2.0}, ["kl"], RuntimeOptions(batch_size=2), 3, 5, steps, notes, out, ("method",),
        task_targets=[1, 2],
    )  # fmt: skip
    (run,) = _Run.made
    assert run.args[4] == ["onnxruntime", "x"] and run.args[5] == work and run.args[6] == Recipe(per_channel=True)
    assert run.args[7] == Budget(5.0) and run.args[8] == {"int16": 1.0, "float": 2.0} and run.args[9] == ["kl"]
    assert run.args[10] == RuntimeOptions(batch_size=2)
    assert run.args[11:] == (3, 5, steps, notes, ("method",), (), [1, 2])
    assert out.read_bytes() == b"model" and result.model == str(out)
    assert (work / "best.onnx").exists()  # the caller's folder is kept


@needs_cache
def test_search_recipe_reads_a_task_targets_sidecar(tmp_path, monkeypatch):
    monkeypatch.setattr(search_module, "RecipeSearch", _Run)
    from pytest_qaccuracy.data import load_dataset

    with load_dataset(TEST) as data:
        count = len(data)
    sidecar = tmp_path / "targets.jsonl"
    sidecar.write_text("".join(f'{{"record": {i}, "target": {i}}}\n' for i in range(count)))
    _Run.made = []
    search_recipe(FP32, CALIB, TEST, ["cosine>=0.99"], workdir=tmp_path, task_targets=str(sidecar))
    assert list(_Run.made[0].args[-1]) == list(range(count))
    with load_dataset(TEST) as data:
        _Run.made = []
        search_recipe(FP32, CALIB, data, ["cosine>=0.99"], workdir=tmp_path, task_targets=sidecar)
        assert list(_Run.made[0].args[-1]) == list(range(count))
    sidecar.write_text('{"record": 0, "target": 1}\n')
    with pytest.raises(QAccuracyError, match="record"):
        search_recipe(FP32, CALIB, TEST, ["cosine>=0.99"], workdir=tmp_path, task_targets=sidecar)


# -- the global phase on stand-ins --------------------------------------------------------------------------------


class _Ranges:
    def __init__(self, ranges) -> None:
        self.ranges = ranges


class _GlobalBuilder(_Builder):
    """The writer's stand-in for the global phase: ``histograms`` maps a method to the histogram kind
    it needs (its pass takes ``expected`` seconds of the clock); a method's estimated ranges are
    ``ranges[method]`` (``{"x": (0, 1)}`` by default); ``calibrators`` maps a method to its
    calibrator's seconds."""

    def __init__(self, clock, histograms=None, expected=0.0, ranges=None, calibrators=None) -> None:
        super().__init__(clock, calibrators=calibrators)
        self.histograms, self.expected, self.method_ranges = histograms or {}, expected, ranges or {}
        self.asked_ranges: list[Recipe] = []

    def needs(self, recipe):
        kind = self.histograms.get(recipe.method)
        return None if kind in self.folded else kind

    def expected_seconds(self, recipe):
        return self.expected if self.needs(recipe) is not None else 0.0

    def estimated_ranges(self, recipe):
        self.asked_ranges.append(recipe)
        kind = self.needs(recipe)
        if kind is not None:
            self.clock.now += self.expected
            self.folded.append(kind)
        return dict(self.method_ranges.get(recipe.method, {"x": (0.0, 1.0)}))

    def ranges(self, recipe):
        return _Ranges({"start": (recipe.method, recipe.activation_type)})


_REAL_LOAD = onnx.load


def _load(path, *args, **kwargs):
    """onnx.load's stand-in: a real model as onnx reads it, a recipe's text as that text."""
    if _is_onnx(path):
        return _REAL_LOAD(path, *args, **kwargs)
    return f"loaded {Path(path).name}: {Path(path).read_text()}"


class _Edits:
    """GlobalEdits' stand-in: an edited model is the recipe's text; every one made is recorded."""

    made: ClassVar[list] = []

    def __init__(self, model, base, fp32, ranges) -> None:
        self.args = (model, base, fp32, ranges)
        self.asked: list[tuple[Recipe, dict]] = []
        _Edits.made.append(self)

    def model(self, recipe, ranges):
        self.asked.append((recipe, ranges))
        return repr(recipe)


def _global(tmp_path, monkeypatch, margin, methods=("minmax",), budget=None, builder=None, **kwargs):
    """A search whose verified and estimated margins are ``margin(recipe, estimated)``; models are the
    recipes' text (onnx.load and onnx.save stand-ins read and write it)."""
    from pytest_qaccuracy.analysis.recipe import edit as edit_module

    search = _search(tmp_path, monkeypatch, budget=budget, methods=methods, **kwargs)
    fp32 = search.builder.model
    search.builder = builder or _GlobalBuilder(search.clock)
    search.builder.clock, search.builder.model = search.clock, fp32
    _Edits.made = []
    monkeypatch.setattr(edit_module, "GlobalEdits", _Edits)
    monkeypatch.setattr(onnx, "load", lambda path, *a, **k: _load(path, *a, **k))
    monkeypatch.setattr(onnx, "save", lambda model, path, *a, **k: Path(path).write_text(model))
    recipes: dict[str, Recipe] = {}
    real_write = search.builder.write

    def write(recipe, out):
        recipes[repr(recipe)] = recipe
        return real_write(recipe, out)

    search.builder.write = write
    real_model = _Edits.model

    def edited(self, recipe, ranges):
        recipes[repr(recipe)] = recipe
        return real_model(self, recipe, ranges)

    monkeypatch.setattr(_Edits, "model", edited)
    search.evaluator = _Evaluator(search.clock, lambda text: margin(recipes[text], None), pace=1.0)
    real_measure = search.evaluator.measure

    def measure(path, targets=None):
        search.evaluator.margins = lambda text: margin(recipes[text], targets is not None)
        return real_measure(path, targets)

    search.evaluator.measure = measure
    return search


def _margins(table, default=-1.0, verified=None):
    """A margin per recipe: ``table`` by the recipe's changes from the default one (estimates),
    ``verified`` for experiments (the estimate's when not listed)."""

    def margin(recipe, estimated):
        key = recipe.changes_from(Recipe())
        if not estimated and verified is not None and key in verified:
            return verified[key]
        return table.get(key, default)

    return margin


def _rows(search):
    return [(s.change, s.margin, s.estimated) for s in search.steps]


def test_global_phase_returns_the_start_when_it_passes_fails_or_varies_nothing(tmp_path, monkeypatch):
    search = _global(tmp_path, monkeypatch, _margins({"(same)": 0.5}))
    assert search._global_phase() == Recipe()
    assert _rows(search) == [("starting recipe", 0.5, False)] and _Edits.made == []
    search = _global(tmp_path, monkeypatch, _margins({"(same)": -0.5}), vary=("node_weights",))
    assert search._global_phase() == Recipe() and len(search.steps) == 1 and _Edits.made == []
    search = _global(tmp_path, monkeypatch, _margins({}))
    search.builder.failures[Recipe()] = QAccuracyError("no")
    assert search._global_phase() == Recipe() and search.steps[0].skipped == "no" and _Edits.made == []


def test_global_phase_descends_one_choice_at_a_time(tmp_path, monkeypatch):
    """From the start (-0.5): per_channel=True improves (-0.3); from there reduce_range misses,
    int8 activations improve (-0.2); uint8 weights are refused with them; a second pass tries
    the values seen before (per tensor, reduce_range) from the best; nothing improves: the best
    estimated recipe's edited model is the node phase's base."""
    table = {
        "(same)": -0.5,
        "per_channel=True": -0.3,
        "per_channel=True, activation_type=int8": -0.2,
        "activation_type=int8": -0.25,
    }
    search = _global(tmp_path, monkeypatch, _margins(table))
    base = search._global_phase()
    assert base == Recipe(per_channel=True, activation_type="int8")
    refused = "onnxruntime's quantize_static refuses int8 activations with uint8 weights"
    assert [(s.change, s.margin, s.skipped) for s in search.steps] == [
        ("starting recipe", -0.5, None),
        ("per_channel=True", -0.3, None),
        ("reduce_range=True", -1.0, None),
        ("activation_type=int8", -0.2, None),
        ("weight_type=uint8", None, refused),
        ("per_channel=False", -0.25, None),
        ("reduce_range=True", -1.0, None),
    ]
    assert [s.estimated for s in search.steps] == [False] + [True] * 6
    (edits,) = _Edits.made
    assert edits.args == (
        "loaded step0.onnx: " + repr(Recipe()),
        Recipe(),
        search.builder.model,
        {"start": ("minmax", "uint8")},
    )
    assert search.base_models == {base: tmp_path / "global.onnx"}
    assert (tmp_path / "global.onnx").read_text() == repr(base)
    # the start's own model is its row: on the host alone, estimated
    start_row = search.global_rows[(Recipe(), (("x", (0.0, 1.0)),))]
    assert start_row.estimated and start_row.measured == {HOST: {"y": {"cosine": 0.25}}} and start_row.margin == -0.5
    assert start_row.index == 0 and not start_row.passed


def test_global_phase_verifies_a_recipe_estimated_to_pass(tmp_path, monkeypatch):
    table = {"(same)": -0.5, "per_channel=True": 0.1}
    search = _global(tmp_path, monkeypatch, _margins(table))
    assert search._global_phase() == Recipe(per_channel=True)
    assert _rows(search) == [
        ("starting recipe", -0.5, False),
        ("per_channel=True", 0.1, True),
        ("per_channel=True", 0.1, False),
    ]
    assert search.steps[-1].phase == "global" and search.base_models == {}
    # verified worse than the start: the start
    search = _global(tmp_path, monkeypatch, _margins(table, verified={"per_channel=True": -0.6}))
    assert search._global_phase() == Recipe() and search.base_models == {}
    # verified to miss, but better than the start: the node phase's base, on its edited model
    search = _global(tmp_path, monkeypatch, _margins(table, verified={"per_channel=True": -0.4}))
    assert search._global_phase() == Recipe(per_channel=True)
    assert search.base_models == {Recipe(per_channel=True): tmp_path / "global.onnx"}
    # its experiment refused: the start
    search = _global(tmp_path, monkeypatch, _margins(table))
    search.builder.failures[Recipe(per_channel=True)] = QAccuracyError("refused")
    assert search._global_phase() == Recipe() and search.base_models == {}


def test_global_phase_without_the_host_estimates_the_start(tmp_path, monkeypatch):
    search = _global(tmp_path, monkeypatch, _margins({"(same)": -0.5, "per_channel=True": -0.4}))
    search.targets = ["other"]
    real = search.evaluator.measure
    search.evaluator.measure = lambda path, targets=None: (
        real(path, targets) if targets else replace(real(path, ("other",)), measured={"other": {"y": {"cosine": 0.0}}})
    )
    search._global_phase()
    assert _rows(search)[:3] == [
        ("starting recipe", -0.5, False),  # measured on the other target alone
        ("starting recipe", -0.5, True),  # estimated on the host
        ("per_channel=True", -0.4, True),
    ]


def test_global_phase_histogram_methods_after_the_descent(tmp_path, monkeypatch):
    """mse needs a histogram pass (4 s): tried after the cheap moves; it improves, so the cheap
    moves are tried again from it (per_channel=True) and kept."""
    table = {"(same)": -0.5, "method=mse": -0.2, "method=mse, per_channel=True": -0.1}
    search = _global(tmp_path, monkeypatch, _margins(table), methods=("minmax", "mse"), vary=("method", "per_channel"))
    search.builder.histograms, search.builder.expected = {"mse": "mse"}, 4.0
    search.builder.method_ranges = {"mse": {"x": (0.0, 0.5)}}
    base = search._global_phase()
    assert base == Recipe(method="mse", per_channel=True)
    assert _rows(search) == [
        ("starting recipe", -0.5, False),
        ("per_channel=True", -1.0, True),
        ("method=mse", -0.2, True),
        ("per_channel=True", -0.1, True),
    ]
    assert search.statistics_seconds == 4.0 and search.extended is True
    assert search.notes == [
        "global phase: the mse histograms for method=mse (expected 4.0s)",
        "global phase: the mse histograms took 4.0s",
    ]


def test_global_phase_stops_when_the_histograms_would_not_fit(tmp_path, monkeypatch):
    search = _global(
        tmp_path, monkeypatch, _margins({"(same)": -0.5}), methods=("minmax", "mse"), budget=Budget(100.0),
        vary=("method",),
    )  # fmt: skip
    search.builder.histograms, search.builder.expected = {"mse": "mse"}, 60.0  # past 50 % of the budget
    assert search._global_phase() == Recipe()
    assert len(search.steps) == 1
    assert search.notes == [
        "global phase: method=mse not estimated: its histograms (expected 60.0s) would not end within the "
        "phase's share of the budget"
    ]


def test_descend_stops_when_the_share_is_spent_but_skips_a_calibrator_that_does_not_fit(tmp_path, monkeypatch):
    search = _global(tmp_path, monkeypatch, _margins({}), methods=("minmax", "ort-minmax"), budget=Budget(100.0))
    search.builder.calibrators = {"ort-minmax": 40.0}  # 40 s of its calibrator: past 30 %
    search.clock.now = 10.0
    tried, values = {Recipe()}, {(d, getattr(Recipe(), d)) for d in search_module.GLOBAL_CHOICES}
    assert search._descend(_Edits("m", Recipe(), None, {}), Recipe(), -0.5, tried, values) == (Recipe(), -0.5)
    # every cheap move estimated once (-1: none improves), the calibrator's skipped; the revisit adds nothing new
    assert [(s.change, s.margin, s.skipped) for s in search.steps] == [
        ("per_channel=True", -1.0, None),
        ("reduce_range=True", -1.0, None),
        ("activation_type=int8", -1.0, None),
        ("weight_type=uint8", -1.0, None),
    ]
    search.clock.now = 30.0  # the share spent
    search.steps.clear()
    assert search._descend(_Edits("m", Recipe(), None, {}), Recipe(), -0.5, {Recipe()}, set()) == (Recipe(), -0.5)
    assert search.steps == [] and search.notes[-1] == "global phase: its share of the budget is spent"


def test_descend_skips_moves_not_varied_and_histogram_methods(tmp_path, monkeypatch):
    search = _global(tmp_path, monkeypatch, _margins({}), methods=("minmax", "mse"), vary=("reduce_range", "method"))
    search.builder.histograms = {"mse": "mse"}
    values = {(d, getattr(Recipe(), d)) for d in search_module.GLOBAL_CHOICES}
    search._descend(_Edits("m", Recipe(), None, {}), Recipe(), -0.5, {Recipe()}, values)
    assert [s.change for s in search.steps] == ["reduce_range=True"]
    assert search._descend(_Edits("m", Recipe(), None, {}), Recipe(), 0.0, {Recipe()}, set()) == (
        Recipe(),
        0.0,
    )  # met: nothing to do


def test_descend_a_better_method_extends_the_share(tmp_path, monkeypatch):
    search = _global(tmp_path, monkeypatch, _margins({"method=mse": -0.3}), methods=("minmax", "mse"), vary=("method",))
    search.builder.method_ranges = {"mse": {"x": (0.0, 0.5)}}
    assert method_rank("mse") > method_rank("minmax")
    assert search._descend(_Edits("m", Recipe(), None, {}), Recipe(), -0.5, {Recipe()}, set()) == (
        Recipe(method="mse"),
        -0.3,
    )
    assert search.extended is True
    search = _global(
        tmp_path, monkeypatch, _margins({"method=percentile": -0.3}), methods=("minmax", "percentile"),
        vary=("method",),
    )  # fmt: skip
    search.builder.method_ranges = {"percentile": {"x": (0.0, 0.5)}}
    assert search._descend(_Edits("m", Recipe(), None, {}), Recipe(), -0.5, {Recipe()}, set()) == (
        Recipe(method="percentile"),
        -0.3,
    )
    assert search.extended is False  # of the same pass: no new ranges


def test_statistics_of_a_recipe_that_needs_none(tmp_path, monkeypatch):
    search = _global(tmp_path, monkeypatch, _margins({}))
    search._statistics(Recipe())
    assert search.notes == [] and search.statistics_seconds == 0.0 and search.builder.asked_ranges == []
    search.builder.histograms, search.builder.expected = {"kl": "kl"}, 2.5
    search.statistics_seconds = 1.0
    search._statistics(Recipe(method="kl"))
    assert search.statistics_seconds == 3.5
    assert search.notes == [
        "global phase: the kl histograms for method=kl (expected 2.5s)",
        "global phase: the kl histograms took 2.5s",
    ]


def _fits(tmp_path, monkeypatch, now, expected=0.0, statistics=0.0, extended=False, folded=(), calibrator=0.0):
    search = _global(tmp_path, monkeypatch, _margins({}), budget=Budget(100.0))
    search.builder.histograms, search.builder.expected = {"mse": "mse", "kl": "kl"}, expected
    search.builder.folded = list(folded)
    search.builder.calibrators = {"ort-minmax": calibrator}
    search.clock.now, search.statistics_seconds, search.extended = now, statistics, extended
    return search


@pytest.mark.parametrize(
    ("now", "recipe", "fields", "fits"),
    [
        (29.9, Recipe(), {}, True),  # within 30 %
        (30.0, Recipe(), {}, False),
        (37.9, Recipe(), {"statistics": 8.0}, True),  # 30 % plus the histogram passes' 8 s
        (38.0, Recipe(), {"statistics": 8.0}, False),
        (49.9, Recipe(), {"extended": True}, True),  # a histogram method improved: 50 %
        (50.0, Recipe(), {"extended": True}, False),
        (39.9, Recipe(method="mse"), {"expected": 10.0}, True),  # the first histogram method: 50 %
        (40.0, Recipe(method="mse"), {"expected": 10.0}, False),
        (19.9, Recipe(method="mse"), {"expected": 10.0, "folded": ("kl",)}, True),  # not the first: 30 %
        (20.0, Recipe(method="mse"), {"expected": 10.0, "folded": ("kl",)}, False),
        (23.9, Recipe(method="ort-minmax"), {"calibrator": 6.0}, True),  # its calibrator's run counts
        (24.0, Recipe(method="ort-minmax"), {"calibrator": 6.0}, False),
        (59.9, Recipe(), {"statistics": 10.0, "extended": True}, False),  # the larger: 40 % < 50 %
        (45.0, Recipe(), {"statistics": 30.0, "extended": True}, True),  # 60 % > 50 %
    ],
)
def test_global_fits(tmp_path, monkeypatch, now, recipe, fields, fits):
    assert _fits(tmp_path, monkeypatch, now, **fields)._global_fits(recipe) is fits


def test_global_fits_unbounded(tmp_path, monkeypatch):
    search = _global(tmp_path, monkeypatch, _margins({}))
    search.clock.now = 1e12
    assert search._global_fits(Recipe(method="mse")) is True


def test_row_key_is_the_choices_but_the_method_and_its_ranges(tmp_path, monkeypatch):
    search = _global(tmp_path, monkeypatch, _margins({}), start=Recipe(method="percentile"))
    search.builder.histograms = {"mse": "mse"}
    search.builder.method_ranges = {
        "minmax": {"b": (1.0, 2.0), "a": (0.0, 1.0)},
        "ort-minmax": {"a": (0.0, 1.0), "b": (1.0, 2.0)},
    }
    pc = Recipe(method="minmax", per_channel=True)
    key = search._row_key(pc)
    assert key == (Recipe(method="percentile", per_channel=True), (("a", (0.0, 1.0)), ("b", (1.0, 2.0))))
    assert search._row_key(Recipe(method="ort-minmax", per_channel=True)) == key  # equal ranges: one row
    assert search._row_key(Recipe(method="mse")) == (Recipe(method="mse"), None)  # its ranges not computed yet
    asked = len(search.builder.asked_ranges)
    search._row_key(Recipe(method="minmax", reduce_range=True))
    assert len(search.builder.asked_ranges) == asked  # the fingerprint is kept per method and activation type
    search._row_key(Recipe(method="minmax", activation_type="int8"))
    assert len(search.builder.asked_ranges) == asked + 1
    assert set(search.fingerprints) == {("minmax", "uint8"), ("ort-minmax", "uint8"), ("minmax", "int8")}


def test_estimate_global_reuses_the_row_of_equal_ranges(tmp_path, monkeypatch):
    search = _global(tmp_path, monkeypatch, _margins({"per_channel=True": -0.25}))
    edits = _Edits("m", Recipe(), "f", {})
    first = search._estimate_global(edits, Recipe(per_channel=True), "per_channel=True")
    assert first.margin == -0.25 and first.estimated and edits.asked == [(Recipe(per_channel=True), {"x": (0.0, 1.0)})]
    assert first.phase == "global" and first.change == "per_channel=True"
    search.best = _step(passed=True)
    again = search._estimate_global(edits, Recipe(method="ort-minmax", per_channel=True), "method=ort-minmax")
    assert again == replace(
        first, index=1, phase="global", change="method=ort-minmax (estimated as step 0)",
        recipe=Recipe(method="ort-minmax", per_channel=True), seconds=0.0,
    )  # fmt: skip
    assert search.steps == [first, again] and search.estimates[again.recipe] is again
    assert search.calls[-1] == (again, search.best) and len(edits.asked) == 1
    assert search._estimate_global(edits, Recipe(method="ort-minmax", per_channel=True), "x") is again
    assert len(search.steps) == 2
    # an estimated recipe's row stays the first one of its key
    key = search._row_key(Recipe(per_channel=True))
    assert search.global_rows[key] is first


# -- the per-node weight moves ------------------------------------------------------------------------------------


def _weights(tmp_path, monkeypatch, table, verified=None, **kwargs):
    search = _global(tmp_path, monkeypatch, _margins(table, verified=verified), **kwargs)
    search.measure(Recipe(), "start", "starting recipe")
    return search


@old_ort_refuses_moves
def test_weight_phase_keeps_each_move_that_improves_then_verifies_them_together(tmp_path, monkeypatch):
    table = {
        "(same)": -0.5,
        "per-channel weight +conv2": -0.4,
        "per-channel weight +conv2, 7-bit weight +conv1": -0.3,
        "per-channel weight +conv2, uint8 weight +fc": -0.45,
    }
    search = _weights(tmp_path, monkeypatch, table)
    base = search._weight_phase(Recipe(), ["conv1", "fc", "conv2", "relu1"])
    assert base == Recipe(flipped=frozenset({"conv2"}), narrowed=frozenset({"conv1"}))
    # the costliest first: conv2 (18432), conv1 (4608), fc (640); relu1 has no weight
    assert [(s.change, s.margin, s.estimated) for s in search.steps[1:]] == [
        ("base (weights as the global choice)", -0.5, True),
        ("per-channel weight +conv2", -0.4, True),
        ("per-channel weight +conv1", -1.0, True),
        ("per-channel weight +fc", -1.0, True),
        ("7-bit weight +conv2", -1.0, True),
        ("7-bit weight +conv1", -0.3, True),
        ("7-bit weight +fc", -1.0, True),
        ("uint8 weight +conv2", -1.0, True),
        ("uint8 weight +conv1", -1.0, True),
        ("uint8 weight +fc", -1.0, True),
        ("per-channel weight +conv2, 7-bit weight +conv1", -0.3, False),
    ]
    assert search.steps[-1].phase == "weights"
    assert search.notes == [
        "weights: 3 node(s) whose weight may take the other granularity, reduce_range=True or uint8 (cost 0)"
    ]


@pytest.mark.parametrize(
    ("verified", "kept"),
    [
        (-0.3, True),
        (-0.5, False),  # not better than the base's verified margin
        (-0.49, True),
        (None, False),  # skipped
    ],
)
def test_weight_phase_keeps_the_moves_when_verified_better_than_the_base(tmp_path, monkeypatch, verified, kept):
    moved = Recipe(flipped=frozenset({"conv2"}))
    table = {"(same)": -0.5, "per-channel weight +conv2": -0.1}
    search = _weights(tmp_path, monkeypatch, table, verified={"per-channel weight +conv2": verified})
    if verified is None:
        search.builder.failures[moved] = QAccuracyError("refused")
    assert search._weight_phase(Recipe(), ["conv2"]) == (moved if kept else Recipe())
    assert search.steps[-1].recipe == moved and not search.steps[-1].estimated


def test_weight_phase_a_verified_pass_is_kept_and_an_unverified_base_uses_its_estimate(tmp_path, monkeypatch):
    search = _weights(tmp_path, monkeypatch, {"(same)": -0.5, "per-channel weight +conv2": 0.2})
    assert search._weight_phase(Recipe(), ["conv2"]) == Recipe(flipped=frozenset({"conv2"}))
    # a base never verified (the global phase's estimate): compared with its estimate, -0.5 here
    table = {"(same)": -0.5, "per_channel=True": -0.5, "per_channel=True, per-tensor weight +conv2": -0.45}
    search = _weights(tmp_path, monkeypatch, table, verified={"per_channel=True, per-tensor weight +conv2": -0.48})
    pc = Recipe(per_channel=True)
    assert search._weight_phase(pc, ["conv2"]) == replace(pc, flipped=frozenset({"conv2"}))
    search = _weights(tmp_path, monkeypatch, table, verified={"per_channel=True, per-tensor weight +conv2": -0.5})
    assert search._weight_phase(pc, ["conv2"]) == pc


@old_ort_refuses_moves
def test_weight_phase_does_nothing_without_weights_or_a_start(tmp_path, monkeypatch):
    search = _weights(tmp_path, monkeypatch, {"(same)": -0.5}, vary=("per_channel",))
    assert search._weight_phase(Recipe(), ["conv2"]) == Recipe() and len(search.steps) == 1
    search = _weights(tmp_path, monkeypatch, {"(same)": -0.5})
    assert search._weight_phase(Recipe(), ["relu1", "pool1"]) == Recipe() and len(search.steps) == 1
    search = _global(tmp_path, monkeypatch, _margins({}))
    assert search._weight_phase(Recipe(), ["conv2"]) == Recipe() and search.steps == []  # no start measured
    search = _global(tmp_path, monkeypatch, _margins({}))
    search.builder.failures[Recipe()] = QAccuracyError("no")
    search.measure(Recipe(), "start", "s")
    assert search._weight_phase(Recipe(), ["conv2"]) == Recipe() and len(search.steps) == 1
    # the base's own estimate skipped: nothing to compare with
    search = _weights(tmp_path, monkeypatch, {"(same)": -0.5})
    search.evaluator.measure = lambda path, targets=None: (_ for _ in ()).throw(ValueError("x"))
    assert search._weight_phase(Recipe(), ["conv2"]) == Recipe() and len(search.steps) == 2
    # no move improves: nothing verified
    search = _weights(tmp_path, monkeypatch, {"(same)": -0.5})
    assert search._weight_phase(Recipe(), ["conv2"]) == Recipe()
    assert [s.estimated for s in search.steps] == [False, True, True, True, True]


@old_ort_refuses_moves
def test_weight_phase_flips_only_the_costliest_and_per_channel_needs_its_opset(tmp_path, monkeypatch):
    monkeypatch.setattr(search_module, "FLIP_NODES", 2)
    search = _weights(tmp_path, monkeypatch, {"(same)": -0.5})
    search._weight_phase(Recipe(), ["fc", "conv1", "conv2"])
    assert [s.change for s in search.steps[2:4]] == ["per-channel weight +conv2", "per-channel weight +conv1"]
    assert len(search.steps) == 2 + 3 * 2
    search = _weights(tmp_path, monkeypatch, {"(same)": -0.5})
    search.builder.model = onnx.helper.make_model(
        onnx.helper.make_graph([], "g", [], []), opset_imports=[onnx.helper.make_opsetid("", 12)]
    )
    search._weight_phase(Recipe(), ["conv2"])
    assert [s.change for s in search.steps[2:]] == ["7-bit weight +conv2", "uint8 weight +conv2"]  # no flip
    search = _weights(tmp_path, monkeypatch, {"(same)": -0.5, "per_channel=True": -0.5})
    search.builder.model = onnx.helper.make_model(
        onnx.helper.make_graph([], "g", [], []), opset_imports=[onnx.helper.make_opsetid("", 12)]
    )
    search._weight_phase(Recipe(per_channel=True), ["conv2"])
    assert search.steps[2].change == "per-tensor weight +conv2"  # per channel already: the flip is per tensor


@old_ort_refuses_moves
def test_weight_phase_skips_a_kind_onnxruntime_refuses(tmp_path, monkeypatch):
    start = Recipe(activation_type="int8", weight_type="int8")
    search = _weights(tmp_path, monkeypatch, {}, start=start)
    search.measure(start, "start", "s")
    search._weight_phase(start, ["conv2"])
    assert [s.change for s in search.steps[3:]] == ["per-channel weight +conv2", "7-bit weight +conv2"]
    assert search.notes[-1] == (
        "weights: no retyped weights: onnxruntime's quantize_static refuses int8 activations with uint8 weights"
    )


@pytest.mark.parametrize(("share", "flips"), [(0.025, 2), (0.03, 3)])
def test_weight_phase_within_its_share(tmp_path, monkeypatch, share, flips):
    """The share counts from after the base's estimate; each estimate takes 1 s: with 2.5 s, the
    third flip (from 2 s on, 1 s long) would end past it; with 3 s it ends on it. Then no other kind."""
    search = _weights(tmp_path, monkeypatch, {"(same)": -0.5}, budget=Budget(100.0))
    monkeypatch.setattr(search_module, "WEIGHTS_SHARE", share)
    search._weight_phase(Recipe(), ["fc", "conv1", "conv2"])
    assert [s.change for s in search.steps[1:]] == [
        "base (weights as the global choice)",
        *[f"per-channel weight +{n}" for n in ("conv2", "conv1", "fc")[:flips]],
    ]


@old_ort_refuses_moves
def test_weight_phase_within_the_estimates_left(tmp_path, monkeypatch):
    """10 s in all, the start's experiment 2 s: estimates may use 10 - now - 2.5; each takes 1 s."""
    search = _weights(tmp_path, monkeypatch, {"(same)": -0.5}, budget=Budget(10.0))
    monkeypatch.setattr(search_module, "WEIGHTS_SHARE", 1.0)
    search._weight_phase(Recipe(), ["fc", "conv1", "conv2"])
    # after the base's estimate now is 3: 4.5 left > 1; 3.5 > 1; 2.5 > 1; 1.5 > 1; then 0.5: stop
    assert len(search.steps) == 1 + 1 + 4
    assert [s.change for s in search.steps[2:]] == [
        "per-channel weight +conv2",
        "per-channel weight +conv1",
        "per-channel weight +fc",
        "7-bit weight +conv2",
    ]


def test_edits_are_made_once_from_the_starts_model(tmp_path, monkeypatch):
    search = _global(tmp_path, monkeypatch, _margins({}))
    search.measure(Recipe(), "start", "s")
    edits = search._edits()
    assert edits.args == (
        "loaded step0.onnx: " + repr(Recipe()),
        Recipe(),
        search.builder.model,
        {"start": ("minmax", "uint8")},
    )
    assert search._edits() is edits and len(_Edits.made) == 1
    search.edits = "kept"
    assert search._edits() == "kept"


# -- run ----------------------------------------------------------------------------------------------------------


class _FakeEvaluator:
    made: ClassVar[list] = []

    def __init__(self, *args) -> None:
        self.args, self.records = args, 11
        _FakeEvaluator.made.append(args)


def _run(tmp_path, monkeypatch, global_phase, node_phase=None, **kwargs):
    search = _global(tmp_path, monkeypatch, _margins({}), **kwargs)
    search.evaluator = None
    _FakeEvaluator.made = []
    monkeypatch.setattr(search_module, "Evaluator", _FakeEvaluator)
    phases = []
    search._global_phase = lambda: phases.append("global") or global_phase(search)
    search._node_phase = lambda base: phases.append(("nodes", base)) or (node_phase and node_phase(search))
    search.builder.reads = {"conv1": ["x", "conv1"]}
    search.builder.convert_opset = lambda recipe: 13 if recipe.per_channel else None
    search.phases = phases
    return search


def _best(search, recipe, passed, cost=0.0):
    search.steps.append(Step(len(search.steps), "g", "c", recipe, cost, {}, passed, 0.5 if passed else -0.5, 1.0))
    search.best = search.steps[-1]
    return recipe


def test_run_returns_the_best_step_and_its_arguments(tmp_path, monkeypatch):
    search = _run(tmp_path, monkeypatch, lambda s: _best(s, Recipe(per_channel=True), False))
    search.clock.now = 2.0
    search.started = 0.5
    result = search.run()
    assert search.phases == ["global", ("nodes", Recipe(per_channel=True))]
    assert _FakeEvaluator.made == [(FP32, TEST, COSINE, [HOST], search.options, [], None)]
    assert search.notes[0] == "measuring the fp32 model on the evaluation records"
    assert result.fp32 == "digits_cnn.onnx" and result.calibration == "digits_calib.npz"
    assert result.evaluation == "digits_test.npz" and result.records == 11
    assert result.checks == COSINE and result.targets == [HOST] and result.weights == {"int16": 1.0, "float": 1.0}
    assert result.steps == search.steps and result.best == 0 and result.stopped == "done" and result.note == ""
    assert result.seconds == 1.5
    assert result.arguments == Recipe(per_channel=True).arguments(
        {"conv1": ["x", "conv1"]}, None, search.builder.weights
    )
    assert result.model == str(tmp_path / "step0.onnx") and result.ranges == {"start": ("minmax", "uint8")}
    assert result.convert_opset == 13 and result.held_out is True


def test_run_skips_the_node_phase_after_a_free_pass(tmp_path, monkeypatch):
    search = _run(tmp_path, monkeypatch, lambda s: _best(s, Recipe(), True))
    result = search.run()
    assert search.phases == ["global"] and result.met and result.convert_opset is None
    search = _run(tmp_path, monkeypatch, lambda s: _best(s, Recipe(float=frozenset({"fc"})), True, cost=0.1))
    search.run()
    assert search.phases == ["global", ("nodes", Recipe(float=frozenset({"fc"})))]


def test_run_stops_at_the_budget_or_an_interrupt(tmp_path, monkeypatch):
    def out(search):
        _best(search, Recipe(), False)
        raise _OutOfBudget

    result = _run(tmp_path, monkeypatch, out, budget=Budget(None, 3)).run()
    assert (result.stopped, result.note, result.best) == ("budget", "budget reached (3 experiments)", 0)

    def interrupted(search):
        raise KeyboardInterrupt

    result = _run(tmp_path, monkeypatch, interrupted).run()
    assert (result.stopped, result.note, result.best, result.model) == ("interrupted", "interrupted", None, None)
    assert result.arguments is None and result.ranges is None and result.convert_opset is None


def test_run_before_the_evaluator_and_on_the_calibration_records(tmp_path, monkeypatch):
    def refuses(*args):
        raise KeyboardInterrupt

    search = _run(tmp_path, monkeypatch, lambda s: None)
    monkeypatch.setattr(search_module, "Evaluator", refuses)
    result = search.run()
    assert result.records == 0 and result.stopped == "interrupted" and search.phases == []
    search = _run(tmp_path, monkeypatch, lambda s: None)
    search.evaluation = search.calibration
    assert search.run().held_out is False


# -- second round: what the first mutation run left ------------------------------------------------------------


def test_the_budget_counts_from_the_searchs_start(tmp_path, monkeypatch):
    """A search started at 100 s on the clock: its budget counts from there."""
    clock = Clock()
    clock.now = 100.0
    monkeypatch.setattr(search_module, "time", SimpleNamespace(monotonic=clock.monotonic))
    search = RecipeSearch(
        FP32, CALIB, TEST, COSINE, [HOST], tmp_path, Recipe(), Budget(10.0), {}, ("minmax",), RuntimeOptions(), 4,
        16, None, None,
    )  # fmt: skip
    search.steps.append(_step(seconds=2.0))
    clock.now = 107.9
    search._check_budget()  # 7.9 + 2 < 10
    assert search._estimates_left() == pytest.approx(10.0 - 7.9 - 2.5)
    assert search._room_for(1.0) is True and search._room_for(1.1) is False
    clock.now = 108.0
    with pytest.raises(_OutOfBudget):
        search._check_budget()
    # pruning's pace: 10 - 4 s left, less two experiments of 2 s: 2 / 2 / 1 s = one node
    clock.now = 104.0
    search.cost = CostModel(WORK)
    estimator = _Estimator(lambda f: -0.5)
    search._prune_round(estimator, _step(recipe=Recipe(float=frozenset(WORK))), lambda n: WORK[n], set())
    assert estimator.dropped[0][1] == ["a"]


def test_measure_counts_a_calibrators_first_run_in_the_budget(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch, budget=Budget(10.0))
    search.builder = _Builder(search.clock, pace=0.0, calibrators={"ort-minmax": 2.0})
    search.evaluator = _Evaluator(search.clock, lambda text: -1.0, pace=3.0)
    search.measure(Recipe(), "start", "s")  # 3 s
    search.clock.now = 5.0
    with pytest.raises(_OutOfBudget):
        search.measure(Recipe(method="ort-minmax"), "global", "m")  # 5 + 3 + 2 >= 10
    assert search.measure(Recipe(per_channel=True), "global", "p").index == 1  # 5 + 3 < 10


def test_measure_a_better_step_when_the_best_models_file_is_gone(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch)
    search.builder = _Builder(search.clock)
    search.evaluator = _Evaluator(search.clock, lambda text: 0.5 if "per_channel=True" in text else -0.5)
    search.measure(Recipe(), "start", "s")
    search.model_path(0).unlink()
    better = search.measure(Recipe(per_channel=True), "global", "p")
    assert search.best is better and search.model_path(1).exists()


def test_measured_margin_of_a_model_onnx_cannot_save(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch)
    search.evaluator = _Evaluator(search.clock, lambda text: 0.25)
    with pytest.raises(AttributeError):  # onnx's own error, not the missing file's
        search._measured_margin(object())
    assert search.evaluator.calls == []


def test_verified_prefix_of_the_whole_order_estimated_to_pass_and_verified_to_miss(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch)
    estimator = _Estimator(lambda f: 0.5 if len(f) == 10 else -0.5)
    asked = _rule_search(search, lambda r: False, margin=lambda r: -0.1)
    assert search._verified_prefix(Recipe(), estimator, ORDER) is None
    assert [(len(r.float), p, c) for r, p, c in asked] == [(10, "nodes", "float: top 10")]
    assert [len(f) for f, _ in estimator.asked] == [1, 4, 1]  # the order, its head, 9 (bisected): no retry


def test_verified_prefix_all_in_float_is_a_node_experiment(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch)
    order = [f"n{i}" for i in range(40)]
    estimator = _Estimator(lambda f: len(f) / 100)
    asked = _rule_search(search, lambda r: len(r.float) == 40, margin=lambda r: -0.001)
    search._verified_prefix(Recipe(), estimator, order)
    assert [p for _, p, _ in asked] == ["nodes"] * 4


def test_estimated_boundary_the_heads_gain_anywhere_in_its_longest_prefix(tmp_path, monkeypatch):
    """n5 gains 0.6 alone (base -1): within the top 8, not the top 2 or 4: the head is estimated."""
    search = _search(tmp_path, monkeypatch)
    estimator = _Estimator(lambda f: 0.25 if "n5" in f else -1.0, base=-1.0, gains={"n5": 0.6})
    assert search._estimated_boundary(estimator, ORDER, 0, 0.0) == (6, 0.25)
    assert estimator.asked[1][1] == "short prefixes"


def test_prune_round_budget_edges(tmp_path, monkeypatch):
    search = _search(tmp_path, monkeypatch, budget=Budget(100.0))
    search.cost = CostModel(WORK)
    full = _step(recipe=Recipe(float=frozenset(WORK)))
    # no time past two experiments: none, however quick the estimates (0.1 s)
    search.steps = [_step(seconds=0.1, estimated=True), _step(seconds=50.0)]
    estimator = _Estimator(lambda f: -0.5)
    assert search._prune_round(estimator, full, lambda n: WORK[n], set()) is None and estimator.dropped == []
    # 2 s past two experiments, instant estimates (1 ms at the least): every node
    search.steps = [_step(seconds=0.0, estimated=True), _step(seconds=49.0)]
    estimator = _Estimator(lambda f: -0.5)
    search._prune_round(estimator, full, lambda n: WORK[n], set())
    assert estimator.dropped[0][1] == ["a", "b", "c", "d"]


def test_prune_round_the_costliest_first_whatever_their_names(tmp_path, monkeypatch):
    work = {"a": 1.0, "b": 2.0, "c": 4.0, "d": 8.0}
    search = _search(tmp_path, monkeypatch)
    search.cost = CostModel(work)
    monkeypatch.setattr(estimate_module, "PRUNE_NODES", 2)
    estimator = _Estimator(lambda f: -0.5)
    search._prune_round(estimator, _step(recipe=Recipe(float=frozenset(work))), lambda n: work[n], set())
    assert estimator.dropped[0][1] == ["d", "c"]


def test_prune_round_a_margin_of_zero_passes(tmp_path, monkeypatch):
    """Each node dropped alone and the run together estimated at exactly 0: they pass."""
    search = _search(tmp_path, monkeypatch)
    search.cost = CostModel(WORK)
    estimator = _Estimator(lambda f: 0.0)
    asked = _rule_search(search, lambda r: True)
    missed: set[str] = set()
    passing = _step(passed=True, recipe=Recipe(float=frozenset({"a", "b"})))
    found = search._prune_round(estimator, passing, lambda n: WORK[n], missed)
    assert missed == set() and found.recipe == Recipe()
    assert [len(f[0]) for f, _ in estimator.asked] == [1, 0]  # mid 1 of 2, then both
    assert [c for _, _, c in asked] == ["float -a,b"]


def test_prune_round_bisects_the_run_from_its_middle_up(tmp_path, monkeypatch):
    """Two nodes droppable alone, not together: mid (0 + 2 + 1) // 2 = 1 passes, then both miss."""
    search = _search(tmp_path, monkeypatch)
    search.cost = CostModel(WORK)
    estimator = _Estimator(lambda f: 0.5 if f else -0.5)
    asked = _rule_search(search, lambda r: True)
    passing = _step(passed=True, recipe=Recipe(float=frozenset({"a", "b"})))
    search._prune_round(estimator, passing, lambda n: WORK[n], set())
    assert [sorted(f[0]) for f, _ in estimator.asked] == [["b"], []]
    assert [c for _, _, c in asked] == ["float -a"]


def test_assignment_cost_rounds_to_nine_decimals():
    cost = CostModel({"a": 1.0000000004, "b": 1.0}, int16=1.0, float=1.0)
    assert assignment_cost(["a"], ["float"], cost) == 1.0
    assert assignment_cost(["a", "b"], ["float", "float"], cost) == 2.0


@needs_cache
def test_search_recipe_whose_search_removed_its_own_folder(tmp_path, monkeypatch):
    class Removes(_Run):
        def run(self):
            result = super().run()
            import shutil

            shutil.rmtree(self.args[5])
            return replace(result, model=None)

    monkeypatch.setattr(search_module, "RecipeSearch", Removes)
    _Run.made = []
    result = search_recipe(FP32, CALIB, TEST, ["cosine>=0.99"], model_out=tmp_path / "out.onnx")
    assert result.model is None and not (tmp_path / "out.onnx").exists()


# -- third round: what the second mutation run left --------------------------------------------------------------


def test_run_hands_on_the_task_targets_and_the_best_recipes_overrides(tmp_path, monkeypatch):
    best = Recipe(int16=frozenset({"conv1"}), flipped=frozenset({"conv2"}))
    search = _run(tmp_path, monkeypatch, lambda s: _best(s, best, True, cost=0.2))
    search.task_targets = ["t0", "t1"]
    result = search.run()
    assert _FakeEvaluator.made[0][-1] == ["t0", "t1"]
    # conv1's activations (its reads, x and conv1) at uint16; conv2's weight per channel on axis 0
    assert result.arguments["extra_options"]["TensorQuantOverrides"] == {
        "conv1": [{"quant_type": "QUInt16"}],
        "conv2.weight": [{"axis": 0}],
        "x": [{"quant_type": "QUInt16"}],
    }


class _TwoTargets(_Evaluator):
    """Measured: the host at ``host``, another target at ``other`` (estimates: the host alone)."""

    def __init__(self, clock, host: float, other: float) -> None:
        super().__init__(clock, lambda text: host, pace=1.0)
        self.host, self.other = host, other

    def measure(self, path, targets=None):
        self.calls.append((Path(path).name, targets))
        measured = {HOST: {"y": {"cosine": 0.5 + self.host / 2}}}
        if targets is None:
            measured["other"] = {"y": {"cosine": 0.5 + self.other / 2}}
        margin = min(self.host, self.other) if targets is None else self.host
        return Verdict(measured, margin >= 0, margin)


def test_global_phase_the_starts_host_row_passes_on_the_host_alone(tmp_path, monkeypatch):
    """The start misses on another target (-0.5) but meets the checks on the host (margin 0): its
    host row passes at 0, and the descent has nothing to improve."""
    search = _global(tmp_path, monkeypatch, _margins({}))
    search.evaluator = _TwoTargets(search.clock, 0.0, -0.5)
    assert search._global_phase() == Recipe()
    assert search.steps[0].phase == "start" and search.steps[0].margin == -0.5 and not search.steps[0].passed
    (row,) = search.global_rows.values()
    assert row.passed is True and row.margin == 0.0 and row.estimated is True and row.phase == "start"
    assert row.measured == {HOST: {"y": {"cosine": 0.5}}}
    assert len(search.steps) == 1 and search.base_models == {}


def test_global_phase_without_a_host_margin_descends_from_minus_infinity(tmp_path, monkeypatch):
    """No host among the targets and the start's estimate fails: any estimated margin improves."""
    search = _global(tmp_path, monkeypatch, _margins({"(same)": -0.5, "per_channel=True": -0.9}), vary=("per_channel",))
    search.targets = ["other"]
    real = search.evaluator.measure

    def measure(path, targets=None):
        if targets is None:
            found = real(path, targets)
            return replace(found, measured={"other": found.measured["other"]})
        if Path(path).read_text() == repr(Recipe()):
            raise ValueError("cannot run it")
        return real(path, targets)

    search.evaluator.measure = measure
    assert search._global_phase() == Recipe(per_channel=True)
    assert [(s.change, s.margin, s.skipped) for s in search.steps] == [
        ("starting recipe", -0.5, None),
        ("starting recipe", None, "ValueError: cannot run it"),
        ("per_channel=True", -0.9, None),
    ]


def test_global_phase_a_descent_to_exactly_zero_is_verified_before_any_histogram(tmp_path, monkeypatch):
    search = _global(
        tmp_path, monkeypatch, _margins({"(same)": -0.5, "per_channel=True": 0.0}), methods=("minmax", "mse"),
        vary=("per_channel", "method"),
    )  # fmt: skip
    search.builder.histograms, search.builder.expected = {"mse": "mse"}, 4.0
    assert search._global_phase() == Recipe(per_channel=True)
    assert _rows(search) == [
        ("starting recipe", -0.5, False),
        ("per_channel=True", 0.0, True),
        ("per_channel=True", 0.0, False),
    ]
    assert search.notes == [] and search.builder.folded == []


def test_global_phase_the_cheapest_histogram_rule_first_when_their_times_are_equal(tmp_path, monkeypatch):
    """No extrema pass timed yet: mse, kl both expected at 0 s; mse's rule is the cheaper (docs: 2 passes
    against 3.5), so it comes first, whatever the names' order."""
    table = {"(same)": -0.5, "method=mse": -0.6, "method=kl": -0.7}
    search = _global(tmp_path, monkeypatch, _margins(table), methods=("minmax", "kl", "mse"), vary=("method",))
    search.builder.histograms = {"mse": "mse", "kl": "kl"}
    search.builder.method_ranges = {"mse": {"x": (0.0, 0.5)}, "kl": {"x": (0.0, 0.25)}}
    assert search._global_phase() == Recipe()
    assert [s.change for s in search.steps[1:]] == ["method=mse", "method=kl"]


@pytest.mark.parametrize(
    ("mse", "skipped"),
    [(-0.7, None), (-0.5, None), (None, "ValueError: no")],
)
def test_global_phase_a_histogram_method_no_better_is_not_kept(tmp_path, monkeypatch, mse, skipped):
    def margin(recipe, estimated):
        if recipe.method == "mse":
            return ValueError("no") if mse is None else mse
        return -0.5

    search = _global(tmp_path, monkeypatch, margin, methods=("minmax", "mse"), vary=("method",))
    search.builder.histograms = {"mse": "mse"}
    search.builder.method_ranges = {"mse": {"x": (0.0, 0.5)}}
    assert search._global_phase() == Recipe()
    assert [(s.change, s.margin, s.skipped) for s in search.steps[1:]] == [("method=mse", mse, skipped)]
    assert search.extended is False and search.base_models == {}


def test_global_phase_the_bases_edited_model_has_its_estimated_ranges(tmp_path, monkeypatch):
    search = _global(tmp_path, monkeypatch, _margins({"(same)": -0.5, "per_channel=True": -0.4}), vary=("per_channel",))
    search.builder.method_ranges = {"minmax": {"x": (0.0, 3.0)}}
    search._global_phase()
    (edits,) = _Edits.made
    assert edits.asked[-1] == (Recipe(per_channel=True), {"x": (0.0, 3.0)})


def test_descend_from_a_met_margin_estimates_nothing(tmp_path, monkeypatch):
    search = _global(tmp_path, monkeypatch, _margins({"per_channel=True": 1.0}))
    assert search._descend(_Edits("m", Recipe(), None, {}), Recipe(), 0.0, {Recipe()}, set()) == (Recipe(), 0.0)
    assert search.steps == []


def test_descend_first_each_new_value_then_the_values_seen(tmp_path, monkeypatch):
    """per_channel=True counts as seen: the first pass takes reduce_range (-0.3) and the revisit
    both from there (-0.2); per_channel alone comes last (from both, reduce_range back)."""
    table = {"per_channel=True": -0.4, "reduce_range=True": -0.3, "per_channel=True, reduce_range=True": -0.2}
    search = _global(tmp_path, monkeypatch, _margins(table), vary=("per_channel", "reduce_range"))
    edits = _Edits("m", Recipe(), None, {})
    found = search._descend(edits, Recipe(), -0.5, {Recipe()}, {("per_channel", True)})
    assert found == (Recipe(per_channel=True, reduce_range=True), -0.2)
    assert [s.change for s in search.steps] == ["reduce_range=True", "per_channel=True", "reduce_range=False"]
    assert [s.recipe for s in search.steps] == [
        Recipe(reduce_range=True),
        Recipe(per_channel=True, reduce_range=True),
        Recipe(per_channel=True),
    ]


def test_descend_a_folded_histogram_method_past_one_not_folded(tmp_path, monkeypatch):
    """kl's statistics exist, mse's do not: mse is skipped (the caller's), kl estimated."""
    search = _global(tmp_path, monkeypatch, _margins({}), methods=("minmax", "mse", "kl"), vary=("method",))
    search.builder.histograms, search.builder.folded = {"mse": "mse", "kl": "kl"}, ["kl"]
    search.builder.method_ranges = {"kl": {"x": (0.0, 0.25)}}
    search._descend(_Edits("m", Recipe(), None, {}), Recipe(), -0.5, {Recipe()}, set())
    assert [s.change for s in search.steps] == ["method=kl"]


def test_descend_skips_a_calibrator_of_half_a_second_that_does_not_fit(tmp_path, monkeypatch):
    search = _global(tmp_path, monkeypatch, _margins({}), methods=("minmax", "ort-minmax"), budget=Budget(100.0))
    search.evaluator.pace = 0.0
    search.builder.calibrators = {"ort-minmax": 0.5}
    search.clock.now = 29.6  # 29.6 + 0.5 is past 30 % of 100 s; the cheap moves fit
    search._descend(_Edits("m", Recipe(), None, {}), Recipe(), -0.5, {Recipe()}, set())
    assert [s.change for s in search.steps] == [
        "per_channel=True",
        "reduce_range=True",
        "activation_type=int8",
        "weight_type=uint8",
    ]
    assert search.notes == []


def test_descend_an_equal_margin_is_no_improvement(tmp_path, monkeypatch):
    search = _global(tmp_path, monkeypatch, _margins({"per_channel=True": -0.5}), vary=("per_channel",))
    assert search._descend(_Edits("m", Recipe(), None, {}), Recipe(), -0.5, {Recipe()}, set()) == (Recipe(), -0.5)


def test_descend_a_cheaper_method_than_the_current_does_not_extend(tmp_path, monkeypatch):
    search = _global(
        tmp_path, monkeypatch, _margins({"method=mse": -0.3}), methods=("kl", "mse"), vary=("method",),
        start=Recipe(method="kl"),
    )  # fmt: skip
    search.builder.method_ranges = {"mse": {"x": (0.0, 0.5)}}
    found = search._descend(_Edits("m", Recipe(), None, {}), Recipe(method="kl"), -0.5, {Recipe(method="kl")}, set())
    assert found == (Recipe(method="mse"), -0.3) and search.extended is False


def test_global_fits_a_histogram_under_a_second_has_the_floor(tmp_path, monkeypatch):
    assert _fits(tmp_path, monkeypatch, 39.0, expected=0.5)._global_fits(Recipe(method="mse")) is True


def test_global_fits_counts_from_the_searchs_start(tmp_path, monkeypatch):
    search = _fits(tmp_path, monkeypatch, 129.9)
    search.started = 100.0
    assert search._global_fits(Recipe()) is True
    search.clock.now = 130.0
    assert search._global_fits(Recipe()) is False


def test_estimate_global_a_reused_row_is_a_global_row(tmp_path, monkeypatch):
    search = _global(tmp_path, monkeypatch, _margins({}))
    key = search._row_key(Recipe())
    search.global_rows[key] = Step(0, "start", "starting recipe", Recipe(), 0.0, {}, False, -0.5, 3.0, estimated=True)
    search.steps.append(search.global_rows[key])
    row = search._estimate_global(_Edits("m", Recipe(), None, {}), Recipe(method="ort-minmax"), "method=ort-minmax")
    assert (row.index, row.phase, row.change, row.seconds) == (
        1,
        "global",
        "method=ort-minmax (estimated as step 0)",
        0.0,
    )


def test_weight_phase_a_node_without_work_counts_as_one(tmp_path, monkeypatch):
    search = _weights(tmp_path, monkeypatch, {"(same)": -0.5})
    search.cost = CostModel({"a": 1.5, "b": 0.5})
    search.builder.weights = {"a": ("a.w", 0), "b": ("b.w", 0), "ghost": ("ghost.w", 0)}
    monkeypatch.setattr(search_module, "FLIP_NODES", 2)
    search._weight_phase(Recipe(), ["b", "ghost", "a"])
    assert [s.change for s in search.steps[2:4]] == ["per-channel weight +a", "per-channel weight +ghost"]


def test_weight_phase_flips_at_the_per_channel_opset_itself(tmp_path, monkeypatch):
    search = _weights(tmp_path, monkeypatch, {"(same)": -0.5})
    search.builder.model = onnx.helper.make_model(
        onnx.helper.make_graph([], "g", [], []), opset_imports=[onnx.helper.make_opsetid("", 13)]
    )
    search._weight_phase(Recipe(), ["conv2"])
    assert search.steps[2].change == "per-channel weight +conv2"


@old_ort_refuses_moves
def test_weight_phase_estimates_on_the_bases_ranges_in_its_own_phase(tmp_path, monkeypatch):
    search = _weights(tmp_path, monkeypatch, {"(same)": -0.5, "per-channel weight +conv2": -0.25})
    search.builder.method_ranges = {"minmax": {"x": (0.0, 7.0)}}
    search._weight_phase(Recipe(), ["conv2"])
    (edits,) = _Edits.made
    assert [ranges for _, ranges in edits.asked] == [{"x": (0.0, 7.0)}] * 4
    assert {s.phase for s in search.steps[1:]} == {"weights"}


def test_weight_phase_compares_with_the_bases_verified_margin(tmp_path, monkeypatch):
    """The base verified at -0.5 but estimated at -0.3; the moves verified at -0.4: kept."""
    table = {"(same)": -0.3, "per-channel weight +conv2": -0.1}
    search = _weights(tmp_path, monkeypatch, table, verified={"(same)": -0.5, "per-channel weight +conv2": -0.4})
    assert search._weight_phase(Recipe(), ["conv2"]) == Recipe(flipped=frozenset({"conv2"}))


def test_weight_phase_a_skipped_verified_base_counts_as_minus_infinity(tmp_path, monkeypatch):
    table = {"(same)": -0.5, "per_channel=True": -0.5, "per_channel=True, per-tensor weight +conv2": -0.1}
    search = _weights(tmp_path, monkeypatch, table, verified={"per_channel=True, per-tensor weight +conv2": -0.9})
    pc = Recipe(per_channel=True)
    search.seen[pc] = _step(index=9, skipped="refused", recipe=pc)
    assert search._weight_phase(pc, ["conv2"]) == replace(pc, flipped=frozenset({"conv2"}))


def test_weight_phase_on_onnxruntime_1_18_says_each_kind_it_refuses(tmp_path, monkeypatch):
    import onnxruntime

    monkeypatch.setattr(onnxruntime, "__version__", "1.18.1")
    search = _weights(tmp_path, monkeypatch, {"(same)": -0.5})
    assert search._weight_phase(Recipe(), ["conv2"]) == Recipe()
    assert [s.change for s in search.steps[2:]] == ["per-channel weight +conv2"]
    assert [n.split(":")[0] for n in search.notes[1:]] == ["weights", "weights"]
    assert "no narrowed weights" in search.notes[1] and "no retyped weights" in search.notes[2]


def test_weight_phase_out_of_its_share_goes_on_to_verify_nothing(tmp_path, monkeypatch):
    search = _weights(tmp_path, monkeypatch, {"(same)": -0.5}, budget=Budget(100.0))
    monkeypatch.setattr(search_module, "WEIGHTS_SHARE", 0.0)
    assert search._weight_phase(Recipe(), ["conv2"]) == Recipe()


# -- fourth round: what the third mutation run left -------------------------------------------------------------


@pytest.mark.parametrize("host", [0.0, 0.5])
def test_global_phase_a_start_met_on_the_host_computes_no_histogram(tmp_path, monkeypatch, host):
    search = _global(tmp_path, monkeypatch, _margins({}), methods=("minmax", "mse"), vary=("method",))
    search.builder.histograms = {"mse": "mse"}
    search.evaluator = _TwoTargets(search.clock, host, -0.5)
    assert search._global_phase() == Recipe()
    assert search.notes == [] and search.builder.folded == [] and len(search.steps) == 1


def test_global_phase_a_histogram_method_is_estimated_once(tmp_path, monkeypatch):
    """mse's statistics from 28 s to 38 s, its estimate to 41 s (no better): the phase's share is then
    30 % + the 10 s of statistics, spent; the descent after it has nothing left to try, so it says
    nothing."""
    search = _global(tmp_path, monkeypatch, _margins({"(same)": -0.5}), methods=("minmax", "mse"), budget=Budget(100.0),
                     vary=("method",))  # fmt: skip
    search.builder.histograms, search.builder.expected = {"mse": "mse"}, 10.0
    search.builder.method_ranges = {"mse": {"x": (0.0, 0.5)}}
    search.evaluator.pace = 3.0
    search.clock.now = 24.0  # the start's experiment ends at 28 (1 s to write, 3 to measure)
    assert search._global_phase() == Recipe()
    assert search.clock.now == 41.0 and [s.change for s in search.steps[1:]] == ["method=mse"]
    assert search.notes == [
        "global phase: the mse histograms for method=mse (expected 10.0s)",
        "global phase: the mse histograms took 10.0s",
    ]


def test_descend_a_recipe_estimated_once_is_not_tried_again(tmp_path, monkeypatch):
    """per_channel=True estimated from 29.5 s (1 s): the revisit past 30 % has nothing left to try,
    so it says nothing."""
    search = _global(tmp_path, monkeypatch, _margins({}), budget=Budget(100.0), vary=("per_channel",))
    search.clock.now = 29.5
    assert search._descend(_Edits("m", Recipe(), None, {}), Recipe(), -0.5, {Recipe()}, set()) == (Recipe(), -0.5)
    assert [s.change for s in search.steps] == ["per_channel=True"] and search.notes == []
