"""Scalar golden implementations for the integer-backend tests.

Written from the gemmlowp/TFLite/ORT definitions (their public sources: docs/backend.md, Sources)
with Python integers and ``fractions.Fraction``, one element at a time: independent of the vectorised
code under test.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np


def golden_shift(x: int, n: int, mode: str) -> int:
    q = Fraction(x, 2**n)
    floor = q.numerator // q.denominator
    frac = q - floor
    if mode == "floor":
        return floor
    if mode == "half_up":
        return floor + (frac >= Fraction(1, 2))
    if mode == "half_even":
        return round(q)  # Python rounds Fractions half to even
    magnitude = abs(q)
    base = magnitude.numerator // magnitude.denominator
    r = base + (magnitude - base >= Fraction(1, 2))
    return r if x >= 0 else -r


INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def _round_half_away(q: Fraction) -> int:
    r = math.floor(abs(q) + Fraction(1, 2))
    return r if q >= 0 else -r


def srdhm(a: int, b: int) -> int:
    """gemmlowp SaturatingRoundingDoublingHighMul, from its meaning: ``a * b / 2**31`` rounded half
    toward +inf (gemmlowp adds the nudge ``1 << 30`` before truncating: ``srdhm(-1, 2**30)`` is 0, not -1),
    exactly; the one product
    that overflows int32, ``INT32_MIN * INT32_MIN`` (1.0 in Q0.31), saturates to ``INT32_MAX``."""
    if a == b == INT32_MIN:
        return INT32_MAX
    return math.floor(Fraction(a * b, 2**31) + Fraction(1, 2))


def rdbpot(x: int, e: int) -> int:
    """gemmlowp RoundingDivideByPOT, from its meaning: ``x / 2**e`` rounded half away from zero, exactly."""
    return _round_half_away(Fraction(x, 2**e))


def mbqm_double(x: int, q: int, shift: int) -> int:
    left, right = max(shift, 0), max(-shift, 0)
    return rdbpot(srdhm(x * (1 << left), q), right)


def golden_requantize(preset: str, acc: int, m32: np.float32 | float, zp: int, lo: int = 0, hi: int = 255) -> int:
    """One element, written from each backend's definition (docs/backend.md, Sources)."""
    if preset == "onnxruntime":
        value = np.float32(np.float32(acc) * m32)
        r = int(np.rint(value)) + zp
    elif preset == "onnx-reference":
        r = round(Fraction(float(np.float64(acc) * np.float64(m32))) + zp)
    elif preset in ("tflite", "tflite-single-rounding", "tvm-upward"):
        m = float(m32)
        frac, exp = np.frexp(m)
        q = int(golden_shift(int(Fraction(float(frac)) * 2**31 * 2), 1, "half_away"))
        if q == 2**31:
            q, exp = q // 2, exp + 1
        if preset == "tflite":
            r = mbqm_double(acc, q, int(exp)) + zp
        else:
            t = 31 - int(exp)
            r = (acc * q + (1 << (t - 1))) >> t
            r += zp
    else:  # power2: nearest power of two in log domain, rounding shift half up
        e = int(np.round(np.log2(float(m32))))
        r = golden_shift(acc, -e, "half_up") + zp
    return min(max(r, lo), hi)


def quantize_multiplier(m: float) -> tuple[int, int]:
    """TFLite QuantizeMultiplier: frexp, round half away, renormalise at 2**31."""
    frac, exp = np.frexp(m)
    q = golden_shift(int(Fraction(float(frac)) * 2**32), 1, "half_away")
    if q == 2**31:
        q, exp = q // 2, exp + 1
    return q, int(exp)


def tflite_add(a: int, a_s: float, a_zp: int, b: int, b_s: float, b_zp: int, c_s: float, c_zp: int) -> int:
    """TFLite int8 ADD (reference/integer_ops/add.h), before clamping."""
    twice_max = 2.0 * max(a_s, b_s)
    m1, s1 = quantize_multiplier(a_s / twice_max)
    m2, s2 = quantize_multiplier(b_s / twice_max)
    mo, so = quantize_multiplier(twice_max / (2**20 * c_s))
    left_a = mbqm_double((a - a_zp) * 2**20, m1, s1)
    left_b = mbqm_double((b - b_zp) * 2**20, m2, s2)
    return mbqm_double(left_a + left_b, mo, so) + c_zp


def _doublings(v: Fraction, target: Fraction) -> int:
    """The fewest doublings ``p >= 0`` with ``v * 2**p >= target`` (no loop: 2**p >= ceil(target / v))."""
    ratio = target / v
    return 0 if ratio <= 1 else (math.ceil(ratio) - 1).bit_length()


def glow_params(scale: float) -> tuple[int, int, int]:
    """Glow quantizeScaleOffset32To8 (Glow's ``lib/Quantization/Base/Base.cpp``), in closed form rather than its loops.

    A power of two ``2**e`` is exact: ``(0, 0, 2**e)`` for ``e > 0``, else ``(0, -e, 1)``. Otherwise the
    first loop doubles until the scale is >= 0.5 and (>= 256 or 15 doublings): ``post = max(p(0.5),
    min(p(256), 15))``; the second doubles ``pre`` more times until >= 255 or ``pre >= post / 2``:
    ``pre = min(p(255), ceil(post / 2))``; ``s`` is the doubled scale rounded half away (std::round).
    """
    v = Fraction(float(np.float32(scale)))  # exact value of the float32 scale
    if v.numerator == 1 and v.denominator & (v.denominator - 1) == 0:  # 2**-k, k >= 0
        return 0, v.denominator.bit_length() - 1, 1
    if v.denominator == 1 and v.numerator & (v.numerator - 1) == 0:  # 2**e, e > 0
        return 0, 0, v.numerator
    post = max(_doublings(v, Fraction(1, 2)), min(_doublings(v, Fraction(256)), 15))
    pre = min(_doublings(v * 2**post, Fraction(255)), math.ceil(Fraction(post, 2)))
    return pre, post, _round_half_away(v * 2 ** (post + pre))


def glow_scale(acc: int, scale: float) -> int:
    pre, post, s = glow_params(scale)
    return ((acc >> pre) * s + (1 << (post - 1) if post > 0 else 0)) >> post
