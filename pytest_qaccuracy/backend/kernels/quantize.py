"""QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear (ONNX opsets 10-25)."""

from __future__ import annotations

import numpy as np
from onnx import helper

from pytest_qaccuracy.backend import arith
from pytest_qaccuracy.backend.kernels.elementwise import lookup_bytes
from pytest_qaccuracy.backend.registry import NotHandled, kernel
from pytest_qaccuracy.backend.scheme import Scheme

_INTEGER_TYPES = {np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16)}


def broadcast_param(param: np.ndarray, x_ndim: int, x_shape: tuple[int, ...], axis: int, block_size: int) -> np.ndarray:
    """Reshape a scale/zero point for per-tensor, per-axis or blocked use against ``x``."""
    param = np.asarray(param)
    if param.ndim == 0 or (param.size == 1 and block_size == 0):
        return param.reshape(())
    axis = axis % x_ndim
    if block_size:
        return np.repeat(param, block_size, axis=axis).take(np.arange(x_shape[axis]), axis=axis)
    shape = [1] * x_ndim
    shape[axis] = param.size
    return param.reshape(shape)


def _output_dtype(zero_point: np.ndarray | None, output_dtype: int) -> np.dtype:
    if zero_point is not None:
        return np.asarray(zero_point).dtype
    if output_dtype:
        return np.dtype(helper.tensor_dtype_to_np_dtype(output_dtype))
    return np.dtype(np.uint8)


@kernel("", "QuantizeLinear", 10, scheme=True)
def quantize_linear(
    x: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None = None,
    *,
    axis: int = 1,
    saturate: int = 1,
    block_size: int = 0,
    output_dtype: int = 0,
    precision: int = 0,
    scheme: Scheme,
) -> tuple[np.ndarray]:
    """``saturate(round(x / y_scale) + zp)``; float8/4-bit/2-bit targets go to ``onnx.reference``."""
    dtype = _output_dtype(y_zero_point, output_dtype)
    if dtype not in _INTEGER_TYPES or precision:
        raise NotHandled
    scale = broadcast_param(y_scale, x.ndim, x.shape, axis, block_size)
    zp = 0 if y_zero_point is None else broadcast_param(y_zero_point, x.ndim, x.shape, axis, block_size)
    ftype = np.float32 if x.dtype != np.float64 and scale.dtype != np.float64 else np.float64
    return (arith.quantize_float(x.astype(ftype, copy=False), scale.astype(ftype), np.asarray(zp), dtype, scheme),)


@kernel("", "DequantizeLinear", 10)
def dequantize_linear(
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray | None = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    output_dtype: int = 0,
) -> tuple[np.ndarray]:
    """``(x - zp) * scale`` in float32, cast to the scale's (or ``output_dtype``'s) type."""
    if x.dtype not in _INTEGER_TYPES | {np.dtype(np.int32)}:
        raise NotHandled
    scale = broadcast_param(x_scale, x.ndim, x.shape, axis, block_size)
    zp = None if x_zero_point is None else broadcast_param(x_zero_point, x.ndim, x.shape, axis, block_size)
    out_type = np.dtype(helper.tensor_dtype_to_np_dtype(output_dtype)) if output_dtype else scale.dtype
    if x.dtype.itemsize == 1 and scale.size == 1 and (zp is None or zp.size == 1):  # one 256-entry table
        every = np.arange(256, dtype=np.uint8).view(x.dtype)  # in byte order
        table = arith.dequantize(every, scale.astype(np.float32), zp).astype(out_type, copy=False).reshape(256)
        return (lookup_bytes(x, table),)
    value = arith.dequantize(x, scale.astype(np.float32), zp)
    return (value.astype(out_type, copy=False),)


@kernel("", "DynamicQuantizeLinear", 11, scheme=True)
def dynamic_quantize_linear(x: np.ndarray, *, scheme: Scheme) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """uint8 scale/zero point from the data range (always including 0), then QuantizeLinear."""
    x = np.asarray(x, dtype=np.float32)
    high = np.float32(max(0.0, float(x.max()))) if x.size else np.float32(0)
    low = np.float32(min(0.0, float(x.min()))) if x.size else np.float32(0)
    if high == low:  # all zeros: onnxruntime's scale is 1, onnx.reference's 1 / 255 (y and zp are 0 either way)
        scale = np.float32(1) / np.float32(255) if scheme.float_kernels == "reference" else np.float32(1)
    else:
        scale = np.float32(high - low) / np.float32(255)
    zp_float = np.clip(np.float32(0) - low / scale, 0, 255)
    zp = arith.round_float(np.asarray(zp_float, np.float32), "half_even").astype(np.uint8)
    y = arith.quantize_float(x, np.asarray(scale), np.asarray(zp), np.uint8, scheme)
    return y, np.asarray(scale, np.float32), np.asarray(zp, np.uint8)
