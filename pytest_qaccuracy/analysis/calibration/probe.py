"""The measured effect of each candidate range on a tensor's consumers, all tensors in one session.

For every chosen tensor *T* and each of its distinct candidate ranges *k*, the fp32 graph gets a
fake-quantized copy of *T* (QuantizeLinear then DequantizeLinear with onnxruntime's scale and zero
point for that range) and a copy of each consumer of *T* that reads it; the copy's first output is
compared with the consumer's own: ``ReduceSumSquare(copy - consumer)``, and the consumer's energy
``ReduceSumSquare(consumer)``. Summed over the records, a candidate's score is the sum over the
consumers of error / energy: the relative squared error that quantizing *T* alone with that range
puts into what reads it. A consumer sees what the range does where it matters: clipping the rare
large values of a residual stream changes a layer norm's mean far more than rounding noise, which
the mean averages out. A tensor read by no consumer that can be copied (a graph output, a subgraph's
input) is scored on itself. The copies cost about one fp32 run per candidate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from pytest_qaccuracy.analysis.calibration.qdq_params import scale_zero_point
from pytest_qaccuracy.model.graph import GraphView

FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE}


@dataclass(frozen=True, slots=True)
class ProbeEntry:
    """One scored (tensor, candidate range): the error outputs and the energy output they divide by."""

    tensor: str
    range: tuple[float, float]
    errors: tuple[str, ...]
    energies: tuple[str, ...]


def _copyable(node: onnx.NodeProto) -> bool:
    return not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def build_probe(
    fp32: onnx.ModelProto, candidates: Mapping[str, Sequence[tuple[float, float]]], activation_type: str
) -> tuple[onnx.ModelProto, list[ProbeEntry]]:
    """The fp32 model with the probe's copies and outputs added after its own.

    ``candidates``: each tensor's distinct candidate ranges.
    """
    inferred = onnx.shape_inference.infer_shapes(fp32)
    types = GraphView(inferred).elem_types
    view = GraphView(fp32)
    model = onnx.ModelProto()
    model.CopyFrom(fp32)
    graph = model.graph
    energies: dict[str, str] = {}
    entries = []
    outputs = []

    def energy_of(tensor: str) -> str:
        if tensor not in energies:
            name = f"qaccuracy_probe/energy/{len(energies)}"
            graph.node.append(helper.make_node("ReduceSumSquare", [tensor], [name], keepdims=0))
            energies[tensor] = name
            outputs.append(name)
        return energies[tensor]

    for t_index, (tensor, ranges) in enumerate(candidates.items()):
        readers = [
            node
            for _, node, _ in view.consumers.get(tensor, [])
            if _copyable(node) and node.output and types.get(node.output[0], onnx.TensorProto.FLOAT) in FLOATS
        ]
        for k, (lo, hi) in enumerate(ranges):
            tag = f"qaccuracy_probe/{t_index}/{k}"
            scale, zero = scale_zero_point(lo, hi, activation_type)
            graph.initializer.extend(
                [
                    numpy_helper.from_array(np.array(scale), f"{tag}/scale"),
                    numpy_helper.from_array(np.array(zero), f"{tag}/zero"),
                ]
            )
            fake = f"{tag}/fake"
            graph.node.extend(
                [
                    helper.make_node("QuantizeLinear", [tensor, f"{tag}/scale", f"{tag}/zero"], [f"{tag}/q"]),
                    helper.make_node("DequantizeLinear", [f"{tag}/q", f"{tag}/scale", f"{tag}/zero"], [fake]),
                ]
            )
            pairs = [(fake, tensor)] if not readers else []
            for c_index, node in enumerate(readers):
                copy = onnx.NodeProto()
                copy.CopyFrom(node)
                copy.name = f"{tag}/{c_index}/{node.name}"
                copy.input[:] = [fake if name == tensor else name for name in node.input]
                copy.output[:] = [f"{tag}/{c_index}/out{i}" if name else "" for i, name in enumerate(node.output)]
                graph.node.append(copy)
                pairs.append((copy.output[0], node.output[0]))
            errors, divisors = [], []
            for p_index, (changed, original) in enumerate(pairs):
                err = f"{tag}/err{p_index}"
                graph.node.extend(
                    [
                        helper.make_node("Sub", [changed, original], [f"{err}/diff"]),
                        helper.make_node("ReduceSumSquare", [f"{err}/diff"], [err], keepdims=0),
                    ]
                )
                errors.append(err)
                divisors.append(energy_of(original))
                outputs.append(err)
            entries.append(ProbeEntry(tensor, (lo, hi), tuple(errors), tuple(divisors)))
    graph.output.extend(onnx.ValueInfoProto(name=name) for name in outputs)
    return model, entries


class ProbeScores:
    """Sums of the probe's outputs over records, and each entry's score."""

    def __init__(self, entries: Sequence[ProbeEntry]) -> None:
        self.entries = list(entries)
        self.sums: dict[str, float] = {}

    def add(self, values: Mapping[str, np.ndarray]) -> None:
        for name, value in values.items():
            self.sums[name] = self.sums.get(name, 0.0) + float(np.asarray(value, dtype=np.float64))

    def score(self, entry: ProbeEntry) -> float:
        """Sum over the consumers of error / energy (a consumer with no energy counts its error)."""
        total = 0.0
        for err, energy in zip(entry.errors, entry.energies, strict=True):
            e, s = self.sums.get(err, 0.0), self.sums.get(energy, 0.0)
            total += e / s if s > 0 else (0.0 if e == 0 else float("inf"))
        return total

    def by_tensor(self) -> dict[str, list[tuple[tuple[float, float], float]]]:
        out: dict[str, list[tuple[tuple[float, float], float]]] = {}
        for entry in self.entries:
            out.setdefault(entry.tensor, []).append((entry.range, self.score(entry)))
        return out


def output_names(entries: Iterable[ProbeEntry]) -> list[str]:
    """Every output the probe model computes, once."""
    names = dict.fromkeys(n for e in entries for n in (*e.errors, *e.energies))
    return list(names)
