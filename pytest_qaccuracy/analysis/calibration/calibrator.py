"""Calibration: stream a dataset through the fp32 model, choose every activation's range, and have
onnxruntime write the QDQ model with those ranges.

Methods (docs/calibration.md): ``minmax`` (global extrema), ``moving-average`` and ``percentile``
(Samsung ONE record-minmax, over per-record extrema), ``kl`` (MXNet/TVM KL divergence) and ``mse``
(least expected squared error over the histogram). ``power2`` rounds every scale up to a power of two.
Histogram methods take two passes over the data: extrema first, then a histogram over fixed bins, so
memory stays flat in the number of records.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
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
from pytest_qaccuracy.analysis.calibration.options import (
    QTYPES,
    CalibrationOptions,
    CalibrationResult,
    written_key,
)
from pytest_qaccuracy.analysis.calibration.quantize import (
    LARGE_MODEL_BYTES,
    quantize_with_ranges,
)
from pytest_qaccuracy.data import BoundDataset, Dataset, bind_dataset, load_dataset
from pytest_qaccuracy.data.binding import Batch, same_shapes
from pytest_qaccuracy.data.progress import task
from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.model.graph import GraphView
from pytest_qaccuracy.model.loading import graph_inputs, load_model
from pytest_qaccuracy.runtime import OrtRunner, RuntimeOptions


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
    nodes_to_exclude: Sequence[str] = (),
) -> CalibrationResult:
    """Run the fp32 model over every record and choose each tensor's range.

    ``nodes_to_exclude`` matters to ``auto`` only, which writes and runs models as they will be
    written (onnxruntime's ``nodes_to_exclude``).

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
        observe = replace(options, optimization="disable", batch_size=1) if calibration.method == "auto" else options
        runner = OrtRunner(proto, [n for n in names if n not in inputs] or names[:0], observe, "calibration")
        if calibration.method == "auto":
            from pytest_qaccuracy.analysis.calibration.auto import auto_ranges

            def passes() -> Iterator[tuple[dict[str, np.ndarray], int]]:
                return _passes(runner, bound, 1, names)

            with _model_file(model, proto) as path:
                chosen, observed, selection, written = auto_ranges(
                    path, proto, bound, names, passes, calibration, options, nodes_to_exclude
                )
            result = _finish(calibration, len(bound), chosen, observed, selection)
            if calibration.power2 or isinstance(model, onnx.ModelProto):
                return result  # power-of-two ranges are not the ones the model was written with
            return replace(result, model=written, model_key=written_key(model, calibration, nodes_to_exclude))
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
    return _finish(calibration, len(bound), chosen, observed)


def _finish(
    calibration: CalibrationOptions,
    records: int,
    chosen: dict[str, tuple[float, float]],
    observed: dict[str, tuple[float, float]],
    selection: dict[str, Any] | None = None,
) -> CalibrationResult:
    if calibration.power2:
        qmin, qmax = QTYPES[calibration.activation_type]
        chosen = {n: R.power2_range(lo, hi, qmin, qmax) for n, (lo, hi) in chosen.items()}
    return CalibrationResult(calibration.method, records, chosen, observed, selection)


@contextlib.contextmanager
def _model_file(model: onnx.ModelProto | str | os.PathLike[str], proto: onnx.ModelProto) -> Iterator[Path]:
    """A path to the model: its own, or a private file of the proto for as long as it is needed."""
    if not isinstance(model, onnx.ModelProto):
        yield Path(model)
        return
    with tempfile.TemporaryDirectory(prefix="qaccuracy-calibrate-") as tmp:
        path = Path(tmp) / "model.onnx"
        onnx.save(proto, str(path), save_as_external_data=proto.ByteSize() > LARGE_MODEL_BYTES)
        yield path


#: bytes of every calibrated tensor of one batch: batches shrink to stay under it, so that a model with
#: hundreds of large tensors (a transformer's attention maps) does not hold gigabytes per batch
BATCH_BYTES = 256 << 20


def _passes(
    runner: OrtRunner, bound: BoundDataset, batch_size: int, names: Sequence[str]
) -> Iterator[tuple[dict[str, np.ndarray], int]]:
    """Per batch: ({tensor: values}, records in the batch); one batch alive at a time.

    The first batch is one record, which measures a record's tensors; later batches hold at most
    ``batch_size`` records and :data:`BATCH_BYTES` of tensors, all of one shape (records of another
    size start a batch of their own, as in :meth:`BoundDataset.iter_batches`).
    """
    wanted = set(names)
    size, start, pending = 1, 0, []

    def run(records: list[dict[str, np.ndarray]]) -> tuple[dict[str, np.ndarray], int]:
        nonlocal size, start
        batch = Batch(start, records)
        values = runner.run(batch) if runner.tensors else {}
        values.update({k: v for k, v in batch.stacked().items() if k in wanted})
        values = {n: values[n] for n in names if values[n].dtype.kind == "f"}
        start += len(batch)
        per_record = sum(v.nbytes for v in values.values()) / len(batch)
        size = max(1, min(batch_size, int(BATCH_BYTES // max(per_record, 1.0))))
        return values, len(batch)

    for feeds in bound.iter_records():
        if pending and not same_shapes(pending[0], feeds):
            yield run(pending)
            pending = []
        pending.append(feeds)
        if len(pending) >= size:
            yield run(pending)
            pending = []
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
    result = compute_ranges(model, data, calibration, options, nodes_to_exclude=nodes_to_exclude or ())
    quantize_with_ranges(model, out, result, calibration, nodes_to_exclude)
    return result
