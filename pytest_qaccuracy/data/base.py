"""The dataset abstraction: records of model inputs, read lazily and in order.

A dataset holds N records; each record holds one array per model input. Datasets only know files:
matching their keys to a model's inputs and checking shapes is :mod:`pytest_qaccuracy.data.binding`.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pytest_qaccuracy.errors import DataError


@dataclass(frozen=True, slots=True)
class ArrayMeta:
    """Shape and dtype of one stored array, known without reading its data."""

    shape: tuple[int, ...]
    dtype: np.dtype


class Dataset(ABC):
    """Records stored in a file or folder.

    ``keys`` are the per-record array names: model input names for ``.npy`` folders and ``.npz``
    files, positions ``"0".."K-1"`` for ONE HDF5 files (``by_position`` is then true).
    """

    by_position: bool = False
    #: Every record has the same shapes and dtypes (one header per array), so checking record 0 suffices.
    uniform: bool = False

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    @abstractmethod
    def keys(self) -> list[str]: ...

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def meta(self, record: int, key: str) -> ArrayMeta:
        """Shape and dtype of one array, read from headers only."""

    @abstractmethod
    def iter_records(self, start: int = 0, stop: int | None = None) -> Iterator[dict[str, np.ndarray]]:
        """Yield records ``start..stop-1`` in order, one dict of key -> array each."""

    def labels(self) -> np.ndarray | None:
        """One label per record, when the dataset stores them; else None."""
        return None

    def targets(self) -> list[Any] | None:
        """One task-metric target per record (any shape, :mod:`.targets`), when stored; else None."""
        return None

    def close(self) -> None:
        """Release open files (datasets are also context managers)."""

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r}, records={len(self)}, keys={self.keys})"


def check_plain_dtype(dtype: np.dtype, where: str) -> np.dtype:
    """Refuse object and structured dtypes: they would need pickle or are not tensors."""
    if dtype.hasobject or dtype.fields is not None or dtype.kind not in "biuf":
        raise DataError(f"{where}: dtype {dtype} is not a numeric tensor type")
    return dtype


def check_labels(labels: np.ndarray, count: int, where: str) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim == 0 or labels.shape[0] != count:
        raise DataError(f"{where}: labels have shape {labels.shape}, expected one label per record ({count})")
    return labels
