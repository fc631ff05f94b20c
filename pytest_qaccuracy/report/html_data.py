"""The data the HTML report embeds, with every value formatted and coloured here. Pure.

The page's script never formats a number: each value comes with its text (``text``), its visq
colour (``color``) and the raw number (for sorting and for placing bars and points); chart axes
come with their ticks already labelled.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from pytest_qaccuracy.analysis.results import ComparisonResult
from pytest_qaccuracy.numbers import finite, format_metric
from pytest_qaccuracy.report._palette import (
    FIXED_RANGES,
    ZERO_BASED,
    Slot,
    higher_is_better,
    metric_names,
    metric_slots,
    slot_color,
)

#: Chart axes get at most this many ticks.
MAX_TICKS = 6


def _scale(metric: str, higher_better: bool) -> str:
    if metric in FIXED_RANGES:
        lo, hi = FIXED_RANGES[metric]
        return f"fixed {lo:g}..{hi:g}"
    base = "0..max of the values" if metric in ZERO_BASED else "min..max of the values"
    return base + (" (dark red = lowest)" if higher_better else "")


def ticks(lo: float, hi: float, log: bool = False) -> list[float]:
    """Round tick positions between ``lo`` and ``hi`` (whole powers of ten on a log axis)."""
    if log:
        found = [float(p) for p in range(math.floor(lo), math.ceil(hi) + 1) if lo - 1e-9 <= p <= hi + 1e-9]
        return found if len(found) >= 2 else [lo, hi]
    span = hi - lo
    step = 10 ** math.floor(math.log10(span / 5))
    step *= next((m for m in (1, 2, 2.5, 5, 10) if span / (step * m) <= MAX_TICKS), 10)
    first = math.ceil(lo / step)
    found = []
    while (first + len(found)) * step <= hi + step * 1e-9:
        t = (first + len(found)) * step
        found.append(0.0 if abs(t) < step * 1e-9 else t)
    return found


def axis(metric: str, values: Iterable[float], higher_better: bool, log: bool = False) -> dict[str, Any] | None:
    """A chart's value axis: ``{lo, hi, log, ticks: [[position, label], ...]}``, or None without values.

    Positions are log10 of the values on a log axis. Error metrics start at zero on a linear axis.
    """
    present = [v for v in values if math.isfinite(v)]
    if not present or (log and min(present) <= 0):
        return None
    scaled = [math.log10(v) for v in present] if log else present
    lo, hi = min(scaled), max(scaled)
    if not log and not higher_better:
        lo = min(0.0, lo)
    if lo == hi:
        pad = abs(lo) / 2 or 1.0
        lo, hi = lo - pad, hi + pad
    elif log or higher_better:
        margin = (hi - lo) * 0.05
        lo, hi = lo - margin, hi + margin
    labelled = [[t, format_metric(metric, 10**t if log else t)] for t in ticks(lo, hi, log)]
    return {"lo": lo, "hi": hi, "log": log, "ticks": labelled}


def _slots_view(metric: str, slots: list[Slot]) -> list[list[Any]]:
    """``[begin, end, colour, "begin – end"]`` per slot."""
    text = [f"{format_metric(metric, s.begin)} – {format_metric(metric, s.end)}" for s in slots]
    return [[s.begin, s.end, s.color, t] for s, t in zip(slots, text, strict=True)]


def metric_view(result: ComparisonResult, name: str) -> dict[str, Any]:
    """One metric: label, definition, direction, colour slots, and the bar chart's axes."""
    better = higher_is_better(result, name)
    layers = [v for v in (finite(x.metrics.get(name)) for x in result.layers) if v is not None]
    return {
        "name": name,
        "label": name.upper(),
        "definition": result.metric_definitions.get(name, ""),
        "higher_is_better": better,
        "scale": _scale(name, better),
        "slots": _slots_view(name, metric_slots(result, name)),
        "axis": axis(name, layers, better),
        "log_axis": axis(name, layers, better, log=True),
    }


def entry_view(entry: dict[str, Any], slots: Mapping[str, list[Slot]]) -> dict[str, Any]:
    """A layer or output dict of the comparison JSON plus ``text`` and ``color`` per metric."""
    text, color = {}, {}
    for name, value in entry["metrics"].items():
        text[name] = format_metric(name, value)
        number = finite(value)
        if number is not None and name in slots:
            color[name] = slot_color(slots[name], number)
    return {**entry, "text": text, "color": color}


def comparison_view(result: ComparisonResult) -> dict[str, Any]:
    """The comparison JSON dict (layers in topological order) with formatted values and metrics."""
    data = result.to_dict()
    names = metric_names(result)
    slots = {name: metric_slots(result, name) for name in names}
    data["layers"] = [entry_view(x, slots) for x in sorted(data["layers"], key=lambda layer: layer["order"])]
    data["outputs"] = [entry_view(x, slots) for x in data["outputs"]]
    data["metrics"] = [metric_view(result, name) for name in names]
    return data


def sensitivity_display(view: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A sensitivity view (:func:`~pytest_qaccuracy.report.sensitivity_summary.sensitivity_view`) plus
    ``text`` per row, ``baseline_text``, and the curves' axis and point labels (``chart_axis``,
    ``chart_text``); the view's own keys are kept as they are."""
    if not view or "note" in view:
        return dict(view) if view else None
    metric = view["metric"]
    out = {**view, "rows": [{**r, "text": format_metric(metric, r.get("value"))} for r in view["rows"]]}
    baseline = finite(view.get("baseline"))
    out["baseline_text"] = None if baseline is None else format_metric(metric, baseline)
    chart = view.get("chart")
    if chart:
        name = chart.get("y_label", metric)
        values = [v for s in chart["series"] for v in (finite(y) for y in s["y"]) if v is not None]
        out["chart_axis"] = axis(name, values, True)
        out["chart_text"] = [[format_metric(name, finite(y)) for y in s["y"]] for s in chart["series"]]
    return out
