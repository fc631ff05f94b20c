"""The usual sensitivity analyses of one pair in one call.

:func:`analyse_pair` ranks the nodes, sweeps exclusions towards a target and draws the cumulative
curves, and returns a :class:`SensitivityReport` (what the pytest summary shows for a failing pair).
Its tables and files are in :mod:`pytest_qaccuracy.report.sensitivity_tables`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_qaccuracy.analysis.cumulative import DEFAULT_CONFIGS, CumulativeResult, cumulative_in
from pytest_qaccuracy.analysis.deadline import Deadline, DeadlineReached
from pytest_qaccuracy.analysis.reference_cache import ReferenceCache
from pytest_qaccuracy.analysis.sensitivity import SensitivityResult, open_session, sensitivity_in
from pytest_qaccuracy.analysis.sweep import SweepResult, Target, sweep_in
from pytest_qaccuracy.data import Dataset
from pytest_qaccuracy.errors import ModelError
from pytest_qaccuracy.model.pair import ModelPair
from pytest_qaccuracy.plain import Plain, empty, fields_form, from_plain, none, plain_field
from pytest_qaccuracy.runtime import RuntimeOptions


@dataclass(frozen=True, slots=True)
class SensitivityReport(Plain):
    """The analyses of one pair: ranking, sweep (with a target), cumulative curves.

    ``unsupported`` holds the reason instead of results when the pair cannot be analysed (a QOperator
    model): the caller shows it rather than failing. ``stopped`` says what a deadline cut short
    (``ranking stopped at the budget after 12 of 40 nodes; no sweep; no cumulative curves``), or None.
    """

    stem: str
    sensitivity: SensitivityResult | None = plain_field(None, omit=none)
    sweep: SweepResult | None = plain_field(None, omit=none)
    cumulative: CumulativeResult | None = plain_field(None, omit=none)
    unsupported: str | None = plain_field(None, omit=empty)
    stopped: str | None = plain_field(None, omit=empty)

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": 1, **fields_form(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SensitivityReport:
        """The inverse of :meth:`to_dict` (e.g. a report sent by a pytest-xdist worker)."""
        if data.get("schema_version") != 1 or "stem" not in data:
            raise ValueError("not a sensitivity report (schema_version 1 with a 'stem')")
        return from_plain(cls, data)


def analyse_pair(
    pair: ModelPair,
    data: Dataset | str | os.PathLike[str],
    metrics: str | Sequence[str] = "cosine",
    mode: str = "single",
    target: Target | str | None = None,
    max_excluded: int | None = 10,
    cumulative: bool = True,
    average_mode: bool = False,
    options: RuntimeOptions | None = None,
    records: int | None = None,
    outputs: Sequence[str] | None = None,
    reference: ReferenceCache | None = None,
    deadline: Deadline | None = None,
) -> SensitivityReport:
    """Rank the nodes of a QDQ pair, sweep exclusions towards ``target``, and draw the cumulative curves.

    All analyses share one bound dataset and graph index; ``records`` limits them to the first N
    records (their cost grows with every record and every node); ``outputs`` measures them at these
    fp32 tensors or nodes instead of the model outputs; ``reference`` gives them the fp32 values a
    comparison of the pair computed (:mod:`.reference_cache`). A QOperator pair gives a report whose
    ``unsupported`` says why, instead of raising.

    ``deadline`` (:mod:`.deadline`) bounds the analyses: the ranking keeps the nodes it measured before
    it (:func:`~.sensitivity.measure_until`), the sweep and the curves are left out when it interrupts
    them, and ``stopped`` says so. It raises :class:`~.deadline.DeadlineReached` when the deadline came
    before any node was ranked.
    """
    target = Target.parse(target) if isinstance(target, str) else target
    names = [m.strip() for m in metrics.split(",")] if isinstance(metrics, str) else list(metrics)
    if target is not None and target.metric not in names:
        names.append(target.metric)
    stem = pair.quantized_path.stem
    try:
        session = open_session(pair, data, names, options, records=records, outputs=outputs, reference=reference)
    except ModelError as exc:
        if pair.format != "qdq":
            return SensitivityReport(stem, unsupported=str(exc))
        raise
    try:
        ranking = sensitivity_in(session, mode, deadline=deadline)
        notes = [ranking.stopped] if ranking.stopped else []
        sweep = curves = None
        try:
            sweep = sweep_in(session, ranking, max_excluded, target, deadline) if target is not None else None
        except DeadlineReached:
            notes.append("no sweep")
        try:
            curves = cumulative_in(session, DEFAULT_CONFIGS, average_mode, deadline) if cumulative else None
        except DeadlineReached:
            notes.append("no cumulative curves")
    finally:
        session.close()
    if notes and not ranking.stopped:
        notes.insert(0, "stopped at the budget")
    return SensitivityReport(stem, ranking, sweep, curves, stopped="; ".join(notes) or None)
