"""Issue 18, "nothing lost, nothing hangs": hostile inputs and outputs end in one ``error:`` line.

Each case runs the ``qaccuracy`` command and checks the message, the exit code and that nothing
(or exactly what is promised) was written.
"""

from __future__ import annotations

import io
import json
import time
import zipfile

import h5py
import numpy as np
import onnx
import pytest
from modelzoo import random_inputs, write_h5
from numpy.lib import format as npy_format

from pytest_qaccuracy.cli import main


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "Traceback" not in err[0]
    return err[0]


def _npy_header(shape: tuple[int, ...], payload: bytes = b"\0" * 64) -> bytes:
    """An ``.npy`` file whose header declares ``shape`` float32, followed by a few bytes only."""
    stream = io.BytesIO()
    npy_format.write_array_header_1_0(stream, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return stream.getvalue() + payload


def _compare(zoo, data, out, *extra: str) -> list[str]:
    return ["compare", str(zoo["fp32"]), str(zoo["qdq_u8"]), "--data", str(data), "--out-dir", str(out), *extra]


def test_a_tiny_npz_declaring_4e9_records_is_refused_at_once(zoo, tmp_path, capsys):
    for method in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        data = tmp_path / f"huge{method}.npz"
        with zipfile.ZipFile(data, "w", method) as archive:
            archive.writestr("x.npy", _npy_header((4_000_000_000, 3, 16, 16)))
        assert data.stat().st_size < 1024
        out = tmp_path / "out"
        began = time.monotonic()
        assert main(_compare(zoo, data, out)) == 2
        assert time.monotonic() - began < 5
        line = _error_line(capsys)
        assert line.startswith(
            f"error: {data.name}: array 'x': the header declares shape (4000000000, 3, 16, 16) float32 (11.2 TiB), "
            "more than the file can hold"
        ), line
        assert not out.exists()


def test_a_npz_of_empty_records_is_checked_once_not_per_record(zoo, tmp_path, capsys):
    data = tmp_path / "empty.npz"
    with zipfile.ZipFile(data, "w") as archive:
        archive.writestr("x.npy", _npy_header((4_000_000_000, 0), b""))
    began = time.monotonic()
    assert main(_compare(zoo, data, tmp_path / "out")) == 2
    assert time.monotonic() - began < 5
    assert _error_line(capsys) == (
        "error: empty.npz: record 0, input 'x': shape (0,) does not match the model input (N, 3, 16, 16)"
    )


def test_a_npy_record_declaring_23_gib_is_refused_before_numpy_allocates(zoo, tmp_path, capsys):
    (tmp_path / "data" / "x").mkdir(parents=True)
    np.save(tmp_path / "data" / "x" / "0.npy", np.zeros((1, 3, 16, 16), np.float32))
    (tmp_path / "data" / "x" / "1.npy").write_bytes(_npy_header((100_000_000, 3, 16, 16)))
    out = tmp_path / "out"
    assert main(_compare(zoo, tmp_path / "data", out)) == 2
    line = _error_line(capsys)
    assert line.startswith(
        "error: data/x/1.npy: the header declares shape (100000000, 3, 16, 16) float32 (286.1 GiB), "
        "more than the file can hold (64 B)"
    ), line
    assert not out.exists()


def test_an_h5_record_over_the_memory_budget_is_refused(zoo, tmp_path, capsys, monkeypatch):
    data = tmp_path / "sparse.h5"
    with h5py.File(data, "w") as f:  # chunked and never written: a small file
        f.create_dataset("value/0/0", shape=(100_000_000, 3, 16, 16), dtype=np.float32, chunks=(1, 3, 16, 16))
    out = tmp_path / "out"
    monkeypatch.setenv("QACCURACY_MEMORY_BUDGET", "1G")
    assert main(_compare(zoo, data, out)) == 2
    assert _error_line(capsys) == (
        "error: sparse.h5: record 0, input 0: shape (100000000, 3, 16, 16) float32 needs 286.1 GiB, "
        "over the memory budget of 1.0 GiB (set QACCURACY_MEMORY_BUDGET to raise it)"
    )
    assert not out.exists()
    monkeypatch.setenv("QACCURACY_MEMORY_BUDGET", "lots")
    assert main(_compare(zoo, data, out)) == 2
    assert _error_line(capsys) == ("error: QACCURACY_MEMORY_BUDGET='lots': expected a size in bytes, e.g. 2G or 500M")


def test_a_record_holding_several_samples_is_refused(zoo, tmp_path, capsys):
    """One record is one sample: a (5, 3, 16, 16) file would be counted as 1 record for 5 samples."""
    (tmp_path / "data" / "x").mkdir(parents=True)
    np.save(tmp_path / "data" / "x" / "0.npy", np.zeros((1, 3, 16, 16), np.float32))
    np.save(tmp_path / "data" / "x" / "1.npy", np.zeros((5, 3, 16, 16), np.float32))
    out = tmp_path / "out"
    assert main(_compare(zoo, tmp_path / "data", out)) == 2
    assert _error_line(capsys) == (
        "error: data: record 1, input 'x': shape (5, 3, 16, 16) holds 5 samples; a record is one sample "
        "(batch dimension 1, or none): store them as 5 records"
    )
    assert not out.exists()


def _compare_to(zoo, *outputs: str) -> list[str]:
    return ["compare", str(zoo["fp32"]), str(zoo["qdq_u8"]), "--data", str(zoo["data"]), "--metrics", "mse", *outputs]


def test_unwritable_output_paths_are_refused_before_the_models_run(zoo, tmp_path, capsys):
    folder = tmp_path / "a_folder"
    folder.mkdir()
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    cases = {
        ("--json", str(folder)): f"error: --json {folder}: is a directory, expected a file",
        ("--out-dir", str(a_file)): f"error: --out-dir {a_file}: is a file, expected a directory",
        ("--out-dir", str(a_file / "out")): (
            f"error: --out-dir {a_file / 'out'}: cannot be created, {a_file} is not a directory"
        ),
        ("--json", str(a_file / "deep" / "r.json")): (
            f"error: --json {a_file / 'deep' / 'r.json'}: cannot be created, {a_file} is not a directory"
        ),
    }
    for option, message in cases.items():
        assert main(_compare_to(zoo, *option)) == 2
        assert _error_line(capsys) == message
        assert capsys.readouterr().out == ""  # refused before the comparison ran
    assert list(folder.iterdir()) == [] and a_file.read_text() == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "a_folder"]


def test_a_directory_in_place_of_an_artifact_is_refused_before_any_is_written(zoo, tmp_path, capsys):
    out = tmp_path / "out"
    (out / "report.html").mkdir(parents=True)
    json_path = tmp_path / "r.json"
    assert main(_compare_to(zoo, "--out-dir", str(out), "--json", str(json_path))) == 2
    assert _error_line(capsys) == f"error: --out-dir {out}: report.html exists there as a directory"
    assert [p.name for p in out.iterdir()] == ["report.html"] and not json_path.exists()


def test_report_out_pointing_at_a_directory_is_refused(zoo, tmp_path, capsys):
    assert main(_compare_to(zoo, "--json", str(tmp_path / "r.json"))) == 0
    capsys.readouterr()
    (tmp_path / "report.html").mkdir()
    assert main(["report", str(tmp_path)]) == 2
    assert _error_line(capsys) == f"error: --out {tmp_path / 'report.html'}: is a directory, expected a file"


def test_nan_metrics_are_null_in_json_and_nan_on_the_terminal(zoo, tmp_path, capsys):
    records = random_inputs(4, seed=4)
    records[1, 0, 0, 0, 0] = np.nan
    data = write_h5(tmp_path / "nan.h5", records)
    out, json_path = tmp_path / "out", tmp_path / "r.json"
    args = _compare(zoo, data, out, "--metrics", "mse,sqnr", "--allow-nonfinite", "--json", str(json_path))
    assert main(args) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "nan" in captured.out
    document = json.loads(json_path.read_text(), parse_constant=lambda name: pytest.fail(f"{name} in JSON"))
    assert document["outputs"][0]["metrics"] == {"mse": None, "sqnr": None}
    assert {p.name for p in out.iterdir()} == {
        "net.qdq_u8.comparison.json",
        "net.qdq_u8.mse.visq.json",
        "net.qdq_u8.mse.dot",
        "net.qdq_u8.sqnr.visq.json",
        "net.qdq_u8.sqnr.dot",
        "report.html",
    }


def test_report_names_the_file_layer_and_metric_of_a_non_numeric_value(zoo, tmp_path, capsys):
    json_path = tmp_path / "r.json"
    assert main(_compare_to(zoo, "--json", str(json_path))) == 0
    capsys.readouterr()
    document = json.loads(json_path.read_text())
    layer = document["layers"][2]
    layer["metrics"]["mse"] = "0.1 (approx)"
    json_path.write_text(json.dumps(document))
    assert main(["report", str(tmp_path)]) == 2
    assert _error_line(capsys) == (
        f"error: {json_path}: not a valid comparison JSON "
        f"(layer '{layer['tensor']}', metric 'mse': '0.1 (approx)' is not a number)"
    )
    assert not (tmp_path / "report.html").exists()


def test_an_empty_onnx_file_is_refused_as_a_model(zoo, tmp_path, capsys):
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    out = tmp_path / "out"
    for fp32, quantized in ((empty, zoo["qdq_u8"]), (zoo["fp32"], empty)):
        args = ["compare", str(fp32), str(quantized), "--data", str(zoo["data"]), "--out-dir", str(out)]
        assert main(args) == 2
        assert _error_line(capsys) == f"error: {empty}: empty file, not an ONNX model"
    assert not out.exists()


def _rename(source, target, renames: dict[str, str]):
    """A copy of the model at ``source`` with tensors renamed everywhere they appear."""
    model = onnx.load(str(source))
    graph = model.graph
    for node in graph.node:
        node.input[:] = [renames.get(n, n) for n in node.input]
        node.output[:] = [renames.get(n, n) for n in node.output]
    for value in [*graph.output, *graph.value_info]:
        value.name = renames.get(value.name, value.name)
    onnx.save(model, str(target))
    return target


HOSTILE = {"logits": "logits\x1b[2J", "relu1": "relu1\x1b]0;pwned\x07"}


def test_control_characters_in_tensor_names_are_escaped_on_the_terminal_not_in_json(zoo, tmp_path, capsys):
    fp32 = _rename(zoo["fp32"], tmp_path / "net.onnx", HOSTILE)
    quantized = _rename(zoo["qdq_u8"], tmp_path / "net.q.onnx", HOSTILE)
    json_path = tmp_path / "r.json"
    args = ["compare", str(fp32), str(quantized), "--data", str(zoo["data"]), "--metrics", "mse,sqnr"]
    assert main([*args, "--json", str(json_path), "--top", "20"]) == 0
    text = capsys.readouterr().out
    assert "\x1b" not in text and "\x07" not in text
    assert "logits\\x1b[2J" in text and "relu1\\x1b]0;pwned\\x07" in text
    document = json.loads(json_path.read_text())
    assert document["outputs"][0]["name"] == HOSTILE["logits"]
    assert HOSTILE["relu1"] in {layer["tensor"] for layer in document["layers"]}
    assert main([*args, "--rank-by", "nope\x1b[2J"]) == 2
    assert _error_line(capsys).endswith("--rank-by nope\\x1b[2J: not among the measured metrics mse, sqnr")


def _unrelated(fp32, target):
    """A model with ``fp32``'s input and output but nothing else in common: pool, flatten, Gemm."""
    source = onnx.load(str(fp32)).graph
    channels = source.input[0].type.tensor_type.shape.dim[1].dim_value
    classes = source.output[0].type.tensor_type.shape.dim[1].dim_value
    weights = np.random.default_rng(0).standard_normal((classes, channels)).astype(np.float32)
    graph = onnx.helper.make_graph(
        [
            onnx.helper.make_node("GlobalAveragePool", [source.input[0].name], ["p"]),
            onnx.helper.make_node("Flatten", ["p"], ["f"], axis=1),
            onnx.helper.make_node("Gemm", ["f", "w"], [source.output[0].name], transB=1),
        ],
        "unrelated",
        [source.input[0]],
        [source.output[0]],
        [onnx.numpy_helper.from_array(weights, "w")],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(target))
    return target


def test_a_quantized_model_not_derived_from_the_fp32_one_is_flagged(zoo, tmp_path, capsys):
    other = _unrelated(zoo["fp32"], tmp_path / "other.onnx")
    json_path = tmp_path / "r.json"
    args = ["compare", str(zoo["fp32"]), str(other), "--data", str(zoo["data"]), "--metrics", "mse"]
    assert main([*args, "--json", str(json_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "warning: only 1 of 12 layers matched: are these the same model?" in lines
    assert json_path.exists()
    assert main(["compare", str(zoo["fp32"]), str(zoo["qdq_u8"]), "--data", str(zoo["data"])]) == 0
    assert "warning" not in capsys.readouterr().out  # 11 of 12 matched
