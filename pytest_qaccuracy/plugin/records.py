"""The plugin's records: a check's outcome, a pair's record of a session, a worker's payload.

Frozen dataclasses built by keyword. Each has ``to_dict`` and ``from_dict`` (:class:`~pytest_qaccuracy.plain.Plain`:
its fields in order, empty optional parts left out), the one place where it becomes plain builtins
and back: an xdist worker's payload crosses execnet, which takes builtins only, and the report
writers (``summary.json``, ``report.html``, the terminal summary) read a pair's record as a mapping
of that form. Pure: stdlib only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pytest_qaccuracy.outcomes import Outcome, pair_status
from pytest_qaccuracy.plain import Plain, empty, none, plain_field


@dataclass(frozen=True, slots=True)
class RecordedCheck(Plain):
    """An outcome as one test recorded it: the test, the outcome's position among that test's
    outcomes, and the reason when the test was expected to fail."""

    test: str
    index: int
    outcome: Outcome = plain_field(inline=True)
    xfail: str | None = None


@dataclass(frozen=True, slots=True)
class TargetRun(Plain):
    """A pair's run on one deployment target: where it ran, its output figures, its top-k counts,
    and whether every output check on it passed."""

    backend: str
    scheme: str
    #: output name -> metric name -> value
    outputs: Mapping[str, Mapping[str, Any]]
    #: output name -> top-k counts (``OutputStats.topk``)
    topk: Mapping[str, Any]
    passed: bool
    #: task-metric value name -> ``TaskValue.to_dict()`` of this target's run
    task: Mapping[str, Any] = plain_field(default_factory=dict, omit=empty)


def merge_targets(known: Mapping[str, TargetRun], new: Mapping[str, TargetRun]) -> dict[str, TargetRun]:
    """``new`` folded into ``known``: a target passes only if all its checks did (a suite checks one
    tolerance per item; xdist workers check different items). The newest figures are kept."""
    merged = dict(known)
    for name, run in new.items():
        merged[name] = replace(run, passed=run.passed and (name not in known or known[name].passed))
    return merged


def agreement_record(agreement: Any) -> dict[str, Any]:
    """The agreement gate's measurement for a record (an ``AgreementResult``'s ``to_dict()`` without the
    verdict, which depends on N and is in the pair's checks)."""
    data: Mapping[str, Any] = agreement.to_dict()
    return {k: v for k, v in data.items() if k not in ("max_steps_allowed", "first_divergence")}


@dataclass(frozen=True, slots=True)
class ExclusionTarget(Plain):
    """The failed output check the sensitivity sweep aims at (``min_cosine = 0.99``: cosine >= 0.99)."""

    check: str
    target: str
    metric: str
    threshold: float
    source: str


@dataclass(frozen=True, slots=True)
class SensitivityEntry(Plain):
    """A pair's end-of-session sensitivity analysis: the report's ``to_dict()``, or a one-line error."""

    mode: str
    metric: str
    report: Mapping[str, Any] | None = plain_field(None, omit=none)
    error: str | None = plain_field(None, omit=none)
    target_from: ExclusionTarget | None = None
    #: the sweep aimed at a failed task-metric check (``TaskSweep.to_dict()``, or ``{"check", "error"}``)
    task: Mapping[str, Any] | None = plain_field(None, omit=none)
    #: the recipe search's result (``RecipeResult.to_dict()``), or why it was not searched
    recipe: Mapping[str, Any] | None = plain_field(None, omit=none)
    recipe_note: str | None = plain_field(None, omit=none)
    #: seconds the analysis took, and the budget it had
    seconds: float | None = plain_field(None, omit=none)
    budget: float | None = plain_field(None, omit=none)


@dataclass(frozen=True, slots=True, kw_only=True)
class PairRecord(Plain):
    """What a session knows about one pair: its files and run, its comparison, every recorded check,
    and what the checks and the end-of-session analysis measured besides."""

    id: str
    #: :meth:`~pytest_qaccuracy.plugin.pairs.PairSpec.key`: the pair's identity across runs
    key: str
    #: the stem of the pair's artifacts and baseline
    stem: str
    fp32: str
    quantized: str
    data: str
    labels: str | None = None
    backend: str
    #: the scheme the quantized model ran with (the integer backend's preset, resolved)
    scheme: str
    #: the :class:`~pytest_qaccuracy.analysis.results.ComparisonResult` as ``to_dict()``
    comparison: Mapping[str, Any]
    #: output name -> top-k counts
    topk: Mapping[str, Any] = field(default_factory=dict)
    checks: tuple[RecordedCheck, ...] = ()
    #: task-metric value name -> ``TaskValue.to_dict()`` (fp32, quantized, drop, against, records)
    task: Mapping[str, Any] = plain_field(default_factory=dict, omit=empty)
    #: the agreement gate's measurement (``AgreementResult.to_dict()`` without the verdict)
    agreement: Mapping[str, Any] | None = plain_field(None, omit=none)
    targets: Mapping[str, TargetRun] = plain_field(default_factory=dict, omit=empty)
    sensitivity: SensitivityEntry | None = plain_field(None, omit=none)
    #: pytest's outcome of each test that checked the pair (nodeid -> passed, failed, xfailed, ...)
    tests: Mapping[str, str] = plain_field(default_factory=dict, omit=empty)

    @property
    def status(self) -> tuple[str, str | None]:
        """:func:`~pytest_qaccuracy.outcomes.pair_status` of the record."""
        return pair_status(({"passed": c.outcome.passed, "xfail": c.xfail} for c in self.checks), self.tests)

    @property
    def passed(self) -> bool:
        return self.status[0] in ("passed", "unchecked")

    def with_pytest_outcomes(self, outcomes: Mapping[str, tuple[str, str | None]]) -> PairRecord:
        """The record as pytest judged its tests (``outcomes``: nodeid -> (outcome, xfail reason)): a
        check is expected to fail only where pytest reported its test as xfailed (not under
        ``--runxfail``, ``-p no:skipping`` or a false condition). Tests pytest did not report keep
        what the check recorded."""
        checks = tuple(
            c
            if c.test not in outcomes
            else replace(c, xfail=outcomes[c.test][1] if outcomes[c.test][0] == "xfailed" else None)
            for c in self.checks
        )
        tests = {test: outcomes[test][0] for test in sorted({c.test for c in checks} & set(outcomes))}
        return replace(self, checks=checks, tests=tests)

    def with_checks(self, checks: Sequence[RecordedCheck]) -> PairRecord:
        return replace(self, checks=(*self.checks, *checks))

    def sorted(self) -> PairRecord:
        """The record with its checks in a stable order: by test, then position (same with or without xdist)."""
        return replace(self, checks=tuple(sorted(self.checks, key=lambda c: (c.test, c.index))))


@dataclass(frozen=True, slots=True)
class WorkerPayload(Plain):
    """What an xdist worker sends the controller: its records, and where it was interrupted."""

    records: Mapping[str, PairRecord]
    interrupted: str | None = None

    def to_wire(self) -> dict[str, Any]:
        """Plain builtins (execnet refuses anything else)."""
        return self.to_dict()

    @classmethod
    def from_wire(cls, data: Mapping[str, Any] | None) -> WorkerPayload | None:
        """The payload a worker sent, or None when it sent none (it crashed)."""
        if not data:
            return None
        return cls.from_dict(data)
