"""A runner over the emulated integer backend, interchangeable with :class:`OrtRunner` in compare."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import onnx

from pytest_qaccuracy.data.binding import Batch, join_records
from pytest_qaccuracy.errors import QAccuracyError
from pytest_qaccuracy.model.batch import stacking
from pytest_qaccuracy.runtime.ort_runner import BatchUnits

log = logging.getLogger(__name__)


class IntegerRunner(BatchUnits):
    """Runs a quantized model with :class:`~pytest_qaccuracy.backend.IntegerSession` under a scheme.

    ``tensors`` may name any tensor of the graph; records of a batch run through each kernel at once,
    or one at a time when the model does not take stacked records (:func:`~pytest_qaccuracy.model.batch.stacking`,
    checked on the first batch as :class:`~pytest_qaccuracy.runtime.ort_runner.OrtRunner` checks it).
    """

    backend = "integer"
    capture = "emulated"

    def __init__(
        self, model: onnx.ModelProto, tensors: Sequence[str], scheme: str, label: str, threads: int = 0
    ) -> None:
        from pytest_qaccuracy.backend import IntegerSession

        self.label = label
        self.tensors = list(dict.fromkeys(tensors))
        runnable, self.batching = stacking(model)
        self.session = IntegerSession(runnable, scheme=scheme, threads=threads)
        self.scheme_name = self.session.scheme.name  # "onnxruntime" resolved to this machine's preset
        self._verified = runnable is model  # a freed declared batch of 1 is checked on two records

    def _run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(self.tensors, feeds)

    def _verify(self, batch: Batch) -> None:
        """Stacked records must give what they give one by one; else they run one at a time."""
        self._verified = True
        two = Batch(batch.start, batch.records[:2])
        try:
            together = self._run(two.stacked())
        except QAccuracyError:
            together = None
        singles = [self._run(r) for r in two.records]
        if together is None or not all(
            t.shape[:1] == (2,) and np.array_equal(t, np.concatenate([s[i] for s in singles]), equal_nan=True)
            for i, t in enumerate(together)
        ):
            log.info("%s: the model does not batch; running one record at a time", self.label)
            self.batching = False

    def run(self, batch: Batch) -> dict[str, np.ndarray]:
        parts = self._run_units(batch)
        if len(parts) == 1:
            return dict(zip(self.tensors, parts[0], strict=True))
        return {name: join_records([p[i] for p in parts]) for i, name in enumerate(self.tensors)}
