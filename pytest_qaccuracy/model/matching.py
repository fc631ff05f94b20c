"""Matching fp32 activations to their counterparts in the quantized model.

Three passes, each only over what the previous left unmatched:

1. **user**: an explicit ``{fp32 tensor: quantized tensor}`` mapping;
2. **name**: the fp32 tensor ``X`` also exists in the quantized model (ORT's QDQ quantizer keeps it and
   adds ``X -> QuantizeLinear -> X_QuantizeLinear_Output -> DequantizeLinear``; graph outputs come back
   through a DequantizeLinear named ``X``), or ``X_quantized`` exists (ORT's QOperator naming);
3. **structure**: both graphs are walked in topological order, with Q/DQ nodes seen as identities and
   QLinear ops as their float ops; a node matches when its op type and its matched activation inputs
   agree. Activations that a quantizer folds away (Relu/Clip after a conv) are handled.

The captured tensor is always the *integer* tensor where one exists (a QuantizeLinear or QLinear
output), dequantized in numpy: exposing it does not stop onnxruntime from fusing QDQ groups, and it
holds exactly the values that the next layer reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import onnx

from pytest_qaccuracy.errors import ModelError
from pytest_qaccuracy.model.graph import GraphView
from pytest_qaccuracy.model.quant_params import (
    QLINEAR_SIGNATURES,
    QOPERATOR_FLOAT_OP,
    QuantParams,
    find_quant_params,
)

FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16}
#: Quantized types whose codes are not numbers numpy subtracts a zero point from (onnxruntime cannot
#: even hand them to numpy): a tensor of one is captured after the model's own DequantizeLinear, as
#: onnxruntime computes it. 8- and 16-bit integer codes are fetched and dequantized in numpy (exactly).
QUANTIZED_TYPES = {
    getattr(onnx.TensorProto, name)
    for name in (
        "FLOAT8E4M3FN",
        "FLOAT8E4M3FNUZ",
        "FLOAT8E5M2",
        "FLOAT8E5M2FNUZ",
        "FLOAT4E2M1",
        "INT4",
        "UINT4",
        "INT2",
        "UINT2",
    )
    if hasattr(onnx.TensorProto, name)
}
#: Ops a quantizer may fold into the op before them (their output is that op's quantized output).
FOLDABLE_ACTIVATIONS = {"Relu", "Clip"}
#: Ops a converter may drop entirely (their output equals their input).
DROPPABLE = {"Identity", "Dropout"}
DEQUANTIZE = "DequantizeLinear"
_IDENTITY_OPS = {"QuantizeLinear", DEQUANTIZE, "DynamicQuantizeLinear"}
#: Integer ops whose output is an int32 accumulator without a scale of its own (dynamic quantization).
ACCUMULATORS = {"ConvInteger", "MatMulInteger"}
#: ``op_type`` reported for a graph input (it has no producing node).
INPUT = "input"


@dataclass(frozen=True, slots=True)
class TensorMatch:
    """One fp32 tensor and the quantized-model tensor that holds the same quantity.

    ``capture`` is what is fetched from the quantized model; ``params`` dequantize it when it is an
    integer tensor. ``quantized`` is the name reported (a DequantizeLinear output where there is one).
    A quantized graph input has ``node`` None, ``op_type`` :data:`INPUT` and ``order`` -1.
    """

    fp32: str
    quantized: str
    capture: str
    params: QuantParams | None
    node: str | None
    op_type: str | None
    order: int
    matched_by: str


@dataclass(slots=True)
class Matching:
    matches: list[TensorMatch]
    unmatched_fp32: list[str] = field(default_factory=list)
    unmatched_quantized: list[str] = field(default_factory=list)


class _Classes:
    """Union-find over quantized-model tensors: Q/DQ outputs are one class with their input."""

    def __init__(self, view: GraphView) -> None:
        self.parent: dict[str, str] = {}
        for node in view.nodes:
            if node.op_type in _IDENTITY_OPS and node.input and node.output:
                self.union(node.input[0], node.output[0])

    def find(self, name: str) -> str:
        root = name
        while self.parent.get(root, root) != root:
            root = self.parent[root]
        self.parent[name] = root
        return root

    def union(self, a: str, b: str) -> None:
        self.parent[self.find(b)] = self.find(a)


def _is_float(view: GraphView, name: str) -> bool:
    elem = view.elem_types.get(name)
    return elem is None or elem in FLOAT_TYPES


class Matcher:
    """Finds counterparts for every float activation of ``fp32`` in ``quant``."""

    def __init__(self, fp32: onnx.ModelProto, quant: onnx.ModelProto) -> None:
        self.f = GraphView(_with_types(fp32))
        self.q = GraphView(_with_types(quant))
        self.classes = _Classes(self.q)
        self._members: dict[str, list[str]] = {}
        for name in [*self.q.input_names, *self.q.producer]:
            self._members.setdefault(self.classes.find(name), []).append(name)

    # -- resolving a quantized-model tensor to what is captured ---------------------------------

    def resolve(self, name: str, follow_quantize: bool = True) -> tuple[str, str, QuantParams | None]:
        """(reported name, captured name, params) for quantized-model tensor ``name``.

        A DequantizeLinear output is captured as its integer input. With ``follow_quantize``, a float
        tensor that a QuantizeLinear reads is captured as that quantized value (what the next layer
        reads); without it (model outputs), the float tensor itself is captured.
        """
        found = self.q.producer.get(name)
        if found and found[1].op_type == "DequantizeLinear":
            integer = found[1].input[0]
            if not self._numpy_codes(integer):
                return name, name, None
            return name, integer, find_quant_params(self.q, integer)
        for _, node, pos in self.q.consumers.get(name, []) if follow_quantize else ():
            if node.op_type == "QuantizeLinear" and pos == 0:
                integer = node.output[0]
                dequantized = self._dq_name(integer)
                if not self._numpy_codes(integer):
                    return (dequantized, dequantized, None) if dequantized else (name, name, None)
                return dequantized or integer, integer, find_quant_params(self.q, integer)
        params = self._integer_params(name)
        if params is not None:
            return self._dq_name(name) or name, name, params
        return name, name, None

    def _integer_params(self, name: str) -> QuantParams | None:
        """Quantization parameters of ``name`` unless its type is float, or codes numpy cannot read."""
        if self.q.elem_types.get(name) in FLOAT_TYPES or not self._numpy_codes(name):
            return None
        return find_quant_params(self.q, name)

    def _numpy_codes(self, integer: str) -> bool:
        """Whether ``integer`` holds codes numpy reads as numbers (not one of ``QUANTIZED_TYPES``); its
        type is the inferred one, else its zero point's (a model shape inference cannot type)."""
        elem = self.q.elem_types.get(integer)
        if elem is None:
            zero_point = self._zero_point(integer)
            elem = self.q.initializers[zero_point].data_type if zero_point in self.q.initializers else None
        return elem not in QUANTIZED_TYPES

    def _zero_point(self, integer: str) -> str | None:
        found = self.q.producer.get(integer)
        nodes = [found[1]] if found and found[1].op_type == "QuantizeLinear" else []
        nodes += [n for _, n, pos in self.q.consumers.get(integer, []) if n.op_type == "DequantizeLinear" and pos == 0]
        return next((n.input[2] for n in nodes if len(n.input) > 2 and n.input[2]), None)

    def _dq_name(self, integer: str) -> str | None:
        for _, node, pos in self.q.consumers.get(integer, []):
            if node.op_type == "DequantizeLinear" and pos == 0:
                return node.output[0]
        return None

    def _resolve_class(self, root: str) -> tuple[str, str, QuantParams | None] | None:
        """Pick the tensor of a class to capture: an integer member with params, else the float one."""
        members = self._members.get(root, [root])
        for name in members:
            params = self._integer_params(name)
            if params is not None:
                return self._dq_name(name) or name, name, params
        float_members = [m for m in members if m in self.q.producer or m in self.q.input_names]
        # a DequantizeLinear output holds the quantized values (float8 or 4-bit codes, dequantized)
        float_members.sort(
            key=lambda m: m not in self.q.producer or self.q.producer[m][1].op_type != "DequantizeLinear"
        )
        return (float_members[0], float_members[0], None) if float_members else None

    # -- the three passes ------------------------------------------------------------------------

    def candidates(self) -> list[tuple[int, onnx.NodeProto, str]]:
        out = []
        for i, node in enumerate(self.f.nodes):
            if node.op_type == "Constant" or all(self.f.is_constant(x) for x in node.input if x):
                continue
            out.extend((i, node, name) for name in node.output if name and _is_float(self.f, name))
        return out

    def match(self, user: Mapping[str, str] | None = None) -> Matching:
        candidates = self.candidates()
        by_name = {name: (i, node) for i, node, name in candidates}
        found: dict[str, tuple[str, str, QuantParams | None, str]] = {}
        used: set[str] = set()

        for fp32_name, q_name in (user or {}).items():
            if fp32_name not in by_name:
                raise ModelError(f"user mapping: '{fp32_name}' is not a float activation of the fp32 model")
            if q_name not in self.q.producer and q_name not in self.q.input_names:
                raise ModelError(f"user mapping: '{q_name}' is not a tensor of the quantized model")
            found[fp32_name] = (*self.resolve(q_name), "user")
            used.add(self.classes.find(q_name))

        for _, _, name in candidates:
            if name in found:
                continue
            if name in self.q.producer:
                target = name
            elif f"{name}_quantized" in self.q.producer:
                target = f"{name}_quantized"
            else:
                continue
            root = self.classes.find(target)
            if root in used:
                continue
            found[name] = (*self.resolve(target), "name")
            used.add(root)

        self._unfold_activations(found)

        for name, root in self._structure(by_name).items():
            if name in found or root in used:
                continue
            resolved = self._resolve_class(root)
            if resolved:
                found[name] = (*resolved, "structure")
                used.add(root)

        matches = self._inputs(found, used)
        for i, node, name in candidates:
            if name in found:
                reported, capture, params, how = found[name]
                matches.append(TensorMatch(name, reported, capture, params, node.name or None, node.op_type, i, how))
        unmatched_fp32 = [name for _, _, name in candidates if name not in found]
        unmatched_q = [
            out
            for node in self.q.nodes
            if node.op_type not in _IDENTITY_OPS and node.op_type != "Constant"
            for out in node.output[:1]
            if out and self.classes.find(out) not in used and not self._constant_class(out)
        ]
        return Matching(matches, unmatched_fp32, unmatched_q)

    def _inputs(self, found: Mapping[str, object], used: set[str]) -> list[TensorMatch]:
        """Float graph inputs that the quantized model quantizes (``x -> QuantizeLinear``), as
        onnxruntime's ``qdq_loss_debug`` reports them; ``order`` -1, before every node."""
        matches = []
        for name in self.f.input_names:
            if name in found or name not in self.q.input_names or not _is_float(self.f, name):
                continue
            reported, capture, params = self.resolve(name)
            if (params is None and capture == name) or self.classes.find(capture) in used:
                continue
            matches.append(TensorMatch(name, reported, capture, params, None, INPUT, -1, "name"))
        return matches

    def _unfold_activations(self, found: dict[str, tuple[str, str, QuantParams | None, str]]) -> None:
        """QOperator models fold Relu/Clip into the producing QLinear op and keep the producer's name
        (``conv1_quantized`` holds relu1's values): move such a match to the activation's output."""
        for node in self.f.nodes:
            if node.op_type not in FOLDABLE_ACTIVATIONS or not node.input or node.output[0] in found:
                continue
            source = node.input[0]
            if source not in found:
                continue
            root = self.classes.find(found[source][1])
            members = self._members.get(root, [root])
            if not any(c.op_type in FOLDABLE_ACTIVATIONS for m in members for _, c, _ in self.q.consumers.get(m, [])):
                found[node.output[0]] = found.pop(source)

    def _constant_class(self, name: str) -> bool:
        found = self.q.producer.get(name)
        return found is not None and all(self.q.is_constant(x) for x in found[1].input if x)

    # -- structure -------------------------------------------------------------------------------

    def _activation_inputs_q(self, node: onnx.NodeProto) -> tuple[str, ...]:
        names = [x for x in node.input if x and not self._constant_tensor_q(x)]
        if node.op_type in QOPERATOR_FLOAT_OP:
            names = [x for x in names if _is_activation_slot(node, list(node.input).index(x))]
        return tuple(self.classes.find(x) for x in names)

    def _constant_tensor_q(self, name: str) -> bool:
        """An initializer or Constant, possibly through Q/DQ nodes (quantized weights and biases)."""
        while not self.q.is_constant(name):
            found = self.q.producer.get(name)
            if found is None or found[1].op_type not in _IDENTITY_OPS:
                return False
            name = found[1].input[0]
        return True

    def _structure(self, by_name: dict[str, tuple[int, onnx.NodeProto]]) -> dict[str, str]:
        """fp32 tensor -> quantized class root, by walking both graphs in topological order."""
        pool: dict[tuple[str, tuple[str, ...]], list[onnx.NodeProto]] = {}
        for node in self.q.nodes:
            if node.op_type in _IDENTITY_OPS or node.op_type == "Constant":
                continue
            key = (QOPERATOR_FLOAT_OP.get(node.op_type, node.op_type), self._activation_inputs_q(node))
            pool.setdefault(key, []).append(node)
        mapped = {name: self.classes.find(name) for name in self.f.input_names if name in self._members}
        for node in self.f.nodes:
            acts = [x for x in node.input if x and not self.f.is_constant(x)]
            if not acts or any(x not in mapped for x in acts):
                continue
            key = (node.op_type, tuple(mapped[x] for x in acts))
            if pool.get(key):
                twin = pool[key].pop(0)
                theirs_outputs: list[str | None] = list(twin.output)
                if twin.op_type in ACCUMULATORS:
                    bias = len(node.input) > 2 and bool(node.input[2])
                    theirs_outputs = [self._rescaled(twin.output[0], bias)]
                for mine, theirs in zip(node.output, theirs_outputs, strict=False):
                    if mine and theirs:
                        mapped[mine] = self.classes.find(theirs)
            elif node.op_type in DROPPABLE and len(acts) == 1:
                mapped[node.output[0]] = mapped[acts[0]]
            elif node.op_type in FOLDABLE_ACTIVATIONS and len(acts) == 1:
                mapped[node.output[0]] = mapped.pop(acts[0])  # the quantized tensor is post-activation
        return {name: root for name, root in mapped.items() if name in by_name}

    def _rescaled(self, accumulator: str, bias: bool) -> str | None:
        """The tensor holding the float value of an int32 accumulator: onnxruntime's dynamic
        quantization follows it with Cast -> Mul(scale product), then Add(bias) when the float op
        has a bias. Without that chain, the accumulator itself if it has quantization parameters
        (a DequantizeLinear reads it), else None (left unmatched: raw int32 sums are no activation)."""
        name = accumulator
        for op_type in ("Cast", "Mul", "Add") if bias else ("Cast", "Mul"):
            consumers = self.q.consumers.get(name, [])
            if len(consumers) != 1 or consumers[0][1].op_type != op_type:
                break
            name = consumers[0][1].output[0]
        else:
            return name
        return accumulator if self._integer_params(accumulator) is not None else None


def _is_activation_slot(node: onnx.NodeProto, pos: int) -> bool:
    if node.op_type == "QLinearConcat":
        return pos >= 2 and (pos - 2) % 3 == 0
    signature = QLINEAR_SIGNATURES.get(node.op_type)
    if signature:
        return any(t == pos for t, _, _ in signature[0])
    return node.op_type in ("ConvInteger", "MatMulInteger") and pos in (0, 1)


def _with_types(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy with inferred value_info (for element types); the original if inference fails."""
    try:
        return onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:
        return model


def match_tensors(fp32: onnx.ModelProto, quant: onnx.ModelProto, user: Mapping[str, str] | None = None) -> Matching:
    """Match every float activation of ``fp32`` to the quantized model; see the module docstring."""
    return Matcher(fp32, quant).match(user)
