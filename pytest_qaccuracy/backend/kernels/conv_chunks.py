"""How a convolution's work is cut and read: chunks of records and output rows, padding, scratch.

* :func:`conv_pads` and :func:`output_shape` resolve the ONNX geometry;
* :func:`chunk_spans` cuts the output into chunks of about a scratch budget, at least one per thread,
  and :class:`Chunk` says where one lies and which input slice each kernel tap reads;
* :class:`Source` reads a 2-D input as ``x - offset`` padded, row by row, without a padded copy;
  :func:`to_padded` builds the padded copy for the paths that want one.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pytest_qaccuracy.backend import parallel

#: scratch elements of one chunk (float32: 16 MiB)
CHUNK_ELEMENTS = 1 << 22
#: the same when several threads share the chunks: fewer, larger ones, since each chunk costs the
#: threads a hand-off
THREADED_CHUNK_ELEMENTS = 1 << 23
#: the same for the float depthwise paths that read the input row by row: their one pass per tap
#: wants its scratch in cache
DEPTHWISE_CHUNK_ELEMENTS = 1 << 19


def conv_pads(
    spatial: tuple[int, ...],
    kernel_shape: tuple[int, ...],
    auto_pad: str,
    pads: list[int] | None,
    strides: tuple[int, ...],
    dilations: tuple[int, ...],
) -> list[int]:
    """Begin pads then end pads, resolving ``auto_pad`` as the ONNX spec does."""
    d = len(spatial)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for size, k, s, dil in zip(spatial, kernel_shape, strides, dilations, strict=False):
            out = -(-size // s)
            total = max(0, (out - 1) * s + (k - 1) * dil + 1 - size)
            small, large = total // 2, total - total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else large)
            end.append(large if auto_pad == "SAME_UPPER" else small)
        return begin + end
    if auto_pad == "VALID" or not pads:
        return [0] * (2 * d)
    return list(pads)


def scratch_buffer(size: int, dtype: type, role: str = "cols") -> np.ndarray:
    """A reusable per-thread scratch buffer (see ``parallel.scratch``)."""
    return parallel.scratch(size, dtype, f"conv-{role}")


def to_padded(x: np.ndarray, pads: list[int], offset: np.ndarray | int, dtype: type) -> np.ndarray:
    """``x - offset`` as ``dtype``, zero-padded on the spatial axes, in one pass over ``x``."""
    d = x.ndim - 2
    spatial = x.shape[2:]
    shape = (*x.shape[:2], *(s + pads[i] + pads[d + i] for i, s in enumerate(spatial)))
    xp = np.zeros(shape, dtype) if any(pads) else np.empty(shape, dtype)
    inner = (slice(None), slice(None), *(slice(pads[i], pads[i] + s) for i, s in enumerate(spatial)))
    convert(x, offset, xp[inner])
    return xp


def convert(x: np.ndarray, offset: np.ndarray | int, out: np.ndarray) -> None:
    """``out = x - offset`` in ``out``'s float type (a plain converting copy when there is no offset)."""
    if np.ndim(offset) == 0 and offset == 0:
        np.copyto(out, x, casting="unsafe")
    else:
        np.subtract(x, offset, out=out, dtype=out.dtype, casting="unsafe")


def output_shape(
    padded: tuple[int, ...], kernel_shape: tuple[int, ...], strides: tuple[int, ...], dilations: tuple[int, ...]
) -> tuple[int, ...]:
    """The output's spatial shape over a padded input of spatial shape ``padded``."""
    return tuple(
        (size - ((k - 1) * dil + 1)) // s + 1
        for size, k, s, dil in zip(padded, kernel_shape, strides, dilations, strict=False)
    )


def chunk_spans(n: int, first: int, per_row: int, budget: int | None = None) -> list[tuple[int, int, int, int]]:
    """``(n0, n1, o0, o1)``: chunks of records and output rows of about ``budget`` scratch elements
    (default ``CHUNK_ELEMENTS``, or ``THREADED_CHUNK_ELEMENTS`` on several threads), at least one per thread."""
    threads = parallel.current()
    budget = budget or (CHUNK_ELEMENTS if threads <= 1 else THREADED_CHUNK_ELEMENTS)
    rows = max(1, budget // max(per_row, 1))
    records = max(1, rows // max(first, 1))
    if threads > 1 and n * first * per_row >= parallel.MIN_PARALLEL_ELEMENTS:
        count = -(-n // records)
        count = -(-count // threads) * threads  # a multiple of the threads: no thread idles at the end
        records = -(-n // count)
        if n < threads:  # too few records to share: split the rows too
            rows = min(rows, -(-first // (threads // n)))
    spans = []
    for n0 in range(0, n, records):
        n1 = min(n, n0 + records)
        row_step = first if n1 - n0 > 1 else min(first, rows)
        for o0 in range(0, first, row_step):  # bounded chunks of output rows, not single pixels
            spans.append((n0, n1, o0, min(first, o0 + row_step)))
    return spans


@dataclasses.dataclass(frozen=True, slots=True)
class Chunk:
    """Where one chunk of a convolution lies: records ``[n0, n1)``, output rows from ``o0``, and the
    chunk's output shape ``lead`` = (records, rows, *other output axes)."""

    records: tuple[int, int]
    o0: int
    lead: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]

    def tap_view(self, xp: np.ndarray, tap: tuple[int, ...]) -> np.ndarray:
        """The ``(n, C, *lead[1:])`` slice of the padded input that kernel tap ``tap`` reads."""
        index = [slice(*self.records), slice(None)]
        for axis, (t, s, dil, size) in enumerate(zip(tap, self.strides, self.dilations, self.lead[1:], strict=True)):
            begin = t * dil + (self.o0 * s if axis == 0 else 0)
            index.append(slice(begin, begin + (size - 1) * s + 1, s))
        return xp[tuple(index)]


@dataclasses.dataclass(frozen=True, slots=True)
class Source:
    """A 2-D input read as ``x - offset`` zero-padded, without building the padded copy.

    ``x`` is ``(N, *channels, H, W)``: the channel axes may be split (blocks of channels) as long as
    the spatial axes come last; ``fill`` writes any ``(n, *channels, R, K)`` view alike.
    """

    x: np.ndarray
    pads: list[int]
    offset: np.ndarray | int

    @property
    def padded_spatial(self) -> tuple[int, int]:
        (h, w), (top, left, bottom, right) = self.x.shape[-2:], self.pads
        return h + top + bottom, w + left + right

    def fill(self, out: np.ndarray, records: tuple[int, int], rows: tuple[int, int], cols: tuple[int, int]) -> None:
        """``out (n, *channels, R, K)`` = the padded input at rows ``row0 + r * row_step`` and columns
        ``col0 + k * col_step``, where ``rows = (row0, row_step)`` and ``cols = (col0, col_step)``.

        Positions in the padding get 0, the rest ``x - offset``: one pass over what the chunk reads.
        """
        (r0, r1), (c0, c1) = (
            _inside(first - pad, step, count, size)
            for (first, step), pad, count, size in zip(
                (rows, cols), self.pads[:2], out.shape[-2:], self.x.shape[-2:], strict=True
            )
        )
        if r1 <= r0 or c1 <= c0:
            out[...] = 0
            return
        out[..., :r0, :] = 0
        out[..., r1:, :] = 0
        (row0, row_step), (col0, col_step) = rows, cols
        plane = out[(0,) * (out.ndim - 2)]
        if row_step == 1 and col_step == 1 and out.shape[-1] == self.x.shape[-1] and plane.flags.c_contiguous:
            self._fill_shifted(out[..., r0:r1, :], records, row0 - self.pads[0] + r0, col0 - self.pads[1])
            return
        out[..., r0:r1, :c0] = 0
        out[..., r0:r1, c1:] = 0
        top, left = row0 - self.pads[0] + r0 * row_step, col0 - self.pads[1] + c0 * col_step
        src = self.x[
            slice(*records),
            ...,
            top : top + (r1 - r0 - 1) * row_step + 1 : row_step,
            left : left + (c1 - c0 - 1) * col_step + 1 : col_step,
        ]
        convert(src, self.offset, out[..., r0:r1, c0:c1])

    def _fill_shifted(self, out: np.ndarray, records: tuple[int, int], top: int, shift: int) -> None:
        """Whole image rows ``top ..`` with column ``w`` taken from image column ``w + shift``.

        Rows are contiguous in both arrays, so the copy runs over the flattened rows (one long vector
        loop per channel instead of one per row); the ``|shift|`` columns that wrapped into the
        neighbouring row are then set to 0 (they are padding).
        """
        rows, width = out.shape[-2:]
        src = self.x[slice(*records), ..., top : top + rows, :]
        src = src.reshape(*src.shape[:-2], rows * width)
        dst = out.reshape(*out.shape[:-2], rows * width)
        length = rows * width - abs(shift)
        begin_dst, begin_src = max(0, -shift), max(0, shift)
        convert(src[..., begin_src : begin_src + length], self.offset, dst[..., begin_dst : begin_dst + length])
        if shift < 0:
            out[..., :-shift] = 0
        elif shift > 0:
            out[..., width - shift :] = 0


def _inside(first: int, step: int, count: int, size: int) -> tuple[int, int]:
    """``[lo, hi)``: the ``k < count`` with ``0 <= first + k * step < size``."""
    lo = min(count, max(0, -(first // step)))
    hi = max(lo, min(count, (size - 1 - first) // step + 1)) if size - 1 >= first else lo
    return lo, hi
