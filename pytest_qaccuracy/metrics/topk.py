"""Top-k agreement and top-k accuracy of classifier outputs, as streaming counters.

These are not registered tensor metrics: they only make sense for class scores of shape
``(records, classes)`` (Glow's rule: top-1 and top-5 accuracy may drop by at most 0.5 %).

- agreement@k: the fraction of records whose fp32 top-1 class is among the quantized top-k classes
  (agreement@1 is plain top-1 agreement);
- accuracy@k: the fraction of records whose label is among the model's top-k classes;
- drop@k: accuracy@k of the fp32 model minus accuracy@k of the quantized model.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np


def as_scores(scores: np.ndarray, what: str = "scores") -> np.ndarray:
    """Class scores as a 2-D ``(records, classes)`` array; ``(classes,)`` is one record."""
    array = np.asarray(scores)
    if array.ndim == 1:
        array = array[np.newaxis]
    elif array.ndim > 2:
        if len([d for d in array.shape[1:] if d != 1]) > 1:
            raise ValueError(f"{what}: expected class scores (records, classes), got shape {array.shape}")
        array = array.reshape(array.shape[0], -1)
    if array.ndim != 2 or array.shape[1] < 1:
        raise ValueError(f"{what}: expected class scores (records, classes), got shape {np.shape(scores)}")
    return array


def topk_indices(scores: np.ndarray, k: int) -> np.ndarray:
    """The k highest-scoring classes per record, best first (ties go to the lower class index)."""
    k = min(k, scores.shape[1])
    order = np.argsort(-scores, axis=1, kind="stable")
    return order[:, :k]


def in_topk(scores: np.ndarray, targets: np.ndarray, k: int) -> np.ndarray:
    """A boolean per record: is ``targets[r]`` among the top-k classes of ``scores[r]``?"""
    return (topk_indices(scores, k) == np.asarray(targets).reshape(-1, 1)).any(axis=1)


@dataclass(slots=True)
class TopKCounter:
    """Counts over records for each k: agreement, and accuracy of both models when labels are given.

    State is a handful of integers per k, so ``update`` can run batch by batch and ``merge`` is exact.
    """

    ks: tuple[int, ...] = (1,)
    records: int = 0
    labelled: int = 0
    agree: dict[int, int] = field(default_factory=dict)
    ref_correct: dict[int, int] = field(default_factory=dict)
    test_correct: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ks = tuple(sorted({int(k) for k in self.ks}))
        if not self.ks or self.ks[0] < 1:
            raise ValueError(f"k must be >= 1, got {self.ks}")
        for counts in (self.agree, self.ref_correct, self.test_correct):
            for k in self.ks:
                counts.setdefault(k, 0)

    def update(self, reference: np.ndarray, test: np.ndarray, labels: np.ndarray | None = None) -> None:
        """Fold one batch of fp32 (``reference``) and quantized (``test``) class scores."""
        ref, tst = as_scores(reference, "reference"), as_scores(test, "actual")
        if ref.shape != tst.shape:
            raise ValueError(f"score shapes differ: actual {tst.shape}, reference {ref.shape}")
        ref_top1 = topk_indices(ref, 1)[:, 0]
        for k in self.ks:
            self.agree[k] += int(in_topk(tst, ref_top1, k).sum())
        self.records += ref.shape[0]
        if labels is not None:
            labels = np.asarray(labels).reshape(-1)
            if labels.shape[0] != ref.shape[0]:
                raise ValueError(f"{labels.shape[0]} labels for {ref.shape[0]} records")
            for k in self.ks:
                self.ref_correct[k] += int(in_topk(ref, labels, k).sum())
                self.test_correct[k] += int(in_topk(tst, labels, k).sum())
            self.labelled += labels.shape[0]

    def merge(self, other: TopKCounter) -> None:
        if other.ks != self.ks:
            raise ValueError(f"cannot merge counters for k={other.ks} into k={self.ks}")
        self.records += other.records
        self.labelled += other.labelled
        for k in self.ks:
            self.agree[k] += other.agree[k]
            self.ref_correct[k] += other.ref_correct[k]
            self.test_correct[k] += other.test_correct[k]

    def agreement(self, k: int = 1) -> float | None:
        return self.agree[k] / self.records if self.records else None

    def accuracy(self, k: int = 1) -> tuple[float, float] | None:
        """(fp32 accuracy@k, quantized accuracy@k), or None without labels."""
        if not self.labelled:
            return None
        return self.ref_correct[k] / self.labelled, self.test_correct[k] / self.labelled

    def drop(self, k: int = 1) -> float | None:
        acc = self.accuracy(k)
        return None if acc is None else acc[0] - acc[1]

    def to_dict(self) -> dict[str, object]:
        """Plain builtins: ``{"records", "labelled", "k": {"1": {...}}}``."""
        per_k: dict[str, dict[str, float | None]] = {}
        for k in self.ks:
            acc = self.accuracy(k)
            per_k[str(k)] = {
                "agreement": self.agreement(k),
                "fp32_accuracy": None if acc is None else acc[0],
                "quantized_accuracy": None if acc is None else acc[1],
                "accuracy_drop": self.drop(k),
            }
        return {"records": self.records, "labelled": self.labelled, "k": per_k}


def topk_counter(
    reference: np.ndarray, test: np.ndarray, ks: Iterable[int] = (1,), labels: np.ndarray | None = None
) -> TopKCounter:
    """Count all records at once (see :class:`TopKCounter`)."""
    counter = TopKCounter(tuple(ks))
    counter.update(reference, test, labels)
    return counter


__all__ = ["TopKCounter", "as_scores", "in_topk", "topk_counter", "topk_indices"]
