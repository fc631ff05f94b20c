"""The plugin's records: a check's outcome, a pair's record of a session, a worker's payload.

Frozen dataclasses built by keyword. Each has ``to_dict`` and ``from_dict``, the one place where it
becomes plain builtins and back: an xdist worker's payload crosses execnet, which takes builtins
only, and the report writers (``summary.json``, ``report.html``, the terminal summary) read a pair's
record as a mapping of that form. Pure: stdlib only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pytest_qaccuracy.outcomes import Outcome, pair_status


@dataclass(frozen=True, slots=True)
class RecordedCheck:
    """An outcome as one test recorded it: the test, the outcome's position among that test's
    outcomes, and the reason when the test was expected to fail."""

    test: str
    index: int
    outcome: Outcome
    xfail: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"test": self.test, "index": self.index, **self.outcome.to_dict(), "xfail": self.xfail}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RecordedCheck:
        return cls(test=data["test"], index=data["index"], outcome=Outcome.from_dict(data), xfail=data.get("xfail"))


@dataclass(frozen=True, slots=True)
class TargetRun:
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
    task: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "scheme": self.scheme,
            "outputs": {name: dict(metrics) for name, metrics in self.outputs.items()},
            "topk": dict(self.topk),
            "passed": self.passed,
            **({"task": dict(self.task)} if self.task else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TargetRun:
        return cls(
            backend=data["backend"],
            scheme=data["scheme"],
            outputs=data["outputs"],
            topk=data["topk"],
            passed=bool(data["passed"]),
            task=data.get("task") or {},
        )


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
class ExclusionTarget:
    """The failed output check the sensitivity sweep aims at (``min_cosine = 0.99``: cosine >= 0.99)."""

    check: str
    target: str
    metric: str
    threshold: float
    source: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExclusionTarget:
        return cls(**{name: data[name] for name in cls.__dataclass_fields__})


@dataclass(frozen=True, slots=True)
class SensitivityEntry:
    """A pair's end-of-session sensitivity analysis: the report's ``to_dict()``, or a one-line error."""

    mode: str
    metric: str
    report: Mapping[str, Any] | None = None
    error: str | None = None
    target_from: ExclusionTarget | None = None
    #: the sweep aimed at a failed task-metric check (``TaskSweep.to_dict()``, or ``{"check", "error"}``)
    task: Mapping[str, Any] | None = None
    #: the recipe search's result (``RecipeResult.to_dict()``), or why it was not searched
    recipe: Mapping[str, Any] | None = None
    recipe_note: str | None = None
    #: seconds the analysis took, and the budget it had
    seconds: float | None = None
    budget: float | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"mode": self.mode, "metric": self.metric}
        if self.report is not None:
            data["report"] = self.report
        if self.error is not None:
            data["error"] = self.error
        data["target_from"] = None if self.target_from is None else self.target_from.to_dict()
        if self.task is not None:
            data["task"] = dict(self.task)
        for name in ("recipe", "recipe_note", "seconds", "budget"):
            if getattr(self, name) is not None:
                data[name] = getattr(self, name)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SensitivityEntry:
        target = data.get("target_from")
        return cls(
            mode=data["mode"],
            metric=data["metric"],
            report=data.get("report"),
            error=data.get("error"),
            target_from=None if target is None else ExclusionTarget.from_dict(target),
            task=data.get("task"),
            recipe=data.get("recipe"),
            recipe_note=data.get("recipe_note"),
            seconds=data.get("seconds"),
            budget=data.get("budget"),
        )


@dataclass(frozen=True, slots=True)
class PairRecord:
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
    labels: str | None
    backend: str
    #: the scheme the quantized model ran with (the integer backend's preset, resolved)
    scheme: str
    #: the :class:`~pytest_qaccuracy.analysis.results.ComparisonResult` as ``to_dict()``
    comparison: Mapping[str, Any]
    #: output name -> top-k counts
    topk: Mapping[str, Any] = field(default_factory=dict)
    #: task-metric value name -> ``TaskValue.to_dict()`` (fp32, quantized, drop, against, records)
    task: Mapping[str, Any] = field(default_factory=dict)
    checks: tuple[RecordedCheck, ...] = ()
    #: the agreement gate's measurement (``AgreementResult.to_dict()`` without the verdict)
    agreement: Mapping[str, Any] | None = None
    targets: Mapping[str, TargetRun] = field(default_factory=dict)
    sensitivity: SensitivityEntry | None = None
    #: pytest's outcome of each test that checked the pair (nodeid -> passed, failed, xfailed, ...)
    tests: Mapping[str, str] = field(default_factory=dict)

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

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.id,
            "key": self.key,
            "stem": self.stem,
            "fp32": self.fp32,
            "quantized": self.quantized,
            "data": self.data,
            "labels": self.labels,
            "backend": self.backend,
            "scheme": self.scheme,
            "comparison": self.comparison,
            "topk": dict(self.topk),
            "checks": [c.to_dict() for c in self.checks],
        }
        if self.task:
            data["task"] = dict(self.task)
        if self.agreement is not None:
            data["agreement"] = self.agreement
        if self.targets:
            data["targets"] = {name: run.to_dict() for name, run in self.targets.items()}
        if self.sensitivity is not None:
            data["sensitivity"] = self.sensitivity.to_dict()
        if self.tests:
            data["tests"] = dict(self.tests)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PairRecord:
        sensitivity = data.get("sensitivity")
        return cls(
            id=data["id"],
            key=data["key"],
            stem=data["stem"],
            fp32=data["fp32"],
            quantized=data["quantized"],
            data=data["data"],
            labels=data.get("labels"),
            backend=data["backend"],
            scheme=data["scheme"],
            comparison=data["comparison"],
            topk=data.get("topk") or {},
            task=data.get("task") or {},
            checks=tuple(RecordedCheck.from_dict(c) for c in data.get("checks", ())),
            agreement=data.get("agreement"),
            targets={name: TargetRun.from_dict(run) for name, run in (data.get("targets") or {}).items()},
            sensitivity=None if sensitivity is None else SensitivityEntry.from_dict(sensitivity),
            tests=data.get("tests") or {},
        )


@dataclass(frozen=True, slots=True)
class WorkerPayload:
    """What an xdist worker sends the controller: its records, and where it was interrupted."""

    records: Mapping[str, PairRecord]
    interrupted: str | None = None

    def to_wire(self) -> dict[str, Any]:
        """Plain builtins (execnet refuses anything else)."""
        return {
            "records": {key: record.to_dict() for key, record in self.records.items()},
            "interrupted": self.interrupted,
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any] | None) -> WorkerPayload | None:
        """The payload a worker sent, or None when it sent none (it crashed)."""
        if not data:
            return None
        records = {key: PairRecord.from_dict(record) for key, record in (data.get("records") or {}).items()}
        return cls(records=records, interrupted=data.get("interrupted"))
