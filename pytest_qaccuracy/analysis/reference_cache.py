"""The fp32 model's values of a comparison pass, kept for a later analysis of the same records.

A pytest session compares a pair, and at its end may rank the pair's nodes (:mod:`.sensitivity`),
which needs the fp32 model's outputs on the same records again, once per experiment round (and per
chunk of nodes, under a deadline) and once for the sweep.
:func:`~pytest_qaccuracy.analysis.compare.compare` fills a :class:`ReferenceCache` with the values it
computed anyway; the analysis reads them instead of running the fp32 model.

Memory is bounded: every cache of a process draws on one :class:`ReferenceBudget` (default
:data:`REFERENCE_BUDGET` bytes). A cache whose records do not fit drops what it held and keeps nothing;
the analysis then runs the fp32 model itself, batch by batch, exactly as the comparison ran it (the
same session options and graph outputs, since exposing intermediate tensors can change the last bits of
onnxruntime's outputs). So the figures never depend on whether the values fitted: only the time does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np

from pytest_qaccuracy.data.binding import Batch

#: Bytes of fp32 values all reference caches of a process hold at most (256 MB).
REFERENCE_BUDGET = 256 << 20


class ReferenceBudget:
    """Bytes shared by the reference caches of a process: each reserves before it keeps a batch."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = REFERENCE_BUDGET if limit is None else limit
        self.used = 0

    def reserve(self, nbytes: int) -> bool:
        if self.used + nbytes > self.limit:
            return False
        self.used += nbytes
        return True

    def release(self, nbytes: int) -> None:
        self.used -= nbytes


class Runner(Protocol):
    """What recomputes a batch's fp32 values: ``run(batch) -> {tensor: array}``."""

    def run(self, batch: Batch) -> dict[str, np.ndarray]: ...


class ReferenceCache:
    """fp32 values of ``names`` per batch of a comparison pass, under a byte budget.

    Args:
        names: fp32 tensors to keep (the model outputs, or the layers an analysis measures at).
        budget: the process's :class:`ReferenceBudget`, or a limit in bytes for this cache alone
            (default :data:`REFERENCE_BUDGET`).
        records: keep only batches within the first N records (an analysis limited to them).
    """

    def __init__(
        self, names: Sequence[str], budget: ReferenceBudget | int | None = None, records: int | None = None
    ) -> None:
        self.names = tuple(dict.fromkeys(names))
        self.budget = budget if isinstance(budget, ReferenceBudget) else ReferenceBudget(budget)
        self.records = records
        self.overflowed = False
        self.nbytes = 0
        #: batches asked for that were not kept, so computed again
        self.recomputed = 0
        self._batches: dict[tuple[int, int], dict[str, np.ndarray]] = {}
        self._tensors: frozenset[str] | None = None
        self._recompute: Callable[[], Runner] | None = None
        self._runner: Runner | None = None

    def begin(self, tensors: Sequence[str], recompute: Callable[[], Runner]) -> None:
        """Called by a comparison before its pass: the fp32 tensors its runs give, and how to make a
        runner that computes a batch's values exactly as the pass computes them."""
        self._tensors, self._recompute = frozenset(tensors), recompute

    def add(self, batch: Batch, values: Mapping[str, np.ndarray]) -> None:
        """Keep a batch's values of :attr:`names` (all of them, or none); past the budget, drop everything
        and keep nothing more."""
        if self.overflowed or (self.records is not None and batch.start + len(batch) > self.records):
            return
        if any(name not in values for name in self.names):  # a layer the pass reduced: computed on request
            return
        kept = {name: np.array(values[name], copy=True) for name in self.names}
        size = sum(v.nbytes for v in kept.values())
        if not self.budget.reserve(size):
            self.overflowed = True
            self.release()
            return
        self.nbytes += size
        self._batches[(batch.start, len(batch))] = kept

    def covers(self, names: Sequence[str]) -> bool:
        """Whether the pass computed ``names`` (fp32 tensors), so that this cache can give them."""
        return self._tensors is not None and set(names) <= set(self.names) & self._tensors

    def values(self, batch: Batch) -> dict[str, np.ndarray]:
        """The fp32 values of ``batch``: kept ones when this exact batch was kept, else computed as the
        comparison computed them."""
        held = self._batches.get((batch.start, len(batch)))
        if held is not None:
            return held
        if self._recompute is None:
            raise RuntimeError("no comparison began this cache")
        if self._runner is None:
            self._runner = self._recompute()
        self.recomputed += 1
        return self._runner.run(batch)

    @property
    def held_batches(self) -> int:
        return len(self._batches)

    def release(self) -> None:
        """Give the kept values' bytes back to the budget (the cache still recomputes on request)."""
        self._batches.clear()
        self.budget.release(self.nbytes)
        self.nbytes = 0
        self._runner = None
