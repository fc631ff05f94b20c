"""One self-contained HTML report for any number of comparisons: inline CSS and JS, no network access.

The data is the results' contract-2 JSON plus, per metric, its direction and visq colour slots,
embedded as a ``<script type="application/json">`` block that the inline script renders.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_qaccuracy.analysis.results import ComparisonResult
from pytest_qaccuracy.report._html_assets import CSS, JS
from pytest_qaccuracy.report._palette import FIXED_RANGES, ZERO_BASED, higher_is_better, metric_names, metric_slots
from pytest_qaccuracy.report.atomic import atomic_write_text, finite_json

DEFAULT_TITLE = "Quantization accuracy report"

#: Characters that must not appear literally inside ``<script>``: ``</script>``, ``<!--`` and the JS
#: line terminators U+2028/U+2029 (escaped anyway by ``ensure_ascii``).
_SCRIPT_ESCAPES = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026"}


def _scale(metric: str, higher_better: bool) -> str:
    if metric in FIXED_RANGES:
        lo, hi = FIXED_RANGES[metric]
        return f"fixed {lo:g}..{hi:g}"
    base = "0..max of the values" if metric in ZERO_BASED else "min..max of the values"
    return base + (" (dark red = lowest)" if higher_better else "")


def pair_data(result: ComparisonResult) -> dict[str, Any]:
    """The embedded data of one comparison: its contract-2 dict plus ``title`` and ``metrics``.

    ``metrics`` lists ``{name, label, definition, higher_is_better, scale, slots}`` per metric, where
    ``slots`` are ``[begin, end, colour]`` exactly as in the metric's visq.json. Layers are sorted by
    topological order.
    """
    data = result.to_dict()
    data["layers"] = sorted(data["layers"], key=lambda layer: layer["order"])
    data["title"] = f"{Path(result.quantized_model).name} vs {Path(result.fp32_model).name}"
    data["metrics"] = []
    for name in metric_names(result):
        better = higher_is_better(result, name)
        data["metrics"].append(
            {
                "name": name,
                "label": name.upper(),
                "definition": result.metric_definitions.get(name, ""),
                "higher_is_better": better,
                "scale": _scale(name, better),
                "slots": [[s.begin, s.end, s.color] for s in metric_slots(result, name)],
            }
        )
    return finite_json(data)


def embed_json(data: Any) -> str:
    """Strict JSON that is safe inside ``<script>``: no NaN/Inf, no ``<``, ``>`` or ``&`` characters."""
    return json.dumps(data, allow_nan=False, ensure_ascii=True, separators=(",", ":")).translate(_SCRIPT_ESCAPES)


def render_html(
    results: Sequence[ComparisonResult],
    title: str = DEFAULT_TITLE,
    sensitivity: Sequence[Mapping[str, Any] | None] | None = None,
    names: Sequence[str | None] | None = None,
    targets: Sequence[Mapping[str, Any] | None] | None = None,
) -> str:
    """The report page for ``results`` (one section per comparison, an overview when there are several).

    Args:
        results: the comparisons, in the order they are shown.
        title: the page title.
        sensitivity: per comparison, its sensitivity section
            (:func:`~pytest_qaccuracy.report.sensitivity_summary.sensitivity_view`) or None.
        names: per comparison, a name shown before its models (a pytest pair id), or None; pairs of
            the same model files (another backend, another dataset) stay apart.
        targets: per comparison, its deployment targets side by side
            (:func:`~pytest_qaccuracy.report.summary.target_view`) or None.

    Returns:
        A complete HTML document that loads nothing from the network.
    """
    pairs = [pair_data(r) for r in results]
    for pair, view in zip(pairs, list(sensitivity or []), strict=False):
        pair["sensitivity"] = finite_json(view)
    for pair, view in zip(pairs, list(targets or []), strict=False):
        pair["targets"] = view
    for pair, name in zip(pairs, list(names or []), strict=False):
        if name:
            pair["title"] = f"{name}: {pair['title']}"
    payload = embed_json({"title": title, "pairs": pairs})
    heading = html.escape(title)
    count = len(results)
    subtitle = f"{count} comparison{'s' if count != 1 else ''} of fp32 and quantized ONNX models, layer by layer"
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="pytest-qaccuracy">
<title>{heading}</title>
<style>{CSS}</style>
</head>
<body>
<header class="top"><div class="inner"><h1>{heading}</h1><p>{html.escape(subtitle)}</p></div></header>
<main>
<div id="qa-error" role="alert"></div>
<noscript><p>This report needs JavaScript to draw its tables and charts; the data is in the page source.</p></noscript>
<div id="qa-root"></div>
</main>
<footer>Generated by pytest-qaccuracy. Colours: ColorBrewer YlOrRd-9, as in Samsung ONE's visq; red is bad.</footer>
<script type="application/json" id="qaccuracy-data">{payload}</script>
<script>{JS}</script>
</body>
</html>
"""


def write_html(
    path: str | os.PathLike[str],
    results: Sequence[ComparisonResult],
    title: str = DEFAULT_TITLE,
    sensitivity: Sequence[Mapping[str, Any] | None] | None = None,
    names: Sequence[str | None] | None = None,
    targets: Sequence[Mapping[str, Any] | None] | None = None,
) -> Path:
    """Write :func:`render_html` to ``path`` atomically; returns the path."""
    page = render_html(results, title=title, sensitivity=sensitivity, names=names, targets=targets)
    return atomic_write_text(path, page)
