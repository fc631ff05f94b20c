"""The artifacts of one comparison: comparison JSON, one visq.json and DOT graph per metric, HTML."""

from __future__ import annotations

from pathlib import Path

import onnx

from pytest_qaccuracy.analysis.results import ComparisonResult
from pytest_qaccuracy.atomic import atomic_write_json, check_dir_target, check_file_target


def artifact_stem(result: ComparisonResult) -> str:
    """File stem of a pair's artifacts: the quantized model's file stem."""
    return Path(result.quantized_model).stem


def artifact_names(stem: str, metric_names: list[str]) -> list[str]:
    """The files ``write_comparison_artifacts`` writes in ``out_dir``."""
    names = [f"{stem}.comparison.json"]
    for metric in metric_names:
        names += [f"{stem}.{metric}.visq.json", f"{stem}.{metric}.dot"]
    return [*names, "report.html"]


def check_artifact_targets(json_path: Path | None, out_dir: Path | None, stem: str, metric_names: list[str]) -> None:
    """Refuse unwritable output paths before anything runs (``--json``, ``--out-dir``).

    Raises:
        InputError: a path is a directory where a file goes (or the reverse), or cannot be written.
    """
    if json_path is not None:
        check_file_target(json_path, "--json")
    if out_dir is not None:
        check_dir_target(out_dir, "--out-dir", artifact_names(stem, metric_names))


def write_comparison_artifacts(
    result: ComparisonResult,
    fp32_model: onnx.ModelProto,
    json_path: Path | None = None,
    out_dir: Path | None = None,
) -> list[Path]:
    """Write what ``qaccuracy compare`` promises (contract 1); returns the paths written.

    ``json_path`` gets the comparison JSON; ``out_dir`` gets ``<stem>.comparison.json``,
    ``<stem>.<metric>.visq.json`` and ``<stem>.<metric>.dot`` per metric, and ``report.html``.
    """
    from pytest_qaccuracy.report.dot import write_dot
    from pytest_qaccuracy.report.html import ReportPair, write_html
    from pytest_qaccuracy.report.visq import write_visq

    written = []
    if json_path is not None:
        written.append(atomic_write_json(json_path, result.to_dict()))
    if out_dir is not None:
        stem = artifact_stem(result)
        written.append(atomic_write_json(out_dir / f"{stem}.comparison.json", result.to_dict()))
        for metric in result.metric_names:
            written.append(write_visq(out_dir / f"{stem}.{metric}.visq.json", result, metric))
            written.append(write_dot(out_dir / f"{stem}.{metric}.dot", fp32_model, result, metric))
        written.append(write_html(out_dir / "report.html", [ReportPair(result, model=fp32_model)]))
    return written
