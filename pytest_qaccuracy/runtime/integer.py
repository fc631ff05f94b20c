"""A runner over the emulated integer backend, interchangeable with :class:`OrtRunner` in compare."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from pytest_qaccuracy.data.binding import Batch


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

        self.label = label
        self.tensors = list(dict.fromkeys(tensors))
        self.session = IntegerSession(model, scheme=scheme, threads=threads)
        self.scheme_name = self.session.scheme.name  # "onnxruntime" resolved to this machine's preset

    def run(self, batch: Batch) -> dict[str, np.ndarray]:
        return dict(zip(self.tensors, self.session.run(self.tensors, batch.stacked()), strict=True))
