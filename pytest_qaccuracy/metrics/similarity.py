"""Similarity metrics (higher is better): cosine similarity and SQNR, both over all records at once."""

from __future__ import annotations

import math

import numpy as np

from pytest_qaccuracy.metrics.base import Result, StatsMetric, register_metric
from pytest_qaccuracy.metrics.pair import RecordStats, TensorPair

#: ORT's qdq_loss_debug clamps both norms to float64 eps, so identical tensors give a finite SQNR.
SQNR_EPS = float(np.finfo(np.float64).eps)


@register_metric
class Cosine(StatsMetric):
    name = "cosine"
    formula = "sum(f*q) / (||f|| * ||q||) over all elements of all records; 1 when both are all zeros"
    higher_is_better = True
    sums = ("dot", "ref_sq", "test_sq")

    def fold(self, stats: RecordStats, pair: TensorPair) -> dict[str, float]:
        return {"dot": stats.dot.sum(), "ref_sq": stats.ref_sq.sum(), "test_sq": stats.test_sq.sum()}

    def record_values(self, pair: TensorPair) -> np.ndarray:
        s = pair.stats
        norm = np.sqrt(s.ref_sq * s.test_sq)
        with np.errstate(divide="ignore", invalid="ignore"):
            cos = np.where(norm > 0, s.dot / norm, np.where((s.ref_sq == 0) & (s.test_sq == 0), 1.0, 0.0))
        return np.clip(cos, -1.0, 1.0)

    def compute(self) -> Result:
        ref, test = self.state["ref_sq"], self.state["test_sq"]
        if ref == 0 and test == 0:
            return 1.0, None
        if ref == 0 or test == 0:
            which = "fp32" if ref == 0 else "quantized"
            return None, f"the {which} tensor is all zeros"
        return max(-1.0, min(1.0, self.state["dot"] / math.sqrt(ref * test))), None


@register_metric
class SQNR(StatsMetric):
    name = "sqnr"
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
        return 20 * math.log10(signal / noise), None
