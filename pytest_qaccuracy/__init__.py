"""pytest-qaccuracy: quantization accuracy of ONNX model pairs as an ordinary regression test.

The public API is re-exported here lazily (PEP 562): importing the package costs nothing, so the
pytest plugin, which pytest loads for every run, stays cheap. See docs/api.md.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: public name -> module that defines it
_EXPORTS = {
    "ModelPair": "pytest_qaccuracy.model",
    "load_model": "pytest_qaccuracy.model",
    "match_tensors": "pytest_qaccuracy.model",
    "load_dataset": "pytest_qaccuracy.data",
    "bind_dataset": "pytest_qaccuracy.data",
    "compare": "pytest_qaccuracy.analysis.compare",
    "worst_layers": "pytest_qaccuracy.analysis.compare",
    "first_jump": "pytest_qaccuracy.analysis.compare",
    "ComparisonResult": "pytest_qaccuracy.analysis.results",
    "LayerResult": "pytest_qaccuracy.analysis.results",
    "OutputResult": "pytest_qaccuracy.analysis.results",
    "RuntimeOptions": "pytest_qaccuracy.runtime",
    "Metric": "pytest_qaccuracy.metrics",
    "StatsMetric": "pytest_qaccuracy.metrics",
    "register_metric": "pytest_qaccuracy.metrics",
    "available_metrics": "pytest_qaccuracy.metrics",
    "assert_cosine": "pytest_qaccuracy.assertions",
    "assert_relative": "pytest_qaccuracy.assertions",
    "assert_topk": "pytest_qaccuracy.assertions",
    "assert_within_lsb": "pytest_qaccuracy.assertions",
    "IntegerSession": "pytest_qaccuracy.backend",
    "Scheme": "pytest_qaccuracy.backend",
    "get_scheme": "pytest_qaccuracy.backend",
    "check_agreement": "pytest_qaccuracy.backend.agreement",
    "node_sensitivity": "pytest_qaccuracy.analysis.sensitivity",
    "analyse_pair": "pytest_qaccuracy.analysis.sensitivity_report",
    "calibrate": "pytest_qaccuracy.analysis.calibration",
    "DatasetReader": "pytest_qaccuracy.analysis.calibration.reader",
    "QAccuracyError": "pytest_qaccuracy.errors",
    "InputError": "pytest_qaccuracy.errors",
    "DataError": "pytest_qaccuracy.errors",
    "ModelError": "pytest_qaccuracy.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_qaccuracy' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
