"""Convolutions: QLinearConv, ConvInteger, QLinearConvTranspose and float Conv, by im2col + GEMM.

Work is cut into bounded chunks of records and output rows, which run on the session's threads
(``parallel``). Integer convolutions stay exact: operands are small integers and the float type is
chosen from a bound on every partial sum (``arith.int_matmul``). Exact 2-D convolutions take the row
path (:func:`_row_gemm_chunk`), which reads the unpadded input directly and copies a third (vertical
stride 1) or two thirds (stride 2) of what im2col copies for a 3x3 kernel; grouped and depthwise ones
too, with blocks of groups as block-diagonal dense GEMMs; float 2-D depthwise ones multiply-accumulate
tap by tap on chunks read the same way; the rest build im2col columns from a padded copy and run one
(grouped, batched) BLAS matmul per chunk.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterable

import numpy as np

from pytest_qaccuracy.backend import arith, parallel
from pytest_qaccuracy.backend.kernels import conv_pairs
from pytest_qaccuracy.backend.registry import kernel
from pytest_qaccuracy.backend.scheme import Scheme

#: scratch elements of one chunk (float32: 16 MiB; measured best of 2^19..2^23 on three nets)
CHUNK_ELEMENTS = 1 << 22
#: the same when several threads share the chunks: fewer, larger ones, since each chunk costs the
#: threads hand-offs (measured at 2 threads: the detector 5 % faster than at 2^22; plain and mobile
#: nets unchanged, and one thread slower, hence two budgets)
THREADED_CHUNK_ELEMENTS = 1 << 23
#: the same for float depthwise chunks off the padded-width path, whose nine passes want their scratch
#: in cache (measured on six MobileNet layers, when integer depthwise convolutions still took these
#: paths: 1.2-1.9x faster than at 2^22; the padded-width path is not)
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


def _buffer(size: int, dtype: type, role: str = "cols") -> np.ndarray:
    """A reusable per-thread scratch buffer (see ``parallel.scratch``)."""
    return parallel.scratch(size, dtype, f"conv-{role}")


def to_padded(x: np.ndarray, pads: list[int], offset: np.ndarray | int, dtype: type, padding: int = 0) -> np.ndarray:
    """``x - offset`` as ``dtype``, padded with ``padding`` on the spatial axes, in one pass over ``x``."""
    d = x.ndim - 2
    spatial = x.shape[2:]
    shape = (*x.shape[:2], *(s + pads[i] + pads[d + i] for i, s in enumerate(spatial)))
    xp = np.full(shape, padding, dtype) if any(pads) else np.empty(shape, dtype)
    inner = (slice(None), slice(None), *(slice(pads[i], pads[i] + s) for i, s in enumerate(spatial)))
    _convert(x, offset, xp[inner])
    return xp


def _convert(x: np.ndarray, offset: np.ndarray | int, out: np.ndarray) -> None:
    """``out = x - offset`` in ``out``'s float type (a plain converting copy when there is no offset)."""
    if np.ndim(offset) == 0 and offset == 0:
        np.copyto(out, x, casting="unsafe")
    else:
        np.subtract(x, offset, out=out, dtype=out.dtype, casting="unsafe")


def output_shape(
    padded: tuple[int, ...], kernel_shape: tuple[int, ...], strides: tuple[int, ...], dilations: tuple[int, ...]
) -> tuple[int, ...]:
    return tuple(
        (size - ((k - 1) * dil + 1)) // s + 1
        for size, k, s, dil in zip(padded, kernel_shape, strides, dilations, strict=False)
    )


Epilogue = Callable[[np.ndarray, np.ndarray], None]


def conv_core(
    xp: np.ndarray,
    w: np.ndarray,
    group: int,
    strides: tuple[int, ...],
    dilations: tuple[int, ...],
    dtype: type,
    epilogue: tuple[Epilogue, np.dtype] | None = None,
    exact: bool = False,
    pads: list[int] | None = None,
    offset: np.ndarray | int = 0,
    padding: int = 0,
    bias: np.ndarray | None = None,
    bias_in_gemm: bool = False,
    correction: conv_pairs.PairCorrection | None = None,
) -> np.ndarray:
    """``sum x*w (+ bias)`` over the windows of a padded input, chunk by chunk on the session's threads.

    Paths (:func:`_path`): exact 2-D convolutions take the row path (:func:`_row_gemm_chunk`), grouped
    ones with blocks of groups as block-diagonal dense GEMMs; float 2-D depthwise convolutions read
    their chunks from the unpadded input and multiply-accumulate tap by tap
    (:func:`_depthwise_source_chunk`, :func:`_depthwise_flat_chunk`); the rest use channels-first
    im2col, each tap copying a shifted image plane into the column matrix, then one
    ``W (Mg, taps*Cg) @ cols (taps*Cg, rows)`` GEMM per group (:func:`_gemm_chunk`).

    Args:
        xp: padded input ``(N, C, *spatial)``, values exact in ``dtype``; or, with ``pads``, the
            unpadded input, read as ``xp - offset`` zero-padded by ``pads`` (the row path then builds
            its columns straight from it, without a padded copy).
        w: weights ``(M, C/group, *kernel)``.
        group: number of groups.
        strides: strides per spatial axis.
        dilations: dilations per spatial axis.
        dtype: float type of the GEMMs.
        epilogue: ``(fn, out_dtype)``: ``fn(chunk, dest)`` writes each finished chunk's values (the
            chunk is scratch and may be overwritten) into ``dest``, a view of the ``out_dtype``
            output, e.g. requantization while the chunk is still in cache.
        exact: the sums are exact in ``dtype`` (integer operands under the bound), so they may be
            added in any order: 2-D kernels then take the row path.
        pads: begin then end pads of an unpadded ``xp``.
        offset: subtracted from an unpadded ``xp`` (the input's zero point).
        padding: the value of padded positions of an unpadded ``xp`` (after ``offset``): 0, or the
            zero point when the caller folds it out of the sums instead of subtracting it.
        bias: ``(M,)`` added to every sum before the epilogue, by one pass over each chunk.
        bias_in_gemm: every partial sum stays exact with the bias added (the caller checked the
            bound): the row paths then add it in the GEMMs themselves, one more column of ones.
        correction: the int16 pair saturation of ``conv_pairs``, added to each chunk's sums before the
            bias pass and the epilogue; exactness is the caller's.

    Returns:
        ``(N, M, *out)``.
    """
    kernel_shape = w.shape[2:]
    n, c = xp.shape[:2]
    m = w.shape[0]
    cg, mg = c // group, m // group
    depthwise = cg == 1 and group > 1
    source = None  # 2-D row and depthwise paths read the unpadded input chunk by chunk
    if len(kernel_shape) == 2 and (exact or depthwise):
        source = _Source(xp, [0] * 4 if pads is None else list(pads), offset if pads is not None else 0, padding)
        padded_spatial = source.padded_spatial
    else:
        if pads is not None:
            xp = to_padded(xp, pads, offset, dtype, padding)
        padded_spatial = xp.shape[2:]
    out_spatial = output_shape(padded_spatial, kernel_shape, strides, dilations)
    path = _path(source is not None, exact, group, c, mg, strides, out_spatial[-1])
    taps = list(itertools.product(*(range(k) for k in kernel_shape)))
    out = np.empty((n, m, *out_spatial), dtype=epilogue[1] if epilogue else dtype)
    if path in ("rows", "grouped-rows"):  # ordinary: one dense block; grouped: blocks of groups
        blocks = 1 if path == "rows" else group // _groups_per_block(group, cg)
        dense = w[None] if path == "rows" else _block_weights(w, group, blocks)
        block_bias = np.asarray(bias).reshape(blocks, -1) if bias is not None and bias_in_gemm else None
        classes = _row_classes(dense, strides[0], dilations[0], dtype, block_bias)
        source = dataclasses.replace(source, x=source.x.reshape(n, blocks, c // blocks, *source.x.shape[2:]))
    elif depthwise:  # elementwise multiply-accumulate per tap, vectorised over everything else
        wt = w.reshape(group, mg, len(taps)).astype(dtype)
    else:  # (G, Mg, taps * Cg), K ordered (tap, channel) like the columns
        wmat = np.moveaxis(w.reshape(group, mg, cg, len(taps)), 3, 2).reshape(group, mg, len(taps) * cg)
        wmat = np.ascontiguousarray(wmat, dtype=dtype)
    first = out_spatial[0]
    added = None  # the bias, when a pass over each chunk adds it
    if bias is not None and not (bias_in_gemm and path in ("rows", "grouped-rows")):
        added = np.asarray(bias, dtype).reshape((m,) + (1,) * len(out_spatial))

    def run_chunk(n0: int, n1: int, o0: int, o1: int) -> None:
        lead = (n1 - n0, o1 - o0, *out_spatial[1:])
        chunk = _Chunk((n0, n1), o0, lead, strides, dilations)
        if path == "flat":  # computed on the padded width; the extra columns are dropped when stored
            wide = (lead[2] - 1) + (kernel_shape[1] - 1) * dilations[1] + 1
            result = _buffer(m * lead[0] * lead[1] * wide, dtype, "target").reshape(lead[0], m, lead[1], wide)
            _depthwise_flat_chunk(source, wt, result, kernel_shape, chunk)
            if correction is not None:
                correction.add_to(result, n0, n1, o0, o1)
            if added is not None:
                result += added
            if epilogue:
                epilogue[0](result[..., : lead[2]], out[n0:n1, :, o0:o1])
            else:
                np.copyto(out[n0:n1, :, o0:o1], result[..., : lead[2]])
            return
        if epilogue:
            target = _buffer(m * math.prod(lead), dtype, "target").reshape(lead[0], m, *lead[1:])
        else:
            target = out[n0:n1, :, o0:o1]
        if path in ("rows", "grouped-rows"):
            _row_gemm_chunk(source, classes, target, kernel_shape[1], chunk)
        elif path == "channels-last":
            _depthwise_nhwc_chunk(source, wt, target, kernel_shape, chunk)
        elif path == "depthwise-rows":
            _depthwise_source_chunk(source, wt, target, kernel_shape, chunk)
        elif path == "depthwise":
            _depthwise_chunk(xp, wt, target, taps, chunk)
        else:
            _gemm_chunk(xp, wmat, target, taps, chunk, o1 - o0 == first)
        if correction is not None:
            correction.add_to(target, n0, n1, o0, o1)
        if added is not None:
            target += added
        if epilogue:
            epilogue[0](target, out[n0:n1, :, o0:o1])

    # scratch per output row: the columns, the partial sums of the row path and the chunk's output
    if path in ("rows", "grouped-rows"):
        scratch = len(taps) * c + kernel_shape[0] * m
    elif depthwise:  # the chunk's padded input rows, its output, one product (and channels last: one more)
        scratch = c * math.prod(strides) + (3 if path == "channels-last" else 2) * m
    else:
        scratch = len(taps) * c + m
    budget = DEPTHWISE_CHUNK_ELEMENTS if path in ("depthwise", "depthwise-rows", "channels-last") else None
    spans = _chunks(n, first, scratch * math.prod(out_spatial[1:]), budget)
    parallel.run_all([lambda span=span: run_chunk(*span) for span in spans])
    return out


def _path(from_source: bool, exact: bool, group: int, c: int, mg: int, strides: tuple[int, ...], width: int) -> str:
    """Which chunk function a convolution takes (see :func:`conv_core`)."""
    depthwise = c == group > 1
    if not from_source:
        return "depthwise" if depthwise else "im2col"
    if group == 1:
        return "rows"
    if exact:  # grouped: blocks of groups as block-diagonal GEMMs
        return "grouped-rows"
    # float depthwise: on the padded width when rows are long enough for it to pay (measured: faster
    # from 64 columns)
    if tuple(strides) == (1, 1) and width >= 64:
        return "flat"
    # channels last when there are more channels than output columns (measured: 384 channels at
    # 16x16 2.2x faster, 192 at 32x32 1.7x): the vector loops then run over channels x columns
    return "channels-last" if mg == 1 and c >= width else "depthwise-rows"


def _chunks(n: int, first: int, per_row: int, budget: int | None = None) -> list[tuple[int, int, int, int]]:
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
class _Chunk:
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


def _depthwise_chunk(
    xp: np.ndarray,
    wt: np.ndarray,
    target: np.ndarray,
    taps: list[tuple[int, ...]],
    chunk: _Chunk,
) -> None:
    """One input channel per group: multiply-accumulate tap by tap, vectorised over everything else."""
    group, mg, _ = wt.shape
    lead = chunk.lead
    view = target.reshape(lead[0], group, mg, *lead[1:])
    view[...] = 0
    for t, tap in enumerate(taps):
        x_tap = chunk.tap_view(xp, tap)[:, :, None]
        view += x_tap * wt[:, :, t].reshape(group, mg, *([1] * len(lead[1:])))


def _chunk_rows(
    source: _Source, chunk: _Chunk, kernel_shape: tuple[int, ...], dtype: type, channels_last: bool = False
) -> np.ndarray:
    """The padded input rows a 2-D chunk reads, converted once into scratch: ``(n, C, rows, cols)``,
    or ``(n, rows, cols, C)`` with ``channels_last``."""
    (kh, kw), (sh, sw), (dh, dw) = kernel_shape, chunk.strides, chunk.dilations
    n, rows, width = chunk.lead
    c = source.x.shape[1]
    span, wide = (rows - 1) * sh + (kh - 1) * dh + 1, (width - 1) * sw + (kw - 1) * dw + 1
    shape = (n, span, wide, c) if channels_last else (n, c, span, wide)
    local = _buffer(math.prod(shape), dtype, "padded").reshape(shape)
    source.fill(local.transpose(0, 3, 1, 2) if channels_last else local, chunk.records, (chunk.o0 * sh, 1), (0, 1))
    return local


def _multiply_accumulate(terms: Iterable[tuple[np.ndarray, np.ndarray]], acc: np.ndarray) -> None:
    """``acc = sum x * w`` over the terms, with one product buffer (no temporary per term)."""
    product = _buffer(acc.size, acc.dtype.type, "product").reshape(acc.shape)
    for t, (x, w) in enumerate(terms):
        if t == 0:
            np.multiply(x, w, out=acc)
        else:
            np.multiply(x, w, out=product)
            acc += product


def _tap_slices(chunk: _Chunk, i: int, j: int) -> tuple[slice, slice]:
    """Rows and columns of a chunk's padded input rows that kernel tap ``(i, j)`` reads."""
    (sh, sw), (dh, dw) = chunk.strides, chunk.dilations
    _, rows, width = chunk.lead
    return slice(i * dh, i * dh + (rows - 1) * sh + 1, sh), slice(j * dw, j * dw + (width - 1) * sw + 1, sw)


def _depthwise_source_chunk(
    source: _Source, wt: np.ndarray, target: np.ndarray, kernel_shape: tuple[int, ...], chunk: _Chunk
) -> None:
    """A 2-D depthwise chunk: its padded input rows converted once into scratch (no padded copy of
    the whole input), then one multiply and one add per tap on chunk-sized arrays."""
    local = _chunk_rows(source, chunk, kernel_shape, wt.dtype.type)
    group, mg, _ = wt.shape
    view = target.reshape(chunk.lead[0], group, mg, *chunk.lead[1:])
    taps = itertools.product(range(kernel_shape[0]), range(kernel_shape[1]))
    terms = (
        (local[(slice(None), slice(None), *_tap_slices(chunk, i, j))][:, :, None], wt[:, :, t].reshape(group, mg, 1, 1))
        for t, (i, j) in enumerate(taps)
    )
    _multiply_accumulate(terms, view)


def _depthwise_nhwc_chunk(
    source: _Source, wt: np.ndarray, target: np.ndarray, kernel_shape: tuple[int, ...], chunk: _Chunk
) -> None:
    """A 2-D depthwise chunk (one output per channel) computed channels last: the chunk's padded input
    rows are converted once into ``(n, rows, columns, C)`` scratch, each tap multiplies a view whose
    innermost run is ``columns x C`` long (stride 1) or ``C`` (wider strides), and the result is
    transposed into ``target (n, C, rows, width)`` once."""
    local = _chunk_rows(source, chunk, kernel_shape, wt.dtype.type, channels_last=True)
    n, rows, width = chunk.lead
    c = local.shape[3]
    acc = _buffer(n * rows * width * c, wt.dtype.type, "channels-last").reshape(n, rows, width, c)
    weights = wt.reshape(c, -1)
    tile = chunk.strides[1] == 1  # the weights repeated along the columns: runs of columns x C

    def term(t: int, i: int, j: int) -> tuple[np.ndarray, np.ndarray]:
        return local[(slice(None), *_tap_slices(chunk, i, j))], np.tile(weights[:, t], (width, 1)) if tile else weights[
            :, t
        ]

    taps = itertools.product(range(kernel_shape[0]), range(kernel_shape[1]))
    _multiply_accumulate((term(t, i, j) for t, (i, j) in enumerate(taps)), acc)
    np.copyto(target, acc.transpose(0, 3, 1, 2))


def _depthwise_flat_chunk(
    source: _Source, wt: np.ndarray, result: np.ndarray, kernel_shape: tuple[int, ...], chunk: _Chunk
) -> None:
    """A 2-D depthwise chunk with stride 1, on the padded width: each tap is then one contiguous run
    of the flattened input rows per channel (long vector loops instead of one per output row).

    ``result (n, M, rows, wide)``: columns from ``width`` on are scratch (they mix neighbouring
    rows) and are dropped by the caller.
    """
    kh, kw = kernel_shape
    dh, dw = chunk.dilations
    n, rows, _ = chunk.lead
    local = _chunk_rows(source, chunk, kernel_shape, wt.dtype.type)
    wide = local.shape[3]
    flat = local.reshape(n, local.shape[1], 1, -1)
    group, mg, _ = wt.shape
    length = rows * wide - (kw - 1) * dw  # the last row's scratch tail would read past the input
    view = result.reshape(n, group, mg, rows * wide)
    view[..., length:] = 0
    begins = (i * dh * wide + j * dw for i, j in itertools.product(range(kh), range(kw)))
    terms = ((flat[..., b : b + length], wt[:, :, t].reshape(group, mg, 1)) for t, b in enumerate(begins))
    _multiply_accumulate(terms, view[..., :length])


def _gemm_chunk(
    xp: np.ndarray,
    wmat: np.ndarray,
    target: np.ndarray,
    taps: list[tuple[int, ...]],
    chunk: _Chunk,
    whole: bool,
) -> None:
    """im2col for one chunk (per record: taps x channels x rows) and one batched GEMM into ``target``."""
    group, mg, _ = wmat.shape
    lead = chunk.lead
    c = xp.shape[1]
    cg = c // group
    # columns per record: (n, taps, C, *rows), so that one batched GEMM writes (n, M, rows)
    single = chunk.tap_view(xp, taps[0]) if len(taps) == 1 else None
    if single is not None and single.flags.c_contiguous:  # 1x1, stride 1, no padding: the input is the matrix
        cols = single.reshape(lead[0], 1, c, *lead[1:])
    else:
        cols = _buffer(len(taps) * c * math.prod(lead), wmat.dtype.type).reshape(lead[0], len(taps), c, *lead[1:])
        for t, tap in enumerate(taps):
            cols[:, t] = chunk.tap_view(xp, tap)
    grouped = cols.reshape(lead[0], len(taps), group, cg, -1)
    if group > 1:
        grouped = grouped.transpose(0, 2, 1, 3, 4)
    grouped = grouped.reshape(lead[0], group, len(taps) * cg, -1)
    if whole and target.flags.c_contiguous:  # whole records: the GEMM writes straight into the output
        np.matmul(wmat, grouped, out=target.reshape(lead[0], group, mg, -1))
    else:
        target[...] = np.matmul(wmat, grouped).reshape(target.shape)


@dataclasses.dataclass(frozen=True, slots=True)
class _Source:
    """A 2-D input read as ``x - offset`` padded with ``pad``, without building the padded copy.

    ``x`` is ``(N, *channels, H, W)``: the channel axes may be split (blocks of channels) as long as
    the spatial axes come last; ``fill`` writes any ``(n, *channels, R, K)`` view alike.
    """

    x: np.ndarray
    pads: list[int]
    offset: np.ndarray | int
    pad: int = 0

    @property
    def padded_spatial(self) -> tuple[int, int]:
        (h, w), (top, left, bottom, right) = self.x.shape[-2:], self.pads
        return h + top + bottom, w + left + right

    def fill(self, out: np.ndarray, records: tuple[int, int], rows: tuple[int, int], cols: tuple[int, int]) -> None:
        """``out (n, *channels, R, K)`` = the padded input at rows ``row0 + r * row_step`` and columns
        ``col0 + k * col_step``, where ``rows = (row0, row_step)`` and ``cols = (col0, col_step)``.

        Positions in the padding get ``pad``, the rest ``x - offset``: one pass over what the chunk reads.
        """
        (r0, r1), (c0, c1) = (
            _inside(first - pad, step, count, size)
            for (first, step), pad, count, size in zip(
                (rows, cols), self.pads[:2], out.shape[-2:], self.x.shape[-2:], strict=True
            )
        )
        if r1 <= r0 or c1 <= c0:
            out[...] = self.pad
            return
        out[..., :r0, :] = self.pad
        out[..., r1:, :] = self.pad
        (row0, row_step), (col0, col_step) = rows, cols
        plane = out[(0,) * (out.ndim - 2)]
        if row_step == 1 and col_step == 1 and out.shape[-1] == self.x.shape[-1] and plane.flags.c_contiguous:
            self._fill_shifted(out[..., r0:r1, :], records, row0 - self.pads[0] + r0, col0 - self.pads[1])
            return
        out[..., r0:r1, :c0] = self.pad
        out[..., r0:r1, c1:] = self.pad
        top, left = row0 - self.pads[0] + r0 * row_step, col0 - self.pads[1] + c0 * col_step
        src = self.x[
            slice(*records),
            ...,
            top : top + (r1 - r0 - 1) * row_step + 1 : row_step,
            left : left + (c1 - c0 - 1) * col_step + 1 : col_step,
        ]
        _convert(src, self.offset, out[..., r0:r1, c0:c1])

    def _fill_shifted(self, out: np.ndarray, records: tuple[int, int], top: int, shift: int) -> None:
        """Whole image rows ``top ..`` with column ``w`` taken from image column ``w + shift``.

        Rows are contiguous in both arrays, so the copy runs over the flattened rows (one long vector
        loop per channel instead of one per row); the ``|shift|`` columns that wrapped into the
        neighbouring row are then set to ``pad`` (they are padding).
        """
        rows, width = out.shape[-2:]
        src = self.x[slice(*records), ..., top : top + rows, :]
        src = src.reshape(*src.shape[:-2], rows * width)
        dst = out.reshape(*out.shape[:-2], rows * width)
        length = rows * width - abs(shift)
        begin_dst, begin_src = max(0, -shift), max(0, shift)
        _convert(src[..., begin_src : begin_src + length], self.offset, dst[..., begin_dst : begin_dst + length])
        if shift < 0:
            out[..., :-shift] = self.pad
        elif shift > 0:
            out[..., width - shift :] = self.pad


def _inside(first: int, step: int, count: int, size: int) -> tuple[int, int]:
    """``[lo, hi)``: the ``k < count`` with ``0 <= first + k * step < size``."""
    lo = min(count, max(0, -(first // step)))
    hi = max(lo, min(count, (size - 1 - first) // step + 1)) if size - 1 >= first else lo
    return lo, hi


@dataclasses.dataclass(frozen=True, slots=True)
class _RowClass:
    """Kernel rows whose input rows share one residue modulo the vertical stride.

    Kernel row ``i`` of output row ``r`` reads padded row ``s * r + i * dh``; with ``q = i * dh % s``
    and ``shift = i * dh // s`` that is row ``shift + r`` of the rows ``q, q + s, q + 2s, ...``.
    """

    residue: int
    shifts: tuple[int, ...]
    weights: np.ndarray  # (blocks, len(shifts) * M, kw * C), kernel rows stacked like the shifts


def _row_classes(
    w: np.ndarray, stride: int, dilation: int, dtype: type, bias: np.ndarray | None = None
) -> list[_RowClass]:
    """The kernel rows of ``w (blocks, M, C, kh, kw)`` grouped by residue, each with its GEMM weights.

    With ``bias (blocks, M)``, the first class's weights get one more column holding it on its first
    kernel row's outputs (zeros on the others), against a row of ones in the columns: the GEMM then
    adds the bias, and no pass over the output does.
    """
    blocks, m, c, kh, kw = w.shape
    wrows = np.transpose(w, (0, 3, 1, 4, 2)).reshape(blocks, kh, m, kw * c)  # K ordered (tap j, channel)
    classes = []
    for q in range(stride):
        rows = [i for i in range(kh) if i * dilation % stride == q]
        if rows:
            weights = wrows[:, rows].reshape(blocks, len(rows) * m, kw * c)
            if bias is not None and not classes:
                column = np.zeros((blocks, len(rows) * m, 1))
                column[:, :m, 0] = bias
                weights = np.concatenate([weights, column], axis=2)
            weights = np.ascontiguousarray(weights, dtype=dtype)
            classes.append(_RowClass(q, tuple(i * dilation // stride for i in rows), weights))
    return classes


def _groups_per_block(group: int, cg: int) -> int:
    """Groups merged into one block-diagonal GEMM on the row path: two one-channel groups (measured on
    eleven MobileNetV2 depthwise layers: 1.05-2.4x faster than the elementwise depthwise paths on one
    core, 1.7-2.7x on two; 2-8 % faster than one group per GEMM on one core, 4-24 % on two; four
    groups were no better); wider groups alone."""
    return 2 if cg == 1 and group % 2 == 0 else 1


def _block_weights(w: np.ndarray, group: int, blocks: int) -> np.ndarray:
    """``w (M, C/group, kh, kw)`` as ``blocks`` dense convolutions ``(blocks, M/blocks, C/blocks, kh, kw)``,
    each holding ``group/blocks`` groups on its diagonal (zeros elsewhere: exact, and BLAS-sized)."""
    m, cg, kh, kw = w.shape
    per, mg = group // blocks, m // group
    dense = np.zeros((blocks, per, mg, per, cg, kh, kw), w.dtype)
    grouped = w.reshape(blocks, per, mg, cg, kh, kw)
    for g in range(per):
        dense[:, g, :, g] = grouped[:, g]
    return dense.reshape(blocks, per * mg, per * cg, kh, kw)


def _row_gemm_chunk(source: _Source, classes: list[_RowClass], target: np.ndarray, kw: int, chunk: _Chunk) -> None:
    """A 2-D chunk by kernel rows: for each residue class, columns of the ``kw`` horizontal taps of
    every input row of that class the chunk reads, one GEMM giving each of the class's kernel rows'
    contribution on every such row, then the contributions added with each kernel row's shift.

    With vertical stride 1 (one class) a 3x3 kernel's columns are a third of im2col's, since the
    kernel rows share input rows; with stride 2, two thirds. The GEMM has (rows of the class) x M
    outputs, which BLAS runs better than M when M is small. The partial sums are exact integers
    under the same bound as the whole sum, so the result is bit-identical.

    ``source.x`` is ``(N, blocks, C, H, W)`` and each block its own GEMM (one block for an ordinary
    convolution; grouped ones as block-diagonal dense blocks, see :func:`_block_weights`);
    ``target`` is ``(n, blocks * M, rows, width)``.
    """
    s, step = chunk.strides
    dw = chunk.dilations[1]
    n, rows, width = chunk.lead
    blocks, c = source.x.shape[1:3]
    target = target.reshape(n, blocks, -1, rows, width)
    first = True
    for cls in classes:
        span = rows + max(cls.shifts)  # rows of this class the chunk reads
        m = cls.weights.shape[1] // len(cls.shifts)
        k = cls.weights.shape[2]  # kw * c, and one more for the bias's row of ones
        matrix = _buffer(n * blocks * k * span * width, cls.weights.dtype.type).reshape(n, blocks, k, span * width)
        cols = matrix[:, :, : kw * c].reshape(n, blocks, kw, c, span, width)
        for j in range(kw):
            source.fill(cols[:, :, j], chunk.records, (chunk.o0 * s + cls.residue, s), (j * dw, step))
        if k > kw * c:
            matrix[:, :, kw * c :] = 1
        if cls.shifts == (0,) and len(classes) == 1 and target.flags.c_contiguous:  # one kernel row: no sums
            np.matmul(cls.weights, matrix, out=target.reshape(n, blocks, m, -1))
            return
        shape = (n, blocks, len(cls.shifts), m, span, width)
        parts = _buffer(math.prod(shape), cls.weights.dtype.type, "rows").reshape(shape)
        np.matmul(cls.weights, matrix, out=parts.reshape(n, blocks, len(cls.shifts) * m, -1))
        views = [parts[:, :, i, :, shift : shift + rows] for i, shift in enumerate(cls.shifts)]
        if first:
            first = False
            if len(views) == 1:
                np.copyto(target, views.pop())
            else:
                np.add(views.pop(0), views.pop(0), out=target)
        for view in views:
            target += view


def _geometry(x: np.ndarray, w: np.ndarray, attrs: dict) -> tuple[list[int], tuple[int, ...], tuple[int, ...], int]:
    d = x.ndim - 2
    kernel_shape = tuple(attrs.get("kernel_shape") or w.shape[2:])
    strides = tuple(attrs.get("strides") or (1,) * d)
    dilations = tuple(attrs.get("dilations") or (1,) * d)
    pads = conv_pads(
        x.shape[2:], kernel_shape, attrs.get("auto_pad") or "NOTSET", attrs.get("pads"), strides, dilations
    )
    return pads, strides, dilations, int(attrs.get("group") or 1)


@dataclasses.dataclass(frozen=True, slots=True)
class Requantizer:
    """How exact sums become a convolution's output chunk by chunk: ``bias`` (int64 per output
    channel, or None) is added to them first, then ``finish(chunk, dest)`` writes ``dest`` (of
    ``dtype``); the chunk is scratch and may be overwritten."""

    bias: np.ndarray | None
    finish: Epilogue
    dtype: np.dtype


def conv_integer_acc(
    x: np.ndarray,
    x_zp: np.ndarray | int,
    w: np.ndarray,
    w_zp: np.ndarray | int,
    attrs: dict,
    scheme: Scheme,
    requantizer_for: Callable[[float, type], Requantizer | None] | None = None,
) -> tuple[np.ndarray, float, bool]:
    """Exact ``sum (x - x_zp)(w - w_zp)`` as ``(N, M, *out)``, padding contributing 0.

    ``requantizer_for(bound, float type)`` may supply a :class:`Requantizer` (when it is exact for
    sums under ``bound``), which then runs on each chunk while it is in cache. The input zero point
    is folded into its bias when the sums over the raw input stay exact (see
    :func:`_folded_zero_point`), and the bias goes into the GEMMs when every partial sum stays exact
    with it (``conv_core``'s ``bias_in_gemm``).

    Returns:
        the accumulator (a float array holding exact integers, or int64 for the int16-pair
        accumulator), or the requantizer's output; a bound on the accumulator's magnitude; and whether
        the requantizer ran.
    """
    pads, strides, dilations, group = _geometry(x, w, attrs)
    m = w.shape[0]
    w_zp = np.asarray(w_zp, dtype=np.int64)
    ws = w.astype(np.int64) - (w_zp.reshape((m,) + (1,) * (w.ndim - 1)) if w_zp.size > 1 else w_zp)
    x_zp = np.asarray(x_zp).reshape(()).astype(np.int64)
    w_sum = float(np.abs(ws).reshape(m, -1).sum(axis=1).max(initial=0))
    x_range = 0
    if x.dtype.kind in "iu":  # the type's range first: no pass over the input when it is small enough
        info = np.iinfo(x.dtype)
        x_range = max(abs(int(info.max) - int(x_zp)), abs(int(info.min) - int(x_zp)))
    if (x.dtype.kind not in "iu" or x_range * w_sum >= 2.0**23) and x.size:  # then the data's own range
        x_range = max(abs(int(x.max()) - int(x_zp)), abs(int(x.min()) - int(x_zp)))
    bound = float(x_range) * w_sum
    # MLAS's depthwise kernel sums exactly; the others saturate u8 x s8 pairs on CPUs without VNNI
    correction, correction_max = None, 0.0
    depthwise = group == x.shape[1] == w.shape[0]
    if arith.saturates_pairs(scheme, x.dtype, w.dtype) and not depthwise and x.size:
        padded = [s + pads[i] + pads[x.ndim - 2 + i] for i, s in enumerate(x.shape[2:])]
        out_spatial = output_shape(tuple(padded), w.shape[2:], strides, dilations)
        correction = conv_pairs.pair_corrections(x, int(x_zp), w, group, pads, strides, dilations, out_spatial)
        if correction is not None:  # |exact + correction| <= bound + max|correction|
            correction_max = float(correction.max_abs())
            bound += correction_max
    dtype = np.float32 if bound < 2.0**24 else np.float64
    limit = 2.0**24 if dtype is np.float32 else 2.0**53  # below it, float sums of integers are exact
    requantizer = requantizer_for(bound, dtype) if requantizer_for else None
    offset, padding, sums_bound, added = x_zp, 0, bound, None
    if requantizer is not None:
        added = requantizer.bias
        raw_bound, shift = _folded_zero_point(x, x_zp, ws, w_sum)
        raw_bound += correction_max
        if shift is not None and raw_bound < limit:
            folded = shift if added is None else shift + added
            if float(np.abs(folded).max(initial=0)) < limit:
                offset, padding, sums_bound, added = 0, int(x_zp), raw_bound, folded
    epilogue = None if requantizer is None else (requantizer.finish, requantizer.dtype)
    in_gemm = added is not None and sums_bound + float(np.abs(added).max(initial=0)) < limit
    acc = conv_core(
        x,
        ws.astype(dtype),
        group,
        strides,
        dilations,
        dtype,
        epilogue,
        exact=True,
        pads=pads,
        offset=offset,
        padding=padding,
        bias=None if added is None else added.astype(dtype),
        bias_in_gemm=in_gemm,
        correction=correction,
    )
    return acc, bound, epilogue is not None


def _folded_zero_point(
    x: np.ndarray, x_zp: np.ndarray, ws: np.ndarray, w_sum: float
) -> tuple[float, np.ndarray | None]:
    """The bound of ``sum x w`` over the raw input, and ``-x_zp * sum(w)`` per output channel (None
    when there is no zero point to fold).

    With the padding holding ``x_zp``, ``sum (x - x_zp) w = sum x w - x_zp sum w`` on every window,
    so the columns become a plain converting copy of ``x`` (measured: about 25 % faster than
    converting and subtracting) and the constant joins the bias; the caller folds only when the raw
    sums stay exact.
    """
    if x.dtype.kind not in "iu" or x.dtype.itemsize > 2 or int(x_zp) == 0:
        return float("inf"), None
    info = np.iinfo(x.dtype)
    raw_bound = max(abs(int(info.min)), abs(int(info.max))) * w_sum
    return raw_bound, -int(x_zp) * ws.reshape(ws.shape[0], -1).sum(axis=1)


def _requantize_conv(
    acc: np.ndarray,
    bound: float,
    bias: np.ndarray | None,
    multiplier: np.ndarray,
    y_zp: np.ndarray | int,
    dtype: np.dtype,
    scheme: Scheme,
) -> np.ndarray:
    """Add the bias and requantize; stays in float when every value is an exact float32 integer."""
    bias_max = float(np.abs(bias).max(initial=0)) if bias is not None else 0.0
    exact_in_float = acc.dtype.kind == "f" and bound + bias_max < (2.0**24 if acc.dtype == np.float32 else 2.0**53)
    if exact_in_float and scheme.multiplier in ("float32", "float64") and bound + bias_max < 2.0**31:
        if bias is not None:
            acc += bias.astype(acc.dtype)  # exact: no int32 overflow, no float rounding
        return arith.requantize(acc, multiplier, y_zp, dtype, scheme, "gemm", overwrite=True)
    acc = arith.accumulate(acc.astype(np.int64), scheme)
    if bias is not None:
        acc = arith.accumulate(acc + bias.astype(np.int64), scheme)
    return arith.requantize(acc, multiplier, y_zp, dtype, scheme, "gemm")


@kernel("", "QLinearConv", 10, scheme=True)
def qlinear_conv(
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray,
    w: np.ndarray,
    w_scale: np.ndarray,
    w_zero_point: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray,
    B: np.ndarray | None = None,
    *,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
    scheme: Scheme,
) -> tuple[np.ndarray]:
    """int32 accumulate (+ bias), then requantize with the scheme (per output channel scale)."""
    attrs = dict(
        auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads, strides=strides
    )
    w = arith.clamp_weights(w, scheme)
    multiplier = arith.real_multiplier([x_scale, np.asarray(w_scale).reshape(-1)], y_scale, scheme)
    dtype = np.asarray(y_zero_point).dtype if y_zero_point is not None else x.dtype
    y_zp = 0 if y_zero_point is None else y_zero_point
    bias = None if B is None else np.asarray(B).reshape((-1,) + (1,) * (x.ndim - 2))
    multiplier = multiplier.reshape((-1,) + (1,) * (x.ndim - 2))

    def requantizer_for(bound: float, ftype: type) -> Requantizer | None:
        """Requantize each chunk in float while it is in cache, when that is exact (see ``_requantize_conv``)."""
        bias_max = float(np.abs(bias).max(initial=0)) if bias is not None else 0.0
        kind_type = {"float32": np.float32, "float64": np.float64}.get(scheme.multiplier)
        if kind_type is not ftype or bound + bias_max >= (2.0**24 if ftype is np.float32 else 2.0**31):
            return None
        m = multiplier.astype(ftype)

        def finish(chunk: np.ndarray, dest: np.ndarray) -> None:
            np.multiply(chunk, m, out=chunk)
            arith.requantize_float(chunk, y_zp, dtype, scheme, "gemm", out=dest)

        return Requantizer(None if bias is None else bias.reshape(-1).astype(np.int64), finish, np.dtype(dtype))

    acc, bound, done = conv_integer_acc(x, x_zero_point, w, w_zero_point, attrs, scheme, requantizer_for)
    if done:
        return (acc,)
    return (_requantize_conv(acc, bound, bias, multiplier, y_zp, dtype, scheme),)


@kernel("", "ConvInteger", 10, scheme=True)
def conv_integer(
    x: np.ndarray,
    w: np.ndarray,
    x_zero_point: np.ndarray | None = None,
    w_zero_point: np.ndarray | None = None,
    *,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
    scheme: Scheme,
) -> tuple[np.ndarray]:
    """int32 ``sum (x - x_zp)(w - w_zp)``; padding contributes zero."""
    attrs = dict(
        auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads, strides=strides
    )
    x_zp = 0 if x_zero_point is None else x_zero_point
    w_zp = 0 if w_zero_point is None else w_zero_point
    # onnxruntime's ConvInteger sums exactly on every x86 CPU (measured on AVX2: no pair saturation)
    exact = scheme.replace(accumulator="wrap32", pair_saturation=False)
    acc, _, _ = conv_integer_acc(x, x_zp, w, w_zp, attrs, exact)
    acc = arith.accumulate(acc.astype(np.int64), exact)
    return (acc.astype(np.int32),)


@kernel("", "Conv", 1, float_op=True)
def conv(
    X: np.ndarray,
    W: np.ndarray,
    B: np.ndarray | None = None,
    *,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> tuple[np.ndarray]:
    """Float convolution (im2col + float BLAS in the input's precision)."""
    attrs = dict(
        auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads, strides=strides
    )
    pad_list, stride, dilation, groups = _geometry(X, W, attrs)
    dtype = X.dtype.type
    y = conv_core(X, W.astype(dtype), groups, stride, dilation, dtype, pads=pad_list)
    if B is not None:
        y += B.astype(dtype).reshape((-1,) + (1,) * (X.ndim - 2))
    return (y,)
