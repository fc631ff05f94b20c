"""Chains of elementwise steps on one 8-bit tensor, run as one 256-entry table.

A chain such as a QOperator model's float island (``DequantizeLinear -> Div -> QuantizeLinear``,
``DequantizeLinear -> HardSigmoid -> QuantizeLinear``) or an affine block (``QLinearMul`` then
``QLinearAdd`` by constants) maps each 8-bit value to one value on its own, whatever the tensor's
shape. So the chain's own steps (the same kernels, onnxruntime nodes or ``onnx.reference`` the plan
would run) are run once on the 256 values of the input's type, and every run of the model is one
lookup per element: exactly the values the steps give, without the tensors in between.

A chain starts at a step that reads an 8-bit tensor (a DequantizeLinear, or a QOperator op) and
grows while each step acts on each element alone (:data:`ELEMENTWISE`, :data:`QUANTIZED_ELEMENTWISE`)
with constants of one value for every other operand, and while the tensor between two steps is read
by the next step only, is no graph output and is not asked for.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from onnx import helper

from pytest_qaccuracy.backend.fusion import EIGHT_BIT
from pytest_qaccuracy.backend.graph import Step
from pytest_qaccuracy.backend.kernels.elementwise import lookup_bytes

#: the runner :meth:`IntegerSession.plan` names for a table step
TABLE = "table"
#: ops of the default domain whose every output element depends on the same element of the input only
#: (other operands: constants of one value)
ELEMENTWISE = frozenset(
    {
        "Abs", "Add", "Cast", "Ceil", "Celu", "Clip", "Cos", "Div", "Elu", "Erf", "Exp", "Floor", "Gelu",
        "HardSigmoid", "HardSwish", "Identity", "LeakyRelu", "Log", "Max", "Min", "Mish", "Mul", "Neg", "Pow",
        "PRelu", "Reciprocal", "Relu", "Round", "Selu", "Shrink", "Sigmoid", "Sign", "Sin", "Softplus",
        "Softsign", "Sqrt", "Sub", "Tanh", "ThresholdedRelu",
    }
)  # fmt: skip
_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


#: QOperator (com.microsoft) ops that act on each element alone when every operand but one is constant
QUANTIZED_ELEMENTWISE = frozenset({"QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu"})


def find_chains(steps: Sequence[Step], constants: dict[str, np.ndarray], keep: set[str]) -> list[list[int]]:
    """Indices (in ``steps``, in order) of each group of at least two steps that can run as a table.

    From a step reading an 8-bit tensor ``x``, a group takes every later step whose varying inputs are
    ``x`` or tensors of the group (a diamond such as ``x * hardsigmoid(x)`` included) and that acts on
    each element alone; it qualifies when one tensor only leaves it. Otherwise the straight chain
    from that step is tried. ``keep``: tensors that must be produced (graph outputs, tensors asked for).
    """
    readers: dict[str, list[int]] = {}
    for index, s in enumerate(steps):
        for name in dict.fromkeys(s.inputs):
            if name:
                readers.setdefault(name, []).append(index)
    groups: list[list[int]] = []
    taken: set[int] = set()
    for start, step in enumerate(steps):
        if start in taken or not _reads_eight_bit(step, constants):
            continue
        source = varying_input(step, constants)
        group = _region(steps, constants, keep, readers, taken, start, source) or _chain(
            steps, constants, keep, readers, start
        )
        if len(group) > 1:
            groups.append(group)
            taken.update(group)
    return groups


def _region(
    steps: Sequence[Step],
    constants: dict[str, np.ndarray],
    keep: set[str],
    readers: dict[str, list[int]],
    taken: set[int],
    start: int,
    source: str,
) -> list[int]:
    """The elementwise steps from ``start`` on that read only ``source`` and each other, if one tensor
    leaves them; else []."""
    group, made = [start], {steps[start].outputs[0]}
    for index in range(start + 1, len(steps)):
        step = steps[index]
        varying = {n for n in step.inputs if n and n not in constants}
        if index in taken or not varying & made or not varying <= made | {source}:
            continue
        if _elementwise(step, varying, constants):
            group.append(index)
            made.add(step.outputs[0])
    inside = set(group)
    leaving = [t for t in made if t in keep or any(r not in inside for r in readers.get(t, []))]
    return group if len(group) > 1 and len(leaving) == 1 and leaving[0] == steps[group[-1]].outputs[0] else []


def _chain(
    steps: Sequence[Step], constants: dict[str, np.ndarray], keep: set[str], readers: dict[str, list[int]], start: int
) -> list[int]:
    """The straight chain from ``start``: each tensor read by the next step only."""
    chain, tensor = [start], steps[start].outputs[0]
    while tensor not in keep and len(readers.get(tensor, [])) == 1:
        nxt = readers[tensor][0]
        if not _elementwise(steps[nxt], {tensor}, constants):
            break
        chain.append(nxt)
        tensor = steps[nxt].outputs[0]
    return chain


def _reads_eight_bit(step: Step, constants: dict[str, np.ndarray]) -> bool:
    """A step whose one varying input is 8-bit: a DequantizeLinear (checked when it runs) or a QOperator op."""
    tensor = varying_input(step, constants)
    if tensor is None:
        return False
    if step.domain in ("", "ai.onnx") and step.op_type == "DequantizeLinear":
        return _elementwise(step, {tensor}, constants)
    return step.domain == "com.microsoft" and _elementwise(step, {tensor}, constants)


def varying_input(step: Step, constants: dict[str, np.ndarray]) -> str | None:
    """The one input of ``step`` that is not a constant (None if there are none or several)."""
    names = {n for n in step.inputs if n and n not in constants}
    return names.pop() if len(names) == 1 else None


def _elementwise(step: Step, tensors: set[str], constants: dict[str, np.ndarray]) -> bool:
    """``step`` computes each output element from the same element of ``tensors`` alone (one shape)."""
    if len([o for o in step.outputs if o]) != 1 or not step.outputs[0]:
        return False
    if step.domain in ("", "ai.onnx"):
        if step.op_type not in ELEMENTWISE and step.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            return False
        if step.op_type == "Cast" and np.dtype(helper.tensor_dtype_to_np_dtype(step.attrs.get("to", 0))) not in _FLOATS:
            return False  # a cast to integers is another rounding: left to its own step
    elif step.domain != "com.microsoft" or step.op_type not in QUANTIZED_ELEMENTWISE:
        return False
    others = [n for n in step.inputs if n and n not in tensors]
    return bool(tensors & set(step.inputs)) and all(n in constants and constants[n].size == 1 for n in others)


class ChainTable:
    """A chain's steps run once on every 8-bit value, then one lookup per element on each run.

    ``runs``: the chain's bound steps (``run(args) -> outputs``), in order; ``steps``: the steps.
    """

    def __init__(self, steps: Sequence[Step], runs: Sequence[Callable[[list[Any]], tuple[Any, ...]]]):
        self.steps, self.runs = list(steps), list(runs)
        self._tables: dict[np.dtype, np.ndarray] = {}
        self._lock = threading.Lock()

    def table(self, dtype: np.dtype, constants: dict[str, np.ndarray]) -> np.ndarray:
        """The chain's output for each raw byte of an input of ``dtype`` (256 values)."""
        with self._lock:
            if dtype not in self._tables:
                every = np.arange(256, dtype=np.uint8).view(dtype)
                self._tables[dtype] = np.ascontiguousarray(self.run_steps(every, constants)).reshape(256)
            return self._tables[dtype]

    def run_steps(self, x: np.ndarray, constants: dict[str, np.ndarray]) -> np.ndarray:
        """The chain's steps one after the other, as the plan would run them."""
        values: dict[str, Any] = {varying_input(self.steps[0], constants): x}
        for step, run in zip(self.steps, self.runs, strict=True):
            args = [values[i] if i in values else constants[i] if i else None for i in step.inputs]
            values.update(zip(step.outputs, run(args), strict=False))
        return values[self.steps[-1].outputs[0]]

    def apply(self, x: np.ndarray, constants: dict[str, np.ndarray]) -> np.ndarray:
        if x.dtype not in EIGHT_BIT:  # e.g. an int32 or 16-bit DequantizeLinear: the steps themselves
            return self.run_steps(x, constants)
        return lookup_bytes(x, self.table(x.dtype, constants))
