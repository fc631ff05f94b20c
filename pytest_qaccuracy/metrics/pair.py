"""A batch of reference/test tensor values, and the per-record statistics every metric folds.

Metrics never keep arrays: they read the per-record sums below (computed once per batch, in float64,
shared by all metrics) or, for custom metrics, the arrays themselves, and keep only fixed-size state.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np


@dataclass(frozen=True, slots=True)
class RecordStats:
    """Per-record sums over one tensor's elements (each field has shape (records,))."""

    count: int  # elements per record
    sq_err: np.ndarray  # sum (f - q)^2
    abs_err: np.ndarray  # sum |f - q|
    max_abs_err: np.ndarray  # max |f - q|
    ref_sq: np.ndarray  # sum f^2
    test_sq: np.ndarray  # sum q^2
    dot: np.ndarray  # sum f*q
    ref_abs: np.ndarray  # sum |f|
    ref_min: np.ndarray
    ref_max: np.ndarray


class TensorPair:
    """Reference values ``f`` (fp32 model) and test values ``q`` (quantized model) for a batch.

    Both have shape (records, ...); ``scale``/``axis`` describe the quantized tensor's step when it
    has one (a scalar for per-tensor, a vector along ``axis`` for per-channel quantization).
    """

    __slots__ = ("__dict__", "axis", "first_record", "ref", "scale", "test")

    def __init__(
        self,
        ref: np.ndarray,
        test: np.ndarray,
        scale: float | np.ndarray | None = None,
        axis: int | None = None,
        first_record: int = 0,
    ) -> None:
        if ref.shape != test.shape:
            raise ValueError(f"reference shape {ref.shape} differs from test shape {test.shape}")
        self.ref, self.test, self.scale, self.axis, self.first_record = ref, test, scale, axis, first_record

    @property
    def records(self) -> int:
        return self.ref.shape[0]

    @cached_property
    def stats(self) -> RecordStats:
        n = self.records
        f = self.ref.reshape(n, -1).astype(np.float64)
        q = self.test.reshape(n, -1).astype(np.float64)
        d = f - q
        abs_d = np.abs(d)
        empty = f.shape[1] == 0
        return RecordStats(
            count=f.shape[1],
            sq_err=np.einsum("ij,ij->i", d, d),
            abs_err=abs_d.sum(axis=1),
            max_abs_err=np.zeros(n) if empty else abs_d.max(axis=1),
            ref_sq=np.einsum("ij,ij->i", f, f),
            test_sq=np.einsum("ij,ij->i", q, q),
            dot=np.einsum("ij,ij->i", f, q),
            ref_abs=np.abs(f).sum(axis=1),
            ref_min=np.zeros(n) if empty else f.min(axis=1),
            ref_max=np.zeros(n) if empty else f.max(axis=1),
        )

    @cached_property
    def steps(self) -> np.ndarray | None:
        """Per-record max |f - q| in quantization steps, or None without a scale."""
        if self.scale is None:
            return None
        scale = np.asarray(self.scale, dtype=np.float64)
        if scale.size == 1:
            return self.stats.max_abs_err / float(scale.reshape(()))
        shape = [1] * self.ref.ndim
        shape[self.axis if self.axis is not None else 1] = scale.size
        err = np.abs(self.ref.astype(np.float64) - self.test.astype(np.float64)) / scale.reshape(shape)
        return err.reshape(self.records, -1).max(axis=1)
