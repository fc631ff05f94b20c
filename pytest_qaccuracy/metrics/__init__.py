"""Metrics: a registry of streaming accumulators with exact, documented formulas (docs/metrics.md).

Register your own with ``@register_metric`` on a :class:`Metric` subclass (or :class:`StatsMetric`
for metrics made of per-record sums).
"""

from pytest_qaccuracy.metrics import error, similarity  # noqa: F401  (registers the built-ins)
from pytest_qaccuracy.metrics.base import (
    Metric,
    StatsMetric,
    available_metrics,
    get_metric,
    parse_metric_names,
    register_metric,
    unregister_metric,
)
from pytest_qaccuracy.metrics.pair import RecordStats, TensorPair

__all__ = [
    "Metric",
    "RecordStats",
    "StatsMetric",
    "TensorPair",
    "available_metrics",
    "get_metric",
    "parse_metric_names",
    "register_metric",
    "unregister_metric",
]
