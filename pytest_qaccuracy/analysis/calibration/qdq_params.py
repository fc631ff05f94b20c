"""A QDQ model whose activation ranges can be changed without quantizing it again.

``auto`` calibration compares whole-model choices of ranges. Writing a model with onnxruntime's
quantizer for each choice costs seconds; instead the model is written once, and the scales and zero
points of its activations become graph inputs of one onnxruntime session, fed for each choice.
The values fed are onnxruntime's own (``compute_scale_zp`` on the range after its range rules, as
``QDQQuantizer.calc_quant_params`` does), checked against the written model: a parameter whose
computed value differs from what onnxruntime wrote stays a constant and is not chosen.
``ParamModel.patched`` sets the same values as constants of a written model (its int32 biases
quantized again), which gives onnxruntime's own model of a choice without writing it.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from pytest_qaccuracy.model.graph import GraphView

#: the quantized type of activations by name, as numpy types
ACTIVATION_DTYPES = {"uint8": np.uint8, "int8": np.int8}


def adjusted_ranges(
    model: onnx.ModelProto, ranges: Mapping[str, tuple[float, float]]
) -> dict[str, tuple[float, float]]:
    """onnxruntime's range rules (``adjust_tensor_ranges``) applied to ``ranges``: a Relu/Clip's
    single-consumer input takes the output's range, and a Softmax output is [0, 1]."""
    view = GraphView(model)
    out = dict(ranges)
    for node in view.nodes:
        if node.op_type in ("Relu", "Clip") and len(view.consumers.get(node.input[0], [])) == 1:
            if node.output[0] in out:
                out[node.input[0]] = out[node.output[0]]
        elif node.op_type == "Softmax":
            out[node.output[0]] = (0.0, 1.0)
    return out


@functools.lru_cache(maxsize=1 << 16)
def scale_zero_point(lo: float, hi: float, activation_type: str) -> tuple[np.float32, np.integer]:
    """onnxruntime's asymmetric scale and zero point of the range ``(lo, hi)`` (``compute_scale_zp``
    with the type's full range, no minimum real range); remembered, as choices repeat ranges."""
    from onnxruntime.quantization.quant_utils import compute_scale_zp

    dtype = ACTIVATION_DTYPES[activation_type]
    info = np.iinfo(dtype)
    zero, scale = compute_scale_zp(
        np.array(lo, dtype=np.float32),
        np.array(hi, dtype=np.float32),
        np.array(info.min, dtype),
        np.array(info.max, dtype),
    )
    return np.float32(scale), dtype(zero)


def _holds(scale: onnx.TensorProto, zero: onnx.TensorProto, bounds: tuple[float, float], kind: str) -> bool:
    """Whether a written scale and zero point are onnxruntime's plain ones of the range ``bounds``
    (one value each, of the activation type); else onnxruntime applied a rule of its own."""
    have_s, have_z = numpy_helper.to_array(scale), numpy_helper.to_array(zero)
    want_s, want_z = scale_zero_point(*bounds, kind)
    return have_s.size == 1 and have_s.item() == want_s and have_z.dtype == want_z.dtype and have_z.item() == want_z


class ParamModel:
    """The activation scales and zero points of a QDQ model written by onnxruntime, as graph inputs.

    Attributes:
        model: the QDQ model with the parameters as inputs.
        tensors: the calibrated tensors whose range the inputs carry, in graph order.
    """

    def __init__(
        self, qdq: onnx.ModelProto, fp32: onnx.ModelProto, base: Mapping[str, tuple[float, float]], activation_type: str
    ) -> None:
        self._fp32 = fp32
        self._type = activation_type
        self._base = dict(base)
        adjusted = self._adjusted = adjusted_ranges(fp32, base)
        floats = GraphView(fp32)
        self._floats = floats.initializers
        # a Gemm's beta, folded into its bias's scale by the writer, which resets the node's to 1
        self._betas = {n.name: next((a.f for a in n.attribute if a.name == "beta"), 1.0) for n in floats.nodes}
        view = GraphView(qdq)
        inits = view.initializers
        self._params: dict[str, tuple[str, str, tuple[int, ...]]] = {}
        for node in view.nodes:
            if node.op_type != "QuantizeLinear" or len(node.input) < 3 or node.input[0] in inits:
                continue
            scale, zero = node.input[1], node.input[2]
            tensor = scale.removesuffix("_scale")
            if tensor in self._params or tensor not in adjusted or scale not in inits or zero not in inits:
                continue
            if _holds(inits[scale], inits[zero], adjusted[tensor], activation_type):
                self._params[tensor] = (scale, zero, tuple(inits[scale].dims))
        self.tensors = list(self._params)
        self.model = self._with_inputs(qdq)

    def _with_inputs(self, qdq: onnx.ModelProto) -> onnx.ModelProto:
        model = copy.deepcopy(qdq)
        names = {n for scale, zero, _ in self._params.values() for n in (scale, zero)}
        kept = [t for t in model.graph.initializer if t.name not in names]
        types = {t.name: t.data_type for t in model.graph.initializer if t.name in names}
        shapes = {n: shape for scale, zero, shape in self._params.values() for n in (scale, zero)}
        del model.graph.initializer[:]
        model.graph.initializer.extend(kept)
        for name in sorted(names):
            model.graph.input.append(onnx.helper.make_tensor_value_info(name, types[name], list(shapes[name])))
        return model

    def patched(self, written: onnx.ModelProto, ranges: Mapping[str, tuple[float, float]]) -> onnx.ModelProto:
        """``written`` (a model onnxruntime wrote with the base ranges, QDQ or QOperator) as onnxruntime
        would write it with ``ranges``: every activation parameter ``<tensor>_scale``/``_zero_point``
        that holds onnxruntime's value of the base range is set to that of the new one, and every int32
        bias whose input scale changed is quantized again (``round(bias / (input scale * weight
        scale))``, clipped to int32). What this does not reproduce (onnxruntime raising a weight's scale
        for its int32 bias, a parameter of its own rules) is caught by :func:`same_model`."""
        model = copy.deepcopy(written)
        inits = {t.name: t for t in model.graph.initializer}
        base = self._adjusted
        new = adjusted_ranges(self._fp32, {**self._base, **ranges})
        changed = {}
        for tensor, (lo, hi) in new.items():
            scale, zero = inits.get(f"{tensor}_scale"), inits.get(f"{tensor}_zero_point")
            if scale is None or zero is None or base.get(tensor) == (lo, hi):
                continue
            if not _holds(scale, zero, base[tensor], self._type):
                continue  # another rule than onnxruntime's plain one wrote it (a Softmax's [0, 1] never moves)
            s, z = scale_zero_point(lo, hi, self._type)
            changed[scale.name] = np.full(tuple(scale.dims), s)  # s and z are numpy scalars of their type
            scale.CopyFrom(numpy_helper.from_array(changed[scale.name], scale.name))
            zero.CopyFrom(numpy_helper.from_array(np.full(tuple(zero.dims), z), zero.name))
        for bias, x_scale, w_scale, b_scale, node in _biases(model):
            beta = self._betas.get(node.removesuffix("_quant"), 1.0)
            source = self._floats.get(bias.removesuffix("_quantized"))
            if x_scale not in changed or source is None:
                continue
            data = numpy_helper.to_array(source)
            scale = changed[x_scale] * numpy_helper.to_array(inits[w_scale]) * np.float32(beta)
            info = np.iinfo(np.int32)
            q = np.clip(np.round(data.astype(np.float64) / scale.astype(np.float64)), info.min, info.max)
            inits[bias].CopyFrom(numpy_helper.from_array(q.astype(np.int32), bias))
            if b_scale is not None:
                inits[b_scale].CopyFrom(numpy_helper.from_array(scale.astype(data.dtype).reshape(-1), b_scale))
        return model

    def feeds(self, ranges: Mapping[str, tuple[float, float]]) -> dict[str, np.ndarray]:
        """The inputs that quantize every parameter's tensor with ``ranges`` (after onnxruntime's rules;
        tensors ``ranges`` leaves out keep the base ranges)."""
        adjusted = adjusted_ranges(self._fp32, {**self._base, **ranges})
        feeds = {}
        for tensor, (scale, zero, shape) in self._params.items():
            s, z = scale_zero_point(*adjusted[tensor], self._type)
            feeds[scale] = np.full(shape, s)  # numpy scalars of their type
            feeds[zero] = np.full(shape, z)
        return feeds


#: the inputs of a QOperator node with an int32 bias: (bias, input scale, weight scale)
_QOPERATOR_BIAS = {"QLinearConv": (8, 1, 4), "QGemm": (6, 1, 4)}


def _biases(model: onnx.ModelProto) -> list[tuple[str, str, str, str | None, str]]:
    """Every int32 bias as onnxruntime quantizes it (input 2 of a node whose inputs 0 and 1 are
    quantized: Conv, ConvTranspose, Gemm, the normalizations): its initializer, the input scale's and
    weight scale's initializers, its own scale's initializer (QDQ) or None, and the node's name."""
    view = GraphView(model)
    inits = view.initializers
    producer = {o: n for n in view.nodes for o in n.output}
    found = []

    def dq_scale(name: str) -> str | None:
        node = producer.get(name)
        return node.input[1] if node is not None and node.op_type == "DequantizeLinear" else None

    for node in view.nodes:
        slots = _QOPERATOR_BIAS.get(node.op_type)
        if slots is not None and len(node.input) > slots[0] and node.input[slots[0]] in inits:
            found.append((node.input[slots[0]], node.input[slots[1]], node.input[slots[2]], None, node.name))
        elif len(node.input) > 2:  # Conv, ConvTranspose, Gemm, the normalizations: input 2 is the bias
            bias_dq = producer.get(node.input[2])
            if bias_dq is None or bias_dq.op_type != "DequantizeLinear" or bias_dq.input[0] not in inits:
                continue
            x_scale, w_scale = dq_scale(node.input[0]), dq_scale(node.input[1])
            if x_scale is not None and w_scale is not None:
                found.append((bias_dq.input[0], x_scale, w_scale, bias_dq.input[1], node.name))
    return [f for f in found if inits[f[0]].data_type == onnx.TensorProto.INT32]


def same_model(a: onnx.ModelProto, b: onnx.ModelProto) -> bool:
    """Whether two models have the same nodes and the same initializers (name, type, shape, values)."""
    if [n.SerializeToString() for n in a.graph.node] != [n.SerializeToString() for n in b.graph.node]:
        return False
    left = {t.name: numpy_helper.to_array(t) for t in a.graph.initializer}
    right = {t.name: numpy_helper.to_array(t) for t in b.graph.initializer}
    return left.keys() == right.keys() and all(
        left[k].dtype == right[k].dtype and left[k].shape == right[k].shape and np.array_equal(left[k], right[k])
        for k in left
    )
