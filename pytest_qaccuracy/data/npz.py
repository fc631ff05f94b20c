"""``.npz`` datasets: one array per input name, record axis first (docs/data.md)."""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from typing import Any

import numpy as np

from pytest_qaccuracy.data.base import ArrayMeta, Dataset, check_labels
from pytest_qaccuracy.data.budget import (
    DEFLATE_MAX_RATIO,
    check_array_budget,
    check_fits_file,
    declared_bytes,
    memory_budget,
)
from pytest_qaccuracy.data.npy_stream import RecordReader, read_header
from pytest_qaccuracy.data.targets import TARGET_KEYS, assemble_targets
from pytest_qaccuracy.errors import DataError

#: An array of this name holds labels rather than a model input.
LABELS_KEY = "labels"

_CHUNK = 64  # records decoded per read when iterating


def _member_capacity(info: zipfile.ZipInfo, archive_size: int) -> int | None:
    """The most bytes a member can decompress to, or None when the method has no known bound."""
    stored = min(info.compress_size, archive_size)
    if info.compress_type == zipfile.ZIP_STORED:
        return stored
    if info.compress_type == zipfile.ZIP_DEFLATED:
        return stored * DEFLATE_MAX_RATIO
    return None


class NpzDataset(Dataset):
    """Arrays of an ``.npz`` archive, streamed record by record (compressed members too).

    Every record of an array has the same shape and dtype, so binding checks record 0 only.
    """

    uniform = True

    def __init__(self, path) -> None:
        super().__init__(path)
        try:
            self._zip = zipfile.ZipFile(self.path)
        except (OSError, zipfile.BadZipFile) as exc:
            raise DataError(f"{self.name}: not a readable .npz archive ({exc})") from None
        self._members = {
            info.filename[: -len(".npy")]: info.filename
            for info in self._zip.infolist()
            if info.filename.endswith(".npy")
        }
        if not self._members:
            raise DataError(f"{self.name}: the archive holds no arrays")
        self._meta: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
        archive_size = self.path.stat().st_size
        for key, member in self._members.items():
            if key in TARGET_KEYS:  # any dtype (text too): read and checked by targets()
                continue
            where = f"{self.name}: array '{key}'"
            info = self._zip.getinfo(member)
            with self._zip.open(member) as stream:
                shape, dtype, fortran = read_header(stream, where)
                header_bytes = stream.tell()
            if not shape:
                raise DataError(f"{self.name}: array '{key}' is 0-d; expected the record axis first")
            capacity = _member_capacity(info, archive_size)
            if capacity is not None:
                check_fits_file(shape, dtype, max(capacity - header_bytes, 0), where)
            if capacity is None or fortran or key == LABELS_KEY:  # read whole
                check_array_budget(shape, dtype, where)
            check_array_budget(shape[1:], dtype, f"{where}, one record")
            self._meta[key] = (shape, dtype)
        self._keys = [k for k in self._members if k != LABELS_KEY and k not in TARGET_KEYS]
        counts = {key: self._meta[key][0][0] for key in self._keys}
        if len(set(counts.values())) > 1:
            raise DataError(f"{self.name}: arrays disagree on the number of records: {counts}")
        self._count = next(iter(counts.values()), 0)
        record_bytes = sum(declared_bytes(self._meta[k][0][1:], self._meta[k][1]) for k in self._keys)
        self._chunk = max(1, min(_CHUNK, memory_budget() // max(record_bytes, 1)))

    @property
    def keys(self) -> list[str]:
        return self._keys

    def __len__(self) -> int:
        return self._count

    def meta(self, record: int, key: str) -> ArrayMeta:
        shape, dtype = self._meta[key]
        return ArrayMeta(shape[1:], dtype)

    def iter_records(self, start: int = 0, stop: int | None = None) -> Iterator[dict[str, np.ndarray]]:
        stop = len(self) if stop is None else min(stop, len(self))
        streams = {key: self._zip.open(self._members[key]) for key in self._keys}
        try:
            readers = {key: RecordReader(s, f"{self.name}: array '{key}'") for key, s in streams.items()}
            for reader in readers.values():  # skip to start, a chunk at a time
                skipped = 0
                while skipped < start:
                    skipped += len(reader.read(min(self._chunk, start - skipped)))
            index = start
            while index < stop:
                n = min(self._chunk, stop - index)
                chunk = {key: reader.read(n) for key, reader in readers.items()}
                for i in range(n):
                    yield {key: arrays[i] for key, arrays in chunk.items()}
                index += n
        finally:
            for stream in streams.values():
                stream.close()

    def labels(self) -> np.ndarray | None:
        if LABELS_KEY not in self._members:
            return None
        with self._zip.open(self._members[LABELS_KEY]) as stream:
            reader = RecordReader(stream, f"{self.name}: array '{LABELS_KEY}'")
            labels = reader.read(reader.count)
        return check_labels(labels, len(self), f"{self.name}: array '{LABELS_KEY}'")

    def targets(self) -> list[Any] | None:
        arrays = {}
        for key in TARGET_KEYS:
            if key in self._members:
                with self._zip.open(self._members[key]) as stream:
                    try:
                        arrays[key] = np.lib.format.read_array(stream, allow_pickle=False)
                    except ValueError as exc:
                        raise DataError(f"{self.name}: array '{key}': cannot read ({exc})") from None
        return assemble_targets(arrays, len(self), self.name)

    def close(self) -> None:
        self._zip.close()
