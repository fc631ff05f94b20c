"""Reading ``.npy`` payloads one record at a time, from files or (compressed) ``.npz`` members.

``np.load`` on an ``.npz`` member reads the whole array; a 10,000-record file must not be read whole,
so we parse the ``.npy`` header ourselves and then read ``record_bytes`` per record in order.
Pickled (object) arrays are refused before any data is read.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

import numpy as np
from numpy.lib import format as npy_format

from pytest_qaccuracy.data.base import check_plain_dtype
from pytest_qaccuracy.data.budget import check_array_budget, check_fits_file
from pytest_qaccuracy.errors import DataError


def read_header(stream: BinaryIO, where: str) -> tuple[tuple[int, ...], np.dtype, bool]:
    """Parse an ``.npy`` header: (shape, dtype, fortran_order); refuses object dtypes."""
    try:
        version = npy_format.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = npy_format.read_array_header_1_0(stream)
        else:
            shape, fortran, dtype = npy_format.read_array_header_2_0(stream)
    except ValueError as exc:
        raise DataError(f"{where}: not a .npy array ({exc})") from None
    return tuple(shape), check_plain_dtype(np.dtype(dtype), where), bool(fortran)


def read_file_header(path: Path, where: str) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of a ``.npy`` file, checked to fit the file and the memory budget."""
    try:
        with open(path, "rb") as stream:
            shape, dtype, _ = read_header(stream, where)
            available = os.fstat(stream.fileno()).st_size - stream.tell()
    except OSError as exc:  # a symlink loop, a dangling link, no permission: the file, and why
        raise DataError(f"{where}: cannot read ({exc.strerror or exc})") from None
    check_fits_file(shape, dtype, available, where)
    check_array_budget(shape, dtype, where)
    return shape, dtype


class RecordReader:
    """Sequential reader of an array whose first axis is the record axis."""

    def __init__(self, stream: BinaryIO, where: str) -> None:
        self.where = where
        self._stream = stream
        shape, self.dtype, fortran = read_header(stream, where)
        if not shape:
            raise DataError(f"{where}: a 0-d array has no record axis")
        self.count, self.record_shape = shape[0], shape[1:]
        self._record_bytes = int(np.prod(self.record_shape, dtype=np.int64)) * self.dtype.itemsize
        self._whole: np.ndarray | None = None
        if fortran:  # records are not contiguous: this (rare) layout must be read whole
            check_array_budget(shape, self.dtype, where)
            data = stream.read()
            self._whole = np.frombuffer(data, self.dtype).reshape(shape[::-1]).T
        self._next = 0

    def read(self, count: int) -> np.ndarray:
        """The next ``count`` records as one array of shape (count, *record_shape)."""
        count = min(count, self.count - self._next)
        if self._whole is not None:
            out = np.array(self._whole[self._next : self._next + count])
        else:
            data = self._stream.read(self._record_bytes * count)
            if len(data) != self._record_bytes * count:
                raise DataError(f"{self.where}: file is truncated at record {self._next}")
            out = np.frombuffer(data, self.dtype).reshape((count, *self.record_shape)).copy()
        self._next += count
        return out
