"""``backend/arith.py`` against hand-computed values and independent scalar implementations.

The scalar goldens below are written from the gemmlowp/TFLite definitions with Python integers and
``fractions.Fraction`` (exact), one element at a time, on small samples; the code under test is
vectorised numpy.
"""

from __future__ import annotations

import numpy as np
import pytest
from golden import glow_params, golden_requantize, golden_shift, mbqm_double, rdbpot, srdhm

from pytest_qaccuracy.backend import arith, get_scheme
from pytest_qaccuracy.errors import InputError

TIES = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5], dtype=np.float32)
EXPECTED_TIES = {
    "half_even": [-2, -2, -0, 0, 2, 2],
    "half_up": [-2, -1, 0, 1, 2, 3],
    "half_away": [-3, -2, -1, 1, 2, 3],
    "floor": [-3, -2, -1, 0, 1, 2],
}


@pytest.mark.parametrize("mode", EXPECTED_TIES)
def test_round_float_ties(mode: str) -> None:
    np.testing.assert_array_equal(arith.round_float(TIES, mode), EXPECTED_TIES[mode])


def test_half_up_is_not_fooled_by_float_addition() -> None:
    just_below = np.nextafter(np.float32(0.5), np.float32(0))  # 0.49999997 + 0.5 == 1.0 in float32
    assert arith.round_float(np.array([just_below]), "half_up")[0] == 0


@pytest.mark.parametrize("mode", ["floor", "half_up", "half_even", "half_away"])
def test_round_shift_matches_exact_fractions(mode: str) -> None:
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.integers(-(2**40), 2**40, 300), np.arange(-40, 41)])  # includes every tie of n <= 3
    n = rng.integers(0, 5, x.size)
    got = arith.round_shift(x, n, mode)
    want = [golden_shift(int(a), int(b), mode) for a, b in zip(x, n, strict=True)]
    np.testing.assert_array_equal(got, want)


# -- gemmlowp / TFLite, from their definitions ------------------------------------------------------


def test_srdhm_rounds_half_up() -> None:
    got = arith.srdhm(np.array([1, -1, 3, -3, 5, -5]), np.int64(2**30))
    np.testing.assert_array_equal(got, [1, 0, 2, -1, 3, -2])  # gemmlowp: half rounds toward +inf
    assert arith.srdhm(np.int64(-(2**31)), np.int64(-(2**31))) == 2**31 - 1


def test_rounding_divide_by_pot_rounds_half_away() -> None:
    got = arith.rounding_divide_by_pot(np.array([5, -5, 3, -3, 6, -6, 7]), np.array([1, 1, 1, 1, 2, 2, 0]))
    np.testing.assert_array_equal(got, [3, -3, 2, -2, 2, -2, 7])


def test_srdhm_and_rdbpot_match_scalar_definitions() -> None:
    rng = np.random.default_rng(1)
    odd = np.arange(-41, 42, 2)  # odd * 2**30 / 2**31 is a tie for srdhm
    a = np.concatenate([rng.integers(-(2**31), 2**31, 500), odd, [-(2**31), -(2**31), 2**31 - 1]])
    b = np.concatenate([rng.integers(2**30, 2**31, 300), rng.integers(-(2**31), 2**31, 200)])
    b = np.concatenate([b, np.full(odd.size, 2**30), [-(2**31), 2**31 - 1, -(2**31)]])
    np.testing.assert_array_equal(arith.srdhm(a, b), [srdhm(int(x), int(y)) for x, y in zip(a, b, strict=True)])
    x = np.concatenate([a, np.arange(-40, 41)])  # every tie of e <= 3
    e = np.concatenate([rng.integers(0, 31, a.size), rng.integers(1, 4, 81)])
    np.testing.assert_array_equal(
        arith.rounding_divide_by_pot(x, e), [rdbpot(int(v), int(k)) for v, k in zip(x, e, strict=True)]
    )


@pytest.mark.parametrize(
    ("m", "q", "shift"),
    [
        (0.5, 2**30, 0),
        (0.75, 1610612736, 0),
        (1 / 3, 1431655765, -1),  # 2**31 * 2/3 = 1431655765.33
        (1 - 2**-40, 2**30, 1),  # rounds up to 2**31: renormalised
        (2**-40, 0, 0),  # below 2**-31: flushed to zero
        (3.0, 1610612736, 2),
    ],
)
def test_quantize_multiplier(m: float, q: int, shift: int) -> None:
    got_q, got_shift = arith.quantize_multiplier(np.float64(m))
    assert (int(got_q), int(got_shift)) == (q, shift)


def test_multiply_by_quantized_multiplier_double_rounding() -> None:
    rng = np.random.default_rng(2)
    x = rng.integers(-(2**20), 2**20, 400)
    m = rng.uniform(1e-4, 0.9, 400)
    q, shift = arith.quantize_multiplier(m)
    got = arith.multiply_by_quantized_multiplier(x, q, shift, double_rounding=True)
    want = [mbqm_double(int(a), int(b), int(c)) for a, b, c in zip(x, q, shift, strict=True)]
    np.testing.assert_array_equal(got, want)


def test_multiply_by_quantized_multiplier_single_rounding_ties() -> None:
    q, shift = arith.quantize_multiplier(np.float64(0.25))  # exact: every odd multiple of 2 is a tie
    got = arith.multiply_by_quantized_multiplier(np.array([2, -2, 6, -6, 5]), q, shift, rounding="half_up")
    np.testing.assert_array_equal(got, [1, 0, 2, -1, 1])


def test_glow_params() -> None:
    pre, post, s = arith.glow_params(np.array([0.25, 3.0, 0.1], np.float32))
    assert list(zip(pre.tolist(), post.tolist(), s.tolist(), strict=True)) == [(0, 2, 1), (0, 7, 384), (0, 12, 410)]


def test_glow_params_match_the_closed_form() -> None:
    """Every branch of Glow's loops: powers of two, tiny scales (post capped at 15), scales near 0.5,
    255 and 256, and scales above 256 (no doubling at all)."""
    rng = np.random.default_rng(4)
    scales = np.concatenate(
        [
            2.0 ** np.arange(-20, 12),
            np.exp(rng.uniform(np.log(1e-7), np.log(3e3), 400)),
            [0.4999, 0.5001, 0.999, 1.5, 254.9, 255.0, 255.5, 256.5, 127.6, 3e-5, 1e-6],
        ]
    ).astype(np.float32)
    pre, post, s = arith.glow_params(scales)
    got = list(zip(pre.tolist(), post.tolist(), s.tolist(), strict=True))
    assert got == [glow_params(float(v)) for v in scales]


# -- requantize per preset ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "preset", ["onnxruntime", "onnx-reference", "tflite", "tflite-single-rounding", "tvm-upward", "power2"]
)
def test_requantize_matches_scalar_definitions(preset: str) -> None:
    rng = np.random.default_rng(3)
    acc = np.concatenate([rng.integers(-200000, 200000, 300), rng.integers(-(2**28), 2**28, 100)])
    m = rng.uniform(1e-5, 3e-3, acc.size).astype(np.float32)
    m[::7] = np.float32(2.0**-6)  # exact ties for acc multiples of 32
    acc[::7] = (acc[::7] // 64) * 64 + 32
    got = arith.requantize(acc, m, 17, np.uint8, get_scheme(preset), "gemm")
    want = [golden_requantize(preset, int(a), mm, 17) for a, mm in zip(acc, m, strict=True)]
    np.testing.assert_array_equal(got, want)


def test_presets_disagree_on_ties() -> None:
    acc = (np.arange(-64, 64) * 2 + 1) * 2  # M = 1/4: every value is a tie
    m = np.full(acc.shape, np.float32(0.25))
    results = {
        p: arith.requantize(acc, m, 101, np.uint8, get_scheme(p), "gemm")
        for p in ("onnxruntime", "onnx-reference", "tflite-single-rounding", "tflite")
    }
    assert not np.array_equal(results["onnxruntime"], results["onnx-reference"])  # zp before rounding
    assert not np.array_equal(results["onnxruntime"], results["tflite-single-rounding"])  # half up vs even
    assert not np.array_equal(results["tflite-single-rounding"], results["tflite"])  # half away for negatives


# -- exact integer GEMM ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("low", "k"), [(128, 64), (256, 4096), (2**20, 2**14)])
def test_int_matmul_is_exact_beyond_float32(low: int, k: int) -> None:
    rng = np.random.default_rng(4)
    a = rng.integers(-low, low, (5, k))
    b = rng.integers(-low, low, (k, 3))
    np.testing.assert_array_equal(arith.int_matmul(a, b), a @ b)  # numpy int64 matmul is exact here


def test_accumulator_wrap_and_saturate() -> None:
    acc = np.array([2**31, -(2**31) - 1, 5])
    np.testing.assert_array_equal(arith.accumulate(acc, get_scheme("onnxruntime")), [-(2**31), 2**31 - 1, 5])
    sat = get_scheme("onnxruntime").replace(accumulator="saturate32")
    np.testing.assert_array_equal(arith.accumulate(acc, sat), [2**31 - 1, -(2**31), 5])


def test_scheme_validation_and_presets() -> None:
    with pytest.raises(InputError, match=r"unknown scheme 'nope'.*onnxruntime"):
        get_scheme("nope")
    with pytest.raises(InputError, match="double_rounding needs"):
        get_scheme("onnxruntime").replace(double_rounding=True)
    with pytest.raises(InputError, match="unknown op families"):
        get_scheme("onnxruntime").replace(zp_before_rounding=frozenset({"conv2"}))
    assert get_scheme("tflite").to_dict()["multiplier"] == "q31"
    assert get_scheme(None) is get_scheme("onnxruntime")
    with pytest.raises(InputError, match="pair_saturation=True"):
        get_scheme("onnxruntime").replace(accumulator="int16_pairs")


def test_reduced_weight_bits_saturate() -> None:
    w = np.array([-128, -65, -64, 63, 64, 127], np.int8)
    np.testing.assert_array_equal(
        arith.clamp_weights(w, get_scheme("onnxruntime").replace(reduce_range=True)), [-64, -64, -64, 63, 63, 63]
    )
