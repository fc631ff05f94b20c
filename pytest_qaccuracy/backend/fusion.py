"""QDQ fusion: rewrite ``DequantizeLinear -> op -> QuantizeLinear`` groups into integer steps.

This mirrors onnxruntime's QDQ selector/action transformers (``onnxruntime/core/optimizer/
qdq_transformer/selectors_actions/`` in github.com/microsoft/onnxruntime): a group whose
float op has a QOperator twin becomes that QOperator node (QLinearConv, QLinearMatMul, QGemm,
QLinearAdd, ...); data-movement ops (Reshape, Transpose, MaxPool, nearest Resize, ...) run on the
integers and are followed by a requantize table when input and output parameters differ (for a
monotone or data-moving op this equals ORT's float path exactly). Relu/Clip before a QuantizeLinear whose
range already implies them are removed (ORT ``ReluQuantFusion``/``ClipQuantFusion``).

DequantizeLinear steps are kept: they become dead (and are pruned) unless their float output is asked
for. A group is left unfused when its float interior tensor must be materialised (``keep``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from pytest_qaccuracy.backend.graph import INTERNAL_PREFIX, Step
from pytest_qaccuracy.backend.registry import INTERNAL_DOMAIN

MS = "com.microsoft"
EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))
#: ops that only move or select values: they commute with any monotone requantization
PASS_THROUGH = {
    "MaxPool",
    "Reshape",
    "Transpose",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Slice",
    "Split",
    "Gather",
    "Resize",
}


class _Graph:
    """Producer/consumer maps over a step list."""

    def __init__(
        self, steps: list[Step], constants: dict[str, np.ndarray], types: dict[str, np.dtype], outputs: set[str]
    ):
        self.steps = steps
        self.int8_allowed = True
        self.constants = constants
        self.types = types
        self.outputs = outputs
        self.producer = {o: s for s in steps for o in s.outputs if o}
        self.consumers: dict[str, list[Step]] = {}
        for s in steps:
            for i in s.inputs:
                if i:
                    self.consumers.setdefault(i, []).append(s)

    def dq(self, tensor: str) -> Step | None:
        """The DequantizeLinear producing ``tensor`` from an 8-bit tensor, if any."""
        step = self.producer.get(tensor)
        if step is None or step.op_type != "DequantizeLinear" or step.domain not in ("", "ai.onnx"):
            return None
        return step if self.types.get(step.inputs[0]) in EIGHT_BIT else None

    def single_q(self, tensor: str, keep: set[str]) -> Step | None:
        """The only consumer of ``tensor`` when it is an 8-bit QuantizeLinear and tensor is internal."""
        users = self.consumers.get(tensor, [])
        if tensor in self.outputs or tensor in keep or len(users) != 1:
            return None
        q = users[0]
        if q.op_type != "QuantizeLinear" or q.inputs[0] != tensor or self.types.get(q.outputs[0]) not in EIGHT_BIT:
            return None
        return q

    def per_tensor(self, step: Step) -> bool:
        """Scale and zero point of a Q/DQ step are constant scalars."""
        names = [n for n in step.inputs[1:3] if n]
        return all(n in self.constants and self.constants[n].size == 1 for n in names) and len(names) >= 1


def _qparams(step: Step) -> list[str]:
    """``[tensor, scale, zero_point]`` input names of a Q/DQ step (zp may be ``""``)."""
    return [step.inputs[0], step.inputs[1], step.inputs[2] if len(step.inputs) > 2 else ""]


def remove_implied_activations(graph: _Graph, keep: set[str]) -> list[Step]:
    """Drop Relu/Clip whose following QuantizeLinear already saturates at the same bounds."""
    removed: dict[str, str] = {}
    kept = []
    for step in graph.steps:
        if step.op_type in ("Relu", "Clip") and step.domain in ("", "ai.onnx"):
            q = graph.single_q(step.outputs[0], keep)
            if q is not None and graph.per_tensor(q) and _implied(step, q, graph):
                removed[step.outputs[0]] = step.inputs[0]
                continue
        kept.append(step)
    for step in kept:
        step.inputs = [removed.get(i, i) for i in step.inputs]
    return kept


def _implied(act: Step, q: Step, graph: _Graph) -> bool:
    scale = float(graph.constants[q.inputs[1]])
    dtype = graph.types[q.outputs[0]]
    zp = int(graph.constants[q.inputs[2]]) if len(q.inputs) > 2 and q.inputs[2] else 0
    lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
    if act.op_type == "Relu":
        return zp == lo
    low = _clip_bound(act, graph, 1, "min", -np.inf)
    high = _clip_bound(act, graph, 2, "max", np.inf)
    if low is None or high is None:
        return False
    eps = 1e-6 * max(1.0, abs(scale))
    return low <= (lo - zp) * scale + eps and high >= (hi - zp) * scale - eps


def _clip_bound(act: Step, graph: _Graph, index: int, attr: str, default: float) -> float | None:
    if attr in act.attrs:
        return float(act.attrs[attr])
    if len(act.inputs) > index and act.inputs[index]:
        value = graph.constants.get(act.inputs[index])
        return None if value is None else float(value)
    return default


Builder = Callable[[_Graph, Step, list[Step], Step, int], list[Step] | None]


def _granularity(graph: _Graph, step: Step) -> int | None:
    """``-1`` for a per-tensor Q/DQ, the (non-negative) axis for a per-axis one, None if unknown/blocked."""
    scale = graph.constants.get(step.inputs[1])
    if scale is None or step.attrs.get("block_size", 0):
        return None
    if scale.size == 1:
        return -1
    rank = len(graph.constants[step.inputs[0]].shape) if step.inputs[0] in graph.constants else None
    axis = int(step.attrs.get("axis", 1))
    if axis < 0:
        if rank is None:
            return None
        axis += rank
    return axis


#: op -> allowed granularity of each DQ input (by position) and of the output Q: what the QOperator
#: kernels accept (per-tensor activations; weights per tensor or per output channel)
_GRANULARITY: dict[str, tuple[tuple[int, ...], ...]] = {
    "Conv": ((-1,), (-1, 0)),
    "MatMul": ((-1,), (-1, 1)),
}


def _granularity_ok(graph: _Graph, step: Step, dqs: list[Step], q: Step) -> bool:
    if _granularity(graph, q) != -1:
        return False
    allowed = _GRANULARITY.get(step.op_type)
    if step.op_type == "Gemm":
        allowed = ((-1,), (-1, 0 if step.attrs.get("transB", 0) else 1))
    for i, dq in enumerate(dqs):
        ok = allowed[i] if allowed and i < len(allowed) else (-1,)
        if _granularity(graph, dq) not in ok:
            return False
    return True


def _dq_inputs(graph: _Graph, step: Step, indices: tuple[int, ...]) -> list[Step] | None:
    dqs = [graph.dq(step.inputs[i]) if i < len(step.inputs) and step.inputs[i] else None for i in indices]
    return None if any(d is None for d in dqs) else dqs  # type: ignore[return-value]


def _same_type(graph: _Graph, dqs: list[Step], q: Step) -> bool:
    types = {graph.types.get(d.inputs[0]) for d in dqs} | {graph.types.get(q.outputs[0])}
    return len(types) == 1


def _out(q: Step) -> list[str]:
    return [q.inputs[1], q.inputs[2] if len(q.inputs) > 2 else ""]


def _activation_types_match(graph: _Graph, x: Step, q: Step) -> bool:
    """onnxruntime fuses Conv/MatMul/Gemm groups only when input and output activations share a type
    (they may not after its int8 -> uint8 conversion of single QDQ pairs: ``int8_to_uint8``), and int8
    ones only when int8 is allowed (``session.qdqisint8allowed=1`` on x86)."""
    kind = graph.types.get(x.inputs[0])
    return kind == graph.types.get(q.outputs[0]) and (graph.int8_allowed or kind != np.dtype(np.int8))


def _conv(graph: _Graph, step: Step, dqs: list[Step], q: Step, opset: int) -> list[Step] | None:
    x, w = dqs
    if not _activation_types_match(graph, x, q):
        return None
    inputs = _qparams(x) + _qparams(w) + _out(q)
    if len(step.inputs) > 2 and step.inputs[2]:
        bias = graph.producer.get(step.inputs[2])
        if bias is None or bias.op_type != "DequantizeLinear" or graph.types.get(bias.inputs[0]) != np.int32:
            return None
        inputs.append(bias.inputs[0])
    return [Step(step.name, "", "QLinearConv", inputs, list(q.outputs), dict(step.attrs))]


def _matmul(graph: _Graph, step: Step, dqs: list[Step], q: Step, opset: int) -> list[Step] | None:
    a, b = dqs
    if not _activation_types_match(graph, a, q):
        return None
    return [Step(step.name, "", "QLinearMatMul", _qparams(a) + _qparams(b) + _out(q), list(q.outputs))]


def _gemm(graph: _Graph, step: Step, dqs: list[Step], q: Step, opset: int) -> list[Step] | None:
    a, b = dqs
    if not _activation_types_match(graph, a, q):
        return None
    bias = ""
    if len(step.inputs) > 2 and step.inputs[2]:
        c = graph.producer.get(step.inputs[2])
        if c is None or c.op_type != "DequantizeLinear" or graph.types.get(c.inputs[0]) != np.int32:
            return None
        if float(step.attrs.get("beta", 1.0)) != 1.0:
            return None
        bias = c.inputs[0]
    attrs = {k: step.attrs[k] for k in ("alpha", "transA", "transB") if k in step.attrs}
    inputs = [*_qparams(a), *_qparams(b), bias, *_out(q)]
    return [Step(step.name, MS, "QGemm", inputs, list(q.outputs), attrs)]


# The two builder families below take their op as a first argument bound by ``functools.partial`` in
# ``RULES``, rather than closing over it: a closure made at import would keep its code through mutation
# testing (``scripts/mutation.py``), which switches a function's code on each call.


def _binary(op: str, graph: _Graph, step: Step, dqs: list[Step], q: Step, opset: int) -> list[Step] | None:
    if not _same_type(graph, dqs, q):
        return None
    a, b = dqs
    return [Step(step.name, MS, op, _qparams(a) + _qparams(b) + _out(q), list(q.outputs))]


def _unary(
    op: str, attr_names: tuple[str, ...], domain: str, graph: _Graph, step: Step, dqs: list[Step], q: Step, opset: int
) -> list[Step] | None:
    if not _same_type(graph, dqs, q):
        return None
    if op == "QLinearAveragePool" and any(d != 1 for d in step.attrs.get("dilations", [])):
        return None
    attrs = {k: step.attrs[k] for k in attr_names if k in step.attrs}
    if op == "QLinearSoftmax":
        attrs["opset"] = opset
        attrs.setdefault("axis", 1 if opset < 13 else -1)
    if op == "QLinearLookup":
        attrs["function"] = step.op_type
    inputs = _qparams(dqs[0]) + _out(q) + (step.inputs[1:] if op == "QLinearLookup" else [])
    return [Step(step.name, domain, op, inputs, list(q.outputs), attrs)]


def _concat(graph: _Graph, step: Step, dqs: list[Step], q: Step, opset: int) -> list[Step] | None:
    if not _same_type(graph, dqs, q):
        return None
    inputs = _out(q)
    for d in dqs:
        inputs += _qparams(d)
    return [Step(step.name, MS, "QLinearConcat", inputs, list(q.outputs), {"axis": step.attrs.get("axis", 0)})]


_POOL_ATTRS = ("auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides")
#: op_type -> (indices of inputs that must come from DequantizeLinear, builder)
RULES: dict[str, tuple[tuple[int, ...] | None, Builder]] = {
    "Conv": ((0, 1), _conv),
    "MatMul": ((0, 1), _matmul),
    "Gemm": ((0, 1), _gemm),
    "Add": ((0, 1), partial(_binary, "QLinearAdd")),
    "Mul": ((0, 1), partial(_binary, "QLinearMul")),
    "AveragePool": ((0,), partial(_unary, "QLinearAveragePool", _POOL_ATTRS, MS)),
    "GlobalAveragePool": ((0,), partial(_unary, "QLinearGlobalAveragePool", (), MS)),
    "Sigmoid": ((0,), partial(_unary, "QLinearSigmoid", (), MS)),
    "LeakyRelu": ((0,), partial(_unary, "QLinearLeakyRelu", ("alpha",), MS)),
    "Softmax": ((0,), partial(_unary, "QLinearSoftmax", ("axis",), MS)),
    "Relu": ((0,), partial(_unary, "QLinearLookup", (), INTERNAL_DOMAIN)),
    "Clip": ((0,), partial(_unary, "QLinearLookup", ("min", "max"), INTERNAL_DOMAIN)),
    "Concat": (None, _concat),
}


def _pass_through(graph: _Graph, step: Step, keep: set[str]) -> list[Step] | None:
    """``DQ -> data op -> Q`` on each output: the op on integers, then a requantize table if needed."""
    if step.op_type == "Resize" and step.attrs.get("mode", "nearest") != "nearest":
        return None
    if step.op_type == "MaxPool" and len([o for o in step.outputs if o]) > 1:
        return None
    dq = graph.dq(step.inputs[0]) if step.inputs else None
    if dq is None or not graph.per_tensor(dq):
        return None
    qs = [graph.single_q(o, keep) for o in step.outputs]
    if any(q is None or not graph.per_tensor(q) for q in qs):
        return None
    if any(graph.types.get(q.outputs[0]) != graph.types.get(dq.inputs[0]) for q in qs):  # type: ignore[union-attr]
        return None
    raw_outputs, extra = [], []
    for out, q in zip(step.outputs, qs, strict=False):
        assert q is not None
        if _same_params(graph, dq, q):
            raw_outputs.append(q.outputs[0])
            continue
        tmp = f"{INTERNAL_PREFIX}{out}"
        raw_outputs.append(tmp)
        inputs = [tmp, *_qparams(dq)[1:], *_out(q)]
        extra.append(Step(f"{step.name}/requantize", INTERNAL_DOMAIN, "Requantize", inputs, list(q.outputs)))
    moved = Step(step.name, step.domain, step.op_type, [dq.inputs[0], *step.inputs[1:]], raw_outputs, dict(step.attrs))
    return [moved, *extra]


def _same_params(graph: _Graph, a: Step, b: Step) -> bool:
    pa, pb = _qparams(a)[1:], _qparams(b)[1:]
    values = [graph.constants.get(n) if n else np.zeros(1) for n in (*pa, *pb)]
    if any(v is None for v in values):
        return False
    return bool(
        np.array_equal(values[0], values[2]) and np.array_equal(values[1].astype(np.int64), values[3].astype(np.int64))
    )


def fuse_qdq(
    steps: list[Step],
    constants: dict[str, np.ndarray],
    types: dict[str, np.dtype],
    graph_outputs: set[str],
    keep: set[str],
    opset: int,
    int8_allowed: bool = True,
) -> list[Step]:
    """Rewrite the QDQ groups of ``steps`` (see module docstring); returns the new step list.

    Without ``int8_allowed`` (onnxruntime's default x86 session, ``session.qdqisint8allowed`` unset),
    Conv/MatMul/Gemm groups whose activations are still int8 stay in float, as its node group
    selectors leave them.
    """
    graph = _Graph(list(steps), constants, types, graph_outputs)
    graph = _Graph(remove_implied_activations(graph, keep), constants, types, graph_outputs)
    graph.int8_allowed = int8_allowed
    replaced: dict[int, list[Step]] = {}
    dropped: set[int] = set()
    position = {id(s): i for i, s in enumerate(graph.steps)}
    for step in graph.steps:
        if step.domain not in ("", "ai.onnx") or len([o for o in step.outputs if o]) == 0:
            continue
        new: list[Step] | None = None
        if step.op_type in PASS_THROUGH:
            new = _pass_through(graph, step, keep)
            qs = [graph.consumers[o][0] for o in step.outputs] if new else []
        elif step.op_type in RULES and len(step.outputs) == 1:
            indices, build = RULES[step.op_type]
            q = graph.single_q(step.outputs[0], keep)
            idx = tuple(range(len(step.inputs))) if indices is None else indices
            dqs = _dq_inputs(graph, step, idx) if q is not None else None
            if q is not None and dqs is not None and _granularity_ok(graph, step, dqs, q):
                new = build(graph, step, dqs, q, opset)
            qs = [q] if new else []
        if new:
            qs = sorted(qs, key=lambda q: position[id(q)])
            for s in new:
                s.fused = (step.name, *(q.name for q in qs))
            dropped.add(id(step))
            replaced[id(qs[-1])] = new
            dropped.update(id(q) for q in qs[:-1])
    out: list[Step] = []
    for step in graph.steps:
        if id(step) in replaced:
            out.extend(replaced[id(step)])
        elif id(step) not in dropped:
            out.append(step)
    return out
