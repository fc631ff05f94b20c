"""An fp32 model and its quantized version, checked to take the same inputs."""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path

import onnx

from pytest_qaccuracy.errors import ModelError
from pytest_qaccuracy.model.graph import GraphView
from pytest_qaccuracy.model.loading import InputSpec, graph_inputs, load_model
from pytest_qaccuracy.model.matching import QUANTIZED_TYPES, Matcher, Matching
from pytest_qaccuracy.model.quant_params import detect_format


class ModelPair:
    """Both models of a pair, loaded safely; their inputs must agree in name, dtype and shape.

    Args:
        fp32: path (or ModelProto) of the float model.
        quantized: path (or ModelProto) of the quantized model.
        mapping: optional ``{fp32 tensor: quantized tensor}`` for tensors the automatic matching misses.

    Raises:
        ModelError: a model cannot be loaded, or the inputs differ (the message names the difference).
    """

    def __init__(
        self,
        fp32: str | os.PathLike[str] | onnx.ModelProto,
        quantized: str | os.PathLike[str] | onnx.ModelProto,
        mapping: Mapping[str, str] | None = None,
    ) -> None:
        self.fp32_path, self.fp32 = _load(fp32, "fp32.onnx")
        self.quantized_path, self.quantized = _load(quantized, "quantized.onnx")
        self.mapping = dict(mapping or {})
        self.inputs = graph_inputs(self.fp32)
        _check_inputs(self.inputs, graph_inputs(self.quantized), self.fp32_path.name, self.quantized_path.name)
        self._check_outputs()

    @property
    def name(self) -> str:
        return self.quantized_path.stem

    @cached_property
    def format(self) -> str:
        """``qdq``, ``qoperator``, ``mixed`` or ``float`` (a quantized model with no quantized op)."""
        return detect_format(GraphView(self.quantized))

    @cached_property
    def matcher(self) -> Matcher:
        return Matcher(self.fp32, self.quantized)

    @cached_property
    def matching(self) -> Matching:
        return self.matcher.match(self.mapping)

    def output_pairs(self) -> list[tuple[str, str]]:
        """(fp32 output, quantized output) pairs: by name, else by position."""
        f = [o.name for o in self.fp32.graph.output]
        q = [o.name for o in self.quantized.graph.output]
        if set(f) == set(q):
            return [(name, name) for name in f]
        return list(zip(f, q, strict=True))

    def _check_outputs(self) -> None:
        f = [o.name for o in self.fp32.graph.output]
        q = [o.name for o in self.quantized.graph.output]
        if len(f) != len(q):
            raise ModelError(
                f"{self.fp32_path.name} has {len(f)} output(s) {f}, {self.quantized_path.name} has {len(q)} {q}"
            )
        for value in self.quantized.graph.output:
            elem = value.type.tensor_type.elem_type
            if elem in QUANTIZED_TYPES:
                kind = onnx.helper.tensor_dtype_to_string(elem).removeprefix("TensorProto.").lower()
                raise ModelError(
                    f"{self.quantized_path.name}: output '{value.name}' is {kind}, codes that cannot be compared "
                    "as numbers; end the model with its DequantizeLinear"
                )


def _load(model: str | os.PathLike[str] | onnx.ModelProto, default_name: str) -> tuple[Path, onnx.ModelProto]:
    if isinstance(model, onnx.ModelProto):
        return Path(default_name), model
    return Path(model), load_model(model)


def _check_inputs(f: list[InputSpec], q: list[InputSpec], f_name: str, q_name: str) -> None:
    f_names, q_names = [s.name for s in f], [s.name for s in q]
    if f_names != q_names:
        raise ModelError(f"input names differ: {f_name} has {f_names}, {q_name} has {q_names}")
    for a, b in zip(f, q, strict=True):
        if a.dtype != b.dtype:
            raise ModelError(f"input '{a.name}': dtype {a.dtype} in {f_name} but {b.dtype} in {q_name}")
        if len(a.shape) != len(b.shape) or any(
            isinstance(x, int) and isinstance(y, int) and x != y for x, y in zip(a.shape, b.shape, strict=True)
        ):
            raise ModelError(
                f"input '{a.name}': shape {a.describe_shape()} in {f_name} but {b.describe_shape()} in {q_name}"
            )
