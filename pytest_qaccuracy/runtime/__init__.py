"""Running models: onnxruntime sessions (or the emulated integer backend) that expose tensors per batch."""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.runtime.options import CAPTURE_MODES, OPTIMIZATION_LEVELS, RuntimeOptions
from pytest_qaccuracy.runtime.ort_runner import OrtRunner

BACKENDS = ("onnxruntime", "integer")


def make_runner(
    model: onnx.ModelProto,
    tensors: Sequence[str],
    options: RuntimeOptions,
    label: str,
    backend: str = "onnxruntime",
    scheme: str | None = None,
):
    """A runner with ``run(batch) -> {tensor: array}`` on the chosen backend."""
    if backend == "onnxruntime":
        if scheme is not None:
            raise InputError("a scheme applies to the integer backend only")
        return OrtRunner(model, tensors, options, label)
    if backend == "integer":
        from pytest_qaccuracy.runtime.integer import IntegerRunner

        return IntegerRunner(model, tensors, scheme or "onnxruntime", label, threads=options.threads)
    raise InputError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "CAPTURE_MODES", "OPTIMIZATION_LEVELS", "OrtRunner", "RuntimeOptions", "make_runner"]
