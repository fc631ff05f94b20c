"""A batch of reference/test tensor values, and the per-record statistics every metric folds.

Metrics never keep arrays: they read the per-record sums below (computed once per batch, in float64,
shared by all metrics) or, for custom metrics, the arrays themselves, and keep only fixed-size state.
"""

from __future__ import annotations

import threading
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
        # Sums run through BLAS in float64 (row dot products), several times faster than einsum and
        # exact to float64 rounding; the inputs are never modified (custom metrics may read them).
        n = self.records
        m = self.ref.size // n if n else 0
        if m == 0:
            zeros = np.zeros(n)
            return RecordStats(0, zeros, zeros, zeros, zeros, zeros, zeros, zeros, zeros, zeros)
        f = scratch(0, (n, m))
        np.copyto(f, self.ref.reshape(n, m))
        q = self.test.reshape(n, m)
        if q.dtype != np.float64:
            buffer = scratch(1, (n, m))
            np.copyto(buffer, q)
            q = buffer
        ones = np.ones(m)
        ref_sq, test_sq, dot = _row_dot(f, f), _row_dot(q, q), _row_dot(f, q)
        d = np.subtract(f, q, out=scratch(2, (n, m)))
        sq_err = _row_dot(d, d)
        np.abs(d, out=d)
        ref_min, ref_max = f.min(axis=1), f.max(axis=1)
        np.abs(f, out=f)
        return RecordStats(
            count=m,
            sq_err=sq_err,
            abs_err=d @ ones,
            max_abs_err=d.max(axis=1),
            ref_sq=ref_sq,
            test_sq=test_sq,
            dot=dot,
            ref_abs=f @ ones,
            ref_min=ref_min,
            ref_max=ref_max,
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


_local = threading.local()


def scratch(slot: int, shape: tuple[int, ...]) -> np.ndarray:
    """A reusable float64 work array of this thread (fresh multi-MB arrays cost page faults per batch).

    Slots 0-2 belong to :attr:`TensorPair.stats`; slot 3 holds dequantized values during an update.
    The contents are only valid until the same slot is asked for again on this thread.
    """
    buffers = getattr(_local, "buffers", None)
    if buffers is None:
        buffers = _local.buffers = [np.empty(0) for _ in range(4)]
    size = int(np.prod(shape))
    if buffers[slot].size < size:
        buffers[slot] = np.empty(size)
    return buffers[slot][:size].reshape(shape)


def _row_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per-row dot products of two (n, m) float64 arrays, through BLAS."""
    return np.matmul(a[:, np.newaxis, :], b[:, :, np.newaxis]).reshape(a.shape[0])
