"""The int16 pair saturation of unpadded 1x1 u8 x s8 convolutions, pixel by pixel.

A 1x1 convolution reduces over channels only, so each pair MLAS forms is two neighbouring channels
``(c, c+1)`` of one input pixel, and the pixel is the output position. Whether some weight pair of
channel pair ``p`` saturates at a pixel is one table lookup: ``x[c+1] >= lowest[p, x[c]]``
(:class:`~pytest_qaccuracy.backend.pairs.LowestSecond`). Only the candidate pixels are multiplied out,
against every risky weight pair of their channel pair at once (a row padded to the longest), and the
changes are added straight into each chunk's sums: no list of changed outputs is sorted, merged and
searched (the general sparse way, ``conv_pairs``), and no output is evaluated for nothing (the dense
way). Mobile nets' expansion layers are 1x1 convolutions with many risky pairs.
"""

from __future__ import annotations

import math

import numpy as np

from pytest_qaccuracy.backend import pairs

#: Costs in nanoseconds, fitted on the 46 corrected 1x1 convolutions of the bench's mobile nets (32
#: and 128 pixels, one thread): this way's fixed cost, per (pixel, channel pair) scanned, per pixel
#: passing the cheap test, and per (candidate, weight pair slot) multiplied out; the dense way's fixed
#: cost and cost per (output, risky pair). Choosing by them took 33.2 ms over those layers, the faster
#: way each time 33.2, the dense way alone 58.5 and this way alone 61.2.
FIXED, SCAN, CHEAP, SLOT = 44_000, 2.65, 10.1, 5.57
DENSE_FIXED, DENSE_EVALUATION = 72_000, 1.59


class PointwiseLayout:
    """A 1x1 convolution's risky weight pairs grouped by channel pair, made once per set of risky pairs.

    ``channels``: the first input channel of each channel pair with a risky weight pair (ascending);
    ``out``, ``w_first``, ``w_second``: ``(pairs, longest)`` rows of each channel pair's risky weight
    pairs (output channel and weights), padded with zero weights (a zero change); ``lowest``: the
    :func:`~pytest_qaccuracy.backend.pairs.lowest_second` table of the channel pairs, flattened;
    ``threshold``: the smallest ``x[c] + x[c+1]`` at which any of a channel pair's weight pairs can
    saturate, a cheaper first test.
    """

    def __init__(self, found: list[tuple[int, pairs.RiskyPairs]], cg: int, mg: int):
        self.found, self.cg, self.mg = found, cg, mg
        channel = np.concatenate([g * cg + risky.first for g, risky in found])
        out = np.concatenate([g * mg + risky.column for g, risky in found])
        w_first = np.concatenate([risky.w_first for _, risky in found]).astype(np.int32)
        w_second = np.concatenate([risky.w_second for _, risky in found]).astype(np.int32)
        self.channels, which = np.unique(channel, return_inverse=True)
        count = self.channels.size
        order = np.argsort(which, kind="stable")
        sizes = np.bincount(which, minlength=count)
        longest = int(sizes.max(initial=1))
        slot = np.arange(order.size) - np.repeat(np.cumsum(sizes) - sizes, sizes)  # place within its pair
        self.out = np.zeros((count, longest), np.int64)
        self.w_first = np.zeros((count, longest), np.int32)
        self.w_second = np.zeros((count, longest), np.int32)
        rows = which[order]
        self.out[rows, slot] = out[order]
        self.w_first[rows, slot] = w_first[order]
        self.w_second[rows, slot] = w_second[order]
        self.lowest = pairs.lowest_second(w_first, w_second, which, count).reshape(-1).astype(np.int16)
        own = pairs.INT16_MAX // np.maximum(np.abs(w_first), np.abs(w_second))
        self.threshold = np.full(count, pairs.INT16_MAX, np.int64)
        np.minimum.at(self.threshold, which, own)
        self._verdicts: dict[tuple, bool] = {}

    def candidates(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
        """Where some risky weight pair saturates, in the pixels of ``x`` (``(records, C, *pixels)``):
        flat indices into ``(records, pairs, pixels)``, the two inputs and the channel pair of each,
        and how many passed the cheap test (``x[c] + x[c+1]`` over the pair's threshold) before the
        exact one (a table lookup)."""
        records, count = x.shape[0], self.channels.size
        first = x[:, self.channels].reshape(records, count, -1)
        second = x[:, self.channels + 1].reshape(records, count, -1)
        total = np.add(first, second, dtype=np.uint16)
        flat = np.flatnonzero(total > self.threshold.astype(np.uint16)[:, None])
        a, b = first.reshape(-1)[flat], second.reshape(-1)[flat]
        pair = flat // first.shape[2] % count
        exact = np.flatnonzero(b >= self.lowest[pair * 256 + a])
        return flat[exact], a[exact], b[exact], pair[exact], int(flat.size)

    def is_cheaper(self, x: np.ndarray, dense_evaluations: int) -> bool:
        """Whether this way beats evaluating every risky pair at every output (``conv_pairs``' dense
        way), judged on the first record of ``x`` (``(N, C, *pixels)``, the pixels the outputs read)
        and kept for later runs of the same input shape."""
        key = ("pointwise is cheaper", x.shape, dense_evaluations)
        verdict = self._verdicts.get(key)
        if verdict is None:
            flat, _, _, _, cheap = self.candidates(x[:1])
            n, scan = x.shape[0], self.channels.size * math.prod(x.shape[2:])
            pointwise = FIXED + n * (SCAN * scan + CHEAP * cheap + SLOT * flat.size * self.out.shape[1])
            verdict = self._verdicts[key] = pointwise < DENSE_FIXED + DENSE_EVALUATION * dense_evaluations
        return verdict

    @classmethod
    def of(cls, found: list[tuple[int, pairs.RiskyPairs]], cg: int, mg: int) -> PointwiseLayout:
        return pairs.derived(found, ("pointwise", cg, mg, tuple(g for g, _ in found)), lambda: cls(found, cg, mg))


class PointwiseCorrection:
    """The pair correction of an unpadded 1x1 convolution, computed for each chunk into its sums.

    Args:
        x: raw uint8 input ``(N, C, *spatial)``.
        strides: the convolution's strides.
        out_spatial: its output's spatial shape.
        m: output channels.
        channel_max: each input channel's largest value (for :meth:`max_abs`).
        layout: the risky pairs (:class:`PointwiseLayout`).
    """

    def __init__(
        self,
        x: np.ndarray,
        strides: tuple[int, ...],
        out_spatial: tuple[int, ...],
        m: int,
        channel_max: np.ndarray,
        layout: PointwiseLayout,
    ):
        self.x, self.strides, self.layout, self.channel_max = x, strides, layout, channel_max
        self.shape = (x.shape[0], m, *out_spatial)

    def __bool__(self) -> bool:
        return True

    def max_abs(self) -> int:
        """A bound on any output's ``|correction|`` (:func:`pairs.correction_bound`; a 1x1 kernel's
        rows are its group's channels)."""
        layout = self.layout
        return pairs.correction_bound(
            layout.found, self.shape[1], layout.mg, lambda g: self.channel_max[g * layout.cg : (g + 1) * layout.cg]
        )

    def beside_sums(self, dtype: type) -> None:
        """Nothing to run beside onnxruntime's sums: each chunk finds its own candidates."""

    def before_chunks(self, dtype: type) -> None:
        """Nothing: each chunk computes its own part."""

    def dense(self) -> np.ndarray:
        """The whole ``(N, M, *out)`` int64 correction."""
        out = np.zeros(self.shape, np.int64)
        self.add_to(out, 0, self.shape[0], 0, self.shape[2])
        return out

    def add_to(self, target: np.ndarray, n0: int, n1: int, o0: int, o1: int) -> None:
        """Add records ``n0:n1`` and first spatial indices ``o0:o1`` to that chunk's sums ``target``
        (``(n1 - n0, M, o1 - o0, *out[1:])``, or wider along the last axis)."""
        out = self.shape[2:]
        rows = (slice(o0 * self.strides[0], (o1 - 1) * self.strides[0] + 1, self.strides[0]),)
        rest = tuple(slice(0, (size - 1) * s + 1, s) for size, s in zip(out[1:], self.strides[1:], strict=True))
        layout = self.layout
        count = layout.channels.size
        flat, a, b, pair, _ = layout.candidates(self.x[(slice(n0, n1), slice(None), *rows, *rest)])
        if not flat.size:
            return
        pixels = (o1 - o0) * math.prod(out[1:])
        value = a[:, None].astype(np.int32) * layout.w_first[pair]
        value += b[:, None].astype(np.int32) * layout.w_second[pair]
        change = np.clip(value, pairs.INT16_MIN, pairs.INT16_MAX)
        change -= value
        changed = np.flatnonzero(change)  # one saturated pair sum each
        hit, entry = np.divmod(changed, change.shape[1])
        record, pixel = np.divmod(flat[hit], count * pixels)
        pixel %= pixels
        channel = layout.out[pair[hit], entry]
        values = change.reshape(-1)[changed].astype(target.dtype)
        if target.flags.c_contiguous:  # one flat index: numpy's add.at is fastest on one axis
            spatial = np.unravel_index(pixel, (o1 - o0, *out[1:]))
            index = np.ravel_multi_index((record, channel, *spatial), target.shape)
            np.add.at(target.reshape(-1), index, values)
        else:
            view = target[(slice(None), slice(None), *(slice(0, size) for size in (o1 - o0, *out[1:])))]
            np.add.at(view, (record, channel, *np.unravel_index(pixel, view.shape[2:])), values)
        if pairs.counter is not None:
            pairs.count(0, record + n0)


def applies(kernel: tuple[int, ...], pads: list[int], cg: int) -> bool:
    """Whether a convolution's pairs are all channel pairs of one pixel at its output: an unpadded 1x1
    kernel (an odd last channel pairs with nothing and cannot saturate)."""
    return math.prod(kernel) == 1 and not any(pads) and cg >= 2
