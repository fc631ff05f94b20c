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
_NEED_TEST = _NEED_DIFF | {"test_sq"}
#: Elements per chunk of one sweep: a few such float32 chunks stay in a core's L2 cache.
CHUNK = 1 << 16


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

    The fields the metrics declare (``prepare``) are computed together in one sweep over column
    chunks of ``CHUNK`` elements, so each chunk of ``f`` and ``q`` is read from memory once and every
    pass over it (dequantize, subtract, absolute value, sums) runs in cache: the fold is bound by
    memory bandwidth, and whole-array passes read a batch's activations five or six times. A field
    nobody declared is computed on first use by a sweep of its own. Elementwise work runs in the
    tensors' own float32; every sum is taken over blocks of ``BLOCK`` elements by BLAS and the block
    sums are added in float64 (relative error about 1e-8). The inputs are never modified.
    """

    __slots__ = ("_codes", "_dequant", "_f", "_q", "_values", "count")

    def __init__(self, pair: TensorPair) -> None:
        n = pair.records
        self.count = pair.ref.size // n if n else 0
        shape = (n, self.count)
        self._codes = pair._codes.reshape(shape) if pair._codes is not None else None
        if self._codes is not None:
            self._f = np.ascontiguousarray(pair.ref.reshape(shape), dtype=np.float32)
            self._q = None
        else:
            test = pair.test
            dtype = np.float64 if np.float64 in (pair.ref.dtype, test.dtype) else np.float32
            self._f = np.ascontiguousarray(pair.ref.reshape(shape), dtype=dtype)
            self._q = np.ascontiguousarray(test.reshape(shape), dtype=dtype)
        self._dequant = pair._dequant
        self._values: dict[str, np.ndarray] = {}

    def prepare(self, fields: Iterable[str]) -> None:
        """Compute ``fields`` (those not computed yet) in one sweep."""
        missing = frozenset(fields) - self._values.keys()
        if missing:
            self._values.update(_sweep(self._f, self._q, self._codes, self._dequant, missing))

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


def _sweep(
    f: np.ndarray,
    q: np.ndarray | None,
    codes: np.ndarray | None,
    dequant: tuple[np.float32, np.float32] | None,
    fields: frozenset[str],
) -> dict[str, np.ndarray]:
    """The per-row ``fields`` of (n, m) arrays, chunk by chunk (see :class:`RecordStats`)."""
    n, m = f.shape
    sums = {name: np.zeros(n) for name in fields if name not in ("max_abs_err", "ref_min", "ref_max")}
    extrema: dict[str, np.ndarray] = {}
    step = max(BLOCK, CHUNK // max(n, 1) // BLOCK * BLOCK)  # a multiple of BLOCK: the same block sums
    for start in range(0, m, step):
        fc = f[:, start : start + step]
        if "ref_sq" in fields:
            sums["ref_sq"] += block_dot(fc, fc)
        if "ref_abs" in fields:
            sums["ref_abs"] += block_sum(np.abs(fc, out=scratch(1, fc.shape, fc.dtype)))
        if "ref_min" in fields:
            _running(extrema, "ref_min", fc.min(axis=1), np.minimum)
        if "ref_max" in fields:
            _running(extrema, "ref_max", fc.max(axis=1), np.maximum)
        if not fields & _NEED_TEST:
            continue
        if codes is None:
            qc = q[:, start : start + step]
        else:  # (codes - zero point) * scale in float32: what QuantParams.dequantize computes
            qc = np.subtract(codes[:, start : start + step], dequant[1], out=scratch(0, fc.shape), dtype=np.float32)
            np.multiply(qc, dequant[0], out=qc)
        if "test_sq" in fields:
            sums["test_sq"] += block_dot(qc, qc)
        if not fields & _NEED_DIFF:
            continue
        d = np.subtract(fc, qc, out=scratch(3, fc.shape, fc.dtype))
        if "sq_err" in fields:
            sums["sq_err"] += block_dot(d, d)
        if "abs_err" in fields or "max_abs_err" in fields:
            np.abs(d, out=d)
            if "abs_err" in fields:
                sums["abs_err"] += block_sum(d)
            if "max_abs_err" in fields:
                _running(extrema, "max_abs_err", d.max(axis=1), np.maximum)
    for name in ("max_abs_err", "ref_min", "ref_max"):
        if name in fields:
            value = extrema.get(name)
            sums[name] = np.zeros(n) if value is None else value.astype(np.float64)
    return sums


def _running(extrema: dict[str, np.ndarray], name: str, value: np.ndarray, combine) -> None:
    previous = extrema.get(name)
    extrema[name] = value if previous is None else combine(previous, value)


class TensorPair:
    """Reference values ``f`` (fp32 model) and test values ``q`` (quantized model) for a batch.

    Both have shape (records, ...); ``scale``/``axis`` describe the quantized tensor's step when it
    has one (a scalar for per-tensor, a vector along ``axis`` for per-channel quantization).
    :meth:`from_codes` builds a pair from per-tensor integer codes, dequantized chunk by chunk
    while the statistics are computed (``test`` is dequantized whole only if someone reads it).
    """

    __slots__ = ("__dict__", "_codes", "_dequant", "_test", "axis", "first_record", "ref", "scale")

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
        self.ref, self._test, self.scale, self.axis, self.first_record = ref, test, scale, axis, first_record
        self._codes: np.ndarray | None = None
        self._dequant: tuple[np.float32, np.float32] | None = None

    @classmethod
    def from_codes(
        cls, ref: np.ndarray, codes: np.ndarray, scale: float, zero_point: float, first_record: int = 0
    ) -> TensorPair:
        """A pair whose test values are ``(codes - zero_point) * scale`` (per-tensor, float32).

        The values are bit-identical to DequantizeLinear's (the subtraction is exact in float32 for
        8- and 16-bit codes); ``ref`` must be float32.
        """
        if ref.shape != codes.shape:
            raise ValueError(f"reference shape {ref.shape} differs from test shape {codes.shape}")
        pair = cls.__new__(cls)
        pair.ref, pair._test, pair.scale, pair.axis, pair.first_record = ref, None, scale, None, first_record
        pair._codes = codes
        pair._dequant = (np.float32(scale), np.float32(zero_point))
        return pair

    @property
    def test(self) -> np.ndarray:
        """The test values (dequantized on first read for a pair made by :meth:`from_codes`)."""
        if self._test is None:
            scale, zero_point = self._dequant
            test = np.subtract(self._codes, zero_point, dtype=np.float32)
            self._test = np.multiply(test, scale, out=test)
        return self._test

    @property
    def records(self) -> int:
        return self.ref.shape[0]

    @cached_property
    def stats(self) -> RecordStats:
        """The per-record sums of this batch (see :class:`RecordStats`)."""
        return RecordStats(self)

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

    Slots 0, 1 and 3 belong to :class:`RecordStats`' sweep; slot 2 holds dequantized values during an update.
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
