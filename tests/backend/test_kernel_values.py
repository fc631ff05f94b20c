"""QLinearSoftmax, Quantize/DequantizeLinear and the elementwise kernels on the inputs where a
rounding step, an overflow or a parameter's shape decides the answer.

Expected values come from outside the kernels: onnxruntime run on the same one-node model,
``onnx.reference``, or values worked by hand. The rows of the softmax tests were picked (by a search
run once, not here) where one rounding of the kernel's formula decides an output step, and are kept
only where onnxruntime gives the answer; the tests compare with onnxruntime at run time. Part of the
``kernels`` mutation group (``scripts/mutation.py``).
"""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from backend_models import MS, assert_same, node_model, ort_run
from onnx import helper
from onnx.reference import ReferenceEvaluator

from pytest_qaccuracy.backend import get_scheme
from pytest_qaccuracy.backend.kernels import elementwise, quantize, softmax
from pytest_qaccuracy.backend.scheme import for_onnxruntime

f32 = np.float32
ORT = get_scheme("onnxruntime")
#: x86 as two releases compute (whatever is installed): float64 quotients, then float32 ones
X86_132 = for_onnxruntime(get_scheme("onnxruntime-vnni"), (1, 32))
X86_131 = for_onnxruntime(get_scheme("onnxruntime-vnni"), (1, 31))
ONNX = tuple(int(p) for p in re.findall(r"\d+", onnx.__version__)[:2])


def _softmax_pair(x: np.ndarray, inits: dict[str, np.ndarray], opset: int = 13) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's QLinearSoftmax and onnxruntime's."""
    spec = [("x", x.dtype, x.shape)]
    model = node_model("QLinearSoftmax", spec, inits, x.dtype, domain=MS, input_order=["x", *inits], opset=opset)
    (got,) = softmax.qlinear_softmax(x, *inits.values(), opset=opset, scheme=ORT)
    return got, ort_run(model, {"x": x})[0]


def _reference(op: str, feeds: dict[str, np.ndarray], inits: dict[str, np.ndarray], out, opset: int, **attrs):
    """onnx.reference's outputs for one node (``output_dtype`` set as an attribute)."""
    spec = [(name, value.dtype, value.shape) for name, value in feeds.items()]
    output_dtype = attrs.pop("output_dtype", None)
    model = node_model(op, spec, inits, out, model_opset=opset, input_order=[*feeds, *inits], **attrs)
    if output_dtype is not None:
        model.graph.node[0].attribute.append(helper.make_attribute("output_dtype", output_dtype))
    return ReferenceEvaluator(model).run(None, feeds)


def _overflowed(zp: int, dtype) -> int:
    """onnxruntime 1.31 and earlier on x86 where ``t * floor(1 / y_scale)`` overflows float32: the
    integer conversion of an infinity, 0 for the uint8 kernel and INT32_MIN for the int8 one, plus the
    zero point in int32, then the clip."""
    if dtype == np.uint8:
        return zp
    wrapped = (-(2**31) + zp + 2**31) % 2**32 - 2**31
    return min(max(wrapped, -128), 127)


# -- QLinearSoftmax ------------------------------------------------------------------------------


def test_qlinear_softmax_divides_in_float64_from_onnxruntime_1_32() -> None:
    """The onnxruntime presets follow the installed onnxruntime: 1.32 takes the inverse scale as a
    double, 1.31 and earlier as a float (read from their binaries)."""
    from pytest_qaccuracy.backend import scheme as scheme_module

    assert not scheme_module._softmax_in_float64((1, 18))
    assert not scheme_module._softmax_in_float64((1, 31))
    assert scheme_module._softmax_in_float64((1, 32)) and scheme_module._softmax_in_float64((2, 0))
    version = tuple(int(p) for p in re.findall(r"\d+", ort.__version__)[:2])
    assert ORT.softmax_float64 is (version >= (1, 32))
    assert get_scheme("onnxruntime-arm64").softmax_float64 is ORT.softmax_float64
    assert not get_scheme("tflite").softmax_float64


def test_the_onnxruntime_presets_follow_the_installed_release() -> None:
    """Every field that changed between onnxruntime releases is set by ``for_onnxruntime`` from the
    installed version, and only those: the presets of two releases differ in nothing else."""
    import dataclasses

    from pytest_qaccuracy.backend import scheme as scheme_module

    version = scheme_module._INSTALLED
    for name in ("onnxruntime-avx2", "onnxruntime-vnni", "onnxruntime-arm64", "onnxruntime-arm64-neon"):
        preset = get_scheme(name)
        assert scheme_module.for_onnxruntime(preset, version) == preset
        old, new = scheme_module.for_onnxruntime(preset, (1, 18)), scheme_module.for_onnxruntime(preset, (1, 32))
        changed = {f.name for f in dataclasses.fields(preset) if getattr(old, f.name) != getattr(new, f.name)}
        fields = {"quantize_float_weights", "softmax_float64", "pool_size_plain", "softmax_int8_wraps"}
        assert changed == fields | {"qdq_pairs_removed_first"} | (
            {"neon_int8_conv_pairs"} if name.endswith("neon") else set()
        )
    assert scheme_module._pool_size_plain((1, 20)) and not scheme_module._pool_size_plain((1, 21))
    assert get_scheme("onnx-reference").pool_size_plain  # onnx.reference sizes by the ONNX formula
    assert not get_scheme("tflite").pool_size_plain


@pytest.mark.parametrize(
    ("dtype", "zp", "y_scale"),
    [
        (np.uint8, 0, 1 / 256),
        (np.uint8, 3, 1 / 200),
        (np.uint8, 0, 1 / 150),
        (np.int8, -128, 1 / 200),
        (np.int8, 0, 1 / 256),
        (np.int8, 5, 1 / 1000),
    ],
)
def test_qlinear_softmax_over_an_axis_of_one(dtype, zp, y_scale) -> None:
    """Softmax of a single value is 1. The table's top entry is FLT_MAX / e^5 for a row of one, so
    ``t * floor(1 / y_scale)`` passes FLT_MAX below y_scale 1/148: in float64 (onnxruntime 1.32) the
    output is ``floor(1 / y_scale) + zp`` saturated; in float32 (1.31 and earlier) the cast of an
    infinity (:func:`_overflowed`)."""
    x = np.array([[5], [9], [200 if dtype == np.uint8 else 100]], dtype)
    inits = {"xs": f32(0.1), "xz": dtype(0), "ys": f32(y_scale), "yz": dtype(zp)}
    lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
    one = min(max(int(np.floor(np.float32(1) / np.float32(y_scale))) + zp, lo), hi)
    for wide, by_hand in ((True, one), (False, _overflowed(zp, dtype) if y_scale < 1 / 148 else one)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no overflow warning on the way
            (got,) = softmax.qlinear_softmax(x, *inits.values(), opset=13, scheme=X86_132 if wide else X86_131)
        assert_same(got, np.full(x.shape, by_hand, dtype))
    got, want = _softmax_pair(x, inits)
    assert_same(got, want)


def test_int8_qlinear_softmax_wraps_in_onnxruntime_1_28_and_earlier() -> None:
    """onnxruntime 1.28 and earlier cast ``q + zp`` to int8 without the clip: a confident row quantized
    to ``1/256, -128`` (onnxruntime's quantizer's int8 QOperator Softmax) gives -128 where 1.29 gives 127
    (github.com/microsoft/onnxruntime/issues/29727). By hand: p = 1 - 3e-4 gives q = rne(255.9) = 256."""
    from pytest_qaccuracy.backend import scheme as scheme_module

    x = np.array([[127, -128, -128, -128], [3, 3, -128, -128]], np.int8)
    inits = {"xs": f32(0.1), "xz": np.int8(0), "ys": f32(1 / 256), "yz": np.int8(-128)}
    old, new = (for_onnxruntime(get_scheme("onnxruntime-vnni"), v) for v in ((1, 28), (1, 29)))
    (wrapped,) = softmax.qlinear_softmax(x, *inits.values(), opset=13, scheme=old)
    (clipped,) = softmax.qlinear_softmax(x, *inits.values(), opset=13, scheme=new)
    assert clipped[0, 0] == 127 and wrapped[0, 0] == -128  # 256 - 128 = 128
    assert wrapped[1, :2].tolist() == clipped[1, :2].tolist() == [0, 0]  # 128 - 128: in range either way
    # a finer scale (t * 400 stays finite for rows of 4): q = 400 is first clipped to 255, as in the
    # uint8 kernel, whose low byte is -1
    fine = {**inits, "ys": f32(1 / 400), "yz": np.int8(0)}
    assert softmax.qlinear_softmax(x[:1], *fine.values(), opset=13, scheme=old)[0][0, 0] == -1
    assert softmax.qlinear_softmax(x[:1], *fine.values(), opset=13, scheme=new)[0][0, 0] == 127
    assert scheme_module._softmax_int8_wraps((1, 28)) and not scheme_module._softmax_int8_wraps((1, 29))


@pytest.mark.parametrize(("zp", "x86", "arm64"), [(0, 0, -1), (5, 5, 4), (-100, -1, -1), (-128, -1, -1)])
def test_an_overflowed_int8_softmax_in_onnxruntime_1_28_and_earlier(zp, x86, arm64) -> None:
    """A row of one value with y_scale 1/256 overflows float32 (``t * 256 > FLT_MAX``). onnxruntime 1.18
    to 1.28 (measured on x86 1.18.0, 1.21.1, 1.28.0 and ARM64 1.18.0, 1.28.0 under qemu) add the zero
    point to the converted infinity in int32 (INT32_MIN on x86, INT32_MAX on ARM64), clip to at most 255
    and keep the low byte: the zero point on x86 and ``zp - 1`` on ARM64 for a zero point >= 0, 255's
    -1 for a negative one (the sum then wraps to a large positive int32)."""
    x = np.array([[7], [100]], np.int8)
    inits = {"xs": f32(0.05), "xz": np.int8(0), "ys": f32(1 / 256), "yz": np.int8(zp)}
    for preset, want in (("onnxruntime-vnni", x86), ("onnxruntime-arm64", arm64)):
        scheme = for_onnxruntime(get_scheme(preset), (1, 28))
        (got,) = softmax.qlinear_softmax(x, *inits.values(), opset=13, scheme=scheme)
        assert got.ravel().tolist() == [want, want], preset


@pytest.mark.parametrize(
    ("dtype", "zp", "want"),
    [(np.uint8, 0, 255), (np.uint8, 10, 9), (np.uint8, 200, 199), (np.int8, 0, 127), (np.int8, 5, -128)],
)
def test_arm64_saturates_an_overflowed_softmax_in_onnxruntime_1_29_to_1_31(dtype, zp, want) -> None:
    """1.29 to 1.31 clip, and ARM64 converts the infinity to UINT32_MAX (uint8: ``zp - 1``, 255 for zero
    point 0) or INT32_MAX (int8: plus the zero point in int32), where x86 gives 0 or INT32_MIN (measured
    on 1.29.0's aarch64 wheel under qemu and on x86)."""
    x = np.array([[7], [100]], dtype)
    inits = {"xs": f32(0.05), "xz": dtype(0), "ys": f32(1 / 256), "yz": dtype(zp)}
    arm = for_onnxruntime(get_scheme("onnxruntime-arm64"), (1, 31))
    (got,) = softmax.qlinear_softmax(x, *inits.values(), opset=13, scheme=arm)
    assert got.ravel().tolist() == [want, want]  # what onnxruntime 1.29.0's aarch64 wheel gave
    (x86,) = softmax.qlinear_softmax(x, *inits.values(), opset=13, scheme=X86_131)
    assert x86.ravel().tolist() == [_overflowed(zp, dtype)] * 2


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_softmax_with_a_fine_output_scale_matches_onnxruntime(dtype) -> None:
    """y_scale 1/1000: the rows' maxima overflow ``t * 1000`` in float32 for rows of up to six values;
    onnxruntime 1.32 saturates them (float64), earlier ones give the cast of an infinity."""
    rng = np.random.default_rng(7)
    low = 100 if dtype == np.uint8 else -20
    x = rng.integers(low, low + 40, (6, 4)).astype(dtype)
    zp = dtype(0) if dtype == np.uint8 else dtype(-128)
    inits = {"xs": f32(0.07), "xz": dtype(0), "ys": f32(1 / 1000), "yz": zp}
    got, want = _softmax_pair(x, inits)
    assert_same(got, want)
    table = softmax._exp_table(0.07, 4)
    t = table[x.astype(np.int64) - x.max(axis=1, keepdims=True) + 255]
    with np.errstate(over="ignore"):
        over = np.isinf(t * f32(1000))
    assert over.any() and (~over).any()
    (narrow,) = softmax.qlinear_softmax(x, *inits.values(), opset=13, scheme=X86_131)
    assert (narrow[over] == _overflowed(int(zp), dtype)).all()


@pytest.mark.parametrize("wide", [False, True])
def test_qlinear_softmax_quotient_is_float32_or_float64_as_onnxruntime(wide) -> None:
    """A row where the two differ: the top value's ``t * 256 / sum t`` is 146.50002 in float64, and
    exactly 146.5 after the float32 division (a tie: 146). onnxruntime 1.31 gives 146, 1.32 gives 147."""
    x = np.array([[238, 214, 227, 135, 186, 151, 98, 105, 247, 151]], np.uint8)
    inits = {"xs": f32(0.0819096714258194), "xz": np.uint8(0), "ys": f32(1 / 256), "yz": np.uint8(0)}
    (got,) = softmax.qlinear_softmax(x, *inits.values(), opset=13, scheme=X86_132 if wide else X86_131)
    assert got[0, 8] == (147 if wide else 146)
    table = softmax._exp_table(float(inits["xs"]), 10)
    t = table[x[0].astype(np.int64) + 255 - 247]
    total = np.float32(0)
    for value in t:  # the float32 sum, in order
        total = np.float32(total + value)
    assert np.float32(t[8] * np.float32(256)) / total == np.float32(146.5)
    assert float(t[8]) * 256 / float(total) > 146.5
    if wide is ORT.softmax_float64:
        assert_same(got, _softmax_pair(x, inits)[1])


def test_qlinear_softmax_reads_one_element_vectors_as_scalars() -> None:
    """onnxruntime takes scales and zero points of shape (1,) as well as 0-d ones."""
    x = np.array([[5, 9, 200, 7], [30, 30, 31, 0]], np.uint8)
    inits = {
        "xs": np.array([0.1], f32),
        "xz": np.array([3], np.uint8),
        "ys": np.array([1 / 256], f32),
        "yz": np.array([2], np.uint8),
    }
    got, want = _softmax_pair(x, inits)
    assert_same(got, want)
    scalars = {k: v.reshape(()) for k, v in inits.items()}
    assert_same(softmax.qlinear_softmax(x, *scalars.values(), opset=13, scheme=ORT)[0], want)


@pytest.mark.parametrize(
    ("row", "x_scale"),
    [
        ([241, 219, 180, 11, 187, 81, 74, 187, 21], 0.12954899668693542),
        ([115, 147, 122, 106], 0.11640195548534393),
    ],
)
def test_qlinear_softmax_table_shift_decides_a_rounding(row, x_scale) -> None:
    """The table is scaled by e^(log(FLT_MAX / n) - 5) so that the row sum stays finite; the factor
    cancels in t / sum t but for the float32 roundings, which decide one output step on these rows
    (a table without it gives another)."""
    x = np.array([row], np.uint8)
    inits = {"xs": f32(x_scale), "xz": np.uint8(0), "ys": f32(1 / 256), "yz": np.uint8(0)}
    got, want = _softmax_pair(x, inits)
    assert_same(got, want)


@pytest.mark.parametrize(
    ("row", "x_scale", "y_scale"),
    [
        ([26, 213, 238, 118, 151, 31], 0.04907398298382759, 1 / 150),
        ([180, 130, 25, 128, 25, 25], 0.05342596769332886, 1 / 150),
        ([244, 244, 48, 94, 75, 17, 153], 0.25067055225372314, 1 / 250),
    ],
)
def test_qlinear_softmax_rounds_t_times_the_inverse_scale_to_float32(row, x_scale, y_scale) -> None:
    """``t * floor(1 / y_scale)`` is rounded to float32 before the division by the sum (as onnxruntime's
    float arithmetic does); on these rows the exact product would give another output step."""
    x = np.array([row], np.uint8)
    inits = {"xs": f32(x_scale), "xz": np.uint8(0), "ys": f32(y_scale), "yz": np.uint8(0)}
    got, want = _softmax_pair(x, inits)
    assert_same(got, want)


# -- QuantizeLinear / DequantizeLinear ------------------------------------------------------------


def test_quantize_linear_in_float64_rounds_the_exact_quotient() -> None:
    """A float64 input is divided in float64: 0.5 + 2^-30 rounds to 1 and -0.5 - 2^-35 to -1 (in
    float32 both are exactly +-0.5, ties to even 0); 2.5 - 2^-40 rounds to 2. Also when only the
    input is float64."""
    x = np.array([0.5 + 2.0**-30, -0.5 - 2.0**-35, 2.5 - 2.0**-40, 3.5], np.float64)
    want = np.array([1, -1, 2, 4], np.int8)
    assert_same(quantize.quantize_linear(x, np.float64(1), np.int8(0), scheme=ORT)[0], want)
    (reference,) = _reference("QuantizeLinear", {"x": x}, {"s": np.float64(1), "z": np.int8(0)}, np.int8, 13)
    assert_same(reference, want)
    assert_same(quantize.quantize_linear(x, f32(1), np.int8(0), scheme=ORT)[0], want)


def test_dequantize_linear_gives_the_scale_s_type() -> None:
    """Without ``output_dtype`` the output has the scale's type: float16 here (onnx.reference, opset 21)."""
    x = np.array([0, 1, 7, 255], np.uint8)
    inits = {"s": np.float16(0.1), "z": np.uint8(3)}
    (want,) = _reference("DequantizeLinear", {"x": x}, inits, np.float16, 21)
    got = quantize.dequantize_linear(x, *inits.values())[0]
    assert want.dtype == np.float16
    assert_same(got, want)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_dequantize_linear_per_axis_without_a_zero_point(dtype) -> None:
    """Per-channel scales and no zero point on 8-bit input (the zero point is then 0 in every channel)."""
    x = np.array([[[1, 2, 3], [4, 5, 6]], [[7, 8, 9], [10, 11, 12]]], dtype)
    scale = np.array([0.5, 0.25], f32)
    (want,) = _reference("DequantizeLinear", {"x": x}, {"s": scale}, f32, 19, axis=1)
    assert_same(want, (x * scale[None, :, None]).astype(f32))
    assert_same(quantize.dequantize_linear(x, scale, None, axis=1)[0], want)


@pytest.mark.parametrize("dtype", [np.uint8, np.int16])  # the table of 8-bit values, the general path
def test_dequantize_linear_to_float64_multiplies_in_float32(dtype) -> None:
    """``output_dtype`` double with a float32 scale: the product is taken in float32 then widened, as
    onnx.reference does (opset 23); 3 * 0.1f is 0.30000001192092896, not 0.3000000044703484. (Not int32:
    there onnx.reference's int32 zero point promotes its float32 difference to float64.)"""
    if ONNX < (1, 18):
        pytest.skip(f"onnx {onnx.__version__}'s reference has no DequantizeLinear-23 (output_dtype)")
    x = np.array([3, 7, 100, 0], dtype)
    inits = {"s": f32(0.1), "z": dtype(0)}
    (want,) = _reference("DequantizeLinear", {"x": x}, inits, np.float64, 23, output_dtype=11)
    assert want.dtype == np.float64 and want[0] == np.float64(f32(3) * f32(0.1))
    assert_same(quantize.dequantize_linear(x, *inits.values(), output_dtype=11)[0], want)


# -- QLinearAdd / QLinearMul and the table ops -----------------------------------------------------

_BINARY_ORDER = ["a", "as", "az", "b", "bs", "bz", "cs", "cz"]


def _binary_pair(op: str, a: np.ndarray, b: np.ndarray, inits: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's QLinearAdd or QLinearMul under the onnxruntime preset, and onnxruntime's."""
    spec = [("a", a.dtype, a.shape), ("b", b.dtype, b.shape)]
    model = node_model(op, spec, inits, a.dtype, domain=MS, input_order=_BINARY_ORDER)
    (want,) = ort_run(model, {"a": a, "b": b})
    ours = elementwise.qlinear_add if op == "QLinearAdd" else elementwise.qlinear_mul
    args = (a, inits["as"], inits["az"], b, inits["bs"], inits["bz"], inits["cs"], inits["cz"])
    return ours(*args, scheme=ORT)[0], want


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize(
    ("shape_a", "shape_b"),
    [
        ((1, 1, 1), (4,)),  # one value, against an operand of fewer dimensions than the output
        ((4,), (1, 1, 1)),
        ((9, 2), (1, 2)),  # many rows of two: a broadcast operand, rows split by the row count
        ((1, 3), (11, 3)),
    ],
)
def test_qlinear_binary_broadcasts_to_more_dimensions_like_onnxruntime(op, shape_a, shape_b) -> None:
    rng = np.random.default_rng(11)
    a = rng.integers(0, 256, shape_a).astype(np.uint8)
    b = rng.integers(0, 256, shape_b).astype(np.uint8)
    inits = {"as": f32(0.031), "az": np.uint8(3), "bs": f32(0.017), "bz": np.uint8(9)}
    inits |= {"cs": f32(0.05 if op == "QLinearAdd" else 0.009), "cz": np.uint8(5)}
    got, want = _binary_pair(op, a, b, inits)
    assert want.shape == np.broadcast_shapes(shape_a, shape_b)
    assert_same(got, want, f"{op} {shape_a} {shape_b}")


def test_qlinear_add_in_tflite_fixed_point_reads_one_element_vector_scales() -> None:
    """Equal scales: TFLite's ADD halves each input exactly (s / 2s) and doubles the sum back, so C is
    A - A_zp + B - B_zp + C_zp, saturated; scales of shape (1,) read as the scalars they hold."""
    a = np.array([0, 10, 100, 120, 255, 200], np.uint8)
    b = np.array([7, 20, 50, 100, 1, 250], np.uint8)
    s = np.array([0.5], f32)
    got = elementwise.qlinear_add(a, s, np.uint8(3), b, s, np.uint8(9), s, np.uint8(5), scheme=get_scheme("tflite"))[0]
    assert_same(got, np.array([0, 23, 143, 213, 249, 255], np.uint8))


def test_qlinear_add_in_float64_adds_the_zero_point_before_rounding_when_the_scheme_says() -> None:
    """A scheme with ``add`` in ``zp_before_rounding``: (a + b) * 1.25 / 1 = 2.5, + zp 1 = 3.5 rounds (half
    to even) to 4; rounded first, 2.5 gives 2, + 1 = 3 (the onnx-reference preset)."""
    reference = get_scheme("onnx-reference")
    first = reference.replace(name="zp-first-add", zp_before_rounding=frozenset({"add"}))
    a, b = np.array([1], np.int16), np.array([1], np.int16)
    args = (a, f32(1.25), np.int16(0), b, f32(1.25), np.int16(0), f32(1), np.int16(1))
    assert_same(elementwise.qlinear_add(*args, scheme=first)[0], np.array([4], np.int16))
    assert_same(elementwise.qlinear_add(*args, scheme=reference)[0], np.array([3], np.int16))


def test_qlinear_add_keeps_one_table_per_broadcast_kind() -> None:
    """MLAS folds ``fixed + a * r_a`` into one FMA when A holds one value per innermost span, and adds
    B's term first otherwise. With these parameters (found by a search over the two orders) the pair
    (240, 167) gives 66 the first way and 67 the other, as onnxruntime does: a table kept for one kind
    of call must not serve the other, nor may the output shape be taken from B alone."""
    inits = {"as": f32(0.013153451), "az": np.uint8(238), "bs": f32(0.08526804), "bz": np.uint8(250)}
    inits |= {"cs": f32(0.039948672), "cz": np.uint8(243)}
    b = np.array([[167, 0, 167, 3], [9, 167, 167, 167]], np.uint8)
    for a, b_, value in (
        (np.full((2, 1), 240, np.uint8), b, 66),  # one A per row
        (np.full((2, 4), 240, np.uint8), b, 67),  # A in full: the same parameters, the other order
        (np.full((2, 1), 240, np.uint8), b[0], 66),  # B of fewer dimensions than the output
    ):
        got, want = _binary_pair("QLinearAdd", a, b_, inits)
        assert_same(got, want, f"{a.shape} {b_.shape}")
        assert (got[np.broadcast_to(b_, got.shape) == 167] == value).all()


def _fixed_add(a: int, b: int, params: tuple, bits: int, floor: bool) -> int:
    """TFLite's quantized ADD on one uint8 pair with a ``bits``-wide multiplier and one rounding shift
    (half up, or floor), as docs/backend.md defines the ``q15``/``q31`` multipliers: ``m = q 2^(e - bits)``,
    ``q = round_half_away(frac 2^bits)`` from ``frexp``."""
    a_s, a_zp, b_s, b_zp, c_s, c_zp = params

    def times(x: int, m: float) -> int:
        frac, e = math.frexp(m)
        q = math.floor(frac * 2**bits + 0.5)
        if q == 2**bits:
            q, e = q // 2, e + 1
        t = bits - e
        return (x * q) >> t if floor else (x * q + (1 << (t - 1))) >> t

    twice_max = 2 * max(float(a_s), float(b_s))
    terms = times((a - a_zp) << 20, float(a_s) / twice_max) + times((b - b_zp) << 20, float(b_s) / twice_max)
    return min(max(times(terms, twice_max / (2**20 * float(c_s))) + c_zp, 0), 255)


@pytest.mark.parametrize(("multiplier", "rounding"), [("q15", "half_up"), ("q31", "floor"), ("q15", "floor")])
def test_qlinear_add_in_fixed_point_with_its_multiplier_width_and_rounding(multiplier, rounding) -> None:
    """The ``q15`` multiplier (15-bit integers) and a single-rounding ``q31`` scheme that floors:
    every pair of a grid against TFLite's ADD written out in Python integers with that width and rounding."""
    scheme = get_scheme("tflite-single-rounding").replace(name="custom", multiplier=multiplier, rounding=rounding)
    params = (f32(0.031), 3, f32(0.017), 9, f32(0.05), 5)
    a = np.repeat(np.arange(256, dtype=np.uint8), 256)  # every pair: a few hundred fall either side of a
    b = np.tile(np.arange(256, dtype=np.uint8), 256)  # rounding with a 15- or a 31-bit multiplier
    want = np.array([_fixed_add(int(x), int(y), params, int(multiplier[1:]), rounding == "floor") for x, y in
                     zip(a, b, strict=True)], np.uint8)  # fmt: skip
    a_s, a_zp, b_s, b_zp, c_s, c_zp = params
    got = elementwise.qlinear_add(a, a_s, np.uint8(a_zp), b, b_s, np.uint8(b_zp), c_s, np.uint8(c_zp), scheme=scheme)
    assert_same(got[0], want)
