"""A QDQ model whose activation ranges can be changed without quantizing it again.

``auto`` calibration compares whole-model choices of ranges. Writing a model with onnxruntime's
quantizer for each choice costs seconds; instead the model is written once, and the scales and zero
points of its activations become graph inputs of one onnxruntime session, fed for each choice.
The values fed are onnxruntime's own (``compute_scale_zp`` on the range after its range rules, as
``QDQQuantizer.calc_quant_params`` does), checked against the written model: a parameter whose
computed value differs from what onnxruntime wrote stays a constant and is not chosen.
``ParamModel.patched`` sets the same values as constants of a written model (its int32 biases
quantized again, and a weight's scale raised where onnxruntime raises it for its bias), which gives
onnxruntime's own model of a choice without writing it.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from dataclasses import dataclass

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
        changed, before = {}, {}
        for tensor, (lo, hi) in new.items():
            scale, zero = inits.get(f"{tensor}_scale"), inits.get(f"{tensor}_zero_point")
            if scale is None or zero is None or base.get(tensor) == (lo, hi):
                continue
            if not _holds(scale, zero, base[tensor], self._type):
                continue  # another rule than onnxruntime's plain one wrote it (a Softmax's [0, 1] never moves)
            s, z = scale_zero_point(lo, hi, self._type)
            before[scale.name] = numpy_helper.to_array(scale)
            changed[scale.name] = np.full(tuple(scale.dims), s)  # s and z are numpy scalars of their type
            scale.CopyFrom(numpy_helper.from_array(changed[scale.name], scale.name))
            zero.CopyFrom(numpy_helper.from_array(np.full(tuple(zero.dims), z), zero.name))
        found = _biases(model)
        weights = [w for *_, w in found]
        for bias, x_scale, w_scale, b_scale, node, weight in found:
            beta = self._betas.get(node.removesuffix("_quant"), 1.0)
            source = self._floats.get(bias.removesuffix("_quantized"))
            if x_scale not in changed or source is None:
                continue
            data = numpy_helper.to_array(source)
            if weight is not None and weights.count(weight) == 1 and raises_weight_scales(b_scale is None):
                self._raise_weight(inits, weight, w_scale, data, before[x_scale], changed[x_scale])
            scale = changed[x_scale] * numpy_helper.to_array(inits[w_scale]) * np.float32(beta)
            info = np.iinfo(np.int32)
            q = np.clip(np.round(data.astype(np.float64) / scale.astype(np.float64)), info.min, info.max)
            inits[bias].CopyFrom(numpy_helper.from_array(q.astype(np.int32), bias))
            if b_scale is not None:
                inits[b_scale].CopyFrom(numpy_helper.from_array(scale.astype(data.dtype).reshape(-1), b_scale))
        return model

    def _raise_weight(
        self, inits: dict, weight: Weight, w_scale: str, bias: np.ndarray, x_was: np.ndarray, x_now: np.ndarray
    ) -> None:
        """Set ``weight``'s scale (and the channels it quantizes differently) to what onnxruntime writes
        with the input scale ``x_now``: its plain scale, raised for the int32 bias as
        :func:`raised_scale` raises it. Done only where the written model checks out: the plain scale
        computed here, raised for the input scale ``x_was``, gives the written scale, and the written
        weight quantized with it. Otherwise the weight stays as written (:func:`same_model` tells)."""
        source = self._floats.get(weight.name.removesuffix("_quantized"))
        quantized, zero = inits.get(weight.name), inits.get(weight.zero_point)
        if source is None or quantized is None or zero is None or quantized.data_type not in SYMMETRIC:
            return
        q, written = numpy_helper.to_array(quantized), numpy_helper.to_array(inits[w_scale])
        float_weight = numpy_helper.to_array(source)
        per_channel = written.size > 1
        if numpy_helper.to_array(zero).any() or (per_channel and not _fits(float_weight, written, bias, weight.axis)):
            return
        axis = weight.axis if per_channel else None
        plain = symmetric_scale(float_weight, axis, quantized.data_type)
        if not np.array_equal(raised_scale(plain, x_was, bias, per_channel), written):
            return
        scale = raised_scale(plain, x_now, bias, per_channel)
        moved = np.flatnonzero(scale != written)
        if moved.size == 0:
            return
        index: tuple = (Ellipsis,)
        shape = [1] * q.ndim
        if axis is not None:
            index = (slice(None),) * axis + (moved,)
            shape[axis] = moved.size
        old, new = (s.reshape(-1)[moved].reshape(shape) for s in (written, scale))
        if not np.array_equal(quantize_weight(float_weight[index], old, q.dtype), q[index]):
            return
        q = q.copy()
        q[index] = quantize_weight(float_weight[index], new, q.dtype)
        quantized.CopyFrom(numpy_helper.from_array(q, quantized.name))
        inits[w_scale].CopyFrom(numpy_helper.from_array(scale, w_scale))

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


#: the inputs of a QOperator node with an int32 bias: (bias, input scale, weight, weight scale, weight
#: zero point) and the axis of a per-channel weight (None: only per tensor is known)
_QOPERATOR_BIAS = {"QLinearConv": ((8, 1, 3, 4, 5), 0), "QGemm": ((6, 1, 3, 4, 5), None)}


@dataclass(frozen=True, slots=True)
class Weight:
    """A quantized weight initializer before an int32 bias: its name, its zero point's, and the axis
    of its scales (None when per tensor, or not known)."""

    name: str
    zero_point: str
    axis: int | None


def _biases(model: onnx.ModelProto) -> list[tuple[str, str, str, str | None, str, Weight | None]]:
    """Every int32 bias as onnxruntime quantizes it (input 2 of a node whose inputs 0 and 1 are
    quantized: Conv, ConvTranspose, Gemm, the normalizations): its initializer, the input scale's and
    weight scale's initializers, its own scale's initializer (QDQ) or None, the node's name, and the
    quantized weight (None when its DequantizeLinear has no zero point)."""
    view = GraphView(model)
    inits = view.initializers
    producer = {o: n for n in view.nodes for o in n.output}
    found = []

    def dq_scale(name: str) -> str | None:
        node = producer.get(name)
        return node.input[1] if node is not None and node.op_type == "DequantizeLinear" else None

    def dq_weight(name: str) -> Weight | None:
        node = producer.get(name)
        if node is None or len(node.input) < 3:
            return None
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)  # DequantizeLinear's default
        return Weight(node.input[0], node.input[2], axis)

    for node in view.nodes:
        slots, axis = _QOPERATOR_BIAS.get(node.op_type, (None, None))
        if slots is not None and len(node.input) > slots[0] and node.input[slots[0]] in inits:
            bias, x_scale, w, w_scale, w_zero = (node.input[i] for i in slots)
            found.append((bias, x_scale, w_scale, None, node.name, Weight(w, w_zero, axis)))
        elif len(node.input) > 2:  # Conv, ConvTranspose, Gemm, the normalizations: input 2 is the bias
            bias_dq = producer.get(node.input[2])
            if bias_dq is None or bias_dq.op_type != "DequantizeLinear" or bias_dq.input[0] not in inits:
                continue
            x_scale, w_scale = dq_scale(node.input[0]), dq_scale(node.input[1])
            if x_scale is not None and w_scale is not None:
                found.append(
                    (bias_dq.input[0], x_scale, w_scale, bias_dq.input[1], node.name, dq_weight(node.input[1]))
                )
    return [f for f in found if inits[f[0]].data_type == onnx.TensorProto.INT32]


def raises_weight_scales(qoperator: bool) -> bool:
    """Whether this onnxruntime's writer of the form raises a weight's scale for its int32 bias (seen:
    1.32 in both forms, 1.20.1 in QDQ only, 1.18 in neither)."""
    from onnxruntime.quantization.onnx_quantizer import ONNXQuantizer
    from onnxruntime.quantization.qdq_quantizer import QDQQuantizer

    return hasattr(ONNXQuantizer if qoperator else QDQQuantizer, "_adjust_weight_scale_for_int32_bias")


#: the weight types onnxruntime raises a scale of, with their symmetric range (``get_qmin_qmax_for_qType``)
SYMMETRIC = {onnx.TensorProto.INT8: (-127, 127), onnx.TensorProto.INT16: (-32767, 32767)}

#: the int32 range onnxruntime divides a bias by, ``max - (min + 1)``, and its margin
_INT32_RANGE = np.float64(np.iinfo(np.int32).max) - np.float64(np.iinfo(np.int32).min + 1)
_MARGIN = 1.0001

#: the type numpy gives a float32 scalar times a Python float (float32 under numpy 2, float64 before):
#: onnxruntime computes a channel's least bias scale on that scalar
_SCALAR_TYPE = type(np.float32(1.0) * 2.0)


def _fits(weight: np.ndarray, scale: np.ndarray, bias: np.ndarray, axis: int | None) -> bool:
    """Whether per-channel ``scale`` and ``bias`` have one value per channel of ``weight`` along ``axis``."""
    return axis is not None and 0 <= axis < weight.ndim and weight.shape[axis] == scale.size == bias.size


def symmetric_scale(weight: np.ndarray, axis: int | None, data_type: int) -> np.ndarray:
    """onnxruntime's symmetric scale of ``weight`` (per channel along ``axis``, or per tensor), before
    any raise: ``2 max|w| / (qmax - qmin)`` over the type's symmetric range, in float64, stored as
    float32; 1.0 where that is below float32's smallest normal (an all-zero channel)."""
    absmax = np.abs(weight).max(axis=tuple(i for i in range(weight.ndim) if i != axis)).astype(np.float64)
    qmin, qmax = SYMMETRIC[data_type]
    scale = (absmax - (-absmax)) / (np.float64(qmax) - np.float64(qmin))
    return np.where(scale < np.finfo(np.float32).tiny, 1.0, scale).astype(np.float32)


def raised_scale(scale: np.ndarray, x_scale: np.ndarray, bias: np.ndarray, per_channel: bool) -> np.ndarray:
    """The weight scale onnxruntime writes for an int32 bias (``_adjust_weight_scale_for_int32_bias``):
    where ``x_scale * scale`` (float64) is positive and below ``1.0001 * 2 |b| / (2^32 - 2)`` (per
    channel, or the bias's largest magnitude), ``scale`` is raised by that ratio (float64, stored as
    float32)."""
    if per_channel:
        least = (_MARGIN * (2.0 * np.abs(bias).astype(_SCALAR_TYPE))).astype(np.float64) / _INT32_RANGE
    else:
        least = _MARGIN * (2.0 * np.float64(np.abs(bias).max())) / _INT32_RANGE
    wide = scale.astype(np.float64)
    product = np.float64(np.asarray(x_scale).item()) * wide
    with np.errstate(divide="ignore", invalid="ignore"):
        raised = (wide * (least / product)).astype(np.float32)
    return np.where((product < least) & (product > 0.0), raised, scale)


def quantize_weight(weight: np.ndarray, scale: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """onnxruntime's quantization of a weight with zero point 0 (``quantize_nparray``): ``round(w /
    scale)`` in float32, clipped to the type's full range."""
    info = np.iinfo(dtype)
    q = np.round(weight.astype(np.float32) / scale.astype(np.float32))
    return np.clip(q, info.min, info.max).astype(dtype)


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
