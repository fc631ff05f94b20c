"""Layer-wise comparison: run both models of a pair on every record and fold the error per tensor.

Data flows one way: dataset batches -> runners -> TensorPair -> metric accumulators -> results.
Nothing but the current batch's tensors and the accumulators' fixed-size state is kept.
"""

from __future__ import annotations

import heapq
import itertools
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from pytest_qaccuracy.analysis.outputs import OutputMeasure
from pytest_qaccuracy.analysis.reduced_compare import ReducedPass, start_reduced
from pytest_qaccuracy.analysis.results import ComparisonResult, LayerResult, OutputResult
from pytest_qaccuracy.analysis.slices import SliceSpec, check_outputs
from pytest_qaccuracy.data import Dataset, bind_dataset, load_dataset
from pytest_qaccuracy.data.progress import task
from pytest_qaccuracy.errors import CheckError, InputError, QAccuracyError
from pytest_qaccuracy.metrics import Metric, TensorPair, get_metric, parse_metric_names
from pytest_qaccuracy.metrics.base import finite_result
from pytest_qaccuracy.metrics.channels import ChannelSpans
from pytest_qaccuracy.metrics.pair import scratch
from pytest_qaccuracy.model.matching import TensorMatch
from pytest_qaccuracy.model.pair import ModelPair
from pytest_qaccuracy.model.quant_params import QuantParams
from pytest_qaccuracy.runtime import OrtRunner, RuntimeOptions, make_runner
from pytest_qaccuracy.runtime.reduction_graph import ReductionUnavailable

if TYPE_CHECKING:  # the gate's module loads the integer backend: only callers that gate import it
    from pytest_qaccuracy.analysis.agreement_pass import AgreementPass
    from pytest_qaccuracy.analysis.reference_cache import ReferenceCache

#: How many worst records each output keeps per metric (for failure messages).
WORST_RECORDS = 5


@dataclass(slots=True)
class _Tracked:
    """Accumulators of one compared tensor."""

    fp32: str
    capture: str
    params: QuantParams | None
    metrics: dict[str, Metric]
    worst: dict[str, list[tuple[float, int, float]]] | None = None  # metric -> heap of (badness, record, value)
    problem: str | None = None
    fields: frozenset[str] = frozenset()  # RecordStats fields the metrics read, computed together
    view: SliceSpec | None = None  # a named view of an output (its name replaces ``fp32`` in results)
    spans: ChannelSpans | None = None  # per-channel ranges, for tensors with one scale
    dequantized: bool = False  # the capture is already float (a model output onnxruntime dequantized)

    @property
    def target(self) -> str:
        """``output 'y'``, ``output 'boxes'`` (a view) or ``layer 'conv1'``, for messages."""
        if self.view is not None:
            return f"output '{self.view.name}'"
        return f"{'output' if self.worst is not None else 'layer'} '{self.fp32}'"

    def update(self, ref: np.ndarray, test: np.ndarray, first_record: int) -> None:
        if self.view is not None:
            ref, test = self.view.take(ref), self.view.take(test)
        if ref.shape != test.shape:
            self.problem = f"shape {ref.shape[1:]} in the fp32 model but {test.shape[1:]} in the quantized model"
            return
        if self.params is not None and not self.dequantized:
            test = self.params.dequantize(test, out=scratch(2, test.shape))
        scale = None if self.params is None else self.params.scale
        axis = None if self.params is None else self.params.axis
        zero_point = None if self.params is None else self.params.zero_point
        pair = TensorPair(ref, test, scale=scale, axis=axis, first_record=first_record, zero_point=zero_point)
        pair.stats.prepare(self.fields)
        for metric in self.metrics.values():
            metric.update(pair)
        if self.spans is not None:
            self.spans.update(ref)
        if self.worst is not None:
            self._track_worst(pair)

    def _track_worst(self, pair: TensorPair) -> None:
        for name, metric in self.metrics.items():
            values = metric.record_values(pair)
            if values is None:
                continue
            heap = self.worst.setdefault(name, [])
            sign = -1.0 if metric.higher_is_better else 1.0
            for offset, value in enumerate(np.asarray(values, dtype=np.float64)):
                item = (sign * float(value), pair.first_record + offset, float(value))
                if len(heap) < WORST_RECORDS:
                    heapq.heappush(heap, item)
                elif item > heap[0]:
                    heapq.heapreplace(heap, item)

    def results(self) -> tuple[dict[str, float | None], dict[str, str]]:
        values, undefined = {}, {}
        for name, metric in self.metrics.items():
            value, reason = finite_result(*metric.result())  # a registered metric may give NaN too
            values[name] = value
            if value is None:
                undefined[name] = reason or "undefined"
        return values, undefined

    def worst_records(self) -> dict[str, list[tuple[int, float]]]:
        return {m: [(r, v) for _, r, v in sorted(heap, reverse=True)] for m, heap in (self.worst or {}).items()}


def compare(
    pair: ModelPair,
    data: Dataset | str | os.PathLike[str],
    metrics: str | Sequence[str] | None = None,
    options: RuntimeOptions | None = None,
    capture: str = "deployed",
    layers: bool = True,
    allow_nonfinite: bool = False,
    backend: str = "onnxruntime",
    scheme: str | None = None,
    slices: Sequence[SliceSpec] = (),
    measure: OutputMeasure | None = None,
    agreement: AgreementPass | None = None,
    reference: ReferenceCache | None = None,
) -> ComparisonResult:
    """Compare an fp32/quantized pair on every record of ``data``.

    Args:
        pair: the models (see :class:`ModelPair`).
        data: a dataset or its path (``.h5``/``.hdf5``, ``.npz``, or a folder of ``.npy``).
        metrics: metric names (``"mse,cosine"`` or a list); all registered metrics by default.
        options: onnxruntime options (providers, optimization level, threads, batch size).
        capture: ``deployed`` (fused integer kernels where onnxruntime fuses) or ``reference``
            (QDQ fake-quant semantics, optimizations off); see ``CAPTURE_MODES``.
        layers: also compare every matched intermediate tensor (outputs are always compared).
        allow_nonfinite: accept NaN/Inf in the inputs.
        backend: ``onnxruntime`` or ``integer`` (the emulated integer backend) for the quantized model.
        scheme: the integer backend's scheme preset (default ``onnxruntime``).
        slices: named views of outputs, compared as outputs of their own (:mod:`.slices`).
        measure: also fold the outputs into these top-k counts and element checks, in the same
            pass (what :func:`~pytest_qaccuracy.analysis.outputs.measure_outputs` measures in a
            pass of its own; read them with ``measure.result()``). It sees the compared tensors:
            the capture mode's run, with the outputs dequantized as the metrics see them.
        agreement: also measure this agreement gate in the same pass (the quantized model's runs are
            shared where they compute the same tensors; see :mod:`.agreement_pass`); read it with
            ``agreement.result()``.
        reference: keep the fp32 model's values of each batch in this cache, for a later analysis of
            the same records (:mod:`.reference_cache`); on the merged graph only when both models
            have one opset (else the analysis computes them as the whole-tensor pass would).

    Returns:
        A :class:`ComparisonResult` (its ``to_dict()`` is the comparison JSON).

    Raises:
        InputError: bad data, bad models, unknown metrics or options (the message names what).
    """
    names = parse_metric_names(metrics)
    options = options or RuntimeOptions()
    q_options = options.for_capture(capture)
    dataset = data if isinstance(data, Dataset) else load_dataset(data)
    try:
        bound = bind_dataset(dataset, pair.inputs, allow_nonfinite=allow_nonfinite)
        try:
            check_outputs(list(slices), [f for f, _ in pair.output_pairs()])
        except ValueError as exc:
            raise InputError(str(exc)) from None
        layer_matches = pair.matching.matches if layers else []
        inner = bool(layer_matches) or agreement is not None
        plain = _deployed_outputs(pair, options, q_options, capture, backend, inner)
        outputs = _output_trackers(pair, names, slices, as_deployed=plain is not None)
        layer_trackers = [_tracker(m.fp32, m.capture, m.params, names) for m in layer_matches]
        if reference is not None:  # how this pass's fp32 runner runs, to recompute what it does not keep
            fetched, label = list(dict.fromkeys(t.fp32 for t in outputs + layer_trackers)), pair.fp32_path.name
            reference.begin(fetched, lambda: OrtRunner(pair.fp32, fetched, options, f"{label} (fp32 reference)"))
        note = _whole_tensor_reason(backend)
        if note is None:
            gate_tensors, reduced_q = [], q_options
            first = next(iter(bound.iter_batches(options.batch_size)), None) if agreement is not None else None
            if first is not None:  # the gate's tensors, fetched by the merged graph's quantized side
                gate_tensors, reduced_q = agreement.merged_tensors(pair.quantized, q_options, first)
            reduced, note = start_reduced(pair, outputs, layer_trackers, options, reduced_q, gate_tensors)
            try:
                if reduced is not None:
                    kept = reference if reference is not None and _own_opset(pair) else None
                    _run_reduced(reduced, bound, options, outputs, measure, dataset, pair, agreement, kept, plain)
                    result = _result(
                        pair, dataset, names, len(bound), outputs, layer_matches, layer_trackers, capture, None
                    )
                    return replace(result, reduction=reduced.note)
            except ReductionUnavailable as exc:  # the first batch failed: nothing was folded
                note = f"numpy (fallback): {exc}"
        fp32_runner = OrtRunner(
            pair.fp32, [t.fp32 for t in outputs + layer_trackers], options, f"{pair.fp32_path.name}"
        )
        q_runner = (make_runner if agreement is None else agreement.runner)(
            pair.quantized,
            [t.capture for t in outputs + layer_trackers],
            q_options,
            pair.quantized_path.name,
            backend,
            scheme,
        )
        trackers = outputs + layer_trackers
        if measure is not None:
            measure.begin(dataset, [f for f, _ in pair.output_pairs()])
        with ThreadPoolExecutor(max_workers=_workers(options)) as pool, task("compare", len(bound)) as advance:
            for batch in bound.iter_batches(options.batch_size):
                ref, test = fp32_runner.run(batch), q_runner.run(batch)
                o_ref, o_test = plain.outputs(batch, ref, test) if plain is not None else (ref, test)
                _fold_both(pool, trackers, (ref, test), (o_ref, o_test), batch)
                if reference is not None:  # as its fp32 runner computes them, which it can recompute
                    reference.add(batch, ref)
                if measure is not None:
                    measure.update(*_output_values(outputs, o_ref, o_test), batch.start, len(batch))
                advance(len(batch))
        records = len(bound)
    finally:
        if not isinstance(data, Dataset):
            dataset.close()
    result = _result(pair, dataset, names, records, outputs, layer_matches, layer_trackers, capture, q_runner)
    return replace(result, reduction=note)


def _whole_tensor_reason(backend: str) -> str | None:
    """Why the layer sums must run in numpy on whole tensors; None when the merged graph may serve.
    Neither an agreement gate (the merged graph fetches its tensors) nor a ``reference`` cache decides."""
    if backend != "onnxruntime":
        return "numpy: the integer backend"
    return None


def _run_reduced(
    reduced: ReducedPass,
    bound,
    options: RuntimeOptions,
    outputs,
    measure,
    dataset,
    pair,
    agreement=None,
    kept=None,
    plain=None,
) -> None:
    """The comparison loop on the merged graph: layers folded from their statistics, the rest whole,
    the gate's tensors (if any) to the gate, the fp32 outputs to ``kept`` (a reference cache), the
    outputs as ``plain`` (if given) runs the quantized model alone."""
    started = False
    with ThreadPoolExecutor(max_workers=_workers(options)) as pool, task("compare", len(bound)) as advance:
        for batch in bound.iter_batches(options.batch_size):
            ref, test = reduced.run(batch)
            o_ref, o_test = plain.outputs(batch, ref, test) if plain is not None else (ref, test)
            if not started and measure is not None:
                measure.begin(dataset, [f for f, _ in pair.output_pairs()])
            started = True
            _fold_both(pool, reduced.whole, (ref, test), (o_ref, o_test), batch)
            if agreement is not None:
                agreement.fold(batch, test)
            if kept is not None:
                kept.add(batch, ref)
            if measure is not None:
                measure.update(*_output_values(outputs, o_ref, o_test), batch.start, len(batch))
            advance(len(batch))


def _fold_both(pool: ThreadPoolExecutor, trackers: list[_Tracked], values: tuple, outputs: tuple, batch) -> None:
    """Fold the outputs' trackers from ``outputs`` (the models' own outputs) and the rest from
    ``values`` (the pass's tensors): a layer may be an output tensor too, as the pass computed it."""
    finals = [t for t in trackers if t.worst is not None]
    _fold(pool, finals, *outputs, batch.start, len(batch))
    _fold(pool, [t for t in trackers if t.worst is None], *values, batch.start, len(batch))


def _own_opset(pair: ModelPair) -> bool:
    """Whether the merged graph runs the fp32 model at its own default-domain opset (the quantized
    model's): its values then equal the whole-tensor pass's, bit for bit (tested on the corpus)."""

    def default(model) -> int:
        return next((o.version for o in model.opset_import if (o.domain or "") == ""), 0)

    return default(pair.fp32) == default(pair.quantized)


def _fold(pool: ThreadPoolExecutor, trackers: list[_Tracked], ref: dict, test: dict, start: int, records: int) -> None:
    """Fold one batch of ``records`` into every tracker; numpy and BLAS release the GIL, so tensors go
    in parallel. A 0-d tensor (made from a 0-d input, such as a speech model's sample rate) is the
    one value of every record of the batch."""

    def one(tracker: _Tracked) -> None:
        if tracker.problem is None:
            try:
                tracker.update(
                    _per_record(ref[tracker.fp32], records), _per_record(test[tracker.capture], records), start
                )
            except QAccuracyError:
                raise
            except Exception as exc:  # a bug or an unforeseen tensor: name the tensor
                raise CheckError(f"{tracker.target}: {type(exc).__name__}: {exc}") from exc

    for _ in pool.map(one, trackers):
        pass


def _per_record(value: np.ndarray, records: int) -> np.ndarray:
    """``value`` with a record axis: a 0-d value repeated for each of ``records``."""
    value = np.asarray(value)
    return np.broadcast_to(value, (records,)) if value.ndim == 0 else value


def _output_values(outputs: list[_Tracked], ref: dict, test: dict) -> tuple[dict, dict]:
    """The models' outputs by fp32 name (views left out), the quantized ones dequantized."""
    found = [t for t in outputs if t.view is None]
    values = {t.fp32: test[t.capture] for t in found}
    dequantized = {
        t.fp32: t.params.dequantize(values[t.fp32]) if t.params and not t.dequantized else values[t.fp32] for t in found
    }
    return {t.fp32: ref[t.fp32] for t in found}, dequantized


def _workers(options: RuntimeOptions) -> int:
    return max(1, options.threads or os.cpu_count() or 1)


def _tracker(
    fp32: str,
    capture: str,
    params: QuantParams | None,
    names: list[str],
    worst: bool = False,
    view: SliceSpec | None = None,
) -> _Tracked:
    metrics = {n: get_metric(n)() for n in names}
    fields = frozenset(f for m in metrics.values() for f in m.stats_fields)
    spans = ChannelSpans() if params is not None and params.per_tensor_scale is not None else None
    return _Tracked(fp32, capture, params, metrics, {} if worst else None, fields=fields, view=view, spans=spans)


def _output_trackers(
    pair: ModelPair, names: list[str], slices: Sequence[SliceSpec] = (), as_deployed: bool = False
) -> list[_Tracked]:
    """Outputs are captured like layers: a DequantizeLinear output as its integer input, an integer
    output dequantized, a float output as it is. ``as_deployed``: a dequantized output is taken as
    the model gives it (float, with its integer tensor's parameters for the step metrics), for a run
    of the quantized model that fetches its outputs only (:func:`_deployed_outputs`). Views follow
    the outputs."""
    trackers, found = [], {}
    for f_name, q_name in pair.output_pairs():
        _, capture, params = pair.matcher.resolve(q_name, follow_quantize=False)
        tracker = _tracker(f_name, capture, params, names, worst=True)
        if as_deployed and capture != q_name:
            tracker.capture, tracker.dequantized = q_name, True
        trackers.append(tracker)
        found[f_name] = tracker
    for view in slices:
        base = found[view.output]
        tracker = _tracker(view.output, base.capture, base.params, names, worst=True, view=view)
        tracker.dequantized = base.dequantized
        trackers.append(tracker)
    return trackers


class _DeployedOutputs:
    """Both models run alone for their outputs: onnxruntime fuses a model differently when its inner
    tensors are fetched too (an int8 tensor made a graph output keeps its type, so onnxruntime's s8
    to u8 rewrite of x86 CPUs stops there): on CPUs without VNNI the quantized outputs then differ
    from what the model gives alone (PP-OCRv4 rec s8s8 per channel: cosine 0.976 against 0.895). The
    checks read the outputs; they must be the deployed models'."""

    def __init__(self, pair: ModelPair, options: RuntimeOptions, q_options: RuntimeOptions) -> None:
        names = pair.output_pairs()
        self.fp32 = OrtRunner(pair.fp32, [f for f, _ in names], options, f"{pair.fp32_path.name} (outputs)")
        self.quantized = OrtRunner(
            pair.quantized, [q for _, q in names], q_options, f"{pair.quantized_path.name} (outputs)"
        )

    def outputs(self, batch, ref: dict, test: dict) -> tuple[dict, dict]:
        """``ref`` and ``test`` with the batch's outputs replaced by the models' own (new mappings)."""
        return {**ref, **self.fp32.run(batch)}, {**test, **self.quantized.run(batch)}


def _deployed_outputs(
    pair: ModelPair, options: RuntimeOptions, q_options: RuntimeOptions, capture: str, backend: str, inner: bool
) -> _DeployedOutputs | None:
    """The models run alone for their outputs when the pass fetches ``inner`` tensors too, in
    ``deployed`` capture on onnxruntime; else None (the pass's own runs give the outputs as deployed)."""
    if not inner or capture != "deployed" or backend != "onnxruntime":
        return None
    return _DeployedOutputs(pair, options, q_options)


def _result(
    pair: ModelPair,
    dataset: Dataset,
    names: list[str],
    records: int,
    outputs: list[_Tracked],
    matches: list[TensorMatch],
    trackers: list[_Tracked],
    capture: str,
    q_runner,
) -> ComparisonResult:
    out_results = []
    quantized_names = [q for _, q in pair.output_pairs()] + [t.view.view for t in outputs if t.view is not None]
    for q_name, tracker in zip(quantized_names, outputs, strict=True):
        name = tracker.view.name if tracker.view is not None else tracker.fp32
        if tracker.problem:
            raise InputError(f"output '{name}': {tracker.problem}")
        values, undefined = tracker.results()
        worst = tracker.worst_records()
        out_results.append(OutputResult(name, values, undefined, worst, q_name, _channel_report(tracker)))
    layers, unmatched_fp32 = [], list(pair.matching.unmatched_fp32)
    unmatched_q = list(pair.matching.unmatched_quantized)
    for match, tracker in zip(matches, trackers, strict=True):
        if tracker.problem:  # a structural match that turned out wrong: report, never drop silently
            unmatched_fp32.append(match.fp32)
            unmatched_q.append(match.quantized)
            continue
        values, undefined = tracker.results()
        scale = match.params.per_tensor_scale if match.params is not None else None
        layers.append(
            LayerResult(
                match.fp32,
                match.quantized,
                match.node,
                match.op_type,
                match.order,
                values,
                undefined,
                match.matched_by,
                scale,
                _channel_report(tracker),
            )
        )
    return ComparisonResult(
        fp32_model=pair.fp32_path.name,
        quantized_model=pair.quantized_path.name,
        data=dataset.name,
        records=records,
        metric_definitions={n: get_metric(n).formula for n in names},
        outputs=out_results,
        layers=layers,
        unmatched_fp32=unmatched_fp32,
        unmatched_quantized=unmatched_q,
        backend=getattr(q_runner, "backend", "onnxruntime"),
        scheme=getattr(q_runner, "scheme_name", None),
        capture=getattr(q_runner, "capture", capture),
        higher_is_better={n: get_metric(n).higher_is_better for n in names},
    )


def _channel_report(tracker: _Tracked):
    if tracker.spans is None or tracker.params is None:
        return None
    return tracker.spans.report(tracker.params.per_tensor_scale)


def worst_layers(result: ComparisonResult, metric: str, count: int = 5) -> list[LayerResult]:
    """The ``count`` layers with the worst ``metric`` (undefined values last)."""
    higher = result.higher_is_better.get(metric, False)

    def key(layer: LayerResult) -> tuple[int, float]:
        value = layer.metrics.get(metric)
        if value is None:
            return (1, 0.0)
        return (0, value if higher else -value)

    return sorted(result.layers, key=key)[:count]


def first_jump(result: ComparisonResult, metric: str = "sqnr", factor_db: float = 6.0) -> LayerResult | None:
    """The first layer (topological order) where ``metric`` worsens sharply against the layer before.

    SQNR: a drop of ``factor_db`` dB. Other metrics: the error (for higher-is-better metrics, the
    distance from 1) at least doubles. Without such a step, the layer with the largest worsening, or
    None when nothing worsens.
    """
    ordered = [x for x in sorted(result.layers, key=lambda x: x.order) if x.metrics.get(metric) is not None]
    higher = result.higher_is_better.get(metric, False)
    threshold = factor_db if metric == "sqnr" else 1.0
    best_step, best_layer = 0.0, None
    for before, layer in itertools.pairwise(ordered):
        step = _worsening(before.metrics[metric], layer.metrics[metric], metric, higher)
        if step >= threshold:
            return layer
        if step > best_step:
            best_step, best_layer = step, layer
    return best_layer


def _worsening(before: float, value: float, metric: str, higher: bool) -> float:
    if metric == "sqnr":
        return before - value
    if higher:
        return (before - value) / max(abs(1 - before), 1e-12)
    return (value - before) / max(abs(before), 1e-12)
