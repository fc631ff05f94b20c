"""Pool kernels against onnxruntime over a grid of geometry: output shapes and values (issue 32).

Every pair of kernel size, stride, dilation and begin/end pads (each pad below the kernel, as
onnxruntime requires) with ``ceil_mode`` 0 and 1, plus ``auto_pad``, on 1-d, 2-d and 3-d inputs of
several sizes. One graph per op and input holds every case as its own node, so that one onnxruntime
session judges hundreds of geometries. The grid reaches the ``ceil_mode`` boundary where the last window
would start exactly at the end of input plus left pad (onnxruntime drops it).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from backend_models import MS, ort_session, tensor_type
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from pytest_qaccuracy.backend import IntegerSession, get_scheme
from pytest_qaccuracy.backend.interpreter import KernelError
from pytest_qaccuracy.backend.scheme import for_onnxruntime

# (kernel, stride, dilation, begin pad, end pad) of one spatial axis
AXES = [
    (k, s, dil, begin, end)
    for k, s, dil in itertools.product((1, 2, 3), (1, 2, 3), (1, 2))
    for begin, end in itertools.product(range(k), range(k))
]
SIZES = {1: [(4,), (5,), (6,), (7,)], 2: [(4, 5), (7, 6)], 3: [(4, 5, 6)]}
SAMPLED = 120  # 2-d and 3-d cases drawn from the product of AXES (1-d takes all of them)


#: onnxruntime 1.20 and earlier size pools by the plain ONNX formulas (a last ceil_mode window may start
#: in the end padding; a window larger than its padded axis by less than a stride gives no output), 1.21
#: and later by their own; the emulation follows the installed onnxruntime (``Scheme.pool_size_plain``).
#: The values of 1.20's windows that start past the input (no tap; later releases have no such window)
#: are not emulated: each kernel leaves its own (0, the lowest float, a value of the input)
CEIL_MODES = (0, 1)
ORT_VERSION = tuple(int(v) for v in ort.__version__.split(".")[:2])
PLAIN_SIZES = ORT_VERSION < (1, 21)
#: onnxruntime 1.21 to 1.24's float AveragePool with count_include_pad leaves some explicit end pads out
#: (explicit or SAME) out of some windows' divisors (fixed in 1.25; no rule found that fits every
#: measured case): not emulated
INCLUDE_PAD_DIVISORS = not (1, 21) <= ORT_VERSION < (1, 25)


def _tapless(case: dict[str, object], spatial: tuple[int, ...], out: tuple[int, ...]) -> np.ndarray:
    """Where an output window starts past the end of the input on some axis (it reads no value)."""
    d = len(spatial)
    begins = (case.get("pads") or [0] * 2 * d)[:d] if case.get("auto_pad", "NOTSET") == "NOTSET" else [0] * d
    hit = np.zeros(out, bool)
    for axis, (size, s, begin) in enumerate(zip(spatial, case["strides"], begins, strict=True)):
        starts = np.arange(out[axis]) * s - begin
        hit |= (starts >= size).reshape([-1 if i == axis else 1 for i in range(d)])
    return hit


def _fits(case: dict[str, object], spatial: tuple[int, ...]) -> bool:
    """Whether every dilated window fits in its padded axis (SAME pads always make it fit)."""
    d = len(spatial)
    pads = case.get("pads") or ([0] * 2 * d if case.get("auto_pad") == "VALID" else None)
    if pads is None:
        return True
    return all(
        n + pads[i] + pads[i + d] >= (k - 1) * dil + 1
        for i, (n, k, dil) in enumerate(zip(spatial, case["kernel_shape"], case["dilations"], strict=True))
    )


def _geometries(d: int) -> list[dict[str, object]]:
    """Explicit-pad cases with ceil_mode 0 and 1, then auto_pad cases whose stride is at most the
    dilated kernel (onnxruntime's legacy SAME padding needs it)."""
    if d == 1:
        combos = [(a,) for a in AXES]
    else:
        rows = np.random.default_rng(d).integers(0, len(AXES), (SAMPLED, d))
        combos = [tuple(AXES[i] for i in row) for row in rows]
    cases: list[dict[str, object]] = []
    for axes in combos:
        pads = [a[3] for a in axes] + [a[4] for a in axes]
        cases += [{**_window(axes), "pads": pads, "ceil_mode": ceil} for ceil in CEIL_MODES]
    for axes in combos[:40]:
        if all(s <= (k - 1) * dil + 1 for k, s, dil, _, _ in axes):
            cases += [{**_window(axes), "auto_pad": mode} for mode in ("SAME_UPPER", "SAME_LOWER", "VALID")]
    return cases


def _window(axes: tuple[tuple[int, ...], ...]) -> dict[str, list[int]]:
    return {"kernel_shape": [a[0] for a in axes], "strides": [a[1] for a in axes], "dilations": [a[2] for a in axes]}


# name: (op, domain, input dtype, extra attributes, initializers after x)
QLINEAR_INITS = {"xs": np.float32(0.031), "xz": np.uint8(3), "ys": np.float32(0.027), "yz": np.uint8(5)}
OPS = {
    "maxpool-float": ("MaxPool", "", np.float32, {}, {}),
    "maxpool-uint8": ("MaxPool", "", np.uint8, {}, {}),
    "averagepool": ("AveragePool", "", np.float32, {}, {}),
    "averagepool-include-pad": ("AveragePool", "", np.float32, {"count_include_pad": 1}, {}),
    "qlinear-averagepool": ("QLinearAveragePool", MS, np.uint8, {}, QLINEAR_INITS),
    "qlinear-averagepool-include-pad": ("QLinearAveragePool", MS, np.uint8, {"count_include_pad": 1}, QLINEAR_INITS),
}


def _grid_model(name: str, shape: tuple[int, ...], cases: list[dict[str, object]]) -> onnx.ModelProto:
    op, domain, dtype, extra, inits = OPS[name]
    nodes, outputs = [], []
    for i, case in enumerate(cases):
        attrs = {**case, **extra}
        if op == "QLinearAveragePool":  # no dilations in the contrib op
            attrs.pop("dilations", None)
        nodes.append(helper.make_node(op, ["x", *inits], [f"y{i}"], domain=domain, **attrs))
        outputs.append(helper.make_tensor_value_info(f"y{i}", tensor_type(dtype), None))
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", tensor_type(dtype), shape)],
        outputs,
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    opsets = [helper.make_opsetid("", 19)] + ([helper.make_opsetid(MS, 1)] if domain else [])
    return helper.make_model(graph, opset_imports=opsets, ir_version=9)


def _input(dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(sum(shape))
    if dtype == np.uint8:
        return rng.integers(0, 256, shape).astype(np.uint8)
    return rng.normal(0, 1, shape).astype(np.float32)


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("name", OPS)
def test_pool_grid_matches_onnxruntime(name: str, d: int) -> None:
    op = OPS[name][0]
    cases = _geometries(d)
    if op == "QLinearAveragePool":  # the contrib op takes no dilations: keep the undilated cases
        cases = [c for c in cases if all(v == 1 for v in c["dilations"])]
    checked = 0
    for spatial in SIZES[d]:
        shape = (2, 3, *spatial)
        model = _grid_model(name, shape, cases)
        x = _input(OPS[name][2], shape)
        want = ort_session(model).run(None, {"x": x})
        got = IntegerSession(model, threads=1).run(None, {"x": x})
        for case, w, g in zip(cases, want, got, strict=True):
            assert g.shape == w.shape, f"{op} {case} on {shape}: shape {g.shape}, onnxruntime {w.shape}"
            assert g.dtype == w.dtype
            if not INCLUDE_PAD_DIVISORS and name == "averagepool-include-pad":
                checked += 1  # the shape only
                continue
            if PLAIN_SIZES and case.get("ceil_mode"):
                keep = ~_tapless(case, spatial, w.shape[2:])
                g, w = g[..., keep], w[..., keep]
            np.testing.assert_array_equal(g, w, err_msg=f"{op} {case} on {shape}")
            checked += 1
    assert checked >= 50 * len(SIZES[d])  # the grid is not empty


@pytest.mark.parametrize(
    "attrs",
    [
        {"kernel_shape": [3], "dilations": [2], "strides": [1]},  # a dilated window of 5 on 3 values
        {"kernel_shape": [3], "strides": [1], "pads": [0, 0]},
    ],
)
def test_a_window_larger_than_the_input_is_refused_like_onnxruntime(attrs: dict[str, object]) -> None:
    x = np.zeros((1, 2, 3 if attrs.get("dilations") else 1), np.float32)
    model = _grid_model("maxpool-float", x.shape, [attrs])
    with pytest.raises(Exception, match=r"negative|Size\(\) must be >= 0"):  # 1.19 to 1.28: the latter
        ort_session(model).run(None, {"x": x})
    with pytest.raises(KernelError, match="does not fit spatial axis 0"):
        IntegerSession(model).run(None, {"x": x})


#: (input shape, attributes, what both refuse): onnxruntime's ``PoolAttributes`` refuses a pad as large
#: as the kernel (at the session's start) and an input that holds no value unless its batch is empty
REFUSED = [
    ((1, 2, 4), {"kernel_shape": [1], "pads": [1, 0]}, "not smaller than the kernel"),
    ((1, 2, 4, 4), {"kernel_shape": [3, 2], "pads": [0, 2, 0, 0]}, "pad 2 on spatial axis 1"),
    ((1, 2, 4, 4), {"kernel_shape": [3, 2], "pads": [0, 0, 3, 0]}, "pad 3 on spatial axis 0"),
    ((1, 2, 0, 4), {"kernel_shape": [1, 1], "pads": [0, 0, 0, 0]}, "only N may be 0"),
    ((2, 3, 4, 0), {"kernel_shape": [3, 1], "pads": [1, 0, 1, 0]}, "only N may be 0"),
]  # fmt: skip


@pytest.mark.parametrize("name", ["maxpool-uint8", "averagepool", "qlinear-averagepool"])
@pytest.mark.parametrize(("shape", "attrs", "message"), REFUSED)
def test_what_onnxruntime_refuses_is_refused(name: str, shape: tuple[int, ...], attrs: dict, message: str) -> None:
    model = _grid_model(name, shape, [attrs])
    x = np.zeros(shape, OPS[name][2])
    with pytest.raises(Exception, match=r"Pad should be smaller than kernel|Only N can be zero"):
        ort_session(model).run(None, {"x": x})
    with pytest.raises(KernelError, match=message):
        IntegerSession(model).run(None, {"x": x})


@pytest.mark.parametrize("name", ["maxpool-uint8", "averagepool", "qlinear-averagepool"])
def test_an_empty_batch_gives_an_empty_output_like_onnxruntime(name: str) -> None:
    shape = (0, 2, 5, 4)
    model = _grid_model(name, shape, [{"kernel_shape": [3, 2], "pads": [1, 1, 1, 0], "strides": [2, 1]}])
    x = np.zeros(shape, OPS[name][2])
    (want,) = ort_session(model).run(None, {"x": x})
    (got,) = IntegerSession(model).run(None, {"x": x})
    assert got.shape == want.shape == (0, 2, 3, 4) and got.dtype == want.dtype


#: ceil_mode at its boundary, by hand (onnxruntime from 1.20 and PyTorch keep a last window only if it
#: starts inside the input or the begin padding): (size, kernel, stride, begin pad, end pad, the input
#: positions each kept window reads)
CEIL_BOUNDARY = [
    (4, 2, 2, 0, 1, [[0, 1], [2, 3]]),  # a third window would start at 4, in the end pad: dropped
    (5, 2, 2, 0, 0, [[0, 1], [2, 3], [4]]),  # the third starts at 4, inside the input: kept, one value
    (4, 3, 2, 1, 1, [[0, 1], [1, 2, 3], [3]]),  # starts -1, 1, 3: the last is inside the input
    (6, 2, 3, 0, 1, [[0, 1], [3, 4]]),  # a third would start at 6, in the end pad: dropped
    (7, 2, 3, 0, 1, [[0, 1], [3, 4], [6]]),  # the third starts at 6, inside the input: kept
]


@pytest.mark.parametrize(("size", "k", "s", "begin", "end", "windows"), CEIL_BOUNDARY)
def test_max_pool_ceil_mode_keeps_a_last_window_only_inside_the_input(size, k, s, begin, end, windows) -> None:
    x = np.random.default_rng(size * 10 + k).permutation(size).astype(np.float32).reshape(1, 1, size)
    attrs = {"kernel_shape": [k], "strides": [s], "pads": [begin, end], "ceil_mode": 1}
    node = helper.make_node("MaxPool", ["x"], ["y"], **attrs)
    value = helper.make_tensor_value_info
    graph = helper.make_graph([node], "g", [value("x", onnx.TensorProto.FLOAT, [1, 1, size])], [value("y", 1, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    (y,) = IntegerSession(model, for_onnxruntime(get_scheme("onnxruntime-vnni"), (1, 21))).run(None, {"x": x})
    assert y.tolist() == [[[x[0, 0, w].max() for w in windows]]]
    # onnxruntime 1.20 and earlier: the plain formula, ceil((size + pads - k) / s) + 1 windows, none dropped
    (old,) = IntegerSession(model, for_onnxruntime(get_scheme("onnxruntime-vnni"), (1, 20))).run(None, {"x": x})
    assert old.shape[-1] == math.ceil((size + begin + end - k) / s) + 1 >= len(windows)
    assert old[..., : len(windows)].tolist() == y.tolist()


@pytest.mark.parametrize(
    ("size", "k", "s", "dil", "pads", "auto_pad", "plain", "current"),
    [
        (2, 3, 2, 1, [0, 0], "NOTSET", 0, 1),  # the window overruns the input by 1 < s: int(-0.5 + 1) = 0
        (3, 4, 2, 1, [0, 0], "VALID", 0, 1),
        (5, 3, 2, 1, [0, 0], "NOTSET", 2, 2),  # it fits: the same
        (1, 3, 2, 1, [0, 0], "VALID", 0, 0),  # by 2 = s: no output either way
        (2, 3, 2, 1, None, "SAME_UPPER", 1, 1),  # SAME pads make an undilated window fit
        (2, 2, 3, 3, None, "SAME_UPPER", 0, 1),  # not a dilated one (pads from the undilated kernel)
        (2, 2, 3, 3, None, "SAME_LOWER", 0, 1),
    ],
)
def test_output_sizes_of_both_rules(size, k, s, dil, pads, auto_pad, plain, current) -> None:
    """The sizes measured on onnxruntime 1.18.0/1.20.1 (plain) and 1.21.1 to 1.32.0 (current), by hand."""
    x = np.arange(size, dtype=np.float32).reshape(1, 1, size)
    attrs = {"kernel_shape": [k], "strides": [s], "dilations": [dil], "auto_pad": auto_pad}
    attrs |= {"pads": pads} if pads else {}
    model = _grid_model("maxpool-float", x.shape, [attrs])
    for version, want in (((1, 20), plain), ((1, 21), current)):
        (y,) = IntegerSession(model, for_onnxruntime(get_scheme("onnxruntime-vnni"), version)).run(None, {"x": x})
        assert y.shape[-1] == want, version
    if auto_pad.startswith("SAME"):  # onnx.reference sizes SAME pads by ceil(size / stride), not the formula
        return
    (ref,) = ReferenceEvaluator(model).run(None, {"x": x})  # the ONNX formula, as onnxruntime 1.20
    (got,) = IntegerSession(model, "onnx-reference").run(None, {"x": x})
    assert ref.shape[-1] == got.shape[-1] == plain
