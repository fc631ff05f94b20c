"""Output-level statistics that need elements rather than sums: top-k agreement and accuracy, and
elements outside ``atol + rtol * |fp32|``.

Both models run once more with only their outputs fetched (cheap next to a layer-wise comparison).
Everything streams: the state is counters and a few worst elements per output.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pytest_qaccuracy.data import Dataset, bind_dataset, load_dataset
from pytest_qaccuracy.metrics.topk import TopKCounter, as_scores
from pytest_qaccuracy.model.graph import GraphView
from pytest_qaccuracy.model.matching import FLOAT_TYPES
from pytest_qaccuracy.model.pair import ModelPair
from pytest_qaccuracy.model.quant_params import QuantParams, find_quant_params
from pytest_qaccuracy.runtime import OrtRunner, RuntimeOptions, make_runner

WORST_ELEMENTS = 5


@dataclass(frozen=True, slots=True)
class RelativeStats:
    """Elements of one output outside ``atol + rtol * |f|``; ``worst`` rows are (record, index, q, f)."""

    rtol: float
    atol: float
    violations: int
    elements: int
    max_abs: float
    max_rel: float | None
    worst: list[tuple[int, str, float, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rtol": self.rtol,
            "atol": self.atol,
            "violations": self.violations,
            "elements": self.elements,
            "max_abs": self.max_abs,
            "max_rel": self.max_rel,
            "worst": [list(row) for row in self.worst],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RelativeStats:
        worst = [(int(r), str(i), float(q), float(f)) for r, i, q, f in data.get("worst", [])]
        return cls(
            float(data["rtol"]),
            float(data["atol"]),
            int(data["violations"]),
            int(data["elements"]),
            float(data["max_abs"]),
            None if data.get("max_rel") is None else float(data["max_rel"]),
            worst,
        )


class _RelativeTracker:
    def __init__(self, rtol: float, atol: float) -> None:
        self.rtol, self.atol = rtol, atol
        self.violations = self.elements = 0
        self.max_abs, self.max_rel = 0.0, 0.0
        self.heap: list[tuple[float, int, str, float, float]] = []

    def update(self, ref: np.ndarray, test: np.ndarray, first_record: int) -> None:
        f, q = ref.astype(np.float64), test.astype(np.float64)
        diff = np.abs(q - f)
        bad = ~(diff <= self.atol + self.rtol * np.abs(f))
        self.elements += diff.size
        if not bad.any():
            return
        self.violations += int(bad.sum())
        self.max_abs = max(self.max_abs, float(np.nan_to_num(diff[bad], nan=np.inf).max()))
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.where(f != 0, diff / np.abs(f), np.inf)
        self.max_rel = max(self.max_rel, float(np.nan_to_num(rel[bad], nan=np.inf).max()))
        margin = np.nan_to_num(diff - (self.atol + self.rtol * np.abs(f)), nan=np.inf)
        for flat in np.argsort(-np.where(bad, margin, -np.inf), axis=None)[:WORST_ELEMENTS]:
            index = np.unravel_index(int(flat), f.shape)
            row = (float(margin[index]), first_record + int(index[0]), str(list(map(int, index[1:]))))
            item = (*row, float(q[index]), float(f[index]))
            if len(self.heap) < WORST_ELEMENTS:
                heapq.heappush(self.heap, item)
            elif item > self.heap[0]:
                heapq.heapreplace(self.heap, item)

    def result(self) -> RelativeStats:
        worst = [(r, i, q, f) for _, r, i, q, f in sorted(self.heap, reverse=True)]
        max_rel = self.max_rel if np.isfinite(self.max_rel) else None
        max_abs = self.max_abs if np.isfinite(self.max_abs) else float("inf")
        return RelativeStats(self.rtol, self.atol, self.violations, self.elements, max_abs, max_rel, worst)


@dataclass(frozen=True, slots=True)
class OutputStats:
    """Per output name: top-k counts (class-score outputs only) and relative-tolerance stats."""

    topk: dict[str, dict[str, Any]]
    relative: dict[str, RelativeStats]

    def to_dict(self) -> dict[str, Any]:
        return {"topk": self.topk, "relative": {k: v.to_dict() for k, v in self.relative.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OutputStats:
        return cls(dict(data["topk"]), {k: RelativeStats.from_dict(v) for k, v in data["relative"].items()})


def _is_scores(array: np.ndarray) -> bool:
    try:
        return as_scores(array).shape[1] >= 2
    except ValueError:
        return False


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

    Returns:
        :class:`OutputStats` keyed by the fp32 model's output names.
    """
    options = options or RuntimeOptions()
    dataset = data if isinstance(data, Dataset) else load_dataset(data)
    try:
        if labels is None:
            labels = dataset.labels()
        bound = bind_dataset(dataset, pair.inputs)
        names = pair.output_pairs()
        params = _integer_outputs(pair)
        fp32 = OrtRunner(pair.fp32, [f for f, _ in names], options, pair.fp32_path.name)
        quant = make_runner(pair.quantized, [q for _, q in names], options, pair.quantized_path.name, backend, scheme)
        counters: dict[str, TopKCounter | None] = {}
        relative = {f: _RelativeTracker(rtol or 0.0, atol or 0.0) for f, _ in names} if rtol or atol else {}
        for batch in bound.iter_batches(options.batch_size):
            ref, test = fp32.run(batch), quant.run(batch)
            test = {q: params[q].dequantize(t) if q in params else t for q, t in test.items()}
            batch_labels = None if labels is None else np.asarray(labels)[batch.start : batch.start + len(batch)]
            for f, q in names:
                if f not in counters:
                    counters[f] = TopKCounter(tuple(ks)) if _is_scores(ref[f]) else None
                if counters[f] is not None:
                    counters[f].update(ref[f], test[q].astype(np.float32), batch_labels)
                if f in relative:
                    relative[f].update(ref[f], test[q], batch.start)
    finally:
        if not isinstance(data, Dataset):
            dataset.close()
    return OutputStats(
        {name: c.to_dict() for name, c in counters.items() if c is not None},
        {name: r.result() for name, r in relative.items()},
    )


__all__ = ["OutputStats", "RelativeStats", "measure_outputs"]
