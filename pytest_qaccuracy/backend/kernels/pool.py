"""Pooling: QLinearAveragePool, QLinearGlobalAveragePool, MaxPool (any dtype), float AveragePool.

Window reductions loop over the kernel taps (a handful), each step vectorised over every record,
channel and pixel; the tap order is ORT's row-major order, so float32 sums round exactly as ORT's do.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import numpy as np

from pytest_qaccuracy.backend import arith
from pytest_qaccuracy.backend.kernels.elementwise import apply_table
from pytest_qaccuracy.backend.registry import NotHandled, kernel
from pytest_qaccuracy.backend.scheme import Scheme

MS = "com.microsoft"


def _pool_geometry(
    shape: tuple[int, ...],
    kernel_shape: list[int],
    strides: list[int] | None,
    pads: list[int] | None,
    auto_pad: str,
    ceil_mode: int,
    dilations: list[int] | None,
    scheme: Scheme,
) -> tuple[list[int], tuple[int, ...], tuple[int, ...], list[int]]:
    """Pads, strides, dilations and output sizes exactly as onnxruntime's ``PoolAttributes`` computes them.

    ``SAME_*`` pads come from the undilated kernel (onnxruntime's legacy rule, which the grid test pins);
    a ``ceil_mode`` window that would start beyond the input and the left pad is dropped; without
    ``ceil_mode`` the size is ``int(span / stride) + 1``. With ``scheme.pool_size_plain`` (onnxruntime
    1.20 and earlier) the ONNX formulas as written: ``int(span / stride + 1)``, no window dropped.
    """
    spatial = shape[2:]
    d = len(spatial)
    if shape[0] and not math.prod(shape[1:]):
        raise ValueError(f"the input {tuple(shape)} holds no value but its batch is not empty (only N may be 0)")
    strides = tuple(strides or (1,) * d)
    dilations = tuple(dilations or (1,) * d)
    begin = list(pads[:d]) if pads and auto_pad in ("", "NOTSET") else [0] * d
    end = list(pads[d:]) if pads and auto_pad in ("", "NOTSET") else [0] * d
    for i, pad in enumerate(begin + end):  # explicit pads (onnxruntime refuses them at the session's start)
        if pad >= (k := kernel_shape[i % d]):
            raise ValueError(f"pad {pad} on spatial axis {i % d} is not smaller than the kernel ({k})")
    out = []
    for i, (size, k, s, dil) in enumerate(zip(spatial, kernel_shape, strides, dilations, strict=False)):
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            needed = (-(-size // s) - 1) * s + k - size  # may be negative: the end pad then crops
            begin[i] = int(needed / 2) if auto_pad == "SAME_UPPER" else int((needed + 1) / 2)
            end[i] = needed - begin[i]
            if begin[i] < 0:
                raise ValueError(f"auto_pad {auto_pad} gives a negative begin pad on spatial axis {i}")
        span = size + begin[i] + end[i] - (k - 1) * dil - 1
        if not ceil_mode:
            n = int(span / s + 1) if scheme.pool_size_plain else int(span / s) + 1
        else:
            n = -(-span // s) + 1
            if not scheme.pool_size_plain and (n - 1) * s >= size + begin[i]:  # must start inside input or left pad
                n -= 1
        if n < 0:
            raise ValueError(f"the window ({k} taps, dilation {dil}) does not fit spatial axis {i} of size {size}")
        out.append(n)
    return begin + end, strides, dilations, out


def _taps(
    x: np.ndarray,
    kernel_shape: list[int],
    strides: tuple[int, ...],
    dilations: tuple[int, ...],
    pads: list[int],
    out: list[int],
    fill: float,
) -> Iterator[np.ndarray]:
    """Yield, per kernel tap in row-major order, the ``(N, C, *out)`` slice it reads (``fill`` outside)."""
    d = len(kernel_shape)
    geometry = zip(out, strides, kernel_shape, dilations, x.shape[2:], strict=True)
    extra = [
        max(0, (o - 1) * s + (k - 1) * dil + 1 - (size + pads[i]) - pads[d + i])
        for i, (o, s, k, dil, size) in enumerate(geometry)
    ]
    widths = [(0, 0), (0, 0), *((pads[i], max(0, pads[d + i] + extra[i])) for i in range(d))]
    xp = np.pad(x, widths, constant_values=fill) if any(p for w in widths for p in w) else x
    for tap in itertools.product(*(range(k) for k in kernel_shape)):
        index = tuple(  # no output on an axis reads nothing (a negative stop would count from the end)
            slice(t * dil, t * dil + (o - 1) * s + 1, s) if o else slice(0, 0)
            for t, dil, o, s in zip(tap, dilations, out, strides, strict=False)
        )
        yield xp[(slice(None), slice(None), *index)]


def _counts(
    shape: tuple[int, ...],
    kernel_shape: list[int],
    strides: tuple[int, ...],
    dilations: tuple[int, ...],
    pads: list[int],
    out: list[int],
    include_pad: int = 0,
) -> np.ndarray:
    """Divisor of every output position, shape ``(1, 1, *out)``: its in-bounds taps, or with
    ``include_pad`` its taps inside the padded extent (onnxruntime clips a ``ceil_mode`` window there)."""
    d = len(kernel_shape)
    if include_pad:
        padded = tuple(size + pads[i] + pads[d + i] for i, size in enumerate(shape[2:]))
        ones = np.ones((1, 1, *padded), np.int64)
        return sum(_taps(ones, kernel_shape, strides, dilations, [0] * (2 * d), out, 0))  # type: ignore[return-value]
    ones = np.ones((1, 1, *shape[2:]), np.int64)
    return sum(_taps(ones, kernel_shape, strides, dilations, pads, out, 0))  # type: ignore[return-value]


def _mean(total: np.ndarray, count: np.ndarray) -> np.ndarray:
    """``total / count``, 0 where a window holds no tap (onnxruntime leaves such outputs at 0)."""
    count = np.asarray(count).astype(total.dtype)
    out = np.zeros(np.broadcast_shapes(total.shape, count.shape), total.dtype)
    return np.divide(total, count, out=out, where=count != 0)


@kernel(MS, "QLinearAveragePool", 1, scheme=True)
def qlinear_average_pool(
    X: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray | None,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None = None,
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    channels_last: int = 0,
    count_include_pad: int = 0,
    kernel_shape: list[int],
    pads: list[int] | None = None,
    strides: list[int] | None = None,
    scheme: Scheme,
) -> tuple[np.ndarray]:
    """Float path of ORT (dequantize table, float32 tap sum, divide, ``rne(y / ys + zp)``), or an
    integer sum and one requantization for fixed-point schemes."""
    if channels_last:
        X = np.moveaxis(X, -1, 1)
    dtype = np.asarray(y_zero_point).dtype if y_zero_point is not None else X.dtype
    pads_, strides_, dil, out = _pool_geometry(X.shape, kernel_shape, strides, pads, auto_pad, ceil_mode, None, scheme)
    # onnxruntime's contrib kernel divides by the whole kernel with count_include_pad, even where a
    # ceil_mode window reaches past the end pad (the grid test pins it)
    count = math.prod(kernel_shape) if count_include_pad else _counts(X.shape, kernel_shape, strides_, dil, pads_, out)
    y_zp = arith.scalar(y_zero_point)
    if scheme.multiplier in ("float32", "float64"):
        ftype = np.float32 if scheme.multiplier == "float32" else np.float64
        lo = arith.qrange(X.dtype)[0]
        table = arith.dequantize(np.arange(lo, lo + 256), x_scale, x_zero_point).astype(ftype)
        values = apply_table(X, table)
        total = np.zeros((*X.shape[:2], *out), ftype)
        for tap in _taps(values, kernel_shape, strides_, dil, pads_, out, 0):
            total += tap
        mean = _mean(total, count)
        y = mean / ftype(np.asarray(y_scale).reshape(()))
        result = arith.requantize_float(y.astype(ftype), y_zp, dtype, scheme, "pool")
    else:
        zp_x = 0 if x_zero_point is None else int(np.asarray(x_zero_point).reshape(()))
        # a counted pad tap holds the real value 0, the zero point; an uncounted one adds nothing
        fill = zp_x if count_include_pad else 0
        acc = sum(t.astype(np.int64) for t in _taps(X, kernel_shape, strides_, dil, pads_, out, fill))
        acc = acc - np.asarray(count) * zp_x
        multiplier = arith.real_multiplier([x_scale], np.asarray(y_scale, np.float64) * count, scheme)
        result = arith.requantize(acc, multiplier, y_zp, dtype, scheme, "pool")
    return (np.moveaxis(result, 1, -1) if channels_last else result,)


@kernel(MS, "QLinearGlobalAveragePool", 1, scheme=True)
def qlinear_global_average_pool(
    X: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray | None,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None = None,
    *,
    channels_last: int = 0,
    scheme: Scheme,
) -> tuple[np.ndarray]:
    """ORT: ``acc = sum x - x_zp * N`` (int32), then requantize by ``x_s / (y_s * N)``."""
    axes = tuple(range(1, X.ndim - 1)) if channels_last else tuple(range(2, X.ndim))
    count = math.prod(X.shape[a] for a in axes)
    if not count:  # onnxruntime: "parameter out of computation range"
        raise ValueError(f"the input {X.shape} has no value to average over its spatial axes {list(axes)}")
    zp_x = 0 if x_zero_point is None else int(np.asarray(x_zero_point).reshape(()))
    # 8-bit sums in 32 bits (exact below 2^24 elements per channel), without an int64 copy of the input
    small = count < 1 << 24
    wide = {np.dtype(np.uint8): np.uint32, np.dtype(np.int8): np.int32}.get(X.dtype, np.int64) if small else np.int64
    acc = X.sum(axis=axes, dtype=wide, keepdims=True).astype(np.int64) - zp_x * count
    if scheme.scale_precision == "float32":
        multiplier = np.float32(
            np.asarray(x_scale, np.float32).reshape(())
            / (np.float32(np.asarray(y_scale).reshape(())) * np.float32(count))
        )
    else:
        multiplier = np.float64(np.asarray(x_scale).reshape(())) / (np.float64(np.asarray(y_scale).reshape(())) * count)
    dtype = np.asarray(y_zero_point).dtype if y_zero_point is not None else X.dtype
    y_zp = 0 if y_zero_point is None else y_zero_point
    return (arith.requantize(acc, np.asarray(multiplier), y_zp, dtype, scheme, "global_pool"),)


@kernel("", "MaxPool", 8, outputs=True, scheme=True)
def max_pool(
    X: np.ndarray,
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    dilations: list[int] | None = None,
    kernel_shape: list[int],
    pads: list[int] | None = None,
    storage_order: int = 0,
    strides: list[int] | None = None,
    n_outputs: int = 1,
    scheme: Scheme,
) -> tuple[np.ndarray]:
    """Max over windows, for float and integer tensors (padding never wins)."""
    if n_outputs > 1:
        raise NotHandled  # Indices output: onnx.reference
    pads_, strides_, dil, out = _pool_geometry(
        X.shape, kernel_shape, strides, pads, auto_pad, ceil_mode, dilations, scheme
    )
    fill = -np.inf if X.dtype.kind == "f" else np.iinfo(X.dtype).min
    result = None
    for tap in _taps(X, kernel_shape, strides_, dil, pads_, out, fill):
        result = tap.copy() if result is None else np.maximum(result, tap, out=result)
    return (result,)


@kernel("", "AveragePool", 7, float_op=True, scheme=True)
def average_pool(
    X: np.ndarray,
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    count_include_pad: int = 0,
    dilations: list[int] | None = None,
    kernel_shape: list[int],
    pads: list[int] | None = None,
    strides: list[int] | None = None,
    scheme: Scheme,
) -> tuple[np.ndarray]:
    pads_, strides_, dil, out = _pool_geometry(
        X.shape, kernel_shape, strides, pads, auto_pad, ceil_mode, dilations, scheme
    )
    total = np.zeros((*X.shape[:2], *out), X.dtype)
    for tap in _taps(X, kernel_shape, strides_, dil, pads_, out, 0):
        total += tap
    if count_include_pad and scheme.pool_size_plain:  # the whole kernel, even past the end pad
        count = np.asarray(math.prod(kernel_shape))
    else:
        count = _counts(X.shape, kernel_shape, strides_, dil, pads_, out, count_include_pad)
    return (_mean(total, count).astype(X.dtype),)


@kernel("", "GlobalAveragePool", 1, float_op=True)
def global_average_pool(X: np.ndarray) -> tuple[np.ndarray]:
    return (X.mean(axis=tuple(range(2, X.ndim)), keepdims=True).astype(X.dtype),)
