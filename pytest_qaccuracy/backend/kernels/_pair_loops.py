"""The compiled loops of :mod:`~pytest_qaccuracy.backend.kernels.compiled_pairs` (imported only
where numba is installed: the ``compiled`` extra). numba compiles each on its first call in a
process for the types it is given and keeps the machine code in its cache (``__pycache__`` beside
this file, or ``NUMBA_CACHE_DIR``), so later processes load it.

How the loops stay vectorized: LLVM vectorizes a loop over a slice indexed by ``range`` (numba then
knows no index is negative); the same loop over flat indices with offsets stays scalar (1.0 ns per
evaluation against 0.15-0.2 on the bench nets), and so did a helper function for a row, inlined or
not, and one loop shared by unit and other strides (its slices then have no known layout).
"""

import numba
import numpy as np


@numba.njit(nogil=True, cache=True, boundscheck=False)
def pad(x, n, geometry, used, padded, row_max):
    """The ``used`` channels of record ``n`` of the flat input ``x`` into ``padded``, the zero point
    around them, and the largest value of each of their padded rows into ``row_max``."""
    channels, height, width, top, left, rows, cols = geometry[:7]
    zero = np.uint8(geometry[10])
    for c in used:
        plane = c * rows * cols
        for k in range(top * cols):
            padded[plane + k] = zero
        for k in range((top + height) * cols, rows * cols):
            padded[plane + k] = zero
        for r in range(height):
            dst = plane + (r + top) * cols
            src = ((n * channels + c) * height + r) * width
            for k in range(left):
                padded[dst + k] = zero
            for k in range(left + width, cols):
                padded[dst + k] = zero
            row, source = padded[dst + left : dst + left + width], x[src : src + width]
            for k in range(width):
                row[k] = source[k]
        for r in range(rows):
            line = padded[plane + r * cols : plane + (r + 1) * cols]
            top_value = np.uint8(0)
            for k in range(cols):
                top_value = max(top_value, line[k])
            row_max[c * rows + r] = top_value


@numba.njit(nogil=True, cache=True)
def quiet(top_a, top_b, wa, wb):
    """Whether no pair sum ``a wa + b wb`` with ``a <= top_a`` and ``b <= top_b`` (inputs are >= 0) can
    leave int16: its extremes are ``top_a wa+ + top_b wb+`` and ``top_a wa- + top_b wb-``."""
    high = top_a * max(wa, 0) + top_b * max(wb, 0)
    low = top_a * min(wa, 0) + top_b * min(wb, 0)
    return high <= 32767 and low >= -32768


@numba.njit(nogil=True, cache=True, boundscheck=False)
def correct(
    x,
    geometry,
    first,
    second,
    w_first,
    w_second,
    column,
    used,
    out,
    ts,
    saturated,
    n0,
    n1,
    i0,
    i1,
    j0,
    padded,
    acc,
    row_max,
):
    """Add ``sat16(p) - p`` to ``out[n - n0, column[e], i - i0, j]`` (flat, element strides ``ts``)
    for records ``n0:n1``, output rows ``i0:i1``, the ``out_w`` columns from ``j0`` and every entry
    ``e`` (sorted by column): ``p = x_a w_first[e] + x_b w_second[e]``, ``x_a`` the padded input of
    channel ``first[e, 0]`` at row ``i * sh + first[e, 1]`` and column ``j * sw + first[e, 2]``,
    ``x_b`` alike from ``second``.

    ``geometry``: channels, height, width, top, left, padded rows and columns, sh, sw, out_w, zero
    point. ``saturated[n - n0]`` (when it has a row per record) counts the pair sums that change.
    ``padded``, ``acc`` and ``row_max`` are scratch: a padded record, an output channel's plane and
    the padded rows' largest values. A row (a plane at stride 1 below 32 outputs a row) none of
    whose pair sums can leave int16 by its two input rows' largest values is skipped.
    """
    rows, cols, sh, sw, out_w = geometry[5], geometry[6], geometry[7], geometry[8], geometry[9]
    plane = rows * cols
    lo, hi = np.int32(-32768), np.int32(32767)
    count = saturated.shape[0] > 0
    # rows of at least 32 outputs vectorize on their own (rows of 30-31, a padded row's interior, ran
    # at 0.8-0.9 ns an evaluation against 0.15); shorter ones run as one loop over a plane of the
    # padded width
    flat = sh == 1 and sw == 1 and not count and out_w < 32
    span = (i1 - i0 - 1) * cols + out_w  # the flat positions of rows i0:i1 at stride 1
    entries = first.shape[0]
    for n in range(n0, n1):
        pad(x, n, geometry, used, padded, row_max)
        changed = 0
        e = 0
        while e < entries:
            o = column[e]
            target = (n - n0) * ts[0] + o * ts[1]
            touched = False
            while e < entries and column[e] == o:
                wa, wb = np.int32(w_first[e]), np.int32(w_second[e])
                row_a = first[e, 0] * rows + i0 * sh + first[e, 1]  # in row_max
                row_b = second[e, 0] * rows + i0 * sh + second[e, 1]
                a0 = first[e, 0] * plane + (i0 * sh + first[e, 1]) * cols + j0 * sw + first[e, 2]
                b0 = second[e, 0] * plane + (i0 * sh + second[e, 1]) * cols + j0 * sw + second[e, 2]
                if flat:  # every row of the chunk in one contiguous loop, unless all are quiet
                    ma, mb = np.int32(0), np.int32(0)
                    for i in range(i1 - i0):
                        ma, mb = max(ma, np.int32(row_max[row_a + i])), max(mb, np.int32(row_max[row_b + i]))
                    if quiet(ma, mb, wa, wb):
                        e += 1
                        continue
                    if not touched:
                        acc[:span] = 0
                        touched = True
                    a, b, into = padded[a0 : a0 + span], padded[b0 : b0 + span], acc[:span]
                    for f in range(span):
                        p = np.int32(a[f]) * wa + np.int32(b[f]) * wb
                        q = p if p < hi else hi
                        q = q if q > lo else lo
                        into[f] += q - p
                elif sw == 1:  # row by row, straight into the sums
                    for i in range(i1 - i0):
                        if quiet(np.int32(row_max[row_a + i * sh]), np.int32(row_max[row_b + i * sh]), wa, wb):
                            continue
                        ra, rb, rt = a0 + i * sh * cols, b0 + i * sh * cols, target + i * ts[2]
                        a, b, into = padded[ra : ra + out_w], padded[rb : rb + out_w], out[rt : rt + out_w]
                        # the counting loop is a copy of its own: its reduction slows the loop 3x (a 3x3
                        # layer, 16 -> 32 channels at 64x64, 8 records: 9.5 against 3.2 ms)
                        if count:
                            for j in range(out_w):
                                p = np.int32(a[j]) * wa + np.int32(b[j]) * wb
                                q = p if p < hi else hi
                                q = q if q > lo else lo
                                into[j] += q - p
                                changed += q != p
                        else:
                            for j in range(out_w):
                                p = np.int32(a[j]) * wa + np.int32(b[j]) * wb
                                q = p if p < hi else hi
                                q = q if q > lo else lo
                                into[j] += q - p
                else:  # strided rows: scalar
                    for i in range(i1 - i0):
                        if quiet(np.int32(row_max[row_a + i * sh]), np.int32(row_max[row_b + i * sh]), wa, wb):
                            continue
                        ra, rb, rt = a0 + i * sh * cols, b0 + i * sh * cols, target + i * ts[2]
                        for j in range(out_w):
                            p = np.int32(padded[ra + j * sw]) * wa + np.int32(padded[rb + j * sw]) * wb
                            q = p if p < hi else hi
                            q = q if q > lo else lo
                            out[rt + j] += q - p
                            changed += q != p
                e += 1
            if touched:
                for i in range(i1 - i0):
                    row, done = (
                        out[target + i * ts[2] : target + i * ts[2] + out_w],
                        acc[i * cols : i * cols + out_w],
                    )
                    for j in range(out_w):
                        row[j] += done[j]
        if count:
            saturated[n - n0] += changed
