"""A task metric of the digits example: the recall of the worst-recognised digit.

Top-1 accuracy can hide one digit the quantized model has stopped reading; this metric gates on the
weakest class. It implements the task-metric protocol directly (``update``, ``merge``, ``compute``;
docs/pytest.md, "Task metrics"): its state is two arrays of counts per side, which merge by addition.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

CLASSES = 10


class WorstClassRecall:
    """``worst_class_recall``: min over digits d of (records of d read as d) / (records of d)."""

    higher_is_better: ClassVar[dict[str, bool]] = {"worst_class_recall": True}

    def __init__(self, output: str = "logits") -> None:
        self.output = output
        self.state = {
            side: {"hits": np.zeros(CLASSES, np.int64), "seen": np.zeros(CLASSES, np.int64)}
            for side in ("fp32", "quantized")
        }

    def update(self, fp32, quantized, targets):
        predicted = {"fp32": fp32[self.output].argmax(axis=1), "quantized": quantized[self.output].argmax(axis=1)}
        # without targets (a dataset without labels), the fp32 model's answers are the truth
        truth = predicted["fp32"] if targets is None else np.asarray(targets, np.int64)
        for side, answer in predicted.items():
            self.state[side]["seen"] += np.bincount(truth, minlength=CLASSES)
            self.state[side]["hits"] += np.bincount(truth[answer == truth], minlength=CLASSES)

    def merge(self, other):
        for side, counts in other.state.items():
            for key, value in counts.items():
                self.state[side][key] += value

    def compute(self):
        found = {}
        for side, counts in self.state.items():
            present = counts["seen"] > 0
            recall = counts["hits"][present] / counts["seen"][present]
            found[side] = {"worst_class_recall": float(recall.min()) if present.any() else None}
        return found
