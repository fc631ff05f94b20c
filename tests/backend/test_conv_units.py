"""The convolution kernels called one at a time: conv, conv_core, conv_chunks, conv_gemm, conv_depthwise.

Each expected value comes from outside the kernels: a direct convolution in int64 written in the
test (every output position, every tap, exact), onnxruntime run on the same one-node model (this
host's onnxruntime is the ``onnxruntime-vnni`` family, which sums exactly), or geometry worked by hand
from the ONNX spec. Every path of ``conv_core.choose_path`` is run, on one thread and on two, with
chunks small enough that the output is cut into several. These tests are the ``conv`` mutation
group's fast unit tests (``scripts/mutation.py``).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from backend_models import assert_same, node_model, ort_run, random_q

from pytest_qaccuracy.backend import get_scheme, parallel
from pytest_qaccuracy.backend.kernels import conv, conv_chunks, conv_core, conv_gemm
from pytest_qaccuracy.backend.kernels.conv_chunks import Chunk, Source

f32 = np.float32
VNNI = get_scheme("onnxruntime-vnni")
REFERENCE = get_scheme("onnx-reference")


def _direct(x: np.ndarray, w: np.ndarray, group: int, strides, dilations, pads) -> np.ndarray:
    """``sum x * w`` over every window, in int64: one tap at a time over a zero-padded copy."""
    d = x.ndim - 2
    x = x.astype(np.int64)
    w = w.astype(np.int64)
    padded = np.pad(x, [(0, 0), (0, 0), *((pads[i], pads[d + i]) for i in range(d))])
    kernel = w.shape[2:]
    out = tuple((padded.shape[2 + i] - (kernel[i] - 1) * dilations[i] - 1) // strides[i] + 1 for i in range(d))
    n = x.shape[0]
    m, cg = w.shape[:2]
    mg = m // group
    y = np.zeros((n, m, *out), np.int64)
    for o in range(m):
        g = o // mg
        for ci in range(cg):
            for tap in itertools.product(*(range(k) for k in kernel)):
                index = tuple(
                    slice(tap[i] * dilations[i], tap[i] * dilations[i] + (out[i] - 1) * strides[i] + 1, strides[i])
                    for i in range(d)
                )
                y[:, o] += padded[(slice(None), g * cg + ci, *index)] * w[(o, ci, *tap)]
    return y


#: name: (records, channels, outputs, group, spatial, kernel, strides, dilations, pads) -- each row
#: takes one of ``conv_core.choose_path``'s paths (float depthwise: flat, nhwc, rows; exact: grouped
#: rows, nhwc; any: im2col) or one of the geometry's corners
GEOMETRIES = {
    "dense-3x3": (2, 3, 4, 1, (7, 6), (3, 3), (1, 1), (1, 1), [1, 1, 1, 1]),
    "dense-stride-2-dilated": (2, 3, 5, 1, (9, 8), (3, 2), (2, 1), (2, 2), [1, 0, 2, 1]),
    "dense-stride-3-tall": (1, 2, 3, 1, (11, 7), (5, 3), (3, 2), (1, 1), [2, 1, 2, 1]),
    "1x1": (3, 4, 6, 1, (5, 4), (1, 1), (1, 1), (1, 1), [0, 0, 0, 0]),
    "1x1-stride-2": (2, 4, 3, 1, (5, 5), (1, 1), (2, 2), (1, 1), [0, 0, 0, 0]),
    "grouped": (2, 6, 4, 2, (8, 7), (3, 3), (1, 1), (1, 1), [1, 1, 1, 1]),
    "grouped-stride-2": (2, 6, 9, 3, (9, 9), (3, 3), (2, 2), (1, 2), [1, 2, 0, 1]),
    "depthwise-tiny": (2, 6, 6, 6, (5, 4), (3, 3), (1, 1), (1, 1), [1, 1, 1, 1]),
    "depthwise-tiny-2x3": (2, 6, 6, 6, (5, 4), (2, 3), (1, 1), (1, 1), [1, 1, 0, 1]),
    "depthwise-odd-groups": (2, 5, 5, 5, (9, 8), (3, 3), (1, 1), (1, 1), [1, 1, 1, 1]),
    "depthwise-x2": (2, 4, 8, 4, (9, 10), (3, 3), (2, 1), (1, 2), [1, 2, 1, 0]),
    "depthwise-wide": (2, 4, 4, 4, (6, 70), (3, 3), (1, 1), (2, 1), [2, 1, 0, 1]),
    "depthwise-wide-x2": (1, 3, 6, 3, (5, 66), (2, 3), (1, 1), (1, 2), [0, 2, 1, 2]),
    "depthwise-many-channels": (2, 40, 40, 40, (10, 8), (3, 3), (2, 2), (1, 1), [1, 1, 1, 1]),
    "depthwise-rows": (2, 4, 4, 4, (12, 14), (3, 2), (2, 1), (1, 1), [1, 0, 1, 1]),
    "1d": (2, 4, 6, 2, (13,), (3,), (2,), (2,), [2, 1]),
    "1d-depthwise": (2, 3, 3, 3, (11,), (4,), (1,), (1,), [1, 2]),
    "3d": (1, 2, 3, 1, (4, 5, 4), (2, 3, 2), (1, 2, 1), (1, 1, 2), [1, 0, 1, 0, 1, 1]),
}  # fmt: skip


def _case(name: str, x_dtype: type, seed: int = 0) -> tuple[np.ndarray, np.ndarray, dict]:
    n, c, m, group, spatial, kernel, strides, dilations, pads = GEOMETRIES[name]
    rng = np.random.default_rng(seed + len(name))
    x = random_q(rng, x_dtype, (n, c, *spatial))
    w = random_q(rng, np.int8, (m, c // group, *kernel))
    attrs = dict(group=group, strides=list(strides), dilations=list(dilations), pads=list(pads))
    return x, w, attrs


def _small_chunks(monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    """Chunks of a few rows, shared between the threads even for small convolutions."""
    monkeypatch.setattr(conv_chunks, "CHUNK_ELEMENTS", 300)
    monkeypatch.setattr(conv_chunks, "THREADED_CHUNK_ELEMENTS", 300)
    monkeypatch.setattr(conv_chunks, "DEPTHWISE_CHUNK_ELEMENTS", 300)
    monkeypatch.setattr(parallel, "MIN_PARALLEL_ELEMENTS", 0)


@pytest.mark.parametrize("chunks", ["whole", "small"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", GEOMETRIES)
def test_float_conv_equals_the_direct_sums(name: str, threads: int, chunks: str, monkeypatch) -> None:
    """Float Conv on integer-valued inputs (exact in float32): every path, whole or cut into chunks,
    on one thread or two, gives the direct int64 sums plus the bias."""
    if chunks == "small":
        _small_chunks(monkeypatch, threads)
    x, w, attrs = _case(name, np.int8)
    bias = np.arange(w.shape[0], dtype=f32) - 2
    with parallel.using(threads):
        (got,) = conv.conv(x.astype(f32), w.astype(f32), bias, **attrs)
    want = _direct(x, w, attrs["group"], attrs["strides"], attrs["dilations"], attrs["pads"])
    want = want + bias.astype(np.int64).reshape((-1,) + (1,) * (x.ndim - 2))
    assert got.dtype == f32
    assert_same(got, want.astype(f32), name)


@pytest.mark.parametrize("chunks", ["whole", "small"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", GEOMETRIES)
def test_conv_integer_equals_the_direct_sums(name: str, threads: int, chunks: str, monkeypatch) -> None:
    """ConvInteger with zero points (per-tensor input, per-channel weights): the exact paths, the
    padding counted as the input's zero point (it contributes 0)."""
    if chunks == "small":
        _small_chunks(monkeypatch, threads)
    x, w, attrs = _case(name, np.uint8, seed=1)
    x_zp = np.array(131, np.uint8)
    w_zp = (np.arange(w.shape[0]) % 3 - 1).astype(np.int8)
    with parallel.using(threads):
        (got,) = conv.conv_integer(x, w, x_zp, w_zp, **attrs, scheme=VNNI)
    shifted = w.astype(np.int64) - w_zp.reshape((-1,) + (1,) * (w.ndim - 1))
    want = _direct(
        x.astype(np.int64) - 131, shifted, attrs["group"], attrs["strides"], attrs["dilations"], attrs["pads"]
    )
    assert got.dtype == np.int32
    assert_same(got, want.astype(np.int32), name)


def _qlinear_inputs(name: str, x_dtype: type, seed: int):
    x, w, attrs = _case(name, x_dtype, seed)
    m = w.shape[0]
    rng = np.random.default_rng(seed)
    inits = {
        "xs": f32(0.02), "xz": np.array(7 if x_dtype == np.uint8 else -3, x_dtype), "w": w,
        "ws": rng.uniform(0.002, 0.02, m).astype(f32), "wz": np.zeros(m, np.int8), "ys": f32(0.09),
        "yz": np.array(121 if x_dtype == np.uint8 else -6, x_dtype),
        "b": rng.integers(-3000, 3000, m).astype(np.int32),
    }  # fmt: skip
    return x, inits, attrs


@pytest.mark.parametrize("x_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("name", GEOMETRIES)
def test_qlinear_conv_equals_onnxruntime(name: str, x_dtype: type, monkeypatch) -> None:
    """QLinearConv with a bias and per-channel weight scales against this host's onnxruntime (VNNI:
    exact sums), in chunks on two threads: the requantization in each chunk's epilogue."""
    _small_chunks(monkeypatch, 2)
    x, inits, attrs = _qlinear_inputs(name, x_dtype, seed=2)
    w = inits["w"]
    model = node_model(
        "QLinearConv", [("x", x_dtype, x.shape)], inits, x_dtype, kernel_shape=list(w.shape[2:]), **attrs
    )
    (want,) = ort_run(model, {"x": x})
    order = ("xs", "xz", "w", "ws", "wz", "ys", "yz", "b")
    with parallel.using(2):
        (got,) = conv.qlinear_conv(x, *(inits[k] for k in order), **attrs, scheme=VNNI)
    assert_same(got, want, name)


def test_qlinear_conv_without_bias_or_output_zero_point_equals_onnxruntime() -> None:
    """No bias: the sums are requantized alone; no output zero point: the input's type and 0."""
    x, inits, attrs = _qlinear_inputs("grouped", np.uint8, seed=3)
    w = inits["w"]
    del inits["b"]
    model = node_model("QLinearConv", [("x", np.uint8, x.shape)], inits, np.uint8, kernel_shape=[3, 3], **attrs)
    (want,) = ort_run(model, {"x": x})
    order = ("xs", "xz", "w", "ws", "wz", "ys", "yz")
    (got,) = conv.qlinear_conv(x, *(inits[k] for k in order), **attrs, scheme=VNNI)
    assert_same(got, want, "no bias")
    zero = np.array(0, np.uint8)
    (got,) = conv.qlinear_conv(x, *(inits[k] for k in order[:-1]), None, **attrs, scheme=VNNI)
    (with_zero,) = conv.qlinear_conv(x, *(inits[k] for k in order[:-1]), zero, **attrs, scheme=VNNI)
    assert got.dtype == np.uint8
    assert_same(got, with_zero, "no output zero point")
    assert w.shape[0] == got.shape[1]


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_auto_pad_equals_onnxruntime(auto_pad: str) -> None:
    """``auto_pad`` resolved as the spec says (odd totals: SAME_UPPER puts the extra pad at the end)."""
    x, inits, attrs = _qlinear_inputs("dense-stride-3-tall", np.uint8, seed=4)
    del attrs["pads"]
    w = inits["w"]
    model = node_model(
        "QLinearConv", [("x", np.uint8, x.shape)], inits, np.uint8, kernel_shape=[5, 3], auto_pad=auto_pad, **attrs
    )
    (want,) = ort_run(model, {"x": x})
    order = ("xs", "xz", "w", "ws", "wz", "ys", "yz", "b")
    (got,) = conv.qlinear_conv(x, *(inits[k] for k in order), **attrs, auto_pad=auto_pad, scheme=VNNI)
    assert_same(got, want, auto_pad)
    assert w.shape[2:] == (5, 3)


def test_conv_defaults_read_the_kernel_from_the_weights() -> None:
    """No attributes: kernel shape from the weights, strides and dilations 1, no pads, one group."""
    x, w, _ = _case("dense-3x3", np.int8)
    (got,) = conv.conv(x.astype(f32), w.astype(f32))
    assert_same(got, _direct(x, w, 1, (1, 1), (1, 1), [0] * 4).astype(f32), "defaults")
    (got,) = conv.conv_integer(x, w, scheme=REFERENCE)
    assert_same(got, _direct(x, w, 1, (1, 1), (1, 1), [0] * 4).astype(np.int32), "no zero points")


def test_float64_conv_stays_float64() -> None:
    """A float64 convolution sums in float64: values past float32's integers stay exact."""
    x = np.full((1, 2, 3, 3), 2.0**26 + 1)
    w = np.ones((1, 2, 1, 1))
    (got,) = conv.conv(x, w)
    assert got.dtype == np.float64
    assert got[0, 0, 0, 0] == 2 * (2.0**26 + 1)


@pytest.mark.parametrize(
    ("auto_pad", "size", "kernel", "stride", "dilation", "want"),
    [
        ("SAME_UPPER", 7, 4, 1, 1, [1, 2]),  # total 3: the extra pad at the end
        ("SAME_LOWER", 7, 4, 1, 1, [2, 1]),
        ("SAME_UPPER", 7, 3, 2, 1, [1, 1]),  # out 4: (4-1)*2 + 3 - 7 = 2
        ("SAME_UPPER", 8, 3, 2, 1, [0, 1]),  # out 4: (4-1)*2 + 3 - 8 = 1
        ("SAME_LOWER", 8, 3, 2, 1, [1, 0]),
        ("SAME_UPPER", 6, 3, 1, 2, [2, 2]),  # dilated: (3-1)*2 + 1 - 1 = 4
        ("SAME_UPPER", 5, 1, 3, 1, [0, 0]),  # a negative total is no pad
        ("VALID", 7, 3, 1, 1, [0, 0]),
        ("NOTSET", 7, 3, 1, 1, [3, 4]),  # the given pads
    ],
)
def test_conv_pads(auto_pad: str, size: int, kernel: int, stride: int, dilation: int, want: list[int]) -> None:
    assert conv_chunks.conv_pads((size,), (kernel,), auto_pad, [3, 4], (stride,), (dilation,)) == want


def test_conv_pads_of_two_axes_and_no_pads() -> None:
    """Begin pads of every axis, then end pads; NOTSET without pads is no pad."""
    got = conv_chunks.conv_pads((7, 8), (4, 3), "SAME_UPPER", None, (1, 2), (1, 1))
    assert got == [1, 0, 2, 1]
    assert conv_chunks.conv_pads((7, 8), (3, 3), "NOTSET", None, (1, 1), (1, 1)) == [0, 0, 0, 0]
    assert conv_chunks.conv_pads((7, 8), (3, 3), "NOTSET", [], (1, 1), (1, 1)) == [0, 0, 0, 0]


def test_output_shape() -> None:
    """``(size - ((k - 1) * dilation + 1)) // stride + 1`` per axis."""
    assert conv_chunks.output_shape((9, 10, 7), (3, 2, 1), (2, 3, 1), (1, 2, 1)) == (4, 3, 7)


@pytest.mark.parametrize(
    ("first", "step", "count", "size", "want"),
    [
        (0, 1, 5, 5, (0, 5)),
        (-2, 1, 6, 3, (2, 5)),  # two of padding before, one after
        (-3, 2, 5, 4, (2, 4)),  # -3 -1 [1 3] 5
        (-4, 3, 4, 5, (2, 3)),  # -4 -1 [2] 5
        (1, 2, 4, 6, (0, 3)),  # [1 3 5] 7
        (4, 1, 3, 4, (0, 0)),  # starts past the input
        (-5, 1, 3, 4, (3, 3)),  # ends before the input
        (3, 1, 1, 4, (0, 1)),
    ],
)
def test_inside(first: int, step: int, count: int, size: int, want: tuple[int, int]) -> None:
    """The positions ``first + k * step`` inside ``[0, size)``."""
    assert conv_chunks._inside(first, step, count, size) == want


@pytest.mark.parametrize("offset", [0, 3])
@pytest.mark.parametrize(
    ("rows", "cols", "shape"),
    [
        ((0, 1), (0, 1), (7, 8)),  # whole padded rows and columns
        ((1, 1), (2, 1), (4, 6)),
        ((0, 2), (1, 3), (4, 3)),
        ((2, 1), (0, 1), (3, 8)),  # whole image rows: the shifted copy, shifted left
        ((1, 1), (3, 1), (3, 5)),
        ((5, 1), (0, 1), (2, 8)),  # ends in the bottom padding
        ((0, 1), (6, 1), (7, 2)),  # only the right padding and one column
        ((5, 3), (0, 1), (1, 8)),
        ((0, 1), (1, 1), (5, 4)),  # as many rows as the image has columns
        ((1, 1), (0, 1), (3, 3)),  # as many columns as the image has channels
    ],
)
def test_source_fill_equals_slices_of_the_padded_input(rows, cols, shape, offset: int) -> None:
    """``Source.fill`` writes what slicing the zero-padded ``x - offset`` gives (the padding 0)."""
    rng = np.random.default_rng(5)
    x = rng.integers(1, 50, (2, 3, 4, 5)).astype(np.int64)
    pads = [1, 2, 2, 1]
    padded = np.pad(x - offset, [(0, 0), (0, 0), (1, 2), (2, 1)])
    source = Source(x, pads, offset)
    assert source.padded_spatial == (7, 8)
    out = np.full((1, 3, *shape), -99.0)
    source.fill(out, (1, 2), rows, cols)
    (r0, rs), (c0, cs) = rows, cols
    want = padded[1:2, :, r0 : r0 + (shape[0] - 1) * rs + 1 : rs, c0 : c0 + (shape[1] - 1) * cs + 1 : cs]
    assert_same(out, want.astype(np.float64), f"{rows} {cols}")


@pytest.mark.parametrize(("cols", "width"), [((0, 2), 5), ((2, 1), 4), ((3, 1), 5)])
def test_source_fill_of_as_many_columns_as_the_image(cols: tuple[int, int], width: int) -> None:
    """Five channels, five columns, four of padding each side: every second padded column (five of
    them, like the image's), four columns (as many as the channels are not), five shifted ones."""
    x = np.arange(1, 1 + 5 * 4 * 5, dtype=np.int64).reshape(1, 5, 4, 5)
    padded = np.pad(x, [(0, 0), (0, 0), (0, 0), (4, 4)])
    out = np.full((1, 5, 4, width), -1.0)
    Source(x, [0, 4, 0, 4], 0).fill(out, (0, 1), (0, 1), cols)
    c0, step = cols
    assert_same(out, padded[..., c0 : c0 + (width - 1) * step + 1 : step].astype(np.float64), f"{cols}")


def test_source_fill_shifted_right_and_wholly_outside() -> None:
    """Whole image rows read from a negative column (left padding) and rows wholly in the padding."""
    x = np.arange(1, 2 * 4 * 3 + 1, dtype=np.int64).reshape(1, 2, 4, 3)
    source = Source(x, [1, 2, 0, 0], 0)
    out = np.full((1, 2, 3, 3), -1.0)
    source.fill(out, (0, 1), (1, 1), (1, 1))  # padded rows 1..3, columns 1..3: image columns -1..1
    want = np.pad(x, [(0, 0), (0, 0), (1, 0), (2, 0)])[:, :, 1:4, 1:4]
    assert_same(out, want.astype(np.float64), "shifted right")
    out[...] = -1
    source.fill(out, (0, 1), (5, 1), (0, 1))
    assert not out.any()


@pytest.mark.parametrize("x_dtype", [np.uint8, np.float32])
def test_to_padded_and_convert(x_dtype: type) -> None:
    """``x - offset`` in the scratch type, zero-padded; no offset is a plain copy."""
    x = np.arange(12, dtype=x_dtype).reshape(1, 1, 3, 4)
    got = conv_chunks.to_padded(x, [1, 0, 0, 2], np.int64(5), np.float64)
    want = np.pad(x.astype(np.float64) - 5, [(0, 0), (0, 0), (1, 0), (0, 2)])
    assert got.dtype == np.float64
    assert_same(got, want, "padded")
    got = conv_chunks.to_padded(x, [0, 0, 0, 0], 0, np.float32)
    assert_same(got, x.astype(np.float32), "not padded")
    out = np.empty(3, np.float32)
    conv_chunks.convert(np.array([250, 3, 7], np.uint8), np.array([1, 2, 3]), out)
    assert out.tolist() == [249, 1, 4]


@pytest.mark.parametrize(
    ("n", "first", "per_row", "budget", "threads", "want"),
    [
        (3, 4, 10, 100, 1, [(0, 2, 0, 4), (2, 3, 0, 4)]),  # 10 rows: 2 records of 4 rows
        (1, 7, 10, 30, 1, [(0, 1, 0, 3), (0, 1, 3, 6), (0, 1, 6, 7)]),  # one record: 3 rows a chunk
        (2, 5, 10, 20, 1, [(0, 1, 0, 2), (0, 1, 2, 4), (0, 1, 4, 5), (1, 2, 0, 2), (1, 2, 2, 4), (1, 2, 4, 5)]),
        (2, 3, 0, 5, 1, [(0, 1, 0, 3), (1, 2, 0, 3)]),  # no scratch per row: as if one element
        (4, 3, 10, 1000, 2, [(0, 2, 0, 3), (2, 4, 0, 3)]),  # a multiple of the threads
        (5, 2, 10, 1000, 2, [(0, 3, 0, 2), (3, 5, 0, 2)]),
        (1, 6, 10, 1000, 2, [(0, 1, 0, 3), (0, 1, 3, 6)]),  # one record: its rows shared
        (3, 2, 1, 2, 2, [(0, 1, 0, 2), (1, 2, 0, 2), (2, 3, 0, 2)]),  # already more chunks than threads
    ],
)
def test_chunk_spans(n, first, per_row, budget, threads, want, monkeypatch) -> None:
    """Chunks of records and rows of about the budget (worked by hand), a multiple of the threads."""
    monkeypatch.setattr(parallel, "MIN_PARALLEL_ELEMENTS", 0)
    with parallel.using(threads):
        assert conv_chunks.chunk_spans(n, first, per_row, budget) == want


def test_chunk_spans_default_budgets_and_the_parallel_threshold(monkeypatch) -> None:
    """One thread: ``CHUNK_ELEMENTS``; several: ``THREADED_CHUNK_ELEMENTS``; a small convolution on
    several threads is not split for them."""
    monkeypatch.setattr(conv_chunks, "CHUNK_ELEMENTS", 40)
    monkeypatch.setattr(conv_chunks, "THREADED_CHUNK_ELEMENTS", 80)
    assert conv_chunks.chunk_spans(4, 2, 10) == [(0, 2, 0, 2), (2, 4, 0, 2)]
    monkeypatch.setattr(parallel, "MIN_PARALLEL_ELEMENTS", 4 * 2 * 10 + 1)
    with parallel.using(2):
        assert conv_chunks.chunk_spans(4, 2, 10) == [(0, 4, 0, 2)]
    monkeypatch.setattr(parallel, "MIN_PARALLEL_ELEMENTS", 4 * 2 * 10)
    with parallel.using(2):
        assert conv_chunks.chunk_spans(4, 2, 10) == [(0, 2, 0, 2), (2, 4, 0, 2)]


def test_tap_view() -> None:
    """The input slice of a tap: rows from ``o0 * stride + tap * dilation``, columns from the tap."""
    xp = np.arange(2 * 1 * 9 * 8).reshape(2, 1, 9, 8)
    chunk = Chunk((1, 2), 1, (1, 2, 3), (2, 3), (2, 1))
    got = chunk.tap_view(xp, (1, 2))
    assert_same(got, xp[1:2, :, 4:7:2, 2:9:3], "tap (1, 2)")


@pytest.mark.parametrize(
    ("kind", "args"),
    [
        (conv_core.Im2colPath, (False, True, 4, 4, 1, (1, 1), 8, 64)),  # padded copy
        (conv_core.Im2colPath, (True, True, 1, 4, 3, (1, 1), 8, 64)),  # one group
        (conv_core.NhwcPath, (True, True, 8, 8, 1, (1, 1), 8, 32)),  # tiny depthwise, exact
        (conv_core.NhwcPath, (True, False, 8, 8, 1, (2, 2), 8, 32)),
        (conv_core.GroupedRowPath, (True, True, 8, 8, 1, (1, 1), 8, 33)),
        (conv_core.GroupedRowPath, (True, True, 8, 8, 2, (1, 1), 8, 16)),  # two outputs per channel
        (conv_core.GroupedRowPath, (True, True, 2, 8, 3, (1, 1), 8, 16)),  # grouped, not depthwise
        (conv_core.FlatPath, (True, False, 8, 8, 1, (1, 1), 64, 640)),
        (conv_core.RowsPath, (True, False, 8, 8, 1, (1, 1), 63, 630)),
        (conv_core.RowsPath, (True, False, 8, 8, 1, (1, 2), 64, 640)),
        (conv_core.NhwcPath, (True, False, 8, 8, 1, (1, 2), 8, 640)),  # channels >= columns
        (conv_core.RowsPath, (True, False, 8, 8, 1, (1, 2), 9, 640)),
        (conv_core.RowsPath, (True, False, 4, 4, 2, (1, 2), 2, 640)),  # two outputs per channel
        (conv_core.RowsPath, (True, False, 8, 8, 2, (1, 1), 8, 16)),
    ],
)
def test_choose_path(kind: type, args: tuple) -> None:
    """The table of ``conv_core``'s docstring, on each side of its thresholds."""
    assert conv_core.choose_path(*args) is kind


@pytest.mark.parametrize(("group", "cg", "want"), [(8, 1, 2), (7, 1, 1), (8, 2, 1), (1, 4, 1)])
def test_groups_per_block(group: int, cg: int, want: int) -> None:
    assert conv_gemm.groups_per_block(group, cg) == want


def test_block_weights() -> None:
    """Four groups of two outputs and one channel as two blocks: each block's two groups on its
    diagonal, zeros elsewhere."""
    w = np.arange(1, 9, dtype=np.int64).reshape(8, 1, 1, 1)
    got = conv_gemm.block_weights(w, 4, 2)[..., 0, 0]
    want = np.array([[[1, 0], [2, 0], [0, 3], [0, 4]], [[5, 0], [6, 0], [0, 7], [0, 8]]])
    assert_same(got, want, "blocks")


def test_row_classes() -> None:
    """Kernel rows grouped by ``i * dilation % stride``, with shifts ``i * dilation // stride``."""
    w = np.arange(1 * 2 * 1 * 5 * 2, dtype=np.int64).reshape(1, 2, 1, 5, 2)
    classes = conv_gemm.row_classes(w, 2, 1, np.float64)
    assert [(c.residue, c.shifts) for c in classes] == [(0, (0, 1, 2)), (1, (0, 1))]
    assert classes[0].weights.shape == (1, 3 * 2, 2)
    assert classes[0].weights.dtype == np.float64
    assert_same(classes[1].weights[0, :2], w[0, :, 0, 1, :].astype(np.float64), "kernel row 1")
    assert_same(classes[0].weights[0, 4:], w[0, :, 0, 4, :].astype(np.float64), "kernel row 4")
    classes = conv_gemm.row_classes(w, 3, 2, np.float32)  # rows 0..4 read 0, 2, 4, 6, 8
    assert [(c.residue, c.shifts) for c in classes] == [(0, (0, 2)), (1, (1,)), (2, (0, 2))]


def _large_sums(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Inputs whose sums pass 2**24 and are odd: float32 would round them, the kernels must not."""
    x = rng.integers(0, 2, (1, 64, 6, 6)).astype(np.uint8)  # x - 255: -255 or -254
    w = rng.integers(-128, -126, (3, 64, 3, 3)).astype(np.int8)  # -128 or -127
    w[1] = -w[1] - 1  # 127 or 126: sums of both signs
    return x, w


def test_conv_integer_past_float32_integers_equals_the_direct_sums() -> None:
    """|sums| of about 1.9e7 > 2**24, from the input zero point's side of the range: float64 sums."""
    x, w = _large_sums(np.random.default_rng(6))
    (got,) = conv.conv_integer(x, w, np.array(255, np.uint8), np.array(0, np.int8), scheme=VNNI)
    want = _direct(x.astype(np.int64) - 255, w, 1, (1, 1), (1, 1), [0] * 4)
    assert np.abs(want).max() > 2**24
    assert_same(got, want.astype(np.int32), "past 2**24")


def test_qlinear_conv_past_float32_integers_equals_onnxruntime() -> None:
    """The same sums requantized: no float32 epilogue, the float64 requantization."""
    x, w = _large_sums(np.random.default_rng(7))
    sums = _direct(x.astype(np.int64) - 255, w, 1, (1, 1), (1, 1), [0] * 4)
    bias = -np.median(sums, axis=(0, 2, 3)).astype(np.int32)  # the outputs about the zero point
    inits = {
        "xs": f32(0.5), "xz": np.array(255, np.uint8), "w": w, "ws": np.array([0.06, 0.09, 0.1], f32),
        "wz": np.zeros(3, np.int8), "ys": f32(1.5), "yz": np.array(128, np.uint8), "b": bias,
    }  # fmt: skip
    model = node_model("QLinearConv", [("x", np.uint8, x.shape)], inits, np.uint8, kernel_shape=[3, 3])
    (want,) = ort_run(model, {"x": x})
    order = ("xs", "xz", "w", "ws", "wz", "ys", "yz", "b")
    (got,) = conv.qlinear_conv(x, *(inits[k] for k in order), scheme=VNNI)
    assert len(np.unique(want)) > 20
    assert_same(got, want, "past 2**24")


def _tap_by_tap(x: np.ndarray, w: np.ndarray, strides, dilations, pads) -> np.ndarray:
    """A 2-D depthwise convolution (one output per channel) summed tap by tap in ``x``'s type, row-major
    taps: ``acc = x_0 w_0``, then ``acc = acc + x_t w_t``, each product and sum rounded to the type."""
    padded = np.pad(x, [(0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])])
    kh, kw = w.shape[2:]
    out = [(padded.shape[2 + a] - (w.shape[2 + a] - 1) * dilations[a] - 1) // strides[a] + 1 for a in range(2)]
    acc = None
    for i, j in itertools.product(range(kh), range(kw)):
        rows = slice(i * dilations[0], i * dilations[0] + (out[0] - 1) * strides[0] + 1, strides[0])
        cols = slice(j * dilations[1], j * dilations[1] + (out[1] - 1) * strides[1] + 1, strides[1])
        term = padded[:, :, rows, cols] * w[:, 0, i, j].reshape(1, -1, 1, 1)
        acc = term if acc is None else acc + term
    return acc


@pytest.mark.parametrize("name", ["depthwise-tiny-2x3", "depthwise-wide", "depthwise-many-channels", "depthwise-rows"])
def test_float_depthwise_sums_tap_by_tap_in_float32(name: str) -> None:
    """The float depthwise paths (channels last, flat, channels first) multiply-accumulate tap by tap
    in the input's precision: float32 rounding after each product and each sum, not a float64 sum."""
    n, c, _, _, spatial, kernel, strides, dilations, pads = GEOMETRIES[name]
    rng = np.random.default_rng(8)
    x = rng.normal(size=(n, c, *spatial)).astype(f32)
    w = rng.normal(size=(c, 1, *kernel)).astype(f32)
    (got,) = conv.conv(x, w, group=c, strides=list(strides), dilations=list(dilations), pads=list(pads))
    want = _tap_by_tap(x, w, strides, dilations, pads)
    assert want.dtype == f32
    assert not np.array_equal(
        want, _tap_by_tap(x.astype(np.float64), w.astype(np.float64), strides, dilations, pads).astype(f32)
    )
    assert_same(got, want, name)


# neon.py: MLAS's ARM64 QLinearAdd, worked by hand from its fixed-point and float algorithms


@pytest.mark.parametrize(
    ("ratios", "want"),
    [
        ((2.0**-14, 0.5), (22, 1 << 8, 1 << 21)),  # the smallest ratio kept: shift from the larger one
        ((0.75, 0.5), (22, 3 << 20, 1 << 21)),
        ((255.0, 1.0), (14, 255 << 14, 1 << 14)),
        ((2.0**-10, 2.0**-10), (31, 1 << 21, 1 << 21)),  # the largest shift
        ((2.0**-11, 2.0**-11), None),  # shift 32
        ((256.0, 1.0), None),  # a ratio of 256 or more
        ((2.0**-15, 0.5), None),  # a ratio under 2**-14
        ((np.nextafter(f32(2), f32(0)), 0.5), None),  # (2 - 2**-23) * 2**21 rounds to 2**22
        ((0.5, np.nextafter(f32(2), f32(0))), None),  # the same for the second ratio
        ((np.nextafter(f32(2), f32(0)), 2.0**-14), None),
    ],
)
def test_neon_add_parameters(ratios, want) -> None:
    from pytest_qaccuracy.backend.kernels import neon

    assert neon.add_parameters(f32(ratios[0]), f32(ratios[1])) == want


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [
        (9, 20, 99),  # (-1) * 0.5 = -0.5: half away from zero, -1
        (11, 20, 101),  # +0.5: 1
        (9, 21, 100),  # -0.5 + 0.25 = -0.25: 0
        (7, 19, 98),  # -1.5 - 0.25 = -1.75: -2
        (8, 21, 99),  # -1 + 0.25 = -0.75: -1
        (255, 20, 223),  # 123.0: 100 + 123
        (0, 20, 95),  # -4.5: -5
    ],
)
def test_neon_add_rounds_half_away_from_zero(a: int, b: int, want: int) -> None:
    """Ratios 0.5 and 0.25 (shift 22): ``(a - 10) / 2 + (b - 20) / 4`` rounded half away from zero
    (``vrshlq_s32``), plus the output zero point 100."""
    from pytest_qaccuracy.backend.kernels import neon

    got = neon.add(
        np.array([a], np.uint8), f32(0.5), np.uint8(10), np.array([b], np.uint8), f32(0.25), np.uint8(20),
        f32(1.0), np.uint8(100), np.dtype(np.uint8),
    )  # fmt: skip
    assert got.tolist() == [want]


def test_neon_add_float_fallback_rounds_in_float32() -> None:
    """A ratio of 1000 takes MLAS's scalar float loop, float32 throughout: 2.4999998 + 101 is 103.5 in
    float32, rounded half to even: 104 (103 in float64); twice that is 106, none is 101."""
    from pytest_qaccuracy.backend.kernels import neon

    sa = np.nextafter(f32(2.5), f32(0))
    got = neon.add(
        np.array([11, 10, 12], np.int8), sa, np.int8(10), np.array([3, 3, 3], np.int8), f32(1000.0), np.int8(3),
        f32(1.0), np.int8(101), np.dtype(np.int8),
    )  # fmt: skip
    assert got.tolist() == [104, 101, 106]


def _neon_add(a, a_s, a_zp, b, b_s, b_zp, c_s, c_zp, dtype=np.int8) -> np.ndarray:
    from pytest_qaccuracy.backend.kernels import neon

    return neon.add(
        np.asarray(a, dtype), f32(a_s), dtype(a_zp), np.asarray(b, dtype), f32(b_s), dtype(b_zp), f32(c_s), dtype(c_zp),
        np.dtype(dtype),
    )  # fmt: skip


def test_neon_add_divides_both_scales_by_the_output_scale() -> None:
    """Scales 1 and 0.5 over an output scale of 2: the ratios 0.5 and 0.25 of the rounding test above,
    so the same outputs (``a_s * c_s`` would make the ratios 2 and 1)."""
    got = _neon_add([9, 11, 7, 255], 1.0, 10, [20, 20, 19, 20], 0.5, 20, 2.0, 100, np.uint8)
    assert got.dtype == np.uint8
    assert got.tolist() == [99, 101, 98, 223]


def test_neon_add_reads_one_element_parameters_as_scalars() -> None:
    """Scales and zero points of shape (1,) (as some models store them) are scalars: 0-d inputs give a
    0-d output, with no deprecated array-to-scalar conversion on the way."""
    import warnings

    from pytest_qaccuracy.backend.kernels import neon

    one = lambda v, t: np.array([v], t)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = neon.add(
            np.array(11, np.uint8), one(0.5, f32), one(10, np.uint8), np.array(20, np.uint8), one(0.25, f32),
            one(20, np.uint8), one(1.0, f32), one(100, np.uint8), np.dtype(np.uint8),
        )  # fmt: skip
    assert got.shape == ()
    assert int(got) == 101


def test_neon_add_float_fallback_divides_and_saturates_around_the_zero_point() -> None:
    """A ratio under 2**-14 (2**-16 / 0.5) takes the float loop: ``(2**-16 xa + 1.0 xb) / 0.5 + 20``
    with ``xa = 0``: xb = 6, -6 give 32, 8; xb = 100 gives 220, clamped to 127 before the zero point
    is added (``hi - zp`` = 107); xb = -100 gives -180, clamped to -128 (``lo - zp`` = -148)."""
    got = _neon_add([0, 0, 0, 0], 2.0**-16, 0, [6, -6, 100, -100], 1.0, 0, 0.5, 20)
    assert got.dtype == np.int8
    assert got.tolist() == [32, 8, 127, -128]


def test_neon_add_float_fallback_rounds_the_quotient_to_float32() -> None:
    """``sa / sc`` = (12681981 / 2**24) / (6341039 / 2**22) lies 0.64 * 2**-26 under 1/2 - 2**-18: float32
    rounds it to 1/2 - 2**-18 exactly, and 101 + that is 101.5 - 2**-18, halfway between two float32
    values: to even, 101.5, then rounded half to even, 102. Kept in float64 the quotient stays under
    the halfway point: 101.5 - 2**-17, then 101."""
    from fractions import Fraction

    sa, sc = f32(12681981 / 2**24), f32(6341039 / 2**22)
    quotient = Fraction(12681981, 2**24) / Fraction(6341039, 2**22)
    below = Fraction(1, 2) - Fraction(1, 2**18) - quotient
    assert Fraction(1, 2**46) < below < Fraction(1, 2**26)  # float32 (ulp 2**-25 there) rounds it up
    got = _neon_add([11], sa, 10, [3], 2000.0, 3, sc, 101)  # 2000 / sc > 256: the float loop
    assert got.tolist() == [102]


@pytest.mark.parametrize("c_zp", [3, -7])
def test_neon_mul_by_hand(c_zp: int) -> None:
    """``(a - za)(b - zb) * 0.5 + zc`` rounded half to even, saturated to int8: products 1, 3, -1, -3,
    1000, -1000 give 3.5, 4.5, 2.5, 1.5 (+ 3: 4, 4, 2, 2) and saturate at 127 and -128."""
    from pytest_qaccuracy.backend.kernels import neon

    a = np.array([6, 8, 4, 2, 105, -95], np.int8)  # a - 5: 1, 3, -1, -3, 100, -100
    b = np.array([-9, -9, -9, -9, 0, 0], np.int8)  # b + 10: 1, 1, 1, 1, 10, 10
    got = neon.mul(a, np.int8(5), b, np.int8(-10), np.array([0.5], f32), np.int8(c_zp), np.dtype(np.int8))
    assert got.dtype == np.int8
    want = {3: [4, 4, 2, 2, 127, -128], -7: [-6, -6, -8, -8, 127, -128]}[c_zp]  # -6.5, -5.5, -7.5, -8.5
    assert got.tolist() == want


# conv_ort.py: the session cache and the fork handler, called in this process


def _conv_bytes(strides: tuple[int, int]) -> bytes:
    from pytest_qaccuracy.backend.kernels import conv_ort

    return conv_ort.conv_model(np.ones((1, 1, 2, 2), f32), 1, strides, (1, 1), [0, 0, 0, 0])


def test_session_for_keeps_one_session_per_array_key_and_threads(monkeypatch) -> None:
    """A session per (weight array, key, threads): the same three give the cached session, another
    key, thread count or array a session of its own model; dropping the array drops its sessions."""
    import gc

    from pytest_qaccuracy.backend.kernels import conv_ort

    monkeypatch.setattr(conv_ort, "_SESSIONS", {})
    a, b = np.zeros(3), np.zeros(3)
    first = conv_ort.session_for(a, "k", lambda: _conv_bytes((1, 1)), 1)
    assert conv_ort.session_for(a, "k", lambda: pytest.fail("rebuilt"), 1) is first
    other_key = conv_ort.session_for(a, "j", lambda: _conv_bytes((2, 2)), 1)
    other_threads = conv_ort.session_for(a, "k", lambda: _conv_bytes((1, 1)), 2)
    other_array = conv_ort.session_for(b, "k", lambda: _conv_bytes((2, 2)), 1)
    assert len({id(first), id(other_key), id(other_threads), id(other_array)}) == 4
    x = np.arange(16, dtype=f32).reshape(1, 1, 4, 4)
    assert first.run(None, {"x": x})[0].shape == (1, 1, 3, 3)
    assert other_key.run(None, {"x": x})[0].shape == (1, 1, 2, 2)  # its own model, strides 2
    assert other_array.run(None, {"x": x})[0].shape == (1, 1, 2, 2)
    assert conv_ort.session_for(a, "j", lambda: pytest.fail("rebuilt"), 1) is other_key
    assert len(conv_ort._SESSIONS) == 4
    del a
    gc.collect()
    assert len(conv_ort._SESSIONS) == 1
    assert conv_ort.session_for(b, "k", lambda: pytest.fail("rebuilt"), 1) is other_array


def test_session_for_a_source_without_weak_references_is_not_cached(monkeypatch) -> None:
    from pytest_qaccuracy.backend.kernels import conv_ort

    monkeypatch.setattr(conv_ort, "_SESSIONS", {})
    source = (1, 2)  # tuples take no weak reference
    first = conv_ort.session_for(source, "k", lambda: _conv_bytes((1, 1)), 1)
    assert conv_ort.session_for(source, "k", lambda: _conv_bytes((1, 1)), 1) is not first
    assert conv_ort._SESSIONS == {}


def test_forget_in_child_keeps_the_parents_sessions_and_makes_a_new_lock(monkeypatch) -> None:
    """After a fork the child drops the parent's sessions into ``_ABANDONED`` (never destroyed) and
    takes a fresh lock, even when the parent's was held."""
    import threading

    from pytest_qaccuracy.backend.kernels import conv_ort

    held = threading.Lock()
    held.acquire()
    monkeypatch.setattr(conv_ort, "_LOCK", held)
    monkeypatch.setattr(conv_ort, "_SESSIONS", {(1, "a"): (None, "first"), (2, "b"): (None, "second")})
    monkeypatch.setattr(conv_ort, "_ABANDONED", ["older"])
    conv_ort._forget_in_child()
    assert conv_ort._SESSIONS == {}
    assert conv_ort._ABANDONED == ["older", "first", "second"]
    assert conv_ort._LOCK is not held
    assert conv_ort._LOCK.acquire(blocking=False)
    conv_ort._LOCK.release()


def test_conv_model() -> None:
    """The one-node float32 Conv: its attributes, free batch and spatial axes, opset 13, IR 7."""
    import onnx

    from pytest_qaccuracy.backend.kernels import conv_ort

    w = np.arange(2 * 3 * 2 * 1, dtype=np.int64).reshape(2, 3, 2, 1)
    model = onnx.load_from_string(conv_ort.conv_model(w, 2, (2, 1), (1, 3), [1, 0, 0, 1]))
    node = model.graph.node[0]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs == {"group": 2, "strides": [2, 1], "dilations": [1, 3], "pads": [1, 0, 0, 1], "kernel_shape": [2, 1]}
    weights = onnx.numpy_helper.to_array(model.graph.initializer[0])
    assert weights.dtype == f32
    assert_same(weights, w.astype(f32), "weights")
    dims = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["n", 6, "s0", "s1"]
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 13)]
    assert model.ir_version == 7


@pytest.mark.parametrize("preset", ["onnxruntime-avx2", "onnxruntime-arm64", "onnxruntime-arm64-neon", "tflite"])
@pytest.mark.parametrize("name", ["dense-3x3", "depthwise-odd-groups"])
def test_conv_integer_sums_exactly_under_every_preset(name: str, preset: str) -> None:
    """onnxruntime's ConvInteger sums exactly: no int16 pair saturation (AVX2) or wrap (ARM64), even
    on inputs of 255 next to weights of -128, where those would change the sums."""
    x, w, attrs = _case(name, np.uint8, seed=9)
    x[:, :, ::2] = 255
    w[..., ::2] = -128
    x_zp = np.array(0, np.uint8)
    (got,) = conv.conv_integer(x, w, x_zp, np.array(0, np.int8), **attrs, scheme=get_scheme(preset))
    geometry = (attrs["group"], attrs["strides"], attrs["dilations"], attrs["pads"])
    assert_same(got, _direct(x, w, *geometry).astype(np.int32), preset)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
def test_conv_and_conv_integer_read_auto_pad(auto_pad: str) -> None:
    """Float Conv and ConvInteger resolve ``auto_pad`` too: kernel 4 x 3, stride 1, so the pads are
    (1, 2) rows and (1, 1) columns, the odd one at the end for SAME_UPPER, at the start for SAME_LOWER."""
    rng = np.random.default_rng(10)
    x = random_q(rng, np.uint8, (1, 2, 6, 5))
    w = random_q(rng, np.int8, (3, 2, 4, 3))
    pads = [1, 1, 2, 1] if auto_pad == "SAME_UPPER" else [2, 1, 1, 1]
    want = _direct(x, w, 1, (1, 1), (1, 1), pads)
    assert want.shape[2:] == (6, 5)
    (got,) = conv.conv(x.astype(f32), w.astype(f32), auto_pad=auto_pad)
    assert_same(got, want.astype(f32), f"Conv {auto_pad}")
    (got,) = conv.conv_integer(x, w, auto_pad=auto_pad, scheme=VNNI)
    assert_same(got, want.astype(np.int32), f"ConvInteger {auto_pad}")


def _conv_of(kind: type, c: int, m: int, group: int, kernel: tuple[int, int], strides=(1, 1)) -> conv_core.ConvPath:
    x = np.zeros((2, c, 9, 10), f32)
    source = Source(x, [1, 1, 1, 1], 0) if kind is not conv_core.Im2colPath else x
    w = np.ones((m, c // group, *kernel), f32)
    return kind(conv_core.Conv(source, w, group, strides, (1, 1), f32, (9, 10)))


def test_scratch_per_row_and_budget_of_each_path() -> None:
    """Scratch per output row, record and column, worked by hand from each path's buffers: im2col's
    columns (taps x C) and output (M); the row path's columns (taps x C) and kernel rows' partial
    sums (kh x M); the depthwise paths' input rows (C x strides) and 2 or 3 output-sized arrays.
    The tap-loop paths that read rows want a smaller budget; the flat one the default."""
    assert _conv_of(conv_core.Im2colPath, 4, 6, 2, (3, 2)).scratch_per_row() == 6 * 4 + 6
    assert _conv_of(conv_core.GroupedRowPath, 4, 6, 2, (3, 2)).scratch_per_row() == 6 * 4 + 3 * 6
    assert _conv_of(conv_core.RowsPath, 4, 8, 4, (3, 3), (2, 3)).scratch_per_row() == 4 * 6 + 2 * 8
    assert _conv_of(conv_core.NhwcPath, 4, 4, 4, (3, 3), (2, 1)).scratch_per_row() == 4 * 2 + 3 * 4
    assert _conv_of(conv_core.RowsPath, 4, 4, 4, (3, 3)).budget() == conv_chunks.DEPTHWISE_CHUNK_ELEMENTS
    assert _conv_of(conv_core.NhwcPath, 4, 4, 4, (3, 3)).budget() == conv_chunks.DEPTHWISE_CHUNK_ELEMENTS
    assert _conv_of(conv_core.FlatPath, 4, 4, 4, (3, 3)).budget() is None
    assert _conv_of(conv_core.Im2colPath, 4, 6, 2, (3, 2)).budget() is None


def test_grouped_row_path_blocks() -> None:
    """One-channel groups in pairs (an even count), wider groups alone; the dense blocks' shapes."""
    path = _conv_of(conv_core.GroupedRowPath, 6, 12, 6, (3, 3))
    assert path.blocks() == 3
    assert path.source.x.shape == (2, 3, 2, 9, 10)
    assert path.dense_weights(3).shape == (3, 4, 2, 3, 3)
    path = _conv_of(conv_core.GroupedRowPath, 6, 6, 3, (3, 3))
    assert path.blocks() == 3
    assert path.source.x.shape == (2, 3, 2, 9, 10)


def test_conv_properties() -> None:
    x = np.zeros((1, 6, 5, 5), f32)
    c = conv_core.Conv(Source(x, [0] * 4, 0), np.ones((3, 2, 2, 3), f32), 3, (1, 1), (1, 1), f32, (4, 3))
    assert c.kernel_shape == (2, 3)
    assert c.channels == 6
    assert c.taps == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert conv_core.Conv(x, c.w, 3, (1, 1), (1, 1), f32, (4, 3)).channels == 6


@pytest.mark.parametrize("preset", ["onnx-reference", "onnxruntime-vnni"])
def test_qlinear_conv_bias_past_float32_integers(preset: str) -> None:
    """Sums of -255 * 128 * 514 (under 2**24, exact in float32) plus a bias of 2**24 + 1, which float32
    rounds to 2**24: the sum and bias must be added in integers. 257 * 0.498 = 127.99 is 128, where
    256 * 0.498 = 127.49 would be 127; against onnx.reference and onnxruntime."""
    from onnx.reference import ReferenceEvaluator

    x = np.full((1, 514, 1, 2), 255, np.uint8)
    x[0, 0, 0, 1] = 254  # 385 * 0.498 = 191.7: 192
    inits = {
        "xs": f32(1), "xz": np.array(0, np.uint8), "w": np.full((1, 514, 1, 1), -128, np.int8),
        "ws": np.array([0.498], f32), "wz": np.zeros(1, np.int8), "ys": f32(1), "yz": np.array(0, np.uint8),
        "b": np.array([2**24 + 1], np.int32),
    }  # fmt: skip
    model = node_model("QLinearConv", [("x", np.uint8, x.shape)], inits, np.uint8, kernel_shape=[1, 1])
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    assert want.tolist() == [[[[128, 192]]]]
    assert_same(ort_run(model, {"x": x})[0], want, "onnxruntime")
    order = ("xs", "xz", "w", "ws", "wz", "ys", "yz", "b")
    (got,) = conv.qlinear_conv(x, *(inits[k] for k in order), scheme=get_scheme(preset))
    assert_same(got, want, preset)


@pytest.mark.parametrize("bias", [0, 2**24 - 255])
def test_reference_preset_adds_the_zero_point_before_rounding(bias: int) -> None:
    """onnx-reference rounds ``sum * 0.5 + 3`` half to even with the zero point already added: odd
    sums are ties, and 3 is odd, so adding it after rounding would give 3, 67, 195, 131. Small float
    sums, and sums of -255 * 128 * 514 whose bound plus the bias pass 2**24 (integer sums);
    against onnx.reference."""
    from onnx.reference import ReferenceEvaluator

    x = np.full((1, 514, 1, 4), 255, np.uint8)  # sums + bias: 1, 129, 385, 257
    x[0, 0, 0, 1] = 254
    x[0, :3, 0, 2] = 254
    x[0, 0, 0, 3] = 253
    inits = {
        "xs": f32(1), "xz": np.array(0, np.uint8), "w": np.full((1, 514, 1, 1), -128, np.int8),
        "ws": np.array([0.5], f32), "wz": np.zeros(1, np.int8), "ys": f32(1), "yz": np.array(3, np.uint8),
        "b": np.array([bias], np.int32),
    }  # fmt: skip
    if not bias:  # odd sums from one channel: zero point after rounding would give 3, 67, 131, 129
        x = np.array([[[[1, 129, 255, 253]]]], np.uint8)
        inits["w"] = np.ones((1, 1, 1, 1), np.int8)
    model = node_model("QLinearConv", [("x", np.uint8, x.shape)], inits, np.uint8, kernel_shape=[1, 1])
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    order = ("xs", "xz", "w", "ws", "wz", "ys", "yz", "b")
    (got,) = conv.qlinear_conv(x, *(inits[k] for k in order), scheme=REFERENCE)
    assert want.tolist() == ([[[[4, 68, 130, 130]]]] if not bias else [[[[4, 68, 196, 132]]]])
    assert_same(got, want, "zero point first")


@pytest.mark.parametrize("accumulator", ["wrap32", "saturate32", "exact"])
def test_conv_integer_wraps_int32_whatever_the_schemes_accumulator(accumulator: str) -> None:
    """66,000 products of 255 * -128 sum to -2,154,240,000, past int32: onnxruntime's ConvInteger wraps
    it to 2,140,727,296, and so does the kernel under any scheme's accumulator."""
    x = np.full((1, 66000, 1, 1), 255, np.uint8)
    w = np.full((1, 66000, 1, 1), -128, np.int8)
    want = -255 * 128 * 66000 + 2**32
    model = node_model("ConvInteger", [("x", np.uint8, x.shape)], {"w": w}, np.int32)
    try:
        ran = ort_run(model, {"x": x})[0].tolist()
    except Exception as exc:  # u8 x s8 ConvInteger: no CPU kernel in older onnxruntime (1.18, 1.23)
        assert "NOT_IMPLEMENTED" in str(exc)  # the hand-worked value alone judges the kernel there
    else:
        assert ran == [[[[want]]]]
    (got,) = conv.conv_integer(x, w, scheme=VNNI.replace(accumulator=accumulator))
    assert got.dtype == np.int32
    assert got.tolist() == [[[[want]]]]


def test_qlinear_conv_wraps_int32_as_onnxruntime() -> None:
    """Sums of -2,154,240,000 wrap in int32 to 2,140,727,296; plus the bias -2**24, 2,123,950,080;
    times 1e-7, 212. Without the wrap the output would saturate at 0."""
    x = np.full((1, 66000, 1, 2), 255, np.uint8)
    x[0, :50000, 0, 1] = 254  # the second sum does not wrap: -2,154,240,000 + 6,400,000, still past
    inits = {
        "xs": f32(1e-3), "xz": np.array(0, np.uint8), "w": np.full((1, 66000, 1, 1), -128, np.int8),
        "ws": np.array([1e-3], f32), "wz": np.zeros(1, np.int8), "ys": f32(10.0), "yz": np.array(0, np.uint8),
        "b": np.array([-(2**24)], np.int32),
    }  # fmt: skip
    model = node_model("QLinearConv", [("x", np.uint8, x.shape)], inits, np.uint8, kernel_shape=[1, 1])
    (want,) = ort_run(model, {"x": x})
    assert want[0, 0, 0, 0] == 212
    order = ("xs", "xz", "w", "ws", "wz", "ys", "yz", "b")
    (got,) = conv.qlinear_conv(x, *(inits[k] for k in order), scheme=VNNI)
    assert_same(got, want, "int32 wrap")


@pytest.mark.parametrize(("n", "per_record", "threads", "want"), [
    (5, 1, 1, [(0, 3, 0, 7), (3, 5, 0, 7)]),  # 4 records a chunk: 2 chunks, 3 records each
    (5, 0, 1, [(0, 3, 0, 7), (3, 5, 0, 7)]),  # no outputs counted as one
    (5, 2, 2, [(0, 2, 0, 7), (2, 4, 0, 7), (4, 5, 0, 7)]),  # 4 chunks wanted (a multiple of 2): 2 records each
    (3, 1, 4, [(0, 3, 0, 7)]),  # fewer records than threads: one chunk
])  # fmt: skip
def test_record_spans_by_hand(n: int, per_record: int, threads: int, want: list, monkeypatch) -> None:
    """Chunks of about ``ORT_CHUNK_ELEMENTS`` (4 here) outputs, as many as a multiple of the threads."""
    monkeypatch.setattr(conv_core, "ORT_CHUNK_ELEMENTS", 4)
    assert conv_core._record_spans(n, per_record, threads, 7) == want


def test_onnxruntime_sessions_differ_by_geometry() -> None:
    """The same weight array and key in two geometries (strides, pads): each gets its own onnxruntime
    session, and both give the direct sums."""
    rng = np.random.default_rng(11)
    x = random_q(rng, np.int8, (2, 3, 8, 7))
    w = random_q(rng, np.int8, (4, 3, 3, 3))
    weights = (w, "same key")
    for strides, pads in (((1, 1), [1, 1, 1, 1]), ((2, 1), [0, 1, 2, 0]), ((2, 1), [0, 0, 0, 0])):
        got = conv_core.conv_core(
            x, w.astype(f32), 1, strides, (1, 1), f32, exact=True, pads=pads, offset=0, weights=weights
        )
        assert_same(got, _direct(x, w, 1, strides, (1, 1), pads).astype(f32), f"{strides} {pads}")


def test_qlinear_conv_output_type_is_the_output_zero_points() -> None:
    """uint8 in, int8 out: ``(x - 100) * 0.1 / 0.2 - 5`` is -55, -30, -5 and 72.5 + 0 rounded to even,
    72; against onnx.reference too."""
    from onnx.reference import ReferenceEvaluator

    x = np.array([[[[0, 50, 100, 255]]]], np.uint8)
    inits = {
        "xs": f32(0.1), "xz": np.array(100, np.uint8), "w": np.ones((1, 1, 1, 1), np.int8),
        "ws": np.array([1.0], f32), "wz": np.zeros(1, np.int8), "ys": f32(0.2), "yz": np.array(-5, np.int8),
    }  # fmt: skip
    model = node_model("QLinearConv", [("x", np.uint8, x.shape)], inits, np.int8, kernel_shape=[1, 1])
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    assert want.dtype == np.int8
    assert want.tolist() == [[[[-55, -30, -5, 72]]]]
    order = ("xs", "xz", "w", "ws", "wz", "ys", "yz")
    (got,) = conv.qlinear_conv(x, *(inits[k] for k in order), scheme=REFERENCE)
    assert_same(got, want, "int8 output")


@pytest.mark.parametrize("kernel", [(3, 2), (2, 3)])
def test_conv_integer_two_per_channel_weight_zero_points(kernel: tuple[int, int]) -> None:
    """Two output channels, two weight zero points: each subtracted from its own channel's weights."""
    rng = np.random.default_rng(12)
    x = random_q(rng, np.uint8, (1, 3, 6, 5))
    w = random_q(rng, np.int8, (2, 3, *kernel))
    w_zp = np.array([3, -2], np.int8)
    (got,) = conv.conv_integer(x, w, np.array(7, np.uint8), w_zp, scheme=VNNI)
    shifted = w.astype(np.int64) - np.array([3, -2]).reshape(2, 1, 1, 1)
    assert_same(got, _direct(x.astype(np.int64) - 7, shifted, 1, (1, 1), (1, 1), [0] * 4).astype(np.int32), "zp")
