"""Emulated integer backend: run quantized ONNX models with the arithmetic of a chosen scheme.

Public API::

    from pytest_qaccuracy.backend import IntegerSession, Scheme, get_scheme, PRESETS
    session = IntegerSession("model.int8.onnx", scheme="tflite")
    outputs = session.run(None, {"input": batch})

Names are re-exported lazily (PEP 562), so ``pytest_qaccuracy.backend.scheme`` (stdlib only) can be
imported without numpy: the pytest plugin validates ``qaccuracy_scheme`` against ``PRESETS`` at
configure time, which runs for every pytest invocation.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> module that defines it
_EXPORTS = {
    "IntegerSession": "pytest_qaccuracy.backend.interpreter",
    "KernelError": "pytest_qaccuracy.backend.interpreter",
    "TensorArg": "pytest_qaccuracy.backend.interpreter",
    "PRESETS": "pytest_qaccuracy.backend.scheme",
    "Scheme": "pytest_qaccuracy.backend.scheme",
    "get_scheme": "pytest_qaccuracy.backend.scheme",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_qaccuracy.backend' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
