"""QLinearAdd and QLinearMul as onnxruntime's ARM64 builds compute them (MLAS's NEON kernels).

On ARM, MLAS does not add in float as on x86 (``elementwise._add_mlas``) but in fixed point
(``qladd.cpp``, ``MlasCalcQLinearAddParameters``): the ratios ``r = s_in / s_out`` (float32) become
two integer multipliers ``round(r * 2**shift)`` with ``shift = 21 - exponent(max ratio)``, so the larger
one lies in ``[2**21, 2**22)``; ``(a - za) * Ma + (b - zb) * Mb`` is summed in int32 and shifted right
by ``shift`` rounding half away from zero (``vsraq_n_s32`` then ``vrshlq_s32``); the output zero point
is added after, with saturation. When a ratio leaves ``[2**-14, 256)``, the shift leaves ``[13, 31]`` or
a multiplier reaches ``2**22``, a float loop runs instead: ``(sa (a - za) + sb (b - zb)) / sc``,
clamped, plus the zero point, rounded half to even.

QLinearMul (``qlmul.cpp``): the exact product ``(a - za)(b - zb)`` in float32 times the ratio
``sa * sb / sc`` plus the zero point, rounded half to even, as on x86, but the multiply and the add are
one fused multiply-add: the intrinsics ``vaddq_f32(zp, vmulq_f32(ratio, p))`` are plain vector
arithmetic to GCC, which contracts them into ``fmla`` (onnxruntime 1.32's aarch64 wheel: 115 of 530,000
output values of PP-OCR's s8s8 recognizer differ without it, none with it). Older MLAS versions truncated
with ``vcvtq_s32_f32``; the ARM64 goldens rule that out.
"""

from __future__ import annotations

import numpy as np

from pytest_qaccuracy.backend import arith

_MIN_RATIO = np.float32(2.0**-14)
_MAX_RATIO = np.float32(256.0)


def _f32(x: np.ndarray | float) -> np.float32:
    return np.float32(np.asarray(x, np.float32).reshape(()))


def _int(x: np.ndarray | int) -> int:
    return int(np.asarray(x).reshape(()))


def add_parameters(ratio_a: np.float32, ratio_b: np.float32) -> tuple[int, int, int] | None:
    """``(shift, multiplier_a, multiplier_b)`` of the fixed-point add, or None where MLAS falls back to float."""
    ratios = (np.float32(ratio_a), np.float32(ratio_b))
    if any(not _MIN_RATIO <= r < _MAX_RATIO for r in ratios):
        return None
    exponent = int(np.frexp(max(ratios))[1]) - 1  # the float's unbiased exponent: max in [2**e, 2**(e+1))
    shift = 21 - exponent
    if not 13 <= shift <= 31:
        return None
    scale = np.float32(2.0**shift)
    ma, mb = (int(np.rint(np.float32(r * scale))) for r in ratios)  # exact products, lrintf: half to even
    if ma >= 1 << 22 or mb >= 1 << 22 or max(ma, mb) < 1 << 21:
        return None
    return shift, ma, mb


def add(
    a: np.ndarray,
    a_s: np.ndarray,
    a_zp: np.ndarray | int,
    b: np.ndarray,
    b_s: np.ndarray,
    b_zp: np.ndarray | int,
    c_s: np.ndarray,
    c_zp: np.ndarray | int,
    dtype: np.dtype,
) -> np.ndarray:
    """MLAS NEON QLinearAdd on broadcastable integer arrays."""
    f32 = np.float32
    a_s, b_s, c_s = _f32(a_s), _f32(b_s), _f32(c_s)
    ratio_a, ratio_b = f32(a_s / c_s), f32(b_s / c_s)
    xa = a.astype(np.int64) - _int(a_zp)
    xb = b.astype(np.int64) - _int(b_zp)
    params = add_parameters(ratio_a, ratio_b)
    if params is None:
        return _add_float(xa, a_s, xb, b_s, c_s, _int(c_zp), dtype)
    shift, ma, mb = params
    acc = xa * ma + xb * mb  # |acc| < 2**31: 255 * 2**22 * 2
    rounded = (acc - (acc < 0) + (1 << (shift - 1))) >> shift  # half away from zero
    return arith.saturate(np.clip(rounded, -32768, 32767) + _int(c_zp), dtype)


def _add_float(
    xa: np.ndarray, sa: np.float32, xb: np.ndarray, sb: np.float32, sc: np.float32, zc: int, dtype: np.dtype
) -> np.ndarray:
    """MLAS's scalar fallback (``MlasQLinearAddKernelRawHelper``), float32 throughout."""
    f32 = np.float32
    lo, hi = arith.qrange(dtype)
    value = ((sa * xa.astype(f32)).astype(f32) + (sb * xb.astype(f32)).astype(f32)).astype(f32)
    value = np.clip((value / sc).astype(f32), f32(lo - zc), f32(hi - zc))
    return np.rint((value + f32(zc)).astype(f32)).astype(np.int64).astype(dtype)


def mul(
    a: np.ndarray,
    a_zp: np.ndarray | int,
    b: np.ndarray,
    b_zp: np.ndarray | int,
    multiplier: np.ndarray,
    c_zp: np.ndarray | int,
    dtype: np.dtype,
) -> np.ndarray:
    """MLAS NEON QLinearMul: ``sat(rne(fma(f32(p), M, zp)))`` with ``p`` the exact product, ``M`` float32."""
    product = (a.astype(np.int64) - _int(a_zp)) * (b.astype(np.int64) - _int(b_zp))
    value = arith.fma32(product.astype(np.float32), _f32(multiplier), np.float32(_int(c_zp)))
    return arith.saturate(np.rint(value), dtype)
