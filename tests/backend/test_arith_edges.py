"""Edges of ``backend/arith.py``: input types, boundaries, the zero point joining before rounding in
every multiplier kind, the scale precisions, empty and huge integer GEMMs.

Expected values come from exact arithmetic (Python integers, ``fractions.Fraction``, a float32
rounding written from IEEE 754 below) or from the ONNX reference implementation, never from ``arith``.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from golden import golden_shift, mbqm_double, quantize_multiplier, rdbpot, srdhm

from pytest_qaccuracy.backend import arith, get_scheme
from pytest_qaccuracy.backend.scheme import Scheme


def nearest_f32(q: Fraction) -> Fraction:
    """The float32 nearest to ``q`` (ties to an even significand), as an exact fraction; normal range."""
    if q == 0:
        return Fraction(0)
    m = abs(q)
    e = m.numerator.bit_length() - m.denominator.bit_length()
    if Fraction(2) ** e > m:
        e -= 1
    ulp = Fraction(2) ** (e - 23)
    r = round(m / ulp) * ulp  # Python rounds a Fraction half to even
    return r if q > 0 else -r


def f32(x: float) -> Fraction:
    return nearest_f32(Fraction(x))


def rounded(q: Fraction, mode: str) -> int:
    """``q`` rounded to an integer with a scheme's rounding mode."""
    floor = math.floor(q)
    if mode == "floor":
        return floor
    if mode == "half_up":
        return floor + (q - floor >= Fraction(1, 2))
    if mode == "half_even":
        return round(q)
    r = math.floor(abs(q) + Fraction(1, 2))
    return r if q >= 0 else -r


# -- small helpers --------------------------------------------------------------------------------


def test_scalar_and_saturate() -> None:
    assert arith.scalar(None) == 0
    assert arith.scalar(None, 7) == 7
    one = arith.scalar(np.array([2.5]))
    assert one.shape == () and float(one) == 2.5
    out = arith.saturate(np.array([300, -5, 17]), np.uint8)
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out, [255, 0, 17])


def test_unknown_modes_are_named() -> None:
    with pytest.raises(ValueError, match="unknown rounding mode 'half_odd'"):
        arith.round_float(np.array([0.5]), "half_odd")
    with pytest.raises(ValueError, match="unknown rounding mode 'half_odd'"):
        arith.round_shift(np.array([5]), 1, "half_odd")
    with pytest.raises(ValueError, match="unknown multiplier kind 'q7'"):
        arith.requantize(np.array([5]), np.array([0.5]), 0, np.int8, Scheme(multiplier="q7"), "gemm")


# -- integer helpers read their inputs as int64 ---------------------------------------------------

X = [5, -5, 7, -7, 3, -3, 2**31 - 1, -(2**31), 123456789, -987654321]


@pytest.mark.parametrize("dtype", [np.float64, np.uint64, np.int32])
@pytest.mark.parametrize("mode", ["floor", "half_up", "half_even", "half_away"])
def test_rounding_shifts_read_any_integer_type(dtype, mode: str) -> None:
    x = np.array([v for v in X if dtype != np.uint64 or v >= 0])
    n = np.arange(x.size) % 5
    want = [golden_shift(int(a), int(b), mode) for a, b in zip(x, n, strict=True)]
    np.testing.assert_array_equal(arith.round_shift(x.astype(dtype), n.astype(dtype), mode), want)
    np.testing.assert_array_equal(arith.shift_right(x.astype(dtype), n.astype(dtype), mode), want)


@pytest.mark.parametrize("mode", ["floor", "half_up", "half_even", "half_away"])
def test_shift_right_both_ways_and_past_62(mode: str) -> None:
    x = np.array([5, -5, 3, -3, 1, -1, 0, 2**40 + 3, -(2**40) - 3])
    for n in [-20, -3, -1, 0, 1, 2, 40, 62, 63, 64, 100]:
        got = arith.shift_right(x, np.full(x.size, n), mode)
        # left: x * 2**-n; right: x / 2**n rounded (past 62 bits every |x| < 2**61 gives 0, or -1 by floor)
        want = [int(v) * 2**-n if n < 0 else golden_shift(int(v), n, mode) for v in x]
        np.testing.assert_array_equal(got, want, err_msg=f"n={n}")


def test_srdhm_and_rdbpot_read_any_integer_type() -> None:
    a = np.array([2**31 - 1, -(2**31) + 1, 123456789, -(2**30) - 1, 77])
    b = np.array([2**31 - 1, 2**31 - 1, 2**30 + 7, 1, -(2**30)])
    want = [srdhm(int(x), int(y)) for x, y in zip(a, b, strict=True)]
    assert want[3] == -1  # -(2**30 + 1) / 2**31 is just below -1/2: half up gives -1
    for ta, tb in [(np.int32, np.int32), (np.float64, np.int64), (np.int64, np.float64)]:
        np.testing.assert_array_equal(arith.srdhm(a.astype(ta), b.astype(tb)), want)
    x = np.array([5, -5, 6, -6, 2**31 - 1, -(2**31), 0, 12])
    e = np.array([1, 1, 2, 2, 3, 3, 4, 0])
    want = [rdbpot(int(v), int(k)) for v, k in zip(x, e, strict=True)]
    np.testing.assert_array_equal(arith.rounding_divide_by_pot(x.astype(np.float64), e), want)
    np.testing.assert_array_equal(arith.rounding_divide_by_pot(x, e.astype(np.float64)), want)


# -- TFLite multipliers ---------------------------------------------------------------------------


def test_quantize_multiplier_types_and_the_flush_boundary() -> None:
    m = np.array([1 / 3, 0.75, 1 - 2**-40, 3.0, 2.0**-32, 2.0**-33])
    q, shift = arith.quantize_multiplier(m)
    assert q.dtype == np.int64 and shift.dtype == np.int64
    # 2**-32 = 0.5 * 2**-31 keeps shift -31; 2**-33 has shift -32 < -31 and flushes (TFLite)
    want = [quantize_multiplier(v) for v in m[:5]] + [(0, 0)]
    assert list(zip(q.tolist(), shift.tolist(), strict=True)) == want
    assert want[4] == (2**30, -31)
    # a float16 or float32 multiplier is the same number: read in float64, not in its own type
    for dtype in (np.float16, np.float32):
        value = np.array([1 / 3, 0.1], dtype)
        got = arith.quantize_multiplier(value)
        assert [(int(a), int(b)) for a, b in zip(*got, strict=True)] == [quantize_multiplier(float(v)) for v in value]


def test_multiply_by_quantized_multiplier_defaults_to_half_up() -> None:
    q, shift = arith.quantize_multiplier(np.float64(0.25))
    got = arith.multiply_by_quantized_multiplier(np.array([2, -2, 6, -6]), q, shift)
    np.testing.assert_array_equal(got, [1, 0, 2, -1])  # x / 4 rounded half toward +inf


def test_multiply_by_quantized_multiplier_double_rounding_with_offset_and_left_shift() -> None:
    x = np.array([31, -31, 1000, -1000, 2**20 + 1])
    for m in (2.0**-6, 3.0, 5.5):
        q, shift = quantize_multiplier(m)
        got = arith.multiply_by_quantized_multiplier(x, np.int64(q), np.int64(shift), double_rounding=True, offset=9)
        np.testing.assert_array_equal(got, [mbqm_double(int(v), q, shift) + 9 for v in x], err_msg=str(m))
    # 31 / 64: SRDHM gives 15.5 -> 16, then 16 / 32 = 0.5 rounds away to 1; one rounding gives 0
    q, shift = quantize_multiplier(2.0**-6)
    assert arith.multiply_by_quantized_multiplier(np.array([31]), q, shift, double_rounding=True)[0] == 1


def fixed_multiplier(m: float, bits: int) -> tuple[int, int]:
    """TFLite QuantizeMultiplier at ``bits``: ``m = q * 2**(shift - bits)``, q rounded half away."""
    frac, shift = math.frexp(m)
    q = rounded(Fraction(frac) * 2**bits, "half_away")
    return (q // 2, shift + 1) if q == 2**bits else (q, shift)


@pytest.mark.parametrize("bits", [31, 15])
@pytest.mark.parametrize("rounding", ["half_up", "half_even", "half_away", "floor"])
def test_multiply_by_quantized_multiplier_single_rounding_with_offset(rounding: str, bits: int) -> None:
    """``x * q * 2**(shift - bits) + offset`` rounded once, the offset joining before the rounding
    (after the shift when the multiplier is so large that the shift goes left)."""
    x = np.array([2, -2, 6, -6, 1, -1, 2**30 + 1, -(2**30) - 3, 1000])
    for m in (0.25, 1 / 3, 0.999, 2.0**15, 2.0**20 + 0.5, 2.0**30):
        q, shift = fixed_multiplier(m, bits)
        for offset in (0, 3, -7):
            got = arith.multiply_by_quantized_multiplier(
                x.astype(np.float64),
                np.float64(q),
                np.float64(shift),
                bits=bits,
                rounding=rounding,
                offset=np.float64(offset),
            )
            want = [rounded(Fraction(int(v) * q, 2**bits) * Fraction(2) ** shift + offset, rounding) for v in x]
            np.testing.assert_array_equal(got, want, err_msg=f"m={m} offset={offset}")


def test_glow_params_read_the_scale_as_float32() -> None:
    """Glow takes a float scale: 0.1 in float64 and 0.1 in float32 give the same parameters."""
    from golden import glow_params

    scales = [0.1, 1 / 3, 255 * 2.0**-18, 255 * 2.0**-16, 1.0, 2.0]
    pre, post, s = arith.glow_params(np.array(scales, np.float64))
    assert pre.dtype == np.int64
    assert list(zip(pre.tolist(), post.tolist(), s.tolist(), strict=True)) == [glow_params(v) for v in scales]
    # 255 * 2**-18: 15 doublings give 31.875, three more reach 255 exactly and stop there
    assert glow_params(scales[2]) == (3, 15, 255)


# -- real multipliers -----------------------------------------------------------------------------


def test_real_multiplier_precisions() -> None:
    """``xs * ws / ys`` from float64 inputs: each precision rounds the inputs and steps its own way."""
    xs, ws, ys = 0.1, 0.3, 0.7
    exact = {"x": f32(xs), "w": f32(ws), "y": f32(ys)}

    def f64(q: Fraction) -> Fraction:
        return Fraction(float(q))

    want = {
        "float32": nearest_f32(nearest_f32(exact["x"] * exact["w"]) / exact["y"]),
        "float64": f64(f64(Fraction(xs) * Fraction(ws)) / Fraction(ys)),
        "float32_product": f64(nearest_f32(exact["x"] * exact["w"]) / Fraction(ys)),
    }
    assert len(set(want.values())) == 3  # the three really differ on these scales
    for precision, expected in want.items():
        scheme = Scheme(scale_precision=precision)
        got = arith.real_multiplier([xs, ws], ys, scheme)
        assert Fraction(float(got)) == expected, precision
        assert got.dtype == (np.float32 if precision == "float32" else np.float64)
    products = {p: arith.real_multiplier([xs, ws], None, Scheme(scale_precision=p)) for p in want}
    assert Fraction(float(products["float32"])) == nearest_f32(exact["x"] * exact["w"])
    assert Fraction(float(products["float64"])) == f64(Fraction(xs) * Fraction(ws))
    assert Fraction(float(products["float32_product"])) == nearest_f32(exact["x"] * exact["w"])


# -- requantize -----------------------------------------------------------------------------------


def test_requantize_float_multipliers_round_acc_and_m_in_their_type() -> None:
    acc = np.array([2**24 + 1, 1, 3])
    m = np.array([1.0, 0.5 + 2**-30, 0.5 + 2**-30])
    f32_scheme = get_scheme("onnxruntime-vnni")  # rne(f32(acc) * f32(M))
    f64_scheme = f32_scheme.replace(multiplier="float64")  # rne(acc * M) in double
    got32 = arith.requantize(acc, m, 0, np.int32, f32_scheme, "gemm")
    got64 = arith.requantize(acc, m, 0, np.int32, f64_scheme, "gemm")
    assert got32.dtype == np.int32 and got64.dtype == np.int32
    # float32: 2**24 + 1 -> 2**24; M -> 0.5 exactly, so 1 * 0.5 ties to 0 and 3 * 0.5 to 2
    np.testing.assert_array_equal(got32, [2**24, 0, 2])
    np.testing.assert_array_equal(got64, [2**24 + 1, 1, 2])


@pytest.mark.parametrize("overwrite", [False, True])
def test_requantize_float_path_overwrite_and_broadcast(overwrite: bool) -> None:
    scheme = get_scheme("onnxruntime-vnni")
    acc = np.array([10.0, -10.0, 7.0, 1000.0], np.float32)
    kept = acc.copy()
    got = arith.requantize(acc, np.float32(0.25), 3, np.int8, scheme, "gemm", overwrite=overwrite)
    np.testing.assert_array_equal(got, [5, 1, 5, 127])  # rne(2.5) = 2, rne(-2.5) = -2, rne(1.75) = 2; + 3
    if not overwrite:
        np.testing.assert_array_equal(acc, kept)  # the caller's accumulator is left alone
    # a multiplier or zero point with more dimensions than the accumulator broadcasts the output
    acc = np.array([[4.0, 8.0]], np.float32)
    got = arith.requantize(acc, np.array([[0.25], [0.5]], np.float32), 0, np.int8, scheme, "gemm", overwrite=overwrite)
    np.testing.assert_array_equal(got, [[1, 2], [2, 4]])
    got = arith.requantize(np.array([4, 8]), np.float32(0.25), np.array([[0], [10]]), np.int8, scheme, "gemm")
    np.testing.assert_array_equal(got, [[1, 2], [11, 12]])
    assert got.dtype == np.int8


def _golden_fixed(kind: str, acc: int, m: float, zp: int, before: bool, mode: str) -> int:
    """One element of ``saturate(round(acc * M) + zp)`` with M as the multiplier kind represents it."""
    if kind in ("q31", "q15"):
        bits = 31 if kind == "q31" else 15
        q, exp = fixed_multiplier(m, bits)
        value = Fraction(acc * q) * Fraction(2) ** (exp - bits)
    elif kind == "power2":  # the power of two nearest in log2: 2**p with 2**(2p-1) <= M**2 < 2**(2p+1)
        p = math.floor(math.log2(m))
        while Fraction(m) ** 2 >= Fraction(2) ** (2 * p + 1):
            p += 1
        while Fraction(m) ** 2 < Fraction(2) ** (2 * p - 1):
            p -= 1
        value = Fraction(acc) * Fraction(2) ** p
    else:  # glow: ((acc >> pre) * s) / 2**post
        from golden import glow_params

        pre, post, s = glow_params(m)
        value = Fraction((acc >> pre) * s, 2**post)
    r = rounded(value + zp, mode) if before else rounded(value, mode) + zp
    return min(max(r, -128), 127)


@pytest.mark.parametrize("kind", ["q31", "q15", "power2", "glow"])
@pytest.mark.parametrize("mode", ["half_even", "half_away", "half_up"])
@pytest.mark.parametrize("before", [False, True])
def test_requantize_fixed_point_zero_point_before_or_after_rounding(kind: str, mode: str, before: bool) -> None:
    scheme = Scheme(multiplier=kind, rounding=mode, zp_before_rounding=frozenset({"add"} if before else ()))
    acc = np.array([2, -2, 6, -6, 1, -1, 3, -3, 50, -50, 333, 2**20 + 5, -(2**20) - 3])
    for m in (0.25, 0.5, 1 / 3, 2.0, 3.0, 0.7071067811865476, 0.001):
        for zp in (np.int8(1), np.uint8(2), np.int32(-3)):
            got = arith.requantize(acc, np.float64(m), zp, np.int8, scheme, "add")
            want = [_golden_fixed(kind, int(a), m, int(zp), before, mode) for a in acc]
            np.testing.assert_array_equal(got, want, err_msg=f"M={m} zp={zp}")
            assert got.dtype == np.int8


def test_requantize_q15_keeps_15_bits() -> None:
    acc = np.array([2**20])
    got = arith.requantize(acc, np.float64(1 / 3), 0, np.int32, Scheme(multiplier="q15", rounding="half_up"), "gemm")
    # 2/3 * 2**15 = 21845.33 -> 21845; 2**20 * 21845 / 2**16 = 349520 (31 bits would give 349525)
    assert got[0] == 349520


def test_requantize_tflite_rounds_twice() -> None:
    """31 / 64 with gemmlowp's two roundings is 1; one rounding (half up or away) gives 0."""
    acc = np.array([31, -31, 95])
    tflite = get_scheme("tflite")
    got = arith.requantize(acc, np.float32(2.0**-6), 0, np.int8, tflite, "gemm")
    np.testing.assert_array_equal(got, [mbqm_double(int(a), 2**30, -5) for a in acc])
    np.testing.assert_array_equal(got, [1, 0, 2])  # -31: -15.5 -> -15, then -0.47 -> 0


# -- requantize_float and quantize ----------------------------------------------------------------


def test_requantize_float_into_out_with_the_zero_point_first() -> None:
    scheme = Scheme(zp_before_rounding=frozenset({"quantize"}))
    value = np.array([0.5, 2.5, -0.5, 300.0], np.float32)
    out = np.empty(4, np.uint8)
    got = arith.requantize_float(value, np.float32(1), np.uint8, scheme, "quantize", out=out)
    assert got is out
    np.testing.assert_array_equal(out, [2, 4, 0, 255])  # rne(1.5), rne(3.5), rne(0.5), saturated


ONNX = get_scheme("onnxruntime-vnni")


def test_quantize_in_blocks_with_the_zero_point_first() -> None:
    scheme = ONNX.replace(zp_before_rounding=frozenset({"quantize"}))
    x = np.tile(np.array([0.5, 1.5, -0.5, -1.5], np.float32), 3)
    got = arith.quantize_float(x, np.float32(1.0), np.int8(1), np.int8, scheme)
    np.testing.assert_array_equal(got, np.tile([2, 2, 0, 0], 3))  # rne(x + 1)
    got = arith.quantize_float(x, np.float32(1.0), np.int8(1), np.int8, ONNX)
    np.testing.assert_array_equal(got, np.tile([1, 3, 1, -1], 3))  # rne(x) + 1
    per_channel = arith.quantize_float(
        x.reshape(3, 4), np.float32(1.0), np.array([[1], [1], [1]], np.int8), np.int8, scheme
    )
    np.testing.assert_array_equal(per_channel, np.tile([2, 2, 0, 0], (3, 1)))


def test_quantize_uses_the_quantize_rounding() -> None:
    """tvm-upward rounds requantization half up but QuantizeLinear half to even."""
    tvm = get_scheme("tvm-upward")
    assert (tvm.rounding, tvm.quantize_rounding) == ("half_up", "half_even")
    x = np.array([0.5, 1.5, 2.5, -0.5], np.float32)
    np.testing.assert_array_equal(arith.quantize_float(x, np.float32(1), np.int8(0), np.int8, tvm), [0, 2, 2, 0])
    scale = np.array([1.0, 1.0, 1.0, 1.0], np.float32)  # per channel: the whole-array path
    np.testing.assert_array_equal(arith.quantize_float(x, scale, np.int8(0), np.int8, tvm), [0, 2, 2, 0])


@pytest.mark.parametrize(
    ("scale", "zero_point", "want"),
    [
        (np.array([0.5, 1.0, 2.0], np.float32), np.int8(1), [[3, 3, 3], [-1, 2, 3]]),  # 3 / 2 = 1.5 -> 2
        (np.float32(0.5), np.array([1, 2, 3], np.int8), [[3, 6, 9], [-1, 4, 11]]),
        (np.array([[0.5]], np.float32), np.int8(1), [[3, 5, 7], [-1, 3, 9]]),
        (np.float32(0.5), np.array([[1]], np.int8), [[3, 5, 7], [-1, 3, 9]]),
        (np.float32(0.5), np.array([[[1]], [[0]]], np.int8), [[[3, 5, 7], [-1, 3, 9]], [[2, 4, 6], [-2, 2, 8]]]),
    ],
)
def test_quantize_scale_and_zero_point_shapes(scale, zero_point, want) -> None:
    """``round(x / scale) + zp`` with numpy broadcasting; the output takes the broadcast shape."""
    x = np.array([[1.0, 2.0, 3.0], [-1.0, 1.0, 4.0]], np.float32)
    got = arith.quantize_float(x, scale, zero_point, np.int8, ONNX)
    assert got.dtype == np.int8
    np.testing.assert_array_equal(got, want)


def test_quantize_divides_by_the_scale_in_float32() -> None:
    """A float64 scale is read in x's precision: 3 / f32(0.1) = 29.9999996 -> 30, not 3 / 0.1."""
    x = np.array([3.0, 0.25], np.float32)
    for scale in (np.float64(0.1), np.array([0.1, 0.1])):
        got = arith.quantize_float(x, scale, np.int8(0), np.int8, ONNX)
        want = [round(nearest_f32(f32(float(v)) / f32(0.1))) for v in x]
        np.testing.assert_array_equal(got, want)
    # exact ties after the float32 division decide: f32(1.35) / f32(0.9) = 1.5 exactly in float32
    x = np.array([1.35] * 4, np.float32)
    q = nearest_f32(f32(1.35) / f32(0.9))
    got = arith.quantize_float(x, np.array([0.9] * 4, np.float64), np.int8(0), np.int8, ONNX)
    np.testing.assert_array_equal(got, [round(q)] * 4)


def test_dequantize_int32_shifts_in_float32() -> None:
    """ONNX DequantizeLinear (reference implementation): x and zero point in float32, then subtract."""
    from onnx.reference.ops.op_dequantize_linear import DequantizeLinear_21 as Reference

    x = np.array([2**24 + 1, 2**24 + 3, -(2**24) - 1, 5], np.int32)
    zp = np.int32(1)
    want = (x.astype(np.float32) - np.float32(zp)) * np.float32(1.0)
    assert want[0] == 2**24 - 1
    got = arith.dequantize(x, np.float32(1.0), zp)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, Reference.eval(x, np.float32(1.0), zp))


# -- integer GEMM ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a_shape", "b_shape"),
    [
        ((0, 3), (3, 2)),
        ((2, 3), (3, 0)),
        ((2, 0), (0, 4)),
        ((5, 2, 0), (0, 3)),
        ((2, 0), (4, 0, 3)),
        ((1, 3, 0), (2, 0, 5)),
    ],
)
def test_int_matmul_empty(a_shape, b_shape) -> None:
    got = arith.int_matmul(np.ones(a_shape, np.int64), np.ones(b_shape, np.int64))
    want = np.matmul(np.ones(a_shape, np.int64), np.ones(b_shape, np.int64))
    assert got.dtype == np.int64 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_int_matmul_single_elements_and_types() -> None:
    got = arith.int_matmul(np.array([[7]]), np.array([[-3]]))
    assert got.dtype == np.int64 and got.tolist() == [[-21]]
    # int8 weights with -128: |b| must be taken in int64 (in int8, |-128| is -128 and the bound looks tiny)
    rng = np.random.default_rng(5)
    a = rng.integers(30000, 32000, (3, 2048))
    b = np.full((2048, 2), -128, np.int8)
    b[::7, 0] = 1
    b[::5, 1] = 127
    got = arith.int_matmul(a, b)
    want = [[sum(int(x) * int(y) for x, y in zip(row, col, strict=True)) for col in b.T] for row in a]
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, want)


def test_int_matmul_chunks_large_sums() -> None:
    """Sums past 2**53, batched: each chunk of K is exact in float64 and the chunks add in int64."""
    rng = np.random.default_rng(6)
    a = rng.integers(2**20 - 1000, 2**20, (2, 3, 2**14))
    b = rng.integers(2**20 - 1000, 2**20, (2**14, 2))
    got = arith.int_matmul(a, b)
    want = [
        [[sum(int(x) * int(y) for x, y in zip(row, col, strict=True)) for col in b.T] for row in batch] for batch in a
    ]
    assert got.dtype == np.int64
    assert got.max() > 2**53 + 2**52
    np.testing.assert_array_equal(got, want)


def test_int_matmul_products_near_2_53() -> None:
    """Products of 2**52 and more: one product per chunk; two would lose the last bit."""
    a = np.array([[2**26 + 1, 2**26 + 1]])
    b = np.array([[2**26 + 1], [2**26 + 2]])
    got = arith.int_matmul(a, b)
    want = (2**26 + 1) ** 2 + (2**26 + 1) * (2**26 + 2)
    assert want > 2**53 and want % 2 == 1  # not a float64
    assert got.dtype == np.int64 and int(got[0, 0]) == want


def test_int_matmul_between_float32_and_float64_exactness() -> None:
    a = np.array([[2**12 + 1, 2**12 + 3]])
    b = np.array([[2**12 + 5], [2**12 + 7]])
    got = arith.int_matmul(a, b)
    assert got.dtype == np.int64
    assert int(got[0, 0]) == (2**12 + 1) * (2**12 + 5) + (2**12 + 3) * (2**12 + 7)


# -- weights and FMA ------------------------------------------------------------------------------


def test_clamp_weights_to_the_scheme_width() -> None:
    onnx = get_scheme("onnxruntime-vnni")
    signed = np.array([-128, -9, -8, 7, 8, 127], np.int8)
    unsigned = np.array([0, 1, 15, 16, 127, 128, 255], np.uint8)
    wide = np.array([-300, 300], np.int16)
    four = onnx.replace(weight_bits=4)
    for scheme, lo, hi, ulo, uhi in [
        (onnx, -128, 127, 0, 255),
        (four, -8, 7, 0, 15),
        (onnx.replace(reduce_range=True), -64, 63, 0, 127),
    ]:
        got = arith.clamp_weights(signed, scheme)
        assert got.dtype == np.int8
        np.testing.assert_array_equal(got, np.clip(signed.astype(int), lo, hi))
        got = arith.clamp_weights(unsigned, scheme)
        assert got.dtype == np.uint8
        np.testing.assert_array_equal(got, np.clip(unsigned.astype(int), ulo, uhi))
        np.testing.assert_array_equal(arith.clamp_weights(wide, scheme), wide)  # 16-bit weights are kept


def test_fma32_rounds_its_float64_inputs_to_float32_first() -> None:
    cases = [
        (1 / 3, 3.0, -1.0),  # f32(1/3) * 3 - 1 = 2**-25 ... not 0
        (3.0, 1 / 3, -1.0),
        (1.0, 1.0, 2.0**-24 + 2.0**-50),  # f32(c) = 2**-24: 1 + 2**-24 is a tie, to even: 1
    ]
    for a, b, c in cases:
        want = nearest_f32(f32(a) * f32(b) + f32(c))
        got = arith.fma32(np.array([a]), np.array([b]), np.array([c]))
        assert got.dtype == np.float32
        assert Fraction(float(got[0])) == want, (a, b, c)
