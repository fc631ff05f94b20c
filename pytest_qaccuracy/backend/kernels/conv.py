"""Convolution kernels: QLinearConv, ConvInteger and float Conv.

The kernels resolve the ONNX attributes and the integer arithmetic; :func:`conv_integer_acc` sizes
the exact float type from a bound on every partial sum, adds the int16 pair saturation where the
scheme has it (``conv_pairs``), and hands the sums to
:func:`~pytest_qaccuracy.backend.kernels.conv_core.conv_core`, which computes them chunk by chunk.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Hashable

import numpy as np

from pytest_qaccuracy.backend import arith, neon_pairs
from pytest_qaccuracy.backend.kernels import conv_ort, conv_pairs
from pytest_qaccuracy.backend.kernels.conv_chunks import conv_pads, output_shape
from pytest_qaccuracy.backend.kernels.conv_core import Epilogue, conv_core
from pytest_qaccuracy.backend.registry import kernel
from pytest_qaccuracy.backend.scheme import Scheme


def _geometry(
    x: np.ndarray, w: np.ndarray, attrs: dict
) -> tuple[list[int], tuple[int, ...], tuple[int, ...], int, tuple[int, ...]]:
    """Pads, strides, dilations, group and the output's spatial shape, every axis of it non-empty."""
    d = x.ndim - 2
    kernel_shape = tuple(attrs.get("kernel_shape") or w.shape[2:])
    strides = tuple(attrs.get("strides") or (1,) * d)
    dilations = tuple(attrs.get("dilations") or (1,) * d)
    pads = conv_pads(
        x.shape[2:], kernel_shape, attrs.get("auto_pad") or "NOTSET", attrs.get("pads"), strides, dilations
    )
    padded = tuple(s + pads[i] + pads[d + i] for i, s in enumerate(x.shape[2:]))
    out = output_shape(padded, kernel_shape, strides, dilations)
    if any(size <= 0 for size in out):  # onnxruntime: "Invalid input shape"
        raise ValueError(f"the input's spatial shape {x.shape[2:]}, padded {padded}, leaves no output position {out}")
    return pads, strides, dilations, int(attrs.get("group") or 1), out


@dataclasses.dataclass(frozen=True, slots=True)
class Requantizer:
    """How exact sums become a convolution's output chunk by chunk: ``bias`` (int64 per output
    channel, or None) is added to them first, then ``finish(chunk, dest)`` writes ``dest`` (of
    ``dtype``); the chunk is scratch and may be overwritten."""

    bias: np.ndarray | None
    finish: Epilogue
    dtype: np.dtype


def conv_integer_acc(
    x: np.ndarray,
    x_zp: np.ndarray | int,
    w: np.ndarray,
    w_zp: np.ndarray | int,
    attrs: dict,
    scheme: Scheme,
    requantizer_for: Callable[[float, type], Requantizer | None] | None = None,
    source: tuple[np.ndarray, Hashable] | None = None,
) -> tuple[np.ndarray, float, bool]:
    """Exact ``sum (x - x_zp)(w - w_zp)`` as ``(N, M, *out)``, padding contributing 0.

    ``requantizer_for(bound, float type)`` may supply a :class:`Requantizer` (when it is exact for
    sums under ``bound``), which then runs on each chunk while it is in cache, after the bias is added
    to the chunk (exact: the requantizer is made only where the sums plus the bias stay exact).
    ``source``: ``(array, key)`` when ``w`` is derived from the constant ``array`` and ``key`` alone
    (a session's weights): large 2-D convolutions with exact float32 sums then run in onnxruntime
    (``conv_ort``).

    Returns:
        the accumulator (a float array holding exact integers, or int64 for the int16-pair
        accumulator), or the requantizer's output; a bound on the accumulator's magnitude; and whether
        the requantizer ran.
    """
    pads, strides, dilations, group, out_spatial = _geometry(x, w, attrs)
    m = w.shape[0]
    w_zp = np.asarray(w_zp, dtype=np.int64)
    ws = w.astype(np.int64) - (w_zp.reshape((m,) + (1,) * (w.ndim - 1)) if w_zp.size > 1 else w_zp)
    x_zp = np.asarray(x_zp).reshape(()).astype(np.int64)
    w_sum = float(np.abs(ws).reshape(m, -1).sum(axis=1).max(initial=0))
    x_range = 0
    if x.dtype.kind in "iu":  # the type's range first: no pass over the input when it is small enough
        info = np.iinfo(x.dtype)
        x_range = max(abs(int(info.max) - int(x_zp)), abs(int(info.min) - int(x_zp)))
    if (x.dtype.kind not in "iu" or x_range * w_sum >= 2.0**23) and x.size:  # then the data's own range
        x_range = max(abs(int(x.max()) - int(x_zp)), abs(int(x.min()) - int(x_zp)))
    bound = float(x_range) * w_sum
    # MLAS's depthwise kernel sums exactly; the others saturate u8 x s8 pairs on CPUs without VNNI
    correction, correction_max = None, 0.0
    depthwise = group == x.shape[1] == w.shape[0]
    # an input with no pixel but padding still has outputs (every axis has some, ``_geometry``), whose
    # pairs read only the zero point
    has_outputs = x.shape[0] > 0
    if arith.saturates_pairs(scheme, x.dtype, w.dtype) and not depthwise and has_outputs:
        correction = conv_pairs.pair_corrections(x, int(x_zp), w, group, pads, strides, dilations, out_spatial)
        if correction is not None:  # |exact + correction| <= bound + max|correction|
            correction_max = float(correction.max_abs())
            bound += correction_max
    wrapped = None  # ARM64's int16 pairs that wrap: added after the sums (rare: -128 weights)
    if scheme.neon_pair_wrap and not depthwise and has_outputs:
        wrapped = neon_pairs.conv_correction(
            x, int(x_zp), w, group, pads, strides, dilations, out_spatial, int8_inputs=scheme.neon_int8_conv_pairs
        )
    if scheme.depthwise_pair_wrap and depthwise and has_outputs:
        wrapped = neon_pairs.depthwise_correction(x, int(x_zp), w, w_zp, pads, strides, dilations, out_spatial)
    if wrapped is not None:
        bound += float(np.abs(wrapped).max(initial=0))
        requantizer_for = None
    dtype = np.float32 if bound < 2.0**24 else np.float64
    requantizer = requantizer_for(bound, dtype) if requantizer_for else None
    # onnxruntime's float32 Conv sums exactly under the bound
    weights, macs = None, x.shape[0] * w.size * math.prod(out_spatial)
    if source is not None and x.ndim == 4 and dtype is np.float32 and conv_ort.worth_it(macs):
        weights = (source[0], (source[1], w_zp.tobytes()))
    added = None if requantizer is None else requantizer.bias
    epilogue = None if requantizer is None else (requantizer.finish, requantizer.dtype)
    acc = conv_core(
        x,
        ws.astype(dtype),
        group,
        strides,
        dilations,
        dtype,
        epilogue,
        exact=True,
        pads=pads,
        offset=x_zp,
        bias=None if added is None else added.astype(dtype),
        correction=correction,
        weights=weights,
    )
    if wrapped is not None:
        acc = acc.astype(np.float64) + wrapped  # exact: |sums| <= bound < 2**53
    return acc, bound, epilogue is not None


def _requantize_conv(
    acc: np.ndarray,
    bound: float,
    bias: np.ndarray | None,
    multiplier: np.ndarray,
    y_zp: np.ndarray | int,
    dtype: np.dtype,
    scheme: Scheme,
) -> np.ndarray:
    """Add the bias and requantize; stays in float when every value is an exact float32 integer."""
    bias_max = float(np.abs(bias).max(initial=0)) if bias is not None else 0.0
    exact_in_float = acc.dtype.kind == "f" and bound + bias_max < (2.0**24 if acc.dtype == np.float32 else 2.0**53)
    if exact_in_float and scheme.multiplier in ("float32", "float64") and bound + bias_max < 2.0**31:
        if bias is not None:
            acc += bias.astype(acc.dtype)  # exact: no int32 overflow, no float rounding
        return arith.requantize(acc, multiplier, y_zp, dtype, scheme, "gemm", overwrite=True)
    acc = arith.accumulate(acc.astype(np.int64), scheme)
    if bias is not None:
        acc = arith.accumulate(acc + bias.astype(np.int64), scheme)
    return arith.requantize(acc, multiplier, y_zp, dtype, scheme, "gemm")


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
    B: np.ndarray | None = None,
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
    attrs = dict(
        auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads, strides=strides
    )
    source = (w, (scheme.weight_bits, scheme.reduce_range))
    w = arith.clamp_weights(w, scheme)
    multiplier = arith.real_multiplier([x_scale, np.asarray(w_scale).reshape(-1)], y_scale, scheme)
    dtype = np.asarray(y_zero_point).dtype if y_zero_point is not None else x.dtype
    y_zp = 0 if y_zero_point is None else y_zero_point
    bias = None if B is None else np.asarray(B).reshape((-1,) + (1,) * (x.ndim - 2))
    multiplier = multiplier.reshape((-1,) + (1,) * (x.ndim - 2))

    def requantizer_for(bound: float, ftype: type) -> Requantizer | None:
        """Requantize each chunk in float while it is in cache, when that is exact (see ``_requantize_conv``)."""
        bias_max = float(np.abs(bias).max(initial=0)) if bias is not None else 0.0
        kind_type = {"float32": np.float32, "float64": np.float64}.get(scheme.multiplier)
        if kind_type is not ftype or bound + bias_max >= (2.0**24 if ftype is np.float32 else 2.0**31):
            return None
        m = multiplier.astype(ftype)

        def finish(chunk: np.ndarray, dest: np.ndarray) -> None:
            np.multiply(chunk, m, out=chunk)
            arith.requantize_float(chunk, y_zp, dtype, scheme, "gemm", out=dest)

        return Requantizer(None if bias is None else bias.reshape(-1).astype(np.int64), finish, np.dtype(dtype))

    acc, bound, done = conv_integer_acc(x, x_zero_point, w, w_zero_point, attrs, scheme, requantizer_for, source)
    if not done:
        acc = _requantize_conv(acc, bound, bias, multiplier, y_zp, dtype, scheme)
    return (acc,)


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
    attrs = dict(
        auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads, strides=strides
    )
    x_zp = 0 if x_zero_point is None else x_zero_point
    w_zp = 0 if w_zero_point is None else w_zero_point
    # onnxruntime's ConvInteger sums exactly on every x86 CPU: no pair saturation, AVX2 included
    exact = scheme.replace(accumulator="wrap32", pair_saturation=False, neon_pair_wrap=False, depthwise_pair_wrap=False)
    acc, _, _ = conv_integer_acc(x, x_zp, w, w_zp, attrs, exact, source=(w, "ConvInteger"))
    acc = arith.accumulate(acc.astype(np.int64), exact)
    return (acc.astype(np.int32),)


@kernel("", "Conv", 1, float_op=True)
def conv(
    X: np.ndarray,
    W: np.ndarray,
    B: np.ndarray | None = None,
    *,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> tuple[np.ndarray]:
    """Float convolution (im2col + float BLAS in the input's precision)."""
    attrs = dict(
        auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads, strides=strides
    )
    pad_list, stride, dilation, groups, _ = _geometry(X, W, attrs)
    dtype = X.dtype.type
    y = conv_core(X, W.astype(dtype), groups, stride, dilation, dtype, pads=pad_list)
    if B is not None:
        y += B.astype(dtype).reshape((-1,) + (1,) * (X.ndim - 2))
    return (y,)
