"""Unit tests of the pair emulation's parts (``backend/pairs.py``, ``backend/neon_pairs.py``), for the
``pairs`` mutation group: every expected value is worked out by hand here or by loops over single pair
sums in Python integers (int16 saturation for x86 without VNNI, int16 wrap-around for ARM64 without
dot products), which share no code with the backend's vectorized corrections."""

from __future__ import annotations

import gc
import itertools
from collections.abc import Iterator

import numpy as np
import pytest

from pytest_qaccuracy.backend import neon_pairs, pairs


def _sat16(v: int) -> int:
    return max(-32768, min(32767, v))


def _wrap16(v: int) -> int:
    return (v + 32768) % 65536 - 32768


@pytest.fixture(autouse=True)
def _no_counter() -> Iterator[None]:
    """Every test starts and ends without an active saturation counter."""
    assert pairs.counter is None
    yield
    assert pairs.counter is None


def _counter(node: str = "node", offset: int = 0) -> pairs.SaturationCounter:
    counter = pairs.SaturationCounter()
    counter.node, counter.offset = node, offset
    return counter


# --- the saturation counter ----------------------------------------------------------------------------


def test_a_node_without_saturated_records_has_no_worst_record() -> None:
    assert pairs.NodeSaturation().worst_record() is None
    assert pairs.NodeSaturation(pairs=10, saturated=0).worst_record() is None


def test_the_worst_record_has_the_most_saturated_sums_and_the_lowest_index_on_a_tie() -> None:
    assert pairs.NodeSaturation(per_record={4: 2, 1: 7, 9: 3}).worst_record() == (1, 7)
    assert pairs.NodeSaturation(per_record={8: 5, 3: 5, 6: 1}).worst_record() == (3, 5)
    assert pairs.NodeSaturation(per_record={3: 5, 8: 5}).worst_record() == (3, 5)
    assert pairs.NodeSaturation(per_record={0: 1}).worst_record() == (0, 1)


def test_the_counter_adds_pairs_saturated_sums_and_records_offset_per_node() -> None:
    counter = _counter("conv1", offset=10)
    counter.add(100, np.array([2, 0, 2, 2], np.int64))
    counter.add(50, np.zeros(0, np.int64))
    counter.offset = 20
    counter.add(7, np.array([0, 1], np.int64))
    counter.node = "conv2"
    counter.add(3, np.array([5], np.int64))
    assert list(counter.nodes) == ["conv1", "conv2"]
    first, second = counter.nodes["conv1"], counter.nodes["conv2"]
    assert (first.pairs, first.saturated) == (157, 6)
    assert first.per_record == {12: 3, 10: 1, 20: 1, 21: 1}
    assert all(type(k) is int and type(v) is int for k, v in first.per_record.items())
    assert type(first.pairs) is int and type(first.saturated) is int
    assert (second.pairs, second.saturated, second.per_record) == (3, 1, {25: 1})


def test_the_counter_adds_to_a_record_seen_before() -> None:
    counter = _counter()
    counter.add(np.int64(4), np.array([1, 1], np.int64))
    counter.add(np.int64(4), np.array([1], np.int64))
    assert counter.nodes["node"].per_record == {1: 3}
    assert counter.nodes["node"].pairs == 8 and counter.nodes["node"].saturated == 3


def test_a_counter_starts_with_no_node_named_and_no_offset() -> None:
    counter = pairs.SaturationCounter()
    counter.add(2, np.array([1]))
    assert counter.nodes == {"": pairs.NodeSaturation(2, 1, {1: 1})}


def test_a_node_that_never_saturates_is_listed_with_its_pairs() -> None:
    counter = _counter("quiet")
    counter.add(64, np.zeros(0, np.int64))
    assert counter.nodes["quiet"] == pairs.NodeSaturation(pairs=64, saturated=0, per_record={})


def test_counting_activates_a_counter_and_restores_the_previous_one() -> None:
    outer, inner = _counter("outer"), _counter("inner")
    pairs.count(5, np.array([0]))  # no counter: nothing happens
    with pairs.counting(outer) as active:
        assert active is outer and pairs.counter is outer
        pairs.count(5, np.array([0]))
        with pairs.counting(inner):
            assert pairs.counter is inner
            pairs.count(3, np.array([1, 1]))
        assert pairs.counter is outer
        with pytest.raises(RuntimeError), pairs.counting(inner):
            raise RuntimeError("stop")
        assert pairs.counter is outer
    assert pairs.counter is None
    assert outer.nodes["outer"] == pairs.NodeSaturation(5, 1, {0: 1})
    assert inner.nodes["inner"] == pairs.NodeSaturation(3, 2, {1: 2})


# --- the weight bounds -----------------------------------------------------------------------------------


def _corner_test(w: np.ndarray, bound: np.ndarray) -> np.ndarray:
    """``(K // 2, N)``: whether some inputs in ``[0, bound[k]] x [0, bound[k+1]]`` leave int16 (the extremes
    of ``a w + a' w'`` lie at the box's corners)."""
    k = w.shape[0] - w.shape[0] % 2
    w0, w1 = w[0:k:2].astype(np.int64), w[1:k:2].astype(np.int64)
    a0, a1 = bound[0:k:2, None].astype(np.int64), bound[1:k:2, None].astype(np.int64)
    corners = [c0 * w0 + c1 * w1 for c0 in (0, a0) for c1 in (0, a1)]
    return (np.max(corners, axis=0) > 32767) | (np.min(corners, axis=0) < -32768)


def _flagged(found: pairs.RiskyPairs, shape: tuple[int, int]) -> np.ndarray:
    flagged = np.zeros(shape, bool)
    flagged[found.first // 2, found.column] = True
    return flagged


def test_a_pair_on_the_int16_edge_is_flagged_only_past_it() -> None:
    """255 * 127 + 255 * 2 = 32895 can leave int16, a pair of mixed signs (at most 255 * 128) cannot;
    -128 * (128 + 128) = -32768 stays in, one more step on either input leaves it; 127 * (129 + 129) =
    32766 stays in, 127 * (129 + 130) = 32893 does not."""
    w = np.array([[127, 127, -128, -128, 1], [2, -128, -128, -128, 1]], np.int8)
    found = pairs.risky_pairs(w, 255)
    assert found.column.tolist() == [0, 2, 3]
    assert found.first.tolist() == [0, 0, 0]
    assert found.w_first.tolist() == [127, -128, -128] and found.w_second.tolist() == [2, -128, -128]
    assert found.first.dtype == np.int64 and found.column.dtype == np.int64
    assert found.w_first.dtype == np.int32 and found.w_second.dtype == np.int32
    assert len(found) == 3
    w = np.array([[-128], [-128]], np.int8)
    assert len(pairs.risky_pairs(w, np.array([128, 128]))) == 0
    assert len(pairs.risky_pairs(w, np.array([129, 128]))) == 1
    assert len(pairs.risky_pairs(w, np.array([128, 129]))) == 1
    w = np.array([[127], [127]], np.int8)
    assert len(pairs.risky_pairs(w, np.array([129, 129]))) == 0
    assert len(pairs.risky_pairs(w, np.array([129, 130]))) == 1


def test_a_pair_that_reaches_32767_exactly_is_not_flagged() -> None:
    """255 * 127 + 191 * 2 = 32767: the largest int16, no saturation; one more step is 32769."""
    w = np.array([[127], [2]], np.int8)
    assert len(pairs.risky_pairs(w, np.array([255, 191]))) == 0
    assert len(pairs.risky_pairs(w, np.array([255, 192]))) == 1


def test_a_column_on_the_int16_edge_is_not_flagged_next_to_a_risky_one() -> None:
    """The same pair row, so that the row passes the first test and each column is looked at: (127, 2) at
    inputs (255, 191) reach 32767, (-128, -1) at (255, 128) reach -32768, both in range; the other column
    leaves int16 (-128 * 446, 127 * 383)."""
    w = np.array([[127, -128], [2, -128]], np.int8)
    assert pairs.risky_pairs(w, np.array([255, 191])).column.tolist() == [1]
    assert pairs.risky_pairs(w, np.array([255, 192])).column.tolist() == [0, 1]
    w = np.array([[-128, 127], [-1, 127]], np.int8)
    assert pairs.risky_pairs(w, np.array([255, 128])).column.tolist() == [1]
    assert pairs.risky_pairs(w, np.array([255, 129])).column.tolist() == [0, 1]


def test_a_weight_without_columns_has_no_risky_pairs() -> None:
    found = pairs.risky_pairs(np.zeros((4, 0), np.int8), 255)
    assert len(found) == 0 and found.column.size == 0


def test_an_odd_last_weight_row_pairs_with_padding_and_is_never_flagged() -> None:
    w = np.array([[1], [1], [127]], np.int8)
    assert len(pairs.risky_pairs(w, 255)) == 0
    w = np.array([[127, 1], [127, 1], [127, 127]], np.int8)
    found = pairs.risky_pairs(w, 255)
    assert found.first.tolist() == [0] and found.column.tolist() == [0]


def test_risky_pairs_are_sorted_by_column_then_pair() -> None:
    rng = np.random.default_rng(4)
    w = rng.integers(-128, 128, (10, 7)).astype(np.int8)
    w[0:2, 3] = 127  # pair 0 of column 3 saturates
    w[6:8, :] = -128  # pair 3 of every column saturates
    found = pairs.risky_pairs(w, 255)
    order = list(zip(found.column.tolist(), found.first.tolist(), strict=True))
    assert order == sorted(order) and len(set(order)) == len(order)
    np.testing.assert_array_equal(_flagged(found, (5, 7)), _corner_test(w, np.full(10, 255)))
    np.testing.assert_array_equal(found.w_first, w[found.first, found.column])
    np.testing.assert_array_equal(found.w_second, w[found.first + 1, found.column])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_only_some_pair_rows_risky_flags_exactly_the_corner_test(seed: int) -> None:
    """Rows whose largest parts cannot saturate are ruled out first; the others column by column (some
    risky rows, not all: the row subset path)."""
    rng = np.random.default_rng(seed)
    w = rng.integers(-60, 61, (12, 9)).astype(np.int8)  # 255 * 60 * 2 < 32768: quiet
    w[2, :4], w[3, :4] = 127, 100  # pair 1: positive side
    w[8, 5:], w[9, 5:] = -128, -90  # pair 4: negative side
    w[10, 0], w[11, 0] = 127, -128  # mixed signs: never
    bound = rng.integers(150, 256, 12)
    found = pairs.risky_pairs(w, bound)
    want = _corner_test(w, bound)
    assert 0 < want.sum() < want.size and want.any(axis=1).sum() < want.shape[0]
    np.testing.assert_array_equal(_flagged(found, (6, 9)), want)
    np.testing.assert_array_equal(found.w_first, w[found.first, found.column])
    np.testing.assert_array_equal(found.w_second, w[found.first + 1, found.column])


def test_no_risky_row_gives_empty_arrays_of_the_documented_types() -> None:
    found = pairs.risky_pairs(np.full((4, 3), 60, np.int8), 255)
    assert len(found) == 0
    assert found.first.dtype == np.int64 and found.column.dtype == np.int64
    assert found.w_first.dtype == np.int32 and found.w_second.dtype == np.int32
    assert all(part.size == 0 for part in (found.first, found.column, found.w_first, found.w_second))


def test_a_repeated_bound_is_each_tap_s_channels() -> None:
    """``repeat`` tiles the per-channel bounds over the taps: row ``t * C + c`` has channel ``c``'s bound."""
    w = np.zeros((8, 2), np.int8)  # 2 taps x 4 channels
    w[[0, 1, 4, 5, 6, 7], 0] = 127  # pairs (0, 1), (4, 5), (6, 7)
    channel_max = np.array([255, 255, 10, 10])
    found = pairs.PairBounds(w).risky(channel_max, repeat=2)
    assert found.first.tolist() == [0, 4] and found.column.tolist() == [0, 0]  # (6, 7) are channels 2, 3
    np.testing.assert_array_equal(found.memo["bound"], [255, 255, 10, 10, 255, 255, 10, 10])
    found = pairs.PairBounds(w).risky(np.array([10, 10, 255, 255]), repeat=2)
    assert found.first.tolist() == [6] and found.column.tolist() == [0]


def test_a_scalar_bound_is_every_row_s_and_is_kept() -> None:
    w = np.array([[127], [127], [127], [127]], np.int8)
    bounds = pairs.PairBounds(w)
    found = bounds.risky(200)
    assert found.first.tolist() == [0, 2]
    np.testing.assert_array_equal(found.memo["bound"], [200, 200, 200, 200])
    assert bounds.risky(150) is found and bounds.risky(200) is found
    assert bounds.risky(np.array([200, 200, 200, 200])) is not found  # another shape: searched again
    assert len(bounds.risky(120)) == 0  # 127 * 240 = 30480: nothing


def test_the_last_pairs_are_reused_only_while_no_bound_grows() -> None:
    w = np.array([[127, 100], [127, 100]], np.int8)
    bounds = pairs.PairBounds(w)
    first = bounds.risky(np.array([200, 200]))
    assert first.column.tolist() == [0, 1]  # 100 * 400 = 40000
    assert bounds.risky(np.array([130, 129])) is first  # lower: the superset is reused
    grown = bounds.risky(np.array([201, 200]))
    assert grown is not first and grown.column.tolist() == [0, 1]
    low = bounds.risky(np.array([120, 120]))  # lower than the last search: reused, a superset
    assert low is grown
    assert bounds.risky(np.array([202, 100])) is not grown
    found = pairs.PairBounds(w).risky(np.array([202, 100]))
    assert found.column.tolist() == [0]  # 127 * 302 = 38354, 100 * 302 = 30200


def test_found_pairs_are_read_only() -> None:
    found = pairs.risky_pairs(np.full((2, 2), 127, np.int8), 255)
    for part in (found.first, found.column, found.w_first, found.w_second):
        assert not part.flags.writeable
        with pytest.raises(ValueError):
            part[0] = 0


# --- derived values and the correction's bound ----------------------------------------------------------


def _risky(first: list[int], column: list[int], w_first: list[int], w_second: list[int]) -> pairs.RiskyPairs:
    return pairs.RiskyPairs(
        np.array(first, np.int64), np.array(column, np.int64), np.array(w_first, np.int32), np.array(w_second, np.int32)
    )


def test_derived_values_are_kept_for_the_same_pairs_only() -> None:
    one, two = _risky([0], [0], [127], [127]), _risky([0], [0], [127], [127])
    made = []

    def make() -> int:
        made.append(1)
        return len(made)

    found = [(0, one), (1, two)]
    assert pairs.derived(found, "k", make) == 1
    assert pairs.derived([(0, one), (1, two)], "k", make) == 1  # the very same objects: kept
    assert pairs.derived(found, "other", make) == 2  # another key
    assert pairs.derived([(0, one), (1, _risky([0], [0], [127], [127]))], "k", make) == 3  # new pairs
    assert pairs.derived([(0, one), (1, two)], "k", make) == 4  # replaced by the last ones
    assert "k" in one.memo and "k" not in two.memo  # kept with the first group's pairs


def test_a_derived_value_is_made_again_when_a_group_joins_or_leaves() -> None:
    """The first group's pairs carry the value: a later run may add a group whose inputs grew from quiet,
    or drop one (it raised ValueError from a strict zip over lists of different lengths)."""
    one, two = _risky([0], [0], [127], [127]), _risky([0], [0], [127], [127])
    assert pairs.derived([(0, one)], "k", lambda: "one") == "one"
    assert pairs.derived([(0, one), (1, two)], "k", lambda: "both") == "both"
    assert pairs.derived([(0, one), (1, two)], "k", lambda: "again") == "both"
    assert pairs.derived([(0, one)], "k", lambda: "alone") == "alone"


def test_a_kept_value_that_is_falsy_is_given_again() -> None:
    one = _risky([0], [0], [127], [127])
    made = []
    assert pairs.derived([(0, one)], "k", lambda: made.append(0) or 0) == 0
    assert pairs.derived([(0, one)], "k", lambda: made.append(1) or 1) == 0
    assert made == [0]


def test_the_largest_change_of_a_pair_is_worked_out_at_its_tops() -> None:
    change = pairs.largest_change(
        np.array([127, -128, 127, 100, 127, -128, 0], np.int8),
        np.array([127, -128, -128, 100, 2, -128, -128], np.int8),
        np.array([255, 255, 255, 200, 255, 128, 255]),
        np.array([255, 255, 255, 200, 255, 129, 255]),
    )
    # 255*127*2 = 64770 -> 32003; 255*(-128)*2 = -65280 -> 32512; mixed: 0; 100*400 = 40000 -> 7233;
    # 255*127 + 255*2 = 32895 -> 128; -128*257 = -32896 -> 128; 255*(-128) = -32640 -> 0
    assert change.tolist() == [32003, 32512, 0, 7233, 128, 128, 0]
    assert change.dtype == np.int64


def test_the_correction_bound_sums_each_output_column_s_pairs() -> None:
    """Group 0's pairs on column 1 (two pairs) and group 1's on column 0 (global column 2 of mg = 2)."""
    g0 = _risky([0, 2], [1, 1], [127, 127], [127, 2])
    g1 = _risky([0], [0], [-128], [-128])
    tops = {0: np.array([255, 255, 255, 255]), 1: np.array([200, 100])}
    found = [(0, g0), (1, g1)]
    bound = pairs.correction_bound(found, 4, 2, lambda g: tops[g])
    assert bound == 32003 + 128  # column 1: both pairs of group 0; column 2: -128 * 300 -> 5632
    assert type(bound) is int
    tops[1] = np.array([255, 255, 0, 0])
    assert pairs.correction_bound(found, 4, 2, lambda g: tops[g]) == 32512  # unsearched pairs: made again


def test_the_correction_bound_reads_the_searched_bound_and_keeps_the_value() -> None:
    w = np.array([[127, 127], [127, 2], [-128, 1], [-128, 1]], np.int8)
    found = [(0, pairs.PairBounds(w).risky(np.array([255, 255, 255, 255])))]
    assert found[0][1].column.tolist() == [0, 0, 1]
    calls = []

    def row_max(g: int) -> np.ndarray:
        calls.append(g)
        return np.zeros(4, np.int64)

    # column 0: 32003 + 32512; column 1: 255 * 129 = 32895 -> 128
    assert pairs.correction_bound(found, 2, 2, row_max) == 32003 + 32512
    assert calls == []  # the searched bounds, not each row's maximum
    found[0][1].memo["bound"] = np.zeros(4, np.int64)  # a kept value is not made again
    assert pairs.correction_bound(found, 2, 2, row_max) == 32003 + 32512
    assert pairs.correction_bound(found, 3, 2, row_max) == 0  # another shape: made again


def test_no_risky_pair_bounds_the_correction_at_zero() -> None:
    assert pairs.correction_bound([(0, _risky([], [], [], []))], 3, 3, lambda g: np.zeros(0)) == 0
    assert pairs.correction_bound([(0, _risky([], [], [], []))], 0, 0, lambda g: np.zeros(0)) == 0  # no outputs


# --- kept bounds per weight ------------------------------------------------------------------------------


def test_the_bounds_of_a_read_only_weight_are_kept_while_it_lives() -> None:
    w = np.full((4, 3), 127, np.int8)
    w.flags.writeable = False
    made = []
    box = [w]

    def make() -> np.ndarray:
        made.append(1)
        return box[0]

    first = pairs.pair_bounds(w, "k", make)
    assert pairs.pair_bounds(w, "k", make) is first and len(made) == 1
    other = pairs.pair_bounds(w, "other", make)
    assert other is not first and len(made) == 2
    address = id(w)
    assert (address, "k") in pairs._BOUNDS and (address, "other") in pairs._BOUNDS
    box.clear()
    del w
    gc.collect()
    assert (address, "k") not in pairs._BOUNDS and (address, "other") not in pairs._BOUNDS  # dropped with it


def test_the_bounds_of_a_writable_weight_are_made_each_time() -> None:
    w = np.full((4, 3), 127, np.int8)
    first = pairs.pair_bounds(w, "k", lambda: w)
    assert pairs.pair_bounds(w, "k", lambda: w) is not first
    assert (id(w), "k") not in pairs._BOUNDS


def test_another_array_at_a_kept_address_gets_its_own_bounds() -> None:
    """The key is the address; the weak reference tells a later array at that address apart."""
    w = np.full((2, 1), 127, np.int8)
    w.flags.writeable = False
    kept = pairs.pair_bounds(w, "k", lambda: w)
    other = np.full((2, 1), 1, np.int8)
    other.flags.writeable = False
    pairs._BOUNDS[(id(other), "k")] = pairs._BOUNDS[(id(w), "k")]  # as if w had lived at other's address
    fresh = pairs.pair_bounds(other, "k", lambda: other)
    assert fresh is not kept and len(fresh.risky(255)) == 0
    assert len(kept.risky(255)) == 1
    pairs._BOUNDS.pop((id(other), "k"), None)
    pairs._BOUNDS.pop((id(w), "k"), None)


# --- the lowest-second-input table and the corrections -------------------------------------------------


def test_the_lowest_second_input_is_worked_out_by_hand() -> None:
    """Entry (127, 127): ``a' >= ceil((32768 - 127 a) / 127)``; entry (-100, -128): ``a' >= ceil((32769 -
    100 a) / 128)``; a zero second weight never; pair 2 has no entry."""
    table = pairs.lowest_second(np.array([127, -100, 127]), np.array([127, -128, 0]), np.array([0, 1, 0]), 3)
    assert table.shape == (3, 256) and table.dtype == np.int16
    assert table[0, 0] == 256  # ceil(32768 / 127) = 259: never
    assert table[0, 3] == 256  # ceil(32387 / 127) = 256: never
    assert table[0, 4] == 255  # ceil(32260 / 127) = 255
    assert table[0, 255] == 4  # ceil(383 / 127) = 4: 32385 + 508 = 32893
    assert table[0, 254] == 5  # ceil(510 / 127) = 5
    assert table[1, 255] == 57  # ceil((32769 - 25500) / 128) = 57
    assert table[1, 0] == 256  # ceil(32769 / 128) = 257: never
    assert (table[2] == 256).all()


def test_the_lowest_second_input_of_int8_weights_matches_brute_force() -> None:
    """Weights as a model stores them (int8, -128 included) and second weights of 0, +-1 and +-2, which
    never or barely reach int16's edges."""
    w = np.array([-128, -128, 127, 127, -128, 127, -128, 127, 100, -128], np.int8)
    w2 = np.array([0, 1, 1, 2, -1, -2, -128, 127, -128, 2], np.int8)
    entries = w.size
    table = pairs.lowest_second(w, w2, np.arange(entries), entries)
    a = np.arange(256)[:, None]
    for e in range(entries):
        sums = a * int(w[e]) + np.arange(256)[None, :] * int(w2[e])  # (a, a')
        leaves = (sums > 32767) | (sums < -32768)
        want = np.where(leaves.any(axis=1), leaves.argmax(axis=1), 256)
        np.testing.assert_array_equal(table[e], want, err_msg=f"entry {e}: ({w[e]}, {w2[e]})")
    assert (table[:3] == 256).all() and table[3, 255] == 256 - 64  # 32385 + 2 * 192 = 32769


def test_lowest_second_rows_are_made_as_they_are_asked_for() -> None:
    w, w2, pair = np.array([127, 127, -128]), np.array([127, 100, -128]), np.array([0, 0, 2])
    lowest = pairs.LowestSecond(w, w2, pair, 3)
    assert lowest.cost(np.array([0, 0])) == 2 * 256 and lowest.cost(np.array([1])) == 0
    assert lowest.cost(np.array([0, 2])) == 3 * 256
    table = lowest.rows(np.array([2]))
    assert lowest.done.tolist() == [False, False, True]
    assert (table[0] == 256).all()  # not made yet
    assert lowest.cost(np.array([0, 2])) == 2 * 256
    full = pairs.lowest_second(w, w2, pair, 3)
    np.testing.assert_array_equal(table[2], full[2])
    table = lowest.rows(np.array([0, 1]))
    np.testing.assert_array_equal(table, full)
    assert lowest.cost(np.array([0, 1, 2])) == 0


def _brute_corrections(a2: np.ndarray, found: pairs.RiskyPairs) -> np.ndarray:
    """``(rows, columns)`` of ``sum sat16(p) - p`` over the risky pairs, pair by pair in Python integers."""
    out = np.zeros((a2.shape[0], int(found.column.max(initial=-1)) + 1), np.int64)
    for k, n, w0, w1 in zip(found.first, found.column, found.w_first, found.w_second, strict=True):
        for r in range(a2.shape[0]):
            p = int(a2[r, k]) * int(w0) + int(a2[r, k + 1]) * int(w1)
            out[r, n] += _sat16(p) - p
    return out


@pytest.mark.parametrize("block", [pairs.BLOCK_ELEMENTS, 7, 1])
def test_corrections_are_the_pair_by_pair_changes_in_any_blocks(monkeypatch, block: int) -> None:
    monkeypatch.setattr(pairs, "BLOCK_ELEMENTS", block)
    rng = np.random.default_rng(1)
    w = rng.integers(-128, 128, (12, 6)).astype(np.int8)
    w[4:6] = 120  # a pair row risky in every column
    a2 = rng.integers(100, 256, (5, 12)).astype(np.uint8)
    a2[1] = 0  # a quiet row
    found = pairs.risky_pairs(w, a2.max(axis=0))
    gathered = []

    def gather(ks: np.ndarray) -> np.ndarray:
        gathered.append(ks.tolist())
        return np.ascontiguousarray(a2[:, ks].T)

    rows, cols, values = pairs.corrections(found, gather, 5)
    assert gathered == [sorted(set(found.first.tolist()) | {k + 1 for k in found.first.tolist()})]
    got = np.zeros((5, 6), np.int64)
    np.add.at(got, (rows, cols), values)
    want = np.zeros((5, 6), np.int64)
    brute = _brute_corrections(a2, found)
    want[:, : brute.shape[1]] = brute
    np.testing.assert_array_equal(got, want)
    assert values.dtype == np.int64 and (values != 0).all()  # only the pairs that change
    assert want.any() and not want[1].any()


def test_corrections_of_no_pairs_or_no_rows_are_empty() -> None:
    found = pairs.risky_pairs(np.full((2, 2), 127, np.int8), 255)
    for got in (
        pairs.corrections(found, lambda ks: np.zeros((ks.size, 0), np.uint8), 0),
        pairs.corrections(pairs.risky_pairs(np.zeros((2, 2), np.int8), 255), lambda ks: None, 3),
    ):
        assert [part.size for part in got] == [0, 0, 0]
        assert all(part.dtype == np.int64 for part in got)


def test_corrections_where_no_candidate_saturates_are_empty() -> None:
    """Weights (127, 5) can leave int16 (255 * 132 = 33660); inputs that pass the cheap test (a + a' above
    32767 // 127 = 258) but stay in it, 250 * 127 + 10 * 5 = 31800 and 10 * 127 + 250 * 5 = 2520, and
    (200, 58), which the cheap test drops, add nothing."""
    found = pairs.risky_pairs(np.array([[127], [5]], np.int8), 255)
    assert len(found) == 1
    for a2 in (np.array([[250, 10], [10, 250], [200, 58]], np.uint8), np.array([[200, 58]], np.uint8)):
        rows, cols, values = pairs.corrections(found, lambda ks, a2=a2: np.ascontiguousarray(a2[:, ks].T), len(a2))
        assert [rows.size, cols.size, values.size] == [0, 0, 0]
        assert values.dtype == np.int64


def test_a_block_whose_candidates_all_stay_in_range_is_followed_by_the_next(monkeypatch) -> None:
    """One pair per block: pair 0's only candidate stays in int16 (250 * 127 + 10 * 5), pair 1's leaves it."""
    monkeypatch.setattr(pairs, "BLOCK_ELEMENTS", 1)
    w = np.array([[127], [5], [127], [127]], np.int8)
    found = pairs.risky_pairs(w, 255)
    assert found.first.tolist() == [0, 2]
    a2 = np.array([[250, 10, 255, 255]], np.uint8)
    rows, cols, values = pairs.corrections(found, lambda ks: np.ascontiguousarray(a2[:, ks].T), 1)
    assert (rows.tolist(), cols.tolist(), values.tolist()) == ([0], [0], [32767 - 64770])
    a2 = np.array([[1, 1, 255, 255]], np.uint8)  # pair 0 has no candidate at all
    rows, cols, values = pairs.corrections(found, lambda ks: np.ascontiguousarray(a2[:, ks].T), 1)
    assert (rows.tolist(), cols.tolist(), values.tolist()) == ([0], [0], [32767 - 64770])


def test_a_candidate_saturates_from_the_table_s_threshold_on() -> None:
    """One pair (127, 127): at first input 255, second input 4 is the first to leave int16 (32893)."""
    found = pairs.risky_pairs(np.array([[127], [127]], np.int8), 255)
    a2 = np.array([[255, 3], [255, 4], [4, 255], [255, 255]], np.uint8)
    rows, cols, values = pairs.corrections(found, lambda ks: np.ascontiguousarray(a2[:, ks].T), 4)
    assert rows.tolist() == [1, 2, 3] and cols.tolist() == [0, 0, 0]
    assert values.tolist() == [32767 - 32893, 32767 - 32893, 32767 - 64770]
    a2 = np.array([[254, 4], [254, 5]], np.uint8)  # at 254 the threshold is 5: 32258 + 635 = 32893
    rows, _, values = pairs.corrections(found, lambda ks: np.ascontiguousarray(a2[:, ks].T), 2)
    assert rows.tolist() == [1] and values.tolist() == [32767 - 32893]


# --- the matmul correction -------------------------------------------------------------------------------


def _oracle_change(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``sum_p sat16(p) - p`` of ``a @ w`` (2-D) in Python integers; an odd last element pairs with 0."""
    m, k = a.shape
    out = np.zeros((m, w.shape[1]), np.int64)
    for i, j in itertools.product(range(m), range(w.shape[1])):
        for p in range(0, k - 1, 2):
            v = int(a[i, p]) * int(w[p, j]) + int(a[i, p + 1]) * int(w[p + 1, j])
            out[i, j] += _sat16(v) - v
    return out


def _heavy(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    sign = rng.choice([-1, 1], size=(*shape[:-2], 1, shape[-1]))
    return np.clip(sign * rng.integers(40, 129, size=shape), -128, 127).astype(np.int8)


def test_the_matmul_correction_is_the_pair_oracle_s_change() -> None:
    rng = np.random.default_rng(9)
    a = rng.integers(120, 256, (4, 11)).astype(np.uint8)
    w = _heavy(rng, (11, 5))
    got = pairs.saturating_matmul_correction(a, w)
    want = _oracle_change(a, w)
    assert want.any() and got.dtype == np.int64
    np.testing.assert_array_equal(got, want)


def test_the_matmul_correction_keeps_leading_axes_of_the_activations() -> None:
    rng = np.random.default_rng(10)
    a = rng.integers(150, 256, (2, 3, 8)).astype(np.uint8)
    w = _heavy(rng, (8, 4))
    got = pairs.saturating_matmul_correction(a, w)
    assert got.shape == (2, 3, 4)
    np.testing.assert_array_equal(got.reshape(6, 4), _oracle_change(a.reshape(6, 8), w))


def test_a_matmul_whose_pairs_never_saturate_has_no_correction() -> None:
    rng = np.random.default_rng(2)
    assert (
        pairs.saturating_matmul_correction(rng.integers(0, 256, (3, 8)).astype(np.uint8), np.ones((8, 2), np.int8))
        is None
    )
    a = np.full((2, 2), 10, np.uint8)  # risky weights, quiet inputs
    assert pairs.saturating_matmul_correction(a, np.full((2, 2), 127, np.int8)) is None


@pytest.mark.parametrize(
    ("a_shape", "w_shape", "batch"),
    [
        ((3, 2, 10), (3, 10, 4), (3,)),
        ((2, 10), (3, 10, 4), (3,)),
        ((1, 2, 10), (3, 10, 4), (3,)),
        ((3, 2, 10), (1, 10, 4), (3,)),
        ((2, 3, 2, 10), (3, 10, 4), (2, 3)),
    ],
)
def test_a_batched_matmul_correction_broadcasts_and_leaves_quiet_batches_zero(a_shape, w_shape, batch) -> None:
    rng = np.random.default_rng(len(a_shape) + w_shape[0])
    a = rng.integers(150, 256, a_shape).astype(np.uint8)
    w = _heavy(rng, w_shape)
    w[-1, :, 0] = 1  # the last weight matrix's column 0 never saturates
    got = pairs.saturating_matmul_correction(a, w)
    assert got.shape == (*batch, a.shape[-2], 4) and got.dtype == np.int64
    a_b, w_b = np.broadcast_to(a, (*batch, *a.shape[-2:])), np.broadcast_to(w, (*batch, *w.shape[-2:]))
    for i in np.ndindex(*batch):
        np.testing.assert_array_equal(got[i], _oracle_change(a_b[i], w_b[i]), err_msg=str(i))
        assert got[i].any()
    assert not got[..., -1, :, 0].any() if w_shape[0] > 1 else not got[..., 0].any()


def test_a_batched_matmul_whose_some_batches_never_saturate() -> None:
    rng = np.random.default_rng(5)
    a = rng.integers(150, 256, (3, 2, 10)).astype(np.uint8)
    w = _heavy(rng, (3, 10, 4))
    w[1] = 1  # batch 1 never saturates: zeros there
    got = pairs.saturating_matmul_correction(a, w)
    assert got.dtype == np.int64 and not got[1].any() and got[0].any() and got[2].any()
    for i in range(3):
        np.testing.assert_array_equal(got[i], _oracle_change(a[i], w[i]), err_msg=str(i))


def test_a_matmul_of_no_rows_has_no_correction() -> None:
    counter = _counter()
    with pairs.counting(counter):
        assert pairs.saturating_matmul_correction(np.zeros((0, 4), np.uint8), np.full((4, 3), 127, np.int8)) is None
    assert counter.nodes["node"] == pairs.NodeSaturation(0, 0, {})


def test_a_batched_matmul_that_never_saturates_has_no_correction() -> None:
    a = np.full((2, 3, 4), 255, np.uint8)
    assert pairs.saturating_matmul_correction(a, np.ones((2, 4, 3), np.int8)) is None


def test_the_matmul_correction_counts_pair_sums_per_record() -> None:
    """Rows of a record: a 3-D input's leading axis is the batch; K = 5 has three pair sums per output."""
    a = np.array([[[255, 255, 0, 0, 9], [255, 255, 255, 255, 9]], [[0] * 5, [255, 4, 0, 0, 0]]], np.uint8)
    w = np.array([[127, 1], [127, 1], [127, 1], [127, 1], [1, 1]], np.int8)
    counter = _counter("mm", offset=3)
    with pairs.counting(counter):
        got = pairs.saturating_matmul_correction(a, w)
    entry = counter.nodes["mm"]
    assert entry.pairs == 4 * 3 * 2
    # record 0: (255, 255) x2 in row 1 and once in row 0; record 1: (255, 4): 32893
    assert entry.saturated == 4 and entry.per_record == {3: 3, 4: 1}
    np.testing.assert_array_equal(got.reshape(4, 2), _oracle_change(a.reshape(4, 5), w))


@pytest.mark.parametrize(("records", "rows"), [(3, 1), (3, 3), (1, 4)])
def test_the_matmul_counts_records_of_any_number_of_rows(records: int, rows: int) -> None:
    """``records`` records of ``rows`` rows each (K = 4, two pair sums per output): the last record's last
    row saturates."""
    a = np.zeros((records, rows, 4), np.uint8)
    a[-1, -1] = 255
    counter = _counter()
    with pairs.counting(counter):
        pairs.saturating_matmul_correction(a, np.full((4, 1), 127, np.int8))
    assert counter.nodes["node"] == pairs.NodeSaturation(records * rows * 2, 2, {records - 1: 2})


def test_a_two_dimensional_matmul_counts_each_row_as_a_record() -> None:
    a = np.array([[255, 255], [0, 0], [255, 255]], np.uint8)
    counter = _counter()
    with pairs.counting(counter):
        pairs.saturating_matmul_correction(a, np.array([[127], [127]], np.int8))
    assert counter.nodes["node"] == pairs.NodeSaturation(3, 2, {0: 1, 2: 1})


def test_a_one_dimensional_matmul_is_one_record() -> None:
    counter = _counter()
    with pairs.counting(counter):
        got = pairs.saturating_matmul_correction(
            np.array([255, 255, 255, 255], np.uint8), np.full((4, 2), 127, np.int8)
        )
    assert got.tolist() == [2 * (32767 - 64770)] * 2
    assert counter.nodes["node"] == pairs.NodeSaturation(4, 4, {0: 4})


def test_the_matmul_counts_without_a_saturated_sum() -> None:
    counter = _counter()
    with pairs.counting(counter):
        assert pairs.saturating_matmul_correction(np.ones((2, 3), np.uint8), np.full((3, 2), 127, np.int8)) is None
    assert counter.nodes["node"] == pairs.NodeSaturation(2 * 2 * 2, 0, {})


def test_views_of_one_constant_share_bounds_only_with_the_same_layout() -> None:
    rng = np.random.default_rng(6)
    constant = _heavy(rng, (8, 6))
    constant.flags.writeable = False
    a = rng.integers(150, 256, (3, 8)).astype(np.uint8)
    for view in (constant, constant[:, ::-1], constant[:, :3], constant[:, 3:], constant[::2, :], constant.T.T):
        np.testing.assert_array_equal(
            pairs.saturating_matmul_correction(a[:, : view.shape[0]], view),
            _oracle_change(a[:, : view.shape[0]], view),
        )


# --- ARM64: the int16 pair wrap --------------------------------------------------------------------------


def _flip(values: np.ndarray) -> list[int]:
    """The operand as MLAS's ARM64 kernels read it: uint8 flipped to int8 (``a - 128``), int8 as is."""
    return [int(v) - 128 if values.dtype == np.uint8 else int(v) for v in values.ravel()]


def _neon_change(a: list[int], b: list[int]) -> int:
    """``sum wrap16(p) - p`` over the pairs ``(16j + i, 16j + i + 8)``, ``i < 8``, of a reduction axis
    padded with zeros to a multiple of 16."""
    k = -(-len(a) // 16) * 16
    a, b = a + [0] * (k - len(a)), b + [0] * (k - len(b))
    total = 0
    for j in range(0, k, 16):
        for i in range(8):
            p = a[j + i] * b[j + i] + a[j + i + 8] * b[j + i + 8]
            total += _wrap16(p) - p
    return total


def _oracle_gemm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a, b = np.broadcast_to(a, (*batch, *a.shape[-2:])), np.broadcast_to(b, (*batch, *b.shape[-2:]))
    out = np.zeros((*batch, a.shape[-2], b.shape[-1]), np.int64)
    for index in itertools.product(*(range(s) for s in (*batch, a.shape[-2], b.shape[-1]))):
        *lead, m, n = index
        out[index] = _neon_change(_flip(a[(*lead, m)]), _flip(b[(*lead, slice(None), n)]))
    return out


def _min_heavy(rng: np.random.Generator, shape: tuple[int, ...], dtype: type, share: float = 0.7) -> np.ndarray:
    """Values at the int8 minimum once flipped (0 for uint8, -128 for int8) with probability ``share``."""
    low = 0 if dtype == np.uint8 else -128
    values = rng.integers(low, low + 256, shape)
    return np.where(rng.random(shape) < share, low, values).astype(dtype)


def test_the_pair_count_of_a_reduction_axis_is_eight_per_16_deep_block() -> None:
    blocks = [neon_pairs._blocks(k) for k in (0, 1, 8, 15, 16, 17, 32, 33)]
    assert blocks == [0, 8, 8, 8, 8, 16, 16, 24] and all(type(b) is int for b in blocks)


def test_the_pair_mask_pairs_k_with_k_plus_8_in_each_block() -> None:
    hits = np.zeros((2, 20), bool)
    hits[0, [0, 8]] = True  # pair 0 of block 0
    hits[0, [3, 12]] = True  # 3 and 12 are not a pair (3 pairs with 11)
    hits[0, [16]] = True  # 16 pairs with 24, which is padding
    hits[1, [7, 15, 17]] = True  # pair 7
    mask = neon_pairs._pair_mask(hits)
    assert mask.shape == (2, 16)
    assert np.flatnonzero(mask[0]).tolist() == [0] and np.flatnonzero(mask[1]).tolist() == [7]
    full = np.ones((1, 2, 32), bool)
    assert neon_pairs._pair_mask(full).shape == (1, 2, 16) and neon_pairs._pair_mask(full).all()


def test_the_int8_minimum_is_zero_for_uint8_and_minus_128_for_int8() -> None:
    assert neon_pairs._as_int8_min(np.array([0, 1, 128, 255], np.uint8)).tolist() == [True, False, False, False]
    assert neon_pairs._as_int8_min(np.array([-128, -127, 0, 127], np.int8)).tolist() == [True, False, False, False]


@pytest.mark.parametrize("a_type", [np.uint8, np.int8])
@pytest.mark.parametrize(("a_shape", "b_shape"), [((5, 37), (37, 4)), ((2, 3, 16), (2, 16, 3)), ((3, 9), (2, 9, 2))])
def test_the_gemm_wrap_is_the_pair_oracle_s_change(a_type, a_shape, b_shape) -> None:
    rng = np.random.default_rng(len(a_shape) * 10 + a_shape[-1])
    a = _min_heavy(rng, a_shape, a_type)
    b = _min_heavy(rng, b_shape, np.int8)
    got = neon_pairs.gemm_correction(a, b)
    want = _oracle_gemm(a, b)
    assert want.any() and got is not None and got.dtype == np.int64
    np.testing.assert_array_equal(got, want)


def test_a_gemm_without_a_pair_of_minus_128_weights_has_no_wrap() -> None:
    a = np.zeros((2, 32), np.uint8)  # every input at the minimum
    b = np.zeros((32, 3), np.int8)
    b[0, :] = -128  # its partner (8) is not
    b[9, 1] = -128  # nor is 1's partner
    assert neon_pairs.gemm_correction(a, b) is None
    assert neon_pairs.gemm_correction(a, np.full((32, 3), -127, np.int8)) is None
    b[8, 2] = -128  # (0, 8) of column 2: a pair
    got = neon_pairs.gemm_correction(a, b)
    assert got.tolist() == [[0, 0, -65536]] * 2


@pytest.mark.parametrize(("a_type", "b_type"), [(np.uint8, np.uint8), (np.int16, np.int8), (np.uint8, np.int16)])
def test_other_operand_types_are_not_paired(a_type, b_type) -> None:
    a = np.zeros((2, 16), a_type) + (0 if a_type == np.uint8 else -128)
    b = np.zeros((16, 2), b_type) + (0 if b_type == np.uint8 else -128)
    assert neon_pairs.gemm_correction(a.astype(a_type), b.astype(b_type)) is None


def test_the_gemm_counts_pair_sums_and_wrapped_ones_per_record() -> None:
    a = np.zeros((2, 3, 20), np.uint8)  # record 0 all at the minimum; record 1 only row 2
    a[1, :2] = 200
    b = np.zeros((20, 2), np.int8)
    b[[1, 9, 4, 12], 0] = -128  # column 0: pairs 1 and 4
    b[[2, 10], 1] = -128  # column 1: pair 2
    counter = _counter("gemm", offset=5)
    with pairs.counting(counter):
        got = neon_pairs.gemm_correction(a, b)
    assert got[:, :, 0].tolist() == [[-131072] * 3, [0, 0, -131072]]
    assert got[:, :, 1].tolist() == [[-65536] * 3, [0, 0, -65536]]
    entry = counter.nodes["gemm"]
    assert entry.pairs == 2 * 3 * 2 * 16  # K = 20: two blocks of eight pairs
    assert entry.saturated == 9 + 3 and entry.per_record == {5: 9, 6: 3}


def test_a_gemm_without_wraps_still_counts_its_pair_sums() -> None:
    counter = _counter("gemm")
    with pairs.counting(counter):
        assert neon_pairs.gemm_correction(np.zeros((4, 16), np.int8), np.ones((2, 16, 5), np.int8)) is None
        b = np.zeros((2, 16, 5), np.int8)
        b[:, 0] = -128  # -128 weights, none paired
        assert neon_pairs.gemm_correction(np.zeros((4, 16), np.int8), b) is None
    assert counter.nodes["gemm"] == pairs.NodeSaturation(2 * (2 * 4 * 5 * 8), 0, {})


@pytest.mark.parametrize("a_shape", [(0, 16), (0, 2, 16), (2, 0, 16)])
def test_a_gemm_of_no_records_or_rows_counts_nothing(a_shape) -> None:
    """An empty activation (a batch of none, a detector's zero boxes) under ``qaccuracy saturation``:
    no pair sums and no error (the wrap count's reshape to records failed on 0 records)."""
    b = np.zeros((16, 3), np.int8)
    b[[0, 8]] = -128
    counter = _counter("gemm")
    with pairs.counting(counter):
        got = neon_pairs.gemm_correction(np.zeros(a_shape, np.uint8), b)
    assert got.shape == (*a_shape[:-1], 3) and not got.any()
    assert counter.nodes["gemm"] == pairs.NodeSaturation(0, 0, {})


def test_an_empty_matmul_under_the_saturation_counter_is_empty_on_every_pair_preset() -> None:
    """Through the integer matmul, as ``qaccuracy saturation`` runs it (it raised ZeroDivisionError on
    onnxruntime-avx2 and ValueError on onnxruntime-arm64-neon)."""
    from pytest_qaccuracy.backend import arith, get_scheme

    b = np.full((16, 3), -128, np.int8)
    for preset in ("onnxruntime-avx2", "onnxruntime-arm64-neon"):
        counter = _counter(preset)
        with pairs.counting(counter):
            got = arith.zero_point_matmul(np.zeros((0, 16), np.uint8), 0, b, 0, get_scheme(preset))
        assert got.shape == (0, 3)
        assert counter.nodes[preset] == pairs.NodeSaturation(0, 0, {})


def test_the_wrap_count_is_reported_only_to_an_active_counter() -> None:
    neon_pairs._count(10, np.ones((2, 3), np.int64))  # no counter: nothing to do, no error
    counter = _counter("n")
    with pairs.counting(counter):
        neon_pairs._count(10)
        neon_pairs._count(4, np.int64(3))  # 0-d: no records
        neon_pairs._count(6, np.array([[[1, 0], [2, 0]], [[0, 0], [0, 1]]]))
    assert counter.nodes["n"] == pairs.NodeSaturation(20, 4, {0: 3, 1: 1})


def test_minus_128_is_found_and_remembered_while_the_weight_lives() -> None:
    w = np.array([[1, -128]], np.int8)
    address = id(w)
    assert neon_pairs._has_int8_min(w) is True
    assert neon_pairs._HAS_MIN[address][1] is True
    assert neon_pairs._has_int8_min(np.array([[1, -127]], np.int8)) is False
    neon_pairs._HAS_MIN[address] = (neon_pairs._HAS_MIN[address][0], False)  # what was found is given again
    assert neon_pairs._has_int8_min(w) is False
    del w
    gc.collect()
    assert address not in neon_pairs._HAS_MIN


def test_another_weight_at_a_remembered_address_is_checked_anew() -> None:
    w = np.array([-128], np.int8)
    other = np.array([5], np.int8)
    neon_pairs._has_int8_min(w)
    neon_pairs._HAS_MIN[id(other)] = neon_pairs._HAS_MIN[id(w)]  # as if w had lived at other's address
    assert neon_pairs._has_int8_min(other) is False
    assert neon_pairs._HAS_MIN[id(other)][0]() is other


def _pad(x: np.ndarray, x_zp: int, pads: list[int]) -> np.ndarray:
    d = x.ndim - 2
    widths = [(0, 0), (0, 0)] + [(pads[i], pads[d + i]) for i in range(d)]
    return np.pad(x, widths, constant_values=x_zp)


def _oracle_conv_wrap(x, x_zp, w, group, pads, strides, dilations) -> np.ndarray:
    """``sum wrap16(p) - p`` of each output of a 2-D convolution, reduction axis in ``(kh, kw, cin)`` order."""
    xp = _pad(x, x_zp, pads)
    n, m, (cg, kh, kw) = x.shape[0], w.shape[0], w.shape[1:]
    mg = m // group
    oh = (xp.shape[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (xp.shape[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    out = np.zeros((n, m, oh, ow), np.int64)
    for r, o, i, j in itertools.product(range(n), range(m), range(oh), range(ow)):
        g = o // mg
        window = [
            xp[r, g * cg + ch, i * strides[0] + ti * dilations[0], j * strides[1] + tj * dilations[1]]
            for ti, tj, ch in itertools.product(range(kh), range(kw), range(cg))
        ]
        weights = [w[o, ch, ti, tj] for ti, tj, ch in itertools.product(range(kh), range(kw), range(cg))]
        out[r, o, i, j] = _neon_change(_flip(np.array(window, x.dtype)), _flip(np.array(weights, np.int8)))
    return out


@pytest.mark.parametrize(
    ("c", "m", "group", "kernel", "pads", "strides", "dilations", "x_zp"),
    [
        (16, 3, 1, (1, 1), [0, 0, 0, 0], (1, 1), (1, 1), 0),  # 1x1: pairs of channels (k, k + 8)
        (4, 2, 1, (3, 3), [1, 1, 1, 1], (1, 1), (1, 1), 0),  # pairs across taps; padding at the minimum
        (4, 2, 1, (3, 3), [1, 0, 2, 1], (2, 1), (1, 2), 9),  # padding that is not
        (6, 4, 2, (2, 3), [0, 1, 1, 0], (1, 2), (2, 1), 0),  # grouped, 3 channels per group
        (8, 4, 4, (3, 2), [1, 1, 1, 1], (1, 1), (1, 1), 0),  # grouped, 2 channels per group
    ],
)
def test_the_convolution_wrap_is_the_pair_oracle_s_change(c, m, group, kernel, pads, strides, dilations, x_zp) -> None:
    rng = np.random.default_rng(c * 10 + m + group + x_zp)
    x = _min_heavy(rng, (2, c, 5, 6), np.uint8)
    w = _min_heavy(rng, (m, c // group, *kernel), np.int8, share=0.8)
    xp = _pad(x, x_zp, pads)
    oh = (xp.shape[2] - dilations[0] * (kernel[0] - 1) - 1) // strides[0] + 1
    ow = (xp.shape[3] - dilations[1] * (kernel[1] - 1) - 1) // strides[1] + 1
    got = neon_pairs.conv_correction(x, x_zp, w, group, pads, strides, dilations, (oh, ow))
    want = _oracle_conv_wrap(x, x_zp, w, group, pads, strides, dilations)
    assert got is not None and want.any() and got.dtype == np.int64
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("c", "m", "group", "kernel", "pads", "strides", "dilations", "x_zp"),
    [
        (16, 3, 1, (1, 1), [0, 0, 0, 0], (1, 1), (1, 1), 0),
        (4, 2, 1, (3, 3), [1, 1, 1, 1], (1, 1), (1, 1), -128),  # padding at the minimum
        (4, 2, 1, (3, 3), [1, 0, 2, 1], (2, 1), (1, 2), 0),  # padding that is not (0 is not -128 in int8)
        (6, 4, 2, (2, 3), [0, 1, 1, 0], (1, 2), (2, 1), -128),  # grouped
    ],
)
def test_int8_convolutions_wrap_as_onnxruntime_before_1_30_pairs_them(
    c, m, group, kernel, pads, strides, dilations, x_zp
) -> None:
    """onnxruntime 1.18 through 1.29 on ARM64 without dot products: int8 x int8 convolutions go through
    the pairing GEMM, the input not flipped (``int8_inputs``); 1.30 and later sum them exactly (None)."""
    rng = np.random.default_rng(c * 10 + m + group - x_zp)
    x = _min_heavy(rng, (2, c, 5, 6), np.int8)
    w = _min_heavy(rng, (m, c // group, *kernel), np.int8, share=0.8)
    xp = _pad(x, x_zp, pads)
    oh = (xp.shape[2] - dilations[0] * (kernel[0] - 1) - 1) // strides[0] + 1
    ow = (xp.shape[3] - dilations[1] * (kernel[1] - 1) - 1) // strides[1] + 1
    geometry = (x_zp, w, group, pads, strides, dilations, (oh, ow))
    got = neon_pairs.conv_correction(x, *geometry, int8_inputs=True)
    want = _oracle_conv_wrap(x, x_zp, w, group, pads, strides, dilations)
    assert got is not None and want.any()
    np.testing.assert_array_equal(got, want)
    assert neon_pairs.conv_correction(x, *geometry) is None


def test_the_preset_pairs_int8_convolutions_up_to_onnxruntime_1_29() -> None:
    from pytest_qaccuracy.backend import scheme as scheme_module
    from pytest_qaccuracy.backend.scheme import for_onnxruntime, get_scheme

    assert scheme_module._pairs_int8_convolutions((1, 18)) and scheme_module._pairs_int8_convolutions((1, 29))
    assert not scheme_module._pairs_int8_convolutions((1, 30)) and not scheme_module._pairs_int8_convolutions((2, 0))
    neon, dot = get_scheme("onnxruntime-arm64-neon"), get_scheme("onnxruntime-arm64")
    assert (
        for_onnxruntime(neon, (1, 29)).neon_int8_conv_pairs and not for_onnxruntime(neon, (1, 30)).neon_int8_conv_pairs
    )
    assert not for_onnxruntime(dot, (1, 18)).neon_int8_conv_pairs  # CPUs with dot products sum exactly
    assert neon.neon_int8_conv_pairs is scheme_module._pairs_int8_convolutions(scheme_module._INSTALLED)


def test_the_convolution_wrap_counts_pair_sums_per_record() -> None:
    x = np.full((3, 2, 4, 4), 200, np.uint8)
    x[1] = 0  # record 1 at the minimum everywhere
    x[2, :, 0, 0] = 0  # record 2 at one pixel
    w = np.full((1, 2, 3, 3), 5, np.int8)
    w[0, 0, 0, 0] = w[0, 0, 1, 1] = -128  # (kh, kw, cin) indices 0 and 8: a pair
    counter = _counter("conv")
    with pairs.counting(counter):
        got = neon_pairs.conv_correction(x, 0, w, 1, [1, 1, 1, 1], (1, 1), (1, 1), (4, 4))
    # record 0: the centre tap (1, 1) never reads padding; record 2: output (0, 0) reads pixel (0, 0) there
    want = _oracle_conv_wrap(x, 0, w, 1, [1, 1, 1, 1], (1, 1), (1, 1))
    np.testing.assert_array_equal(got, want)
    per_record = (-want // 65536).reshape(3, -1).sum(axis=1)
    assert per_record.tolist() == [0, 16, 1]
    entry = counter.nodes["conv"]
    assert entry.pairs == 3 * 1 * 16 * 16  # 18 products: two 16-deep blocks
    assert entry.saturated == 17 and entry.per_record == {1: 16, 2: 1}


@pytest.mark.parametrize(
    ("x_type", "w_type", "group", "c", "m"),
    [(np.int8, np.int8, 1, 2, 2), (np.uint8, np.uint8, 1, 2, 2), (np.uint8, np.int8, 2, 2, 2)],
)
def test_convolutions_whose_kernels_sum_exactly_have_no_wrap(x_type, w_type, group, c, m) -> None:
    """int8 x int8 (MLAS's symmetric kernel), uint8 x uint8 and depthwise convolutions."""
    x = np.zeros((1, c, 3, 3), x_type) + (0 if x_type == np.uint8 else -128)
    w = np.zeros((m, c // group, 3, 3), w_type) + (0 if w_type == np.uint8 else -128)
    assert neon_pairs.conv_correction(x, 0, w, group, [0, 0, 0, 0], (1, 1), (1, 1), (1, 1)) is None


def test_a_single_channel_group_convolution_that_is_not_depthwise_is_paired() -> None:
    """group == C but more outputs than inputs: not MLAS's depthwise kernel."""
    x = np.zeros((1, 2, 3, 3), np.uint8)
    w = np.full((4, 1, 3, 3), -128, np.int8)
    got = neon_pairs.conv_correction(x, 0, w, 2, [0, 0, 0, 0], (1, 1), (1, 1), (1, 1))
    assert got is not None
    np.testing.assert_array_equal(got, _oracle_conv_wrap(x, 0, w, 2, [0, 0, 0, 0], (1, 1), (1, 1)))
    x1 = np.zeros((1, 1, 3, 3), np.uint8)  # one channel, one output: group 1 == C == M, a plain convolution
    w1 = np.full((1, 1, 3, 3), -128, np.int8)
    got = neon_pairs.conv_correction(x1, 0, w1, 1, [0, 0, 0, 0], (1, 1), (1, 1), (1, 1))
    assert got.tolist() == [[[[-65536]]]]  # taps 0 and 8 of 9


def test_convolution_weights_without_a_wrapping_pair_count_their_pair_sums() -> None:
    x = np.zeros((2, 4, 3, 3), np.uint8)
    w = np.full((3, 4, 3, 3), 7, np.int8)
    w[:, 0, 0, 0] = -128  # index 0 of (kh, kw, cin); its partner 8 is 7
    counter = _counter("conv")
    with pairs.counting(counter):
        assert neon_pairs.conv_correction(x, 0, w, 1, [1, 1, 1, 1], (1, 1), (1, 1), (3, 3)) is None
        assert (
            neon_pairs.conv_correction(x, 0, np.full((3, 4, 3, 3), 7, np.int8), 1, [1] * 4, (1, 1), (1, 1), (3, 3))
            is None
        )
    assert counter.nodes["conv"] == pairs.NodeSaturation(2 * (2 * 3 * 9 * 24), 0, {})  # K = 36: three blocks


@pytest.mark.parametrize("d", [1, 3])
def test_one_and_three_dimensional_convolutions_with_wrapping_pairs_are_refused(d: int) -> None:
    """Their reduction order was not measured: -128 weights that would pair in ``(tap, cin)`` order
    (channels 0 and 8 of one tap) or in ``(cin, tap)`` order (flat indices 0 and 8: channel 2's third tap)
    are refused; -128 weights that pair in neither are counted and left exact."""
    spatial, kernel = (4,) * d, (3,) + (1,) * (d - 1)
    x = np.zeros((1, 16, *spatial), np.uint8)
    out = tuple(s - k + 1 for s, k in zip(spatial, kernel, strict=True))
    geometry = ([0] * 2 * d, (1,) * d, (1,) * d, out)

    def weights(*minus: tuple[int, int]) -> np.ndarray:
        w = np.zeros((2, 16, *kernel), np.int8)
        for channel, tap in minus:
            w[(1, channel, tap, *([0] * (d - 1)))] = -128
        return w

    counter = _counter("conv")
    with pairs.counting(counter):
        assert neon_pairs.conv_correction(x, 0, weights(), 1, *geometry) is None
        assert neon_pairs.conv_correction(x, 0, weights((0, 0), (0, 1), (5, 2)), 1, *geometry) is None
    assert counter.nodes["conv"] == pairs.NodeSaturation(2 * (2 * int(np.prod(out)) * 24), 0, {})  # K = 48
    for minus in (((0, 0), (8, 0)), ((0, 0), (2, 2))):
        with pytest.raises(
            neon_pairs.NotEmulated, match=rf"^the int16 pair wrap .* this {d}-D uint8 x int8 convolution"
        ):
            neon_pairs.conv_correction(x, 0, weights(*minus), 1, *geometry)


def test_the_depthwise_tap_pairs_follow_mlas_s_kernels() -> None:
    assert neon_pairs._taps_pairs(9, 16) == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert neon_pairs._taps_pairs(9, 32) == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert neon_pairs._taps_pairs(9, 24) == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert neon_pairs._taps_pairs(9, 8) == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert neon_pairs._taps_pairs(4, 16) == [(0, 1), (2, 3)]
    assert neon_pairs._taps_pairs(25, 16) == [(2 * j, 2 * j + 1) for j in range(12)]
    assert neon_pairs._taps_pairs(1, 16) == []


def _oracle_depthwise_wrap(x, x_zp, w, pads, strides, dilations, taps_pairs) -> np.ndarray:
    """``sum wrap16(p) - p`` over the given tap pairs of each output of a depthwise 2-D convolution, taps
    numbered row by row."""
    xp = _pad(x, x_zp, pads)
    n, c, kh, kw = x.shape[0], x.shape[1], w.shape[2], w.shape[3]
    oh = (xp.shape[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (xp.shape[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    out = np.zeros((n, c, oh, ow), np.int64)
    for r, ch, i, j in itertools.product(range(n), range(c), range(oh), range(ow)):
        window = [
            xp[r, ch, i * strides[0] + ti * dilations[0], j * strides[1] + tj * dilations[1]]
            for ti, tj in itertools.product(range(kh), range(kw))
        ]
        products = [a * b for a, b in zip(_flip(np.array(window, x.dtype)), _flip(w[ch, 0]), strict=True)]
        for a, b in taps_pairs:
            p = products[a] + products[b]
            out[r, ch, i, j] += _wrap16(p) - p
    return out


@pytest.mark.parametrize(
    ("x_type", "c", "kernel", "taps_pairs", "pads", "strides", "dilations", "x_zp"),
    [
        (np.int8, 16, (3, 3), [(0, 2), (1, 3), (4, 6), (5, 7)], [1, 1, 1, 1], (1, 1), (1, 1), -128),
        (np.uint8, 16, (3, 3), [(0, 2), (1, 3), (4, 6), (5, 7)], [1, 0, 0, 1], (2, 1), (1, 2), 0),
        (np.uint8, 24, (3, 3), [(0, 1), (2, 3), (4, 5), (6, 7)], [1, 1, 1, 1], (1, 1), (1, 1), 3),
        (np.int8, 8, (3, 3), [(0, 1), (2, 3), (4, 5), (6, 7)], [0, 1, 2, 1], (1, 2), (2, 1), -128),
        (np.int8, 8, (2, 2), [(0, 1), (2, 3)], [1, 1, 1, 1], (1, 1), (1, 1), 0),
    ],
)
def test_the_depthwise_wrap_is_the_tap_pair_oracle_s_change(
    x_type, c, kernel, taps_pairs, pads, strides, dilations, x_zp
) -> None:
    rng = np.random.default_rng(c + kernel[0] + sum(pads) + abs(x_zp))
    x = _min_heavy(rng, (2, c, 5, 5), x_type)
    w = _min_heavy(rng, (c, 1, *kernel), np.int8, share=0.8)
    want = _oracle_depthwise_wrap(x, x_zp, w, pads, strides, dilations, taps_pairs)
    out = want.shape[2:]
    got = neon_pairs.depthwise_correction(x, x_zp, w, np.zeros(c, np.int8), pads, strides, dilations, out)
    assert got is not None and want.any() and got.dtype == np.int64
    np.testing.assert_array_equal(got, want)


def test_the_depthwise_wrap_counts_tap_pair_sums_per_record() -> None:
    x = np.full((3, 16, 3, 3), 100, np.uint8)
    x[1] = 0  # record 1 at the minimum everywhere
    x[2, 5, 0, 0] = x[2, 5, 0, 2] = 0  # record 2: taps 0 and 2 of channel 5's only output
    w = np.full((16, 1, 3, 3), 3, np.int8)
    w[5, 0, 0, 0] = w[5, 0, 0, 2] = -128  # channel 5: taps (0, 2), a pair of the 16-channel kernel
    w[6, 0, 0, 0] = w[6, 0, 0, 1] = -128  # channel 6: taps (0, 1), not a pair there
    counter = _counter("dw", offset=1)
    with pairs.counting(counter):
        got = neon_pairs.depthwise_correction(x, 0, w, np.int8(0), [0, 0, 0, 0], (1, 1), (1, 1), (1, 1))
    want = np.zeros((3, 16, 1, 1), np.int64)
    want[1, 5] = want[2, 5] = -65536
    np.testing.assert_array_equal(got, want)
    assert counter.nodes["dw"] == pairs.NodeSaturation(3 * 16 * 1 * 4, 2, {2: 1, 3: 1})


@pytest.mark.parametrize("case", ["weight zero point", "3-D", "uint8 weights", "int16 input"])
def test_depthwise_kernels_of_other_kinds_are_left_exact(case: str) -> None:
    x = np.zeros((1, 16, 3, 3), np.int16 if case == "int16 input" else np.uint8)
    w = np.full((16, 1, 3, 3), 0 if case == "uint8 weights" else -128, np.uint8 if case == "uint8 weights" else np.int8)
    w_zp = np.full(16, 1 if case == "weight zero point" else 0, np.int8)
    if case == "3-D":
        x, w = x[..., None], w[..., None]
    got = neon_pairs.depthwise_correction(x, 0, w, w_zp, [0, 0, 0, 0], (1, 1), (1, 1), (1, 1))
    assert got is None
    if case == "weight zero point":  # one channel's zero point is enough
        w_zp = np.zeros(16, np.int8)
        w_zp[3] = 2
        assert neon_pairs.depthwise_correction(x, 0, w, w_zp, [0, 0, 0, 0], (1, 1), (1, 1), (1, 1)) is None
        assert neon_pairs.depthwise_correction(x, 0, w, np.int8(0), [0, 0, 0, 0], (1, 1), (1, 1), (1, 1)) is not None


def test_depthwise_weights_without_a_wrapping_pair_count_their_pair_sums() -> None:
    x = np.zeros((2, 12, 4, 4), np.uint8)
    counter = _counter("dw")
    w = np.full((12, 1, 3, 3), 9, np.int8)
    one = np.full((12, 1, 1, 1), -128, np.int8)  # one tap: no pairs at all
    unpaired = np.full((12, 1, 3, 3), 9, np.int8)
    unpaired[:, 0, 0, 0] = unpaired[:, 0, 2, 2] = -128  # taps 0 and 8 never pair
    with pairs.counting(counter):
        assert neon_pairs.depthwise_correction(x, 0, w, np.int8(0), [1] * 4, (1, 1), (1, 1), (4, 4)) is None
        assert neon_pairs.depthwise_correction(x, 0, one, np.int8(0), [0] * 4, (1, 1), (1, 1), (4, 4)) is None
        assert neon_pairs.depthwise_correction(x, 0, unpaired, np.int8(0), [1] * 4, (1, 1), (1, 1), (4, 4)) is None
    assert counter.nodes["dw"] == pairs.NodeSaturation(2 * (2 * 12 * 16 * 4), 0, {})


def test_a_depthwise_wrap_on_channels_not_in_eights_is_refused() -> None:
    x = np.zeros((1, 12, 3, 3), np.int8)
    w = np.zeros((12, 1, 3, 3), np.int8)
    w[4, 0, 0, :2] = -128  # neighbouring taps 0 and 1
    with pytest.raises(
        neon_pairs.NotEmulated, match=r"^the int16 tap pairs .* this depthwise convolution has 12 channels"
    ):
        neon_pairs.depthwise_correction(x, 0, w, np.int8(0), [0, 0, 0, 0], (1, 1), (1, 1), (1, 1))


def test_one_dimensional_weights_pair_within_each_output_channel_only() -> None:
    """5 channels and 3 taps: 15 products per output, one block padded to 16. A -128 at index 7 of output
    0 (channel 2, tap 1 in either order) pairs with padding, and output 1's first weight pairs with its
    index 8, not with output 0's 15th place: nothing can wrap, so nothing is refused."""
    x = np.zeros((1, 5, 6), np.uint8)
    w = np.zeros((2, 5, 3), np.int8)
    w[0, 2, 1] = w[1, 0, 0] = -128
    assert neon_pairs.conv_correction(x, 0, w, 1, [0, 0], (1,), (1,), (4,)) is None
    w[1, 3, 1] = -128  # output 1's index 8 in (tap, cin) order: a pair there
    with pytest.raises(neon_pairs.NotEmulated):
        neon_pairs.conv_correction(x, 0, w, 1, [0, 0], (1,), (1,), (4,))
