"""Session artifacts and baselines, written by the controller only, each file atomically.

Layout under the artifacts folder::

    summary.json                       versions, UTC time, per pair: SHA-256s, checks, artifact paths
    pairs/<id>-<hash8>.json            the comparison (contract 2)
    pairs/<id>-<hash8>.<metric>.visq.json   one per metric (contract 3)
    pairs/<id>-<hash8>.dot             the fp32 graph coloured by the pair's error
    pairs/<id>-<hash8>.sensitivity.json, .sweep.json, .cumulative.json, .cumulative.chart.json
                                       the pair's sensitivity analysis (when it was analysed)
    report.html                        all pairs (when the HTML writer is available)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: Metric the DOT graph is coloured by, in order of preference.
DOT_METRICS = ("sqnr", "cosine", "mse")


def write_artifacts(directory: Path, records: Sequence[Mapping[str, Any]], root: Path) -> list[Path]:
    """Write every artifact of ``records`` into ``directory``; returns the paths written."""
    from pytest_qaccuracy.analysis.results import ComparisonResult
    from pytest_qaccuracy.model import load_model
    from pytest_qaccuracy.report.atomic import atomic_write_json
    from pytest_qaccuracy.report.dot import write_dot
    from pytest_qaccuracy.report.summary import summary_document
    from pytest_qaccuracy.report.visq import write_visq

    written: list[Path] = []
    index: dict[str, dict[str, Any]] = {}
    results = []
    for record in records:
        result = ComparisonResult.from_dict(record["comparison"])
        results.append(result)
        base = directory / "pairs" / record["stem"]
        path = atomic_write_json(base.with_name(f"{base.name}.json"), record["comparison"])
        written.append(path)
        entry: dict[str, Any] = {"comparison": _rel(path, directory), "visq": {}}
        for metric in result.metric_names:
            path = base.with_name(f"{base.name}.{metric}.visq.json")
            write_visq(path, result, metric)
            written.append(path)
            entry["visq"][metric] = _rel(path, directory)
        metric = next((m for m in DOT_METRICS if m in result.metric_names), None)
        if metric is not None:
            path = base.with_name(f"{base.name}.dot")
            write_dot(path, load_model(record["fp32"]), result, metric)
            written.append(path)
            entry["dot"] = _rel(path, directory)
        entry.update(_write_sensitivity(record, base.parent, directory))
        index[record["key"]] = entry
    html = _write_html(directory / "report.html", results, records)
    if html is not None:
        written.append(html)
    summary = summary_document(records, root, index)
    if html is not None:
        summary["report"] = _rel(html, directory)
    written.append(atomic_write_json(directory / "summary.json", summary))
    return written


def _write_sensitivity(record: Mapping[str, Any], folder: Path, directory: Path) -> dict[str, str]:
    """The pair's sensitivity files, as ``{"sensitivity": path, "sweep": ..., "cumulative_chart": ...}``."""
    from pytest_qaccuracy.analysis.sensitivity_report import SensitivityReport

    report = (record.get("sensitivity") or {}).get("report")
    if report is None:
        return {}
    stem = record["stem"]
    paths = SensitivityReport.from_dict(report).write(folder, stem)
    return {p.name[len(stem) + 1 : -len(".json")].replace(".", "_"): _rel(p, directory) for p in paths}


def _write_html(path: Path, results: list[Any], records: Sequence[Mapping[str, Any]]) -> Path | None:
    try:
        from pytest_qaccuracy.report.html import write_html
    except ImportError:  # the HTML writer is optional for the plugin
        return None
    from pytest_qaccuracy.report.sensitivity_summary import sensitivity_view
    from pytest_qaccuracy.report.summary import target_view

    views = [sensitivity_view(record) for record in records]
    targets = [target_view(record) for record in records]
    write_html(path, results, sensitivity=views, names=[record["id"] for record in records], targets=targets)
    return path


def _rel(path: Path, directory: Path) -> str:
    return path.relative_to(directory).as_posix()


__all__ = ["write_artifacts"]
