"""Our numpy float and data-movement kernels, one node each, against onnxruntime.

Data movement must be exact (on float and on 8-bit tensors); arithmetic within float32 rounding.
"""

from __future__ import annotations

import numpy as np
import pytest
from backend_models import node_model, ort_run

from pytest_qaccuracy.backend import IntegerSession, get_scheme
from pytest_qaccuracy.backend.host import host_preset

#: the host's preset under another name: float ops then run on our numpy kernels, not on this machine's
#: onnxruntime (which the host preset itself uses for them: issue 32)
NUMPY_FLOATS = get_scheme("onnxruntime").replace(name="numpy-floats")

rng = np.random.default_rng(0)
X = rng.normal(0, 1, (2, 6, 7, 7)).astype(np.float32)
Q = rng.integers(0, 256, (2, 6, 7, 7)).astype(np.uint8)


def _i64(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


CASES = {
    # name: (op, inputs {name: array}, initializers, attrs, exact)
    "conv": (
        "Conv",
        {"x": X},
        {"w": rng.normal(0, 1, (4, 6, 3, 3)).astype(np.float32), "b": rng.normal(0, 1, 4).astype(np.float32)},
        {"pads": [1, 1, 1, 1], "strides": [2, 1]},
        False,
    ),
    "conv-grouped-dilated": (
        "Conv",
        {"x": X},
        {"w": rng.normal(0, 1, (6, 2, 3, 3)).astype(np.float32)},
        {"group": 3, "dilations": [2, 2], "pads": [2, 1, 2, 1]},
        False,
    ),
    "conv-depthwise": ("Conv", {"x": X}, {"w": rng.normal(0, 1, (6, 1, 3, 3)).astype(np.float32)}, {"group": 6}, False),
    "conv-depthwise-padded-wide": (  # 64+ output columns: the padded-width path
        "Conv",
        {"x": rng.normal(0, 1, (2, 4, 5, 70)).astype(np.float32)},
        {"w": rng.normal(0, 1, (4, 1, 3, 3)).astype(np.float32), "b": rng.normal(0, 1, 4).astype(np.float32)},
        {"group": 4, "pads": [1, 2, 0, 1], "dilations": [1, 2]},
        False,
    ),
    "conv-1d-depthwise": (  # other ranks than 2: im2col, the depthwise groups as a batched GEMM
        "Conv",
        {"x": rng.normal(0, 1, (2, 6, 40)).astype(np.float32)},
        {"w": rng.normal(0, 1, (12, 1, 5)).astype(np.float32), "b": rng.normal(0, 1, 12).astype(np.float32)},
        {"group": 6, "pads": [2, 1], "strides": [2]},
        False,
    ),
    "conv-3d-depthwise": (
        "Conv",
        {"x": rng.normal(0, 1, (2, 4, 5, 6, 7)).astype(np.float32)},
        {"w": rng.normal(0, 1, (4, 1, 3, 3, 3)).astype(np.float32)},
        {"group": 4, "pads": [1, 0, 1, 1, 1, 0], "dilations": [1, 2, 1]},
        False,
    ),
    "matmul": ("MatMul", {"x": X[0, 0]}, {"w": rng.normal(0, 1, (7, 5)).astype(np.float32)}, {}, False),
    "gemm": (
        "Gemm",
        {"x": X[0, 0]},
        {"w": rng.normal(0, 1, (5, 7)).astype(np.float32), "c": np.ones(5, np.float32)},
        {"transB": 1, "alpha": 0.5, "beta": 2.0},
        False,
    ),
    "add": ("Add", {"x": X}, {"b": rng.normal(0, 1, (6, 1, 1)).astype(np.float32)}, {}, True),
    "sub": ("Sub", {"x": X}, {"b": np.float32(0.5)}, {}, True),
    "mul": ("Mul", {"x": X}, {"b": X[0]}, {}, True),
    "relu": ("Relu", {"x": X}, {}, {}, True),
    "sigmoid": ("Sigmoid", {"x": X}, {}, {}, False),
    "clip": ("Clip", {"x": X}, {"lo": np.float32(-0.5), "hi": np.float32(0.7)}, {}, True),
    "softmax": ("Softmax", {"x": X}, {}, {"axis": 1}, False),
    "maxpool": ("MaxPool", {"x": X}, {}, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}, True),
    "maxpool-uint8-ceil": ("MaxPool", {"x": Q}, {}, {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, True),
    "averagepool": ("AveragePool", {"x": X}, {}, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, False),
    "averagepool-include-pad": (
        "AveragePool",
        {"x": X},
        {},
        {"kernel_shape": [2, 3], "pads": [1, 0, 1, 1], "count_include_pad": 1},
        False,
    ),
    "globalaveragepool": ("GlobalAveragePool", {"x": X}, {}, {}, False),
    "maxpool-same-upper": (
        "MaxPool",
        {"x": X},
        {},
        {"kernel_shape": [2, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
        True,
    ),
    "averagepool-ceil": (
        "AveragePool",
        {"x": X},
        {},
        {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
        False,
    ),
    "maxpool-dilated-same": (
        "MaxPool",
        {"x": X},
        {},
        {"kernel_shape": [3, 3], "dilations": [2, 2], "pads": [2, 1, 1, 2], "strides": [2, 2]},
        True,
    ),
    "reshape-uint8": ("Reshape", {"x": Q}, {"s": _i64(0, -1, 7)}, {}, True),
    "transpose": ("Transpose", {"x": Q}, {}, {"perm": [0, 2, 3, 1]}, True),
    "flatten": ("Flatten", {"x": Q}, {}, {"axis": 2}, True),
    "squeeze": ("Squeeze", {"x": Q[:, :1]}, {"a": _i64(1)}, {}, True),
    "unsqueeze": ("Unsqueeze", {"x": Q}, {"a": _i64(0, -1)}, {}, True),
    "concat": ("Concat", {"x": Q, "b": Q[:, :2]}, {}, {"axis": 1}, True),
    "gather": ("Gather", {"x": Q}, {"i": _i64(0, -1, 2)}, {"axis": 1}, True),
    "resize-nearest-half-pixel": (
        "Resize",
        {"x": Q},
        {"roi": np.zeros(0, np.float32), "sc": np.array([1, 1, 2, 1.5], np.float32)},
        {"mode": "nearest"},
        True,
    ),
    "resize-nearest-asymmetric-sizes": (
        "Resize",
        {"x": X},
        {"roi": np.zeros(0, np.float32), "sc": np.zeros(0, np.float32), "sz": _i64(2, 6, 3, 11)},
        {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
        True,
    ),
    "resize-nearest-batch-axis": (  # the record axis resized too: no split over records
        "Resize",
        {"x": Q},
        {"roi": np.zeros(0, np.float32), "sc": np.array([2, 1, 1, 2], np.float32)},
        {"mode": "nearest"},
        True,
    ),
    "resize-nearest-align-corners": (
        "Resize",
        {"x": Q},
        {"roi": np.zeros(0, np.float32), "sc": np.array([1, 1, 0.5, 3], np.float32)},
        {"mode": "nearest", "coordinate_transformation_mode": "align_corners", "nearest_mode": "round_prefer_ceil"},
        True,
    ),
    "resize-linear-falls-back": (
        "Resize",
        {"x": X},
        {"roi": np.zeros(0, np.float32), "sc": np.array([1, 1, 2, 2], np.float32)},
        {"mode": "linear"},
        False,
    ),
    "slice": ("Slice", {"x": Q}, {"st": _i64(1, -1), "en": _i64(5, -8), "ax": _i64(1, 3), "sp": _i64(2, -2)}, {}, True),
}


@pytest.mark.parametrize("case", CASES)
def test_kernel_matches_onnxruntime(case: str) -> None:
    op, inputs, inits, attrs, exact = CASES[case]
    spec = [(name, value.dtype, value.shape) for name, value in inputs.items()]
    first = next(iter(inputs.values()))
    model = node_model(op, spec, inits, first.dtype, **attrs)
    want = ort_run(model, inputs)[0]
    got = IntegerSession(model, NUMPY_FLOATS).run(None, inputs)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    if exact:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_the_host_preset_runs_float_ops_on_onnxruntime() -> None:
    """The host's preset computes float ops with this machine's onnxruntime (bit for bit, fusions of one
    node included); the other family's preset and renamed schemes keep the numpy kernels."""
    op, inputs, inits, attrs, _ = CASES["conv"]
    model = node_model(op, [("x", X.dtype, X.shape)], inits, X.dtype, **attrs)
    other = next(p for p in ("onnxruntime-avx2", "onnxruntime-vnni") if p != host_preset())
    assert [s.runner for s in IntegerSession(model).plan()] == ["onnxruntime"]
    assert [s.runner for s in IntegerSession(model, other).plan()] == ["kernel"]
    assert [s.runner for s in IntegerSession(model, NUMPY_FLOATS).plan()] == ["kernel"]
    np.testing.assert_array_equal(IntegerSession(model).run(None, inputs)[0], ort_run(model, inputs)[0])
