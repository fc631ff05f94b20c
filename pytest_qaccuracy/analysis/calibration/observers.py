"""Streaming statistics of one tensor over the records: what each calibration method needs, no more.

Observers fold one batch at a time (shape ``(records, ...)``) and keep fixed-size state, except
:class:`ExtremaObserver`, which keeps two float32 per record (ONE's percentile and moving average are
defined over the per-record minima and maxima, as record-minmax records them).
"""

from __future__ import annotations

import warnings

import numpy as np


def record_extrema(values: np.ndarray, records: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-record (min, max), ignoring NaN; a record with only NaN gives NaN."""
    flat = values.reshape(records, -1)
    if not np.isnan(flat).any():
        return flat.min(axis=1).astype(np.float64), flat.max(axis=1).astype(np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN records give NaN on purpose
        return np.nanmin(flat, axis=1).astype(np.float64), np.nanmax(flat, axis=1).astype(np.float64)


class MinMaxObserver:
    """Global min and max over every element of every record (NaN ignored)."""

    def __init__(self) -> None:
        self.min, self.max = np.inf, -np.inf

    def update(self, mins: np.ndarray, maxs: np.ndarray) -> None:
        if np.isfinite(mins).any():
            self.min = min(self.min, float(np.nanmin(mins)))
            self.max = max(self.max, float(np.nanmax(maxs)))

    @property
    def seen(self) -> bool:
        return bool(np.isfinite(self.min))


class ExtremaObserver:
    """Every record's min and max (float32, grown in chunks), for ONE's percentile and moving average."""

    def __init__(self) -> None:
        self._mins = np.empty(0, dtype=np.float32)
        self._maxs = np.empty(0, dtype=np.float32)
        self.count = 0

    def update(self, mins: np.ndarray, maxs: np.ndarray) -> None:
        keep = ~np.isnan(mins)
        mins, maxs = mins[keep], maxs[keep]
        need = self.count + mins.size
        if need > self._mins.size:
            size = max(need, 2 * self._mins.size, 64)
            self._mins = np.resize(self._mins, size)
            self._maxs = np.resize(self._maxs, size)
        self._mins[self.count : need], self._maxs[self.count : need] = mins, maxs
        self.count = need

    @property
    def mins(self) -> np.ndarray:
        return self._mins[: self.count]

    @property
    def maxs(self) -> np.ndarray:
        return self._maxs[: self.count]


class HistogramObserver:
    """A histogram of the values over the fixed symmetric range ``[-t, t]`` (an odd number of bins).

    ``t`` comes from a first pass (the global max of |x|), so bins never move and counts are exact:
    bin ``b`` holds the values in ``[-t + b*w, -t + (b+1)*w)``, ``w = 2t / bins``, the last bin closed.
    """

    def __init__(self, bound: float, bins: int) -> None:
        if bins < 3 or bins % 2 == 0:
            raise ValueError(f"histogram bins must be odd and >= 3, got {bins}")
        self.bound = bound if bound > 0 else 1.0
        self.bins = bins
        self.counts = np.zeros(bins, dtype=np.int64)

    @property
    def edges(self) -> np.ndarray:
        return np.linspace(-self.bound, self.bound, self.bins + 1)

    def update(self, values: np.ndarray) -> None:
        self.fold_shifted(shifted(values, self.bound))

    def fold_shifted(self, x: np.ndarray) -> None:
        """Count ``x = values + bound`` (float64, from :func:`shifted`): histograms of one tensor over
        the same bound share that copy (``auto`` folds the ``kl`` and ``mse`` histograms from one)."""
        index = (x * (self.bins / (2.0 * self.bound))).astype(np.int64)  # floor: x >= 0 but for rounding
        np.clip(index, 0, self.bins - 1, out=index)
        self.counts += np.bincount(index, minlength=self.bins)


class MagnitudeHistogramObserver:
    """onnxruntime's percentile histogram of |x| (``HistogramCollector.collect_absolute_value``), kept
    exactly while streaming: onnxruntime histograms every record's |x| at once into ``bins`` equal
    float32 bins over ``[min |x|, max |x|]``; with those bounds from a first pass, each record's counts
    over the same edges add up to the same histogram."""

    def __init__(self, smallest: float, largest: float, bins: int = 2048) -> None:
        self.range = (np.float32(smallest), np.float32(largest))
        self.counts = np.zeros(bins, dtype=np.int64)

    @property
    def edges(self) -> np.ndarray:
        """The edges as onnxruntime keeps them (numpy's for float32 data, then cast to float32)."""
        return np.histogram(np.empty(0, np.float32), self.counts.size, self.range)[1].astype(np.float32)

    def update(self, values: np.ndarray) -> None:
        magnitude = np.abs(np.asarray(values, dtype=np.float32).reshape(-1))
        self.counts += np.histogram(magnitude, self.counts.size, self.range)[0]


def magnitude_minimum(values: np.ndarray, mins: np.ndarray, maxs: np.ndarray) -> float:
    """min |x| over ``values`` (NaN ignored), from the records' extrema when every value has one sign."""
    lo, hi = float(np.nanmin(mins)), float(np.nanmax(maxs))
    if lo >= 0:
        return lo
    if hi <= 0:
        return -hi
    return float(np.nanmin(np.abs(values)))


def shifted(values: np.ndarray, bound: float) -> np.ndarray:
    """The finite-or-infinite values (NaN dropped) as float64, plus ``bound`` (a histogram's left edge
    moved to 0)."""
    x = values.astype(np.float64).reshape(-1)
    if np.isnan(x).any():
        x = x[~np.isnan(x)]
    x += bound
    return x
