"""Measuring a recipe's model: its outputs against the fp32 model's on held-out records, on each
deployment target, with the pair's own output metrics.

The fp32 outputs of the evaluation records are computed once and kept (outputs only, not layers),
so an experiment runs only the quantized model, once per target: ``onnxruntime`` is a real
onnxruntime session on this host (default optimizations, as deployed); any other name is a scheme
preset of the emulated integer backend (``onnxruntime-avx2``, ``onnxruntime-vnni``, ...:
docs/cpus.md), so a recipe is measured on a CPU family this host is not.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from pytest_qaccuracy.analysis.recipe.checks import Check
from pytest_qaccuracy.analysis.slices import SliceSpec, check_outputs
from pytest_qaccuracy.data import Dataset, bind_dataset, load_dataset
from pytest_qaccuracy.data.binding import Batch
from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.metrics import TensorPair, get_metric
from pytest_qaccuracy.model.graph import GraphView
from pytest_qaccuracy.model.loading import graph_inputs, load_model
from pytest_qaccuracy.model.matching import FLOAT_TYPES
from pytest_qaccuracy.model.pair import ModelPair
from pytest_qaccuracy.presets import HOST, NAMES, split_release
from pytest_qaccuracy.runtime import OrtRunner, RuntimeOptions, make_runner

if TYPE_CHECKING:
    from pytest_qaccuracy.analysis.outputs import OutputMeasure
    from pytest_qaccuracy.metrics.task import TaskSpec

#: Margins above this count as this (an infinite SQNR must not outweigh other checks' figures).
_CAP = 1e6
#: target -> output -> metric -> value (None: undefined, e.g. NaN outputs); task values under :data:`TASK`
Measured = dict[str, dict[str, dict[str, float | None]]]
#: The pseudo output that holds a model's task-metric values in :data:`Measured`.
TASK = "(task)"
#: Below 0 by this much: the margin of a strict check (``>``, ``<``) exactly at its bound.
_AT_BOUND = 1e-12
#: Tensor metrics that read the quantized output's step (its scale and zero point).
STEP_METRICS = frozenset({"lsb", "clipped"})


def check_values(check: Check, per_output: Mapping[str, Mapping[str, float | None]]) -> list[float | None]:
    """The check's values on one target: of its one output (:attr:`Check.output`), else of every
    output that has its metric."""
    return [
        metrics[check.metric]
        for name, metrics in per_output.items()
        if check.metric in metrics and (check.output is None or name == check.output)
    ]


def check_targets(names: Sequence[str]) -> tuple[str, ...]:
    """Deployment targets: ``onnxruntime`` (this host's own session) and scheme presets; InputError otherwise."""
    for name in names:
        try:
            preset, _ = split_release(name)
        except ValueError as exc:
            raise InputError(f"deployment target {exc}") from None
        if preset not in NAMES:
            raise InputError(f"unknown deployment target {name!r}; expected one of {', '.join(NAMES)}")
    if not names:
        raise InputError("give at least one deployment target")
    return tuple(dict.fromkeys(names))


@dataclass(frozen=True, slots=True)
class Verdict:
    """A measured model: its metrics, whether every check holds on every target and output, and by
    how much (``margin``: the worst check's relative distance to its threshold, >= 0 when met)."""

    measured: Measured
    passed: bool
    margin: float


def judge(measured: Measured, checks: Sequence[Check]) -> Verdict:
    """Every check on every target, on its output or on every output that has its value (a check no
    output has is unmet); the margin is the worst relative distance to a bound (floored by the check's
    scale; a strict check exactly at its bound is just below 0)."""
    margins = []
    for per_output in measured.values():
        for check in checks:
            values = check_values(check, per_output)
            if not values:
                margins.append(-math.inf)
            for value in values:
                if value is None or math.isnan(value):
                    margins.append(-math.inf)
                    continue
                gap = value - check.value if check.higher_is_better else check.value - value
                margin = min(gap / max(abs(check.value), check.scale), _CAP)
                margins.append(-_AT_BOUND if check.strict and gap <= 0 and margin >= 0 else margin)
    margin = min(margins) if margins else -math.inf
    return Verdict(measured, margin >= 0, margin)


class Evaluator:
    """The evaluation records and their fp32 outputs, computed once; :meth:`measure` runs a model.

    Args:
        fp32: the fp32 model's path.
        data: the held-out evaluation records (path or open dataset).
        checks: the targets the metrics are measured for (:mod:`.checks`).
        targets: deployment targets (:func:`check_targets`).
        options: onnxruntime options (batch size, threads, providers).
        tasks: task metrics the task checks read (:class:`~pytest_qaccuracy.metrics.task.TaskSpec`).
        task_targets: one task target per evaluation record; default: the dataset's targets, else
            its labels, else none (the quantized side scored against the fp32 one).
    """

    def __init__(
        self,
        fp32: str | os.PathLike[str],
        data: Dataset | str | os.PathLike[str],
        checks: Sequence[Check],
        targets: Sequence[str],
        options: RuntimeOptions,
        tasks: Sequence[TaskSpec] = (),
        task_targets: Sequence[Any] | None = None,
    ) -> None:
        self.fp32, self.checks, self.targets, self.options = str(fp32), list(checks), tuple(targets), options
        self.metrics = list(dict.fromkeys(c.metric for c in checks if c.kind == "tensor" and c.view is None))
        # named views of outputs (a view's own tolerance): measured like outputs, under the view's name
        self.views = {c.output: SliceSpec(c.output, c.view) for c in self.checks if c.view and c.output}
        self.view_metrics = {
            name: list(dict.fromkeys(c.metric for c in self.checks if c.output == name and c.kind == "tensor"))
            for name in self.views
        }
        self.tasks = list(tasks)
        proto = load_model(self.fp32)
        self.metadata = {p.key: p.value for p in proto.metadata_props}
        types = GraphView(proto).elem_types  # float outputs only: an int64 label output has no error
        self.outputs = [v.name for v in proto.graph.output if types.get(v.name) in FLOAT_TYPES]
        if not self.outputs:
            raise InputError(f"{self.fp32}: no float output to measure")
        try:  # before the data is read
            check_outputs(list(self.views.values()), self.outputs)
        except ValueError as exc:
            raise InputError(f"{self.fp32}: {exc}") from None
        dataset = data if isinstance(data, Dataset) else load_dataset(data)
        try:
            bound = bind_dataset(dataset, graph_inputs(proto))
            self.batches: list[Batch] = list(bound.iter_batches(options.batch_size))
            self.snapshot = _Snapshot(dataset.name, len(dataset), dataset.labels(), dataset.targets())
        finally:
            if not isinstance(data, Dataset):
                dataset.close()
        if task_targets is not None:
            self.snapshot = replace(self.snapshot, stored_targets=list(task_targets))
        self._check_inputs()
        runner = OrtRunner(proto, self.outputs, options, f"{os.path.basename(self.fp32)} (fp32)")
        self.reference = [runner.run(batch) for batch in self.batches]
        self.records = sum(len(b) for b in self.batches)

    def _check_inputs(self) -> None:
        """InputError before any run: a top-k drop without labels, a task check without its metric."""
        for check in self.checks:
            if check.kind == "topk" and check.metric.startswith("max_") and self.snapshot.stored_labels is None:
                raise InputError(f"target {check}: the evaluation data {self.snapshot.name} has no labels")
        wanted = [c for c in self.checks if c.kind == "task"]
        if wanted:
            if not self.tasks:
                raise InputError(f"target {wanted[0]}: name the task metric that computes it (--task-metric)")
            known = {name for spec in self.tasks for name in spec.value_names(spec.create())}
            for check in wanted:
                if check.task_value not in known:
                    raise InputError(
                        f"target {check}: no task metric computes {check.task_value!r} "
                        f"(they compute: {', '.join(sorted(known))})"
                    )

    def measure(self, model: str | os.PathLike[str], targets: Sequence[str] | None = None) -> Verdict:
        """Run ``model`` on every target (or on ``targets``) and judge it; InputError when a target
        cannot run it."""
        pair = ModelPair(self.fp32, str(model))
        names = [(f, q) for f, q in pair.output_pairs() if f in self.outputs]
        measured: Measured = {}
        for target in self.targets if targets is None else targets:
            measured[target] = self._run(pair, names, target)
        return judge(measured, self.checks)

    def _steps(self, pair: ModelPair, names: list[tuple[str, str]]) -> dict[str, Any]:
        """fp32 output -> the quantized output's scale and zero point (``QuantParams``), when a
        check's metric reads them (:data:`STEP_METRICS`), as the pair's comparison reads them."""
        wanted = {m for per in [self.metrics, *self.view_metrics.values()] for m in per}
        if not wanted & STEP_METRICS:
            return {}
        found = {f: pair.matcher.resolve(q, follow_quantize=False)[2] for f, q in names}
        return {f: params for f, params in found.items() if params is not None}

    def _output_measure(self, names: list[tuple[str, str]]) -> OutputMeasure | None:
        """Top-k, allclose and task folds for the checks that need them (None: tensor checks only)."""
        from pytest_qaccuracy.analysis.outputs import OutputMeasure

        kinds = {c.kind for c in self.checks}
        if not kinds - {"tensor"}:
            return None
        close = next((c for c in self.checks if c.kind == "allclose"), None)
        measure = OutputMeasure(
            ks=sorted({c.k for c in self.checks if c.kind == "topk"} or {1}),
            rtol=None if close is None else close.rtol,
            atol=None if close is None else close.atol,
            tasks=self.tasks if "task" in kinds else (),
            targets=self.snapshot.stored_targets,
            metadata=self.metadata,
        )
        measure.begin(self.snapshot, [f for f, _ in names])
        return measure

    def _run(self, pair: ModelPair, names: list[tuple[str, str]], target: str) -> dict[str, dict[str, float | None]]:
        label = f"{pair.quantized_path.name} ({target})"
        q_names = [q for _, q in names]
        if target == HOST:
            runner = OrtRunner(pair.quantized, q_names, self.options, label)
        else:
            runner = make_runner(pair.quantized, q_names, self.options, label, "integer", target)
        metrics = {f: {m: get_metric(m)() for m in self.metrics} for f, _ in names}
        measured = {f for f, _ in names}
        views = {n: v for n, v in self.views.items() if v.output in measured}
        metrics.update({n: {m: get_metric(m)() for m in self.view_metrics[n]} for n in views})
        steps = self._steps(pair, names)
        folds = self._output_measure(names)
        for batch, ref in zip(self.batches, self.reference, strict=True):
            test = runner.run(batch)
            quantized = {}
            for f, q in names:
                values = np.asarray(test[q], dtype=np.float64) if test[q].dtype.kind != "f" else test[q]
                quantized[f] = np.asarray(values, dtype=ref[f].dtype)
            tensors = [(f, np.asarray(ref[f]), quantized[f], steps.get(f)) for f, _ in names]
            tensors += [(n, v.take(np.asarray(ref[v.output])), v.take(quantized[v.output]), steps.get(v.output))
                        for n, v in views.items()]  # fmt: skip
            for name, f_values, q_values, params in tensors:
                step = {} if params is None else {"scale": params.scale, "axis": params.axis}
                zero = {} if params is None else {"zero_point": params.zero_point}
                tensor = TensorPair(f_values, q_values, first_record=batch.start, **step, **zero)
                for metric in metrics[name].values():
                    metric.update(tensor)
            if folds is not None:
                folds.update({f: ref[f] for f, _ in names}, quantized, batch.start, len(batch))
        out = {f: {m: _finite(metric.result()[0]) for m, metric in per.items()} for f, per in metrics.items()}
        if folds is not None:
            _fold_values(out, folds.result(), self.checks)
        return out


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """What :class:`~pytest_qaccuracy.analysis.outputs.OutputMeasure` reads of the evaluation dataset
    (kept: the dataset itself is closed after its records are read)."""

    name: str
    count: int
    stored_labels: Any
    stored_targets: Any

    def __len__(self) -> int:
        return self.count

    def labels(self) -> Any:
        return self.stored_labels

    def targets(self) -> Any:
        return self.stored_targets


def _fold_values(out: dict[str, dict[str, float | None]], stats: Any, checks: Sequence[Check]) -> None:
    """The non-tensor checks' values into ``out`` (output -> key -> value): allclose and top-k per
    output, task values under :data:`TASK`."""
    for check in checks:
        if check.kind == "allclose":
            for f, rel in stats.relative.items():
                if f in out:
                    out[f][check.metric] = rel.violations / max(rel.elements, 1)
        elif check.kind == "topk":
            field = "accuracy_drop" if check.metric.startswith("max_") else "agreement"
            for f, counted in stats.topk.items():
                if f in out:
                    out[f][check.metric] = _finite(counted["k"][str(check.k)][field])
        elif check.kind == "task":
            kind = check.metric.partition(":")[0]
            value = stats.task.get(check.task_value)
            number = None if value is None else value.drop if kind == "max_drop" else value.quantized
            out.setdefault(TASK, {})[check.metric] = _finite(number)


def _finite(value: float | None) -> float | None:
    """NaN is undefined; an infinite SQNR (identical outputs) stays infinite, and meets any target."""
    return None if value is None or math.isnan(value) else float(value)
