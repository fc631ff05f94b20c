"""What the installed onnxruntime can do, as skip marks shared by the test files that need a feature.

The recipe search writes every recipe through onnxruntime's calibration cache (``save_tensors_data``,
onnxruntime 1.19 on) and refuses an onnxruntime without it (``test_recipe_refusal.py``); onnxruntime
1.18 also refuses per-node weight types and 7-bit weights, so the search's weight phase has fewer
moves there.
"""

from __future__ import annotations

import onnxruntime as ort
import pytest
from onnxruntime.quantization import calibrate as ort_calibrate

#: onnxruntime 1.18 (the oldest supported) writes a per-tensor MatMul weight as an activation (measured:
#: uint8 whatever the weight type or override): the recipe refuses per-node weight moves there
OLD_ORT = tuple(int(part) for part in ort.__version__.split(".")[:2]) <= (1, 18)

needs_cache = pytest.mark.skipif(
    not hasattr(ort_calibrate, "save_tensors_data"),
    reason=f"onnxruntime {ort.__version__} has no calibration cache: the recipe search refuses it",
)
old_ort_refuses_moves = pytest.mark.skipif(
    OLD_ORT, reason="onnxruntime 1.18 refuses per-node weight types and 7-bit weights: fewer weight moves"
)
