"""Matrix products: QLinearMatMul, MatMulInteger, com.microsoft QGemm, and float MatMul/Gemm."""

from __future__ import annotations

import numpy as np

from pytest_qaccuracy.backend import arith
from pytest_qaccuracy.backend.registry import kernel
from pytest_qaccuracy.backend.scheme import Scheme

MS = "com.microsoft"


def _row_param(p: np.ndarray | None) -> np.ndarray | int:
    """Per-tensor or per-row (``[M]`` or ``[..., M, 1]``) parameter of ``a``, broadcastable to ``(..., M, 1)``."""
    if p is None:
        return 0
    p = np.asarray(p)
    if p.size == 1:
        return p.reshape(())
    return p.reshape(-1, 1) if p.ndim == 1 else p


def _col_param(p: np.ndarray | None) -> np.ndarray | int:
    """Per-tensor or per-column (``[N]`` or ``[..., 1, N]``) parameter of ``b``."""
    if p is None:
        return 0
    p = np.asarray(p)
    return p.reshape(()) if p.size == 1 else p


def integer_matmul(
    a: np.ndarray, a_zp: np.ndarray | int | None, b: np.ndarray, b_zp: np.ndarray | int | None, scheme: Scheme
) -> np.ndarray:
    """``(a - a_zp) @ (b - b_zp)`` with numpy matmul broadcasting, exact, with the scheme's accumulator."""
    return arith.zero_point_matmul(a, _row_param(a_zp), b, _col_param(b_zp), scheme)


@kernel("", "QLinearMatMul", 10, scheme=True)
def qlinear_matmul(
    a: np.ndarray,
    a_scale: np.ndarray,
    a_zero_point: np.ndarray,
    b: np.ndarray,
    b_scale: np.ndarray,
    b_zero_point: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray,
    *,
    scheme: Scheme,
) -> tuple[np.ndarray]:
    """Integer matmul, then requantize with ``a_scale * b_scale / y_scale`` (per row / per column)."""
    b = arith.clamp_weights(b, scheme)
    acc = integer_matmul(a, a_zero_point, b, b_zero_point, scheme)
    multiplier = arith.real_multiplier([_row_param(a_scale), _col_param(b_scale)], y_scale, scheme)
    return (arith.requantize(acc, multiplier, y_zero_point, np.asarray(y_zero_point).dtype, scheme, "gemm"),)


@kernel("", "MatMulInteger", 10, scheme=True)
def matmul_integer(
    A: np.ndarray,
    B: np.ndarray,
    a_zero_point: np.ndarray | None = None,
    b_zero_point: np.ndarray | None = None,
    *,
    scheme: Scheme,
) -> tuple[np.ndarray]:
    """int32 ``(A - a_zp) @ (B - b_zp)`` (u8 x s8 pairs saturate as the scheme says)."""
    return (integer_matmul(A, a_zero_point, B, b_zero_point, scheme.replace(accumulator="wrap32")).astype(np.int32),)


@kernel(MS, "QGemm", 1, scheme=True)
def qgemm(
    A: np.ndarray,
    a_scale: np.ndarray,
    a_zero_point: np.ndarray,
    B: np.ndarray,
    b_scale: np.ndarray,
    b_zero_point: np.ndarray,
    C: np.ndarray | None = None,
    y_scale: np.ndarray | None = None,
    y_zero_point: np.ndarray | None = None,
    *,
    alpha: float = 1.0,
    transA: int = 0,
    transB: int = 0,
    scheme: Scheme,
) -> tuple[np.ndarray]:
    """ORT QGemm: ``alpha * A' B'`` accumulated in int32 plus int32 C; quantized (or float) output."""
    a = A.T if transA else A
    b = arith.clamp_weights(B.T if transB else B, scheme)
    acc = integer_matmul(a, a_zero_point, b, b_zero_point, scheme)
    scale = arith.real_multiplier([np.float32(alpha), a_scale, _col_param(b_scale)], None, scheme)
    if C is not None:
        acc = arith.accumulate(acc + C.astype(np.int64), scheme)
    if y_scale is None:  # float output: f32(acc) * scale (ORT's scale output processor)
        return (acc.astype(np.float32) * np.asarray(scale, np.float32),)
    multiplier = arith.real_multiplier([scale], y_scale, scheme)
    dtype = np.asarray(y_zero_point).dtype if y_zero_point is not None else A.dtype
    y_zp = 0 if y_zero_point is None else y_zero_point
    return (arith.requantize(acc, multiplier, y_zp, dtype, scheme, "gemm"),)


@kernel("", "MatMul", 1, float_op=True)
def matmul(A: np.ndarray, B: np.ndarray) -> tuple[np.ndarray]:
    return (np.matmul(A, B),)


@kernel("", "Gemm", 1, float_op=True)
def gemm(
    A: np.ndarray,
    B: np.ndarray,
    C: np.ndarray | None = None,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    transA: int = 0,
    transB: int = 0,
) -> tuple[np.ndarray]:
    a = A.T if transA else A
    b = B.T if transB else B
    y = np.matmul(a, b)
    if alpha != 1.0:
        y = y * y.dtype.type(alpha)
    if C is not None:
        y = y + (C if beta == 1.0 else C * y.dtype.type(beta))
    return (y.astype(A.dtype),)
