"""CTC greedy decoding with character error rate and exact match (a text recognizer's accuracy).

Greedy decoding takes the best class of every time step, merges repeats and drops the blank, as
PaddleOCR's ``CTCLabelDecode`` does. Per record, the character error rate is the Levenshtein distance
between the decoded text and the target text over the target's length; over the data,
``cer = sum(distances) / sum(target lengths)`` (a corpus-level rate, as jiwer and torchmetrics compute
it) and ``exact_match`` is the share of records whose text equals the target exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from pytest_qaccuracy.metrics.task import TaskContext, TaskMetric, ratio


def greedy_paths(scores: np.ndarray, class_axis: int = -1) -> list[np.ndarray]:
    """Per record, the class indices greedy CTC decoding keeps (repeats merged), blanks included."""
    best = np.argmax(np.moveaxis(np.asarray(scores), class_axis, -1), axis=-1)
    best = best.reshape(best.shape[0], -1)
    keep = np.ones(best.shape, bool)
    keep[:, 1:] = best[:, 1:] != best[:, :-1]
    return [row[mask] for row, mask in zip(best, keep, strict=True)]


def levenshtein(a: Sequence[Any], b: Sequence[Any]) -> int:
    """Edit distance (insertions, deletions, substitutions of cost 1); one row of numpy per element of ``a``."""
    if not len(b):
        return len(a)
    codes: dict[Any, int] = {}
    left = np.array([codes.setdefault(x, len(codes)) for x in a], np.int64)
    right = np.array([codes.setdefault(x, len(codes)) for x in b], np.int64)
    row = np.arange(len(right) + 1, dtype=np.int64)
    for symbol in left:
        cost = row[:-1] + (right != symbol)  # substitution (or match) from the diagonal
        new = np.empty_like(row)
        new[0] = row[0] + 1
        new[1:] = np.minimum(cost, row[1:] + 1)  # ... or deletion from above
        # insertion from the left: a running minimum of new[j-1] + 1 along the row
        new = np.minimum.accumulate(new - np.arange(len(new))) + np.arange(len(new))
        row = new
    return int(row[-1])


class CTCGreedy(TaskMetric):
    """CTC greedy decoding; ``cer`` (lower is better) and ``exact_match`` (higher) of the decoded text.

    Args:
        output: the output of per-step class scores ``(records, steps, classes)``; default: the first.
        characters: the character of each class after the blank (a list, or a file with one per line);
            default: the fp32 model's ``metadata_props`` entry ``metadata_key`` (PaddleOCR models ship it).
        metadata_key: that entry's name.
        blank: the blank class; PaddleOCR puts it first (0) and characters follow it.
        space: add ``" "`` as the last class (PaddleOCR's ``use_space_char``).
        class_axis: the class axis of the scores.
    """

    higher_is_better: ClassVar[Mapping[str, bool]] = {"cer": False, "exact_match": True}

    def __init__(
        self,
        output: str | None = None,
        characters: Sequence[str] | str | None = None,
        metadata_key: str = "character",
        blank: int = 0,
        space: bool = True,
        class_axis: int = -1,
    ) -> None:
        super().__init__()
        self.output, self.metadata_key, self.blank, self.space, self.class_axis = (
            output,
            metadata_key,
            blank,
            space,
            class_axis,
        )
        if isinstance(characters, str):
            characters = Path(characters).read_text(encoding="utf-8").splitlines()
        self.alphabet = None if characters is None else self._alphabet(list(characters))

    def _alphabet(self, characters: list[str]) -> list[str]:
        alphabet = [*characters, *([" "] if self.space else [])]
        alphabet.insert(self.blank, "")
        return alphabet

    def begin(self, context: TaskContext) -> None:
        super().begin(context)
        if self.alphabet is None:
            if self.metadata_key not in context.metadata:
                raise ValueError(f"no characters given and the fp32 model has no metadata_props '{self.metadata_key}'")
            self.alphabet = self._alphabet(context.metadata[self.metadata_key].splitlines())

    def decode(self, outputs: Mapping[str, Any]) -> list[str]:
        name = self.output or next(iter(outputs))
        scores = np.asarray(outputs[name])
        classes = scores.shape[self.class_axis]
        alphabet = self.alphabet or []
        if classes != len(alphabet):
            raise ValueError(f"output '{name}' has {classes} classes but the character list gives {len(alphabet)}")
        return ["".join(alphabet[i] for i in path if i != self.blank) for path in greedy_paths(scores, self.class_axis)]

    def score(self, predictions: Sequence[str], targets: Sequence[Any]) -> dict[str, int]:
        texts = [str(t) for t in targets]
        return {
            "edits": sum(levenshtein(p, t) for p, t in zip(predictions, texts, strict=True)),
            "characters": sum(len(t) for t in texts),
            "exact": sum(p == t for p, t in zip(predictions, texts, strict=True)),
            "records": len(texts),
        }

    def finish(self, sums: Mapping[str, int | float]) -> dict[str, float | None]:
        return {
            "cer": ratio(sums.get("edits", 0), sums.get("characters", 0)),
            "exact_match": ratio(sums.get("exact", 0), sums.get("records", 0)),
        }
