"""Convolutions: QLinearConv, ConvInteger, QLinearConvTranspose and float Conv, by im2col + GEMM.

The im2col matrix is built from a strided window view in bounded chunks of records and output rows,
and each chunk is one (grouped, batched) BLAS matmul. Integer convolutions stay exact: operands are
small integers and the float type is chosen from a bound on every partial sum (``arith.int_matmul``).
"""

from __future__ import annotations

import math

import numpy as np

from pytest_qaccuracy.backend import arith
from pytest_qaccuracy.backend.registry import kernel
from pytest_qaccuracy.backend.scheme import Scheme

#: elements of one im2col chunk (float32: 32 MiB)
CHUNK_ELEMENTS = 1 << 23


def conv_pads(
    spatial: tuple[int, ...],
    kernel_shape: tuple[int, ...],
    auto_pad: str,
    pads: list[int] | None,
    strides: tuple[int, ...],
    dilations: tuple[int, ...],
) -> list[int]:
    """Begin pads then end pads, resolving ``auto_pad`` as the ONNX spec does."""
    d = len(spatial)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for size, k, s, dil in zip(spatial, kernel_shape, strides, dilations):
            out = -(-size // s)
            total = max(0, (out - 1) * s + (k - 1) * dil + 1 - size)
            small, large = total // 2, total - total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else large)
            end.append(large if auto_pad == "SAME_UPPER" else small)
        return begin + end
    if auto_pad == "VALID" or not pads:
        return [0] * (2 * d)
    return list(pads)


def _windows(xp: np.ndarray, kernel_shape: tuple[int, ...], strides: tuple[int, ...], dilations: tuple[int, ...]) -> np.ndarray:
    """View ``(N, C, *out, *kernel)`` of a padded input (no copy)."""
    d = len(kernel_shape)
    effective = tuple((k - 1) * dil + 1 for k, dil in zip(kernel_shape, dilations))
    view = np.lib.stride_tricks.sliding_window_view(xp, effective, axis=tuple(range(2, 2 + d)))
    index = (slice(None), slice(None), *(slice(None, None, s) for s in strides), *(slice(None, None, dil) for dil in dilations))
    return view[index]


def conv_core(
    xp: np.ndarray, w: np.ndarray, group: int, strides: tuple[int, ...], dilations: tuple[int, ...], dtype: type
) -> np.ndarray:
    """``sum x*w`` over windows of the padded input, as ``dtype`` GEMMs; returns ``(N, M, *out)``.

    Args:
        xp: padded input ``(N, C, *spatial)``, values already exact in ``dtype``.
        w: weights ``(M, C/group, *kernel)``.
        group: number of groups.
        strides: strides per spatial axis.
        dilations: dilations per spatial axis.
        dtype: float type of the GEMMs.
    """
    kernel_shape = w.shape[2:]
    win = _windows(xp, kernel_shape, strides, dilations)
    n, c = xp.shape[:2]
    out_spatial = win.shape[2 : 2 + len(kernel_shape)]
    m = w.shape[0]
    cg, mg = c // group, m // group
    kg = cg * math.prod(kernel_shape)
    win = win.reshape(n, group, cg, *win.shape[2:])
    d = len(kernel_shape)
    # (N, G, O..., Cg, k...) so that a chunk reshapes to (G, rows, Kg)
    order = (1, 0, *range(3, 3 + d), 2, *range(3 + d, 3 + 2 * d))
    wmat = w.reshape(group, mg, kg).transpose(0, 2, 1).astype(dtype)
    out = np.empty((n, m, *out_spatial), dtype=dtype)
    rest = math.prod(out_spatial[1:]) if d > 1 else 1
    per_row = group * kg * rest  # elements for one record and one first-axis output row
    first = out_spatial[0] if d else 1
    rows = max(1, CHUNK_ELEMENTS // max(per_row, 1))
    records = max(1, rows // max(first, 1))
    for n0 in range(0, n, records):
        n1 = min(n, n0 + records)
        row_step = first if n1 - n0 > 1 else min(first, rows)
        for o0 in range(0, first, row_step):  # bounded chunks of output rows, not single pixels
            o1 = min(first, o0 + row_step)
            sub = win[n0:n1, :, :, o0:o1].transpose(order)
            lead = sub.shape[1 : 2 + d]
            cols = np.ascontiguousarray(sub, dtype=dtype).reshape(group, -1, kg)
            res = np.matmul(cols, wmat)  # (G, rows, Mg)
            res = res.reshape(group, *lead, mg)
            res = np.moveaxis(res, -1, 1).reshape(group * mg, *lead)  # (M, n, o, ...)
            out[n0:n1, :, o0:o1] = np.moveaxis(res, 1, 0)
    return out


def _geometry(x: np.ndarray, w: np.ndarray, attrs: dict) -> tuple[list[int], tuple[int, ...], tuple[int, ...], int]:
    d = x.ndim - 2
    kernel_shape = tuple(attrs.get("kernel_shape") or w.shape[2:])
    strides = tuple(attrs.get("strides") or (1,) * d)
    dilations = tuple(attrs.get("dilations") or (1,) * d)
    pads = conv_pads(x.shape[2:], kernel_shape, attrs.get("auto_pad") or "NOTSET", attrs.get("pads"), strides, dilations)
    return pads, strides, dilations, int(attrs.get("group") or 1)


def _pad(x: np.ndarray, pads: list[int], value: float | int) -> np.ndarray:
    d = len(pads) // 2
    if not any(pads):
        return x
    widths = [(0, 0), (0, 0), *zip(pads[:d], pads[d:])]
    return np.pad(x, widths, constant_values=value)


def conv_integer_acc(
    x: np.ndarray, x_zp: np.ndarray | int, w: np.ndarray, w_zp: np.ndarray | int, attrs: dict, scheme: Scheme
) -> np.ndarray:
    """Exact ``sum (x - x_zp)(w - w_zp)`` as int64 ``(N, M, *out)`` (padding contributes 0)."""
    pads, strides, dilations, group = _geometry(x, w, attrs)
    m = w.shape[0]
    w_zp = np.asarray(w_zp, dtype=np.int64)
    ws = w.astype(np.int64) - (w_zp.reshape((m,) + (1,) * (w.ndim - 1)) if w_zp.size > 1 else w_zp)
    xs = x.astype(np.int32) - np.int32(np.asarray(x_zp).reshape(()))
    bound = float(np.abs(xs).max(initial=0)) * float(np.abs(ws).reshape(m, -1).sum(axis=1).max(initial=0))
    if scheme.accumulator == "int16_pairs" and x.dtype == np.uint8 and w.dtype == np.int8:
        return _conv_int16_pairs(x, x_zp, w, w_zp, pads, strides, dilations, group, scheme)
    dtype = np.float32 if bound < 2.0**24 else np.float64
    acc = conv_core(_pad(xs.astype(dtype), pads, 0), ws.astype(dtype), group, strides, dilations, dtype)
    return arith.accumulate(acc.astype(np.int64), scheme)


def _conv_int16_pairs(x, x_zp, w, w_zp, pads, strides, dilations, group, scheme) -> np.ndarray:  # noqa: ANN001
    """im2col on raw values (padding = x_zp), then the int16 pair accumulator of ``arith``."""
    n = x.shape[0]
    kernel_shape = w.shape[2:]
    xp = _pad(x, pads, int(np.asarray(x_zp).reshape(())))
    win = _windows(xp, kernel_shape, strides, dilations)
    d = len(kernel_shape)
    out_spatial = win.shape[2 : 2 + d]
    cg, mg = x.shape[1] // group, w.shape[0] // group
    win = win.reshape(n, group, cg, *win.shape[2:])
    order = (1, 0, *range(3, 3 + d), 2, *range(3 + d, 3 + 2 * d))
    cols = np.ascontiguousarray(win.transpose(order)).reshape(group, -1, cg * math.prod(kernel_shape))
    wmat = w.reshape(group, mg, -1).transpose(0, 2, 1)
    zp_cols = np.broadcast_to(np.asarray(w_zp), (w.shape[0],)).reshape(group, 1, mg)
    acc = arith.zero_point_matmul(cols, x_zp, wmat, zp_cols, scheme)  # (G, rows, Mg)
    acc = acc.reshape(group, n, *out_spatial, mg)
    return np.moveaxis(acc, -1, 1).reshape(group * mg, n, *out_spatial).swapaxes(0, 1)


def _bias_shape(b: np.ndarray, ndim: int) -> np.ndarray:
    return np.asarray(b, dtype=np.int64).reshape((1, -1) + (1,) * (ndim - 2))


@kernel("", "QLinearConv", 10, scheme=True)
def qlinear_conv(
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray,
    w: np.ndarray,
    w_scale: np.ndarray,
    w_zero_point: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray,
    B: np.ndarray | None = None,  # noqa: N803  (ONNX input name)
    *,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
    scheme: Scheme,
) -> tuple[np.ndarray]:
    """int32 accumulate (+ bias), then requantize with the scheme (per output channel scale)."""
    attrs = dict(auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads, strides=strides)
    w = arith.clamp_weights(w, scheme)
    acc = conv_integer_acc(x, x_zero_point, w, w_zero_point, attrs, scheme)
    if B is not None:
        acc = arith.accumulate(acc + _bias_shape(B, acc.ndim), scheme)
    multiplier = arith.real_multiplier([x_scale, np.asarray(w_scale).reshape(-1)], y_scale, scheme)
    multiplier = multiplier.reshape((1, -1) + (1,) * (acc.ndim - 2))
    dtype = np.asarray(y_zero_point).dtype if y_zero_point is not None else x.dtype
    y_zp = 0 if y_zero_point is None else y_zero_point
    return (arith.requantize(acc, multiplier, y_zp, dtype, scheme, "gemm"),)


@kernel("", "ConvInteger", 10, scheme=True)
def conv_integer(
    x: np.ndarray,
    w: np.ndarray,
    x_zero_point: np.ndarray | None = None,
    w_zero_point: np.ndarray | None = None,
    *,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
    scheme: Scheme,
) -> tuple[np.ndarray]:
    """int32 ``sum (x - x_zp)(w - w_zp)``; padding contributes zero."""
    attrs = dict(auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads, strides=strides)
    x_zp = 0 if x_zero_point is None else x_zero_point
    w_zp = 0 if w_zero_point is None else w_zero_point
    acc = conv_integer_acc(x, x_zp, w, w_zp, attrs, scheme.replace(accumulator="wrap32"))
    return (acc.astype(np.int32),)


@kernel("", "Conv", 1, float_op=True)
def conv(
    X: np.ndarray,  # noqa: N803
    W: np.ndarray,  # noqa: N803
    B: np.ndarray | None = None,  # noqa: N803
    *,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> tuple[np.ndarray]:
    """Float convolution (im2col + float BLAS in the input's precision)."""
    attrs = dict(auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads, strides=strides)
    pad_list, stride, dilation, groups = _geometry(X, W, attrs)
    dtype = X.dtype.type
    y = conv_core(_pad(X, pad_list, 0), W.astype(dtype), groups, stride, dilation, dtype)
    if B is not None:
        y += B.astype(dtype).reshape((1, -1) + (1,) * (y.ndim - 2))
    return (y,)
