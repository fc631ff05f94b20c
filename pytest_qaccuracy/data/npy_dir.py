"""Folders of ``.npy`` files: ``<dir>/<input name>/<k>.npy``, one file per record (docs/data.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pytest_qaccuracy.data.base import ArrayMeta, Dataset, check_labels
from pytest_qaccuracy.data.npy_stream import read_file_header
from pytest_qaccuracy.data.targets import TARGET_KEYS, assemble_targets
from pytest_qaccuracy.errors import DataError

LABELS_FILE = "labels.npy"


def _record_files(folder: Path, where: str) -> dict[int, Path]:
    files = {}
    for path in folder.iterdir():
        if path.suffix != ".npy":
            continue
        if not path.stem.isdigit():
            raise DataError(f"{where}: file '{path.name}' is not named <record number>.npy")
        files[int(path.stem)] = path
    return files


class NpyDirDataset(Dataset):
    """One sub-folder per model input, one ``<k>.npy`` per record, the same k in every sub-folder."""

    def __init__(self, path) -> None:
        super().__init__(path)
        folders = sorted(p for p in self.path.iterdir() if p.is_dir())
        if not folders:
            raise DataError(f"{self.name}: no input folders (expected <dir>/<input name>/<k>.npy)")
        self._files = {f.name: _record_files(f, f"{self.name}/{f.name}") for f in folders}
        self._keys = [k for k, files in self._files.items() if files]
        if not self._keys:
            raise DataError(f"{self.name}: the input folders hold no .npy files")
        indices = {k: set(self._files[k]) for k in self._keys}
        first = self._keys[0]
        for key in self._keys[1:]:
            if indices[key] != indices[first]:
                diff = sorted(indices[key] ^ indices[first])[:5]
                raise DataError(
                    f"{self.name}: inputs '{first}' and '{key}' have different record files; "
                    f"e.g. record(s) {diff} exist in only one of them"
                )
        count = len(indices[first])
        if indices[first] != set(range(count)):
            missing = sorted(set(range(count)) - indices[first])[:5]
            raise DataError(f"{self.name}/{first}: records must be numbered 0..{count - 1}; missing {missing}")
        self._count = count

    @property
    def keys(self) -> list[str]:
        return self._keys

    def __len__(self) -> int:
        return self._count

    def _where(self, record: int, key: str) -> str:
        return f"{self.name}/{key}/{record}.npy"

    def meta(self, record: int, key: str) -> ArrayMeta:
        shape, dtype = read_file_header(self._files[key][record], self._where(record, key))
        return ArrayMeta(shape, dtype)

    def iter_records(self, start: int = 0, stop: int | None = None) -> Iterator[dict[str, np.ndarray]]:
        stop = len(self) if stop is None else min(stop, len(self))
        for record in range(start, stop):
            out = {}
            for key in self._keys:
                try:
                    out[key] = np.load(self._files[key][record], allow_pickle=False)
                except ValueError as exc:
                    raise DataError(f"{self._where(record, key)}: cannot read ({exc})") from None
                except OSError as exc:
                    raise DataError(f"{self._where(record, key)}: cannot read ({exc.strerror or exc})") from None
            yield out

    def labels(self) -> np.ndarray | None:
        path = self.path / LABELS_FILE
        if not path.is_file():
            return None
        read_file_header(path, f"{self.name}/{LABELS_FILE}")
        return check_labels(np.load(path, allow_pickle=False), len(self), f"{self.name}/{LABELS_FILE}")

    def targets(self) -> list[Any] | None:
        arrays = {}
        for key in TARGET_KEYS:
            path = self.path / f"{key}.npy"
            if path.is_file():
                try:
                    arrays[key] = np.load(path, allow_pickle=False)
                except (ValueError, EOFError) as exc:  # EOFError: an empty file
                    raise DataError(f"{self.name}/{path.name}: cannot read ({exc})") from None
        return assemble_targets(arrays, len(self), self.name)
