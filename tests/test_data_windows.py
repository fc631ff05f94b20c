"""Every dataset format gives back exactly the records written, for any window ``[start, stop)``,
and a Head gives back a prefix: the data contract of docs/data.md, checked format by format."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from pytest_qaccuracy.data import Head, load_dataset
from pytest_qaccuracy.errors import DataError

RECORDS = np.arange(5 * 2 * 3, dtype=np.float32).reshape(5, 2, 3) - 7.5
FLAGS = np.array([True, False, True, True, False])
LABELS = np.array([3, 1, 4, 1, 5])
WINDOWS = [(0, None), (1, 3), (2, 10), (4, None), (3, 3)]


def _write(kind: str, root) -> object:
    if kind == "h5":  # ONE's layout: value/<record>/<input index>; numpy bool becomes an HDF5 enum
        path = root / "d.h5"
        with h5py.File(path, "w") as f:
            for i in range(len(RECORDS)):
                f.create_dataset(f"value/{i}/0", data=RECORDS[i])
                f.create_dataset(f"value/{i}/1", data=FLAGS[i])
            f.create_dataset("labels", data=LABELS)
        return path
    if kind in ("npz", "npz-fortran"):
        path = root / "d.npz"
        x = np.asfortranarray(RECORDS) if kind == "npz-fortran" else RECORDS
        np.savez(path, x=x, flag=FLAGS, labels=LABELS)
        return path
    path = root / "d"
    for name, array in (("x", RECORDS), ("flag", FLAGS)):
        (path / name).mkdir(parents=True)
        for i, record in enumerate(array):
            np.save(path / name / f"{i}.npy", record)
    np.save(path / "labels.npy", LABELS)
    return path


@pytest.mark.parametrize("kind", ["h5", "npz", "npz-fortran", "npy-dir"])
def test_every_window_gives_back_the_records_written(tmp_path, kind) -> None:
    with load_dataset(_write(kind, tmp_path)) as dataset:
        assert len(dataset) == 5
        x_key, flag_key = sorted(dataset.keys, key=lambda k: k not in ("x", "0"))
        for start, stop in WINDOWS:
            got = list(dataset.iter_records(start, stop))
            end = 5 if stop is None else min(stop, 5)
            assert len(got) == max(end - start, 0), (start, stop)
            for offset, record in enumerate(got):
                np.testing.assert_array_equal(record[x_key], RECORDS[start + offset])
                assert record[flag_key].dtype == np.bool_ and record[flag_key] == FLAGS[start + offset]
        assert dataset.meta(2, flag_key).dtype == np.bool_
        np.testing.assert_array_equal(dataset.labels(), LABELS)


@pytest.mark.parametrize("kind", ["h5", "npz", "npy-dir"])
def test_a_head_is_a_prefix(tmp_path, kind) -> None:
    dataset = load_dataset(_write(kind, tmp_path))
    with Head(dataset, 3) as head:
        assert len(head) == 3 and head.keys == dataset.keys and head.name == dataset.name
        assert (head.by_position, head.uniform) == (dataset.by_position, dataset.uniform)
        x_key = next(k for k in head.keys if k in ("x", "0"))
        assert head.meta(1, x_key) == dataset.meta(1, x_key)
        assert [r[x_key][0, 0] for r in head.iter_records()] == [-7.5, -1.5, 4.5]
        assert [r[x_key][0, 0] for r in head.iter_records(1, 10)] == [-1.5, 4.5]
        np.testing.assert_array_equal(head.labels(), LABELS[:3])
    assert len(Head(load_dataset(dataset.path), 1)) == 1
    assert len(Head(load_dataset(dataset.path), 9)) == 5  # all of them when there are fewer
    with pytest.raises(DataError, match=r"a sample needs at least 1 record, got 0$"):
        Head(dataset, 0)
