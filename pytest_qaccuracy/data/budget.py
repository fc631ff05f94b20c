"""Sizes declared in file headers, checked before anything is allocated.

A header can declare any shape: a 1 KB file may claim 4e9 records or a (1e8, 1, 8, 8) array. Every
declared size is checked against what the file can hold and against a memory budget, so a bad file
is refused with one message instead of hanging or failing in numpy's allocator.

The budget is ``QACCURACY_MEMORY_BUDGET`` (bytes, or with a ``K``/``M``/``G``/``T`` suffix, powers of
1024), by default half of the machine's physical memory (4 GiB when that is unknown).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from pytest_qaccuracy.errors import DataError

ENV = "QACCURACY_MEMORY_BUDGET"

#: deflate expands at most ~1032:1, so a deflated member of n bytes holds at most this many times n.
DEFLATE_MAX_RATIO = 1032

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def memory_budget() -> int:
    """The most bytes one array read from a dataset may take (see the module docstring)."""
    text = os.environ.get(ENV, "").strip().upper().removesuffix("B").removesuffix("I")
    if not text:
        physical = _physical_memory()
        return physical // 2 if physical else 4 << 30
    unit = text[-1] if text[-1] in _UNITS else ""
    try:
        value = float(text[: len(text) - len(unit)]) * _UNITS[unit]
    except ValueError:
        raise DataError(f"{ENV}={os.environ[ENV]!r}: expected a size in bytes, e.g. 2G or 500M") from None
    if value <= 0:
        raise DataError(f"{ENV}={os.environ[ENV]!r}: the memory budget must be positive")
    return int(value)


def format_bytes(count: float) -> str:
    """``1536`` -> ``1.5 KiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if count < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def declared_bytes(shape: Sequence[int], dtype: np.dtype) -> int:
    """Bytes an array of ``shape`` and ``dtype`` takes (Python ints: no overflow)."""
    count = 1
    for dim in shape:
        count *= int(dim)
    return count * np.dtype(dtype).itemsize


def _describe(shape: Sequence[int], dtype: np.dtype) -> str:
    dims = ", ".join(str(d) for d in shape)
    return f"shape ({dims}{',' if len(shape) == 1 else ''}) {np.dtype(dtype)}"


def check_fits_file(shape: Sequence[int], dtype: np.dtype, available: int, where: str) -> None:
    """Refuse a header that declares more data than the ``available`` bytes of its file."""
    size = declared_bytes(shape, dtype)
    if size > available:
        raise DataError(
            f"{where}: the header declares {_describe(shape, dtype)} ({format_bytes(size)}), "
            f"more than the file can hold ({format_bytes(available)})"
        )


def check_budget(size: int, where: str, what: str) -> None:
    """Refuse to allocate ``size`` bytes for ``what`` when that exceeds the memory budget."""
    budget = memory_budget()
    if size > budget:
        raise DataError(
            f"{where}: {what} needs {format_bytes(size)}, over the memory budget of {format_bytes(budget)} "
            f"(set {ENV} to raise it)"
        )


def check_array_budget(shape: Sequence[int], dtype: np.dtype, where: str) -> None:
    """Refuse an array of ``shape`` that would not fit the memory budget."""
    check_budget(declared_bytes(shape, dtype), where, _describe(shape, dtype))
