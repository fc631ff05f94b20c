"""``conv_pairs``: the int16 pair saturation of u8 x s8 convolutions, way by way, block by block.

Every value is checked against a numpy oracle written here: the convolution's raw products in
MLAS's reduction order (``(tap, channel)`` per group), added two by two, each pair sum clipped to
int16; the correction is ``sum (sat16(p) - p)`` per output and the saturated pair sums are those
the clip changes. The costs that choose between the dense and the sparse way are worked by hand
from ``conv_pairs``' constants (``DENSE_DIRECT`` 65,536, ``SPARSE_FIXED`` 18,000, ``SCAN_COST``
0.4, ``SPARSE_HIT_COST`` 130) at each side of their thresholds. Part of the ``conv_pairs``
mutation group.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from pair_ways import force_way

from pytest_qaccuracy.backend import pairs, parallel
from pytest_qaccuracy.backend.kernels import conv_pairs


def _geometry(x, w, pads, strides, dilations):
    d = x.ndim - 2
    pads = list(pads) if pads is not None else [0] * (2 * d)
    strides = tuple(strides) if strides is not None else (1,) * d
    dilations = tuple(dilations) if dilations is not None else (1,) * d
    kernel = w.shape[2:]
    out = tuple(
        (x.shape[2 + i] + pads[i] + pads[d + i] - dilations[i] * (kernel[i] - 1) - 1) // strides[i] + 1
        for i in range(d)
    )
    return pads, strides, dilations, out


def _oracle(x, x_zp, w, pads=None, strides=None, dilations=None, group=1):
    """``(correction, saturated pair sums per record, pair sums computed)`` of a convolution."""
    pads, strides, dilations, out = _geometry(x, w, pads, strides, dilations)
    d = x.ndim - 2
    n = x.shape[0]
    m, cg = w.shape[:2]
    mg = m // group
    xp = np.pad(x.astype(np.int64), [(0, 0), (0, 0)] + [(pads[i], pads[d + i]) for i in range(d)], constant_values=x_zp)
    change = np.zeros((n, m, *out), np.int64)
    saturated = np.zeros(n, np.int64)
    total = 0
    for g in range(group):
        taps = []
        for tap in itertools.product(*(range(k) for k in w.shape[2:])):
            window = tuple(
                slice(t * dil, t * dil + (o - 1) * s + 1, s)
                for t, dil, o, s in zip(tap, dilations, out, strides, strict=True)
            )
            taps.append(xp[(slice(None), slice(g * cg, (g + 1) * cg), *window)])  # (n, cg, *out)
        a = np.stack(taps, axis=1).reshape(n, len(taps) * cg, -1)  # (n, K, positions): (tap, channel)
        b = np.moveaxis(w[g * mg : (g + 1) * mg].astype(np.int64), 1, -1).reshape(mg, -1)  # (mg, K) alike
        if b.shape[1] % 2:  # an odd last product pairs with nothing
            a = np.concatenate([a, np.zeros_like(a[:, :1])], axis=1)
            b = np.concatenate([b, np.zeros_like(b[:, :1])], axis=1)
        products = a[:, None] * b[None, :, :, None]  # (n, mg, K, positions)
        pair = products[:, :, 0::2] + products[:, :, 1::2]
        diff = np.clip(pair, -32768, 32767) - pair
        change[:, g * mg : (g + 1) * mg] = diff.sum(axis=2).reshape(n, mg, *out)
        saturated += np.count_nonzero(diff, axis=(1, 2, 3))
        total += n * mg * pair.shape[2] * pair.shape[3]
    return change, saturated, total


def _correction(x, x_zp, w, pads=None, strides=None, dilations=None, group=1):
    pads, strides, dilations, out = _geometry(x, w, pads, strides, dilations)
    return conv_pairs.pair_corrections(x, x_zp, w, group, pads, strides, dilations, out)


def _heavy(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Weights with many large same-sign neighbours, so that many pairs saturate."""
    sign = rng.choice([-1, 1], size=(*shape[:-1], 1))
    return np.clip(sign * rng.integers(20, 129, size=shape), -128, 127).astype(np.int8)


def _counted(counter: pairs.SaturationCounter, n: int) -> tuple[int, list[int]]:
    entry = counter.nodes[""]
    return entry.pairs, [entry.per_record.get(r, 0) for r in range(n)]


def _way(x: np.ndarray, w: np.ndarray, strides=None, x_zp: int = 0) -> type:
    """The correction's class; its whole correction and the pair sums it reports checked against the
    oracle (a sample run to choose the way is not counted)."""
    want, _, total = _oracle(x, x_zp, w, strides=strides)
    counter = pairs.SaturationCounter()
    with pairs.counting(counter):
        correction = _correction(x, x_zp, w, strides=strides)
        np.testing.assert_array_equal(correction.dense(), want)
    assert counter.nodes[""].pairs == total
    return type(correction)


# the way: odd channel counts (pairs across taps) with at most two risky entries per pair are dense


def _crossing_weights(m: int) -> np.ndarray:
    """3 channels, a 1 x 2 kernel: the reduction order is (t0 c0, t0 c1), (t0 c2, t1 c0), (t1 c1,
    t1 c2). Output channels 0 and 1 have both of the first two pairs at -128; channel 2, if any, the
    first pair only."""
    w = np.zeros((m, 3, 1, 2), np.int8)
    w[:2, 0, 0, 0] = w[:2, 1, 0, 0] = -128  # pair (t0 c0, t0 c1)
    w[:2, 2, 0, 0] = w[:2, 0, 0, 1] = -128  # pair (t0 c2, t1 c0): across taps
    w[2:, 0, 0, 0] = w[2:, 1, 0, 0] = -128
    return w


@pytest.mark.parametrize(("m", "want"), [(2, conv_pairs.DenseCorrection), (3, conv_pairs.SparseSearch)])
def test_odd_channels_are_dense_up_to_two_risky_entries_per_pair(m: int, want: type) -> None:
    """One record of 3 x 130 x 131 through the 1 x 2 kernel: 130 x 130 = 16,900 outputs, 2 distinct
    risky pairs. 2 output channels: 4 entries <= 2 x 2: dense (16,900 x 4 = 67,600 evaluations, past
    2**16, which the cost alone would leave to the sparse way: 18,000 + 0.4 x 17,030 x 2 = 31,624).
    3 channels: 5 entries: the cost decides, and one record takes no sample: sparse."""
    x = np.random.default_rng(1).integers(0, 256, (1, 3, 130, 131)).astype(np.uint8)
    assert _way(x, _crossing_weights(m)) is want


@pytest.mark.parametrize(("m", "want"), [(8, conv_pairs.DenseCorrection), (16, conv_pairs.DenseCorrection)])
def test_up_to_2_16_evaluations_the_dense_way_without_weighing(m: int, want: type) -> None:
    """One record of 2 x 64 x 64 at 255 through 1 x 1 weights -128: 4,096 x ``m`` evaluations (32,768,
    then exactly 65,536), more than the sparse way's 18,000 + 0.4 x 4,096 = 19,638.4, but at most
    ``DENSE_DIRECT``: dense, without a sample (one record could not take one)."""
    x = np.full((1, 2, 64, 64), 255, np.uint8)
    assert _way(x, np.full((m, 2, 1, 1), -128, np.int8)) is want


def test_dense_way_when_it_costs_exactly_the_sparse_ways_scan() -> None:
    """1-D, stride 2 over 180,000 pixels of 2 channels: 90,000 outputs x 1 entry = 90,000 = 18,000 +
    0.4 x 180,000 x 1 first row: no more than the sparse way: dense."""
    x = np.full((1, 2, 180_000), 255, np.uint8)
    assert _way(x, np.full((1, 2, 1), -128, np.int8), strides=(2,)) is conv_pairs.DenseCorrection


def test_the_sparse_ways_scan_counts_every_first_row() -> None:
    """1-D, stride 2 over 80,000 pixels of 4 channels (2 risky pairs): dense 40,000 x 2 = 80,000 <=
    sparse 18,000 + 0.4 x 80,000 x 2 = 82,000: dense (with one first row the scan would cost 50,000)."""
    x = np.full((1, 4, 80_000), 255, np.uint8)
    assert _way(x, np.full((1, 4, 1), -128, np.int8), strides=(2,)) is conv_pairs.DenseCorrection


# the sample: 4 records of 2 x 64 x 64, 8 output channels of 1 x 1 weights -128: dense 131,072 >
# sparse 24,553.6; the first record is run the sparse way when 1/8 of its values are above
# 32767 // 128 // 2 = 127, and the dense way wins when 24,553.6 + 130 x hits x 4 > 131,072


def _stem(n: int = 4, h: int = 64) -> np.ndarray:
    return np.zeros((n, 2, h, h), np.uint8)


def test_no_sample_under_one_eighth_of_values_above_127() -> None:
    """511 pixels at 255 in both channels (1,022 values) and two values at exactly 127: 1,022 values
    above 127, under 8,192 / 8 = 1,024: sparse, though a sample would find 4,088 hits."""
    x = _stem()
    x[0, :, :8].reshape(2, -1)[:, :511] = 255
    x[0, 0, 10, :2] = 127
    assert _way(x, np.full((8, 2, 1, 1), -128, np.int8)) is conv_pairs.SparseSearch


def test_the_sample_is_the_first_record_alone() -> None:
    """The first record high in channel 0 only (half its values: sampled, no pair saturates), the
    three others at 255: sparse."""
    x = _stem()
    x[0, 0] = 255
    x[1:] = 255
    assert _way(x, np.full((8, 2, 1, 1), -128, np.int8)) is conv_pairs.SparseSearch


@pytest.mark.parametrize("budget", [None, 64])
def test_a_samples_hits_count_once_per_record(monkeypatch, budget: int | None) -> None:
    """100 saturated pixels x 8 channels in the sample: 24,553.6 + 130 x 800 x 4 = 440,553.6 > 131,072:
    dense; also where the sample adds its hits in spans of 8 pixels (64 expanded entries), the last of
    them 4 pixels (32 hits alone would leave the sparse way: 41,193.6)."""
    if budget is not None:
        monkeypatch.setattr(conv_pairs, "BLOCK_ELEMENTS", budget)
    x = _stem()
    x[0, 0] = 255
    x[0, 1].reshape(-1)[:100] = 255
    assert _way(x, np.full((8, 2, 1, 1), -128, np.int8)) is conv_pairs.DenseCorrection


def test_a_sample_costing_exactly_the_dense_way_keeps_the_sparse_way() -> None:
    """4 records of 2 x 50 x 50, 10 output channels, 15 saturated pixels in the sample: sparse 18,000 +
    0.4 x 10,000 + 130 x 150 x 4 = 100,000 = dense 4 x 2,500 x 10: not more: sparse."""
    x = _stem(h=50)
    x[0, 0] = 255
    x[0, 1].reshape(-1)[:15] = 255
    assert _way(x, np.full((10, 2, 1, 1), -128, np.int8)) is conv_pairs.SparseSearch


def test_a_kept_verdict_is_for_the_same_input_shape_only() -> None:
    """A session's weight (read-only): 4 records whose first is at 255 sample dense; then 5 records
    whose first is at 0 (the same channel maxima, so the same risky pairs) sample again: sparse."""
    w = np.full((8, 2, 1, 1), -128, np.int8)
    w.flags.writeable = False
    x = _stem()
    x[0] = 255
    assert _way(x, w) is conv_pairs.DenseCorrection
    x = _stem(5)
    x[1:] = 255
    assert _way(x, w) is conv_pairs.SparseSearch


# the pair sums reported to the saturation counter, chunk by chunk


def test_row_chunks_of_the_dense_way_count_each_record_once(monkeypatch) -> None:
    """Chunks that split records and rows take their part of the whole correction; each record's
    saturated pair sums are reported by the chunk holding its first row, and the pair sums once."""
    force_way(monkeypatch, "dense")
    rng = np.random.default_rng(2)
    x = rng.integers(150, 256, (5, 8, 7, 6)).astype(np.uint8)
    w = _heavy(rng, (4, 8, 3, 3))
    geometry = {"pads": [1, 0, 1, 1], "strides": (1, 2)}
    want, saturated, total = _oracle(x, 140, w, **geometry)
    assert saturated.all()
    counter = pairs.SaturationCounter()
    with pairs.counting(counter):
        correction = _correction(x, 140, w, **geometry)
        assert isinstance(correction, conv_pairs.DenseCorrection)
        for (n0, n1), (o0, o1) in itertools.product([(0, 2), (2, 5)], [(0, 2), (2, 4), (4, 7)]):
            target = np.zeros((n1 - n0, 4, o1 - o0, 3), np.float32)
            correction.add_to(target, n0, n1, o0, o1)
            np.testing.assert_array_equal(target, want[n0:n1, :, o0:o1], err_msg=str((n0, n1, o0, o1)))
    assert _counted(counter, 5) == (total, saturated.tolist())


@pytest.mark.parametrize("form", ["few calls", "blocks of one record", "evaluated blocks of one record"])
def test_record_chunks_of_a_grouped_dense_way_count_every_saturated_pair_sum(monkeypatch, form: str) -> None:
    """Two groups of 4 channels, whole-record chunks ``0:2`` and ``2:5``, in the few-calls form of small
    chunks and in blocks (im2col blocks of one record or of the chunk, evaluated one record at a time):
    the oracle's values, saturated pair sums per record and pair sums."""
    force_way(monkeypatch, "dense" if form == "few calls" else "dense-blocks")
    if form == "blocks of one record":
        monkeypatch.setattr(conv_pairs, "COLUMN_BLOCK", 1)
    if form != "few calls":  # im2col blocks of whole chunks, or of one record, evaluated record by record
        monkeypatch.setattr(conv_pairs, "DENSE_BLOCK", 1)
    rng = np.random.default_rng(3)
    x = rng.integers(150, 256, (5, 8, 6, 5)).astype(np.uint8)
    w = _heavy(rng, (4, 4, 3, 3))
    geometry = {"pads": [1, 1, 1, 1], "group": 2}
    want, saturated, total = _oracle(x, 30, w, **geometry)
    assert saturated.all() and want[:, :2].any() and want[:, 2:].any()  # both groups saturate
    counter = pairs.SaturationCounter()
    with pairs.counting(counter):
        correction = _correction(x, 30, w, **geometry)
        for n0, n1 in [(0, 2), (2, 5)]:
            target = np.zeros((n1 - n0, 4, 6, 5), np.float32)
            correction.add_to(target, n0, n1, 0, 6)
            np.testing.assert_array_equal(target, want[n0:n1], err_msg=str((n0, n1)))
    assert _counted(counter, 5) == (total, saturated.tolist())


def test_pairs_across_taps_of_the_sparse_way_are_counted(monkeypatch) -> None:
    """3 channels, 3 x 3 kernels: most pairs cross taps; the sparse way's saturated pair sums per record
    and its pair sums are the oracle's."""
    force_way(monkeypatch, "sparse")
    rng = np.random.default_rng(4)
    x = rng.integers(150, 256, (3, 3, 6, 7)).astype(np.uint8)
    w = _heavy(rng, (4, 3, 3, 3))
    want, saturated, total = _oracle(x, 131, w, pads=[1, 1, 1, 1])
    counter = pairs.SaturationCounter()
    with pairs.counting(counter):
        correction = _correction(x, 131, w, pads=[1, 1, 1, 1])
        assert isinstance(correction, conv_pairs.SparseSearch)
        np.testing.assert_array_equal(correction.dense(), want)
    assert saturated.all()
    assert _counted(counter, 3) == (total, saturated.tolist())


def test_the_sparse_way_on_two_threads_counts_each_record(monkeypatch) -> None:
    """Two records of 2 x 128 x 128 (65,536 values: one per thread), each task's records counted as
    the layer's."""
    force_way(monkeypatch, "sparse")
    rng = np.random.default_rng(5)
    x = rng.integers(100, 256, (2, 2, 128, 128)).astype(np.uint8)
    x[0, :, :64] //= 2  # fewer saturated pair sums in the first record
    w = _heavy(rng, (3, 2, 1, 1))
    want, saturated, total = _oracle(x, 0, w)
    counter = pairs.SaturationCounter()
    with parallel.using(2), pairs.counting(counter):
        correction = _correction(x, 0, w)
        np.testing.assert_array_equal(correction.dense(), want)
    assert 0 < saturated[0] < saturated[1]
    assert _counted(counter, 2) == (total, saturated.tolist())


def test_the_sparse_way_over_more_records_than_values_per_record(monkeypatch) -> None:
    """Six records of two 1 x 1 pixels at 255: every record is searched."""
    force_way(monkeypatch, "sparse")
    x = np.full((6, 2, 1, 1), 255, np.uint8)
    w = np.full((3, 2, 1, 1), -128, np.int8)
    correction = _correction(x, 0, w)
    np.testing.assert_array_equal(correction.dense(), np.full((6, 3, 1, 1), -32768 + 128 * 510))


def test_the_sparse_way_in_blocks_of_one_record(monkeypatch) -> None:
    """Blocks of one record (``BLOCK_ELEMENTS`` = one record's pixels) over 4 records of 2 channels: one
    whose pixels all pass the cheap test (128 + 128 > 255) but never saturate (-128 x 256 = -32768),
    one with 300 such pixels (the exact test rules them out), one at 0, one at 255 whose expanded
    entries (2 per pixel) take two spans of the budget. Only the last changes: the oracle's values."""
    force_way(monkeypatch, "sparse")
    monkeypatch.setattr(conv_pairs, "BLOCK_ELEMENTS", 64 * 64)
    x = np.zeros((4, 2, 64, 64), np.uint8)
    x[0] = 128
    x[1, :, :5, :60] = 128
    x[3] = 255
    w = np.array([[-128, -128], [-100, -120]], np.int8).reshape(2, 2, 1, 1)
    want, saturated, _ = _oracle(x, 0, w)
    assert saturated.tolist() == [0, 0, 0, 2 * 4096]
    np.testing.assert_array_equal(_correction(x, 0, w).dense(), want)


# the sparse way's candidate test on pairs of channels that are not every even one


@pytest.mark.parametrize(
    ("c", "risky", "quiet"),
    [
        (3, [((1, 1), (1, 2))], 0),  # (t1 c1, t1 c2) only: first channel 1, half of 3 channels
        (5, [((0, 0), (0, 1)), ((1, 1), (3, 4))], 2),  # (t0 c0, t0 c1), (t1 c3, t1 c4): firsts 0 and 3
        (3, [((0, 1), (2, 0))], None),  # (t0 c2, t1 c0) only: every risky pair crosses taps
    ],
)
def test_the_sparse_way_reads_the_channels_each_pair_holds(monkeypatch, c: int, risky, quiet) -> None:
    """1 x 2 kernels whose only risky pairs are the listed ``((tap, tap'), (channel, channel'))``, at
    -128; channel ``quiet`` is 0: a candidate test reading it instead of the pair's own channels would
    find nothing."""
    force_way(monkeypatch, "sparse")
    w = np.zeros((2, c, 1, 2), np.int8)
    for (t0, t1), (c0, c1) in risky:
        w[:, c0, 0, t0] = w[:, c1, 0, t1] = -128
    x = np.random.default_rng(c).integers(150, 256, (2, c, 5, 6)).astype(np.uint8)
    if quiet is not None:
        x[:, quiet] = 0
    want, saturated, _ = _oracle(x, 0, w)
    assert saturated.all()
    correction = _correction(x, 0, w)
    assert isinstance(correction, conv_pairs.SparseSearch)
    np.testing.assert_array_equal(correction.dense(), want)


def test_padding_that_saturates_through_the_larger_first_weight(monkeypatch) -> None:
    """Weights (-128, -60) at every tap, inputs at most 60, padding at the zero point 180: only padded
    pixels saturate (180 x 188 = 33,840), and only through the first weight is ``2 x 180`` too large to
    leave the padding out (``32767 // 128 = 255``; ``32767 // 60 = 546``)."""
    force_way(monkeypatch, "sparse")
    x = np.random.default_rng(6).integers(0, 61, (2, 2, 5, 5)).astype(np.uint8)
    w = np.zeros((2, 2, 3, 3), np.int8)
    w[:, 0], w[:, 1] = -128, -60
    want, saturated, _ = _oracle(x, 180, w, pads=[1, 1, 1, 1])
    assert saturated.all() and not want[:, :, 1:-1, 1:-1].any()  # the border only
    np.testing.assert_array_equal(_correction(x, 180, w, pads=[1, 1, 1, 1]).dense(), want)


# the dense way's sums per output channel


def test_entries_of_both_signs_each_on_its_own_channel(monkeypatch) -> None:
    """Channel 0 saturates below (-128, -128) and channel 1 above (127, 127: 64,770 > 32,767); the plan
    puts positive entries first, so channel 1's change comes first and must land on channel 1."""
    force_way(monkeypatch, "dense")
    x = np.full((1, 2, 3, 3), 255, np.uint8)
    w = np.array([[-128, -128], [127, 127]], np.int8).reshape(2, 2, 1, 1)
    target = np.zeros((1, 2, 3, 3), np.float32)
    _correction(x, 0, w).add_to(target, 0, 1, 0, 3)
    assert target[0, :, 0, 0].tolist() == [-32768 + 128 * 510, 32767 - 127 * 510]
    np.testing.assert_array_equal(target, _oracle(x, 0, w)[0])


def _light_but(m: int, loud: list[int]) -> np.ndarray:
    """1 x 1 weights of 2 channels, 1 but on the ``loud`` output channels (-128)."""
    w = np.ones((m, 2, 1, 1), np.int8)
    w[loud] = -128
    return w


def test_as_many_changed_channels_as_rows(monkeypatch) -> None:
    """5 output channels, 0, 2 and 4 changed, over 3 rows of outputs: the changed channels' sums are
    added to those channels."""
    force_way(monkeypatch, "dense-blocks")
    x = np.full((2, 2, 3, 4), 255, np.uint8)
    w = _light_but(5, [0, 2, 4])
    target = np.zeros((2, 5, 3, 4), np.float32)
    _correction(x, 0, w).add_to(target, 0, 2, 0, 3)
    np.testing.assert_array_equal(target, _oracle(x, 0, w)[0])
    assert target[:, [0, 2, 4]].all() and not target[:, [1, 3]].any()


def test_runs_of_changed_channels_from_channel_3(monkeypatch) -> None:
    """Changed channels 3, 4 and 6 of 7: runs ``(3, 5)`` (first at index 0) and ``(6, 7)`` (index 2),
    each added as a slice."""
    force_way(monkeypatch, "dense-blocks")
    monkeypatch.setattr(conv_pairs, "RUN_ADD_OUTPUTS", 0)
    x = np.full((1, 2, 4, 4), 255, np.uint8)
    w = _light_but(7, [3, 4, 6])
    correction = _correction(x, 0, w)
    assert correction.layout.channel_runs() == [(3, 5, 0), (6, 7, 2)]
    target = np.zeros((1, 7, 4, 4), np.float32)
    correction.add_to(target, 0, 1, 0, 4)
    np.testing.assert_array_equal(target, _oracle(x, 0, w)[0])


def test_the_whole_correction_is_its_own_while_later_chunks_run(monkeypatch) -> None:
    """A layer's whole correction, made once, stays right after another layer's chunks ran their dense
    blocks on the same thread (in its scratch buffers)."""
    force_way(monkeypatch, "dense-blocks")
    rng = np.random.default_rng(7)
    x = rng.integers(150, 256, (3, 8, 5, 6)).astype(np.uint8)
    w = _heavy(rng, (4, 8, 3, 3))
    want = _oracle(x, 0, w, pads=[1, 1, 1, 1])[0]
    first = _correction(x, 0, w, pads=[1, 1, 1, 1])
    acc, _ = first.prepare(np.float32)
    assert acc.dtype == np.float32
    other = x[:1] // 2 + 100
    second = _correction(other, 0, w, pads=[1, 1, 1, 1])
    target = np.zeros((1, 4, 5, 6), np.float32)
    second.add_to(target, 0, 1, 0, 5)
    np.testing.assert_array_equal(target, _oracle(other, 0, w, pads=[1, 1, 1, 1])[0])
    np.testing.assert_array_equal(first.dense(), want)


@pytest.mark.parametrize("way", ["dense", "sparse"])
def test_chunks_starting_at_row_1(monkeypatch, way: str) -> None:
    """A fresh correction whose first chunk starts at row 1 and runs to the last row: row 0's changes
    are left out."""
    force_way(monkeypatch, way)
    rng = np.random.default_rng(8)
    x = rng.integers(150, 256, (2, 4, 5, 5)).astype(np.uint8)
    w = _heavy(rng, (3, 4, 3, 3))
    want = _oracle(x, 0, w, pads=[1, 1, 1, 1])[0]
    target = np.zeros((2, 3, 4, 5), np.float32)
    _correction(x, 0, w, pads=[1, 1, 1, 1]).add_to(target, 0, 2, 1, 5)
    np.testing.assert_array_equal(target, want[:, :, 1:])


# the types of the corrections' arrays, their bounds and truth


def test_whole_corrections_are_int64_and_dense_sums_of_the_asked_type(monkeypatch) -> None:
    """``dense()`` is int64 either way; the dense way's sums are of the type asked (fresh or scratch)."""
    rng = np.random.default_rng(9)
    x = rng.integers(150, 256, (2, 4, 5, 5)).astype(np.uint8)
    w = _heavy(rng, (3, 4, 3, 3))
    want = _oracle(x, 0, w)[0]
    for way, kind in (("dense", conv_pairs.DenseCorrection), ("sparse", conv_pairs.SparseSearch)):
        with monkeypatch.context() as patch:
            force_way(patch, way)
            correction = _correction(x, 0, w)
            assert isinstance(correction, kind)
            whole = correction.dense()
            assert whole.dtype == np.int64
            np.testing.assert_array_equal(whole, want)
    for fresh in (True, False):
        acc, _ = conv_pairs._dense_records(
            correction.layer, conv_pairs._DenseLayout.of(correction.found, 3), 0, 2, False, np.dtype(np.float32), fresh
        )
        assert acc.dtype == np.float32
        assert acc.sum() == want.sum()


def test_row_maxima_and_the_bound_of_pairs_not_searched() -> None:
    """``row_max(g)``: each channel's largest input (the zero point where padded) of group ``g``, once
    per tap; a correction's bound from pairs without the bound they were searched for takes them: one
    pair (-128, -128) of group 1 on inputs up to 220 and 230 changes by at most 450 x 128 - 32,768 =
    24,832."""
    x = np.zeros((2, 6, 2, 2), np.uint8)
    x[1, :, 0, 0] = [200, 210, 220, 230, 240, 250]
    x[0, 0, 1, 1] = 10  # below the zero point: padding raises channel 0 to 205
    w = np.full((3, 2, 1, 3), -128, np.int8)
    correction = _correction(x, 205, w, pads=[0, 1, 0, 1], group=3)
    layer = correction.layer
    assert layer.row_max(0).tolist() == [205, 210] * 3
    assert layer.row_max(1).tolist() == [220, 230] * 3
    assert layer.records(0, 1).row_max(2).tolist() == [240, 250] * 3  # the layer's maxima, not the part's
    hand = pairs.RiskyPairs(np.array([0]), np.array([0]), np.array([-128], np.int32), np.array([-128], np.int32))
    sparse = conv_pairs.SparseSearch(layer, [(1, hand)], 0)
    dense = conv_pairs.DenseCorrection(layer, conv_pairs._DenseLayout([(1, hand)], 1))
    assert sparse.max_abs() == dense.max_abs() == 24832
    assert bool(sparse) and bool(dense)  # a correction is there, whatever it holds


def test_a_pair_correction_by_hand() -> None:
    """Entries at the same output add up; outputs whose entries cancel are dropped; ``max_abs`` is the
    largest magnitude left, 0 for none."""
    shape = (2, 2, 3, 1)
    index = (np.array([0, 1, 1, 1]), np.array([0, 1, 1, 0]), np.array([2, 0, 0, 1]), np.array([0, 0, 0, 0]))
    found = conv_pairs.PairCorrection(shape, index, np.array([5, -3, -6, 4]))
    assert found.max_abs() == 9
    whole = found.dense()
    assert whole.dtype == np.int64
    want = np.zeros(shape, np.int64)
    want[0, 0, 2, 0], want[1, 1, 0, 0], want[1, 0, 1, 0] = 5, -9, 4
    np.testing.assert_array_equal(whole, want)
    cancelled = conv_pairs.PairCorrection(shape, tuple(i[:2] for i in index), np.array([0, 0]))
    assert not cancelled and cancelled.max_abs() == 0


def test_an_empty_batch_has_nothing_to_correct() -> None:
    """No records: channel maxima of nothing are 0 (the zero point where padded, 255 here, which makes
    every pair risky), and the convolution is empty, padded or not."""
    w = np.full((3, 2, 1, 1), -128, np.int8)
    x = np.zeros((0, 2, 4, 4), np.uint8)
    counter = pairs.SaturationCounter()
    with pairs.counting(counter):
        assert _correction(x, 255, w) is None
        padded = _correction(x, 255, w, pads=[1, 1, 1, 1])
        assert padded.layer.channel_max.tolist() == [255, 255]
        assert padded.dense().shape == (0, 3, 6, 6)
    assert counter.nodes[""].pairs == 0


def test_a_padded_input_without_pixels_reads_the_zero_point_only() -> None:
    """An input of height 0 padded by 1: its channels' maxima are the zero point (255), and every
    output's pair reads the padding: 255 x -128 x 2 = -65,280, saturated to -32,768."""
    w = np.full((3, 2, 1, 1), -128, np.int8)
    x = np.zeros((1, 2, 0, 4), np.uint8)
    correction = _correction(x, 255, w, pads=[1, 1, 1, 1])
    assert correction.layer.channel_max.tolist() == [255, 255]
    want = _oracle(x, 255, w, pads=[1, 1, 1, 1])[0]
    assert want.shape == (1, 3, 2, 6) and (want == -32768 + 65280).all()
    np.testing.assert_array_equal(correction.dense(), want)
