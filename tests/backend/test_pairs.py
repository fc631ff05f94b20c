"""int16 pair saturation (x86 without VNNI) against pair sums written out here, and the host probe.

The oracle sums every pair of raw products with Python integers, one output at a time, in the
reduction order MLAS packs (``(tap, channel)`` for convolutions); the backend computes exact sums with
BLAS and corrects only the pairs its weight bound flags, so the two share no code.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from pair_ways import force_way, recorded

from pytest_qaccuracy.backend import arith, get_scheme, host, pairs
from pytest_qaccuracy.backend.kernels.conv import conv_integer_acc
from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.presets import HOST_FAMILIES

AVX2 = get_scheme("onnxruntime-avx2")
VNNI = get_scheme("onnxruntime-vnni")


def _sat16(v: int) -> int:
    return max(-32768, min(32767, v))


def _pair_dot(a: list[int], b: list[int]) -> int:
    """``sum_p sat16(a[2p] b[2p] + a[2p+1] b[2p+1])``; an odd last element pairs with 0."""
    total = 0
    for p in range(0, len(a), 2):
        pair = a[p] * b[p] + (a[p + 1] * b[p + 1] if p + 1 < len(a) else 0)
        total += _sat16(pair)
    return total


def _oracle_matmul(a: np.ndarray, a_zp: int, b: np.ndarray, b_zp: int) -> np.ndarray:
    m, k = a.shape
    out = np.zeros((m, b.shape[1]), np.int64)
    for i in range(m):
        for j in range(b.shape[1]):
            raw = _pair_dot([int(v) for v in a[i]], [int(v) for v in b[:, j]])
            out[i, j] = raw - a_zp * int(b[:, j].astype(np.int64).sum()) - b_zp * int(a[i].astype(np.int64).sum())
            out[i, j] += k * a_zp * b_zp
    return out


def _heavy_weights(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Weights with many large same-sign neighbours, so that many pairs saturate."""
    sign = rng.choice([-1, 1], size=(*shape[:-1], 1))
    return np.clip(sign * rng.integers(20, 129, size=shape), -128, 127).astype(np.int8)


def test_a_pair_saturates_like_vpmaddubsw() -> None:
    a = np.full((1, 4), 255, np.uint8)
    b = np.array([[100], [100], [-100], [1]], np.int8)
    # pairs: 255*100 + 255*100 = 51000 -> 32767; 255*(-100) + 255*1 = -25245
    assert arith.zero_point_matmul(a, 0, b, 0, AVX2)[0, 0] == 32767 - 25245
    assert arith.zero_point_matmul(a, 0, b, 0, VNNI)[0, 0] == 255 * 101


def test_the_weight_bound_flags_every_pair_that_can_saturate_and_no_other() -> None:
    """Over every pair of int8 weights: flagged iff some inputs in [0, a_max] leave the int16 range."""
    values = np.arange(-128, 128)
    w0, w1 = np.meshgrid(values, values, indexing="ij")
    for a_max in (255, 200, 128, 64):
        w = np.stack([w0.ravel(), w1.ravel()]).astype(np.int8)  # (2, 65536): one pair per column
        flagged = np.zeros(w.shape[1], bool)
        flagged[pairs.risky_pairs(w, a_max).column] = True
        # the extremes of a0*w0 + a1*w1 over the box [0, a_max]^2 lie at its corners
        corners = [a0 * w0.ravel() + a1 * w1.ravel() for a0 in (0, a_max) for a1 in (0, a_max)]
        can_saturate = (np.max(corners, axis=0) > 32767) | (np.min(corners, axis=0) < -32768)
        np.testing.assert_array_equal(flagged, can_saturate)


def test_a_bound_per_input_flags_every_pair_that_can_saturate_and_no_other() -> None:
    """With one bound per reduction index (each input channel's own largest value), a pair is flagged
    iff some inputs in ``[0, a_max[k]] x [0, a_max[k+1]]`` leave the int16 range."""
    rng = np.random.default_rng(11)
    w = rng.integers(-128, 128, (64, 300)).astype(np.int8)
    a_max = rng.integers(0, 256, 64)
    a_max[:6] = [255, 255, 0, 255, 129, 128]  # full range, one dead channel, the 2 * 128 * 128 edge
    flagged = np.zeros((32, 300), bool)
    found = pairs.risky_pairs(w, a_max)
    flagged[found.first // 2, found.column] = True
    w0, w1 = w[0::2].astype(np.int64), w[1::2].astype(np.int64)
    a0, a1 = a_max[0::2, None], a_max[1::2, None]
    corners = [c0 * w0 + c1 * w1 for c0 in (0, a0) for c1 in (0, a1)]  # extremes lie at the box's corners
    can_saturate = (np.max(corners, axis=0) > 32767) | (np.min(corners, axis=0) < -32768)
    np.testing.assert_array_equal(flagged, can_saturate)
    assert 0 < can_saturate.sum() < can_saturate.size  # both outcomes occur
    np.testing.assert_array_equal(found.w_first, w[found.first, found.column])
    np.testing.assert_array_equal(found.w_second, w[found.first + 1, found.column])


@pytest.mark.parametrize(("m", "k", "n"), [(1, 64, 32), (3, 63, 17), (5, 1, 4), (8, 130, 9)])
@pytest.mark.parametrize(("a_zp", "b_zp"), [(0, 0), (128, 0), (37, -5)])
def test_matmul_matches_the_pair_oracle(m: int, k: int, n: int, a_zp: int, b_zp: int) -> None:
    rng = np.random.default_rng(m * 1000 + k + n)
    a = rng.integers(150, 256, (m, k)).astype(np.uint8)
    b = _heavy_weights(rng, (n, k)).T.copy()
    got = arith.zero_point_matmul(a, a_zp, b, b_zp, AVX2)
    np.testing.assert_array_equal(got, _oracle_matmul(a, a_zp, b, b_zp))
    if k > 1:
        assert not np.array_equal(got, arith.zero_point_matmul(a, a_zp, b, b_zp, VNNI))  # it saturated


def test_batched_matmul_saturates_per_batch() -> None:
    from pytest_qaccuracy.backend.kernels.matmul import integer_matmul

    rng = np.random.default_rng(3)
    a = rng.integers(200, 256, (2, 3, 10)).astype(np.uint8)
    b = np.stack([_heavy_weights(rng, (4, 10)).T for _ in range(2)])
    got = integer_matmul(a, 0, b, 0, AVX2)
    for i in range(2):
        np.testing.assert_array_equal(got[i], _oracle_matmul(a[i], 0, b[i], 0))


def _oracle_conv(x, x_zp, w, pads, strides, dilations, group) -> np.ndarray:
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    mg = m // group
    xp = np.full((n, c, h + pads[0] + pads[2], wd + pads[1] + pads[3]), x_zp, np.int64)
    xp[:, :, pads[0] : pads[0] + h, pads[1] : pads[1] + wd] = x
    oh = (xp.shape[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (xp.shape[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    out = np.zeros((n, m, oh, ow), np.int64)
    for r, o, i, j in itertools.product(range(n), range(m), range(oh), range(ow)):
        g = o // mg
        window, weights = [], []
        for ti, tj, ch in itertools.product(range(kh), range(kw), range(cg)):  # (tap, channel) order
            row, col = i * strides[0] + ti * dilations[0], j * strides[1] + tj * dilations[1]
            window.append(int(xp[r, g * cg + ch, row, col]))
            weights.append(int(w[o, ch, ti, tj]))
        out[r, o, i, j] = _pair_dot(window, weights) - x_zp * sum(weights)
    return out


def test_grouped_convolution_with_some_channel_pairs_quiet_matches_the_pair_oracle() -> None:
    """3 channels per group and group 1's ``(0, 1)`` pairs unable to saturate: the pairs that may saturate
    start at channels 0, 1 and 4, half the channel count but not every even channel."""
    rng = np.random.default_rng(7)
    x = rng.integers(180, 256, (2, 6, 5, 6)).astype(np.uint8)
    x[:, 3] //= 8  # small where a test of every even channel would look (channels 2 and 3) instead of 1 and 2
    w = _heavy_weights(rng, (4, 3, 3, 3))
    w[2:, 0, 0::2, :] = 0  # taps (0, 0), (0, 2), (1, 1), (2, 0), (2, 2) in the (tap, channel) order: even taps
    w[2:, 0, 1, 1] = 0
    attrs = {"pads": [1, 1, 1, 1], "strides": [1, 1], "dilations": [1, 1], "group": 2}
    got, _, _ = conv_integer_acc(x, np.uint8(131), w, np.int8(0), attrs, AVX2)
    np.testing.assert_array_equal(np.asarray(got, np.int64), _oracle_conv(x, 131, w, [1, 1, 1, 1], (1, 1), (1, 1), 2))


@pytest.mark.parametrize(
    ("c", "m", "group", "kernel", "pads", "strides", "dilations"),
    [
        (3, 4, 1, 3, [1, 1, 1, 1], (1, 1), (1, 1)),  # odd channels: pairs cross taps
        (8, 6, 1, 1, [0, 0, 0, 0], (1, 1), (1, 1)),  # 1x1
        (5, 4, 1, 3, [2, 1, 0, 1], (2, 1), (1, 2)),  # strides, dilations, uneven pads
        (6, 4, 2, 3, [1, 1, 1, 1], (1, 1), (1, 1)),  # grouped, 3 channels per group
        (4, 8, 4, 3, [1, 1, 1, 1], (1, 1), (1, 1)),  # one channel in, two out per group: paired taps
        (8, 4, 1, 3, [2, 1, 0, 1], (2, 1), (1, 2)),  # even channels: pairs within a tap, read per pixel
        (8, 6, 2, 3, [1, 1, 1, 1], (2, 2), (1, 1)),  # grouped, 4 channels per group
    ],
)
def test_convolution_matches_the_pair_oracle(c, m, group, kernel, pads, strides, dilations) -> None:
    rng = np.random.default_rng(c * 100 + m + group)
    x = rng.integers(180, 256, (2, c, 5, 6)).astype(np.uint8)
    w = _heavy_weights(rng, (m, c // group, kernel, kernel))
    attrs = {"pads": pads, "strides": list(strides), "dilations": list(dilations), "group": group}
    got, _, _ = conv_integer_acc(x, np.uint8(131), w, np.int8(0), attrs, AVX2)
    want = _oracle_conv(x, 131, w, pads, strides, dilations, group)
    np.testing.assert_array_equal(np.asarray(got, np.int64), want)
    exact, _, _ = conv_integer_acc(x, np.uint8(131), w, np.int8(0), attrs, VNNI)
    assert not np.array_equal(np.asarray(exact, np.int64), want)


def test_depthwise_convolution_sums_exactly() -> None:
    """One channel in and one out per group: MLAS's depthwise kernel widens to int32, no pairs."""
    rng = np.random.default_rng(11)
    x = rng.integers(200, 256, (1, 4, 5, 5)).astype(np.uint8)
    w = _heavy_weights(rng, (4, 1, 3, 3))
    attrs = {"pads": [1, 1, 1, 1], "group": 4}
    got, _, _ = conv_integer_acc(x, np.uint8(0), w, np.int8(0), attrs, AVX2)
    exact, _, _ = conv_integer_acc(x, np.uint8(0), w, np.int8(0), attrs, VNNI)
    np.testing.assert_array_equal(got, exact)
    assert not np.array_equal(np.asarray(exact, np.int64), _oracle_conv(x, 0, w, [1, 1, 1, 1], (1, 1), (1, 1), 4))


def test_the_probe_names_this_machine_and_can_be_overridden(monkeypatch: pytest.MonkeyPatch) -> None:
    value = host.probe()
    assert value in (32767, 64770)
    host.host_preset.cache_clear()
    monkeypatch.delenv(host.ENV_OVERRIDE, raising=False)
    try:
        assert host.host_preset() == ("onnxruntime-avx2" if value == 32767 else "onnxruntime-vnni")
        assert get_scheme("onnxruntime").name == host.host_preset()
        for preset in HOST_FAMILIES:
            host.host_preset.cache_clear()
            monkeypatch.setenv(host.ENV_OVERRIDE, preset)
            assert get_scheme("onnxruntime") is get_scheme(preset)
        host.host_preset.cache_clear()
        monkeypatch.setenv(host.ENV_OVERRIDE, "onnxruntime-sse")
        with pytest.raises(InputError, match="QACCURACY_HOST_PRESET='onnxruntime-sse': expected one of"):
            host.host_preset()
    finally:
        host.host_preset.cache_clear()


def test_one_dimensional_convolution_matches_the_pair_oracle() -> None:
    """Conv1d (speech and sequence models): the same (tap, channel) order along one spatial axis."""
    rng = np.random.default_rng(21)
    x = rng.integers(150, 256, (2, 6, 11)).astype(np.uint8)
    w = _heavy_weights(rng, (4, 6, 5))
    attrs = {"pads": [2, 1], "strides": [2], "dilations": [1]}
    got, _, _ = conv_integer_acc(x, np.uint8(7), w, np.int8(0), attrs, AVX2)
    # the 2-D oracle on a height-1 image with a height-1 kernel is the 1-D convolution
    want = _oracle_conv(x[:, :, None, :], 7, w[:, :, None, :], [0, 2, 0, 1], (1, 2), (1, 1), 1)
    np.testing.assert_array_equal(np.asarray(got, np.int64), want[:, :, 0, :])
    exact, _, _ = conv_integer_acc(x, np.uint8(7), w, np.int8(0), attrs, VNNI)
    assert not np.array_equal(np.asarray(exact, np.int64), want[:, :, 0, :])


def test_rgb_stem_with_only_first_channel_pairs_risky_matches_the_pair_oracle() -> None:
    """3 input channels whose only same-tap pairs that can saturate are ``(0, 1)`` (odd taps, which pair
    channels 1 and 2, have zero weights): "every even channel" must not read the unpaired channel 2
    (YOLOv8n's 320x320 stem failed with an IndexError on the onnxruntime-avx2 preset)."""
    rng = np.random.default_rng(3)
    x = rng.integers(180, 256, (2, 3, 6, 7)).astype(np.uint8)
    w = _heavy_weights(rng, (4, 3, 3, 3))
    for ti, tj in itertools.product(range(3), range(3)):
        if (ti * 3 + tj) % 2:
            w[:, :, ti, tj] = 0
    attrs = {"pads": [1, 1, 1, 1], "strides": [2, 2], "dilations": [1, 1], "group": 1}
    got, _, _ = conv_integer_acc(x, np.uint8(120), w, np.int8(0), attrs, AVX2)
    np.testing.assert_array_equal(np.asarray(got, np.int64), _oracle_conv(x, 120, w, [1, 1, 1, 1], (2, 2), (1, 1), 1))


@pytest.mark.parametrize("x_zp", [0, 100])
def test_convolution_read_unpadded_matches_the_pair_oracle(x_zp: int) -> None:
    """Padding at a zero point too small to saturate is never materialised: outputs near the border stay right."""
    rng = np.random.default_rng(11)
    x = rng.integers(150, 256, (2, 8, 5, 6)).astype(np.uint8)
    w = _heavy_weights(rng, (4, 8, 3, 3))
    pads, strides, dilations = [2, 1, 0, 1], (2, 1), (1, 2)
    attrs = {"pads": pads, "strides": list(strides), "dilations": list(dilations), "group": 1}
    got, _, _ = conv_integer_acc(x, np.uint8(x_zp), w, np.int8(0), attrs, AVX2)
    want = _oracle_conv(x, x_zp, w, pads, strides, dilations, 1)
    np.testing.assert_array_equal(np.asarray(got, np.int64), want)


@pytest.mark.parametrize("way", ["sparse", "dense", "dense-blocks"])
@pytest.mark.parametrize(
    ("c", "group", "pads", "strides"), [(3, 1, [1, 1, 1, 1], (2, 2)), (8, 2, [0, 1, 2, 1], (1, 2))]
)
def test_dense_and_sparse_corrections_match_the_pair_oracle(monkeypatch, way, c, group, pads, strides) -> None:
    """Inputs high on heavy weights saturate at most outputs (an image stem): the correction is then computed
    densely from im2col columns; both ways give the oracle's sums."""
    taken = force_way(monkeypatch, way)
    rng = np.random.default_rng(c + group)
    x = rng.integers(150, 256, (5, c, 6, 7)).astype(np.uint8)
    w = _heavy_weights(rng, (4, c // group, 3, 3))
    attrs = {"pads": pads, "strides": list(strides), "dilations": [1, 1], "group": group}
    got, _, _ = conv_integer_acc(x, np.uint8(140), w, np.int8(0), attrs, AVX2)
    want = _oracle_conv(x, 140, w, pads, strides, (1, 1), group)
    np.testing.assert_array_equal(np.asarray(got, np.int64), want)
    assert taken[-1] == recorded(way)  # the sparse way may sample first


def test_lowest_second_input_table_matches_brute_force() -> None:
    """``lowest_second[p, a]`` is the smallest ``a'`` at which some entry of pair ``p`` leaves int16."""
    from pytest_qaccuracy.backend.pairs import lowest_second

    rng = np.random.default_rng(5)
    w = rng.integers(-128, 128, 40)
    w2 = rng.integers(-128, 128, 40)
    w[:4], w2[:4] = [127, -128, 90, 5], [127, -128, 0, -128]  # both sides, a zero second weight, mixed signs
    pair = rng.integers(0, 6, 40)
    got = lowest_second(w, w2, pair, 7)  # pair 6 has no entry: never
    a = np.arange(256)[:, None, None]
    b = np.arange(256)[None, :, None]
    sums = a * w[None, None, :] + b * w2[None, None, :]
    leaves = (sums > 32767) | (sums < -32768)  # (a, a', entry)
    for p in range(7):
        any_entry = leaves[:, :, pair == p].any(axis=2)  # (a, a')
        want = np.where(any_entry.any(axis=1), any_entry.argmax(axis=1), 256)
        np.testing.assert_array_equal(got[p], want, err_msg=f"pair {p}")


@pytest.mark.parametrize("way", ["dense", "dense-blocks", "sparse"])
@pytest.mark.parametrize("c", [3, 8])  # pairs across taps, pairs within a tap
def test_a_correction_adds_the_same_in_any_chunks(monkeypatch, c: int, way: str) -> None:
    """The dense correction: whole-record chunks compute their part while the convolution runs, chunks
    of rows take theirs from the whole correction; the sparse one is found up front. Each way, each
    chunk adds what the oracle's pair sums change, and the correction's bound holds."""
    from pytest_qaccuracy.backend.kernels import conv_pairs

    force_way(monkeypatch, way)
    rng = np.random.default_rng(c)
    x = rng.integers(150, 256, (5, c, 7, 6)).astype(np.uint8)
    w = _heavy_weights(rng, (4, c, 3, 3))
    pads, strides = [1, 0, 1, 1], (1, 2)
    found = conv_pairs.pair_corrections(x, 140, w, 1, pads, strides, (1, 1), (7, 3))
    kinds = {"dense": conv_pairs.DenseCorrection, "sparse": conv_pairs.SparseSearch}
    assert isinstance(found, kinds[way.split("-")[0]])
    saturating = _oracle_conv(x, 140, w, pads, strides, (1, 1), 1)
    attrs = {"pads": pads, "strides": list(strides)}
    exact, _, _ = conv_integer_acc(x, np.uint8(140), w, np.int8(0), attrs, get_scheme("onnxruntime-vnni"))
    want = saturating - np.asarray(exact, np.int64)  # the change the pair saturation makes
    assert want.any()
    for chunks in ([(0, 5, 0, 7)], [(0, 2, 0, 7), (2, 5, 0, 7)], [(0, 5, 0, 3), (0, 5, 3, 7)], [(1, 4, 2, 5)]):
        for n0, n1, o0, o1 in chunks:
            target = np.zeros((n1 - n0, 4, o1 - o0, 4), np.float32)  # one column wider, as row paths leave it
            found.add_to(target, n0, n1, o0, o1)
            np.testing.assert_array_equal(target[..., :3], want[n0:n1, :, o0:o1], err_msg=str((n0, n1, o0, o1)))
            assert not target[..., 3].any()
    np.testing.assert_array_equal(found.dense(), want)
    assert found.max_abs() >= np.abs(want).max()


def test_matmul_weight_bounds_are_made_once_per_weight(monkeypatch) -> None:
    """A session passes the same constant (or a view of it: QGemm's transposed B) on every run: its pair
    bounds are made once and kept while it lives; another matrix gets its own."""
    made = []
    real = pairs.PairBounds.__init__
    monkeypatch.setattr(pairs.PairBounds, "__init__", lambda self, w: (made.append(w.shape), real(self, w))[1])
    rng = np.random.default_rng(2)
    constant = _heavy_weights(rng, (6, 40))  # (N, K): used transposed
    constant.flags.writeable = False  # as a session holds its constants
    a = rng.integers(150, 256, (3, 40)).astype(np.uint8)
    first = pairs.saturating_matmul_correction(a, constant.T)
    again = pairs.saturating_matmul_correction(a, constant.T)  # a new view of the same constant
    assert len(made) == 1
    np.testing.assert_array_equal(first, again)
    want = _oracle_matmul(a, 0, constant.T, 0) - a.astype(np.int64) @ constant.T.astype(np.int64)
    np.testing.assert_array_equal(first, want)
    pairs.saturating_matmul_correction(a, constant[:, ::-1].T)  # another view: other values
    assert len(made) == 2


def test_matmul_bounds_of_a_writable_operand_are_never_kept() -> None:
    """An operand that is not read-only (an activation) may hold other values at the same address
    later: its bounds are made for each call, so changed values give the right correction."""
    rng = np.random.default_rng(4)
    w = _heavy_weights(rng, (5, 32)).T.copy()  # (K, N), writable
    a = rng.integers(200, 256, (2, 32)).astype(np.uint8)
    before = pairs.saturating_matmul_correction(a, w)
    np.testing.assert_array_equal(before, _oracle_matmul(a, 0, w, 0) - a.astype(np.int64) @ w.astype(np.int64))
    w[...] = np.where(w > 0, 1, -1)  # the same array, now unable to saturate
    assert pairs.saturating_matmul_correction(a, w) is None


def _oracle_conv_nd(x, x_zp, w, pads, strides, dilations) -> np.ndarray:
    """Pair sums of a group-1 convolution of any rank, one output at a time, in (tap, channel) order."""
    d = x.ndim - 2
    m, c, kernel = w.shape[0], x.shape[1], w.shape[2:]
    xp = np.pad(x.astype(np.int64), [(0, 0), (0, 0)] + [(pads[i], pads[d + i]) for i in range(d)], constant_values=x_zp)
    out_spatial = [(xp.shape[2 + i] - dilations[i] * (kernel[i] - 1) - 1) // strides[i] + 1 for i in range(d)]
    out = np.zeros((x.shape[0], m, *out_spatial), np.int64)
    for r, o, *pos in itertools.product(range(x.shape[0]), range(m), *(range(s) for s in out_spatial)):
        window, weights = [], []
        for tap in itertools.product(*(range(k) for k in kernel)):
            at = tuple(p * s + t * dil for p, s, t, dil in zip(pos, strides, tap, dilations, strict=True))
            for ch in range(c):
                window.append(int(xp[(r, ch, *at)]))
                weights.append(int(w[(o, ch, *tap)]))
        out[(r, o, *pos)] = _pair_dot(window, weights) - x_zp * sum(weights)
    return out


@pytest.mark.parametrize("way", ["dense", "dense-blocks", "sparse"])
@pytest.mark.parametrize(("spatial", "kernel", "c"), [((9,), (3,), 4), ((9,), (3,), 3), ((4, 5, 4), (2, 3, 2), 4)])
def test_one_and_three_dimensional_convolutions_match_the_pair_oracle(monkeypatch, way, spatial, kernel, c) -> None:
    """The correction's im2col windows and candidate test hold for 1-D and 3-D convolutions too, with
    pairs within a tap (4 channels) and across taps (3), padded and strided."""
    force_way(monkeypatch, way)
    rng = np.random.default_rng(len(spatial) * 10 + c)
    x = rng.integers(150, 256, (5, c, *spatial)).astype(np.uint8)
    w = _heavy_weights(rng, (3, c, *kernel))
    d = len(spatial)
    pads, strides, dilations = [1] * (2 * d), [2] + [1] * (d - 1), [1] * d
    attrs = {"pads": pads, "strides": strides, "dilations": dilations, "group": 1}
    got, _, _ = conv_integer_acc(x, np.uint8(140), w, np.int8(0), attrs, AVX2)
    np.testing.assert_array_equal(np.asarray(got, np.int64), _oracle_conv_nd(x, 140, w, pads, strides, dilations))


def test_the_pairs_found_are_reused_only_for_bounds_no_larger() -> None:
    """A weight's last search is given again while no input bound grows (its pairs then cover every
    pair that may saturate); a larger bound anywhere searches again, as a fresh search would find."""
    rng = np.random.default_rng(12)
    w = rng.integers(-128, 128, (64, 40)).astype(np.int8)
    bounds = pairs.PairBounds(w)
    high = rng.integers(150, 256, 64)
    first = bounds.risky(high)
    assert bounds.risky(high) is first
    assert bounds.risky(high - 40) is first  # lower everywhere: the same (superset of the) pairs
    assert not first.first.flags.writeable  # handed out again: nobody may change it
    raised = high.copy()
    raised[7] = 255 if high[7] < 255 else 254
    raised[6] = 255
    again = bounds.risky(raised)
    fresh = pairs.risky_pairs(w, raised)
    for got, want in zip(
        (again.first, again.column, again.w_first, again.w_second),
        (fresh.first, fresh.column, fresh.w_first, fresh.w_second),
        strict=True,
    ):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("way", ["dense", "dense-blocks", "sparse"])
def test_runs_with_growing_and_shrinking_inputs_match_the_pair_oracle(monkeypatch, way) -> None:
    """One read-only weight (a session's constant) over batches whose channel maxima rise, fall and rise
    again: each run's correction is the oracle's, whether it searched anew or reused the last pairs."""
    taken = force_way(monkeypatch, way)
    rng = np.random.default_rng(21)
    w = _heavy_weights(rng, (6, 8, 3, 3))
    w.flags.writeable = False
    attrs = {"pads": [1, 1, 1, 1], "strides": [1, 1], "dilations": [1, 1], "group": 1}
    for low, high in ((90, 160), (150, 256), (60, 130), (200, 256)):
        x = rng.integers(low, high, (4, 8, 5, 6)).astype(np.uint8)
        got, _, _ = conv_integer_acc(x, np.uint8(70), w, np.int8(0), attrs, AVX2)
        want = _oracle_conv(x, 70, w, [1, 1, 1, 1], (1, 1), (1, 1), 1)
        np.testing.assert_array_equal(np.asarray(got, np.int64), want, err_msg=f"inputs in [{low}, {high})")
    assert recorded(way) in taken


@pytest.mark.parametrize("way", ["dense", "sparse"])
def test_a_quiet_group_growing_loud_in_a_later_run_matches_the_pair_oracle(monkeypatch, way) -> None:
    """A grouped convolution's read-only weight: group 0 risky in every run, group 1 quiet first and then
    risky while group 0's pairs are reused. Its correction's bound, kept with group 0's pairs, is made
    again for both groups (it raised ValueError: the kept groups were compared with a strict zip)."""
    force_way(monkeypatch, way)
    rng = np.random.default_rng(0)
    w = _heavy_weights(rng, (4, 4, 3, 3))
    w.flags.writeable = False
    attrs = {"pads": [1, 1, 1, 1], "strides": [1, 1], "dilations": [1, 1], "group": 2}
    x = rng.integers(200, 256, (2, 8, 5, 5)).astype(np.uint8)
    x[:, 4:] //= 25  # group 1's inputs below 11: no pair of it can saturate
    for run in range(3):
        got, _, _ = conv_integer_acc(x, np.uint8(0), w, np.int8(0), attrs, AVX2)
        want = _oracle_conv(x, 0, w, [1, 1, 1, 1], (1, 1), (1, 1), 2)
        np.testing.assert_array_equal(np.asarray(got, np.int64), want, err_msg=f"run {run}")
        x = x.copy()
        x[:, 4:] = rng.integers(200, 256, (2, 4, 5, 5)) if run == 0 else x[:, 4:] // 25  # loud, then quiet again


def test_the_sampled_choice_of_way_is_kept_for_the_same_risky_pairs(monkeypatch) -> None:
    """A layer whose way needs a sample run (of its first record) takes it once: later runs of the same
    weight and input shape reuse the verdict while the risky pairs stay the same; new pairs (an input
    bound grew) sample again. Every run gives the oracle's sums."""
    from pytest_qaccuracy.backend.kernels import conv_pairs

    samples = []
    real = conv_pairs._sparse
    monkeypatch.setattr(
        conv_pairs, "_sparse", lambda *a, **k: (samples.append(k.get("count_only", False)), real(*a, **k))[1]
    )
    rng = np.random.default_rng(5)
    w = _heavy_weights(rng, (16, 8, 1, 2))
    w.flags.writeable = False
    attrs = {"pads": [0, 0, 0, 0], "strides": [1, 1], "dilations": [1, 1], "group": 1}
    for low, high in ((150, 250), (140, 240), (160, 256)):
        x = rng.integers(low, high, (6, 8, 40, 40)).astype(np.uint8)  # large enough to need a sample
        got, _, _ = conv_integer_acc(x, np.uint8(0), w, np.int8(0), attrs, AVX2)
        # with 8 channels, each pair is channels (2p, 2p + 1) at one tap: the oracle, vectorized
        want = np.zeros((6, 16, 40, 39), np.int64)
        for tap in range(2):
            xs = x[:, :, :, tap : tap + 39].astype(np.int64)
            products = xs[:, None] * w[None, :, :, 0, tap, None, None].astype(np.int64)
            want += np.clip(products[:, :, 0::2] + products[:, :, 1::2], -32768, 32767).sum(axis=2)
        np.testing.assert_array_equal(np.asarray(got, np.int64), want)
    assert samples.count(True) == 2  # the first run and the run whose bounds grew; not the second


def _oracle_pointwise(x: np.ndarray, w: np.ndarray, group: int, strides: tuple[int, int]) -> np.ndarray:
    """Pair sums of an unpadded 1x1 convolution, vectorized: each pair is channels ``(2p, 2p + 1)`` of a
    group at one pixel (an odd last channel pairs with nothing)."""
    xs = x[:, :, :: strides[0], :: strides[1]].astype(np.int64)
    m, cg = w.shape[:2]
    mg = m // group
    out = np.zeros((x.shape[0], m, *xs.shape[2:]), np.int64)
    for g in range(group):
        part = xs[:, g * cg : (g + 1) * cg]
        products = part[:, None] * w[g * mg : (g + 1) * mg, :, 0, 0, None, None].astype(np.int64)
        even = products[:, :, 0 : cg - cg % 2 : 2] + products[:, :, 1::2]
        out[:, g * mg : (g + 1) * mg] = np.clip(even, -32768, 32767).sum(axis=2)
        if cg % 2:
            out[:, g * mg : (g + 1) * mg] += products[:, :, -1]
    return out


@pytest.mark.parametrize("way", ["dense", "sparse"])
@pytest.mark.parametrize(("c", "group", "strides"), [(8, 1, (1, 1)), (7, 1, (2, 1)), (12, 2, (2, 2)), (10, 2, (1, 3))])
def test_1x1_kernels_match_the_pair_oracle(monkeypatch, way: str, c: int, group: int, strides) -> None:
    """Unpadded 1x1 kernels (even and odd channel counts, groups, strides), by either way: the oracle's
    sums."""
    taken = force_way(monkeypatch, way)
    rng = np.random.default_rng(c * 10 + group)
    x = rng.integers(120, 256, (5, c, 9, 10)).astype(np.uint8)
    x[:, 1, :, :5] //= 4  # pixels where no pair of channels (0, 1) can saturate
    w = _heavy_weights(rng, (6, c // group, 1, 1))
    attrs = {"pads": [0, 0, 0, 0], "strides": list(strides), "dilations": [1, 1], "group": group}
    got, _, _ = conv_integer_acc(x, np.uint8(131), w, np.int8(0), attrs, AVX2)
    saturating = _oracle_pointwise(x, w, group, strides) - 131 * w.reshape(6, -1).astype(np.int64).sum(1)[:, None, None]
    np.testing.assert_array_equal(np.asarray(got, np.int64), saturating)
    assert taken[-1] == recorded(way)
    exact, _, _ = conv_integer_acc(x, np.uint8(131), w, np.int8(0), attrs, VNNI)
    want = saturating - np.asarray(exact, np.int64)
    assert want.any() and not want.all()  # some outputs change, some do not


@pytest.mark.parametrize("way", ["dense", "sparse"])
def test_1x1_kernels_count_each_saturated_pair_sum(monkeypatch, way: str) -> None:
    """The saturation report's counts of a 1x1 kernel: every pair sum the oracle clips, per record, once."""
    force_way(monkeypatch, way)
    rng = np.random.default_rng(3)
    x = rng.integers(100, 256, (4, 8, 6, 7)).astype(np.uint8)
    w = _heavy_weights(rng, (5, 8, 1, 1))
    products = x.astype(np.int64)[:, None] * w[None, :, :, 0, 0, None, None].astype(np.int64)
    sums = products[:, :, 0::2] + products[:, :, 1::2]
    clipped = ((sums > 32767) | (sums < -32768)).reshape(4, -1).sum(axis=1)
    counter = pairs.SaturationCounter()
    counter.node = "conv"
    with pairs.counting(counter):
        conv_integer_acc(x, np.uint8(0), w, np.int8(0), {"pads": [0, 0, 0, 0], "strides": [1, 1]}, AVX2)
    entry = counter.nodes["conv"]
    assert entry.pairs == 4 * 5 * 6 * 7 * 4
    assert entry.saturated == clipped.sum() > 0
    assert [entry.per_record.get(r, 0) for r in range(4)] == clipped.tolist()


@pytest.mark.parametrize("way", ["dense", "dense-blocks"])
def test_a_few_risky_pairs_each_on_its_own_output_channel_match_the_pair_oracle(monkeypatch, way) -> None:
    """Light weights but for one risky pair on each of three output channels (of both signs), on a small
    layer: each pair's change lands on its own channel, the others unchanged."""
    force_way(monkeypatch, way)
    rng = np.random.default_rng(8)
    x = rng.integers(200, 256, (2, 6, 4, 5)).astype(np.uint8)
    w = rng.integers(-40, 41, (5, 6, 3, 3)).astype(np.int8)  # 255 * 40 * 2 < 32768: never saturates
    w[0, 0:2, 0, 0] = 120  # channels (0, 1) at tap (0, 0): a pair in (tap, channel) order
    w[2, 2:4, 1, 1] = -125
    w[4, 4:6, 2, 1] = 110
    attrs = {"pads": [1, 1, 1, 1], "strides": [1, 1], "dilations": [1, 1], "group": 1}
    got, _, _ = conv_integer_acc(x, np.uint8(90), w, np.int8(0), attrs, AVX2)
    want = _oracle_conv(x, 90, w, [1, 1, 1, 1], (1, 1), (1, 1), 1)
    np.testing.assert_array_equal(np.asarray(got, np.int64), want)
    exact, _, _ = conv_integer_acc(x, np.uint8(90), w, np.int8(0), attrs, VNNI)
    changed = (np.asarray(exact, np.int64) != want).any(axis=(0, 2, 3))
    assert changed.tolist() == [True, False, True, False, True]


@pytest.mark.parametrize("way", ["dense", "sparse"])
@pytest.mark.parametrize(("spatial", "strides"), [((17,), (1,)), ((9,), (2,)), ((4, 5, 6), (1, 2, 1))])
def test_1x1_kernels_in_one_and_three_dimensions(monkeypatch, way: str, spatial, strides) -> None:
    """1x1 kernels of 1-D and 3-D convolutions: the vectorized oracle's sums."""
    taken = force_way(monkeypatch, way)
    rng = np.random.default_rng(len(spatial) + strides[0])
    c, m, d = 8, 5, len(spatial)
    x = rng.integers(120, 256, (3, c, *spatial)).astype(np.uint8)
    w = _heavy_weights(rng, (m, c)).reshape(m, c, *([1] * d))
    attrs = {"pads": [0] * (2 * d), "strides": list(strides), "dilations": [1] * d, "group": 1}
    got, _, _ = conv_integer_acc(x, np.uint8(131), w, np.int8(0), attrs, AVX2)
    xs = x[(slice(None), slice(None), *(slice(None, None, s) for s in strides))].astype(np.int64)
    products = xs[:, None] * w.reshape(m, c, *([1] * d))[None].astype(np.int64)
    pair_sums = np.clip(products[:, :, 0::2] + products[:, :, 1::2], -32768, 32767).sum(axis=2)
    want = pair_sums - 131 * w.reshape(m, -1).astype(np.int64).sum(1).reshape(1, m, *([1] * d))
    np.testing.assert_array_equal(np.asarray(got, np.int64), want)
    assert taken[-1] == recorded(way)


@pytest.mark.parametrize("way", ["dense", "dense-blocks", "dense-runs"])
def test_records_of_different_ranges_in_one_batch_match_the_pair_oracle(monkeypatch, way) -> None:
    """Quiet records next to loud ones, chunk by chunk and whole, give the oracle's sums and saturation
    counts. Two output channels never change, so the sums add to runs of channels (``dense-runs``: a
    slice per run, as large chunks do)."""
    from pytest_qaccuracy.backend.kernels import conv_pairs

    force_way(monkeypatch, way.replace("runs", "blocks"))
    if way == "dense-runs":
        monkeypatch.setattr(conv_pairs, "RUN_ADD_OUTPUTS", 0)
    rng = np.random.default_rng(8)
    w = _heavy_weights(rng, (6, 8, 3, 3))
    w[[2, 4]] //= 4  # no pair of these channels can saturate
    ranges = [(200, 256), (0, 90), (100, 170), (0, 256), (0, 40)]
    x = np.concatenate([rng.integers(lo, hi, (1, 8, 6, 5)) for lo, hi in ranges]).astype(np.uint8)
    x[3, :, 2, 2] = 255  # one loud pixel in a mostly quiet record
    pads, strides = [1, 1, 1, 1], (1, 1)
    found = conv_pairs.pair_corrections(x, 30, w, 1, pads, strides, (1, 1), (6, 5))
    assert isinstance(found, conv_pairs.DenseCorrection)
    saturating = _oracle_conv(x, 30, w, pads, strides, (1, 1), 1)
    attrs = {"pads": pads, "strides": list(strides)}
    exact, _, _ = conv_integer_acc(x, np.uint8(30), w, np.int8(0), attrs, VNNI)
    want = saturating - np.asarray(exact, np.int64)
    for chunks in ([(0, 5)], [(r, r + 1) for r in range(5)], [(0, 2), (2, 5)]):
        for n0, n1 in chunks:
            target = np.zeros((n1 - n0, 6, 6, 5), np.float32)
            found.add_to(target, n0, n1, 0, 6)
            np.testing.assert_array_equal(target, want[n0:n1], err_msg=str((n0, n1)))
    assert found.layout.channel_runs() == [(0, 2, 0), (3, 4, 2), (5, 6, 3)]

    products = {"pads": pads, "strides": list(strides), "dilations": [1, 1], "group": 1}
    counter = pairs.SaturationCounter()
    counter.node = "conv"
    with pairs.counting(counter):
        got, _, _ = conv_integer_acc(x, np.uint8(30), w, np.int8(0), products, AVX2)
    np.testing.assert_array_equal(np.asarray(got, np.int64), saturating)
    clipped = _oracle_saturated_per_record(x, 30, w, pads)
    entry = counter.nodes["conv"]
    assert [entry.per_record.get(r, 0) for r in range(5)] == clipped
    assert clipped[0] > 0 and clipped[1] == 0


def _oracle_saturated_per_record(x: np.ndarray, x_zp: int, w: np.ndarray, pads: list[int]) -> list[int]:
    """Each record's pair sums outside int16 of a stride-1 2-D convolution, pairs in (tap, channel) order."""
    n, c, h, wd = x.shape
    m, _, kh, kw = w.shape
    xp = np.full((n, c, h + pads[0] + pads[2], wd + pads[1] + pads[3]), x_zp, np.int64)
    xp[:, :, pads[0] : pads[0] + h, pads[1] : pads[1] + wd] = x
    oh, ow = xp.shape[2] - kh + 1, xp.shape[3] - kw + 1
    # (n, oh, ow, taps * c) in (tap, channel) order, and the weights' rows (m, taps * c) alike
    rows = np.stack([xp[:, :, i : i + oh, j : j + ow] for i in range(kh) for j in range(kw)], axis=1)
    rows = rows.transpose(0, 3, 4, 1, 2).reshape(n, oh, ow, -1)
    weights = w.astype(np.int64).transpose(0, 2, 3, 1).reshape(m, -1)
    products = rows[:, :, :, None, :] * weights[None, None, None]
    sums = products[..., 0::2] + products[..., 1::2]
    return ((sums > 32767) | (sums < -32768)).reshape(n, -1).sum(axis=1).tolist()


def _wrap16(v: int) -> int:
    return (v + 32768) % 65536 - 32768


def _neon_dot(a: list[int], b: list[int]) -> int:
    """MLAS's ARM64 int8 GEMM without dot products: blocks of 16 (zero-padded), products ``k`` and
    ``k + 8`` of a block added in int16 (wrapping), then widened; uint8 inputs flipped to int8 first."""
    a = a + [0] * (-len(a) % 16)
    b = b + [0] * (-len(b) % 16)
    pairs_ = itertools.product(range(0, len(a), 16), range(8))
    return sum(_wrap16(a[j + i] * b[j + i] + a[j + i + 8] * b[j + i + 8]) for j, i in pairs_)


def _oracle_general(a: np.ndarray, a_zp: np.ndarray, b: np.ndarray, b_zp: np.ndarray, dot) -> np.ndarray:
    """``(a - a_zp[row]) @ (b - b_zp[col])`` of 2-D ``a``, ``b`` with raw products summed by ``dot``."""
    k = a.shape[1]
    out = np.zeros((a.shape[0], b.shape[1]), np.int64)
    for i, j in itertools.product(range(a.shape[0]), range(b.shape[1])):
        raw = dot([int(v) for v in a[i]], [int(v) for v in b[:, j]])
        za, zb = int(a_zp[i]), int(b_zp[j])
        out[i, j] = raw - za * int(b[:, j].astype(np.int64).sum()) - zb * int(a[i].astype(np.int64).sum()) + k * za * zb
    return out


def test_per_row_and_per_column_zero_points_with_a_batched_b_saturate_like_the_pair_oracle() -> None:
    """QLinearMatMul's per-row ``a`` and per-column ``b`` zero points, with a batch of weight matrices
    (one way through ``zero_point_matmul`` for every shape)."""
    from pytest_qaccuracy.backend.kernels.matmul import integer_matmul

    rng = np.random.default_rng(8)
    a = rng.integers(180, 256, (2, 3, 21)).astype(np.uint8)
    b = np.stack([_heavy_weights(rng, (5, 21)).T for _ in range(2)])
    a_zp = np.array([0, 128, 37], np.uint8)
    b_zp = np.array([0, -3, 5, 1, -128], np.int8)
    got = integer_matmul(a, a_zp, b, b_zp, AVX2)
    for i in range(2):
        np.testing.assert_array_equal(got[i], _oracle_general(a[i], a_zp, b[i], b_zp, _pair_dot))
    assert not np.array_equal(got, integer_matmul(a, a_zp, b, b_zp, VNNI))  # it saturated
    got2 = integer_matmul(a[0], a_zp, b[1], b_zp, AVX2)  # 2-D b, per-row a zero point
    np.testing.assert_array_equal(got2, _oracle_general(a[0], a_zp, b[1], b_zp, _pair_dot))


@pytest.mark.parametrize("a_type", [np.uint8, np.int8])
def test_batched_and_per_row_matmul_wraps_like_the_neon_pair_oracle(a_type) -> None:
    """ARM64 without dot products: a pair of two ``(-128) * (-128)`` products wraps to ``-32768``."""
    from pytest_qaccuracy.backend.kernels.matmul import integer_matmul

    neon = get_scheme("onnxruntime-arm64-neon")
    rng = np.random.default_rng(21)
    low = 0 if a_type == np.uint8 else -128
    a = rng.integers(low, low + 256, (2, 3, 37)).astype(a_type)
    a[..., :24] = low  # uint8 0 is int8 -128 once MLAS flips it
    b = rng.integers(-128, 128, (2, 37, 4)).astype(np.int8)
    b[0, :24, :2] = -128
    b[1, 8:16, 3] = -128
    b[1, 0:8, 3] = -128
    a_zp = np.array([3, 0, 200 if a_type == np.uint8 else -7]).astype(a_type)
    b_zp = np.array([0, 2, -1, 4], np.int8)
    got = integer_matmul(a, a_zp, b, b_zp, neon)
    flip = 128 if a_type == np.uint8 else 0

    def dot(x: list[int], w: list[int]) -> int:  # flipped to int8, then the uint8 offset added back
        return _neon_dot([v - flip for v in x], w) + flip * sum(w)

    for i in range(2):
        np.testing.assert_array_equal(got[i], _oracle_general(a[i], a_zp, b[i], b_zp, dot))
    exact = integer_matmul(a, a_zp, b, b_zp, get_scheme("onnxruntime-arm64"))
    assert (got - exact).min() <= -65536 and set(np.unique(got - exact) % 65536) == {0}
