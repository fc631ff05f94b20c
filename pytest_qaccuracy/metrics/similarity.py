"""Similarity metrics (higher is better): cosine similarity and SQNR, both over all records at once."""

from __future__ import annotations

import math

import numpy as np

from pytest_qaccuracy.metrics.base import Result, StatsMetric, register_metric
from pytest_qaccuracy.metrics.pair import RecordStats, TensorPair

#: ORT's qdq_loss_debug clamps both norms to float64 eps, so identical tensors give a finite SQNR.
SQNR_EPS = float(np.finfo(np.float64).eps)


def _cosine(ref_sq, test_sq, sq_err):
    """cos(f, q) from ||f||^2, ||q||^2 and ||f - q||^2, without cancellation near 1.

    Since ||f - q||^2 = ||f||^2 + ||q||^2 - 2 f.q, cos = 1 - (||f - q||^2 - (||f|| - ||q||)^2) / (2 ||f|| ||q||):
    the small error norm is summed directly, so 1 - cos keeps its digits when f and q nearly agree.
    """
    nf, nq = np.sqrt(ref_sq), np.sqrt(test_sq)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.clip(1.0 - (sq_err - (nf - nq) ** 2) / (2.0 * nf * nq), -1.0, 1.0)


@register_metric
class Cosine(StatsMetric):
    name = "cosine"
    stats_fields = ("ref_sq", "test_sq", "sq_err")
    formula = "sum(f*q) / (||f|| * ||q||) over all elements of all records; 1 when both are all zeros"
    higher_is_better = True
    sums = ("ref_sq", "test_sq", "sq_err")

    def fold(self, stats: RecordStats, pair: TensorPair) -> dict[str, float]:
        return {"ref_sq": stats.ref_sq.sum(), "test_sq": stats.test_sq.sum(), "sq_err": stats.sq_err.sum()}

    def record_values(self, pair: TensorPair) -> np.ndarray:
        s = pair.stats
        both_zero = (s.ref_sq == 0) & (s.test_sq == 0)
        one_zero = (s.ref_sq == 0) ^ (s.test_sq == 0)
        return np.where(both_zero, 1.0, np.where(one_zero, 0.0, _cosine(s.ref_sq, s.test_sq, s.sq_err)))

    def compute(self) -> Result:
        ref, test = self.state["ref_sq"], self.state["test_sq"]
        if ref == 0 and test == 0:
            return 1.0, None
        if ref == 0 or test == 0:
            which = "fp32" if ref == 0 else "quantized"
            return None, f"the {which} tensor is all zeros"
        return float(_cosine(ref, test, self.state["sq_err"])), None


@register_metric
class SQNR(StatsMetric):
    name = "sqnr"
    stats_fields = ("ref_sq", "sq_err")
    formula = (
        "20*log10(max(||f||, eps) / max(||f - q||, eps)) in dB, norms over all records, eps = 2.22e-16 "
        "(as onnxruntime's qdq_loss_debug)"
    )
    higher_is_better = True
    sums = ("ref_sq", "sq_err")

    def fold(self, stats: RecordStats, pair: TensorPair) -> dict[str, float]:
        return {"ref_sq": stats.ref_sq.sum(), "sq_err": stats.sq_err.sum()}

    def record_values(self, pair: TensorPair) -> np.ndarray:
        s = pair.stats
        return 20 * np.log10(np.maximum(np.sqrt(s.ref_sq), SQNR_EPS) / np.maximum(np.sqrt(s.sq_err), SQNR_EPS))

    def compute(self) -> Result:
        signal = max(math.sqrt(self.state["ref_sq"]), SQNR_EPS)
        noise = max(math.sqrt(self.state["sq_err"]), SQNR_EPS)
        if not math.isfinite(signal / noise) or signal / noise == 0:  # Inf noise: log10(0) would raise
            return math.nan, None
        return 20 * math.log10(signal / noise), None
