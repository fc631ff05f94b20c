"""Samsung ONE's HDF5 layout: ``value/<record>/<input position>`` (docs/data.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import h5py
import numpy as np

from pytest_qaccuracy.data.base import ArrayMeta, Dataset, check_labels, check_plain_dtype
from pytest_qaccuracy.data.budget import check_array_budget
from pytest_qaccuracy.data.targets import TARGET_KEYS, assemble_targets
from pytest_qaccuracy.errors import DataError


def _numeric_sorted(names, what: str, where: str) -> list[str]:
    try:
        ordered = sorted(names, key=int)
    except ValueError:
        bad = next(n for n in names if not n.isdigit())
        raise DataError(f"{where}: {what} '{bad}' is not a number; expected '0'..'N-1'") from None
    expected = [str(i) for i in range(len(ordered))]
    if ordered != expected:
        missing = sorted(set(expected) - set(ordered), key=int)
        raise DataError(f"{where}: {what}s must be numbered '0'..'{len(ordered) - 1}'; missing {missing[:5]}")
    return ordered


def _bool_enum(dtype: np.dtype) -> bool:
    """An H5T_ENUM of false = 0, true = 1 in other letter case than h5py's FALSE/TRUE (which it reads
    as bool itself); any other enum is read as its integer base type, not as bool."""
    members = h5py.check_enum_dtype(dtype)
    return members is not None and {name.lower(): value for name, value in members.items()} == {"false": 0, "true": 1}


class HDF5Dataset(Dataset):
    """Records in ONE's layout; each record's arrays are read only when iterated."""

    by_position = True

    def __init__(self, path) -> None:
        super().__init__(path)
        try:
            self._file = h5py.File(self.path, "r")
        except OSError as exc:
            raise DataError(f"{self.name}: not a readable HDF5 file ({exc})") from None
        if "value" not in self._file or not isinstance(self._file["value"], h5py.Group):
            self._file.close()
            raise DataError(f"{self.name}: no group 'value' (expected ONE's layout value/<record>/<input>)")
        self._value = self._file["value"]
        self._records = _numeric_sorted(list(self._value.keys()), "record", self.name)
        if not self._records:
            raise DataError(f"{self.name}: group 'value' holds no records")
        first = self._group(0)
        self._keys = _numeric_sorted(list(first.keys()), "input", f"{self.name}: record 0")

    def _group(self, record: int) -> h5py.Group:
        item = self._value[str(record)]
        if not isinstance(item, h5py.Group):
            raise DataError(f"{self.name}: record {record} is not a group of input datasets")
        return item

    @property
    def keys(self) -> list[str]:
        return self._keys

    def __len__(self) -> int:
        return len(self._records)

    def _dataset(self, record: int, key: str) -> h5py.Dataset:
        group = self._group(record)
        if key not in group:
            raise DataError(f"{self.name}: record {record} has no input '{key}' (record 0 has {self._keys})")
        node = group[key]
        if not isinstance(node, h5py.Dataset):
            raise DataError(f"{self.name}: record {record}, input {key} is not a dataset")
        return node

    def meta(self, record: int, key: str) -> ArrayMeta:
        node = self._dataset(record, key)
        if _bool_enum(node.dtype):
            dtype = np.dtype(bool)
        else:
            dtype = check_plain_dtype(node.dtype, f"{self.name}: record {record}, input {key}")
        check_array_budget(node.shape, dtype, f"{self.name}: record {record}, input {key}")
        return ArrayMeta(tuple(node.shape), dtype)

    def iter_records(self, start: int = 0, stop: int | None = None) -> Iterator[dict[str, np.ndarray]]:
        stop = len(self) if stop is None else min(stop, len(self))
        for record in range(start, stop):
            group = self._group(record)
            extra = set(group.keys()) - set(self._keys)
            if extra:
                raise DataError(f"{self.name}: record {record} has inputs {sorted(extra)} that record 0 lacks")
            out = {}
            for key in self._keys:
                node = self._dataset(record, key)
                array = np.asarray(node[()])
                out[key] = array.astype(bool) if _bool_enum(node.dtype) else array
            yield out

    def labels(self) -> np.ndarray | None:
        if "labels" not in self._file:
            return None
        node = self._file["labels"]
        if not isinstance(node, h5py.Dataset):
            raise DataError(f"{self.name}: 'labels' is not a dataset (expected one label per record)")
        check_array_budget(node.shape, node.dtype, f"{self.name}: dataset 'labels'")
        return check_labels(node[()], len(self), f"{self.name}: dataset 'labels'")

    def targets(self) -> list[Any] | None:
        arrays = {}
        for key in TARGET_KEYS:
            node = self._file.get(key)
            if node is None:
                continue
            if not isinstance(node, h5py.Dataset):
                raise DataError(f"{self.name}: '{key}' is not a dataset")
            check_array_budget(
                node.shape, node.dtype if node.dtype.kind != "O" else np.dtype("O"), f"{self.name}: '{key}'"
            )
            arrays[key] = node.asstr()[()] if h5py.check_string_dtype(node.dtype) else node[()]
        return assemble_targets(arrays, len(self), self.name)

    def close(self) -> None:
        if self._file.id.valid:
            self._file.close()
