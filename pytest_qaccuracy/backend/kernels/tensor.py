"""Data-movement ops (any dtype, integers pass through unchanged) and QLinearConcat."""

from __future__ import annotations

import numpy as np

from pytest_qaccuracy.backend import parallel
from pytest_qaccuracy.backend.kernels.elementwise import apply_table, lookup_table
from pytest_qaccuracy.backend.registry import NotHandled, kernel
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
    axis = axis + input.ndim if axis < 0 else axis  # axis == rank is allowed: (N, 1)
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
    axis = axis % parts[0].ndim
    if axis == 0 or len({x.shape[0] for x in parts}) != 1:  # (a mismatch raises numpy's own error)
        return (np.concatenate(parts, axis=axis),)
    shape = list(parts[0].shape)
    shape[axis] = sum(x.shape[axis] for x in parts)
    out = np.empty(shape, np.result_type(*parts))

    def part(n0: int, n1: int) -> None:  # records split over the threads
        np.concatenate([x[n0:n1] for x in parts], axis=axis, out=out[n0:n1])

    parallel.run_all([lambda r=r: part(*r) for r in parallel.split_records(shape)])
    return (out,)


def _nearest_index(out_size: int, in_size: int, scale: float, transform: str, nearest_mode: str) -> np.ndarray:
    """Input index of every output position along one axis (ONNX Resize, mode ``nearest``), in float32
    as onnxruntime computes it (``upsamplebase.h``): in float64, 4 / 1.6f is just below 2.5 where
    float32 gives 2.5 exactly, and ``round_prefer_ceil`` picks another pixel."""
    x = np.arange(out_size, dtype=np.float32)
    s = np.float32(scale)
    half = np.float32(0.5)
    if transform == "half_pixel":
        original = (x + half) / s - half
    elif transform == "pytorch_half_pixel":
        original = (x + half) / s - half if out_size > 1 else np.zeros_like(x)
    elif transform == "align_corners":
        original = x * np.float32(in_size - 1) / np.float32(out_size - 1) if out_size > 1 else np.zeros_like(x)
    elif transform == "asymmetric":
        original = x / s
    elif transform == "tf_half_pixel_for_nn":
        original = (x + half) / s
    else:
        raise NotHandled
    # a negative coordinate reads index 0 in every mode; above 0, ORT's std::round rounds half away
    whole = np.trunc(original)
    fraction = original - whole  # exact in float32
    if nearest_mode == "round_prefer_floor":
        index = whole + (fraction > half)
    elif nearest_mode == "round_prefer_ceil":
        index = whole + (fraction >= half)
    elif nearest_mode == "floor":
        index = np.floor(original)
    else:
        index = np.ceil(original)
    return np.clip(index, 0, in_size - 1).astype(np.intp)


@kernel("", "Resize", 11, scheme=True)
def resize(
    X: np.ndarray,
    roi: np.ndarray | None = None,
    scales: np.ndarray | None = None,
    sizes: np.ndarray | None = None,
    *,
    antialias: int = 0,
    axes: list[int] | None = None,
    coordinate_transformation_mode: str = "half_pixel",
    cubic_coeff_a: float = -0.75,
    exclude_outside: int = 0,
    extrapolation_value: float = 0.0,
    keep_aspect_ratio_policy: str = "stretch",
    mode: str = "nearest",
    nearest_mode: str = "round_prefer_floor",
    scheme: Scheme,
) -> tuple[np.ndarray]:
    """Nearest-neighbour Resize as index gathers (any dtype); other modes go to ``onnx.reference``."""
    if mode != "nearest" or axes or keep_aspect_ratio_policy != "stretch" or antialias:
        raise NotHandled
    if coordinate_transformation_mode == "tf_crop_and_resize":
        raise NotHandled
    # scales and output sizes in float32, as onnxruntime computes them
    if sizes is not None and np.size(sizes):
        out_sizes = [int(s) for s in sizes]
        factors = [np.float32(o) / np.float32(i) for o, i in zip(out_sizes, X.shape, strict=True)]
    else:
        factors = list(np.asarray(scales, dtype=np.float32))
        out_sizes = [int(np.float32(i) * f) for i, f in zip(X.shape, factors, strict=True)]
    if out_sizes == list(X.shape) and scheme.float_kernels != "reference":
        return (X,)  # onnxruntime copies the input then, whatever the scales; onnx.reference resizes
    gathers = [
        (axis, _nearest_index(out, size, factor, coordinate_transformation_mode, nearest_mode))
        for axis, (out, size, factor) in enumerate(zip(out_sizes, X.shape, factors, strict=True))
        if not (out == size and factor == 1.0)
    ]
    if not gathers:
        return (X,)
    y = np.empty(out_sizes, X.dtype)
    keeps_records = gathers[0][0] > 0  # the record axis is not resized: records split over the threads

    def part(n0: int, n1: int) -> None:
        block = X[n0:n1]
        for axis, index in gathers[:-1]:
            block = np.take(block, index, axis=axis)
        axis, index = gathers[-1]
        np.take(block, index, axis=axis, out=y[n0:n1] if keeps_records else y, mode="clip")

    ranges = parallel.split_records(y.shape) if keeps_records else [(0, X.shape[0])]
    parallel.run_all([lambda r=r: part(*r) for r in ranges])
    return (y,)
