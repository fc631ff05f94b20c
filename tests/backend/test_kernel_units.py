"""The non-convolution kernels called one at a time: pool, tensor, elementwise, quantize, softmax, matmul.

Each expected value comes from outside the kernel: onnxruntime run on the same one-node model, the
ONNX spec's numpy formula, or integer arithmetic worked by hand in the test. The failure paths (a
case left to ``onnx.reference``, a geometry onnxruntime refuses) are exercised too. These tests are
the ``kernels`` mutation group's fast unit tests (``scripts/mutation.py``).
"""

from __future__ import annotations

import math
import re

import numpy as np
import onnxruntime
import pytest
from backend_models import MS, assert_same, node_model, ort_run, random_q
from onnx import TensorProto, helper, numpy_helper

from pytest_qaccuracy.backend import get_scheme
from pytest_qaccuracy.backend.kernels import elementwise, matmul, pool, quantize, softmax, tensor
from pytest_qaccuracy.backend.registry import NotHandled
from pytest_qaccuracy.backend.scheme import for_onnxruntime

f32 = np.float32
ORT = get_scheme("onnxruntime")
#: onnxruntime 1.20 and later run opset 21's blocked QuantizeLinear and QLinearMatMul (1.18: neither)
ORT_OPSET_21 = tuple(int(p) for p in onnxruntime.__version__.split(".")[:2]) >= (1, 20)
#: the QLinearMatMul onnxruntime runs: opset 21's, else opset 10's (the same formula)
MATMUL_OPSET = 21 if ORT_OPSET_21 else 13
REFERENCE = get_scheme("onnx-reference")
TFLITE = get_scheme("tflite")
rng = np.random.default_rng(36)


def _ort(op: str, feeds: dict[str, np.ndarray], inits: dict[str, object], out, order=None, domain="", **attrs):
    """onnxruntime's outputs for one node (feeds are graph inputs, inits initializers)."""
    spec = [(name, value.dtype, value.shape) for name, value in feeds.items()]
    output_dtype = attrs.pop("output_dtype", None)  # the attribute, not node_model's argument
    model = node_model(op, spec, inits, out, domain=domain, input_order=order, **attrs)
    if output_dtype is not None:
        model.graph.node[0].attribute.append(helper.make_attribute("output_dtype", output_dtype))
    return ort_run(model, feeds)


def _i64(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def _srdhm(a: int, b: int) -> int:
    """gemmlowp SaturatingRoundingDoublingHighMul on Python ints."""
    if a == b == -(1 << 31):
        return (1 << 31) - 1
    ab = a * b
    nudge = (1 << 30) if ab >= 0 else 1 - (1 << 30)
    return int((ab + nudge) / (1 << 31))  # C's division truncates toward zero


def _rdbpot(x: int, exponent: int) -> int:
    """gemmlowp RoundingDivideByPOT (half away from zero)."""
    mask = (1 << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> exponent) + (1 if remainder > threshold else 0)


def _quantize_multiplier(m: float) -> tuple[int, int]:
    """TFLite QuantizeMultiplier: m = q * 2^(shift - 31), q in [2^30, 2^31)."""
    frac, shift = math.frexp(m)
    q = round(frac * (1 << 31))
    if q == 1 << 31:
        q, shift = q // 2, shift + 1
    return q, shift


def _mbqm(x: int, m: float, single: bool = False) -> int:
    """TFLite MultiplyByQuantizedMultiplier: SRDHM then RoundingDivideByPOT, or with
    TFLITE_SINGLE_ROUNDING one rounding shift, (x q + 2^(t - 1)) >> t with t = 31 - shift."""
    q, shift = _quantize_multiplier(m)
    if single:
        total = 31 - shift
        return (x * q + (1 << (total - 1))) >> total
    left, right = max(shift, 0), max(-shift, 0)
    return _rdbpot(_srdhm(x * (1 << left), q), right)


# -- pool ----------------------------------------------------------------------------------------

X4 = rng.normal(0, 1, (2, 3, 7, 6)).astype(f32)


@pytest.mark.parametrize(
    "attrs",
    [
        {"kernel_shape": [2, 3], "auto_pad": "SAME_UPPER", "strides": [2, 3]},
        {"kernel_shape": [2, 3], "auto_pad": "SAME_LOWER", "strides": [2, 3]},
        {"kernel_shape": [3, 2], "auto_pad": "SAME_LOWER", "strides": [1, 2]},
        {"kernel_shape": [3, 3], "auto_pad": "VALID", "strides": [2, 2], "pads": [1, 1, 1, 1]},
        {"kernel_shape": [2, 2], "auto_pad": "NOTSET", "pads": [1, 0, 0, 1], "strides": [2, 1]},
        {"kernel_shape": [3, 2], "dilations": [2, 3], "pads": [2, 0, 1, 1], "ceil_mode": 1, "strides": [2, 2]},
    ],
)
def test_max_and_average_pool_geometry_matches_onnxruntime(attrs) -> None:
    """Pads from auto_pad (the odd pad goes to the end for SAME_UPPER, to the start for SAME_LOWER),
    explicit pads ignored under VALID, dilations; values and shapes as onnxruntime gives them."""
    x = -np.abs(X4) - 1  # every value below the padding's 0: padding must never win a max
    (want,) = _ort("MaxPool", {"x": x}, {}, f32, model_opset=13, **attrs)
    (got,) = pool.max_pool(x, **attrs, scheme=ORT)
    assert_same(got, want, f"MaxPool {attrs}")
    if "dilations" not in attrs:  # AveragePool takes dilations from opset 19 on only
        for include in (0, 1):
            (want,) = _ort("AveragePool", {"x": X4}, {}, f32, count_include_pad=include, **attrs)
            (got,) = pool.average_pool(X4, count_include_pad=include, **attrs, scheme=ORT)
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=f"AveragePool {attrs} {include}")
            assert got.dtype == np.float32


def test_average_pool_with_dilations_matches_onnxruntime() -> None:
    attrs = {"kernel_shape": [2, 2], "dilations": [2, 1], "pads": [1, 1, 0, 1], "count_include_pad": 1}
    (want,) = _ort("AveragePool", {"x": X4}, {}, f32, model_opset=19, **attrs)
    np.testing.assert_allclose(pool.average_pool(X4, **attrs, scheme=ORT)[0], want, rtol=1e-6, atol=1e-6)


def test_max_pool_on_integers_pads_with_the_type_minimum() -> None:
    x = np.full((1, 1, 3, 3), -128, np.int8)
    x[0, 0, 1, 1] = -127
    (got,) = pool.max_pool(x, kernel_shape=[2, 2], pads=[1, 1, 1, 1], scheme=ORT)
    assert_same(got, np.array([[[[-128, -128, -128, -128], [-128, -127, -127, -128],
                                 [-128, -127, -127, -128], [-128, -128, -128, -128]]]], np.int8))  # fmt: skip
    (want,) = _ort("MaxPool", {"x": x}, {}, np.int8, kernel_shape=[2, 2], pads=[1, 1, 1, 1])
    assert_same(got, want)


def test_max_pool_with_an_indices_output_is_left_to_the_reference() -> None:
    with pytest.raises(NotHandled):
        pool.max_pool(X4, kernel_shape=[2, 2], n_outputs=2, scheme=ORT)


def test_a_same_pad_with_a_negative_begin_is_refused() -> None:
    """size 7, stride 4, kernel 1: SAME needs -2 pads, of which SAME_UPPER puts -1 at the start."""
    with pytest.raises(ValueError, match="auto_pad SAME_UPPER gives a negative begin pad on spatial axis 1"):
        pool.max_pool(
            np.zeros((1, 1, 4, 7), f32), kernel_shape=[1, 1], strides=[1, 4], auto_pad="SAME_UPPER", scheme=ORT
        )
    # SAME_LOWER puts int(-1 / 2) = 0 at the start and crops the end: one window per stride
    (got,) = pool.max_pool(np.arange(7, dtype=f32).reshape(1, 1, 1, 7), kernel_shape=[1, 1], strides=[1, 4],
                           auto_pad="SAME_LOWER", scheme=ORT)  # fmt: skip
    assert_same(got, np.array([[[[0, 4]]]], f32))


def test_a_window_larger_than_the_padded_input_is_refused() -> None:
    with pytest.raises(ValueError, match=r"the window \(4 taps, dilation 2\) does not fit spatial axis 0 of size 5"):
        pool.max_pool(np.zeros((1, 1, 5, 5), f32), kernel_shape=[4, 1], dilations=[2, 1], scheme=ORT)


def test_an_empty_input_is_refused_unless_only_its_batch_is_empty() -> None:
    for shape in [(2, 0, 4, 4), (2, 3, 0, 4), (2, 3, 4, 0)]:  # no channel, or an empty spatial axis
        with pytest.raises(ValueError, match=re.escape(f"the input {shape} holds no value but its batch is not empty")):
            pool.max_pool(np.zeros(shape, f32), kernel_shape=[2, 2], scheme=ORT)
    (got,) = pool.max_pool(np.zeros((0, 3, 4, 4), f32), kernel_shape=[2, 2], scheme=ORT)
    assert got.shape == (0, 3, 3, 3)


def test_average_pool_by_hand_with_and_without_the_pads_counted() -> None:
    """1 x 3 input [1, 2, 4], kernel 2, pads 1 | 1: windows [pad, 1], [1, 2], [2, 4], [4, pad]."""
    x = np.array([[[[1, 2, 4]]]], f32)
    (excl,) = pool.average_pool(x, kernel_shape=[1, 2], pads=[0, 1, 0, 1], scheme=ORT)
    (incl,) = pool.average_pool(x, kernel_shape=[1, 2], pads=[0, 1, 0, 1], count_include_pad=1, scheme=ORT)
    assert_same(excl, np.array([[[[1, 1.5, 3, 4]]]], f32))
    assert_same(incl, np.array([[[[0.5, 1.5, 3, 2]]]], f32))


def test_global_average_pool_matches_onnxruntime() -> None:
    x = rng.normal(0, 1, (2, 3, 4, 5, 2)).astype(f32)
    (want,) = _ort("GlobalAveragePool", {"x": x}, {}, f32)
    (got,) = pool.global_average_pool(x)
    assert got.shape == want.shape == (2, 3, 1, 1, 1) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


QPOOL_PARAMS = {"xs": f32(0.05), "xz": np.uint8(131), "ys": f32(0.03), "yz": np.uint8(117)}


@pytest.mark.parametrize(
    "attrs",
    [
        {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
        {"kernel_shape": [3, 3], "pads": [1, 0, 1, 2], "count_include_pad": 1, "strides": [2, 2]},
        {"kernel_shape": [2, 3], "auto_pad": "SAME_LOWER", "strides": [2, 2]},
        {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1},
        {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "channels_last": 1},
        {"kernel_shape": [2, 2], "pads": [1, 1, 0, 0], "channels_last": 1, "count_include_pad": 1},
    ],
)
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_average_pool_matches_onnxruntime(attrs, dtype) -> None:
    x = random_q(rng, dtype, (2, 5, 7, 3) if attrs.get("channels_last") else (2, 3, 5, 7))
    p = {k: (v if k.endswith("s") else v.astype(dtype) if dtype == np.uint8 else np.int8(int(v) - 128))
         for k, v in QPOOL_PARAMS.items()}  # fmt: skip
    (want,) = _ort("QLinearAveragePool", {"x": x}, p, dtype, order=["x", "xs", "xz", "ys", "yz"], domain=MS, **attrs)
    (got,) = pool.qlinear_average_pool(x, p["xs"], p["xz"], p["ys"], p["yz"], scheme=ORT, **attrs)
    assert_same(got, want, f"QLinearAveragePool {attrs}")


def test_qlinear_average_pool_without_zero_points_matches_onnxruntime_with_zeros() -> None:
    """Absent zero points are 0 (onnxruntime wants them present: it gets explicit zeros)."""
    x = random_q(rng, np.uint8, (1, 2, 4, 4))
    inits = {"xs": f32(0.02), "xz": np.uint8(0), "ys": f32(0.05), "yz": np.uint8(0)}
    (want,) = _ort("QLinearAveragePool", {"x": x}, inits, np.uint8, order=["x", "xs", "xz", "ys", "yz"], domain=MS,
                   kernel_shape=[2, 2], pads=[1, 1, 1, 1])  # fmt: skip
    for scheme in (ORT, TFLITE):
        (got,) = pool.qlinear_average_pool(
            x, f32(0.02), None, f32(0.05), None, kernel_shape=[2, 2], pads=[1, 1, 1, 1], scheme=scheme
        )
        if scheme is ORT:
            assert_same(got, want)
        else:  # another rounding: at most one step away
            assert got.dtype == np.uint8 and np.abs(got.astype(int) - want).max() <= 1


def test_qlinear_average_pool_in_fixed_point_and_float64_by_hand() -> None:
    """1 x 4 uint8 [10, 21, 30, 41] - zp 2 in windows of 2 with stride 2 (and a zero point of 5 out):
    sums 27 and 67 over 2, scale ratio 1: 13.5 and 33.5. TFLite rounds half away (14, 34), then
    adds 5; float64 with onnx.reference's rules rounds half to even (14, 34) as well; a ratio of 2
    (y scale halved) makes 27 and 67 exact."""
    x = np.array([[[[10, 21, 30, 41]]]], np.uint8)
    zp_x, zp_y = np.uint8(2), np.uint8(5)
    # onnxruntime's rule adds the zero point before rounding: 18.5 and 38.5 go to even
    (got,) = pool.qlinear_average_pool(
        x, f32(0.5), zp_x, f32(0.5), zp_y, kernel_shape=[1, 2], strides=[1, 2], scheme=ORT.replace(multiplier="float64")
    )
    assert_same(got, np.array([[[[18, 38]]]], np.uint8))
    for scheme in (TFLITE, REFERENCE):
        (got,) = pool.qlinear_average_pool(
            x, f32(0.5), zp_x, f32(0.5), zp_y, kernel_shape=[1, 2], strides=[1, 2], scheme=scheme
        )
        assert_same(got, np.array([[[[19, 39]]]], np.uint8), scheme.name)
        (got,) = pool.qlinear_average_pool(
            x, f32(0.5), zp_x, f32(0.25), zp_y, kernel_shape=[1, 2], strides=[1, 2], scheme=scheme
        )
        assert_same(got, np.array([[[[32, 72]]]], np.uint8), scheme.name)
    # a padded window divides by its in-bounds taps (2), or by the whole kernel (3) with count_include_pad
    (got,) = pool.qlinear_average_pool(
        x, f32(0.5), zp_x, f32(0.5), zp_y, kernel_shape=[1, 3], pads=[0, 1, 0, 0], strides=[1, 2], scheme=TFLITE
    )
    # [8, 19] / 2 = 13.5 -> 14; [19, 28, 39] / 3 in TFLite's two roundings: 57.33 -> 57, 57 / 2 -> 29
    assert_same(got, np.array([[[[14 + 5, _mbqm(86, 1 / 3) + 5]]]], np.uint8))
    assert _mbqm(86, 1 / 3) == 29
    (got,) = pool.qlinear_average_pool(
        x,
        f32(0.5),
        zp_x,
        f32(0.5),
        zp_y,
        kernel_shape=[1, 3],
        pads=[0, 1, 0, 0],
        strides=[1, 2],
        count_include_pad=1,
        scheme=TFLITE,
    )
    # the pad counts as a real 0 (the zero point): [0, 8, 19] / 3 = 9; 86 / 3 as above
    assert_same(got, np.array([[[[9 + 5, 29 + 5]]]], np.uint8))
    (float_path,) = pool.qlinear_average_pool(
        x, f32(0.5), zp_x, f32(0.5), zp_y, kernel_shape=[1, 3], pads=[0, 1, 0, 0], strides=[1, 2],
        count_include_pad=1, scheme=REFERENCE,
    )  # fmt: skip
    assert_same(float_path, np.array([[[[14, 34]]]], np.uint8))  # 28.67 -> 29


@pytest.mark.parametrize("scheme", ["tflite", "power2", "glow", "onnx-reference", "onnxruntime"])
def test_qlinear_average_pool_counts_a_pad_tap_as_a_real_zero(scheme) -> None:
    """Every input equals its zero point (real 0), so every average is 0 and the output is its zero point,
    pads counted or not (before the fix, the fixed-point path counted a counted pad tap as -zp)."""
    x = np.full((1, 1, 2, 3), 100, np.uint8)
    for include in (0, 1):
        (got,) = pool.qlinear_average_pool(
            x, f32(1), np.uint8(100), f32(1), np.uint8(50), kernel_shape=[3, 3], pads=[1, 1, 1, 1],
            count_include_pad=include, scheme=get_scheme(scheme),
        )  # fmt: skip
        assert_same(got, np.full((1, 1, 2, 3), 50, np.uint8), f"count_include_pad={include}")


@pytest.mark.parametrize("channels_last", [0, 1])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_global_average_pool_matches_onnxruntime(channels_last, dtype) -> None:
    x = random_q(rng, dtype, (2, 6, 5, 4) if channels_last else (2, 4, 6, 5))
    zp = dtype(3)
    p = {"xs": f32(0.07), "xz": zp, "ys": f32(0.011), "yz": dtype(-9 if dtype == np.int8 else 9)}
    (want,) = _ort("QLinearGlobalAveragePool", {"x": x}, p, dtype, order=["x", "xs", "xz", "ys", "yz"], domain=MS,
                   channels_last=channels_last)  # fmt: skip
    got = pool.qlinear_global_average_pool(x, p["xs"], p["xz"], p["ys"], p["yz"], channels_last=channels_last,
                                           scheme=ORT)[0]  # fmt: skip
    assert_same(got, want)


def test_qlinear_global_average_pool_by_hand() -> None:
    """[10, 20, 31] - zp 1 = 58 over 3 elements, ratio 1: 19.33 -> 19; without zero points 61 / 3 =
    20.33 -> 20; a float64 scale precision (TFLite) gives the same; an output zero point adds."""
    x = np.array([[[10, 20, 31]]], np.uint8)
    got = pool.qlinear_global_average_pool(x, f32(0.1), np.uint8(1), f32(0.1), np.uint8(4), scheme=ORT)[0]
    assert_same(got, np.array([[[23]]], np.uint8))
    got = pool.qlinear_global_average_pool(x, f32(0.1), None, f32(0.1), None, scheme=ORT)[0]
    assert_same(got, np.array([[[20]]], np.uint8))
    # TFLite's two roundings (SRDHM, then a rounding shift) take 58 / 3 to 20 and 61 / 3 to 21
    got = pool.qlinear_global_average_pool(x, f32(0.1), np.uint8(1), f32(0.1), np.uint8(4), scheme=TFLITE)[0]
    assert_same(got, np.array([[[_mbqm(58, 1 / 3) + 4]]], np.uint8))
    got = pool.qlinear_global_average_pool(x, f32(0.1), None, f32(0.1), None, scheme=TFLITE)[0]
    assert_same(got, np.array([[[_mbqm(61, 1 / 3)]]], np.uint8))
    assert (_mbqm(58, 1 / 3), _mbqm(61, 1 / 3)) == (20, 21)
    # int8 in, no input zero point, an int8 one out: -254 over 3, ratio 0.5: -42.33 -> -42, + (-60)
    x = np.array([[[-128, -128, 2]]], np.int8)
    got = pool.qlinear_global_average_pool(x, f32(0.05), None, f32(0.1), np.int8(-60), scheme=ORT)[0]
    assert_same(got, np.array([[[-102]]], np.int8))


def test_qlinear_global_average_pool_of_a_channel_past_2_24_elements_sums_in_64_bits() -> None:
    """Past 2^24 elements a channel is summed in int64: -128 x (2^24 + 4096) is below int32's range,
    255 x 4112 x 4097 above uint32's (the 32-bit sums, up to 4x faster on common shapes, are exact
    below 2^24 elements)."""
    x = np.full((1, 1, 4096, 4097), -128, np.int8)
    got = pool.qlinear_global_average_pool(x, f32(1.0), None, f32(1.0), np.int8(0), scheme=ORT)[0]
    assert_same(got, np.array([[[[-128]]]], np.int8))
    x = np.full((1, 1, 4112, 4097), 255, np.uint8)
    got = pool.qlinear_global_average_pool(x, f32(0.5), np.uint8(0), f32(1.0), np.uint8(0), scheme=ORT)[0]
    assert_same(got, np.array([[[[128]]]], np.uint8))  # 255 * 0.5 = 127.5 -> 128 (to even)


@pytest.mark.parametrize("channels_last", [0, 1])
def test_qlinear_global_average_pool_refuses_an_input_without_spatial_values(channels_last) -> None:
    shape, axes = ((1, 0, 4, 3), [1, 2]) if channels_last else ((1, 3, 4, 0), [2, 3])
    with pytest.raises(
        ValueError, match=re.escape(f"the input {shape} has no value to average over its spatial axes {axes}")
    ):
        pool.qlinear_global_average_pool(np.zeros(shape, np.uint8), f32(1), None, f32(1), None,
                                         channels_last=channels_last, scheme=ORT)  # fmt: skip


# -- tensor --------------------------------------------------------------------------------------

Q4 = random_q(rng, np.uint8, (2, 3, 4, 5))


def test_reshape_copies_zero_sizes_unless_allowzero() -> None:
    assert tensor.reshape(Q4, _i64(0, 0, -1))[0].shape == (2, 3, 20)
    assert tensor.reshape(Q4, _i64(4, 0, 10), allowzero=0)[0].shape == (4, 3, 10)
    empty = np.zeros((0, 3), f32)
    assert tensor.reshape(empty, _i64(3, 0), allowzero=1)[0].shape == (3, 0)
    with pytest.raises(ValueError):
        tensor.reshape(Q4, _i64(0, 0), allowzero=1)


def test_transpose_flatten_squeeze_unsqueeze_as_numpy_spells_the_spec() -> None:
    assert_same(tensor.transpose(Q4)[0], Q4.T)
    assert_same(tensor.transpose(Q4, perm=[0, 2, 3, 1])[0], Q4.transpose(0, 2, 3, 1))
    assert tensor.flatten(Q4)[0].shape == (2, 60)
    assert tensor.flatten(Q4, axis=0)[0].shape == (1, 120)
    assert tensor.flatten(Q4, axis=-1)[0].shape == (24, 5)
    assert tensor.flatten(Q4, axis=4)[0].shape == (120, 1)
    assert tensor.flatten(np.float32(3))[0].shape == (1, 1)
    x = Q4[:1, :, :1]
    assert tensor.squeeze(x)[0].shape == (3, 5)
    assert tensor.squeeze(x, _i64(-2))[0].shape == (1, 3, 5)
    assert tensor.squeeze_1(x)[0].shape == (3, 5)
    assert tensor.squeeze_1(x, axes=[0])[0].shape == (3, 1, 5)
    assert tensor.unsqueeze(Q4, _i64(0, -1))[0].shape == (1, 2, 3, 4, 5, 1)
    assert tensor.unsqueeze(Q4, _i64(-3))[0].shape == (2, 3, 1, 4, 5)
    assert tensor.unsqueeze_1(Q4, axes=[1, -1])[0].shape == (2, 1, 3, 4, 5, 1)
    assert tensor.unsqueeze_1(Q4, axes=[-2])[0].shape == (2, 3, 4, 1, 5)
    assert_same(tensor.concat(Q4, Q4[:, :1], axis=-3)[0], np.concatenate([Q4, Q4[:, :1]], axis=1))


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_reads_negative_indices_from_the_end(axis) -> None:
    idx = np.array([[0, -1], [-2, 1]], np.int64)
    (want,) = _ort("Gather", {"x": Q4}, {"i": idx}, np.uint8, axis=axis)
    assert_same(tensor.gather(Q4, idx, axis=axis)[0], want)


@pytest.mark.parametrize(
    "inits",
    [
        {"st": _i64(1), "en": _i64(3)},
        {"st": _i64(-1, 0), "en": _i64(-100, 3), "ax": _i64(3, 1), "sp": _i64(-2, 1)},
        {"st": _i64(0, 1), "en": _i64(9223372036854775807, 4), "ax": _i64(-2, -1)},
    ],
)
def test_slice_matches_onnxruntime(inits) -> None:
    order = ["x", *inits]
    (want,) = _ort("Slice", {"x": Q4}, inits, np.uint8, order=order)
    (got,) = tensor.slice_(Q4, *inits.values())
    assert_same(got, want)


def test_qlinear_concat_copies_matching_inputs_and_requantizes_the_others() -> None:
    """Input 0 has the output's parameters (copied as is), input 1 another zero point, input 2 another
    scale; by hand: (v - zp) * s / y_s + y_zp, rounded half to even."""
    a = np.array([[0, 7, 255]], np.uint8)
    b = np.array([[10, 13, 200]], np.uint8)
    c = np.array([[1, 2, 3]], np.uint8)
    ys, yz = f32(0.5), np.uint8(4)
    args = (ys, yz, a, f32(0.5), np.uint8(4), b, f32(0.5), np.uint8(6), c, f32(0.25), np.uint8(0))
    (got,) = tensor.qlinear_concat(*args, axis=-1, scheme=ORT)
    want = np.array([[0, 7, 255, 8, 11, 198, 4, 5, 6]], np.uint8)  # c: 0.5 -> 0, 1, 1.5 -> 2: +4
    assert_same(got, want)
    (got,) = tensor.qlinear_concat(*args, axis=0, scheme=ORT)
    assert_same(got, want.reshape(3, 3))
    # the same against onnxruntime, on records split over the threads
    xs = [random_q(rng, np.uint8, (3, 2, 4)), random_q(rng, np.uint8, (3, 1, 4)), random_q(rng, np.uint8, (3, 5, 4))]
    inits = {"ys": f32(0.1), "yz": np.uint8(128), "s0": f32(0.1), "z0": np.uint8(128), "s1": f32(0.1),
             "z1": np.uint8(100), "s2": f32(0.37), "z2": np.uint8(128)}  # fmt: skip
    order = ["ys", "yz", "x0", "s0", "z0", "x1", "s1", "z1", "x2", "s2", "z2"]
    feeds = {f"x{i}": x for i, x in enumerate(xs)}
    (want,) = _ort("QLinearConcat", feeds, inits, np.uint8, order=order, domain=MS, axis=1)
    flat = [v for i in range(3) for v in (xs[i], inits[f"s{i}"], inits[f"z{i}"])]
    assert_same(tensor.qlinear_concat(inits["ys"], inits["yz"], *flat, axis=-2, scheme=ORT)[0], want)
    with pytest.raises(ValueError):  # records that differ in number: numpy's own error
        tensor.qlinear_concat(ys, yz, a, ys, yz, np.zeros((2, 3), np.uint8), ys, yz, axis=1, scheme=ORT)


RESIZE_MODES = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn"]
NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]


@pytest.mark.parametrize("transform", RESIZE_MODES)
def test_resize_nearest_matches_onnxruntime(transform) -> None:
    """Every coordinate transform and nearest mode, up and down, by scales and by sizes (sizes of 1
    included: the pytorch and align_corners transforms read index 0 there)."""
    x = random_q(rng, np.uint8, (2, 3, 5, 8))
    empty = np.zeros(0, f32)
    for nearest in NEAREST_MODES:
        attrs = {"mode": "nearest", "coordinate_transformation_mode": transform, "nearest_mode": nearest}
        for scales in ([1, 1, 1.6, 0.75], [1, 1, 0.4, 2.5], [1, 1, 3, 1]):
            sc = np.array(scales, f32)
            (want,) = _ort("Resize", {"x": x}, {"roi": empty, "sc": sc}, np.uint8, **attrs)
            assert_same(tensor.resize(x, empty, sc, **attrs, scheme=ORT)[0], want, f"{attrs} {scales}")
        for sizes in ((2, 3, 1, 13), (2, 3, 7, 1), (2, 3, 5, 3)):
            sz = _i64(*sizes)
            (want,) = _ort("Resize", {"x": x}, {"roi": empty, "sc": empty, "sz": sz}, np.uint8, **attrs)
            assert_same(tensor.resize(x, empty, empty, sz, **attrs, scheme=ORT)[0], want, f"{attrs} {sizes}")


def test_resize_leaves_other_modes_to_the_reference() -> None:
    x = Q4.astype(f32)
    sc = np.array([1, 1, 2, 2], f32)
    for attrs in ({"mode": "linear"}, {"axes": [2, 3]}, {"keep_aspect_ratio_policy": "not_larger"},
                  {"antialias": 1}, {"coordinate_transformation_mode": "tf_crop_and_resize"},
                  {"coordinate_transformation_mode": "unknown"}):  # fmt: skip
        with pytest.raises(NotHandled):
            tensor.resize(x, None, sc, **attrs, scheme=ORT)
    assert tensor.resize(x, None, np.ones(4, f32), scheme=ORT)[0] is x  # nothing to resize: the input itself


# -- elementwise ---------------------------------------------------------------------------------


def test_logistic_matches_onnxruntime_sigmoid_bit_for_bit() -> None:
    """MLAS's polynomial is onnxruntime's float Sigmoid (clamped at +-18); the numpy formula is the
    exact 1 / (1 + e^-x), 0 below -88 without a warning."""
    x = np.concatenate([np.linspace(-20, 20, 4001, dtype=f32), f32([-1e4, -88.5, 88.5, 1e4, 0])])
    (want,) = _ort("Sigmoid", {"x": x}, {}, f32)
    assert_same(elementwise.logistic(x, ORT), want)
    with np.errstate(over="raise"):
        got = elementwise.logistic(x, REFERENCE)
    with np.errstate(over="ignore"):
        exact = (1 / (1 + np.exp(-x.astype(np.float64)))).astype(f32)
    np.testing.assert_allclose(got, exact, rtol=2e-7, atol=0)
    assert got.dtype == np.float32 and got[-5] == 0


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_float_elementwise_kernels_match_onnxruntime(dtype) -> None:
    x = rng.normal(0, 3, (2, 3, 4)).astype(f32)
    for op, ours in (("Relu", elementwise.relu), ("Sigmoid", elementwise.sigmoid), ("Identity", elementwise.identity)):
        (want,) = _ort(op, {"x": x}, {}, f32)
        np.testing.assert_allclose(ours(x)[0], want, rtol=1e-6, atol=1e-7, err_msg=op)
        assert ours(x)[0].dtype == np.float32
    q = random_q(rng, dtype, (3, 4))
    assert_same(elementwise.relu(q.astype(np.int32))[0], np.maximum(q.astype(np.int32), 0))
    for lo, hi, order in ((f32(-1), f32(2), ["x", "lo", "hi"]), (f32(-1), None, ["x", "lo"]),
                          (None, f32(0.5), ["x", "", "hi"]), (None, None, ["x"])):  # fmt: skip
        inits = {k: v for k, v in (("lo", lo), ("hi", hi)) if v is not None}
        (want,) = _ort("Clip", {"x": x}, inits, f32, order=order)
        assert_same(elementwise.clip(x, lo, hi)[0], want)
    assert_same(elementwise.clip(q, dtype(1), dtype(9))[0], np.clip(q, 1, 9).astype(dtype))


def _by_hand_table(fn, dtype, xs, xz, ys, yz, y_dtype=None):
    """quantize(fn(dequantize(q))) over every 8-bit q, in float32, rounding half to even."""
    y_dtype = y_dtype or dtype
    info, out = np.iinfo(dtype), np.iinfo(y_dtype)
    q = np.arange(info.min, info.max + 1)
    v = ((q - int(xz)).astype(f32) * f32(xs)).astype(f32)
    y = np.rint(fn(v).astype(f32) / f32(ys)) + int(yz)
    return np.clip(y, out.min, out.max).astype(y_dtype)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_lookup_and_requantize_tables_by_hand(dtype) -> None:
    info = np.iinfo(dtype)
    x = np.arange(info.min, info.max + 1).astype(dtype)[::-1].copy()
    xs, xz, ys, yz = f32(0.05), dtype(7), f32(0.03), dtype(-3 if dtype == np.int8 else 3)
    index = x.astype(np.int64) - info.min

    def run(**kw):
        return elementwise.qlinear_lookup(x, xs, xz, ys, yz, scheme=ORT, **kw)[0]

    assert_same(run(function="Relu"), _by_hand_table(lambda v: np.maximum(v, 0), dtype, xs, xz, ys, yz)[index])
    clip = _by_hand_table(lambda v: np.clip(v, f32(-1), f32(2)), dtype, xs, xz, ys, yz)[index]
    assert_same(run(function="Clip", min=-1.0, max=2.0), clip)
    assert_same(elementwise.qlinear_lookup(x, xs, xz, ys, yz, f32(-1), f32(2), function="Clip", scheme=ORT)[0], clip)
    low_only = _by_hand_table(lambda v: np.maximum(v, f32(-1)), dtype, xs, xz, ys, yz)[index]
    assert_same(elementwise.qlinear_lookup(x, xs, xz, ys, yz, f32(-1), None, function="Clip", scheme=ORT)[0], low_only)
    assert_same(run(function="Clip", min=-1.0), low_only)
    high_only = _by_hand_table(lambda v: np.minimum(v, f32(2)), dtype, xs, xz, ys, yz)[index]
    assert_same(elementwise.qlinear_lookup(x, xs, xz, ys, yz, None, f32(2), function="Clip", scheme=ORT)[0], high_only)
    assert_same(run(function="Clip", max=2.0), high_only)
    same = _by_hand_table(lambda v: v, dtype, xs, xz, ys, yz)[index]
    assert_same(elementwise.requantize_table(x, xs, xz, ys, yz, scheme=ORT)[0], same)
    no_zp = _by_hand_table(lambda v: v, dtype, xs, 0, ys, 0)[index]
    assert_same(elementwise.requantize_table(x, xs, None, ys, None, scheme=ORT)[0], no_zp)
    # 16-bit values index the table by value: table[x - qmin]
    wide = np.array([-32768, 0, 32767], np.int16)
    assert_same(elementwise.apply_table(wide, np.arange(65536) * 2), np.array([0, 65536, 131070]))


@pytest.mark.parametrize("op", ["QLinearSigmoid", "QLinearLeakyRelu"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_table_ops_on_every_input_match_onnxruntime(op, dtype) -> None:
    info = np.iinfo(dtype)
    x = np.arange(info.min, info.max + 1).astype(dtype).reshape(2, 128)
    for xs, xz, ys, yz in ((0.05, 7, 1 / 256, 0), (0.1, 0, 0.03, 11)):
        inits = {"xs": f32(xs), "xz": dtype(xz), "ys": f32(ys), "yz": dtype(yz)}
        attrs = {"alpha": 0.2} if op == "QLinearLeakyRelu" else {}
        (want,) = _ort(op, {"x": x}, inits, dtype, order=["x", "xs", "xz", "ys", "yz"], domain=MS, **attrs)
        ours = elementwise.qlinear_sigmoid if op == "QLinearSigmoid" else elementwise.qlinear_leaky_relu
        assert_same(ours(x, *inits.values(), scheme=ORT, **attrs)[0], want, f"{op} {inits}")
    if op == "QLinearLeakyRelu":  # the default alpha, 0.01, by hand
        got = elementwise.qlinear_leaky_relu(x, f32(1), dtype(0), f32(0.01), dtype(0), scheme=ORT)[0]
        v = x.astype(f32)
        want = np.clip(np.rint(np.where(v >= 0, v, f32(0.01) * v) / f32(0.01)), info.min, info.max).astype(dtype)
        assert_same(got, want)


BINARY_SHAPES = [((2, 3, 4, 5), (1, 3, 1, 1)), ((2, 3, 4, 5), (5,)), ((1,), (2, 3, 4, 5)), ((2, 3, 4, 1), (2, 3, 4, 5)),
                 ((2, 3, 4, 5), ()), ((3, 1, 5), (2, 1, 4, 1)), ((), ())]  # fmt: skip


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dtypes", [(np.uint8, np.uint8), (np.int8, np.int8)])
def test_qlinear_binary_broadcasts_like_onnxruntime(op, dtypes) -> None:
    """Broadcast operands of every kind (per channel, innermost, one value, both) against onnxruntime."""
    for shape_a, shape_b in BINARY_SHAPES:
        a, b = random_q(rng, dtypes[0], shape_a), random_q(rng, dtypes[1], shape_b)
        c = dtypes[0]
        inits = {"as": f32(0.031), "az": c(3), "bs": f32(0.017), "bz": c(9), "cs": f32(0.05 if op == "QLinearAdd"
                 else 0.009), "cz": c(-5 if c == np.int8 else 5)}  # fmt: skip
        order = ["a", "as", "az", "b", "bs", "bz", "cs", "cz"]
        (want,) = _ort(op, {"a": a, "b": b}, inits, c, order=order, domain=MS)
        ours = elementwise.qlinear_add if op == "QLinearAdd" else elementwise.qlinear_mul
        args = (a, inits["as"], inits["az"], b, inits["bs"], inits["bz"], inits["cs"], inits["cz"])
        assert_same(ours(*args, scheme=ORT)[0], want, f"{op} {shape_a} {shape_b}")
        # the cache: the same call again reads its table
        assert_same(ours(*args, scheme=ORT)[0], want, f"{op} {shape_a} {shape_b} again")


def test_qlinear_binary_without_zero_points_matches_onnxruntime_with_zeros() -> None:
    a, b = random_q(rng, np.uint8, (2, 8)), random_q(rng, np.uint8, (2, 8))
    z = np.uint8(0)
    for op, ours in (("QLinearAdd", elementwise.qlinear_add), ("QLinearMul", elementwise.qlinear_mul)):
        inits = {"as": f32(0.02), "az": z, "bs": f32(0.03), "bz": z, "cs": f32(0.04), "cz": z}
        (want,) = _ort(op, {"a": a, "b": b}, inits, np.uint8, order=["a", "as", "az", "b", "bs", "bz", "cs", "cz"],
                       domain=MS)  # fmt: skip
        assert_same(ours(a, f32(0.02), None, b, f32(0.03), None, f32(0.04), scheme=ORT)[0], want, op)


def _tflite_add(
    a: int, b: int, a_s, a_zp, b_s, b_zp, c_s, c_zp, left_shift: int, lo: int, hi: int, single=False
) -> int:
    """TFLite's reference quantized ADD (reference_ops::AddElementwise) on one pair."""
    twice_max = 2 * max(float(a_s), float(b_s))
    sa = _mbqm((a - a_zp) << left_shift, float(a_s) / twice_max, single)
    sb = _mbqm((b - b_zp) << left_shift, float(b_s) / twice_max, single)
    out = _mbqm(sa + sb, twice_max / ((1 << left_shift) * float(c_s)), single) + c_zp
    return min(max(out, lo), hi)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16])
def test_qlinear_add_in_tflite_fixed_point_matches_its_reference_add(dtype) -> None:
    info = np.iinfo(dtype)
    a = random_q(rng, dtype, (64,))
    b = random_q(rng, dtype, (64,))
    a[:4] = [info.min, info.max, info.min, 0]
    b[:4] = [info.min, info.max, info.max, 0]
    if dtype == np.int16:  # pairs where a left shift of 16 (not TFLite's 15 for 16 bits) ends one step off
        a[4:7] = [18938, -21895, 20488]
        b[4:7] = [25568, -29963, 28068]
    params = (f32(0.031), 3, f32(0.017), -2 if dtype != np.uint8 else 9, f32(0.05), 5)
    left_shift = 20 if dtype != np.int16 else 15
    want = np.array(
        [_tflite_add(int(x), int(y), *params, left_shift, info.min, info.max) for x, y in zip(a, b, strict=True)], dtype
    )
    a_s, a_zp, b_s, b_zp, c_s, c_zp = params
    got = elementwise.qlinear_add(a, a_s, dtype(a_zp), b, b_s, dtype(b_zp), c_s, dtype(c_zp), scheme=TFLITE)[0]
    assert_same(got, want)
    # the b scale the larger one
    got = elementwise.qlinear_add(b, b_s, dtype(b_zp), a, a_s, dtype(a_zp), c_s, dtype(c_zp), scheme=TFLITE)[0]
    want = np.array(
        [_tflite_add(int(y), int(x), b_s, b_zp, a_s, a_zp, c_s, c_zp, left_shift, info.min, info.max)
         for x, y in zip(a, b, strict=True)], dtype)  # fmt: skip
    assert_same(got, want)


@pytest.mark.parametrize("preset", ["tflite", "tflite-single-rounding"])
def test_qlinear_add_in_tflite_fixed_point_on_a_grid_of_pairs(preset) -> None:
    """4,096 uint8 pairs (every a, 16 values of b): the two roundings and the single rounding differ
    on some of them."""
    a = np.repeat(np.arange(256), 16).astype(np.uint8)
    b = np.tile(np.arange(3, 256, 16), 256).astype(np.uint8)
    single = preset == "tflite-single-rounding"
    for a_s, a_zp, b_s, b_zp, c_s, c_zp in ((f32(0.031), 3, f32(0.017), 9, f32(0.05), 5),
                                             (f32(0.002), 128, f32(0.0025), 120, f32(0.003), 131)):  # fmt: skip
        want = np.array([_tflite_add(int(x), int(y), a_s, a_zp, b_s, b_zp, c_s, c_zp, 20, 0, 255, single)
                         for x, y in zip(a, b, strict=True)], np.uint8)  # fmt: skip
        got = elementwise.qlinear_add(a, a_s, np.uint8(a_zp), b, b_s, np.uint8(b_zp), c_s, np.uint8(c_zp),
                                      scheme=get_scheme(preset))[0]  # fmt: skip
        assert_same(got, want, f"{preset} {a_s}")
        other = np.array([_tflite_add(int(x), int(y), a_s, a_zp, b_s, b_zp, c_s, c_zp, 20, 0, 255, not single)
                          for x, y in zip(a, b, strict=True)], np.uint8)  # fmt: skip
        assert (other != want).any(), "the grid tells the two roundings apart"


def test_qlinear_add_in_float64_and_with_two_roundings_by_hand() -> None:
    """float64 (onnx.reference's rules): one rounding half to even, then the zero point; power2: each
    input rescaled to the output scale on its own (half up), then added."""
    a = np.array([0, 1, 2, 3, 255, 2], np.uint8)
    b = np.array([0, 0, 1, 1, 255, 2], np.uint8)
    # (a - 1) * 0.25 + (b - 2) * 0.5 over 0.5: (a - 1) / 2 + (b - 2)
    got = elementwise.qlinear_add(a, f32(0.25), np.uint8(1), b, f32(0.5), np.uint8(2), f32(0.5), np.uint8(10),
                                  scheme=REFERENCE)[0]  # fmt: skip
    exact = (a.astype(np.float64) - 1) / 2 + (b.astype(np.float64) - 2)
    assert_same(got, np.clip(np.rint(exact) + 10, 0, 255).astype(np.uint8))
    assert list(got) == [8, 8, 10, 10, 255, 10]  # -2.5, -2, -0.5, 0, 380, 0.5 rounded half to even
    power2 = get_scheme("power2")
    got = elementwise.qlinear_add(a, f32(0.25), np.uint8(1), b, f32(0.5), np.uint8(2), f32(0.5), np.uint8(10),
                                  scheme=power2)[0]  # fmt: skip
    # (a - 1) / 2 rounded half up: -0.5 -> 0, 0, 0.5 -> 1, 1, 127, 0.5 -> 1; b - 2 exact
    assert list(got) == [8, 8, 10, 10, 255, 11]
    wide = np.array([-300, 300], np.int16)
    got = elementwise.qlinear_add(wide, f32(1), np.int16(0), wide, f32(1), np.int16(0), f32(1), np.int16(0),
                                  scheme=REFERENCE)[0]  # fmt: skip
    assert_same(got, np.array([-600, 600], np.int16))


def test_qlinear_mul_on_16_bit_values_by_hand() -> None:
    a = np.array([-300, 7, 1000], np.int16)
    b = np.array([3, -5, 40], np.int16)
    got = elementwise.qlinear_mul(a, f32(0.5), np.int16(0), b, f32(0.25), np.int16(1), f32(1), np.int16(2),
                                  scheme=REFERENCE)[0]  # fmt: skip
    # (a) (b - 1) / 8 + 2: -75 + 2, -5.25 + 2, 4875 + 2
    assert_same(got, np.array([-73, -3, 4877], np.int16))


def test_param_key_and_scalar_span() -> None:
    assert elementwise.param_key(np.float32(1), 2) != elementwise.param_key(np.float64(1), 2)
    assert elementwise.param_key(np.float32(1), None, "a", (1,), True) == (
        ("<f4", (), np.float32(1).tobytes()), None, "a", (1,), True)  # fmt: skip
    out = (2, 3, 4, 5)
    assert elementwise._scalar_span(np.zeros(1), out)
    assert elementwise._scalar_span(np.zeros((3, 4, 1)), out)
    assert not elementwise._scalar_span(np.zeros((5,)), out)
    assert elementwise._scalar_span(np.zeros((2, 1)), (2, 3))
    assert not elementwise._scalar_span(np.zeros((2, 1)), (2, 1))
    assert not elementwise._scalar_span(np.zeros((1, 3)), (2, 3))


# -- quantize ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        ("uint8", {"s": f32(0.02), "z": np.uint8(128)}, {}),
        ("int8-axis0", {"s": np.array([0.02, 0.05], f32), "z": np.array([-3, 4], np.int8)}, {"axis": 0}),
        (
            "int16-axis-last",
            {"s": np.array([0.01, 0.02, 0.03, 0.04, 0.05], f32), "z": np.full(5, 7, np.int16)},
            {"axis": -1},
        ),
        ("uint16-no-zp", {"s": f32(0.001)}, {"output_dtype": 4}),
        (
            "int8-blocked",
            {"s": rng.uniform(0.01, 0.05, (2, 3, 2, 5)).astype(f32), "z": np.zeros((2, 3, 2, 5), np.int8)},
            {"axis": 2, "block_size": 2},
        ),
        ("uint8-no-zp", {"s": f32(0.02)}, {}),
    ],
    ids=lambda c: c[0],
)
def test_quantize_and_dequantize_linear_match_onnxruntime(case) -> None:
    _, inits, attrs = case
    if "block_size" in attrs and not ORT_OPSET_21:
        pytest.skip(f"onnxruntime {onnxruntime.__version__} has no blocked QuantizeLinear")
    x = rng.normal(0, 2, (2, 3, 4, 5)).astype(f32)
    order = ["x", *inits]
    out = inits["z"].dtype if "z" in inits else (np.uint16 if attrs.get("output_dtype") == 4 else np.uint8)
    (want,) = _ort("QuantizeLinear", {"x": x}, inits, out, order=order, model_opset=21, **attrs)
    (q,) = quantize.quantize_linear(x, *inits.values(), scheme=ORT, **attrs)
    assert_same(q, want)
    dq_attrs = {k: v for k, v in attrs.items() if k != "output_dtype"}
    (want,) = _ort("DequantizeLinear", {"q": q}, inits, f32, order=["q", *inits], model_opset=21, **dq_attrs)
    assert_same(quantize.dequantize_linear(q, *inits.values(), **dq_attrs)[0], want)


def test_quantize_linear_by_hand_and_its_failure_paths() -> None:
    x = np.array([-1.5, -0.5, 0.5, 1.5, 2.5, 1000, -1000], np.float64)
    got = quantize.quantize_linear(x, np.float64(1), np.int8(0), scheme=ORT)[0]
    assert_same(got, np.array([-2, 0, 0, 2, 2, 127, -128], np.int8))
    got = quantize.quantize_linear(x.astype(f32), f32(1), None, scheme=TFLITE)[0]  # half away, uint8
    assert_same(got, np.array([0, 0, 1, 2, 3, 255, 0], np.uint8))
    got = quantize.quantize_linear(x.astype(f32), f32(1), None, output_dtype=3, scheme=ORT)[0]  # int8
    assert_same(got, np.array([-2, 0, 0, 2, 2, 127, -128], np.int8))
    with pytest.raises(NotHandled):  # float8 output
        quantize.quantize_linear(x, f32(1), None, output_dtype=17, scheme=ORT)
    with pytest.raises(NotHandled):  # an int32 zero point names an output quantize_float does not handle
        quantize.quantize_linear(x, f32(1), np.int32(0), scheme=ORT)
    with pytest.raises(NotHandled):  # opset 25's precision attribute
        quantize.quantize_linear(x, f32(1), np.uint8(0), precision=1, scheme=ORT)


def test_dequantize_linear_by_hand_and_its_failure_paths() -> None:
    x = np.array([-128, -1, 0, 5, 127], np.int8)
    got = quantize.dequantize_linear(x, f32(0.5), np.int8(-1))[0]
    assert_same(got, np.array([-63.5, 0, 0.5, 3, 64], f32))
    assert_same(quantize.dequantize_linear(x, f32(0.5))[0], np.array([-64, -0.5, 0, 2.5, 63.5], f32))
    assert_same(quantize.dequantize_linear(x[3:4].reshape(()), f32(2))[0], np.array(10, f32))
    wide = np.array([-(2**31), 3, 2**31 - 1], np.int32)
    got = quantize.dequantize_linear(wide, f32(0.5), np.int32(1))[0]
    assert_same(got, ((wide.astype(np.float64) - 1) * 0.5).astype(f32))
    got = quantize.dequantize_linear(np.array([1, 2], np.uint16), np.float64(0.5), output_dtype=1)[0]
    assert_same(got, np.array([0.5, 1], f32))
    got = quantize.dequantize_linear(np.array([1, 2], np.uint8), f32(0.5), output_dtype=11)[0]
    assert_same(got, np.array([0.5, 1], np.float64))
    per_axis = quantize.dequantize_linear(np.array([[1, 2], [3, 4]], np.uint8), np.array([1, 2], f32),
                                          np.array([0, 1], np.uint8), axis=0)[0]  # fmt: skip
    assert_same(per_axis, np.array([[1, 2], [4, 6]], f32))
    with pytest.raises(NotHandled):
        quantize.dequantize_linear(np.array([1], np.int64), f32(1))


def test_broadcast_param_shapes() -> None:
    assert quantize.broadcast_param(np.array([2.0]), 3, (2, 3, 4), 1, 0).shape == ()
    assert quantize.broadcast_param(np.array([1.0, 2, 3]), 3, (2, 3, 4), -2, 0).shape == (1, 3, 1)
    blocked = quantize.broadcast_param(np.array([[1.0, 2]]), 2, (1, 3), 1, 2)
    assert_same(blocked, np.array([[1.0, 1, 2]]))
    assert quantize._output_dtype(None, 0) == np.uint8
    assert quantize._output_dtype(None, 5) == np.int16
    assert quantize._output_dtype(np.int8(0), 2) == np.int8


@pytest.mark.parametrize(
    "x",
    [
        np.array([[-1.0, 0.5, 2.25], [3.0, -0.25, 0.0]], f32),
        np.array([0.5, 1.0, 7.0], f32),
        np.array([-0.5, -1.0, -7.0], f32),
        np.zeros((2, 2), f32),
        np.full(3, 4.0, f32),
    ],
)
def test_dynamic_quantize_linear_matches_onnxruntime(x) -> None:
    spec = [("x", x.dtype, x.shape)]
    model = node_model("DynamicQuantizeLinear", spec, {}, np.uint8, n_outputs=3)
    model.graph.output[1].type.tensor_type.elem_type = 1  # the scale is float32
    want = ort_run(model, {"x": x})
    got = quantize.dynamic_quantize_linear(x, scheme=ORT)
    for g, w, name in zip(got, want, ("y", "scale", "zero point"), strict=True):
        assert_same(np.asarray(g), np.asarray(w), name)


def test_dynamic_quantize_linear_by_hand() -> None:
    """[-1, 0, 3]: range 4, scale 4 / 255, zero point rne(255 / 4) = 64; -1 -> 0, 3 -> 64 + 191.25 -> 255."""
    y, scale, zp = quantize.dynamic_quantize_linear(np.array([-1.0, 0.0, 3.0], f32), scheme=ORT)
    assert scale == f32(4) / f32(255) and scale.dtype == np.float32
    assert zp == 64 and zp.dtype == np.uint8
    assert_same(y, np.array([0, 64, 255], np.uint8))
    y, scale, zp = quantize.dynamic_quantize_linear(np.zeros(0, f32), scheme=ORT)
    assert y.shape == (0,) and scale == 1 and zp == 0  # as onnxruntime 1.32 gives on an empty input


def test_dynamic_quantize_linear_of_zeros_follows_the_preset_s_runtime() -> None:
    """An all-zero input has no range: onnxruntime's scale is then 1, onnx.reference's 1 / 255 (the
    ``onnx-reference`` preset's); y and the zero point are 0 in both."""
    from onnx.reference import ReferenceEvaluator

    x = np.zeros((2, 3), f32)
    model = node_model("DynamicQuantizeLinear", [("x", x.dtype, x.shape)], {}, np.uint8, n_outputs=3)
    model.graph.output[1].type.tensor_type.elem_type = 1
    for scheme, want in ((ORT, ort_run(model, {"x": x})), (REFERENCE, ReferenceEvaluator(model).run(None, {"x": x}))):
        got = quantize.dynamic_quantize_linear(x, scheme=scheme)
        for g, w, name in zip(got, want, ("y", "scale", "zero point"), strict=True):
            assert_same(np.asarray(g), np.asarray(w), f"{scheme.name} {name}")
    assert float(want[1]) == np.float32(1) / np.float32(255)


# -- softmax -------------------------------------------------------------------------------------


@pytest.mark.parametrize("opset", [12, 13])
@pytest.mark.parametrize("axis", [-1, 1, 2])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_softmax_matches_onnxruntime(opset, axis, dtype) -> None:
    x = random_q(rng, dtype, (2, 3, 4, 6))
    yz = dtype(-128) if dtype == np.int8 else dtype(0)
    inits = {"xs": f32(0.1), "xz": dtype(2), "ys": f32(1 / 256), "yz": yz}
    (want,) = _ort("QLinearSoftmax", {"x": x}, inits, dtype, order=["x", "xs", "xz", "ys", "yz"], domain=MS,
                   axis=axis, opset=opset)  # fmt: skip
    (got,) = softmax.qlinear_softmax(x, *inits.values(), axis=axis, opset=opset, scheme=ORT)
    assert_same(got, want, f"opset {opset} axis {axis}")


def test_qlinear_softmax_by_hand() -> None:
    """One row [k, k]: each half; [big, small...]: 1 saturates at 255 (uint8) or 127 (int8, zp -128),
    as onnxruntime 1.29 and later compute (1.28 and earlier wrap int8: test_kernel_values)."""
    ORT = for_onnxruntime(get_scheme("onnxruntime-vnni"), (1, 29))
    x = np.array([[5, 5]], np.uint8)
    got = softmax.qlinear_softmax(x, f32(0.1), np.uint8(0), f32(1 / 256), np.uint8(0), opset=13, scheme=ORT)[0]
    assert_same(got, np.array([[128, 128]], np.uint8))
    x = np.array([[255, 0, 0, 0]], np.uint8)
    got = softmax.qlinear_softmax(x, f32(1), np.uint8(0), f32(1 / 256), None, opset=13, scheme=ORT)[0]
    assert_same(got, np.array([[255, 0, 0, 0]], np.uint8))
    x = np.array([[127, -128, -128, -128]], np.int8)
    got = softmax.qlinear_softmax(x, f32(1), np.int8(0), f32(1 / 256), np.int8(-128), opset=13, scheme=ORT)[0]
    assert_same(got, np.array([[127, -128, -128, -128]], np.int8))
    got = softmax.qlinear_softmax(x, f32(1), None, f32(1 / 256), np.int8(10), opset=13, scheme=ORT)[0]
    assert_same(got, np.array([[127, 10, 10, 10]], np.int8))


def test_exp_table_keeps_the_row_sum_finite() -> None:
    """table[255] = e^shift with shift * x_s = log(FLT_MAX / n) - 5 rounded to float32 first."""
    for scale, n in ((0.1, 10), (2.0, 1000), (0.001, 1)):
        table = softmax._exp_table(scale, n)
        log = float(np.float32(math.log(float(np.float32(3.4028234663852886e38) / np.float32(n)))))
        want = np.exp((np.arange(256) - 255.0) * scale + max(0.0, log - 5.0)).astype(f32)
        np.testing.assert_allclose(table, want, rtol=1e-6)
        assert np.isfinite(np.float32(table[-1]) * np.float32(n))
        assert table.dtype == np.float32


def test_float_softmax_matches_the_spec() -> None:
    x = rng.normal(0, 4, (2, 3, 5)).astype(f32)
    for axis in (-1, 0, 1):
        (want,) = _ort("Softmax", {"x": x}, {}, f32, axis=axis)
        (got,) = softmax.softmax(x, axis=axis)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert softmax.softmax(x)[0].shape == x.shape
    np.testing.assert_allclose(softmax.softmax(x)[0].sum(-1), 1, rtol=1e-6)


# -- matmul --------------------------------------------------------------------------------------


@pytest.mark.parametrize("per", ["tensor", "row", "column", "both"])
@pytest.mark.parametrize("dtypes", [(np.uint8, np.int8), (np.int8, np.int8), (np.uint8, np.uint8)])
def test_qlinear_matmul_matches_onnxruntime(per, dtypes) -> None:
    a = random_q(rng, dtypes[0], (2, 4, 9))
    b = random_q(rng, dtypes[1], (9, 5))
    az, bz = dtypes[0](3), dtypes[1](-2 if dtypes[1] == np.int8 else 7)
    a_s = rng.uniform(0.01, 0.05, 4).astype(f32) if per in ("row", "both") else f32(0.02)
    b_s = rng.uniform(0.01, 0.05, 5).astype(f32) if per in ("column", "both") else f32(0.03)
    if per in ("column", "both"):
        bz = np.full(5, bz, dtypes[1])
    if per in ("row", "both"):  # onnxruntime takes a per-row a scale as [M, 1]
        a_s = a_s.reshape(4, 1)
        az = np.full((4, 1), az, dtypes[0])
    inits = {"as": a_s, "az": az, "bs": b_s, "bz": bz, "ys": f32(0.6), "yz": dtypes[0](5)}
    order = ["a", "as", "az", "b", "bs", "bz", "ys", "yz"]
    feeds = {"a": a, "b": b}
    # onnxruntime's x86 formula with exact int32 sums (VNNI): rne(f32(acc) * f32(f32(a_s b_s) / y_s)) + y_zp
    acc = (a.astype(np.int64) - az) @ (b.astype(np.int64) - bz)
    multiplier = (np.asarray(a_s, f32) * np.asarray(b_s, f32)).astype(f32) / f32(0.6)
    info = np.iinfo(dtypes[0])
    formula = np.clip(np.rint((acc.astype(f32) * multiplier).astype(f32)) + 5, info.min, info.max).astype(dtypes[0])
    (got,) = matmul.qlinear_matmul(
        a, a_s, az, b, b_s, bz, f32(0.6), dtypes[0](5), scheme=get_scheme("onnxruntime-vnni")
    )
    assert_same(got, formula, "the formula")
    if per in ("row", "both"):  # onnxruntime refuses a per-row a scale: the formula alone judges it
        with pytest.raises(Exception, match="zero point must be a scalar"):
            _ort("QLinearMatMul", feeds, inits, dtypes[0], order=order, model_opset=MATMUL_OPSET)
        return
    (want,) = _ort("QLinearMatMul", feeds, inits, dtypes[0], order=order, model_opset=MATMUL_OPSET)
    assert_same(matmul.qlinear_matmul(a, a_s, az, b, b_s, bz, f32(0.6), dtypes[0](5), scheme=ORT)[0], want)
    if dtypes != (np.uint8, np.int8) or ORT.name == "onnxruntime-vnni":
        assert_same(formula, want, "the formula against onnxruntime")


def test_matmul_integer_matches_onnxruntime_and_wraps_in_int32() -> None:
    a, b = random_q(rng, np.uint8, (3, 2, 7)), random_q(rng, np.int8, (7, 4))
    for inits, order in (({"az": np.uint8(9), "bz": np.int8(-3)}, ["a", "b", "az", "bz"]), ({}, ["a", "b"]),
                         ({"bz": np.arange(4, dtype=np.int8)}, ["a", "b", "", "bz"])):  # fmt: skip
        (want,) = _ort("MatMulInteger", {"a": a, "b": b}, inits, np.int32, order=order)
        (got,) = matmul.matmul_integer(a, b, inits.get("az"), inits.get("bz"), scheme=ORT)
        assert_same(got, want, str(order))
    # per-row a zero points ([M]) by hand: row i minus i
    a2 = np.array([[1, 2], [3, 4]], np.uint8)
    got = matmul.matmul_integer(a2, np.array([[1], [1]], np.uint8), np.array([0, 1], np.uint8), None, scheme=ORT)[0]
    assert_same(got, np.array([[3], [5]], np.int32))
    # 3-d b with a per-tensor a zero point: numpy broadcasting
    b3 = np.ones((2, 2, 1), np.uint8)
    got = matmul.matmul_integer(a2, b3, np.uint8(1), np.uint8(0), scheme=ORT)[0]
    assert_same(got, np.array([[[1], [5]], [[1], [5]]], np.int32))


def test_row_and_column_params() -> None:
    assert matmul._row_param(None) == 0 and matmul._col_param(None) == 0
    assert matmul._row_param(np.array([5])).shape == ()
    assert matmul._row_param(np.array([1, 2, 3])).shape == (3, 1)
    assert matmul._row_param(np.zeros((2, 3, 1))).shape == (2, 3, 1)
    assert matmul._col_param(np.array([[7]])).shape == ()
    assert matmul._col_param(np.zeros((1, 4))).shape == (1, 4)


@pytest.mark.parametrize("attrs", [{}, {"transA": 1}, {"transB": 1}, {"alpha": 0.5, "transA": 1, "transB": 1}], ids=str)
@pytest.mark.parametrize("output", ["quantized", "float", "no-zp"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("b_zp", ["zero", "per-column"])
def test_qgemm_matches_onnxruntime(attrs, output, bias, b_zp) -> None:
    m, k, n = 4, 9, 5
    a = random_q(rng, np.uint8, (k, m) if attrs.get("transA") else (m, k))
    b = random_q(rng, np.int8, (n, k) if attrs.get("transB") else (k, n))
    bz = np.zeros(n, np.int8) if b_zp == "zero" else np.array([0, 3, -2, 1, 5], np.int8)
    inits = {"as": f32(0.02), "az": np.uint8(130), "bs": rng.uniform(0.01, 0.03, n).astype(f32), "bz": bz}
    order = ["a", "as", "az", "b", "bs", "bz"]
    if bias:
        inits["c"] = rng.integers(-2000, 2000, n).astype(np.int32)
    order.append("c" if bias else "")
    out = f32
    if output != "float":
        inits["ys"] = f32(0.3)
        order.append("ys")
        out = np.uint8
        inits["yz"] = np.uint8(120 if output == "quantized" else 0)  # absent: 0 (onnxruntime wants it present)
        order.append("yz")
    (want,) = _ort("QGemm", {"a": a, "b": b}, inits, out, order=order, domain=MS, **attrs)
    (got,) = matmul.qgemm(
        a, inits["as"], inits["az"], b, inits["bs"], inits["bz"], inits.get("c"), inits.get("ys"),
        inits.get("yz") if output == "quantized" else None, scheme=ORT, **attrs,
    )  # fmt: skip
    if output == "float":
        np.testing.assert_allclose(got, want, rtol=1e-6)
        assert got.dtype == np.float32
    else:
        assert_same(got, want)


def test_qgemm_requantizes_as_the_gemm_family_of_its_scheme() -> None:
    """Under ``onnx-reference`` (output zero point added before rounding, float64) QGemm without alpha
    or C requantizes as onnx.reference's QLinearMatMul: the two ops are one ``gemm`` family."""
    from onnx.reference import ReferenceEvaluator

    a = np.array([[1, 2, 3, 4], [10, 20, 30, 41], [9, 60, 7, 99]], np.uint8)  # no output saturates
    b = np.array([[1, -3], [2, 5], [-1, 4], [3, 3]], np.int8)
    a_s, az, b_s, bz, y_s = f32(0.5), np.uint8(1), f32(0.5), np.int8(0), f32(1.0)
    # (a - 1) @ b * 0.25: halves, which the zero point 3 rounds the other way (5.5 + 3 -> 8, not 6 + 3)
    inits = {"as": a_s, "az": az, "bs": b_s, "bz": bz, "ys": y_s, "yz": np.uint8(3)}
    order = ["a", "as", "az", "b", "bs", "bz", "ys", "yz"]
    model = node_model("QLinearMatMul", [("a", np.uint8, a.shape), ("b", np.int8, b.shape)], inits, np.uint8,
                       input_order=order)  # fmt: skip
    (want,) = ReferenceEvaluator(model).run(None, {"a": a, "b": b})
    (got,) = matmul.qgemm(a, a_s, az, b, b_s, bz, None, y_s, np.uint8(3), scheme=REFERENCE)
    assert_same(got, want)
    after = matmul.qgemm(a, a_s, az, b, b_s, bz, None, y_s, np.uint8(3), scheme=ORT)[0]
    assert not np.array_equal(after, want)  # rounding first, then the zero point, gives other values


@pytest.mark.parametrize(
    "attrs",
    [{}, {"transA": 1}, {"transB": 1}, {"alpha": 0.5, "beta": 2.0}, {"alpha": 1.0, "beta": 0.25}, {"alpha": 2.0}],
)
def test_float_gemm_and_matmul_match_onnxruntime(attrs) -> None:
    a = rng.normal(0, 1, (5, 3) if attrs.get("transA") else (3, 5)).astype(f32)
    b = rng.normal(0, 1, (4, 5) if attrs.get("transB") else (5, 4)).astype(f32)
    c = rng.normal(0, 1, (4,)).astype(f32)
    (want,) = _ort("Gemm", {"a": a}, {"b": b, "c": c}, f32, **attrs)
    (got,) = matmul.gemm(a, b, c, **attrs)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    (want,) = _ort("Gemm", {"a": a}, {"b": b}, f32, **attrs)
    np.testing.assert_allclose(matmul.gemm(a, b, **attrs)[0], want, rtol=1e-5, atol=1e-6)
    a3 = rng.normal(0, 1, (2, 3, 5)).astype(f32)
    (want,) = _ort("MatMul", {"a": a3}, {"b": b if not attrs.get("transB") else b.T.copy()}, f32)
    np.testing.assert_allclose(matmul.matmul(a3, b if not attrs.get("transB") else b.T.copy())[0], want, rtol=1e-5,
                               atol=1e-6)  # fmt: skip


# -- defaults, caches and threads ----------------------------------------------------------------


def test_resize_defaults_are_onnx_s() -> None:
    """No attributes: nearest, half_pixel, round_prefer_floor (onnxruntime reads the same defaults)."""
    x = random_q(rng, np.uint8, (2, 3, 5, 6))
    empty = np.zeros(0, f32)
    for scales in ([1, 1, 1.7, 0.5], [1, 1, 2.5, 1.5]):
        sc = np.array(scales, f32)
        (want,) = _ort("Resize", {"x": x}, {"roi": empty, "sc": sc}, np.uint8)
        assert_same(tensor.resize(x, empty, sc, scheme=ORT)[0], want, str(scales))
    with pytest.raises(ValueError):  # one size per axis
        tensor.resize(x, empty, empty, _i64(2, 3, 10), scheme=ORT)
    with pytest.raises(ValueError):  # one scale per axis
        tensor.resize(x, empty, np.array([1, 2, 2], f32), scheme=ORT)


def test_float_softmax_subtracts_each_row_s_own_maximum() -> None:
    """Rows far apart (1000 and 0): without its own maximum a row overflows or underflows to 0 / 0."""
    x = np.array([[1000, 999, 998], [0, -1, -2]], f32)
    (got,) = softmax.softmax(x, axis=-1)
    want = np.exp(np.array([0, -1, -2], np.float64)) / np.exp(np.array([0, -1, -2], np.float64)).sum()
    np.testing.assert_allclose(got, np.stack([want, want]).astype(f32), rtol=1e-6)
    (got,) = softmax.softmax(x.T, axis=0)
    np.testing.assert_allclose(got, np.stack([want, want]).T.astype(f32), rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_table_ops_without_an_output_zero_point_match_onnxruntime_with_zero(dtype) -> None:
    info = np.iinfo(dtype)
    x = np.arange(info.min, info.max + 1).astype(dtype)
    xs, xz, ys = f32(0.05), dtype(3), f32(1 / 128)
    inits = {"xs": xs, "xz": xz, "ys": ys, "yz": dtype(0)}
    order = ["x", "xs", "xz", "ys", "yz"]
    for op, ours in (
        ("QLinearSigmoid", elementwise.qlinear_sigmoid),
        ("QLinearLeakyRelu", elementwise.qlinear_leaky_relu),
    ):
        (want,) = _ort(op, {"x": x}, inits, dtype, order=order, domain=MS)
        assert_same(ours(x, xs, xz, ys, None, scheme=ORT)[0], want, op)
    relu = _by_hand_table(lambda v: np.maximum(v, 0), dtype, xs, xz, ys, 0)[x.astype(np.int64) - info.min]
    assert_same(elementwise.qlinear_lookup(x, xs, xz, ys, None, function="Relu", scheme=ORT)[0], relu)


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_a_cached_pair_table_is_never_reused_for_other_parameters(op) -> None:
    """Calls in a row that differ in one parameter each (a zero point, a scale, the output type, the
    scheme), each checked against onnxruntime or the float64 formula: a cache key missing a parameter
    would hand the previous call's table to the next."""
    ours = elementwise.qlinear_add if op == "QLinearAdd" else elementwise.qlinear_mul
    a, b = random_q(rng, np.uint8, (3, 16)), random_q(rng, np.uint8, (3, 16))
    base = {
        "as": f32(0.031),
        "az": np.uint8(3),
        "bs": f32(0.017),
        "bz": np.uint8(9),
        "cs": f32(0.05),
        "cz": np.uint8(5),
    }
    order = ["a", "as", "az", "b", "bs", "bz", "cs", "cz"]
    changes = [{}, {"az": np.uint8(4)}, {"bz": np.uint8(10)}, {"as": f32(0.062)}, {"bs": f32(0.034)},
               {"cs": f32(0.1)}, {"cz": np.uint8(6)}, {}]  # fmt: skip
    for change in changes:
        p = {**base, **change}
        (want,) = _ort(op, {"a": a, "b": b}, p, np.uint8, order=order, domain=MS)
        got = ours(a, p["as"], p["az"], b, p["bs"], p["bz"], p["cs"], p["cz"], scheme=ORT)[0]
        assert_same(got, want, f"{op} {change}")
    # the same parameters under the float64 formula, then an int8 output zero point
    p = base
    av, bv = a.astype(np.float64) - 3, b.astype(np.float64) - 9
    real = (
        av * float(p["as"]) + bv * float(p["bs"]) if op == "QLinearAdd" else av * bv * float(p["as"]) * float(p["bs"])
    )
    for cz, dtype in ((np.uint8(5), np.uint8), (np.int8(5), np.int8)):
        got = ours(a, p["as"], p["az"], b, p["bs"], p["bz"], p["cs"], cz, scheme=REFERENCE)[0]
        info = np.iinfo(dtype)
        want = np.clip(np.rint(real / float(p["cs"])) + 5, info.min, info.max).astype(dtype)
        if op == "QLinearMul":  # the multiplier is rounded to float64 first: compare within one step
            assert got.dtype == dtype and np.abs(got.astype(int) - want).max() <= 1
        else:
            assert_same(got, want, f"{op} float64 {dtype}")


@pytest.fixture
def three_threads(monkeypatch: pytest.MonkeyPatch):
    """Three threads and tiny blocks: every kernel below splits even these small tensors."""
    from pytest_qaccuracy.backend import parallel

    monkeypatch.setattr(parallel, "MIN_PARALLEL_ELEMENTS", 0)
    monkeypatch.setattr(parallel, "BLOCK_ELEMENTS", 100)
    with parallel.using(3):
        yield


def test_split_kernels_on_three_threads_match_onnxruntime(three_threads) -> None:
    x = random_q(rng, np.uint8, (5, 3, 4, 6))
    empty = np.zeros(0, f32)
    for scales in ([1, 1, 2, 1.5], [2, 1, 1, 0.5], [1, 1, 1, 2]):  # records kept, records resized, one axis
        sc = np.array(scales, f32)
        (want,) = _ort("Resize", {"x": x}, {"roi": empty, "sc": sc}, np.uint8, mode="nearest")
        assert_same(tensor.resize(x, empty, sc, mode="nearest", scheme=ORT)[0], want, f"Resize {scales}")
    for shape_b in ((1, 3, 1, 1), (5, 3, 4, 6), (1, 1, 1, 6), ()):
        b = random_q(rng, np.uint8, shape_b)
        for op, ours in (("QLinearAdd", elementwise.qlinear_add), ("QLinearMul", elementwise.qlinear_mul)):
            inits = {"as": f32(0.03), "az": np.uint8(3), "bs": f32(0.02), "bz": np.uint8(7), "cs": f32(0.05),
                     "cz": np.uint8(9)}  # fmt: skip
            for first in ("a", "b"):
                feeds = {"a": x, "b": b} if first == "a" else {"a": b, "b": x}
                (want,) = _ort(op, feeds, inits, np.uint8, order=["a", "as", "az", "b", "bs", "bz", "cs", "cz"],
                               domain=MS)  # fmt: skip
                got = ours(feeds["a"], inits["as"], inits["az"], feeds["b"], inits["bs"], inits["bz"], inits["cs"],
                           inits["cz"], scheme=ORT)[0]  # fmt: skip
                assert_same(got, want, f"{op} {first} {shape_b}")
    parts = [random_q(rng, np.uint8, (5, n, 4)) for n in (2, 3)]
    inits = {
        "ys": f32(0.1),
        "yz": np.uint8(128),
        "s0": f32(0.1),
        "z0": np.uint8(128),
        "s1": f32(0.2),
        "z1": np.uint8(1),
    }
    (want,) = _ort("QLinearConcat", {"x0": parts[0], "x1": parts[1]}, inits, np.uint8,
                   order=["ys", "yz", "x0", "s0", "z0", "x1", "s1", "z1"], domain=MS, axis=1)  # fmt: skip
    got = tensor.qlinear_concat(inits["ys"], inits["yz"], parts[0], inits["s0"], inits["z0"], parts[1], inits["s1"],
                                inits["z1"], axis=1, scheme=ORT)[0]  # fmt: skip
    assert_same(got, want)
    q = random_q(rng, np.int8, (5, 3, 40))
    (want,) = _ort("DequantizeLinear", {"q": q}, {"s": f32(0.1), "z": np.int8(-3)}, f32, order=["q", "s", "z"])
    assert_same(quantize.dequantize_linear(q, f32(0.1), np.int8(-3))[0], want)


def test_resize_edge_cases_match_onnxruntime() -> None:
    """A scale of 1.15 keeps 5 pixels: onnxruntime then copies the input (onnx.reference moves the last
    row), but with another axis resized it reads the 1.15; an empty sizes input means "use the scales";
    tf_crop_and_resize goes to the reference even when nothing is resized; Gather's default axis is 0."""
    x = random_q(rng, np.uint8, (2, 3, 5, 4))
    empty = np.zeros(0, f32)
    sc = np.array([1, 1, 1.15, 1], f32)
    (want,) = _ort("Resize", {"x": x}, {"roi": empty, "sc": sc}, np.uint8)
    assert_same(want, x)
    assert_same(tensor.resize(x, empty, sc, scheme=ORT)[0], want)
    sc = np.array([1, 1, 1.15, 2], f32)
    (want,) = _ort("Resize", {"x": x}, {"roi": empty, "sc": sc}, np.uint8)
    assert_same(want[:, :, 4, ::2], x[:, :, 3])  # row 4 reads row 3: (4.5 / 1.15 - 0.5 = 3.41)
    assert_same(tensor.resize(x, empty, sc, scheme=ORT)[0], want)
    assert_same(tensor.resize(x, empty, sc, np.zeros(0, np.int64), scheme=ORT)[0], want)
    with pytest.raises(NotHandled):
        tensor.resize(x, empty, np.ones(4, f32), coordinate_transformation_mode="tf_crop_and_resize", scheme=ORT)
    idx = np.array([1, -1], np.int64)
    (want,) = _ort("Gather", {"x": x}, {"i": idx}, np.uint8)
    assert_same(tensor.gather(x, idx)[0], want)


def test_qlinear_mul_tables_are_kept_per_scheme() -> None:
    """The same parameters under two schemes that differ only in where the zero point joins: by hand,
    (a - 1)(b - 2) * 0.5 is a tie for odd products; onnxruntime adds the zero point 1 first (rint(x.5 + 1)),
    the variant after (rint(x.5) + 1)."""
    a = np.array([2, 3, 4, 6], np.uint8)  # a - 1: 1, 2, 3, 5
    b = np.array([3, 3, 5, 3], np.uint8)  # b - 2: 1, 1, 3, 1 -> products 1, 2, 9, 5
    args = (a, f32(0.5), np.uint8(1), b, f32(0.5), np.uint8(2), f32(0.5), np.uint8(1))
    got = elementwise.qlinear_mul(*args, scheme=ORT)[0]
    assert_same(got, np.array([2, 2, 6, 4], np.uint8))  # rint(1.5) rint(2) rint(5.5) rint(3.5)
    got = elementwise.qlinear_mul(*args, scheme=ORT.replace(zp_before_rounding=frozenset()))[0]
    assert_same(got, np.array([1, 2, 5, 3], np.uint8))  # rint(0.5) + 1, rint(1) + 1, rint(4.5) + 1, rint(2.5) + 1


def test_qlinear_average_pool_fixed_point_sums_in_64_bits_and_reads_absent_zero_points_as_0() -> None:
    """TFLite, no zero points, windows of 2: 200 + 201 = 401 (past uint8) and 30 + 41 = 71, halved by
    SRDHM's rounding (half up): 201 and 36."""
    x = np.array([[[[200, 201, 30, 41]]]], np.uint8)
    (got,) = pool.qlinear_average_pool(x, f32(0.5), None, f32(0.5), None, kernel_shape=[1, 2], strides=[1, 2],
                                       scheme=TFLITE)  # fmt: skip
    assert_same(got, np.array([[[[_mbqm(401, 0.5), _mbqm(71, 0.5)]]]], np.uint8))
    assert (_mbqm(401, 0.5), _mbqm(71, 0.5)) == (201, 36)


def test_qlinear_average_pool_adds_the_zero_point_where_the_scheme_says() -> None:
    """A Q31 multiplier with onnxruntime's other choices (zero point before rounding for pools, half to
    even): (27 / 2 + 5, 67 / 2 + 5) = (18.5, 38.5) -> (18, 38); with the zero point after: (19, 39)."""
    x = np.array([[[[10, 21, 30, 41]]]], np.uint8)
    for scheme, want in ((ORT.replace(multiplier="q31"), [18, 38]),
                         (ORT.replace(multiplier="q31", zp_before_rounding=frozenset()), [19, 39])):  # fmt: skip
        (got,) = pool.qlinear_average_pool(x, f32(0.5), np.uint8(2), f32(0.5), np.uint8(5), kernel_shape=[1, 2],
                                           strides=[1, 2], scheme=scheme)  # fmt: skip
        assert_same(got, np.array([[[want]]], np.uint8), str(sorted(scheme.zp_before_rounding)))


def test_qlinear_softmax_shifts_each_row_by_its_own_maximum() -> None:
    """x_scale 1: a row of zeros next to a row holding 255 must still read table[255] for its maximum
    (e^-255 underflows to 0 in float32): each half, 128 of 256."""
    x = np.array([[255, 0], [0, 0]], np.uint8)
    got = softmax.qlinear_softmax(x, f32(1), np.uint8(0), f32(1 / 256), np.uint8(0), opset=13, scheme=ORT)[0]
    assert_same(got, np.array([[255, 0], [128, 128]], np.uint8))


def test_qlinear_global_average_pool_adds_the_zero_point_where_the_scheme_says() -> None:
    """(10 + 21 - 2 * 2) / 2 = 13.5, plus 5: rint(18.5) = 18 with the zero point first, rint(13.5) + 5 = 19 after."""
    x = np.array([[[10, 21]]], np.uint8)
    for first, want in ((frozenset({"global_pool"}), 18), (frozenset(), 19)):
        scheme = ORT.replace(zp_before_rounding=first)
        got = pool.qlinear_global_average_pool(x, f32(0.5), np.uint8(2), f32(0.5), np.uint8(5), scheme=scheme)[0]
        assert_same(got, np.array([[[want]]], np.uint8), str(sorted(first)))


def test_resize_to_its_own_shape_is_the_input_on_onnxruntime_and_resized_on_the_reference() -> None:
    """A scale that leaves a size unchanged (2 x 1.2 floors to 2) still moves the pixels in
    onnx.reference; onnxruntime copies the input whatever the scales. Each preset follows its runtime."""
    from onnx.reference import ReferenceEvaluator

    x = np.arange(16, dtype=np.uint8).reshape(1, 1, 4, 4)
    sc = np.array([1, 1, 1.2, 1.2], np.float32)
    empty = np.zeros(0, np.float32)
    (want_ort,) = _ort("Resize", {"x": x}, {"roi": empty, "sc": sc}, np.uint8, nearest_mode="round_prefer_ceil")
    assert_same(tensor.resize(x, empty, sc, nearest_mode="round_prefer_ceil", scheme=ORT)[0], want_ort, "ort")
    node = helper.make_node("Resize", ["x", "", "sc"], ["y"], nearest_mode="round_prefer_ceil")
    graph = helper.make_graph(  # no roi input: onnx 1.16's reference indexes an empty one
        [node],
        "resize",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
        [numpy_helper.from_array(sc, "sc")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    (want_ref,) = ReferenceEvaluator(model).run(None, {"x": x})
    got = tensor.resize(x, empty, sc, nearest_mode="round_prefer_ceil", scheme=REFERENCE)[0]
    assert_same(got, want_ref, "reference")
    assert not np.array_equal(want_ref, x)  # the case is one where the two runtimes differ


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_an_empty_auto_pad_reads_the_pads_as_notset_does(op: str) -> None:
    """onnxruntime reads ``auto_pad=""`` as ``NOTSET``: the explicit pads apply (a 4x4 input, 3x3
    windows, one pixel of padding each side: 4x4 outputs, not 2x2)."""
    x = np.arange(16, dtype=f32).reshape(1, 1, 4, 4)
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "auto_pad": ""}
    (want,) = _ort(op, {"x": x}, {}, f32, **attrs)
    run = pool.max_pool if op == "MaxPool" else pool.average_pool
    (got,) = run(x, **attrs, scheme=ORT)
    assert want.shape == (1, 1, 4, 4)
    np.testing.assert_array_equal(got, want)


def test_a_table_of_a_16_bit_type_is_read_from_its_minimum() -> None:
    """``apply_table`` beyond 8 bits: entry ``x - min`` (int16: ``x + 32768``), worked by hand."""
    table = np.arange(65536, dtype=np.int64) * 3
    x = np.array([-32768, -1, 0, 32767], np.int16)
    np.testing.assert_array_equal(elementwise.apply_table(x, table), [0, 32767 * 3, 32768 * 3, 65535 * 3])
    u = np.array([0, 7, 65535], np.uint16)
    np.testing.assert_array_equal(elementwise.apply_table(u, table), [0, 21, 65535 * 3])


def _pair_formula(calls: list[int]):
    def fn(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        calls.append(1)
        return a.astype(np.int64) * 3 - b.astype(np.int64)

    return fn


def test_a_pair_table_with_a_key_is_built_once_and_one_without_each_time() -> None:
    rng = np.random.default_rng(5)
    a, b = random_q(rng, np.uint8, (3, 5)), random_q(rng, np.int8, (3, 5))
    want = a.astype(np.int64) * 3 - b.astype(np.int64)
    calls: list[int] = []
    fn = _pair_formula(calls)
    for _ in range(2):
        np.testing.assert_array_equal(elementwise.binary_table_apply(fn, a, b, ("k",)), want)
    assert len(calls) == 1, "the second call with the same key reads the kept table"
    key = next(iter(elementwise._PAIR_TABLES))
    assert key == (("k",), a.dtype.str, b.dtype.str)
    assert elementwise._PAIR_TABLES[key] is not None
    a8 = a.view(np.int8)  # the same key with other operand types is another table
    np.testing.assert_array_equal(
        elementwise.binary_table_apply(fn, a8, b, ("k",)), a8.astype(np.int64) * 3 - b.astype(np.int64)
    )
    assert len(calls) == 2 and len(elementwise._PAIR_TABLES) == 2
    for _ in range(2):  # without a key: built for every call, kept for none
        np.testing.assert_array_equal(elementwise.binary_table_apply(fn, a, b), want)
    assert len(calls) == 4 and len(elementwise._PAIR_TABLES) == 2


def test_the_pair_tables_kept_are_bounded_and_the_oldest_goes_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(elementwise, "_PAIR_TABLES_MAX", 2)
    a, b = np.array([[1, 200]], np.uint8), np.array([[3, 4]], np.uint8)
    calls: list[int] = []
    fn = _pair_formula(calls)
    for name in ("first", "second", "third"):
        np.testing.assert_array_equal(elementwise.binary_table_apply(fn, a, b, (name,)), [[0, 596]])
    assert [k[0] for k in elementwise._PAIR_TABLES] == [("second",), ("third",)]
    elementwise.binary_table_apply(fn, a, b, ("third",))
    assert len(calls) == 3
    elementwise.binary_table_apply(fn, a, b, ("first",))  # evicted: built again, and "second" goes
    assert len(calls) == 4 and [k[0] for k in elementwise._PAIR_TABLES] == [("third",), ("first",)]
