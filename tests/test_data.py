"""Datasets: ONE HDF5, .npy folders and .npz; validation against model inputs; streaming."""

from __future__ import annotations

import tracemalloc
import zipfile

import h5py
import numpy as np
import pytest
from modelzoo import write_h5

from pytest_qaccuracy.data import HDF5Dataset, NpyDirDataset, NpzDataset, bind_dataset, load_dataset
from pytest_qaccuracy.errors import DataError
from pytest_qaccuracy.model import InputSpec

X = InputSpec("x", "float32", (1, 3, 48, 192))


def _records(n: int, shape=(1, 3, 48, 192), seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, *shape)).astype(np.float32)


def _npy_dir(root, arrays: dict[str, np.ndarray]):
    for name, records in arrays.items():
        (root / name).mkdir(parents=True)
        for i, record in enumerate(records):
            np.save(root / name / f"{i}.npy", record)
    return root


def test_load_dataset_dispatches_on_path(tmp_path):
    records = _records(3)
    h5 = write_h5(tmp_path / "a.h5", records)
    np.savez(tmp_path / "b.npz", x=records)
    folder = _npy_dir(tmp_path / "c", {"x": records})
    assert isinstance(load_dataset(h5), HDF5Dataset)
    assert isinstance(load_dataset(tmp_path / "b.npz"), NpzDataset)
    assert isinstance(load_dataset(folder), NpyDirDataset)
    with pytest.raises(DataError, match=r"missing\.h5: dataset not found"):
        load_dataset(tmp_path / "missing.h5")
    (tmp_path / "d.csv").write_text("1,2")
    with pytest.raises(DataError, match=r"unknown dataset format '\.csv'"):
        load_dataset(tmp_path / "d.csv")


@pytest.mark.parametrize("kind", ["h5", "npz", "npz_compressed", "npy"])
def test_every_format_yields_the_stored_records_in_batches(tmp_path, kind):
    records = _records(7)
    if kind == "h5":
        path = write_h5(tmp_path / "d.h5", records)
    elif kind == "npz":
        path = tmp_path / "d.npz"
        np.savez(path, x=records)
    elif kind == "npz_compressed":
        path = tmp_path / "d.npz"
        np.savez_compressed(path, x=records)
    else:
        path = _npy_dir(tmp_path / "d", {"x": records})
    with load_dataset(path) as ds:
        assert len(ds) == 7
        bound = bind_dataset(ds, [X])
        batches = list(bound.iter_batches(3))
    assert [len(b) for b in batches] == [3, 3, 1]
    assert [b.start for b in batches] == [0, 3, 6]
    stacked = np.concatenate([b.stacked()["x"] for b in batches])
    np.testing.assert_array_equal(stacked, records.reshape(7, 3, 48, 192))


def test_shape_error_names_file_record_input_and_both_shapes(tmp_path):
    records = _records(5)
    path = tmp_path / "calib.h5"
    with h5py.File(path, "w") as f:
        for i, r in enumerate(records):
            data = r if i != 3 else r.transpose(0, 2, 3, 1)  # a transposed input of the same size
            f.create_dataset(f"value/{i}/0", data=data)
    with pytest.raises(DataError) as info:
        bind_dataset(load_dataset(path), [X])
    assert str(info.value) == (
        "calib.h5: record 3, input 0 ('x'): shape (1, 48, 192, 3) does not match the model input (1, 3, 48, 192)"
    )


def test_dynamic_dims_and_records_without_batch_axis_are_accepted(tmp_path):
    dynamic = InputSpec("x", "float32", ("N", 3, None, 192))
    records = _records(2, shape=(3, 48, 192))  # stored without the batch axis
    np.savez(tmp_path / "d.npz", x=records)
    batch = next(bind_dataset(load_dataset(tmp_path / "d.npz"), [dynamic]).iter_batches(2))
    assert batch.stacked()["x"].shape == (2, 3, 48, 192)
    with pytest.raises(DataError, match=r"shape \(3, 48, 192\) does not match the model input \(4, 3, 48, 192\)"):
        bind_dataset(load_dataset(tmp_path / "d.npz"), [InputSpec("x", "float32", (4, 3, 48, 192))])


def test_dtype_and_input_name_mismatches(tmp_path):
    np.savez(tmp_path / "d.npz", x=_records(2).astype(np.float64))
    with pytest.raises(
        DataError, match=r"record 0, input 'x': dtype float64 does not match the model input dtype float32"
    ):
        bind_dataset(load_dataset(tmp_path / "d.npz"), [X])
    np.savez(tmp_path / "e.npz", y=_records(2))
    with pytest.raises(DataError, match=r"missing model input\(s\) \['x'\]; unknown input\(s\) \['y'\]"):
        bind_dataset(load_dataset(tmp_path / "e.npz"), [X])
    write_h5(tmp_path / "f.h5", _records(2))
    two = [X, InputSpec("y", "float32", (1,))]
    with pytest.raises(DataError, match=r"f\.h5: records hold 1 input\(s\), the model has 2 \(x, y\)"):
        bind_dataset(load_dataset(tmp_path / "f.h5"), two)


def test_nan_and_inf_are_errors_unless_allowed(tmp_path):
    records = _records(4)
    records[2, 0, 1, 2, 3] = np.nan
    path = write_h5(tmp_path / "n.h5", records)
    bound = bind_dataset(load_dataset(path), [X])  # metadata is fine: the check happens on read
    with pytest.raises(DataError, match=r"n\.h5: record 2, input 0 \('x'\): contains NaN"):
        list(bound.iter_batches(2))
    allowed = bind_dataset(load_dataset(path), [X], allow_nonfinite=True)
    assert sum(len(b) for b in allowed.iter_batches(2)) == 4
    records[2, 0, 1, 2, 3] = np.inf
    np.savez(tmp_path / "i.npz", x=records)
    with pytest.raises(DataError, match=r"record 2, input 'x': contains Inf"):
        list(bind_dataset(load_dataset(tmp_path / "i.npz"), [X]).iter_batches(4))


def test_pickles_are_never_loaded(tmp_path):
    objects = np.empty(2, dtype=object)
    objects[:] = [{"a": 1}, {"b": 2}]
    np.savez(tmp_path / "o.npz", x=objects)
    with pytest.raises(DataError, match=r"o\.npz: array 'x': dtype object is not a numeric tensor type"):
        load_dataset(tmp_path / "o.npz")
    (tmp_path / "p" / "x").mkdir(parents=True)
    np.save(tmp_path / "p" / "x" / "0.npy", objects, allow_pickle=True)
    ds = load_dataset(tmp_path / "p")
    with pytest.raises(DataError, match=r"p/x/0\.npy: dtype object is not a numeric tensor type"):
        bind_dataset(ds, [InputSpec("x", "float32", (2,))])


def test_hdf5_layout_errors(tmp_path):
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f.create_dataset("data/0/0", data=np.zeros(3))
    with pytest.raises(DataError, match=r"a\.h5: no group 'value'"):
        load_dataset(tmp_path / "a.h5")
    with h5py.File(tmp_path / "b.h5", "w") as f:
        f.create_dataset("value/0/0", data=np.zeros(3))
        f.create_dataset("value/2/0", data=np.zeros(3))
    with pytest.raises(DataError, match=r"b\.h5: records must be numbered '0'..'1'; missing \['1'\]"):
        load_dataset(tmp_path / "b.h5")
    (tmp_path / "c.h5").write_bytes(b"not hdf5")
    with pytest.raises(DataError, match=r"c\.h5: not a readable HDF5 file"):
        load_dataset(tmp_path / "c.h5")


def _h5(path, datasets: dict[str, np.ndarray], groups: tuple[str, ...] = ()):
    with h5py.File(path, "w") as f:
        for name in groups:
            f.create_group(name)
        for name, data in datasets.items():
            f.create_dataset(name, data=data)
    return path


def _message(path, records: int | None = None) -> str:
    """The DataError message of opening ``path`` (and reading ``records`` records, if given)."""
    with pytest.raises(DataError) as info:
        ds = load_dataset(path)
        list(ds.iter_records(0, records))
    return str(info.value)


def test_hdf5_layout_errors_name_file_record_and_input(tmp_path):
    """Each broken layout gets one line naming the file, the record and the input."""
    z = np.zeros(3, np.float32)
    path = _h5(tmp_path / "names.h5", {"value/0/0": z, "value/first/0": z})
    assert _message(path) == "names.h5: record 'first' is not a number; expected '0'..'N-1'"
    path = _h5(tmp_path / "inputs.h5", {"value/0/0": z, "value/0/image": z})
    assert _message(path) == "inputs.h5: record 0: input 'image' is not a number; expected '0'..'N-1'"
    path = _h5(tmp_path / "empty.h5", {}, groups=("value",))
    assert _message(path) == "empty.h5: group 'value' holds no records"
    path = _h5(tmp_path / "flat.h5", {"value/0/0": z, "value/1": z})
    assert _message(path) == "flat.h5: record 1 is not a group of input datasets"
    path = _h5(tmp_path / "fewer.h5", {"value/0/0": z, "value/0/1": z, "value/1/0": z})
    assert _message(path) == "fewer.h5: record 1 has no input '1' (record 0 has ['0', '1'])"
    path = _h5(tmp_path / "nested.h5", {"value/0/0": z, "value/1/0/deeper": z})
    assert _message(path) == "nested.h5: record 1, input 0 is not a dataset"
    path = _h5(tmp_path / "more.h5", {"value/0/0": z, "value/1/0": z, "value/1/1": z, "value/1/2": z})
    assert _message(path) == "more.h5: record 1 has inputs ['1', '2'] that record 0 lacks"


def test_hdf5_an_input_that_record_0_lacks_is_an_error_not_skipped(tmp_path):
    """Record 0 is read fine; record 1 carries an input the model would never see: an error, not a skip."""
    z = np.zeros(3, np.float32)
    ds = load_dataset(_h5(tmp_path / "more.h5", {"value/0/0": z, "value/1/0": z, "value/1/1": z}))
    assert [list(r) for r in ds.iter_records(0, 1)] == [["0"]]
    with pytest.raises(DataError, match=r"^more\.h5: record 1 has inputs \['1'\] that record 0 lacks$"):
        list(ds.iter_records())


def test_npy_folder_record_files_must_agree(tmp_path):
    root = _npy_dir(tmp_path / "d", {"a": _records(3, (2,)), "b": _records(2, (2,))})
    with pytest.raises(DataError, match=r"inputs 'a' and 'b' have different record files; e\.g\. record\(s\) \[2\]"):
        load_dataset(root)


def test_labels_in_every_format(tmp_path):
    records, labels = _records(4, (2,)), np.array([3, 1, 4, 1])
    write_h5(tmp_path / "a.h5", records, labels)
    np.savez(tmp_path / "b.npz", x=records, labels=labels)
    root = _npy_dir(tmp_path / "c", {"x": records})
    np.save(root / "labels.npy", labels)
    for path in (tmp_path / "a.h5", tmp_path / "b.npz", root):
        ds = load_dataset(path)
        np.testing.assert_array_equal(ds.labels(), labels)
        assert ds.keys == (["0"] if path.suffix == ".h5" else ["x"])
    np.savez(tmp_path / "bad.npz", x=records, labels=labels[:3])
    with pytest.raises(DataError, match=r"labels have shape \(3,\), expected one label per record \(4\)"):
        load_dataset(tmp_path / "bad.npz").labels()


def test_one_bool_enum_inputs_are_read_as_bool(tmp_path):
    path = tmp_path / "b.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("value/0/0", data=np.array([True, False, True]))
    ds = load_dataset(path)
    assert ds.meta(0, "0").dtype == np.dtype(bool)
    batch = next(bind_dataset(ds, [InputSpec("m", "bool", (3,))]).iter_batches(1))
    np.testing.assert_array_equal(batch.records[0]["m"], [True, False, True])


def test_a_large_npz_is_streamed_not_read_whole(tmp_path):
    """10,000 records: peak traced memory while iterating stays a small fraction of the data."""
    records = np.random.default_rng(0).standard_normal((10_000, 1, 3, 16, 16)).astype(np.float32)
    path = tmp_path / "big.npz"
    np.savez_compressed(path, x=records)
    total = records.nbytes
    del records
    bound = bind_dataset(load_dataset(path), [InputSpec("x", "float32", ("N", 3, 16, 16))])
    tracemalloc.start()
    count = sum(len(batch) for batch in bound.iter_batches(16))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert count == 10_000
    assert peak < total / 20, f"peak {peak} bytes while streaming {total} bytes"
    with zipfile.ZipFile(path) as z:  # sanity: the member really is compressed, so streaming was needed
        assert z.getinfo("x.npy").compress_type == zipfile.ZIP_DEFLATED


def test_head_is_the_first_records_of_a_dataset(tmp_path):
    from pytest_qaccuracy.data import Head

    records, labels = _records(5, (2,)), np.arange(5)
    np.savez(tmp_path / "d.npz", x=records, labels=labels)
    ds = load_dataset(tmp_path / "d.npz")
    head = Head(ds, 3)
    assert (len(head), head.keys, head.name) == (3, ["x"], "d.npz")
    np.testing.assert_array_equal(np.stack([r["x"] for r in head.iter_records()]), records[:3])
    np.testing.assert_array_equal(np.stack([r["x"] for r in head.iter_records(1, 99)]), records[1:3])
    np.testing.assert_array_equal(head.labels(), labels[:3])
    batches = list(bind_dataset(head, [InputSpec("x", "float32", (2,))]).iter_batches(2))
    assert [len(b) for b in batches] == [2, 1]
    assert len(Head(ds, 50)) == 5  # a larger sample is the whole dataset
    with pytest.raises(DataError, match=r"d\.npz: a sample needs at least 1 record, got 0"):
        Head(ds, 0)
