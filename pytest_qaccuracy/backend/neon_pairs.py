"""The int16 pair wrap of onnxruntime's ARM64 integer kernels on CPUs without dot-product instructions.

Without ``sdot``/``udot`` MLAS multiplies int8 by int8 with ``smull`` (eight products into int16 lanes)
and adds the product eight places further along the reduction axis with ``smlal``, which wraps around
in int16, before ``sadalp`` widens the lanes to int32 exactly (``QgemmS8S8KernelNeon.S``). uint8
activations are first flipped to int8 (``a ^ 0x80``, i.e. ``a - 128``), weights stay int8. So, in
blocks of 16 along the reduction axis (zero-padded)::

    acc = sum_blocks sum_{i<8} wrap16(a[16j + i] b[16j + i] + a[16j + i + 8] b[16j + i + 8])

A product of two int8 values lies in ``[-16256, 16384]``, so a pair only wraps when both products are
``(-128) * (-128)``: the sum ``32768`` becomes ``-32768``. The exact sums are therefore corrected by
``-65536`` per such pair, counted as a product of 0/1 matrices. ``(-128)`` weights never appear in
models quantized symmetrically to ``[-127, 127]`` (onnxruntime's quantizer, TFLite, NNCF, ...).

Measured with onnxruntime 1.32's aarch64 wheel under qemu (docs/cpus.md): GEMMs with int8 weights
(MatMulInteger, QLinearMatMul, QGemm) for int8 and uint8 activations, and uint8 x int8 convolutions other
than depthwise, whose reduction axis runs ``(kh, kw, cin)``; int8 x int8 convolutions sum exactly
(MLAS's symmetric convolution kernel, 1.30 and later; 1.18 through 1.29 pair them as uint8 x int8 ones,
``Scheme.neon_int8_conv_pairs``), uint8 x uint8 products too. Depthwise convolutions pair kernel
taps instead, on every ARM64 CPU (:func:`depthwise_correction`).
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

from pytest_qaccuracy.backend import pairs

WRAP = 1 << 16
_BLOCK = 16


class NotEmulated(Exception):
    """A kernel variant whose pair wrap is not emulated (the interpreter names the node and op)."""


#: id(weights) -> (a weak reference to them, whether they hold -128): a session's constant convolution
#: weights are checked once, not on every run
_HAS_MIN: dict[int, tuple[weakref.ref, bool]] = {}
_HAS_MIN_LOCK = threading.Lock()


def _has_int8_min(w: np.ndarray) -> bool:
    """Whether ``w`` holds ``-128``, remembered for as long as the array lives."""
    key = id(w)
    with _HAS_MIN_LOCK:
        entry = _HAS_MIN.get(key)
    if entry is not None and entry[0]() is w:
        return entry[1]
    found = bool((w == -128).any())
    try:
        ref = weakref.ref(w, lambda _, key=key: _HAS_MIN.pop(key, None))
    except TypeError:  # not weak-referenceable (a view of a buffer): not remembered
        return found
    with _HAS_MIN_LOCK:
        _HAS_MIN[key] = (ref, found)
    return found


def _count(total: int, count: np.ndarray | None = None) -> None:
    """Report ``total`` pair sums, and the wrapped ones in ``count`` (axis 0: records), to the saturation
    counter of ``qaccuracy saturation`` when one is active (:mod:`pytest_qaccuracy.backend.pairs`)."""
    if pairs.counter is None:
        return
    if count is None or count.ndim == 0:
        pairs.count(total, np.zeros(0, np.int64))
        return
    per_record = count.sum(axis=tuple(range(1, count.ndim))).astype(np.int64)  # any size, no records too
    pairs.count(total, np.repeat(np.arange(per_record.size), per_record))


def _blocks(k: int) -> int:
    """Pair sums along a reduction axis of ``k``: eight per 16-deep block."""
    return -(-k // _BLOCK) * (_BLOCK // 2)


def _pair_mask(hits: np.ndarray) -> np.ndarray:
    """``hits[..., K]`` (bool) -> ``[..., K16 / 2]``: both members of each ``(k, k + 8)`` pair hit."""
    k = hits.shape[-1]
    padded = -(-k // _BLOCK) * _BLOCK
    if padded != k:
        widths = [(0, 0)] * (hits.ndim - 1) + [(0, padded - k)]
        hits = np.pad(hits, widths)
    blocks = hits.reshape(*hits.shape[:-1], padded // _BLOCK, 2, _BLOCK // 2)
    return (blocks[..., 0, :] & blocks[..., 1, :]).reshape(*hits.shape[:-1], padded // 2)


def _as_int8_min(x: np.ndarray) -> np.ndarray:
    """Where the operand is ``-128`` once MLAS has made it int8 (uint8 ``0`` is ``-128`` after the flip)."""
    return x == (0 if x.dtype == np.uint8 else -128)


def gemm_correction(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """``-65536 x`` the wrapped pairs of ``a @ b`` (``a`` 8-bit ``[..., M, K]``, ``b`` int8 ``[..., K, N]``),
    or None when no pair of ``b`` can wrap."""
    if b.dtype != np.int8 or a.dtype not in (np.dtype(np.int8), np.dtype(np.uint8)):
        return None
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    total = int(np.prod(batch, dtype=np.int64)) * a.shape[-2] * b.shape[-1] * _blocks(a.shape[-1])
    hits = b == -128  # b may be an activation (a fresh array each run): checked each time
    pb = _pair_mask(np.swapaxes(hits, -1, -2)) if hits.any() else None  # [..., N, K/2]
    if pb is None or not pb.any():
        _count(total)
        return None
    pa = _pair_mask(_as_int8_min(a))  # [..., M, K/2]
    count = np.matmul(pa.astype(np.float32), np.swapaxes(pb, -1, -2).astype(np.float32)).astype(np.int64)
    _count(total, count)
    return count * -WRAP


def conv_correction(
    x: np.ndarray,
    x_zp: int,
    w: np.ndarray,
    group: int,
    pads: list[int],
    strides: tuple[int, ...],
    dilations: tuple[int, ...],
    out_spatial: tuple[int, ...],
    int8_inputs: bool = False,
) -> np.ndarray | None:
    """``-65536 x`` the wrapped pairs of a uint8 x int8 2-D convolution as ``(N, M, *out)``, or None when
    none wraps (other types, depthwise convolutions: MLAS's kernels there do not pair so). With
    ``int8_inputs``, int8 x int8 convolutions too (onnxruntime 1.29 and earlier; the input is not flipped).

    Raises:
        NotEmulated: a 1-D or 3-D 8-bit x int8 convolution whose weights hold a pair that can wrap.
    """
    inputs = (np.uint8, np.int8) if int8_inputs else (np.uint8,)
    if x.dtype not in inputs or w.dtype != np.int8 or group == x.shape[1] == w.shape[0] != 1:
        return None
    total = x.shape[0] * w.shape[0] * int(np.prod(out_spatial)) * _blocks(int(np.prod(w.shape[1:])))
    if not _has_int8_min(w):  # the common case (symmetric weights): checked once per weight array
        _count(total)
        return None
    if x.ndim != 4:
        flat = (w == -128).reshape(w.shape[0], -1)
        if _pair_mask(flat).any() or _pair_mask(np.moveaxis(w == -128, 1, -1).reshape(w.shape[0], -1)).any():
            raise NotEmulated(
                f"the int16 pair wrap of ARM64 kernels without dot products is emulated for 2-D convolutions only; "
                f"this {x.ndim - 2}-D {x.dtype} x int8 convolution has int8 weights of -128 that can pair"
            )
        _count(total)
        return None
    m, cg, kh, kw = w.shape
    og = m // group
    # weights in the kernel's reduction order (kh, kw, cin), per group: [group, og, K]
    wk = (w == -128).reshape(group, og, cg, kh, kw).transpose(0, 1, 3, 4, 2).reshape(group, og, kh * kw * cg)
    pw = _pair_mask(wk)
    if not pw.any():
        _count(total)
        return None
    n = x.shape[0]
    hits = np.pad(
        _as_int8_min(x),
        ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])),
        constant_values=bool(_as_int8_min(np.asarray(x_zp, x.dtype))),  # the padding holds the zero point
    )
    out_h, out_w = out_spatial
    rows = np.arange(kh)[:, None] * dilations[0] + np.arange(out_h)[None, :] * strides[0]  # [kh, out_h]
    cols = np.arange(kw)[:, None] * dilations[1] + np.arange(out_w)[None, :] * strides[1]  # [kw, out_w]
    out = np.zeros((n, m, out_h * out_w), np.int64)
    for g in range(group):
        part = hits[:, g * cg : (g + 1) * cg]  # [n, cg, H, W]
        patches = part[:, :, rows[:, :, None, None], cols[None, None, :, :]]  # [n, cg, kh, out_h, kw, out_w]
        patches = patches.transpose(0, 3, 5, 2, 4, 1).reshape(n, out_h * out_w, kh * kw * cg)
        pa = _pair_mask(patches).astype(np.float32)  # [n, P, K/2]
        count = np.matmul(pa, pw[g].T.astype(np.float32))  # [n, P, og]
        out[:, g * og : (g + 1) * og] = np.swapaxes(count, 1, 2).astype(np.int64)
    _count(total, out)
    return out.reshape(n, m, out_h, out_w) * -WRAP


def _taps_pairs(taps: int, channels: int) -> list[tuple[int, int]]:
    """The tap pairs MLAS's ARM64 depthwise kernels add in int16: its 9-tap kernel (channels in blocks of
    16) pairs taps two apart, ``(0, 2), (1, 3), (4, 6), (5, 7)``; the general one neighbours."""
    if taps == 9 and channels % 16 == 0:
        return [(0, 2), (1, 3), (4, 6), (5, 7)]
    return [(2 * j, 2 * j + 1) for j in range(taps // 2)]


def depthwise_correction(
    x: np.ndarray,
    x_zp: int,
    w: np.ndarray,
    w_zp: np.ndarray,
    pads: list[int],
    strides: tuple[int, ...],
    dilations: tuple[int, ...],
    out_spatial: tuple[int, ...],
) -> np.ndarray | None:
    """``-65536 x`` the wrapped tap pairs of an 8-bit x int8 depthwise 2-D convolution as ``(N, C, *out)``,
    or None when no pair wraps (other types or ranks, weights with a zero point: other kernels).

    MLAS's symmetric depthwise kernels on ARM64 (with or without dot products) multiply each tap with
    ``smull``/``smlal`` and add two taps' products in int16 before widening (uint8 inputs flipped to
    int8). Measured on onnxruntime 1.32's aarch64 wheel: 3x3 kernels on 16 channels pair taps two apart,
    on 24 channels neighbouring taps.

    Raises:
        NotEmulated: the channels are not a multiple of 8 (not measured) and a pair of weights can wrap.
    """
    if x.ndim != 4 or w.dtype != np.int8 or x.dtype not in (np.dtype(np.int8), np.dtype(np.uint8)):
        return None
    if np.any(np.asarray(w_zp) != 0):
        return None
    channels, _, kh, kw = w.shape
    taps_pairs = _taps_pairs(kh * kw, channels)
    total = x.shape[0] * channels * int(np.prod(out_spatial)) * len(taps_pairs)
    if not _has_int8_min(w):
        _count(total)
        return None
    flat = (w == -128).reshape(channels, kh * kw)
    weight_pairs = np.stack([flat[:, a] & flat[:, b] for a, b in taps_pairs], axis=1) if taps_pairs else flat[:, :0]
    if not weight_pairs.any():
        _count(total)
        return None
    if channels % 8:
        raise NotEmulated(
            f"the int16 tap pairs of ARM64 depthwise kernels are emulated for channels in multiples of 8; "
            f"this depthwise convolution has {channels} channels and int8 weights of -128 that can pair"
        )
    hits = np.pad(
        _as_int8_min(x),
        ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])),
        constant_values=int(x_zp) == (0 if x.dtype == np.uint8 else -128),
    )
    out_h, out_w = out_spatial
    taps = [
        hits[:, :, i * dilations[0] : i * dilations[0] + strides[0] * (out_h - 1) + 1 : strides[0],
             j * dilations[1] : j * dilations[1] + strides[1] * (out_w - 1) + 1 : strides[1]]
        for i in range(kh)
        for j in range(kw)
    ]  # fmt: skip
    count = np.zeros((x.shape[0], channels, out_h, out_w), np.int64)
    for index, (a, b) in enumerate(taps_pairs):
        both = taps[a] & taps[b] & weight_pairs[None, :, index, None, None]
        count += both
    _count(total, count)
    return count * -WRAP
