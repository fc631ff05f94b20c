"""A QDQ model whose activation ranges can be changed without quantizing it again.

``auto`` calibration compares whole-model choices of ranges. Writing a model with onnxruntime's
quantizer for each choice costs seconds; instead the model is written once, and the scales and zero
points of its activations become graph inputs of one onnxruntime session, fed for each choice.
The values fed are onnxruntime's own (``compute_scale_zp`` on the range after its range rules, as
``QDQQuantizer.calc_quant_params`` does), checked against the written model: a parameter whose
computed value differs from what onnxruntime wrote stays a constant and is not chosen.
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
        adjusted = adjusted_ranges(fp32, base)
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
            have_s, have_z = numpy_helper.to_array(inits[scale]), numpy_helper.to_array(inits[zero])
            want_s, want_z = scale_zero_point(*adjusted[tensor], activation_type)
            if (
                have_s.size == 1
                and have_s.item() == want_s
                and have_z.dtype == want_z.dtype
                and have_z.item() == want_z
            ):
                self._params[tensor] = (scale, zero, tuple(have_s.shape))
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

    def feeds(self, ranges: Mapping[str, tuple[float, float]]) -> dict[str, np.ndarray]:
        """The inputs that quantize every parameter's tensor with ``ranges`` (after onnxruntime's rules)."""
        adjusted = adjusted_ranges(self._fp32, ranges)
        feeds = {}
        for tensor, (scale, zero, shape) in self._params.items():
            s, z = scale_zero_point(*adjusted[tensor], self._type)
            feeds[scale] = np.full(shape, s, dtype=np.float32)
            feeds[zero] = np.full(shape, z, dtype=z.dtype)
        return feeds
