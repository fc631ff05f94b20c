"""Top-k agreement and top-k accuracy of classifier outputs, as streaming counters.

These are not registered tensor metrics: they only make sense for class scores (Glow's rule: top-1
and top-5 accuracy may drop by at most 0.5 %). A *unit* is what one class decision is made for:

- a record, for scores ``(records, classes)``;
- a position, for sequence scores ``(records, positions..., classes)`` with the classes on one axis
  (a CTC recognizer's time steps, a token model's tokens): every position is a unit;
- a record or position of an integer *label* output (scikit-learn's ``label``), top-1 only.

- agreement@k: the fraction of units whose fp32 top-1 class is among the quantized top-k classes
  (agreement@1 is plain top-1 agreement);
- accuracy@k: the fraction of units whose label is among the model's top-k classes;
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


@dataclass(frozen=True, slots=True)
class ScoreLayout:
    """How one output's values become units: ``kind`` ``scores`` (classes on ``class_axis``) or
    ``labels`` (one integer class per value); ``positions`` units per record."""

    kind: str
    class_axis: int
    positions: int

    def units(self, array: np.ndarray) -> np.ndarray:
        """Scores as ``(units, classes)``, labels as ``(units,)``; units in record-major order."""
        array = np.asarray(array)
        if self.kind == "labels":
            return array.reshape(-1)
        moved = np.moveaxis(array, self.class_axis, -1)
        return moved.reshape(-1, moved.shape[-1])

    def describe(self) -> str:
        """How the units were counted, for summaries (``per record``, ``per position (40 per record)``)."""
        what = "labels " if self.kind == "labels" else ""
        if self.positions == 1:
            return f"{what}per record"
        axis = "" if self.kind == "labels" else f", classes on axis {self.class_axis}"
        return f"{what}per position ({self.positions} per record{axis})"


def score_layout(array: np.ndarray, class_axis: int | None = None) -> ScoreLayout:
    """How to count an output (record axis first), or ValueError with the reason it cannot be counted.

    Float outputs are class scores: with ``class_axis`` None, only ``(records, classes)`` (extra axes
    of 1 allowed); with a class axis, every other position is a unit. Integer outputs are labels.
    """
    array = np.asarray(array)
    shape = tuple(array.shape)
    if array.ndim < 1 or shape[0] < 1:
        raise ValueError("no record axis")
    if array.dtype.kind in "iub":
        return ScoreLayout("labels", 0, int(np.prod(shape[1:], dtype=np.int64)))
    if array.dtype.kind != "f":
        raise ValueError(f"dtype {array.dtype} holds neither class scores nor labels")
    if class_axis is None:
        rest = [d for d in shape[1:] if d != 1]
        if len(rest) != 1:
            raise ValueError("not class scores (records, classes)")
        class_axis = 1 + shape[1:].index(rest[0])
        positions = 1
    else:
        if array.ndim < 2 or not -array.ndim <= class_axis < array.ndim or class_axis % array.ndim == 0:
            raise ValueError(f"class axis {class_axis} is not an axis after the records")
        class_axis %= array.ndim
        positions = int(np.prod(shape[1:], dtype=np.int64)) // shape[class_axis]
    if shape[class_axis] < 2:
        raise ValueError(f"{shape[class_axis]} class on axis {class_axis}")
    return ScoreLayout("scores", class_axis, positions)


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
    """Counts over units for each k: agreement, and accuracy of both models when labels are given.

    State is a handful of integers per k, so ``update`` can run batch by batch and ``merge`` is exact.
    Without a ``layout``, a record is a unit and scores are read by :func:`as_scores`.
    """

    ks: tuple[int, ...] = (1,)
    records: int = 0
    labelled: int = 0
    agree: dict[int, int] = field(default_factory=dict)
    ref_correct: dict[int, int] = field(default_factory=dict)
    test_correct: dict[int, int] = field(default_factory=dict)
    layout: ScoreLayout | None = None
    units: int = 0

    def __post_init__(self) -> None:
        self.ks = tuple(sorted({int(k) for k in self.ks}))
        if not self.ks or self.ks[0] < 1:
            raise ValueError(f"k must be >= 1, got {self.ks}")
        if self.layout is not None and self.layout.kind == "labels":
            self.ks = (1,)  # a label output has no ranking beyond its one class
        for counts in (self.agree, self.ref_correct, self.test_correct):
            for k in self.ks:
                counts.setdefault(k, 0)

    def _units(self, reference: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        if self.layout is None:
            ref, tst = as_scores(reference, "reference"), as_scores(test, "actual")
            return ref, tst, ref.shape[0]
        if np.shape(reference) != np.shape(test):
            raise ValueError(f"shapes differ: actual {np.shape(test)}, reference {np.shape(reference)}")
        return self.layout.units(reference), self.layout.units(test), int(np.shape(reference)[0])

    def update(self, reference: np.ndarray, test: np.ndarray, labels: np.ndarray | None = None) -> None:
        """Fold one batch of fp32 (``reference``) and quantized (``test``) outputs; ``labels`` hold
        one class per unit (``(records,)``, or ``(records, positions...)`` for sequences)."""
        ref, tst, records = self._units(reference, test)
        if ref.shape != tst.shape:
            raise ValueError(f"score shapes differ: actual {tst.shape}, reference {ref.shape}")
        if labels is not None:
            labels = np.asarray(labels).reshape(-1)
            if labels.shape[0] != ref.shape[0]:
                per = "" if ref.shape[0] == records else f" ({ref.shape[0]} positions)"
                raise ValueError(f"{labels.shape[0]} labels for {records} records{per}")
        labelling = self.layout is not None and self.layout.kind == "labels"
        ref_top1 = ref if labelling else topk_indices(ref, 1)[:, 0]
        for k in self.ks:
            self.agree[k] += int((tst == ref_top1).sum() if labelling else in_topk(tst, ref_top1, k).sum())
        self.records += records
        self.units += ref.shape[0]
        if labels is not None:
            for k in self.ks:
                self.ref_correct[k] += int((ref == labels).sum() if labelling else in_topk(ref, labels, k).sum())
                self.test_correct[k] += int((tst == labels).sum() if labelling else in_topk(tst, labels, k).sum())
            self.labelled += labels.shape[0]

    def merge(self, other: TopKCounter) -> None:
        if other.ks != self.ks:
            raise ValueError(f"cannot merge counters for k={other.ks} into k={self.ks}")
        self.records += other.records
        self.units += other.units
        self.labelled += other.labelled
        for k in self.ks:
            self.agree[k] += other.agree[k]
            self.ref_correct[k] += other.ref_correct[k]
            self.test_correct[k] += other.test_correct[k]

    def agreement(self, k: int = 1) -> float | None:
        return self.agree[k] / self.units if self.units else None

    def accuracy(self, k: int = 1) -> tuple[float, float] | None:
        """(fp32 accuracy@k, quantized accuracy@k), or None without labels."""
        if not self.labelled:
            return None
        return self.ref_correct[k] / self.labelled, self.test_correct[k] / self.labelled

    def drop(self, k: int = 1) -> float | None:
        acc = self.accuracy(k)
        return None if acc is None else acc[0] - acc[1]

    def to_dict(self) -> dict[str, object]:
        """Plain builtins: ``{"records", "units", "counted", "labelled", "k": {"1": {...}}}``."""
        per_k: dict[str, dict[str, float | None]] = {}
        for k in self.ks:
            acc = self.accuracy(k)
            per_k[str(k)] = {
                "agreement": self.agreement(k),
                "fp32_accuracy": None if acc is None else acc[0],
                "quantized_accuracy": None if acc is None else acc[1],
                "accuracy_drop": self.drop(k),
            }
        counted = self.layout.describe() if self.layout is not None else "per record"
        return {"records": self.records, "units": self.units, "counted": counted, "labelled": self.labelled, "k": per_k}


def topk_counter(
    reference: np.ndarray, test: np.ndarray, ks: Iterable[int] = (1,), labels: np.ndarray | None = None
) -> TopKCounter:
    """Count all records at once (see :class:`TopKCounter`)."""
    counter = TopKCounter(tuple(ks))
    counter.update(reference, test, labels)
    return counter
