"""Depthwise convolutions in float: one input channel per group, multiply-accumulate tap by tap.

Each function computes one chunk (:class:`~.conv_chunks.Chunk`) into ``target``, vectorised over
everything but the taps. ``wt`` holds the weights as ``(groups, M/groups, taps)``.

All 2-D, reading the unpadded input through a :class:`~.conv_chunks.Source`:
:func:`depthwise_rows_chunk` (channels first), :func:`depthwise_nhwc_chunk` (channels last, for more
channels than output columns) and :func:`depthwise_flat_chunk` (stride 1 on the padded width, for
long rows).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable

import numpy as np

from pytest_qaccuracy.backend.kernels.conv_chunks import Chunk, Source, scratch_buffer


def _chunk_rows(
    source: Source, chunk: Chunk, kernel_shape: tuple[int, ...], dtype: type, channels_last: bool = False
) -> np.ndarray:
    """The padded input rows a 2-D chunk reads, converted once into scratch: ``(n, C, rows, cols)``,
    or ``(n, rows, cols, C)`` with ``channels_last``."""
    (kh, kw), (sh, sw), (dh, dw) = kernel_shape, chunk.strides, chunk.dilations
    n, rows, width = chunk.lead
    c = source.x.shape[1]
    span, wide = (rows - 1) * sh + (kh - 1) * dh + 1, (width - 1) * sw + (kw - 1) * dw + 1
    shape = (n, span, wide, c) if channels_last else (n, c, span, wide)
    local = scratch_buffer(math.prod(shape), dtype, "padded").reshape(shape)
    source.fill(local.transpose(0, 3, 1, 2) if channels_last else local, chunk.records, (chunk.o0 * sh, 1), (0, 1))
    return local


def _multiply_accumulate(terms: Iterable[tuple[np.ndarray, np.ndarray]], acc: np.ndarray) -> None:
    """``acc = sum x * w`` over the terms, with one product buffer (no temporary per term)."""
    product = scratch_buffer(acc.size, acc.dtype.type, "product").reshape(acc.shape)
    for t, (x, w) in enumerate(terms):
        if t == 0:
            np.multiply(x, w, out=acc)
        else:
            np.multiply(x, w, out=product)
            acc += product


def _tap_slices(chunk: Chunk, i: int, j: int) -> tuple[slice, slice]:
    """Rows and columns of a chunk's padded input rows that kernel tap ``(i, j)`` reads."""
    (sh, sw), (dh, dw) = chunk.strides, chunk.dilations
    _, rows, width = chunk.lead
    return slice(i * dh, i * dh + (rows - 1) * sh + 1, sh), slice(j * dw, j * dw + (width - 1) * sw + 1, sw)


def depthwise_rows_chunk(
    source: Source, wt: np.ndarray, target: np.ndarray, kernel_shape: tuple[int, ...], chunk: Chunk
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


def depthwise_nhwc_chunk(
    source: Source, wt: np.ndarray, target: np.ndarray, kernel_shape: tuple[int, ...], chunk: Chunk
) -> None:
    """A 2-D depthwise chunk (one output per channel) computed channels last: the chunk's padded input
    rows are converted once into ``(n, rows, columns, C)`` scratch, each tap multiplies a view whose
    innermost run is ``columns x C`` long (stride 1) or ``C`` (wider strides), and the result is
    transposed into ``target (n, C, rows, width)`` once."""
    local = _chunk_rows(source, chunk, kernel_shape, wt.dtype.type, channels_last=True)
    n, rows, width = chunk.lead
    c = local.shape[3]
    acc = scratch_buffer(n * rows * width * c, wt.dtype.type, "channels-last").reshape(n, rows, width, c)
    weights = wt.reshape(c, -1)
    tile = chunk.strides[1] == 1  # the weights repeated along the columns: runs of columns x C

    def term(t: int, i: int, j: int) -> tuple[np.ndarray, np.ndarray]:
        return local[(slice(None), *_tap_slices(chunk, i, j))], np.tile(weights[:, t], (width, 1)) if tile else weights[
            :, t
        ]

    taps = itertools.product(range(kernel_shape[0]), range(kernel_shape[1]))
    _multiply_accumulate((term(t, i, j) for t, (i, j) in enumerate(taps)), acc)
    np.copyto(target, acc.transpose(0, 3, 1, 2))


def depthwise_flat_chunk(
    source: Source, wt: np.ndarray, result: np.ndarray, kernel_shape: tuple[int, ...], chunk: Chunk
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
