"""The memory budget for arrays declared in data headers (``data/budget.py``, docs in its module
docstring: bytes or K/M/G/T in powers of 1024, by default half the physical memory)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from pytest_qaccuracy.data import budget
from pytest_qaccuracy.errors import DataError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2G", 2 << 30),
        ("500M", 500 << 20),
        ("1.5k", 1536),
        ("2GiB", 2 << 30),
        ("1024", 1024),
        (" 3 kb ", 3072),
        ("1T", 1 << 40),
    ],
)
def test_budget_from_the_environment(monkeypatch, text, expected) -> None:
    monkeypatch.setenv(budget.ENV, text)
    assert budget.memory_budget() == expected


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("abc", "expected a size in bytes, e.g. 2G or 500M"),
        ("0", "the memory budget must be positive"),
        ("-1G", "the memory budget must be positive"),
    ],
)
def test_bad_budgets_are_refused(monkeypatch, text, why) -> None:
    monkeypatch.setenv(budget.ENV, text)
    with pytest.raises(DataError, match=f"^{re.escape(f'{budget.ENV}={text!r}: {why}')}$"):
        budget.memory_budget()


def test_default_budget_is_half_the_physical_memory(monkeypatch) -> None:
    monkeypatch.delenv(budget.ENV, raising=False)
    meminfo = Path("/proc/meminfo")
    if not meminfo.exists():
        pytest.skip("no /proc/meminfo to read the physical memory from")
    total_kib = int(re.search(r"MemTotal:\s+(\d+) kB", meminfo.read_text()).group(1))
    assert budget.memory_budget() == total_kib * 1024 // 2


def test_default_budget_without_a_known_memory_size(monkeypatch) -> None:
    monkeypatch.delenv(budget.ENV, raising=False)
    monkeypatch.setattr(budget.os, "sysconf", lambda name: (_ for _ in ()).throw(ValueError(name)))
    assert budget.memory_budget() == 4 << 30


@pytest.mark.parametrize(
    ("count", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (5 << 20, "5.0 MiB"),
        (3 << 30, "3.0 GiB"),
        (1 << 50, "1024.0 TiB"),
    ],
)
def test_format_bytes(count, text) -> None:
    assert budget.format_bytes(count) == text


def test_declared_sizes_do_not_overflow() -> None:
    assert budget.declared_bytes((1 << 40, 1 << 30), np.int8) == 1 << 70
    assert budget.declared_bytes((3, 5), np.float64) == 120


def test_a_header_must_fit_its_file() -> None:
    budget.check_fits_file((4,), np.float32, 16, "w")  # exactly full
    message = "w: the header declares shape (4,) float32 (16 B), more than the file can hold (15 B)"
    with pytest.raises(DataError, match=f"^{re.escape(message)}$"):
        budget.check_fits_file((4,), np.float32, 15, "w")


def test_an_array_must_fit_the_budget(monkeypatch) -> None:
    monkeypatch.setenv(budget.ENV, "1K")
    budget.check_array_budget((16, 16), np.float32, "w")  # exactly the budget
    message = (
        f"w: shape (16, 17) float32 needs 1.1 KiB, over the memory budget of 1.0 KiB (set {budget.ENV} to raise it)"
    )
    with pytest.raises(DataError, match=f"^{re.escape(message)}$"):
        budget.check_array_budget((16, 17), np.float32, "w")
