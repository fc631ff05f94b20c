"""Error metrics (lower is better): Samsung ONE's MSE, MPEIR, TAE, SRMSE, plus MRE, max_abs, lsb and
clipped (the share of fp32 values outside the quantized range); and the elements outside
``atol + rtol * |fp32|`` (:func:`outside_tolerance`, the one formula of ``assert_relative`` and the
plugin's ``rtol``/``atol`` check).

Notation: f_s and q_s are the fp32 and quantized values of record s (all elements of the tensor),
N the number of records, n the elements per record. ONE's metrics are means of per-record values.
"""

from __future__ import annotations

import math

import numpy as np

from pytest_qaccuracy.metrics.base import Result, StatsMetric, register_metric
from pytest_qaccuracy.metrics.pair import RecordStats, TensorPair

#: ONE's visq epsilon for the range in MPEIR.
MPEIR_EPS = 1e-6


def outside_tolerance(
    actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The elements of ``actual`` outside ``atol + rtol * |expected|``, compared in float64 (NaN is outside).

    Returns:
        The mask of those elements (``actual``'s shape) and, for each of them in C order,
        ``|actual - expected|``, the relative difference ``|actual - expected| / |expected|`` (inf where
        ``expected`` is 0) and the excess over the bound (NaN as inf: the worst first).
    """
    a, e = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    with np.errstate(invalid="ignore"):  # inf - inf and 0 * inf are NaN, and outside
        diff = np.abs(a - e)
        bound = atol + rtol * np.abs(e)
        bad = ~(diff <= bound)
    diff, scale, bound = diff[bad], np.abs(e[bad]), np.asarray(bound)[bad]
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(scale != 0, diff / scale, np.inf)
    excess = diff - bound
    return bad, diff, rel, np.where(np.isnan(excess), np.inf, excess)


class RecordMean(StatsMetric):
    """A metric that is the mean over records of a per-record value (ONE's visq metrics)."""

    sums = ("total",)

    def fold(self, stats: RecordStats, pair: TensorPair) -> dict[str, float]:
        return {"total": self.record_values(pair).sum()}

    def compute(self) -> Result:
        return self.state["total"] / self.state["records"], None


@register_metric
class MSE(RecordMean):
    name = "mse"
    stats_fields = ("sq_err",)
    formula = "mean over records s of mean((f_s - q_s)^2)  (Samsung ONE visq)"

    def record_values(self, pair: TensorPair) -> np.ndarray:
        return pair.stats.sq_err / max(pair.stats.count, 1)


@register_metric
class MPEIR(RecordMean):
    name = "mpeir"
    stats_fields = ("max_abs_err", "ref_min", "ref_max")
    formula = "mean over records s of max|f_s - q_s| / (max(f_s) - min(f_s) + 1e-6)  (Samsung ONE visq)"

    def record_values(self, pair: TensorPair) -> np.ndarray:
        stats = pair.stats
        return stats.max_abs_err / (stats.ref_max - stats.ref_min + MPEIR_EPS)


@register_metric
class TAE(RecordMean):
    name = "tae"
    stats_fields = ("abs_err",)
    formula = "mean over records s of sum|f_s - q_s|  (Samsung ONE visq)"

    def record_values(self, pair: TensorPair) -> np.ndarray:
        return pair.stats.abs_err


@register_metric
class SRMSE(StatsMetric):
    name = "srmse"
    stats_fields = ("sq_err",)
    formula = (
        "sqrt(mean over records s of mean((f_s - q_s)^2)) / scale, scale = the quantized tensor's step "
        "(Samsung ONE visq; about 0.289 = 1/sqrt(12) for uniformly distributed rounding error)"
    )
    sums = ("mse_sum",)

    def __init__(self) -> None:
        super().__init__()
        self.scale: float | None = None
        self.reason: str | None = "the quantized tensor has no scale"

    def fold(self, stats: RecordStats, pair: TensorPair) -> dict[str, float]:
        if pair.scale is not None:
            scale = np.asarray(pair.scale)
            if scale.size == 1:
                self.scale, self.reason = float(scale.reshape(())), None
            else:
                self.reason = "per-channel scale: SRMSE is defined for a per-tensor scale"
        return {"mse_sum": (stats.sq_err / max(stats.count, 1)).sum()}

    def merge(self, other) -> None:
        super().merge(other)
        if self.scale is None:
            self.scale, self.reason = other.scale, other.reason

    def compute(self) -> Result:
        if self.scale is None or self.reason is not None:
            return None, self.reason
        if self.scale <= 0:
            return None, f"non-positive scale {self.scale}"
        return math.sqrt(self.state["mse_sum"] / self.state["records"]) / self.scale, None


@register_metric
class MRE(StatsMetric):
    name = "mre"
    stats_fields = ("abs_err", "ref_abs")
    formula = "sum|f - q| / sum|f| over all elements of all records (relative L1 error)"
    sums = ("abs_err", "ref_abs")

    def fold(self, stats: RecordStats, pair: TensorPair) -> dict[str, float]:
        return {"abs_err": stats.abs_err.sum(), "ref_abs": stats.ref_abs.sum()}

    def record_values(self, pair: TensorPair) -> np.ndarray:
        stats = pair.stats
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(stats.ref_abs > 0, stats.abs_err / stats.ref_abs, np.where(stats.abs_err > 0, np.inf, 0))

    def compute(self) -> Result:
        if self.state["ref_abs"] == 0:
            return (0.0, None) if self.state["abs_err"] == 0 else (None, "the fp32 tensor is all zeros")
        return self.state["abs_err"] / self.state["ref_abs"], None


@register_metric
class MaxAbs(StatsMetric):
    name = "max_abs"
    stats_fields = ("max_abs_err",)
    formula = "max |f - q| over all elements of all records"
    maxima = ("max_abs",)

    def fold(self, stats: RecordStats, pair: TensorPair) -> dict[str, float]:
        return {"max_abs": stats.max_abs_err.max(initial=0.0)}

    def record_values(self, pair: TensorPair) -> np.ndarray:
        return pair.stats.max_abs_err

    def compute(self) -> Result:
        return self.state["max_abs"], None


@register_metric
class LSB(StatsMetric):
    name = "lsb"
    stats_fields = ("max_abs_err",)
    formula = "max |f - q| / scale over all elements of all records: the worst error in quantization steps"
    maxima = ("lsb",)

    def __init__(self) -> None:
        super().__init__()
        self.has_scale = False

    def fold(self, stats: RecordStats, pair: TensorPair) -> dict[str, float]:
        steps = pair.steps
        if steps is None:
            return {}
        self.has_scale = True
        return {"lsb": steps.max(initial=0.0)}

    def record_values(self, pair: TensorPair) -> np.ndarray | None:
        return pair.steps

    def merge(self, other) -> None:
        super().merge(other)
        self.has_scale = self.has_scale or other.has_scale

    def compute(self) -> Result:
        if not self.has_scale:
            return None, "the quantized tensor has no scale"
        return self.state["lsb"], None


@register_metric
class Clipped(StatsMetric):
    name = "clipped"
    stats_fields = ("ref_min", "ref_max")
    formula = (
        "fraction of fp32 elements outside the quantized tensor's range (saturated by QuantizeLinear): "
        "f / scale + zero_point < qmin - 0.5 or >= qmax + 0.5, over all elements of all records"
    )
    sums = ("clipped", "elements")

    def fold(self, stats: RecordStats, pair: TensorPair) -> dict[str, float]:
        counts = pair.saturated
        if counts is None:
            return {}
        return {"clipped": float(counts.sum()), "elements": float(stats.count * pair.records)}

    def record_values(self, pair: TensorPair) -> np.ndarray | None:
        counts = pair.saturated
        return None if counts is None else counts / max(pair.stats.count, 1)

    def compute(self) -> Result:
        if self.state["elements"] == 0:
            return None, "the quantized tensor has no scale and zero point"
        return self.state["clipped"] / self.state["elements"], None
