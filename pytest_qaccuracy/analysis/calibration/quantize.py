"""onnxruntime's quantizer writes the QDQ model with ranges we chose: handed over as its calibration
cache (or as ``TensorQuantOverrides``), power-of-two weight scales, the opset per-channel weights need.
"""

from __future__ import annotations

import inspect
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from pytest_qaccuracy.analysis.calibration import ranges as R
from pytest_qaccuracy.analysis.calibration.options import (
    QTYPES,
    WEIGHT_SLOTS,
    CalibrationOptions,
    CalibrationResult,
    written_key,
)
from pytest_qaccuracy.atomic import atomic_write
from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.model.graph import GraphView
from pytest_qaccuracy.model.loading import graph_inputs, load_model

log = logging.getLogger(__name__)


def _power2_weight_overrides(
    model: onnx.ModelProto, c: CalibrationOptions, quant_type: Any
) -> dict[str, list[dict[str, Any]]]:
    """Explicit power-of-two scales for every weight of a Conv/Gemm/MatMul (per channel for Conv).

    ``quant_type`` (the weight type) is stated too: onnxruntime 1.18 quantizes a MatMul's constant
    input with the *activation* type, and would store the int8 zero point and scale as uint8.
    """
    view = GraphView(model)
    qmin, qmax = QTYPES[c.weight_type]
    dtype = np.int8 if c.weight_type == "int8" else np.uint8
    overrides = {}
    for node in view.nodes:
        if node.op_type not in WEIGHT_SLOTS or len(node.input) < 2:
            continue
        w = view.constant(node.input[1])
        if w is None or w.dtype.kind != "f" or node.input[1] in overrides:
            continue
        axis = WEIGHT_SLOTS[node.op_type]
        channels = (
            [np.take(w, i, axis=axis) for i in range(w.shape[axis])] if c.per_channel and axis is not None else [w]
        )
        entries = []
        for values in channels:
            if c.weight_type == "int8":  # symmetric, onnxruntime's default for int8 weights: [-127, 127]
                scale, zero = R.power2_scale(float(np.abs(values).max(initial=0.0)), 127), 0
            else:
                lo, hi = R.power2_range(float(values.min()), float(values.max()), qmin, qmax)
                scale = (hi - lo) / (qmax - qmin) or 1.0
                zero = round(qmin - lo / scale)
            entries.append({"scale": np.float32(scale), "zero_point": dtype(zero)})
        entries[0]["quant_type"] = quant_type
        if len(entries) > 1:
            entries[0]["axis"] = axis
        overrides[node.input[1]] = entries
    return overrides


#: models above this size are handed to onnxruntime's quantizer with their tensors in a side file
#: (a protobuf message cannot exceed 2 GiB)
LARGE_MODEL_BYTES = 1 << 30

#: DequantizeLinear takes ``axis`` (per-channel weights) from this opset on.
PER_CHANNEL_OPSET = 13


def opset_note(model: onnx.ModelProto, calibration: CalibrationOptions) -> str | None:
    """What :func:`quantize_with_ranges` will do to the opset, in one line (None: nothing)."""
    opset = GraphView(model).opset
    if not calibration.per_channel or opset >= PER_CHANNEL_OPSET:
        return None
    return (
        f"per-channel weights need DequantizeLinear's axis (opset {PER_CHANNEL_OPSET}): "
        f"the model is converted from opset {opset} to {PER_CHANNEL_OPSET} before quantization"
    )


def with_opset_for(
    model: onnx.ModelProto, calibration: CalibrationOptions, label: str = "model"
) -> tuple[onnx.ModelProto, bool]:
    """The model as the quantizer needs it: opset 13 for per-channel weights (onnx's version
    converter), else unchanged; and whether it was converted. InputError in one line if it cannot be."""
    if opset_note(model, calibration) is None:
        return model, False
    from onnx import version_converter

    opset = GraphView(model).opset
    try:
        converted = version_converter.convert_version(model, PER_CHANNEL_OPSET)
        onnx.checker.check_model(converted)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise InputError(
            f"{label}: per-channel weights need opset {PER_CHANNEL_OPSET} (DequantizeLinear axis), and onnx "
            f"cannot convert this opset {opset} model ({first}); convert it, or quantize per tensor"
        ) from None
    log.info("%s", opset_note(model, calibration))
    return converted, True


def quantize_with_ranges(
    model: str | os.PathLike[str],
    out: str | os.PathLike[str],
    result: CalibrationResult,
    calibration: CalibrationOptions | None = None,
    nodes_to_exclude: Sequence[str] | None = None,
    via: str = "auto",
) -> Path:
    """Have onnxruntime's ``quantize_static`` write a QDQ model with our ranges.

    ``via="cache"`` hands the ranges over as onnxruntime's calibration cache (no calibration run);
    ``via="overrides"`` as ``TensorQuantOverrides`` rmin/rmax, with onnxruntime calibrating one
    all-zero record whose ranges are all overridden (for releases without ``calibration_cache_path``);
    ``auto`` takes the cache when onnxruntime has it.
    """
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    calibration = calibration or CalibrationOptions()
    if result.model is not None and result.model_key == written_key(model, calibration, nodes_to_exclude):
        payload = result.model  # auto wrote this very model while choosing
        return atomic_write(Path(out), lambda handle: handle.write(payload), mode="wb")
    has_cache = "calibration_cache_path" in inspect.signature(quantize_static).parameters
    if via not in ("auto", "cache", "overrides"):
        raise InputError(f"unknown way to hand ranges to onnxruntime {via!r}; expected auto, cache or overrides")
    if via == "cache" and not has_cache:
        raise InputError("this onnxruntime's quantize_static takes no calibration_cache_path; use via='overrides'")
    use_cache = via == "cache" or (via == "auto" and has_cache)
    proto, upgraded = with_opset_for(load_model(model), calibration, str(model))
    extra: dict[str, Any] = {"TensorQuantOverrides": {}}
    qtypes = {"uint8": QuantType.QUInt8, "int8": QuantType.QInt8}
    if calibration.power2:
        weights = _power2_weight_overrides(proto, calibration, qtypes[calibration.weight_type])
        extra["TensorQuantOverrides"].update(weights)
        extra["QDQDisableWeightAdjustForInt32Bias"] = True
    kwargs: dict[str, Any] = {
        "quant_format": QuantFormat.QDQ,
        "per_channel": calibration.per_channel,
        "activation_type": qtypes[calibration.activation_type],
        "weight_type": qtypes[calibration.weight_type],
        "nodes_to_exclude": list(nodes_to_exclude or []),
        "calibrate_method": CalibrationMethod.MinMax,
        "extra_options": extra,
    }
    out = Path(out)
    with tempfile.TemporaryDirectory(prefix="qaccuracy-calibrate-") as tmp:
        if use_cache:
            from onnxruntime.quantization.calibrate import TensorData, TensorsData, save_tensors_data

            data = {
                n: TensorData(lowest=np.float32(lo), highest=np.float32(hi)) for n, (lo, hi) in result.ranges.items()
            }
            cache = Path(tmp) / "ranges.json"
            save_tensors_data(TensorsData(CalibrationMethod.MinMax, data), cache)
            kwargs.update(calibration_data_reader=None, calibration_cache_path=str(cache))
        else:
            extra["TensorQuantOverrides"].update(_range_overrides(proto, result))
            kwargs["calibration_data_reader"] = _ZeroRecord(proto)
        written = Path(tmp) / out.name
        # onnxruntime's quantizer reads a file and writes `<model>-inferred.onnx` beside it: hand it a
        # private copy (the converted model, if upgraded), so that two calibrations of one model at
        # once (pytest-xdist workers) never share that file
        name = f"opset{PER_CHANNEL_OPSET}.{Path(model).name}" if upgraded else Path(model).name
        private = Path(tmp) / name
        onnx.save(proto, str(private), save_as_external_data=proto.ByteSize() > LARGE_MODEL_BYTES)
        root = logging.getLogger()
        level = root.level
        root.setLevel(max(level, logging.ERROR))  # onnxruntime's "consider pre-processing" advice, per call
        try:
            quantize_static(str(private), str(written), **kwargs)
        except (ValueError, KeyError, RuntimeError) as exc:
            raise InputError(f"{model}: onnxruntime could not quantize the model ({exc})") from None
        finally:
            root.setLevel(level)
        payload = written.read_bytes()
    return atomic_write(out, lambda handle: handle.write(payload), mode="wb")


def _range_overrides(model: onnx.ModelProto, result: CalibrationResult) -> dict[str, list[dict[str, Any]]]:
    """rmin/rmax overrides of every calibrated activation, with onnxruntime's own range rules applied
    first (``qdq_params.adjusted_ranges``; overrides win over those rules, so they must already agree)."""
    from pytest_qaccuracy.analysis.calibration.qdq_params import adjusted_ranges

    initializers = GraphView(model).initializers
    return {
        name: [{"rmin": np.float32(lo), "rmax": np.float32(hi)}]
        for name, (lo, hi) in adjusted_ranges(model, result.ranges).items()
        if name not in initializers
    }


class _ZeroRecord:
    """A CalibrationDataReader of one all-zero record (every range it yields is overridden)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        feeds = {}
        for spec in graph_inputs(model):
            shape = [d if isinstance(d, int) and d > 0 else 1 for d in spec.shape]
            feeds[spec.name] = np.zeros(shape, dtype=np.dtype(spec.dtype))
        self._items = iter([feeds])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._items, None)
