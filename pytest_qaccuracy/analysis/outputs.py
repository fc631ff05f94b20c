"""Output-level statistics that need elements rather than sums: top-k agreement and accuracy,
elements outside ``atol + rtol * |fp32|``, and task metrics (:mod:`pytest_qaccuracy.metrics.task`).

:class:`OutputMeasure` folds them batch by batch, inside the comparison's own pass
(``compare(..., measure=...)``, as the plugin does) or in a pass of its own with only the outputs
fetched (:func:`measure_outputs`). Everything streams: the state is counters and a few worst
elements per output.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pytest_qaccuracy.analysis.slices import SliceSpec, check_outputs
from pytest_qaccuracy.data import Dataset, bind_dataset, load_dataset
from pytest_qaccuracy.data.progress import task
from pytest_qaccuracy.errors import CheckError, DataError, InputError, QAccuracyError
from pytest_qaccuracy.metrics.error import outside_tolerance
from pytest_qaccuracy.metrics.task import TaskContext, TaskSpec
from pytest_qaccuracy.metrics.topk import ScoreLayout, TopKCounter, score_layout
from pytest_qaccuracy.model.graph import GraphView
from pytest_qaccuracy.model.matching import FLOAT_TYPES
from pytest_qaccuracy.model.pair import ModelPair
from pytest_qaccuracy.model.quant_params import QuantParams, find_quant_params
from pytest_qaccuracy.plain import Plain, from_plain, none, plain_field
from pytest_qaccuracy.runtime import OrtRunner, RuntimeOptions, make_runner

WORST_ELEMENTS = 5


@dataclass(frozen=True, slots=True)
class RelativeStats(Plain):
    """Elements of one output outside ``atol + rtol * |f|`` (:func:`~pytest_qaccuracy.metrics.error.outside_tolerance`);
    ``max_abs`` and ``max_rel`` are the largest differences among them (NaN when one is), ``worst`` rows
    are (record, index, q, f)."""

    rtol: float
    atol: float
    violations: int
    elements: int
    max_abs: float
    max_rel: float
    worst: list[tuple[int, str, float, float]] = field(default_factory=list)


class _RelativeTracker:
    def __init__(self, rtol: float, atol: float) -> None:
        self.rtol, self.atol = rtol, atol
        self.violations = self.elements = 0
        self.max_abs, self.max_rel = 0.0, 0.0
        self.heap: list[tuple[float, int, int, str, float, float]] = []

    def update(self, ref: np.ndarray, test: np.ndarray, first_record: int) -> None:
        bad, diff, rel, excess = outside_tolerance(test, ref, self.rtol, self.atol)
        self.elements += bad.size
        if not diff.size:
            return
        self.violations += diff.size
        # np.maximum keeps a NaN, as assert_relative's max over all violations does
        self.max_abs = float(np.maximum(self.max_abs, diff.max()))
        self.max_rel = float(np.maximum(self.max_rel, rel.max()))
        where = np.flatnonzero(bad)
        for i in np.argsort(-excess, kind="stable")[:WORST_ELEMENTS]:
            index = np.unravel_index(int(where[i]), bad.shape)
            record = first_record + int(index[0])
            # ties: the first element first, as assert_relative lists them
            shown = str(list(map(int, index[1:])))
            item = (float(excess[i]), -record, -int(where[i]), shown, float(test[index]), float(ref[index]))
            if len(self.heap) < WORST_ELEMENTS:
                heapq.heappush(self.heap, item)
            elif item > self.heap[0]:
                heapq.heapreplace(self.heap, item)

    def result(self) -> RelativeStats:
        worst = [(-r, i, q, f) for _, r, _, i, q, f in sorted(self.heap, reverse=True)]
        return RelativeStats(self.rtol, self.atol, self.violations, self.elements, self.max_abs, self.max_rel, worst)


@dataclass(frozen=True, slots=True)
class TaskValue(Plain):
    """One value of a task metric on both sides: ``against`` is ``targets`` (the data's) or ``fp32``
    (no targets: the quantized side scored against the fp32 model's predictions). ``error`` is the
    one line of a metric that raised (naming it and the records of the batch): both sides are then
    None, and only the checks of the metric's values fail on it."""

    name: str = plain_field(skip=True)  # the key it is written under
    metric: str
    against: str
    records: int
    higher_is_better: bool
    fp32: float | None
    quantized: float | None = plain_field(then=("drop",))
    error: str | None = plain_field(None, omit=none)

    @property
    def drop(self) -> float | None:
        """How much worse the quantized side is, in the metric's own direction (negative: better)."""
        if self.fp32 is None or self.quantized is None:
            return None
        return self.fp32 - self.quantized if self.higher_is_better else self.quantized - self.fp32

    @classmethod
    def from_dict(cls, name: str, data: dict[str, Any]) -> TaskValue:  # type: ignore[override]
        return from_plain(cls, data, name=name)


@dataclass(frozen=True, slots=True)
class OutputStats(Plain):
    """Per output name: top-k counts (class-score outputs only) and relative-tolerance stats; per
    task-metric value name, its :class:`TaskValue`.

    ``problems`` names the outputs that top-k could not count, with a one-line reason that gives the
    output's shape and dtype; ``candidates`` describes every output when none could be counted.
    """

    topk: dict[str, dict[str, Any]]
    relative: dict[str, RelativeStats]
    problems: dict[str, str] = field(default_factory=dict)
    task: dict[str, TaskValue] = plain_field(default_factory=dict, load=lambda d: _task_values(d))


def _task_values(data: dict[str, Any]) -> dict[str, TaskValue]:
    """Task values read back, each named by its key."""
    return {name: TaskValue.from_dict(name, value) for name, value in data.items()}


def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if np.isfinite(number) else None


class TaskRun:
    """The task metrics of one pass: created, begun, fed batch by batch with one target per record,
    and read as :class:`TaskValue` rows. A metric that raises (before the first batch, on a batch, or
    computing its values) raises :class:`CheckError` with one line naming it and the records; with
    ``keep_errors`` it is set aside instead, the others go on, and its values carry the line
    (:attr:`TaskValue.error`) instead of figures (the plugin fails only the checks of its values)."""

    def __init__(self, specs: Sequence[TaskSpec], targets: Sequence[Any] | None, keep_errors: bool = False) -> None:
        self.specs = list(specs)
        self.targets = targets
        self.keep_errors = keep_errors
        self.metrics: list[Any] = []
        self.records = 0
        #: index of a metric that raised -> its one line
        self.errors: dict[int, str] = {}

    def begin(self, context: TaskContext) -> None:
        if self.targets is not None and len(self.targets) != context.records:
            raise DataError(f"{len(self.targets)} task targets for {context.records} records")
        try:
            self.metrics = [spec.create() for spec in self.specs]
        except ValueError as exc:
            raise InputError(str(exc)) from None
        for i, metric in enumerate(self.metrics):
            if callable(getattr(metric, "begin", None)):
                self._guard(i, "before the first batch", metric.begin, context)

    def update(self, ref: dict[str, np.ndarray], test: dict[str, np.ndarray], start: int, count: int) -> None:
        targets = None if self.targets is None else list(self.targets[start : start + count])
        where = f"on record {start}" if count == 1 else f"on records {start}..{start + count - 1}"
        for i, metric in enumerate(self.metrics):
            self._guard(i, where, metric.update, ref, test, targets)
        self.records += count

    def _guard(self, index: int, where: str, method: Any, *args: Any) -> Any:
        """``method(*args)`` unless metric ``index`` raised before; any exception but ours becomes one
        line naming the metric and ``where``: raised, or kept (``keep_errors``)."""
        if index in self.errors:
            return None
        try:
            return method(*args)
        except QAccuracyError:
            raise
        except Exception as exc:
            text = (str(exc).strip().splitlines() or [""])[0]
            label = self.specs[index].label
            line = f"task metric '{label}' {where}: {type(exc).__name__}: {text}"
            if not self.keep_errors:
                raise CheckError(line) from exc
            self.errors[index] = line
            return None

    def result(self) -> dict[str, TaskValue]:
        found = {}
        for i, (spec, metric) in enumerate(zip(self.specs, self.metrics, strict=True)):
            values = self._guard(i, "computing its values", metric.compute) or {}
            error = self.errors.get(i)
            state = getattr(metric, "state", {}) or {}
            against = (state.get("against") if isinstance(state, dict) else None) or (
                "fp32" if self.targets is None else "targets"
            )
            for name, own in spec.value_names(metric).items():
                fp32, quantized = (
                    (None, None)
                    if error is not None
                    else (_finite(values.get(side, {}).get(own)) for side in ("fp32", "quantized"))
                )
                higher = bool(metric.higher_is_better[own])
                found[name] = TaskValue(name, spec.label, against, self.records, higher, fp32, quantized, error)
        return found


def parse_scores(text: str | None, outputs: Sequence[str]) -> tuple[str, int | None] | None:
    """``scores`` as (output, class axis): ``"logits"``, or ``"logits:1"`` for classes on axis 1
    (an output whose own name ends in ``:<n>`` is taken whole). ValueError names the known outputs."""
    if text is None:
        return None
    if text in outputs:
        return text, None
    name, _, axis = text.rpartition(":")
    if name in outputs and axis.removeprefix("-").isdecimal():  # what int() reads: "--1" and "²" are not
        return name, int(axis)
    raise ValueError(f"scores: no output {text!r} (outputs: {', '.join(outputs)})")


def _describe(name: str, array: np.ndarray) -> str:
    return f"output '{name}' {array.dtype} {tuple(array.shape)}"


def plan_topk(
    outputs: dict[str, np.ndarray], scores: str | None = None, automatic: int | None = None
) -> tuple[dict[str, ScoreLayout], dict[str, str]]:
    """Which outputs top-k counts, and how (from one batch of fp32 outputs); and why others cannot.

    Named (``scores``): that output only; scores on the named axis, else ``(records, classes)``,
    else a sequence with the classes last; integer outputs count as labels. Not named: the first
    ``automatic`` outputs (default all) that are float ``(records, classes)``; without any, integer
    label outputs ``(records,)``.
    """
    try:
        named = parse_scores(scores, list(outputs))
    except ValueError as exc:
        return {}, {str(scores): str(exc)}
    if named is not None:
        name, axis = named
        array = outputs[name]
        for attempt in (axis,) if axis is not None else (None, -1):
            try:
                return {name: score_layout(array, attempt)}, {}
            except ValueError as exc:
                reason = str(exc)
        return {}, {name: f"{_describe(name, array)}: {reason}"}
    layouts, problems = {}, {}
    for name, array in list(outputs.items())[:automatic]:  # views are counted only when named
        try:
            layouts[name] = score_layout(array)
        except ValueError as exc:
            hint = f'; to count per position: scores = "{name}" (classes last) or "{name}:<axis>"'
            problems[name] = f"{_describe(name, array)}: {exc}" + (hint if array.ndim > 2 else "")
    found = {n: x for n, x in layouts.items() if x.kind == "scores"}
    if not found:
        found = {n: x for n, x in layouts.items() if x.positions == 1}  # labels, one per record
    for name, layout in layouts.items():
        if name not in found:
            problems[name] = f"{_describe(name, outputs[name])}: {layout.kind} {layout.describe()}"
    return found, problems


def _integer_outputs(pair: ModelPair) -> dict[str, QuantParams]:
    """Quantized-model outputs that are integer tensors, with the parameters that dequantize them."""
    view = GraphView(pair.quantized)
    found = {}
    for _, name in pair.output_pairs():
        elem = view.elem_types.get(name)
        params = None if elem is None or elem in FLOAT_TYPES else find_quant_params(view, name)
        if params is not None:
            found[name] = params
    return found


class OutputMeasure:
    """Top-k counts and element checks folded batch by batch: the state of :func:`measure_outputs`,
    also folded by :func:`~pytest_qaccuracy.analysis.compare.compare` into its own pass (``measure=``),
    so that a pair check runs each model once.

    :meth:`begin` once with the dataset and the fp32 output names, :meth:`update` per batch with
    both models' outputs by fp32 output name (the quantized ones dequantized), then :meth:`result`.
    Arguments as :func:`measure_outputs`.
    """

    def __init__(
        self,
        ks: Sequence[int] = (1,),
        labels: np.ndarray | None = None,
        rtol: float | None = None,
        atol: float | None = None,
        scores: str | None = None,
        slices: Sequence[SliceSpec] = (),
        tasks: Sequence[TaskSpec] = (),
        targets: Sequence[Any] | None = None,
        metadata: dict[str, str] | None = None,
        keep_task_errors: bool = False,
    ) -> None:
        self.ks, self.labels, self.scores, self.slices = tuple(ks), labels, scores, list(slices)
        self.tasks = TaskRun(tasks, targets, keep_task_errors) if tasks else None
        self.metadata = dict(metadata or {})
        self.rtol, self.atol = rtol, atol
        self.names: list[str] = []
        self.counters: dict[str, TopKCounter] | None = None
        self.problems: dict[str, str] = {}
        self.relative: dict[str, _RelativeTracker] = {}

    def begin(self, dataset: Dataset, outputs: Sequence[str]) -> None:
        """Check the views against ``outputs`` (fp32 names); labels default to the dataset's own."""
        try:
            check_outputs(self.slices, list(outputs))
        except ValueError as exc:
            raise InputError(str(exc)) from None
        if self.labels is None:
            self.labels = dataset.labels()
        self.names = [*outputs, *(v.name for v in self.slices)]
        if self.tasks is not None:
            if self.tasks.targets is None:  # the dataset's targets, else its labels, else none (agreement)
                stored = dataset.targets()
                labels = None if self.labels is None else [_python(x) for x in np.asarray(self.labels)]
                self.tasks.targets = stored if stored is not None else labels
            self.tasks.begin(TaskContext(tuple(self.names), self.metadata, len(dataset)))
        if self.rtol or self.atol:
            self.relative = {f: _RelativeTracker(self.rtol or 0.0, self.atol or 0.0) for f in self.names}

    def update(self, ref: dict[str, np.ndarray], test: dict[str, np.ndarray], start: int, count: int) -> None:
        """One batch of ``count`` records from record ``start``; ``ref``/``test`` by fp32 output name."""
        ref, test = dict(ref), dict(test)
        for view in self.slices:  # a view's fp32 and quantized values go by its name
            ref[view.name] = view.take(ref[view.output])
            test[view.name] = view.take(test[view.output])
        labels = None if self.labels is None else np.asarray(self.labels)[start : start + count]
        if self.counters is None:
            automatic = len(self.names) - len(self.slices)
            layouts, self.problems = plan_topk({f: ref[f] for f in self.names}, self.scores, automatic)
            self.counters = {f: TopKCounter(self.ks, layout=layout) for f, layout in layouts.items()}
        for f in self.names:
            try:
                if f in self.counters:
                    _count(self.counters, self.problems, f, ref[f], test[f], labels)
                if f in self.relative:
                    self.relative[f].update(ref[f], test[f], start)
            except QAccuracyError:
                raise
            except Exception as exc:  # a bug or an unforeseen tensor: name the output
                raise CheckError(f"output '{f}': {type(exc).__name__}: {exc}") from exc
        if self.tasks is not None:
            self.tasks.update(ref, test, start, count)

    def result(self) -> OutputStats:
        return OutputStats(
            {name: c.to_dict() for name, c in (self.counters or {}).items()},
            {name: r.result() for name, r in self.relative.items()},
            self.problems,
            {} if self.tasks is None else self.tasks.result(),
        )


def _python(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def measure_outputs(
    pair: ModelPair,
    data: Dataset | str | os.PathLike[str],
    ks: Sequence[int] = (1,),
    labels: np.ndarray | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    options: RuntimeOptions | None = None,
    backend: str = "onnxruntime",
    scheme: str | None = None,
    scores: str | None = None,
    slices: Sequence[SliceSpec] = (),
    tasks: Sequence[TaskSpec] = (),
    targets: Sequence[Any] | None = None,
    keep_task_errors: bool = False,
) -> OutputStats:
    """Run both models on every record and measure their outputs.

    Args:
        pair: the models.
        data: the dataset or its path.
        ks: the k of the top-k counts (outputs shaped like class scores only).
        labels: one class per record; defaults to the dataset's own labels.
        rtol: relative tolerance; with ``atol``, counts elements outside ``atol + rtol*|f|``.
        atol: absolute tolerance.
        options: onnxruntime options.
        backend: ``onnxruntime`` or ``integer`` (the emulated integer backend) for the quantized model.
        scheme: the integer backend's scheme preset (default ``onnxruntime``).
        scores: the output top-k counts (``"logits"``, or ``"logits:1"`` for classes on axis 1);
            default: every float output shaped ``(records, classes)`` (see :func:`plan_topk`).
        slices: named views of outputs, measured as outputs of their own (and ``scores`` may name one).
        tasks: task metrics to fold (:class:`~pytest_qaccuracy.metrics.task.TaskSpec`).
        targets: one task target per record; default: the dataset's targets, else its labels, else
            none (the quantized side is then scored against the fp32 predictions).
        keep_task_errors: a task metric that raises is set aside, its values carrying the one line
            (:attr:`TaskValue.error`), instead of raising :class:`CheckError`.

    Returns:
        :class:`OutputStats` keyed by the fp32 model's output names.
    """
    options = options or RuntimeOptions()
    metadata = {p.key: p.value for p in pair.fp32.metadata_props}
    measure = OutputMeasure(ks, labels, rtol, atol, scores, slices, tasks, targets, metadata, keep_task_errors)
    dataset = data if isinstance(data, Dataset) else load_dataset(data)
    try:
        bound = bind_dataset(dataset, pair.inputs)
        names = pair.output_pairs()
        measure.begin(dataset, [f for f, _ in names])
        params = _integer_outputs(pair)
        fp32 = OrtRunner(pair.fp32, [f for f, _ in names], options, pair.fp32_path.name)
        quant = make_runner(pair.quantized, [q for _, q in names], options, pair.quantized_path.name, backend, scheme)
        with task("outputs", len(bound)) as advance:
            for batch in bound.iter_batches(options.batch_size):
                ref, test = fp32.run(batch), quant.run(batch)
                test = {f: params[q].dequantize(test[q]) if q in params else test[q] for f, q in names}
                measure.update(ref, test, batch.start, len(batch))
                advance(len(batch))
    finally:
        if not isinstance(data, Dataset):
            dataset.close()
    return measure.result()


def _count(
    counters: dict[str, TopKCounter], problems: dict[str, str], name: str, ref: np.ndarray, test: np.ndarray, labels
) -> None:
    """Fold one output into its counter; a batch it cannot count drops the counter with the reason."""
    counter = counters[name]
    if counter.layout.kind == "scores":
        test = test.astype(np.float32, copy=False)
    try:
        counter.update(ref, test, labels)
    except ValueError as exc:
        problems[name] = f"{_describe(name, ref)}: {exc}"
        del counters[name]
