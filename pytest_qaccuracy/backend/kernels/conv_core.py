"""The convolution driver: choose a path, cut the output into chunks, run them on the session's threads.

:func:`conv_core` computes ``sum x*w (+ bias)`` over the windows of an input. Each way of computing
a chunk is a :class:`ConvPath`: it prepares its weights once, says how much scratch an output row
needs, and computes one chunk's sums. :func:`choose_path` picks one from the convolution's shape:

==================  =================================================  ==================================
path                when                                               how (module)
==================  =================================================  ==================================
``NhwcPath``        2-D depthwise on at most 32 outputs per channel     taps, channels last
``GroupedRowPath``  2-D, exact sums, grouped or depthwise               kernel rows as GEMMs on blocks of
                                                                       groups (conv_gemm)
``FlatPath``        2-D float depthwise, stride 1, >= 64 columns        taps on the padded width
``NhwcPath``        2-D float depthwise, more channels than columns     taps, channels last
``RowsPath``        other 2-D float depthwise                           taps, channels first
``OrtPath``         2-D, exact float32 sums, large, weights constant    onnxruntime's Conv (conv_ort)
``Im2colPath``      the rest                                            im2col + one GEMM (conv_gemm)
==================  =================================================  ==================================

Exact one-group convolutions that onnxruntime does not compute take ``Im2colPath`` on a padded copy:
the kernel rows' GEMMs were 0.87-1.15x as fast on whole nets (``docs/performance.md``).

``OrtPath`` is chosen by the caller (``weights=``) rather than by :func:`choose_path`: only the
caller knows the weights are a constant that lives across runs, whose session is worth building.

After a path, the driver adds the int16 pair correction, then the bias, then runs the epilogue
(e.g. requantization) while the chunk is in cache.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Hashable
from typing import ClassVar

import numpy as np

from pytest_qaccuracy.backend import parallel
from pytest_qaccuracy.backend.kernels import conv_chunks, conv_ort, conv_pairs
from pytest_qaccuracy.backend.kernels.conv_chunks import (
    Chunk,
    Source,
    chunk_spans,
    convert,
    output_shape,
    scratch_buffer,
)
from pytest_qaccuracy.backend.kernels.conv_depthwise import (
    depthwise_flat_chunk,
    depthwise_nhwc_chunk,
    depthwise_rows_chunk,
)
from pytest_qaccuracy.backend.kernels.conv_gemm import (
    block_weights,
    groups_per_block,
    im2col_chunk,
    row_classes,
    row_gemm_chunk,
)

Epilogue = Callable[[np.ndarray, np.ndarray], None]

#: output columns from which a float depthwise convolution of stride 1 runs on the padded width
FLAT_MIN_COLUMNS = 64


@dataclasses.dataclass(frozen=True, slots=True)
class Conv:
    """One convolution as the paths see it.

    ``x`` is the padded input ``(N, C, *spatial)``, or, for the 2-D paths, a :class:`Source` reading
    the unpadded one; ``w`` is ``(M, C/group, *kernel)``.
    """

    x: np.ndarray | Source
    w: np.ndarray
    group: int
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    dtype: type
    out_spatial: tuple[int, ...]
    #: ``(array, key)``: the constant the weights come from and what else made them (for ``OrtPath``)
    weights: tuple[np.ndarray, Hashable] | None = None
    #: intra-op threads of each onnxruntime call (for ``OrtPath``)
    threads: int = 1

    @property
    def kernel_shape(self) -> tuple[int, ...]:
        return self.w.shape[2:]

    @property
    def channels(self) -> int:
        x = self.x.x if isinstance(self.x, Source) else self.x
        return x.shape[1]

    @property
    def taps(self) -> list[tuple[int, ...]]:
        return list(itertools.product(*(range(k) for k in self.kernel_shape)))


class ConvPath:
    """One way to compute a chunk of a convolution's sums."""

    def __init__(self, conv: Conv) -> None:
        """Prepare the weights once."""
        self.conv = conv

    def scratch_per_row(self) -> int:
        """Scratch elements per output row (of the first spatial axis), per record and output column."""
        raise NotImplementedError

    def budget(self) -> int | None:
        """The chunk's scratch budget in elements; None: the default of :func:`chunk_spans`."""
        return None

    def sums(self, chunk: Chunk, dest: np.ndarray | None) -> np.ndarray:
        """The chunk's sums ``(n, M, rows, *out[1:])``, written into ``dest`` when given and possible."""
        conv = self.conv
        if dest is None:
            lead = chunk.lead
            dest = scratch_buffer(conv.w.shape[0] * math.prod(lead), conv.dtype, "target")
            dest = dest.reshape(lead[0], conv.w.shape[0], *lead[1:])
        self.compute(chunk, dest)
        return dest

    def compute(self, chunk: Chunk, target: np.ndarray) -> None:
        """Write the chunk's sums into ``target (n, M, rows, *out[1:])``."""
        raise NotImplementedError


class GroupedRowPath(ConvPath):
    """Exact 2-D sums of a grouped convolution by kernel rows (:func:`~.conv_gemm.row_gemm_chunk`):
    blocks of groups, each a block-diagonal dense GEMM."""

    def __init__(self, conv: Conv) -> None:
        super().__init__(conv)
        blocks = self.blocks()
        dense = self.dense_weights(blocks)
        self.classes = row_classes(dense, conv.strides[0], conv.dilations[0], conv.dtype)
        source = conv.x
        n, c = source.x.shape[:2]
        self.source = dataclasses.replace(source, x=source.x.reshape(n, blocks, c // blocks, *source.x.shape[2:]))

    def blocks(self) -> int:
        """Dense convolutions the groups make."""
        conv = self.conv
        return conv.group // groups_per_block(conv.group, conv.channels // conv.group)

    def dense_weights(self, blocks: int) -> np.ndarray:
        """``(blocks, M/blocks, C/blocks, kh, kw)``."""
        return block_weights(self.conv.w, self.conv.group, blocks)

    def scratch_per_row(self) -> int:
        conv = self.conv
        return len(conv.taps) * conv.channels + conv.kernel_shape[0] * conv.w.shape[0]

    def compute(self, chunk: Chunk, target: np.ndarray) -> None:
        row_gemm_chunk(self.source, self.classes, target, self.conv.kernel_shape[1], chunk)


class DepthwisePath(ConvPath):
    """2-D float depthwise from the unpadded input: one input channel per group, tap by tap (the
    subclasses say in which layout). Other ranks take :class:`Im2colPath`, which was faster there
    (``bench/conv_paths.py``: a 1-d depthwise k5 layer 6.9 against 12.9 ms)."""

    def __init__(self, conv: Conv) -> None:
        super().__init__(conv)
        m = conv.w.shape[0]
        self.wt = conv.w.reshape(conv.group, m // conv.group, len(conv.taps)).astype(conv.dtype)

    #: scratch arrays of the chunk's output size: its output and one product
    outputs: ClassVar[int] = 2

    def scratch_per_row(self) -> int:
        conv = self.conv
        return conv.channels * math.prod(conv.strides) + self.outputs * conv.w.shape[0]

    def budget(self) -> int | None:
        return conv_chunks.DEPTHWISE_CHUNK_ELEMENTS


class RowsPath(DepthwisePath):
    """2-D float depthwise, channels first, reading the chunk's input rows from the unpadded input."""

    def compute(self, chunk: Chunk, target: np.ndarray) -> None:
        depthwise_rows_chunk(self.conv.x, self.wt, target, self.conv.kernel_shape, chunk)


class NhwcPath(DepthwisePath):
    """2-D float depthwise, channels last: for more channels than output columns."""

    outputs = 3

    def compute(self, chunk: Chunk, target: np.ndarray) -> None:
        depthwise_nhwc_chunk(self.conv.x, self.wt, target, self.conv.kernel_shape, chunk)


class FlatPath(DepthwisePath):
    """2-D float depthwise of stride 1 on the padded width: for long rows."""

    def budget(self) -> int | None:
        return None

    def sums(self, chunk: Chunk, dest: np.ndarray | None) -> np.ndarray:
        """Computed on the padded width in scratch; the columns past the output's are dropped."""
        conv = self.conv
        lead, m = chunk.lead, conv.w.shape[0]
        wide = (lead[2] - 1) + (conv.kernel_shape[1] - 1) * conv.dilations[1] + 1
        result = scratch_buffer(m * lead[0] * lead[1] * wide, conv.dtype, "target").reshape(lead[0], m, lead[1], wide)
        depthwise_flat_chunk(conv.x, self.wt, result, conv.kernel_shape, chunk)
        return result[..., : lead[2]]


class Im2colPath(ConvPath):
    """im2col and one (grouped, batched) GEMM per chunk (:func:`~.conv_gemm.im2col_chunk`)."""

    def __init__(self, conv: Conv) -> None:
        super().__init__(conv)
        group, taps = conv.group, len(conv.taps)
        m, cg = conv.w.shape[:2]
        # (G, Mg, taps * Cg), K ordered (tap, channel) like the columns
        wmat = np.moveaxis(conv.w.reshape(group, m // group, cg, taps), 3, 2).reshape(group, m // group, taps * cg)
        self.wmat = np.ascontiguousarray(wmat, dtype=conv.dtype)

    def scratch_per_row(self) -> int:
        conv = self.conv
        return len(conv.taps) * conv.channels + conv.w.shape[0]

    def compute(self, chunk: Chunk, target: np.ndarray) -> None:
        whole = chunk.lead[1] == self.conv.out_spatial[0]
        im2col_chunk(self.conv.x, self.wmat, target, self.conv.taps, chunk, whole)


class OrtPath(ConvPath):
    """Exact 2-D sums by onnxruntime's float32 convolution (:mod:`.conv_ort`): whole records per chunk."""

    def __init__(self, conv: Conv) -> None:
        super().__init__(conv)
        source = conv.x
        assert isinstance(source, Source) and conv.weights is not None
        array, key = conv.weights
        geometry = (conv.group, conv.strides, conv.dilations, tuple(source.pads), np.dtype(conv.dtype).str)
        self.session = conv_ort.session_for(
            array,
            (key, geometry),
            lambda: conv_ort.conv_model(conv.w, conv.group, conv.strides, conv.dilations, source.pads),
            conv.threads,
        )

    def sums(self, chunk: Chunk, dest: np.ndarray | None) -> np.ndarray:
        """The chunk's records converted to ``x - offset`` in float32, then one onnxruntime call."""
        source = self.conv.x
        x = source.x[slice(*chunk.records)]
        converted = scratch_buffer(x.size, np.float32, "ort-input").reshape(x.shape)
        convert(x, source.offset, converted)
        return self.session.run(None, {"x": converted})[0]


#: depthwise layers with at most this many outputs per channel run channels last even when exact: on
#: tiny maps (4x6, 5x5 taps, 384 channels) the tap loop beats the block-diagonal GEMMs by about 20 %
NHWC_MAX_POSITIONS = 32


def choose_path(
    from_source: bool,
    exact: bool,
    group: int,
    c: int,
    mg: int,
    strides: tuple[int, ...],
    width: int,
    positions: int | None = None,
) -> type[ConvPath]:
    """The path of a convolution (see the table in this module's docstring).

    ``from_source``: a 2-D convolution whose input is read unpadded (grouped and exact, or depthwise);
    ``width`` and ``positions``: the output's columns and outputs per channel.
    """
    depthwise = c == group > 1
    if not from_source or group == 1:
        return Im2colPath
    if depthwise and mg == 1 and positions is not None and positions <= NHWC_MAX_POSITIONS:
        return NhwcPath
    if exact:
        return GroupedRowPath
    if tuple(strides) == (1, 1) and width >= FLAT_MIN_COLUMNS:
        return FlatPath
    return NhwcPath if mg == 1 and c >= width else RowsPath


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
    bias: np.ndarray | None = None,
    correction: conv_pairs.Correction | None = None,
    weights: tuple[np.ndarray, Hashable] | None = None,
) -> np.ndarray:
    """``sum x*w (+ bias)`` over the windows of a padded input, chunk by chunk on the session's threads.

    Args:
        xp: padded input ``(N, C, *spatial)``, values exact in ``dtype``; or, with ``pads``, the
            unpadded input, read as ``xp - offset`` zero-padded by ``pads`` (the 2-D paths then read
            it directly, without a padded copy).
        w: weights ``(M, C/group, *kernel)``.
        group: number of groups.
        strides: strides per spatial axis.
        dilations: dilations per spatial axis.
        dtype: float type of the GEMMs.
        epilogue: ``(fn, out_dtype)``: ``fn(chunk, dest)`` writes each finished chunk's values (the
            chunk is scratch and may be overwritten) into ``dest``, a view of the ``out_dtype``
            output, e.g. requantization while the chunk is still in cache.
        exact: the sums are exact in ``dtype`` (integer operands under the bound), so they may be
            added in any order: grouped 2-D kernels then take the row path.
        pads: begin then end pads of an unpadded ``xp``.
        offset: subtracted from an unpadded ``xp`` (the input's zero point).
        bias: ``(M,)`` added to every sum before the epilogue, by one pass over each chunk.
        correction: the int16 pair saturation of ``conv_pairs``, added to each chunk's sums before the
            bias pass and the epilogue; exactness is the caller's.
        weights: ``(array, key)``: ``w`` is derived from the constant ``array`` and ``key`` alone, and
            onnxruntime is to compute the sums (``OrtPath``); the caller checked that they are exact
            float32 sums of a 2-D convolution and worth it
            (:func:`~.conv_ort.worth_it`).

    Returns:
        ``(N, M, *out)``.
    """
    kernel_shape = w.shape[2:]
    n, c = xp.shape[:2]
    m = w.shape[0]
    depthwise = c // group == 1 and group > 1
    x: np.ndarray | Source
    in_onnxruntime = weights is not None
    if len(kernel_shape) == 2 and (depthwise or in_onnxruntime or (exact and group > 1)):  # read unpadded
        x = Source(xp, [0] * 4 if pads is None else list(pads), offset if pads is not None else 0)
        padded_spatial = x.padded_spatial
    else:
        x = xp if pads is None else conv_chunks.to_padded(xp, pads, offset, dtype)
        padded_spatial = x.shape[2:]
    out_spatial = output_shape(padded_spatial, kernel_shape, strides, dilations)
    kind = (
        OrtPath
        if in_onnxruntime
        else choose_path(
            isinstance(x, Source), exact, group, c, m // group, strides, out_spatial[-1], math.prod(out_spatial)
        )
    )
    threads = parallel.current()
    conv = Conv(x, w, group, strides, dilations, dtype, out_spatial, weights, 1 if n >= threads else threads)
    path = kind(conv)
    out = np.empty((n, m, *out_spatial), dtype=epilogue[1] if epilogue else dtype)
    added = None if bias is None else np.asarray(bias, dtype).reshape((m,) + (1,) * len(out_spatial))

    def _chunk(span: tuple[int, int, int, int]) -> Chunk:
        n0, n1, o0, o1 = span
        return Chunk((n0, n1), o0, (n1 - n0, o1 - o0, *out_spatial[1:]), strides, dilations)

    def run_chunk(n0: int, n1: int, o0: int, o1: int) -> None:
        dest = out[n0:n1, :, o0:o1]
        finish_chunk(n0, n1, o0, o1, path.sums(_chunk((n0, n1, o0, o1)), None if epilogue else dest))

    def finish_chunk(n0: int, n1: int, o0: int, o1: int, sums: np.ndarray) -> None:
        dest = out[n0:n1, :, o0:o1]
        if correction is not None:
            correction.add_to(sums, n0, n1, o0, o1)
        if added is not None:
            sums += added
        if epilogue:
            epilogue[0](sums, dest)
        elif sums is not dest:
            np.copyto(dest, sums)

    if in_onnxruntime:
        outputs = m * math.prod(out_spatial)
        macs = n * outputs * (w[0].size + (correction is not None) * CORRECTION_MACS)
        spans = _record_spans(n, outputs, threads if macs >= MIN_PARALLEL_MACS else 1, out_spatial[0])
    else:
        spans = chunk_spans(n, out_spatial[0], path.scratch_per_row() * math.prod(out_spatial[1:]), path.budget())
    if correction is not None:
        correction.before_chunks(dtype)
    parallel.run_all([lambda span=span: run_chunk(*span) for span in spans])
    return out


#: multiply-adds of a convolution below which its chunks run on one thread: a hand-off to another
#: thread and back costs about what onnxruntime computes in the meantime
MIN_PARALLEL_MACS = 1 << 24
#: multiply-adds one output's pair correction is counted as, for :data:`MIN_PARALLEL_MACS`
CORRECTION_MACS = 64

#: output elements of one onnxruntime call: a call costs tens of microseconds, and the epilogue
#: that follows wants its chunk in cache
ORT_CHUNK_ELEMENTS = 1 << 18


def _record_spans(n: int, per_record: int, threads: int, rows: int) -> list[tuple[int, int, int, int]]:
    """Chunks of whole records for ``OrtPath``: about ``ORT_CHUNK_ELEMENTS`` outputs each, as many
    as a multiple of the threads (one chunk on one thread's worth of records)."""
    records = max(1, ORT_CHUNK_ELEMENTS // max(per_record, 1))
    count = -(-n // records)
    if threads > 1 and n >= threads:
        count = -(-max(count, threads) // threads) * threads
    records = -(-n // count)
    return [(n0, min(n, n0 + records), 0, rows) for n0 in range(0, n, records)]
