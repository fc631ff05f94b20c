"""Layout errors of ``.npy`` folders and ONE HDF5 files name the file and what is wrong
(docs/data.md's layouts: ``<dir>/<input>/<k>.npy``, ``value/<k>/<i>`` numbered from 0)."""

from __future__ import annotations

import re

import h5py
import numpy as np
import pytest

from pytest_qaccuracy.data import HDF5Dataset, NpyDirDataset
from pytest_qaccuracy.errors import DataError


def _folder(root, **records: list[int]):
    for name, numbers in records.items():
        (root / name).mkdir(parents=True)
        for k in numbers:
            np.save(root / name / f"{k}.npy", np.zeros(2, np.float32))
    return root


def _error(cls, path) -> str:
    with pytest.raises(DataError) as info:
        cls(path)
    return str(info.value)


def test_npy_folder_layout_errors(tmp_path) -> None:
    (tmp_path / "empty").mkdir()
    assert _error(NpyDirDataset, tmp_path / "empty").endswith(
        "empty: no input folders (expected <dir>/<input name>/<k>.npy)"
    )
    (tmp_path / "bare" / "x").mkdir(parents=True)
    assert _error(NpyDirDataset, tmp_path / "bare").endswith("bare: the input folders hold no .npy files")
    two = _folder(tmp_path / "two", x=[0, 1, 2], y=[0, 1])
    assert _error(NpyDirDataset, two).endswith(
        "two: inputs 'x' and 'y' have different record files; e.g. record(s) [2] exist in only one of them"
    )
    gaps = _folder(tmp_path / "gaps", x=[0, *range(7, 13)])  # 7 files: 0..6 expected
    assert _error(NpyDirDataset, gaps).endswith("gaps/x: records must be numbered 0..6; missing [1, 2, 3, 4, 5]")
    named = _folder(tmp_path / "named", x=[0])
    np.save(named / "x" / "first.npy", np.zeros(2))
    assert _error(NpyDirDataset, named).endswith("named/x: file 'first.npy' is not named <record number>.npy")


def test_other_files_in_an_input_folder_are_ignored(tmp_path) -> None:
    root = _folder(tmp_path / "d", x=[0, 1, 2])
    for name in ("README.txt", "a.json", "b.csv", "notes"):
        (root / "x" / name).write_text("")
    assert len(NpyDirDataset(root)) == 3


def test_hdf5_records_are_numbered_as_numbers(tmp_path) -> None:
    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as f:
        for k in (0, *range(11, 21)):  # 11 records: '0'..'10' expected, '1'..'10' missing
            f.create_dataset(f"value/{k}/0", data=np.zeros(2, np.float32))
    message = "d.h5: records must be numbered '0'..'10'; missing ['1', '2', '3', '4', '5']"
    with pytest.raises(DataError, match=re.escape(message) + "$"):
        HDF5Dataset(path)
