"""Emulated integer backend: run quantized ONNX models with the arithmetic of a chosen scheme.

Public API::

    from pytest_qaccuracy.backend import IntegerSession, Scheme, get_scheme, PRESETS
    session = IntegerSession("model.int8.onnx", scheme="tflite")
    outputs = session.run(None, {"input": batch})
"""

from pytest_qaccuracy.backend.interpreter import IntegerSession, KernelError, TensorArg
from pytest_qaccuracy.backend.scheme import PRESETS, Scheme, get_scheme

__all__ = ["PRESETS", "IntegerSession", "KernelError", "Scheme", "TensorArg", "get_scheme"]
