"""Session artifacts and baselines, written by the controller only, each file atomically.

Layout under the artifacts folder (a pair's files named as by ``qaccuracy compare``,
:mod:`pytest_qaccuracy.report.artifacts`, with the stem ``<id>-<hash8>``)::

    summary.json                       versions, UTC time, per pair: SHA-256s, checks, artifact paths
    pairs/<id>-<hash8>.comparison.json the comparison (ComparisonResult.to_dict)
    pairs/<id>-<hash8>.<metric>.visq.json   one per metric (Samsung ONE's visq format)
    pairs/<id>-<hash8>.<metric>.dot    the fp32 graph coloured by the first of sqnr, cosine, mse
    pairs/<id>-<hash8>.sensitivity.json, .sweep.json, .cumulative.json, .cumulative.chart.json
                                       the pair's sensitivity analysis (when it was analysed)
    pairs/<id>-<hash8>.recipe.json, .recipe.py, .ranges.json, .recipe.steps.txt
                                       the recipe the analysis found (``qaccuracy recipe``'s files
                                       but the model, which the script writes)
    report.html                        all pairs with verdicts and graphs (``qaccuracy_report`` moves it)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_qaccuracy.report.completeness import SessionStatus

#: The entries of the artifacts folder a session writes; anything else there is the user's.
OWNED = ("summary.json", "report.html", "pairs")


def publish_artifacts(
    directory: Path,
    records: Sequence[Mapping[str, Any]],
    root: Path,
    report: Path | None = None,
    status: SessionStatus | None = None,
) -> list[Path]:
    """:func:`write_artifacts` as one set that replaces ``directory`` in one rename
    (:func:`~pytest_qaccuracy.report.publish.publish_files`); returns the paths as published."""
    from pytest_qaccuracy.report.publish import publish_files

    directory = directory.absolute()
    inside = report is None or report.absolute() == directory / "report.html"
    return publish_files(
        directory, lambda stage: write_artifacts(stage, records, root, None if inside else report, status), OWNED
    )


def write_artifacts(
    directory: Path,
    records: Sequence[Mapping[str, Any]],
    root: Path,
    report: Path | None = None,
    status: SessionStatus | None = None,
) -> list[Path]:
    """Write every artifact of ``records`` into ``directory``, and the HTML report to ``report``
    (default ``directory/report.html``); returns the paths written. ``summary.json`` and the report
    say whether the session is complete (``status``)."""
    from pytest_qaccuracy.analysis.results import ComparisonResult
    from pytest_qaccuracy.atomic import atomic_write_json
    from pytest_qaccuracy.report.artifacts import session_dot_metrics, write_comparison_files
    from pytest_qaccuracy.report.sensitivity_summary import with_recipe_files
    from pytest_qaccuracy.report.summary import summary_document

    written: list[Path] = []
    index: dict[str, dict[str, Any]] = {}
    models = fp32_models(records)
    for record in records:
        result = ComparisonResult.from_dict(record["comparison"])
        dots = session_dot_metrics(result.metric_names)
        files = write_comparison_files(directory / "pairs", record["stem"], result, models[record["fp32"]], dots)
        written += files.paths()
        entry: dict[str, Any] = {
            "comparison": _rel(files.comparison, directory),
            "visq": {metric: _rel(path, directory) for metric, path in files.visq.items()},
        }
        if files.dot:
            entry["dot"] = _rel(next(iter(files.dot.values())), directory)
        entry.update(_write_sensitivity(record, directory / "pairs", directory))
        recipe = _write_recipe(record, directory / "pairs", directory, root)
        if recipe:
            entry["recipe"] = recipe
        index[record["key"]] = entry
    shown = [with_recipe_files(record, index[record["key"]].get("recipe")) for record in records]
    html = write_report(report or directory / "report.html", shown, models, status)
    written.append(html)
    summary = summary_document(shown, root, index, status)
    summary["report"] = _rel(html, directory) if html.is_relative_to(directory) else html.as_posix()
    written.append(atomic_write_json(directory / "summary.json", summary))
    return written


def _write_sensitivity(record: Mapping[str, Any], folder: Path, directory: Path) -> dict[str, str]:
    """The pair's sensitivity files, as ``{"sensitivity": path, "sweep": ..., "cumulative_chart": ...}``."""
    from pytest_qaccuracy.analysis.sensitivity_report import SensitivityReport
    from pytest_qaccuracy.report.sensitivity_tables import write_report

    report = (record.get("sensitivity") or {}).get("report")
    if report is None:
        return {}
    stem = record["stem"]
    paths = write_report(SensitivityReport.from_dict(report), folder, stem)
    return {p.name[len(stem) + 1 : -len(".json")].replace(".", "_"): _rel(p, directory) for p in paths}


def _write_recipe(record: Mapping[str, Any], folder: Path, directory: Path, root: Path) -> dict[str, str]:
    """The files of the recipe the pair's analysis found, as ``{"json": path, "python": ...,
    "ranges": ..., "steps": ...}`` (nothing when none was measured); the script names the pair's
    files relative to the root folder, where it runs."""
    from dataclasses import replace

    from pytest_qaccuracy.analysis.recipe.search import RecipeResult
    from pytest_qaccuracy.report.recipe_tables import recipe_file_names, write_recipe

    data = (record.get("sensitivity") or {}).get("recipe")
    if not data or data.get("best") is None:
        return {}
    ranges = data.get("ranges")
    result = RecipeResult.from_dict(data)
    result = replace(result, ranges=None if ranges is None else {k: (lo, hi) for k, (lo, hi) in ranges.items()})
    stem, head = record["stem"], data.get("calibration_records")
    fp32, data = _shown(record["fp32"], root), _shown(record["data"], root)
    paths = write_recipe(result, folder, fp32, data, stem, head, staged=True)
    names = recipe_file_names(stem, result.arguments, result.ranges is not None)  # the order they are named in
    written = {p.name: _rel(p, directory) for p in paths}
    return {kind: written[name] for kind, name in names.items() if name in written}


def _shown(path: str, root: Path) -> str:
    """``path`` relative to the root folder when it lies inside it."""
    p = Path(path)
    return p.relative_to(root).as_posix() if p.is_absolute() and p.is_relative_to(root) else str(path)


def fp32_models(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Each record's fp32 model, loaded once per file; None for a file that no longer loads."""
    from pytest_qaccuracy.errors import QAccuracyError
    from pytest_qaccuracy.model import load_model

    models: dict[str, Any] = {}
    for path in dict.fromkeys(record["fp32"] for record in records):
        try:
            models[path] = load_model(path)
        except (OSError, QAccuracyError):
            models[path] = None
    return models


def write_report(
    path: Path,
    records: Sequence[Mapping[str, Any]],
    models: Mapping[str, Any] | None = None,
    status: SessionStatus | None = None,
) -> Path:
    """The session's HTML report: every pair with its verdict, checks and coloured graph, and a notice
    when the session is interrupted or incomplete."""
    from pytest_qaccuracy.report.html import ReportPair, write_html

    models = fp32_models(records) if models is None else models
    pairs = [ReportPair.from_record(record, models.get(record["fp32"])) for record in records]
    return write_html(path, pairs, notice=status.headline() if status else None)


def report_path(settings: Any, written: Sequence[Path]) -> Path | None:
    """The HTML report this session wrote (absolute), or None when it wrote none."""
    path = settings.report
    if path is None and settings.artifacts_dir is not None:
        path = settings.artifacts_dir / "report.html"
    return path.resolve() if path is not None and path in written else None


def _rel(path: Path, directory: Path) -> str:
    return path.relative_to(directory).as_posix()
