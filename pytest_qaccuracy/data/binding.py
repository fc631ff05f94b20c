"""Binding a dataset to a model's inputs: key matching, shape/dtype checks, streaming in batches."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from pytest_qaccuracy.data.base import Dataset
from pytest_qaccuracy.errors import DataError
from pytest_qaccuracy.model.loading import InputSpec


@dataclass(frozen=True, slots=True)
class Batch:
    """Consecutive records ``start .. start + len(records) - 1``, each a dict input name -> array."""

    start: int
    records: list[dict[str, np.ndarray]]

    def __len__(self) -> int:
        return len(self.records)

    def stacked(self) -> dict[str, np.ndarray]:
        """The records concatenated on the batch axis (axis 0), one array per input."""
        names = self.records[0].keys()
        return {name: join_records([r[name] for r in self.records]) for name in names}


def join_records(parts: list[np.ndarray]) -> np.ndarray:
    """Per-record arrays on one record axis: one record as it is, several concatenated on axis 0, or
    stacked when they are scalars (a 0-d input has no batch axis: a speech model's sample rate)."""
    if len(parts) == 1:
        return parts[0]
    return np.stack(parts) if parts[0].ndim == 0 else np.concatenate(parts, axis=0)


def same_shapes(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    """Whether two records can share a batch: every input has the same shape in both."""
    return all(array.shape == b[name].shape for name, array in a.items())


def _shape_str(shape: Sequence[object]) -> str:
    dims = ", ".join(str(d) if isinstance(d, int) else (d or "?") for d in shape)
    return f"({dims}{',' if len(shape) == 1 else ''})"


def _dims_match(shape: tuple[int, ...], model: tuple[int | str | None, ...]) -> bool:
    return len(shape) == len(model) and all(not isinstance(m, int) or m == s for s, m in zip(shape, model, strict=True))


class BoundDataset:
    """A dataset whose every record was checked against a model's inputs.

    Records may be stored with the model's full shape, or without its leading batch dimension (when
    that dimension is 1 or dynamic); ``iter_batches`` always yields full-rank arrays.
    """

    def __init__(self, dataset: Dataset, inputs: Sequence[InputSpec], allow_nonfinite: bool = False) -> None:
        self.dataset = dataset
        self.inputs = list(inputs)
        self.allow_nonfinite = allow_nonfinite
        self._key_of = self._match_keys()
        self._add_batch_axis = {spec.name: False for spec in self.inputs}
        self._check_all_records()

    def __len__(self) -> int:
        return len(self.dataset)

    def _describe(self, spec: InputSpec) -> str:
        if self.dataset.by_position:
            return f"input {self.inputs.index(spec)} ('{spec.name}')"
        return f"input '{spec.name}'"

    def _match_keys(self) -> dict[str, str]:
        keys, names = self.dataset.keys, [spec.name for spec in self.inputs]
        where = self.dataset.name
        if self.dataset.by_position:
            if len(keys) != len(names):
                raise DataError(
                    f"{where}: records hold {len(keys)} input(s), the model has {len(names)} ({', '.join(names)})"
                )
            return {name: str(i) for i, name in enumerate(names)}
        missing, extra = sorted(set(names) - set(keys)), sorted(set(keys) - set(names))
        if missing or extra:
            parts = [
                f"missing model input(s) {missing}" if missing else "",
                f"unknown input(s) {extra}" if extra else "",
            ]
            raise DataError(f"{where}: {'; '.join(p for p in parts if p)}; the model's inputs are {names}")
        return {name: name for name in names}

    def _check_all_records(self) -> None:
        if len(self.dataset) == 0:
            raise DataError(f"{self.dataset.name}: the dataset holds no records")
        for record in range(1 if self.dataset.uniform else len(self.dataset)):
            for spec in self.inputs:
                self._check_meta(record, spec)

    def _check_meta(self, record: int, spec: InputSpec) -> None:
        meta = self.dataset.meta(record, self._key_of[spec.name])
        where = f"{self.dataset.name}: record {record}, {self._describe(spec)}"
        if meta.dtype != np.dtype(spec.dtype):
            raise DataError(f"{where}: dtype {meta.dtype} does not match the model input dtype {spec.dtype}")
        batch_dim_free = bool(spec.shape) and (spec.shape[0] == 1 or not isinstance(spec.shape[0], int))
        if _dims_match(meta.shape, spec.shape):
            add_axis = False
            if batch_dim_free and meta.shape[0] != 1:
                raise DataError(
                    f"{where}: shape {_shape_str(meta.shape)} holds {meta.shape[0]} samples; a record is one "
                    f"sample (batch dimension 1, or none): store them as {meta.shape[0]} records"
                )
        elif batch_dim_free and _dims_match((1, *meta.shape), spec.shape):
            add_axis = True
        else:
            raise DataError(
                f"{where}: shape {_shape_str(meta.shape)} does not match the model input {_shape_str(spec.shape)}"
            )
        if record == 0:
            self._add_batch_axis[spec.name] = add_axis
        elif add_axis != self._add_batch_axis[spec.name]:
            raise DataError(f"{where}: records mix shapes with and without the batch dimension")

    def iter_records(self) -> Iterator[dict[str, np.ndarray]]:
        """Every record as a dict model input name -> full-rank array, checked for NaN/Inf."""
        for record, stored in enumerate(self.dataset.iter_records()):
            feeds = {}
            for spec in self.inputs:
                array = np.asarray(stored[self._key_of[spec.name]])  # a 0-d record reads as a numpy scalar
                if not self.allow_nonfinite and array.dtype.kind == "f" and not np.isfinite(array).all():
                    bad = "NaN" if np.isnan(array).any() else "Inf"
                    raise DataError(
                        f"{self.dataset.name}: record {record}, {self._describe(spec)}: contains {bad} "
                        "(accept it with --allow-nonfinite, or allow_nonfinite = true in a suite or marker)"
                    )
                feeds[spec.name] = array[np.newaxis] if self._add_batch_axis[spec.name] else array
            yield feeds

    def iter_batches(self, batch_size: int) -> Iterator[Batch]:
        """Records in order, up to ``batch_size`` at a time; only one batch is held in memory.

        A batch holds records of one shape: a model with dynamic dimensions (an image model of any
        height and width) takes records of different sizes, which cannot be stacked, so a record whose
        shapes differ from the batch's closes it and starts the next one.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        records: list[dict[str, np.ndarray]] = []
        start = 0
        for feeds in self.iter_records():
            if records and (len(records) == batch_size or not same_shapes(records[0], feeds)):
                yield Batch(start, records)
                start += len(records)
                records = []
            records.append(feeds)
        if records:
            yield Batch(start, records)
