"""Saturation report: where a u8 x s8 model's int16 pair sums saturate on x86 CPUs without VNNI.

The model runs on the integer backend twice over the data, with ``onnxruntime-avx2`` (pairs saturate,
counted per node by ``backend.pairs``) and with ``onnxruntime-vnni`` (exact int32 sums). Per node: how
many pair sums it computed, how many saturated, and the record with the most; per 8-bit tensor: how
far the two runs differ (elements, largest step difference), which says which layers lose accuracy
because of the saturation; per graph output: the SQNR of the AVX2 run against the exact one. Memory
holds one batch and fixed-size state per node and tensor.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import onnx

from pytest_qaccuracy.data import Dataset, bind_dataset, load_dataset
from pytest_qaccuracy.model.loading import graph_inputs, load_model

SATURATING, EXACT = "onnxruntime-avx2", "onnxruntime-vnni"
_EIGHT_BIT = (np.dtype(np.uint8), np.dtype(np.int8))


@dataclass(frozen=True, slots=True)
class LayerSaturation:
    """One node whose u8 x s8 products are summed in pairs."""

    node: str
    pairs: int
    saturated: int
    worst_record: int | None
    worst_record_saturated: int
    tensor: str | None  # its 8-bit output
    differing: int  # elements of ``tensor`` that differ from the exact run
    elements: int
    max_steps: int

    @property
    def share(self) -> float:
        return self.saturated / self.pairs if self.pairs else 0.0


@dataclass(frozen=True, slots=True)
class SaturationReport:
    """What :func:`measure_saturation` found (``to_dict`` for JSON)."""

    model: str
    records: int
    layers: tuple[LayerSaturation, ...]
    outputs: dict[str, float | None]  # SQNR (dB) of the saturating run against the exact one

    @property
    def pairs(self) -> int:
        return sum(layer.pairs for layer in self.layers)

    @property
    def saturated(self) -> int:
        return sum(layer.saturated for layer in self.layers)

    @property
    def share(self) -> float:
        return self.saturated / self.pairs if self.pairs else 0.0

    def worst(self) -> LayerSaturation | None:
        """The layer with the largest share of saturated pair sums, or None when none saturated."""
        found = [layer for layer in self.layers if layer.saturated]
        return max(found, key=lambda layer: (layer.share, layer.saturated)) if found else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "records": self.records,
            "saturating_preset": SATURATING,
            "exact_preset": EXACT,
            "pairs": self.pairs,
            "saturated": self.saturated,
            "share": self.share,
            "layers": [{**asdict(layer), "share": layer.share} for layer in self.layers],
            "outputs_sqnr_vs_exact": dict(self.outputs),
        }


def measure_saturation(
    model: str | os.PathLike[str] | onnx.ModelProto,
    data: Dataset | str | os.PathLike[str],
    *,
    batch_size: int = 32,
    threads: int = 0,
) -> SaturationReport:
    """Run ``model`` (quantized) over ``data`` with and without int16 pair saturation; see the module.

    Raises:
        InputError: bad data (the message names the file, record and input).
        ModelError: the model cannot be loaded.
    """
    from pytest_qaccuracy.backend import IntegerSession, pairs

    proto = model if isinstance(model, onnx.ModelProto) else load_model(model)
    label = os.path.basename(str(model)) if not isinstance(model, onnx.ModelProto) else proto.graph.name or "model"
    saturating = IntegerSession(proto, SATURATING, threads=threads)
    exact = IntegerSession(proto, EXACT, threads=threads)
    outputs = [o.name for o in saturating.get_outputs()]
    counter = pairs.SaturationCounter()
    tensors: dict[str, list[int]] = {}  # name -> [elements, differing, max steps]
    energy: dict[str, list[float]] = {name: [0.0, 0.0] for name in outputs}  # sum ref^2, sum err^2
    dataset = data if isinstance(data, Dataset) else load_dataset(data)
    records = 0
    try:
        for batch in bind_dataset(dataset, graph_inputs(proto)).iter_batches(batch_size):
            feeds = batch.stacked()
            counter.offset = records
            with pairs.counting(counter):
                ours = _run(saturating, feeds, energy)
            _fold(ours, _run(exact, feeds, energy), tensors, energy, set(saturating.constants))
            records += int(np.asarray(next(iter(feeds.values()))).shape[0]) if feeds else 0
    finally:
        if not isinstance(data, Dataset):
            dataset.close()
    produced = _quantized_outputs(proto)
    layers = []
    for node, entry in counter.nodes.items():
        tensor = produced.get(node)
        elements, differing, steps = tensors.get(tensor, [0, 0, 0]) if tensor else [0, 0, 0]
        worst = entry.worst_record()
        layers.append(
            LayerSaturation(
                node,
                entry.pairs,
                entry.saturated,
                None if worst is None else worst[0],
                0 if worst is None else worst[1],
                tensor,
                differing,
                elements,
                steps,
            )
        )
    sqnr = {name: _sqnr(*energy[name]) for name in outputs}
    return SaturationReport(label, records, tuple(layers), sqnr)


def _run(session: Any, feeds: Mapping[str, np.ndarray], outputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Every 8-bit tensor and every graph output of one run."""
    kept: dict[str, np.ndarray] = {}

    def keep(name: str, value: np.ndarray) -> None:
        if isinstance(value, np.ndarray) and (value.dtype in _EIGHT_BIT or name in outputs):
            kept[name] = value

    session.run([], feeds, on_tensor=keep)
    return kept


def _fold(
    ours: Mapping[str, np.ndarray],
    theirs: Mapping[str, np.ndarray],
    tensors: dict[str, list[int]],
    energy: dict[str, list[float]],
    constants: set[str],
) -> None:
    for name, value in ours.items():
        other = theirs.get(name)
        if other is None or other.shape != value.shape:
            continue
        if name in energy:
            ref = np.asarray(other, np.float64)
            energy[name][0] += float(np.sum(ref * ref))
            energy[name][1] += float(np.sum((np.asarray(value, np.float64) - ref) ** 2))
        if value.dtype in _EIGHT_BIT and name not in constants:
            diff = np.abs(value.astype(np.int16) - other.astype(np.int16))
            state = tensors.setdefault(name, [0, 0, 0])
            state[0] += int(diff.size)
            state[1] += int(np.count_nonzero(diff))
            state[2] = max(state[2], int(diff.max(initial=0)))


def _sqnr(signal: float, noise: float) -> float | None:
    """10 log10(signal / noise); None when the noise is zero (identical runs) or there is no signal."""
    if noise == 0.0 or signal == 0.0:
        return None
    return float(10.0 * np.log10(signal / noise))


def _quantized_outputs(model: onnx.ModelProto) -> dict[str, str]:
    """node name -> its 8-bit output: a QOperator node's own output, or the QuantizeLinear after a QDQ op."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    found = {}
    for index, node in enumerate(model.graph.node):
        name = node.name or f"{node.op_type}_{index}"
        if not node.output:
            continue
        users = readers.get(node.output[0], [])
        if node.op_type.startswith("QLinear") or node.op_type in ("QGemm", "MatMulInteger"):
            found[name] = node.output[0]
        elif len(users) == 1 and users[0].op_type == "QuantizeLinear":
            found[name] = users[0].output[0]
    return found


__all__ = ["EXACT", "SATURATING", "LayerSaturation", "SaturationReport", "measure_saturation"]
