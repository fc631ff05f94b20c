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


def test_byte_string_and_object_targets_come_back_as_python_text(tmp_path) -> None:
    """Fixed-width byte strings (``S`` dtype) are decoded; HDF5 variable-length text rows (an object
    array per record) become lists of str."""
    with load_dataset(_write(tmp_path / "b", "npz", {"targets": np.array([b"ab", b"c", b"\xc3\xa9"])})) as data:
        assert data.targets() == ["ab", "c", "é"]
    words = {"targets_values": np.array(["cat", "dog", "ox"]), "targets_offsets": np.array([0, 1, 1, 3])}
    with load_dataset(_write(tmp_path / "w", "h5", words)) as data:
        assert data.targets() == [["cat"], [], ["dog", "ox"]]


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        (
            {"targets_values": np.float32(1.5), "targets_offsets": np.array([0, 0, 0, 0])},
            "d.npz: 'targets_values' is 0-d; expected the rows of every record, concatenated",
        ),
        (
            {"targets_values": np.zeros((3, 5)), "targets_offsets": np.array([1, 1, 2, 3])},
            "d.npz: 'targets_offsets' must start at 0, got 1",
        ),
    ],
)
def test_ragged_targets_with_a_scalar_or_a_late_start_are_refused(tmp_path, arrays, message) -> None:
    with load_dataset(_write(tmp_path, "npz", arrays)) as data, pytest.raises(DataError) as info:
        data.targets()
    assert str(info.value) == message


def test_a_sidecar_that_cannot_be_read_names_the_file_and_why(tmp_path) -> None:
    missing = tmp_path / "none.jsonl"
    with pytest.raises(DataError) as info:
        read_sidecar(missing, 2)
    assert str(info.value) == f"{missing}: cannot read targets (No such file or directory)"
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"record": 0, "target": "caf\xe9"}\n')
    with pytest.raises(DataError) as info:
        read_sidecar(latin, 1)
    assert str(info.value) == (
        f"{latin}: cannot read targets ('utf-8' codec can't decode byte 0xe9 in position 28: invalid continuation byte)"
    )


def test_unreadable_target_arrays_name_the_file(tmp_path) -> None:
    """A pickled (object) targets array is never loaded; an empty targets.npy is an error naming the file
    (np.load's EOFError escaped before)."""
    folder = _write(tmp_path / "pickled", "npy", {})
    np.save(folder / "targets.npy", np.array([None, 1, 2], object), allow_pickle=True)
    with load_dataset(folder) as data, pytest.raises(DataError) as info:
        data.targets()
    assert str(info.value) == "d/targets.npy: cannot read (Object arrays cannot be loaded when allow_pickle=False)"
    (folder / "targets.npy").write_bytes(b"")
    with load_dataset(folder) as data, pytest.raises(DataError) as info:
        data.targets()
    assert str(info.value) in (
        "d/targets.npy: cannot read (No data left in file)",  # numpy 2
        "d/targets.npy: cannot read (Cannot load file containing pickled data when allow_pickle=False)",  # 1.24
    )
    archive = tmp_path / "p.npz"
    np.savez(archive, x=np.zeros((3, 2), np.float32), targets=np.array([None, 1, 2], object))
    with load_dataset(archive) as data, pytest.raises(DataError) as info:
        data.targets()
    assert str(info.value) == (
        "p.npz: array 'targets': cannot read (Object arrays cannot be loaded when allow_pickle=False)"
    )


def test_an_hdf5_group_where_targets_or_labels_belong_is_refused(tmp_path) -> None:
    """A group named 'labels' crashed with h5py's TypeError before ('Accessing a group is done with
    bytes or str')."""
    path = _write(tmp_path, "h5", {})
    with h5py.File(path, "a") as f:
        f.create_group("targets")
        f.create_group("labels")
    with load_dataset(path) as data:
        with pytest.raises(DataError) as info:
            data.targets()
        assert str(info.value) == "d.h5: 'targets' is not a dataset"
        with pytest.raises(DataError) as info:
            data.labels()
        assert str(info.value) == "d.h5: 'labels' is not a dataset (expected one label per record)"
