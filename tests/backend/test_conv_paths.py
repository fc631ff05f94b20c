"""Which way the convolution kernels compute, and the bounds that decide it.

``conv_integer_acc`` returns a bound on its sums, and that bound picks float32 or float64 sums, the
requantizer that runs inside the chunks, and onnxruntime's path; ``_requantize_conv`` stays in float
only where every value is an exact integer. The values are the same either way, so these tests watch
the decisions themselves: the bound worked by hand from the inputs' type or data range and the
weights, the path ``conv_core`` takes for each geometry of ``test_conv_units.py`` (the table in
``conv_core``'s docstring), and which requantization ran. Values are checked too: against direct
int64 sums, onnx.reference, or numbers worked by hand. ``conv_pairs``' choice between its dense
and sparse corrections is watched the same way, at the end. Part of the ``conv`` and ``conv_pairs``
mutation groups.
"""

from __future__ import annotations

import numpy as np
import pytest
from backend_models import assert_same, node_model, random_q
from test_conv_units import GEOMETRIES, _case, _direct

from pytest_qaccuracy.backend import arith, get_scheme, neon_pairs
from pytest_qaccuracy.backend.kernels import conv, conv_core, conv_ort, conv_pairs

f32 = np.float32
VNNI = get_scheme("onnxruntime-vnni")
REFERENCE = get_scheme("onnx-reference")

#: the path of each geometry: float Conv, then exact sums (ConvInteger); worked from the table in
#: ``conv_core``'s docstring (depthwise at most 32 outputs per channel: channels last; exact grouped:
#: kernel rows; float depthwise of stride 1 and 64 columns or more: flat; else rows)
PATHS = {
    "dense-3x3": ("Im2colPath", "Im2colPath"),
    "dense-stride-2-dilated": ("Im2colPath", "Im2colPath"),
    "dense-stride-3-tall": ("Im2colPath", "Im2colPath"),
    "1x1": ("Im2colPath", "Im2colPath"),
    "1x1-stride-2": ("Im2colPath", "Im2colPath"),
    "grouped": ("Im2colPath", "GroupedRowPath"),  # float grouped: a padded copy
    "grouped-stride-2": ("Im2colPath", "GroupedRowPath"),
    "depthwise-tiny": ("NhwcPath", "NhwcPath"),  # 5 x 4 outputs
    "depthwise-tiny-2x3": ("NhwcPath", "NhwcPath"),  # 5 x 4
    "depthwise-odd-groups": ("RowsPath", "GroupedRowPath"),  # 9 x 8, 5 channels < 8 columns
    "depthwise-x2": ("RowsPath", "GroupedRowPath"),  # two outputs per channel
    "depthwise-wide": ("FlatPath", "GroupedRowPath"),  # 4 x 70
    "depthwise-wide-x2": ("FlatPath", "GroupedRowPath"),  # 5 x 66
    "depthwise-many-channels": ("NhwcPath", "NhwcPath"),  # 5 x 4
    "depthwise-rows": ("RowsPath", "GroupedRowPath"),  # 6 x 14, stride 2
    "1d": ("Im2colPath", "Im2colPath"),
    "1d-depthwise": ("Im2colPath", "Im2colPath"),
    "3d": ("Im2colPath", "Im2colPath"),
}


def _record_paths(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    taken: list[str] = []
    choose = conv_core.choose_path

    def recording(*args: object) -> type:
        kind = choose(*args)
        taken.append(kind.__name__)
        return kind

    monkeypatch.setattr(conv_core, "choose_path", recording)
    return taken


@pytest.mark.parametrize("name", GEOMETRIES)
def test_each_geometry_takes_its_path(name: str, monkeypatch) -> None:
    """Float Conv, then ConvInteger (exact sums), on each geometry: the path of the table, and the
    direct sums."""
    taken = _record_paths(monkeypatch)
    x, w, attrs = _case(name, np.int8)
    (got_float,) = conv.conv(x.astype(f32), w.astype(f32), **attrs)
    (got_int,) = conv.conv_integer(x, w, scheme=VNNI, **attrs)
    assert taken == list(PATHS[name])
    want = _direct(x, w, attrs["group"], attrs["strides"], attrs["dilations"], attrs["pads"])
    assert_same(got_float, want.astype(f32), name)
    assert_same(got_int, want.astype(np.int32), name)


def test_two_channel_depthwise_reads_the_input_unpadded(monkeypatch) -> None:
    """Two groups of one channel are depthwise too: channels last when tiny, kernel rows when exact."""
    taken = _record_paths(monkeypatch)
    rng = np.random.default_rng(20)
    x = random_q(rng, np.int8, (1, 2, 7, 6))
    w = random_q(rng, np.int8, (2, 1, 3, 3))
    want = _direct(x, w, 2, (1, 1), (1, 1), [1, 1, 1, 1])
    (got,) = conv.conv(x.astype(f32), w.astype(f32), group=2, pads=[1, 1, 1, 1])
    assert_same(got, want.astype(f32), "float")
    (got,) = conv.conv_integer(x, w, group=2, pads=[1, 1, 1, 1], scheme=VNNI)
    assert_same(got, want.astype(np.int32), "exact")
    assert taken == ["RowsPath", "GroupedRowPath"]  # 42 outputs per channel: not channels last
    x = x[:, :, :4, :4]
    want = _direct(x, w, 2, (1, 1), (1, 1), [1, 1, 1, 1])
    (got,) = conv.conv(x.astype(f32), w.astype(f32), group=2, pads=[1, 1, 1, 1])
    assert_same(got, want.astype(f32), "float, tiny")
    assert taken[-1] == "NhwcPath"


def test_exact_two_group_convolution_takes_the_kernel_rows(monkeypatch) -> None:
    taken = _record_paths(monkeypatch)
    rng = np.random.default_rng(21)
    x = random_q(rng, np.uint8, (1, 4, 6, 5))
    w = random_q(rng, np.int8, (4, 2, 3, 3))
    (got,) = conv.conv_integer(x, w, np.array(3, np.uint8), group=2, scheme=VNNI)
    assert_same(got, _direct(x.astype(np.int64) - 3, w, 2, (1, 1), (1, 1), [0] * 4).astype(np.int32), "sums")
    assert taken == ["GroupedRowPath"]


@pytest.mark.parametrize("name", ["dense-3x3", "grouped", "depthwise-tiny", "depthwise-odd-groups", "depthwise-wide"])
@pytest.mark.parametrize("exact", [False, True])
def test_conv_core_of_an_input_padded_by_the_caller(name: str, exact: bool) -> None:
    """Without ``pads`` the input is taken as already padded: no more padding, no offset."""
    x, w, attrs = _case(name, np.int8)
    p = attrs["pads"]
    xp = np.pad(x, [(0, 0), (0, 0), (p[0], p[2]), (p[1], p[3])])
    got = conv_core.conv_core(
        xp.astype(f32), w.astype(f32), attrs["group"], tuple(attrs["strides"]), tuple(attrs["dilations"]), f32,
        exact=exact,
    )  # fmt: skip
    want = _direct(x, w, attrs["group"], attrs["strides"], attrs["dilations"], p)
    assert got.dtype == f32
    assert_same(got, want.astype(f32), name)


# conv_integer_acc's bound: |x - x_zp| at most over the type's range, or the data's own when the
# type's would pass 2**23 against the weights' largest sum of |w - w_zp| over one output channel


def _acc(x, x_zp, w, w_zp=0, scheme=VNNI, **attrs):
    return conv.conv_integer_acc(x, x_zp, w, w_zp, attrs, scheme)


def test_bound_from_the_inputs_type_with_its_zero_point() -> None:
    """uint8 with zero point 100: |x - 100| <= 155; int8 with zero point 5: <= 133 (-128 - 5). The
    weights' sums of |w - w_zp|: channel 0 has 6 * 2 + 3 * 7 = 33, channel 1 9 * 4 = 36."""
    x = np.full((1, 1, 4, 4), 101, np.uint8)  # the data alone would give |101 - 100| = 1
    w = np.array([2] * 6 + [-7] * 3 + [4] * 9, np.int8).reshape(2, 1, 3, 3)
    acc, bound, done = _acc(x, np.uint8(100), w)
    assert (bound, done) == (155 * 36, False)
    assert acc.dtype == f32
    assert_same(acc, _direct(x.astype(np.int64) - 100, w, 1, (1, 1), (1, 1), [0] * 4).astype(f32), "sums")
    _, bound, _ = _acc(x.astype(np.int8) - 100, np.int8(5), w)
    assert bound == 133 * 36
    _, bound, _ = _acc(x, np.uint8(100), w, np.array([2, 1], np.int8))  # |w - zp|: 3 * 9 = 27, 3 * 9
    assert bound == 155 * 27


def test_bound_of_zero_weights_is_zero() -> None:
    _, bound, _ = _acc(np.full((1, 2, 3, 3), 7, np.uint8), np.uint8(0), np.zeros((2, 2, 2, 2), np.int8))
    assert bound == 0.0


@pytest.mark.parametrize(("x_zp", "want"), [(0, 40), (20, 20), (3, 37)])
def test_bound_from_the_data_when_the_types_passes_2_23(x_zp: int, want: int) -> None:
    """Weights of 100 over 64 channels and 9 taps: 57,600; with the type's range (255 at most) that is
    past 2**23, so the data's own range counts: x in [3, 40] minus the zero point."""
    rng = np.random.default_rng(22)
    x = rng.integers(3, 41, (1, 64, 5, 5)).astype(np.uint8)
    x[0, 0, 0, :2] = (3, 40)
    w = np.full((2, 64, 3, 3), 100, np.int8)
    acc, bound, _ = _acc(x, np.uint8(x_zp), w)
    assert bound == want * 57600
    assert_same(acc, _direct(x.astype(np.int64) - x_zp, w, 1, (1, 1), (1, 1), [0] * 4).astype(f32), "sums")


def test_bound_at_2_23_takes_the_data_range() -> None:
    """int8 with zero point 0 ranges over 128; 512 weights of -128 sum to 2**16: exactly 2**23, from
    which the data's range (5) counts; at 2**23 - 128 (one weight 0) the type's still does."""
    x = np.tile(np.arange(-3, 6, dtype=np.int8), 512)[:512].reshape(1, 512, 1, 1)
    w = np.full((1, 512, 1, 1), -128, np.int8)
    _, bound, _ = _acc(x, np.int8(0), w)
    assert bound == 5 * 2**16
    w[0, 0] = 0
    _, bound, _ = _acc(x, np.int8(0), w)
    assert bound == 128 * (2**16 - 128)


def test_sums_are_float64_from_a_bound_of_2_24() -> None:
    """1,032 weights of -128 and 255 - 0: a bound of 33,683,... >= 2**24: float64 sums; 514 of them,
    2**24 - 256: float32."""
    for channels, dtype in ((1032, np.float64), (514, f32)):
        x = np.full((1, channels, 1, 2), 255, np.uint8)
        x[0, 0, 0, 1] = 254
        w = np.full((1, channels, 1, 1), -128, np.int8)
        acc, bound, _ = _acc(x, np.uint8(0), w)
        assert bound == 255 * 128 * channels
        assert acc.dtype == dtype
        assert acc.tolist() == [[[[-255 * 128 * channels, -255 * 128 * channels + 128]]]]


def test_a_requantizer_runs_on_the_sums_plus_its_bias() -> None:
    """``requantizer_for(bound, float type)``: asked once with the bound and float32; its bias added to
    the sums, then its ``finish`` writes the output of its type."""
    rng = np.random.default_rng(23)
    x = random_q(rng, np.uint8, (2, 3, 5, 4))
    w = random_q(rng, np.int8, (4, 3, 2, 2))
    asked = []

    def finish(chunk: np.ndarray, dest: np.ndarray) -> None:
        dest[...] = chunk.astype(np.int64) * 2

    def requantizer_for(bound: float, ftype: type) -> conv.Requantizer:
        asked.append((bound, ftype))
        return conv.Requantizer(np.array([1, -2, 3, 0]), finish, np.dtype(np.int32))

    got, bound, done = conv.conv_integer_acc(x, np.uint8(9), w, 0, {}, VNNI, requantizer_for)
    assert asked == [(bound, f32)]
    assert bound == 246 * int(np.abs(w.astype(np.int64)).reshape(4, -1).sum(axis=1).max())
    assert done
    assert got.dtype == np.int32
    sums = _direct(x.astype(np.int64) - 9, w, 1, (1, 1), (1, 1), [0] * 4)
    assert_same(got, ((sums + np.array([1, -2, 3, 0]).reshape(4, 1, 1)) * 2).astype(np.int32), "finished")


def test_avx2_bound_adds_the_pair_corrections_bound() -> None:
    """Under AVX2 the sums carry the int16 pair saturation: their bound is the exact sums' plus the
    correction's own (``max_abs``), and it holds the saturated sums."""
    x = np.full((1, 4, 4, 4), 255, np.uint8)
    w = np.full((2, 4, 3, 3), -128, np.int8)
    w[1] = 127
    avx2 = get_scheme("onnxruntime-avx2")
    acc, bound, _ = _acc(x, np.uint8(0), w, scheme=avx2)
    correction = conv_pairs.pair_corrections(x, 0, w, 1, [0] * 4, (1, 1), (1, 1), (2, 2))
    assert correction is not None
    exact = 255 * 128 * 36
    assert bound == exact + correction.max_abs()
    assert np.abs(acc).max() <= bound
    assert_same(acc, (_direct(x, w, 1, (1, 1), (1, 1), [0] * 4) + correction.dense()).astype(f32), "saturated")
    assert acc[0, 0, 0, 0] == 18 * -32768  # each pair of 255 * -128 saturates at -32768


@pytest.mark.parametrize(("preset", "group"), [("onnxruntime-arm64-neon", 1), ("onnxruntime-arm64", 8)])
def test_arm64_bound_adds_the_wrapped_pairs(preset: str, group: int) -> None:
    """ARM64's wrapped int16 pairs (weights of -128 next to each other): the sums plus the wrap, and
    the bound plus its largest magnitude; no requantizer runs inside the chunks then."""
    rng = np.random.default_rng(24)
    c = 4 if group == 1 else 8  # MLAS's depthwise kernels: channels in blocks of 8
    x = rng.integers(200, 256, (1, c, 5, 5)).astype(np.uint8)
    w = np.full((c, c // group, 3, 3), -128, np.int8)
    w[:2, :, 0] = random_q(rng, np.int8, (2, c // group, 3))
    scheme = get_scheme(preset)
    if group == 1:
        wrapped = neon_pairs.conv_correction(x, 0, w, 1, [1, 1, 1, 1], (1, 1), (1, 1), (5, 5))
    else:
        wrapped = neon_pairs.depthwise_correction(x, 0, w, np.int64(0), [1, 1, 1, 1], (1, 1), (1, 1), (5, 5))
    assert wrapped is not None and np.abs(wrapped).max() > 0
    asked = []
    acc, bound, done = conv.conv_integer_acc(
        x, np.uint8(0), w, 0, {"pads": [1, 1, 1, 1], "group": group}, scheme, lambda *a: asked.append(a)
    )
    w_sum = int(np.abs(w.astype(np.int64)).reshape(c, -1).sum(axis=1).max())
    assert bound == 255 * w_sum + np.abs(wrapped).max()
    assert (asked, done) == ([], False)
    assert acc.dtype == np.float64  # the wrap added in float64, exact
    assert_same(acc, (_direct(x, w, group, (1, 1), (1, 1), [1] * 4) + wrapped).astype(np.float64), preset)


def test_onnxruntime_is_asked_with_the_convolutions_multiply_adds(monkeypatch) -> None:
    """``conv_ort.worth_it`` gets records x weights x output positions: 2 x (4 * 3 * 3 * 3) x (6 * 5)."""
    asked = []
    monkeypatch.setattr(conv_ort, "worth_it", lambda macs: asked.append(macs) or False)
    rng = np.random.default_rng(25)
    x = random_q(rng, np.uint8, (2, 3, 8, 7))
    w = random_q(rng, np.int8, (4, 3, 3, 3))
    (got,) = conv.conv_integer(x, w, scheme=VNNI)
    assert asked == [2 * 108 * 30]
    assert_same(got, _direct(x, w, 1, (1, 1), (1, 1), [0] * 4).astype(np.int32), "sums")


# _requantize_conv: float requantization where the sums plus the bias are exact integers, else int64


@pytest.fixture
def requantized(monkeypatch) -> list[tuple]:
    """The calls to ``arith.requantize``: (accumulator type, overwrite)."""
    calls: list[tuple] = []
    requantize = arith.requantize

    def recording(acc, *args, **kwargs):
        calls.append((acc.dtype, kwargs.get("overwrite")))
        return requantize(acc, *args, **kwargs)

    monkeypatch.setattr(arith, "requantize", recording)
    return calls


@pytest.mark.parametrize(
    ("acc_type", "bound", "bias", "preset", "float_path"),
    [
        (f32, 1000, [5, -5], "onnxruntime-vnni", True),
        (f32, 1000, None, "onnx-reference", True),  # a float64 multiplier on float32 sums
        (f32, 2**24 - 10, [10, -3], "onnxruntime-vnni", False),  # bound + bias = 2**24: not exact
        (f32, 2**24 - 1, [0, 0], "onnxruntime-vnni", True),
        (f32, 2**24 - 1, None, "onnxruntime-vnni", True),
        (np.float64, 2**25, [7, 1], "onnxruntime-vnni", True),
        (np.float64, 2**31 - 7, [7, 1], "onnx-reference", False),  # bound + bias = 2**31: int64
        (np.float64, 2**31 - 8, [7, 1], "onnx-reference", True),
        (np.int64, 1000, [5, -5], "onnxruntime-vnni", False),
        (f32, 1000, [5, -5], "tflite", False),  # fixed-point multipliers want integers
    ],
)
def test_requantize_conv_stays_in_float_where_exact(acc_type, bound, bias, preset, float_path, requantized) -> None:
    """Sums 0, 1, 3, -3 (and the bias) times 0.5 plus 10, rounded half to even (tflite: half away from
    zero): the same values on both paths; the float path reuses the float sums (``overwrite``), the
    other requantizes int64."""
    acc = np.array([[0, 1], [3, -3]], acc_type).reshape(1, 2, 2, 1)
    b = None if bias is None else np.array(bias).reshape(2, 1, 1)
    m = np.array([0.5, 0.5], f32).reshape(2, 1, 1)
    got = conv._requantize_conv(acc, bound, b, m, np.int8(10), np.dtype(np.int8), get_scheme(preset))
    sums = np.array([[0, 1], [3, -3]]) + (0 if bias is None else np.array(bias).reshape(2, 1))
    halves = np.trunc(sums / 2 + np.sign(sums) / 2) if preset == "tflite" else np.rint(sums / 2)  # tflite: away
    assert got.dtype == np.int8
    assert got.reshape(2, 2).tolist() == (halves + 10).astype(int).tolist()
    if float_path:
        assert requantized == [(np.dtype(acc_type), True)]
    else:
        assert [dtype for dtype, _ in requantized] == [np.dtype(np.int64)]


# qlinear_conv's requantizer: inside the chunks when float sums of the multiplier's type are exact


@pytest.fixture
def after_chunks(monkeypatch) -> list[float]:
    """The bounds ``_requantize_conv`` (the requantization after the chunks) was called with."""
    calls: list[float] = []
    requantize = conv._requantize_conv

    def recording(acc, bound, *args):
        calls.append(bound)
        return requantize(acc, bound, *args)

    monkeypatch.setattr(conv, "_requantize_conv", recording)
    return calls


def _qlinear(x: np.ndarray, w: np.ndarray, bias: list[int] | None, scheme, y_zp: int = 0) -> np.ndarray:
    m = w.shape[0]
    (got,) = conv.qlinear_conv(
        x, f32(1), np.uint8(0), w, np.full(m, 1.0, f32), np.zeros(m, np.int8), f32(2), np.uint8(y_zp),
        None if bias is None else np.array(bias, np.int32), scheme=scheme,
    )  # fmt: skip
    return got


@pytest.mark.parametrize(
    ("channels", "extra", "bias", "preset", "inside", "want"),
    [
        (2, 0, [3], "onnxruntime-vnni", True, 0),  # bound 65,280: float32, inside the chunks
        (514, 1, None, "onnxruntime-vnni", True, 0),  # bound 2**24 - 1
        (514, 1, [0], "onnxruntime-vnni", True, 0),
        (514, 1, [1], "onnxruntime-vnni", False, 0),  # bound + bias = 2**24: not exact in float32
        (2, 0, [3], "onnx-reference", False, 0),  # float32 sums, a float64 multiplier
        (1032, 0, [0], "onnx-reference", True, 0),  # float64 sums: inside
        (66000, 0, None, "onnx-reference", False, 255),  # past 2**31: int64 after the chunks, wraps int32
        (2, 0, [3], "tflite", False, 0),
    ],
)
def test_qlinear_conv_requantizes_inside_the_chunks_where_exact(
    channels: int, extra: int, bias, preset: str, inside: bool, want: int, after_chunks
) -> None:
    """Weights of -128 against 255 (and ``extra`` weights of 1): bound 255 * (128 * channels + extra).
    The output is the sums plus the bias over 2, saturated at 0 (as onnx.reference says); past 2**31
    the sum wraps in int32 to 2,140,727,296 first (as onnxruntime's, ``test_conv_units.py``): 255."""
    from onnx.reference import ReferenceEvaluator

    x = np.full((1, channels + extra, 1, 1), 255, np.uint8)
    w = np.full((1, channels + extra, 1, 1), -128, np.int8)
    w[0, channels:] = 1
    got = _qlinear(x, w, bias, get_scheme(preset))
    assert got.tolist() == [[[[want]]]]
    assert after_chunks == ([] if inside else [255.0 * (128 * channels + extra)])
    if channels < 1000:
        inits = {
            "xs": f32(1), "xz": np.array(0, np.uint8), "w": w, "ws": np.full(1, 1.0, f32), "wz": np.zeros(1, np.int8),
            "ys": f32(2), "yz": np.array(0, np.uint8),
        }  # fmt: skip
        if bias is not None:
            inits["b"] = np.array(bias, np.int32)
        model = node_model("QLinearConv", [("x", np.uint8, x.shape)], inits, np.uint8, kernel_shape=[1, 1])
        assert ReferenceEvaluator(model).run(None, {"x": x})[0].tolist() == [[[[0]]]]


def test_reference_requantizes_float64_sums_inside_the_chunks_zero_point_first() -> None:
    """Sums of 1,032 channels (float64: bound 33,683,... >= 2**24) plus a bias that brings them to 1, 129,
    385, 257, times 0.5 plus 3, rounded half to even with the zero point added first: 4, 68, 196, 132
    (adding it after rounding would give 3, 67, 195, 131); against onnx.reference."""
    from onnx.reference import ReferenceEvaluator

    channels = 1032
    x = np.full((1, channels, 1, 4), 255, np.uint8)
    x[0, 0, 0, 1] = 254
    x[0, :3, 0, 2] = 254
    x[0, 0, 0, 3] = 253
    bias = 255 * 128 * channels + 1
    inits = {
        "xs": f32(1), "xz": np.array(0, np.uint8), "w": np.full((1, channels, 1, 1), -128, np.int8),
        "ws": np.array([0.5], f32), "wz": np.zeros(1, np.int8), "ys": f32(1), "yz": np.array(3, np.uint8),
        "b": np.array([bias], np.int32),
    }  # fmt: skip
    model = node_model("QLinearConv", [("x", np.uint8, x.shape)], inits, np.uint8, kernel_shape=[1, 1])
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    assert want.tolist() == [[[[4, 68, 196, 132]]]]
    order = ("xs", "xz", "w", "ws", "wz", "ys", "yz", "b")
    (got,) = conv.qlinear_conv(x, *(inits[k] for k in order), scheme=REFERENCE)
    assert_same(got, want, "zero point first")


# conv_core's plumbing: onnxruntime's threads and record chunks, and the chunks of the other paths


def _ort_case() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(26)
    return random_q(rng, np.int8, (2, 3, 8, 7)), random_q(rng, np.int8, (4, 3, 3, 3))


@pytest.mark.parametrize(("records", "threads", "want"), [(1, 2, 2), (2, 2, 1), (3, 2, 1), (1, 1, 1)])
def test_onnxruntime_threads_go_inside_the_call_when_records_are_fewer(records, threads, want, monkeypatch) -> None:
    """Fewer records than the session's threads: one onnxruntime call using them all (intra-op);
    else one thread per call, the calls spread over the threads."""
    from pytest_qaccuracy.backend import parallel

    asked = []
    session_for = conv_ort.session_for
    monkeypatch.setattr(conv_ort, "session_for", lambda *a: asked.append(a[3]) or session_for(*a))
    x, w = _ort_case()
    x = np.concatenate([x] * 2)[:records]
    with parallel.using(threads):
        got = conv_core.conv_core(x, w.astype(f32), 1, (1, 1), (1, 1), f32, exact=True, pads=[0] * 4, weights=(w, "t"))
    assert asked == [want]
    assert_same(got, _direct(x, w, 1, (1, 1), (1, 1), [0] * 4).astype(f32), "sums")


@pytest.mark.parametrize(("shift", "want"), [(0, 2), (1, 1)])
def test_onnxruntime_records_are_shared_from_min_parallel_macs(shift: int, want: int, monkeypatch) -> None:
    """Two records of 4 x 6 x 5 outputs of 27 multiply-adds: 6,480, shared between two threads from
    ``MIN_PARALLEL_MACS`` = 6,480 (not from 6,481)."""
    from pytest_qaccuracy.backend import parallel

    asked = []
    spans = conv_core._record_spans
    monkeypatch.setattr(conv_core, "_record_spans", lambda *a: asked.append(a) or spans(*a))
    monkeypatch.setattr(conv_core, "MIN_PARALLEL_MACS", 2 * 120 * 27 + shift)
    x, w = _ort_case()
    with parallel.using(2):
        got = conv_core.conv_core(x, w.astype(f32), 1, (1, 1), (1, 1), f32, exact=True, pads=[0] * 4, weights=(w, "s"))
    assert asked == [(2, 120, want, 6)]
    assert_same(got, _direct(x, w, 1, (1, 1), (1, 1), [0] * 4).astype(f32), "sums")


@pytest.mark.parametrize(
    ("name", "budget"), [("depthwise-odd-groups", "DEPTHWISE_CHUNK_ELEMENTS"), ("dense-3x3", None)]
)
def test_chunks_are_cut_by_each_paths_scratch_and_budget(name: str, budget, monkeypatch) -> None:
    """``chunk_spans`` gets the records, the output rows, the path's scratch per row times the output's
    columns, and the path's budget (the row-reading depthwise paths' smaller one)."""
    from pytest_qaccuracy.backend.kernels import conv_chunks

    asked = []
    spans = conv_core.chunk_spans
    monkeypatch.setattr(conv_core, "chunk_spans", lambda *a: asked.append(a) or spans(*a))
    x, w, attrs = _case(name, np.int8)
    (got,) = conv.conv(x.astype(f32), w.astype(f32), **attrs)
    n, c, m = GEOMETRIES[name][:3]
    rows, cols = got.shape[2:]
    per_row = (c + 2 * m) if budget else (9 * c + m)  # RowsPath: C x strides + 2 M; im2col: taps x C + M
    want_budget = getattr(conv_chunks, budget) if budget else None
    assert asked == [(n, rows, per_row * cols, want_budget)]


@pytest.mark.parametrize("name", ["depthwise-tiny", "grouped"])
def test_conv_core_reads_the_offset_only_with_pads(name: str) -> None:
    """``offset`` is subtracted from an unpadded input (with ``pads``); an input padded by the caller
    is taken as it is, whatever ``offset`` says."""
    x, w, attrs = _case(name, np.int8)
    g, strides, dilations = attrs["group"], tuple(attrs["strides"]), tuple(attrs["dilations"])
    got = conv_core.conv_core(x.astype(f32), w.astype(f32), g, strides, dilations, f32, exact=True, offset=5)
    assert_same(got, _direct(x, w, g, strides, dilations, [0] * 4).astype(f32), "padded by the caller")
    got = conv_core.conv_core(x, w.astype(f32), g, strides, dilations, f32, exact=True, pads=[0] * 4, offset=5)
    assert_same(got, _direct(x.astype(np.int64) - 5, w, g, strides, dilations, [0] * 4).astype(f32), "unpadded")


def test_onnxruntime_path_of_one_output_channel() -> None:
    """One output channel through onnxruntime: its weights are all the weights."""
    x, w = _ort_case()
    w = w[:1]
    got = conv_core.conv_core(x, w.astype(f32), 1, (1, 1), (1, 1), f32, exact=True, pads=[1] * 4, weights=(w, "one"))
    assert got.shape == (2, 1, 8, 7)
    assert_same(got, _direct(x, w, 1, (1, 1), (1, 1), [1] * 4).astype(f32), "one channel")


# conv_pairs: the dense or the sparse way, chosen by cost. 1 x 1 kernels over two channels of
# weights -128: one risky pair per output channel and pixel, whose sum -128 (x0 + x1) saturates at
# -32768 when x0 + x1 > 256. ``dense`` = records x outputs x entries, ``sparse`` = 18,000 + 0.4 x
# records x pixels x first rows (``SPARSE_FIXED``, ``SCAN_COST``); a dense way of at most 2**16
# evaluations is taken without weighing.


def _choice(x: np.ndarray, m: int, stride: int = 1) -> type:
    """The correction's class; its sums checked against ``sat16(-128 (x0 + x1))``."""
    w = np.full((m, 2, 1, 1), -128, np.int8)
    xs = x[:, :, ::stride, ::stride]
    out = xs.shape[2:]
    correction = conv_pairs.pair_corrections(x, 0, w, 1, [0] * 4, (stride, stride), (1, 1), out)
    acc, _, _ = _acc(x, np.uint8(0), w, scheme=get_scheme("onnxruntime-avx2"), strides=[stride, stride])
    pair = np.maximum(-128 * (xs[:, :1].astype(np.int64) + xs[:, 1:]), -32768)
    assert_same(acc, np.broadcast_to(pair, acc.shape).astype(acc.dtype), "saturated sums")
    return type(correction)


def _records(n: int, high_share: int | None = None) -> np.ndarray:
    """``n`` records of 2 x 64 x 64: the first at 255 (or 255 on 1 / ``high_share`` of its rows), the
    others 0."""
    x = np.zeros((n, 2, 64, 64), np.uint8)
    if high_share is None:
        x[0] = 255
    else:
        x[0, :, : 64 // high_share] = 255
    return x


def test_dense_way_for_a_stem_like_first_record() -> None:
    """4 records, 8 outputs: dense 131,072 > sparse 24,554; the first record high everywhere: its
    32,768 saturated pair sums cost 130 each per record, far more: dense."""
    assert _choice(_records(4), 8) is conv_pairs.DenseCorrection


def test_sparse_way_under_four_records() -> None:
    """3 records: dense 98,304 > sparse 22,915, and no sample is taken under 4 records: sparse."""
    assert _choice(_records(3), 8) is conv_pairs.SparseSearch


def test_sparse_way_when_few_inputs_are_high() -> None:
    """The first record at 100 (under 32767 // 128 // 2 = 127), a later one high: sparse."""
    x = _records(4)
    x[0] = 100
    x[1, :, 0, 0] = 255
    assert _choice(x, 8) is conv_pairs.SparseSearch


def test_dense_way_from_one_eighth_of_high_inputs() -> None:
    """One row in 8 of the first record at 255 (exactly 1/8 of its values): sampled, 4,096 saturated
    pair sums: dense."""
    assert _choice(_records(4, high_share=8), 8) is conv_pairs.DenseCorrection


def test_dense_way_when_it_costs_no_more_than_the_scan() -> None:
    """Stride 2 over 514 x 514: dense 257 * 257 = 66,049 (past 2**16) <= sparse 18,000 + 0.4 * 514 * 514
    = 123,678: dense, with one record."""
    x = np.full((1, 2, 514, 514), 255, np.uint8)
    assert _choice(x, 1, stride=2) is conv_pairs.DenseCorrection


def test_zeros_buffer_grows_once_and_is_shared_read_only(monkeypatch) -> None:
    """``_zeros``: int16 zeros of any shape from one read-only buffer, replaced only when too small."""
    monkeypatch.setattr(conv_pairs, "_ZEROS", np.zeros(0, np.int16))
    first = conv_pairs._zeros((3, 4))
    assert first.shape == (3, 4) and first.dtype == np.int16 and not first.any()
    assert not first.flags.writeable
    grown = conv_pairs._ZEROS
    assert grown.size == 12
    same = conv_pairs._zeros((2, 6))  # as large: the same buffer
    assert conv_pairs._ZEROS is grown and np.shares_memory(same, grown)
    assert conv_pairs._zeros((5,)).base is not None and conv_pairs._ZEROS is grown
    assert conv_pairs._zeros((13,)).shape == (13,) and conv_pairs._ZEROS.size == 13


@pytest.mark.parametrize(
    ("bounds", "budget", "want"),
    [
        ([0, 3, 5, 9, 10, 14], 5, [(0, 2), (2, 4), (4, 5)]),  # each span's entries: 5, 5, 4
        ([0, 8, 9], 5, [(0, 1), (1, 2)]),  # a candidate over the budget alone takes a span of its own
        ([0, 1, 2, 3], 10, [(0, 3)]),
        ([0, 2], 1, [(0, 1)]),
    ],
)
def test_spans_of_candidates_by_hand(bounds: list[int], budget: int, want: list) -> None:
    """``_spans``: consecutive ranges of candidates whose expanded entries (cumulative ``bounds``) fit
    the budget, at least one candidate each."""
    assert conv_pairs._spans(np.array(bounds), budget) == want


def test_a_convolution_without_risky_pairs_counts_its_pair_sums() -> None:
    """No pair can saturate (inputs at most 100 on weights of -128): no correction, and the counter
    gets every pair sum of the convolution, none saturated: 2 records x 6 x 5 outputs x 3 output
    channels x 14 pairs (3 x 3 taps x 3 channels = 27 products, the last one alone)."""
    from pytest_qaccuracy.backend import pairs

    x = np.full((2, 3, 8, 7), 100, np.uint8)
    w = np.full((3, 3, 3, 3), -128, np.int8)
    counter = pairs.SaturationCounter()
    with pairs.counting(counter):
        assert conv_pairs.pair_corrections(x, 0, w, 1, [0] * 4, (1, 1), (1, 1), (6, 5)) is None
    node = counter.nodes[""]
    assert (node.pairs, node.saturated, node.per_record) == (2 * 30 * 3 * 14, 0, {})


def test_a_sparse_search_without_saturated_pairs_is_all_zeros() -> None:
    """The sparse way on inputs whose pairs never reach int16's range (a later record decides the
    channels' maxima): its dense correction is int64 zeros of the output's shape."""
    x = np.zeros((3, 2, 64, 64), np.uint8)
    x[2, 0, 0, 0] = x[2, 1, 0, 1] = 255  # channel maxima 255: risky pairs; no pixel high in both channels
    w = np.full((8, 2, 1, 1), -128, np.int8)
    correction = conv_pairs.pair_corrections(x, 0, w, 1, [0] * 4, (1, 1), (1, 1), (64, 64))
    assert isinstance(correction, conv_pairs.SparseSearch)
    dense = correction.dense()
    assert dense.shape == (3, 8, 64, 64) and dense.dtype == np.int64 and not dense.any()
