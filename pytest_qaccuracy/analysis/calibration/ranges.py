"""Range-selection algorithms: pure functions over fixed-size statistics (no model, no data).

Every function here is vectorised numpy over a histogram or a vector of per-record extrema, and has
its formula in docs/calibration.md.
"""

from __future__ import annotations

import math

import numpy as np

#: TVM/MXNet KL defaults: 8001 histogram bins over [-t, t], 255 quantized bins.
KL_BINS = 8001
KL_QUANTIZED_BINS = 255
#: KL tries every KL_STRIDE-th window, then the windows around the best (see kl_threshold).
KL_STRIDE = 64
#: The exhaustive search runs when it visits at most this many (window, non-zero bin) pairs.
KL_EXHAUSTIVE = 1 << 20
#: Upper bound on the (window, non-zero bin) pairs of one vectorised step of the exhaustive search.
KL_PAIRS = 1 << 22
#: Smoothing of zero bins before the KL divergence (MXNet ``_smooth_distribution``).
KL_EPS = 1e-4


def one_percentile(values: np.ndarray, percent: float) -> float:
    """ONE record-minmax's percentile: sort, ``i = floor((n-1)p/100)``, interpolate ``v[i]..v[i+1]``."""
    if not 0.0 <= percent <= 100.0:
        raise ValueError(f"percentile must be within [0, 100], got {percent}")
    v = np.sort(np.asarray(values, dtype=np.float64).reshape(-1))
    if v.size == 0:
        raise ValueError("percentile of no values")
    if v.size == 1 or percent == 0.0:
        return float(v[0])
    if percent == 100.0:
        return float(v[-1])
    pos = (v.size - 1) * percent / 100.0
    i = math.floor(pos)
    return float(v[i] + (pos - i) * (v[i + 1] - v[i]))


def moving_average(extrema: np.ndarray, is_min: bool, batch: int = 16, constant: float = 0.1) -> float:
    """ONE's moving average of per-record minima (or maxima): batch extrema folded by an EMA.

    ``curr = batch_0``; for each later batch ``curr = curr * (1 - c) + batch_k * c``, where
    ``batch_k`` is the min (or max) of records ``16k .. 16k+15``.
    """
    v = np.asarray(extrema, dtype=np.float64).reshape(-1)
    chunks = [v[i : i + batch] for i in range(0, v.size, batch)]
    curr = None
    for chunk in chunks:
        value = float(chunk.min() if is_min else chunk.max())
        curr = value if curr is None else curr * (1.0 - constant) + value * constant
    if curr is None:
        raise ValueError("moving average of no values")
    return curr


def kl_threshold(
    hist: np.ndarray,
    edges: np.ndarray,
    quantized_bins: int = KL_QUANTIZED_BINS,
    stride: int = KL_STRIDE,
    exhaustive: int = KL_EXHAUSTIVE,
) -> tuple[float, float]:
    """The threshold ``t`` whose clipped, ``quantized_bins``-level distribution is closest in KL.

    ``hist`` is symmetric around zero: an odd number of bins over ``[-T, T]`` (``edges`` has one more
    entry). For each window of ``2i+1`` central bins (i from ``quantized_bins // 2`` to
    ``len(hist) // 2``): the reference P is the window with the outside counts added to its end
    bins; Q merges the window into ``quantized_bins`` groups (the last takes the remainder),
    spreads each group's count evenly over its bins where P is non-zero, and is zero where P is.
    Both are smoothed, and the window's right edge with the smallest ``KL(P || Q)`` wins (MXNet's
    algorithm as ported to TVM, github.com/apache/tvm/pull/3538).

    Windows are tried exhaustively, as TVM does, when that visits at most ``exhaustive``
    (:data:`KL_EXHAUSTIVE`) (window, non-zero bin) pairs: few values, or outliers far out, where the
    divergence jumps from one window to the next. Otherwise (a histogram dense over thousands of bins) every
    ``stride``-th window is tried first, then every ``stride/8``-th within ``stride`` of the two
    best, and so on down to every window: the divergence varies slowly at that scale but is jagged
    bin to bin, so the window found may not be the exhaustive search's (docs/calibration.md gives
    how close). ``stride=1`` always searches exhaustively.

    Returns:
        (threshold, divergence).
    """
    hist = np.asarray(hist, dtype=np.float64)
    n = hist.size
    if n % 2 == 0 or edges.size != n + 1:
        raise ValueError(f"expected an odd number of bins and bins+1 edges, got {n} and {edges.size}")
    zero = n // 2
    half = quantized_bins // 2
    if zero < half:
        raise ValueError(f"{n} bins are fewer than the {quantized_bins} quantized bins")
    cumsum = np.concatenate([[0.0], np.cumsum(hist)])
    windows = range(half, zero + 1)
    tried: dict[int, float] = {}
    sums: WindowSums | None = None

    def evaluate(wanted: list[int]) -> None:
        """The divergence of every window of ``wanted`` not tried yet, in one vectorised step."""
        nonlocal sums
        todo = sorted({i for i in wanted if i not in tried})
        if todo:
            sums = sums or WindowSums(hist)
            tried.update(zip(todo, sums.divergences(zero, np.array(todo), quantized_bins).tolist(), strict=True))

    filled = np.flatnonzero(hist)
    halves = np.arange(half, zero + 1)
    pairs = int(_inner(filled, zero, halves).sum())  # the exhaustive search's work
    if stride == 1 or pairs <= exhaustive:  # few values: the divergence jumps from window to window
        values = _windows_kl(hist, cumsum, filled, zero, halves, quantized_bins)
        if not np.isfinite(values).any():
            return float(edges[-1]), math.inf
        k = int(np.argmin(values))  # the first minimum: ties go to the narrower window
        return float(edges[zero + halves[k] + 1]), float(values[k])
    step = stride
    candidates = list(windows) if len(windows) <= 8 * step else [*windows[::step], windows[-1]]
    while step > 1 and len(candidates) > 8:  # zoom in: a step 8 times finer around the two best
        evaluate(candidates)
        best_two = sorted(set(candidates), key=tried.__getitem__)[:2]
        fine = max(1, step // 8)
        candidates = [i for c in best_two for i in range(max(half, c - step + 1), min(zero, c + step - 1) + 1, fine)]
        candidates += best_two
        step = fine
    best = (float(edges[-1]), math.inf)
    evaluate(candidates)
    for i in sorted({*candidates, *tried}):  # ties go to the narrower window, as in the exhaustive loop
        value = tried[i]
        if value < best[1]:
            best = (float(edges[zero + i + 1]), value)
    return best


def _windows_kl(
    hist: np.ndarray, cumsum: np.ndarray, filled: np.ndarray, zero: int, halves: np.ndarray, qbins: int
) -> np.ndarray:
    """:func:`_window_kl` of every window of ``halves`` at once, over (window, non-zero bin) pairs:
    numpy's work is the number of such pairs, so a sparse histogram is cheap to search exhaustively.
    Windows go in chunks of at most :data:`KL_PAIRS` pairs."""
    inner = _inner(filled, zero, halves)
    out = np.empty(halves.size)
    first = 0
    while first < halves.size:
        last = first + max(1, int(np.searchsorted(np.cumsum(inner[first:] + 2), KL_PAIRS, side="right")))
        out[first:last] = _pairs_kl(hist, cumsum, filled, zero, halves[first:last], qbins)
        first = last
    return out


def _inner(filled: np.ndarray, zero: int, halves: np.ndarray) -> np.ndarray:
    """The non-zero bins strictly inside each window (``filled``: the non-zero bins, sorted)."""
    return np.searchsorted(filled, zero + halves, side="left") - np.searchsorted(filled, zero - halves, side="right")


def _pairs_kl(
    hist: np.ndarray, cumsum: np.ndarray, filled: np.ndarray, zero: int, halves: np.ndarray, qbins: int
) -> np.ndarray:
    n, count = hist.size, halves.size
    starts, stops = zero - halves, zero + halves + 1
    sizes, widths = stops - starts, (stops - starts) // qbins
    lo = np.searchsorted(filled, starts, side="right")  # the non-zero bins strictly inside each window
    hi = np.searchsorted(filled, stops - 1, side="left")
    inner = hi - lo
    win = np.repeat(np.arange(count), inner)
    ramp = np.arange(win.size) - np.repeat(np.cumsum(inner) - inner, inner)
    pos = filled[np.repeat(lo, inner) + ramp]
    value = hist[pos].astype(np.float64)
    ends = np.r_[starts, stops - 1]  # the end bins take the counts outside the window (P only)
    end_values = np.r_[hist[starts] + cumsum[starts], hist[stops - 1] + cumsum[n] - cumsum[stops]]
    keep = end_values != 0
    win = np.r_[win, np.tile(np.arange(count), 2)[keep]]
    pos, value = np.r_[pos, ends[keep]], np.r_[value, end_values[keep]]
    group = np.minimum((pos - starts[win]) // widths[win], qbins - 1)
    bounds = np.minimum(np.arange(qbins + 1) * widths[:, None], sizes[:, None])
    bounds[:, -1] = sizes
    edges = cumsum[starts[:, None] + bounds]
    counts = np.diff(edges, axis=1)  # each group's count in the window, without the outside counts
    cell = win * qbins + group
    norms = np.bincount(cell, minlength=count * qbins)
    q = counts.reshape(-1)[cell] / norms[cell]
    nonzero = np.bincount(win, minlength=count)
    zeros_p = sizes - nonzero
    with np.errstate(divide="ignore", invalid="ignore"):
        ps = value - (KL_EPS * zeros_p / nonzero)[win]
        zeros_q = zeros_p + np.bincount(win, weights=q == 0, minlength=count)
        qs = np.where(q == 0, KL_EPS, q - (KL_EPS * zeros_q / (sizes - zeros_q))[win])
        bad = np.bincount(win, weights=(ps <= 0) | (qs <= 0), minlength=count) > 0
        bad |= (nonzero == 0) | (zeros_q >= sizes)
        sp = np.bincount(win, weights=ps, minlength=count) + zeros_p * KL_EPS
        sq = np.bincount(win, weights=qs, minlength=count) + zeros_p * KL_EPS
        terms = np.bincount(win, weights=np.where((ps > 0) & (qs > 0), ps * np.log(ps / qs), 0.0), minlength=count)
        kl = terms / sp + np.log(sq / sp)
    return np.where(bad, np.inf, kl)


#: windows whose smoothing shift ``a`` of P exceeds this are computed bin by bin (:func:`_pairs_kl`)
KL_SERIES_MAX_SHIFT = 0.01
#: terms of the series of :class:`WindowSums`: with ``a <= 0.01`` and counts >= 1 the rest is below 1e-24
KL_SERIES_TERMS = 10


class WindowSums:
    """Prefix sums of one histogram from which each window's ``KL(P || Q)`` (:func:`kl_threshold`)
    takes O(quantized bins) operations instead of one pass over the window's bins.

    Per window, the group sums of P and Q, the non-zero bins per group and the smoothing shifts
    ``a`` (P) and ``b`` (Q) come from prefix sums at the group bounds. Q is constant over a group's
    non-zero bins, so ``sum ps log qs`` is one term per group. ``sum (p - a) log(p - a)`` over the
    non-zero bins is ``sum p log p - a (log p + 1) + sum_m a^(m+1) / (m (m+1) p^m)`` from prefix sums
    of ``p log p``, ``log p`` and ``p^-m`` (counts are integers >= 1); the two end bins, which take the
    outside counts, are computed directly. A window with ``a`` above :data:`KL_SERIES_MAX_SHIFT`
    (far more empty bins than filled ones) is computed bin by bin instead. The values agree with the
    bin-by-bin computation to about 1e-10 relative.
    """

    def __init__(self, hist: np.ndarray):
        h = np.asarray(hist, dtype=np.float64)
        self.hist = h
        filled = h > 0
        safe = np.where(filled, h, 1.0)
        rows = np.empty((4 + KL_SERIES_TERMS, h.size + 1))
        rows[:, 0] = 0.0
        body = rows[:, 1:]
        body[0], body[1] = h, filled
        body[2] = np.where(filled, h * np.log(safe), 0.0)
        body[3] = np.where(filled, np.log(safe) + 1.0, 0.0)
        body[4] = np.where(filled, 1.0 / safe, 0.0)
        for m in range(1, KL_SERIES_TERMS):
            np.multiply(body[3 + m], body[4], out=body[4 + m])
        np.cumsum(rows, axis=1, out=rows)  # every prefix sum in one pass
        self.counts, self.nonzero, self.plogp, self.logp1 = rows[:4]  # logp1: sum of (log p + 1)
        self.inverse = list(rows[4:])
        self.filled = np.flatnonzero(filled)

    def divergences(self, zero: int, halves: np.ndarray, qbins: int) -> np.ndarray:
        """``KL(P || Q)`` of the windows of ``2i+1`` central bins, ``i`` in ``halves``; inf if undefined."""
        h, n = self.hist, self.hist.size
        start, stop = zero - halves, zero + halves + 1
        size = stop - start
        width = size // qbins
        bounds = np.minimum(np.arange(qbins + 1)[None, :] * width[:, None], size[:, None])
        bounds[:, -1] = size
        at = start[:, None] + bounds
        count = np.diff(self.counts[at], axis=1)  # each group's count in the window, without the outside
        filled = np.diff(self.nonzero[at], axis=1).astype(np.float64)  # its non-zero bins of P
        left, right = self.counts[start], self.counts[n] - self.counts[stop]
        first, last = h[start] + left, h[stop - 1] + right  # the end bins take the outside counts
        filled[:, 0] += (h[start] == 0) & (left > 0)
        filled[:, -1] += (h[stop - 1] == 0) & (right > 0)
        mass = count.copy()
        mass[:, 0] += left
        mass[:, -1] += right
        nonzero = filled.sum(axis=1)
        zeros_p = size - nonzero
        with np.errstate(divide="ignore", invalid="ignore"):
            a = KL_EPS * zeros_p / nonzero
            empty = np.where(count == 0, filled, 0.0).sum(axis=1)  # non-zero P bins where Q is zero
            zeros_q = zeros_p + empty
            b = KL_EPS * zeros_q / (size - zeros_q)
            spread = (count > 0) & (filled > 0)
            q = np.where(spread, count / np.maximum(filled, 1.0) - b[:, None], 1.0)
            bad = (nonzero == 0) | (zeros_q >= size) | (spread & (q <= 0)).any(axis=1)
            log_q = np.where(spread, np.log(np.where(q > 0, q, 1.0)), math.log(KL_EPS))
            cross = ((mass - filled * a[:, None]) * np.where(filled > 0, log_q, 0.0)).sum(axis=1)
            own = np.zeros(halves.size)
            for end in (first, last):
                ps = end - a
                bad |= (end > 0) & (ps <= 0)
                own += np.where(end > 0, ps * np.log(np.where(ps > 0, ps, 1.0)), 0.0)
            lo, hi = start + 1, stop - 1  # the bins between the two ends
            own += self.plogp[hi] - self.plogp[lo] - a * (self.logp1[hi] - self.logp1[lo])
            power = a.copy()
            for m, inverse in enumerate(self.inverse, start=1):
                power = power * a
                own += power / (m * (m + 1)) * (inverse[hi] - inverse[lo])
            sp = self.counts[n] - nonzero * a + zeros_p * KL_EPS  # KL of the normalised distributions
            sq = np.where(spread, count - filled * b[:, None], 0.0).sum(axis=1) + KL_EPS * (empty + zeros_p)
            kl = np.where(bad, np.inf, (own - cross) / sp + np.log(sq / sp))
        shifted = ~bad & (a > KL_SERIES_MAX_SHIFT)  # the series converges too slowly: bin by bin
        if shifted.any():
            kl[shifted] = _pairs_kl(h, self.counts, self.filled, zero, halves[shifted], qbins)
        return kl


#: (candidate, bin) pairs of one vectorised step of :func:`mse_range`
MSE_BLOCK = 1 << 15


def mse_range(
    hist: np.ndarray, edges: np.ndarray, lo: float, hi: float, qmin: int, qmax: int, candidates: int = 256
) -> tuple[float, float]:
    """The clipping range with the least expected squared quantization error over the histogram.

    Candidates are ``(max(lo, -t), min(hi, t))`` for ``t = T * j / candidates``, j = 1..candidates
    (T: the histogram's half width). Each bin's values are taken at the bin centre, quantized on the
    candidate's grid (onnxruntime's asymmetric scale and zero point for the range widened to include
    0, round half to even, clamp) and dequantized.
    """
    hist = np.asarray(hist, dtype=np.float64)
    centres = (edges[:-1] + edges[1:]) / 2.0
    span = float(edges[-1])
    best, best_err = (lo, hi), math.inf
    ts = span * np.arange(1, candidates + 1) / candidates
    los, his = np.maximum(lo, -ts), np.minimum(hi, ts)
    rmin, rmax = np.minimum(los, 0.0), np.maximum(his, 0.0)
    scales = (rmax - rmin) / (qmax - qmin)
    ok = scales > 0
    scales = np.where(ok, scales, 1.0)
    zps = np.clip(np.round(qmin - rmin / scales), qmin, qmax)
    filled = hist > 0  # empty bins add nothing to any candidate's error
    weights, values = hist[filled], centres[filled]
    tried = np.flatnonzero(ok)
    step = max(1, MSE_BLOCK // max(values.size, 1))
    for first in range(0, tried.size, step):  # candidates in blocks: (candidates, non-empty bins)
        j = tried[first : first + step]
        s, z = scales[j, None], zps[j, None]
        q = values / s  # then in place: round, + z, clamp, - z, * s, the error, squared
        np.round(q, out=q)
        q += z
        np.clip(q, qmin, qmax, out=q)
        q -= z
        q *= s
        np.subtract(values, q, out=q)
        err = np.square(q, out=q) @ weights
        k = int(np.argmin(err))  # the first minimum: ties go to the narrower range, as one by one
        if err[k] < best_err:
            best, best_err = (float(los[j[k]]), float(his[j[k]])), float(err[k])
    return best


def power2_range(lo: float, hi: float, qmin: int, qmax: int) -> tuple[float, float]:
    """The smallest range covering ``[lo, hi]`` (and 0) whose asymmetric grid step is a power of two.

    With ``s = 2**k`` and ``z = ceil(-min(lo,0) / s)`` steps below zero, the range is
    ``(-z*s, (qmax - qmin - z)*s)``; k starts at ``ceil(log2((hi - lo) / (qmax - qmin)))`` and grows
    until the range covers ``hi``. onnxruntime then derives scale ``s`` and zero point ``qmin + z``.
    """
    rmin, rmax = min(lo, 0.0), max(hi, 0.0)
    levels = qmax - qmin
    if rmax - rmin <= 0:
        return 0.0, 0.0
    k = math.ceil(math.log2((rmax - rmin) / levels))
    while True:
        s = 2.0**k
        z = math.ceil(-rmin / s)
        if z <= levels and (levels - z) * s >= rmax:
            return -z * s, (levels - z) * s
        k += 1


def power2_scale(absmax: float, qmax: int) -> float:
    """The smallest power of two ``s`` with ``absmax <= qmax * s`` (symmetric weights)."""
    if absmax <= 0:
        return 1.0
    return 2.0 ** math.ceil(math.log2(absmax / qmax))
