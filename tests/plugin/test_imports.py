"""Import costs: the plugin entry point loads no numerical stack; the library never loads pytest."""

from __future__ import annotations

import subprocess
import sys


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "; import sys; print(' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(out.stdout.split())


def test_entry_point_is_cheap() -> None:
    loaded = _modules_after("import pytest_qaccuracy.plugin")
    assert not loaded & {"numpy", "onnx", "onnxruntime", "h5py", "tabulate", "scipy"}


def test_checking_backend_options_is_cheap() -> None:
    """Options are checked at configure time, which runs for every pytest invocation (``--help`` too)."""
    code = "from pytest_qaccuracy.plugin.schemes import check_backend, check_scheme; check_scheme('tflite')"
    assert not _modules_after(code) & {"numpy", "onnx", "onnxruntime", "pytest_qaccuracy.backend"}


def test_library_modules_do_not_import_pytest() -> None:
    modules = ["analysis.outputs", "metrics.topk", "report.summary", "report.baseline", "assertions"]
    loaded = _modules_after("; ".join(f"import pytest_qaccuracy.{m}" for m in modules))
    assert "pytest" not in loaded and "_pytest" not in loaded
