"""Elementwise ops: QLinearAdd, QLinearMul, table-driven QLinearSigmoid/LeakyRelu, and float kernels.

8-bit unary ops are 256-entry tables built in float32 (dequantize, op, quantize), as ORT's
``qlinear_lookup_table.cc`` does; the same tables are exactly ORT's unfused ``DQ -> op -> Q`` float path.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from pytest_qaccuracy.backend import arith, parallel
from pytest_qaccuracy.backend.kernels import neon
from pytest_qaccuracy.backend.registry import INTERNAL_DOMAIN, kernel
from pytest_qaccuracy.backend.scheme import Scheme

MS = "com.microsoft"

# MLAS logistic: Eigen's rational approximation on [-18, 18] (mlas/lib/logistic.cpp); learnt constants.
_ALPHA = np.array([4.37031012579801e-11, 1.15627324459942e-07, 6.08574864600143e-05, 8.51377133304701e-03,
                   2.48287947061529e-01], dtype=np.float32)  # fmt: skip
_BETA = np.array([6.10247389755681e-13, 5.76102136993427e-09, 6.29106785017040e-06, 1.70198817374094e-03,
                  1.16817656904453e-01, 9.93151921023180e-01], dtype=np.float32)  # fmt: skip


def logistic(x: np.ndarray, scheme: Scheme) -> np.ndarray:
    """float32 logistic: MLAS's FMA polynomial (``float_kernels='mlas'``) or ``1 / (1 + exp(-x))``."""
    x = np.asarray(x, np.float32)
    if scheme.float_kernels != "mlas":
        with np.errstate(over="ignore"):  # exp(-x) = inf below x = -88 gives the exact limit 0
            return (np.float32(1) / (np.float32(1) + np.exp(-x))).astype(np.float32)
    v = np.clip(x, np.float32(-18), np.float32(18))
    v2 = (v * v).astype(np.float32)
    p = arith.fma32(v2, _ALPHA[0], _ALPHA[1])
    for coef in _ALPHA[2:]:
        p = arith.fma32(p, v2, coef)
    p = (p * v).astype(np.float32)
    q = arith.fma32(v2, _BETA[0], _BETA[1])
    for coef in _BETA[2:]:
        q = arith.fma32(q, v2, coef)
    return np.clip((p / q).astype(np.float32) + np.float32(0.5), np.float32(0), np.float32(1))


def lookup_table(
    fn: Callable[[np.ndarray], np.ndarray],
    x_dtype: np.dtype,
    x_scale: np.ndarray,
    x_zp: np.ndarray | None,
    y_scale: np.ndarray,
    y_zp: np.ndarray | None,
    y_dtype: np.dtype,
    scheme: Scheme,
) -> np.ndarray:
    """``table[q - qmin] = quantize(fn(dequantize(q)))`` for every 8-bit ``q`` (float32 throughout)."""
    lo, hi = arith.qrange(x_dtype)
    q = np.arange(lo, hi + 1)
    v = arith.dequantize(
        q, np.asarray(x_scale, np.float32).reshape(()), None if x_zp is None else np.asarray(x_zp).reshape(())
    )
    out = np.asarray(fn(v.astype(np.float32)), dtype=np.float32)
    zp = np.zeros((), y_dtype) if y_zp is None else np.asarray(y_zp).reshape(())
    return arith.quantize_float(out, np.asarray(y_scale, np.float32).reshape(()), zp, y_dtype, scheme)


def lookup_bytes(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    """``table[b]`` for the raw byte ``b`` of each element of the 8-bit ``x`` (a 256-entry table in
    byte order), split over the session's threads; a 0-d ``x`` gives a 0-d result."""
    raw = x.view(np.uint8)
    out = np.empty(x.shape, table.dtype)

    def gather(target: np.ndarray, block: np.ndarray) -> None:
        np.take(table, block, out=target, mode="clip")  # every byte is an index: "clip" avoids a copy

    if not parallel.blockwise(gather, out, raw):
        gather(out, raw)
    return out


def byte_order(table: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A 256-entry table in value order (``table[q - qmin]``) rearranged in raw byte order: int8's
    bytes are its offset-binary pattern with the sign bit flipped."""
    return table[np.arange(256) ^ 0x80] if np.dtype(dtype) == np.int8 else table


def apply_table(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    """``table[x - qmin]``; 8-bit values index directly (int8 through its offset-binary bit pattern)."""
    if x.dtype == np.uint8 or x.dtype == np.int8:
        return lookup_bytes(x, byte_order(table, x.dtype))
    return table[x.astype(np.intp) - arith.qrange(x.dtype)[0]]


def _out_dtype(y_zp: np.ndarray | None, x: np.ndarray) -> np.dtype:
    return np.asarray(y_zp).dtype if y_zp is not None else x.dtype


@kernel(MS, "QLinearSigmoid", 1, scheme=True)
def qlinear_sigmoid(
    X: np.ndarray,
    X_scale: np.ndarray,
    X_zero_point: np.ndarray | None,
    Y_scale: np.ndarray,
    Y_zero_point: np.ndarray | None = None,
    *,
    scheme: Scheme,
) -> tuple[np.ndarray]:
    dtype = _out_dtype(Y_zero_point, X)
    table = lookup_table(
        lambda v: logistic(v, scheme), X.dtype, X_scale, X_zero_point, Y_scale, Y_zero_point, dtype, scheme
    )
    return (apply_table(X, table),)


@kernel(MS, "QLinearLeakyRelu", 1, scheme=True)
def qlinear_leaky_relu(
    X: np.ndarray,
    X_scale: np.ndarray,
    X_zero_point: np.ndarray | None,
    Y_scale: np.ndarray,
    Y_zero_point: np.ndarray | None = None,
    *,
    alpha: float = 0.01,
    scheme: Scheme,
) -> tuple[np.ndarray]:
    dtype = _out_dtype(Y_zero_point, X)
    a = np.float32(alpha)

    def leaky(v: np.ndarray) -> np.ndarray:
        return np.where(v >= 0, v, (a * v).astype(np.float32))

    table = lookup_table(leaky, X.dtype, X_scale, X_zero_point, Y_scale, Y_zero_point, dtype, scheme)
    return (apply_table(X, table),)


@kernel(INTERNAL_DOMAIN, "QLinearLookup", 1, scheme=True)
def qlinear_lookup(
    X: np.ndarray,
    X_scale: np.ndarray,
    X_zero_point: np.ndarray | None,
    Y_scale: np.ndarray,
    Y_zero_point: np.ndarray | None,
    low: np.ndarray | None = None,
    high: np.ndarray | None = None,
    *,
    function: str,
    min: float | None = None,
    max: float | None = None,
    scheme: Scheme,
) -> tuple[np.ndarray]:
    """Fused ``DQ -> Relu|Clip -> Q`` as a table (exactly ORT's float path for these ops)."""
    lo_v = np.float32(-np.inf if low is None else low) if min is None else np.float32(min)
    hi_v = np.float32(np.inf if high is None else high) if max is None else np.float32(max)
    if function == "Relu":
        lo_v, hi_v = np.float32(0), np.float32(np.inf)
    dtype = _out_dtype(Y_zero_point, X)
    table = lookup_table(
        lambda v: np.clip(v, lo_v, hi_v), X.dtype, X_scale, X_zero_point, Y_scale, Y_zero_point, dtype, scheme
    )
    return (apply_table(X, table),)


@kernel(INTERNAL_DOMAIN, "Requantize", 1, scheme=True)
def requantize_table(
    X: np.ndarray,
    X_scale: np.ndarray,
    X_zero_point: np.ndarray | None,
    Y_scale: np.ndarray,
    Y_zero_point: np.ndarray | None = None,
    *,
    scheme: Scheme,
) -> tuple[np.ndarray]:
    """``Q(DQ(x))`` with different parameters: what a data-movement op between them computes."""
    dtype = _out_dtype(Y_zero_point, X)
    table = lookup_table(lambda v: v, X.dtype, X_scale, X_zero_point, Y_scale, Y_zero_point, dtype, scheme)
    return (apply_table(X, table),)


def _scalar_span(x: np.ndarray, out_shape: tuple[int, ...]) -> bool:
    """Whether ORT's broadcaster feeds ``x`` as one value per innermost span (then folded in a constant)."""
    if x.size == 1:
        return True
    shape = (1,) * (len(out_shape) - x.ndim) + x.shape
    axes = [i for i, d in enumerate(out_shape) if d != 1]
    return bool(axes) and shape[axes[-1]] == 1


def _add_mlas(
    a: np.ndarray,
    a_s: np.ndarray,
    a_zp: np.ndarray | float | int,
    b: np.ndarray,
    b_s: np.ndarray,
    b_zp: np.ndarray | float | int,
    c_s: np.ndarray,
    c_zp: np.ndarray | float | int,
    dtype: np.dtype,
    spans: tuple[bool, bool],
) -> np.ndarray:
    """MLAS AVX2 QLinearAdd: float32 ratios, a folded constant and two FMAs, RNE, int16 then 8-bit saturation.

    The constant ``zp_c - (r_a zp_a + r_b zp_b)`` is one FMA too: the compiler contracts ``r_a zp_a +
    (r_b zp_b)`` (b's product rounded first). With both products rounded, 3 of the 917,504 input pairs
    of the mobile bench net's 14 additions came out one step off onnxruntime (1.18 and 1.32 alike).
    """
    f32 = np.float32
    r_a = f32(f32(a_s) / f32(c_s))
    r_b = f32(f32(b_s) / f32(c_s))
    fixed = f32(f32(c_zp) - arith.fma32(np.asarray(r_a), f32(a_zp), f32(r_b * f32(b_zp))))
    fa, fb = a.astype(f32), b.astype(f32)
    # b's term first, then a's; but when a holds one value per span, the per-span constant
    # fixed + a * r_a comes first (the compiler contracts it into one FMA) and b's term after it
    if spans[0]:
        t = arith.fma32(fb, r_b, arith.fma32(fa, r_a, fixed))
    else:
        t = arith.fma32(fa, r_a, arith.fma32(fb, r_b, fixed))
    return arith.saturate(np.clip(np.rint(t), -32768, 32767), dtype)


def _add_fixed(
    a: np.ndarray,
    a_s: np.ndarray,
    a_zp: np.ndarray | float | int,
    b: np.ndarray,
    b_s: np.ndarray,
    b_zp: np.ndarray | float | int,
    c_s: np.ndarray,
    c_zp: np.ndarray | float | int,
    dtype: np.dtype,
    scheme: Scheme,
) -> np.ndarray:
    """TFLite ADD: inputs shifted left 20 bits, rescaled by Q31 multipliers, summed, rescaled again."""
    bits = 31 if scheme.multiplier == "q31" else 15
    left_shift = 20 if np.dtype(dtype).itemsize == 1 else 15
    twice_max = 2.0 * max(float(a_s), float(b_s))
    terms = []
    for x, s, zp in ((a, a_s, a_zp), (b, b_s, b_zp)):
        q, sh = arith.quantize_multiplier(float(s) / twice_max, bits)
        shifted = (x.astype(np.int64) - int(zp)) << left_shift
        terms.append(
            arith.multiply_by_quantized_multiplier(
                shifted, q, sh, bits=bits, double_rounding=scheme.double_rounding, rounding=scheme.rounding
            )
        )
    q, sh = arith.quantize_multiplier(twice_max / (2.0**left_shift * float(c_s)), bits)
    total = arith.multiply_by_quantized_multiplier(
        terms[0] + terms[1], q, sh, bits=bits, double_rounding=scheme.double_rounding, rounding=scheme.rounding
    )
    return arith.saturate(total + int(c_zp), dtype)


def _add(
    a: np.ndarray,
    a_s: np.ndarray,
    a_zp: np.ndarray | float | int,
    b: np.ndarray,
    b_s: np.ndarray,
    b_zp: np.ndarray | float | int,
    c_s: np.ndarray,
    c_zp: np.ndarray | float | int,
    dtype: np.dtype,
    scheme: Scheme,
    spans: tuple[bool, bool],
) -> np.ndarray:
    """QLinearAdd on broadcastable integer arrays, as the scheme computes it."""
    if scheme.qlinear_binary == "mlas_neon":
        return neon.add(a, a_s, a_zp, b, b_s, b_zp, c_s, c_zp, dtype)
    if scheme.multiplier == "float32":
        return _add_mlas(a, a_s, a_zp, b, b_s, b_zp, c_s, c_zp, dtype, spans)
    if scheme.multiplier in ("q31", "q15"):
        return _add_fixed(a, a_s, a_zp, b, b_s, b_zp, c_s, c_zp, dtype, scheme)
    if scheme.multiplier == "float64":
        value = ((a.astype(np.float64) - a_zp) * float(a_s) + (b.astype(np.float64) - b_zp) * float(b_s)) / float(c_s)
        return arith.requantize_float(value, c_zp, dtype, scheme, "add")
    # power2 / glow: each input rescaled to the output scale on its own (two roundings), then added
    parts = [
        arith.requantize(x.astype(np.int64) - zp, arith.real_multiplier([s], c_s, scheme), 0, np.int32, scheme, "add")
        for x, s, zp in ((a, a_s, a_zp), (b, b_s, b_zp))
    ]
    return arith.saturate(parts[0].astype(np.int64) + parts[1] + c_zp, dtype)


#: pair tables by their parameters (64 KiB each): a model's adds and muls reuse theirs on every run
_PAIR_TABLES: dict[tuple, np.ndarray] = {}
_PAIR_TABLES_MAX = 256
_PAIR_TABLES_LOCK = threading.Lock()


def param_key(*values: object) -> tuple:
    """A hashable key of exact parameter values (dtype and bytes of each array or scalar)."""
    key = []
    for value in values:
        if isinstance(value, Scheme | str | bool | tuple | type(None)):
            key.append(value)
        else:
            array = np.asarray(value)
            key.append((array.dtype.str, array.shape, array.tobytes()))
    return tuple(key)


def binary_table_apply(
    fn: Callable[[np.ndarray, np.ndarray], np.ndarray], a: np.ndarray, b: np.ndarray, key: tuple | None = None
) -> np.ndarray:
    """``fn(a, b)`` for 8-bit ``a``, ``b``: evaluated once on all 65536 pairs, then one gather per element.

    Exact for any elementwise formula with fixed parameters, and much cheaper than the float64/int64
    formula on large tensors. With ``key`` (every parameter ``fn`` depends on, see :func:`param_key`)
    the table is kept for the next call with the same key.
    """
    full_key = None if key is None else (key, a.dtype.str, b.dtype.str)
    with _PAIR_TABLES_LOCK:
        table = _PAIR_TABLES.get(full_key) if full_key is not None else None
    if table is None:
        lo_a, lo_b = arith.qrange(a.dtype)[0], arith.qrange(b.dtype)[0]
        grid_a = np.arange(lo_a, lo_a + 256).astype(a.dtype)[:, None]
        grid_b = np.arange(lo_b, lo_b + 256).astype(b.dtype)[None, :]
        table = np.ascontiguousarray(fn(grid_a, grid_b)).reshape(-1)
        if full_key is not None:
            with _PAIR_TABLES_LOCK:
                if len(_PAIR_TABLES) >= _PAIR_TABLES_MAX:
                    _PAIR_TABLES.pop(next(iter(_PAIR_TABLES)))  # the oldest entry
                _PAIR_TABLES[full_key] = table
    # int8 indexes by its offset-binary pattern: the sign bit of each byte flipped
    flips = (0x8000 if a.dtype == np.int8 else 0) | (0x80 if b.dtype == np.int8 else 0)

    def gather(out: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
        index = parallel.scratch(x.size, np.uint16, "pair-index").reshape(x.shape)
        np.multiply(x, np.uint16(256), out=index, dtype=np.uint16)  # measured: faster than copy + shift
        np.add(index, y, out=index)  # the low byte is free: adding is or-ing
        if flips:
            index ^= flips
        np.take(table, index, out=out, mode="clip")  # every index is in range; "clip" avoids a copy

    ua, ub = a.view(np.uint8), b.view(np.uint8)
    out = np.empty(np.broadcast_shapes(a.shape, b.shape), table.dtype)
    lut = _operand_table(table, ua, ub, flips, out.shape)
    if lut is not None:  # one operand is a single value: a 256-entry table of the other's bytes
        return lookup_bytes(ua if ua.shape == out.shape else ub, lut)
    if not parallel.blockwise(gather, out, ua, ub):  # broadcasting or strided operands: by leading index
        _broadcast_gather(table, flips, ua, ub, out)
    return out


def _broadcast_gather(table: np.ndarray, flips: int, ua: np.ndarray, ub: np.ndarray, out: np.ndarray) -> None:
    """The pair table's gather where one operand broadcasts (a per-channel scale): the smaller operand
    takes the high byte of the index, shifted once, and the larger one is added to it in one pass
    (the table transposed when the larger one is ``a``); records split over the threads."""
    square = table.reshape(256, 256)
    if ua.size > ub.size:  # index by (b, a): the transposed table
        square, ua, ub, flips = square.T, ub, ua, ((flips & 0xFF) << 8) | (flips >> 8)
    # every index as raw bytes (int8's offset-binary flip folded into the table, once per call)
    rows, columns = np.arange(256) ^ (flips >> 8), np.arange(256) ^ (flips & 0xFF)
    raw = np.ascontiguousarray(square[rows[:, None], columns[None, :]]).reshape(-1)
    high = ua.astype(np.uint16) << 8  # the smaller operand
    xh, xl = np.broadcast_arrays(high, ub)

    def part(target: np.ndarray, h: np.ndarray, low: np.ndarray) -> None:
        index = parallel.scratch(target.size, np.uint16, "pair-index").reshape(target.shape)
        np.add(h, low, out=index, dtype=np.uint16)  # the low byte is free: adding is or-ing
        np.take(raw, index, out=target, mode="clip")

    if out.ndim == 0:
        part(out, xh, xl)
        return
    spans = parallel.split_records(out.shape)
    parallel.run_all([lambda a=a, b=b: part(out[a:b], xh[a:b], xl[a:b]) for a, b in spans])


def _operand_table(
    table: np.ndarray, ua: np.ndarray, ub: np.ndarray, flips: int, shape: tuple[int, ...]
) -> np.ndarray | None:
    """The pair table's row (or column) at a single-valued operand, indexed by the other operand's raw
    byte; None unless one operand holds one value and the other has the output's shape."""
    if ub.size == 1 and ua.shape == shape:
        fixed = (int(ub.reshape(-1)[0]) ^ (flips & 0xFF)) & 0xFF
        return table[((np.arange(256) ^ (flips >> 8)) << 8) | fixed]
    if ua.size == 1 and ub.shape == shape:
        fixed = (int(ua.reshape(-1)[0]) ^ (flips >> 8)) & 0xFF
        return table[(fixed << 8) | (np.arange(256) ^ (flips & 0xFF))]
    return None


def _eight_bit(*arrays: np.ndarray) -> bool:
    return all(x.dtype in (np.dtype(np.uint8), np.dtype(np.int8)) for x in arrays)


@kernel(MS, "QLinearAdd", 1, scheme=True)
def qlinear_add(
    A: np.ndarray,
    A_scale: np.ndarray,
    A_zero_point: np.ndarray | None,
    B: np.ndarray,
    B_scale: np.ndarray,
    B_zero_point: np.ndarray | None,
    C_scale: np.ndarray,
    C_zero_point: np.ndarray | None = None,
    *,
    scheme: Scheme,
) -> tuple[np.ndarray]:
    """``C = (A_s(A - A_zp) + B_s(B - B_zp)) / C_s + C_zp`` as the scheme computes it."""
    dtype = _out_dtype(C_zero_point, A)
    a_zp = arith.scalar(A_zero_point)
    b_zp = arith.scalar(B_zero_point)
    c_zp = arith.scalar(C_zero_point)
    a_s, b_s, c_s = (np.asarray(s).reshape(()) for s in (A_scale, B_scale, C_scale))
    out_shape = np.broadcast_shapes(A.shape, B.shape)
    spans = (_scalar_span(A, out_shape), _scalar_span(B, out_shape))

    def formula(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return _add(a, a_s, a_zp, b, b_s, b_zp, c_s, c_zp, dtype, scheme, spans)

    if not _eight_bit(A, B):
        return (formula(A, B),)
    key = param_key("QLinearAdd", a_s, a_zp, b_s, b_zp, c_s, c_zp, np.dtype(dtype).str, scheme, spans)
    return (binary_table_apply(formula, A, B, key),)


@kernel(MS, "QLinearMul", 1, scheme=True)
def qlinear_mul(
    A: np.ndarray,
    A_scale: np.ndarray,
    A_zero_point: np.ndarray | None,
    B: np.ndarray,
    B_scale: np.ndarray,
    B_zero_point: np.ndarray | None,
    C_scale: np.ndarray,
    C_zero_point: np.ndarray | None = None,
    *,
    scheme: Scheme,
) -> tuple[np.ndarray]:
    """``C = (A - A_zp)(B - B_zp) * A_s B_s / C_s + C_zp``; the product is exact in int32."""
    dtype = _out_dtype(C_zero_point, A)
    a_zp = np.int64(arith.scalar(A_zero_point))
    b_zp = np.int64(arith.scalar(B_zero_point))
    multiplier = arith.real_multiplier([A_scale, B_scale], C_scale, scheme)
    c_zp = 0 if C_zero_point is None else C_zero_point

    def formula(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if scheme.qlinear_binary == "mlas_neon":
            return neon.mul(a, a_zp, b, b_zp, multiplier, c_zp, dtype)
        product = (a.astype(np.int64) - a_zp) * (b.astype(np.int64) - b_zp)
        return arith.requantize(product, multiplier, c_zp, dtype, scheme, "mul")

    if not _eight_bit(A, B):
        return (formula(A, B),)
    key = param_key("QLinearMul", a_zp, b_zp, multiplier, c_zp, np.dtype(dtype).str, scheme)
    return (binary_table_apply(formula, A, B, key),)


# -- float kernels ------------------------------------------------------------------------------


def _binary(op_type: str, fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> None:
    @kernel("", op_type, 7, float_op=True)
    def run(A: np.ndarray, B: np.ndarray) -> tuple[np.ndarray]:
        y = fn(A, B)
        return (y.astype(A.dtype, copy=False),)

    run.__name__ = op_type.lower()


_binary("Add", np.add)
_binary("Sub", np.subtract)
_binary("Mul", np.multiply)


@kernel("", "Relu", 6, float_op=True)
def relu(X: np.ndarray) -> tuple[np.ndarray]:
    return (np.maximum(X, X.dtype.type(0)),)


@kernel("", "Sigmoid", 6, float_op=True)
def sigmoid(X: np.ndarray) -> tuple[np.ndarray]:
    return ((1 / (1 + np.exp(-X))).astype(X.dtype),)


@kernel("", "Clip", 11, float_op=True)
def clip(input: np.ndarray, min: np.ndarray | None = None, max: np.ndarray | None = None) -> tuple[np.ndarray]:
    y = input
    if min is not None:
        y = np.maximum(y, min)
    if max is not None:
        y = np.minimum(y, max)
    return (y.astype(input.dtype, copy=False),)


@kernel("", "Identity", 1)
def identity(x: np.ndarray) -> tuple[np.ndarray]:
    return (x,)
