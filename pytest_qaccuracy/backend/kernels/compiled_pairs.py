"""The int16 pair saturation of u8 x s8 convolutions, corrected by one compiled loop (optional).

With the ``compiled`` extra (numba) installed, :class:`CompiledCorrection` takes the place of the
numpy ways of ``conv_pairs`` for 1-d and 2-d convolutions: every risky weight pair is evaluated at
every output of a chunk, and ``sat16(p) - p`` added to the chunk's sums while they are in cache.
numpy needs about nine whole-array passes per evaluation (gathers, two products, the sum, the clip,
the difference, a reduction per channel) and searches to skip most evaluations; the loop needs one
pass, vectorized by LLVM, at about 0.15 ns per evaluation on the bench nets against 1.4 ns. The
result is the same integers: the same pairs, inputs and arithmetic (``tests/backend`` checks the
two against each other and against onnxruntime's recorded AVX2 results).

How the loop stays vectorized: each record is copied into a padded plane per channel it reads (the
zero point around it, as onnxruntime pads), so that no row reads past an edge. Rows of at least 32
outputs then run one by one, straight into the sums. Shorter rows (4 to 31 outputs: too short for
the vector loop) run as one loop over the plane: at stride 1 an output ``(i, j)`` of a tap at offset
``(dy, dx)`` reads the padded input at ``f + dy * width + dx``, with ``f = i * width + j``, so one
contiguous loop over ``f`` covers every row of the chunk; the ``width - out_w`` positions between
rows are evaluated too and dropped when the plane is added to the sums. Strided convolutions and the
counts of the saturation report (which must not count those positions) run row by row. A row whose
two input rows' largest values cannot take the pair past int16 is skipped.

``QACCURACY_COMPILED=0`` turns it off (the numpy ways only). numba compiles the loop on its first
use in a process, and keeps it in its cache (beside this file, or in ``NUMBA_CACHE_DIR``).
"""

from __future__ import annotations

import importlib
import os
import threading
import warnings
from collections.abc import Callable, Sequence

import numpy as np

from pytest_qaccuracy.backend import pairs

_loaded: dict[str, Callable | None] = {}
_lock = threading.Lock()


def available() -> bool:
    """Whether the compiled loop runs here: numba importable and not turned off."""
    if os.environ.get("QACCURACY_COMPILED", "1") == "0":
        return False
    return _kernel() is not None


def _kernel() -> Callable | None:
    with _lock:
        if "correct" not in _loaded:
            _loaded["correct"] = _compile()
        return _loaded["correct"]


def _compile() -> Callable | None:
    """The loop, compiled for float32 sums and tried on a tiny convolution; None without numba, with
    numba's JIT turned off (``NUMBA_DISABLE_JIT``: the loop would run as Python), or where numba
    cannot load or compile it (a warning says why; the numpy ways give the same sums)."""
    try:
        loops = importlib.import_module("pytest_qaccuracy.backend.kernels._pair_loops")
    except ImportError:
        return None
    except Exception as exc:  # e.g. numba finds no writable cache folder for the loop
        _declined(exc)
        return None
    if loops.numba.config.DISABLE_JIT:
        return None
    try:
        _try(loops.correct)
    except Exception as exc:  # a numba that cannot compile here: the numpy ways instead
        _declined(exc)
        return None
    return loops.correct


def _declined(exc: Exception) -> None:
    first = str(exc).splitlines()[0] if str(exc) else ""
    warnings.warn(
        f"pytest-qaccuracy: numba cannot compile the pair correction loop ({type(exc).__name__}: {first}); "
        "using the numpy ways",
        RuntimeWarning,
        stacklevel=3,
    )


def _try(correct: Callable) -> None:
    """One record ``[255, 255]``, one pair of a 1x2 kernel of weights 127, padded by one zero on the
    left: the first output reads ``(0, 255)`` and stays in int16, the second ``(255, 255)``: ``64770``
    saturates to 32767, a correction of -32003."""
    geometry = np.array([1, 1, 2, 0, 1, 1, 3, 1, 1, 2, 0], np.int64)  # one row of 2, left pad 1
    first, second = np.array([[0, 0, 0]], np.int64), np.array([[0, 0, 1]], np.int64)
    weights, column, used = np.array([127], np.int32), np.array([0], np.int64), np.array([0], np.int64)
    out = np.zeros(2, np.float32)
    steps = np.array([2, 2, 2], np.int64)
    x = np.array([255, 255], np.uint8)
    scratch = (np.empty(3, np.uint8), np.empty(2, np.float32), np.empty(1, np.uint8))
    correct(
        x,
        geometry,
        first,
        second,
        weights,
        weights,
        column,
        used,
        out,
        steps,
        np.zeros(0, np.int64),
        0,
        1,
        0,
        1,
        0,
        *scratch,
    )
    if out.tolist() != [0.0, -32003.0]:
        raise ArithmeticError(f"the loop computed {out.tolist()} for [0, -32003]")


def _taps(k: np.ndarray, cg: int, g: int, kernel: tuple[int, int], dilations: tuple[int, int]) -> np.ndarray:
    """``(entries, 3)``: the input channel and the (row, column) offset that im2col row ``k`` of group
    ``g`` reads (the channels-last order: ``k = tap * cg + channel``)."""
    tap, channel = np.divmod(k, cg)
    rows, cols = np.unravel_index(tap, kernel)
    return np.stack([g * cg + channel, rows * dilations[0], cols * dilations[1]], axis=1).astype(np.int64)


def _entries(
    found: Sequence[tuple[int, pairs.RiskyPairs]], cg: int, mg: int, kernel: tuple[int, int], dilations: tuple[int, int]
) -> list[np.ndarray]:
    """The loop's view of the risky pairs: where each pair's two inputs lie, its weights, its output
    channel (made once per set of pairs: a session's runs mostly hand out the same ones)."""
    parts = [
        (
            _taps(r.first, cg, g, kernel, dilations),
            _taps(r.first + 1, cg, g, kernel, dilations),
            r.w_first.astype(np.int32),
            r.w_second.astype(np.int32),
            (g * mg + r.column).astype(np.int64),
        )
        for g, r in found
    ]
    fields = [np.ascontiguousarray(np.concatenate(field)) for field in zip(*parts, strict=True)]
    return [*fields, np.unique(np.concatenate([fields[0][:, 0], fields[1][:, 0]]))]  # and the channels read


def _flat(target: np.ndarray) -> np.ndarray | None:
    """A 1-d view of the memory from ``target``'s first element to its last, or None when its rows
    are not contiguous (the loop's strides then cannot address it)."""
    strides = target.strides
    if not target.size or strides[-1] != target.itemsize or any(s < 0 or s % target.itemsize for s in strides):
        return None
    extent = 1 + sum((size - 1) * stride for size, stride in zip(target.shape, target.strides, strict=True))
    return np.lib.stride_tricks.as_strided(target, shape=(extent // target.itemsize,), strides=(target.itemsize,))


def _as_2d(values: Sequence[int], fill: int) -> tuple[int, int]:
    return (fill, values[0]) if len(values) == 1 else (values[0], values[1])


class CompiledCorrection:
    """The correction of a 1-d or 2-d convolution, added by the compiled loop to each chunk's sums
    (``conv_core``) while they are in cache: no array of the whole correction is made.

    Args:
        x: the raw uint8 input ``(N, C, *spatial)``.
        x_zp: its zero point (what the padding holds).
        found: each group's risky pairs (``pairs.PairBounds.risky``), columns ascending.
        total: the pair sums the convolution computes (for the saturation report).
        row_max: each im2col row's largest input of a group (for :meth:`max_abs`).
    """

    def __init__(
        self,
        x: np.ndarray,
        x_zp: int,
        pads: Sequence[int],
        found: Sequence[tuple[int, pairs.RiskyPairs]],
        cg: int,
        mg: int,
        m: int,
        kernel: tuple[int, ...],
        strides: tuple[int, ...],
        dilations: tuple[int, ...],
        out_spatial: tuple[int, ...],
        total: int,
        row_max: Callable[[int], np.ndarray],
    ):
        self.found, self.m, self.mg, self.row_max = list(found), m, mg, row_max
        self.shape = (x.shape[0], m, *out_spatial)
        self._x = np.ascontiguousarray(x).reshape(-1)
        d = x.ndim - 2
        height, width = _as_2d(x.shape[2:], 1)
        top, left = _as_2d(pads[:d], 0)
        bottom, right = _as_2d(pads[d:], 0)
        out_w = _as_2d(out_spatial, 1)[1]
        kernel, dilations = _as_2d(kernel, 1), _as_2d(dilations, 1)
        self._geometry = np.array(
            [x.shape[1], height, width, top, left, height + top + bottom, width + left + right,
             *_as_2d(strides, 1), out_w, x_zp],
            np.int64,
        )  # fmt: skip
        self._entries = pairs.derived(
            self.found, ("compiled", cg, mg, kernel, dilations), lambda: _entries(self.found, cg, mg, kernel, dilations)
        )
        pairs.count(total, np.zeros(0, np.int64))

    def __bool__(self) -> bool:
        return True

    def max_abs(self) -> int:
        """A bound on any output's ``|correction|`` (:func:`pairs.correction_bound`)."""
        return pairs.correction_bound(self.found, self.m, self.mg, self.row_max)

    def dense(self) -> np.ndarray:
        """The whole ``(N, M, *out)`` correction in int64."""
        whole = np.zeros(self.shape, np.int64)
        self.add_to(whole, 0, self.shape[0], 0, self.shape[2])
        return whole

    def beside_sums(self, dtype: type) -> None:
        """None: each chunk's own pass costs less than a whole correction made beside the sums."""
        return None

    def before_chunks(self, dtype: type) -> None:
        """Nothing: each chunk adds its own part."""

    def add_to(self, target: np.ndarray, n0: int, n1: int, o0: int, o1: int) -> None:
        """Add records ``n0:n1`` and first spatial indices ``o0:o1`` to that chunk's sums ``target``
        (``(n1 - n0, M, o1 - o0, *out[1:])``, or wider along the last axis), in its own type (exact:
        the sums' type holds every integer within their bound, which includes :meth:`max_abs`)."""
        view, geometry, rows, j0 = target, self._geometry, (o0, o1), 0
        if target.ndim == 3:  # 1-d: the chunk's outputs o0:o1 are columns
            view, geometry, rows, j0 = target[:, :, None], geometry.copy(), (0, 1), o0
            geometry[9] = o1 - o0
        flat = view.reshape(-1) if view.flags.c_contiguous else _flat(view)
        source = view if flat is not None else np.ascontiguousarray(view)  # else through a contiguous copy
        flat = flat if flat is not None else source.reshape(-1)
        steps = np.array(source.strides[:3], np.int64) // source.itemsize
        saturated = np.zeros(n1 - n0 if pairs.counter is not None else 0, np.int64)
        padded = np.empty(int(geometry[0] * geometry[5] * geometry[6]), np.uint8)
        acc = np.empty(int((rows[1] - rows[0]) * geometry[6]), source.dtype)
        row_max = np.empty(int(geometry[0] * geometry[5]), np.uint8)
        _kernel()(self._x, geometry, *self._entries, flat, steps, saturated, n0, n1, *rows, j0, padded, acc, row_max)
        if source is not view:
            view[...] = source
        if saturated.size:
            pairs.count(0, np.repeat(np.arange(n0, n1), saturated))


__all__ = ["CompiledCorrection", "available"]
