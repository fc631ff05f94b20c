"""A runner over the emulated integer backend, interchangeable with :class:`OrtRunner` in compare."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from pytest_qaccuracy.data.binding import Batch, join_records


class IntegerRunner:
    """Runs a quantized model with :class:`~pytest_qaccuracy.backend.IntegerSession` under a scheme.

    ``tensors`` may name any tensor of the graph; records of a batch run through each kernel at once.
    """

    backend = "integer"
    capture = "emulated"

    def __init__(
        self, model: onnx.ModelProto, tensors: Sequence[str], scheme: str, label: str, threads: int = 0
    ) -> None:
        from pytest_qaccuracy.backend import IntegerSession
        from pytest_qaccuracy.runtime.ort_runner import bakes_batch

        self.label = label
        self.tensors = list(dict.fromkeys(tensors))
        self.session = IntegerSession(model, scheme=scheme, threads=threads)
        self.scheme_name = self.session.scheme.name  # "onnxruntime" resolved to this machine's preset
        self.batching = not bakes_batch(model)  # a Reshape to a constant shape takes one record at a time

    def run(self, batch: Batch) -> dict[str, np.ndarray]:
        if self.batching or len(batch) == 1:
            return dict(zip(self.tensors, self.session.run(self.tensors, batch.stacked()), strict=True))
        parts = [self.session.run(self.tensors, record) for record in batch.records]
        return {name: join_records([p[i] for p in parts]) for i, name in enumerate(self.tensors)}
