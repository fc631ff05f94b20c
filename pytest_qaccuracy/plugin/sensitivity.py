"""The end-of-session sensitivity analysis of checked pairs, for the summary's tables.

At the end of the session, the process that compared a pair (an xdist worker, or the only process)
ranks the pair's quantized nodes with :func:`~pytest_qaccuracy.analysis.sensitivity_report.analyse_pair`,
once per pair, for the pairs that failed (``failed``, the default; expected failures count) or for
all of them (``all``). The result goes into the pair's record as a
:class:`~pytest_qaccuracy.plugin.records.SensitivityEntry`, which crosses xdist as plain builtins;
the controller writes the artifacts and prints the tables. An analysis that raises leaves a one-line
reason instead: it never ends the session. Its options are read with the others (:mod:`.settings`).

The sweep target comes from the pair's own failed output tolerance on cosine or SQNR (``min_cosine
= 0.99`` gives ``cosine>=0.99``), so the suggestion says what to keep in float to get back within it.
A pair that failed a task-metric tolerance (``max_drop:cer``) also gets a sweep aimed at it
(:func:`~pytest_qaccuracy.analysis.task_sweep.task_sweep`): the ranked nodes kept in float one by one,
each model run as deployed and scored by the task metric, until the value is back within it.

The recipe search (level ``recipe``) aims at every failed check of the pair that a recipe can change
(:func:`~pytest_qaccuracy.analysis.recipe.aims.recipe_checks`): output metrics in either direction,
``rtol``/``atol``, top-k, task metrics, a view's own checks, and checks that failed on a deployment
target only (every check is measured on every target); the others are listed as not aimed at.
The pair's passing checks a recipe can measure are targets too: a recipe must not break them.

Only stdlib at module level.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pytest_qaccuracy.plugin.records import ExclusionTarget, PairRecord, RecordedCheck, SensitivityEntry
from pytest_qaccuracy.tolerances import GATE

if TYPE_CHECKING:
    from pytest_qaccuracy.analysis.deadline import Deadline

#: Output metrics whose failed check sets the sweep target (the sweep measures the mean over outputs).
TARGET_METRICS = ("cosine", "sqnr")


class PairFiles(Protocol):
    """The files of a pair that the analysis reads (a :class:`~pytest_qaccuracy.plugin.pairs.PairSpec`)."""

    @property
    def fp32(self) -> Path: ...
    @property
    def quantized(self) -> Path: ...
    @property
    def data(self) -> Path: ...
    @property
    def backend(self) -> str: ...
    @property
    def scheme(self) -> str: ...
    @property
    def targets(self) -> tuple[str, ...]: ...


class SensitivitySettings(Protocol):
    """The settings the analysis reads (a :class:`~pytest_qaccuracy.plugin.settings.QAccuracySettings`)."""

    @property
    def sensitivity(self) -> str: ...
    @property
    def sensitivity_metric(self) -> str: ...
    @property
    def sensitivity_mode(self) -> str: ...
    @property
    def sensitivity_records(self) -> int: ...
    @property
    def analysis(self) -> str: ...
    @property
    def analysis_budget(self) -> tuple[float | None, float | None]: ...


class AnalysedSession(Protocol):
    """What the analysis needs of the run state (a :class:`~pytest_qaccuracy.plugin.session.QAccuracySession`),
    declared here so that this module, which the session imports, does not import the session."""

    @property
    def settings(self) -> SensitivitySettings: ...
    @property
    def records(self) -> dict[str, PairRecord]: ...
    def model_pair(self, spec: Any) -> Any: ...
    def runtime_options(self) -> Any: ...
    def reference(self, spec: Any) -> Any: ...
    def task_inputs(self, spec: Any) -> tuple[Sequence[Any], Any]: ...
    def check_seconds(self, spec: Any) -> float: ...


def exclusion_target(checks: Sequence[RecordedCheck], metric: str) -> ExclusionTarget | None:
    """The failed output check on cosine or SQNR the sweep aims at, or None.

    The strictest one, preferring the ranking metric, then cosine. Every process picks the same way,
    so the controller keeps the xdist worker's pick with the highest :func:`target_rank`.
    """
    failed = [
        o
        for o in (c.outcome for c in checks)
        if not o.passed
        and o.scope == "output"
        and o.deployment is None  # the analysis runs the pair's own backend
        and o.metric in TARGET_METRICS
        and o.op in (">=", ">")
        and o.threshold is not None
    ]
    if not failed:
        return None
    best = max(failed, key=lambda o: _check_rank(o.metric, o.threshold, metric))
    return ExclusionTarget(
        check=best.check,
        target=best.target,
        metric=best.metric,
        threshold=float(best.threshold or 0.0),
        source=best.source,
    )


def _check_rank(metric: str, threshold: float | None, ranked_by: str) -> tuple[bool, bool, float]:
    return (metric == ranked_by, metric == "cosine", float(threshold or 0.0))


def target_rank(entry: SensitivityEntry | None) -> tuple[bool | float, ...]:
    """Order of two analyses of one pair (from two xdist workers): the one a serial run would make wins."""
    if entry is None:
        return (False,)
    target = entry.target_from
    return (True,) if target is None else (True, True, *_check_rank(target.metric, target.threshold, entry.metric))


def merge_entry(mine: SensitivityEntry | None, theirs: SensitivityEntry | None) -> SensitivityEntry | None:
    """Of two analyses of one pair, the one a serial run would have made (see :func:`exclusion_target`)."""
    return theirs if theirs is not None and target_rank(theirs) > target_rank(mine) else mine


def analyse_records(state: AnalysedSession, specs: Mapping[str, PairFiles]) -> None:
    """Analyse the selected pairs of ``state.records`` (``specs``: record key -> pair), once per pair."""
    settings = state.settings
    if settings.sensitivity == "off" or settings.analysis == "off":
        return
    done: dict[tuple[Any, ...], SensitivityEntry] = {}
    for key, record in list(state.records.items()):
        spec = specs.get(key)
        # the agreement gate measures the integer arithmetic, which a node ranking cannot explain
        failed = not all(c.outcome.passed for c in record.checks if c.outcome.check != GATE)
        if spec is None or record.sensitivity is not None or (settings.sensitivity == "failed" and not failed):
            continue
        target = exclusion_target(record.checks, settings.sensitivity_metric)
        text = None if target is None else f"{target.metric}>={float(target.threshold)!r}"
        aim = task_target(record.checks)
        aims = recipe_aims(record.checks, spec) if settings.analysis == "recipe" else None
        ident = (spec.fp32, spec.quantized, spec.data, text, aim, aims)
        if ident not in done:
            done[ident] = analyse_one(state, spec, text, aims)
        entry = replace(done[ident], target_from=target)
        if aim is not None and entry.report is not None and entry.report.get("sensitivity"):
            entry = replace(entry, task=analyse_task(state, spec, entry, *aim))
        state.records[key] = replace(record, sensitivity=entry)


def recipe_aims(checks: Sequence[RecordedCheck], spec: Any) -> tuple[tuple[Any, ...], tuple[str, ...]]:
    """The recipe checks of the pair's failed checks and why the others are not aimed at
    (:func:`~pytest_qaccuracy.analysis.recipe.aims.recipe_checks`); ``spec``'s views name the checks
    that hold on one view."""
    from pytest_qaccuracy.analysis.recipe.aims import recipe_checks

    views = {view.name: view.view for view in getattr(spec, "slices", ())}
    found, skipped = recipe_checks((c.outcome for c in checks), views)
    return tuple(found), tuple(skipped)


def task_target(checks: Sequence[RecordedCheck]) -> tuple[str, float] | None:
    """The first failed task-metric tolerance of the pair's own run (``("max_drop:cer", 0.005)``), or None."""
    for outcome in (c.outcome for c in checks):
        if (
            not outcome.passed
            and outcome.kind == "task"
            and outcome.value is not None
            and outcome.threshold is not None
            and outcome.deployment is None
        ):
            return outcome.check, float(outcome.threshold)
    return None


def analyse_task(state: AnalysedSession, spec: Any, entry: SensitivityEntry, check: str, threshold: float) -> dict:
    """The task-metric sweep of a pair along ``entry``'s ranking, or ``{"check", "error"}`` (one line)."""
    try:
        from pytest_qaccuracy.analysis.sensitivity import SensitivityResult
        from pytest_qaccuracy.analysis.task_sweep import task_sweep

        value = check.partition(":")[2]
        metrics, targets = state.task_inputs(spec)
        metric = next(m for m in metrics if value in m.value_names(m.create()))
        order = [n.node for n in SensitivityResult.from_dict((entry.report or {})["sensitivity"]).ranked()]
        sweep = task_sweep(
            state.model_pair(spec),
            spec.data,
            metric,
            check,
            threshold,
            order,
            targets,
            state.runtime_options(),
            state.settings.sensitivity_records or None,
        )
        return sweep.to_dict()
    except Exception as exc:  # as analyse_one: never ends the session
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        return {"check": check, "threshold": threshold, "error": f"{type(exc).__name__}: {first}"}


def analysis_budget(settings: SensitivitySettings, check_seconds: float) -> float:
    """Seconds the analysis of a pair may take: a multiple of its check time, or a fixed time."""
    factor, fixed = settings.analysis_budget
    return float(fixed) if fixed is not None else float(factor or 0.0) * check_seconds


def analyse_one(
    state: AnalysedSession,
    spec: PairFiles,
    target: str | None,
    aims: tuple[tuple[Any, ...], tuple[str, ...]] | None = None,
) -> SensitivityEntry:
    """:func:`_analyse_one`, with a heartbeat in a log (:func:`pytest_qaccuracy.data.progress.heartbeat`):
    ``qaccuracy: analysing <pair>: still working (...)`` whenever nothing was printed for ``LOG_INTERVAL``."""
    from pytest_qaccuracy.data.progress import heartbeat

    with heartbeat(f"qaccuracy: analysing {getattr(spec, 'id', None) or spec.quantized.name}"):
        return _analyse_one(state, spec, target, aims)


def _analyse_one(
    state: AnalysedSession,
    spec: PairFiles,
    target: str | None,
    aims: tuple[tuple[Any, ...], tuple[str, ...]] | None = None,
) -> SensitivityEntry:
    """One pair's analysis within its budget: the ranking (when it is expected to fit), then the
    recipe search with what is left (level ``recipe``), aimed at ``aims`` (:func:`recipe_aims`);
    each part gives a one-line reason instead when it does not run or fails. Never raises: a bad
    model or dataset must not end the session.

    The ranking runs against a deadline at the end of the budget (:mod:`~pytest_qaccuracy.analysis.deadline`):
    it stops at the first step that would start after it, with the nodes it measured (``ranking
    stopped at the budget after N of M nodes``), so a wrong estimate costs at most one step more."""
    import time

    from pytest_qaccuracy.analysis.deadline import Deadline

    settings = state.settings
    mode, metric = settings.sensitivity_mode, settings.sensitivity_metric
    check = state.check_seconds(spec)
    budget = analysis_budget(settings, check)
    began = time.monotonic()
    deadline = Deadline(began + budget, budget)
    entry = SensitivityEntry(mode=mode, metric=metric, budget=round(budget, 3))
    try:
        entry = replace(entry, **_ranking(state, spec, target, budget, check, deadline))
    except Exception as exc:
        entry = replace(entry, error=_one_line(exc))
    if settings.analysis == "recipe":
        try:
            left = budget - (time.monotonic() - began)
            entry = replace(entry, **_recipe(state, spec, aims or ((), ()), left, check))
        except Exception as exc:
            entry = replace(entry, recipe_note=f"recipe not searched: {_one_line(exc)}")
    return replace(entry, seconds=round(time.monotonic() - began, 3))


def _one_line(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return f"{type(exc).__name__}: {first}"


def _ranking(
    state: AnalysedSession,
    spec: PairFiles,
    target: str | None,
    budget: float,
    check: float,
    deadline: Deadline | None = None,
) -> dict[str, Any]:
    """The node ranking's report, or why it did not run (its expected cost exceeds the budget) or
    measured nothing (``deadline`` came before the first chunk of nodes was measured)."""
    from pytest_qaccuracy.analysis.deadline import DeadlineReached
    from pytest_qaccuracy.analysis.recipe.pair import ranking_seconds
    from pytest_qaccuracy.analysis.sensitivity_report import analyse_pair
    from pytest_qaccuracy.data import load_dataset

    settings = state.settings
    pair = state.model_pair(spec)
    with load_dataset(spec.data) as data:
        count = len(data)
    share = 1.0 if not settings.sensitivity_records else min(1.0, settings.sensitivity_records / max(count, 1))
    expected = ranking_seconds(pair.quantized, check, share)
    if expected > budget:
        return {"error": f"ranking not run: budget (about {expected:.0f}s expected, {_budget_text(settings, budget)})"}
    try:
        report = analyse_pair(
            pair,
            spec.data,
            metrics=settings.sensitivity_metric,
            mode=settings.sensitivity_mode,
            target=target,
            options=state.runtime_options(),
            records=settings.sensitivity_records or None,
            reference=state.reference(spec),  # the fp32 outputs of the pair's comparison
            deadline=deadline,
        )
    except DeadlineReached:
        why = f"about {expected:.1f}s expected, {_budget_text(settings, budget)}"
        return {"error": f"ranking stopped at the budget before any node was measured ({why})"}
    return {"report": report.to_dict()}


def _recipe(
    state: AnalysedSession,
    spec: PairFiles,
    aims: tuple[tuple[Any, ...], tuple[str, ...]],
    left: float,
    check: float,
) -> dict[str, Any]:
    """The recipe search's result within what is left of the budget, or why it was not searched. It
    aims at every failed check of the pair a recipe can change, and keeps its passing ones (``aims``: the
    checks, and a line per failed check it cannot aim at): a recipe must meet them all, on every target of the pair."""
    checks, skipped = list(aims[0]), list(aims[1])
    if not checks:
        why = f" ({'; '.join(skipped)})" if skipped else ""
        return {"recipe_note": f"recipe not searched: no failed check a recipe can change{why}"}
    from pytest_qaccuracy.analysis.recipe.pair import pair_recipe

    own = "onnxruntime" if spec.backend == "onnxruntime" else spec.scheme
    targets = list(dict.fromkeys([own, *spec.targets]))
    wants_tasks = any(c.kind == "task" for c in checks)
    tasks, task_targets = state.task_inputs(spec) if wants_tasks else ((), None)
    on_step, on_note = _recipe_progress(checks)
    found = pair_recipe(
        spec.fp32,
        spec.quantized,
        spec.data,
        checks,
        targets,
        left,
        check,
        state.runtime_options(),
        tasks=tasks,
        task_targets=task_targets,
        on_step=on_step,
        on_note=on_note,
    )
    if found.result is None:
        hint = (
            "; a larger --qaccuracy-analysis-budget (e.g. 10x) or `qaccuracy recipe` searches it"
            if found.note.startswith("recipe not searched: budget")
            else ""
        )
        return {"recipe_note": f"{found.note}; {_budget_text(state.settings, left)} left{hint}"}
    if found.result.stopped == "interrupted":  # Ctrl-C: the session's analysis stops, as in the ranking
        raise KeyboardInterrupt
    recipe = {**found.result.to_dict(), "budget": round(left, 3), "calibration_records": found.calibration_records}
    if found.pair_data is not None:  # the best recipe on all the pair's records, as its check reads them
        recipe["pair_data"] = found.pair_data
    if skipped:  # failed checks the recipe was not aimed at: its "meets" says nothing of them
        recipe["not_aimed"] = skipped
    if found.result.ranges is not None:  # the controller writes them as the recipe's calibration cache
        recipe["ranges"] = {name: [float(lo), float(hi)] for name, (lo, hi) in found.result.ranges.items()}
    return {"recipe": recipe}


def _recipe_progress(checks: Sequence[Any]) -> tuple[Any, Any]:
    """The search's ``on_step`` and ``on_note``: a line per finished step and before a long phase, to
    the progress the session installed (redrawn on a terminal; in a log, every step a plain line
    (:func:`pytest_qaccuracy.data.progress.step`), the notes at most every ``LOG_INTERVAL``
    (:func:`~pytest_qaccuracy.data.progress.note`); nothing with ``-q``)."""
    from pytest_qaccuracy.analysis.recipe.checks import parse_checks
    from pytest_qaccuracy.data.progress import note, step
    from pytest_qaccuracy.report.recipe_tables import step_line

    parsed = parse_checks(list(checks))

    def on_step(done: Any, best: Any) -> None:
        step(step_line(done, best, parsed))

    def on_note(text: str) -> None:
        note(f"recipe: {text}")

    return on_step, on_note


def _budget_text(settings: SensitivitySettings, seconds: float) -> str:
    factor, fixed = settings.analysis_budget
    unit = f"{factor:g}x the pair's check" if fixed is None else "qaccuracy_analysis_budget"
    return f"budget {seconds:.1f}s = {unit}"
