"""Shared by the writers: which metrics a result has, which way is worse, and the visq colour slots.

One implementation of the colour rules, so visq.json, the DOT graph and the HTML report agree.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pytest_qaccuracy.analysis.results import ComparisonResult
from pytest_qaccuracy.numbers import finite

#: ColorBrewer YlOrRd-9, light (good) to dark red (bad): the palette of ONE's visq.
YLORRD9 = ("#ffffcc", "#ffeda0", "#fed976", "#feb24c", "#fd8d3c", "#fc4e2a", "#e31a1c", "#bd0026", "#800026")
NUM_SLOTS = len(YLORRD9)
#: Colours dark enough that text on them must be white.
DARK = frozenset(YLORRD9[6:])

#: Used when a result does not say (older JSON): the built-in similarity metrics are higher-is-better.
DEFAULT_HIGHER_IS_BETTER = {"cosine": True, "sqnr": True}

#: Metrics whose colour range is fixed rather than taken from the values (ONE's visq).
FIXED_RANGES = {"mpeir": (0.0, 1.0)}
#: Metrics whose colour range starts at zero and ends at the largest value (ONE's visq).
ZERO_BASED = frozenset({"srmse"})


@dataclass(frozen=True, slots=True)
class Slot:
    """One colour slot ``[begin, end]`` of a metric's scale."""

    begin: float
    end: float
    color: str


def metric_names(result: ComparisonResult) -> list[str]:
    """The result's metrics: those with definitions first, then any other key found in the values."""
    names = list(result.metric_definitions)
    for entry in [*result.outputs, *result.layers]:
        names.extend(name for name in entry.metrics if name not in names)
    return names


def higher_is_better(result: ComparisonResult, metric: str) -> bool:
    """Whether larger values of ``metric`` are better (from the result, else the built-in default)."""
    if metric in result.higher_is_better:
        return bool(result.higher_is_better[metric])
    return DEFAULT_HIGHER_IS_BETTER.get(metric, False)


def error_map(result: ComparisonResult, metric: str) -> dict[str, float]:
    """fp32 tensor name -> finite value of ``metric``: every layer, then outputs not already a layer.

    None, NaN and Inf are skipped; they have no place on a colour scale.
    """
    values: dict[str, float] = {}
    for entry_name, metrics in [(x.tensor, x.metrics) for x in result.layers] + [
        (o.name, o.metrics) for o in result.outputs
    ]:
        value = finite(metrics.get(metric))
        if value is not None and entry_name not in values:
            values[entry_name] = value
    return values


def _widen(value: float, upward: bool) -> tuple[float, float]:
    """A non-empty range for values that are all ``value``; they land on the lightest colour.

    The width is half of ``|value|`` (1.0 at zero), added above the value when lower is better and
    below it when higher is better, so the value sits at the good end of the scale.
    """
    width = abs(value) / 2 if value != 0 else 1.0
    lo, hi = (value, value + width) if upward else (value - width, value)
    if not lo < hi:  # |value| is subnormal, half of it rounds to zero
        lo, hi = (value, value + 1.0) if upward else (value - 1.0, value)
    return lo, hi


def metric_range(metric: str, values: Iterable[float], higher_better: bool = False) -> tuple[float, float]:
    """The ``(lo, hi)`` a metric's nine slots span, always with ``lo < hi``.

    MPEIR is fixed at 0..1, SRMSE is 0..max, every other metric is min..max of ``values``. A range
    that would be empty (no values, all values equal, SRMSE all zero) is widened by :func:`_widen`.
    """
    if metric in FIXED_RANGES:
        return FIXED_RANGES[metric]
    values = [v for v in values if math.isfinite(v)]
    if not values:
        return (0.0, 1.0)
    lo, hi = min(values), max(values)
    if metric in ZERO_BASED:
        lo = min(0.0, lo)
    if lo < hi:
        return lo, hi
    return _widen(hi if higher_better else lo, upward=not higher_better)


def color_slots(lo: float, hi: float, higher_better: bool = False) -> list[Slot]:
    """Nine uniform slots from ``lo`` to ``hi``, listed in ascending order of value.

    Lower-is-better metrics get YlOrRd-9 in order (large error = dark red). Higher-is-better metrics
    (cosine, SQNR) get the same slots with the colours reversed, so the lowest values are dark red:
    red always means bad, and a reader that picks the slot containing a value gets the right colour.
    """
    colors = YLORRD9[::-1] if higher_better else YLORRD9

    def edge(i: int) -> float:
        # A weighted mean never overflows and gives exactly lo at i=0 and hi at i=9.
        return lo * ((NUM_SLOTS - i) / NUM_SLOTS) + hi * (i / NUM_SLOTS)

    return [Slot(edge(i), edge(i + 1), colors[i]) for i in range(NUM_SLOTS)]


def metric_slots(result: ComparisonResult, metric: str, values: Mapping[str, float] | None = None) -> list[Slot]:
    """The colour slots of ``metric`` for ``result`` (range from ``values``, default its error map)."""
    better = higher_is_better(result, metric)
    values = error_map(result, metric) if values is None else values
    return color_slots(*metric_range(metric, values.values(), better), higher_better=better)


def slot_color(slots: list[Slot], value: float) -> str:
    """The colour of the slot holding ``value``; values outside the scale take the end colours."""
    if value <= slots[0].end:
        return slots[0].color
    for slot in slots:
        if slot.begin <= value <= slot.end:
            return slot.color
    return slots[-1].color
