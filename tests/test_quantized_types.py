"""Every quantized type gives the figures onnxruntime's own dequantized values give (issue 32, item 3).

A QDQ ``x -> MatMul -> Relu`` quantized to float8 (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz), int4/uint4,
int16/uint16 and uint8: the comparison (onnxruntime and the integer backend), the sensitivity baseline
and the integer backend's outputs are checked against cosines computed here, in float64, from
onnxruntime's DequantizeLinear outputs. Float8 and 4-bit codes are not numbers to subtract a zero point
from: reading them as integers gave an input cosine of -0.36 for e4m3fn (exit 0) before.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from pytest_qaccuracy.analysis.compare import compare
from pytest_qaccuracy.analysis.sensitivity import node_sensitivity
from pytest_qaccuracy.backend import IntegerSession
from pytest_qaccuracy.model import ModelPair
from tests.modelzoo import write_h5

# type: (ONNX type, zero point, input scale)
TYPES = {
    "float8e4m3fn": (TensorProto.FLOAT8E4M3FN, 0, 0.01),
    "float8e4m3fnuz": (TensorProto.FLOAT8E4M3FNUZ, 0, 0.01),
    "float8e5m2": (TensorProto.FLOAT8E5M2, 0, 0.01),
    "float8e5m2fnuz": (TensorProto.FLOAT8E5M2FNUZ, 0, 0.01),
    "int4": (TensorProto.INT4, -1, 0.4),
    "uint4": (TensorProto.UINT4, 8, 0.4),
    "int16": (TensorProto.INT16, 7, 1e-4),
    "uint16": (TensorProto.UINT16, 30000, 1e-4),
    "uint8": (TensorProto.UINT8, 128, 0.02),
}
RNG = np.random.default_rng(3)
W = RNG.normal(0, 0.3, (16, 8)).astype(np.float32)
RECORDS = RNG.normal(0, 1, (10, 1, 16)).astype(np.float32)
OPSET = [helper.make_opsetid("", 21)]

pytestmark = pytest.mark.skipif(
    tuple(int(v) for v in ort.__version__.split(".")[:2]) < (1, 20),
    reason=f"the models use opset 21 (float8 and int4 Q/DQ, QLinearMatMul 21): onnxruntime {ort.__version__} "
    "has no kernels for them",
)


def _pair(kind: str, folder: Path) -> tuple[Path, Path]:
    elem, zero, scale = TYPES[kind]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 8])]
    fp32 = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["out"])],
        "fp32",
        inputs,
        outputs,
        [numpy_helper.from_array(W, "w")],
    )
    nodes, inits = [], [numpy_helper.from_array(W, "w")]
    for name, factor in (("x", 1.0), ("w", 0.5), ("y", 3.0)):
        nodes += [
            helper.make_node("QuantizeLinear", [name, f"{name}s", f"{name}z"], [f"{name}q"]),
            helper.make_node("DequantizeLinear", [f"{name}q", f"{name}s", f"{name}z"], [f"{name}d"]),
        ]
        inits += [
            numpy_helper.from_array(np.float32(scale * factor), f"{name}s"),
            helper.make_tensor(f"{name}z", elem, [], [zero]),
        ]
    nodes.insert(4, helper.make_node("MatMul", ["xd", "wd"], ["y"]))
    nodes.append(helper.make_node("Relu", ["yd"], ["out"]))
    quantized = helper.make_graph(nodes, "quantized", inputs, outputs, inits)
    paths = folder / f"{kind}.fp32.onnx", folder / f"{kind}.qdq.onnx"
    for graph, path in zip((fp32, quantized), paths, strict=True):
        onnx.save(helper.make_model(graph, opset_imports=OPSET, ir_version=10), path)
    return paths


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / np.sqrt((a @ a) * (b @ b)))


def _expected(fp32: Path, quantized: Path) -> dict[str, float]:
    """Cosines of x, y and out from onnxruntime's own DequantizeLinear outputs (xd, yd) and output."""
    model = onnx.load(str(quantized))
    model.graph.output.extend([onnx.ValueInfoProto(name="xd"), onnx.ValueInfoProto(name="yd")])
    q = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    f = onnx.load(str(fp32))
    f.graph.output.extend([onnx.ValueInfoProto(name="y")])
    reference = ort.InferenceSession(f.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"x": RECORDS[:, 0]}
    out_q, x_q, y_q = q.run(["out", "xd", "yd"], feeds)
    out_f, y_f = reference.run(["out", "y"], feeds)
    return {"x": _cosine(feeds["x"], x_q), "y": _cosine(y_f, y_q), "out": _cosine(out_f, out_q)}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_h5(tmp_path_factory.mktemp("types") / "data.h5", RECORDS)


@pytest.mark.parametrize("backend", ["onnxruntime", "integer"])
@pytest.mark.parametrize("kind", TYPES)
def test_compare_gives_onnxruntimes_dequantized_figures(kind: str, backend: str, data: Path, tmp_path: Path) -> None:
    fp32, quantized = _pair(kind, tmp_path)
    want = _expected(fp32, quantized)
    result = compare(ModelPair(fp32, quantized), data, "cosine", backend=backend)
    got = {layer.tensor: layer.metrics["cosine"] for layer in result.layers}
    got["out"] = result.output("out").metrics["cosine"]
    assert set(got) == {"x", "y", "out"}, got
    for name, value in want.items():
        assert got[name] == pytest.approx(value, abs=1e-6), (name, got, want)
    assert min(want.values()) > 0.9  # every type quantizes this net well: a wrong reading shows


@pytest.mark.parametrize("kind", TYPES)
def test_sensitivity_and_the_backend_agree_with_onnxruntime(kind: str, data: Path, tmp_path: Path) -> None:
    fp32, quantized = _pair(kind, tmp_path)
    want = _expected(fp32, quantized)
    result = node_sensitivity(ModelPair(fp32, quantized), data, metrics="cosine")
    assert result.baseline["cosine"] == pytest.approx(want["out"], abs=1e-6)
    feeds = {"x": RECORDS[:, 0]}
    session = ort.InferenceSession(str(quantized), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(IntegerSession(quantized).run(None, feeds)[0], session.run(None, feeds)[0])


@pytest.mark.parametrize("kind", ["float8e4m3fn", "int4"])
def test_an_output_of_codes_numpy_cannot_read_is_one_error_line(
    kind: str, data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The quantized model's output is the QuantizeLinear's codes: refused, naming the type and the tensor."""
    from pytest_qaccuracy.cli import main

    fp32, quantized = _pair(kind, tmp_path)
    model = onnx.load(str(quantized))
    del model.graph.node[-2:]  # DequantizeLinear and Relu: the output is yq itself
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("yq", TYPES[kind][0], ["N", 8]))
    f = onnx.load(str(fp32))
    del f.graph.node[-1]
    f.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8]))
    onnx.save(model, quantized)
    onnx.save(f, fp32)
    for backend in ("onnxruntime", "integer"):
        assert main(["compare", str(fp32), str(quantized), "--data", str(data), "--backend", backend]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:"), err
        assert f"output 'yq' is {kind}" in err[0], err
