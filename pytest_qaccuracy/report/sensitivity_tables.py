"""Tables and files for sensitivity results: pure formatters and atomic writers (no recomputation).

* :func:`sensitivity_table`, :func:`sweep_table`, :func:`cumulative_table` return tabulate text;
* :func:`write_sensitivity_artifacts` writes ``<stem>.sensitivity.json``, ``<stem>.sweep.json``,
  ``<stem>.cumulative.json`` and ``<stem>.cumulative.chart.json`` (chart-ready series);
* :func:`report_lines` and :func:`write_report` do the same for one
  :class:`~pytest_qaccuracy.analysis.sensitivity_report.SensitivityReport`.
"""

from __future__ import annotations

from pathlib import Path

from tabulate import tabulate

from pytest_qaccuracy import defaults
from pytest_qaccuracy.analysis.cumulative import CumulativeResult
from pytest_qaccuracy.analysis.sensitivity import SensitivityResult
from pytest_qaccuracy.analysis.sensitivity_report import SensitivityReport
from pytest_qaccuracy.analysis.sweep import SweepResult
from pytest_qaccuracy.atomic import atomic_write_json
from pytest_qaccuracy.numbers import format_number


def _fmt(value: float | None) -> str:
    """A number in a sensitivity table; a missing one as ``n/a``."""
    return format_number(value, missing="n/a")


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
    for the results given). ``out_dir`` gets one file per result, plus the cumulative chart data,
    published as one set (:func:`~pytest_qaccuracy.report.publish.publish_files`).

    Raises:
        InputError: a write failed (naming ``--json`` or ``--out-dir``); nothing there changed.
    """
    from pytest_qaccuracy.atomic import write_errors
    from pytest_qaccuracy.report.publish import publish_files

    written = []
    parts = {"sensitivity": sensitivity, "sweep": sweep, "cumulative": cumulative}
    present = {k: v.to_dict() for k, v in parts.items() if v is not None}
    files = {f"{stem}.{key}.json": data for key, data in present.items()}
    if cumulative is not None:
        files[f"{stem}.cumulative.chart.json"] = cumulative.chart_data()
    if out_dir is not None:
        with write_errors("--out-dir", out_dir):
            written += publish_files(
                Path(out_dir), lambda stage: [atomic_write_json(stage / n, d) for n, d in files.items()], files
            )
    if json_path is not None:
        with write_errors("--json", json_path):
            written.append(atomic_write_json(json_path, {"schema_version": 1, **present}))
    return written


def report_lines(report: SensitivityReport, top: int = defaults.TOP) -> list[str]:
    """Terminal lines: the ranked table and the exclusion suggestion (or why there is none)."""
    if report.unsupported:
        return [f"sensitivity of {report.stem}: {report.unsupported}"]
    lines = sensitivity_table(report.sensitivity, top=top).splitlines() if report.sensitivity else []
    if report.sweep is not None and report.sweep.target is not None:
        lines.append(f"target {report.sweep.target}: {report.sweep.nodes_to_exclude()}")
    return lines


def write_report(report: SensitivityReport, out_dir: Path, stem: str | None = None) -> list[Path]:
    """``<stem>.sensitivity.json``, ``.sweep.json``, ``.cumulative.json``, ``.cumulative.chart.json``
    (``stem`` defaults to the report's own)."""
    return write_sensitivity_artifacts(
        stem or report.stem, out_dir, sensitivity=report.sensitivity, sweep=report.sweep, cumulative=report.cumulative
    )
