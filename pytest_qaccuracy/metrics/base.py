"""The metric base class and registry.

A metric is a streaming accumulator: ``update(pair)`` folds one batch, ``merge(other)`` combines two
partial states (records split across batches or workers), ``result()`` gives ``(value, reason)``:
a finite float and None, or None and the reason the value is undefined.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np

from pytest_qaccuracy.errors import MetricError
from pytest_qaccuracy.metrics.pair import RecordStats, TensorPair
from pytest_qaccuracy.numbers import finite

Result = tuple[float | None, str | None]

#: Why a metric over NaN or Inf values (``--allow-nonfinite`` data, or a model that makes them) has none.
NONFINITE_REASON = "NaN or Inf in the compared values"


def nan_max(a: float, b: float) -> float:
    """``max(a, b)``, but NaN if either is NaN (the builtin returns whichever comes first)."""
    return math.nan if math.isnan(a) or math.isnan(b) else max(a, b)


def finite_result(value: float | None, reason: str | None) -> Result:
    """A result whose value is finite, or None with a reason: NaN or Inf becomes undefined
    (:data:`NONFINITE_REASON`), as every result and JSON file expects, instead of ``nan`` or ``-inf`` in a table."""
    if value is not None and finite(value) is None:
        return None, NONFINITE_REASON
    return value, reason


_REGISTRY: dict[str, type[Metric]] = {}


class Metric(ABC):
    """Base of every metric. Subclasses set ``name``, ``formula`` and ``higher_is_better``.

    State must be fixed-size (sums, counts, extrema), never a list of arrays, so memory does not grow
    with the number of records and ``merge`` is exact.
    """

    name: ClassVar[str]
    formula: ClassVar[str]
    higher_is_better: ClassVar[bool] = False
    #: The :class:`RecordStats` fields the metric reads: computed together once per batch. A field
    #: read but not declared is still computed, on first read.
    stats_fields: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def update(self, pair: TensorPair) -> None: ...

    @abstractmethod
    def merge(self, other: Metric) -> None: ...

    @abstractmethod
    def result(self) -> Result: ...

    def record_values(self, pair: TensorPair) -> np.ndarray | None:
        """This metric for each record of the batch alone (for "worst records"); None if not defined."""
        return None

    def value(self) -> float | None:
        return self.result()[0]


class StatsMetric(Metric):
    """A metric whose state is a few float64 sums over :class:`RecordStats` fields.

    Subclasses list ``sums`` (names of state fields), implement ``fold(stats) -> dict`` returning the
    batch's contribution to each sum, and ``compute()``. ``update`` and ``merge`` come for free, and
    so does ``state["records"]``: the records folded so far (no records -> undefined, for every metric).
    """

    sums: ClassVar[tuple[str, ...]] = ()
    maxima: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        self.state = {"records": 0.0} | {key: 0.0 for key in self.sums} | {key: -math.inf for key in self.maxima}

    def update(self, pair: TensorPair) -> None:
        self.state["records"] += pair.records
        for key, value in self.fold(pair.stats, pair).items():
            if key in self.maxima:
                self.state[key] = nan_max(self.state[key], float(value))
            else:
                self.state[key] += float(value)

    def merge(self, other: Metric) -> None:
        assert isinstance(other, type(self))
        for key in ("records", *self.sums):
            self.state[key] += other.state[key]
        for key in self.maxima:
            self.state[key] = nan_max(self.state[key], other.state[key])

    def result(self) -> Result:
        if self.state["records"] == 0:
            return None, "no records"
        return finite_result(*self.compute())

    @abstractmethod
    def fold(self, stats: RecordStats, pair: TensorPair) -> dict[str, float]: ...

    @abstractmethod
    def compute(self) -> Result: ...


def register_metric(cls: type[Metric]) -> type[Metric]:
    """Class decorator: make a metric available by ``cls.name`` (lower case, unique)."""
    name = getattr(cls, "name", None)
    if not name or name != name.lower() or not name.replace("_", "").isalnum():
        raise MetricError(f"metric {cls.__name__}: name must be a lower-case identifier, got {name!r}")
    if name in _REGISTRY:
        raise MetricError(f"metric '{name}' is already registered (by {_REGISTRY[name].__name__})")
    if not getattr(cls, "formula", ""):
        raise MetricError(f"metric '{name}': a formula string is required (it goes into metric_definitions)")
    _REGISTRY[name] = cls
    return cls


def unregister_metric(name: str) -> None:
    """Remove a user metric (tests and plugins that register temporarily)."""
    _REGISTRY.pop(name, None)


def get_metric(name: str) -> type[Metric]:
    try:
        return _REGISTRY[name.strip().lower()]
    except KeyError:
        raise MetricError(f"unknown metric '{name}'; available: {', '.join(available_metrics())}") from None


def available_metrics() -> list[str]:
    return list(_REGISTRY)


def parse_metric_names(spec: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """``"mse, cosine"`` or a list -> validated names; None -> every registered metric."""
    if spec is None:
        return available_metrics()
    names = [n.strip().lower() for n in (spec.split(",") if isinstance(spec, str) else spec) if n.strip()]
    if not names:
        raise MetricError("no metric named; available: " + ", ".join(available_metrics()))
    for name in names:
        get_metric(name)
    return list(dict.fromkeys(names))
