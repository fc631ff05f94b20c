"""Tables and files for sensitivity results: pure formatters and atomic writers (no recomputation).

* :func:`sensitivity_table`, :func:`sweep_table`, :func:`cumulative_table` return tabulate text;
* :func:`write_sensitivity_artifacts` writes ``<stem>.sensitivity.json``, ``<stem>.sweep.json``,
  ``<stem>.cumulative.json`` and ``<stem>.cumulative.chart.json`` (chart-ready series);
* :func:`analyse_pair` runs the usual analyses of one pair in one call and returns a
  :class:`SensitivityReport` (what the pytest summary shows for a failing pair).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tabulate import tabulate

from pytest_qaccuracy.analysis.cumulative import DEFAULT_CONFIGS, CumulativeResult, cumulative_in
from pytest_qaccuracy.analysis.sensitivity import SensitivityResult, open_session, sensitivity_in
from pytest_qaccuracy.analysis.sweep import SweepResult, Target, sweep_in
from pytest_qaccuracy.data import Dataset
from pytest_qaccuracy.errors import ModelError
from pytest_qaccuracy.model.pair import ModelPair
from pytest_qaccuracy.report.atomic import atomic_write_json
from pytest_qaccuracy.runtime import RuntimeOptions


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.6g}"


def sensitivity_title(result: SensitivityResult) -> str:
    """What was analysed and how it is ranked: the first line of :func:`sensitivity_table`."""
    where = f" measured at {', '.join(result.measured_at)}" if result.measured_at else ""
    return (
        f"{result.mode} sensitivity ({result.granularity}) of {result.quantized_model}{where} on {result.data} "
        f"({result.records} records), ranked by {result.metric_names[0]}"
    )


def sensitivity_table(result: SensitivityResult, top: int | None = None) -> str:
    """Ranked nodes, most sensitive first, one column per metric (tabulate ``simple``)."""
    names = result.metric_names
    nodes = result.ranked()
    shown = nodes if top is None else nodes[:top]
    rows = [[i + 1, n.node, n.op_type, *(_fmt(n.metrics.get(m)) for m in names)] for i, n in enumerate(shown)]
    lines = [sensitivity_title(result), tabulate(rows, headers=["rank", "node", "op_type", *names], tablefmt="simple")]
    if top is not None and len(nodes) > top:
        lines.append(f"... {len(nodes) - top} more node(s)")
    baseline = ", ".join(f"{m} {_fmt(result.baseline.get(m))}" for m in names)
    lines.append(f"fully quantized model: {baseline}")
    return "\n".join(lines)


def sweep_table(result: SweepResult) -> str:
    """One row per step k: the node added to the float list and the output metrics."""
    names = list(result.steps[0].metrics) if result.steps else []
    rows = [
        [s.k, s.excluded[-1] if s.excluded else "(none)", *(_fmt(s.metrics.get(m)) for m in names)]
        for s in result.steps
    ]
    table = tabulate(rows, headers=["k", "kept in float", *names], tablefmt="simple")
    title = f"partial quantization sweep ({result.ranking_mode} ranking by {result.ranking_metric})"
    lines = [title, table]
    if result.target is not None:
        lines.append(f"target {result.target}: {result.nodes_to_exclude()}")
    return "\n".join(lines)


def cumulative_table(result: CumulativeResult) -> str:
    """One row per quantized node, one column per curve."""
    rows = [
        [i, node, op, *(_fmt(c.values[i]) for c in result.curves)]
        for i, (node, op) in enumerate(zip(result.nodes, result.op_types, strict=True))
    ]
    title = f"cumulative {result.metric}{' (average mode)' if result.average_mode else ''} of {result.quantized_model}"
    headers = ["order", "node", "op_type", *(c.label for c in result.curves)]
    return title + "\n" + tabulate(rows, headers=headers, tablefmt="simple")


def write_sensitivity_artifacts(
    stem: str,
    out_dir: Path | None = None,
    json_path: Path | None = None,
    sensitivity: SensitivityResult | None = None,
    sweep: SweepResult | None = None,
    cumulative: CumulativeResult | None = None,
) -> list[Path]:
    """Write the results given; returns the paths written.

    ``json_path`` gets one document ``{"sensitivity": ..., "sweep": ..., "cumulative": ...}`` (keys
    for the results given). ``out_dir`` gets one file per result, plus the cumulative chart data.
    """
    written = []
    parts = {"sensitivity": sensitivity, "sweep": sweep, "cumulative": cumulative}
    present = {k: v.to_dict() for k, v in parts.items() if v is not None}
    if json_path is not None:
        written.append(atomic_write_json(json_path, {"schema_version": 1, **present}))
    if out_dir is not None:
        for key, data in present.items():
            written.append(atomic_write_json(Path(out_dir) / f"{stem}.{key}.json", data))
        if cumulative is not None:
            written.append(atomic_write_json(Path(out_dir) / f"{stem}.cumulative.chart.json", cumulative.chart_data()))
    return written


@dataclass(frozen=True, slots=True)
class SensitivityReport:
    """The analyses of one pair: ranking, sweep (with a target), cumulative curves.

    ``unsupported`` holds the reason instead of results when the pair cannot be analysed (a QOperator
    model): the caller shows it rather than failing.
    """

    stem: str
    sensitivity: SensitivityResult | None = None
    sweep: SweepResult | None = None
    cumulative: CumulativeResult | None = None
    unsupported: str | None = None

    def to_dict(self) -> dict[str, Any]:
        parts = {"sensitivity": self.sensitivity, "sweep": self.sweep, "cumulative": self.cumulative}
        out: dict[str, Any] = {"schema_version": 1, "stem": self.stem}
        out.update({k: v.to_dict() for k, v in parts.items() if v is not None})
        if self.unsupported:
            out["unsupported"] = self.unsupported
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SensitivityReport:
        """The inverse of :meth:`to_dict` (e.g. a report sent by a pytest-xdist worker)."""
        if data.get("schema_version") != 1 or "stem" not in data:
            raise ValueError("not a sensitivity report (schema_version 1 with a 'stem')")
        parts = data.get("sensitivity"), data.get("sweep"), data.get("cumulative")
        return cls(
            data["stem"],
            None if parts[0] is None else SensitivityResult.from_dict(parts[0]),
            None if parts[1] is None else SweepResult.from_dict(parts[1]),
            None if parts[2] is None else CumulativeResult.from_dict(parts[2]),
            data.get("unsupported"),
        )

    def lines(self, top: int = 10) -> list[str]:
        """Terminal lines: the ranked table and the exclusion suggestion (or why there is none)."""
        if self.unsupported:
            return [f"sensitivity of {self.stem}: {self.unsupported}"]
        lines = sensitivity_table(self.sensitivity, top=top).splitlines() if self.sensitivity else []
        if self.sweep is not None and self.sweep.target is not None:
            lines.append(f"target {self.sweep.target}: {self.sweep.nodes_to_exclude()}")
        return lines

    def write(self, out_dir: Path, stem: str | None = None) -> list[Path]:
        """``<stem>.sensitivity.json``, ``.sweep.json``, ``.cumulative.json``, ``.cumulative.chart.json``
        (``stem`` defaults to the report's own)."""
        return write_sensitivity_artifacts(
            stem or self.stem, out_dir, sensitivity=self.sensitivity, sweep=self.sweep, cumulative=self.cumulative
        )


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
) -> SensitivityReport:
    """Rank the nodes of a QDQ pair, sweep exclusions towards ``target``, and draw the cumulative curves.

    All analyses share one bound dataset and graph index; ``records`` limits them to the first N
    records (their cost grows with every record and every node); ``outputs`` measures them at these
    fp32 tensors or nodes instead of the model outputs. A QOperator pair gives a report whose
    ``unsupported`` says why, instead of raising.
    """
    target = Target.parse(target) if isinstance(target, str) else target
    names = [m.strip() for m in metrics.split(",")] if isinstance(metrics, str) else list(metrics)
    if target is not None and target.metric not in names:
        names.append(target.metric)
    stem = pair.quantized_path.stem
    try:
        session = open_session(pair, data, names, options, records=records, outputs=outputs)
    except ModelError as exc:
        if pair.format != "qdq":
            return SensitivityReport(stem, unsupported=str(exc))
        raise
    try:
        ranking = sensitivity_in(session, mode)
        sweep = sweep_in(session, ranking, max_excluded, target) if target is not None else None
        curves = cumulative_in(session, DEFAULT_CONFIGS, average_mode) if cumulative else None
    finally:
        session.close()
    return SensitivityReport(stem, ranking, sweep, curves)


__all__ = [
    "SensitivityReport",
    "analyse_pair",
    "cumulative_table",
    "sensitivity_table",
    "sensitivity_title",
    "sweep_table",
    "write_sensitivity_artifacts",
]
