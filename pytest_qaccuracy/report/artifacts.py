"""The artifacts of one comparison: comparison JSON, one visq.json and DOT graph per metric, HTML."""

from __future__ import annotations

from pathlib import Path

import onnx

from pytest_qaccuracy.analysis.results import ComparisonResult
from pytest_qaccuracy.report.atomic import atomic_write_json


def artifact_stem(result: ComparisonResult) -> str:
    """File stem of a pair's artifacts: the quantized model's file stem."""
    return Path(result.quantized_model).stem


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
    from pytest_qaccuracy.report.html import write_html
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
        written.append(write_html(out_dir / "report.html", [result]))
    return written
