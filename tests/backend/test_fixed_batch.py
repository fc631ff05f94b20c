"""Feeds checked like onnxruntime, and a batch every command can run (issue 32, item 4).

Exports often declare batch 1, and PaddleOCR/YOLO-style graphs bake it into a Reshape: the integer
backend refuses a feed of another shape as onnxruntime does (one line, before any kernel), and every
command runs such a model (records one at a time where stacked records cannot pass) or exits 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import onnx
import pytest
from backend_models import ort_session, quantize_qdq
from onnx import TensorProto, helper, numpy_helper

from pytest_qaccuracy.backend import IntegerSession
from pytest_qaccuracy.cli import main
from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.model.batch import stacking

RNG = np.random.default_rng(5)
RECORDS = RNG.normal(0, 1, (6, 1, 3, 6, 6)).astype(np.float32)


def _classifier(batch: int | str, baked: bool) -> onnx.ModelProto:
    """Conv -> Relu -> Reshape -> Gemm -> Softmax; the Reshape bakes ``[1, 72]`` or flattens ``[-1, 72]``."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.5, (2, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(np.array([1 if baked else -1, 72], np.int64), "shape"),
        numpy_helper.from_array(rng.normal(0, 0.5, (72, 4)).astype(np.float32), "fc"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Reshape", ["r", "shape"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fc"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "classifier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 6, 6])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, 4])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fp32 and QDQ classifiers (baked batch 1, declared batch 1, declared batch 2) and a dataset."""
    folder = tmp_path_factory.mktemp("fixed")
    calibration = RNG.normal(0, 1, (8, 3, 6, 6)).astype(np.float32)
    for name, batch, baked in (("baked", 1, True), ("declared", 1, False), ("two", 2, False)):
        fp32 = _classifier(batch, baked)
        onnx.save(fp32, folder / f"{name}.fp32.onnx")
        # the quantizer calibrates batches of 4: quantize the free-batch graph, then declare and bake
        quantized = quantize_qdq(_classifier("N", False), calibration, folder)
        quantized.graph.input[0].CopyFrom(fp32.graph.input[0])
        quantized.graph.output[0].CopyFrom(fp32.graph.output[0])
        shape = next(t for t in quantized.graph.initializer if t.name == "shape")
        shape.CopyFrom(numpy_helper.from_array(np.array([1 if baked else -1, 72], np.int64), "shape"))
        onnx.save(quantized, folder / f"{name}.qdq.onnx")
    with h5py.File(folder / "data.h5", "w") as h5:
        for i, record in enumerate(RECORDS):
            h5.create_dataset(f"value/{i}/0", data=record)
    return folder


def test_a_feed_of_another_shape_is_refused_as_onnxruntime_refuses_it(folder: Path) -> None:
    model = onnx.load(str(folder / "baked.qdq.onnx"))
    session = IntegerSession(model)
    eight = RECORDS[:, 0].repeat(2, axis=0)[:8]
    with pytest.raises(Exception, match="Got: 8 Expected: 1"):
        ort_session(model).run(None, {"x": eight})
    with pytest.raises(InputError, match=r"^input 'x': invalid dimensions \(index 0: got 8, expected 1\)"):
        session.run(None, {"x": eight})
    with pytest.raises(InputError, match=r"^input 'x': invalid rank, got 3 \[3, 6, 6\], expected 4$"):
        session.run(None, {"x": RECORDS[0, 0]})
    with pytest.raises(InputError, match="index 2: got 7, expected 6, index 3: got 5, expected 6"):
        session.run(None, {"x": np.zeros((1, 3, 7, 5), np.float32)})
    np.testing.assert_array_equal(  # a record of the declared shape runs, exactly as onnxruntime
        session.run(None, {"x": RECORDS[0]})[0], ort_session(model).run(None, {"x": RECORDS[0]})[0]
    )


def test_the_batch_a_model_accepts(folder: Path) -> None:
    baked, declared, two = (onnx.load(str(folder / f"{n}.qdq.onnx")) for n in ("baked", "declared", "two"))
    assert stacking(baked) == (baked, False)
    freed, stacks = stacking(declared)
    assert stacks and freed is not declared and freed.graph.input[0].type.tensor_type.shape.dim[0].dim_param
    assert stacking(two) == (two, False)
    stacked = RECORDS[:4, 0]  # the freed model takes stacked records, bit for bit as one by one
    np.testing.assert_array_equal(
        IntegerSession(freed).run(None, {"x": stacked})[0],
        np.concatenate([IntegerSession(declared).run(None, {"x": r})[0] for r in RECORDS[:4]]),
    )


def _expected(model: Path) -> np.ndarray:
    session = ort_session(model)
    return np.concatenate([session.run(None, {"x": record})[0] for record in RECORDS])


@pytest.mark.parametrize("name", ["baked", "declared"])
@pytest.mark.parametrize("backend", ["integer", "onnxruntime"])
def test_run_takes_a_model_of_batch_one(folder: Path, name: str, backend: str, tmp_path: Path) -> None:
    model, out = folder / f"{name}.qdq.onnx", tmp_path / "out.h5"
    args = ["run", str(model), "--data", str(folder / "data.h5"), "--backend", backend, "--out", str(out)]
    assert main([*args, "--batch-size", "4"]) == 0
    with h5py.File(out) as h5:
        got = np.concatenate([h5[f"value/{i}/0"][()] for i in range(len(RECORDS))])
    np.testing.assert_array_equal(got, _expected(model))


@pytest.mark.parametrize("name", ["baked", "declared"])
def test_saturation_and_compare_take_a_model_of_batch_one(
    folder: Path, name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = str(folder / "data.h5")
    quantized, fp32 = str(folder / f"{name}.qdq.onnx"), str(folder / f"{name}.fp32.onnx")
    assert main(["saturation", quantized, "--data", data, "--json", str(tmp_path / "s.json")]) == 0
    assert json.loads((tmp_path / "s.json").read_text())["records"] == len(RECORDS)
    for backend in ("integer", "onnxruntime"):
        assert main(["compare", fp32, quantized, "--data", data, "--backend", backend, "--batch-size", "4"]) == 0
        assert "probs" in capsys.readouterr().out


@pytest.mark.parametrize(
    "command",
    [
        ["run", "{q}", "--data", "{d}", "--out", "{o}"],
        ["run", "{q}", "--data", "{d}", "--out", "{o}", "--backend", "onnxruntime"],
        ["saturation", "{q}", "--data", "{d}"],
        ["compare", "{f}", "{q}", "--data", "{d}", "--backend", "integer"],
        ["compare", "{f}", "{q}", "--data", "{d}"],
    ],
)
def test_a_batch_the_records_cannot_make_is_one_error_line(
    folder: Path, command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A model declaring batch 2 takes no record of batch 1: exit 2, one ``error:`` line, no file."""
    paths = {"q": "two.qdq.onnx", "f": "two.fp32.onnx", "d": "data.h5"}
    names = {**{k: str(folder / v) for k, v in paths.items()}, "o": str(tmp_path / "o.h5")}
    assert main([part.format(**names) for part in command]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "'x'" in err[0], err
    assert not list(tmp_path.iterdir())
