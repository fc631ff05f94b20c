"""Convolutions as GEMMs: im2col, and the row path of exact 2-D convolutions.

* :func:`im2col_chunk` copies, for each kernel tap, the shifted input plane into a column matrix
  ``(taps * C/groups, rows)``, then runs one batched ``W @ cols`` per chunk;
* :func:`row_gemm_chunk` reads the unpadded input by kernel rows (:class:`RowClass`): the kernel rows
  share input rows, so its columns are a fraction of im2col's. Grouped convolutions run as blocks of
  groups, each a block-diagonal dense GEMM (:func:`block_weights`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from pytest_qaccuracy.backend.kernels.conv_chunks import Chunk, Source, scratch_buffer


def im2col_chunk(
    xp: np.ndarray,
    wmat: np.ndarray,
    target: np.ndarray,
    taps: list[tuple[int, ...]],
    chunk: Chunk,
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
        cols = scratch_buffer(len(taps) * c * math.prod(lead), wmat.dtype.type).reshape(
            lead[0], len(taps), c, *lead[1:]
        )
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
class RowClass:
    """Kernel rows whose input rows share one residue modulo the vertical stride.

    Kernel row ``i`` of output row ``r`` reads padded row ``s * r + i * dh``; with ``q = i * dh % s``
    and ``shift = i * dh // s`` that is row ``shift + r`` of the rows ``q, q + s, q + 2s, ...``.
    """

    residue: int
    shifts: tuple[int, ...]
    weights: np.ndarray  # (blocks, len(shifts) * M, kw * C), kernel rows stacked like the shifts


def row_classes(w: np.ndarray, stride: int, dilation: int, dtype: type) -> list[RowClass]:
    """The kernel rows of ``w (blocks, M, C, kh, kw)`` grouped by residue, each with its GEMM weights."""
    blocks, m, c, kh, kw = w.shape
    wrows = np.transpose(w, (0, 3, 1, 4, 2)).reshape(blocks, kh, m, kw * c)  # K ordered (tap j, channel)
    classes = []
    for q in range(stride):
        rows = [i for i in range(kh) if i * dilation % stride == q]
        if rows:
            weights = wrows[:, rows].reshape(blocks, len(rows) * m, kw * c)
            weights = np.ascontiguousarray(weights, dtype=dtype)
            classes.append(RowClass(q, tuple(i * dilation // stride for i in rows), weights))
    return classes


def groups_per_block(group: int, cg: int) -> int:
    """Groups merged into one block-diagonal GEMM on the row path: two one-channel groups (the
    fastest block for depthwise layers, see docs/performance.md); wider groups alone."""
    return 2 if cg == 1 and group % 2 == 0 else 1


def block_weights(w: np.ndarray, group: int, blocks: int) -> np.ndarray:
    """``w (M, C/group, kh, kw)`` as ``blocks`` dense convolutions ``(blocks, M/blocks, C/blocks, kh, kw)``,
    each holding ``group/blocks`` groups on its diagonal (zeros elsewhere: exact, and BLAS-sized)."""
    m, cg, kh, kw = w.shape
    per, mg = group // blocks, m // group
    dense = np.zeros((blocks, per, mg, per, cg, kh, kw), w.dtype)
    grouped = w.reshape(blocks, per, mg, cg, kh, kw)
    for g in range(per):
        dense[:, g, :, g] = grouped[:, g]
    return dense.reshape(blocks, per * mg, per * cg, kh, kw)


def row_gemm_chunk(source: Source, classes: list[RowClass], target: np.ndarray, kw: int, chunk: Chunk) -> None:
    """A 2-D chunk by kernel rows: for each residue class, columns of the ``kw`` horizontal taps of
    every input row of that class the chunk reads, one GEMM giving each of the class's kernel rows'
    contribution on every such row, then the contributions added with each kernel row's shift.

    With vertical stride 1 (one class) a 3x3 kernel's columns are a third of im2col's, since the
    kernel rows share input rows; with stride 2, two thirds. The GEMM has (rows of the class) x M
    outputs, which BLAS runs better than M when M is small. The partial sums are exact integers
    under the same bound as the whole sum, so the result is bit-identical.

    ``source.x`` is ``(N, blocks, C, H, W)`` and each block its own GEMM (one block for an ordinary
    convolution; grouped ones as block-diagonal dense blocks, see :func:`block_weights`);
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
        k = cls.weights.shape[2]  # kw * c
        matrix = scratch_buffer(n * blocks * k * span * width, cls.weights.dtype.type).reshape(
            n, blocks, k, span * width
        )
        cols = matrix.reshape(n, blocks, kw, c, span, width)
        for j in range(kw):
            source.fill(cols[:, :, j], chunk.records, (chunk.o0 * s + cls.residue, s), (j * dw, step))
        if cls.shifts == (0,) and len(classes) == 1 and target.flags.c_contiguous:  # one kernel row: no sums
            np.matmul(cls.weights, matrix, out=target.reshape(n, blocks, m, -1))
            return
        shape = (n, blocks, len(cls.shifts), m, span, width)
        parts = scratch_buffer(math.prod(shape), cls.weights.dtype.type, "rows").reshape(shape)
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
