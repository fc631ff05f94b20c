"""Layer trackers fed by per-record statistics computed inside onnxruntime (runtime/reduction_graph).

Which trackers qualify: layers (not outputs: those keep their worst records and output measures on
whole tensors) whose metrics are all built-in (they read only RecordStats fields, ``steps`` and
``saturated``), whose fp32 tensor is float32 with a static record shape of rank at least 2, and
whose quantized tensor is float32, or integer with its quantization parameters. The rest run as
before, on whole tensors.

The statistics equal the whole-tensor ones up to summation order: sums over a record are float32
partial sums over blocks of at most 1024 elements added in float64 (as the whole-tensor path adds
its BLAS blocks of 4096), so each sum agrees to a relative 1e-5 or better; cosine's sum q^2 comes
from sum f(f - q) (see ``CROSS``); extremes, saturation counts and channel ranges are exact. NaN is
carried as the whole-tensor path carries it: a record whose sums are NaN has NaN extremes
(onnxruntime's ReduceMax/ReduceMin skip NaN), except per-channel ranges.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from pytest_qaccuracy.errors import CheckError, ModelError, QAccuracyError
from pytest_qaccuracy.metrics import error, similarity
from pytest_qaccuracy.metrics.channels import AXES as SPAN_AXES
from pytest_qaccuracy.metrics.channels import ChannelSpans
from pytest_qaccuracy.metrics.pair import FIELDS, TensorPair
from pytest_qaccuracy.runtime.options import RuntimeOptions
from pytest_qaccuracy.runtime.reduction_graph import CROSS, ReducedRunner, ReductionSpec, ReductionUnavailable

#: Metrics that read only per-record statistics (RecordStats fields, ``steps``, ``saturated``).
REDUCIBLE_METRICS = (
    error.MSE,
    error.MPEIR,
    error.TAE,
    error.SRMSE,
    error.MRE,
    error.MaxAbs,
    error.LSB,
    error.Clipped,
    similarity.Cosine,
    similarity.SQNR,
)


class ReducedStats:
    """RecordStats' fields given by the graph (float64 arrays of shape (records,)) and ``count``."""

    def __init__(self, values: dict[str, np.ndarray], count: int) -> None:
        self._values, self.count = values, count

    def prepare(self, fields) -> None:
        missing = set(fields) - self._values.keys()
        if missing:
            raise KeyError(f"statistics {sorted(missing)} were not reduced")

    def __getattr__(self, name: str) -> np.ndarray:
        if name in FIELDS:
            try:
                return self._values[name]
            except KeyError:
                raise AttributeError(f"statistic '{name}' was not reduced") from None
        raise AttributeError(name)


class ReducedPair(TensorPair):
    """A :class:`TensorPair` of which only the per-record statistics exist (no ``ref``/``test``)."""

    def __init__(
        self,
        stats: ReducedStats,
        records: int,
        shape: tuple[int, ...],
        scale,
        axis,
        zero_point,
        first_record: int,
        steps: np.ndarray | None,
        saturated: np.ndarray | None,
    ) -> None:
        self.ref = self.test = None
        self.scale, self.axis, self.first_record, self.zero_point = scale, axis, first_record, zero_point
        self.__dict__.update(stats=stats, _records=records, _shape=shape, steps=steps, saturated=saturated)

    @property
    def records(self) -> int:
        return self._records


def _value_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto.Tensor]:
    """Tensor name -> its tensor type, from the model's inputs, outputs and value_info."""
    found = {}
    for value in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        if value.type.HasField("tensor_type"):
            found[value.name] = value.type.tensor_type
    return found


def _rank_and_type(types: dict, name: str) -> tuple[int | None, int | None, list[int | None] | None]:
    t = types.get(name)
    if t is None:
        return None, None, None
    if not t.HasField("shape"):
        return None, t.elem_type, None
    dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
    return len(dims), t.elem_type, dims


_NUMPY_TYPES = {np.dtype(np.uint8): onnx.TensorProto.UINT8, np.dtype(np.int8): onnx.TensorProto.INT8}

_INTEGER_TYPES = {
    onnx.TensorProto.UINT8,
    onnx.TensorProto.INT8,
    onnx.TensorProto.UINT16,
    onnx.TensorProto.INT16,
    onnx.TensorProto.INT32,
}


def reduction_spec(tracker, f_types: dict, q_types: dict) -> ReductionSpec | None:
    """The spec of a layer tracker (see :mod:`.compare`), or None when it must run on whole tensors;
    ``f_types``/``q_types`` from :func:`_value_types` of the shape-inferred models."""
    if tracker.view is not None or tracker.worst is not None:
        return None
    if not tracker.metrics or not all(type(m) in REDUCIBLE_METRICS for m in tracker.metrics.values()):
        return None
    rank, f_type, f_dims = _rank_and_type(f_types, tracker.fp32)
    q_rank, q_type, q_dims = _rank_and_type(q_types, tracker.capture)
    if rank is None or rank < 2 or q_rank not in (None, rank) or f_type != onnx.TensorProto.FLOAT:
        return None
    params = tracker.params
    if q_type is None and params is not None:  # a com.microsoft op's output: onnx infers no type, its zero point says
        q_type = _NUMPY_TYPES.get(np.asarray(params.zero_point).dtype)
    dims = tuple(f_dims[1:])
    if not all(isinstance(d, int) and d > 0 for d in dims):  # the reductions are laid out for a static record
        return None
    if (params is None and q_type != onnx.TensorProto.FLOAT) or (params is not None and q_type not in _INTEGER_TYPES):
        return None
    fields = set(tracker.fields)
    names = {m.name for m in tracker.metrics.values()}
    scale_size = None if params is None else np.asarray(params.scale).size
    steps = "lsb" in names and scale_size is not None and scale_size > 1
    bounds = None
    if "clipped" in names and params is not None:
        bounds = _range_bounds(params, rank)
    if "max_abs_err" in fields and not fields & {"sq_err", "abs_err"}:
        fields.add("sq_err")  # its NaN marks the records whose max must be NaN
    if fields & {"ref_min", "ref_max"} and not fields & {"ref_sq", "ref_abs"}:
        fields.add("ref_sq")
    return ReductionSpec(
        tracker.fp32,
        tracker.capture,
        params,
        dims,
        q_type,
        frozenset(fields),
        steps=steps,
        bounds=bounds,
        spans=tracker.spans is not None,
        check_shapes=q_dims is None or tuple(q_dims[1:]) != dims,
        cross="cosine" in names,
    )


def _range_bounds(params, rank: int) -> tuple[np.ndarray, np.ndarray] | None:
    """:attr:`TensorPair.range_bounds` for a tensor of ``rank`` with ``params`` (they are shaped from
    the scale, the axis and the tensor's rank alone, so a probe of that rank stands for the tensor)."""
    probe = np.zeros((1,) * rank, np.float32)
    return TensorPair(probe, probe, scale=params.scale, axis=params.axis, zero_point=params.zero_point).range_bounds


def fold_reduced(tracker, spec: ReductionSpec, values: dict[str, np.ndarray], first_record: int) -> None:
    """Fold one batch of ``spec``'s statistics into ``tracker`` as its ``update`` folds whole tensors."""
    records = len(next(v for k, v in values.items() if k != "qshape"))
    fshape = (records, *spec.dims)
    if "qshape" in values:  # the quantized tensor's shape is not known before the run
        qshape = tuple(int(x) for x in values["qshape"])
        if fshape != qshape:
            tracker.problem = f"shape {fshape[1:]} in the fp32 model but {qshape[1:]} in the quantized model"
            return
    count = int(np.prod(fshape[1:])) if records else 0
    stats = {k: np.asarray(values[k], dtype=np.float64) for k in FIELDS if k in values}
    if spec.sum_fields:  # float32 block sums added in float64, as the whole-tensor path adds its blocks
        sums = np.asarray(values["sums"]).reshape(records, len(spec.sum_fields), -1)
        with np.errstate(over="ignore", invalid="ignore"):
            totals = sums.sum(axis=2, dtype=np.float64)
        stats.update({name: totals[:, i] for i, name in enumerate(spec.sum_fields)})
        if CROSS in stats:  # sum q^2 = sum f^2 - 2 sum f(f - q) + sum (f - q)^2
            stats["test_sq"] = stats["ref_sq"] - 2 * stats.pop(CROSS) + stats["sq_err"]
    if "max_abs" in values:
        stats["max_abs_err"] = np.asarray(values["max_abs"], np.float64)
    elif "max_diff" in values:
        high, low = np.asarray(values["max_diff"], np.float64), np.asarray(values["min_diff"], np.float64)
        stats["max_abs_err"] = np.maximum(high, -low)
    if spec.spans and "span_min1" in values:
        stats["ref_min"] = _row(np.min, values["span_min1"])
        stats["ref_max"] = _row(np.max, values["span_max1"])
    if count == 0:  # empty records: the whole-tensor path gives zero sums and extremes
        stats = {k: np.zeros(records) for k in stats}
    nan_err = _nan_rows(stats, ("sq_err", "abs_err"))
    if nan_err is not None and "max_abs_err" in stats:
        stats["max_abs_err"] = np.where(nan_err, np.nan, stats["max_abs_err"])
    nan_ref = _nan_rows(stats, ("ref_sq", "ref_abs"))
    if nan_ref is not None:
        for key in ("ref_min", "ref_max"):
            if key in stats:
                stats[key] = np.where(nan_ref, np.nan, stats[key])
    params = tracker.params
    steps = None
    if params is not None:
        scale = np.asarray(params.scale, dtype=np.float64)
        if scale.size == 1 and "max_abs_err" in stats:
            steps = stats["max_abs_err"] / float(scale.reshape(()))
        elif "steps" in values:
            steps = np.asarray(values["steps"], dtype=np.float64)
            if nan_err is not None:
                steps = np.where(nan_err, np.nan, steps)
    saturated = np.asarray(values["saturated"], dtype=np.int64) if "saturated" in values else None
    pair = ReducedPair(
        ReducedStats(stats, count),
        records,
        fshape,
        None if params is None else params.scale,
        None if params is None else params.axis,
        None if params is None else params.zero_point,
        first_record,
        steps,
        saturated,
    )
    for metric in tracker.metrics.values():
        metric.update(pair)
    if tracker.spans is not None and records:
        _fold_spans(tracker.spans, fshape, values)


def _row(reduce, values: np.ndarray) -> np.ndarray:
    values = np.asarray(values)
    if values.ndim < 2 or values.shape[1] == 0:
        return np.zeros(values.shape[0])
    return reduce(values.reshape(values.shape[0], -1), axis=1).astype(np.float64)


def _nan_rows(stats: dict[str, np.ndarray], keys: Sequence[str]) -> np.ndarray | None:
    for key in keys:
        if key in stats:
            return np.isnan(stats[key])
    return None


def _fold_spans(spans: ChannelSpans, shape: tuple[int, ...], values: dict[str, np.ndarray]) -> None:
    """What ``ChannelSpans.update`` folds from the whole tensor, from the graph's per-record channel
    extremes: ``span_{min,max}1`` (records, channels of axis 1) and ``span_{min,max}_rest`` (records,
    dims 2...; reduced over axis 1 already). The records go first (one pass over the planes), then
    each axis from the batch's plane."""
    axes = [a for a in SPAN_AXES if a < len(shape) and shape[a] >= 2]
    if not axes:
        return
    found = {}
    for tag, ufunc in (("min", np.minimum), ("max", np.maximum)):
        first, rest = values.get(f"span_{tag}1"), values.get(f"span_{tag}_rest")
        if first is not None and 1 in axes:
            found[1, tag] = ufunc.reduce(first, axis=0)
        if rest is not None and any(a > 1 for a in axes):
            plane = ufunc.reduce(rest, axis=0)  # dims 2...
            for axis in axes:
                if 1 < axis <= plane.ndim + 1:
                    others = tuple(i for i in range(plane.ndim) if i != axis - 2)
                    found[axis, tag] = ufunc.reduce(plane, axis=others) if others else plane
    for axis in axes:
        if (axis, "min") in found:
            spans.fold(axis, found[axis, "min"], found[axis, "max"])


class ReducedPass:
    """Both models in one merged session: reduced layers folded from their statistics, the other
    trackers (``whole``) given whole tensors by :meth:`run`."""

    def __init__(self, runner: ReducedRunner, reduced: list, whole: list, layers: int) -> None:
        self.runner, self.reduced, self.whole = runner, reduced, whole
        self.note = f"onnxruntime: the sums of {len(reduced)} of {layers} layers computed in the merged graph"
        self._started = False

    def run(self, batch) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Run ``batch``, fold the reduced layers; the whole tensors by model. A first batch the
        merged graph cannot run raises :class:`ReductionUnavailable` (nothing is folded yet)."""
        try:
            ref, test, stats = self.runner.run(batch)
        except ModelError as exc:
            if self._started:
                raise
            raise ReductionUnavailable(str(exc)) from None
        self._started = True
        for (tracker, spec), values in zip(self.reduced, stats, strict=True):
            if tracker.problem is None:
                try:
                    fold_reduced(tracker, spec, values, batch.start)
                except QAccuracyError:
                    raise
                except Exception as exc:  # a bug or an unforeseen tensor: name the tensor
                    raise CheckError(f"{tracker.target}: {type(exc).__name__}: {exc}") from exc
        return ref, test


def start_reduced(
    pair,
    outputs: list,
    layers: list,
    options: RuntimeOptions,
    q_options: RuntimeOptions,
    q_extra: Sequence[str] = (),
) -> tuple[ReducedPass | None, str]:
    """The merged-graph pass for ``layers`` (with ``outputs`` and unreduced layers fetched whole, and
    ``q_extra`` tensors of the quantized model, e.g. an agreement gate's), or None and why the sums
    run in numpy."""
    f_types, q_types = _value_types(pair.matcher.f.model), _value_types(pair.matcher.q.model)
    specs = [(t, reduction_spec(t, f_types, q_types)) for t in layers]
    reduced = [(t, s) for t, s in specs if s is not None]
    if not reduced:
        why = "no layers compared" if not layers else "no layer has only built-in metrics on float32/integer tensors"
        return None, f"numpy: {why}"
    whole = outputs + [t for t, s in specs if s is None]
    try:
        runner = ReducedRunner(
            pair.fp32,
            pair.quantized,
            [i.name for i in pair.inputs],
            [s for _, s in reduced],
            [t.fp32 for t in whole],
            [*(t.capture for t in whole), *q_extra],
            options,
            q_options,
            f"{pair.fp32_path.name} + {pair.quantized_path.name}",
        )
    except ReductionUnavailable as exc:
        return None, f"numpy (fallback): {exc}"
    return ReducedPass(runner, reduced, whole, len(layers)), ""
