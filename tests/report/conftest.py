"""Hand-built comparison results for the writer tests: every value is chosen, nothing is measured."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import onnx
import pytest
from onnx import TensorProto, helper

from pytest_qaccuracy.analysis.results import ComparisonResult, LayerResult, OutputResult

DEFINITIONS = {
    "mse": "mean((f - q)^2)",
    "mpeir": "mean over records of max|f - q| / (max f - min f + 1e-6)",
    "cosine": "sum(f*q) / (||f|| * ||q||)",
    "sqnr": "20*log10(||f|| / ||f - q||) in dB",
}
HIGHER = {"mse": False, "mpeir": False, "cosine": True, "sqnr": True}


def build_result(
    layers: Sequence[tuple[str, str | None, Mapping[str, float | None]]],
    outputs: Sequence[tuple[str, Mapping[str, float | None]]] = (),
    definitions: Mapping[str, str] | None = None,
    **kwargs,
) -> ComparisonResult:
    """A result from ``(tensor, op_type, metrics)`` rows, in topological order."""
    definitions = dict(DEFINITIONS if definitions is None else definitions)
    return ComparisonResult(
        fp32_model=kwargs.pop("fp32_model", "models/net.onnx"),
        quantized_model=kwargs.pop("quantized_model", "models/net.int8.onnx"),
        data="calib.h5",
        records=kwargs.pop("records", 16),
        metric_definitions=definitions,
        outputs=[OutputResult(name, dict(m)) for name, m in outputs],
        layers=[
            LayerResult(tensor, f"{tensor}_DequantizeLinear_Output", f"node_{i}", op, i, dict(m))
            for i, (tensor, op, m) in enumerate(layers)
        ],
        higher_is_better=kwargs.pop("higher_is_better", {k: v for k, v in HIGHER.items() if k in definitions}),
        **kwargs,
    )


@pytest.fixture
def make_result() -> Callable[..., ComparisonResult]:
    return build_result


@pytest.fixture
def small_result() -> ComparisonResult:
    """Four layers and one output with all four metrics; one layer has an undefined MPEIR."""
    return build_result(
        [
            ("conv1_out", "Conv", {"mse": 0.002, "mpeir": 0.05, "cosine": 0.9995, "sqnr": 33.0}),
            ("relu1_out", "Relu", {"mse": 0.0005, "mpeir": None, "cosine": 0.9999, "sqnr": 40.0}),
            ("conv2_out", "Conv", {"mse": 0.02, "mpeir": 0.3, "cosine": 0.99, "sqnr": 20.0}),
            ("logits", "Gemm", {"mse": 0.01, "mpeir": 0.2, "cosine": 0.995, "sqnr": 25.0}),
        ],
        outputs=[("logits", {"mse": 0.01, "mpeir": 0.2, "cosine": 0.995, "sqnr": 25.0})],
        unmatched_fp32=["pool_out"],
        unmatched_quantized=["pool_out_quantized"],
    )


def chain_model(ops: Sequence[tuple[str, str]], name: str = "net") -> onnx.ModelProto:
    """A model whose nodes form a chain from input ``x``: ``(output tensor, op_type)`` per node; each
    node also reads an initializer, which the graph leaves out. Drawn, never run."""
    nodes, previous = [], "x"
    for i, (tensor, op) in enumerate(ops):
        nodes.append(helper.make_node(op, [previous, f"w{i}"], [tensor], name=f"node_{i}"))
        previous = tensor
    weights = [helper.make_tensor(f"w{i}", TensorProto.FLOAT, [1], [1.0]) for i in range(len(ops))]
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info(previous, TensorProto.FLOAT, [1, 4])],
        weights,
    )
    return helper.make_model(graph)


@pytest.fixture
def small_model() -> onnx.ModelProto:
    """The fp32 model of ``small_result``: its four layers plus the unmatched ``pool_out``."""
    ops = [("conv1_out", "Conv"), ("relu1_out", "Relu"), ("conv2_out", "Conv"), ("pool_out", "MaxPool")]
    return chain_model([*ops, ("logits", "Gemm")])
