"""Samsung ONE's ``*.visq.json``: one metric's error per fp32 tensor, with a 9-colour scale.

Differences from ONE's own writer, all readable by ONE's consumers (ONE-vscode, circle-mpqsolver):

* values keep full float precision (ONE rounds to 4 decimals, which turns small MSEs into 0.0);
* a result whose values are all equal (or all zero) gets a widened, valid scale instead of a crash;
* higher-is-better metrics (cosine, SQNR) list their slots in ascending order with the colours
  reversed, so the lowest values are dark red;
* values that are None, NaN or Inf are left out of ``error`` (every number in the file is finite).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pytest_qaccuracy.analysis.results import ComparisonResult
from pytest_qaccuracy.atomic import atomic_write_json
from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.report._palette import error_map, metric_names, metric_slots


def visq_document(
    result: ComparisonResult, metric: str, model_name: str | None = None, title: str | None = None
) -> dict[str, Any]:
    """The visq.json document of one metric.

    Args:
        result: the comparison.
        metric: a metric of the result (lower case); written upper-case in ``meta.metric``.
        model_name: ``meta.model``; default the fp32 model's file name.
        title: optional ``meta.title`` (ONE-vscode shows it).

    Returns:
        ``{"meta": {"model", "metric", ["title"], "colorscheme"}, "error": [{tensor: value}]}``;
        ``error`` holds every layer plus each output that is not also a layer.

    Raises:
        InputError: ``metric`` is not one of the result's metrics.
    """
    if metric not in metric_names(result):
        names = ", ".join(metric_names(result)) or "none"
        raise InputError(f"no metric {metric!r} in the comparison of {result.quantized_model}; it has {names}")
    errors = error_map(result, metric)
    meta: dict[str, Any] = {
        "model": model_name if model_name is not None else Path(result.fp32_model).name,
        "metric": metric.upper(),
    }
    if title is not None:
        meta["title"] = title
    meta["colorscheme"] = [{"b": s.begin, "e": s.end, "c": s.color} for s in metric_slots(result, metric, errors)]
    return {"meta": meta, "error": [errors]}


def write_visq(
    path: str | os.PathLike[str],
    result: ComparisonResult,
    metric: str,
    model_name: str | None = None,
    title: str | None = None,
) -> Path:
    """Write :func:`visq_document` to ``path`` atomically; returns the path."""
    return atomic_write_json(path, visq_document(result, metric, model_name=model_name, title=title))
