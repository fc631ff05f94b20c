"""The first records of a dataset: a bounded sample for analyses whose cost grows with every record."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from pytest_qaccuracy.data.base import ArrayMeta, Dataset
from pytest_qaccuracy.errors import DataError


class Head(Dataset):
    """The first ``count`` records of ``dataset`` (all of them when it has fewer).

    Closing the head closes the dataset it reads.
    """

    def __init__(self, dataset: Dataset, count: int) -> None:
        if count < 1:
            raise DataError(f"{dataset.name}: a sample needs at least 1 record, got {count}")
        super().__init__(dataset.path)
        self.dataset = dataset
        self.count = min(count, len(dataset))
        self.by_position = dataset.by_position
        self.uniform = dataset.uniform

    @property
    def name(self) -> str:
        return self.dataset.name

    @property
    def keys(self) -> list[str]:
        return self.dataset.keys

    def __len__(self) -> int:
        return self.count

    def meta(self, record: int, key: str) -> ArrayMeta:
        return self.dataset.meta(record, key)

    def iter_records(self, start: int = 0, stop: int | None = None) -> Iterator[dict[str, np.ndarray]]:
        end = self.count if stop is None else min(stop, self.count)
        return self.dataset.iter_records(start, end)

    def labels(self) -> np.ndarray | None:
        labels = self.dataset.labels()
        return None if labels is None else labels[: self.count]

    def targets(self) -> list[Any] | None:
        targets = self.dataset.targets()
        return None if targets is None else targets[: self.count]

    def close(self) -> None:
        self.dataset.close()


__all__ = ["Head"]
