"""``qaccuracy run``: outputs in the ONE HDF5 layout, written atomically; errors exit 2 with one line."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import onnx
import pytest
from backend_models import float_net, ort_session, quantize_qdq
from onnx import TensorProto, helper

from pytest_qaccuracy.backend import IntegerSession
from pytest_qaccuracy.cli import main


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, np.ndarray]:
    folder = tmp_path_factory.mktemp("run")
    rng = np.random.default_rng(0)
    calibration = rng.normal(0, 1, (8, 8, 10, 10)).astype(np.float32)
    model = quantize_qdq(float_net(["Conv", "Add"], size=10), calibration, folder)
    onnx.save(model, folder / "model.onnx")
    records = rng.normal(0, 1, (5, 1, 8, 10, 10)).astype(np.float32)
    with h5py.File(folder / "data.h5", "w") as h5:
        for i, record in enumerate(records):
            h5.create_dataset(f"value/{i}/0", data=record)
    return folder / "model.onnx", folder / "data.h5", records


@pytest.mark.parametrize("threads", ["0", "1", "2"])
@pytest.mark.parametrize("backend", ["integer", "onnxruntime"])
def test_run_writes_one_layout(
    setup, backend: str, threads: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, data, records = setup
    out = tmp_path / "sub" / "out.h5"
    assert main(["run", str(model), "--data", str(data), "--backend", backend, "--scheme", "onnxruntime",
                 "--out", str(out), "--batch-size", "2", "--threads", threads]) == 0  # fmt: skip
    assert "wrote 5 record(s)" in capsys.readouterr().out
    want = ort_session(model).run(None, {"input": records.reshape(5, 8, 10, 10)})[0]
    with h5py.File(out) as h5:
        assert sorted(h5["value"], key=int) == [str(i) for i in range(5)]
        got = np.concatenate([h5[f"value/{i}/0"][()] for i in range(5)])
        assert h5.attrs["backend"] == backend
    np.testing.assert_array_equal(got, want)  # the integer emulation is bit-exact with onnxruntime
    assert [p.name for p in out.parent.iterdir()] == ["out.h5"]  # no temporary file left


def test_run_other_scheme_differs(setup, tmp_path: Path) -> None:
    model, data, records = setup
    out = tmp_path / "glow.h5"
    assert main(["run", str(model), "--data", str(data), "--scheme", "glow", "--out", str(out)]) == 0
    with h5py.File(out) as h5:
        got = np.concatenate([h5[f"value/{i}/0"][()] for i in range(5)])
        assert h5.attrs["scheme"] == "glow"
    np.testing.assert_array_equal(
        got, IntegerSession(model, "glow").run(None, {"input": records.reshape(5, 8, 10, 10)})[0]
    )


def test_run_errors_are_one_line(setup, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, data, _ = setup
    out = tmp_path / "out.h5"
    assert main(["run", str(model), "--data", str(data), "--scheme", "nope", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown scheme 'nope'") and err.count("\n") == 1
    assert main(["run", str(model), "--data", str(tmp_path / "missing.h5"), "--out", str(out)]) == 2
    assert "dataset not found" in capsys.readouterr().err
    assert main(["run", str(model), "--data", str(data), "--out", str(out), "--threads", "-1"]) == 2
    assert "--threads must be >= 0, got -1" in capsys.readouterr().err
    assert not out.exists()


def test_run_unsupported_op_names_node(setup, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, data, _ = setup
    node = helper.make_node("Mystery", ["input"], ["y"], name="odd_node", domain="example.custom")
    inputs = [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 8, 10, 10])]
    graph = helper.make_graph([node], "g", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])  # fmt: skip
    path = tmp_path / "odd.onnx"
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("example.custom", 1)]),
        path,
    )
    assert main(["run", str(path), "--data", str(data), "--out", str(tmp_path / "o.h5")]) == 2
    err = capsys.readouterr().err
    assert "node 'odd_node'" in err and "example.custom::Mystery" in err and err.count("\n") == 1
