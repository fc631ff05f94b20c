"""Running models: onnxruntime sessions that expose intermediate tensors, batch by batch."""

from pytest_qaccuracy.runtime.options import CAPTURE_MODES, OPTIMIZATION_LEVELS, RuntimeOptions
from pytest_qaccuracy.runtime.session import OrtRunner

__all__ = ["CAPTURE_MODES", "OPTIMIZATION_LEVELS", "OrtRunner", "RuntimeOptions"]
