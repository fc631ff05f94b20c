""":class:`OrtRunner`: a model run by onnxruntime, exposing chosen intermediate tensors, records in batches.

The session comes from :func:`pytest_qaccuracy.ort_session.make_session`. The model is copied with
the requested tensors added as graph outputs. Records run several at a time when the model has a
dynamic batch dimension; when the batch dimension is fixed at 1, it is made dynamic and the first
batch is checked against record-by-record runs, falling back to one record per run if the model does
not batch. A model that bakes its batch into the graph (a Reshape to a constant shape, as
onnxruntime's ``quant_pre_process`` writes around a Gemm) is seen from the graph and never gets
stacked records; a dynamic model whose first stacked run fails falls back the same way. Only the
current batch's tensors are alive at any time.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence

import numpy as np
import onnx

from pytest_qaccuracy.data.binding import Batch, join_records
from pytest_qaccuracy.errors import InputError, ModelError
from pytest_qaccuracy.model.batch import bakes_batch, free_batch_in_place
from pytest_qaccuracy.model.batch import batch_dims as _batch_dims
from pytest_qaccuracy.ort_session import fetch, first_line, make_session
from pytest_qaccuracy.runtime.options import RuntimeOptions

log = logging.getLogger(__name__)


def _with_outputs(model: onnx.ModelProto, names: Sequence[str], dynamic_batch: bool) -> onnx.ModelProto:
    out = copy.deepcopy(model)
    present = {o.name for o in out.graph.output}
    for name in names:
        if name not in present:
            out.graph.output.append(onnx.ValueInfoProto(name=name))
            present.add(name)
    if dynamic_batch:
        free_batch_in_place(out)
    return out


class BatchUnits:
    """Records run stacked while :attr:`batching` (checked by ``_verify`` on the first batch of two
    or more records), else one per run; the subclass gives ``_run(feeds) -> [array]`` and ``_verify``."""

    batching: bool
    _verified: bool

    def _run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError

    def _verify(self, batch: Batch) -> None:
        raise NotImplementedError

    def units(self, batch: Batch) -> list[Batch]:
        """``batch`` as this runner runs it: whole when the model takes stacked records (checked on
        the first batch), else one batch per record. Callers that feed one model's tensors to
        another run both on these units: a tensor of a model that does not batch may have no record
        axis to split (a Reshape folds the batch into another dimension)."""
        if len(batch) > 1 and self.batching and not self._verified:
            self._verify(batch)
        if self.batching or len(batch) == 1:
            return [batch]
        return [Batch(batch.start + i, [record]) for i, record in enumerate(batch.records)]

    def _run_units(self, batch: Batch) -> list[list[np.ndarray]]:
        """``_run``'s values for each of :meth:`units`."""
        return [self._run(u.records[0] if len(u) == 1 else u.stacked()) for u in self.units(batch)]


class OrtRunner(BatchUnits):
    """Runs one model with onnxruntime and returns the requested tensors for a batch of records."""

    def __init__(self, model: onnx.ModelProto, tensors: Sequence[str], options: RuntimeOptions, label: str) -> None:
        self.label = label
        self.tensors = list(dict.fromkeys(tensors))
        self.options = options
        dims = _batch_dims(model)
        self.dynamic = all(not isinstance(d, int) for d in dims)
        self._relaxed = not self.dynamic and all(d == 1 for d in dims) and not bakes_batch(model)
        self._model = model
        self._session = self._make_session(_with_outputs(model, self.tensors, self._relaxed))
        self.batching = self.dynamic or self._relaxed
        self._verified = False

    def _make_session(self, model: onnx.ModelProto):
        try:
            return make_session(
                model,
                providers=self.options.providers,
                threads=self.options.threads,
                optimization=self.options.optimization,
                config=self.options.session_config,
            )
        except Exception as exc:
            raise ModelError(f"{self.label}: onnxruntime cannot load the model ({first_line(exc)})") from None

    def _run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        try:
            return fetch(self._session, self.tensors, feeds)
        except ModelError as exc:  # a tensor onnxruntime cannot return (int4), named
            raise ModelError(f"{self.label}: {exc}") from None
        except Exception as exc:
            raise ModelError(f"{self.label}: onnxruntime failed to run ({first_line(exc)})") from None

    def run(self, batch: Batch) -> dict[str, np.ndarray]:
        """The requested tensors for every record of ``batch``, concatenated on axis 0."""
        if self.dynamic and not self._verified and len(batch) > 1:
            # a model with a dynamic batch needs no probe: its first batch runs whole, or one record at a
            # time if onnxruntime refuses it (so each record runs once)
            self._verified = True
            try:
                return dict(zip(self.tensors, self._run(batch.stacked()), strict=True))
            except InputError:
                log.info("%s: the model does not batch; running one record at a time", self.label)
                self.batching = False
        parts = self._run_units(batch)
        if len(parts) == 1:
            return dict(zip(self.tensors, parts[0], strict=True))
        return {name: join_records([p[i] for p in parts]) for i, name in enumerate(self.tensors)}

    def _verify(self, batch: Batch) -> None:
        """Check that running records together gives what running them one by one gives (a model
        with a dynamic batch only has to run two stacked records)."""
        self._verified = True
        two = Batch(batch.start, batch.records[:2])
        try:
            together = self._run(two.stacked())
        except InputError:
            together = None
        if self.dynamic and together is not None:
            return
        singles = [self._run(r) for r in two.records]
        ok = together is not None and all(
            t.shape[:1] == (2,) and _close(t, np.concatenate([s[i] for s in singles], axis=0))
            for i, t in enumerate(together)
        )
        if not ok:
            log.info("%s: the model does not batch; running one record at a time", self.label)
            self.batching = False
            if self._relaxed:
                self._session = self._make_session(_with_outputs(self._model, self.tensors, False))


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape:
        return False
    if a.dtype.kind == "f":
        return bool(np.allclose(a, b, rtol=1e-4, atol=1e-5, equal_nan=True))
    return bool(np.abs(a.astype(np.int64) - b.astype(np.int64)).max(initial=0) <= 1)
