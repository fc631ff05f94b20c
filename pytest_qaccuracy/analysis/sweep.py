"""Partial-quantization sweep and suggested exclusion list.

The sweep keeps the k most sensitive nodes in float, for k = 0..K, and measures the outputs after
each step (Horizon's ``sensitivity_analysis``, red curve). The suggested exclusion list is the
shortest prefix of the ranking whose outputs meet a target (e.g. cosine >= 0.999): greedy in the
ranking's order, so it is the smallest list *found*, not a proven minimum.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_qaccuracy.analysis.deadline import Deadline
from pytest_qaccuracy.analysis.experiments import Experiment, OutputMetrics
from pytest_qaccuracy.analysis.results import _metrics_dict
from pytest_qaccuracy.analysis.sensitivity import (
    SCHEMA_VERSION,
    SensitivityResult,
    Session,
    _mean,
    checked,
    outputs_dict,
)
from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.metrics import get_metric
from pytest_qaccuracy.plain import Plain, fields_form, from_plain, plain_field


def _number(text: str) -> float | None:
    """``text`` as a float, or None when it is not one."""
    try:
        return float(text)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class Target:
    """``metric >= value`` for metrics where higher is better, ``metric <= value`` otherwise."""

    metric: str
    value: float

    @property
    def higher_is_better(self) -> bool:
        return get_metric(self.metric).higher_is_better

    def met(self, value: float | None) -> bool:
        if value is None:
            return False
        return value >= self.value if self.higher_is_better else value <= self.value

    def __str__(self) -> str:
        return f"{self.metric} {'>=' if self.higher_is_better else '<='} {self.value:g}"

    @classmethod
    def parse(cls, text: str) -> Target:
        """``"cosine>=0.999"``, ``"mse<=1e-4"`` or ``"cosine=0.999"`` (direction from the metric)."""
        match = re.fullmatch(r"\s*([a-z_0-9]+)\s*(>=|<=|=)\s*([-+0-9.eE]+)\s*", text or "")
        value = _number(match.group(3)) if match else None  # "1e" or "--" has the characters of a number
        if match is None or value is None:
            raise InputError(f"target {text!r}: expected METRIC>=VALUE or METRIC<=VALUE, e.g. cosine>=0.999")
        target = cls(match.group(1), value)
        op = match.group(2)
        if op != "=" and (op == ">=") != target.higher_is_better:
            better = "higher" if target.higher_is_better else "lower"
            raise InputError(f"target {text!r}: {target.metric} is better when {better}; write {target}")
        return target


@dataclass(frozen=True, slots=True)
class SweepStep(Plain):
    """The outputs with the ``excluded`` nodes in float (``metrics``: mean over outputs)."""

    k: int
    excluded: list[str]
    metrics: Mapping[str, float | None] = plain_field(dump=_metrics_dict)
    outputs: Mapping[str, Mapping[str, float | None]] = plain_field(default_factory=dict, dump=outputs_dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepResult(Plain):
    """A sweep over the ranking of ``ranking_mode`` sensitivity, and the suggestion for a target."""

    fp32_model: str
    quantized_model: str
    data: str
    records: int
    ranking_mode: str
    ranking_metric: str
    target: Target | None = None
    suggestion: list[str] | None = None
    steps: list[SweepStep]

    def nodes_to_exclude(self) -> str:
        """The suggestion as onnxruntime's ``quantize_static`` argument, or a sentence why there is none."""
        if self.target is None:
            return "no target given"
        if self.suggestion is None:
            best = self.steps[-1].metrics.get(self.target.metric) if self.steps else None
            return f"no exclusion list up to {len(self.steps) - 1} node(s) meets {self.target} (best: {best})"
        return f"nodes_to_exclude={self.suggestion!r}"

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "kind": "sweep", **fields_form(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SweepResult:
        return from_plain(cls, checked(data, "sweep"))


def sweep_in(
    session: Session,
    ranking: SensitivityResult,
    max_excluded: int | None = 10,
    target: Target | None = None,
    deadline: Deadline | None = None,
) -> SweepResult:
    """Keep the k most sensitive nodes of ``ranking`` in float for k = 0..``max_excluded``.

    All steps run in one pass over the data (cache: the fully quantized model); a ``deadline`` that
    passes during it raises :class:`~.deadline.DeadlineReached`.
    """
    if target is not None and target.metric not in session.metrics:
        raise InputError(f"target metric {target.metric!r} is not among the measured metrics {session.metrics}")
    order = [n.node for n in ranking.ranked()]
    limit = len(order) if max_excluded is None else min(max_excluded, len(order))
    if limit < 0:
        raise InputError(f"max_excluded must be >= 0, got {max_excluded}")
    qg = session.qgraph
    experiments = [Experiment(f"k={k}", qg.all_edges - qg.edges_of(order[:k], "node")) for k in range(limit + 1)]
    results: list[OutputMetrics] = session.runner.run(experiments, "quantized", deadline)
    steps = [SweepStep(k, order[:k], _mean(r, session.metrics), r) for k, r in enumerate(results)]
    suggestion = None
    if target is not None:
        suggestion = next((s.excluded for s in steps if target.met(s.metrics.get(target.metric))), None)
    pair = session.pair
    return SweepResult(
        fp32_model=pair.fp32_path.name,
        quantized_model=pair.quantized_path.name,
        data=session.dataset.name,
        records=session.records,
        ranking_mode=ranking.mode,
        ranking_metric=ranking.metric_names[0],
        target=target,
        suggestion=suggestion,
        steps=steps,
    )
