"""Issue 18, "nothing lost, nothing hangs": hostile inputs and outputs end in one ``error:`` line.

One table of bad inputs and output paths for the ``qaccuracy`` command: each case checks the
message, the exit code and that nothing was written anywhere (the folder is as the case left it).
The pytest side of the same probe is in ``tests/plugin/test_nothing_lost.py``.
"""

from __future__ import annotations

import io
import json
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

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


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (None for a folder): the state a case must not change."""
    return {p.relative_to(root).as_posix(): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


@dataclass(frozen=True)
class Case:
    """A bad situation: ``make(zoo, tmp)`` prepares it and returns the command line and the message
    (``{tmp}`` is the case's folder); ``prefix``: the message is the start of the line."""

    make: Callable[[dict, Path], tuple[list[str], str]]
    prefix: bool = False
    env: tuple[tuple[str, str], ...] = ()


def _compare(zoo, data, *extra) -> list[str]:
    return ["compare", str(zoo["fp32"]), str(zoo["qdq_u8"]), "--data", str(data), *map(str, extra)]


def _huge_npz(method: int):
    def make(zoo, tmp):
        data = tmp / "huge.npz"
        with zipfile.ZipFile(data, "w", method) as archive:
            archive.writestr("x.npy", _npy_header((4_000_000_000, 3, 16, 16)))
        assert data.stat().st_size < 1024
        message = (
            "error: huge.npz: array 'x': the header declares shape (4000000000, 3, 16, 16) float32 (11.2 TiB), "
            "more than the file can hold"
        )
        return _compare(zoo, data, "--out-dir", tmp / "out"), message

    return make


def _empty_records(zoo, tmp):
    data = tmp / "empty.npz"
    with zipfile.ZipFile(data, "w") as archive:
        archive.writestr("x.npy", _npy_header((4_000_000_000, 0), b""))
    message = "error: empty.npz: record 0, input 'x': shape (0,) does not match the model input (N, 3, 16, 16)"
    return _compare(zoo, data, "--out-dir", tmp / "out"), message


def _npy_folder(tmp: Path, second: bytes | np.ndarray) -> Path:
    (tmp / "data" / "x").mkdir(parents=True)
    np.save(tmp / "data" / "x" / "0.npy", np.zeros((1, 3, 16, 16), np.float32))
    if isinstance(second, bytes):
        (tmp / "data" / "x" / "1.npy").write_bytes(second)
    else:
        np.save(tmp / "data" / "x" / "1.npy", second)
    return tmp / "data"


def _npy_23_gib(zoo, tmp):
    data = _npy_folder(tmp, _npy_header((100_000_000, 3, 16, 16)))
    message = (
        "error: data/x/1.npy: the header declares shape (100000000, 3, 16, 16) float32 (286.1 GiB), "
        "more than the file can hold (64 B)"
    )
    return _compare(zoo, data, "--out-dir", tmp / "out"), message


def _sparse_h5(tmp: Path) -> Path:
    data = tmp / "sparse.h5"
    with h5py.File(data, "w") as f:  # chunked and never written: a small file
        f.create_dataset("value/0/0", shape=(100_000_000, 3, 16, 16), dtype=np.float32, chunks=(1, 3, 16, 16))
    return data


def _h5_over_budget(zoo, tmp):
    message = (
        "error: sparse.h5: record 0, input 0: shape (100000000, 3, 16, 16) float32 needs 286.1 GiB, "
        "over the memory budget of 1.0 GiB (set QACCURACY_MEMORY_BUDGET to raise it)"
    )
    return _compare(zoo, _sparse_h5(tmp), "--out-dir", tmp / "out"), message


def _bad_budget(zoo, tmp):
    message = "error: QACCURACY_MEMORY_BUDGET='lots': expected a size in bytes, e.g. 2G or 500M"
    return _compare(zoo, _sparse_h5(tmp), "--out-dir", tmp / "out"), message


def _several_samples(zoo, tmp):
    """One record is one sample: a (5, 3, 16, 16) file would be counted as 1 record for 5 samples."""
    data = _npy_folder(tmp, np.zeros((5, 3, 16, 16), np.float32))
    message = (
        "error: data: record 1, input 'x': shape (5, 3, 16, 16) holds 5 samples; a record is one sample "
        "(batch dimension 1, or none): store them as 5 records"
    )
    return _compare(zoo, data, "--out-dir", tmp / "out"), message


def _npz(name: str, message: str, **arrays: np.ndarray):
    def make(zoo, tmp):
        np.savez(tmp / name, **arrays)
        return _compare(zoo, tmp / name, "--out-dir", tmp / "out"), message

    return make


def _nan_data(zoo, tmp):
    records = random_inputs(3, seed=1)
    records[1, 0, 0, 0, 0] = np.nan
    data = write_h5(tmp / "nan.h5", records)
    return _compare(zoo, data, "--json", tmp / "r.json"), (
        "error: nan.h5: record 1, input 0 ('x'): contains NaN "
        "(accept it with --allow-nonfinite, or allow_nonfinite = true in a suite or marker)"
    )


def _option(*extra: str, message: str):
    return lambda zoo, tmp: (_compare(zoo, zoo["data"], *extra, "--out-dir", tmp / "out"), message)


def _output_path(option: str, where: Callable[[Path], Path], message: str):
    """``--json``/``--out-dir`` at ``where(tmp)``, next to a folder ``a_folder`` and a file ``a_file``."""

    def make(zoo, tmp):
        (tmp / "a_folder").mkdir()
        (tmp / "a_file").write_text("")
        return _compare(zoo, zoo["data"], "--metrics", "mse", option, where(tmp)), message

    return make


def _artifact_is_a_folder(zoo, tmp):
    (tmp / "out" / "report.html").mkdir(parents=True)
    args = _compare(zoo, zoo["data"], "--metrics", "mse", "--out-dir", tmp / "out", "--json", tmp / "r.json")
    return args, "error: --out-dir {tmp}/out: report.html exists there as a directory"


def _empty_model(role: str):
    def make(zoo, tmp):
        (tmp / "empty.onnx").write_bytes(b"")
        models = {"fp32": zoo["fp32"], "qdq_u8": zoo["qdq_u8"], role: tmp / "empty.onnx"}
        args = ["compare", str(models["fp32"]), str(models["qdq_u8"]), "--data", str(zoo["data"])]
        return [*args, "--out-dir", str(tmp / "out")], "error: {tmp}/empty.onnx: empty file, not an ONNX model"

    return make


def _model_is_a_folder(zoo, tmp):
    (tmp / "model.onnx").mkdir()
    args = ["compare", str(tmp / "model.onnx"), str(zoo["qdq_u8"]), "--data", str(zoo["data"])]
    return [*args, "--out-dir", str(tmp / "out")], "error: {tmp}/model.onnx: a folder, not an ONNX model file"


def _not_onnx(zoo, tmp):
    (tmp / "text.onnx").write_text("not a model")
    args = ["compare", str(zoo["fp32"]), str(tmp / "text.onnx"), "--data", str(zoo["data"])]
    return [*args, "--out-dir", str(tmp / "out")], "error: {tmp}/text.onnx: not a readable ONNX model (DecodeError: "


def _comparison_json(zoo, tmp) -> Path:
    json_path = tmp / "r.json"
    assert main(_compare(zoo, zoo["data"], "--metrics", "mse", "--json", json_path)) == 0
    return json_path


def _report_non_numeric(zoo, tmp):
    json_path = _comparison_json(zoo, tmp)
    document = json.loads(json_path.read_text())
    layer = document["layers"][2]
    layer["metrics"]["mse"] = "0.1 (approx)"
    json_path.write_text(json.dumps(document))
    message = (
        f"error: {json_path}: not a valid comparison JSON "
        f"(layer '{layer['tensor']}', metric 'mse': '0.1 (approx)' is not a number)"
    )
    return ["report", str(tmp)], message


def _report_not_json(zoo, tmp):
    (tmp / "x.json").write_text("{not json")
    return ["report", str(tmp)], "error: {tmp}/x.json: malformed JSON (Expecting property name enclosed in"


def _report_out_is_a_folder(zoo, tmp):
    _comparison_json(zoo, tmp)
    (tmp / "report.html").mkdir()
    return ["report", str(tmp)], "error: --out {tmp}/report.html: is a directory, expected a file"


MEMORY = (("QACCURACY_MEMORY_BUDGET", "1G"),)
CASES = {
    "npz declaring 4e9 records (stored)": Case(_huge_npz(zipfile.ZIP_STORED), prefix=True),
    "npz declaring 4e9 records (deflated)": Case(_huge_npz(zipfile.ZIP_DEFLATED), prefix=True),
    "npz of 4e9 empty records": Case(_empty_records),
    "npy record declaring 286 GiB": Case(_npy_23_gib, prefix=True),
    "h5 record over the memory budget": Case(_h5_over_budget, env=MEMORY),
    "memory budget not a size": Case(_bad_budget, env=(("QACCURACY_MEMORY_BUDGET", "lots"),)),
    "npy record of 5 samples": Case(_several_samples),
    "bad shape": Case(
        _npz(
            "shape.npz",
            "error: shape.npz: record 0, input 'x': shape (3, 8, 8) does not match the model input (N, 3, 16, 16)",
            x=np.zeros((3, 3, 8, 8), np.float32),
        )
    ),
    "bad dtype": Case(
        _npz(
            "dtype.npz",
            "error: dtype.npz: record 0, input 'x': dtype int64 does not match the model input dtype float32",
            x=np.zeros((3, 3, 16, 16), np.int64),
        )
    ),
    "wrong input name": Case(
        _npz(
            "names.npz",
            "error: names.npz: missing model input(s) ['x']; unknown input(s) ['y']; the model's inputs are ['x']",
            y=np.zeros((3, 3, 16, 16), np.float32),
        )
    ),
    "NaN without --allow-nonfinite": Case(_nan_data),
    "missing data": Case(
        lambda zoo, tmp: (
            _compare(zoo, tmp / "no.h5", "--json", tmp / "r.json"),
            "error: {tmp}/no.h5: dataset not found",
        )
    ),
    "unknown metric": Case(
        _option("--metrics", "mse,bogus", message="error: unknown metric 'bogus'; available: mse,"), prefix=True
    ),
    "negative --top": Case(_option("--top", "-1", message="error: --top must be >= 0, got -1")),
    "zero --batch-size": Case(_option("--batch-size", "0", message="error: --batch-size must be >= 1, got 0")),
    "--json is a folder": Case(
        _output_path(
            "--json", lambda t: t / "a_folder", "error: --json {tmp}/a_folder: is a directory, expected a file"
        )
    ),
    "--out-dir is a file": Case(
        _output_path(
            "--out-dir", lambda t: t / "a_file", "error: --out-dir {tmp}/a_file: is a file, expected a directory"
        )
    ),
    "--out-dir under a file": Case(
        _output_path(
            "--out-dir",
            lambda t: t / "a_file" / "out",
            "error: --out-dir {tmp}/a_file/out: cannot be created, {tmp}/a_file is not a directory",
        )
    ),
    "--json under a file": Case(
        _output_path(
            "--json",
            lambda t: t / "a_file" / "deep" / "r.json",
            "error: --json {tmp}/a_file/deep/r.json: cannot be created, {tmp}/a_file is not a directory",
        )
    ),
    "report.html is a folder in --out-dir": Case(_artifact_is_a_folder),
    "empty fp32 .onnx": Case(_empty_model("fp32")),
    "empty quantized .onnx": Case(_empty_model("qdq_u8")),
    "not an ONNX file": Case(_not_onnx, prefix=True),
    "a folder as the model": Case(_model_is_a_folder),
    "report: a non-numeric metric": Case(_report_non_numeric),
    "report: not JSON": Case(_report_not_json, prefix=True),
    "report: report.html is a folder": Case(_report_out_is_a_folder),
}


@pytest.mark.parametrize("name", CASES)
def test_a_bad_input_or_output_path_gives_one_line_exit_2_and_writes_nothing(zoo, tmp_path, capsys, monkeypatch, name):
    case = CASES[name]
    args, message = case.make(zoo, tmp_path)
    message = message.replace("{tmp}", str(tmp_path))
    for key, value in case.env:
        monkeypatch.setenv(key, value)
    capsys.readouterr()
    before = _tree(tmp_path)
    began = time.monotonic()
    assert main(args) == 2
    assert time.monotonic() - began < 10  # refused at once: no hang, no giant allocation
    line = _error_line(capsys)
    assert line.startswith(message) if case.prefix else line == message, line
    assert capsys.readouterr().out == ""  # refused before any table was printed
    assert _tree(tmp_path) == before  # nothing written, nothing half-written


def test_nan_metrics_are_undefined_with_a_reason_in_json_and_n_a_on_the_terminal(zoo, tmp_path, capsys):
    """With --allow-nonfinite, every metric of a tensor the NaN reaches (max_abs too: not -inf) is
    null in JSON with the reason under ``undefined``, and n/a on the terminal."""
    records = random_inputs(4, seed=4)
    records[1, 0, 0, 0, 0] = np.nan
    data = write_h5(tmp_path / "poisoned.h5", records)
    out, json_path = tmp_path / "out", tmp_path / "r.json"
    metrics = "mse,sqnr,max_abs,lsb"
    args = _compare(zoo, data, "--metrics", metrics, "--allow-nonfinite", "--json", json_path, "--out-dir", out)
    assert main(args) == 0
    captured = capsys.readouterr()
    table = "\n".join(line for line in captured.out.splitlines() if not line.startswith(("wrote", "net.")))
    assert captured.err == "" and "inf" not in table and "nan" not in table, table
    output_rows = [line for line in captured.out.splitlines() if line.startswith("logits")]
    assert output_rows and all(line.split()[1:5] == ["n/a"] * 4 for line in output_rows), captured.out
    document = json.loads(json_path.read_text(), parse_constant=lambda name: pytest.fail(f"{name} in JSON"))
    output = document["outputs"][0]
    assert output["metrics"] == {"mse": None, "sqnr": None, "max_abs": None, "lsb": None}
    assert output["undefined"] == dict.fromkeys(("mse", "sqnr", "max_abs", "lsb"), "NaN or Inf in the compared values")
    assert {p.name for p in out.iterdir()} == {
        "report.html",
        *(f"net.qdq_u8.{m}.{kind}" for m in metrics.split(",") for kind in ("visq.json", "dot")),
        "net.qdq_u8.comparison.json",
    }


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
