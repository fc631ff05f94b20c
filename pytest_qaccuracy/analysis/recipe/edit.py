"""A recipe's global choices estimated by editing a QDQ model onnxruntime wrote, not by quantizing again.

``quantize_static`` costs seconds on a large graph (most of it in onnxruntime's graph rewriting);
the search's global phase tries a dozen calibration methods and weight forms. Each of them changes
only the numbers of the base recipe's model, not its graph:

- **activation ranges** (the calibration method, the activation type): every activation scale and
  zero point whose value onnxruntime computed from the base ranges (checked: ``compute_scale_zp``
  after onnxruntime's range rules, as :mod:`~pytest_qaccuracy.analysis.calibration.qdq_params`
  does) is computed again from the new ranges; the others keep their scale and move their zero point
  to the new type;
- **weights** (per-channel, 7-bit, the weight type): every 8-bit weight is quantized again from the
  fp32 model's value with onnxruntime's rules (symmetric for int8, the type's reduced range, one
  scale per output channel of Conv, ConvTranspose, Gemm and MatMul weights);
- **biases** (int32, scale = input scale x weight scale): quantized again whenever either changes.

The edited model keeps onnxruntime's Q/DQ structure, so onnxruntime runs it with the same integer
kernels as the model ``quantize_static`` would write. It is an *estimate*: range rules this module
does not know (shared parameters, overrides) keep their base values. The search ranks with it and
verifies its answer with ``quantize_static`` (docs/recipe.md).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from pytest_qaccuracy.analysis.calibration.qdq_params import ACTIVATION_DTYPES, adjusted_ranges, scale_zero_point
from pytest_qaccuracy.analysis.recipe.space import OTHER_TYPE, Recipe
from pytest_qaccuracy.model.graph import GraphView

#: The numpy type of each 8-bit weight type.
WEIGHT_DTYPES = {"uint8": np.uint8, "int8": np.int8}
#: Ops whose input 1 onnxruntime quantizes as a weight (the weight type, per channel); a constant
#: input of any other op is quantized as an activation (the activation type, asymmetric, per tensor).
WEIGHT_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
_ONNX_TYPES = {np.dtype(np.uint8): onnx.TensorProto.UINT8, np.dtype(np.int8): onnx.TensorProto.INT8}


@dataclass(frozen=True, slots=True)
class _Weight:
    """An 8-bit weight DequantizeLinear: its initializers, the fp32 value and its channel axis."""

    node: int
    data: str
    scale: str
    zero: str
    value: np.ndarray
    axis: int | None  # per-channel axis of its consumer (None: per-tensor only)
    slot: bool  # a weight input (Conv, Gemm, MatMul...); other constants are quantized as activations
    users: frozenset[str] = frozenset()  # the names of the nodes that read it (a recipe's flipped nodes)


@dataclass(frozen=True, slots=True)
class _Bias:
    """An int32 bias DequantizeLinear and the scales it is the product of."""

    node: int
    data: str
    scale: str
    zero: str
    value: np.ndarray
    input_scale: str
    weight: str  # the weight's DequantizeLinear output


def weight_axis(op_type: str, position: int, rank: int, attributes: Mapping[str, int]) -> int | None:
    """The per-channel axis onnxruntime's QDQ quantizer uses for a weight at ``position`` of ``op_type``."""
    if position != 1:
        return None
    if op_type == "Conv":
        return 0
    if op_type == "ConvTranspose":
        return 1
    if op_type == "Gemm":
        return 0 if attributes.get("transB", 0) else 1
    if op_type == "MatMul":
        return rank - 1
    return None


def quantize_weight(
    value: np.ndarray,
    weight_type: str,
    per_channel_axis: int | None,
    reduce_range: bool,
    symmetric: bool | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """onnxruntime's weight quantization (``quantize_data`` per tensor or per channel): symmetric for
    int8 and per channel, asymmetric for uint8 per tensor, the reduced range with ``reduce_range``;
    (quantized, scale, zero point)."""
    from onnxruntime.quantization.quant_utils import get_qmin_qmax_for_qType

    dtype = WEIGHT_DTYPES[weight_type]
    if symmetric is None:  # onnxruntime 1.32: int8 weights and per-channel weights are symmetric
        symmetric = weight_type == "int8" or per_channel_axis is not None
    qmin, qmax = (float(v) for v in get_qmin_qmax_for_qType(_ONNX_TYPES[np.dtype(dtype)], reduce_range, symmetric))
    data = value.astype(np.float32)
    if per_channel_axis is None:
        flat = data.reshape(1, -1)
    else:
        flat = np.moveaxis(data, per_channel_axis, 0).reshape(data.shape[per_channel_axis], -1)
    rmin = np.minimum(flat.min(axis=1), 0.0).astype(np.float64)
    rmax = np.maximum(flat.max(axis=1), 0.0).astype(np.float64)
    if symmetric:
        absmax = np.maximum(np.abs(rmin), np.abs(rmax))
        rmin, rmax = -absmax, absmax
    scale = (rmax - rmin) / (qmax - qmin)
    tiny = scale < np.finfo(np.float32).tiny
    scale32 = np.where(tiny, 1.0, scale).astype(np.float32)
    if symmetric:
        zero = np.full(scale.shape, np.round((qmin + qmax) / 2.0))
    else:
        zero = np.round(qmin - rmin / np.where(tiny, 1.0, scale))
    zero = np.where(tiny, 0.0, zero)
    shape = [1] * data.ndim
    if per_channel_axis is not None:
        shape[per_channel_axis] = -1
    s, z = scale32.reshape(shape), zero.reshape(shape)
    limits = np.iinfo(dtype)  # onnxruntime clips to the type, not to the (reduced) range: 7-bit uint8 reaches 128
    quantized = np.clip(np.round(data / s) + z, limits.min, limits.max).astype(dtype)
    if per_channel_axis is None:
        return quantized, np.float32(scale32[0]), dtype(zero[0])
    return quantized, scale32, zero.astype(dtype)


class GlobalEdits:
    """Writes, for any global choices, the base recipe's QDQ model with its numbers changed.

    Args:
        base_model: the model ``quantize_static`` wrote for ``base`` (global choices only).
        base: its recipe.
        fp32: the fp32 model (weights, biases, range rules).
        base_ranges: the ranges the base model was written with.
    """

    def __init__(
        self,
        base_model: onnx.ModelProto,
        base: Recipe,
        fp32: onnx.ModelProto,
        base_ranges: Mapping[str, tuple[float, float]],
    ) -> None:
        self.base_model, self.base, self.fp32 = base_model, base, fp32
        view, fview = GraphView(base_model), GraphView(fp32)
        inits = view.initializers
        adjusted = adjusted_ranges(fp32, base_ranges)
        self.params: dict[str, tuple[str, str]] = {}  # tensor -> (scale, zero point) computed from its range
        self.zero_points: set[str] = set()  # every activation zero point
        for node in view.nodes:
            if node.op_type != "QuantizeLinear" or len(node.input) < 3 or node.input[0] in inits:
                continue
            scale, zero = node.input[1], node.input[2]
            if zero not in inits or scale not in inits:
                continue
            self.zero_points.add(zero)
            tensor = scale.removesuffix("_scale")
            if tensor in self.params or tensor not in adjusted:
                continue
            have_s, have_z = numpy_helper.to_array(inits[scale]), numpy_helper.to_array(inits[zero])
            want_s, want_z = scale_zero_point(*adjusted[tensor], base.activation_type)
            if have_s.size == 1 and have_s.item() == want_s and have_z.item() == want_z:
                self.params[tensor] = (scale, zero)
        self.weights: list[_Weight] = []
        self.biases: list[_Bias] = []
        dq_scale = {n.output[0]: n.input[1] for n in view.nodes if n.op_type == "DequantizeLinear"}
        for i, node in enumerate(view.nodes):
            if node.op_type != "DequantizeLinear" or node.input[0] not in inits or len(node.input) < 3:
                continue
            data = inits[node.input[0]]
            names = (node.output[0], node.input[0].removesuffix("_quantized"))
            value = next((fview.constant(n) for n in names if fview.is_constant(n)), None)
            if value is None or tuple(value.shape) != tuple(data.dims):
                continue
            consumers = view.consumers.get(node.output[0], [])
            if data.data_type == onnx.TensorProto.INT32:
                for _, consumer, position in consumers[:1]:
                    if position == 2:
                        self.biases.append(
                            _Bias(
                                i,
                                node.input[0],
                                node.input[1],
                                node.input[2],
                                value,
                                dq_scale.get(consumer.input[0], ""),
                                consumer.input[1],
                            )
                        )
            elif data.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8):
                slots = {(c.op_type in WEIGHT_OPS and position == 1) for _, c, position in consumers}
                axes = {
                    weight_axis(c.op_type, position, value.ndim, {a.name: a.i for a in c.attribute})
                    for _, c, position in consumers
                }
                axis = next(iter(axes)) if len(axes) == 1 else None
                slot = slots == {True}
                users = frozenset(c.name for _, c, _ in consumers)
                self.weights.append(_Weight(i, node.input[0], node.input[1], node.input[2], value, axis, slot, users))

    def model(self, recipe: Recipe, ranges: Mapping[str, tuple[float, float]]) -> onnx.ModelProto:
        """The base model with ``recipe``'s global choices and per-node weight moves (granularity, 7-bit,
        type; its node precisions are ignored)."""
        model = copy.deepcopy(self.base_model)
        inits = {t.name: t for t in model.graph.initializer}
        values: dict[str, np.ndarray] = {}
        axes: dict[int, int | None] = {}
        base = self.base
        if (recipe.method, recipe.activation_type) != (base.method, base.activation_type):
            adjusted = adjusted_ranges(self.fp32, ranges)
            shift = _zero_shift(base.activation_type, recipe.activation_type)
            for zero in self.zero_points:
                values[zero] = (numpy_helper.to_array(inits[zero]).astype(np.int64) + shift).astype(
                    ACTIVATION_DTYPES[recipe.activation_type]
                )
            for tensor, (scale, zero) in self.params.items():
                if tensor in adjusted:
                    s, z = scale_zero_point(*adjusted[tensor], recipe.activation_type)
                    values[scale], values[zero] = np.asarray(s), np.asarray(z)
        for w in self.weights:
            form = _weight_form(recipe, w.users)
            if w.slot and form != _weight_form(base, w.users):
                per_channel, reduce_range, weight_type = form
                axis = w.axis if per_channel else None
                values[w.data], values[w.scale], values[w.zero] = quantize_weight(
                    w.value, weight_type, axis, reduce_range
                )
                axes[w.node] = axis
            elif not w.slot and (recipe.activation_type, recipe.reduce_range) != (
                base.activation_type,
                base.reduce_range,
            ):
                values[w.data], values[w.scale], values[w.zero] = quantize_weight(
                    w.value, recipe.activation_type, None, recipe.reduce_range, symmetric=False
                )
        if values:
            weight_scale = {model.graph.node[w.node].output[0]: w.scale for w in self.weights}
            for b in self.biases:
                if b.input_scale not in inits or b.weight not in weight_scale:
                    continue
                s_in = values.get(b.input_scale, numpy_helper.to_array(inits[b.input_scale]))
                s_w = values.get(weight_scale[b.weight], numpy_helper.to_array(inits[weight_scale[b.weight]]))
                scale = (np.asarray(s_in, np.float32) * np.asarray(s_w, np.float32)).reshape(-1)
                bias = b.value.astype(np.float64).reshape(-1)
                safe = np.where(scale == 0, np.float32(1.0), scale)
                q = np.clip(np.round(bias / safe.astype(np.float64)), -(2**31), 2**31 - 1).astype(np.int32)
                values[b.data] = q.reshape(b.value.shape)
                values[b.scale] = safe.astype(np.float32)  # shape (1,) per tensor, as onnxruntime writes it
                per_channel = safe.size > 1
                values[b.zero] = np.zeros(safe.shape, np.int32) if per_channel else np.int32(0)
                axes[b.node] = 0 if per_channel else None
        for name, value in values.items():
            inits[name].CopyFrom(numpy_helper.from_array(np.asarray(value), name))
        for index, axis in axes.items():
            node = model.graph.node[index]
            kept = [a for a in node.attribute if a.name != "axis"]
            del node.attribute[:]
            node.attribute.extend(kept)
            if axis is not None:
                node.attribute.append(onnx.helper.make_attribute("axis", axis))
        if any(axis is not None for axis in axes.values()):
            model = _at_least_opset13(model)
        return model


def _weight_form(recipe: Recipe, users: frozenset[str]) -> tuple[bool, bool, str]:
    """A weight's (per channel, reduce_range, type) under ``recipe``: the global choices, each turned
    the other way when a node reading it has that per-node move."""
    return (
        recipe.per_channel != bool(recipe.flipped & users),
        recipe.reduce_range != bool(recipe.narrowed & users),
        OTHER_TYPE[recipe.weight_type] if recipe.retyped & users else recipe.weight_type,
    )


def _zero_shift(old: str, new: str) -> int:
    """What a zero point gains moving from one 8-bit activation type to the other (scale unchanged)."""
    return int(np.iinfo(ACTIVATION_DTYPES[new]).min) - int(np.iinfo(ACTIVATION_DTYPES[old]).min)


def _at_least_opset13(model: onnx.ModelProto) -> onnx.ModelProto:
    """Per-channel DequantizeLinear needs opset 13 (``axis``), as onnxruntime converts for it."""
    version = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    if version >= 13:
        return model
    from onnx import version_converter

    return version_converter.convert_version(model, 13)
