"""A check's outcome as one typed record, from the check to the terminal, JSON, JUnit and HTML. Pure.

An :class:`Outcome` says what was checked (``kind``, ``check``), on what (``scope`` and ``subject``:
an output, a layer, a task value, the model), where it ran (``deployment``: a deployment target's
preset, or None for the pair's own run), the measured ``value``, the bound it was held to (``op``
and ``threshold``, or ``params`` for a check with several numbers), the tolerance's ``source`` and
the verdict (``passed``). ``detail`` is the one sentence written for people from those fields; no
reader parses it back. Writers read the fields, never the text.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_qaccuracy.plain import Plain, plain_field

#: What a check is: a named tolerance, a rule line, a task-metric bound, baseline drift, the
#: saturation share, the integer backend's agreement gate, or an error that stopped the check.
KINDS = ("tolerance", "rule", "task", "drift", "saturation", "gate", "error")
#: What a check is about.
SCOPES = ("output", "layer", "task", "model")


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome(Plain):
    """One check applied to one subject: the typed record every writer reads. Its builtins form is its
    fields in this order, with ``target`` after ``deployment`` (the key readers of 0.1's ``summary.json``
    know)."""

    kind: str
    check: str
    scope: str
    subject: str
    deployment: str | None = plain_field(None, then=("target",))
    metric: str
    op: str
    threshold: float | None
    value: float | None
    #: the numbers of a check with several (``rtol``/``atol``): name -> value
    params: Mapping[str, float] = field(default_factory=dict)
    #: the model output an output check is about (``subject`` shows it as ``output 'y'``), else None
    output: str | None = None
    #: the rank of a top-k check (``top-3 accuracy drop``, ``top-1 agreement``), else None
    k: int | None = None
    passed: bool
    source: str
    detail: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"outcome kind {self.kind!r}: expected one of {', '.join(KINDS)}")
        if self.scope not in SCOPES:
            raise ValueError(f"outcome scope {self.scope!r}: expected one of {', '.join(SCOPES)}")

    @property
    def target(self) -> str:
        """The subject and, on a deployment target, where it ran (the JSON's ``target`` key)."""
        return self.subject if self.deployment is None else f"{self.subject} on {self.deployment}"

    @property
    def excess(self) -> float:
        """How far a failed check is beyond its bound, relative to the bound (0 for a pass, inf for a
        failure without a value): the order of "worst first"."""
        if self.passed:
            return 0.0
        if self.value is None or self.threshold is None or self.op not in ("<=", "<", ">=", ">"):
            return math.inf
        gap = self.value - self.threshold if self.op in ("<=", "<") else self.threshold - self.value
        return max(gap, 0.0) / max(abs(self.threshold), 1e-12)


#: pytest's outcome of a test that passed though marked ``xfail(strict=True)`` (pytest fails it).
XPASS_STRICT = "xpassed-strict"
#: A pair's status: every check passed, one failed, every failure was expected (pytest reported the
#: test as xfailed), or nothing was checked.
STATUSES = ("passed", "failed", "xfailed", "unchecked")


def pair_status(checks: Iterable[Mapping[str, Any]], tests: Mapping[str, str] | None = None) -> tuple[str, str | None]:
    """The one definition of a pair's verdict, from its checks (``passed``, ``xfail``: the reason
    when pytest reported the test as xfailed) and pytest's outcome of each test that checked it.

    Returns ``(status, reason)``: ``xfailed`` with the xfail reason when every failed check was in a
    test pytest reported as xfailed; ``failed`` when any other check failed, or when a test passed
    though marked ``xfail(strict=True)`` (pytest fails it, so does the pair; the reason says so).
    """
    checks = list(checks)
    if not checks:
        return "unchecked", None
    failed = [c for c in checks if not c["passed"]]
    if failed:
        reasons = {c.get("xfail") for c in failed}
        return ("failed", None) if None in reasons else ("xfailed", next(iter(reasons)))
    strict = sorted(test for test, outcome in (tests or {}).items() if outcome == XPASS_STRICT)
    if strict:
        return "failed", f"passed, but {strict[0]} is marked xfail(strict=True)"
    return "passed", None


def worst_first(outcomes: list[Outcome]) -> list[Outcome]:
    """Failed outcomes before passed ones, the farthest beyond its bound first (stable otherwise)."""
    return sorted(outcomes, key=lambda o: (o.passed, -o.excess))
