"""Softmax: com.microsoft QLinearSoftmax (ORT's exp table) and float Softmax."""

from __future__ import annotations

import math

import numpy as np

from pytest_qaccuracy.backend import arith
from pytest_qaccuracy.backend.registry import kernel
from pytest_qaccuracy.backend.scheme import Scheme

MS = "com.microsoft"
_FLT_MAX = float(np.finfo(np.float32).max)


def _exp_table(x_scale: float, reduce_len: int) -> np.ndarray:
    """``table[i] = f32(exp((i - 255 + shift) * x_s))``, the shift keeping the float32 sum finite.

    onnxruntime takes the shift's logarithm of a float (``FLT_MAX / reduce_len``), so C++ calls its
    float overload: the log is rounded to float32 before the double arithmetic goes on. The rounding
    moves every entry by a common factor, which cancels in ``t / sum t`` except at rounding
    boundaries: one output step on a real 6625-class recognizer.
    """
    log = float(np.float32(math.log(float(np.float32(_FLT_MAX) / np.float32(reduce_len)))))
    shift = max(0.0, log - 5.0) / x_scale
    i = np.arange(256, dtype=np.float64)
    return np.exp((i - 255.0 + shift) * x_scale).astype(np.float32)


_INT32_MIN = -(2**31)


def _quotients(
    values: np.ndarray, total: np.ndarray, inv: np.float32, zp: int, dtype: np.dtype, scheme: Scheme
) -> np.ndarray:
    """``rne(t * inv / sum t) + zp`` as int64, before the clip.

    onnxruntime 1.32 (``softmax_float64``) computes in float64, so nothing overflows. Earlier ones
    compute in float32: ``t * inv`` passes FLT_MAX when ``y_scale < 1 / (148 n)`` (``t <= FLT_MAX / (n
    e^5)``), and the conversion of that infinity decides the output, to which the zero point is added in
    32 bits. x86 gives 0 for the uint8 kernel (a 64-bit conversion truncated to 32 bits) and INT32_MIN
    for the int8 one (measured on onnxruntime 1.18.0 and 1.31.0: the uint8 output is the zero point);
    ARM64 saturates (``saturating_conversion``): UINT32_MAX and INT32_MAX (measured on 1.18.0, 1.20.1,
    1.24.4 and 1.29.0's aarch64 wheels: uint8 gives ``zp - 1``, 255 for zero point 0).
    """
    if scheme.softmax_float64:
        y = values.astype(np.float64) * float(inv) / total.astype(np.float64)
        return arith.round_float(y, "half_even").astype(np.int64) + zp
    with np.errstate(over="ignore"):
        scaled = (values * inv).astype(np.float32)
    y = scaled / total
    over = np.isinf(y)
    q = arith.round_float(np.where(over, 0.0, y), "half_even").astype(np.int64) + zp
    if over.any():  # the converted infinity plus the zero point, wrapped in 32 bits
        if dtype == np.uint8:
            q[over] = (2**32 - 1 + zp) % 2**32 if scheme.saturating_conversion else zp
        else:
            base = 2**31 - 1 if scheme.saturating_conversion else _INT32_MIN
            q[over] = (base + zp + 2**31) % 2**32 - 2**31
    return q


@kernel(MS, "QLinearSoftmax", 1, scheme=True)
def qlinear_softmax(
    X: np.ndarray,
    X_scale: np.ndarray,
    x_zero_point: np.ndarray | None,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None = None,
    *,
    axis: int = -1,
    opset: int,
    scheme: Scheme,
) -> tuple[np.ndarray]:
    """ORT: rows shifted so their max reads table[255]; ``y = rne(t * floor(1/y_s) / sum t) + zp``.

    The float32 sum runs sequentially along the row (``np.cumsum`` keeps that order); the quotient is
    float32 or float64 as the scheme says (:func:`_quotients`).
    """
    axis = axis % X.ndim
    dtype = np.asarray(y_zero_point).dtype if y_zero_point is not None else X.dtype
    if not X.size:  # no row, or rows of no value: onnxruntime returns the empty output
        return (np.empty(X.shape, dtype),)
    rows = X.reshape(int(np.prod(X.shape[:axis])), -1) if opset < 13 else np.moveaxis(X, axis, -1)
    flat = rows.reshape(-1, rows.shape[-1])
    table = _exp_table(float(np.asarray(X_scale).reshape(())), flat.shape[-1])
    index = flat.astype(np.int64) - flat.max(axis=-1, keepdims=True).astype(np.int64) + 255
    values = table[index]
    total = np.cumsum(values, axis=-1, dtype=np.float32)[:, -1:]
    inv = np.float32(math.floor(np.float32(1.0) / np.float32(np.asarray(y_scale).reshape(()))))
    zp = 0 if y_zero_point is None else int(np.asarray(y_zero_point).reshape(()))
    q = _quotients(values, total, inv, zp, dtype, scheme)
    lo, hi = arith.qrange(dtype)
    if dtype == np.int8 and scheme.softmax_int8_wraps:  # the uint8 clip, then the low byte: 128 is -128
        out = ((np.minimum(q, 255) + 128) % 256 - 128).astype(dtype).reshape(rows.shape)
    else:
        out = np.clip(q, lo, hi).astype(dtype).reshape(rows.shape)
    if opset < 13:
        return (out.reshape(X.shape),)
    return (np.moveaxis(out, -1, axis),)


@kernel("", "Softmax", 13, float_op=True)
def softmax(input: np.ndarray, *, axis: int = -1) -> tuple[np.ndarray]:
    e = np.exp(input - input.max(axis=axis, keepdims=True))
    return ((e / e.sum(axis=axis, keepdims=True)).astype(input.dtype),)
