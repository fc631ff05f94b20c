"""Dataset errors on hand-made files name the file, the record and the input or array; and the
paths the usual datasets do not take (chunked skips, Fortran order, .npy 2.0 headers, bool HDF5)."""

from __future__ import annotations

import io
import re
import zipfile

import h5py
import numpy as np
import pytest
from numpy.lib import format as npy_format

from pytest_qaccuracy.data import (
    ArrayMeta,
    Dataset,
    HDF5Dataset,
    NpyDirDataset,
    NpzDataset,
    bind_dataset,
    load_dataset,
)
from pytest_qaccuracy.data.binding import join_records
from pytest_qaccuracy.data.budget import memory_budget
from pytest_qaccuracy.data.head import Head
from pytest_qaccuracy.data.npy_stream import RecordReader
from pytest_qaccuracy.errors import DataError
from pytest_qaccuracy.model.loading import InputSpec

X = InputSpec("x", "float32", ("N", 4))


def _npy_bytes(array: np.ndarray, version=None) -> bytes:
    out = io.BytesIO()
    npy_format.write_array(out, array, version=version)
    return out.getvalue()


def _zip(path, members: dict[str, bytes], method=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w", compression=method) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def _error(fn, *args) -> str:
    with pytest.raises(DataError) as info:
        fn(*args)
    return str(info.value)


# -- .npz -----------------------------------------------------------------------------------------


def test_npz_archive_errors_name_the_file_and_array(tmp_path) -> None:
    (tmp_path / "bad.npz").write_bytes(b"not a zip at all")
    assert _error(NpzDataset, tmp_path / "bad.npz").startswith("bad.npz: not a readable .npz archive (")
    _zip(tmp_path / "text.npz", {"readme.txt": b"hello"})
    assert _error(NpzDataset, tmp_path / "text.npz") == "text.npz: the archive holds no arrays"
    np.savez(tmp_path / "scalar.npz", x=np.float32(1.0))
    assert _error(NpzDataset, tmp_path / "scalar.npz") == "scalar.npz: array 'x' is 0-d; expected the record axis first"
    np.savez(tmp_path / "counts.npz", a=np.zeros((3, 2)), b=np.zeros((4, 2)))
    assert _error(NpzDataset, tmp_path / "counts.npz") == (
        "counts.npz: arrays disagree on the number of records: {'a': 3, 'b': 4}"
    )
    _zip(tmp_path / "junk.npz", {"x.npy": b"\x93NUMPY garbage"})
    assert _error(NpzDataset, tmp_path / "junk.npz").startswith("junk.npz: array 'x': not a .npy array (")
    np.savez(tmp_path / "cplx.npz", x=np.zeros((2, 4), np.complex64))
    assert _error(NpzDataset, tmp_path / "cplx.npz") == (
        "cplx.npz: array 'x': dtype complex64 is not a numeric tensor type"
    )


def test_npz_member_shorter_than_its_header(tmp_path, monkeypatch) -> None:
    full = _npy_bytes(np.arange(40, dtype=np.float32).reshape(10, 4))
    short = full[: len(full) - 4 * 4 * 3]  # the last three records are missing
    _zip(tmp_path / "stored.npz", {"x.npy": short})  # stored: its size says so before any read
    message = _error(NpzDataset, tmp_path / "stored.npz")
    assert message.startswith("stored.npz: array 'x': ")
    _zip(tmp_path / "deflated.npz", {"x.npy": short}, zipfile.ZIP_DEFLATED)  # found while reading
    with pytest.raises(DataError, match=re.escape("deflated.npz: array 'x': file is truncated at record 0")):
        list(NpzDataset(tmp_path / "deflated.npz").iter_records())  # records 0-9 are one chunk
    monkeypatch.setenv("QACCURACY_MEMORY_BUDGET", "16")  # one record's bytes: chunks of one record
    records = NpzDataset(tmp_path / "deflated.npz").iter_records()
    for k in range(7):
        np.testing.assert_array_equal(next(records)["x"], np.arange(4 * k, 4 * k + 4))
    with pytest.raises(DataError, match=re.escape("deflated.npz: array 'x': file is truncated at record 7")):
        next(records)


def test_npz_records_from_any_start_in_chunks(tmp_path, monkeypatch) -> None:
    data = np.arange(150 * 3, dtype=np.float32).reshape(150, 3)
    np.savez_compressed(tmp_path / "d.npz", x=data, labels=np.arange(150))
    dataset = NpzDataset(tmp_path / "d.npz")
    assert len(dataset) == 150 and dataset.keys == ["x"]
    assert repr(dataset) == f"NpzDataset({str(tmp_path / 'd.npz')!r}, records=150, keys=['x'])"
    for start, stop in [(0, None), (70, None), (130, 140), (149, 500)]:
        got = np.stack([r["x"] for r in dataset.iter_records(start, stop)])
        np.testing.assert_array_equal(got, data[start:stop])
    np.testing.assert_array_equal(dataset.labels(), np.arange(150))
    # a budget of 5 records' bytes: chunks of 5 records, the same values
    np.savez(tmp_path / "e.npz", x=data)
    monkeypatch.setenv("QACCURACY_MEMORY_BUDGET", str(5 * 3 * 4))
    small = NpzDataset(tmp_path / "e.npz")
    got = np.stack([r["x"] for r in small.iter_records(12, 31)])
    np.testing.assert_array_equal(got, data[12:31])


def test_npz_fortran_order_and_labels_only(tmp_path) -> None:
    data = np.asfortranarray(np.arange(24, dtype=np.int16).reshape(6, 4))
    np.savez(tmp_path / "f.npz", x=data)
    dataset = NpzDataset(tmp_path / "f.npz")
    np.testing.assert_array_equal(np.stack([r["x"] for r in dataset.iter_records(2)]), data[2:])
    np.savez(tmp_path / "labels.npz", labels=np.arange(3))
    assert len(NpzDataset(tmp_path / "labels.npz")) == 0  # no input arrays: no records
    np.savez(tmp_path / "badlabels.npz", x=np.zeros((3, 4), np.float32), labels=np.arange(2))
    assert _error(NpzDataset(tmp_path / "badlabels.npz").labels) == (
        "badlabels.npz: array 'labels': labels have shape (2,), expected one label per record (3)"
    )


# -- .npy folders and headers ---------------------------------------------------------------------


def test_npy_folder_read_errors_name_the_record_file(tmp_path) -> None:
    (tmp_path / "d" / "x").mkdir(parents=True)
    np.save(tmp_path / "d" / "x" / "0.npy", np.zeros((1, 4), np.float32))
    (tmp_path / "d" / "x" / "1.npy").write_bytes(_npy_bytes(np.zeros((1, 4), np.float32), version=(2, 0)))
    np.save(tmp_path / "d" / "x" / "2.npy", np.array([[None, 1, 2, 3]], object), allow_pickle=True)
    dataset = NpyDirDataset(tmp_path / "d")
    assert dataset.meta(1, "x").shape == (1, 4)  # a version 2.0 header reads like a 1.0 one
    records = dataset.iter_records()
    next(records), next(records)
    message = _error(next, records)
    assert message.startswith("d/x/2.npy: cannot read (")  # pickled data is never loaded
    assert _error(bind_dataset, dataset, [X]) == "d/x/2.npy: dtype object is not a numeric tensor type"


def test_npy_file_shorter_than_its_header(tmp_path) -> None:
    (tmp_path / "d" / "x").mkdir(parents=True)
    full = _npy_bytes(np.zeros((1, 4), np.float32))
    (tmp_path / "d" / "x" / "0.npy").write_bytes(full[:-4])
    message = _error(bind_dataset, NpyDirDataset(tmp_path / "d"), [X])
    assert message.startswith("d/x/0.npy: "), message
    np.save(tmp_path / "d" / "x" / "0.npy", np.zeros((1, 4), np.float32))
    np.save(tmp_path / "d" / "labels.npy", np.arange(3))
    assert _error(NpyDirDataset(tmp_path / "d").labels) == (
        "d/labels.npy: labels have shape (3,), expected one label per record (1)"
    )
    (tmp_path / "d" / "labels.npy").write_bytes(b"nonsense")
    assert _error(NpyDirDataset(tmp_path / "d").labels).startswith("d/labels.npy: not a .npy array (")


def test_mixed_batch_dimension_names_the_record(tmp_path) -> None:
    (tmp_path / "d" / "x").mkdir(parents=True)
    np.save(tmp_path / "d" / "x" / "0.npy", np.zeros((1, 4), np.float32))
    np.save(tmp_path / "d" / "x" / "1.npy", np.zeros(4, np.float32))
    assert _error(bind_dataset, NpyDirDataset(tmp_path / "d"), [X]) == (
        "d: record 1, input 'x': records mix shapes with and without the batch dimension"
    )


# -- binding --------------------------------------------------------------------------------------


def _npz(tmp_path, name="d.npz", **arrays):
    np.savez(tmp_path / name, **arrays)
    return NpzDataset(tmp_path / name)


def test_binding_messages(tmp_path) -> None:
    two = [X, InputSpec("y", "float32", ("N", 4))]
    data = _npz(tmp_path, x=np.zeros((2, 4), np.float32))
    assert _error(bind_dataset, data, two) == ("d.npz: missing model input(s) ['y']; the model's inputs are ['x', 'y']")
    data = _npz(tmp_path, "e.npz", x=np.zeros((2, 4), np.float32), z=np.zeros((2, 4), np.float32))
    assert _error(bind_dataset, data, [X]) == "e.npz: unknown input(s) ['z']; the model's inputs are ['x']"
    data = _npz(tmp_path, "f.npz", x=np.zeros((0, 4), np.float32))
    assert _error(bind_dataset, data, [X]) == "f.npz: the dataset holds no records"
    data = _npz(tmp_path, "g.npz", x=np.zeros((2, 3, 4), np.float32))
    assert _error(bind_dataset, data, [X]) == (
        "g.npz: record 0, input 'x': shape (3, 4) holds 3 samples; a record is one sample "
        "(batch dimension 1, or none): store them as 3 records"
    )
    data = _npz(tmp_path, "h.npz", x=np.zeros((2, 5), np.float32))
    for shape, shown in [((None, 3), "(?, 3)"), (("batch", 3), "(batch, 3)"), ((3,), "(3,)")]:
        assert _error(bind_dataset, data, [InputSpec("x", "float32", shape)]) == (
            f"h.npz: record 0, input 'x': shape (5,) does not match the model input {shown}"
        )


@pytest.mark.parametrize(("bad", "word"), [(np.nan, "NaN"), (np.inf, "Inf")])
def test_nonfinite_records_are_refused_by_default(tmp_path, bad, word) -> None:
    data = np.zeros((3, 4), np.float32)
    data[2, 1] = bad
    bound = bind_dataset(_npz(tmp_path, x=data), [X])
    with pytest.raises(DataError) as info:
        list(bound.iter_records())
    assert str(info.value) == (
        f"d.npz: record 2, input 'x': contains {word} "
        "(accept it with --allow-nonfinite, or allow_nonfinite = true in a suite or marker)"
    )
    assert len(list(bind_dataset(_npz(tmp_path, x=data), [X], allow_nonfinite=True).iter_records())) == 3


def test_records_without_the_batch_dimension_get_it(tmp_path) -> None:
    data = np.arange(12, dtype=np.float32).reshape(3, 4)  # records of shape (4,) for a (1, 4) input
    bound = bind_dataset(_npz(tmp_path, x=data), [InputSpec("x", "float32", (1, 4))])
    batches = list(bound.iter_batches(2))
    assert [(b.start, len(b)) for b in batches] == [(0, 2), (2, 1)]
    np.testing.assert_array_equal(batches[0].stacked()["x"], data[:2])
    assert batches[1].stacked()["x"].shape == (1, 4)
    with pytest.raises(ValueError, match=re.escape("batch_size must be >= 1, got 0")):
        next(bound.iter_batches(0))


def test_join_records() -> None:
    np.testing.assert_array_equal(join_records([np.float32(1), np.float32(2)]), [1, 2])  # scalars: stacked
    np.testing.assert_array_equal(join_records([np.array([1, 2]), np.array([3])]), [1, 2, 3])  # concatenated
    np.testing.assert_array_equal(join_records([np.array([[1, 2]]), np.array([[3, 4]])]), [[1, 2], [3, 4]])


# -- HDF5, head, formats, budget ------------------------------------------------------------------


def test_hdf5_bool_records_and_error_names(tmp_path) -> None:
    with h5py.File(tmp_path / "b.h5", "w") as f:
        for i in range(2):
            f.create_dataset(f"value/{i}/0", data=np.array([[True, False, i == 1]]))
        f.create_dataset("labels", data=np.arange(3))
    dataset = HDF5Dataset(tmp_path / "b.h5")
    assert dataset.meta(0, "0").dtype == np.dtype(bool)
    records = [r["0"] for r in dataset.iter_records()]
    assert all(r.dtype == np.bool_ for r in records)
    np.testing.assert_array_equal(records[1], [[True, False, True]])
    assert _error(dataset.labels) == "b.h5: dataset 'labels': labels have shape (3,), expected one label per record (2)"
    with h5py.File(tmp_path / "c.h5", "w") as f:
        f.create_dataset("value/0/0", data=np.zeros((1, 2), np.complex64))
    assert _error(HDF5Dataset(tmp_path / "c.h5").meta, 0, "0") == (
        "c.h5: record 0, input 0: dtype complex64 is not a numeric tensor type"
    )


def test_head_reads_a_prefix(tmp_path) -> None:
    dataset = _npz(tmp_path, x=np.arange(20, dtype=np.float32).reshape(5, 4))
    head = Head(dataset, 3)
    assert len(head) == 3 and head.labels() is None
    np.testing.assert_array_equal(np.stack([r["x"] for r in head.iter_records()]), np.arange(12).reshape(3, 4))
    np.testing.assert_array_equal(np.stack([r["x"] for r in head.iter_records(1, 2)]), [[4, 5, 6, 7]])


def test_unknown_format_lists_the_known_ones(tmp_path) -> None:
    (tmp_path / "d.csv").write_text("1,2")
    assert _error(load_dataset, tmp_path / "d.csv") == (
        f"{tmp_path / 'd.csv'}: unknown dataset format '.csv'; expected .h5, .hdf5, .npz or a folder of .npy"
    )


def test_a_missing_dataset_and_a_link_that_leads_nowhere(tmp_path) -> None:
    assert _error(load_dataset, tmp_path / "none.npz") == f"{tmp_path / 'none.npz'}: dataset not found"
    (tmp_path / "gone.npz").symlink_to(tmp_path / "missing.npz")
    (tmp_path / "loop.h5").symlink_to(tmp_path / "loop.h5")
    for name in ("gone.npz", "loop.h5"):
        assert _error(load_dataset, tmp_path / name) == (
            f"{tmp_path / name}: dataset not found (a symbolic link that leads nowhere: a loop or a missing target)"
        )


def test_memory_budget(monkeypatch) -> None:
    monkeypatch.delenv("QACCURACY_MEMORY_BUDGET", raising=False)
    budget = memory_budget()
    assert isinstance(budget, int) and budget > 0
    monkeypatch.setenv("QACCURACY_MEMORY_BUDGET", "1")
    assert memory_budget() == 1  # one byte is a budget, if a small one
    monkeypatch.setenv("QACCURACY_MEMORY_BUDGET", "0")
    with pytest.raises(DataError, match="the memory budget must be positive"):
        memory_budget()


# -- paths the usual files do not take ------------------------------------------------------------


def test_a_folder_named_like_a_record_file_is_refused_by_name(tmp_path) -> None:
    (tmp_path / "d" / "x" / "1.npy").mkdir(parents=True)
    np.save(tmp_path / "d" / "x" / "0.npy", np.zeros((1, 4), np.float32))
    dataset = NpyDirDataset(tmp_path / "d")
    assert _error(dataset.meta, 1, "x") == "d/x/1.npy: cannot read (Is a directory)"
    records = dataset.iter_records()
    assert next(records)["x"].shape == (1, 4)
    assert _error(next, records) == "d/x/1.npy: cannot read (Is a directory)"


def test_npz_members_of_another_compression_are_read_whole_within_the_budget(tmp_path, monkeypatch) -> None:
    """LZMA has no known ratio bound: the member is checked whole against the memory budget (a
    deflated member of the same array is only checked one record at a time)."""
    data = np.arange(8, dtype=np.float32).reshape(4, 2)
    _zip(tmp_path / "lz.npz", {"x.npy": _npy_bytes(data)}, zipfile.ZIP_LZMA)
    _zip(tmp_path / "df.npz", {"x.npy": _npy_bytes(data)}, zipfile.ZIP_DEFLATED)
    np.testing.assert_array_equal(np.stack([r["x"] for r in NpzDataset(tmp_path / "lz.npz").iter_records()]), data)
    monkeypatch.setenv("QACCURACY_MEMORY_BUDGET", "16")  # two records' bytes, half the array's
    assert _error(NpzDataset, tmp_path / "lz.npz") == (
        "lz.npz: array 'x': shape (4, 2) float32 needs 32 B, over the memory budget of 16 B "
        "(set QACCURACY_MEMORY_BUDGET to raise it)"
    )
    assert len(NpzDataset(tmp_path / "df.npz")) == 4


def test_hdf5_enum_bool_meta_and_a_group_in_place_of_an_input(tmp_path) -> None:
    """h5py reads its own FALSE/TRUE enum as bool; a false/true enum in another letter case is read as
    bool by the dataset; any other enum keeps its integer values (class 42 was read as True before)."""
    lower_bool = h5py.enum_dtype({"false": 0, "true": 1}, basetype=np.int8)
    colours = h5py.enum_dtype({"RED": 0, "GREEN": 1, "BLUE": 42}, basetype=np.uint8)
    with h5py.File(tmp_path / "e.h5", "w") as f:
        f.create_dataset("value/0/0", data=np.array([[1, 0, 1]], np.int8), dtype=lower_bool)
        f.create_dataset("value/0/1", data=np.array([[42, 0, 1]], np.uint8), dtype=colours)
        f.create_group("value/1/0")
    dataset = HDF5Dataset(tmp_path / "e.h5")
    assert dataset.meta(0, "0") == ArrayMeta((1, 3), np.dtype(bool))
    assert dataset.meta(0, "1") == ArrayMeta((1, 3), np.dtype(np.uint8))
    record = next(dataset.iter_records())
    assert record["0"].dtype == np.bool_ and record["1"].dtype == np.uint8
    np.testing.assert_array_equal(record["0"], [[True, False, True]])
    np.testing.assert_array_equal(record["1"], [[42, 0, 1]])
    assert _error(dataset.meta, 1, "0") == "e.h5: record 1, input 0 is not a dataset"


def test_head_cannot_skip_past_the_dataset(tmp_path) -> None:
    dataset = _npz(tmp_path, x=np.zeros((3, 4), np.float32))
    assert _error(Head, dataset, 1, 3) == "d.npz: cannot skip 3 of its 3 record(s)"
    assert _error(Head, dataset, 1, -1) == "d.npz: cannot skip -1 of its 3 record(s)"
    assert len(Head(dataset, 5, skip=2)) == 1


def test_a_record_reader_refuses_a_0d_array() -> None:
    """The reader's own guard (NpzDataset refuses 0-d members before it makes one)."""
    assert _error(RecordReader, io.BytesIO(_npy_bytes(np.float32(3))), "s.npz: array 'x'") == (
        "s.npz: array 'x': a 0-d array has no record axis"
    )


class _Memory(Dataset):
    """A user's own dataset that implements only what Dataset requires."""

    def __init__(self) -> None:
        super().__init__("memory")
        self._x = np.arange(6, dtype=np.float32).reshape(3, 2)

    @property
    def keys(self) -> list[str]:
        return ["x"]

    def __len__(self) -> int:
        return len(self._x)

    def meta(self, record: int, key: str) -> ArrayMeta:
        return ArrayMeta(self._x[record].shape, self._x.dtype)

    def iter_records(self, start=0, stop=None):
        for record in range(start, len(self) if stop is None else stop):
            yield {"x": self._x[record]}


def test_a_dataset_that_stores_no_labels_or_targets_has_none() -> None:
    dataset = _Memory()
    assert dataset.labels() is None and dataset.targets() is None
    held = Head(dataset, 2, skip=1)
    assert held.labels() is None and held.targets() is None
    np.testing.assert_array_equal(np.stack([r["x"] for r in held.iter_records()]), [[2, 3], [4, 5]])
