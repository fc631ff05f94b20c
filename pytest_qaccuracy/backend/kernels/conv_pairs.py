"""The int16 pair saturation of u8 x s8 convolutions (x86 without VNNI), as a correction of exact sums.

onnxruntime reduces a convolution over ``(tap, channel)`` in its channels-last im2col order, and MLAS
pairs neighbours of that order (``pairs.py``). When a group has an even number of channels every pair
is two neighbouring channels at one tap, so both values of a pair come from one input pixel: whether a
pair can saturate at an output depends only on ``(x[c], x[c+1])`` at the pixel the tap reads. The
candidate test therefore runs once over the input, not once per tap over im2col rows: a cheap bound on
``x[c] + x[c+1]`` first, then, where that leaves many pixels (mid-range inputs of a first layer), the
exact test, one lookup of ``pairs.lowest_second`` per pixel; only the candidates are multiplied out.
Pairs that cross from one tap to the next (odd channel counts, e.g. a 3-channel stem) gather their
im2col columns instead (``pairs.corrections``). Where few outputs change the correction is sparse
(:class:`PairCorrection`) and each chunk of the convolution adds its own entries. Where many do (an
image stem, mid-range inputs on heavy weights) every risky pair is evaluated at every output, in
int16, chunk by chunk of the convolution while its sums are in cache (:class:`DenseCorrection`).
"""

from __future__ import annotations

import math
import threading

import numpy as np

from pytest_qaccuracy.backend import pairs, parallel

#: elements of one block of the candidate test and of the expanded candidates
BLOCK_ELEMENTS = 1 << 22
#: (entry, output) evaluations of one block of the dense correction: its int32 temporaries stay in cache
DENSE_BLOCK = 1 << 17
#: im2col bytes made at once for the dense correction (whole records)
COLUMN_BLOCK = 1 << 20
#: entries per evaluated block of the dense correction at least, where a group has that many
MIN_SPAN = 16


def pair_corrections(
    x: np.ndarray,
    x_zp: int,
    w: np.ndarray,
    group: int,
    pads: list[int],
    strides: tuple[int, ...],
    dilations: tuple[int, ...],
    out_spatial: tuple[int, ...],
) -> Correction | None:
    """``sum (sat16(p) - p)`` per output ``(N, M, *out)`` (each way's correction adds it to the chunks of
    the convolution's sums), or None when no pair can saturate.

    Args:
        x: raw uint8 input ``(N, C, *spatial)``; padded positions hold ``x_zp``, as in onnxruntime.
        w: int8 weights ``(M, C / group, *kernel)``.
    """
    m, cg = w.shape[:2]
    mg = m // group
    kernel = w.shape[2:]
    taps = math.prod(kernel)
    per_group = w.reshape(group, mg, cg, taps)
    # each input channel's own largest value (x_zp where padding adds it): row k of group g is channel
    # g * cg + k % cg, so a pair can be ruled out by the two channels it reads
    channel_max = x.max(axis=0, initial=0).reshape(x.shape[1], -1).max(axis=1, initial=0)  # records first: fast
    if any(pads):
        channel_max = np.maximum(channel_max, int(x_zp))
    found = []
    for g in range(group):  # the weights' rows in onnxruntime's reduction order: (tap, channel), (K, Mg)
        bounds = pairs.pair_bounds(w, g, lambda g=g: per_group[g].transpose(2, 1, 0).reshape(taps * cg, mg))
        found.append((g, bounds.risky(channel_max[g * cg : (g + 1) * cg], repeat=taps)))
    found = [(g, p) for g, p in found if len(p)]
    positions = math.prod(out_spatial)
    total = x.shape[0] * positions * ((taps * cg + 1) // 2) * m  # pair sums the convolution computes
    if not found:
        pairs.count(total, np.zeros(0, np.int64))
        return None
    entries = sum(len(p) for _, p in found)
    dense = x.shape[0] * positions * entries  # (output, risky entry) evaluations of the dense way
    geometry = _Geometry(kernel, strides, dilations, out_spatial)
    layer = _Layer(x, int(x_zp), pads, cg, mg, m, geometry, channel_max)
    # few (output, risky entry) evaluations: the dense way, without a sample run to decide. With an odd
    # channel count, pairs cross taps and the sparse way scans every (output, pair) for candidates: with
    # about one risky entry per pair, the dense way costs no more.
    crossing = cg % 2 == 1 and entries <= DENSE_ENTRIES_PER_PAIR * sum(np.unique(p.first).size for _, p in found)
    if crossing or dense <= DENSE_DIRECT:
        return _dense(layer, found, total)
    if _dense_is_cheaper(layer, found, entries):
        return _dense(layer, found, total)
    return SparseSearch(layer, found, total)


class SparseSearch:
    """The sparse correction of a layer, searched once before the convolution's chunks run
    (:meth:`before_chunks`). Its bound comes from the weights and the inputs' channel maxima alone,
    so the sums' type is chosen before the search. The search may use the session's threads."""

    def __init__(self, layer: _Layer, found: list[tuple[int, pairs.RiskyPairs]], total: int):
        self.layer, self.found, self.total = layer, found, total
        self.shape = (layer.x.shape[0], layer.m, *layer.geometry.out_spatial)
        self._found: PairCorrection | None = None
        self._done = False
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return True

    def search(self) -> PairCorrection | None:
        """The correction (None: no pair saturates), found once."""
        with self._lock:
            if not self._done:
                self._found = _sparse(self.layer, self.found, self.total)
                self._done = True
            return self._found

    def before_chunks(self, dtype: type) -> None:
        """The search, before the chunks go to the session's threads: one started inside a chunk would
        hand its tasks to the pool that chunk occupies."""
        self.search()

    def max_abs(self) -> int:
        """A bound on any output's ``|correction|`` (:func:`pairs.correction_bound`)."""
        return pairs.correction_bound(self.found, self.layer.m, self.layer.mg, self.layer.row_max)

    def dense(self) -> np.ndarray:
        """The whole ``(N, M, *out)`` int64 correction."""
        found = self.search()
        return np.zeros(self.shape, np.int64) if found is None else found.dense()

    def add_to(self, target: np.ndarray, n0: int, n1: int, o0: int, o1: int) -> None:
        """:meth:`PairCorrection.add_to` of the correction (searched now if not yet)."""
        found = self.search()
        if found is not None:
            found.add_to(target, n0, n1, o0, o1)


class _Layer:
    """One convolution's input and shape, and its padded input made when first needed."""

    def __init__(
        self,
        x: np.ndarray,
        x_zp: int,
        pads: list[int],
        cg: int,
        mg: int,
        m: int,
        geometry: _Geometry,
        channel_max: np.ndarray,
    ):
        self.x, self.x_zp, self.pads, self.cg, self.mg, self.m, self.geometry = x, x_zp, pads, cg, mg, m, geometry
        self.channel_max = channel_max  # each input channel's largest value (the zero point too where padded)
        self._padded: np.ndarray | None = None

    def row_max(self, g: int) -> np.ndarray:
        """The largest input of each im2col row ``tap * cg + channel`` of group ``g``."""
        own = self.channel_max[g * self.cg : (g + 1) * self.cg].astype(np.int64)
        return np.tile(own, math.prod(self.geometry.kernel))

    def xp(self) -> np.ndarray:
        if self._padded is None:
            self._padded = _padded(self.x, self.pads, self.x_zp)
        return self._padded

    def records(self, a: int, b: int) -> _Layer:
        """The same layer on records ``a:b``."""
        part = _Layer(self.x[a:b], self.x_zp, self.pads, self.cg, self.mg, self.m, self.geometry, self.channel_max)
        if self._padded is not None:
            part._padded = self._padded[a:b]
        return part


#: (output, risky pair) evaluations below which a layer is corrected densely without a sample run
DENSE_DIRECT = 1 << 16
#: risky entries per pair up to which a layer with pairs across taps is corrected densely
DENSE_ENTRIES_PER_PAIR = 2
#: The two ways' costs in dense evaluations of one (output, risky entry): the sparse way's fixed cost
#: beyond the dense way's, per (input pixel, risky pair row) scanned for candidates, and per saturated
#: pair sum located and added. Fitted on the 82 corrected convolutions of the bench nets (plain,
#: detector and mobile at 32 pixels, mobile at 128; one thread): dense 62 us + 1.7 ns per evaluation,
#: sparse 93 us + 0.68 ns per scanned pixel and pair row + 221 ns per hit. The old rule (hits only,
#: 64 each) took 83 ms over those layers where the fitted one takes 60 and the faster way each time 59.
SPARSE_FIXED = 18_000
SCAN_COST = 0.4
SPARSE_HIT_COST = 130


def _dense_is_cheaper(layer: _Layer, found: list[tuple[int, pairs.RiskyPairs]], entries: int) -> bool:
    """Whether evaluating every risky pair at every output beats locating the saturated ones.

    Where the sparse way's scan alone costs more, no sample is needed. Else the first record is run
    the sparse way (without counting) to measure how many pair sums saturate per record; layers whose
    inputs sit high on mid-range weights (an image stem) saturate at a large share of their outputs.
    The sample's verdict is kept with the risky pairs for later runs of the same layer shape.
    """
    n = layer.x.shape[0]
    dense = n * math.prod(layer.geometry.out_spatial) * entries
    scan = n * math.prod(layer.x.shape[2:]) * sum(np.unique(p.first).size for _, p in found)
    sparse = SPARSE_FIXED + SCAN_COST * scan
    if dense <= sparse:
        return True
    if n < 4:
        return False

    def verdict() -> bool:
        largest = max(int(np.maximum(np.abs(p.w_first), np.abs(p.w_second)).max()) for _, p in found)
        if np.count_nonzero(layer.x[0] > pairs.INT16_MAX // largest // 2) * 8 < layer.x[0].size:
            return False  # few inputs high enough for a pair to saturate (most layers after a ReLU)
        with pairs.counting(None):  # the sample is not part of the run's saturation counts
            hits = _sparse(layer.records(0, 1), found, 0, count_only=True)
        return sparse + SPARSE_HIT_COST * hits * n > dense

    return pairs.derived(found, ("dense is cheaper", layer.x.shape, tuple(g for g, _ in found)), verdict)


def _sparse(
    layer: _Layer, found: list[tuple[int, pairs.RiskyPairs]], total: int, count_only: bool = False
) -> PairCorrection | int | None:
    """Candidates first, then only the pairs that saturate (most layers: none or few)."""
    x, x_zp, pads, cg, mg, geometry, xp = layer.x, layer.x_zp, layer.pads, layer.cg, layer.mg, layer.geometry, layer.xp
    out = _Correction((x.shape[0], layer.m, *geometry.out_spatial))
    same: list[tuple[np.ndarray, ...]] = []
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
            _add_crossing(out, layer, g, crossing)
    entries = [np.concatenate(parts) for parts in zip(*same, strict=True)]
    # padded pixels (x_zp in both channels) that can never be candidates need not be materialised
    d = x.ndim - 2
    largest = int(np.maximum(np.abs(entries[3]), np.abs(entries[4])).max(initial=1))
    source, offset = (x, tuple(pads[:d])) if 2 * int(x_zp) <= pairs.INT16_MAX // largest else (xp(), (0,) * d)
    spans = parallel.split_records(x.shape)  # records on the session's threads (disjoint outputs)
    firsts, which = np.unique(entries[0], return_inverse=True)
    lowest = pairs.LowestSecond(entries[3], entries[4], which, firsts.size)  # shared by the tasks
    tasks = [lambda a=a, b=b: _add_same_tap(out, a, source[a:b], offset, *entries, geometry, lowest) for a, b in spans]
    parallel.run_all(tasks)
    if pairs.counter is not None:  # one saturated pair sum per non-zero (output, pair) change
        pairs.count(total, np.zeros(0, np.int64))
    return out.hits if count_only else out.result()


def _dense(layer: _Layer, found: list[tuple[int, pairs.RiskyPairs]], total: int) -> DenseCorrection:
    """Every risky pair evaluated at every output from im2col columns, chunk by chunk of the convolution."""
    if pairs.counter is not None:
        pairs.count(total, np.zeros(0, np.int64))
    return DenseCorrection(layer, _DenseLayout.of(found, layer.mg))


class _DensePlan:
    """The risky entries of one group ordered for the dense correction, in int16 arithmetic.

    A risky pair has two weights of one sign (one positive and one negative product never leave int16:
    ``255 * 128 < 32768``), so only one side can saturate. With ``a = x w`` and ``b = x' w'``, each
    within ``[-32640, 32385]``, the change ``sat16(a + b) - (a + b)`` is ``min(32767 - b - a, 0)`` for
    positive weights and ``max(-32768 - b - a, 0)`` for negative ones, and every step stays in int16.
    Entries are ordered by (sign, column): each block is of one sign, and sums its changes per column
    with vector adds (:class:`_Runs`).
    """

    def __init__(self, risky: pairs.RiskyPairs):
        self.needed = np.unique(np.concatenate([risky.first, risky.first + 1]))
        negative = risky.w_second < 0
        order = np.argsort(negative, kind="stable")  # entries come sorted by column: keep that within a sign
        self.split = int(np.count_nonzero(~negative))  # positive entries first
        self.column = risky.column[order]
        self.first = risky.first[order]
        self.row_first = np.searchsorted(self.needed, self.first)
        self.row_second = np.searchsorted(self.needed, self.first + 1)
        self.w_first = risky.w_first[order].astype(np.int16)[:, None]
        self.minus_second = (-risky.w_second[order]).astype(np.int16)[:, None]

    def __len__(self) -> int:
        return int(self.column.size)

    def blocks(self, span: int) -> list[tuple[slice, bool]]:
        """Entry ranges of at most ``span`` entries, each of one sign (True: positive weights)."""
        out = []
        for lo, hi, positive in ((0, self.split, True), (self.split, len(self), False)):
            out.extend((slice(e0, min(hi, e0 + span)), positive) for e0 in range(lo, hi, span))
        return out

    def changes(self, columns: np.ndarray, e: slice, positive: bool) -> np.ndarray:
        """``(entries, rows)`` int16: ``sat16(p) - p`` of entries ``e`` on the im2col ``columns``.

        In the calling thread's scratch buffers (valid until its next call): a fresh array per step
        page-faults, and two threads doing so contend in the kernel's memory map (measured: two
        threads took 4.7x as long as one on the same work)."""
        shape = (e.stop - e.start, columns.shape[1])
        size = shape[0] * shape[1]
        change = parallel.scratch(size, np.int16, "pairs change").reshape(shape)
        product = parallel.scratch(size, np.int16, "pairs product").reshape(shape)
        # rows by indexing, not np.take: take was slower here, alone and more so on two threads at once
        np.multiply(columns[self.row_second[e]], self.minus_second[e], out=change, dtype=np.int16)  # -b
        change += pairs.INT16_MAX if positive else pairs.INT16_MIN
        change -= np.multiply(columns[self.row_first[e]], self.w_first[e], out=product, dtype=np.int16)
        zero = _zeros(shape)  # numpy's int16 minimum with a scalar has no vector loop: 15x slower
        return np.minimum(change, zero, out=change) if positive else np.maximum(change, zero, out=change)


_ZEROS = np.zeros(0, np.int16)


def _zeros(shape: tuple[int, ...]) -> np.ndarray:
    """A read-only int16 zeros array of ``shape`` (one buffer, grown as needed, shared by threads)."""
    global _ZEROS
    size = math.prod(shape)
    found = _ZEROS
    if found.size < size:
        found = np.zeros(size, np.int16)
        found.flags.writeable = False
        _ZEROS = found
    return found[:size].reshape(shape)


class _Runs:
    """Runs of a block's entries that add to one output channel (entries sorted by channel): where each
    run starts, and for each later place within a run the runs that reach it, worked out once per
    block (``np.diff`` and the tests cost more than the adds on short runs)."""

    def __init__(self, first: np.ndarray, count: int):
        sizes = np.diff(first, append=count)
        self.first = first
        self.steps: list[tuple[np.ndarray | None, np.ndarray]] = []
        for k in range(1, int(sizes.max(initial=1))):
            longer = np.flatnonzero(sizes > k)
            self.steps.append((None if longer.size == sizes.size else longer, first[longer] + k))

    def sum(self, rows: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """Sums of the runs of ``rows`` in ``dtype`` (wider than int16): one vectorized add per place
        within a run (numpy's ``add.reduceat`` along axis 0 costs about ten times as much on these
        short runs)."""
        out = rows[self.first].astype(dtype)
        for longer, at in self.steps:
            if longer is None:
                out += rows[at]
            else:
                out[longer] += rows[at]
        return out


def _dense_records(
    layer: _Layer, layout: _DenseLayout, n0: int, n1: int, count: bool, dtype: np.dtype, fresh: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """The dense correction of records ``n0:n1``: sums ``(channels, n1 - n0, positions)`` in ``dtype``
    (the convolution's sums' type: exact, integers under their bound) of the output channels it changes
    (``layout.channels``), and each record's saturated pair sums (zeros unless ``count``). Sums gather
    per channel in one array laid out channel-first, so each block adds whole contiguous rows; in the
    thread's scratch unless ``fresh``."""
    positions = math.prod(layer.geometry.out_spatial)
    shape = (layout.channels.size, n1 - n0, positions)
    if fresh:  # kept: not the thread's scratch
        acc = np.zeros(shape, dtype)
    else:
        acc = parallel.scratch(math.prod(shape), dtype, "pairs sums").reshape(shape)  # no page faults per chunk
        acc.fill(0)
    saturated = np.zeros(n1 - n0, np.int64)
    for index, (_, plan, _) in enumerate(layout.groups):
        step = max(1, COLUMN_BLOCK // (positions * plan.needed.size))  # records per im2col block
        sub = max(1, DENSE_BLOCK // (positions * min(len(plan), MIN_SPAN)))  # records per evaluated block
        for c0 in range(n0, n1, step):
            c1 = min(n1, c0 + step)
            columns = _columns(layer, layout.rows(index, layer), slice(c0, c1))  # (needed, rows)
            for r0 in range(c0, c1, sub):
                r1 = min(c1, r0 + sub)
                part = columns[:, (r0 - c0) * positions : (r1 - c0) * positions]
                for e, positive, rows, runs in layout.blocks(index, max(1, DENSE_BLOCK // part.shape[1])):
                    change = plan.changes(part, e, positive)
                    summed = change if runs is None else runs.sum(change, dtype)  # None: one entry per row
                    acc[rows, r0 - n0 : r1 - n0] += summed.reshape(-1, r1 - r0, positions)
                    if count:
                        counts = np.count_nonzero(change.reshape(-1, r1 - r0, positions), axis=(0, 2))
                        saturated[r0 - n0 : r1 - n0] += counts
    return acc, saturated


#: sums a run of changed channels must have for the dense correction to add a slice per run rather
#: than index every changed channel (a gather, an add and a scatter; a slice costs about 2 us a call)
RUN_ADD_OUTPUTS = 2048


class _DenseLayout:
    """What a layer's dense correction takes from its risky pairs alone: each group's plan, the output
    channels it changes (ascending) with each entry's row among them, and each block's rows. Made once
    per set of risky pairs (kept in their memo): a session's later runs mostly find the same pairs."""

    def __init__(self, found: list[tuple[int, pairs.RiskyPairs]], mg: int):
        self.found, self.mg = found, mg
        plans = [(g, _DensePlan(risky)) for g, risky in found]
        self.channels = np.unique(np.concatenate([g * mg + plan.column for g, plan in plans]))
        self.groups = [(g, plan, np.searchsorted(self.channels, g * mg + plan.column)) for g, plan in plans]
        self.entries = sum(len(plan) for _, plan in plans)
        self._blocks: dict[tuple[int, int], list[tuple[slice, bool, np.ndarray | slice, _Runs | None]]] = {}
        self._rows: dict[int, _Rows] = {}
        self._sums: dict[tuple[int, str], tuple[np.ndarray, np.ndarray | None]] = {}
        self._runs: list[tuple[int, int, int]] | None = None

    @classmethod
    def of(cls, found: list[tuple[int, pairs.RiskyPairs]], mg: int) -> _DenseLayout:
        return pairs.derived(found, ("dense", mg, tuple(g for g, _ in found)), lambda: cls(found, mg))

    def rows(self, index: int, layer: _Layer) -> _Rows:
        """Where group ``index``'s needed im2col rows read (the layer's weights fix the geometry)."""
        found = self._rows.get(index)
        if found is None:
            g, plan, _ = self.groups[index]
            found = self._rows[index] = _Rows(plan.needed, g, layer.cg, layer.geometry.kernel)
        return found

    def channel_runs(self) -> list[tuple[int, int, int]]:
        """Runs of consecutive changed channels: ``(first, end, index of first in channels)``."""
        if self._runs is None:
            starts = np.flatnonzero(np.diff(self.channels, prepend=-2) != 1)
            ends = np.append(starts[1:], self.channels.size)
            first = self.channels[starts]
            self._runs = [(int(a), int(a + j - i), int(i)) for a, i, j in zip(first, starts, ends, strict=True)]
        return self._runs

    def channel_sums(self, index: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray | None]:
        """How group ``index``'s entries add to output channels: the channel of each entry and None
        when no two share one, else all changed channels and the ``(channels, entries)`` matrix with
        1 where an entry adds to a channel (in ``dtype``: a matrix product of the sums' own type)."""
        key = (index, np.dtype(dtype).str)
        found = self._sums.get(key)
        if found is None:
            _, plan, slot = self.groups[index]
            if np.unique(slot).size == slot.size:
                found = (self.channels[slot], None)
            else:
                sums = np.zeros((self.channels.size, len(plan)), dtype)
                sums[slot, np.arange(len(plan))] = 1
                found = (self.channels, sums)
            self._sums[key] = found
        return found

    def blocks(self, index: int, span: int) -> list[tuple[slice, bool, np.ndarray | slice, _Runs | None]]:
        """Group ``index``'s entry blocks of at most ``span`` entries: ``(entries, positive, rows, runs)``,
        the rows they add to (a slice where consecutive) and their entries' runs per row (None: one
        entry per row)."""
        key = (index, span)
        found = self._blocks.get(key)
        if found is None:
            _, plan, slot = self.groups[index]
            found = []
            for e, positive in plan.blocks(span):
                rows, first = np.unique(slot[e], return_index=True)
                count = e.stop - e.start
                runs = None if rows.size == count else _Runs(first, count)
                if rows[-1] - rows[0] + 1 == rows.size:  # consecutive: a slice adds in one pass
                    rows = slice(int(rows[0]), int(rows[-1]) + 1)
                found.append((e, positive, rows, runs))
            self._blocks[key] = found
        return found


class DenseCorrection:
    """The correction of a layer where most outputs change (an image stem, mid-range inputs on heavy
    weights), computed for each chunk of the convolution while its sums are in cache: no array of the
    whole output is made, zeroed, scanned and added. Chunks that split records (row paths) take their
    part of the whole correction, made once by the first of them (:meth:`prepare`)."""

    def __init__(self, layer: _Layer, layout: _DenseLayout):
        self.layer, self.layout = layer, layout
        self.shape = (layer.x.shape[0], layer.m, *layer.geometry.out_spatial)
        self._whole: tuple[np.ndarray, np.ndarray] | None = None
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return True

    def max_abs(self) -> int:
        """A bound on any output's ``|correction|`` (:func:`pairs.correction_bound`)."""
        return pairs.correction_bound(self.layout.found, self.layer.m, self.layer.mg, self.layer.row_max)

    def dense(self) -> np.ndarray:
        """The whole ``(N, M, *out)`` int64 correction."""
        acc, _ = self.prepare()
        whole = np.zeros((self.shape[0], self.shape[1], math.prod(self.shape[2:])), np.int64)
        whole[:, self.layout.channels] = acc.transpose(1, 0, 2)
        return whole.reshape(self.shape)

    def prepare(self, dtype: type | np.dtype = np.int32) -> tuple[np.ndarray, np.ndarray]:
        """The whole correction, made once: the sums of the layout's channels ``(channels, N, positions)``
        in ``dtype`` (that of the first call; exact) and each record's saturated pair sums (zeros
        unless a counter is active)."""
        with self._lock:
            if self._whole is None:
                count = pairs.counter is not None
                self._whole = _dense_records(self.layer, self.layout, 0, self.shape[0], count, np.dtype(dtype), True)
            return self._whole

    def before_chunks(self, dtype: type) -> None:
        """Nothing: each chunk computes its own part."""

    def add_to(self, target: np.ndarray, n0: int, n1: int, o0: int, o1: int) -> None:
        """Add records ``n0:n1`` and first spatial indices ``o0:o1`` to that chunk's sums ``target``
        (``(n1 - n0, M, o1 - o0, *out[1:])``, or wider along the last axis)."""
        out = self.shape[2:]
        if self._whole is not None or o0 != 0 or o1 != out[0]:
            acc, saturated = self.prepare()
            part = acc.reshape(self.layout.channels.size, self.shape[0], *out)[:, n0:n1, o0:o1].swapaxes(0, 1)
            view = target[(slice(None), slice(None), *(slice(0, size) for size in part.shape[2:]))]
            _add_channels(view, part, self.layout)
            if o0 == 0:  # each record counted by the chunk holding its first row
                pairs.count(0, np.repeat(np.arange(n0, n1), saturated[n0:n1]))
            return
        layout = self.layout
        view = target[(slice(None), slice(None), *(slice(0, size) for size in out))]
        if layout.entries * (n1 - n0) * math.prod(out) <= SMALL_EVALUATIONS:
            self._add_small(layout, view, n0, n1)
            return
        acc, saturated = _dense_records(self.layer, layout, n0, n1, pairs.counter is not None, view.dtype)
        _add_channels(view, acc.reshape(layout.channels.size, n1 - n0, *out).swapaxes(0, 1), layout)
        pairs.count(0, np.repeat(np.arange(n0, n1), saturated))

    def _add_small(self, layout: _DenseLayout, view: np.ndarray, n0: int, n1: int) -> None:
        """:meth:`add_to` for few evaluations, in as few numpy calls as can be (most of a small layer's
        cost is per call): ``sat16(p) - p`` in int32 for every entry, summed per output channel by one
        matrix product with each entry's channel (exact: integers under the correction's bound)."""
        out = self.shape[2:]
        saturated = np.zeros(n1 - n0, np.int64) if pairs.counter is not None else None
        for index, (_, plan, _) in enumerate(layout.groups):
            columns = _columns(self.layer, layout.rows(index, self.layer), slice(n0, n1))
            value = np.multiply(columns[plan.row_first], plan.w_first, dtype=np.int32)
            value -= np.multiply(columns[plan.row_second], plan.minus_second, dtype=np.int32)
            change = np.clip(value, pairs.INT16_MIN, pairs.INT16_MAX)
            change -= value
            channels, sums = layout.channel_sums(index, view.dtype)
            summed = change if sums is None else sums @ change.astype(view.dtype)  # (channels, rows)
            block = summed.reshape(channels.size, n1 - n0, *out).swapaxes(0, 1)
            if channels.size == self.shape[1] and sums is not None:
                view += block
            else:
                view[:, channels] += block
            if saturated is not None:
                saturated += np.count_nonzero(change.reshape(len(plan), n1 - n0, -1), axis=(0, 2))
        if saturated is not None:
            pairs.count(0, np.repeat(np.arange(n0, n1), saturated))


def _add_channels(view: np.ndarray, block: np.ndarray, layout: _DenseLayout) -> None:
    """``view[:, layout.channels] += block`` (``block``: records, the layout's channels, then outputs)."""
    if layout.channels.size == view.shape[1]:
        view += block
        return
    runs = layout.channel_runs()
    if len(runs) * RUN_ADD_OUTPUTS > block.size:
        view[:, layout.channels] += block
    else:  # a slice per run of changed channels: one pass, where indexing gathers, adds and scatters
        for a, b, i in runs:
            view[:, a:b] += block[:, i : i + b - a]


#: (entry, output) evaluations of a chunk up to which the dense correction takes its few-calls form
SMALL_EVALUATIONS = 1 << 15


class PairCorrection:
    """The non-zero ``sum (sat16(p) - p)`` of a convolution's outputs ``(N, M, *out)``, one entry per output.

    Entries are sorted by ``(record, first spatial index)``, the way the convolution cuts its chunks.
    """

    def __init__(self, shape: tuple[int, ...], index: tuple[np.ndarray, ...], value: np.ndarray):
        linear = np.ravel_multi_index(index, shape)
        unique, inverse = np.unique(linear, return_inverse=True)
        summed = np.zeros(unique.size, np.int64)
        np.add.at(summed, inverse, value)
        keep = np.nonzero(summed)[0]
        coords = np.unravel_index(unique[keep], shape)
        rows = shape[2]
        key = coords[0] * rows + coords[2]
        order = np.argsort(key, kind="stable")
        self.shape, self.rows = shape, rows
        self.key = key[order]
        self.index = tuple(c[order] for c in coords)
        self.value = summed[keep][order]

    def __bool__(self) -> bool:
        return bool(self.value.size)

    def max_abs(self) -> int:
        """The largest ``|correction|`` of any output."""
        return int(np.abs(self.value).max(initial=0))

    def dense(self) -> np.ndarray:
        """The whole ``(N, M, *out)`` int64 correction."""
        out = np.zeros(self.shape, np.int64)
        out[self.index] = self.value
        return out

    def add_to(self, target: np.ndarray, n0: int, n1: int, o0: int, o1: int) -> None:
        """Add the entries of records ``n0:n1`` and first spatial indices ``o0:o1`` to ``target``,
        that chunk's ``(n1 - n0, M, o1 - o0, *out[1:])`` sums (or wider along the last axis)."""
        if o0 == 0 and o1 == self.rows:
            ranges = [(n0 * self.rows, n1 * self.rows)]
        else:
            ranges = [(r * self.rows + o0, r * self.rows + o1) for r in range(n0, n1)]
        for lo, hi in ranges:
            a, b = np.searchsorted(self.key, [lo, hi])
            if a < b:
                record, channel, row, *rest = (c[a:b] for c in self.index)
                target[(record - n0, channel, row - o0, *rest)] += self.value[a:b].astype(target.dtype)


class _Correction:
    """Collects the saturated pairs of every task (threads) into a :class:`PairCorrection`."""

    def __init__(self, shape: tuple[int, ...]):
        self.shape = shape
        self.parts: list[tuple[tuple[np.ndarray, ...], np.ndarray]] = []
        self.hits = 0  #: saturated pair sums added so far
        self._lock = threading.Lock()

    def add(self, index: tuple[np.ndarray, ...], value: np.ndarray) -> None:
        """``value`` added to the outputs at ``index`` (``(record, channel, *spatial)``, repeats allowed)."""
        with self._lock:
            self.parts.append((index, np.asarray(value, np.int64)))
            self.hits += int(np.size(value))

    def result(self) -> PairCorrection | None:
        if not self.parts:
            return None
        index = tuple(np.concatenate(axis) for axis in zip(*(i for i, _ in self.parts), strict=True))
        found = PairCorrection(self.shape, index, np.concatenate([v for _, v in self.parts]))
        return found if found else None


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
    out: _Correction,
    n_first: int,
    xp: np.ndarray,
    offset: tuple[int, ...],
    channel: np.ndarray,
    tap: np.ndarray,
    column: np.ndarray,
    w_first: np.ndarray,
    w_second: np.ndarray,
    geometry: _Geometry,
    lowest: pairs.LowestSecond,
) -> None:
    """Pairs of channels ``(c, c+1)`` at one tap: candidate pixels first, then each pair's outputs.

    ``xp`` holds records ``n_first...`` of the input, padded or not: ``offset`` is where its pixel 0 lies
    in the padded input.
    """
    if not channel.size:
        return
    firsts, which = np.unique(channel, return_inverse=True)
    # an entry can only saturate where x[c] + x[c+1] > its threshold: entries sorted by threshold within
    # each channel pair, a candidate pixel multiplies out only the prefix whose threshold its sum exceeds
    own = pairs.INT16_MAX // np.maximum(np.abs(w_first), np.abs(w_second)).astype(np.int64)
    order = np.lexsort((own, which))
    key = which[order] * (pairs.INT16_MAX + 1) + own[order]
    start = np.searchsorted(which[order], np.arange(firsts.size))
    threshold = own[order][start]  # the smallest of each channel pair: the cheap candidate test
    spatial = xp.shape[2:]
    per_record = firsts.size * math.prod(spatial)
    step = max(1, BLOCK_ELEMENTS // max(per_record, 1))
    every_even = firsts.size == xp.shape[1] // 2 and np.array_equal(firsts, 2 * np.arange(firsts.size))
    for n0 in range(0, xp.shape[0], step):
        block = xp[n0 : n0 + step]
        total = (
            np.add(block[:, 0 : 2 * firsts.size : 2], block[:, 1 : 2 * firsts.size : 2], dtype=np.uint16)
            if every_even
            else np.add(block[:, firsts], block[:, firsts + 1], dtype=np.uint16)
        ).reshape(block.shape[0], firsts.size, -1)
        passed = total > threshold[:, None]
        candidates = np.count_nonzero(passed)  # counted before any index is made
        if not candidates:
            continue
        every = np.arange(firsts.size)
        if candidates * 8 > total.size and lowest.cost(every) < 4 * candidates:
            # many candidates, few entries (a first layer): the exact test on every pixel, one lookup each
            flat = np.flatnonzero(_exact_candidates(block, firsts, lowest.rows(every)))
        else:
            flat = np.flatnonzero(passed)
        size = total.shape[2]
        record, rest = np.divmod(flat, firsts.size * size)
        pair, position = np.divmod(rest, size)
        source = (record * block.shape[1] + firsts[pair]) * size + position  # flat index in the block
        values = block.reshape(-1)
        first, second = values[source].astype(np.int32), values[source + size].astype(np.int32)
        sums = (first + second).astype(np.int64)
        count = np.searchsorted(key, pair * (pairs.INT16_MAX + 1) + sums) - start[pair]
        if lowest.cost(pair) < int(count.sum()):  # the exact test is cheaper than multiplying every prefix out
            exact = np.nonzero(second >= lowest.rows(pair)[pair, first])[0]  # some entry of the pair saturates
            if not exact.size:
                continue
            record, rest, pair, position = record[exact], rest[exact], pair[exact], position[exact]
            first, second, sums, count = first[exact], second[exact], sums[exact], count[exact]
        record = record + n0
        pixel = [p + o for p, o in zip(np.unravel_index(position, spatial), offset, strict=True)]
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
                out.add((index[0] + n_first, *index[1:]), change[valid])
                pairs.count(0, index[0] + n_first)


def _exact_candidates(block: np.ndarray, firsts: np.ndarray, lowest: np.ndarray) -> np.ndarray:
    """``(records, pairs, pixels)``: where some entry of the channel pair saturates (``x[c+1] >= lowest[x[c]]``)."""
    flat = block.reshape(*block.shape[:2], -1)
    mask = np.empty((block.shape[0], firsts.size, flat.shape[2]), bool)
    for j, c in enumerate(firsts):
        np.greater_equal(flat[:, c + 1], lowest[j][flat[:, c]], out=mask[:, j])
    return mask


def _add_crossing(out: _Correction, layer: _Layer, g: int, risky: pairs.RiskyPairs) -> None:
    """Pairs that cross from one tap to the next: their im2col columns are gathered (``pairs.corrections``)."""
    geometry, mg = layer.geometry, layer.mg
    positions = math.prod(geometry.out_spatial)
    kernel = geometry.kernel
    rows, cols, values = pairs.corrections(
        risky, lambda ks: _columns(layer, _Rows(ks, g, layer.cg, kernel)), layer.x.shape[0] * positions
    )
    record, position = np.divmod(rows, positions)
    pairs.count(0, record)
    if values.size:
        spatial = np.unravel_index(position, geometry.out_spatial)
        out.add((record, g * mg + cols, *spatial), values)


class _Rows:
    """Where im2col rows ``ks`` (``tap * cg + channel`` of group ``g``) read: the input channels they
    use (ascending), each row's place among them and its tap's offset per spatial axis."""

    def __init__(self, ks: np.ndarray, g: int, cg: int, kernel: tuple[int, ...]):
        self.size = ks.size
        tap, channel = np.divmod(ks, cg)
        self.used, self.channel = np.unique(g * cg + channel, return_inverse=True)
        self.offsets = np.unravel_index(tap, kernel)


def _columns(layer: _Layer, rows: _Rows, records: slice = slice(None)) -> np.ndarray:
    """The im2col ``rows`` of ``records``: ``(rows.size, records * out)``.

    One gather from a strided window view of the padded records (padding holds the input zero point,
    as onnxruntime pads): a call per layer and block, not per tap. Only the channels the rows read
    are padded (most layers' risky pairs read a few of them).
    """
    geometry = layer.geometry
    source = layer.x[records]
    source = source[:, rows.used] if rows.used.size < source.shape[1] else source
    xp = np.ascontiguousarray(_padded(source, layer.pads, layer.x_zp))
    d = xp.ndim - 2
    # (records, C, *out, *kernel): output o, tap t reads pixel o * stride + t * dilation
    step = xp.strides[2:]
    shape = (*xp.shape[:2], *geometry.out_spatial, *geometry.kernel)
    strides = (
        *xp.strides[:2],
        *(s * stride for s, stride in zip(step, geometry.strides, strict=True)),
        *(s * dil for s, dil in zip(step, geometry.dilations, strict=True)),
    )
    # a window view (as numpy's as_strided makes it, at a tenth of its cost per call); only read
    windows = np.ndarray(shape, xp.dtype, buffer=xp, strides=strides)
    # the advanced indices are apart, so their axis comes first: (rows, records, *out)
    return windows[(slice(None), rows.channel, *(slice(None),) * d, *rows.offsets)].reshape(rows.size, -1)


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
    if not any(pads):
        return x
    d = x.ndim - 2
    shape = (*x.shape[:2], *(s + pads[i] + pads[d + i] for i, s in enumerate(x.shape[2:])))
    xp = np.full(shape, value, np.uint8)
    xp[(slice(None), slice(None), *(slice(pads[i], pads[i] + s) for i, s in enumerate(x.shape[2:])))] = x
    return xp


def _fields(risky: pairs.RiskyPairs) -> tuple[np.ndarray, ...]:
    return risky.first, risky.column, risky.w_first, risky.w_second


#: what :func:`pair_corrections` returns: each adds its part to a chunk's sums (``add_to``), bounds its
#: size (``max_abs``), and says what may run beside onnxruntime's sums and before the chunks
Correction = DenseCorrection | SparseSearch
