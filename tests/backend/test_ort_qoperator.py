"""Bit-exactness of the ``onnxruntime`` preset against onnxruntime, one QOperator node at a time.

Each case runs a one-node model on real onnxruntime (CPU EP, full optimizations) and on
``IntegerSession``; every output element must be equal. Adversarial cases: power-of-two scales with
odd zero points (exact .5 ties), accumulators above 2**24, per-channel weights.
"""

from __future__ import annotations

import numpy as np
import pytest
from backend_models import MS, assert_same, node_model, ort_run, random_q

from pytest_qaccuracy.backend import IntegerSession

f32 = np.float32


def _saturated(y: np.ndarray) -> float:
    """Fraction of outputs at the ends of their range (a test whose outputs all saturate proves little)."""
    info = np.iinfo(y.dtype)
    return float(np.mean((y == info.min) | (y == info.max)))


def _check(model, feeds, what=""):
    want = ort_run(model, feeds)
    got = IntegerSession(model).run(None, feeds)
    assert len(got) == len(want) == len(model.graph.output), f"{what}: one array per graph output"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_same(g, w, f"{what} output {i}")
    return got


CONV_CASES = {
    # name: (x dtype, w dtype, per_channel, mode, attrs)
    "u8s8": (np.uint8, np.int8, False, "random", {"pads": [1, 1, 1, 1]}),
    "u8s8-per-channel": (np.uint8, np.int8, True, "random", {"pads": [1, 1, 1, 1]}),
    "s8s8-per-channel": (np.int8, np.int8, True, "random", {"pads": [1, 1, 1, 1]}),
    "u8u8-odd-wzp": (np.uint8, np.uint8, False, "random", {"pads": [0, 1, 2, 1]}),
    "ties": (np.uint8, np.int8, False, "ties", {"pads": [1, 1, 1, 1]}),
    "ties-s8": (np.int8, np.int8, False, "ties", {}),
    "bigacc": (np.uint8, np.int8, False, "bigacc", {}),
    "f32-adversarial": (np.uint8, np.int8, True, "f32adv", {}),
    "stride-dilation": (
        np.uint8,
        np.int8,
        False,
        "random",
        {"strides": [2, 2], "dilations": [2, 1], "pads": [2, 1, 2, 1]},
    ),
    "groups": (np.uint8, np.int8, True, "random", {"group": 2, "pads": [1, 1, 1, 1]}),
    "depthwise": (np.int8, np.int8, True, "random", {"group": 8, "pads": [1, 1, 1, 1]}),
    "same-upper": (np.uint8, np.int8, False, "random", {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
}


@pytest.mark.parametrize("case", CONV_CASES)
def test_qlinear_conv(case: str) -> None:
    xdt, wdt, per_channel, mode, attrs = CONV_CASES[case]
    rng = np.random.default_rng(len(case))
    group = attrs.get("group", 1)
    c, m, k = (8, 8, 3) if mode != "bigacc" else (1024, 4, 1)
    if mode in ("ties", "f32adv"):
        k = 1
    x = random_q(rng, xdt, (3, c, 9, 9))
    w = random_q(rng, wdt, (m, c // group, k, k))
    if mode == "ties":  # small values: no saturation, many exact .5 ties with M = 1/8
        x = (rng.integers(-6, 7, x.shape) + (7 if xdt == np.uint8 else -3)).astype(xdt)
        w = rng.integers(-6, 7, w.shape).astype(wdt)
    if mode == "bigacc":  # large same-sign products: |acc| > 2**24, output still inside the uint8 range
        x = rng.integers(180, 256, x.shape).astype(xdt)
        w = rng.integers(-128, -90, w.shape).astype(wdt)
    xs, ys = f32(0.5 if mode == "ties" else 0.0173), f32(2.0 if mode == "ties" else 0.37)
    if mode == "bigacc":
        ys = f32(35.0)
    ws = rng.uniform(0.002, 0.02, m).astype(f32) if per_channel else f32(0.5 if mode == "ties" else 0.0091)
    wzp = np.zeros(m, wdt) if per_channel else np.array(0 if wdt == np.int8 else 131, wdt)
    xzp = np.array(7 if xdt == np.uint8 else -3, xdt)
    yzp = np.array(127 if xdt == np.uint8 else 3, xdt)  # odd: ties round differently if zp joins first
    bias = (
        rng.integers(-40, 40, m).astype(np.int32) if mode == "ties" else rng.integers(-20000, 20000, m).astype(np.int32)
    )
    if mode == "f32adv":  # acc above 2**24 with a tiny multiplier: f32(acc) drops low bits
        bias = np.full(m, 2**25 + 2**18 + 1, np.int32)
        ys = f32(1.0)
        ws = np.full(m, f32(2.0**-19) / xs, f32)
    inits = {"xs": xs, "xz": xzp, "w": w, "ws": ws, "wz": wzp, "ys": ys, "yz": yzp, "b": bias}
    model = node_model("QLinearConv", [("x", xdt, x.shape)], inits, xdt, **attrs)
    if mode == "bigacc":  # the integer sum itself exceeds 2**24: the float64 GEMM path is exercised
        acc = np.einsum(
            "nchw,mc->nmhw", x.astype(np.int64) - int(xzp), w[:, :, 0, 0].astype(np.int64) - wzp.astype(np.int64)
        )
        assert np.abs(acc).min() > 2**24
    got = _check(model, {"x": x}, case)[0]
    assert _saturated(got) < 0.25
    if mode == "ties":  # the case really is adversarial: adding zp before rounding changes many outputs
        zp_first = IntegerSession(model, "onnx-reference").run(None, {"x": x})[0]
        assert np.mean(zp_first != got) > 0.05


def test_qlinear_conv_1d_without_bias() -> None:
    rng = np.random.default_rng(5)
    x = random_q(rng, np.uint8, (4, 6, 17))
    inits = {"xs": f32(0.1), "xz": np.uint8(128), "w": random_q(rng, np.int8, (5, 6, 3)), "ws": f32(0.01),
             "wz": np.int8(0), "ys": f32(1.0), "yz": np.uint8(127)}  # fmt: skip
    got = _check(node_model("QLinearConv", [("x", np.uint8, x.shape)], inits, np.uint8, pads=[1, 1]), {"x": x})[0]
    assert _saturated(got) < 0.25


@pytest.mark.parametrize(
    ("adt", "bdt", "a_shape", "b_shape", "per_column", "ties"),
    [
        (np.uint8, np.int8, (7, 40), (40, 9), False, False),
        (np.uint8, np.uint8, (7, 40), (40, 9), False, True),
        (np.int8, np.int8, (3, 7, 40), (40, 9), True, False),
        (np.uint8, np.int8, (2, 5, 300), (300, 6), True, False),
        (np.int8, np.int8, (2, 5, 16), (2, 16, 6), False, True),
    ],
)
def test_qlinear_matmul(adt, bdt, a_shape, b_shape, per_column, ties) -> None:
    rng = np.random.default_rng(sum(a_shape))
    a, b = random_q(rng, adt, a_shape), random_q(rng, bdt, b_shape)
    n = b_shape[-1]
    bs = rng.uniform(0.001, 0.05, n).astype(f32) if per_column else f32(0.25 if ties else 0.013)
    bz = np.zeros(n, bdt) if per_column else np.array(0 if bdt == np.int8 else 77, bdt)
    if ties:  # small values and M = 1/4: a quarter of the outputs are exact .5 ties
        a = (rng.integers(-3, 4, a_shape) + 5).astype(adt)
        b = (rng.integers(-3, 4, b_shape) + bz.astype(np.int64)).astype(bdt)
        bs = f32(0.5)
    a_s = f32(0.5 if ties else 0.021)
    acc = (a.astype(np.int64) - 5) @ (b.astype(np.int64) - bz.astype(np.int64))
    reach = float(np.abs(acc).max()) * float(a_s) * float(np.max(bs)) / 100.0  # outputs within about +-100
    ys = f32(1.0) if ties else f32(reach * 1.37)
    yz = np.array(127 if adt == np.uint8 else 13, adt)
    inits = {"as": a_s, "az": np.array(5, adt), "b": b, "bs": bs, "bz": bz, "ys": ys, "yz": yz}
    model = node_model("QLinearMatMul", [("a", adt, a_shape)], inits, adt)
    got = _check(model, {"a": a})[0]
    assert _saturated(got) < 0.25
    if ties:
        assert np.mean(IntegerSession(model, "onnx-reference").run(None, {"a": a})[0] != got) > 0.02


@pytest.mark.parametrize("trans", [(0, 0), (1, 1)])
@pytest.mark.parametrize("quantized_output", [True, False])
def test_qgemm(trans, quantized_output) -> None:
    rng = np.random.default_rng(3)
    a = random_q(rng, np.uint8, (30, 12) if trans[0] else (12, 30))
    b = random_q(rng, np.int8, (16, 30) if trans[1] else (30, 16))
    inits = {"as": f32(0.02), "az": np.uint8(120), "b": b, "bs": rng.uniform(0.01, 0.02, 16).astype(f32),
             "bz": np.zeros(16, np.int8)}  # fmt: skip
    order = ["a", "as", "az", "b", "bs", "bz"]
    if quantized_output:
        inits |= {"c": rng.integers(-9000, 9000, 16).astype(np.int32), "ys": f32(0.4), "yz": np.uint8(9)}
        order += ["c", "ys", "yz"]
        out = np.uint8
    else:
        inits |= {"c": rng.integers(-9000, 9000, 16).astype(np.int32)}
        order += ["c"]
        out = np.float32
    model = node_model("QGemm", [("a", np.uint8, a.shape)], inits, out, domain=MS, input_order=order,
                       alpha=0.75, transA=trans[0], transB=trans[1])  # fmt: skip
    if quantized_output:
        _check(model, {"a": a})
    else:  # float output: same float32 formula; compare to the last bit as well
        want = ort_run(model, {"a": a})[0]
        got = IntegerSession(model).run(None, {"a": a})[0]
        np.testing.assert_array_equal(got, want)


BINARY_SHAPES = {
    "same": ((2, 8, 5, 5), (2, 8, 5, 5)),
    "scalar-b": ((2, 8, 5, 5), ()),
    "scalar-a": ((), (2, 8, 5, 5)),
    "one-element-b": ((2, 8, 5, 5), (1,)),  # a 256-entry table of a's bytes
    "one-element-a": ((1, 1, 1, 1), (2, 8, 5, 5)),
    "per-channel-b": ((2, 8, 5, 5), (1, 8, 1, 1)),
    "per-record-channel-a": ((2, 8, 1, 1), (2, 8, 5, 5)),  # A one value per span of B: MLAS's scalar-A kernel
    "last-dim-b": ((2, 8, 5, 5), (5,)),
}


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("shapes", BINARY_SHAPES)
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("ties", [False, True])
def test_qlinear_binary(op, shapes, dtype, ties) -> None:
    rng = np.random.default_rng(11)
    a_shape, b_shape = BINARY_SHAPES[shapes]
    unsigned_zps = (133, 121, 129) if op == "QLinearMul" else (3, 9, 1)  # odd; mid-range where results are signed
    zps = [np.array(v, dtype) for v in (unsigned_zps if dtype == np.uint8 else (-5, 7, 1))]
    if op == "QLinearMul" and ties:  # small values so that products / 8 stay in range
        a = np.asarray(rng.integers(-12, 13, a_shape) + zps[0]).astype(dtype)
        b = np.asarray(rng.integers(-12, 13, b_shape) + zps[1]).astype(dtype)
    else:
        a, b = random_q(rng, dtype, a_shape), random_q(rng, dtype, b_shape)
    scales = (f32(0.5), f32(0.25), f32(1.0)) if ties else (f32(0.031), f32(0.017), f32(0.08))
    if op == "QLinearMul" and not ties:
        scales = (f32(0.031), f32(0.017), f32(0.5))
    inits = {"as": scales[0], "az": zps[0], "bs": scales[1], "bz": zps[1], "cs": scales[2], "cz": zps[2]}
    order = ["a", "as", "az", "b", "bs", "bz", "cs", "cz"]
    model = node_model(op, [("a", dtype, a_shape), ("b", dtype, b_shape)], inits, dtype, domain=MS, input_order=order)
    assert _saturated(_check(model, {"a": a, "b": b}, op)[0]) < 0.35


@pytest.mark.parametrize(
    "params",
    [
        # (a scale, a zp, b scale, b zp, c scale, c zp): two residual additions of a quantized mobile
        # net whose folded constant needs the compiler's FMA, and random ones
        (2.946960687637329, 138, 3.338906764984131, 132, 4.49189567565918, 142),
        (2.02308988571167, 127, 2.226343870162964, 132, 2.946960687637329, 138),
        *[tuple(float(v) for v in p) for p in np.random.default_rng(5).uniform(0.01, 4, (4, 6)) * [1, 0, 1, 0, 1, 0]],
    ],
)
def test_qlinear_add_on_every_input_pair(params) -> None:
    """All 65,536 input pairs of a uint8 QLinearAdd, bit for bit, including the constant that MLAS's
    compiled kernel folds with one FMA (zero points drawn where the parameter set gives none)."""
    rng = np.random.default_rng(int(params[0] * 1000))
    a_s, a_zp, b_s, b_zp, c_s, c_zp = params
    zps = [int(z) if z else int(rng.integers(100, 160)) for z in (a_zp, b_zp, c_zp)]
    inits = {"as": f32(a_s), "az": np.uint8(zps[0]), "bs": f32(b_s), "bz": np.uint8(zps[1]),
             "cs": f32(c_s), "cz": np.uint8(zps[2])}  # fmt: skip
    a = np.repeat(np.arange(256, dtype=np.uint8), 256).reshape(256, 256)
    b = np.tile(np.arange(256, dtype=np.uint8), 256).reshape(256, 256)
    order = ["a", "as", "az", "b", "bs", "bz", "cs", "cz"]
    model = node_model("QLinearAdd", [("a", np.uint8, a.shape), ("b", np.uint8, b.shape)], inits, np.uint8,
                       domain=MS, input_order=order)  # fmt: skip
    _check(model, {"a": a, "b": b}, f"QLinearAdd {params}")


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_pair_tables_are_kept_per_exact_parameters(op: str) -> None:
    """Cached pair tables: parameters one float32 ulp apart, or another zero point, are each bit-exact
    with onnxruntime (a table is only shared when the formula's parameters are equal), and a
    repeated call builds no new table."""
    from pytest_qaccuracy.backend.kernels import elementwise

    rng = np.random.default_rng(2)
    a, b = random_q(rng, np.uint8, (2, 4, 9, 9)), random_q(rng, np.uint8, (2, 4, 9, 9))
    order = ["a", "as", "az", "b", "bs", "bz", "cs", "cz"]
    base = f32(0.031)
    added = []
    for a_scale, c_zp in ((base, 1), (np.nextafter(base, f32(1)), 1), (base, 2), (base, 1)):
        inits = {"as": f32(a_scale), "az": np.uint8(3), "bs": f32(0.017), "bz": np.uint8(9),
                 "cs": f32(0.08 if op == "QLinearAdd" else 0.5), "cz": np.uint8(c_zp)}  # fmt: skip
        model = node_model(op, [("a", np.uint8, a.shape), ("b", np.uint8, b.shape)], inits, np.uint8,
                           domain=MS, input_order=order)  # fmt: skip
        before = set(elementwise._PAIR_TABLES)
        _check(model, {"a": a, "b": b}, f"{op} scale {a_scale!r} zp {c_zp}")
        added.append(set(elementwise._PAIR_TABLES) - before)
    assert len(added[2]) == 1, "another output zero point needs its own table"
    assert not added[3], "the same parameters reuse their table"
    if op == "QLinearAdd":  # MLAS folds each scale into its own float32 ratio: one ulp is another table
        assert len(added[1]) == 1


@pytest.mark.parametrize("op", ["QLinearSigmoid", "QLinearLeakyRelu"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("params", [(0.05, 7, 1 / 256, 0), (0.125, 3, 0.0625, 5), (0.0031, 0, 0.011, 9)])
def test_qlinear_lookup_ops(op, dtype, params) -> None:
    xs, xz, ys, yz = params
    if dtype == np.int8:
        xz, yz = xz - 64, yz - 128
    x = np.arange(np.iinfo(dtype).min, int(np.iinfo(dtype).max) + 1, dtype=dtype).reshape(4, 64)  # every input
    inits = {"xs": f32(xs), "xz": np.array(xz, dtype), "ys": f32(ys), "yz": np.array(yz, dtype)}
    attrs = {"alpha": 0.13} if op == "QLinearLeakyRelu" else {}
    model = node_model(op, [("x", dtype, x.shape)], inits, dtype, domain=MS, **attrs)
    _check(model, {"x": x}, op)


@pytest.mark.parametrize(
    "attrs",
    [
        {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
        {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1},
        {"kernel_shape": [2, 2], "strides": [2, 2]},
        {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [0, 1, 1, 0]},
        {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
        {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 0, 0], "ceil_mode": 1, "count_include_pad": 1},
    ],
)
@pytest.mark.parametrize("ties", [False, True])
def test_qlinear_average_pool(attrs, ties) -> None:
    rng = np.random.default_rng(2)
    x = random_q(rng, np.uint8, (2, 4, 9, 9))
    inits = {
        "xs": f32(0.25 if ties else 0.031),
        "xz": np.uint8(3),
        "ys": f32(0.25 if ties else 0.027),
        "yz": np.uint8(5),
    }
    model = node_model("QLinearAveragePool", [("x", np.uint8, x.shape)], inits, np.uint8, domain=MS, **attrs)
    _check(model, {"x": x})


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("ties", [False, True])
def test_qlinear_global_average_pool(dtype, ties) -> None:
    rng = np.random.default_rng(4)
    x = random_q(rng, dtype, (3, 16, 4, 4) if ties else (3, 16, 7, 5))
    inits = {"xs": f32(1.0 if ties else 0.031), "xz": np.array(3, dtype), "ys": f32(1.0 if ties else 0.029),
             "yz": np.array(5, dtype)}  # fmt: skip
    model = node_model("QLinearGlobalAveragePool", [("x", dtype, x.shape)], inits, dtype, domain=MS, channels_last=0)
    _check(model, {"x": x})


def test_qlinear_concat() -> None:
    rng = np.random.default_rng(6)
    a, b = random_q(rng, np.uint8, (2, 3, 4)), random_q(rng, np.uint8, (2, 5, 4))
    inits = {
        "ys": f32(0.05),
        "yz": np.uint8(10),
        "as": f32(0.05),
        "az": np.uint8(10),
        "bs": f32(0.0731),
        "bz": np.uint8(133),
    }
    order = ["ys", "yz", "a", "as", "az", "b", "bs", "bz"]
    model = node_model("QLinearConcat", [("a", np.uint8, a.shape), ("b", np.uint8, b.shape)], inits, np.uint8,
                       domain=MS, input_order=order, axis=1)  # fmt: skip
    _check(model, {"a": a, "b": b})


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize(("axis", "opset"), [(-1, 13), (1, 13), (1, 12)])
def test_qlinear_softmax(dtype, axis, opset) -> None:
    rng = np.random.default_rng(8)
    x = random_q(rng, dtype, (3, 10, 6))
    yz = np.array(0 if dtype == np.uint8 else -128, dtype)
    inits = {"xs": f32(0.07), "xz": np.array(0, dtype), "ys": f32(1 / 256), "yz": yz}
    model = node_model(
        "QLinearSoftmax", [("x", dtype, x.shape)], inits, dtype, domain=MS, axis=axis, opset=opset, model_opset=13
    )
    want = ort_run(model, {"x": x})[0]
    got = IntegerSession(model).run(None, {"x": x})[0]
    assert_same(got, want, "softmax")


def test_qlinear_softmax_table_shift_takes_a_float_logarithm() -> None:
    """onnxruntime's exp table is shifted by ``log(FLT_MAX / D)`` taken in float (C++ picks ``log``'s
    float overload): peaked rows of 3290 classes where a double logarithm puts one output a step off
    (a real 6625-class CTC recognizer showed it first)."""
    rng = np.random.default_rng(476)
    xs = float(np.float32(rng.uniform(0.05, 0.4)))
    d = int(rng.integers(500, 8000))
    x = rng.integers(0, 160, (64, d)).astype(np.uint8)
    x[:, :3] = rng.integers(200, 256, (64, 3))  # a few likely classes, as a recognizer's rows have
    inits = {"xs": f32(xs), "xz": np.array(0, np.uint8), "ys": f32(1 / 256), "yz": np.array(0, np.uint8)}
    model = node_model(
        "QLinearSoftmax", [("x", np.uint8, x.shape)], inits, np.uint8, domain=MS, axis=1, opset=12, model_opset=13
    )
    want = ort_run(model, {"x": x})[0]
    got = IntegerSession(model).run(None, {"x": x})[0]
    assert_same(got, want, "softmax")


def test_conv_integer_and_matmul_integer() -> None:
    rng = np.random.default_rng(9)
    x = random_q(rng, np.uint8, (2, 3, 7, 7))
    inits = {"w": random_q(rng, np.uint8, (4, 3, 3, 3)), "xz": np.uint8(120), "wz": np.uint8(131)}
    conv = node_model("ConvInteger", [("x", np.uint8, x.shape)], inits, np.int32, input_order=["x", "w", "xz", "wz"],
                      pads=[1, 1, 1, 1])  # fmt: skip
    _check(conv, {"x": x})
    a = random_q(rng, np.uint8, (5, 300))
    inits = {"b": random_q(rng, np.int8, (300, 7)), "az": np.uint8(3), "bz": np.int8(-2)}
    mm = node_model("MatMulInteger", [("a", np.uint8, a.shape)], inits, np.int32, input_order=["a", "b", "az", "bz"])
    _check(mm, {"a": a})


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.uint16, np.int16])
def test_quantize_dequantize_ties(dtype) -> None:
    scale = f32(0.5)
    zp = np.array(3, dtype)
    x = ((np.arange(-300, 300) + 0.5) * scale).astype(f32)  # every value an exact .5 tie
    q = node_model("QuantizeLinear", [("x", np.float32, x.shape)], {"s": scale, "z": zp}, dtype, model_opset=21)
    got = _check(q, {"x": x})[0]
    dq = node_model("DequantizeLinear", [("q", dtype, x.shape)], {"s": scale, "z": zp}, np.float32, model_opset=21)
    _check(dq, {"q": got})


def test_quantize_per_axis() -> None:
    rng = np.random.default_rng(10)
    x = rng.normal(0, 2, (2, 3, 4)).astype(f32)
    inits = {"s": np.array([0.1, 0.02, 0.5], f32), "z": np.array([0, 5, -3], np.int8)}
    _check(node_model("QuantizeLinear", [("x", np.float32, x.shape)], inits, np.int8, axis=1), {"x": x})


@pytest.mark.parametrize("spread", [(-3.0, 5.0), (0.5, 7.0), (-4.0, -1.0)])
def test_dynamic_quantize_linear(spread) -> None:
    x = np.random.default_rng(12).uniform(*spread, (4, 33)).astype(f32)
    model = node_model("DynamicQuantizeLinear", [("x", np.float32, x.shape)], {}, np.uint8, n_outputs=3)
    model.graph.output[1].type.tensor_type.elem_type = 1
    _check(model, {"x": x})


def test_qlinear_matmul_accumulator_above_2_24() -> None:
    rng = np.random.default_rng(13)
    a = rng.integers(200, 256, (2, 4, 2048)).astype(np.uint8)
    b = rng.integers(100, 128, (2048, 3)).astype(np.int8)
    inits = {"as": f32(0.5), "az": np.uint8(3), "b": b, "bs": f32(2.0**-10), "bz": np.int8(0), "ys": f32(2.0**8),
             "yz": np.uint8(9)}  # fmt: skip
    acc = (a.astype(np.int64) - 3) @ b.astype(np.int64)
    assert np.abs(acc).min() > 2**24
    got = _check(node_model("QLinearMatMul", [("a", np.uint8, a.shape)], inits, np.uint8), {"a": a})[0]
    assert got.min() > 0 and got.max() < 255  # not saturated: the low bits matter


@pytest.mark.parametrize("channels", [70000, 140000])
def test_int32_accumulator_wraps_like_onnxruntime(channels: int) -> None:
    """Sums beyond int32 wrap around in onnxruntime's kernels; the wrap32 accumulator does the same."""
    x = np.full((1, channels, 1, 1), 255, np.uint8)
    inits = {"xs": f32(1.0), "xz": np.uint8(0), "w": np.full((1, channels, 1, 1), 127, np.int8), "ws": f32(2.0**-24),
             "wz": np.int8(0), "ys": f32(1.0), "yz": np.uint8(128)}  # fmt: skip
    assert 255 * 127 * channels > 2**31
    got = _check(node_model("QLinearConv", [("x", np.uint8, x.shape)], inits, np.uint8), {"x": x})[0]
    assert got.item() not in (0, 255)  # the exact sum would saturate; the wrapped one does not
    a = np.full((1, channels), 255, np.uint8)
    inits = {"as": f32(1.0), "az": np.uint8(0), "b": np.full((channels, 1), 127, np.int8), "bs": f32(2.0**-24),
             "bz": np.int8(0), "ys": f32(1.0), "yz": np.uint8(128)}  # fmt: skip
    _check(node_model("QLinearMatMul", [("a", np.uint8, a.shape)], inits, np.uint8), {"a": a})


ROW_PATH_CASES = {
    # name: (kernel (kh, kw), attrs, records): every exact grouped 2-D conv takes the row path, every
    # one-group one im2col on a padded copy
    "3x3": ((3, 3), {"pads": [1, 1, 1, 1]}, 3),
    "5x5-asymmetric-pads": ((5, 5), {"pads": [2, 0, 1, 3]}, 2),
    "3x1": ((3, 1), {"pads": [1, 0, 1, 0]}, 2),
    "2x3-horizontal-stride": ((2, 3), {"strides": [1, 2], "pads": [0, 1, 1, 1]}, 2),
    "dilated": ((3, 3), {"dilations": [2, 3], "pads": [2, 3, 1, 0]}, 2),
    "pads-wider-than-kernel": ((3, 3), {"strides": [1, 3], "pads": [3, 4, 2, 5]}, 2),
    "no-pads": ((3, 2), {"strides": [1, 2]}, 2),
    "stride-2": ((3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, 2),
    "stride-3-dilated": ((3, 3), {"strides": [3, 1], "dilations": [2, 1], "pads": [2, 0, 1, 1]}, 2),
    "stride-2-even-kernel": ((4, 2), {"strides": [2, 1], "pads": [1, 0, 2, 1]}, 2),
    "stride-above-kernel": ((2, 3), {"strides": [3, 1]}, 3),
    "1x1": ((1, 1), {}, 2),
    "same-width-dilated": ((3, 3), {"dilations": [1, 2], "pads": [1, 2, 1, 2]}, 2),  # shifted whole rows
    "same-width-5x5-top-only": ((5, 5), {"pads": [4, 2, 0, 2]}, 2),
    "1x1-stride-2-padded": ((1, 1), {"strides": [2, 2], "pads": [1, 0, 0, 1]}, 2),
    "big-accumulator": ((3, 3), {"pads": [1, 1, 1, 1]}, 1),
}


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("chunk", [1 << 23, 700], ids=["one chunk", "row chunks"])
@pytest.mark.parametrize("case", ROW_PATH_CASES)
def test_qlinear_conv_row_path(case: str, chunk: int, threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Exact grouped convolutions add the kernel rows' partial GEMMs (``row_gemm_chunk``), grouped by
    residue modulo the vertical stride: bit-exact with onnxruntime for any kernel, pads, dilation,
    strides, row chunking and thread count (columns come straight from the unpadded input)."""
    from pytest_qaccuracy.backend import parallel
    from pytest_qaccuracy.backend.kernels import conv_chunks, conv_core

    calls = []
    original = conv_core.row_gemm_chunk
    monkeypatch.setattr(conv_chunks, "CHUNK_ELEMENTS", chunk)
    monkeypatch.setattr(conv_chunks, "THREADED_CHUNK_ELEMENTS", chunk)
    monkeypatch.setattr(conv_core, "row_gemm_chunk", lambda *a: calls.append(a[-1].o0) or original(*a))
    shifted = []
    original_shifted = conv_chunks.Source._fill_shifted
    monkeypatch.setattr(conv_chunks.Source, "_fill_shifted", lambda *a: shifted.append(a[-1]) or original_shifted(*a))
    (kh, kw), attrs, records = ROW_PATH_CASES[case]
    rng = np.random.default_rng(len(case))
    c, m = (256, 4) if case == "big-accumulator" else (24, 6) if case.startswith("1x1") else (6, 6)
    x = random_q(rng, np.uint8, (records, c, 11, 10))
    w = random_q(rng, np.int8, (m, c // 2, kh, kw))
    if case == "big-accumulator":  # large same-sign products: the float64 GEMM path
        x = rng.integers(200, 256, x.shape).astype(np.uint8)
        w = rng.integers(-128, -100, w.shape).astype(np.int8)
    ys = f32(300.0) if case == "big-accumulator" else f32(0.37)
    inits = {
        "xs": f32(0.0173), "xz": np.array(7, np.uint8), "w": w, "ws": rng.uniform(0.002, 0.02, m).astype(f32),
        "wz": np.zeros(m, np.int8), "ys": ys, "yz": np.array(127, np.uint8),
        "b": rng.integers(-20000, 20000, m).astype(np.int32),
    }  # fmt: skip
    model = node_model(
        "QLinearConv", [("x", np.uint8, x.shape)], inits, np.uint8, kernel_shape=[kh, kw], group=2, **attrs
    )
    monkeypatch.setattr(parallel, "MIN_PARALLEL_ELEMENTS", 0)
    want = ort_run(model, {"x": x})[0]
    got = IntegerSession(model, threads=threads).run(None, {"x": x})[0]
    assert_same(got, want, case)
    assert _saturated(got) < 0.25
    assert calls, "the row path was not taken"
    whole_rows = {  # output as wide as the input, vertical stride 1: whole image rows, shifted
        "3x3": {-1, 0, 1}, "big-accumulator": {-1, 0, 1}, "3x1": {0}, "1x1": {0},
        "same-width-dilated": {-2, 0, 2}, "same-width-5x5-top-only": {-2, -1, 0, 1, 2},
    }  # fmt: skip
    assert set(shifted) == whole_rows.get(case, set()), "whole shifted rows used (or not) as expected"
    split_rows = chunk == 700 or threads >= 2 * records  # too few records for the threads: rows are shared
    assert (len(set(calls)) > 1) == split_rows, f"row chunks starting at {sorted(set(calls))}"


@pytest.mark.parametrize("case", ROW_PATH_CASES)
def test_qlinear_conv_one_group_takes_im2col(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An exact one-group convolution that onnxruntime does not compute runs im2col on a padded copy
    (the row path gained nothing on whole nets): bit-exact with onnxruntime for every geometry of the
    row path's cases, in row chunks on three threads."""
    from pytest_qaccuracy.backend import parallel
    from pytest_qaccuracy.backend.kernels import conv_chunks, conv_core

    taken: list[str] = []
    real_choose = conv_core.choose_path
    monkeypatch.setattr(conv_core, "choose_path", lambda *a: taken.append(real_choose(*a).__name__) or real_choose(*a))
    monkeypatch.setattr(conv_chunks, "CHUNK_ELEMENTS", 700)
    monkeypatch.setattr(conv_chunks, "THREADED_CHUNK_ELEMENTS", 700)
    monkeypatch.setattr(parallel, "MIN_PARALLEL_ELEMENTS", 0)
    (kh, kw), attrs, records = ROW_PATH_CASES[case]
    rng = np.random.default_rng(len(case) + 100)
    c, m = (256, 4) if case == "big-accumulator" else (6, 5)
    x = random_q(rng, np.uint8, (records, c, 11, 10))
    w = random_q(rng, np.int8, (m, c, kh, kw))
    if case == "big-accumulator":  # large same-sign products: float64 sums
        x = rng.integers(200, 256, x.shape).astype(np.uint8)
        w = rng.integers(-128, -100, w.shape).astype(np.int8)
    inits = {
        "xs": f32(0.0173), "xz": np.array(7, np.uint8), "w": w, "ws": rng.uniform(0.002, 0.02, m).astype(f32),
        "wz": np.zeros(m, np.int8), "ys": f32(300.0) if case == "big-accumulator" else f32(0.37),
        "yz": np.array(127, np.uint8), "b": rng.integers(-20000, 20000, m).astype(np.int32),
    }  # fmt: skip
    model = node_model("QLinearConv", [("x", np.uint8, x.shape)], inits, np.uint8, kernel_shape=[kh, kw], **attrs)
    want = ort_run(model, {"x": x})[0]
    got = IntegerSession(model, threads=3).run(None, {"x": x})[0]
    assert_same(got, want, case)
    assert _saturated(got) < 0.25
    assert taken == ["Im2colPath"]


BIAS_CASES = {
    # name: (x dtype, x zero point, weights, bias, group): the zero point subtracted while the input is
    # read, sums and bias near the bounds of exact float32 sums
    "u8-odd-zp": (np.uint8, 131, "random", 20000, 1),
    "s8-negative-zp": (np.int8, -37, "random", 20000, 1),
    "depthwise": (np.uint8, 99, "random", 20000, 6),
    "grouped": (np.uint8, 77, "random", 20000, 2),
    "conv1d-im2col": (np.uint8, 77, "random", 20000, 1),  # a padded copy
    "zero-zp": (np.uint8, 0, "random", 20000, 1),
    "raw-sums-above-2^24": (np.uint8, 128, "extreme", 20000, 1),  # 255 * sum|w| >= 2^24 > 128 * sum|w|
    # x near its zero point: the bound comes from the data (5 * sum|w|), the bias is large
    "bias-near-2^24": (np.uint8, 255, "positive", 7_000_000, 1),
    # sums up to 128 * sum|w| with a bias of 5M: requantized in float32 only while their sum is exact
    "bias-and-sums-near-2^24": (np.uint8, 128, "positive-any-x", 5_000_000, 1),
}


@pytest.mark.parametrize("case", BIAS_CASES)
def test_qlinear_conv_zero_point_and_bias_near_the_float32_bound(case: str) -> None:
    """The input zero point and the bias at the bounds of exact float32 sums are bit-exact with
    onnxruntime, on the row path, im2col and the depthwise path."""
    xdt, zp, weights, bias, group = BIAS_CASES[case]
    rng = np.random.default_rng(len(case))
    c, m = (6, 6) if group > 1 else (64, 4)
    spatial, kernel, pads = ((10,), [3], [1, 2]) if case.startswith("conv1d") else ((9, 10), [3, 3], [1, 2, 0, 1])
    x = random_q(rng, xdt, (2, c, *spatial))
    w = random_q(rng, np.int8, (m, c // group, *kernel))
    if weights == "extreme":  # sum|w| = 576 * 127 = 73152: 128 * 73152 < 2^24 <= 255 * 73152
        w = np.where(rng.random(w.shape) < 0.5, -127, 127).astype(np.int8)
    if weights.startswith("positive"):  # sum(w) = 576 * ~70: 255 * sum(w) is above 2^23 but below 2^24
        w = rng.integers(60, 81, w.shape).astype(np.int8)
    if weights == "positive":
        x = rng.integers(250, 256, x.shape).astype(xdt)
    scale = {"random": 0.9, "extreme": 40.0, "positive": 3.0, "positive-any-x": 30.0}[weights]
    inits = {
        "xs": f32(0.011), "xz": np.array(zp, xdt), "w": w, "ws": rng.uniform(0.001, 0.003, m).astype(f32),
        "wz": np.zeros(m, np.int8), "ys": f32(scale), "yz": np.array(120 if xdt == np.uint8 else -8, xdt),
        "b": np.full(m, bias, np.int32) * np.where(np.arange(m) % 2, 1, -1).astype(np.int32),
    }  # fmt: skip
    model = node_model("QLinearConv", [("x", xdt, x.shape)], inits, xdt, kernel_shape=kernel, pads=pads, group=group)
    want = ort_run(model, {"x": x})[0]
    got = IntegerSession(model).run(None, {"x": x})[0]
    assert_same(got, want, case)
    assert _saturated(got) < 0.5


DEPTHWISE_CASES = {
    # name: (channels, multiplier, (h, w), attrs); the name's first word is the path a float depthwise
    # convolution takes: flat (stride 1, >= 64 output columns), nhwc (channels >= output columns),
    # rows (the rest); integer ones all take the row path
    "flat": (6, 1, (5, 70), {"pads": [1, 1, 1, 1]}),
    "flat-dilated-asymmetric": (4, 1, (6, 72), {"dilations": [2, 3], "pads": [2, 3, 1, 4]}),
    "flat-multiplier-2": (3, 2, (4, 66), {"pads": [0, 1, 2, 1]}),
    "nhwc-stride-2": (6, 1, (9, 11), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "nhwc-dilated-asymmetric": (12, 1, (7, 8), {"dilations": [2, 1], "pads": [2, 0, 1, 3]}),
    "nhwc-stride-1x3": (9, 1, (6, 14), {"strides": [1, 3], "pads": [1, 1, 1, 1]}),
    "rows-narrow": (5, 1, (7, 9), {"pads": [1, 0, 1, 2]}),
    "rows-multiplier-3-stride-3x1": (2, 3, (10, 8), {"strides": [3, 1], "pads": [1, 1, 0, 0]}),
}


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("chunk", [1 << 22, 500], ids=["one chunk", "row chunks"])
@pytest.mark.parametrize("case", DEPTHWISE_CASES)
def test_qlinear_conv_depthwise_row_path(case: str, chunk: int, threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Integer depthwise convolutions take the row path with pairs of channels as block-diagonal
    GEMMs (odd channel counts: one channel per GEMM): bit-exact with onnxruntime for any pads,
    dilation, stride, multiplier, chunking and thread count (tiny maps, which take the channels-last
    taps, are sent down the row path here)."""
    from pytest_qaccuracy.backend import parallel
    from pytest_qaccuracy.backend.kernels import conv_chunks, conv_core

    blocks = []
    original = conv_core.row_gemm_chunk
    monkeypatch.setattr(conv_core, "row_gemm_chunk", lambda *a: blocks.append(a[0].x.shape[1]) or original(*a))
    monkeypatch.setattr(conv_chunks, "CHUNK_ELEMENTS", chunk)
    monkeypatch.setattr(conv_chunks, "THREADED_CHUNK_ELEMENTS", chunk)
    monkeypatch.setattr(parallel, "MIN_PARALLEL_ELEMENTS", 0)
    monkeypatch.setattr(conv_core, "NHWC_MAX_POSITIONS", 0)
    c, multiplier, (h, w_), attrs = DEPTHWISE_CASES[case]
    rng = np.random.default_rng(len(case))
    x = random_q(rng, np.uint8, (3, c, h, w_))
    w = random_q(rng, np.int8, (c * multiplier, 1, 3, 3))
    inits = {
        "xs": f32(0.021), "xz": np.array(131, np.uint8), "w": w,
        "ws": rng.uniform(0.002, 0.02, c * multiplier).astype(f32), "wz": np.zeros(c * multiplier, np.int8),
        "ys": f32(0.09), "yz": np.array(121, np.uint8), "b": rng.integers(-3000, 3000, c * multiplier).astype(np.int32),
    }  # fmt: skip
    model = node_model(
        "QLinearConv", [("x", np.uint8, x.shape)], inits, np.uint8, kernel_shape=[3, 3], group=c, **attrs
    )
    want = ort_run(model, {"x": x})[0]
    got = IntegerSession(model, threads=threads).run(None, {"x": x})[0]
    assert_same(got, want, case)
    assert _saturated(got) < 0.25
    assert set(blocks) == {c // 2 if c % 2 == 0 else c}, f"{case}: blocks {sorted(set(blocks))}"
    if chunk == 500:
        assert len(blocks) > 1, "small chunks were not used"


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("kernel", [3, 5])
def test_depthwise_on_a_tiny_map_takes_the_channels_last_taps(stride: int, kernel: int, monkeypatch) -> None:
    """A depthwise layer on a 4x6-output map (PP-LCNet's last stages) runs channels last, tap by tap,
    bit-exact with onnxruntime."""
    from pytest_qaccuracy.backend.kernels import conv_core

    taken: list[str] = []
    real_choose = conv_core.choose_path

    def choose(*args, **kwargs):
        kind = real_choose(*args, **kwargs)
        taken.append(kind.__name__)
        return kind

    monkeypatch.setattr(conv_core, "choose_path", choose)
    rng = np.random.default_rng(kernel + stride)
    c, pad = 48, kernel // 2
    x = random_q(rng, np.uint8, (5, c, 4 * stride, 6 * stride))
    w = random_q(rng, np.int8, (c, 1, kernel, kernel))
    inits = {
        "xs": f32(0.021), "xz": np.array(131, np.uint8), "w": w,
        "ws": rng.uniform(0.002, 0.02, c).astype(f32), "wz": np.zeros(c, np.int8),
        "ys": f32(0.09), "yz": np.array(121, np.uint8), "b": rng.integers(-3000, 3000, c).astype(np.int32),
    }  # fmt: skip
    model = node_model(
        "QLinearConv", [("x", np.uint8, x.shape)], inits, np.uint8, kernel_shape=[kernel, kernel], group=c,
        pads=[pad] * 4, strides=[stride, stride],
    )  # fmt: skip
    want = ort_run(model, {"x": x})[0]
    assert want.shape[2:] == (4, 6)
    got = IntegerSession(model).run(None, {"x": x})[0]
    assert_same(got, want, f"{kernel}x{kernel} stride {stride}")
    assert taken == ["NhwcPath"]


@pytest.mark.parametrize("chunk", [1 << 22, 500], ids=["one chunk", "row chunks"])
@pytest.mark.parametrize("case", DEPTHWISE_CASES)
def test_float_depthwise_paths(case: str, chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Float depthwise convolutions multiply-accumulate tap by tap on chunks read from the unpadded
    input, on the padded width when rows are long and channels last when channels outnumber columns.
    On integer-valued floats every order of summation is exact, so each path must equal a direct
    int64 correlation."""
    from pytest_qaccuracy.backend import parallel
    from pytest_qaccuracy.backend.kernels import conv_chunks, conv_core

    taken = []
    for path, name in (("flat", "flat"), ("nhwc", "nhwc"), ("source", "rows")):
        original = getattr(conv_core, f"depthwise_{name}_chunk")
        monkeypatch.setattr(
            conv_core,
            f"depthwise_{name}_chunk",
            lambda *a, path=path, original=original: taken.append(path) or original(*a),
        )
    monkeypatch.setattr(conv_chunks, "DEPTHWISE_CHUNK_ELEMENTS", chunk)
    monkeypatch.setattr(conv_chunks, "CHUNK_ELEMENTS", chunk)  # the padded-width path's budget
    monkeypatch.setattr(conv_chunks, "THREADED_CHUNK_ELEMENTS", chunk)
    monkeypatch.setattr(parallel, "MIN_PARALLEL_ELEMENTS", 0)
    c, multiplier, (h, w_), attrs = DEPTHWISE_CASES[case]
    rng = np.random.default_rng(len(case))
    x = rng.integers(-128, 128, (3, c, h, w_))
    w = rng.integers(-127, 128, (c * multiplier, 1, 3, 3))
    strides, dilations = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
    pads = attrs["pads"]
    got = conv_core.conv_core(x.astype(f32), w.astype(f32), c, tuple(strides), tuple(dilations), f32, pads=pads)
    padded = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    (sh, sw), (dh, dw) = strides, dilations
    oh, ow = (padded.shape[2] - 2 * dh - 1) // sh + 1, (padded.shape[3] - 2 * dw - 1) // sw + 1
    want = np.zeros((3, c * multiplier, oh, ow), np.int64)
    source = np.repeat(padded, multiplier, axis=1)  # output channel m reads input channel m // multiplier
    for i in range(3):
        for j in range(3):
            window = source[:, :, i * dh : i * dh + (oh - 1) * sh + 1 : sh, j * dw : j * dw + (ow - 1) * sw + 1 : sw]
            want += window * w[None, :, 0, i, j, None, None]
    np.testing.assert_array_equal(got, want.astype(f32), err_msg=case)
    expected = {"flat": "flat", "nhwc": "nhwc", "rows": "source"}[case.split("-")[0]]
    assert set(taken) == {expected}, f"{case}: took {sorted(set(taken))}"
    if chunk == 500:
        assert len(taken) > 1, "small chunks were not used"
