"""One self-contained HTML report for any number of comparisons: inline CSS, JS and SVG, no network access.

The page's CSS and script are package files (``report/assets/report.css`` and ``report.js``, read
with :mod:`importlib.resources`). The data is embedded as ``<script type="application/json"
id="qaccuracy-data">``: per pair, its comparison JSON with every value formatted (:mod:`.html_data`),
its verdict and checks (:mod:`.verdicts`), and where given its deployment targets and sensitivity.
Each pair's coloured graph is drawn here as SVG (:mod:`.graph`, :mod:`.drawing`) and placed in the
page hidden, for the script to move into the pair's section.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_qaccuracy.analysis.results import ComparisonResult
from pytest_qaccuracy.atomic import atomic_write_text, finite_json
from pytest_qaccuracy.report.html_data import comparison_view, sensitivity_display
from pytest_qaccuracy.report.summary import FIRST_METRICS
from pytest_qaccuracy.report.verdicts import (
    check_rows,
    counts_line,
    drift_rows,
    task_rows,
    topk_rows,
    verdict_view,
    worst_layers,
)

if TYPE_CHECKING:
    import onnx

DEFAULT_TITLE = "Quantization accuracy report"

#: Characters that must not appear literally inside ``<script>``: ``</script>``, ``<!--`` and the JS
#: line terminators U+2028/U+2029 (escaped anyway by ``ensure_ascii``).
_SCRIPT_ESCAPES = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026"}


@dataclass(frozen=True, slots=True)
class ReportPair:
    """One comparison in the report, with what the pytest plugin knows about it.

    Attributes:
        result: the comparison.
        name: shown before the models (a pytest pair id), so pairs of the same files stay apart.
        record: the plugin's pair record (``checks``, ``topk``; see :mod:`.summary`), or None.
        targets: deployment targets side by side (:func:`~pytest_qaccuracy.report.summary.target_view`).
        sensitivity: the sensitivity section
            (:func:`~pytest_qaccuracy.report.sensitivity_summary.sensitivity_view`).
        model: the fp32 model, to draw its coloured graph; None draws none.
    """

    result: ComparisonResult
    name: str | None = None
    record: Mapping[str, Any] | None = None
    targets: Mapping[str, Any] | None = None
    sensitivity: Mapping[str, Any] | None = None
    model: onnx.ModelProto | None = None

    @classmethod
    def from_record(cls, record: Mapping[str, Any], model: onnx.ModelProto | None = None) -> ReportPair:
        """The pair of a plugin record, with its targets and sensitivity views."""
        from pytest_qaccuracy.report.sensitivity_summary import sensitivity_view
        from pytest_qaccuracy.report.summary import target_view

        result = ComparisonResult.from_dict(record["comparison"])
        return cls(result, record["id"], record, target_view(record), sensitivity_view(record), model)


@cache
def asset(name: str) -> str:
    """The text of ``report/assets/<name>`` (``report.css``, ``report.js``)."""
    return resources.files("pytest_qaccuracy.report").joinpath("assets", name).read_text(encoding="utf-8")


def embed_json(data: Any) -> str:
    """Strict JSON that is safe inside ``<script>``: no NaN/Inf, no ``<``, ``>`` or ``&`` characters."""
    return json.dumps(data, allow_nan=False, ensure_ascii=True, separators=(",", ":")).translate(_SCRIPT_ESCAPES)


def first_metric(result: ComparisonResult) -> str | None:
    """The metric shown first: sqnr, else cosine, else mse, else the result's first."""
    names = result.metric_names or list(result.metric_definitions)
    return next((m for m in FIRST_METRICS if m in names), names[0] if names else None)


def pair_data(pair: ReportPair | ComparisonResult, index: int = 0) -> dict[str, Any]:
    """The embedded data of one pair (without its graph's SVG); see docs/report.md."""
    pair = pair if isinstance(pair, ReportPair) else ReportPair(pair)
    result = pair.result
    data = comparison_view(result)
    data["index"] = index
    data["id"] = f"pair-{index}"
    data["title"] = f"{Path(result.quantized_model).name} vs {Path(result.fp32_model).name}"
    if pair.name:
        data["title"] = f"{pair.name}: {data['title']}"
    data["first_metric"] = first_metric(result)
    data["verdict"] = verdict_view(pair.record)
    data["checks"] = check_rows(pair.record)
    data["drift"] = drift_rows(pair.record)
    data["topk"] = topk_rows(pair.record)
    data["task"] = task_rows(pair.record)
    data["worst"] = worst_layers(result, data["first_metric"])
    data["targets"] = dict(pair.targets) if pair.targets else None
    data["sensitivity"] = sensitivity_display(pair.sensitivity)
    return finite_json(data)


def graph_block(pair: ReportPair, index: int, engine: str = "auto") -> tuple[dict[str, Any], str]:
    """The pair's graph entry (``{metric, engine, nodes}`` or ``{note}``) and its hidden SVG holder."""
    from pytest_qaccuracy.report.drawing import render_graph
    from pytest_qaccuracy.report.graph import build_graph

    metric = first_metric(pair.result)
    if pair.model is None or metric is None:
        return {"note": "no graph: the fp32 model was not available to this report"}, ""
    anchors = {x.tensor: f"pair-{index}-layer-{x.order}" for x in pair.result.layers}
    for k, output in enumerate(pair.result.outputs):
        anchors.setdefault(output.name, f"pair-{index}-output-{k}")
    drawn = render_graph(build_graph(pair.model, pair.result, metric, anchors), engine)
    if drawn is None:
        return {"note": "no graph: the model has too many nodes to draw"}, ""
    holder = f'<div class="graph-src" id="pair-{index}-graph-src" hidden>{drawn.svg}</div>'
    return {"metric": metric, "label": metric.upper(), "engine": drawn.engine, "nodes": drawn.nodes}, holder


def _pairs(
    results: Sequence[ReportPair | ComparisonResult],
    sensitivity: Sequence[Mapping[str, Any] | None] | None,
    names: Sequence[str | None] | None,
    targets: Sequence[Mapping[str, Any] | None] | None,
) -> list[ReportPair]:
    """ReportPairs from results, with the per-result keyword lists of :func:`render_html` filled in."""
    pairs = [r if isinstance(r, ReportPair) else ReportPair(r) for r in results]
    sensitivity, names, targets = list(sensitivity or []), list(names or []), list(targets or [])
    out = []
    for i, pair in enumerate(pairs):
        extra: dict[str, Any] = {}
        if i < len(sensitivity) and sensitivity[i] is not None:
            extra["sensitivity"] = sensitivity[i]
        if i < len(names) and names[i]:
            extra["name"] = names[i]
        if i < len(targets) and targets[i] is not None:
            extra["targets"] = targets[i]
        out.append(replace(pair, **extra))
    return out


def render_html(
    results: Sequence[ReportPair | ComparisonResult],
    title: str = DEFAULT_TITLE,
    sensitivity: Sequence[Mapping[str, Any] | None] | None = None,
    names: Sequence[str | None] | None = None,
    targets: Sequence[Mapping[str, Any] | None] | None = None,
    engine: str = "auto",
    notice: str | None = None,
    environment: Sequence[Sequence[str]] | None = None,
) -> str:
    """The report page: an overview (pairs x verdicts, worst layers), the environment, then one
    section per pair.

    Args:
        results: the comparisons (or :class:`ReportPair` with checks, model, ...), in the order shown.
        title: the page title.
        sensitivity: per comparison, its sensitivity section, or None.
        names: per comparison, a name shown before its models (a pytest pair id), or None.
        targets: per comparison, its deployment targets side by side, or None.
        engine: the graph layout: ``auto`` (Graphviz when installed), ``graphviz`` or ``built-in``.
        notice: a warning shown under the title, without JavaScript too (an interrupted or
            incomplete session: :meth:`~pytest_qaccuracy.report.completeness.SessionStatus.headline`).
        environment: ``[name, text]`` rows of the Environment section; None: this process's
            (:func:`~pytest_qaccuracy.report.environment.environment`).

    Returns:
        A complete HTML document that loads nothing from the network.
    """
    pairs = _pairs(results, sensitivity, names, targets)
    data, holders = [], []
    for i, pair in enumerate(pairs):
        entry = pair_data(pair, i)
        entry["graph"], holder = graph_block(pair, i, engine)
        data.append(entry)
        holders.append(holder)
    summary = counts_line([entry["verdict"] for entry in data])
    if environment is None:
        from pytest_qaccuracy.report.environment import environment as this_environment

        environment = this_environment()
    rows = [[str(name), str(value)] for name, value in environment]
    payload = embed_json({"title": title, "summary": summary, "notice": notice, "environment": rows, "pairs": data})
    return _page(title, summary, payload, "\n".join(h for h in holders if h), notice)


def _page(title: str, summary: str, payload: str, graphs: str, notice: str | None = None) -> str:
    heading = html.escape(title)
    warning = f'<p class="qa-notice" role="alert">{html.escape(notice)}</p>' if notice else ""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="pytest-qaccuracy">
<title>{heading}</title>
<style>{asset("report.css")}</style>
</head>
<body>
<header class="top"><div class="inner"><h1>{heading}</h1><p>{html.escape(summary)}</p>{warning}</div></header>
<main>
<div id="qa-error" role="alert"></div>
<noscript><p>This report needs JavaScript to draw its tables and charts; the data is in the page source.</p></noscript>
<div id="qa-root"></div>
</main>
<footer>Generated by pytest-qaccuracy. Colours: ColorBrewer YlOrRd-9, as in Samsung ONE's visq; red is bad.</footer>
{graphs}
<script type="application/json" id="qaccuracy-data">{payload}</script>
<script>{asset("report.js")}</script>
</body>
</html>
"""


def write_html(
    path: str | os.PathLike[str],
    results: Sequence[ReportPair | ComparisonResult],
    title: str = DEFAULT_TITLE,
    sensitivity: Sequence[Mapping[str, Any] | None] | None = None,
    names: Sequence[str | None] | None = None,
    targets: Sequence[Mapping[str, Any] | None] | None = None,
    engine: str = "auto",
    notice: str | None = None,
    environment: Sequence[Sequence[str]] | None = None,
) -> Path:
    """Write :func:`render_html` to ``path`` atomically; returns the path."""
    page = render_html(
        results,
        title=title,
        sensitivity=sensitivity,
        names=names,
        targets=targets,
        engine=engine,
        notice=notice,
        environment=environment,
    )
    return atomic_write_text(path, page)
