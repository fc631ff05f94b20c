"""What a recipe must meet: any output check the plugin has, as ``--target`` text.

Kinds (a registry: each parses its own names):

- **tensor**: a registered output metric, ``cosine>=0.99``, ``sqnr>=20``, ``mse<=1e-4``: every
  float output;
- **allclose**: ``rtol<=0.01`` and ``atol<=0.001`` (one check together): the share of output elements
  outside ``atol + rtol * |fp32|`` must be 0, as the plugin's ``rtol``/``atol``;
- **topk**: ``max_top1_drop<=0.01`` (top-k accuracy drop against the data's labels),
  ``min_top1_agreement>=0.99`` (top-1 of fp32 among the quantized top-k), ``top5`` for k = 5; every
  output of class scores;
- **task**: ``max_drop:cer<=0.01``, ``min:exact_match>=0.9``, ``max:cer<=0.05``: a value of a task
  metric (:mod:`pytest_qaccuracy.metrics.task`) named with the search, the plugin's tolerance syntax.

``measured`` values are keyed by output, then by :attr:`Check.metric`; a check holds on every output
that has its value, or on one output only (:attr:`Check.output`: an output, or a named view of one,
:attr:`Check.view`). A margin is the relative distance to the bound, floored by :attr:`Check.scale`
for bounds at 0 (a share of elements, a drop). ``>`` and ``<`` exclude the bound (:attr:`Check.strict`),
as the plugin's rules with those operators do.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.task_names import TASK_KINDS, task_tolerance

_TEXT = re.compile(r"\s*([a-z_0-9:]+)\s*(>=|<=|>|<|=)\s*([-+0-9.eE]+|inf)\s*")
_TOPK = re.compile(r"^(?:max_top(?P<drop>\d+)_drop|min_top(?P<agree>\d+)_agreement)$")


#: (higher is better, strict) -> the bound's operator
_OPS = {(True, False): ">=", (False, False): "<=", (True, True): ">", (False, True): "<"}


@dataclass(frozen=True, slots=True)
class Check:
    """``metric`` (the key of its measured value) against ``value``, in the metric's direction.

    ``kind`` is one of :data:`KINDS`; ``k`` the top-k rank, ``rtol``/``atol`` the allclose bounds;
    ``strict``: the bound itself fails (``>``, ``<``); ``output``: the one output (or named view) it
    holds on, None for every output that has its value; ``view``: the view's text
    (``output0[:, 4:]``) when ``output`` names a view (tensor checks only).
    """

    metric: str
    value: float
    higher_is_better: bool
    kind: str = "tensor"
    scale: float = 1e-12
    k: int = 1
    rtol: float = 0.0
    atol: float = 0.0
    strict: bool = False
    output: str | None = None
    view: str | None = None

    def met(self, value: float | None) -> bool:
        if value is None:
            return False
        if self.strict:
            return value > self.value if self.higher_is_better else value < self.value
        return value >= self.value if self.higher_is_better else value <= self.value

    @property
    def op(self) -> str:
        """The bound's operator: ``>=``, ``<=``, or ``>``/``<`` when strict."""
        return _OPS[self.higher_is_better, self.strict]

    def __str__(self) -> str:
        text = f"{self.metric} {self.op} {_exact(self.value)}"
        if self.kind == "allclose":
            text += f" (rtol={_exact(self.rtol)}, atol={_exact(self.atol)})"
        return text if self.output is None else f"{text} on '{self.output}'"

    @property
    def task_value(self) -> str | None:
        """The task-metric value name a task check reads (``cer`` of ``max_drop:cer``)."""
        found = task_tolerance(self.metric) if self.kind == "task" else None
        return None if found is None else found[1]


def _tensor(name: str, value: float) -> Check | None:
    from pytest_qaccuracy.metrics import get_metric

    try:
        metric = get_metric(name)
    except Exception:
        return None
    lo, hi = (-1.0, 1.0) if name == "cosine" else (-math.inf, math.inf)
    if not metric.higher_is_better:
        lo = 0.0  # every lower-is-better metric is an error: never below 0
    _within(name, value, lo, hi)
    return Check(name, value, metric.higher_is_better)


def _allclose(name: str, value: float) -> Check | None:
    if name not in ("rtol", "atol"):
        return None
    _within(name, value, 0.0, math.inf)
    return Check("allclose", 0.0, False, "allclose", 1.0, **{name: value})


def _topk(name: str, value: float) -> Check | None:
    match = _TOPK.match(name)
    if match is None:
        return None
    k = int(match["drop"] or match["agree"])
    if k < 1:
        raise InputError("k must be >= 1")
    if match["drop"]:
        _within(name, value, -1.0, 1.0)
        return Check(name, value, False, "topk", 0.01, k)
    _within(name, value, 0.0, 1.0)
    return Check(name, value, True, "topk", 0.01, k)


def _task(name: str, value: float) -> Check | None:
    found = task_tolerance(name)
    if found is None:
        return None
    op = TASK_KINDS[found[0]][0]
    return Check(name, value, op == ">=", "task", 0.01)


#: kind -> parser of a target's name and bound (None: not this kind's name).
KINDS: dict[str, Callable[[str, float], Check | None]] = {
    "task": _task,
    "topk": _topk,
    "allclose": _allclose,
    "tensor": _tensor,
}


def _exact(value: float) -> str:
    """A bound as the user wrote it: the shortest text that reads back as the same float (``0.9999999``
    stays itself where ``%g`` shows ``1``), without a trailing ``.0``."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def _within(name: str, value: float, lo: float, hi: float) -> None:
    if not math.isfinite(value):
        raise InputError(f"expected a finite bound, got {value!r}")
    if not lo <= value <= hi:
        raise InputError(f"no model can meet it ({name} lies in [{lo:g}, {hi:g}])")


def parse_check(text: str) -> Check:
    """One target: ``cosine>=0.99``, ``rtol<=0.01``, ``max_top1_drop<=0.01``, ``max_drop:cer<=0.01``
    (``>`` and ``<`` exclude the bound); InputError for a malformed, unknown, wrongly directed or impossible one."""
    match = _TEXT.fullmatch(text or "")
    if not match:
        raise InputError(f"target {text!r}: expected METRIC>=VALUE or METRIC<=VALUE, e.g. cosine>=0.99")
    name, op, number = match.group(1), match.group(2), float(match.group(3))
    try:
        check = next((c for c in (parse(name, number) for parse in KINDS.values()) if c is not None), None)
    except InputError as exc:
        raise InputError(f"target {text!r}: {exc}") from None
    if check is None:
        from pytest_qaccuracy.metrics import available_metrics

        known = ", ".join(available_metrics())
        raise InputError(
            f"target {text!r}: unknown check {name!r}; expected a metric ({known}), rtol, atol, "
            "max_top<k>_drop, min_top<k>_agreement or a task value (min:, max:, max_drop:<value>)"
        )
    if op != "=" and op.startswith(">") != check.higher_is_better:
        better = "higher" if check.higher_is_better else "lower"
        raise InputError(
            f"target {text!r}: {name} is better when {better}; write {name}{'>=' if better == 'higher' else '<='}"
        )
    # an allclose bound is the element-wise formula's: its share of elements outside is 0 either way
    return replace(check, strict=True) if op in (">", "<") and check.kind != "allclose" else check


def parse_checks(texts: Sequence[str | Check]) -> list[Check]:
    """Every target (:func:`parse_check`; checks and ``Target`` objects pass through as checks), the
    ``rtol`` and ``atol`` targets folded into one allclose check; InputError when there is none."""
    checks: list[Check] = []
    for text in texts:
        if isinstance(text, Check):
            checks.append(text)
        elif isinstance(text, str):
            checks.append(parse_check(text))
        else:  # an analysis.sweep.Target: a tensor metric
            checks.append(Check(text.metric, float(text.value), bool(text.higher_is_better)))
    close = [c for c in checks if c.kind == "allclose"]
    if len(close) > 1:
        merged = Check(
            "allclose", 0.0, False, "allclose", 1.0, rtol=max(c.rtol for c in close), atol=max(c.atol for c in close)
        )
        checks = [c for c in checks if c.kind != "allclose"] + [merged]
    if not checks:
        raise InputError("give at least one target, e.g. cosine>=0.99")
    return checks
