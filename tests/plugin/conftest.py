"""Fixtures for the plugin tests: a pytester project holding the bundled digits models and data."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "example_suites"

#: A test module checking the QDQ pair (passes) and the broken pair (fails) through the fixtures.
PAIRS_MODULE = """
import pytest

FP32, DATA = "models/digits_cnn.onnx", "data/digits_test.npz"


@pytest.mark.qaccuracy(fp32=FP32, quantized="models/digits_cnn.qdq.onnx", data=DATA, max_top1_drop=0.005)
def test_good(qaccuracy):
    qaccuracy.check()


def test_broken(qaccuracy, qaccuracy_pair):
    qaccuracy.check(qaccuracy_pair(FP32, "models/digits_cnn.broken.onnx", DATA), min_top1_agreement=0.9)
"""

#: A suite with the same two pairs.
SUITE = """
[defaults]
fp32 = "models/digits_cnn.onnx"
data = "data/digits_test.npz"

[defaults.tolerances]
max_top1_drop = 0.005

[pairs.qdq]
quantized = "models/digits_cnn.qdq.onnx"
layers = ["relu* sqnr>=15"]

[pairs.broken]
quantized = "models/digits_cnn.broken.onnx"
"""


#: The analysis as it was before it had a budget: ranking only, unbounded.
UNBOUNDED_RANKING = "--qaccuracy-analysis=rank --qaccuracy-analysis-budget=1h"


@pytest.fixture(autouse=True)
def _quiet_foreign_plugins(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inner pytest runs skip pytest-benchmark (when installed): inside an xdist worker it warns on
    every run, which is noise here and an error under ``filterwarnings = error``.

    They also run the end-of-session analysis as the node ranking without a time budget (what these
    tests were written for: a budget measured in the pair's check time would make their tables depend
    on the machine's speed); ``tests/plugin/test_analysis_budget.py`` tests the bounded defaults."""
    if "pytester" in request.fixturenames:
        request.getfixturevalue("pytester")  # pytester clears PYTEST_ADDOPTS when it starts
        monkeypatch.setenv("PYTEST_ADDOPTS", f"-p no:benchmark {UNBOUNDED_RANKING}")


@pytest.fixture
def digits(pytester: pytest.Pytester) -> pytest.Pytester:
    """A pytester project with ``models/`` (fp32, qdq, qoperator, broken) and ``data/digits_test.npz``."""
    for folder in ("models", "data"):
        target = pytester.path / folder
        target.mkdir()
        for file in sorted((EXAMPLES / folder).iterdir()):
            if file.suffix in (".onnx", ".npz"):
                shutil.copy(file, target / file.name)
    return pytester
