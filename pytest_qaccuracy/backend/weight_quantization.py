"""Float weights between QDQ activations get int8 weights, as onnxruntime 1.21 and later do at load time.

A quantizer that leaves a Conv, ConvTranspose or Gemm in float (an op it does not quantize, or a node
excluded on purpose) still reads a DequantizeLinear and feeds a QuantizeLinear. onnxruntime's
``WeightBiasQuantization`` transformer (basic level, so on in every default session) then quantizes
such a node's float32 weight initializer itself, per tensor with an asymmetric int8 range, and its bias
to int32 at ``input scale * weight scale``, and inserts the DequantizeLinear nodes. Conv and Gemm then
fuse into integer kernels like any QDQ group; ConvTranspose runs in float on the dequantized weights.
The node is therefore not float in the deployment, whatever the model file says.

Conditions, as onnxruntime checks them: the input comes from a DequantizeLinear with a single scale;
the output has one consumer, a QuantizeLinear, possibly through a chain of single-consumer Relu or Clip;
the weight is a float32 constant (or already dequantized, then only the bias is quantized); a bias, if
any, is a 1-D constant.
"""

from __future__ import annotations

import numpy as np

from pytest_qaccuracy.backend import arith
from pytest_qaccuracy.backend.graph import INTERNAL_PREFIX, Step
from pytest_qaccuracy.backend.scheme import Scheme

_OPS = ("Conv", "ConvTranspose", "Gemm")
_PASS_THROUGH = ("Relu", "Clip")
_Q, _DQ = "QuantizeLinear", "DequantizeLinear"


def quantize_float_weights(steps: list[Step], constants: dict[str, np.ndarray], scheme: Scheme) -> list[Step]:
    """The steps with int8 weights and int32 biases (new constants, DequantizeLinear steps) where
    onnxruntime would quantize them."""
    producer = {o: s for s in steps for o in s.outputs if o}
    consumers: dict[str, list[Step]] = {}
    for s in steps:
        for name in s.inputs:
            if name:
                consumers.setdefault(name, []).append(s)
    result: list[Step] = []
    for step in steps:
        if step.op_type in _OPS and not step.domain:
            result.extend(_rewrite(step, producer, consumers, constants, scheme))
        result.append(step)
    return result


def _rewrite(
    step: Step,
    producer: dict[str, Step],
    consumers: dict[str, list[Step]],
    constants: dict[str, np.ndarray],
    scheme: Scheme,
) -> list[Step]:
    """The DequantizeLinear steps to insert before ``step`` (and ``step``'s inputs rewired), or none."""
    source = producer.get(step.inputs[0])
    if source is None or source.op_type != _DQ or np.size(constants.get(_at(source.inputs, 1), np.zeros(2))) != 1:
        return []
    if not _leads_to_quantize(step, consumers):
        return []
    weight = _at(step.inputs, 1)
    weight_dq = producer.get(weight)
    bias = _at(step.inputs, 2)
    if bias and (bias not in constants or constants[bias].ndim != 1):
        return []
    if weight_dq is not None and weight_dq.op_type == _DQ:
        if not bias or np.size(constants.get(_at(weight_dq.inputs, 1), np.zeros(2))) != 1:
            return []  # per-channel weights keep a float bias here: onnxruntime's axis checks are not emulated
        weight_scale = constants[weight_dq.inputs[1]]
        inserted: list[Step] = []
    elif weight in constants and constants[weight].dtype == np.float32:
        inserted, weight_scale = _quantized_weight(step, constants, scheme)
    else:
        return []
    if bias:
        inserted.append(_quantized_bias(step, constants, constants[source.inputs[1]], weight_scale))
    return inserted


def _quantized_weight(step: Step, constants: dict[str, np.ndarray], scheme: Scheme) -> tuple[list[Step], np.ndarray]:
    """int8 weights with onnxruntime's per-tensor ``GetQuantizationParameter`` (asymmetric, range with 0)."""
    w = constants[step.inputs[1]]
    low = np.float32(min(float(w.min(initial=0)), 0.0))
    high = np.float32(max(float(w.max(initial=0)), 0.0))
    scale = np.float32(1.0) if high == low else np.float32(np.float32(high - low) / np.float32(255))
    initial = np.float32(np.float32(-128) - np.float32(low / scale))
    zero_point = arith.round_float(np.asarray(np.clip(initial, -128, 127), np.float32), "half_even").astype(np.int8)
    quantized = arith.quantize_float(w, np.asarray(scale), zero_point, np.dtype(np.int8), scheme)
    names = _names(step, "weight", ("q", "scale", "zp", "dq"))
    constants[names[0]], constants[names[1]], constants[names[2]] = quantized, np.asarray(scale), zero_point
    dq = Step(f"{step.name}_weight_dq", "", _DQ, list(names[:3]), [names[3]], {}, None, (step.name,))
    step.inputs[1] = names[3]
    return [dq], np.asarray(scale)


def _quantized_bias(
    step: Step, constants: dict[str, np.ndarray], input_scale: np.ndarray, weight_scale: np.ndarray
) -> Step:
    """The bias as int32 at ``input scale * weight scale`` (float32 Mul, Div, Round half to even, Cast)."""
    scale = (np.asarray(input_scale, np.float32).reshape(()) * np.asarray(weight_scale, np.float32)).astype(np.float32)
    divided = (constants[step.inputs[2]] / scale).astype(np.float32)
    quantized = np.rint(divided).astype(np.int32)
    names = _names(step, "bias", ("int32", "scale", "dq"))
    constants[names[0]], constants[names[1]] = quantized, scale
    attrs = {"axis": 0} if scale.ndim else {}
    dq = Step(f"{step.name}_bias_dq", "", _DQ, list(names[:2]), [names[2]], attrs, None, (step.name,))
    step.inputs[2] = names[2]
    return dq


def _leads_to_quantize(step: Step, consumers: dict[str, list[Step]]) -> bool:
    """The output reaches a QuantizeLinear without branching, through Relu or Clip at most."""
    current = step
    while len(current.outputs) == 1:
        readers = consumers.get(current.outputs[0], [])
        if len(readers) != 1:
            return False
        current = readers[0]
        if current.op_type == _Q:
            return True
        if current.op_type not in _PASS_THROUGH:
            return False
    return False


def _names(step: Step, what: str, parts: tuple[str, ...]) -> list[str]:
    return [f"{INTERNAL_PREFIX}{step.name}_{what}_{part}" for part in parts]


def _at(inputs: list[str], index: int) -> str:
    return inputs[index] if index < len(inputs) else ""
