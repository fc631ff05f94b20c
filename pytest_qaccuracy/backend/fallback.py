"""Fallbacks for ops without a kernel of ours, one node at a time: onnxruntime, else ``onnx.reference``.

onnxruntime runs the node in a one-node model built for the argument types it first sees (its own CPU
kernels: fast, and the very arithmetic a deployment on onnxruntime computes). ``onnx.reference`` is the
last resort (an op onnxruntime lacks, such as a training op) and the runner of the ``onnx-reference``
preset: it is exact to the spec but slow (per-element Python loops in ops such as ``ConvTranspose``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from pytest_qaccuracy.backend.graph import Step
from pytest_qaccuracy.backend.registry import normalize_domain, unsupported
from pytest_qaccuracy.ort_session import make_session

#: inputs where an empty tensor means "not given" (Resize-11 has no optional inputs, so models pass an empty
#: roi or scales). onnx.reference before 1.22 indexes an empty roi (IndexError); onnx 1.22 drops it
#: itself. Handing such inputs over as absent is the same node by the spec, for every onnx version.
_EMPTY_MEANS_ABSENT: dict[tuple[str, str], tuple[int, ...]] = {("", "Resize"): (1, 2, 3)}


#: the runner names that ``IntegerSession.plan()`` reports
KERNEL, ONNXRUNTIME, REFERENCE = "kernel", "onnxruntime", "onnx.reference"


class OnnxruntimeNode:
    """``step`` run by onnxruntime's CPU kernels in a one-node model, one session per input type signature.

    Raises (on construction and on a call with new input types) whatever onnxruntime raises for a node
    it cannot run: the caller then falls back to ``onnx.reference``.
    """

    def __init__(
        self,
        step: Step,
        types: list[np.dtype | None],
        opsets: dict[str, int],
        ir_version: int,
        threads: int,
        constants: Mapping[str, np.ndarray] | None = None,
    ):
        import onnxruntime  # noqa: F401  (fail here, not on the first run, if it is missing)

        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in _attributes(step)):
            raise ValueError("subgraphs may read outer-scope tensors that a one-node model does not have")
        self.step, self.opsets, self.ir_version, self.threads = step, opsets, ir_version, threads
        # constant inputs stay initializers, as in the whole model: onnxruntime picks its kernels by them
        # (a Conv with constant weights runs NCHWc, one with computed weights does not)
        constants = constants or {}
        self.fixed = {
            i: constants[name]
            for i, name in enumerate(step.inputs)
            if name and name in constants and constants[name].dtype.isbuiltin == 1  # numpy's own: not float8 or 4-bit
        }
        self._sessions: dict[tuple[str | None, ...], Any] = {}
        known = [t is not None for name, t in zip(step.inputs, types, strict=False) if name]
        if all(known):  # build now, so that a node onnxruntime cannot run is known before the first run
            self._session(tuple(None if t is None else np.dtype(t).str for t in types))

    def __call__(self, args: list[Any]) -> tuple[Any, ...]:
        arrays = [None if a is None else np.asarray(a) for a in args]
        session = self._session(tuple(None if a is None else a.dtype.str for a in arrays))
        fed = [i for i, a in enumerate(arrays) if a is not None and self.step.inputs[i] and i not in self.fixed]
        feeds = {f"in{i}": arrays[i] for i in fed}
        wanted = [f"out{i}" for i, name in enumerate(self.step.outputs) if name]
        values = dict(zip(wanted, session.run(wanted, feeds), strict=True))
        return tuple(values.get(f"out{i}") for i in range(len(self.step.outputs)))

    def _session(self, key: tuple[str | None, ...]) -> Any:
        if key not in self._sessions:
            model = _one_node_model(self.step, key, self.opsets, self.ir_version, self.fixed)
            self._sessions[key] = make_session(
                model, providers=("CPUExecutionProvider",), threads=self.threads, optimization="all"
            )
        return self._sessions[key]


def _attributes(step: Step) -> list[onnx.AttributeProto]:
    return list(step.proto.attribute) if step.proto is not None else []


def _one_node_model(
    step: Step,
    dtypes: tuple[str | None, ...],
    opsets: dict[str, int],
    ir_version: int,
    fixed: Mapping[int, np.ndarray] | None = None,
) -> onnx.ModelProto:
    """``step`` alone, its inputs named ``in<i>`` with the given element types (any shape); ``fixed``
    inputs (by position) are initializers."""
    inputs, values, initializers = [], [], []
    for i, name in enumerate(step.inputs):
        dtype = dtypes[i] if i < len(dtypes) else None
        if not name:
            inputs.append("")
            continue
        if fixed and i in fixed:
            inputs.append(f"in{i}")
            initializers.append(numpy_helper.from_array(np.asarray(fixed[i]), f"in{i}"))
            continue
        if dtype is None:
            raise ValueError(f"input '{name}' has no known type")
        inputs.append(f"in{i}")
        values.append(helper.make_tensor_value_info(f"in{i}", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), None))
    outputs = [f"out{i}" if name else "" for i, name in enumerate(step.outputs)]
    node = helper.make_node(step.op_type, inputs, outputs, name=step.name, domain=step.domain)
    if step.proto is not None:
        node.attribute.extend(step.proto.attribute)
    else:
        node.attribute.extend(helper.make_attribute(k, v) for k, v in step.attrs.items())
    return _model(node, values, opsets, ir_version, initializers)


def _model(
    node: onnx.NodeProto,
    inputs: list[onnx.ValueInfoProto],
    opsets: dict[str, int],
    ir_version: int,
    initializers: list[onnx.TensorProto] | None = None,
) -> onnx.ModelProto:
    """A model of ``node`` alone that imports ``opsets``; its outputs of unknown type and shape."""
    outputs = [helper.make_empty_tensor_value_info(name) for name in node.output if name]
    graph = helper.make_graph([node], "qaccuracy_node", inputs, outputs, initializers)
    imports = [helper.make_opsetid(domain, version) for domain, version in opsets.items()]
    return helper.make_model(graph, opset_imports=imports, ir_version=ir_version)


def _in_domain(proto: onnx.NodeProto, domain: str) -> onnx.NodeProto:
    node = onnx.NodeProto()
    node.CopyFrom(proto)
    node.domain = domain
    return node


def _reference_evaluator(node: onnx.NodeProto, opsets: dict[str, int]) -> Any:
    """``onnx.reference`` on ``node`` alone, in a model that imports ``opsets``: given a bare node,
    ``ReferenceEvaluator`` takes every op's latest version whatever ``opsets`` says (onnx 1.23: a
    Squeeze-11 then ignores its ``axes`` attribute)."""
    from onnx.reference import ReferenceEvaluator

    inputs = [helper.make_empty_tensor_value_info(name) for name in dict.fromkeys(node.input) if name]
    return ReferenceEvaluator(_model(node, inputs, opsets, onnx.IR_VERSION))


def reference_kernel(step: Step, opsets: dict[str, int]) -> Callable[[list[Any]], tuple[Any, ...]]:
    """A runner for ``step`` built on ``onnx.reference.ReferenceEvaluator``, at the model's opsets.

    Raises:
        UnsupportedOpError: ``onnx.reference`` has no implementation for the op either.
    """
    domain = normalize_domain(step.domain)  # onnx.reference knows the default domain as "" only
    proto = step.proto
    if proto is None or list(proto.input) != step.inputs or list(proto.output) != step.outputs:
        proto = helper.make_node(step.op_type, step.inputs, step.outputs, name=step.name, domain=domain, **step.attrs)
    elif proto.domain != domain:
        proto = _in_domain(proto, domain)
    reference_opsets = {d or "": v for d, v in opsets.items()}
    try:
        evaluator = _reference_evaluator(proto, reference_opsets)
    except Exception as exc:
        raise unsupported(step.name, domain, step.op_type, opsets.get(domain, 1), f"onnx.reference: {exc}") from None
    names = list(proto.input)
    optional = _EMPTY_MEANS_ABSENT.get((domain, step.op_type), ())
    evaluators: dict[tuple[int, ...], Any] = {(): evaluator}

    def without(absent: tuple[int, ...]) -> Any:
        """The evaluator of the node with the ``absent`` inputs left out (named "")."""
        if absent not in evaluators:
            node = type(proto)()
            node.CopyFrom(proto)
            for i in absent:
                node.input[i] = ""
            evaluators[absent] = _reference_evaluator(node, reference_opsets)
        return evaluators[absent]

    def run(args: list[Any]) -> tuple[Any, ...]:
        absent = tuple(i for i in optional if i < len(args) and args[i] is not None and np.size(args[i]) == 0)
        pairs = enumerate(zip(names, args, strict=False))
        feeds = {name: value for i, (name, value) in pairs if name and i not in absent}
        values = iter(without(absent).run(None, feeds))
        return tuple(next(values) if name else None for name in proto.output)

    return run
