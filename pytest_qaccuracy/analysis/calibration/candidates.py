"""Candidate ranges of one tensor: every calibration method's answer from one set of statistics.

``auto`` calibration (``auto.py``) needs each method's range of every tensor before it measures
which one the model is best off with. :class:`TensorStats` holds what all of them need, gathered in
the same two passes as the histogram methods: the global and per-record extrema (pass one), the
histograms of ``kl`` (8001 bins) and ``mse`` (2047 bins) and onnxruntime's histogram of |x| (pass
two). Each rule in :data:`CANDIDATES` is exactly the method of the same name (docs/calibration.md),
plus ``ort-percentile``: onnxruntime's ``Percentile`` calibrator with its defaults (the 99.999th
percentile of |x|, symmetric), the same range to the bit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pytest_qaccuracy.analysis.calibration import ranges as R
from pytest_qaccuracy.analysis.calibration.observers import (
    ExtremaObserver,
    HistogramObserver,
    MagnitudeHistogramObserver,
)

#: onnxruntime's ``PercentileCalibrater`` default percentile (``create_calibrator``)
ORT_PERCENTILE = 99.999
#: the ``mse`` method's histogram (calibrator.CalibrationOptions.histogram_bins)
MSE_BINS = 2047


#: The histograms of the second pass (a field of :class:`TensorStats` each) and the rule that reads each.
HISTOGRAM_KINDS = ("kl", "mse", "magnitude")
#: Rule -> the histogram it reads (the rules not named read the extrema pass alone).
HISTOGRAM_OF = {"kl": "kl", "mse": "mse", "ort-percentile": "magnitude"}


@dataclass(slots=True)
class TensorStats:
    """Everything the candidate rules read about one tensor, folded over the calibration records
    (a histogram not folded is None: the rules that read it cannot run)."""

    observed: tuple[float, float]
    per_record: ExtremaObserver
    kl: HistogramObserver | None
    mse: HistogramObserver | None
    magnitude: MagnitudeHistogramObserver | None


Rule = Callable[[TensorStats, "CandidateOptions"], tuple[float, float]]


@dataclass(frozen=True, slots=True)
class CandidateOptions:
    """What the rules take from the calibration options."""

    qmin: int
    qmax: int
    percentiles: tuple[float, float] = (1.0, 99.0)
    moving_average: tuple[int, float] = (16, 0.1)
    quantized_bins: int = R.KL_QUANTIZED_BINS


def _minmax(s: TensorStats, o: CandidateOptions) -> tuple[float, float]:
    return s.observed


def _percentile(s: TensorStats, o: CandidateOptions) -> tuple[float, float]:
    return R.one_percentile(s.per_record.mins, o.percentiles[0]), R.one_percentile(s.per_record.maxs, o.percentiles[1])


def _moving_average(s: TensorStats, o: CandidateOptions) -> tuple[float, float]:
    batch, constant = o.moving_average
    mins, maxs = s.per_record.mins, s.per_record.maxs
    return R.moving_average(mins, True, batch, constant), R.moving_average(maxs, False, batch, constant)


def _kl(s: TensorStats, o: CandidateOptions) -> tuple[float, float]:
    t, _ = R.kl_threshold(s.kl.counts, s.kl.edges, o.quantized_bins)
    lo, hi = s.observed
    return max(lo, -t), min(hi, t)


def _mse(s: TensorStats, o: CandidateOptions) -> tuple[float, float]:
    return R.mse_range(s.mse.counts, s.mse.edges, *s.observed, o.qmin, o.qmax)


def _ort_percentile(s: TensorStats, o: CandidateOptions) -> tuple[float, float]:
    return ort_percentile_range(s.magnitude.counts, s.magnitude.edges, *s.observed)


#: every candidate rule by name; ``auto`` measures each tensor's distinct answers
CANDIDATES: dict[str, Rule] = {
    "minmax": _minmax,
    "percentile": _percentile,
    "moving-average": _moving_average,
    "kl": _kl,
    "mse": _mse,
    "ort-percentile": _ort_percentile,
}


def ort_percentile_range(
    counts: np.ndarray, edges: np.ndarray, lo: float, hi: float, percentile: float = ORT_PERCENTILE
) -> tuple[float, float]:
    """onnxruntime's symmetric percentile rule (``HistogramCollector.compute_percentile``) on its
    histogram of |x| (``counts`` over float32 ``edges``): ``t`` is the lower edge of the first bin whose
    cumulative share reaches ``percentile``, and the range is ``(-t, t)`` clipped to the observed
    ``(lo, hi)``, compared in float32 as onnxruntime compares."""
    cdf = np.cumsum(counts / counts.sum())
    t = edges[int(np.searchsorted(cdf, percentile / 100.0))]
    low, high = max(-t, np.float32(lo)), min(t, np.float32(hi))
    return float(low), float(high)


def candidate_ranges(stats: TensorStats, options: CandidateOptions) -> dict[str, tuple[float, float]]:
    """Every rule's range of one tensor, in :data:`CANDIDATES` order."""
    return {name: tuple(map(float, rule(stats, options))) for name, rule in CANDIDATES.items()}
