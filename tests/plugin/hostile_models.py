"""Models and files for the hostile-input table (``test_hostile_inputs.py``): built with onnx.helper."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import onnx
from numpy.lib import format as npy_format
from onnx import TensorProto, helper, numpy_helper


def npy_header(shape: tuple[int, ...], payload: bytes = b"\0" * 64) -> bytes:
    """An ``.npy`` file whose header declares ``shape`` float32, followed by a few bytes only."""
    stream = io.BytesIO()
    npy_format.write_array_header_1_0(stream, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return stream.getvalue() + payload


def tree(root: Path, skip: tuple[str, ...] = ("__pycache__",)) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (None for a folder): the state a case must not change."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes() if p.is_file() else None
        for p in sorted(root.rglob("*"))
        if not skip or not set(skip) & set(p.relative_to(root).parts)
    }


def rename(source: Path, target: Path, renames: dict[str, str]) -> Path:
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


def unrelated(fp32: Path, target: Path) -> Path:
    """A model with ``fp32``'s input and output but nothing else in common: pool, flatten, Gemm."""
    source = onnx.load(str(fp32)).graph
    channels = source.input[0].type.tensor_type.shape.dim[1].dim_value
    classes = source.output[0].type.tensor_type.shape.dim[1].dim_value
    weights = np.random.default_rng(0).standard_normal((classes, channels)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("GlobalAveragePool", [source.input[0].name], ["p"]),
            helper.make_node("Flatten", ["p"], ["f"], axis=1),
            helper.make_node("Gemm", ["f", "w"], [source.output[0].name], transB=1),
        ],
        "unrelated",
        [source.input[0]],
        [source.output[0]],
        [numpy_helper.from_array(weights, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(target))
    return target


def int4_pair(folder: Path, features: int = 16, classes: int = 10) -> tuple[Path, Path]:
    """An fp32 MatMul and its QDQ version whose output is quantized to int4 (``y_int4``), as
    onnxruntime's quantizer writes with ``activation_type=QInt4``; the input is ``x`` (N, features)."""
    weights = np.random.default_rng(0).standard_normal((features, classes)).astype(np.float32)

    def save(nodes: list[onnx.NodeProto], extra: list[onnx.TensorProto], name: str) -> Path:
        graph = helper.make_graph(
            nodes,
            name,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", features])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", classes])],
            [numpy_helper.from_array(weights, "w"), *extra],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
        model.ir_version = 10
        onnx.checker.check_model(model, full_check=True)
        onnx.save(model, str(folder / f"{name}.onnx"))
        return folder / f"{name}.onnx"

    fp32 = save([helper.make_node("MatMul", ["x", "w"], ["y"])], [], "int4_fp32")
    scale = [numpy_helper.from_array(np.float32(0.5), "s"), helper.make_tensor("zp", TensorProto.INT4, [], [0])]
    quantized = save(
        [
            helper.make_node("MatMul", ["x", "w"], ["y_pre"]),
            helper.make_node("QuantizeLinear", ["y_pre", "s", "zp"], ["y_int4"]),
            helper.make_node("DequantizeLinear", ["y_int4", "s", "zp"], ["y"]),
        ],
        scale,
        "int4_qdq",
    )
    return fp32, quantized


def sized_records(folder: Path, sizes: list[int], name: str = "x", seed: int = 5) -> Path:
    """An ``.npy`` folder of (1, 3, s, s) records, one per size: images of different sizes."""
    rng = np.random.default_rng(seed)
    (folder / name).mkdir(parents=True)
    for i, size in enumerate(sizes):
        np.save(folder / name / f"{i}.npy", rng.standard_normal((1, 3, size, size)).astype(np.float32))
    return folder
