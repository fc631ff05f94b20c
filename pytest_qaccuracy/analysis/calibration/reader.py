"""A ``CalibrationDataReader`` over our datasets, so ``onnxruntime.quantization.quantize_static``
can be fed directly from an HDF5 file, a folder of ``.npy`` or an ``.npz`` (one record per call).
"""

from __future__ import annotations

import os
from itertools import islice

import numpy as np
from onnxruntime.quantization import CalibrationDataReader

from pytest_qaccuracy.data import BoundDataset, Dataset, bind_dataset, load_dataset
from pytest_qaccuracy.model.loading import graph_inputs, load_model


class DatasetReader(CalibrationDataReader):
    """Streams the records of a dataset as ``{input name: array}``, checked against the model.

    Supports ``len()`` and ``set_range(start_index, end_index)``, so it also works with
    ``extra_options={"CalibStridedMinMax": N}``. Only the current record is in memory.

    Args:
        data: a dataset, a bound dataset, or a dataset path.
        model: the fp32 model (path or ModelProto) whose inputs the records must fit; optional
            when ``data`` is already bound.
    """

    def __init__(self, data: BoundDataset | Dataset | str | os.PathLike[str], model=None) -> None:
        if isinstance(data, BoundDataset):
            self.bound = data
        else:
            if model is None:
                raise ValueError("DatasetReader needs the model to check the records against")
            proto = model if not isinstance(model, str | os.PathLike) else load_model(model)
            dataset = data if isinstance(data, Dataset) else load_dataset(data)
            self.bound = bind_dataset(dataset, graph_inputs(proto))
        self._start, self._stop = 0, len(self.bound)
        self._iter = None

    def __len__(self) -> int:
        return len(self.bound)

    def set_range(self, start_index: int, end_index: int) -> None:
        """Restrict the next pass to records ``start_index .. end_index - 1`` (and rewind)."""
        self._start, self._stop = max(0, start_index), min(end_index, len(self.bound))
        self._iter = None

    def rewind(self) -> None:
        self._iter = None

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._iter is None:
            self._iter = islice(self.bound.iter_records(), self._start, self._stop)
        return next(self._iter, None)
