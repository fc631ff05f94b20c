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

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

INT16_MIN, INT16_MAX = -32768, 32767
#: elements of one ``(rows, pairs)`` block of the correction
BLOCK_ELEMENTS = 1 << 21


@dataclass(frozen=True, slots=True)
class RiskyPairs:
    """The weight pairs ``(b[k], b[k+1])`` of one ``(K, N)`` weight matrix that may saturate.

    Attributes:
        first: reduction index ``k`` of each pair's first element (even); the second is ``k + 1``.
        column: output column of each pair, sorted ascending.
        w_first: ``b[k, column]`` as int32.
        w_second: ``b[k + 1, column]`` as int32.
    """

    first: np.ndarray
    column: np.ndarray
    w_first: np.ndarray
    w_second: np.ndarray

    def __len__(self) -> int:
        return int(self.first.size)


def risky_pairs(w: np.ndarray, a_max: int) -> RiskyPairs:
    """The pairs of ``w`` (``(K, N)``, signed 8-bit values) that may saturate for inputs in ``[0, a_max]``."""
    w = np.asarray(w, dtype=np.int32)
    k = w.shape[0] - w.shape[0] % 2  # an odd last element pairs with padding (0): one product never saturates
    even, odd = w[0:k:2], w[1:k:2]
    high = np.maximum(even, 0) + np.maximum(odd, 0)
    low = np.minimum(even, 0) + np.minimum(odd, 0)
    mask = (int(a_max) * high > INT16_MAX) | (int(a_max) * low < INT16_MIN)
    columns, pairs = np.nonzero(mask.T)  # column-major: sorted by column
    return RiskyPairs(
        first=(2 * pairs).astype(np.int64),
        column=columns.astype(np.int64),
        w_first=even[pairs, columns],
        w_second=odd[pairs, columns],
    )


def corrections(
    pairs: RiskyPairs, gather: Callable[[np.ndarray], np.ndarray], rows: int
) -> Iterator[tuple[slice, np.ndarray, np.ndarray]]:
    """``(row slice, columns, values)`` blocks to add to the exact sums: ``sat16(p) - p`` per column.

    Args:
        pairs: the risky pairs of the weight matrix.
        gather: ``gather(ks)`` returns the raw inputs at reduction indices ``ks`` as ``(rows, len(ks))``.
        rows: number of rows (records times output positions).
    """
    if not len(pairs) or not rows:
        return
    needed = np.unique(np.concatenate([pairs.first, pairs.first + 1]))
    columns = gather(needed)
    i_first = np.searchsorted(needed, pairs.first)
    i_second = np.searchsorted(needed, pairs.first + 1)
    out_cols, starts = np.unique(pairs.column, return_index=True)
    step = max(1, BLOCK_ELEMENTS // len(pairs))
    for r0 in range(0, rows, step):
        block = columns[r0 : r0 + step]
        total = block[:, i_first].astype(np.int32) * pairs.w_first
        total += block[:, i_second].astype(np.int32) * pairs.w_second
        clipped = np.clip(total, INT16_MIN, INT16_MAX)
        clipped -= total
        if clipped.any():
            yield slice(r0, r0 + block.shape[0]), out_cols, np.add.reduceat(clipped, starts, axis=1)


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
    found = risky_pairs(w, int(a2.max(initial=0)))
    result = None
    for rows, cols, values in corrections(found, lambda ks: a2[:, ks], a2.shape[0]):
        if result is None:
            result = np.zeros((a2.shape[0], w.shape[1]), np.int64)
        result[rows, cols] += values
    return None if result is None else result.reshape(*a.shape[:-1], w.shape[1])
