"""Task targets in the data: one per record, fixed or variable length, in the three dataset formats
and in a JSON-lines sidecar; everything checked against the records, errors naming file and record."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from pytest_qaccuracy.data import load_dataset
from pytest_qaccuracy.data.targets import read_sidecar
from pytest_qaccuracy.errors import DataError

BOXES = [
    np.array([[0, 0, 4, 4, 1]], np.float32),
    np.zeros((0, 5), np.float32),
    np.arange(10, dtype=np.float32).reshape(2, 5),
]


def _ragged() -> dict[str, np.ndarray]:
    return {"targets_values": np.concatenate(BOXES), "targets_offsets": np.array([0, 1, 1, 3])}


def _write(tmp_path, kind: str, arrays: dict[str, np.ndarray]):
    """A 3-record dataset of input 'x' in ``kind`` format, with the target ``arrays`` beside it."""
    inputs = np.zeros((3, 2), np.float32)
    tmp_path.mkdir(parents=True, exist_ok=True)
    if kind == "npz":
        path = tmp_path / "d.npz"
        np.savez(path, x=inputs, **arrays)
    elif kind == "npy":
        path = tmp_path / "d"
        (path / "x").mkdir(parents=True)
        for i in range(3):
            np.save(path / "x" / f"{i}.npy", inputs[i])
        for name, array in arrays.items():
            np.save(path / f"{name}.npy", array)
    else:
        path = tmp_path / "d.h5"
        with h5py.File(path, "w") as f:
            for i in range(3):
                f.create_dataset(f"value/{i}/0", data=inputs[i])
            for name, array in arrays.items():
                text = array.dtype.kind == "U"
                f.create_dataset(
                    name, data=array.astype(object) if text else array, dtype=h5py.string_dtype() if text else None
                )
    return path


@pytest.mark.parametrize("kind", ["npz", "npy", "h5"])
def test_text_and_box_list_targets_read_back_per_record_in_every_format(tmp_path, kind) -> None:
    with load_dataset(_write(tmp_path / "text", kind, {"targets": np.array(["total", "tax 2.50", "é"])})) as data:
        assert data.targets() == ["total", "tax 2.50", "é"]
        assert data.keys == (["0"] if kind == "h5" else ["x"])  # targets are no model input
    with load_dataset(_write(tmp_path / "boxes", kind, _ragged())) as data:
        found = data.targets()
    assert len(found) == 3
    for got, expected in zip(found, BOXES, strict=True):
        np.testing.assert_array_equal(got, expected)


def test_a_dataset_without_targets_has_none(tmp_path) -> None:
    with load_dataset(_write(tmp_path, "npz", {})) as data:
        assert data.targets() is None


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"targets": np.array([1, 2])}, "d.npz: 'targets' has shape (2,), expected one target per record (3)"),
        (
            {"targets_values": np.zeros((3, 5))},
            "d.npz: 'targets_values' and 'targets_offsets' go together; 'targets_offsets' is missing",
        ),
        (
            {"targets_values": np.zeros((3, 5)), "targets_offsets": np.array([0, 2, 1, 3])},
            "d.npz: record 1: 'targets_offsets' goes back from 2 to 1",
        ),
        (
            {"targets_values": np.zeros((3, 5)), "targets_offsets": np.array([0, 1, 2, 4])},
            "d.npz: 'targets_offsets' ends at 4 but 'targets_values' has 3 rows",
        ),
        (
            {"targets_values": np.zeros((3, 5)), "targets_offsets": np.array([0, 1, 3])},
            "d.npz: 'targets_offsets' must be 4 integers (records + 1), got int64 (3,)",
        ),
        (
            {"targets": np.zeros(3), **_ragged()},
            "d.npz: both 'targets' and 'targets_values'/'targets_offsets'; keep one layout",
        ),
    ],
)
def test_targets_that_do_not_fit_the_records_name_the_file_and_the_record(tmp_path, arrays, message) -> None:
    with load_dataset(_write(tmp_path, "npz", arrays)) as data, pytest.raises(DataError) as info:
        data.targets()
    assert str(info.value) == message


def _sidecar(tmp_path, lines: list[str]):
    path = tmp_path / "truth.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_sidecar_gives_one_target_per_record_in_any_order(tmp_path) -> None:
    lines = [json.dumps({"record": 2, "target": [[0, 0, 1, 1, 3]]}), "", json.dumps({"record": 0, "target": "ab"})]
    lines.append(json.dumps({"record": 1, "target": None}))
    assert read_sidecar(_sidecar(tmp_path, lines), 3) == ["ab", None, [[0, 0, 1, 1, 3]]]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            ['{"record": 0, "target": "a"}', "{oops"],
            "line 2: not JSON (Expecting property name enclosed in double quotes)",
        ),
        (['{"record": 0}'], 'line 1: expected {"record": <record number>, "target": ...}'),
        (['{"record": "0", "target": 1}'], 'line 1: expected {"record": <record number>, "target": ...}'),
        (['{"record": 5, "target": 1}'], "line 1: record 5 is not in the data (records 0..1)"),
        (['{"record": 0, "target": 1}', '{"record": 0, "target": 2}'], "line 2: record 0 again (first on line 1)"),
        (['{"record": 1, "target": 1}'], "no target for record 0 (1 of 2 records)"),
    ],
)
def test_a_sidecar_that_does_not_fit_the_records_names_the_line_and_the_record(tmp_path, lines, message) -> None:
    path = _sidecar(tmp_path, lines)
    with pytest.raises(DataError) as info:
        read_sidecar(path, 2)
    assert str(info.value) == f"{path}: {message}"


def test_a_held_out_part_has_the_targets_of_its_own_records(tmp_path) -> None:
    """``Head(data, count, skip)`` (the recipe search's held-out half) gives the targets of the records
    after ``skip``, not the first ones (it gave the first ``count`` before)."""
    from pytest_qaccuracy.data.head import Head

    path = _write(tmp_path, "npz", {"targets": np.array(["a", "b", "c"])})
    with Head(load_dataset(path), 2, skip=1) as held:
        assert held.targets() == ["b", "c"]
    with Head(load_dataset(path), 1) as first:
        assert first.targets() == ["a"]
