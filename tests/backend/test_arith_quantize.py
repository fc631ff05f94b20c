"""QuantizeLinear, DequantizeLinear and the float32 FMA of ``backend/arith.py`` against their
definitions: the ONNX operator spec (``saturate(round(x / scale) + zero_point)``, ties to even;
``(x - zero_point) * scale``), TFLite's round-half-away, and one exact rounding for the FMA.
Every expected integer below is worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_qaccuracy.backend import arith, get_scheme

ONNX = get_scheme("onnxruntime-vnni")
TFLITE = get_scheme("tflite")


def test_quantize_ties_to_even_and_saturates() -> None:
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 1000.0, -1000.0], np.float32)
    q = arith.quantize_float(x, np.float32(1.0), np.int8(0), np.int8, ONNX)
    assert q.dtype == np.int8
    np.testing.assert_array_equal(q, [-2, -2, 0, 0, 2, 2, 127, -128])


def test_quantize_half_away_from_zero_for_tflite() -> None:
    x = np.array([-2.5, -0.5, 0.5, 2.5, 0.25], np.float32)
    np.testing.assert_array_equal(
        arith.quantize_float(x, np.float32(1.0), np.int8(0), np.int8, TFLITE), [-3, -1, 1, 3, 0]
    )


def test_quantize_adds_the_zero_point_and_saturates_after_it() -> None:
    x = np.array([0.5, 1.5, -20.0, 300.0, 1.0], np.float32)
    # round(x / 0.5): 1, 3, -40, 600, 2; + 10: 11, 13, -30 -> 0, 610 -> 255, 12
    q = arith.quantize_float(x, np.float32(0.5), np.uint8(10), np.uint8, ONNX)
    assert q.dtype == np.uint8
    np.testing.assert_array_equal(q, [11, 13, 0, 255, 12])


def test_quantize_per_channel_broadcasts_scale_and_zero_point() -> None:
    x = np.array([[1.0, 2.0], [1.0, 2.0]], np.float32)
    scale = np.array([[1.0], [0.5]], np.float32)
    zero_point = np.array([[0], [1]], np.int8)
    np.testing.assert_array_equal(arith.quantize_float(x, scale, zero_point, np.int8, ONNX), [[1, 2], [3, 5]])
    row = np.array([1.0, 2.0], np.float32)  # one record, two channels: the output takes the broadcast shape
    np.testing.assert_array_equal(arith.quantize_float(row, scale, zero_point, np.int8, ONNX), [[1, 2], [3, 5]])


def test_quantize_divides_in_the_input_precision() -> None:
    x = np.array([0.5 + 2.0**-40], np.float64)  # float64 keeps the excess over the tie, float32 would not
    assert arith.quantize_float(x, np.float32(1.0), np.int8(0), np.int8, ONNX)[0] == 1
    big = np.full(100_000, 2.5, np.float32)  # the per-tensor block path
    assert set(arith.quantize_float(big, np.float32(1.0), np.int8(3), np.int8, ONNX).tolist()) == {5}


def test_dequantize() -> None:
    out = arith.dequantize(np.array([-128, 127], np.int8), np.float32(0.5), np.int8(1))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [-64.5, 63.0])
    np.testing.assert_array_equal(arith.dequantize(np.array([3], np.uint8), np.float32(2.0), None), [6.0])
    # int32 inputs are shifted in float32, as the spec says: 2**24 + 1 becomes 2**24
    assert arith.dequantize(np.array([2**24 + 1], np.int32), np.float32(1.0), np.int32(0))[0] == 2**24
    assert arith.dequantize(np.array([1], np.int8), np.float64(0.1), 0).dtype == np.float64
    assert arith.dequantize(np.array([1], np.int8), np.int32(2), 0).dtype == np.float32


def test_fma32_rounds_once() -> None:
    a = np.float32(1 + 2.0**-12)
    # a*a = 1 + 2**-11 + 2**-24 exactly; float32 rounds the product to 1 + 2**-11 (a tie, to even),
    # so a*a - 1 in two roundings is 2**-11, but with one rounding 2**-11 + 2**-24
    assert np.float32(a * a) - np.float32(1) == np.float32(2.0**-11)
    result = arith.fma32(np.array([a]), np.array([a]), np.array([-1.0], np.float32))
    assert result.dtype == np.float32
    assert result[0] == np.float32(2.0**-11 + 2.0**-24)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16])
def test_quantize_range_of_each_type(dtype) -> None:
    info = np.iinfo(dtype)
    x = np.array([-1e9, 1e9], np.float32)
    np.testing.assert_array_equal(arith.quantize_float(x, np.float32(1.0), dtype(0), dtype, ONNX), [info.min, info.max])
