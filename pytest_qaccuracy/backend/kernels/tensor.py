"""Data-movement ops (any dtype, integers pass through unchanged) and QLinearConcat."""

from __future__ import annotations

import numpy as np

from pytest_qaccuracy.backend.kernels.elementwise import apply_table, lookup_table
from pytest_qaccuracy.backend.registry import kernel
from pytest_qaccuracy.backend.scheme import Scheme

MS = "com.microsoft"


@kernel("", "Reshape", 5)
def reshape(data: np.ndarray, shape: np.ndarray, *, allowzero: int = 0) -> tuple[np.ndarray]:
    new = [int(s) for s in shape]
    if not allowzero:
        new = [data.shape[i] if s == 0 else s for i, s in enumerate(new)]
    return (data.reshape(new),)


@kernel("", "Transpose", 1)
def transpose(data: np.ndarray, *, perm: list[int] | None = None) -> tuple[np.ndarray]:
    return (np.transpose(data, perm),)


@kernel("", "Flatten", 1)
def flatten(input: np.ndarray, *, axis: int = 1) -> tuple[np.ndarray]:
    axis = axis % input.ndim if input.ndim else 0
    outer = int(np.prod(input.shape[:axis]))
    return (input.reshape(outer, -1),)


@kernel("", "Squeeze", 13)
def squeeze(data: np.ndarray, axes: np.ndarray | None = None) -> tuple[np.ndarray]:
    return (np.squeeze(data, axis=None if axes is None else tuple(int(a) for a in axes)),)


@kernel("", "Squeeze", 1)
def squeeze_1(data: np.ndarray, *, axes: list[int] | None = None) -> tuple[np.ndarray]:
    return (np.squeeze(data, axis=None if axes is None else tuple(axes)),)


@kernel("", "Unsqueeze", 13)
def unsqueeze(data: np.ndarray, axes: np.ndarray) -> tuple[np.ndarray]:
    rank = data.ndim + len(axes)
    return (np.expand_dims(data, tuple(int(a) % rank for a in axes)),)


@kernel("", "Unsqueeze", 1)
def unsqueeze_1(data: np.ndarray, *, axes: list[int]) -> tuple[np.ndarray]:
    rank = data.ndim + len(axes)
    return (np.expand_dims(data, tuple(a % rank for a in axes)),)


@kernel("", "Concat", 4)
def concat(*inputs: np.ndarray, axis: int) -> tuple[np.ndarray]:
    return (np.concatenate(inputs, axis=axis),)


@kernel("", "Gather", 1)
def gather(data: np.ndarray, indices: np.ndarray, *, axis: int = 0) -> tuple[np.ndarray]:
    idx = np.where(indices < 0, indices + data.shape[axis], indices)
    return (np.take(data, idx, axis=axis),)


@kernel("", "Slice", 10)
def slice_(
    data: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    axes: np.ndarray | None = None,
    steps: np.ndarray | None = None,
) -> tuple[np.ndarray]:
    index = [slice(None)] * data.ndim
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=False):
        # python slicing clamps like ONNX; int64 extremes are fine for slice objects
        index[int(axis)] = slice(int(start), int(end), int(step))
    return (data[tuple(index)],)


@kernel(MS, "QLinearConcat", 1, scheme=True)
def qlinear_concat(
    Y_scale: np.ndarray, Y_zero_point: np.ndarray, *tensors: np.ndarray, axis: int, scheme: Scheme
) -> tuple[np.ndarray]:
    """ORT: an input with the output's (scale, zp) is copied; any other is requantized by a table."""
    parts = []
    dtype = np.asarray(Y_zero_point).dtype
    for x, scale, zp in zip(tensors[0::3], tensors[1::3], tensors[2::3], strict=False):
        if np.array_equal(scale, Y_scale) and np.array_equal(
            np.asarray(zp).astype(np.int64), np.asarray(Y_zero_point).astype(np.int64)
        ):
            parts.append(x)
        else:
            parts.append(
                apply_table(x, lookup_table(lambda v: v, x.dtype, scale, zp, Y_scale, Y_zero_point, dtype, scheme))
            )
    return (np.concatenate(parts, axis=axis),)
