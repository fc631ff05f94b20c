"""Integer-backend tests import their model builders from ``backend_models`` (next to this file)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
logging.getLogger("root").setLevel(logging.ERROR)  # ORT's quantizer warns about pre-processing


@pytest.fixture(autouse=True)
def _fresh_pair_tables() -> None:
    """Each test starts with no cached QLinearAdd/QLinearMul pair table: a table that an earlier test
    built would hide the formula from this one (mutation testing runs a mutant's tests after the
    clean run, in the same process, so a cached table would keep a mutated formula from running)."""
    from pytest_qaccuracy.backend.kernels import elementwise

    with elementwise._PAIR_TABLES_LOCK:
        elementwise._PAIR_TABLES.clear()
