"""``.npz`` datasets: one array per input name, record axis first (contract 4)."""

from __future__ import annotations

import zipfile
from collections.abc import Iterator

import numpy as np

from pytest_qaccuracy.data.base import ArrayMeta, Dataset, check_labels
from pytest_qaccuracy.data.npy_stream import RecordReader, read_header
from pytest_qaccuracy.errors import DataError

#: An array of this name holds labels rather than a model input.
LABELS_KEY = "labels"

_CHUNK = 64  # records decoded per read when iterating


class NpzDataset(Dataset):
    """Arrays of an ``.npz`` archive, streamed record by record (compressed members too)."""

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
        for key, member in self._members.items():
            with self._zip.open(member) as stream:
                shape, dtype, _ = read_header(stream, f"{self.name}: array '{key}'")
            if not shape:
                raise DataError(f"{self.name}: array '{key}' is 0-d; expected the record axis first")
            self._meta[key] = (shape, dtype)
        self._keys = [k for k in self._members if k != LABELS_KEY]
        counts = {key: self._meta[key][0][0] for key in self._keys}
        if len(set(counts.values())) > 1:
            raise DataError(f"{self.name}: arrays disagree on the number of records: {counts}")
        self._count = next(iter(counts.values()), 0)

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
                    skipped += len(reader.read(min(_CHUNK, start - skipped)))
            index = start
            while index < stop:
                n = min(_CHUNK, stop - index)
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

    def close(self) -> None:
        self._zip.close()
