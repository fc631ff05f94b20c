"""Which nodes to keep in float to get a task metric back within its tolerance.

The node ranking of the sensitivity analysis (:mod:`.sensitivity`) orders a QDQ model's quantized
nodes, most sensitive first; :func:`task_sweep` keeps the first k of them in float (their Q/DQ pairs
removed, :class:`~.partial.QdqGraph`) for k = 0, 1, ... and runs each model as deployed, scoring the
task metric, until the value meets the tolerance. Each step is a real onnxruntime run of a written
model on the same records, so the suggestion is measured, not predicted.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_qaccuracy.analysis.outputs import TaskValue, measure_outputs
from pytest_qaccuracy.analysis.partial import QdqGraph
from pytest_qaccuracy.data import Dataset, load_dataset
from pytest_qaccuracy.data.head import Head
from pytest_qaccuracy.metrics.task import TaskSpec
from pytest_qaccuracy.model.pair import ModelPair
from pytest_qaccuracy.plain import Plain
from pytest_qaccuracy.runtime import RuntimeOptions

#: Tolerance kind -> whether a value meets it: ``min:`` / ``max:`` on the quantized side, ``max_drop:``.
_MET = {
    "min": lambda v, t: v.quantized is not None and v.quantized >= t,
    "max": lambda v, t: v.quantized is not None and v.quantized <= t,
    "max_drop": lambda v, t: v.drop is not None and v.drop <= t,
}


@dataclass(frozen=True, slots=True)
class TaskSweep(Plain):
    """The steps of a task-metric sweep: nodes kept in float and the value measured; ``suggestion``
    the first list that met the tolerance (None: no list up to ``max_excluded`` nodes did)."""

    check: str
    threshold: float
    records: int
    steps: list[dict[str, Any]] = field(default_factory=list)
    suggestion: list[str] | None = None


def task_sweep(
    pair: ModelPair,
    data: Dataset | str | os.PathLike[str],
    metric: TaskSpec,
    check: str,
    threshold: float,
    order: Sequence[str],
    targets: Sequence[Any] | None = None,
    options: RuntimeOptions | None = None,
    records: int | None = None,
    max_excluded: int = 10,
) -> TaskSweep:
    """Keep the first k nodes of ``order`` in float, k = 0.., until task tolerance ``check`` is met.

    Args:
        pair: a QDQ pair.
        data: the dataset or its path.
        metric: the task metric computing the checked value.
        check: the tolerance, ``max_drop:cer``, ``min:exact_match`` or ``max:<value>``.
        threshold: its value.
        order: quantized node names, most sensitive first (the sensitivity ranking).
        targets: one target per record of the whole dataset (None: the dataset's own, or agreement).
        options: onnxruntime options.
        records: only the first N records (None: all).
        max_excluded: the most nodes kept in float.

    Raises:
        ModelError: the quantized model is not a QDQ model.
    """
    kind, _, name = check.partition(":")
    graph = QdqGraph(pair.quantized, pair.fp32, pair.quantized_path.name)
    dataset = data if isinstance(data, Dataset) else load_dataset(data)
    sample: Dataset = Head(dataset, records) if records else dataset
    count = len(sample)
    steps: list[dict[str, Any]] = []
    suggestion = None
    try:
        for k in range(min(max_excluded, len(order)) + 1):
            model = graph.build(graph.all_edges - graph.edges_of(order[:k], "node"))
            partial = ModelPair(pair.fp32, model)
            stats = measure_outputs(
                partial, sample, options=options, tasks=[metric], targets=None if targets is None else targets[:count]
            )
            value: TaskValue = stats.task[name]
            steps.append({"excluded": list(order[:k]), "quantized": value.quantized, "drop": value.drop})
            if _MET[kind](value, threshold):
                suggestion = list(order[:k])
                break
    finally:
        if not isinstance(data, Dataset):
            dataset.close()
    return TaskSweep(check, threshold, count, steps, suggestion)
