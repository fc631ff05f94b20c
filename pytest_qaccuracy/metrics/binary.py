"""Binary F1 with a threshold: a detector of one thing per record or per frame (voice activity).

A prediction is positive when the output's value is at least ``threshold``; a target is positive
when it is non-zero (``True``, ``1``). Over all predictions of all records,
``f1 = 2 TP / (2 TP + FP + FN)``, with ``precision = TP / (TP + FP)`` and ``recall = TP / (TP + FN)``.
Without targets, the fp32 model's decisions are the targets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from pytest_qaccuracy.metrics.task import TaskMetric, ratio


class BinaryF1(TaskMetric):
    """``f1`` (higher is better) of thresholded probabilities, one decision per output element.

    Args:
        output: the probability output; default: the first.
        threshold: a value at or above it is a positive decision (0.5).
    """

    higher_is_better: ClassVar[Mapping[str, bool]] = {"f1": True}

    def __init__(self, output: str | None = None, threshold: float = 0.5) -> None:
        super().__init__()
        self.output, self.threshold = output, float(threshold)

    def decode(self, outputs: Mapping[str, Any]) -> np.ndarray:
        values = np.asarray(outputs[self.output or next(iter(outputs))])
        return values.reshape(values.shape[0], -1) >= self.threshold

    def as_targets(self, predictions: Sequence[Any]) -> np.ndarray:
        return np.asarray(predictions)

    def score(self, predictions: Sequence[Any], targets: Sequence[Any]) -> dict[str, int]:
        predicted = np.asarray(predictions, bool)
        truth = np.asarray([np.asarray(t).reshape(-1) for t in targets]) != 0
        if truth.shape != predicted.shape:
            raise ValueError(f"targets of shape {truth.shape[1:]} per record, predictions {predicted.shape[1:]}")
        tp = int(np.count_nonzero(predicted & truth))
        return {"tp": tp, "fp": int(np.count_nonzero(predicted)) - tp, "fn": int(np.count_nonzero(truth)) - tp}

    def finish(self, sums: Mapping[str, int | float]) -> dict[str, float | None]:
        tp, fp, fn = sums.get("tp", 0), sums.get("fp", 0), sums.get("fn", 0)
        return {"f1": ratio(2 * tp, 2 * tp + fp + fn)}
