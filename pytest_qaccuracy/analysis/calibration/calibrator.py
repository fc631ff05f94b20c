"""Calibration: stream a dataset through the fp32 model, choose every activation's range, and have
onnxruntime write the QDQ model with those ranges.

Methods (docs/calibration.md): ``minmax`` (global extrema), ``moving-average`` and ``percentile``
(Samsung ONE record-minmax, over per-record extrema), ``kl`` (MXNet/TVM KL divergence) and ``mse``
(least expected squared error over the histogram). ``power2`` rounds every scale up to a power of two.
Histogram methods take two passes over the data: extrema first, then a histogram over fixed bins, so
memory stays flat in the number of records.
"""

from __future__ import annotations

import inspect
import logging
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from pytest_qaccuracy.analysis.calibration import ranges as R
from pytest_qaccuracy.analysis.calibration.observers import (
    ExtremaObserver,
    HistogramObserver,
    MinMaxObserver,
    record_extrema,
)
from pytest_qaccuracy.atomic import atomic_write
from pytest_qaccuracy.data import BoundDataset, Dataset, bind_dataset, load_dataset
from pytest_qaccuracy.data.binding import Batch
from pytest_qaccuracy.data.progress import task
from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.model.graph import GraphView
from pytest_qaccuracy.model.loading import graph_inputs, load_model
from pytest_qaccuracy.runtime import OrtRunner, RuntimeOptions

log = logging.getLogger(__name__)

METHODS = ("minmax", "moving-average", "percentile", "kl", "mse")
QTYPES = {"uint8": (0, 255), "int8": (-128, 127)}
#: Weight inputs quantized per channel, and their channel axis (onnxruntime's QDQ defaults).
WEIGHT_SLOTS = {"Conv": 0, "ConvTranspose": 1, "Gemm": None, "MatMul": None}


@dataclass(frozen=True, slots=True)
class CalibrationOptions:
    """How ranges are chosen and how the model is quantized.

    Attributes:
        method: one of ``METHODS``.
        activation_type, weight_type: ``uint8`` or ``int8``.
        per_channel: quantize weights per output channel.
        power2: round every scale up to a power of two (activations through their range, weights
            through explicit scale overrides).
        percentiles: ONE's (min, max) percentiles of the per-record minima / maxima.
        moving_average: ONE's (batch, constant).
        bins: histogram bins (odd); default 8001 for ``kl`` (TVM), 2047 for ``mse``.
        quantized_bins: KL's quantized bins (255).
    """

    method: str = "minmax"
    activation_type: str = "uint8"
    weight_type: str = "int8"
    per_channel: bool = False
    power2: bool = False
    percentiles: tuple[float, float] = (1.0, 99.0)
    moving_average: tuple[int, float] = (16, 0.1)
    bins: int | None = None
    quantized_bins: int = R.KL_QUANTIZED_BINS

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise InputError(f"unknown calibration method {self.method!r}; expected one of {', '.join(METHODS)}")
        for what, value in (("activation", self.activation_type), ("weight", self.weight_type)):
            if value not in QTYPES:
                raise InputError(f"{what} type must be uint8 or int8, got {value!r}")
        lo, hi = self.percentiles
        if not 0 <= lo < hi <= 100:
            raise InputError(f"percentiles must satisfy 0 <= min < max <= 100, got {self.percentiles}")
        batch, constant = self.moving_average
        if batch < 1 or not 0 <= constant <= 1:
            raise InputError(f"moving average needs batch >= 1 and 0 <= constant <= 1, got {self.moving_average}")
        if self.bins is not None and (self.bins < 3 or self.bins % 2 == 0):
            raise InputError(f"histogram bins must be odd and >= 3, got {self.bins}")

    @property
    def histogram_bins(self) -> int:
        return self.bins or (R.KL_BINS if self.method == "kl" else 2047)


@dataclass(frozen=True, slots=True)
class CalibrationResult:
    """The chosen range of every calibrated tensor, and the observed extrema behind it."""

    method: str
    records: int
    ranges: dict[str, tuple[float, float]]
    observed: dict[str, tuple[float, float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "records": self.records,
            "ranges": {k: [float(lo), float(hi)] for k, (lo, hi) in self.ranges.items()},
            "observed": {k: [float(lo), float(hi)] for k, (lo, hi) in self.observed.items()},
        }


def calibration_tensors(model: onnx.ModelProto) -> list[str]:
    """Graph inputs and node outputs of float type (constants excluded), in graph order."""
    inferred = onnx.shape_inference.infer_shapes(model)
    types = GraphView(inferred).elem_types
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE}
    view = GraphView(model)
    names = list(view.input_names) + view.activations()
    return [n for n in dict.fromkeys(names) if types.get(n, onnx.TensorProto.FLOAT) in floats]


def compute_ranges(
    model: onnx.ModelProto | str | os.PathLike[str],
    data: BoundDataset | Dataset | str | os.PathLike[str],
    calibration: CalibrationOptions | None = None,
    options: RuntimeOptions | None = None,
    tensors: Sequence[str] | None = None,
) -> CalibrationResult:
    """Run the fp32 model over every record and choose each tensor's range.

    Raises:
        InputError: bad data, options, or a tensor that was never finite.
    """
    calibration = calibration or CalibrationOptions()
    options = options or RuntimeOptions()
    proto = model if isinstance(model, onnx.ModelProto) else load_model(model)
    own = not isinstance(data, BoundDataset | Dataset)
    dataset = data if isinstance(data, BoundDataset | Dataset) else load_dataset(data)
    bound = dataset if isinstance(dataset, BoundDataset) else bind_dataset(dataset, graph_inputs(proto))
    try:
        names = list(tensors) if tensors is not None else calibration_tensors(proto)
        inputs = {spec.name for spec in bound.inputs}
        runner = OrtRunner(proto, [n for n in names if n not in inputs] or names[:0], options, "calibration")
        extrema = calibration.method in ("moving-average", "percentile")
        minmax = {n: MinMaxObserver() for n in names}
        per_record = {n: ExtremaObserver() for n in names} if extrema else {}
        histogram = calibration.method in ("kl", "mse")  # a second pass over the records
        with task("calibrate", len(bound) * (2 if histogram else 1)) as advance:
            for values, count in _passes(runner, bound, options.batch_size, names):
                for name, value in values.items():
                    mins, maxs = record_extrema(value, count)
                    minmax[name].update(mins, maxs)
                    if extrema:
                        per_record[name].update(mins, maxs)
                advance(count)
            unseen = [n for n, o in minmax.items() if not o.seen]
            if unseen:
                raise InputError(f"tensor(s) {unseen[:5]} held no finite value on any record; cannot calibrate them")
            observed = {n: (o.min, o.max) for n, o in minmax.items()}
            if histogram:
                chosen = _histogram_ranges(runner, bound, options.batch_size, names, observed, calibration)
            else:
                chosen = {n: _extrema_range(observed[n], per_record.get(n), calibration) for n in names}
    finally:
        if own:
            dataset.close()
    if calibration.power2:
        qmin, qmax = QTYPES[calibration.activation_type]
        chosen = {n: R.power2_range(lo, hi, qmin, qmax) for n, (lo, hi) in chosen.items()}
    return CalibrationResult(calibration.method, len(bound), chosen, observed)


#: bytes of every calibrated tensor of one batch: batches shrink to stay under it, so that a model with
#: hundreds of large tensors (a transformer's attention maps) does not hold gigabytes per batch
BATCH_BYTES = 256 << 20


def _passes(
    runner: OrtRunner, bound: BoundDataset, batch_size: int, names: Sequence[str]
) -> Iterator[tuple[dict[str, np.ndarray], int]]:
    """Per batch: ({tensor: values}, records in the batch); one batch alive at a time.

    The first batch is one record, which measures a record's tensors; later batches hold at most
    ``batch_size`` records and :data:`BATCH_BYTES` of tensors.
    """
    wanted = set(names)
    size, start, pending = 1, 0, []

    def run(records: list[dict[str, np.ndarray]]) -> tuple[dict[str, np.ndarray], int]:
        batch = Batch(start, records)
        values = runner.run(batch) if runner.tensors else {}
        values.update({k: v for k, v in batch.stacked().items() if k in wanted})
        return {n: values[n] for n in names if values[n].dtype.kind == "f"}, len(batch)

    for feeds in bound.iter_records():
        pending.append(feeds)
        if len(pending) == size:
            values, count = run(pending)
            start, pending = start + count, []
            per_record = sum(v.nbytes for v in values.values()) / count
            size = max(1, min(batch_size, int(BATCH_BYTES // max(per_record, 1.0))))
            yield values, count
            del values
    if pending:
        yield run(pending)


def _extrema_range(
    observed: tuple[float, float], per_record: ExtremaObserver | None, c: CalibrationOptions
) -> tuple[float, float]:
    if c.method == "minmax":
        return observed
    if c.method == "percentile":
        return R.one_percentile(per_record.mins, c.percentiles[0]), R.one_percentile(per_record.maxs, c.percentiles[1])
    batch, constant = c.moving_average
    return (
        R.moving_average(per_record.mins, True, batch, constant),
        R.moving_average(per_record.maxs, False, batch, constant),
    )


def _histogram_ranges(
    runner: OrtRunner,
    bound: BoundDataset,
    batch_size: int,
    names: Sequence[str],
    observed: dict[str, tuple[float, float]],
    c: CalibrationOptions,
) -> dict[str, tuple[float, float]]:
    hists = {n: HistogramObserver(max(abs(observed[n][0]), abs(observed[n][1])), c.histogram_bins) for n in names}
    qmin, qmax = QTYPES[c.activation_type]

    def choose(name: str) -> tuple[float, float]:
        hist, (lo, hi) = hists[name], observed[name]
        if c.method == "kl":
            t, _ = R.kl_threshold(hist.counts, hist.edges, c.quantized_bins)
            return max(lo, -t), min(hi, t)
        return R.mse_range(hist.counts, hist.edges, lo, hi, qmin, qmax)

    # numpy releases the GIL in its loops: tensors are folded, then searched, side by side
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool, task("calibrate", len(bound)) as advance:
        for values, count in _passes(runner, bound, batch_size, names):
            list(pool.map(lambda item: hists[item[0]].update(item[1]), values.items()))
            del values
            advance(count)
        return dict(zip(hists, pool.map(choose, hists), strict=True))


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
    *,
    reduce_range: bool = False,
    overrides: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> Path:
    """Have onnxruntime's ``quantize_static`` write a QDQ model with our ranges.

    ``reduce_range`` is onnxruntime's 7-bit weights; ``overrides`` are extra ``TensorQuantOverrides``
    (e.g. ``{"conv1_out": [{"quant_type": QuantType.QUInt16}]}`` for 16-bit activations), merged
    entry by entry with those this function writes itself.

    ``via="cache"`` hands the ranges over as onnxruntime's calibration cache (no calibration run);
    ``via="overrides"`` as ``TensorQuantOverrides`` rmin/rmax, with onnxruntime calibrating one
    all-zero record whose ranges are all overridden (for releases without ``calibration_cache_path``);
    ``auto`` takes the cache when onnxruntime has it.
    """
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    calibration = calibration or CalibrationOptions()
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
        "reduce_range": reduce_range,
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
        for name, entries in (overrides or {}).items():
            mine = extra["TensorQuantOverrides"].get(name, [{}])
            extra["TensorQuantOverrides"][name] = [{**mine[0], **dict(entries[0])}, *map(dict, entries[1:])]
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
    first (``adjust_tensor_ranges``): a Relu/Clip's single-consumer input takes the output's range,
    and a Softmax output is [0, 1] (overrides win over those rules, so they must already agree)."""
    view = GraphView(model)
    ranges = dict(result.ranges)
    for node in view.nodes:
        if node.op_type in ("Relu", "Clip") and len(view.consumers.get(node.input[0], [])) == 1:
            if node.output[0] in ranges:
                ranges[node.input[0]] = ranges[node.output[0]]
        elif node.op_type == "Softmax":
            ranges[node.output[0]] = (0.0, 1.0)
    return {
        name: [{"rmin": np.float32(lo), "rmax": np.float32(hi)}]
        for name, (lo, hi) in ranges.items()
        if name not in view.initializers
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


def calibrate(
    model: str | os.PathLike[str],
    data: BoundDataset | Dataset | str | os.PathLike[str],
    out: str | os.PathLike[str],
    calibration: CalibrationOptions | None = None,
    options: RuntimeOptions | None = None,
    nodes_to_exclude: Sequence[str] | None = None,
) -> CalibrationResult:
    """Compute ranges with ``calibration.method`` and write the QDQ model to ``out``."""
    calibration = calibration or CalibrationOptions()
    result = compute_ranges(model, data, calibration, options)
    quantize_with_ranges(model, out, result, calibration, nodes_to_exclude)
    return result
