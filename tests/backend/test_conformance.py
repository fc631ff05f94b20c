"""ONNX backend node tests for quantized ops (the 45 cases of ``load_model_tests(kind="node")``).

Every case runs under the ``onnx-reference`` and ``onnxruntime`` presets and must reproduce the
expected outputs exactly (float outputs within the case's rtol/atol). Float8, 4-bit, 2-bit and
float4 types have no integer kernel here: ``QuantizeLinear``/``DequantizeLinear`` hand them to
``onnx.reference`` (documented in docs/backend.md).
"""

from __future__ import annotations

import re
import warnings
from functools import lru_cache

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from pytest_qaccuracy.backend import IntegerSession

QUANT_CASES = [
    "test_convinteger_with_padding", "test_convinteger_without_padding",
    "test_dequantizelinear", "test_dequantizelinear_axis", "test_dequantizelinear_blocked",
    "test_dequantizelinear_e4m3fn", "test_dequantizelinear_e4m3fn_float16", "test_dequantizelinear_e4m3fn_zero_point",
    "test_dequantizelinear_e5m2", "test_dequantizelinear_float4e2m1", "test_dequantizelinear_int16",
    "test_dequantizelinear_int2", "test_dequantizelinear_int4", "test_dequantizelinear_uint16",
    "test_dequantizelinear_uint2", "test_dequantizelinear_uint4",
    "test_dynamicquantizelinear", "test_dynamicquantizelinear_expanded", "test_dynamicquantizelinear_max_adjusted",
    "test_dynamicquantizelinear_max_adjusted_expanded", "test_dynamicquantizelinear_min_adjusted",
    "test_dynamicquantizelinear_min_adjusted_expanded",
    "test_matmulinteger", "test_qlinearconv",
    "test_qlinearmatmul_2D_int8_float16", "test_qlinearmatmul_2D_int8_float32", "test_qlinearmatmul_2D_uint8_float16",
    "test_qlinearmatmul_2D_uint8_float32", "test_qlinearmatmul_3D_int8_float16", "test_qlinearmatmul_3D_int8_float32",
    "test_qlinearmatmul_3D_uint8_float16", "test_qlinearmatmul_3D_uint8_float32",
    "test_quantizelinear", "test_quantizelinear_axis", "test_quantizelinear_blocked_asymmetric",
    "test_quantizelinear_blocked_symmetric", "test_quantizelinear_e4m3fn", "test_quantizelinear_e5m2",
    "test_quantizelinear_float4e2m1", "test_quantizelinear_int16", "test_quantizelinear_int2",
    "test_quantizelinear_int4",
    "test_quantizelinear_uint16", "test_quantizelinear_uint2", "test_quantizelinear_uint4",
]  # fmt: skip
PATTERN = re.compile("qlinear|quantize|dequantize|integer|convinteger|matmulinteger|dynamicquantize")


@lru_cache(maxsize=1)
def _cases() -> dict:
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {c.name: c for c in load_model_tests(kind="node") if PATTERN.search(c.name)}


def _array(value: object) -> np.ndarray:
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else np.asarray(value)


def test_the_list_is_the_generated_set() -> None:
    assert sorted(_cases()) == sorted(QUANT_CASES) and len(QUANT_CASES) == 45


@pytest.mark.parametrize("preset", ["onnx-reference", "onnxruntime"])
@pytest.mark.parametrize("name", QUANT_CASES)
def test_node_case(name: str, preset: str) -> None:
    case = _cases()[name]
    initializers = {i.name for i in case.model.graph.initializer}
    inputs = [v.name for v in case.model.graph.input if v.name not in initializers]
    session = IntegerSession(case.model, preset)
    for feeds, expected in case.data_sets:
        got = session.run(None, {n: _array(a) for n, a in zip(inputs, feeds, strict=False)})
        for g, w in zip(got, expected, strict=False):
            g, w = np.asarray(g), _array(w)
            assert g.dtype == w.dtype and g.shape == w.shape
            if g.dtype.kind == "f":
                np.testing.assert_allclose(g, w, rtol=case.rtol, atol=case.atol)
            else:
                assert g.tobytes() == w.tobytes()
