"""Unit tests of the calibration algorithms (docs/calibration.md) against values worked out from the
documented formulas: ranges, observers, candidates, options, the calibrator, the reader, the cache."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pytest_qaccuracy.analysis.calibration import cache as cache_module
from pytest_qaccuracy.analysis.calibration import calibrator as calibrator_module
from pytest_qaccuracy.analysis.calibration import ranges as R
from pytest_qaccuracy.analysis.calibration.cache import calibrated_model, content_key
from pytest_qaccuracy.analysis.calibration.calibrator import calibrate, calibration_tensors, compute_ranges
from pytest_qaccuracy.analysis.calibration.candidates import (
    CANDIDATES,
    MSE_BINS,
    ORT_PERCENTILE,
    CandidateOptions,
    TensorStats,
    candidate_ranges,
    ort_percentile_range,
)
from pytest_qaccuracy.analysis.calibration.observers import (
    ExtremaObserver,
    HistogramObserver,
    MagnitudeHistogramObserver,
    MinMaxObserver,
    magnitude_minimum,
    record_extrema,
    shifted,
)
from pytest_qaccuracy.analysis.calibration.options import (
    METHODS,
    QTYPES,
    CalibrationOptions,
    CalibrationResult,
    written_key,
)
from pytest_qaccuracy.analysis.calibration.reader import DatasetReader
from pytest_qaccuracy.data import bind_dataset, load_dataset
from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.model.loading import graph_inputs
from tests.analysis.test_calibration_opset import _window_kl
from tests.progress_recorders import CallRecorder

# --- golden helpers, written from docs/calibration.md -------------------------------------------


def one_percentile_golden(values, p: float) -> float:
    """ONE: sort, pos = (N - 1) p / 100, i = floor(pos), v[i] + (pos - i)(v[i+1] - v[i])."""
    v = sorted(float(x) for x in np.ravel(values))
    if p == 100.0 or len(v) == 1:
        return v[-1] if p == 100.0 else v[0]
    pos = (len(v) - 1) * p / 100.0
    i = math.floor(pos)
    return v[i] + (pos - i) * (v[i + 1] - v[i])


def moving_average_golden(values, is_min: bool, batch: int = 16, constant: float = 0.1) -> float:
    values = [float(x) for x in np.ravel(values)]
    c = None
    for k in range(0, len(values), batch):
        chunk = values[k : k + batch]
        b = min(chunk) if is_min else max(chunk)
        c = b if c is None else c * (1 - constant) + b * constant
    return c


def histogram_golden(values, bound: float, bins: int) -> np.ndarray:
    """bin b holds [-T + b w, -T + (b+1) w), w = 2T / bins, the last bin closed; outside values clipped."""
    x = np.asarray(values, dtype=np.float64).ravel()
    x = np.clip(x[~np.isnan(x)], -bound, bound)
    return np.histogram(x, bins, (-bound, bound))[0]


def mse_golden(hist, edges, lo, hi, qmin, qmax, candidates=256) -> tuple[float, float]:
    """Each candidate t = T j / candidates one by one, the error summed bin by bin."""
    span = float(edges[-1])
    best, best_err = (lo, hi), math.inf
    for j in range(1, candidates + 1):
        t = span * j / candidates
        c_lo, c_hi = max(lo, -t), min(hi, t)
        rmin, rmax = min(c_lo, 0.0), max(c_hi, 0.0)
        s = (rmax - rmin) / (qmax - qmin)
        if s <= 0:
            continue
        z = round(qmin - rmin / s)  # Python's round: half to even, as numpy's
        err = 0.0
        for b, count in enumerate(hist):
            if count:
                c = (edges[b] + edges[b + 1]) / 2
                q = min(max(round(c / s) + z, qmin), qmax)
                err += count * (c - (q - z) * s) ** 2
        if err < best_err:
            best, best_err = (c_lo, c_hi), err
    return best


# --- ranges.py: one_percentile ------------------------------------------------------------------


def test_one_percentile_golden_values_and_ends():
    v = np.array([[3.0, -1.0], [10.0, 2.0]])  # any shape: sorted -1, 2, 3, 10
    assert R.one_percentile(v, 50.0) == pytest.approx(2.5)  # pos 1.5: 2 + 0.5 * 1
    assert R.one_percentile(v, 1.0) == pytest.approx(-1.0 + 0.03 * 3.0)  # pos 0.03
    assert R.one_percentile(v, 99.0) == pytest.approx(3.0 + 0.97 * 7.0)  # pos 2.97
    assert R.one_percentile(v, 0.0) == -1.0 and R.one_percentile(v, 100.0) == 10.0
    assert R.one_percentile([4.0, 4.0], 100.0) == 4.0
    assert R.one_percentile(np.array([2.5]), 37.0) == 2.5
    assert isinstance(R.one_percentile(np.array([1, 2]), 50.0), float)
    rng = np.random.default_rng(11)
    for n in (2, 3, 17, 100):
        values = rng.standard_normal(n)
        for p in (0.5, 1.0, 33.3, 99.0, 99.99):
            assert R.one_percentile(values, p) == pytest.approx(one_percentile_golden(values, p), rel=1e-12)


@pytest.mark.parametrize("percent", [-0.001, 100.001, -50.0])
def test_one_percentile_refuses_a_percent_outside_0_100(percent):
    with pytest.raises(ValueError, match=rf"^percentile must be within \[0, 100\], got {percent}$"):
        R.one_percentile(np.array([1.0, 2.0]), percent)


def test_one_percentile_of_no_values_is_refused():
    with pytest.raises(ValueError, match=r"^percentile of no values$"):
        R.one_percentile(np.array([]), 50.0)


# --- ranges.py: moving_average ------------------------------------------------------------------


def test_moving_average_golden_values():
    rng = np.random.default_rng(5)
    values = rng.standard_normal(53)
    for is_min in (True, False):
        assert R.moving_average(values, is_min) == pytest.approx(moving_average_golden(values, is_min), rel=1e-12)
        for batch, constant in ((1, 0.5), (5, 0.25), (53, 0.9), (60, 0.1)):
            got = R.moving_average(values, is_min, batch, constant)
            assert got == pytest.approx(moving_average_golden(values, is_min, batch, constant), rel=1e-12)
    # by hand: batches of 2 over [[4, 1], [6, 8], [0, 2]] with C = 0.5, maxima 4, 8, 2:
    # 4 -> 4 * 0.5 + 8 * 0.5 = 6 -> 6 * 0.5 + 2 * 0.5 = 4; minima 1, 6, 0 -> 1 -> 3.5 -> 1.75
    hand = np.array([[4.0, 1.0], [6.0, 8.0], [0.0, 2.0]])
    assert R.moving_average(hand, False, 2, 0.5) == 4.0
    assert R.moving_average(hand, True, 2, 0.5) == 1.75
    assert R.moving_average(np.array([3.0]), True) == 3.0
    # the defaults: batches of 16, C = 0.1
    assert R.moving_average(np.r_[np.zeros(16), np.ones(16)], False) == pytest.approx(0.1)


def test_moving_average_of_no_values_is_refused():
    with pytest.raises(ValueError, match=r"^moving average of no values$"):
        R.moving_average(np.array([]), True)


# --- ranges.py: kl_threshold --------------------------------------------------------------------


def test_kl_threshold_refuses_bad_histograms():
    with pytest.raises(ValueError, match=r"^expected an odd number of bins and bins\+1 edges, got 4 and 5$"):
        R.kl_threshold(np.ones(4), np.linspace(-1, 1, 5), 3)
    with pytest.raises(ValueError, match=r"^expected an odd number of bins and bins\+1 edges, got 5 and 5$"):
        R.kl_threshold(np.ones(5), np.linspace(-1, 1, 5), 3)
    with pytest.raises(ValueError, match=r"^expected an odd number of bins and bins\+1 edges, got 5 and 7$"):
        R.kl_threshold(np.ones(5), np.linspace(-1, 1, 7), 3)
    with pytest.raises(ValueError, match=r"^5 bins are fewer than the 7 quantized bins$"):
        R.kl_threshold(np.ones(5), np.linspace(-1, 1, 6), 7)
    # as many bins as quantized bins: one window, allowed
    assert R.kl_threshold(np.array([1, 2, 3, 2, 1]), np.linspace(-2.5, 2.5, 6), 5)[0] == 2.5


def test_kl_threshold_defaults_are_tvms():
    assert (R.KL_BINS, R.KL_QUANTIZED_BINS, R.KL_EPS) == (8001, 255, 1e-4)
    assert R.KL_STRIDE == 64 and R.KL_EXHAUSTIVE == 2**20
    edges = np.linspace(-1, 1, 256)
    hist = np.zeros(255)
    hist[[0, 100, 127, 127, 200, 254]] = [1, 3, 9, 9, 2, 1]
    # 255 bins, 255 quantized bins by default: the one window is the whole histogram
    t, kl = R.kl_threshold(hist, edges)
    assert t == 1.0 and kl == pytest.approx(_window_kl(hist, 127, 255), rel=1e-9)


def test_kl_threshold_of_an_empty_histogram_keeps_the_whole_range():
    edges = np.linspace(-4.5, 4.5, 10)
    assert R.kl_threshold(np.zeros(9), edges, 3) == (4.5, math.inf)
    assert R.kl_threshold(np.zeros(9), edges, 3, stride=2, exhaustive=0) == (4.5, math.inf)


def _counts(seed: int, n: int, bins: int = 1025) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(seed).standard_normal(n)
    hist = HistogramObserver(float(np.abs(x).max()), bins)
    hist.update(x)
    return hist.counts, hist.edges


def _all_windows(counts: np.ndarray, qbins: int) -> dict[int, float]:
    zero = counts.size // 2
    return {i: _window_kl(counts.astype(np.float64), i, qbins) for i in range(qbins // 2, zero + 1)}


def _first_minimum(divergence: dict[int, float], tried, edges: np.ndarray, zero: int) -> tuple[float, float]:
    best = (float(edges[-1]), math.inf)
    for i in sorted(tried):
        if divergence[i] < best[1]:
            best = (float(edges[zero + i + 1]), divergence[i])
    return best


def _coarse_to_fine(divergence, edges: np.ndarray, zero: int, half: int, stride: int, coarse: bool = False):
    """The documented search: every stride-th window (and the widest), then every stride/8-th within
    stride of the two best, and so on down to every window; the least divergence of all tried.
    Every window is tried at once when there are at most 8 strides of them (unless ``coarse``)."""
    windows = list(range(half, zero + 1))
    tried: set[int] = set()
    step = stride
    level = windows if len(windows) <= 8 * step and not coarse else [*windows[::step], windows[-1]]
    while step > 1 and len(level) > 8:
        tried.update(level)
        two = sorted(set(level), key=lambda i: (divergence[i], i))[:2]
        fine = max(1, step // 8)
        level = [i for c in two for i in range(max(half, c - step + 1), min(zero, c + step - 1) + 1, fine)] + two
        step = fine
    tried.update(level)
    return _first_minimum(divergence, tried, edges, zero)


@pytest.fixture(scope="module")
def jagged():
    """3000 normal values in 1025 bins, 63 quantized bins: a divergence jagged from window to window
    (the coarse-to-fine searches of stride 16 and 8 stop at another window than the exhaustive one)."""
    counts, edges = _counts(3, 3000)
    return counts, edges, _all_windows(counts, 63)


def test_kl_exhaustive_search_is_the_first_least_window(jagged):
    counts, edges, divergence = jagged
    want = _first_minimum(divergence, divergence, edges, 512)
    got = R.kl_threshold(counts, edges, 63, stride=1)
    assert got[0] == want[0] and got[1] == pytest.approx(want[1], rel=1e-9)
    assert R.kl_threshold(counts, edges, 63, stride=16, exhaustive=10**9) == got  # few pairs: exhaustive too


@pytest.mark.parametrize("stride", [16, 8, 64])
def test_kl_coarse_to_fine_tries_the_documented_windows(jagged, stride):
    """482 windows: stride 16 zooms 16 -> 2 -> 1, stride 8 zooms 8 -> 1, stride 64 tries them all first."""
    counts, edges, divergence = jagged
    want = _coarse_to_fine(divergence, edges, 512, 31, stride)
    got = R.kl_threshold(counts, edges, 63, stride=stride, exhaustive=0)
    assert got[0] == want[0] and got[1] == pytest.approx(want[1], rel=1e-8)
    exhaustive = R.kl_threshold(counts, edges, 63, stride=1)
    if stride == 64:  # every window tried: the exhaustive answer
        assert got[0] == exhaustive[0] and got[1] == pytest.approx(exhaustive[1], rel=1e-9)
    else:  # not the exhaustive search (docs/calibration.md): a larger divergence
        assert got[0] != exhaustive[0] and got[1] > exhaustive[1]


def test_kl_exhaustive_search_in_chunks_gives_the_same_windows(jagged, monkeypatch):
    counts, edges, divergence = jagged
    whole = R.kl_threshold(counts, edges, 63, stride=1)
    monkeypatch.setattr(R, "KL_PAIRS", 7)  # fewer pairs than one window: one window per chunk
    assert R.kl_threshold(counts, edges, 63, stride=1) == whole
    monkeypatch.setattr(R, "KL_PAIRS", 400)  # a few windows per chunk
    zero = counts.size // 2
    filled = np.flatnonzero(counts)
    halves = np.arange(31, zero + 1)
    values = R._windows_kl(counts.astype(np.float64), np.r_[0.0, np.cumsum(counts)], filled, zero, halves, 63)
    want = np.array([divergence[int(i)] for i in halves])
    np.testing.assert_array_equal(np.isfinite(values), np.isfinite(want))
    np.testing.assert_allclose(values[np.isfinite(want)], want[np.isfinite(want)], rtol=1e-9)


def test_kl_exhaustive_threshold_is_used_by_pair_count():
    """The exhaustive search runs when the (window, non-zero bin) pairs are at most ``exhaustive``."""
    counts, edges = _counts(2, 300, bins=257)
    zero, half = 128, 15
    filled = np.flatnonzero(counts)
    pairs = sum(int(((filled > zero - i) & (filled < zero + i)).sum()) for i in range(half, zero + 1))
    assert int(R._inner(filled, zero, np.arange(half, zero + 1)).sum()) == pairs
    divergence = _all_windows(counts, 31)
    exhaustive = _first_minimum(divergence, divergence, edges, zero)
    coarse = _coarse_to_fine(divergence, edges, zero, half, 4)
    assert coarse[0] != exhaustive[0]  # the two searches differ here, so which one ran shows
    at = R.kl_threshold(counts, edges, 31, stride=4, exhaustive=pairs)
    below = R.kl_threshold(counts, edges, 31, stride=4, exhaustive=pairs - 1)
    assert at[0] == exhaustive[0] and below[0] == coarse[0]


def test_window_sums_series_and_bin_by_bin_windows(monkeypatch):
    """Sparse counts (a large smoothing shift) and dense ones against the bin-by-bin loop, with the
    series cut-over moved both ways."""
    rng = np.random.default_rng(9)
    sparse = np.zeros(129)
    sparse[rng.choice(129, 20, replace=False)] = rng.integers(1, 5, 20)
    dense, _ = _counts(6, 20000, bins=129)
    for counts in (sparse, dense.astype(np.float64)):
        halves = np.arange(7, 65)
        want = np.array([_window_kl(counts, int(i), 15) for i in halves])
        for shift in (R.KL_SERIES_MAX_SHIFT, 0.0, 1.0):
            monkeypatch.setattr(R, "KL_SERIES_MAX_SHIFT", shift)
            got = R.WindowSums(counts).divergences(64, halves, 15)
            np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
            ok = np.isfinite(want)
            np.testing.assert_allclose(got[ok], want[ok], rtol=1e-8 if shift <= 0.01 else 1e-3, atol=1e-12)


# --- ranges.py: mse_range -----------------------------------------------------------------------


def test_mse_range_hand_worked():
    """Ten values at 0 and one at 2 over bins centred on -2..2; 3 levels (0..2), 2 candidates:
    t = 1.25 gives (0, 1.25), step 0.625, 2 -> 1.25, error 0.75^2; t = 2.5 gives (0, 2.2), step 1.1,
    2 -> 2.2, error 0.2^2: the full range wins."""
    edges = np.linspace(-2.5, 2.5, 6)
    hist = np.array([0, 0, 10, 0, 1])
    assert R.mse_range(hist, edges, 0.0, 2.2, 0, 2, candidates=2) == (0.0, 2.2)
    # ten values at 1 and one at 2: (0, 1.25) puts 1 at 1.25 and 2 at 1.25 (0.625 + 0.5625), (0, 2.2)
    # puts 1 at 1.1 and 2 at 2.2 (0.1 + 0.04): the full range again
    hist = np.array([0, 0, 0, 10, 1])
    assert R.mse_range(hist, edges, 0.0, 2.2, 0, 2, candidates=2) == (0.0, 2.2)
    # ten at 1, none at 2, observed max 2.2: (0, 1.25) puts 1 at 1.25 (10 * 0.0625 = 0.625),
    # (0, 2.2) puts 1 at 1.1 (0.1): still the full range; with 5 levels (0..4) (0, 1.25) has step
    # 0.3125 and 1 -> 0.9375 (10 * 0.0039 = 0.039), (0, 2.2) step 0.55, 1 -> 1.1 (0.1): the narrower
    hist = np.array([0, 0, 0, 10, 0])
    assert R.mse_range(hist, edges, 0.0, 2.2, 0, 4, candidates=2) == (0.0, 1.25)


def test_mse_range_against_the_one_by_one_loop():
    rng = np.random.default_rng(8)
    x = np.r_[rng.standard_normal(3000), [9.0, -2.5]]
    bound = float(np.abs(x).max())
    hist = HistogramObserver(bound, 201)
    hist.update(x)
    lo, hi = float(x.min()), float(x.max())
    for qmin, qmax in QTYPES.values():
        for candidates in (256, 31):
            want = mse_golden(hist.counts, hist.edges, lo, hi, qmin, qmax, candidates)
            assert R.mse_range(hist.counts, hist.edges, lo, hi, qmin, qmax, candidates) == pytest.approx(
                want, rel=1e-12
            )
    # only positive values: rmin is 0 and the zero point qmin
    y = np.abs(x)
    hist = HistogramObserver(float(y.max()), 201)
    hist.update(y)
    want = mse_golden(hist.counts, hist.edges, float(y.min()), float(y.max()), -128, 127, 64)
    assert R.mse_range(hist.counts, hist.edges, float(y.min()), float(y.max()), -128, 127, 64) == pytest.approx(want)


def test_mse_range_ties_go_to_the_narrowest_candidate_across_blocks(monkeypatch):
    """Every value at 0: every candidate's error is 0, and the first (t = T / 256) is kept."""
    edges = np.linspace(-2.5, 2.5, 6)
    hist = np.array([0, 0, 7, 0, 0])
    for block in (R.MSE_BLOCK, 1, 3):
        monkeypatch.setattr(R, "MSE_BLOCK", block)
        assert R.mse_range(hist, edges, -1.0, 2.0, 0, 255) == (-2.5 / 256, 2.5 / 256)


def test_mse_range_in_blocks_gives_the_same_range(monkeypatch):
    rng = np.random.default_rng(3)
    x = np.r_[rng.laplace(size=2000), 14.0]
    hist = HistogramObserver(14.0, 101)
    hist.update(x)
    args = (hist.counts, hist.edges, float(x.min()), 14.0, 0, 255)
    want = mse_golden(*args)
    for block in (R.MSE_BLOCK, 1, 50, 101 * 7 + 3):
        monkeypatch.setattr(R, "MSE_BLOCK", block)
        assert R.mse_range(*args) == pytest.approx(want, rel=1e-12)


def test_mse_range_of_a_zero_range_is_that_range():
    edges = np.linspace(-1.5, 1.5, 4)
    assert R.mse_range(np.array([0, 5, 0]), edges, 0.0, 0.0, 0, 255) == (0.0, 0.0)


# --- ranges.py: power of two --------------------------------------------------------------------


def test_power2_range_hand_worked():
    # 4 / 255 -> k = -5, s = 1/32, z = 32: (-1, 223 / 32)
    assert R.power2_range(-1.0, 3.0, 0, 255) == (-1.0, 223 / 32)
    # 254.9 / 255 < 1 -> k = 0, s = 1, z = ceil(0.4) = 1, (255 - 1) * 1 = 254 < 254.5: k = 1, s = 2, z = 1
    assert R.power2_range(-0.4, 254.5, 0, 255) == (-2.0, 508.0)
    # the same at 1/32 of the scale: k = -5 is raised to -4, s = 1/16
    assert R.power2_range(-0.4 / 32, 254.5 / 32, 0, 255) == (-1 / 16, 254 / 16)
    # exactly 255 steps of 1 below zero: z = 255 = qmax - qmin, the range (-255, 0)
    assert R.power2_range(-255.0, 0.0, 0, 255) == (-255.0, 0.0)
    assert R.power2_range(0.0, 255.0, 0, 255) == (0.0, 255.0)
    # lo above zero and hi below it are widened to 0 first
    assert R.power2_range(2.0, 3.0, -128, 127) == R.power2_range(0.0, 3.0, -128, 127) == (-0.0, 255 / 64)
    # 3 / 255 -> k = -6, s = 1/64, z = 192: (-3, 63 / 64)
    assert R.power2_range(-3.0, -2.0, 0, 255) == (-3.0, 63 / 64)
    assert R.power2_range(0.0, 0.0, 0, 255) == (0.0, 0.0)


def test_power2_range_is_the_smallest_power_of_two_grid():
    rng = np.random.default_rng(1)
    for _ in range(200):
        lo, hi = sorted(rng.standard_normal(2) * 10.0 ** rng.integers(-3, 3))
        for qmin, qmax in QTYPES.values():
            a, b = R.power2_range(lo, hi, qmin, qmax)
            s = (b - a) / (qmax - qmin)
            k = math.log2(s)
            assert k.is_integer() and a <= min(lo, 0.0) and b >= max(hi, 0.0) and (-a / s).is_integer()
            # half the step cannot cover it
            half, z = s / 2, math.ceil(-min(lo, 0.0) / (s / 2))
            assert z > qmax - qmin or (qmax - qmin - z) * half < max(hi, 0.0)


def test_power2_scale():
    assert R.power2_scale(1.0, 127) == 2.0**-6  # 1 / 127 -> 2^-6 (2^-7 * 127 < 1)
    assert R.power2_scale(127.0, 127) == 1.0  # exactly one
    assert R.power2_scale(127.5, 127) == 2.0
    assert R.power2_scale(0.0, 127) == 1.0 and R.power2_scale(-1.0, 127) == 1.0
    assert R.power2_scale(3.0, 7) == 0.5


# --- observers.py -------------------------------------------------------------------------------


def test_record_extrema_without_and_with_nan():
    x = np.array([[[1.0, -2.0], [3.0, 0.5]], [[7.0, 7.0], [6.0, -1.0]]], dtype=np.float32)
    mins, maxs = record_extrema(x, 2)
    assert mins.tolist() == [-2.0, -1.0] and maxs.tolist() == [3.0, 7.0]
    assert mins.dtype == maxs.dtype == np.float64
    x[0, 0, 1] = np.nan
    x3 = np.concatenate([x, np.full((1, 2, 2), np.nan, np.float32)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an all-NaN record gives NaN without a warning
        mins, maxs = record_extrema(x3, 3)
    assert mins[:2].tolist() == [0.5, -1.0] and maxs[:2].tolist() == [3.0, 7.0]
    assert np.isnan(mins[2]) and np.isnan(maxs[2]) and mins.dtype == maxs.dtype == np.float64


def test_minmax_observer():
    o = MinMaxObserver()
    assert o.min == math.inf and o.max == -math.inf and o.seen is False
    o.update(np.array([np.nan]), np.array([np.nan]))  # an all-NaN record changes nothing
    assert o.seen is False and o.min == math.inf
    o.update(np.array([1.0, np.nan, 2.0]), np.array([4.0, np.nan, 3.0]))
    assert (o.min, o.max, o.seen) == (1.0, 4.0, True)
    o.update(np.array([-5.0]), np.array([0.0]))
    o.update(np.array([0.0]), np.array([9.0]))
    assert (o.min, o.max) == (-5.0, 9.0) and isinstance(o.min, float)


def test_extrema_observer_keeps_every_record_as_float32():
    o = ExtremaObserver()
    assert o.count == 0 and o.mins.size == 0 and o.maxs.size == 0
    rng = np.random.default_rng(0)
    all_mins, all_maxs = [], []
    for size in (1, 63, 1, 70, 200, 5):
        mins = rng.standard_normal(size)
        maxs = mins + 1.0
        mins[::7] = np.nan  # records without a finite value are dropped, their max with them
        o.update(mins, maxs)
        keep = ~np.isnan(mins)
        all_mins += mins[keep].tolist()
        all_maxs += maxs[keep].tolist()
    assert o.count == len(all_mins)
    assert o.mins.dtype == o.maxs.dtype == np.float32
    np.testing.assert_array_equal(o.mins, np.float32(all_mins))
    np.testing.assert_array_equal(o.maxs, np.float32(all_maxs))
    big = ExtremaObserver()  # more records at once than twice the room: grown to fit them
    big.update(np.arange(300.0), np.arange(300.0) + 0.5)
    assert big.count == 300 and big.mins[-1] == 299.0 and big.maxs[0] == 0.5


def test_histogram_observer_bins_and_edges():
    with pytest.raises(ValueError, match=r"^histogram bins must be odd and >= 3, got 4$"):
        HistogramObserver(1.0, 4)
    with pytest.raises(ValueError, match=r"^histogram bins must be odd and >= 3, got 1$"):
        HistogramObserver(1.0, 1)
    assert HistogramObserver(1.0, 3).bins == 3
    assert HistogramObserver(0.0, 3).bound == 1.0 and HistogramObserver(-2.0, 3).bound == 1.0
    assert HistogramObserver(0.25, 3).bound == 0.25
    h = HistogramObserver(2.5, 5)
    assert h.edges.tolist() == [-2.5, -1.5, -0.5, 0.5, 1.5, 2.5] and h.counts.dtype == np.int64
    h.update(np.array([-2.5, -1.5, -1.6, 0.49, 0.5, 2.5, 9.0, -9.0, np.nan], dtype=np.float32))
    # [-2.5, -1.5): -2.5, -1.6, -9 clipped; [-1.5, -0.5): -1.5; [-0.5, 0.5): 0.49; [0.5, 1.5): 0.5;
    # [1.5, 2.5]: 2.5 and 9 clipped
    assert h.counts.tolist() == [3, 1, 1, 1, 2]
    h.update(np.array([[0.0, 0.0]]))
    assert h.counts.tolist() == [3, 1, 3, 1, 2]


def test_histogram_observer_against_numpy():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 50)).astype(np.float32)
    bound = float(np.abs(x).max()) * 0.8
    h = HistogramObserver(bound, 101)
    for record in x:
        h.update(record)
    np.testing.assert_array_equal(h.counts, histogram_golden(x, bound, 101))
    s = shifted(x, bound)
    h2 = HistogramObserver(bound, 101)
    h2.fold_shifted(s)
    np.testing.assert_array_equal(h2.counts, h.counts)


def test_shifted_drops_nan_and_moves_the_left_edge_to_zero():
    x = np.array([[1.5, np.nan], [-2.0, np.inf]], dtype=np.float32)
    s = shifted(x, 2.0)
    assert s.dtype == np.float64 and s.tolist() == [3.5, 0.0, math.inf]
    assert np.isnan(x[0, 1]) and x[0, 0] == 1.5  # the input is untouched
    y = np.array([1.0, 2.0])
    assert shifted(y, 1.0).tolist() == [2.0, 3.0] and y.tolist() == [1.0, 2.0]


def test_magnitude_histogram_observer_is_ort_histogram_of_all_records():
    rng = np.random.default_rng(6)
    records = [rng.standard_normal((3, 4)).astype(np.float32) * (i + 1) for i in range(5)]
    magnitudes = np.abs(np.concatenate([r.ravel() for r in records]))
    o = MagnitudeHistogramObserver(float(magnitudes.min()), float(magnitudes.max()), bins=16)
    for r in records:
        o.update(r)
    want, edges = np.histogram(magnitudes, 16, (magnitudes.min(), magnitudes.max()))
    np.testing.assert_array_equal(o.counts, want)
    assert o.edges.dtype == np.float32 and o.counts.dtype == np.int64
    np.testing.assert_array_equal(o.edges, edges.astype(np.float32))
    assert MagnitudeHistogramObserver(0.0, 1.0).counts.size == 2048
    assert o.range == (np.float32(magnitudes.min()), np.float32(magnitudes.max()))


def test_magnitude_minimum():
    x = np.array([[3.0, 1.5], [2.0, np.nan]])
    assert magnitude_minimum(x, np.array([1.5, 2.0]), np.array([3.0, 2.0])) == 1.5  # all >= 0: the min
    assert magnitude_minimum(-x, np.array([-3.0, -2.0]), np.array([-1.5, -2.0])) == 1.5  # all <= 0: -max
    mixed = np.array([[-3.0, 0.25], [np.nan, -0.5]])
    assert magnitude_minimum(mixed, np.array([-3.0, -0.5]), np.array([0.25, -0.5])) == 0.25
    assert magnitude_minimum(np.array([0.0, 4.0]), np.array([0.0]), np.array([4.0])) == 0.0
    assert magnitude_minimum(np.array([-4.0, 0.0]), np.array([-4.0]), np.array([0.0])) == 0.0


# --- candidates.py ------------------------------------------------------------------------------


def test_ort_percentile_range_hand_worked():
    edges = np.float32([0.0, 1.0, 2.0, 3.0, 4.0])
    counts = np.array([90, 5, 4, 1])
    # cumulative shares 0.90, 0.95, 0.99, 1.0: 95 % is reached in bin 1 (lower edge 1), 96 % in bin 2
    assert ort_percentile_range(counts, edges, -10.0, 10.0, 95.0) == (-1.0, 1.0)
    assert ort_percentile_range(counts, edges, -10.0, 10.0, 96.0) == (-2.0, 2.0)
    assert ort_percentile_range(counts, edges, -10.0, 10.0, 90.0) == (-0.0, 0.0)
    assert ort_percentile_range(counts, edges, -0.5, 10.0, 99.5) == (-0.5, 3.0)  # clipped to observed
    assert ort_percentile_range(counts, edges, -9.0, 2.5, 99.5) == (-3.0, 2.5)
    assert ort_percentile_range(counts, edges, -9.0, 2.5) == (-3.0, 2.5)  # 99.999 %: the last bin
    # compared in float32: an observed bound that float32 rounds is rounded
    lo, hi = ort_percentile_range(counts, edges, -0.1, 0.1, 96.0)
    assert (lo, hi) == (float(np.float32(-0.1)), float(np.float32(0.1)))
    assert ORT_PERCENTILE == 99.999


def _stats(x: np.ndarray) -> TensorStats:
    """The statistics auto gathers, folded record by record."""
    mins, maxs = x.reshape(len(x), -1).min(axis=1), x.reshape(len(x), -1).max(axis=1)
    per_record = ExtremaObserver()
    per_record.update(mins.astype(np.float64), maxs.astype(np.float64))
    bound = float(np.abs(x).max())
    kl, mse = HistogramObserver(bound, 101), HistogramObserver(bound, MSE_BINS)
    mags = np.abs(x)
    magnitude = MagnitudeHistogramObserver(float(mags.min()), float(mags.max()), 64)
    for record in x:
        kl.update(record)
        mse.update(record)
        magnitude.update(record)
    return TensorStats((float(x.min()), float(x.max())), per_record, kl, mse, magnitude)


def test_candidate_ranges_are_each_methods_range():
    rng = np.random.default_rng(12)
    x = (rng.standard_normal((40, 30)) * 1.5 + 0.5).astype(np.float32)
    x[17, 3] = 25.0
    stats = _stats(x)
    options = CandidateOptions(0, 255, percentiles=(2.0, 97.0), moving_average=(8, 0.3), quantized_bins=21)
    got = candidate_ranges(stats, options)
    assert list(got) == list(CANDIDATES) == ["minmax", "percentile", "moving-average", "kl", "mse", "ort-percentile"]
    lo, hi = float(x.min()), float(x.max())
    mins, maxs = np.float32(x.min(axis=1)), np.float32(x.max(axis=1))
    assert got["minmax"] == (lo, hi)
    assert got["percentile"] == pytest.approx((one_percentile_golden(mins, 2.0), one_percentile_golden(maxs, 97.0)))
    want = (moving_average_golden(mins, True, 8, 0.3), moving_average_golden(maxs, False, 8, 0.3))
    assert got["moving-average"] == pytest.approx(want)
    counts = histogram_golden(x, 25.0, 101).astype(np.float64)
    divergence = _all_windows(counts, 21)
    t, _ = _first_minimum(divergence, divergence, np.linspace(-25.0, 25.0, 102), 50)
    assert got["kl"] == pytest.approx((max(lo, -t), min(hi, t)))
    assert got["kl"][1] < hi  # the outlier is clipped
    mse = histogram_golden(x, 25.0, MSE_BINS)
    assert got["mse"] == pytest.approx(mse_golden(mse, np.linspace(-25.0, 25.0, MSE_BINS + 1), lo, hi, 0, 255))
    mags = np.abs(x).ravel()
    share = np.cumsum(np.histogram(mags, 64, (mags.min(), mags.max()))[0]) / mags.size
    edges = np.histogram(np.empty(0, np.float32), 64, (np.float32(mags.min()), np.float32(mags.max())))[1]
    t = float(np.float32(edges[np.argmax(share >= 0.99999)]))
    assert got["ort-percentile"] == (max(-t, float(np.float32(lo))), min(t, float(np.float32(hi))))
    assert all(type(v) is float for pair in got.values() for v in pair)


def test_candidate_options_defaults():
    o = CandidateOptions(-128, 127)
    assert (o.qmin, o.qmax, o.percentiles, o.moving_average, o.quantized_bins) == (
        -128,
        127,
        (1.0, 99.0),
        (16, 0.1),
        255,
    )
    assert MSE_BINS == 2047


# --- options.py ---------------------------------------------------------------------------------


def test_calibration_options_defaults():
    c = CalibrationOptions()
    assert (c.method, c.activation_type, c.weight_type, c.per_channel, c.power2) == (
        "minmax",
        "uint8",
        "int8",
        False,
        False,
    )
    assert (c.percentiles, c.moving_average, c.bins, c.quantized_bins, c.quant_format) == (
        (1.0, 99.0),
        (16, 0.1),
        None,
        255,
        "qdq",
    )
    assert METHODS == ("minmax", "moving-average", "percentile", "kl", "mse", "auto")
    assert QTYPES == {"uint8": (0, 255), "int8": (-128, 127)}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"quant_format": "QDQ"}, "quantization format must be one of qdq, qoperator, got 'QDQ'"),
        (
            {"method": "entropy"},
            "unknown calibration method 'entropy'; expected one of minmax, moving-average, percentile, kl, mse, auto",
        ),
        ({"activation_type": "int16"}, "activation type must be uint8 or int8, got 'int16'"),
        ({"weight_type": "uint4"}, "weight type must be uint8 or int8, got 'uint4'"),
        ({"percentiles": (-1.0, 99.0)}, "percentiles must satisfy 0 <= min < max <= 100, got (-1.0, 99.0)"),
        ({"percentiles": (50.0, 50.0)}, "percentiles must satisfy 0 <= min < max <= 100, got (50.0, 50.0)"),
        ({"percentiles": (1.0, 100.5)}, "percentiles must satisfy 0 <= min < max <= 100, got (1.0, 100.5)"),
        ({"moving_average": (0, 0.1)}, "moving average needs batch >= 1 and 0 <= constant <= 1, got (0, 0.1)"),
        ({"moving_average": (16, -0.1)}, "moving average needs batch >= 1 and 0 <= constant <= 1, got (16, -0.1)"),
        ({"moving_average": (16, 1.5)}, "moving average needs batch >= 1 and 0 <= constant <= 1, got (16, 1.5)"),
        ({"bins": 2}, "histogram bins must be odd and >= 3, got 2"),
        ({"bins": 1}, "histogram bins must be odd and >= 3, got 1"),
        ({"bins": 100}, "histogram bins must be odd and >= 3, got 100"),
    ],
)
def test_calibration_options_refusals(kwargs, message):
    with pytest.raises(InputError) as info:
        CalibrationOptions(**kwargs)
    assert str(info.value) == message


def test_calibration_options_accept_the_bounds():
    """The edges of each range are valid values, kept as given (a refusal raises here)."""
    low = CalibrationOptions(percentiles=(0.0, 100.0), moving_average=(1, 0.0), bins=3, quant_format="qoperator")
    assert (low.percentiles, low.moving_average, low.bins, low.quant_format) == ((0.0, 100.0), (1, 0.0), 3, "qoperator")
    high = CalibrationOptions(method="auto", moving_average=(1, 1.0), activation_type="int8", weight_type="uint8")
    assert (high.moving_average, high.activation_type, high.weight_type) == ((1, 1.0), "int8", "uint8")
    assert [CalibrationOptions(method=method).method for method in METHODS] == list(METHODS)


def test_histogram_bins():
    assert CalibrationOptions(method="kl").histogram_bins == 8001
    assert CalibrationOptions(method="mse").histogram_bins == 2047
    assert CalibrationOptions(method="minmax").histogram_bins == 2047
    assert CalibrationOptions(method="kl", bins=11).histogram_bins == 11
    assert CalibrationOptions(method="mse", bins=11).histogram_bins == 11


def test_calibration_result_to_dict():
    result = CalibrationResult("kl", 3, {"a": (np.float32(-1.5), np.float64(2.0))}, {"a": (-2, 3)})
    d = result.to_dict()
    assert d == {"method": "kl", "records": 3, "ranges": {"a": [-1.5, 2.0]}, "observed": {"a": [-2.0, 3.0]}}
    assert all(type(v) is float for v in d["ranges"]["a"] + d["observed"]["a"])
    assert json.dumps(d)  # plain JSON
    with_selection = CalibrationResult("auto", 1, {}, {}, {"a": {"winner": "kl"}}, model=b"x", model_key=(1,))
    assert with_selection.to_dict()["selection"] == {"a": {"winner": "kl"}} and "model" not in with_selection.to_dict()
    assert "model_key" not in with_selection.to_dict()
    assert CalibrationResult("minmax", 0, {}).observed == {} and CalibrationResult("minmax", 0, {}).selection is None
    assert with_selection == CalibrationResult("auto", 1, {}, {}, {"a": {"winner": "kl"}})  # model not compared
    assert "model=" not in repr(with_selection)


def test_written_key(tmp_path):
    c = CalibrationOptions(method="auto")
    key = written_key(tmp_path / "m.onnx", c, ["a", "b"])
    assert key == (str((tmp_path / "m.onnx").resolve()), c, ("a", "b"))
    assert written_key(str(tmp_path / "m.onnx"), c, None) == (str((tmp_path / "m.onnx").resolve()), c, ())


# --- calibrator.py ------------------------------------------------------------------------------


def tiny_model(path: Path | None = None) -> onnx.ModelProto:
    """x[N, 4] -> m = x * 2 -> r = Relu(m); s = Shape(x) (int64); c = Constant; l = Log(-1 - |x|): NaN."""
    nodes = [
        helper.make_node("Mul", ["x", "two"], ["m"], name="mul"),
        helper.make_node("Relu", ["m"], ["r"], name="relu"),
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.float32([1.0]), "cv")),
        helper.make_node("Abs", ["x"], ["a"], name="abs"),
        helper.make_node("Sub", ["c", "a"], ["d"], name="sub"),  # 1 - |x|
        helper.make_node("Sub", ["d", "two"], ["e"], name="sub2"),  # -1 - |x| < 0
        helper.make_node("Log", ["e"], ["l"], name="log"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [
            helper.make_tensor_value_info("r", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
            helper.make_tensor_value_info("l", TensorProto.FLOAT, ["N", 4]),
        ],
        [numpy_helper.from_array(np.float32([2.0]), "two")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if path is not None:
        onnx.save(model, str(path))
    return model


def relu_model(path: Path) -> Path:
    """x[N, 4] -> m = x * 2 -> r = Relu(m) -> y = MatMul(r, w)."""
    w = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Mul", ["x", "two"], ["m"], name="mul"),
        helper.make_node("Relu", ["m"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w"], ["y"], name="mm"),
    ]
    graph = helper.make_graph(
        nodes,
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(np.float32([2.0]), "two"), numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """40 records of shape [1, 4] with one spike, saved as .npz."""
    rng = np.random.default_rng(21)
    x = rng.standard_normal((40, 1, 4)).astype(np.float32)
    x[9, 0, 2] = 12.0
    root = tmp_path_factory.mktemp("records")
    np.savez(root / "calib.npz", x=x)
    return root / "calib.npz", x


def test_calibration_tensors_are_float_inputs_and_outputs_in_graph_order():
    model = tiny_model()
    assert calibration_tensors(model) == ["x", "m", "r", "a", "d", "e", "l"]  # no int64 s, no Constant c


def test_a_tensor_never_finite_is_refused_by_name(records, tmp_path):
    path = tiny_model(tmp_path / "tiny.onnx")
    with pytest.raises(InputError) as info:
        compute_ranges(path, records[0])
    assert str(info.value) == "tensor(s) ['l'] held no finite value on any record; cannot calibrate them"
    result = compute_ranges(path, records[0], tensors=["x", "m"])  # the NaN tensor left out
    assert list(result.ranges) == ["x", "m"] and result.records == 40


@pytest.fixture(scope="module")
def relu(tmp_path_factory):
    return relu_model(tmp_path_factory.mktemp("relu") / "relu.onnx")


def _expected_tensors(x: np.ndarray) -> dict[str, np.ndarray]:
    m = x * np.float32(2.0)
    return {"x": x, "m": m, "r": np.maximum(m, 0)}


def test_minmax_percentile_and_moving_average_ranges(relu, records):
    data, x = records
    values = _expected_tensors(x)
    minmax = compute_ranges(relu, data, CalibrationOptions())
    assert minmax.method == "minmax" and minmax.records == 40
    assert set(minmax.ranges) == {"x", "m", "r", "y"}
    for name, v in values.items():
        assert minmax.ranges[name] == (float(v.min()), float(v.max())) == minmax.observed[name]
    options = CalibrationOptions(method="percentile", percentiles=(5.0, 90.0))
    result = compute_ranges(relu, data, options)
    for name, v in values.items():
        mins, maxs = v.reshape(40, -1).min(axis=1), v.reshape(40, -1).max(axis=1)
        want = (one_percentile_golden(mins, 5.0), one_percentile_golden(maxs, 90.0))
        assert result.ranges[name] == pytest.approx(want, rel=1e-6), name
        assert result.observed[name] == (float(v.min()), float(v.max()))
    options = CalibrationOptions(method="moving-average", moving_average=(6, 0.25))
    result = compute_ranges(relu, data, options)
    for name, v in values.items():
        mins, maxs = v.reshape(40, -1).min(axis=1), v.reshape(40, -1).max(axis=1)
        want = (moving_average_golden(mins, True, 6, 0.25), moving_average_golden(maxs, False, 6, 0.25))
        assert result.ranges[name] == pytest.approx(want, rel=1e-6), name


def test_kl_and_mse_ranges_from_the_histogram_of_every_record(relu, records):
    data, x = records
    values = _expected_tensors(x)
    kl = compute_ranges(relu, data, CalibrationOptions(method="kl", bins=101, quantized_bins=21))
    mse = compute_ranges(relu, data, CalibrationOptions(method="mse", bins=61, activation_type="int8"))
    for name, v in values.items():
        lo, hi = float(v.min()), float(v.max())
        bound = max(abs(lo), abs(hi))
        counts = histogram_golden(v, bound, 101).astype(np.float64)
        divergence = _all_windows(counts, 21)
        t, _ = _first_minimum(divergence, divergence, np.linspace(-bound, bound, 102), 50)
        assert kl.ranges[name] == pytest.approx((max(lo, -t), min(hi, t)), rel=1e-6), name
        assert kl.observed[name] == (lo, hi)
        want = mse_golden(histogram_golden(v, bound, 61), np.linspace(-bound, bound, 62), lo, hi, -128, 127)
        assert mse.ranges[name] == pytest.approx(want, rel=1e-6), name
    assert kl.ranges["x"][1] < float(x.max())  # the spike is clipped


def test_the_histogram_spans_the_larger_magnitude_of_either_end(relu, tmp_path):
    """T = max(|min|, |max|): a tensor whose min is the larger magnitude gets bins over [min, -min]."""
    x = np.linspace(-8.0, 1.0, 40 * 4, dtype=np.float32).reshape(40, 1, 4)
    np.savez(tmp_path / "neg.npz", x=x)
    result = compute_ranges(relu, tmp_path / "neg.npz", CalibrationOptions(method="mse", bins=9))
    want = mse_golden(histogram_golden(x, 8.0, 9), np.linspace(-8.0, 8.0, 10), -8.0, 1.0, 0, 255)
    assert result.ranges["x"] == pytest.approx(want, rel=1e-9)


def test_power2_is_applied_to_the_chosen_ranges(relu, records):
    data, _ = records
    plain = compute_ranges(relu, data, CalibrationOptions(method="percentile", activation_type="int8"))
    result = compute_ranges(relu, data, CalibrationOptions(method="percentile", activation_type="int8", power2=True))
    for name, (lo, hi) in plain.ranges.items():
        assert result.ranges[name] == R.power2_range(lo, hi, -128, 127)
    assert result.observed == plain.observed


def test_a_dataset_passed_in_is_left_open(relu, records):
    dataset = load_dataset(records[0])
    first = compute_ranges(relu, dataset)
    second = compute_ranges(relu, dataset)  # still readable
    assert first.ranges == second.ranges
    bound = bind_dataset(dataset, graph_inputs(onnx.load(str(relu))))
    assert compute_ranges(onnx.load(str(relu)), bound).ranges == first.ranges
    dataset.close()


def test_batches_start_with_one_record_and_shrink_to_the_byte_cap(relu, records, monkeypatch):
    data, _ = records
    sizes = []
    real = calibrator_module._passes

    def spy(*args):
        for values, count in real(*args):
            sizes.append((count, sorted(values)))
            yield values, count

    monkeypatch.setattr(calibrator_module, "_passes", spy)
    want = compute_ranges(relu, data, CalibrationOptions(method="kl", bins=101, quantized_bins=21))
    # one record first, then batches of the default batch size (8), in each of the two passes
    assert [c for c, _ in sizes] == [1, 8, 8, 8, 8, 7] * 2
    assert sizes[0][1] == ["m", "r", "x", "y"]
    sizes.clear()
    # x, m, r (4 float32 each) and y (3): 60 bytes per record; 130 bytes hold 2 records
    monkeypatch.setattr(calibrator_module, "BATCH_BYTES", 130)
    got = compute_ranges(relu, data, CalibrationOptions(method="kl", bins=101, quantized_bins=21))
    assert [c for c, _ in sizes] == [1] + [2] * 19 + [1] + [1] + [2] * 19 + [1]
    assert got.ranges == want.ranges
    sizes.clear()
    monkeypatch.setattr(calibrator_module, "BATCH_BYTES", 10)  # less than a record: one record a batch
    compute_ranges(relu, data, CalibrationOptions())
    assert [c for c, _ in sizes] == [1] * 40


def test_batch_size_bounds_the_batches(relu, records, monkeypatch):
    from pytest_qaccuracy.runtime import RuntimeOptions

    sizes = []
    real = calibrator_module._passes

    def spy(*args):
        for values, count in real(*args):
            sizes.append(count)
            yield values, count

    monkeypatch.setattr(calibrator_module, "_passes", spy)
    compute_ranges(relu, records[0], CalibrationOptions(), RuntimeOptions(batch_size=16))
    assert sizes == [1, 16, 16, 7]


def test_records_of_another_shape_start_a_batch():
    """x[N, K]: records of 4 then 6 features; each shape in batches of its own."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu")],
        "dyn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "K"])],
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, ["N", "K"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((1, 4 if i < 3 else 6)).astype(np.float32) for i in range(5)]
    xs[4][0, 5] = 40.0
    real = calibrator_module._passes

    class Records:
        """A bound dataset of records of two shapes."""

        def __len__(self):
            return len(xs)

        def iter_records(self):
            return iter({"x": x} for x in xs)

    runner = calibrator_module.OrtRunner(model, ["r"], calibrator_module.RuntimeOptions(), "calibration")
    batches = list(real(runner, Records(), 64, ["x", "r"]))
    assert [(c, v["x"].shape) for v, c in batches] == [(1, (1, 4)), (2, (2, 4)), (2, (2, 6))]
    assert [list(v) for v, _ in batches] == [["x", "r"]] * 3
    np.testing.assert_array_equal(batches[2][0]["r"], np.maximum(np.concatenate(xs[3:]), 0))


def _matmul_weight(path: Path) -> str:
    """The weight input of the model's MatMul: ``w`` kept in float, or its DequantizeLinear output."""
    (node,) = [n for n in onnx.load(str(path)).graph.node if n.op_type == "MatMul"]
    return node.input[1]


def test_calibrate_writes_the_model_with_the_ranges(relu, records, tmp_path, monkeypatch):
    from pytest_qaccuracy.runtime import RuntimeOptions

    made = _spy_runner(monkeypatch)
    out = tmp_path / "q.onnx"
    runtime = RuntimeOptions(batch_size=5)
    options = CalibrationOptions(method="percentile")
    result = calibrate(relu, records[0], out, options, runtime, nodes_to_exclude=["mm"])
    assert result.method == "percentile" and out.is_file() and made[0][1] is runtime
    assert _matmul_weight(out) == "w"  # mm kept in float
    scales = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(out)).graph.initializer}
    lo, hi = result.ranges["x"]
    assert scales["x_scale"] == pytest.approx((max(hi, 0) - min(lo, 0)) / 255, rel=1e-6)
    assert result == compute_ranges(relu, records[0], options)
    default = calibrate(relu, records[0], tmp_path / "d.onnx")
    assert default.method == "minmax" and _matmul_weight(tmp_path / "d.onnx") == "w_DequantizeLinear_Output"
    assert made[-1][1] == RuntimeOptions()


# --- reader.py ----------------------------------------------------------------------------------


def test_dataset_reader(relu, records):
    data, x = records
    with pytest.raises(ValueError, match=r"^DatasetReader needs the model to check the records against$"):
        DatasetReader(data)
    reader = DatasetReader(data, relu)
    assert len(reader) == 40
    first = reader.get_next()
    assert list(first) == ["x"] and np.array_equal(first["x"], x[0])
    assert np.array_equal(reader.get_next()["x"], x[1])
    reader.rewind()
    assert np.array_equal(reader.get_next()["x"], x[0])
    reader.set_range(38, 100)
    assert np.array_equal(reader.get_next()["x"], x[38])
    assert np.array_equal(reader.get_next()["x"], x[39])
    assert reader.get_next() is None
    reader.set_range(-5, 2)
    got = [reader.get_next() for _ in range(3)]
    assert np.array_equal(got[0]["x"], x[0]) and np.array_equal(got[1]["x"], x[1]) and got[2] is None
    proto = onnx.load(str(relu))
    dataset = load_dataset(data)
    by_proto = DatasetReader(dataset, proto)
    assert len(by_proto) == 40 and np.array_equal(by_proto.get_next()["x"], x[0])
    bound = bind_dataset(dataset, graph_inputs(proto))
    assert DatasetReader(bound).bound is bound
    assert DatasetReader(str(data), str(relu)).get_next()["x"].shape == (1, 4)


# --- cache.py -----------------------------------------------------------------------------------


def test_content_key_changes_with_every_input(relu, records, tmp_path):
    data = records[0]
    base = content_key(relu, data, CalibrationOptions())
    assert len(base) == 64 and int(base, 16) >= 0
    assert content_key(relu, data, CalibrationOptions()) == base
    assert content_key(relu, data, CalibrationOptions(method="kl")) != base
    assert content_key(relu, data, CalibrationOptions(), ["mm"]) != base
    other = tmp_path / "other.npz"
    other.write_bytes(data.read_bytes())
    assert content_key(relu, other, CalibrationOptions()) != base  # the file's name counts
    same_name = tmp_path / "calib.npz"
    same_name.write_bytes(data.read_bytes())
    assert content_key(relu, same_name, CalibrationOptions()) == base  # its folder does not
    same_name.write_bytes(data.read_bytes() + b"\0")
    assert content_key(relu, same_name, CalibrationOptions()) != base
    model_copy = tmp_path / "model.onnx"
    model_copy.write_bytes(relu.read_bytes())
    assert content_key(model_copy, data, CalibrationOptions()) == base
    model_copy.write_bytes(relu.read_bytes() + b"\0")
    assert content_key(model_copy, data, CalibrationOptions()) != base


def test_content_key_of_a_folder_reads_every_file_by_relative_path(relu, tmp_path, monkeypatch):
    folder = tmp_path / "data"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.npy").write_bytes(b"one")
    (folder / "sub" / "b.npy").write_bytes(b"two" * 1000)
    key = content_key(relu, folder, CalibrationOptions())
    monkeypatch.setattr(cache_module, "CHUNK", 7)  # read in blocks: the same digest
    assert content_key(relu, folder, CalibrationOptions()) == key
    moved = tmp_path / "elsewhere" / "data"
    moved.parent.mkdir()
    folder.rename(moved)
    assert content_key(relu, moved, CalibrationOptions()) == key
    (moved / "sub" / "b.npy").rename(moved / "b.npy")
    assert content_key(relu, moved, CalibrationOptions()) != key
    (moved / "b.npy").rename(moved / "sub" / "b.npy")
    (moved / "sub" / "b.npy").write_bytes(b"two" * 999 + b"twx")
    assert content_key(relu, moved, CalibrationOptions()) != key


def test_content_key_hashes_the_bytes_then_the_settings(relu, tmp_path, monkeypatch):
    """The digest is sha256 over the model's bytes, each data file's name and bytes, then the
    settings as JSON (options, nodes kept in float, versions, algorithm): a new algorithm or version
    gives a new key."""
    from importlib.metadata import version

    import onnx
    import onnxruntime

    data = tmp_path / "d.npz"
    data.write_bytes(b"payload")
    options = CalibrationOptions(method="percentile", percentiles=(0.5, 99.5))
    key = content_key(relu, data, options, ["mm"])
    versions = [version("pytest-qaccuracy"), onnxruntime.__version__, onnx.__version__, np.__version__]
    settings = [dataclasses.asdict(options), ["mm"], versions, cache_module.ALGORITHM]
    expected = hashlib.sha256(relu.read_bytes() + b"d.npz" + b"payload" + json.dumps(settings).encode())
    assert key == expected.hexdigest()
    monkeypatch.setattr(cache_module, "ALGORITHM", cache_module.ALGORITHM + 1)
    assert content_key(relu, data, options, ["mm"]) != key
    monkeypatch.undo()
    monkeypatch.setattr(onnxruntime, "__version__", onnxruntime.__version__ + ".post1")
    assert content_key(relu, data, options, ["mm"]) != key


def test_content_key_reads_a_file_in_blocks(relu, tmp_path, monkeypatch):
    """Memory stays flat in the dataset's size: the bytes are hashed one block at a time."""
    data = tmp_path / "d.npz"
    data.write_bytes(bytes(range(256)) * 100)
    key = content_key(relu, data, CalibrationOptions())
    sizes = []
    opened = Path.open

    class Recorder:
        def __init__(self, handle) -> None:
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            self.handle.close()

        def read(self, size=-1):
            sizes.append(size)
            return self.handle.read(size)

    def recording_open(self, *args, **kwargs):
        handle = opened(self, *args, **kwargs)
        return Recorder(handle) if self in (relu, data) else handle

    monkeypatch.setattr(cache_module, "CHUNK", 1000)
    monkeypatch.setattr(Path, "open", recording_open)
    assert content_key(relu, data, CalibrationOptions()) == key
    assert set(sizes) == {1000}
    assert len(sizes) == -(-relu.stat().st_size // 1000) + 1 + 26 + 1  # each file's blocks, then an empty read


def test_content_key_refuses_a_missing_file(relu, tmp_path):
    with pytest.raises(InputError) as info:
        content_key(relu, tmp_path / "missing.npz", CalibrationOptions())
    assert str(info.value) == f"{tmp_path / 'missing.npz'}: not found"
    with pytest.raises(InputError) as info:
        content_key(tmp_path / "none.onnx", relu, CalibrationOptions())
    assert str(info.value) == f"{tmp_path / 'none.onnx'}: not found"


def test_calibrated_model_is_made_once_and_reused(relu, records, tmp_path, monkeypatch):
    folder = tmp_path / "deep" / "cache"
    options = CalibrationOptions(method="percentile")
    path, made = calibrated_model(relu, records[0], folder, options, nodes_to_exclude=["mm"])
    key = content_key(relu, records[0], options, ["mm"])
    assert made is True and path == folder / f"relu.percentile.{key[:16]}.onnx" and path.is_file()
    written = json.loads(path.with_suffix(".json").read_text())
    assert written["method"] == "percentile" and written["records"] == 40 and set(written["ranges"]) >= {"x", "m"}
    assert _matmul_weight(path) == "w"  # mm kept in float
    calls = []
    monkeypatch.setattr(cache_module, "calibrate", lambda *a: calls.append(a) or CalibrationResult("minmax", 0, {}))
    again = calibrated_model(relu, records[0], folder, options, nodes_to_exclude=["mm"])
    assert again == (path, False) and calls == []
    default_path, made = calibrated_model(str(relu), str(records[0]), str(folder))
    assert made is True and default_path.name.startswith("relu.minmax.")
    assert calls[0][3] == CalibrationOptions() and calls[0][5] is None


@pytest.mark.parametrize(("method", "passes"), [("minmax", 1), ("percentile", 1), ("kl", 2), ("mse", 2)])
def test_progress_counts_every_pass_on_one_line(relu, records, method, passes):
    from pytest_qaccuracy.data.progress import reporting

    progress = CallRecorder()
    with reporting(progress):
        compute_ranges(relu, records[0], CalibrationOptions(method=method, bins=31, quantized_bins=5))
    assert progress.calls[0] == ("start", ("calibrate", 40 * passes)) and progress.calls[-1] == ("finish", None)
    advances = [n for what, n in progress.calls if what == "advance"]
    assert advances == [1, 8, 8, 8, 8, 7] * passes
    assert [what for what, _ in progress.calls].count("start") == 1


def _spy_runner(monkeypatch) -> list[tuple]:
    """Record the arguments of every OrtRunner the calibrator makes."""
    made = []
    real = calibrator_module.OrtRunner

    def runner(proto, tensors, options, label):
        made.append((list(tensors), options, label))
        return real(proto, tensors, options, label)

    monkeypatch.setattr(calibrator_module, "OrtRunner", runner)
    return made


def test_auto_observes_one_record_at_a_time_unoptimized_and_hands_all_to_auto_ranges(relu, records, monkeypatch):
    """``auto``'s statistics come from the fp32 model run as onnxruntime's calibrators run it; what
    ``auto_ranges`` returns is the result (its ranges made power-of-two with ``power2``)."""
    from pytest_qaccuracy.analysis.calibration import auto
    from pytest_qaccuracy.runtime import RuntimeOptions

    data, x = records
    made = _spy_runner(monkeypatch)
    calls = []

    def fake(path, proto, bound, names, passes, calibration, options, nodes_to_exclude):
        batches = list(passes())
        calls.append(
            {
                "path": path,
                "file": Path(path).read_bytes(),
                "proto": proto.SerializeToString(),
                "records": len(bound),
                "names": names,
                "batches": [(count, sorted(values)) for values, count in batches],
                "x": np.concatenate([values["x"] for values, _ in batches]),
                "calibration": calibration,
                "options": options,
                "exclude": nodes_to_exclude,
            }
        )
        return {"x": (-1.25, 3.0), "m": (0.1, 0.2)}, {"x": (-2.0, 4.0)}, {"x": {"winner": "kl"}}, b"written"

    monkeypatch.setattr(auto, "auto_ranges", fake)
    runtime = RuntimeOptions(batch_size=16, threads=1)
    options = CalibrationOptions(method="auto")
    result = compute_ranges(relu, data, options, runtime, nodes_to_exclude=("mm",))
    (call,) = calls
    assert call["path"] == relu and call["proto"] == onnx.load(str(relu)).SerializeToString()
    assert call["records"] == 40 and call["names"] == ["x", "m", "r", "y"]
    assert call["batches"] == [(1, ["m", "r", "x", "y"])] * 40  # one record per run
    np.testing.assert_array_equal(call["x"], x.reshape(40, 4))
    assert call["calibration"] is options and call["options"] is runtime and call["exclude"] == ("mm",)
    assert made == [(["m", "r", "y"], RuntimeOptions(batch_size=1, threads=1, optimization="disable"), "calibration")]
    ranges, selection = {"x": (-1.25, 3.0), "m": (0.1, 0.2)}, {"x": {"winner": "kl"}}
    assert result == CalibrationResult("auto", 40, ranges, {"x": (-2.0, 4.0)}, selection)
    assert result.model == b"written" and result.model_key == written_key(relu, options, ("mm",))

    # power of two: the ranges as the model was not written with them, so no model
    calls.clear()
    options = CalibrationOptions(method="auto", power2=True)
    result = compute_ranges(relu, data, options)
    assert result.ranges == {"x": R.power2_range(-1.25, 3.0, 0, 255), "m": R.power2_range(0.1, 0.2, 0, 255)}
    assert result.model is None and result.model_key is None and result.selection == {"x": {"winner": "kl"}}
    assert calls[0]["options"] == RuntimeOptions() and calls[0]["exclude"] == ()

    # a ModelProto is written to a private file for auto_ranges, removed afterwards; no model kept
    calls.clear()
    proto = onnx.load(str(relu))
    result = compute_ranges(proto, data, CalibrationOptions(method="auto"))
    path = Path(calls[0]["path"])
    assert path.name == "model.onnx" and not path.exists() and path.parent.name.startswith("qaccuracy-calibrate-")
    assert onnx.load_from_string(calls[0]["file"]) == proto
    assert result.model is None and result.model_key is None and result.ranges["x"] == (-1.25, 3.0)


def test_other_methods_run_batches_with_the_given_options(relu, records, monkeypatch):
    from pytest_qaccuracy.runtime import RuntimeOptions

    made = _spy_runner(monkeypatch)
    runtime = RuntimeOptions(batch_size=3)
    compute_ranges(relu, records[0], CalibrationOptions(method="mse", bins=11), runtime)
    assert made == [(["m", "r", "y"], runtime, "calibration")]
    made.clear()
    result = compute_ranges(relu, records[0], CalibrationOptions(), tensors=["x"])  # inputs alone: nothing to run
    assert made == [([], RuntimeOptions(), "calibration")]
    assert result.ranges == {"x": (float(records[1].min()), float(records[1].max()))}


def test_a_model_onnxruntime_cannot_load_names_the_calibration(records):
    graph = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x"], ["y"], name="bad")],
        "bad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with pytest.raises(Exception, match=r"^calibration: onnxruntime cannot load the model \("):
        compute_ranges(model, records[0])


def test_unseen_tensors_are_named_five_at_most(records):
    """Six tensors that are NaN on every record: the first five are named."""
    nodes = [
        helper.make_node("Abs", ["x"], ["a"]),
        helper.make_node("Neg", ["a"], ["n"]),
        helper.make_node("Sub", ["n", "one"], ["e"]),  # -1 - |x| < 0
        helper.make_node("Log", ["e"], ["l0"]),
    ]
    nodes += [helper.make_node("Neg", [f"l{i}"], [f"l{i + 1}"]) for i in range(5)]
    graph = helper.make_graph(
        nodes,
        "nan",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("l5", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(np.float32([1.0]), "one")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with pytest.raises(InputError) as info:
        compute_ranges(model, records[0])
    assert str(info.value) == (
        "tensor(s) ['l0', 'l1', 'l2', 'l3', 'l4'] held no finite value on any record; cannot calibrate them"
    )


def test_passes_give_the_runner_each_batch_with_its_first_record_index(relu, records):
    """A runner that records what it is given: batches of consecutive records, each with its start."""
    data, x = records

    class Runner:
        def __init__(self) -> None:
            self.tensors = ["m"]
            self.starts: list[tuple[int, int]] = []

        def run(self, batch):
            self.starts.append((batch.start, len(batch)))
            return {"m": batch.stacked()["x"] * 2, "i": np.zeros(len(batch), np.int64)}

    proto = onnx.load(str(relu))
    bound = bind_dataset(load_dataset(data), graph_inputs(proto))
    runner = Runner()
    batches = list(calibrator_module._passes(runner, bound, 16, ["x", "m", "i"]))
    assert runner.starts == [(0, 1), (1, 16), (17, 16), (33, 7)]
    assert [count for _, count in batches] == [1, 16, 16, 7]
    assert all(list(values) == ["x", "m"] for values, _ in batches)  # floats only, in the order asked
    np.testing.assert_array_equal(np.concatenate([v["m"] for v, _ in batches]), x.reshape(40, 4) * 2)
    np.testing.assert_array_equal(np.concatenate([v["x"] for v, _ in batches]), x.reshape(40, 4))


def test_calibrate_with_auto_writes_the_model_auto_wrote(relu, records, tmp_path, monkeypatch):
    """The nodes kept in float reach both auto (which writes the model) and the writer, so the writer
    recognises auto's model and copies it."""
    from pytest_qaccuracy.analysis.calibration import auto
    from pytest_qaccuracy.runtime import RuntimeOptions

    seen = []

    def fake(path, proto, bound, names, passes, calibration, options, nodes_to_exclude):
        seen.append((options, nodes_to_exclude))
        ranges = {n: (-1.0, 1.0) for n in names}
        return ranges, ranges, {}, b"the model auto wrote"

    monkeypatch.setattr(auto, "auto_ranges", fake)
    runtime = RuntimeOptions(threads=1)
    out = tmp_path / "auto.onnx"
    calibrate(relu, records[0], out, CalibrationOptions(method="auto"), runtime, nodes_to_exclude=["mm"])
    assert out.read_bytes() == b"the model auto wrote" and [(o, list(n)) for o, n in seen] == [(runtime, ["mm"])]
    calibrate(relu, records[0], out, CalibrationOptions(method="auto"))
    assert out.read_bytes() == b"the model auto wrote" and seen[-1] == (RuntimeOptions(), ())
    calibrate(relu, records[0], out, CalibrationOptions(method="auto"), nodes_to_exclude=["mm"])
    assert out.read_bytes() == b"the model auto wrote"


def test_calibrated_model_passes_its_options_on(relu, records, tmp_path, monkeypatch):
    from pytest_qaccuracy.runtime import RuntimeOptions

    calls = []
    monkeypatch.setattr(cache_module, "calibrate", lambda *a: calls.append(a) or CalibrationResult("minmax", 0, {}))
    runtime = RuntimeOptions(threads=1)
    calibrated_model(relu, records[0], tmp_path, CalibrationOptions(method="kl"), runtime, ["mm"])
    calibrated_model(relu, records[0], tmp_path, CalibrationOptions(method="mse"), runtime)
    assert [(a[3].method, a[4], a[5]) for a in calls] == [("kl", runtime, ["mm"]), ("mse", runtime, None)]


def test_one_percentile_computes_in_float64():
    """float32 per-record extrema (as ExtremaObserver keeps them) are interpolated in float64."""
    assert R.one_percentile(np.float32([0.0, 1.0]), 100 / 3) == pytest.approx(1 / 3, rel=1e-15)


def test_magnitude_histogram_counts_float32_values():
    """onnxruntime histograms float32 values: a float64 value just below an edge that rounds onto it
    in float32 is counted in the bin above."""
    o = MagnitudeHistogramObserver(0.0, 1.0, bins=4)
    o.update(np.array([0.5 - 1e-12, 0.1]))
    assert o.counts.tolist() == [1, 0, 1, 0]


def test_mse_range_on_mirrored_and_small_ranges():
    """Clipping below the range costs as much as above it (the clamp at qmin), a range that does not
    reach 1 keeps its own max (the grid is widened to 0, not to 1), and all-positive values keep 0."""
    rng = np.random.default_rng(8)
    x = np.r_[rng.standard_normal(3000), [9.0, -2.5]]
    for values in (-x, x * 0.05, -x * 0.05, np.abs(x) + 5.0, -(np.abs(x) + 5.0)):
        bound = float(np.abs(values).max())
        hist = HistogramObserver(bound, 201)
        hist.update(values)
        lo, hi = float(values.min()), float(values.max())
        for qmin, qmax in QTYPES.values():
            want = mse_golden(hist.counts, hist.edges, lo, hi, qmin, qmax, 64)
            assert R.mse_range(hist.counts, hist.edges, lo, hi, qmin, qmax, 64) == pytest.approx(want, rel=1e-12)


def test_kl_coarse_search_with_nothing_finite_keeps_the_whole_range():
    assert R.kl_threshold(np.zeros(9), np.linspace(-4.5, 4.5, 10), 3, stride=2, exhaustive=-1) == (4.5, math.inf)


def _degenerate_histograms() -> list[np.ndarray]:
    """Histograms whose windows hit every case of the smoothing: values only outside small windows
    (Q all zero), one filled bin, a few far apart (a large smoothing shift)."""
    ends = np.zeros(129)
    ends[[0, 1, 127, 128]] = [3, 1, 2, 5]
    single = np.zeros(129)
    single[64] = 1
    sparse = np.zeros(2001)
    sparse[[3, 700, 1000, 1002, 1500, 1990]] = [1, 2, 1, 3, 1, 2]
    return [ends, single, sparse]


@pytest.mark.parametrize("which", range(3))
def test_kl_divergence_of_degenerate_windows_is_the_loops(which, monkeypatch):
    """Each window's divergence, undefined ones (inf) included, as MXNet's loop gives it: from the
    bin-by-bin pairs, and from the prefix sums with the series used for every shift or for none."""
    counts = _degenerate_histograms()[which]
    zero, qbins = counts.size // 2, 15
    halves = np.arange(7, zero + 1, max(1, (zero - 7) // 60))
    want = np.array([_window_kl(counts, int(i), qbins) for i in halves])
    filled = np.flatnonzero(counts)
    got = R._windows_kl(counts, np.r_[0.0, np.cumsum(counts)], filled, zero, halves, qbins)
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
    ok = np.isfinite(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=1e-9)
    for shift in (R.KL_SERIES_MAX_SHIFT, 10.0, -1.0):
        monkeypatch.setattr(R, "KL_SERIES_MAX_SHIFT", shift)
        got = R.WindowSums(counts).divergences(zero, halves, qbins)
        np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
        np.testing.assert_allclose(got[ok], want[ok], rtol=1e-8 if shift < 1.0 else 1e-6, atol=1e-12)


def test_a_window_whose_smoothing_empties_p_is_undefined():
    """One value in the middle of 12001 bins: a window of 2i+1 bins shifts P's one count by
    1e-4 * 2i, which reaches it at i = 5000: from there on the divergence is undefined (inf)."""
    counts = np.zeros(12001)
    counts[6000] = 1
    halves = np.array([10, 4999, 5001, 6000])
    want = [_window_kl(counts, int(i), 3) for i in halves]
    got = R._windows_kl(counts, np.r_[0.0, np.cumsum(counts)], np.array([6000]), 6000, halves, 3)
    assert np.isfinite(want).tolist() == [True, True, False, False] == np.isfinite(got).tolist()
    np.testing.assert_allclose(got[:2], want[:2], rtol=1e-9)
    sums = R.WindowSums(counts).divergences(6000, halves, 3)
    assert np.isfinite(sums).tolist() == [True, True, False, False]


@pytest.mark.parametrize("seed", [0, 5, 7, 11])
def test_kl_coarse_to_fine_on_more_histograms(seed):
    """The documented search on four more jagged histograms, every stride from 4 to 64."""
    counts, edges = _counts(seed, 1000)
    divergence = _all_windows(counts, 63)
    for stride in (4, 8, 16, 32, 64):
        want = _coarse_to_fine(divergence, edges, 512, 31, stride)
        got = R.kl_threshold(counts, edges, 63, stride=stride, exhaustive=0)
        assert got[0] == want[0] and got[1] == pytest.approx(want[1], rel=1e-8), stride


@pytest.mark.parametrize(("qbins", "windows"), [(67, 32), (63, 34)])
def test_kl_tries_every_window_when_there_are_at_most_eight_strides_of_them(qbins, windows):
    """129 bins, stride 4: 32 windows (8 strides) are all tried at once; 34 go coarse to fine."""
    for seed in range(12):
        counts, edges = _counts(seed, 300, bins=129)
        divergence = _all_windows(counts, qbins)
        assert len(divergence) == windows
        coarse = _coarse_to_fine(divergence, edges, 64, qbins // 2, 4, coarse=True)
        exhaustive = _first_minimum(divergence, divergence, edges, 64)
        got = R.kl_threshold(counts, edges, qbins, stride=4, exhaustive=0)
        assert got[0] == (exhaustive[0] if windows <= 32 else coarse[0])
        if coarse[0] != exhaustive[0]:
            return  # a histogram where the two differ was checked
    pytest.fail("no histogram where the coarse search differs")  # pragma: no cover
