"""``qaccuracy run`` in pieces: batches split per record, outputs without a batch axis, what the
file records, and how errors read."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import h5py
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from pytest_qaccuracy.cli import main
from pytest_qaccuracy.commands import run as run_command
from pytest_qaccuracy.errors import InputError, ModelError, UnsupportedOpError


def _model(path: Path, op: str, **attrs) -> Path:
    """``y = op(x)`` on an input of shape [N, 3]; ReduceSum (keepdims 0) gives a 0-d output."""
    node = helper.make_node(op, ["x"], ["y"], name="only", **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def _data(path: Path, records: np.ndarray) -> Path:
    with h5py.File(path, "w") as h5:
        for i, record in enumerate(records):
            h5.create_dataset(f"value/{i}/0", data=record)
    return path


def _batch_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of records of every run the command makes, in order (filled as it runs)."""
    sizes: list[int] = []
    real = run_command._execute

    def execute(runner, feeds):
        sizes.append(next(iter(feeds.values())).shape[0])
        return real(runner, feeds)

    monkeypatch.setattr(run_command, "_execute", execute)
    return sizes


@pytest.fixture
def records() -> np.ndarray:
    return np.arange(5 * 1 * 3, dtype=np.float32).reshape(5, 1, 3)


def test_split_slices_a_batch_per_record() -> None:
    a = np.arange(10).reshape(5, 2)
    b = np.arange(5)
    parts = run_command._split([a, b], [2, 3])
    assert len(parts) == 2
    np.testing.assert_array_equal(parts[0][0], a[:2])
    np.testing.assert_array_equal(parts[0][1], b[:2])
    np.testing.assert_array_equal(parts[1][0], a[2:])
    np.testing.assert_array_equal(parts[1][1], b[2:])
    assert [[len(x) for x in p] for p in run_command._split([np.zeros((3, 4))], [1, 1, 1])] == [[1], [1], [1]]


def test_split_refuses_outputs_without_the_batch_axis() -> None:
    assert run_command._split([np.zeros((4, 5))], [2, 3]) is None  # first axis is not the batch
    assert run_command._split([np.zeros((5, 4)), np.zeros((4, 5))], [2, 3]) is None
    assert run_command._split([np.float32(1.0)], [1]) is None  # 0-d
    assert run_command._split([np.array(2.0)], [1]) is None


def test_batch_size_of_a_record() -> None:
    assert run_command._batch_size({"x": np.zeros((3, 2)), "z": np.zeros((7,))}) == 3
    assert run_command._batch_size({"x": np.zeros((2, 3))}) == 2
    assert run_command._batch_size({"x": np.array(1.0)}) == 1


def test_execute_keeps_input_errors_and_turns_the_rest_into_model_errors() -> None:
    assert run_command._execute(lambda feeds: [feeds["x"] + 1], {"x": np.ones(2)})[0].tolist() == [2.0, 2.0]
    mine = ModelError("bad model")

    def raise_(exc):
        def execute(feeds):
            raise exc

        return execute

    with pytest.raises(ModelError) as info:
        run_command._execute(raise_(mine), {})
    assert info.value is mine
    with pytest.raises(ModelError) as info:
        run_command._execute(raise_(UnsupportedOpError("node 'n': op Foo is not supported")), {})
    assert str(info.value) == "node 'n': op Foo is not supported"


def test_the_threads_reach_the_session(tmp_path: Path, monkeypatch) -> None:
    import pytest_qaccuracy.backend
    import pytest_qaccuracy.backend.agreement

    seen = {}
    real = pytest_qaccuracy.backend.IntegerSession

    def integer(model, scheme, **kwargs):
        seen["integer"] = kwargs
        return real(model, scheme, **kwargs)

    def ort(model, outputs, *args, **kwargs):
        seen["onnxruntime"] = (outputs, args, kwargs)
        return object()

    monkeypatch.setattr(pytest_qaccuracy.backend, "IntegerSession", integer)
    monkeypatch.setattr(pytest_qaccuracy.backend.agreement, "onnxruntime_session", ort)
    model = onnx.load(_model(tmp_path / "m.onnx", "Relu"))
    _, names, scheme = run_command._runner(model, "integer", "glow", 3)
    assert (names, scheme, seen["integer"]) == (["y"], "glow", {"threads": 3})
    _, names, scheme = run_command._runner(model, "onnxruntime", "glow", 2)
    assert (names, scheme, seen["onnxruntime"]) == (["y"], None, ([], (2,), {}))


def test_an_onnxruntime_failure_is_its_first_line(tmp_path: Path) -> None:
    import onnxruntime

    from pytest_qaccuracy.ort_session import first_line

    model = onnx.load(_model(tmp_path / "m.onnx", "Relu"))
    execute, _, _ = run_command._runner(model, "onnxruntime", "onnxruntime", 1)
    feeds = {"x": np.zeros((2, 4), np.float32)}  # 4 columns where the model has 3
    with pytest.raises(Exception) as direct:
        onnxruntime.InferenceSession(model.SerializeToString()).run(None, feeds)
    with pytest.raises(ModelError) as info:
        execute(feeds)
    assert str(info.value) == f"onnxruntime failed to run ({first_line(direct.value)})"


def test_records_run_in_batches_of_batch_size(tmp_path: Path, records, monkeypatch, capsys) -> None:
    sizes = _batch_sizes(monkeypatch)
    model, data = _model(tmp_path / "m.onnx", "Relu"), _data(tmp_path / "d.h5", records - 7)
    out = tmp_path / "a" / "b" / "out.h5"  # folders made as needed
    argv = ["run", str(model), "--data", str(data), "--backend", "onnxruntime", "--out", str(out)]
    assert main([*argv, "--batch-size", "2"]) == 0
    assert sizes == [2, 2, 1]
    assert capsys.readouterr().out == f"wrote 5 record(s) x 1 output(s) to {out} (onnxruntime)\n"
    with h5py.File(out) as h5:
        assert dict(h5.attrs) == {"model": "m.onnx", "backend": "onnxruntime", "scheme": "", "output_names": '["y"]'}
        for i in range(5):
            np.testing.assert_array_equal(h5[f"value/{i}/0"][()], np.maximum(records[i] - 7, 0))
    assert os.listdir(out.parent) == ["out.h5"]


def test_outputs_without_a_batch_axis_run_one_record_at_a_time(tmp_path: Path, records, monkeypatch) -> None:
    sizes = _batch_sizes(monkeypatch)
    model = _model(tmp_path / "m.onnx", "ReduceSum", keepdims=0)
    out = tmp_path / "out.h5"
    argv = ["run", str(model), "--data", str(_data(tmp_path / "d.h5", records)), "--backend", "onnxruntime"]
    assert main([*argv, "--out", str(out), "--batch-size", "4"]) == 0
    # the batch of 4 gives one number: each record again alone; so does the last batch, of 1
    assert sizes == [4, 1, 1, 1, 1, 1, 1]
    with h5py.File(out) as h5:
        assert [float(h5[f"value/{i}/0"][()]) for i in range(5)] == [float(r.sum()) for r in records]


def test_batch_size_one_is_allowed_and_zero_is_not(tmp_path: Path, records, capsys) -> None:
    model, data = _model(tmp_path / "m.onnx", "Relu"), _data(tmp_path / "d.h5", records)
    argv = ["run", str(model), "--data", str(data), "--backend", "onnxruntime", "--out", str(tmp_path / "o.h5")]
    assert main([*argv, "--batch-size", "1"]) == 0
    capsys.readouterr()
    assert main([*argv, "--batch-size", "0"]) == 2
    assert capsys.readouterr().err == "error: --batch-size must be >= 1, got 0\n"


def test_nonfinite_inputs_need_the_flag(tmp_path: Path, records, capsys) -> None:
    records[2, 0, 1] = np.nan
    model, data = _model(tmp_path / "m.onnx", "Relu"), _data(tmp_path / "d.h5", records)
    out = tmp_path / "o.h5"
    argv = ["run", str(model), "--data", str(data), "--backend", "onnxruntime", "--out", str(out)]
    assert main(argv) == 2
    assert "NaN" in capsys.readouterr().err and not out.exists()
    assert main([*argv, "--allow-nonfinite"]) == 0
    with h5py.File(out) as h5:
        assert np.isnan(h5["value/2/0"][0, 1])


def test_a_failed_write_names_the_option_and_leaves_nothing(tmp_path: Path, records, monkeypatch, capsys) -> None:
    model, data = _model(tmp_path / "m.onnx", "Relu"), _data(tmp_path / "d.h5", records)
    out = tmp_path / "o.h5"

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    assert main(["run", str(model), "--data", str(data), "--out", str(out)]) == 2
    assert (
        capsys.readouterr().err
        == f"error: --out {out}: could not be written (No space left on device); left as it was\n"
    )
    assert sorted(os.listdir(tmp_path)) == ["d.h5", "m.onnx"]  # the temporary file is gone


def test_output_names_are_json(tmp_path: Path, records) -> None:
    model, data = _model(tmp_path / "m.onnx", "Relu"), _data(tmp_path / "d.h5", records)
    out = tmp_path / "o.h5"
    assert main(["run", str(model), "--data", str(data), "--out", str(out), "--scheme", "tflite"]) == 0
    with h5py.File(out) as h5:
        assert json.loads(h5.attrs["output_names"]) == ["y"] and h5.attrs["scheme"] == "tflite"
        assert h5.attrs["backend"] == "integer"


def test_a_model_the_backend_rejects_names_the_model(tmp_path: Path, records, capsys, monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise UnsupportedOpError("node 'only': op Relu is not supported")

    def bad_input(*args, **kwargs):
        raise InputError("unknown scheme 'x'")

    model, data = _model(tmp_path / "m.onnx", "Relu"), _data(tmp_path / "d.h5", records)
    argv = ["run", str(model), "--data", str(data), "--out", str(tmp_path / "o.h5")]
    monkeypatch.setattr(run_command, "_runner", refuse)
    assert main(argv) == 2
    assert capsys.readouterr().err == f"error: {model}: node 'only': op Relu is not supported\n"
    monkeypatch.setattr(run_command, "_runner", bad_input)
    assert main(argv) == 2
    assert capsys.readouterr().err == "error: unknown scheme 'x'\n"


def test_a_batch_baked_into_a_reshape_runs_records_one_at_a_time(tmp_path: Path, records, monkeypatch) -> None:
    sizes = _batch_sizes(monkeypatch)
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [1, 3])
    node = helper.make_node("Reshape", ["x", "shape"], ["y"], name="only")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
        [shape],
    )
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), model)
    out = tmp_path / "o.h5"
    argv = ["run", str(model), "--data", str(_data(tmp_path / "d.h5", records)), "--backend", "onnxruntime"]
    assert main([*argv, "--out", str(out), "--batch-size", "4"]) == 0
    assert sizes == [1, 1, 1, 1, 1]


def test_progress_is_one_task_over_the_records_and_the_scheme_is_said(tmp_path: Path, records, monkeypatch, capsys):
    import contextlib

    import pytest_qaccuracy.data.progress as progress

    tasks = []

    @contextlib.contextmanager
    def task(name, total):
        tasks.append((name, total))
        yield lambda n: None

    monkeypatch.setattr(progress, "task", task)
    model, data = _model(tmp_path / "m.onnx", "Relu"), _data(tmp_path / "d.h5", records)
    out = tmp_path / "o.h5"
    assert main(["run", str(model), "--data", str(data), "--out", str(out), "--scheme", "tflite"]) == 0
    assert tasks == [("run", 5)]
    assert capsys.readouterr().out == f"wrote 5 record(s) x 1 output(s) to {out} (integer, tflite)\n"
    assert main(["run", str(model), "--data", str(data), "--out", str(out), "--threads", "-1"]) == 2
    assert capsys.readouterr().err == "error: --threads must be >= 0, got -1\n"
