"""What a pair's checks ask of a recipe: each :class:`~pytest_qaccuracy.outcomes.Outcome` as the recipe
:class:`~.checks.Check` that measures what it measured, or why a recipe cannot be aimed at it. Pure:
what the pytest plugin's end-of-session recipe search aims at: the failed checks, and the passing
ones a recipe must not break (:func:`recipe_checks`).

- a named output tolerance (``min_cosine``, ``min_sqnr``, ``max_lsb``) or an output rule
  (``<pair glob> mse<=1e-4``, ``... cosine>0.999``): a tensor check on the same metric, with the same
  operator (``>``/``<`` exclude the bound, as the plugin's rules do);
- ``rtol``/``atol``: the allclose check with both numbers: no element outside ``atol + rtol*|fp32|``,
  the plugin's formula (both measured by :class:`~pytest_qaccuracy.analysis.outputs.OutputMeasure`);
- ``min_top1_agreement`` and ``max_top1_drop`` (top-1 and the ``topk`` rank): top-k checks;
- a task-metric bound (``max_drop:cer``): the task check.

A tolerance or rule of the pair holds on every output, so its check does too, whichever output
failed it; a check failed on a named view (``slices``: its own tolerance or rule, or the pair's
failing there) holds on that view only, measured on it. A check that
failed on a deployment target only (``on onnxruntime-vnni``) becomes the same check: the search
measures every check on every target of the pair. Not aimed at (a reason each): layer rules (the
search measures outputs), ``min_channel_steps``, the saturation share, baseline drift, the agreement
gate (the emulation's arithmetic, not the recipe), errors and checks that measured nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from functools import partial

from pytest_qaccuracy.analysis.recipe.checks import Check, parse_check
from pytest_qaccuracy.outcomes import Outcome

#: Why an outcome of each kind that no recipe check measures is not aimed at.
NOT_AIMED = {
    "drift": "baseline drift compares runs, not a recipe's outputs",
    "saturation": "the search does not measure the saturation share",
    "gate": "the agreement gate measures the integer emulation, not the recipe",
    "error": "the check did not run",
}

#: What an aim gives: a check, or why there is none.
Aim = Check | str


def _tensor(outcome: Outcome, views: Mapping[str, str]) -> Aim:
    from pytest_qaccuracy.metrics import available_metrics

    if outcome.metric not in available_metrics():
        return f"the search does not measure {outcome.metric!r}"
    name = outcome.output
    view = views.get(name) if name is not None else None
    return Check(
        outcome.metric,
        float(outcome.threshold or 0.0),
        outcome.op in (">=", ">"),
        strict=outcome.op in (">", "<"),
        output=None if view is None else name,
        view=view,
    )


def _allclose(outcome: Outcome, views: Mapping[str, str]) -> Aim:
    rtol, atol = float(outcome.params.get("rtol", 0.0)), float(outcome.params.get("atol", 0.0))
    return Check("allclose", 0.0, False, "allclose", 1.0, rtol=rtol, atol=atol)


def _agreement(outcome: Outcome, views: Mapping[str, str]) -> Aim:
    return Check("min_top1_agreement", float(outcome.threshold or 0.0), True, "topk", 0.01, 1)


def _drop(outcome: Outcome, views: Mapping[str, str]) -> Aim:
    if outcome.k is None:
        return f"the search does not measure {outcome.metric!r}"
    if outcome.value is None:
        return "it measured nothing (the data has no labels)"
    return Check(f"max_top{outcome.k}_drop", float(outcome.threshold or 0.0), False, "topk", 0.01, outcome.k)


def _task(outcome: Outcome, views: Mapping[str, str]) -> Aim:
    if outcome.value is None:
        return "it measured nothing"
    return parse_check(f"{outcome.check}{outcome.op}{float(outcome.threshold or 0.0)!r}")


def _skipped(why: str, outcome: Outcome, views: Mapping[str, str]) -> Aim:
    """The aim of a check no recipe check measures: ``why`` (bound with ``partial`` in the tables)."""
    return why


#: A pair's named output tolerance -> its aim.
TOLERANCE_AIMS: dict[str, Callable[[Outcome, Mapping[str, str]], Aim]] = {
    "min_cosine": _tensor,
    "min_sqnr": _tensor,
    "max_lsb": _tensor,
    "rtol": _allclose,
    "atol": _allclose,
    "min_top1_agreement": _agreement,
    "max_top1_drop": _drop,
    "min_channel_steps": partial(_skipped, "the search does not measure channel steps"),
}


def _tolerance(outcome: Outcome, views: Mapping[str, str]) -> Aim:
    aim = TOLERANCE_AIMS.get(outcome.check)
    return f"the search does not measure {outcome.check}" if aim is None else aim(outcome, views)


def _rule(outcome: Outcome, views: Mapping[str, str]) -> Aim:
    return _tensor(outcome, views) if outcome.scope == "output" else "the search measures outputs, not layers"


#: outcome kind -> its aim (the kinds of :data:`NOT_AIMED` have none).
KIND_AIMS: dict[str, Callable[[Outcome, Mapping[str, str]], Aim]] = {
    "tolerance": _tolerance,
    "rule": _rule,
    "task": _task,
    **{kind: partial(_skipped, why) for kind, why in NOT_AIMED.items()},
}


def aim(outcome: Outcome, views: Mapping[str, str] | None = None) -> Aim:
    """The recipe check of one outcome, or why it has none; ``views``: the pair's named views
    (name -> ``output0[:, 4:]``), whose own checks hold on them only."""
    if outcome.threshold is None:
        return "it measured nothing"
    return KIND_AIMS[outcome.kind](outcome, views or {})


def recipe_checks(outcomes: Iterable[Outcome], views: Mapping[str, str] | None = None) -> tuple[list[Check], list[str]]:
    """The checks a recipe must meet (each once, in their order), and a line per failed check it cannot
    be aimed at (``max_backend_steps: the agreement gate ...``).

    A recipe is searched for the failed checks, and it must keep the pair's passing ones: a recipe that
    fixes cosine while breaking the SQNR check that held would leave the pair red. So the checks are
    every aimed outcome, passed or failed, and none at all when no failed outcome can be aimed at.
    """
    checks: dict[Check, None] = {}
    skipped: dict[str, None] = {}
    aimed_failure = False
    for outcome in outcomes:
        found = aim(outcome, views)
        if isinstance(found, Check):
            checks[found] = None
            aimed_failure = aimed_failure or not outcome.passed
        elif not outcome.passed:
            skipped[f"{outcome.check}: {found}"] = None
    return (list(checks) if aimed_failure else []), list(skipped)
