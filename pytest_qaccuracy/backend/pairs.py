"""The int16 pair saturation of x86 u8 x s8 integer kernels on CPUs without VNNI.

onnxruntime's MLAS multiplies unsigned 8-bit activations by signed 8-bit weights with ``vpmaddubsw``
on AVX2 and AVX512-BW CPUs that lack VNNI. The instruction adds each two neighbouring products along
the reduction axis and saturates the sum to int16; ``vpmaddwd`` then widens those sums to int32
exactly. On raw (not zero-point shifted) values, with the reduction axis in the order the kernel packs
it::

    acc = sum_p sat16(a[2p] * b[2p] + a[2p + 1] * b[2p + 1])  - zero-point terms (exact)

A pair can only saturate when its sum can leave ``[-32768, 32767]``. With ``0 <= a <= a_max`` that
needs ``a_max * (b[2p]+ + b[2p+1]+) > 32767`` or ``a_max * (b[2p]- + b[2p+1]-) > 32768`` (``+``/``-``
the positive and negative parts), a property of the weights alone. So the exact sums are computed the
fast way and only the pairs that may saturate are corrected: ``acc = exact + sum (sat16(p) - p)``.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

T = TypeVar("T")

INT16_MIN, INT16_MAX = -32768, 32767
#: elements of one ``(rows, pairs)`` block of the correction
BLOCK_ELEMENTS = 1 << 21


@dataclass(slots=True)
class NodeSaturation:
    """Pair sums of one node over a run: how many were computed, how many saturated, and per record."""

    pairs: int = 0
    saturated: int = 0
    per_record: dict[int, int] = field(default_factory=dict)

    def worst_record(self) -> tuple[int, int] | None:
        """``(record, saturated pair sums)`` of the record with the most, or None."""
        return max(self.per_record.items(), key=lambda item: (item[1], -item[0])) if self.per_record else None


class SaturationCounter:
    """Counts the saturated pair sums of every node while :func:`counting` is active.

    The interpreter names the node (``node``) before each step; ``offset`` is the index of the batch's
    first record in the dataset. Kernels report through :func:`count` from any thread.
    """

    def __init__(self) -> None:
        self.node = ""
        self.offset = 0
        self.nodes: dict[str, NodeSaturation] = {}
        self._lock = threading.Lock()

    def add(self, pairs: int, records: np.ndarray) -> None:
        """``pairs`` pair sums computed; ``records`` holds the record of each one that saturated."""
        found, counts = np.unique(records, return_counts=True) if records.size else ((), ())
        with self._lock:
            entry = self.nodes.setdefault(self.node, NodeSaturation())
            entry.pairs += int(pairs)
            entry.saturated += int(records.size)
            for record, number in zip(found, counts, strict=True):
                key = self.offset + int(record)
                entry.per_record[key] = entry.per_record.get(key, 0) + int(number)


#: the active counter (one at a time), or None
counter: SaturationCounter | None = None


@contextlib.contextmanager
def counting(target: SaturationCounter) -> Iterator[SaturationCounter]:
    """Count saturated pair sums into ``target`` for the duration of the block."""
    global counter
    previous, counter = counter, target
    try:
        yield target
    finally:
        counter = previous


def count(pairs: int, records: np.ndarray) -> None:
    """Report pair sums to the active counter (nothing when none is active)."""
    if counter is not None:
        counter.add(pairs, records)


@dataclass(frozen=True, slots=True)
class RiskyPairs:
    """The weight pairs ``(b[k], b[k+1])`` of one ``(K, N)`` weight matrix that may saturate.

    Attributes:
        first: reduction index ``k`` of each pair's first element (even); the second is ``k + 1``.
        column: output column of each pair, sorted ascending.
        w_first: ``b[k, column]`` as int32.
        w_second: ``b[k + 1, column]`` as int32.
        memo: what a kernel derives from these pairs alone, kept with them (they are handed out
            again while a weight's input bounds do not grow: :meth:`PairBounds.risky`); ``"bound"``:
            the input bound of each reduction index they were searched for, when searched.
    """

    first: np.ndarray
    column: np.ndarray
    w_first: np.ndarray
    w_second: np.ndarray
    memo: dict = field(default_factory=dict, compare=False, repr=False)

    def __len__(self) -> int:
        return int(self.first.size)


def risky_pairs(w: np.ndarray, a_max: int | np.ndarray) -> RiskyPairs:
    """The pairs of ``w`` (``(K, N)``, signed 8-bit values) that may saturate for inputs in ``[0, a_max]``.

    ``a_max`` is one bound for every input, or one per reduction index (``(K,)``, e.g. the largest
    value of each input channel): a pair ``(k, k+1)`` then needs ``a_max[k] b[k]+ + a_max[k+1] b[k+1]+ >
    32767`` (or the negative parts below -32768), a tighter test where channels have narrower ranges.
    """
    return PairBounds(w).risky(a_max)


class PairBounds:
    """A ``(K, N)`` weight matrix split into the positive and negative parts of its pairs' two rows,
    made once per weight (:func:`pair_bounds`) so that :meth:`risky` costs a few passes per run."""

    def __init__(self, w: np.ndarray):
        w = np.asarray(w, dtype=np.int32)
        self.k = w.shape[0]
        k = self.k - self.k % 2  # an odd last element pairs with padding (0): one product never saturates
        self.even, self.odd = w[0:k:2], w[1:k:2]
        # int16 arithmetic: |a w| <= 255 * 128 = 32640, so the test ``a w + a' w' > 32767`` is run as
        # ``a w > 32767 - a' w'`` (and ``a w < -32768 - a' w'`` for the negative parts), both sides in int16
        self.high = np.maximum(self.even, 0).astype(np.int16), np.maximum(self.odd, 0).astype(np.int16)
        self.low = np.minimum(self.even, 0).astype(np.int16), np.minimum(self.odd, 0).astype(np.int16)
        # each pair row's largest parts over the columns: a row none of whose columns can saturate is
        # ruled out by two products, before its columns are looked at (most rows of most layers)
        self.row_high = tuple(part.max(axis=1, initial=0).astype(np.int32) for part in self.high)
        self.row_low = tuple(part.min(axis=1, initial=0).astype(np.int32) for part in self.low)
        #: the last bounds searched and what was found: (bounds, pairs)
        self._last: tuple[np.ndarray, RiskyPairs] | None = None

    def risky(self, a_max: int | np.ndarray, repeat: int = 1) -> RiskyPairs:
        """:func:`risky_pairs` of this matrix; ``a_max`` repeated ``repeat`` times gives the bound of
        each reduction index (a convolution's rows: the same channels at every tap).

        The pairs found for the last bounds are given again when no bound is larger (then they hold
        every pair that may saturate, perhaps a few more that cannot: the corrections evaluate them
        to zero). A session's later runs mostly see the same channel maxima (many at 255), so the
        search runs about once per weight (measured: 2-4 ms of a 32-pixel net's 25 ms per run).
        """
        given = np.asarray(a_max, dtype=np.int32)  # inputs are uint8
        last = self._last
        if last is not None and given.shape == last[0].shape and bool((given <= last[0]).all()):
            return last[1]
        bound = np.broadcast_to(np.tile(given, repeat) if repeat > 1 else given, (self.k,))
        found = self._search(bound)
        found.memo["bound"] = np.array(bound)  # what the pairs were searched for: it bounds later inputs too
        self._last = (given.copy(), found)  # one assignment: threads sharing the weight see a whole pair
        return found

    def _search(self, bound: np.ndarray) -> RiskyPairs:
        k = self.even.shape[0] * 2
        a_even, a_odd = bound[0:k:2], bound[1:k:2]
        rows = np.flatnonzero(
            (a_even * self.row_high[0] + a_odd * self.row_high[1] > INT16_MAX)
            | (a_even * self.row_low[0] + a_odd * self.row_low[1] < INT16_MIN)
        )
        if not rows.size:
            empty = np.zeros(0, np.int64)
            return RiskyPairs(empty, empty, np.zeros(0, np.int32), np.zeros(0, np.int32))
        every = rows.size == a_even.size
        a_even, a_odd = a_even[rows, None].astype(np.int16), a_odd[rows, None].astype(np.int16)
        (high0, high1), (low0, low1) = (
            (self.high, self.low) if every else ([p[rows] for p in self.high], [p[rows] for p in self.low])
        )
        room = np.subtract(INT16_MAX, high1 * a_odd, dtype=np.int16)
        mask = high0 * a_even > room
        np.subtract(INT16_MIN, low1 * a_odd, out=room)
        mask |= low0 * a_even < room
        columns, found = np.nonzero(mask.T)  # column-major: sorted by column
        pairs = rows[found]
        return _read_only(
            RiskyPairs(
                first=(2 * pairs).astype(np.int64),
                column=columns.astype(np.int64),
                w_first=self.even[pairs, columns],
                w_second=self.odd[pairs, columns],
            )
        )


def _read_only(found: RiskyPairs) -> RiskyPairs:
    """``found`` with its arrays read-only: it is handed out again for later runs."""
    for part in (found.first, found.column, found.w_first, found.w_second):
        part.flags.writeable = False
    return found


def derived(found: Sequence[tuple[int, RiskyPairs]], key: Hashable, make: Callable[[], T]) -> T:
    """``make()``, kept in the first group's :attr:`RiskyPairs.memo` under ``key`` for as long as the
    groups' risky pairs are these very objects (a later search hands out new ones; another group may
    join them, one whose inputs grew from quiet). Threads may make it twice, never see it half made
    (one assignment)."""
    memo = found[0][1].memo
    kept = memo.get(key)
    same = kept is not None and len(kept[0]) == len(found)
    if same and all(a is b for a, (_, b) in zip(kept[0], found, strict=True)):
        return kept[1]
    value = make()
    memo[key] = ([risky for _, risky in found], value)
    return value


def largest_change(
    w_first: np.ndarray, w_second: np.ndarray, top_first: np.ndarray, top_second: np.ndarray
) -> np.ndarray:
    """The most ``|sat16(p) - p|`` can be for each weight pair, its two inputs in ``[0, top]``: from
    ``w top + w' top'``, exact for any signs (a pair of mixed signs never leaves int16: ``255 * 128 <
    32768``, and one of a single sign is largest at the tops)."""
    reach = top_first * w_first.astype(np.int64) + top_second * w_second.astype(np.int64)
    return np.maximum(np.maximum(reach - INT16_MAX, INT16_MIN - reach), 0)


def correction_bound(
    found: Sequence[tuple[int, RiskyPairs]], m: int, mg: int, row_max: Callable[[int], np.ndarray]
) -> int:
    """A bound on any output's ``|sum (sat16(p) - p)|``: each risky pair's largest change, from the
    largest input of each of its two rows, summed per output column (``g * mg + column``, of ``m``).

    The inputs' bounds are those the pairs were searched for (``memo["bound"]``, no smaller than any
    run's that reuses them), so the bound is made once per set of pairs; ``row_max(g)`` (each row's
    largest input of group ``g``) serves pairs that were not searched.
    """

    def make() -> int:
        total = np.zeros(m, np.int64)
        for g, risky in found:
            top = (risky.memo["bound"] if "bound" in risky.memo else row_max(g)).astype(np.int64)
            change = largest_change(risky.w_first, risky.w_second, top[risky.first], top[risky.first + 1])
            np.add.at(total, g * mg + risky.column, change)
        return int(total.max(initial=0))

    if all("bound" in risky.memo for _, risky in found):
        return derived(found, ("correction bound", m, mg), make)
    return make()


_BOUNDS: dict[tuple[int, Hashable], tuple[weakref.ref, PairBounds]] = {}
_BOUNDS_LOCK = threading.Lock()


def pair_bounds(source: np.ndarray, key: Hashable, make: Callable[[], np.ndarray]) -> PairBounds:
    """The :class:`PairBounds` of ``make()``, a matrix derived from the weight array ``source``, kept
    while ``source`` lives: a session passes the same weight arrays on every run. Only a read-only
    ``source`` (a session's constant) is kept: another array may hold other values at the same
    address later (an activation), so its bounds are made for each call."""
    if source.flags.writeable:
        return PairBounds(make())
    slot = (id(source), key)
    with _BOUNDS_LOCK:
        found = _BOUNDS.get(slot)
        if found is not None and found[0]() is source:
            return found[1]
    bounds = PairBounds(make())
    try:
        ref = weakref.ref(source, lambda _, slot=slot: _BOUNDS.pop(slot, None))
    except TypeError:  # not weak-referenceable (a view of a temporary): no caching
        return bounds
    with _BOUNDS_LOCK:
        _BOUNDS[slot] = (ref, bounds)
    return bounds


def lowest_second(w_first: np.ndarray, w_second: np.ndarray, pair: np.ndarray, pairs: int) -> np.ndarray:
    """``table[p, a]``: the smallest second input at which some weight pair of ``p`` saturates, first input ``a``.

    Pair ``i`` (weights ``w_first[i], w_second[i]``, one of ``pairs`` groups named by ``pair[i]``) saturates
    at inputs ``(a, a')`` when ``a w + a' w' > 32767`` or ``< -32768``. With ``0 <= a, a' <= 255`` only
    one side can be reached, the one of ``w'``'s sign (``|a w| <= 32640``), and for a fixed ``a`` it is a
    threshold on ``a'``: ``a' >= ceil((32768 - a w) / w')`` for ``w' > 0``, ``a' >= ceil((32769 + a w) / -w')``
    for ``w' < 0``. ``256``: never.
    """
    return LowestSecond(w_first, w_second, pair, pairs).rows(np.arange(pairs))


class LowestSecond:
    """:func:`lowest_second`, row by row as candidates need them (threads share one table)."""

    def __init__(self, w_first: np.ndarray, w_second: np.ndarray, pair: np.ndarray, pairs: int):
        self.w_first = np.asarray(w_first, np.int32)
        self.w_second = np.asarray(w_second, np.int32)
        pair = np.asarray(pair)
        self.order = np.argsort(pair, kind="stable")  # entries grouped by pair
        self.bounds = np.concatenate([[0], np.cumsum(np.bincount(pair, minlength=pairs))])
        self.table = np.full((pairs, 256), 256, np.int16)
        self.done = np.zeros(pairs, bool)
        self._lock = threading.Lock()

    def cost(self, wanted: np.ndarray) -> int:
        """Table cells still to compute for the rows of ``wanted`` (pairs)."""
        todo = np.unique(wanted)
        todo = todo[~self.done[todo]]
        return int((self.bounds[todo + 1] - self.bounds[todo]).sum()) * 256

    def rows(self, wanted: np.ndarray) -> np.ndarray:
        """The table, with at least the rows of the pairs in ``wanted`` filled in."""
        with self._lock:
            todo = np.unique(wanted)
            todo = todo[~self.done[todo]]
            if todo.size:
                counts = self.bounds[todo + 1] - self.bounds[todo]
                at = np.repeat(self.bounds[todo] - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
                entry = self.order[at]
                starts = np.cumsum(counts) - counts
                lowest = self._lowest(self.w_first[entry], self.w_second[entry])
                filled = counts > 0
                self.table[todo[filled]] = np.minimum.reduceat(lowest, starts[filled], axis=0)
                self.done[todo] = True
            return self.table

    @staticmethod
    def _lowest(w: np.ndarray, w2: np.ndarray) -> np.ndarray:
        """``(entries, 256)``: the threshold on the second input of each entry, for every first input."""
        a = np.arange(256, dtype=np.int32)
        up = w2 > 0
        first = np.where(up, w, -w).astype(np.int32)[:, None]  # toward the reachable side
        need = np.where(up, INT16_MAX + 1, -INT16_MIN + 1).astype(np.int32)[:, None]
        second = np.maximum(np.abs(w2), 1).astype(np.int32)[:, None]
        lowest = -((a * first - need) // second)
        lowest[w2 == 0] = 256
        return np.clip(lowest, 0, 256).astype(np.int16)


def corrections(
    pairs: RiskyPairs, gather: Callable[[np.ndarray], np.ndarray], rows: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The non-zero ``sat16(p) - p`` of the risky pairs as ``(row, column, value)`` triples.

    Args:
        pairs: the risky pairs of the weight matrix.
        gather: ``gather(ks)`` returns the raw inputs at reduction indices ``ks`` as ``(len(ks), rows)``.
        rows: number of rows (records times output positions).

    A row of a pair can only saturate when ``(a[k] + a[k+1]) * w_max > 32767``, ``w_max`` the largest
    weight magnitude among the pair's risky columns: a cheap test over the rows picks the candidates,
    a table lookup (:func:`lowest_second`) keeps those where some column does saturate, and only those
    are multiplied out column by column.
    """
    empty = np.zeros(0, np.int64)
    if not len(pairs) or not rows:
        return empty, empty, empty
    needed = np.unique(np.concatenate([pairs.first, pairs.first + 1]))
    inputs = gather(needed)
    firsts, which = np.unique(pairs.first, return_inverse=True)  # distinct pairs of the reduction axis
    row_first, row_second = np.searchsorted(needed, firsts), np.searchsorted(needed, firsts + 1)
    largest = np.zeros(firsts.size, np.int32)
    np.maximum.at(largest, which, np.maximum(np.abs(pairs.w_first), np.abs(pairs.w_second)))
    threshold = INT16_MAX // largest  # a + a' above it may saturate
    order = np.argsort(which, kind="stable")  # the risky entries grouped by pair
    start = np.searchsorted(which[order], np.arange(firsts.size))
    count = np.bincount(which, minlength=firsts.size)
    found: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    lowest = LowestSecond(pairs.w_first, pairs.w_second, which, firsts.size)  # rows made as candidates need them
    step = max(1, BLOCK_ELEMENTS // rows)
    for p0 in range(0, firsts.size, step):
        block = slice(p0, p0 + step)
        total = inputs[row_first[block]].astype(np.uint16) + inputs[row_second[block]]
        pair, row = np.nonzero(total > threshold[block, None])
        if not pair.size:
            continue
        pair += p0
        table = lowest.rows(pair)
        exact = inputs[row_second[pair], row] >= table[pair, inputs[row_first[pair], row]]  # some entry saturates
        pair, row = pair[exact], row[exact]
        if not pair.size:
            continue
        per = count[pair]
        entry = order[np.repeat(start[pair] - np.cumsum(per) + per, per) + np.arange(per.sum())]
        pair, row = np.repeat(pair, per), np.repeat(row, per)
        value = inputs[row_first[pair], row].astype(np.int32) * pairs.w_first[entry]
        value += inputs[row_second[pair], row].astype(np.int32) * pairs.w_second[entry]
        change = np.clip(value, INT16_MIN, INT16_MAX) - value
        keep = np.nonzero(change)[0]
        found.append((row[keep], pairs.column[entry[keep]], change[keep].astype(np.int64)))
    if not found:
        return empty, empty, empty
    return tuple(np.concatenate(parts) for parts in zip(*found, strict=True))  # type: ignore[return-value]


def saturating_matmul_correction(a: np.ndarray, w: np.ndarray) -> np.ndarray | None:
    """``sum_p sat16(pair) - sum_p pair`` for ``a`` (``(..., M, K)`` uint8) times ``w`` (``(..., K, N)`` int8).

    Batch axes broadcast as in ``np.matmul``. Returns None when no pair saturates (the exact sums are
    then right).
    """
    if w.ndim > 2:
        batch = np.broadcast_shapes(a.shape[:-2], w.shape[:-2])
        a_b = np.broadcast_to(a, (*batch, *a.shape[-2:]))
        w_b = np.broadcast_to(w, (*batch, *w.shape[-2:]))
        parts = [saturating_matmul_correction(a_b[i], w_b[i]) for i in np.ndindex(*batch)]
        if all(p is None for p in parts):
            return None
        zeros = np.zeros((a.shape[-2], w.shape[-1]), np.int64)
        return np.stack([zeros if p is None else p for p in parts]).reshape(*batch, *zeros.shape)
    a2 = a.reshape(-1, a.shape[-1])
    source = w  # a session's constant, or the constant array a view of it reads
    while isinstance(source.base, np.ndarray):
        source = source.base
    key = (w.__array_interface__["data"][0], w.shape, w.strides, w.dtype.str)
    bounds = pair_bounds(source, key, lambda: w)  # made once per weight matrix of a session
    found = bounds.risky(a2.max(axis=0, initial=0))  # each input column's own bound
    rows, cols, values = corrections(found, lambda ks: np.ascontiguousarray(a2[:, ks].T), a2.shape[0])
    if counter is not None:  # rows of a record: the leading axis is the batch
        per_record = max(1, a2.shape[0] // max(1, a.shape[0])) if a.ndim > 1 else a2.shape[0]  # 0 records: 1
        count(a2.shape[0] * ((w.shape[0] + 1) // 2) * w.shape[1], rows // per_record)
    if not values.size:
        return None
    result = np.zeros((a2.shape[0], w.shape[1]), np.int64)
    np.add.at(result, (rows, cols), values)
    return result.reshape(*a.shape[:-1], w.shape[1])
