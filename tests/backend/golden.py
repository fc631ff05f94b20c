"""Scalar golden implementations for the integer-backend tests.

Written from the gemmlowp/TFLite/ORT definitions (research notes sections 2-4) with Python integers
and ``fractions.Fraction``, one element at a time: independent of the vectorised code under test.
"""

from __future__ import annotations

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


def srdhm(a: int, b: int) -> int:
    if a == b == -(2**31):
        return 2**31 - 1
    ab = a * b
    nudge = 2**30 if ab >= 0 else 1 - 2**30
    t = ab + nudge
    return abs(t) // 2**31 * (1 if t >= 0 else -1)  # C++ division truncates toward zero


def rdbpot(x: int, e: int) -> int:
    mask = (1 << e) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> e) + (1 if remainder > threshold else 0)


def mbqm_double(x: int, q: int, shift: int) -> int:
    left, right = max(shift, 0), max(-shift, 0)
    return rdbpot(srdhm(x * (1 << left), q), right)


def golden_requantize(preset: str, acc: int, m32: np.float32 | float, zp: int, lo: int = 0, hi: int = 255) -> int:
    """One element, written from each backend's definition (research notes sections 2-4)."""
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


def glow_params(scale: float) -> tuple[int, int, int]:
    """Glow quantizeScaleOffset32To8 (lib/Quantization/Base/Base.cpp), scalar."""
    v = float(np.float32(scale))
    mantissa, exponent = np.frexp(v)
    if mantissa == 0.5:
        e = int(exponent) - 1
        return (0, 0, int(v)) if e > 0 else (0, -e, 1)
    post = 0
    while v < 0.5 or (v < 256 and post < 15):
        v, post = v * 2, post + 1
    pre = 0
    while v < 255 and pre < post / 2:
        v, pre = v * 2, pre + 1
    return pre, post, golden_shift(int(Fraction(v) * 2), 1, "half_away")


def glow_scale(acc: int, scale: float) -> int:
    pre, post, s = glow_params(scale)
    return ((acc >> pre) * s + (1 << (post - 1) if post > 0 else 0)) >> post
