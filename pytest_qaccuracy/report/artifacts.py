"""The files of one comparison, named one way for ``qaccuracy compare --out-dir`` and a pytest session.

Every file of a comparison starts with its stem (:func:`artifact_stem`) and sits in one folder::

    <stem>.comparison.json          the comparison (ComparisonResult.to_dict)
    <stem>.<metric>.visq.json       one per metric (Samsung ONE's visq format)
    <stem>.<metric>.dot             the fp32 graph coloured by that metric

:func:`write_comparison_files` writes them. The command line asks for a DOT graph per metric; a pytest
session draws one per pair, coloured by the metric its HTML report draws the graph with (the first of
sqnr, cosine and mse it measured; :func:`session_dot_metrics`): a session republishes every pair's
files at each run, and a DOT graph is the size of the whole fp32 graph. A pair's sensitivity files
follow the same scheme (``<stem>.sensitivity.json``, ...; :mod:`.sensitivity_tables`).

Only the standard library is imported at module level: the pytest plugin imports :func:`artifact_stem`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx

    from pytest_qaccuracy.analysis.results import ComparisonResult

#: Longest part of a stem taken from a pair id.
_ID_CHARS = 60


def artifact_stem(name: str, key: str | None = None) -> str:
    """The stem every file of one comparison starts with.

    ``qaccuracy compare`` writes one comparison per folder and passes the quantized model's file stem
    as ``name``, used as it is. A pytest session writes every pair into one folder, so it passes the
    pair id and the pair's ``key``: the id made file-name safe (at most 60 characters) plus 8 hex
    digits of the key's SHA-256, so two pairs never collide.
    """
    if key is None:
        return name
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._")[:_ID_CHARS] or "pair"
    return f"{safe}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"


def comparison_name(stem: str) -> str:
    """File name of the comparison JSON."""
    return f"{stem}.comparison.json"


def visq_name(stem: str, metric: str) -> str:
    """File name of one metric's visq.json."""
    return f"{stem}.{metric}.visq.json"


def dot_name(stem: str, metric: str) -> str:
    """File name of the DOT graph coloured by ``metric``."""
    return f"{stem}.{metric}.dot"


def session_dot_metrics(metric_names: Sequence[str]) -> list[str]:
    """The metric a pytest session draws its DOT graph with: the first of the HTML report's graph
    metrics that was measured (none when none was)."""
    from pytest_qaccuracy.report.summary import FIRST_METRICS

    return [m for m in FIRST_METRICS if m in metric_names][:1]


@dataclass(frozen=True, slots=True)
class ComparisonFiles:
    """The files :func:`write_comparison_files` wrote: the comparison, and by metric visq.json and DOT."""

    comparison: Path
    visq: dict[str, Path]
    dot: dict[str, Path]

    def paths(self) -> list[Path]:
        """Every file, the comparison first, then each metric's visq.json and DOT graph."""
        by_metric = [p for metric in self.visq for p in (self.visq[metric], self.dot.get(metric)) if p is not None]
        return [self.comparison, *by_metric]


def write_comparison_files(
    folder: Path,
    stem: str,
    result: ComparisonResult,
    fp32_model: onnx.ModelProto | None,
    dot_metrics: Sequence[str] | None = None,
) -> ComparisonFiles:
    """Write ``result``'s comparison JSON, a visq.json per metric and DOT graphs into ``folder``.

    Args:
        folder: where the files go (created if missing).
        stem: from :func:`artifact_stem`.
        result: the comparison.
        fp32_model: the fp32 model the DOT graphs draw, loaded once by the caller; None writes no
            DOT graph (a model file that no longer loads).
        dot_metrics: the metrics that get a DOT graph (default: every metric of ``result``).
    """
    from pytest_qaccuracy.atomic import atomic_write_json
    from pytest_qaccuracy.report.dot import write_dot
    from pytest_qaccuracy.report.visq import write_visq

    dot_metrics = result.metric_names if dot_metrics is None else dot_metrics
    comparison = atomic_write_json(folder / comparison_name(stem), result.to_dict())
    visq: dict[str, Path] = {}
    dot: dict[str, Path] = {}
    for metric in result.metric_names:
        visq[metric] = write_visq(folder / visq_name(stem, metric), result, metric)
        if fp32_model is not None and metric in dot_metrics:
            dot[metric] = write_dot(folder / dot_name(stem, metric), fp32_model, result, metric)
    return ComparisonFiles(comparison, visq, dot)


def artifact_names(stem: str, metric_names: list[str]) -> list[str]:
    """The files ``qaccuracy compare --out-dir`` writes there (:func:`write_comparison_artifacts`)."""
    per_metric = [name for m in metric_names for name in (visq_name(stem, m), dot_name(stem, m))]
    return [comparison_name(stem), *per_metric, "report.html"]


def check_artifact_targets(json_path: Path | None, out_dir: Path | None, stem: str, metric_names: list[str]) -> None:
    """Refuse unwritable output paths before anything runs (``--json``, ``--out-dir``).

    Raises:
        InputError: a path is a directory where a file goes (or the reverse), or cannot be written.
    """
    from pytest_qaccuracy.atomic import check_file_target
    from pytest_qaccuracy.report.publish import check_out_dir

    if json_path is not None:
        check_file_target(json_path, "--json")
    if out_dir is not None:
        check_out_dir(out_dir, "--out-dir", artifact_names(stem, metric_names))


def write_comparison_artifacts(
    result: ComparisonResult,
    fp32_model: onnx.ModelProto,
    json_path: Path | None = None,
    out_dir: Path | None = None,
    checks: Sequence[Mapping[str, Any]] | None = None,
) -> list[Path]:
    """Write what ``qaccuracy compare`` promises (``--json`` and ``--out-dir``); returns the paths written.

    ``checks`` (outcomes as ``Outcome.to_dict()``, when tolerances were asked for) go into the JSON
    (``checks`` and ``passed`` beside the comparison) and give the report its verdict.
    ``json_path`` gets the comparison JSON; ``out_dir`` gets :func:`write_comparison_files` with a DOT
    graph per metric, stem the quantized model's file stem, and ``report.html``, published as one set
    as a pytest session's folder is (:func:`~pytest_qaccuracy.report.publish.publish_files`): a full
    disk or Ctrl-C leaves the folder as it was.

    Raises:
        InputError: a write failed (naming ``--json`` or ``--out-dir``); nothing there changed.
    """
    from pytest_qaccuracy.atomic import atomic_write_json, write_errors
    from pytest_qaccuracy.report.html import ReportPair, write_html
    from pytest_qaccuracy.report.publish import publish_files

    written = []
    if out_dir is not None:
        stem = artifact_stem(Path(result.quantized_model).stem)

        def build(stage: Path) -> list[Path]:
            files = write_comparison_files(stage, stem, result, fp32_model).paths()
            record = None if checks is None else {"id": None, "checks": list(checks)}
            report = ReportPair(result, record=record, model=fp32_model)
            return [*files, write_html(stage / "report.html", [report])]

        with write_errors("--out-dir", out_dir):
            written += publish_files(out_dir, build, artifact_names(stem, result.metric_names))
    if json_path is not None:
        with write_errors("--json", json_path):
            verdict = {} if checks is None else {"passed": all(c["passed"] for c in checks), "checks": list(checks)}
            written.append(atomic_write_json(json_path, {**result.to_dict(), **verdict}))
    return written
