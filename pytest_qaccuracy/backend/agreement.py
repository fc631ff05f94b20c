"""Layer-by-layer agreement of the integer emulation with onnxruntime's deployed kernels.

``check_agreement`` runs a quantized model on onnxruntime (CPU EP, full optimizations, int8 QDQ fusion
on) and on :class:`IntegerSession` with the same feeds, and compares every 8-bit tensor both produce in
quantization steps (integer units). The result names the first tensor, in topological order, that
differs by more than ``max_steps`` (the Glow issue's per-node comparison across backends).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from pytest_qaccuracy.backend.interpreter import IntegerSession
from pytest_qaccuracy.backend.scheme import Scheme
from pytest_qaccuracy.model.loading import load_model

_EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16), np.dtype(np.uint16))


@dataclass(frozen=True, slots=True)
class TensorAgreement:
    """One integer tensor: how far the emulation is from onnxruntime, in quantization steps."""

    tensor: str
    order: int
    elements: int
    mismatches: int
    max_steps: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "tensor": self.tensor,
            "order": self.order,
            "elements": self.elements,
            "mismatches": self.mismatches,
            "max_steps": self.max_steps,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TensorAgreement:
        return cls(
            str(data["tensor"]),
            int(data["order"]),
            int(data["elements"]),
            int(data["mismatches"]),
            int(data["max_steps"]),
        )


@dataclass(frozen=True, slots=True)
class AgreementResult:
    """Agreement over all compared tensors, in topological order.

    Attributes:
        model: model file name (or graph name).
        scheme: the emulation's scheme name.
        max_steps_allowed: the tolerance N in quantization steps.
        records: records on the batch axis of the feeds.
        tensors: per-tensor agreement, topological order.
        first_divergence: first tensor whose difference exceeds N, or ``None``.
    """

    model: str
    scheme: str
    max_steps_allowed: int
    records: int
    tensors: tuple[TensorAgreement, ...]
    first_divergence: str | None

    @property
    def ok(self) -> bool:
        return self.first_divergence is None

    @property
    def num_mismatched_tensors(self) -> int:
        return sum(1 for t in self.tensors if t.mismatches)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "scheme": self.scheme,
            "max_steps_allowed": self.max_steps_allowed,
            "records": self.records,
            "first_divergence": self.first_divergence,
            "tensors": [t.to_dict() for t in self.tensors],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AgreementResult:
        return cls(
            str(data["model"]),
            str(data["scheme"]),
            int(data["max_steps_allowed"]),
            int(data["records"]),
            tuple(TensorAgreement.from_dict(t) for t in data["tensors"]),
            data["first_divergence"],
        )

    def summary(self) -> str:
        """One line: the rule, then the verdict with the first diverging tensor."""
        head = f"integer emulation ({self.scheme}) within {self.max_steps_allowed} step(s) of onnxruntime"
        if self.ok:
            return f"{head}: ok on {len(self.tensors)} tensors"
        bad = next(t for t in self.tensors if t.tensor == self.first_divergence)
        return (
            f"{head}: first divergence at '{bad.tensor}' (order {bad.order}): {bad.mismatches} / {bad.elements} "
            f"elements differ, max {bad.max_steps} steps; {self.num_mismatched_tensors} tensors differ"
        )


def onnxruntime_session(model: onnx.ModelProto, outputs: list[str]) -> Any:
    """onnxruntime with deployed kernels, full optimizations, int8 QDQ fusion, extra graph outputs."""
    import onnxruntime as ort

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    have = {o.name for o in copy.graph.output}
    copy.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in outputs if n not in have)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.qdqisint8allowed", "1")
    return ort.InferenceSession(copy.SerializeToString(), options, providers=["CPUExecutionProvider"])


def check_agreement(
    model: str | os.PathLike[str] | onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    *,
    scheme: str | Scheme = "onnxruntime",
    max_steps: int = 0,
) -> AgreementResult:
    """Compare every integer tensor of ``model`` between onnxruntime and the integer emulation.

    Args:
        model: a quantized model (QDQ or QOperator), path or proto.
        feeds: input name -> array (a batch of records on the batch axis).
        scheme: the emulation's scheme (preset name or :class:`Scheme`).
        max_steps: tolerated difference N, in quantization steps.

    Returns:
        an :class:`AgreementResult`; ``result.ok`` is False when some tensor differs by more than N.
    """
    proto = model if isinstance(model, onnx.ModelProto) else load_model(model)
    session = IntegerSession(proto, scheme)
    produced: dict[str, np.ndarray] = {}

    def keep_integers(name: str, value: np.ndarray) -> None:
        if isinstance(value, np.ndarray) and value.dtype in _EIGHT_BIT and name not in session.constants:
            produced[name] = value

    session.run([], feeds, on_tensor=keep_integers)
    names = list(produced)
    theirs = onnxruntime_session(proto, names).run(names, dict(feeds)) if names else []
    tensors = []
    first = None
    for order, (name, reference) in enumerate(zip(names, theirs, strict=False)):
        ours = produced[name]
        if ours.shape != reference.shape:
            steps, mismatches = -1, ours.size
        else:
            diff = np.abs(ours.astype(np.int64) - reference.astype(np.int64))
            steps, mismatches = int(diff.max(initial=0)), int(np.count_nonzero(diff))
        tensors.append(TensorAgreement(name, order, int(ours.size), mismatches, steps))
        if first is None and (steps > max_steps or steps < 0):
            first = name
    records = int(np.asarray(next(iter(feeds.values()))).shape[0]) if feeds else 0
    label = os.path.basename(str(model)) if not isinstance(model, onnx.ModelProto) else (proto.graph.name or "model")
    return AgreementResult(label, session.scheme.name, max_steps, records, tuple(tensors), first)
