"""Saturation report: where a model's int16 pair sums overflow on a CPU family whose kernels add two
8-bit products in int16 before widening.

The model runs on the integer backend twice over the data: with the overflowing preset (its pair sums
counted per node by ``backend.pairs``) and with the same preset summing exactly. The presets that
overflow (:data:`OVERFLOWING`): ``onnxruntime-avx2`` (x86 without VNNI: u8 x s8 pairs **saturate**,
against ``onnxruntime-vnni``), ``onnxruntime-arm64-neon`` (ARM64 without dot products: int8 pairs
``(k, k + 8)`` **wrap** around, and depthwise tap pairs) and ``onnxruntime-arm64`` (depthwise tap pairs
wrap). Per node: how many pair sums it computed, how many overflowed, and the record with the most;
per 8-bit tensor: how far the two runs differ (elements, largest step difference), which says which
layers lose accuracy because of it; per graph output: the SQNR of the overflowing run against the
exact one. Memory holds one batch and fixed-size state per node and tensor.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import onnx

from pytest_qaccuracy.data import Dataset, bind_dataset, load_dataset
from pytest_qaccuracy.model.batch import stacking
from pytest_qaccuracy.model.loading import graph_inputs, load_model

SATURATING, EXACT = "onnxruntime-avx2", "onnxruntime-vnni"
#: The presets whose pair sums overflow, and what they do: saturate (x86) or wrap around (ARM64).
OVERFLOWING = {SATURATING: "saturate", "onnxruntime-arm64-neon": "wrap", "onnxruntime-arm64": "wrap"}


def overflowing_presets(targets: tuple[str, ...] = ()) -> list[str]:
    """Where ``max_saturated`` measures: ``onnxruntime-avx2`` always, and the deployment targets among
    :data:`OVERFLOWING` (the ARM64 presets)."""
    return [SATURATING, *(t for t in dict.fromkeys(targets) if t in OVERFLOWING and t != SATURATING)]


def exact_counterpart(preset: str) -> tuple[str, Any]:
    """``(name, scheme)``: ``preset`` with exact int32 sums (``onnxruntime-vnni`` for AVX2).

    Raises:
        InputError: ``preset`` is not one whose pair sums overflow (the message lists those).
    """
    from pytest_qaccuracy.backend.scheme import get_scheme
    from pytest_qaccuracy.errors import InputError

    if preset not in OVERFLOWING:
        raise InputError(
            f"no pair sums overflow on preset '{preset}'; the presets that overflow are {', '.join(OVERFLOWING)}"
        )
    if preset == SATURATING:
        return EXACT, get_scheme(EXACT)
    name = f"{preset} with exact sums"
    return name, get_scheme(preset).replace(name=name, neon_pair_wrap=False, depthwise_pair_wrap=False)


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
    outputs: dict[str, float | None]  # SQNR (dB) of the overflowing run against the exact one
    preset: str = SATURATING  # where pair sums overflow
    exact: str = EXACT  # the same sums, exact

    @property
    def effect(self) -> str:
        """What an overflowing pair sum does on :attr:`preset`: ``saturate`` or ``wrap``."""
        return OVERFLOWING.get(self.preset, "saturate")

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
            "saturating_preset": self.preset,
            "exact_preset": self.exact,
            "effect": self.effect,
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
    preset: str = SATURATING,
) -> SaturationReport:
    """Run ``model`` (quantized) over ``data`` on ``preset`` (one of :data:`OVERFLOWING`) and on the
    same preset with exact sums; see the module.

    Raises:
        InputError: bad data (the message names the file, record and input), or a preset that does not
            overflow.
        ModelError: the model cannot be loaded.
    """
    from pytest_qaccuracy.backend import IntegerSession, pairs

    exact_name, exact_scheme = exact_counterpart(preset)
    proto = model if isinstance(model, onnx.ModelProto) else load_model(model)
    label = os.path.basename(str(model)) if not isinstance(model, onnx.ModelProto) else proto.graph.name or "model"
    proto, stacks = stacking(proto)  # a batch the model accepts: stacked records, or one at a time
    batch_size = batch_size if stacks else 1
    saturating = IntegerSession(proto, preset, threads=threads)
    exact = IntegerSession(proto, exact_scheme, threads=threads)
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
    return SaturationReport(label, records, tuple(layers), sqnr, preset, exact_name)


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


@dataclass(frozen=True, slots=True)
class RemedyResult:
    """One remedy applied to the model and run on ``onnxruntime-avx2``."""

    name: str
    how: str
    saturated: int | None  # pair sums that still saturate; None when the remedy could not be applied
    outputs: dict[str, float | None]  # SQNR (dB) against the original model's exact run; None: identical
    note: str = ""


#: MLAS kernels whose u8 x s8 weights the remedies rewrite: weight, scale, zero point, int32 bias input
_QOPERATOR_WEIGHTS = {"QLinearConv": (3, 4, 5, 8), "QLinearMatMul": (3, 4, 5, None), "QGemm": (3, 4, 5, 6)}


def check_remedies(
    model: str | os.PathLike[str] | onnx.ModelProto,
    data: Dataset | str | os.PathLike[str],
    report: SaturationReport,
    *,
    batch_size: int = 32,
    threads: int = 0,
) -> list[RemedyResult]:
    """Apply each remedy to the model and measure it on the report's preset against the original
    model's exact run. On x86 (saturation): 7-bit weights (the model's weights halved, which approximates
    re-quantizing with ``reduce_range=True``) and u8 weights (``w + 128``, what onnxruntime's
    ``session.x64quantprecision=1`` does on such CPUs); on ARM64 (wrap-around, which needs int8 weights of
    -128): symmetric weights (-128 clipped to -127, what ``WeightSymmetric`` quantizes to); and, for QDQ
    models, the overflowing layers left in float."""
    from pytest_qaccuracy.analysis.partial import QdqGraph
    from pytest_qaccuracy.backend import IntegerSession, pairs
    from pytest_qaccuracy.errors import ModelError

    proto = model if isinstance(model, onnx.ModelProto) else load_model(model)
    proto, stacks = stacking(proto)
    batch_size = batch_size if stacks else 1
    candidates: dict[str, tuple[str, onnx.ModelProto | None, str]] = {}
    if report.effect == "wrap":
        candidates["symmetric weights"] = (
            'quantize with extra_options={"WeightSymmetric": True}',
            _rewrite_weights(proto, _symmetric),
            "",
        )
    else:
        candidates["7-bit weights"] = ("quantize with reduce_range=True", _rewrite_weights(proto, _halve), "")
        candidates["u8 weights"] = (
            "weight_type=QuantType.QUInt8, or session.x64quantprecision=1 on onnxruntime",
            _rewrite_weights(proto, _to_uint8),
            "",
        )
    worst = [layer.node for layer in report.layers if layer.saturated]
    try:
        graph = QdqGraph(proto)
        in_float = graph.build(graph.all_edges - graph.edges_of(worst)) if worst else None
        candidates["worst layers in float"] = (f"nodes_to_exclude={worst}", in_float, "")
    except ModelError:
        candidates["worst layers in float"] = (f"nodes_to_exclude={worst}", None, "QDQ models only")
    reference = IntegerSession(proto, exact_counterpart(report.preset)[1], threads=threads)
    sessions = {n: IntegerSession(m, report.preset, threads=threads) for n, (_, m, _) in candidates.items() if m}
    outputs = [o.name for o in reference.get_outputs()]
    energy = {n: {o: [0.0, 0.0] for o in outputs} for n in sessions}
    counters = {n: pairs.SaturationCounter() for n in sessions}
    dataset = data if isinstance(data, Dataset) else load_dataset(data)
    try:
        for batch in bind_dataset(dataset, graph_inputs(proto)).iter_batches(batch_size):
            feeds = batch.stacked()
            want = dict(zip(outputs, reference.run(None, feeds), strict=True))
            for name, session in sessions.items():
                with pairs.counting(counters[name]):
                    got = session.run(outputs, feeds)
                for output, value in zip(outputs, got, strict=True):
                    ref = np.asarray(want[output], np.float64)
                    energy[name][output][0] += float(np.sum(ref * ref))
                    energy[name][output][1] += float(np.sum((np.asarray(value, np.float64) - ref) ** 2))
    finally:
        if not isinstance(data, Dataset):
            dataset.close()
    found = []
    for name, (how, _, note) in candidates.items():
        if name not in sessions:
            found.append(RemedyResult(name, how, None, {}, note or "nothing to change"))
            continue
        saturated = sum(e.saturated for e in counters[name].nodes.values())
        sqnr = {o: _sqnr(*energy[name][o]) for o in outputs}
        found.append(RemedyResult(name, how, saturated, sqnr, note))
    return found


def _halve(weights: np.ndarray, scale: np.ndarray, zero_point: np.ndarray) -> tuple[np.ndarray, ...]:
    """7-bit weights: ``rint(w / 2)`` in [-64, 64] at twice the scale (bias halves with it)."""
    return (
        np.clip(np.rint(weights / 2.0), -64, 64).astype(np.int8),
        (scale * 2).astype(scale.dtype),
        np.rint(zero_point / 2.0).astype(np.int8),
    )


def _symmetric(weights: np.ndarray, scale: np.ndarray, zero_point: np.ndarray) -> tuple[np.ndarray, ...]:
    """Symmetric int8 weights: ``-128`` becomes ``-127`` (one step; no pair of products can then wrap)."""
    return np.maximum(weights, -127).astype(np.int8), scale, zero_point


def _to_uint8(weights: np.ndarray, scale: np.ndarray, zero_point: np.ndarray) -> tuple[np.ndarray, ...]:
    """u8 weights: ``w + 128`` and ``zp + 128``, the same values (the sums are exact in u8 x u8)."""
    return _plus_128(weights), scale, _plus_128(zero_point)


def _plus_128(values: np.ndarray) -> np.ndarray:
    return (values.astype(np.int16) + 128).astype(np.uint8)


def _rewrite_weights(model: onnx.ModelProto, rewrite: Any) -> onnx.ModelProto | None:
    """A copy of ``model`` whose int8 weights of Conv/MatMul/Gemm kernels went through ``rewrite``
    (the int32 bias follows the weight scale); None when the model has no such weight."""
    from onnx import numpy_helper

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    inits = {t.name: t for t in copy.graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in copy.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    changed = False

    def value(name: str) -> np.ndarray | None:
        return numpy_helper.to_array(inits[name]) if name in inits else None

    def put(node: onnx.NodeProto, index: int, array: np.ndarray) -> None:
        name = f"{node.input[index]}::{node.name or node.op_type}:{index}"
        copy.graph.initializer.append(numpy_helper.from_array(array, name))
        node.input[index] = name

    for node in copy.graph.node:
        spots = _QOPERATOR_WEIGHTS.get(node.op_type)
        if spots is None and node.op_type == "DequantizeLinear" and len(node.input) == 3:
            users = readers.get(node.output[0], [])
            if users and all(u.op_type in ("Conv", "MatMul", "Gemm") and u.input[1] == node.output[0] for u in users):
                spots = (0, 1, 2, None)
        if spots is None:
            continue
        w, s, zp = (value(node.input[i]) if i < len(node.input) else None for i in spots[:3])
        if w is None or s is None or zp is None or w.dtype != np.int8:
            continue
        new_w, new_s, new_zp = rewrite(w, s, zp)
        for index, array in zip(spots[:3], (new_w, new_s, new_zp), strict=True):
            put(node, index, array)
        bias_index = spots[3]
        factor = float(np.asarray(new_s).reshape(-1)[0] / np.asarray(s).reshape(-1)[0])
        if bias_index is not None and bias_index < len(node.input) and value(node.input[bias_index]) is not None:
            put(node, bias_index, np.rint(value(node.input[bias_index]) / factor).astype(np.int32))
        if spots[3] is None and node.op_type == "DequantizeLinear" and factor != 1.0:
            _rescale_bias(copy, readers, node, factor, put, value)
        changed = True
    return copy if changed else None


def _rescale_bias(copy, readers, weight_dq, factor, put, value) -> None:  # type: ignore[no-untyped-def]
    """A QDQ Conv/Gemm's int32 bias (scale ``s_x * s_w``) follows its weight's new scale."""
    for user in readers.get(weight_dq.output[0], []):
        if len(user.input) < 3:
            continue
        bias_dq = next((n for n in copy.graph.node if user.input[2] in n.output), None)
        if bias_dq is None or bias_dq.op_type != "DequantizeLinear":
            continue
        bias, scale = value(bias_dq.input[0]), value(bias_dq.input[1])
        if bias is None or scale is None or bias.dtype != np.int32:
            continue
        put(bias_dq, 0, np.rint(bias / factor).astype(np.int32))
        put(bias_dq, 1, (scale * factor).astype(scale.dtype))
