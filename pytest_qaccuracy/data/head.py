"""The first records of a dataset: a bounded sample for analyses whose cost grows with every record."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from pytest_qaccuracy.data.base import ArrayMeta, Dataset
from pytest_qaccuracy.errors import DataError


class Head(Dataset):
    """The first ``count`` records of ``dataset`` (all of them when it has fewer), or with ``skip``
    the ``count`` records after the first ``skip`` (a held-out part: the recipe search calibrates on
    a head and measures on what follows it).

    Closing the head closes the dataset it reads.
    """

    def __init__(self, dataset: Dataset, count: int, skip: int = 0) -> None:
        if count < 1:
            raise DataError(f"{dataset.name}: a sample needs at least 1 record, got {count}")
        if not 0 <= skip < len(dataset):
            raise DataError(f"{dataset.name}: cannot skip {skip} of its {len(dataset)} record(s)")
        super().__init__(dataset.path)
        self.dataset, self.skip = dataset, skip
        self.count = min(count, len(dataset) - skip)
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
        return self.dataset.meta(self.skip + record, key)

    def iter_records(self, start: int = 0, stop: int | None = None) -> Iterator[dict[str, np.ndarray]]:
        end = self.count if stop is None else min(stop, self.count)
        return self.dataset.iter_records(self.skip + start, self.skip + end)

    def labels(self) -> np.ndarray | None:
        labels = self.dataset.labels()
        return None if labels is None else labels[self.skip : self.skip + self.count]

    def targets(self) -> list[Any] | None:
        targets = self.dataset.targets()
        return None if targets is None else targets[self.skip : self.skip + self.count]

    def close(self) -> None:
        self.dataset.close()
