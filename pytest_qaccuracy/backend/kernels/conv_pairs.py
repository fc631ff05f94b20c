"""The int16 pair saturation of u8 x s8 convolutions (x86 without VNNI), as a correction of exact sums.

onnxruntime reduces a convolution over ``(tap, channel)`` in its channels-last im2col order, and MLAS
pairs neighbours of that order (``pairs.py``). When a group has an even number of channels every pair
is two neighbouring channels at one tap, so both values of a pair come from one input pixel: whether a
pair can saturate at an output depends only on ``x[c] + x[c+1]`` at the pixel the tap reads. The
candidate test therefore runs once over the input, not once per tap over im2col rows, and only the
candidates are multiplied out. Pairs that cross from one tap to the next (odd channel counts, e.g. a
3-channel stem) gather their im2col columns instead (``pairs.corrections``).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from pytest_qaccuracy.backend import pairs, parallel

#: elements of one block of the candidate test and of the expanded candidates
BLOCK_ELEMENTS = 1 << 22


def pair_corrections(
    x: np.ndarray,
    x_zp: int,
    w: np.ndarray,
    group: int,
    pads: list[int],
    strides: tuple[int, ...],
    dilations: tuple[int, ...],
    out_spatial: tuple[int, ...],
) -> np.ndarray | None:
    """``sum (sat16(p) - p)`` per output ``(N, M, *out)`` as int64, or None when no pair saturates.

    Args:
        x: raw uint8 input ``(N, C, *spatial)``; padded positions hold ``x_zp``, as in onnxruntime.
        w: int8 weights ``(M, C / group, *kernel)``.
    """
    xp = _padded(x, pads, x_zp)
    m, cg = w.shape[:2]
    mg = m // group
    kernel = w.shape[2:]
    taps = math.prod(kernel)
    wmat = w.reshape(group, mg, cg, taps).transpose(0, 3, 2, 1).reshape(group, taps * cg, mg)  # (G, K, Mg)
    x_max = int(xp.max(initial=0))
    found = [(g, pairs.risky_pairs(wmat[g], x_max)) for g in range(group)]
    found = [(g, p) for g, p in found if len(p)]
    positions = math.prod(out_spatial)
    total = x.shape[0] * positions * ((taps * cg + 1) // 2) * m  # pair sums the convolution computes
    if not found:
        pairs.count(total, np.zeros(0, np.int64))
        return None
    out = np.zeros((x.shape[0], m, *out_spatial), np.int64)
    geometry = _Geometry(kernel, strides, dilations, out_spatial)
    same: list[tuple[np.ndarray, ...]] = []
    changed = False
    for g, risky in found:
        channel = risky.first % cg
        within = channel + 1 < cg
        same.append(
            (
                g * cg + channel[within],
                risky.first[within] // cg,
                g * mg + risky.column[within],
                risky.w_first[within],
                risky.w_second[within],
            )
        )
        if not within.all():
            crossing = pairs.RiskyPairs(*(field[~within] for field in _fields(risky)))
            changed |= _add_crossing(out, xp, g, cg, mg, crossing, geometry)
    entries = [np.concatenate(parts) for parts in zip(*same, strict=True)]
    spans = parallel.split(xp.shape[0], xp[0].size)  # records on the session's threads (disjoint outputs)
    tasks = [lambda a=a, b=b: _add_same_tap(out[a:b], xp[a:b], *entries, geometry) for a, b in spans]
    changed |= any(parallel.run_all(tasks))
    if pairs.counter is not None:  # one saturated pair sum per non-zero (output, pair) change
        pairs.count(total, np.zeros(0, np.int64))
    return out if changed else None


class _Geometry:
    """Where a tap of each output reads: ``pixel = out * stride + tap * dilation`` per spatial axis."""

    def __init__(
        self,
        kernel: tuple[int, ...],
        strides: tuple[int, ...],
        dilations: tuple[int, ...],
        out_spatial: tuple[int, ...],
    ):
        self.kernel, self.strides, self.dilations, self.out_spatial = kernel, strides, dilations, out_spatial
        self.taps = list(itertools.product(*(range(k) for k in kernel)))

    def outputs(self, pixel: list[np.ndarray], tap: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
        """Output coordinates of ``pixel`` read through ``tap`` (flat tap index), and which exist."""
        offsets = np.unravel_index(tap, self.kernel)
        coords, valid = [], np.ones(tap.shape, bool)
        for p, t, s, d, size in zip(pixel, offsets, self.strides, self.dilations, self.out_spatial, strict=True):
            shifted = p - t * d
            o, rest = np.divmod(shifted, s)
            valid &= (rest == 0) & (o >= 0) & (o < size)
            coords.append(o)
        return coords, valid


def _add_same_tap(
    out: np.ndarray,
    xp: np.ndarray,
    channel: np.ndarray,
    tap: np.ndarray,
    column: np.ndarray,
    w_first: np.ndarray,
    w_second: np.ndarray,
    geometry: _Geometry,
) -> bool:
    """Pairs of channels ``(c, c+1)`` at one tap: candidate pixels first, then each pair's outputs.

    Returns whether any pair saturated.
    """
    changed = False
    if not channel.size:
        return changed
    firsts, which = np.unique(channel, return_inverse=True)
    # an entry can only saturate where x[c] + x[c+1] > its threshold: entries sorted by threshold within
    # each channel pair, a candidate pixel multiplies out only the prefix whose threshold its sum exceeds
    own = pairs.INT16_MAX // np.maximum(np.abs(w_first), np.abs(w_second)).astype(np.int64)
    order = np.lexsort((own, which))
    key = which[order] * (pairs.INT16_MAX + 1) + own[order]
    start = np.searchsorted(which[order], np.arange(firsts.size))
    threshold = own[order][start]  # the smallest of each channel pair: the candidate test
    spatial = xp.shape[2:]
    per_record = firsts.size * math.prod(spatial)
    step = max(1, BLOCK_ELEMENTS // max(per_record, 1))
    for n0 in range(0, xp.shape[0], step):
        block = xp[n0 : n0 + step]
        if firsts.size == xp.shape[1] // 2 and firsts[-1] == 2 * (firsts.size - 1):  # every even channel
            total = np.add(block[:, 0::2], block[:, 1::2], dtype=np.uint16)
        else:
            total = np.add(block[:, firsts], block[:, firsts + 1], dtype=np.uint16)
        flat = np.flatnonzero(total > threshold.reshape(-1, *(1,) * len(spatial)))
        if not flat.size:
            continue
        sums = total.reshape(-1)[flat].astype(np.int64)
        found = np.unravel_index(flat, total.shape)
        record, pair, pixel = found[0] + n0, found[1], list(found[2:])
        count = np.searchsorted(key, pair * (pairs.INT16_MAX + 1) + sums) - start[pair]
        first = xp[(record, firsts[pair], *pixel)].astype(np.int32)
        second = xp[(record, firsts[pair] + 1, *pixel)].astype(np.int32)
        bounds = np.concatenate([[0], np.cumsum(count)])
        for c0, c1 in _spans(bounds, BLOCK_ELEMENTS):
            per = count[c0:c1]
            entry = order[np.repeat(start[pair[c0:c1]] - bounds[c0:c1] + bounds[c0], per) + np.arange(per.sum())]
            candidate = np.repeat(np.arange(c0, c1), per)
            value = first[candidate] * w_first[entry] + second[candidate] * w_second[entry]
            change = np.clip(value, pairs.INT16_MIN, pairs.INT16_MAX) - value
            hit = np.nonzero(change)[0]  # usually few: the outputs of the rest need not be located
            candidate, entry, change = candidate[hit], entry[hit], change[hit]
            coords, valid = geometry.outputs([p[candidate] for p in pixel], tap[entry])
            if valid.any():
                index = (record[candidate[valid]], column[entry[valid]], *(o[valid] for o in coords))
                np.add.at(out, index, change[valid])
                pairs.count(0, index[0])
                changed = True
    return changed


def _add_crossing(
    out: np.ndarray, xp: np.ndarray, g: int, cg: int, mg: int, risky: pairs.RiskyPairs, geometry: _Geometry
) -> bool:
    """Pairs that cross from one tap to the next: their im2col columns are gathered (``pairs.corrections``).

    Returns whether any pair saturated.
    """
    positions = math.prod(geometry.out_spatial)

    def gather(ks: np.ndarray) -> np.ndarray:
        columns = np.empty((ks.size, xp.shape[0] * positions), np.uint8)
        tap_of, channel = np.divmod(ks, cg)
        for t in np.unique(tap_of):
            where = np.nonzero(tap_of == t)[0]
            index = tuple(
                slice(i * d, i * d + (o - 1) * s + 1, s)
                for i, d, o, s in zip(
                    geometry.taps[t], geometry.dilations, geometry.out_spatial, geometry.strides, strict=True
                )
            )
            view = xp[(slice(None), g * cg + channel[where], *index)]  # (records, len, *out)
            columns[where] = np.moveaxis(view, 1, 0).reshape(where.size, -1)
        return columns

    rows, cols, values = pairs.corrections(risky, gather, xp.shape[0] * positions)
    record, position = np.divmod(rows, positions)
    pairs.count(0, record)
    flat = out.reshape(out.shape[0], out.shape[1], positions)  # a view: out is contiguous
    np.add.at(flat, (record, g * mg + cols, position), values)
    return bool(values.size)


def _spans(bounds: np.ndarray, budget: int) -> list[tuple[int, int]]:
    """Consecutive candidate ranges whose expanded entries (``bounds``: cumulative counts) fit ``budget``."""
    spans, start = [], 0
    last = bounds.size - 1
    while start < last:
        stop = int(np.searchsorted(bounds, bounds[start] + budget, side="right")) - 1
        stop = min(max(stop, start + 1), last)
        spans.append((start, stop))
        start = stop
    return spans


def _padded(x: np.ndarray, pads: list[int], value: int) -> np.ndarray:
    d = x.ndim - 2
    shape = (*x.shape[:2], *(s + pads[i] + pads[d + i] for i, s in enumerate(x.shape[2:])))
    xp = np.full(shape, value, np.uint8)
    xp[(slice(None), slice(None), *(slice(pads[i], pads[i] + s) for i, s in enumerate(x.shape[2:])))] = x
    return xp


def _fields(risky: pairs.RiskyPairs) -> tuple[np.ndarray, ...]:
    return risky.first, risky.column, risky.w_first, risky.w_second
