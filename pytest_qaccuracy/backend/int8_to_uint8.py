"""int8 QDQ activations as uint8, as onnxruntime's default session does on x86 before it fuses groups.

On x86 onnxruntime does not fuse int8 activations unless ``session.qdqisint8allowed=1``: its
``QDQS8ToU8`` transformer first turns each int8 ``QuantizeLinear -> DequantizeLinear`` pair of an
activation into uint8, adding 128 to the zero point (so every quantized value moves by 128 and the
dequantized value is unchanged). Weights stay int8, so an s8s8 model then runs u8 x s8 kernels, which
saturate in int16 pairs on CPUs without VNNI (``pairs.py``).

A converted tensor keeps its name; its values are the model's plus 128 as uint8. :func:`as_model_type`
turns them back for anyone outside the plan (graph outputs and requested tensors are never converted).
"""

from __future__ import annotations

import numpy as np

from pytest_qaccuracy.backend.graph import INTERNAL_PREFIX, Step

_Q, _DQ = "QuantizeLinear", "DequantizeLinear"


def convert(
    steps: list[Step],
    constants: dict[str, np.ndarray],
    types: dict[str, np.dtype],
    keep: set[str],
    pairs_removed_first: bool = True,
) -> tuple[list[Step], dict[str, np.ndarray], dict[str, np.dtype], set[str]]:
    """Rewrite int8 activation Q -> DQ pairs to uint8.

    With ``pairs_removed_first`` (onnxruntime 1.19 and later) a pair is judged as it stands once
    Identity nodes and redundant ``DQ -> Q`` pairs after it are gone (:func:`_after_redundant_pairs`);
    without (1.18) as it stands in the model.

    A QuantizeLinear qualifies when its zero point is an int8 constant and its only consumer is a
    DequantizeLinear with the same scale, zero point and axis whose output has one consumer (onnxruntime
    duplicates a DequantizeLinear read by several nodes before converting, and then leaves the pair
    alone); the quantized tensor may not be in ``keep`` (graph outputs, tensors the caller asked for). A QDQ
    group whose input and output then differ in type is not fused and runs in float, as in onnxruntime.

    Returns:
        the new steps, the uint8 zero points (new constants), the updated types, and the names of the
        converted tensors.
    """
    consumers: dict[str, list[Step]] = {}
    for step in steps:
        for name in step.inputs:
            if name:
                consumers.setdefault(name, []).append(step)
    added: dict[str, np.ndarray] = {}
    types = dict(types)
    converted: set[str] = set()
    replaced: dict[int, Step] = {}
    for step in steps:
        if not _is_plain(step, _Q) or len(step.inputs) < 3:
            continue
        tensor, zp = step.outputs[0], step.inputs[2]
        zero_point = constants.get(zp)
        users = consumers.get(tensor, [])
        if zero_point is None or zero_point.dtype != np.int8 or tensor in keep or len(users) != 1:
            continue
        (dq,) = users
        if not (_is_plain(dq, _DQ) and dq.inputs[0] == tensor and _same(dq, step, constants)):
            continue
        end = _after_redundant_pairs(dq, consumers, constants) if pairs_removed_first else dq
        if len(consumers.get(end.outputs[0], [])) > 1:
            continue  # onnxruntime first gives each consumer its own DequantizeLinear: the Q then has several
        if end is not dq and (end.outputs[0] in keep or not consumers.get(end.outputs[0])):
            continue  # the Q then feeds a graph output's DequantizeLinear (and, dropped, that one's readers)
        shifted = f"{INTERNAL_PREFIX}{zp}:uint8"
        added[shifted] = (zero_point.astype(np.int16) + 128).astype(np.uint8)
        for s in (step, dq):
            inputs = list(s.inputs)
            inputs[2] = shifted
            replaced[id(s)] = Step(s.name, s.domain, s.op_type, inputs, list(s.outputs), dict(s.attrs), s.proto)
        types[tensor] = np.dtype(np.uint8)
        converted.add(tensor)
    return [replaced.get(id(s), s) for s in steps], added, types, converted


def _after_redundant_pairs(dq: Step, consumers: dict[str, list[Step]], constants: dict[str, np.ndarray]) -> Step:
    """The DequantizeLinear ``dq`` stands for once onnxruntime has removed Identity nodes and redundant
    ``DequantizeLinear -> QuantizeLinear`` pairs (same scale and zero point) after it, which it does
    before converting int8 pairs: ``Q -> DQ -> Identity -> Q' -> DQ'`` becomes ``Q -> DQ'``."""
    end = dq
    for _ in range(64):
        users = consumers.get(end.outputs[0], [])
        while len(users) == 1 and _is_plain(users[0], "Identity"):
            users = consumers.get(users[0].outputs[0], [])
        if len(users) != 1 or not _is_plain(users[0], _Q) or not _same(end, users[0], constants):
            return end
        after = consumers.get(users[0].outputs[0], [])
        if len(after) != 1 or not _is_plain(after[0], _DQ):
            return end
        end = after[0]
    return end


def as_model_type(value: np.ndarray) -> np.ndarray:
    """A converted uint8 tensor back as the model's int8 values (``value - 128``)."""
    return (np.asarray(value, np.uint8) ^ np.uint8(0x80)).view(np.int8)


def _is_plain(step: Step, op_type: str) -> bool:
    return step.op_type == op_type and step.domain in ("", "ai.onnx") and bool(step.outputs) and bool(step.outputs[0])


def _same(dq: Step, q: Step, constants: dict[str, np.ndarray]) -> bool:
    """The DequantizeLinear uses the QuantizeLinear's scale, zero point and axis (by name or by value); both
    name their zero point (onnxruntime leaves a pair with a default zero point alone)."""
    if len(dq.inputs) < 3 or len(q.inputs) < 3 or dq.attrs.get("axis", 1) != q.attrs.get("axis", 1):
        return False
    for theirs, ours in zip(dq.inputs[1:3], q.inputs[1:3], strict=True):
        if theirs == ours:
            continue
        a, b = constants.get(theirs), constants.get(ours)
        if a is None or b is None or a.dtype != b.dtype or not np.array_equal(a, b):
            return False
    return True
