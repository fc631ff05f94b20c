"""ONNX backend node tests for quantized ops: every case of the installed onnx's
``load_model_tests(kind="node")`` whose name matches ``PATTERN`` (39 cases in onnx 1.16, 45 in onnx >= 1.18,
which adds the int2/uint2/float4e2m1 ones).

Every case runs under the ``onnx-reference`` and ``onnxruntime`` presets and must reproduce the
expected outputs exactly (float outputs within the case's rtol/atol). Float8, 4-bit, 2-bit and
float4 types have no integer kernel here: ``QuantizeLinear``/``DequantizeLinear`` hand them to
``onnx.reference`` (documented in docs/backend.md).

onnx < 1.17 (or so) lists node cases from the files it ships (``case.model`` and ``case.data_sets`` are None,
``case.model_dir`` holds ``model.onnx`` and ``test_data_set_*/{input,output}_*.pb``); newer onnx builds them in
memory and ships no files. ``_load`` reads either, the way onnx's own backend test runner does.
"""

from __future__ import annotations

import glob
import os
import re
import warnings
from collections.abc import Sequence
from functools import lru_cache
from typing import NamedTuple

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from pytest_qaccuracy.backend import IntegerSession
from pytest_qaccuracy.errors import ModelError

ONNX = tuple(int(p) for p in re.findall(r"\d+", onnx.__version__)[:2])

PATTERN = re.compile("qlinear|quantize|dequantize|integer|convinteger|matmulinteger|dynamicquantize")
# Present in every onnx pyproject.toml allows (onnx >= 1.16): a loader or PATTERN regression cannot shrink the set
# below these unnoticed.
CORE_CASES = {
    "test_convinteger_with_padding", "test_convinteger_without_padding", "test_dequantizelinear",
    "test_dequantizelinear_axis", "test_dequantizelinear_blocked", "test_dequantizelinear_e4m3fn",
    "test_dequantizelinear_e5m2", "test_dequantizelinear_int4", "test_dequantizelinear_uint4",
    "test_dynamicquantizelinear", "test_matmulinteger", "test_qlinearconv", "test_qlinearmatmul_2D_uint8_float32",
    "test_qlinearmatmul_3D_int8_float16", "test_quantizelinear", "test_quantizelinear_axis",
    "test_quantizelinear_blocked_asymmetric", "test_quantizelinear_e4m3fn", "test_quantizelinear_int16",
    "test_quantizelinear_uint4",
}  # fmt: skip


class _Case(NamedTuple):
    model: onnx.ModelProto
    data_sets: list[tuple[list[object], list[object]]]
    rtol: float
    atol: float


@lru_cache(maxsize=1)
def _listed() -> dict:
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {c.name: c for c in load_model_tests(kind="node") if PATTERN.search(c.name)}


def _read_tensors(directory: str, prefix: str, values: Sequence[onnx.ValueInfoProto]) -> list[object]:
    """The ``{prefix}_*.pb`` tensors of one on-disk data set, in order (quantized ops only take tensors)."""
    tensors = []
    for i, value in enumerate(values):
        assert value.type.HasField("tensor_type"), f"{value.name}: only tensor inputs/outputs are expected here"
        tensor = onnx.TensorProto()
        with open(os.path.join(directory, f"{prefix}_{i}.pb"), "rb") as f:
            tensor.ParseFromString(f.read())
        tensors.append(tensor)
    return tensors


def _load(name: str) -> _Case:
    case = _listed()[name]
    if case.model is not None:
        return _Case(case.model, list(case.data_sets), case.rtol, case.atol)
    model = onnx.load(os.path.join(case.model_dir, "model.onnx"))
    initializers = {i.name for i in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in initializers]
    data_sets = [
        (_read_tensors(d, "input", inputs), _read_tensors(d, "output", model.graph.output))
        for d in sorted(glob.glob(os.path.join(case.model_dir, "test_data_set_*")))
    ]
    return _Case(model, data_sets, case.rtol, case.atol)


def _narrow(model: onnx.ModelProto) -> bool:
    """Whether the model has float8, 4-bit, 2-bit or float4 tensors."""
    narrow = {
        getattr(onnx.TensorProto, n)
        for n in ("FLOAT8E4M3FN", "FLOAT8E5M2", "UINT4", "INT4", "FLOAT4E2M1", "UINT2", "INT2")
        if hasattr(onnx.TensorProto, n)
    }
    values = [*model.graph.input, *model.graph.output]
    return any(v.type.tensor_type.elem_type in narrow for v in values) or any(
        i.data_type in narrow for i in model.graph.initializer
    )


def _array(value: object) -> np.ndarray:
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else np.asarray(value)


def test_the_generated_set_holds_the_core_cases() -> None:
    missing = sorted(CORE_CASES - set(_listed()))
    assert not missing, missing


@pytest.mark.parametrize("preset", ["onnx-reference", "onnxruntime"])
@pytest.mark.parametrize("name", sorted(_listed()))
def test_node_case(name: str, preset: str) -> None:
    case = _load(name)
    assert case.data_sets, f"{name}: no data set"
    if ONNX < (1, 19) and _narrow(case.model):
        # onnx < 1.19 has no numpy dtype for these types (int8/uint8/float32 in helper, float32 or structured
        # dtypes in numpy_helper): the session refuses the model instead of computing with the wrong type
        with pytest.raises(ModelError, match=r"need onnx >= 1\.19"):
            IntegerSession(case.model, preset)
        return
    if ONNX < (1, 22) and name.startswith("test_qlinearmatmul_") and "_int8_" in name:
        pytest.skip(
            "onnx < 1.22 expects int8 overflow to wrap (its reference QLinearMatMul cast without clipping, "
            "e.g. -236 -> 20); the spec, onnx >= 1.22 and this backend saturate (-128)"
        )
    initializers = {i.name for i in case.model.graph.initializer}
    inputs = [v.name for v in case.model.graph.input if v.name not in initializers]
    session = IntegerSession(case.model, preset)
    for feeds, expected in case.data_sets:
        got = session.run(None, {n: _array(a) for n, a in zip(inputs, feeds, strict=True)})
        assert len(got) == len(expected) == len(case.model.graph.output)
        for g, w in zip(got, expected, strict=True):
            g, w = np.asarray(g), _array(w)
            assert g.dtype == w.dtype and g.shape == w.shape
            if g.dtype.kind == "f":
                np.testing.assert_allclose(g, w, rtol=case.rtol, atol=case.atol)
            else:
                assert g.tobytes() == w.tobytes()
