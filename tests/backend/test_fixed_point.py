"""Fixed-point presets on whole kernels against scalar gemmlowp/TFLite/TVM/Glow goldens.

The accumulators are summed pixel by pixel here with Python integers; the requantization follows each
backend's definition in ``golden.py``. Nothing from ``arith`` is used to build the expected values.
"""

from __future__ import annotations

import numpy as np
import pytest
from backend_models import MS, node_model, random_q
from golden import glow_scale, golden_requantize, mbqm_double, quantize_multiplier, tflite_add

from pytest_qaccuracy.backend import IntegerSession

f32 = np.float32


def _conv_acc(x: np.ndarray, x_zp: int, w: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """int32 accumulators of a 3x3, pad 1 convolution, one output pixel at a time."""
    n, _, h, wd = x.shape
    xp = np.pad(x.astype(np.int64) - x_zp, [(0, 0), (0, 0), (1, 1), (1, 1)])
    acc = np.zeros((n, w.shape[0], h, wd), dtype=object)
    for b in range(n):
        for m in range(w.shape[0]):
            for i in range(h):
                for j in range(wd):
                    window = xp[b, :, i : i + 3, j : j + 3]
                    acc[b, m, i, j] = int((window * w[m].astype(np.int64)).sum()) + int(bias[m])
    return acc


@pytest.mark.parametrize("preset", ["tflite", "tflite-single-rounding", "tvm-upward", "power2", "glow"])
@pytest.mark.parametrize("ties", [False, True])
def test_qlinear_conv_fixed_point(preset: str, ties: bool) -> None:
    rng = np.random.default_rng(1)
    x = random_q(rng, np.uint8, (2, 3, 5, 5))
    w = random_q(rng, np.int8, (4, 3, 3, 3))
    bias = rng.integers(-3000, 3000, 4).astype(np.int32)
    xs, ys = (f32(0.5), f32(4.0)) if ties else (f32(0.0213), f32(0.377))
    ws = np.full(4, f32(0.5)) if ties else rng.uniform(0.002, 0.02, 4).astype(f32)
    x_zp, y_zp = 7, 11
    inits = {"xs": xs, "xz": np.uint8(x_zp), "w": w, "ws": ws, "wz": np.zeros(4, np.int8), "ys": ys,
             "yz": np.uint8(y_zp), "b": bias}  # fmt: skip
    model = node_model("QLinearConv", [("x", np.uint8, x.shape)], inits, np.uint8, pads=[1, 1, 1, 1])
    got = IntegerSession(model, preset).run(None, {"x": x})[0]
    acc = _conv_acc(x, x_zp, w, bias)
    for m in range(4):
        if preset == "tvm-upward":  # Relay multiplies the float32 scales, then divides in double
            real = float(f32(xs * ws[m])) / float(ys)
        elif preset == "glow":
            real = float(f32(f32(xs * ws[m]) / ys))
        else:
            real = float(xs) * float(ws[m]) / float(ys)
        for index in np.ndindex(2, 5, 5):
            a = acc[index[0], m, index[1], index[2]]
            if preset == "glow":
                want = min(max(glow_scale(a, real) + y_zp, 0), 255)
            else:
                want = golden_requantize(preset, a, real, y_zp)
            assert got[index[0], m, index[1], index[2]] == want, (preset, m, index, a)


@pytest.mark.parametrize("ties", [False, True])
def test_qlinear_add_tflite(ties: bool) -> None:
    rng = np.random.default_rng(2)
    a, b = random_q(rng, np.int8, (2, 3, 4, 4)), random_q(rng, np.int8, (2, 3, 4, 4))
    scales = (0.5, 0.25, 1.0) if ties else (0.031, 0.017, 0.043)
    zps = (-5, 7, 1)
    inits = {"as": f32(scales[0]), "az": np.int8(zps[0]), "bs": f32(scales[1]), "bz": np.int8(zps[1]),
             "cs": f32(scales[2]), "cz": np.int8(zps[2])}  # fmt: skip
    order = ["a", "as", "az", "b", "bs", "bz", "cs", "cz"]
    spec = [("a", np.int8, a.shape), ("b", np.int8, b.shape)]
    model = node_model("QLinearAdd", spec, inits, np.int8, domain=MS, input_order=order)
    got = IntegerSession(model, "tflite").run(None, {"a": a, "b": b})[0]
    s = [float(f32(v)) for v in scales]
    want = [
        min(max(tflite_add(int(p), s[0], zps[0], int(q), s[1], zps[1], s[2], zps[2]), -128), 127)
        for p, q in zip(a.ravel(), b.ravel(), strict=True)
    ]
    np.testing.assert_array_equal(got.ravel(), want)


def test_qlinear_mul_tflite() -> None:
    rng = np.random.default_rng(3)
    a, b = random_q(rng, np.int8, (3, 20)), random_q(rng, np.int8, (3, 20))
    inits = {"as": f32(0.05), "az": np.int8(3), "bs": f32(0.02), "bz": np.int8(-9), "cs": f32(0.3), "cz": np.int8(-4)}
    order = ["a", "as", "az", "b", "bs", "bz", "cs", "cz"]
    spec = [("a", np.int8, a.shape), ("b", np.int8, b.shape)]
    model = node_model("QLinearMul", spec, inits, np.int8, domain=MS, input_order=order)
    got = IntegerSession(model, "tflite").run(None, {"a": a, "b": b})[0]
    q, shift = quantize_multiplier(float(f32(0.05)) * float(f32(0.02)) / float(f32(0.3)))
    want = [
        min(max(mbqm_double((int(p) - 3) * (int(r) + 9), q, shift) - 4, -128), 127)
        for p, r in zip(a.ravel(), b.ravel(), strict=True)
    ]
    np.testing.assert_array_equal(got.ravel(), want)


def test_q15_multiplier_single_rounding() -> None:
    """A 15-bit multiplier: q = round_half_away(frac * 2**15), y = (acc q + 2**(t-1)) >> t, t = 15 - shift."""
    from golden import golden_shift

    from pytest_qaccuracy.backend import arith, get_scheme

    scheme = get_scheme("tflite-single-rounding").replace(multiplier="q15")
    rng = np.random.default_rng(4)
    acc = rng.integers(-(2**16), 2**16, 300)
    m = rng.uniform(1e-5, 2e-3, 300)
    got = arith.requantize(acc, m, 3, np.int8, scheme, "gemm")
    want = []
    for a, mm in zip(acc.tolist(), m.tolist(), strict=True):
        frac, exp = np.frexp(mm)
        q = golden_shift(int(frac * 2**16), 1, "half_away")  # frac * 2**15, rounded half away
        if q == 2**15:
            q, exp = q // 2, exp + 1
        t = 15 - int(exp)
        want.append(min(max(((a * q + (1 << (t - 1))) >> t) + 3, -128), 127))
    np.testing.assert_array_equal(got, want)
    assert np.mean(np.abs(got) == 127) < 0.25


@pytest.mark.parametrize("preset", ["glow", "power2"])
def test_qlinear_add_rescales_each_input(preset: str) -> None:
    """Glow/power2 add: each input rescaled to the output scale on its own, then summed (two roundings)."""
    from golden import golden_shift

    rng = np.random.default_rng(5)
    a, b = random_q(rng, np.uint8, (64,)), random_q(rng, np.uint8, (64,))
    s_a, s_b, s_c = f32(0.031), f32(0.017), f32(0.08)
    inits = {"as": s_a, "az": np.uint8(3), "bs": s_b, "bz": np.uint8(9), "cs": s_c, "cz": np.uint8(1)}
    order = ["a", "as", "az", "b", "bs", "bz", "cs", "cz"]
    spec = [("a", np.uint8, a.shape), ("b", np.uint8, b.shape)]
    model = node_model("QLinearAdd", spec, inits, np.uint8, domain=MS, input_order=order)
    got = IntegerSession(model, preset).run(None, {"a": a, "b": b})[0]

    def rescale(x: int, ratio: float) -> int:
        if preset == "glow":
            return glow_scale(x, float(f32(ratio)))
        e = int(np.round(np.log2(ratio)))  # nearest power of two, rounding shift half up
        return golden_shift(x, -e, "half_up")

    r_a, r_b = float(s_a) / float(s_c), float(s_b) / float(s_c)
    if preset == "glow":
        r_a, r_b = float(f32(s_a / s_c)), float(f32(s_b / s_c))
    want = [
        min(max(rescale(int(p) - 3, r_a) + rescale(int(q) - 9, r_b) + 1, 0), 255) for p, q in zip(a, b, strict=True)
    ]
    np.testing.assert_array_equal(got, want)


def test_accumulator_wraps_or_stays_exact() -> None:
    """A 1x1 conv whose sum exceeds int32: ``wrap32`` wraps it like C kernels, ``exact`` does not."""
    from pytest_qaccuracy.backend import arith, get_scheme

    c = 70000  # 255 * 127 * 70000 > 2**31
    x = np.full((1, c, 1, 1), 255, np.uint8)
    w = np.full((1, c, 1, 1), 127, np.int8)
    exact_sum = 255 * 127 * c
    wrapped = (exact_sum + 2**31) % 2**32 - 2**31
    inits = {"xs": f32(1.0), "xz": np.uint8(0), "w": w, "ws": f32(2.0**-24), "wz": np.int8(0), "ys": f32(1.0),
             "yz": np.uint8(128)}  # fmt: skip
    model = node_model("QLinearConv", [("x", np.uint8, x.shape)], inits, np.uint8)
    ort_like = get_scheme("onnxruntime-vnni")  # exact int32 pair sums: the wrap is the point here, not pairs
    got_wrap = IntegerSession(model, ort_like).run(None, {"x": x})[0].item()
    got_exact = IntegerSession(model, ort_like.replace(accumulator="exact")).run(None, {"x": x})[0].item()
    assert got_wrap == min(max(int(np.rint(np.float32(wrapped) * np.float32(2.0**-24))) + 128, 0), 255)
    assert got_exact == min(max(int(np.rint(np.float32(exact_sum) * np.float32(2.0**-24))) + 128, 0), 255)
    assert got_wrap != got_exact
    assert arith.accumulate(np.array([exact_sum]), ort_like)[0] == wrapped
