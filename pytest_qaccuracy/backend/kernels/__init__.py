"""Kernel families; importing this package registers every kernel (one family per module)."""

from pytest_qaccuracy.backend.kernels import conv, elementwise, matmul, pool, quantize, softmax, tensor

__all__ = ["conv", "elementwise", "matmul", "pool", "quantize", "softmax", "tensor"]
