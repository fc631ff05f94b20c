"""Unit tests of the end-of-session analysis (``plugin/sensitivity.py``), in-process with a stand-in
for the session state and for the ranking, the task sweep and the recipe search: which pairs are
analysed (once per pair and target), the target a failed cosine or SQNR check sets, the task-metric
sweep's aim, the budget in seconds and its text, the ranking's refusal and deadline lines, the
recipe's notes and what it keeps, and one-line errors that never end the session. The analyses
themselves are tested in ``tests/analysis/``; here no model is run."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import pytest_qaccuracy.analysis.recipe.pair as recipe_pair
import pytest_qaccuracy.analysis.sensitivity_report as sensitivity_report
import pytest_qaccuracy.data.progress as progress
import pytest_qaccuracy.plugin.sensitivity as sens
from pytest_qaccuracy.analysis.deadline import DeadlineReached
from pytest_qaccuracy.outcomes import Outcome
from pytest_qaccuracy.plugin.records import ExclusionTarget, PairRecord, RecordedCheck, SensitivityEntry

SUITE = Path(__file__).resolve().parents[2] / "example_suites"
DATA = SUITE / "data" / "digits_test.npz"  # 300 records


def outcome(
    metric: str = "cosine",
    threshold: float | None = 0.99,
    passed: bool = False,
    op: str = ">=",
    scope: str = "output",
    deployment: str | None = None,
    kind: str = "tolerance",
    check: str | None = None,
    value: float | None = 0.5,
    subject: str = "output 'y'",
) -> Outcome:
    return Outcome(
        kind=kind,
        check=check or f"min_{metric}",
        scope=scope,
        subject=subject,
        deployment=deployment,
        metric=metric,
        op=op,
        threshold=threshold,
        value=value,
        passed=passed,
        source=f"src {metric}",
        detail="",
    )


def checked(*outcomes: Outcome) -> list[RecordedCheck]:
    return [RecordedCheck(test="t", index=i, outcome=o) for i, o in enumerate(outcomes)]


def settings(**changes: Any) -> SimpleNamespace:
    base = {
        "sensitivity": "failed",
        "sensitivity_metric": "cosine",
        "sensitivity_mode": "single",
        "sensitivity_records": 0,
        "analysis": "sensitivity",
        "analysis_budget": (10.0, None),
    }
    return SimpleNamespace(**{**base, **changes})


def spec(name: str = "p", quantized: str = "q.onnx", **fields: Any) -> SimpleNamespace:
    base = {
        "id": name,
        "fp32": Path("f.onnx"),
        "quantized": Path(quantized),
        "data": DATA,
        "backend": "onnxruntime",
        "scheme": "onnxruntime",
        "targets": (),
        "slices": (),
    }
    return SimpleNamespace(**{**base, **fields})


def record(key: str, checks: list[RecordedCheck], **fields: Any) -> PairRecord:
    base = {
        "id": key,
        "key": key,
        "stem": key,
        "fp32": "f",
        "quantized": "q",
        "data": "d",
        "backend": "onnxruntime",
        "scheme": "s",
        "comparison": {},
        "checks": tuple(checks),
    }
    return PairRecord(**{**base, **fields})


class State:
    """The session state the analysis reads: settings, records, pairs, options, references, task
    inputs and check seconds."""

    def __init__(self, records: dict[str, PairRecord] | None = None, seconds: float = 2.0, **changes: Any) -> None:
        self.settings = settings(**changes)
        self.records = records or {}
        self.seconds = seconds
        self.tasks: tuple[Any, Any] = ((), None)

    def model_pair(self, spec: Any) -> Any:
        return SimpleNamespace(quantized=f"model of {spec.id}", spec=spec)

    # the state answers for a pair: a call without one is a bug

    def runtime_options(self) -> str:
        return "options"

    def reference(self, spec: Any) -> str:
        return f"reference of {spec.id}"

    def task_inputs(self, spec: Any) -> tuple[Any, Any]:
        assert spec is not None, "task inputs of no pair"
        return self.tasks

    def check_seconds(self, spec: Any) -> float:
        assert spec is not None, "check seconds of no pair"
        return self.seconds


# --- the sweep's target -----------------------------------------------------------------------


def test_exclusion_target_takes_only_failed_lower_bounds_of_the_pair_outputs() -> None:
    assert sens.exclusion_target(checked(outcome(passed=True)), "cosine") is None
    assert sens.exclusion_target(checked(outcome(scope="layer")), "cosine") is None
    assert sens.exclusion_target(checked(outcome(deployment="onnxruntime-avx2")), "cosine") is None
    assert sens.exclusion_target(checked(outcome(metric="mse", op=">=")), "cosine") is None
    assert sens.exclusion_target(checked(outcome(op="<=")), "cosine") is None
    assert sens.exclusion_target(checked(outcome(threshold=None)), "cosine") is None
    found = sens.exclusion_target(checked(outcome(op=">", threshold=0.9)), "cosine")
    assert found == ExclusionTarget(
        check="min_cosine", target="output 'y'", metric="cosine", threshold=0.9, source="src cosine"
    )
    assert isinstance(sens.exclusion_target(checked(outcome(metric="sqnr", threshold=20)), "cosine").threshold, float)
    assert sens.exclusion_target(checked(outcome(threshold=0.0)), "cosine").threshold == 0.0


def test_exclusion_target_prefers_the_ranking_metric_then_cosine_then_the_strictest() -> None:
    checks = checked(
        outcome("sqnr", 20.0, subject="output 'a'"),
        outcome("cosine", 0.99, subject="output 'b'"),
        outcome("cosine", 0.999, subject="output 'c'"),
        outcome("sqnr", 30.0, subject="output 'd'"),
    )
    assert sens.exclusion_target(checks, "cosine").target == "output 'c'"
    assert sens.exclusion_target(checks, "sqnr").target == "output 'd'"
    assert sens.exclusion_target(checks, "mse").target == "output 'c'"  # cosine before sqnr
    zero = checked(outcome("cosine", 0.0, subject="output 'z'"), outcome("cosine", 0.5, subject="output 'h'"))
    assert sens.exclusion_target(zero, "cosine").target == "output 'h'"
    assert sens.exclusion_target(zero[::-1], "cosine").target == "output 'h'"


def test_target_rank_and_merge_keep_what_a_serial_run_picks() -> None:
    assert sens.target_rank(None) == (False,)
    untargeted = SensitivityEntry(mode="single", metric="cosine")
    assert sens.target_rank(untargeted) == (True,)
    aimed = SensitivityEntry(
        mode="single", metric="sqnr", target_from=ExclusionTarget("min_cosine", "o", "cosine", 0.5, "s")
    )
    assert sens.target_rank(aimed) == (True, True, False, True, 0.5)
    ranked_by_it = SensitivityEntry(
        mode="single", metric="cosine", target_from=ExclusionTarget("min_cosine", "o", "cosine", 0.5, "s")
    )
    assert sens.target_rank(ranked_by_it) == (True, True, True, True, 0.5)
    assert sens.merge_entry(None, untargeted) is untargeted
    assert sens.merge_entry(untargeted, None) is untargeted
    assert sens.merge_entry(untargeted, aimed) is aimed
    assert sens.merge_entry(aimed, untargeted) is aimed
    same = SensitivityEntry(mode="single", metric="cosine", report={"n": 2})
    assert sens.merge_entry(untargeted, same) is untargeted  # a tie keeps the controller's own


def test_task_target_is_the_first_failed_task_check_of_the_pair_run() -> None:
    def task(**kw: Any) -> Outcome:
        return outcome("cer", kind="task", op="<=", check="max_drop:cer", threshold=kw.pop("threshold", 0.01), **kw)

    assert sens.task_target(checked(task(passed=True))) is None
    assert sens.task_target(checked(outcome())) is None  # not a task check
    assert sens.task_target(checked(task(value=None))) is None
    assert sens.task_target(checked(task(threshold=None))) is None
    assert sens.task_target(checked(task(deployment="x"))) is None
    first = task(threshold=1)
    second = outcome("wer", kind="task", op="<=", check="max:wer", threshold=0.5)
    assert sens.task_target(checked(outcome(), first, second)) == ("max_drop:cer", 1.0)
    assert isinstance(sens.task_target(checked(first))[1], float)


def test_recipe_aims_pass_the_outcomes_and_the_pair_views(monkeypatch: pytest.MonkeyPatch) -> None:
    import pytest_qaccuracy.analysis.recipe.aims as aims

    seen = []
    monkeypatch.setattr(aims, "recipe_checks", lambda o, v: seen.append((list(o), v)) or (["c1", "c2"], ["s"]))
    checks = checked(outcome(), outcome("sqnr"))
    views = (SimpleNamespace(name="head", view="logits[0:2]"), SimpleNamespace(name="tail", view="logits[2:]"))
    assert sens.recipe_aims(checks, spec(slices=views)) == (("c1", "c2"), ("s",))
    assert seen == [([c.outcome for c in checks], {"head": "logits[0:2]", "tail": "logits[2:]"})]
    seen.clear()
    sens.recipe_aims(checks, object())  # a spec without views
    assert seen[0][1] == {}


def test_recipe_aims_of_real_outcomes() -> None:
    found, skipped = sens.recipe_aims(checked(outcome(threshold=0.99), outcome("sqnr", 20.0, passed=True)), spec())
    assert len(found) == 2 and skipped == ()


# --- which pairs are analysed -----------------------------------------------------------------


class Recorder:
    """A stand-in for analyse_one and analyse_task that writes down each call."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, report: Any = None) -> None:
        self.calls: list[tuple] = []
        self.tasks: list[tuple] = []
        self.report = report
        monkeypatch.setattr(sens, "analyse_one", self.analyse_one)
        monkeypatch.setattr(sens, "analyse_task", self.analyse_task)

    def analyse_one(self, state: Any, spec: Any, target: Any, aims: Any) -> SensitivityEntry:
        assert isinstance(state, State), "analysed without the session state"
        self.calls.append((spec.id, target, aims))
        return SensitivityEntry(mode="single", metric="cosine", report=self.report, seconds=len(self.calls))

    def analyse_task(self, state: Any, spec: Any, entry: Any, check: str, threshold: float) -> dict:
        assert isinstance(state, State), "swept without the session state"
        self.tasks.append((spec.id, entry.seconds, check, threshold))
        return {"swept": check}


def test_off_analyses_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder(monkeypatch)
    records = {"k": record("k", checked(outcome()))}
    sens.analyse_records(State(records, sensitivity="off"), {"k": spec()})
    sens.analyse_records(State(records, analysis="off"), {"k": spec()})
    assert rec.calls == [] and records["k"].sensitivity is None


def test_failed_pairs_only_by_default_and_each_once(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder(monkeypatch)
    from pytest_qaccuracy.tolerances import GATE

    done = SensitivityEntry(mode="single", metric="x")
    state = State(
        {
            "passed": record("passed", checked(outcome(passed=True))),
            "failed": record("failed", checked(outcome(threshold=0.99))),
            "gate only": record("gate only", checked(outcome(check=GATE, metric="steps", op="<="))),
            "no spec": record("no spec", checked(outcome())),
            "analysed": record("analysed", checked(outcome()), sensitivity=done),
        }
    )
    specs = {k: spec(k, quantized=f"{k}.onnx") for k in state.records if k != "no spec"}
    sens.analyse_records(state, specs)
    assert rec.calls == [("failed", "cosine>=0.99", None)]
    ordered = State({k: state.records[k] for k in ("no spec", "analysed", "gate only", "failed")})
    ordered.records["failed"] = record("failed", checked(outcome(threshold=0.99)))
    rec.calls.clear()
    sens.analyse_records(ordered, specs)
    assert rec.calls == [("failed", "cosine>=0.99", None)]
    entry = state.records["failed"].sensitivity
    assert entry.target_from == ExclusionTarget("min_cosine", "output 'y'", "cosine", 0.99, "src cosine")
    assert state.records["passed"].sensitivity is None and state.records["gate only"].sensitivity is None
    assert state.records["analysed"].sensitivity is done
    rec.calls.clear()
    every = State({"passed": record("passed", checked(outcome(passed=True)))}, sensitivity="all")
    sens.analyse_records(every, {"passed": spec("passed")})
    assert rec.calls == [("passed", None, None)]
    assert every.records["passed"].sensitivity.target_from is None


def test_pairs_of_the_same_files_and_aims_share_one_analysis(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder(monkeypatch)
    state = State(
        {
            "a": record("a", checked(outcome(threshold=0.99))),
            "b": record("b", checked(outcome(threshold=0.99))),
            "c": record("c", checked(outcome(threshold=0.9))),
            "d": record("d", checked(outcome(threshold=0.99))),
        }
    )
    specs = {"a": spec("a"), "b": spec("b"), "c": spec("c"), "d": spec("d", quantized="other.onnx")}
    sens.analyse_records(state, specs)
    assert rec.calls == [("a", "cosine>=0.99", None), ("c", "cosine>=0.9", None), ("d", "cosine>=0.99", None)]
    assert state.records["b"].sensitivity.seconds == 1  # a's analysis
    assert state.records["c"].sensitivity.seconds == 2


def test_the_recipe_level_passes_the_aims(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder(monkeypatch)
    asked = []
    monkeypatch.setattr(sens, "recipe_aims", lambda checks, s: asked.append(checks) or ((f"aim of {s.id}",), ()))
    state = State({"a": record("a", checked(outcome(threshold=0.99)))}, analysis="recipe")
    checks = state.records["a"].checks
    sens.analyse_records(state, {"a": spec("a")})
    assert rec.calls == [("a", "cosine>=0.99", (("aim of a",), ()))]
    assert asked == [checks]


def test_the_target_follows_the_ranking_metric(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder(monkeypatch)
    checks = checked(outcome("cosine", 0.99), outcome("sqnr", 20))
    for metric, text in (("sqnr", "sqnr>=20.0"), ("cosine", "cosine>=0.99")):
        rec.calls.clear()
        state = State({"a": record("a", checks)}, sensitivity_metric=metric)
        sens.analyse_records(state, {"a": spec("a")})
        assert rec.calls == [("a", text, None)]
        assert state.records["a"].sensitivity.target_from.metric == metric


def test_a_failed_task_check_gets_a_sweep_after_a_ranking(monkeypatch: pytest.MonkeyPatch) -> None:
    task = outcome("cer", kind="task", op="<=", check="max_drop:cer", threshold=0.02)
    rec = Recorder(monkeypatch, report={"sensitivity": {"nodes": []}})
    state = State({"a": record("a", checked(task))})
    sens.analyse_records(state, {"a": spec("a")})
    assert rec.tasks == [("a", 1, "max_drop:cer", 0.02)]
    assert state.records["a"].sensitivity.task == {"swept": "max_drop:cer"}
    for report in (None, {"sensitivity": None}, {"other": 1}):
        rec = Recorder(monkeypatch, report=report)
        state = State({"a": record("a", checked(task))})
        sens.analyse_records(state, {"a": spec("a")})
        assert rec.tasks == [] and state.records["a"].sensitivity.task is None


# --- the task sweep -----------------------------------------------------------------------------


def test_analyse_task_runs_the_sweep_along_the_ranking(monkeypatch: pytest.MonkeyPatch) -> None:
    import pytest_qaccuracy.analysis.sensitivity as analysis_sensitivity
    import pytest_qaccuracy.analysis.task_sweep as task_sweep

    class Metric:
        def __init__(self, names: tuple[str, ...]) -> None:
            self.names = names

        def create(self) -> Any:
            return SimpleNamespace(names=self.names)  # the value names come from the made metric

        def value_names(self, made: Any) -> tuple[str, ...]:
            return made.names

    wer, cer = Metric(("wer",)), Metric(("cer", "exact"))
    ranked = [SimpleNamespace(node="n2"), SimpleNamespace(node="n1")]
    read = []
    monkeypatch.setattr(
        analysis_sensitivity.SensitivityResult,
        "from_dict",
        classmethod(lambda cls, d: read.append(d) or SimpleNamespace(ranked=lambda: ranked)),
    )
    sweeps = []
    monkeypatch.setattr(
        task_sweep, "task_sweep", lambda *a: sweeps.append(a) or SimpleNamespace(to_dict=lambda: {"done": True})
    )
    state = State(sensitivity_records=40)
    state.tasks = ((wer, cer), ["t1"])
    entry = SensitivityEntry(mode="single", metric="cosine", report={"sensitivity": {"ranking": 1}})
    s = spec("a")
    assert sens.analyse_task(state, s, entry, "max_drop:cer", 0.02) == {"done": True}
    assert read == [{"ranking": 1}]
    ((pair, data, metric, check, threshold, order, targets, options, records),) = sweeps
    assert (pair.spec, data, metric, check, threshold) == (s, DATA, cer, "max_drop:cer", 0.02)
    assert (order, targets, options, records) == (["n2", "n1"], ["t1"], "options", 40)
    sweeps.clear()
    state.settings.sensitivity_records = 0
    sens.analyse_task(state, s, entry, "max_drop:cer", 0.02)
    assert sweeps[0][-1] is None


def test_analyse_task_fails_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    state = State()
    state.tasks = ((), None)  # no metric computes the value
    entry = SensitivityEntry(mode="single", metric="cosine", report={"sensitivity": {}})
    got = sens.analyse_task(state, spec(), entry, "max_drop:cer", 0.5)
    assert got == {"check": "max_drop:cer", "threshold": 0.5, "error": "StopIteration: "}

    def broken(s: Any) -> Any:
        raise ValueError("  " + "x" * 400 + "\nsecond line")

    state.task_inputs = broken
    got = sens.analyse_task(state, spec(), entry, "max:wer", 1.0)
    assert got["error"] == "ValueError: " + "x" * 300


# --- the budget ---------------------------------------------------------------------------------


def test_analysis_budget_is_a_factor_of_the_check_or_fixed_seconds() -> None:
    assert sens.analysis_budget(settings(analysis_budget=(3.0, None)), 2.5) == 7.5
    assert sens.analysis_budget(settings(analysis_budget=(None, 40)), 2.5) == 40.0
    assert sens.analysis_budget(settings(analysis_budget=(3.0, 0)), 2.5) == 0.0
    assert sens.analysis_budget(settings(analysis_budget=(None, None)), 2.5) == 0.0
    assert isinstance(sens.analysis_budget(settings(analysis_budget=(None, 40)), 1.0), float)


def test_budget_text_names_where_the_budget_comes_from() -> None:
    assert sens._budget_text(settings(analysis_budget=(2.5, None)), 12.34) == "budget 12.3s = 2.5x the pair's check"
    assert sens._budget_text(settings(analysis_budget=(None, 60.0)), 60) == "budget 60.0s = qaccuracy_analysis_budget"


def test_one_line_is_the_type_and_the_first_line_cut_at_300() -> None:
    assert sens._one_line(ValueError("  bad\nmore")) == "ValueError: bad"
    assert sens._one_line(KeyError()) == "KeyError: "
    assert sens._one_line(OSError("y" * 301)) == "OSError: " + "y" * 300


# --- the ranking --------------------------------------------------------------------------------


class Ranking:
    """Stand-ins for ranking_seconds and analyse_pair."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, expected: float = 1.0, raises: Any = None) -> None:
        self.estimates: list[tuple] = []
        self.runs: list[tuple] = []
        self.expected, self.raises = expected, raises
        monkeypatch.setattr(recipe_pair, "ranking_seconds", self.ranking_seconds)
        monkeypatch.setattr(sensitivity_report, "analyse_pair", self.analyse_pair)

    def ranking_seconds(self, model: Any, check: float, share: float) -> float:
        self.estimates.append((model, check, share))
        return self.expected

    def analyse_pair(self, pair: Any, data: Any, **kwargs: Any) -> Any:
        self.runs.append((pair, data, kwargs))
        if self.raises is not None:
            raise self.raises
        return SimpleNamespace(to_dict=lambda: {"ranked": True})


def test_ranking_runs_with_the_settings_options_and_kept_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    ranking = Ranking(monkeypatch, expected=5.0)
    state = State(sensitivity_metric="sqnr", sensitivity_mode="loo", sensitivity_records=30)
    s = spec("a")
    got = sens._ranking(state, s, "sqnr>=20.0", 5.0, 1.5, "the deadline")
    assert got == {"report": {"ranked": True}}
    assert ranking.estimates == [("model of a", 1.5, 0.1)]  # 30 of the 300 records
    ((pair, data, kwargs),) = ranking.runs
    assert pair.spec is s and data == DATA
    assert kwargs == {
        "metrics": "sqnr",
        "mode": "loo",
        "target": "sqnr>=20.0",
        "options": "options",
        "records": 30,
        "reference": "reference of a",
        "deadline": "the deadline",
    }


@pytest.mark.parametrize(("records", "share"), [(0, 1.0), (300, 1.0), (600, 1.0), (150, 0.5), (1, 1 / 300)])
def test_ranking_estimate_reads_the_share_of_records(
    monkeypatch: pytest.MonkeyPatch, records: int, share: float
) -> None:
    ranking = Ranking(monkeypatch)
    sens._ranking(State(sensitivity_records=records), spec(), None, 10.0, 1.0)
    assert ranking.estimates[0][2] == pytest.approx(share)
    assert ranking.runs[0][2]["records"] == (records or None)


def test_ranking_not_run_when_expected_beyond_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    ranking = Ranking(monkeypatch, expected=12.6)
    state = State(analysis_budget=(3.0, None))
    got = sens._ranking(state, spec(), None, 12.5, 1.0)
    assert got == {"error": "ranking not run: budget (about 13s expected, budget 12.5s = 3x the pair's check)"}
    assert ranking.runs == []
    ranking.expected = 12.5  # exactly the budget: run
    assert sens._ranking(state, spec(), None, 12.5, 1.0) == {"report": {"ranked": True}}


def test_ranking_stopped_by_the_deadline_before_any_node(monkeypatch: pytest.MonkeyPatch) -> None:
    Ranking(monkeypatch, expected=2.25, raises=DeadlineReached())
    got = sens._ranking(State(analysis_budget=(None, 4.0)), spec(), None, 4.0, 1.0)
    why = "about 2.2s expected, budget 4.0s = qaccuracy_analysis_budget"
    assert got == {"error": f"ranking stopped at the budget before any node was measured ({why})"}


# --- one pair's analysis ------------------------------------------------------------------------


def test_analyse_one_beats_a_heartbeat_named_for_the_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    labels = []

    @contextmanager
    def heartbeat(label: str) -> Any:
        labels.append(label)
        yield

    monkeypatch.setattr(progress, "heartbeat", heartbeat)
    monkeypatch.setattr(
        sens, "_analyse_one", lambda state, s, target, aims: isinstance(state, State) and (s, target, aims)
    )
    s = spec("named")
    assert sens.analyse_one(State(), s, "t", ("a", "b")) == (s, "t", ("a", "b"))
    unnamed = spec(quantized="dir/model.q.onnx")
    del unnamed.id
    sens.analyse_one(State(), unnamed, None)
    empty = spec("", quantized="m.onnx")
    assert sens.analyse_one(State(), empty, None) == (empty, None, None)
    assert labels == ["qaccuracy: analysing named", "qaccuracy: analysing model.q.onnx", "qaccuracy: analysing m.onnx"]


def test_analyse_one_keeps_mode_metric_budget_and_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []

    def ranking(state: Any, s: Any, target: Any, budget: float, check: float, deadline: Any) -> dict:
        assert isinstance(state, State)
        seen.append((s.id, target, budget, check, deadline.seconds, deadline.at - deadline.seconds))
        return {"report": {"r": 1}}

    monkeypatch.setattr(sens, "_ranking", ranking)
    monkeypatch.setattr(sens, "_recipe", lambda *a: pytest.fail("no recipe at the sensitivity level"))
    state = State(seconds=0.12345, sensitivity_mode="loo", sensitivity_metric="sqnr", analysis_budget=(3.0, None))
    entry = sens._analyse_one(state, spec("a"), "sqnr>=1.0")
    assert (entry.mode, entry.metric, entry.report, entry.error) == ("loo", "sqnr", {"r": 1}, None)
    assert entry.budget == 0.37  # 3 x 0.12345 = 0.37035, to 3 decimals
    assert 0.0 <= entry.seconds < 5.0 and entry.seconds == round(entry.seconds, 3)
    ((pair_id, target, budget, check, seconds, began),) = seen
    assert (pair_id, target, check) == ("a", "sqnr>=1.0", 0.12345)
    assert budget == pytest.approx(0.37035) and seconds == pytest.approx(0.37035)
    import time

    assert abs(began - time.monotonic()) < 5.0


def test_analyse_one_turns_failures_into_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    def ranking(*args: Any) -> dict:
        raise RuntimeError("ranking broke\nmore")

    def recipe(*args: Any) -> dict:
        raise OSError("disk\nfull")

    monkeypatch.setattr(sens, "_ranking", ranking)
    monkeypatch.setattr(sens, "_recipe", recipe)
    entry = sens._analyse_one(State(analysis="recipe"), spec(), None)
    assert entry.error == "RuntimeError: ranking broke"
    assert entry.recipe_note == "recipe not searched: OSError: disk"
    assert entry.seconds is not None


def test_the_recipe_gets_what_is_left_and_the_aims(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    def ranking(*args: Any) -> dict:
        time.sleep(0.2)
        return {"report": {}}

    calls = []
    monkeypatch.setattr(sens, "_ranking", ranking)

    def recipe(state: Any, s: Any, aims: Any, left: float, check: float) -> dict:
        assert isinstance(state, State) and s.id == "p"
        calls.append((aims, left, check))
        return {"recipe_note": "noted"} if aims[0] else {}

    monkeypatch.setattr(sens, "_recipe", recipe)
    state = State(seconds=1.0, analysis="recipe", analysis_budget=(None, 10.0))
    entry = sens._analyse_one(state, spec(), None, (("c",), ("s",)))
    assert (entry.report, entry.recipe_note, entry.error) == ({}, "noted", None)
    entry = sens._analyse_one(state, spec(), None)
    assert (entry.report, entry.recipe_note, entry.error) == ({}, None, None)
    (aims, left, check), (no_aims, _, _) = calls
    assert aims == (("c",), ("s",)) and no_aims == ((), ())
    assert check == 1.0 and 9.0 < left <= 9.8


def recipe(*args: Any) -> dict:
    """``_recipe``, with a KeyboardInterrupt (only an interrupted search may raise it) failing the test
    instead of ending the session."""
    try:
        return sens._recipe(*args)
    except KeyboardInterrupt:
        pytest.fail("a search that was not interrupted interrupted the analysis")


# --- the recipe search --------------------------------------------------------------------------


class Search:
    """A stand-in for pair_recipe: its arguments, and the result it gives."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, found: Any) -> None:
        self.calls: list[tuple] = []
        self.found = found
        monkeypatch.setattr(recipe_pair, "pair_recipe", self.pair_recipe)
        self.progress: list[Any] = []
        monkeypatch.setattr(
            sens, "_recipe_progress", lambda checks: self.progress.append(checks) or ("on step", "on note")
        )

    def pair_recipe(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((args, kwargs))
        return self.found


def found(result: Any = None, note: str = "", pair_data: Any = None, records: int = 64) -> SimpleNamespace:
    return SimpleNamespace(result=result, note=note, pair_data=pair_data, calibration_records=records)


def result(stopped: str | None = None, ranges: Any = None) -> SimpleNamespace:
    return SimpleNamespace(stopped=stopped, ranges=ranges, to_dict=lambda: {"best": "r1"})


def test_recipe_not_searched_without_a_check_it_can_change(monkeypatch: pytest.MonkeyPatch) -> None:
    search = Search(monkeypatch, found())
    assert recipe(State(), spec(), ((), ()), 10.0, 1.0) == {
        "recipe_note": "recipe not searched: no failed check a recipe can change"
    }
    got = recipe(State(), spec(), ((), ("gate: a", "b: c")), 10.0, 1.0)
    assert got == {"recipe_note": "recipe not searched: no failed check a recipe can change (gate: a; b: c)"}
    assert search.calls == []


def test_recipe_search_gets_the_pair_targets_and_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    search = Search(monkeypatch, found(result()))
    checks = (SimpleNamespace(kind="output"),)
    s = spec(backend="integer", scheme="tflite", targets=("onnxruntime-avx2", "tflite"))
    state = State()
    state.tasks = (("m",), ["t"])
    got = recipe(state, s, (checks, ()), 7.5, 1.25)
    assert got == {"recipe": {"best": "r1", "budget": 7.5, "calibration_records": 64}}
    ((args, kwargs),) = search.calls
    assert args == (s.fp32, s.quantized, DATA, list(checks), ["tflite", "onnxruntime-avx2"], 7.5, 1.25, "options")
    assert kwargs == {"tasks": (), "task_targets": None, "on_step": "on step", "on_note": "on note"}
    search.calls.clear()
    task_checks = (SimpleNamespace(kind="output"), SimpleNamespace(kind="task"))
    recipe(state, spec(targets=("tflite",)), (task_checks, ()), 7.5, 1.25)
    ((args, kwargs),) = search.calls
    assert args[4] == ["onnxruntime", "tflite"]
    assert (kwargs["tasks"], kwargs["task_targets"]) == (("m",), ["t"])


def test_recipe_keeps_pair_data_skipped_checks_and_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    ranges = {"x": (-1, 2.5)}
    Search(monkeypatch, found(result(ranges=ranges), pair_data={"cosine": 0.99}, records=8))
    checks = (SimpleNamespace(kind="output"),)
    got = recipe(State(), spec(), (checks, ("gate: no",)), 3.14159, 1.0)
    assert got == {
        "recipe": {
            "best": "r1",
            "budget": 3.142,
            "calibration_records": 8,
            "pair_data": {"cosine": 0.99},
            "not_aimed": ["gate: no"],
            "ranges": {"x": [-1.0, 2.5]},
        }
    }
    assert isinstance(got["recipe"]["ranges"]["x"][0], float)


def test_recipe_not_found_says_why_and_the_budget_left(monkeypatch: pytest.MonkeyPatch) -> None:
    checks = (SimpleNamespace(kind="output"),)
    Search(monkeypatch, found(note="recipe not searched: budget (about 90s expected)"))
    got = recipe(State(analysis_budget=(None, 5.0)), spec(), (checks, ()), 4.44, 1.0)
    hint = "; a larger --qaccuracy-analysis-budget (e.g. 10x) or `qaccuracy recipe` searches it"
    left = "budget 4.4s = qaccuracy_analysis_budget left"
    assert got == {"recipe_note": f"recipe not searched: budget (about 90s expected); {left}{hint}"}
    Search(monkeypatch, found(note="no recipe meets every check"))
    got = recipe(State(analysis_budget=(None, 5.0)), spec(), (checks, ()), 4.44, 1.0)
    assert got == {"recipe_note": f"no recipe meets every check; {left}"}


def test_an_interrupted_search_interrupts_the_analysis(monkeypatch: pytest.MonkeyPatch) -> None:
    Search(monkeypatch, found(result(stopped="interrupted")))
    with pytest.raises(KeyboardInterrupt):
        sens._recipe(State(), spec(), ((SimpleNamespace(kind="output"),), ()), 1.0, 1.0)
    Search(monkeypatch, found(result(stopped="budget")))
    assert "recipe" in recipe(State(), spec(), ((SimpleNamespace(kind="output"),), ()), 1.0, 1.0)


def test_recipe_progress_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    import pytest_qaccuracy.analysis.recipe.checks as recipe_checks
    import pytest_qaccuracy.report.recipe_tables as recipe_tables

    lines = []
    monkeypatch.setattr(recipe_checks, "parse_checks", lambda checks: ("parsed", checks))
    monkeypatch.setattr(recipe_tables, "step_line", lambda done, best, parsed: f"{done}|{best}|{parsed}")
    monkeypatch.setattr(progress, "step", lambda text: lines.append(("step", text)))
    monkeypatch.setattr(progress, "note", lambda text: lines.append(("note", text)))
    on_step, on_note = sens._recipe_progress(("c",))
    on_step("s1", "b1")
    on_note("calibrating")
    assert lines == [("step", "s1|b1|('parsed', ['c'])"), ("note", "recipe: calibrating")]


def test_analyse_one_times_itself_to_the_millisecond(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    clock = iter([1000.0, 1000.0061, 1000.0123456])  # began, the recipe's start, the end
    monkeypatch.setattr(time, "monotonic", lambda: next(clock))
    deadlines = []
    monkeypatch.setattr(sens, "_ranking", lambda state, s, t, budget, check, deadline: deadlines.append(deadline) or {})
    monkeypatch.setattr(sens, "_recipe", lambda *a: {})
    entry = sens._analyse_one(State(seconds=2.0, analysis="recipe", analysis_budget=(None, 100.0)), spec(), None)
    assert entry.seconds == 0.012 and isinstance(entry.seconds, float)
    assert entry.budget == 100.0
    assert (deadlines[0].at, deadlines[0].seconds) == (1100.0, 100.0)


def test_ranking_share_of_a_one_record_dataset(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import numpy as np

    one = tmp_path / "one.npz"
    np.savez(one, x=np.zeros((1, 1, 8, 8), np.float32))
    ranking = Ranking(monkeypatch)
    sens._ranking(State(sensitivity_records=1), spec(data=one), None, 10.0, 1.0)
    assert ranking.estimates[0][2] == 1.0


def test_recipe_on_onnxruntime_targets_onnxruntime_whatever_its_scheme(monkeypatch: pytest.MonkeyPatch) -> None:
    search = Search(monkeypatch, found(result()))
    recipe(State(), spec(scheme="onnxruntime-vnni"), ((SimpleNamespace(kind="output"),), ()), 1.0, 1.0)
    assert search.calls[0][0][4] == ["onnxruntime"]
    assert search.progress == [[SimpleNamespace(kind="output")]]
