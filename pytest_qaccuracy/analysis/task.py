"""Task metrics of a model pair, as a library call: what the plugin gates on, for any caller (a
recipe search that aims at a character error rate, a notebook).

``evaluate_task_metrics(fp32, quantized, data, ["ctc"])`` runs both models over the data once and
returns every value of every task metric on both sides (:class:`~.outputs.TaskValue`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_qaccuracy.analysis.outputs import TaskValue, measure_outputs
from pytest_qaccuracy.data import Dataset, load_dataset
from pytest_qaccuracy.data.targets import read_sidecar
from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.metrics.task import TaskSpec, parse_task_specs
from pytest_qaccuracy.model.pair import ModelPair
from pytest_qaccuracy.runtime import RuntimeOptions


def evaluate_task_metrics(
    fp32: str | os.PathLike[str] | ModelPair,
    quantized: str | os.PathLike[str] | None,
    data: Dataset | str | os.PathLike[str],
    metrics: Sequence[str | TaskSpec | dict[str, Any]],
    targets: Sequence[Any] | str | os.PathLike[str] | None = None,
    options: RuntimeOptions | None = None,
    backend: str = "onnxruntime",
    scheme: str | None = None,
) -> dict[str, TaskValue]:
    """Every value of the task ``metrics`` for the fp32 and the quantized model over ``data``.

    Args:
        fp32: the fp32 model's path, or a loaded :class:`ModelPair` (then ``quantized`` is None).
        quantized: the quantized model's path.
        data: the dataset or its path.
        metrics: task metrics: ``"pkg.mod:Class"``, a built-in name (``"ctc"``), ``{"metric": ..., <options>}``
            or :class:`TaskSpec`.
        targets: one target per record, or a JSON-lines sidecar file; default: the dataset's
            targets, else its labels, else none (the quantized side then scored against the fp32 one).
        options: onnxruntime options.
        backend: ``onnxruntime`` or ``integer`` for the quantized model.
        scheme: the integer backend's scheme preset.

    Returns:
        value name -> :class:`TaskValue` (``fp32``, ``quantized``, ``drop``, ``against``, ``records``).

    Raises:
        InputError: a metric that cannot be imported or created, targets that do not fit the records.
        CheckError: a metric raised on a batch (the message names the metric and the records).
    """
    try:
        specs = parse_task_specs(list(metrics))
    except ValueError as exc:
        raise InputError(str(exc)) from None
    pair = fp32 if isinstance(fp32, ModelPair) else ModelPair(fp32, quantized)
    dataset = data if isinstance(data, Dataset) else load_dataset(data)
    try:
        if isinstance(targets, (str, os.PathLike)):
            targets = read_sidecar(Path(targets), len(dataset))
        stats = measure_outputs(
            pair, dataset, options=options, backend=backend, scheme=scheme, tasks=specs, targets=targets
        )
    finally:
        if not isinstance(data, Dataset):
            dataset.close()
    return stats.task
