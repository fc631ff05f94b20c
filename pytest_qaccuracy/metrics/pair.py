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
    """Per-record sums over one tensor's elements (each field has shape (records,)).

    ``sum(f*q)`` is not stored: it is ``(ref_sq + test_sq - sq_err) / 2``.
    """

    count: int  # elements per record
    sq_err: np.ndarray  # sum (f - q)^2
    abs_err: np.ndarray  # sum |f - q|
    max_abs_err: np.ndarray  # max |f - q|
    ref_sq: np.ndarray  # sum f^2
    test_sq: np.ndarray  # sum q^2
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
        # Elementwise work runs in the tensors' own float32; every sum is taken over blocks of
        # BLOCK elements by BLAS (single-threaded at that size) and the block sums are added in
        # float64: relative error about 1e-8, at a quarter of the memory traffic of float64 copies.
        # The inputs are never modified: custom metrics may read them after.
        n = self.records
        m = self.ref.size // n if n else 0
        if m == 0:
            zeros = np.zeros(n)
            return RecordStats(0, zeros, zeros, zeros, zeros, zeros, zeros, zeros, zeros)
        dtype = np.float64 if np.float64 in (self.ref.dtype, self.test.dtype) else np.float32
        f = np.ascontiguousarray(self.ref.reshape(n, m), dtype=dtype)
        q = np.ascontiguousarray(self.test.reshape(n, m), dtype=dtype)
        ref_sq, test_sq = block_dot(f, f), block_dot(q, q)
        d = np.subtract(f, q, out=scratch(0, (n, m), dtype))
        sq_err = block_dot(d, d)
        np.abs(d, out=d)
        abs_f = np.abs(f, out=scratch(1, (n, m), dtype))
        return RecordStats(
            count=m,
            sq_err=sq_err,
            abs_err=block_sum(d),
            max_abs_err=d.max(axis=1).astype(np.float64),
            ref_sq=ref_sq,
            test_sq=test_sq,
            ref_abs=block_sum(abs_f),
            ref_min=f.min(axis=1).astype(np.float64),
            ref_max=f.max(axis=1).astype(np.float64),
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

#: Elements per partial sum (see :attr:`TensorPair.stats`).
BLOCK = 4096


def scratch(slot: int, shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
    """A reusable work array of this thread (fresh multi-MB arrays cost page faults on every batch).

    Slots 0-1 belong to :attr:`TensorPair.stats`; slot 2 holds dequantized values during an update.
    The contents are only valid until the same slot is asked for again on this thread.
    """
    buffers = getattr(_local, "buffers", None)
    if buffers is None:
        buffers = _local.buffers = {}
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    buffer = buffers.get(slot)
    if buffer is None or buffer.size < size:
        buffer = buffers[slot] = np.empty(size, np.uint8)
    return buffer[:size].view(dtype).reshape(shape)


def block_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per-row ``sum(a * b)`` of (n, m) arrays: block partial sums by BLAS, added in float64."""
    n, m = a.shape
    k = m // BLOCK
    total = np.zeros(n)
    if k:
        head = np.matmul(a[:, : k * BLOCK].reshape(n, k, 1, BLOCK), b[:, : k * BLOCK].reshape(n, k, BLOCK, 1))
        total += head.reshape(n, k).sum(axis=1, dtype=np.float64)
    if m > k * BLOCK:
        tail = np.matmul(a[:, k * BLOCK :, np.newaxis].transpose(0, 2, 1), b[:, k * BLOCK :, np.newaxis])
        total += tail.reshape(n).astype(np.float64)
    return total


def block_sum(a: np.ndarray) -> np.ndarray:
    """Per-row ``sum(a)`` of an (n, m) array, the same way as :func:`block_dot`."""
    n, m = a.shape
    k = m // BLOCK
    total = a[:, k * BLOCK :].sum(axis=1, dtype=np.float64)
    if k:
        ones = np.ones((BLOCK, 1), a.dtype)
        total += np.matmul(a[:, : k * BLOCK].reshape(n, k, BLOCK), ones).reshape(n, k).sum(axis=1, dtype=np.float64)
    return total
