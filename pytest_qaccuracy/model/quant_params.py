"""Where a quantized tensor's scale and zero point live, for QDQ and QOperator graphs.

A tensor of a quantized model is an integer tensor when a QuantizeLinear produces it, a
DequantizeLinear reads it, or a QLinear*/QGemm/... op produces or reads it. The tables below give,
per op type, the input positions of each quantized operand's (tensor, scale, zero point) and of the
output's (scale, zero point), per the ONNX and com.microsoft op specs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from pytest_qaccuracy.model.graph import GraphView, attribute

#: op type -> ((tensor, scale, zero point) input positions per quantized input, (scale, zp) of output 0)
QLINEAR_SIGNATURES: dict[str, tuple[tuple[tuple[int, int, int], ...], tuple[int, int] | None]] = {
    "QLinearConv": (((0, 1, 2), (3, 4, 5)), (6, 7)),
    "QLinearMatMul": (((0, 1, 2), (3, 4, 5)), (6, 7)),
    "QGemm": (((0, 1, 2), (3, 4, 5)), (7, 8)),
    "QLinearAdd": (((0, 1, 2), (3, 4, 5)), (6, 7)),
    "QLinearMul": (((0, 1, 2), (3, 4, 5)), (6, 7)),
    "QLinearSigmoid": (((0, 1, 2),), (3, 4)),
    "QLinearLeakyRelu": (((0, 1, 2),), (3, 4)),
    "QLinearSoftmax": (((0, 1, 2),), (3, 4)),
    "QLinearAveragePool": (((0, 1, 2),), (3, 4)),
    "QLinearGlobalAveragePool": (((0, 1, 2),), (3, 4)),
    "QLinearReduceMean": (((0, 1, 2),), (3, 4)),
    "QLinearWhere": (((1, 2, 3), (4, 5, 6)), (7, 8)),
}

#: QOperator ops -> the float op they stand for (used to match graphs by structure).
QOPERATOR_FLOAT_OP = {
    "QLinearConv": "Conv",
    "ConvInteger": "Conv",
    "QLinearMatMul": "MatMul",
    "MatMulInteger": "MatMul",
    "QGemm": "Gemm",
    "QLinearAdd": "Add",
    "QLinearMul": "Mul",
    "QLinearSigmoid": "Sigmoid",
    "QLinearLeakyRelu": "LeakyRelu",
    "QLinearSoftmax": "Softmax",
    "QLinearAveragePool": "AveragePool",
    "QLinearGlobalAveragePool": "GlobalAveragePool",
    "QLinearConcat": "Concat",
    "QLinearReduceMean": "ReduceMean",
    "QLinearWhere": "Where",
}


@dataclass(frozen=True, slots=True)
class QuantParams:
    """Scale and zero point of an integer tensor; ``axis`` for per-channel (vector) scales."""

    scale: np.ndarray
    zero_point: np.ndarray
    axis: int | None = None

    @property
    def per_tensor_scale(self) -> float | None:
        return float(self.scale.reshape(-1)[0]) if self.scale.size == 1 else None

    def dequantize(self, q: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``(q - zero_point) * scale`` in float32, bit-identical to DequantizeLinear.

        The subtraction is exact in float32 for 8- and 16-bit codes; ``out`` (float32, q's shape)
        avoids a fresh allocation per batch.
        """
        scale, zp = self.scale.astype(np.float32), self.zero_point.astype(np.float32)
        if scale.size > 1:
            shape = [1] * q.ndim
            shape[self.axis % q.ndim if self.axis is not None else 1] = scale.size
            scale, zp = scale.reshape(shape), zp.reshape(shape)
        else:
            scale, zp = scale.reshape(()), zp.reshape(())
        out = np.asarray(np.subtract(q, zp, out=out, dtype=np.float32))  # a 0-d q gives a scalar, not an array
        return np.multiply(out, scale, out=out)


def _params(view: GraphView, scale: str, zero_point: str | None, axis: int | None) -> QuantParams | None:
    s = view.constant(scale)
    if s is None:
        return None
    zp = view.constant(zero_point) if zero_point else None
    if zp is None:
        zp = np.zeros(s.shape, dtype=np.uint8)
    return QuantParams(s.astype(np.float64), zp, axis if s.size > 1 else None)


def _slot(node: onnx.NodeProto, pos: int) -> str | None:
    return node.input[pos] if pos < len(node.input) and node.input[pos] else None


#: Ops whose integer output keeps the scale and zero point of their first input (QOperator graphs
#: run them on uint8/int8 directly, e.g. MaxPool between QLinearConv and Flatten).
PASS_THROUGH_OPS = frozenset(
    {"MaxPool", "GlobalMaxPool", "Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Slice",
     "Gather", "Split", "Resize", "DepthToSpace", "SpaceToDepth"}
)  # fmt: skip


def find_quant_params(view: GraphView, tensor: str, _depth: int = 0) -> QuantParams | None:
    """The scale/zero point of integer ``tensor``, from its producer or a consumer; None if float.

    When neither says, a pass-through producer (``PASS_THROUGH_OPS``) hands over its input's.
    """
    found = view.producer.get(tensor)
    if found:
        node = found[1]
        if node.op_type == "QuantizeLinear":
            return _params(view, node.input[1], _slot(node, 2), attribute(node, "axis", 1))
        signature = QLINEAR_SIGNATURES.get(node.op_type)
        if signature and signature[1] and tensor == node.output[0]:
            s, z = signature[1]
            return _params(view, node.input[s], _slot(node, z), None)
        if node.op_type == "QLinearConcat" and tensor == node.output[0]:
            return _params(view, node.input[0], _slot(node, 1), None)
    for _, node, pos in view.consumers.get(tensor, []):
        if node.op_type == "DequantizeLinear" and pos == 0:
            return _params(view, node.input[1], _slot(node, 2), attribute(node, "axis", 1))
        signature = QLINEAR_SIGNATURES.get(node.op_type)
        for t, s, z in signature[0] if signature else ():
            if t == pos:
                return _params(view, node.input[s], _slot(node, z), None)
        if node.op_type == "QLinearConcat" and pos >= 2 and (pos - 2) % 3 == 0:
            return _params(view, node.input[pos + 1], _slot(node, pos + 2), None)
    if found and found[1].op_type in PASS_THROUGH_OPS and found[1].input and _depth < 64:
        return find_quant_params(view, found[1].input[0], _depth + 1)
    return None


def detect_format(view: GraphView) -> str:
    """``"qdq"``, ``"qoperator"``, ``"mixed"`` or ``"float"``, from the op types present."""
    ops = {node.op_type for node in view.nodes}
    qoperator = bool(ops & set(QOPERATOR_FLOAT_OP))
    qdq = "DequantizeLinear" in ops and not qoperator
    if (
        qoperator
        and "QuantizeLinear" in ops
        and any(node.op_type in ("Conv", "MatMul", "Gemm") and _reads_dequantized(view, node) for node in view.nodes)
    ):
        return "mixed"
    if qoperator:
        return "qoperator"
    return "qdq" if qdq else "float"


def _reads_dequantized(view: GraphView, node: onnx.NodeProto) -> bool:
    for name in node.input:
        found = view.producer.get(name)
        if found and found[1].op_type == "DequantizeLinear":
            return True
    return False
