"""Integer arithmetic of quantized kernels: ranges, rounding, fixed-point multipliers, requantize, GEMM.

Everything here is vectorised numpy on int64/float arrays. Formulas follow the backends' public
sources (gemmlowp's ``fixedpoint.h``, TFLite's ``kernels/internal/common.h``, onnxruntime's MLAS
requantization, Glow's ``Quantization.cpp``; docs/backend.md, Sources); the gemmlowp names are kept so
they can be checked line by line against ``fixedpoint.h``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pytest_qaccuracy.backend import neon_pairs, pairs, parallel
from pytest_qaccuracy.backend.scheme import Rounding, Scheme

#: Saturation range of each integer type (ONNX QuantizeLinear table).
QRANGES: dict[np.dtype, tuple[int, int]] = {
    np.dtype(t): (int(np.iinfo(t).min), int(np.iinfo(t).max))
    for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32)
}
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
_F32_EXACT = 2.0**24
_F64_EXACT = 2.0**53


def scalar(value: np.ndarray | None, default: int = 0) -> np.ndarray | int:
    """A per-tensor scale or zero point as a 0-d array; ``default`` for an omitted optional input."""
    return default if value is None else np.asarray(value).reshape(())


def qrange(dtype: np.dtype | type) -> tuple[int, int]:
    """``(qmin, qmax)`` of an integer dtype."""
    return QRANGES[np.dtype(dtype)]


def saturate(x: np.ndarray, dtype: np.dtype | type) -> np.ndarray:
    """Clamp integers (or integral floats) to ``dtype``'s range and cast."""
    lo, hi = qrange(dtype)
    return np.clip(x, lo, hi).astype(dtype)


# ----------------------------------------------------------------------------------------------
# Rounding


def round_float(x: np.ndarray, mode: Rounding) -> np.ndarray:
    """Round a float array to integral values (same dtype); exact at ``.5`` ties.

    ``half_up`` is not ``floor(x + 0.5)``: that sum is itself rounded (0.49999997 + 0.5 == 1.0 in
    float32), so the fraction is compared instead.
    """
    if mode == "half_even":
        return np.rint(x)
    if mode == "floor":
        return np.floor(x)
    if mode == "half_up":
        f = np.floor(x)
        return f + (x - f >= 0.5)
    if mode == "half_away":
        a = np.abs(x)
        f = np.floor(a)
        return np.copysign(f + (a - f >= 0.5), x)
    raise ValueError(f"unknown rounding mode '{mode}'")


def round_shift(x: np.ndarray, n: np.ndarray | int, mode: Rounding) -> np.ndarray:
    """``x / 2**n`` rounded with ``mode``, for int64 ``x`` and ``0 <= n <= 62`` (broadcast)."""
    x = np.asarray(x, dtype=np.int64)
    n = np.asarray(n, dtype=np.int64)
    half = (np.int64(1) << n) >> 1
    if mode == "floor":
        return x >> n
    if mode == "half_up":
        return (x + half) >> n
    if mode == "half_away":
        a = (np.abs(x) + half) >> n
        return np.where(x < 0, -a, a)
    if mode == "half_even":
        q = x >> n
        r = x - (q << n)
        up = (r > half) | ((r == half) & (half > 0) & ((q & 1) == 1))
        return q + up
    raise ValueError(f"unknown rounding mode '{mode}'")


def shift_right(x: np.ndarray, n: np.ndarray | int, mode: Rounding) -> np.ndarray:
    """Rounding right shift for ``n >= 0``, plain left shift by ``-n`` for ``n < 0``."""
    n = np.asarray(n, dtype=np.int64)
    right = round_shift(x, np.clip(n, 0, 62), mode)
    return np.where(n < 0, np.asarray(x, dtype=np.int64) << np.clip(-n, 0, 62), right)


# ----------------------------------------------------------------------------------------------
# Fixed point (gemmlowp / TFLite)


def quantize_multiplier(m: np.ndarray | float, bits: int = 31) -> tuple[np.ndarray, np.ndarray]:
    """TFLite ``QuantizeMultiplier``: ``m ~= q * 2**(shift - bits)`` with ``q`` in ``[2**(bits-1), 2**bits)``.

    ``q`` is rounded half away from zero (``std::round``); ``q == 2**bits`` renormalises; multipliers
    with ``shift < -31`` flush to zero, as TFLite does (whatever the multiplier's width).
    """
    f, shift = np.frexp(np.asarray(m, dtype=np.float64))
    q = round_float(f * 2.0**bits, "half_away").astype(np.int64)
    full = q == (1 << bits)
    q = np.where(full, q // 2, q)
    shift = np.where(full, shift + 1, shift).astype(np.int64)
    tiny = shift < -31
    return np.where(tiny, 0, q), np.where(tiny, 0, shift)


def srdhm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """gemmlowp ``SaturatingRoundingDoublingHighMul`` on int32 values held in int64 (half up)."""
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    ab = a * b
    nudge = np.where(ab >= 0, np.int64(1 << 30), np.int64(1 - (1 << 30)))
    t = ab + nudge
    q = np.where(t >= 0, t >> 31, -((-t) >> 31))  # C++ division truncates toward zero
    return np.where((a == INT32_MIN) & (b == INT32_MIN), INT32_MAX, q)


def rounding_divide_by_pot(x: np.ndarray, exponent: np.ndarray | int) -> np.ndarray:
    """gemmlowp ``RoundingDivideByPOT``: ``x / 2**exponent``, round half away from zero."""
    x = np.asarray(x, dtype=np.int64)
    e = np.asarray(exponent, dtype=np.int64)
    mask = (np.int64(1) << e) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0)
    return (x >> e) + (remainder > threshold)


def multiply_by_quantized_multiplier(
    x: np.ndarray,
    q: np.ndarray,
    shift: np.ndarray,
    *,
    bits: int = 31,
    double_rounding: bool = False,
    rounding: Rounding = "half_up",
    offset: np.ndarray | int = 0,
) -> np.ndarray:
    """TFLite ``MultiplyByQuantizedMultiplier``: ``x * q * 2**(shift - bits)`` rounded.

    Double rounding is gemmlowp's SRDHM (half up) then RoundingDivideByPOT (half away). Single
    rounding is one shift of the exact int64 product with ``rounding``; ``offset`` (an integer, e.g. a
    zero point that a scheme adds before rounding) joins the product before that shift.
    """
    x = np.asarray(x, dtype=np.int64)
    shift = np.asarray(shift, dtype=np.int64)
    if double_rounding:
        left = np.maximum(shift, 0)
        right = np.maximum(-shift, 0)
        return rounding_divide_by_pot(srdhm(x << left, q), right) + offset
    t = bits - shift
    prod = x * np.asarray(q, dtype=np.int64)
    offset = np.asarray(offset, dtype=np.int64)
    # a right shift rounds with the offset in; a left shift (t < 0) is exact, the offset joins after it
    right = shift_right(prod + (offset << np.clip(t, 0, 62)), t, rounding)
    return np.where(t < 0, (prod << np.clip(-t, 0, 62)) + offset, right)


def glow_params(scale: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Glow ``quantizeScaleOffset32To8``: ``(pre, post, s)`` so that ``x*scale ~= ((x>>pre)*s) >> post``."""
    pre, post, mult = [], [], []
    for value in np.atleast_1d(np.asarray(scale, dtype=np.float32)).ravel():  # one entry per channel
        v = float(value)
        m, e = np.frexp(v)
        if m == 0.5:  # a power of two
            p, q, s = (0, 0, int(v)) if e - 1 > 0 else (0, 1 - e, 1)
        else:
            q = 0
            while v < 0.5 or (v < 256 and q < 15):
                v, q = v * 2, q + 1
            p = 0
            while v < 255 and p < q / 2:
                v, p = v * 2, p + 1
            s = int(round_float(np.float64(v), "half_away"))
        pre.append(p)
        post.append(q)
        mult.append(s)
    shape = np.shape(scale)
    return tuple(np.asarray(a, dtype=np.int64).reshape(shape) for a in (pre, post, mult))  # type: ignore[return-value]


# ----------------------------------------------------------------------------------------------
# Requantization


def real_multiplier(numerators: Sequence[np.ndarray], denominator: np.ndarray | None, scheme: Scheme) -> np.ndarray:
    """``prod(numerators) / denominator`` evaluated left to right at the scheme's scale precision.

    ``float32``: every step rounds to float32 (ORT ``f32(f32(xs*ws)/ys)``); ``float64``: all steps in
    double from the float32 scales (TFLite); ``float32_product``: product in float32, division in double.
    """
    product_dtype = np.float64 if scheme.scale_precision == "float64" else np.float32
    value = np.asarray(numerators[0], dtype=product_dtype)
    for factor in numerators[1:]:
        value = value * np.asarray(factor, dtype=product_dtype)
    if denominator is None:
        return value
    div_dtype = np.float32 if scheme.scale_precision == "float32" else np.float64
    return value.astype(div_dtype) / np.asarray(denominator, dtype=div_dtype)


def requantize(
    acc: np.ndarray,
    multiplier: np.ndarray,
    zero_point: np.ndarray | int,
    dtype: np.dtype | type,
    scheme: Scheme,
    family: str,
    *,
    overwrite: bool = False,
) -> np.ndarray:
    """``saturate(round(acc * M) + zp)`` as the scheme computes it.

    Args:
        acc: int64 accumulator (already with bias).
        multiplier: real multiplier from :func:`real_multiplier`, broadcastable to ``acc``.
        zero_point: output zero point (broadcastable).
        dtype: output integer dtype.
        scheme: the quantization scheme.
        family: op family (``gemm``, ``add``, ...) deciding whether zp is added before rounding.
        overwrite: ``acc`` (already of the multiplier's float type) may be reused as scratch.

    Returns:
        an array of ``dtype``.
    """
    kind = scheme.multiplier
    if kind in ("float32", "float64"):
        ftype = np.float32 if kind == "float32" else np.float64
        m = np.asarray(multiplier).astype(ftype)
        acc = np.asarray(acc)
        if overwrite and acc.dtype == ftype and np.broadcast_shapes(acc.shape, m.shape) == acc.shape:
            value = np.multiply(acc, m, out=acc)
        else:
            value = acc.astype(ftype) * m
        if value.shape != np.broadcast_shapes(value.shape, np.shape(zero_point)):
            value = np.broadcast_to(value, np.broadcast_shapes(value.shape, np.shape(zero_point))).copy()
        return requantize_float(value, zero_point, dtype, scheme, family)
    zp = np.asarray(zero_point).astype(np.int64)
    before = scheme.zp_first(family)
    offset = zp if before else 0
    m = np.asarray(multiplier, dtype=np.float64)
    if kind in ("q31", "q15"):
        bits = 31 if kind == "q31" else 15
        q, shift = quantize_multiplier(m, bits)
        out = multiply_by_quantized_multiplier(
            acc, q, shift, bits=bits, double_rounding=scheme.double_rounding, rounding=scheme.rounding, offset=offset
        )
    elif kind == "power2":
        f, e = np.frexp(m)
        p = np.where(f < np.sqrt(0.5), e - 1, e).astype(np.int64)  # nearest power of two in log2
        acc = np.asarray(acc, dtype=np.int64)
        # as in multiply_by_quantized_multiplier: the offset joins a left shift (M >= 2**0.5) after it
        right = shift_right(acc + (offset << np.clip(-p, 0, 62)), -p, scheme.rounding)
        out = np.where(p > 0, (acc << np.clip(p, 0, 62)) + offset, right)
    elif kind == "glow":
        pre, post, s = glow_params(np.asarray(multiplier, dtype=np.float32))
        out = shift_right((np.asarray(acc, dtype=np.int64) >> pre) * s + (offset << post), post, scheme.rounding)
    else:
        raise ValueError(f"unknown multiplier kind '{kind}'")
    return saturate(out + (0 if before else zp), dtype)


def requantize_float(
    value: np.ndarray,
    zero_point: np.ndarray | int,
    dtype: np.dtype | type,
    scheme: Scheme,
    family: str,
    rounding: Rounding | None = None,
    *,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """``saturate(round(value) + zp)`` for a real ``value`` (zp joins before rounding if the family says so).

    ``value`` (a float array with the output's shape) is overwritten; ``out`` (of the integer type)
    receives the result, the last step writing it (one pass fewer than casting a copy). Values are
    clamped in float first, so huge values cannot overflow the integer cast (as MLAS does); after
    clamping and rounding every value is a small integer, exact in float, so the zero point is added
    in float.
    """
    ftype = value.dtype.type
    zp = np.asarray(zero_point).astype(ftype)
    lo, hi = qrange(dtype)
    mode = rounding or scheme.rounding
    if scheme.zp_first(family):
        np.add(value, zp, out=value)
        np.clip(value, ftype(lo), ftype(hi), out=value)
        value = _round_inplace(value, mode)
    else:
        np.clip(value, ftype(lo) - zp, ftype(hi) - zp, out=value)
        value = _round_inplace(value, mode)
        if out is not None:
            np.add(value, zp, out=out, casting="unsafe")  # integral and in range: the cast is exact
            return out
        np.add(value, zp, out=value)
    if out is not None:
        np.copyto(out, value, casting="unsafe")
        return out
    return value.astype(dtype)


def _round_inplace(value: np.ndarray, mode: Rounding) -> np.ndarray:
    if mode == "half_even":
        return np.rint(value, out=value)
    return round_float(value, mode)


def quantize_float(
    x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, dtype: np.dtype | type, scheme: Scheme
) -> np.ndarray:
    """QuantizeLinear: ``saturate(round(x / scale) + zp)`` in x's float precision (MLAS, onnx.reference).

    With ``quantize`` in ``scheme.zp_before_rounding`` the zero point joins before rounding (Glow, XNNPACK).
    """
    x = np.asarray(x)
    ftype = np.result_type(x.dtype, np.float32)
    if np.size(scale) == 1 and np.size(zero_point) == 1:  # per tensor: in cache-sized blocks, on threads
        scale_f = np.asarray(scale).astype(ftype).reshape(())
        zp = np.asarray(zero_point).reshape(())
        rounding = scheme.quantize_rounding

        def block(out: np.ndarray, xb: np.ndarray) -> None:
            value = np.divide(xb, scale_f, out=parallel.scratch(xb.size, ftype, "quantize"), dtype=ftype)
            requantize_float(value, zp, dtype, scheme, "quantize", rounding, out=out)

        out = np.empty(x.shape, dtype)
        if parallel.blockwise(block, out, x):
            return out
    value = np.divide(np.asarray(x, dtype=ftype), np.asarray(scale).astype(ftype))
    shape = np.broadcast_shapes(value.shape, np.shape(zero_point))
    if value.shape != shape:
        value = np.broadcast_to(value, shape).copy()
    return requantize_float(value, zero_point, dtype, scheme, "quantize", scheme.quantize_rounding)


def dequantize(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | int | None) -> np.ndarray:
    """DequantizeLinear in the scale's precision: ``(x - zp) * scale`` (zp subtracted exactly as float32)."""
    scale = np.asarray(scale)
    ftype = scale.dtype if scale.dtype.kind == "f" else np.dtype(np.float32)
    zp = np.float32(0) if zero_point is None else np.asarray(zero_point).astype(np.float32)
    shifted = np.subtract(np.asarray(x), zp, dtype=np.float32)  # exact for 8/16-bit; as the spec for int32
    return np.multiply(shifted, scale.astype(ftype), dtype=ftype)


# ----------------------------------------------------------------------------------------------
# Accumulators and exact integer GEMM


def accumulate(acc: np.ndarray, scheme: Scheme) -> np.ndarray:
    """Apply the scheme's accumulator width to an exact int64 sum."""
    if scheme.accumulator == "wrap32":
        return ((acc + 2**31) & 0xFFFFFFFF) - 2**31
    if scheme.accumulator == "saturate32":
        return np.clip(acc, INT32_MIN, INT32_MAX)
    return acc


def int_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact ``a @ b`` for integer arrays through float BLAS; returns int64.

    Every partial sum is an integer bounded by ``max|a| * max_n sum_k |b[k, n]|``. Below 2**24 float32
    is exact whatever order BLAS adds in; below 2**53 float64 is; beyond, K is cut into exact chunks.
    """
    a64 = np.asarray(a)
    b64 = np.asarray(b)
    if a64.size == 0 or b64.size == 0:
        return np.zeros(
            (*np.broadcast_shapes((*a64.shape[:-1], 1), (*b64.shape[:-2], 1, 1))[:-1], b64.shape[-1]), np.int64
        )
    amax = float(np.abs(a64).max())
    col = float(np.abs(b64.astype(np.int64)).sum(axis=-2).max())
    bound = amax * col
    if bound < _F32_EXACT:
        return np.matmul(a64.astype(np.float32), b64.astype(np.float32)).astype(np.int64)
    if bound < _F64_EXACT:
        return np.matmul(a64.astype(np.float64), b64.astype(np.float64)).astype(np.int64)
    k = a64.shape[-1]
    step = max(1, int(_F64_EXACT // max(amax * float(np.abs(b64).max()), 1.0)))
    out = None
    for start in range(0, k, step):  # chunks of K, each exact in float64
        part = np.matmul(
            a64[..., start : start + step].astype(np.float64), b64[..., start : start + step, :].astype(np.float64)
        ).astype(np.int64)
        out = part if out is None else out + part
    return out


def zero_point_matmul(
    a: np.ndarray, a_zp: np.ndarray | int, b: np.ndarray, b_zp: np.ndarray | int, scheme: Scheme
) -> np.ndarray:
    """``(a - a_zp) @ (b - b_zp)`` with the scheme's accumulator, batch axes broadcast as in ``np.matmul``
    (``a`` ``[..., M, K]``, ``b`` ``[..., K, N]``; ``a_zp`` scalar or per row, ``[..., M, 1]``; ``b_zp``
    scalar or per column, ``[..., 1, N]`` or ``[N]``).

    With ``pair_saturation`` a u8 x s8 product sums its raw pairs with int16 saturation (``pairs.py``):
    the exact sums plus a correction for the pairs that saturate.
    """
    # differences of 8- and 16-bit values fit int32, half the bytes of int64 for BLAS's float copy to read
    wide = np.int32 if max(a.dtype.itemsize, b.dtype.itemsize) <= 2 else np.int64
    acc = int_matmul(a.astype(wide) - np.asarray(a_zp, wide), b.astype(wide) - np.asarray(b_zp, wide))
    if saturates_pairs(scheme, a.dtype, b.dtype):
        correction = pairs.saturating_matmul_correction(a, b)
        if correction is not None:
            acc += correction
    if scheme.neon_pair_wrap:
        wrapped = neon_pairs.gemm_correction(a, b)
        if wrapped is not None:
            acc = acc + wrapped
    return accumulate(acc, scheme)


def saturates_pairs(scheme: Scheme, a_dtype: np.dtype, b_dtype: np.dtype) -> bool:
    """The scheme sums the products of these operand types in int16-saturated pairs (u8 x s8 only)."""
    return scheme.pair_saturation and a_dtype == np.uint8 and b_dtype == np.int8


def clamp_weights(w: np.ndarray, scheme: Scheme) -> np.ndarray:
    """Saturate weights to the scheme's weight bit width (no-op for 8 bits without reduce_range)."""
    bits = scheme.weight_bits - int(scheme.reduce_range)
    if bits >= 8 or w.dtype.itemsize > 1:
        return w
    if w.dtype == np.uint8:
        return np.clip(w, 0, 2**bits - 1).astype(w.dtype)
    return np.clip(w, -(2 ** (bits - 1)), 2 ** (bits - 1) - 1).astype(w.dtype)


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 fused multiply-add ``f32(a*b + c)`` (the product is exact in float64)."""
    return (
        np.asarray(a, np.float32).astype(np.float64) * np.asarray(b, np.float32) + np.asarray(c, np.float32)
    ).astype(np.float32)
