"""A batch of reference/test tensor values, and the per-record statistics every metric folds.

Metrics never keep arrays: they read the per-record sums below (computed once per batch, in float64,
shared by all metrics) or, for custom metrics, the arrays themselves, and keep only fixed-size state.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from functools import cached_property

import numpy as np

#: The fields of :class:`RecordStats`: per-record sums and extrema over one tensor's elements.
FIELDS = ("sq_err", "abs_err", "max_abs_err", "ref_sq", "test_sq", "ref_abs", "ref_min", "ref_max")
_NEED_DIFF = frozenset({"sq_err", "abs_err", "max_abs_err"})


class RecordStats:
    """Per-record sums over one tensor's elements (each field has shape (records,), float64).

    ==============  =====================  ==============  ======================
    ``sq_err``      sum (f - q)^2          ``ref_sq``      sum f^2
    ``abs_err``     sum |f - q|            ``test_sq``     sum q^2
    ``max_abs_err`` max |f - q|            ``ref_abs``     sum |f|
    ``ref_min``     min f                  ``ref_max``     max f
    ==============  =====================  ==============  ======================

    ``sum(f*q)`` is not a field: it is ``(ref_sq + test_sq - sq_err) / 2``. ``count`` is the number
    of elements per record.

    Only the fields someone reads are computed: those the metrics declare together (``prepare``,
    sharing ``f - q`` and ``|f - q|``), any other on first read. A comparison asking only for SQNR
    thus reads ``f`` twice and ``q`` once and never pays for absolute values, extrema or
    ``sum(q^2)``. Elementwise work runs in the tensors' own float32; every sum is taken over blocks
    of ``BLOCK`` elements by BLAS and the block sums are added in float64 (relative error about
    1e-8, at a quarter of the memory traffic of float64 copies). The inputs are never modified.
    """

    __slots__ = ("_f", "_q", "_values", "count")

    def __init__(self, ref: np.ndarray, test: np.ndarray) -> None:
        n = ref.shape[0]
        self.count = ref.size // n if n else 0
        shape = (n, self.count)
        dtype = np.float64 if np.float64 in (ref.dtype, test.dtype) else np.float32
        self._f = np.ascontiguousarray(ref.reshape(shape), dtype=dtype)
        self._q = np.ascontiguousarray(test.reshape(shape), dtype=dtype)
        self._values: dict[str, np.ndarray] = {}

    def prepare(self, fields: Iterable[str]) -> None:
        """Compute ``fields`` (those not computed yet) together."""
        missing = frozenset(fields) - self._values.keys()
        if missing:
            self._values.update(_compute(self._f, self._q, missing))

    def _get(self, name: str) -> np.ndarray:
        if name not in self._values:
            self.prepare((name,))
        return self._values[name]

    sq_err = property(lambda self: self._get("sq_err"), doc="sum (f - q)^2")
    abs_err = property(lambda self: self._get("abs_err"), doc="sum |f - q|")
    max_abs_err = property(lambda self: self._get("max_abs_err"), doc="max |f - q|")
    ref_sq = property(lambda self: self._get("ref_sq"), doc="sum f^2")
    test_sq = property(lambda self: self._get("test_sq"), doc="sum q^2")
    ref_abs = property(lambda self: self._get("ref_abs"), doc="sum |f|")
    ref_min = property(lambda self: self._get("ref_min"), doc="min f")
    ref_max = property(lambda self: self._get("ref_max"), doc="max f")


def _compute(f: np.ndarray, q: np.ndarray, fields: frozenset[str]) -> dict[str, np.ndarray]:
    """The per-row ``fields`` of (n, m) arrays ``f`` and ``q`` (see :class:`RecordStats`)."""
    out: dict[str, np.ndarray] = {}
    if "ref_sq" in fields:
        out["ref_sq"] = block_dot(f, f)
    if "test_sq" in fields:
        out["test_sq"] = block_dot(q, q)
    if "ref_abs" in fields:
        out["ref_abs"] = block_sum(np.abs(f, out=scratch(1, f.shape, f.dtype)))
    if "ref_min" in fields:
        out["ref_min"] = _row_reduce(np.min, f)
    if "ref_max" in fields:
        out["ref_max"] = _row_reduce(np.max, f)
    if fields & _NEED_DIFF:
        d = np.subtract(f, q, out=scratch(0, f.shape, f.dtype))
        if "sq_err" in fields:
            out["sq_err"] = block_dot(d, d)
        if "abs_err" in fields or "max_abs_err" in fields:
            np.abs(d, out=d)
            if "abs_err" in fields:
                out["abs_err"] = block_sum(d)
            if "max_abs_err" in fields:
                out["max_abs_err"] = _row_reduce(np.max, d)
    return out


def _row_reduce(reduce, a: np.ndarray) -> np.ndarray:
    """Per-row ``reduce`` of an (n, m) array as float64; zeros when rows are empty."""
    if a.shape[1] == 0:
        return np.zeros(a.shape[0])
    return reduce(a, axis=1).astype(np.float64)


class TensorPair:
    """Reference values ``f`` (fp32 model) and test values ``q`` (quantized model) for a batch.

    Both have shape (records, ...); ``scale``/``axis`` describe the quantized tensor's step when it
    has one (a scalar for per-tensor, a vector along ``axis`` for per-channel quantization), and
    ``zero_point`` (of the integer type) its offset and, by its dtype, its integer range.
    """

    __slots__ = ("__dict__", "axis", "first_record", "ref", "scale", "test", "zero_point")

    def __init__(
        self,
        ref: np.ndarray,
        test: np.ndarray,
        scale: float | np.ndarray | None = None,
        axis: int | None = None,
        first_record: int = 0,
        zero_point: np.ndarray | np.integer | None = None,
    ) -> None:
        if ref.shape != test.shape:
            raise ValueError(f"reference shape {ref.shape} differs from test shape {test.shape}")
        self.ref, self.test, self.scale, self.axis, self.first_record = ref, test, scale, axis, first_record
        self.zero_point = zero_point

    @property
    def records(self) -> int:
        return self.ref.shape[0]

    @cached_property
    def stats(self) -> RecordStats:
        """The per-record sums of this batch (see :class:`RecordStats`)."""
        return RecordStats(self.ref, self.test)

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

    @cached_property
    def range_bounds(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(low, high)``: fp32 values ``f`` with ``f < low`` or ``f >= high`` saturate in the quantized
        tensor's QuantizeLinear; None without scale, zero point, or an integer zero-point type.

        ``t = f / scale + zero_point`` saturates when ``rint(t)`` leaves ``[qmin, qmax]``: ``t < qmin - 0.5``
        or ``t >= qmax + 0.5`` (rounding half to even keeps ``qmin - 0.5`` at the even ``qmin`` and sends
        ``qmax + 0.5`` past the odd ``qmax``, for every integer type ONNX quantizes to). Per-channel bounds
        are shaped to broadcast against ``ref`` along ``axis``.
        """
        if self.scale is None or self.zero_point is None:
            return None
        zp = np.asarray(self.zero_point)
        if not np.issubdtype(zp.dtype, np.integer):
            return None
        info = np.iinfo(zp.dtype)
        scale = np.asarray(self.scale, dtype=np.float64)
        zp = zp.astype(np.float64)
        low, high = (info.min - zp - 0.5) * scale, (info.max - zp + 0.5) * scale
        if scale.size > 1:
            shape = [1] * self.ref.ndim
            shape[self.axis % self.ref.ndim if self.axis is not None else 1] = scale.size
            return low.reshape(shape), high.reshape(shape)
        return low.reshape(()), high.reshape(())

    @cached_property
    def saturated(self) -> np.ndarray | None:
        """Per-record count of fp32 elements outside the quantized tensor's range (see
        :attr:`range_bounds`); None when the range is unknown. Records whose min and max lie inside
        every channel's range are not scanned."""
        bounds = self.range_bounds
        if bounds is None:
            return None
        low, high = bounds
        stats = self.stats
        counts = np.zeros(self.records, dtype=np.int64)
        # a record with NaN has NaN extremes: scanned too, its other values may saturate
        suspect = np.flatnonzero(~((stats.ref_min >= low.max()) & (stats.ref_max < high.min())))
        for r in suspect:  # one record at a time: a boolean mask of one record, not of the batch
            f = self.ref[r : r + 1]
            counts[r] = np.count_nonzero(f < low) + np.count_nonzero(f >= high)
        return counts


_local = threading.local()

#: Elements per partial sum (see :attr:`TensorPair.stats`).
BLOCK = 4096


def scratch(slot: int, shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
    """A reusable work array of this thread (fresh multi-MB arrays cost page faults on every batch).

    Slots 0 and 1 belong to :class:`RecordStats`; slot 2 holds dequantized values during an update.
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
    with np.errstate(over="ignore", invalid="ignore"):  # an Inf sum is reported as an undefined metric
        _block_dot_into(total, a, b, k)
    return total


def _block_dot_into(total: np.ndarray, a: np.ndarray, b: np.ndarray, k: int) -> None:
    n, m = a.shape
    if k:
        head = np.matmul(a[:, : k * BLOCK].reshape(n, k, 1, BLOCK), b[:, : k * BLOCK].reshape(n, k, BLOCK, 1))
        total += head.reshape(n, k).sum(axis=1, dtype=np.float64)
    if m > k * BLOCK:
        tail = np.matmul(a[:, k * BLOCK :, np.newaxis].transpose(0, 2, 1), b[:, k * BLOCK :, np.newaxis])
        total += tail.reshape(n).astype(np.float64)


def block_sum(a: np.ndarray) -> np.ndarray:
    """Per-row ``sum(a)`` of an (n, m) array, the same way as :func:`block_dot`."""
    n, m = a.shape
    k = m // BLOCK
    total = a[:, k * BLOCK :].sum(axis=1, dtype=np.float64)
    if k:
        ones = np.ones((BLOCK, 1), a.dtype)
        with np.errstate(over="ignore", invalid="ignore"):
            total += np.matmul(a[:, : k * BLOCK].reshape(n, k, BLOCK), ones).reshape(n, k).sum(axis=1, dtype=np.float64)
    return total
