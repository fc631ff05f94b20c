"""A float MatMul/Gemm on constant dequantized weights, run with its DequantizeLinear as onnxruntime runs them.

Such a node is what a quantizer leaves where onnxruntime has no integer kernel for the activations (16-bit
QDQ models: ``activation_type=QInt16`` or ``QUInt16``): the weight DequantizeLinear reads constants and
only the MatMul/Gemm reads it. onnxruntime 1.32 (``DQMatMulToMatMulNBits``, all optimizations, the
default session) replaces that pair with ``com.microsoft::MatMulNBits`` (``bits=8``, ``block_size=32``,
``accuracy_level=4``): per-tensor, per-channel (axis 1) and blocked (axis 0) 2/4/8-bit weights, a Gemm
only with ``alpha=1``, no transposes and a ``[N]`` bias. At accuracy level 4 MLAS quantizes the
activations to int8 per block of the reduction axis and sums int8 products per block in its
CPU-specific kernels: not the float GEMM of the written graph (digits MLP, QInt16: 2,485 of 3,072
values of the first layer apart, up to 109 steps). onnxruntime 1.18 does not fuse.

Whether onnxruntime rewrites a candidate depends on its surroundings (the default x86 session leaves
int8 MatMuls in float, weights and all), so the candidates kept are those whose output a MatMulNBits
writes in this onnxruntime's optimized graph of the whole model (``rewritten_outputs``): the emulation
follows the installed version (versions between 1.18 and 1.32 were not measured). Under this machine's
preset each kept group runs on this machine's onnxruntime, built from the model's own nodes and
initializers, which fuses it the same way. Under another onnxruntime preset the kernel is not this
CPU's: a kept group is refused with one line naming the node, its types and the preset to use.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper

from pytest_qaccuracy.backend.graph import Step
from pytest_qaccuracy.ort_session import make_session

_OPS = ("MatMul", "Gemm")
_DQ = "DequantizeLinear"
_DQ_DOMAINS = ("", "ai.onnx", "com.microsoft")


def group_weights(steps: list[Step], constants: Mapping[str, Any], keep: set[str]) -> list[Step]:
    """``steps`` with each float MatMul/Gemm whose weight (and bias) is a DequantizeLinear of constants
    merged with it into one step whose ``group`` holds the original steps (the merged step reads the
    varying inputs only). A DequantizeLinear that another step reads, or whose output is kept, stays;
    so does the group of a MatMul/Gemm whose output is kept and read by another step (onnxruntime
    1.32 computes the float GEMM when such an output, say a QuantizeLinear's input, is a graph output)."""
    producer = {o: s for s in steps for o in s.outputs if o}
    readers: dict[str, int] = {}
    for s in steps:
        for name in set(s.inputs):
            if name:
                readers[name] = readers.get(name, 0) + 1
    merged: dict[int, Step] = {}
    removed: set[int] = set()
    for step in steps:
        if step.op_type not in _OPS or step.domain not in ("", "ai.onnx") or len(step.inputs) < 2:
            continue
        weight = _constant_dq(producer.get(step.inputs[1]), constants)
        if weight is None or readers.get(step.inputs[1], 0) != 1 or step.inputs[1] in keep:
            continue
        if step.outputs[0] in keep and readers.get(step.outputs[0], 0):  # onnxruntime 1.32 does not fuse then
            continue
        group = [weight]
        bias_name = step.inputs[2] if len(step.inputs) > 2 else ""
        bias = _constant_dq(producer.get(bias_name), constants) if bias_name else None
        if bias is not None:
            group.append(bias)
            if readers.get(bias_name, 0) == 1 and bias_name not in keep:
                removed.add(id(bias))
        removed.add(id(weight))
        group.append(step)
        inner = {o for s in group for o in s.outputs if o}
        fed = [i for s in group for i in s.inputs if i and i not in inner and i not in constants]
        merged[id(step)] = Step(
            step.name, step.domain, step.op_type, list(dict.fromkeys(fed)), list(step.outputs), dict(step.attrs),
            step.proto, tuple(s.name for s in group), tuple(group),
        )  # fmt: skip
    return [merged.get(id(s), s) for s in steps if id(s) not in removed]


def _constant_dq(step: Step | None, constants: Mapping[str, Any]) -> Step | None:
    """``step`` if it is a DequantizeLinear whose every input is a constant (the standard one, or
    onnxruntime's ``com.microsoft`` one that quantizers write for 16-bit types before opset 21, on
    integers numpy has a type for)."""
    if step is None or step.op_type != _DQ or step.domain not in _DQ_DOMAINS:
        return None
    if not all(i in constants for i in step.inputs if i):
        return None
    standard = step.domain in ("", "ai.onnx")
    return step if standard or np.asarray(constants[step.inputs[0]]).dtype.isbuiltin == 1 else None


def group_model(
    group: Sequence[Step],
    fed: Sequence[str],
    types: Mapping[str, Any],
    initializers: Mapping[str, onnx.TensorProto],
    opsets: Mapping[str, int],
    ir_version: int,
) -> onnx.ModelProto:
    """The group's nodes as in the model, its constants as the model's own initializers, ``fed`` as
    inputs of the given element types (any shape)."""
    nodes = [s.proto if s.proto is not None else helper.make_node(s.op_type, s.inputs, s.outputs, name=s.name,
             domain=s.domain, **s.attrs) for s in group]  # fmt: skip
    used = {i for s in group for i in s.inputs if i}
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.dtype(types[n])), None) for n in fed]
    outputs = [helper.make_empty_tensor_value_info(o) for o in group[-1].outputs if o]
    inits = [initializers[n] for n in sorted(used) if n in initializers]
    graph = helper.make_graph(nodes, "qaccuracy_group", inputs, outputs, inits)
    imports = [helper.make_opsetid(domain, version) for domain, version in opsets.items()]
    return helper.make_model(graph, opset_imports=imports, ir_version=ir_version)


class OnnxruntimeGroup:
    """A weight group run by this machine's onnxruntime (all optimizations), one session per type
    signature of the varying inputs (built now when their types are known)."""

    def __init__(
        self,
        step: Step,
        types: Mapping[str, Any],
        initializers: Mapping[str, onnx.TensorProto],
        opsets: Mapping[str, int],
        ir_version: int,
        threads: int,
    ):
        self.step, self.initializers, self.opsets, self.ir_version, self.threads = (
            step, initializers, opsets, ir_version, threads,
        )  # fmt: skip
        self._sessions: dict[tuple[str, ...], Any] = {}
        if all(name in types for name in step.inputs):
            self._session(tuple(np.dtype(types[name]).str for name in step.inputs))

    def __call__(self, args: list[Any]) -> tuple[Any, ...]:
        arrays = [np.asarray(a) for a in args]
        session = self._session(tuple(a.dtype.str for a in arrays))
        return tuple(session.run(None, dict(zip(self.step.inputs, arrays, strict=True))))

    def _session(self, key: tuple[str, ...]) -> Any:
        if key not in self._sessions:
            types = dict(zip(self.step.inputs, key, strict=True))
            model = group_model(self.step.group, self.step.inputs, types, self.initializers, self.opsets,
                                self.ir_version)  # fmt: skip
            self._sessions[key] = make_session(
                model, providers=("CPUExecutionProvider",), threads=self.threads, optimization="all"
            )
        return self._sessions[key]


#: the ops onnxruntime writes for a DequantizeLinear of constant weights and its MatMul/Gemm
REWRITES = frozenset({("com.microsoft", "MatMulNBits")})


def rewritten_outputs(model: onnx.ModelProto, config: Mapping[str, str]) -> dict[str, str]:
    """Output name -> ``domain::op`` of the nodes of :data:`REWRITES` in this onnxruntime's optimized
    graph of ``model`` (CPU, all optimizations, ``config``): the MatMul/Gemm outputs it fused with
    their weights. Empty when onnxruntime cannot optimize the model alone."""
    with tempfile.TemporaryDirectory(prefix="qaccuracy-") as folder:
        path = Path(folder) / "optimized.onnx"
        try:
            make_session(model, providers=("CPUExecutionProvider",), threads=1, config=config,
                         optimized_model_path=path)  # fmt: skip
            optimized = onnx.load(str(path), load_external_data=False)
        except Exception:  # onnxruntime cannot load it alone: nothing known to be rewritten
            return {}
    return {n.output[0]: f"{n.domain}::{n.op_type}" for n in optimized.graph.node if (n.domain, n.op_type) in REWRITES}


def refusal(step: Step, rewritten: Sequence[str], types: Mapping[str, Any], scheme: str, host: str) -> str:
    """One line: the group ``step``, its types, what this onnxruntime makes of it, why it is refused."""
    import onnxruntime

    weight = step.group[0]
    wtype = np.dtype(types[weight.inputs[0]]).name if weight.inputs[0] in types else "?"
    act = types.get(step.inputs[0])
    activations = f", activations {np.dtype(act).name}" if act is not None else ""
    return (
        f"node '{step.name}' ({step.domain or 'ai.onnx'}::{step.op_type}, {wtype} weights from DequantizeLinear "
        f"'{weight.name}'{activations}): onnxruntime {onnxruntime.__version__} runs it as {', '.join(rewritten)}, "
        f"whose CPU-specific int8 block arithmetic the integer backend emulates only under this machine's "
        f"preset '{host}', not '{scheme}'"
    )
