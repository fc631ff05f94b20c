"""Datasets: ONE HDF5 files, folders of ``.npy`` per input, and ``.npz`` archives (docs/data.md).

``load_dataset(path)`` opens any of them; ``bind_dataset(dataset, inputs)`` checks every record
against a model's inputs before anything runs and then streams checked records in batches.
"""

from __future__ import annotations

import os
from pathlib import Path

from pytest_qaccuracy.data.base import ArrayMeta, Dataset
from pytest_qaccuracy.data.binding import Batch, BoundDataset
from pytest_qaccuracy.data.hdf5 import HDF5Dataset
from pytest_qaccuracy.data.head import Head
from pytest_qaccuracy.data.npy_dir import NpyDirDataset
from pytest_qaccuracy.data.npz import NpzDataset
from pytest_qaccuracy.errors import DataError

#: File suffix -> dataset class; folders are always ``.npy`` folders.
FORMATS: dict[str, type[Dataset]] = {".h5": HDF5Dataset, ".hdf5": HDF5Dataset, ".npz": NpzDataset}


def load_dataset(path: str | os.PathLike[str]) -> Dataset:
    """Open a dataset by its path: ``.h5``/``.hdf5`` (ONE layout), ``.npz``, or a folder of ``.npy``.

    Raises:
        DataError: the path does not exist, has an unknown suffix, or is not laid out as expected.
    """
    path = Path(path)
    if path.is_dir():
        return NpyDirDataset(path)
    if not path.exists():
        nowhere = " (a symbolic link that leads nowhere: a loop or a missing target)" if path.is_symlink() else ""
        raise DataError(f"{path}: dataset not found{nowhere}")
    try:
        cls = FORMATS[path.suffix.lower()]
    except KeyError:
        known = ", ".join(FORMATS)
        raise DataError(
            f"{path}: unknown dataset format '{path.suffix}'; expected {known} or a folder of .npy"
        ) from None
    return cls(path)


def bind_dataset(dataset: Dataset, inputs, allow_nonfinite: bool = False) -> BoundDataset:
    """Check every record of ``dataset`` against model ``inputs`` (a list of InputSpec)."""
    return BoundDataset(dataset, inputs, allow_nonfinite=allow_nonfinite)


__all__ = [
    "ArrayMeta",
    "Batch",
    "BoundDataset",
    "Dataset",
    "HDF5Dataset",
    "Head",
    "NpyDirDataset",
    "NpzDataset",
    "bind_dataset",
    "load_dataset",
]
