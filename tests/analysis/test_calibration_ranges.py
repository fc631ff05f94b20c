"""Range algorithms against hand-worked values: ONE percentile and moving average, KL, MSE, power of two."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import entropy

from pytest_qaccuracy.analysis.calibration import (
    kl_threshold,
    moving_average,
    mse_range,
    one_percentile,
    power2_range,
    power2_scale,
)
from pytest_qaccuracy.analysis.calibration.observers import ExtremaObserver, HistogramObserver, record_extrema


def test_one_percentile_interpolates_between_neighbours():
    values = np.array([5.0, 1.0, 4.0, 2.0, 3.0])
    # sorted 1..5, (n-1)p/100 = 1.2 -> v[1] + 0.2 (v[2] - v[1]) = 2.2
    assert one_percentile(values, 30.0) == pytest.approx(2.2)
    assert one_percentile(values, 99.0) == pytest.approx(4.96)
    assert one_percentile(values, 0.0) == 1.0 and one_percentile(values, 100.0) == 5.0
    assert one_percentile(np.array([7.0]), 50.0) == 7.0
    rng = np.random.default_rng(0).standard_normal(101)
    assert one_percentile(rng, 1.0) == pytest.approx(np.percentile(rng, 1.0))  # numpy's "linear" method


def test_one_moving_average_batches_of_16_constant_0_1():
    minima = np.concatenate([np.full(16, -2.0), np.full(16, -1.0), np.array([-4.0, 0.0, 0.0])])
    minima[3] = -3.0  # batch 0 min is -3
    # curr = -3; then -3 * 0.9 + (-1) * 0.1 = -2.8; then -2.8 * 0.9 + (-4) * 0.1 = -2.92
    assert moving_average(minima, is_min=True) == pytest.approx(-2.92)
    maxima = np.concatenate([np.full(16, 1.0), np.full(4, 11.0)])
    assert moving_average(maxima, is_min=False) == pytest.approx(1.0 * 0.9 + 11.0 * 0.1)
    assert moving_average(maxima, is_min=False, batch=4, constant=0.5) == pytest.approx(
        ((1.0 * 0.5 + 1.0 * 0.5) * 0.5 + 1.0 * 0.5) * 0.5 * 0.5 + 0.25 * 1.0 + 11.0 * 0.5
    )


def _smoothed(p: list[float], eps: float = 1e-4) -> np.ndarray:
    p = np.array(p, dtype=np.float64)
    zeros = (p == 0).sum()
    return np.where(p == 0, eps, p - eps * zeros / (p.size - zeros))


def test_kl_threshold_on_a_hand_worked_histogram():
    """7 bins over [-3.5, 3.5], 3 quantized bins; P and Q for each window written out by hand."""
    hist = np.array([1, 0, 2, 8, 2, 0, 1])
    edges = np.linspace(-3.5, 3.5, 8)
    # window of 3 bins [2, 8, 2], outliers 1 and 1 on the ends: P = [3, 8, 3]; Q = the window itself
    kl_3 = entropy([3, 8, 3], [2, 8, 2])
    # window of 5 bins [0, 2, 8, 2, 0] -> P = [1, 2, 8, 2, 1]; groups of 1, 1, 3 bins: counts 0, 2, 10
    # spread over the non-zero bins of P: Q = [0, 2, 10/3, 10/3, 10/3], its zero smoothed
    kl_5 = entropy(_smoothed([1, 2, 8, 2, 1]), _smoothed([0, 2, 10 / 3, 10 / 3, 10 / 3]))
    # whole histogram: P = hist; groups of 2, 2, 3 bins: counts 1, 10, 3 over 1, 2, 2 non-zero bins
    kl_7 = entropy(_smoothed([1, 0, 2, 8, 2, 0, 1]), _smoothed([1, 0, 5, 5, 1.5, 0, 1.5]))
    expected = min([(kl_3, 1.5), (kl_5, 2.5), (kl_7, 3.5)])
    threshold, divergence = kl_threshold(hist, edges, quantized_bins=3)
    assert divergence == pytest.approx(expected[0], rel=1e-9)
    assert threshold == expected[1] == 1.5  # the outliers cost less clipped than spread out
    assert kl_3 < kl_7 < kl_5


def test_kl_keeps_the_whole_range_for_a_flat_histogram_and_clips_a_lone_outlier():
    edges = np.linspace(-10, 10, 202)
    flat = np.ones(201)
    assert kl_threshold(flat, edges, 21)[0] == pytest.approx(10.0)
    centres = (edges[:-1] + edges[1:]) / 2
    peaked = np.round(1e5 * np.exp(-(centres**2) / 2))  # a normal shape: merging bins loses it
    peaked[200] = 1
    threshold = kl_threshold(peaked, edges, 21)[0]
    assert 2.0 < threshold < 6.0


def test_mse_range_clips_outliers_and_beats_the_full_range():
    """A million normal values and one at 20: clipping it at ~4 costs ~16^2, a 25-wide grid ~1e6 * 0.1^2/12."""
    edges = np.linspace(-20, 20, 2002)
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.standard_normal(1_000_000), [20.0]])
    obs = HistogramObserver(20.0, 2001)
    obs.update(values)
    hist = obs.counts
    lo, hi = mse_range(hist, edges, values.min(), values.max(), 0, 255)
    assert 2.0 < hi < 10.0 and -10.0 < lo < -2.0

    def err(lo: float, hi: float) -> float:  # squared error of quantizing the actual values
        scale = (hi - lo) / 255
        zp = np.round(-lo / scale)
        q = np.clip(np.round(values / scale) + zp, 0, 255)
        return float(np.sum((values - (q - zp) * scale) ** 2))

    assert err(lo, hi) < err(values.min(), values.max()) / 2


def test_power2_ranges_give_power_of_two_steps():
    lo, hi = power2_range(-1.0, 3.0, 0, 255)
    # 4/255 -> 2^-5 = 0.03125; 32 steps below zero: (-1.0, 223 * 0.03125)
    assert (lo, hi) == (-1.0, 6.96875)
    assert power2_range(0.0, 6.2, 0, 255) == (0.0, 7.96875)
    assert power2_scale(1.0, 127) == 2.0**-6 and power2_scale(0.0, 127) == 1.0
    for a, b in [(-0.3, 0.1), (-5.0, 40.0), (0.0, 1e-3)]:
        lo, hi = power2_range(a, b, -128, 127)
        step = (hi - lo) / 255
        assert lo <= min(a, 0) and hi >= max(b, 0) and math.log2(step).is_integer()


def test_observers_stream_exact_statistics():
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    x[1, 2] = np.nan
    mins, maxs = record_extrema(x, 4)
    assert mins.tolist() == [0, 6, 12, 18] and maxs.tolist() == [5, 11, 17, 23]
    ext = ExtremaObserver()
    for _ in range(40):
        ext.update(mins, maxs)
    assert ext.count == 160 and ext.mins[-4:].tolist() == [0, 6, 12, 18]
    hist = HistogramObserver(3.0, 3)  # bins [-3,-1), [-1,1), [1,3]
    hist.update(np.array([-3.0, -1.0, 0.5, 1.0, 3.0, 7.0, np.nan]))
    assert hist.counts.tolist() == [1, 2, 3]
    np.testing.assert_array_equal(hist.counts, np.histogram([-3.0, -1.0, 0.5, 1.0, 3.0, 3.0], 3, (-3, 3))[0])
