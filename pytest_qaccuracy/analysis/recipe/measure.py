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
from dataclasses import dataclass

import numpy as np

from pytest_qaccuracy.analysis.sweep import Target
from pytest_qaccuracy.data import Dataset, bind_dataset, load_dataset
from pytest_qaccuracy.data.binding import Batch
from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.metrics import TensorPair, get_metric
from pytest_qaccuracy.model.graph import GraphView
from pytest_qaccuracy.model.loading import graph_inputs, load_model
from pytest_qaccuracy.model.matching import FLOAT_TYPES
from pytest_qaccuracy.model.pair import ModelPair
from pytest_qaccuracy.runtime import OrtRunner, RuntimeOptions, make_runner

#: The target that is this host's own onnxruntime session (every other target is a scheme preset).
HOST = "onnxruntime"
#: Values a metric can take at all, for refusing targets no model can meet (``cosine>=1.5``).
_BOUNDS = {"cosine": (-1.0, 1.0)}

#: Margins above this count as this (an infinite SQNR must not outweigh other checks' figures).
_CAP = 1e6
#: target -> output -> metric -> value (None: undefined, e.g. NaN outputs)
Measured = dict[str, dict[str, dict[str, float | None]]]


def parse_checks(texts: Sequence[str]) -> list[Target]:
    """``["cosine>=0.99", "sqnr>=20"]`` -> targets; InputError for a malformed or impossible one."""
    checks = []
    for text in texts:
        check = Target.parse(text)  # unknown metric, bad syntax, wrong direction: InputError
        lo, hi = _BOUNDS.get(check.metric, (-math.inf, math.inf))
        if not get_metric(check.metric).higher_is_better:
            lo = 0.0  # every lower-is-better metric is an error: never below 0
        if not math.isfinite(check.value) or (check.higher_is_better and check.value > hi) or check.value < lo:
            raise InputError(f"target {text!r}: no model can meet it ({check.metric} lies in [{lo:g}, {hi:g}])")
        checks.append(check)
    if not checks:
        raise InputError("give at least one target, e.g. cosine>=0.99")
    return checks


def check_targets(names: Sequence[str]) -> tuple[str, ...]:
    """Deployment targets: ``onnxruntime`` (this host) and scheme presets; InputError otherwise."""
    from pytest_qaccuracy.backend.scheme import PRESETS

    known = (HOST, *PRESETS)
    for name in names:
        if name not in known:
            raise InputError(f"unknown deployment target {name!r}; expected one of {', '.join(known)}")
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

    def worst(self, check: Target) -> float | None:
        """The check's metric at its worst target and output."""
        values = [m.get(check.metric) for per in self.measured.values() for m in per.values()]
        if any(v is None for v in values) or not values:
            return None
        return min(values) if check.higher_is_better else max(values)


def judge(measured: Measured, checks: Sequence[Target]) -> Verdict:
    """Every check on every target and output; the margin is the worst relative distance."""
    margins = []
    for per_output in measured.values():
        for metrics in per_output.values():
            for check in checks:
                value = metrics.get(check.metric)
                if value is None or math.isnan(value):
                    margins.append(-math.inf)
                    continue
                gap = value - check.value if check.higher_is_better else check.value - value
                margins.append(min(gap / max(abs(check.value), 1e-12), _CAP))
    margin = min(margins) if margins else -math.inf
    return Verdict(measured, margin >= 0, margin)


class Evaluator:
    """The evaluation records and their fp32 outputs, computed once; :meth:`measure` runs a model.

    Args:
        fp32: the fp32 model's path.
        data: the held-out evaluation records (path or open dataset).
        checks: the targets the metrics are measured for.
        targets: deployment targets (:func:`check_targets`).
        options: onnxruntime options (batch size, threads, providers).
    """

    def __init__(
        self,
        fp32: str | os.PathLike[str],
        data: Dataset | str | os.PathLike[str],
        checks: Sequence[Target],
        targets: Sequence[str],
        options: RuntimeOptions,
    ) -> None:
        self.fp32, self.checks, self.targets, self.options = str(fp32), list(checks), tuple(targets), options
        self.metrics = list(dict.fromkeys(c.metric for c in checks))
        proto = load_model(self.fp32)
        dataset = data if isinstance(data, Dataset) else load_dataset(data)
        try:
            bound = bind_dataset(dataset, graph_inputs(proto))
            self.batches: list[Batch] = list(bound.iter_batches(options.batch_size))
        finally:
            if not isinstance(data, Dataset):
                dataset.close()
        types = GraphView(proto).elem_types  # float outputs only: an int64 label output has no error
        self.outputs = [v.name for v in proto.graph.output if types.get(v.name) in FLOAT_TYPES]
        if not self.outputs:
            raise InputError(f"{self.fp32}: no float output to measure")
        runner = OrtRunner(proto, self.outputs, options, f"{os.path.basename(self.fp32)} (fp32)")
        self.reference = [runner.run(batch) for batch in self.batches]
        self.records = sum(len(b) for b in self.batches)

    def measure(self, model: str | os.PathLike[str], targets: Sequence[str] | None = None) -> Verdict:
        """Run ``model`` on every target (or on ``targets``) and judge it; InputError when a target
        cannot run it."""
        pair = ModelPair(self.fp32, str(model))
        names = [(f, q) for f, q in pair.output_pairs() if f in self.outputs]
        measured: Measured = {}
        for target in self.targets if targets is None else targets:
            measured[target] = self._run(pair, names, target)
        return judge(measured, self.checks)

    def _run(self, pair: ModelPair, names: list[tuple[str, str]], target: str) -> dict[str, dict[str, float | None]]:
        label = f"{pair.quantized_path.name} ({target})"
        q_names = [q for _, q in names]
        if target == HOST:
            runner = OrtRunner(pair.quantized, q_names, self.options, label)
        else:
            runner = make_runner(pair.quantized, q_names, self.options, label, "integer", target)
        metrics = {f: {m: get_metric(m)() for m in self.metrics} for f, _ in names}
        for batch, ref in zip(self.batches, self.reference, strict=True):
            test = runner.run(batch)
            for f, q in names:
                values = np.asarray(test[q], dtype=np.float64) if test[q].dtype.kind != "f" else test[q]
                tensor = TensorPair(
                    np.asarray(ref[f]), np.asarray(values, dtype=ref[f].dtype), first_record=batch.start
                )
                for metric in metrics[f].values():
                    metric.update(tensor)
        return {f: {m: _finite(metric.result()[0]) for m, metric in per.items()} for f, per in metrics.items()}


def _finite(value: float | None) -> float | None:
    """NaN is undefined; an infinite SQNR (identical outputs) stays infinite, and meets any target."""
    return None if value is None or math.isnan(value) else float(value)


def describe(verdict: Verdict, checks: Sequence[Target]) -> Mapping[str, str]:
    """Per target, the checked metrics at their worst output: ``{"onnxruntime": "cosine 0.9931"}``."""
    from pytest_qaccuracy.numbers import format_metric

    lines = {}
    for target, per_output in verdict.measured.items():
        parts = []
        for check in checks:
            values = [m.get(check.metric) for m in per_output.values()]
            worst = None if any(v is None for v in values) else (min if check.higher_is_better else max)(values)
            parts.append(f"{check.metric} {format_metric(check.metric, worst) if worst is not None else 'undefined'}")
        lines[target] = ", ".join(parts)
    return lines


__all__ = ["HOST", "Evaluator", "Measured", "Verdict", "check_targets", "describe", "judge", "parse_checks"]
