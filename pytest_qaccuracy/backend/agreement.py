"""Layer-by-layer agreement of the integer emulation with onnxruntime's deployed kernels.

``check_agreement`` runs a quantized model on onnxruntime (CPU EP, full optimizations, int8 QDQ fusion
on) and on :class:`IntegerSession` with the same feeds, and compares every 8- and 16-bit integer
tensor both produce in quantization steps (integer units), every model output whatever its type, and
any further tensor the caller's checks read (``tensors``). A float tensor's step is the scale of the
quantized tensor it is computed from (:func:`float_step`; any difference counts as at least one step),
or one unit in the last place of its type when no quantized tensor feeds it: with N = 0 a float output
must be bit-identical, so a gate cannot pass while the outputs differ (issue 32: every 8-bit tensor
agreed on a YOLO detector whose float outputs did not).
The result names the first tensor, in topological order, that differs by more than ``max_steps`` (the
per-node comparison across backends asked for in Glow issue 1837, github.com/pytorch/glow/issues/1837).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from pytest_qaccuracy.backend.interpreter import IntegerSession
from pytest_qaccuracy.backend.scheme import Scheme, get_scheme
from pytest_qaccuracy.data import Dataset, bind_dataset, load_dataset
from pytest_qaccuracy.data.progress import task
from pytest_qaccuracy.model.batch import stacking
from pytest_qaccuracy.model.loading import graph_inputs, load_model
from pytest_qaccuracy.ort_session import fetch, make_session
from pytest_qaccuracy.plain import Plain

_EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16), np.dtype(np.uint16))


@dataclass(frozen=True, slots=True)
class TensorAgreement(Plain):
    """One integer tensor: how far the emulation is from onnxruntime, in quantization steps."""

    tensor: str
    order: int
    elements: int
    mismatches: int
    max_steps: int
    #: ``steps`` (quantization steps: integer units, or a float tensor's quantized source's scale) or
    #: ``ulps`` (a float tensor no quantized tensor feeds: units in the last place of its type)
    unit: str = "steps"

    def steps(self, n: int | None = None) -> str:
        """``n`` (default: this tensor's largest difference) in this tensor's unit: ``3 steps``, ``1 ulp``."""
        n = self.max_steps if n is None else n
        word = "step" if self.unit == "steps" else "ulp"
        return f"{n} {word}" if n == 1 else f"{n} {word}s"


@dataclass(frozen=True, slots=True)
class AgreementResult(Plain):
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
        """Its fields, ``first_divergence`` before ``tensors`` (the form predates the field order)."""
        return {
            "model": self.model,
            "scheme": self.scheme,
            "max_steps_allowed": self.max_steps_allowed,
            "records": self.records,
            "first_divergence": self.first_divergence,
            "tensors": [t.to_dict() for t in self.tensors],
        }

    def with_max_steps(self, max_steps: int) -> AgreementResult:
        """The same measurement judged against another tolerance N (nothing is run again)."""
        return dataclasses.replace(
            self, max_steps_allowed=max_steps, first_divergence=_first_divergence(self.tensors, max_steps)
        )

    def summary(self) -> str:
        """One line: the rule, then the verdict with the first diverging tensor."""
        head = f"integer emulation ({self.scheme}) within {self.max_steps_allowed} step(s) of onnxruntime"
        if self.ok:
            return f"{head}: ok on {len(self.tensors)} tensors"
        bad = next(t for t in self.tensors if t.tensor == self.first_divergence)
        return (
            f"{head}: first divergence at '{bad.tensor}' (order {bad.order}): {bad.mismatches} / {bad.elements} "
            f"elements differ, max {bad.steps()}; {self.num_mismatched_tensors} tensors differ"
        )


#: The gate's session config entries beyond the package defaults: int8 QDQ groups fuse on x86 too.
SESSION_CONFIG = {"session.qdqisint8allowed": "1"}


#: How the gate names a tensor compared in the pair's own session (:attr:`AgreementChecker.deployed`).
DEFAULT_SESSION = "(default session)"


def onnxruntime_session(
    model: onnx.ModelProto, outputs: list[str], threads: int = 0, config: Mapping[str, str] = SESSION_CONFIG
) -> Any:
    """onnxruntime's CPU kernels as deployed: full optimizations, int8 QDQ fusion (``config``: the
    gate's :data:`SESSION_CONFIG`; ``{}`` for a default session), extra graph outputs."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    have = {o.name for o in copy.graph.output}
    copy.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in outputs if n not in have)
    return make_session(
        copy,
        providers=("CPUExecutionProvider",),
        threads=threads,
        optimization="all",
        config=dict(config),
    )


class AgreementChecker:
    """Streaming agreement check: feed batches with :meth:`update`, read :meth:`result` at the end.

    State is fixed-size (per tensor: elements, mismatches, max steps); sessions are built once.

    Args:
        model: a quantized model (QDQ or QOperator), path or proto.
        scheme: the emulation's scheme (preset name or :class:`Scheme`).
        max_steps: tolerated difference N, in quantization steps (float tensors: units in the last place).
        tensors: further tensors to compare whatever their type (the model outputs always are).
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | onnx.ModelProto,
        *,
        scheme: str | Scheme = "onnxruntime",
        max_steps: int = 0,
        tensors: Sequence[str] = (),
    ) -> None:
        proto = model if isinstance(model, onnx.ModelProto) else load_model(model)
        named = not isinstance(model, onnx.ModelProto)
        self.label = os.path.basename(str(model)) if named else (proto.graph.name or "model")
        #: the model both runtimes run (a declared batch of 1 freed), and whether records may run stacked
        self.proto, self.stacks = stacking(proto)
        # onnxruntime runs with session.qdqisint8allowed=1, so that every int8 tensor can be a graph output
        # without unfusing its group: the emulation keeps int8 activations as int8 too
        given = emulated = get_scheme(scheme)
        if emulated.qdq_int8_to_uint8:
            emulated = emulated.replace(name=emulated.name, qdq_int8_to_uint8=False)
        self.session = IntegerSession(self.proto, emulated)
        #: the pair's own session when it computes otherwise (x86 runs int8 QDQ activations as uint8 in a
        #: default session): its watched tensors are compared with onnxruntime's default session too
        self.deployed = (
            IntegerSession(self.proto, given) if given.qdq_int8_to_uint8 and signed_activations(self.proto) else None
        )
        self._deployed_ort: Any = None
        self._deployed_names: list[str] = []
        #: compared whatever their type: the model outputs, and the tensors the caller's checks read
        self.watched = list(dict.fromkeys([*(o.name for o in self.proto.graph.output), *tensors]))
        self._units = {name: unit for name in self.watched if (unit := float_step(self.proto, name)) is not None}
        self._float_names: set[str] = set()
        self.max_steps = max_steps
        self.records = 0
        self._names: list[str] | None = None
        self._ort: Any = None
        self._stats: dict[str, list[int]] = {}  # name -> [elements, mismatches, max_steps]

    @property
    def names(self) -> list[str] | None:
        """The 8-bit tensors compared, topological order; known after the first batch (:meth:`emulate`)."""
        return self._names

    def emulate(
        self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] = ()
    ) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
        """Run one batch on the integer emulation: the requested ``outputs``, and every 8-bit tensor it
        produces (what :meth:`fold` compares). The first batch fixes :attr:`names`."""
        produced: dict[str, np.ndarray] = {}
        watched = set(self.watched)

        def keep(name: str, value: np.ndarray) -> None:
            if not isinstance(value, np.ndarray) or name in self.session.constants:
                return
            if value.dtype in _EIGHT_BIT or (name in watched and value.dtype.kind in "fiub"):
                produced[name] = value

        # the watched tensors are asked for, as onnxruntime is: a float one inside a fused group unfuses it
        asked = [*outputs, *(n for n in self.watched if n not in outputs)]
        values = self.session.run(asked, feeds, on_tensor=keep)[: len(outputs)]
        if self._names is None:
            self._names = list(produced)
        return values, produced

    def fold(self, ours: Mapping[str, np.ndarray], theirs: Mapping[str, np.ndarray], records: int) -> None:
        """Fold one batch: ``ours`` from :meth:`emulate`, ``theirs`` onnxruntime's values of :attr:`names`
        from a session set up as :func:`onnxruntime_session` sets it up (the same batch)."""
        for name in self._names or []:
            self._fold_tensor(name, ours[name], theirs[name], self._units.get(name))
        self.records += records

    def _fold_tensor(self, key: str, ours: np.ndarray, reference: np.ndarray, unit: float | None) -> None:
        stats = self._stats.setdefault(key, [0, 0, 0])
        stats[0] += int(ours.size)
        if ours.shape != reference.shape:
            stats[1] += int(ours.size)
            stats[2] = -1
            return
        if ours.dtype.kind == "f":
            self._float_names.add(key)
        diff = steps_apart(ours, reference, unit)
        stats[1] += int(np.count_nonzero(diff))
        if stats[2] >= 0:
            stats[2] = max(stats[2], int(diff.max(initial=0)))

    def fold_deployed(self, feeds: Mapping[str, np.ndarray]) -> None:
        """With :attr:`deployed`: run one batch in the pair's own session on both runtimes (onnxruntime's
        default session) and fold the watched tensors as ``"<name> (default session)"``."""
        if self.deployed is None:
            return
        names = self.watched
        ours = self.deployed.run(names, feeds)
        if self._deployed_ort is None:
            self._deployed_ort = onnxruntime_session(self.proto, names, config={})
        theirs = fetch(self._deployed_ort, names, feeds)
        for name, value, reference in zip(names, ours, theirs, strict=True):
            key = f"{name} {DEFAULT_SESSION}"
            if key not in self._stats:
                self._deployed_names.append(key)
            self._fold_tensor(key, np.asarray(value), np.asarray(reference), self._units.get(name))

    def _unit(self, name: str) -> str:
        floats = self._float_names
        plain = name.removesuffix(f" {DEFAULT_SESSION}")
        return "ulps" if name in floats and plain not in self._units else "steps"

    def plans_alike(self, outputs: Sequence[str]) -> bool:
        """Whether asking :meth:`emulate` for ``outputs`` leaves the emulation's plan (and so every 8-bit
        tensor it produces) as it is without them: none is inside a fused group or an int8 activation."""
        session = self.session
        return not frozenset(outputs) & (session._fusion_sensitive | session._int8_activations)

    def onnxruntime_values(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """onnxruntime's values of :attr:`names` for one batch, from the gate's own session."""
        if self._ort is None and self._names:
            self._ort = onnxruntime_session(self.proto, self._names)
        theirs = fetch(self._ort, self._names, feeds) if self._ort is not None else []
        return dict(zip(self._names or [], theirs, strict=True))

    def update(self, feeds: Mapping[str, np.ndarray]) -> None:
        """Run one batch on both runtimes and fold the differences into the per-tensor state."""
        _, ours = self.emulate(feeds)
        self.fold(ours, self.onnxruntime_values(feeds), _records(feeds))
        self.fold_deployed(feeds)

    def result(self) -> AgreementResult:
        """Every 8-bit tensor in topological order, then (with :attr:`deployed`) the watched tensors of
        the pair's own session."""
        names = [*(self._names or []), *self._deployed_names]
        tensors = tuple(
            TensorAgreement(name, order, *self._stats[name], self._unit(name)) for order, name in enumerate(names)
        )
        first = _first_divergence(tensors, self.max_steps)
        return AgreementResult(self.label, self.session.scheme.name, self.max_steps, self.records, tensors, first)


def float_step(model: onnx.ModelProto, tensor: str) -> float | None:
    """The step a float tensor is judged in: the scale of the DequantizeLinear it is computed from (the
    nearest one up the chain of first computed inputs; its largest scale when per channel), or None when
    no quantized tensor feeds it (then its steps are units in the last place)."""
    producers = {o: n for n in model.graph.node for o in n.output}
    constants = {t.name: t for t in model.graph.initializer}
    constants.update({n.output[0]: a.t for n in model.graph.node if n.op_type == "Constant" for a in n.attribute})
    for _ in range(len(model.graph.node)):  # an acyclic graph's chain is never longer; a cycle ends here
        node = producers.get(tensor)
        if node is None:
            return None
        if node.op_type == "DequantizeLinear" and node.input[1] in constants:
            return float(np.abs(onnx.numpy_helper.to_array(constants[node.input[1]])).max())
        computed = [x for x in node.input if x and x not in constants]
        if not computed:
            return None
        tensor = computed[0]
    return None


def steps_apart(ours: np.ndarray, theirs: np.ndarray, step: float | None = None) -> np.ndarray:
    """Elementwise distance in steps (int64): integer units; for floats, ``step`` units (a difference
    below one step counts as one: only equal values are 0 apart) or without a step units in the last
    place of their type (the bit patterns mapped to a monotonic integer line). NaN against NaN is 0
    apart, NaN against a number the widest distance."""
    if step is not None and ours.dtype.kind == "f" and theirs.dtype.kind == "f":
        diff = np.abs(ours.astype(np.float64) - theirs.astype(np.float64))
        # a dequantized value is a multiple of its step up to float32 rounding (under 0.01 step for 16-bit
        # codes): 43 steps are not 44
        apart = np.where(diff > 0, np.maximum(1.0, np.ceil(diff / step - 0.01)), 0.0)
        nan_ours, nan_theirs = np.isnan(ours), np.isnan(theirs)
        apart = np.where(nan_ours & nan_theirs, 0, np.minimum(apart, 2.0**62))
        return np.where(nan_ours ^ nan_theirs, np.iinfo(np.int64).max, apart.astype(np.int64))
    if ours.dtype.kind != "f" or theirs.dtype != ours.dtype:
        if ours.dtype.kind == "f" or theirs.dtype.kind == "f":  # another type on each side
            return np.where(ours.astype(np.float64) == theirs.astype(np.float64), 0, np.iinfo(np.int64).max)
        return np.abs(ours.astype(np.int64) - theirs.astype(np.int64))
    bits = np.dtype(f"i{ours.dtype.itemsize}")
    lowest = np.iinfo(bits).min

    def line(x: np.ndarray) -> np.ndarray:
        b = np.ascontiguousarray(x).view(bits).astype(np.int64)
        return np.where(b < 0, lowest - b, b)

    apart = np.abs(line(ours) - line(theirs))
    nan_ours, nan_theirs = np.isnan(ours), np.isnan(theirs)
    apart = np.where(nan_ours & nan_theirs, 0, apart)
    return np.where(nan_ours ^ nan_theirs, np.iinfo(np.int64).max, apart)


def _records(feeds: Mapping[str, np.ndarray]) -> int:
    """Records on the batch axis of ``feeds`` (0 without inputs)."""
    return int(np.asarray(next(iter(feeds.values()))).shape[0]) if feeds else 0


def shares_deployed_session(model: onnx.ModelProto, options: Any) -> bool:
    """Whether a session of ``model`` opened with ``options`` (a ``RuntimeOptions``, all optimizations)
    computes what :func:`onnxruntime_session` computes once :data:`SESSION_CONFIG` is added to it: CPU
    execution provider only, onnxruntime's threads, no other config entry, and no 8-bit activation
    that is signed (``session.qdqisint8allowed`` only changes how QDQ groups with int8 activations
    fuse on x86). Then one run gives both the comparison's and the gate's tensors."""
    config = dict(options.session_config)
    if tuple(options.providers) != ("CPUExecutionProvider",) or options.optimization != "all" or options.threads:
        return False
    if any(config.get(k, v) != v for k, v in SESSION_CONFIG.items()) or set(config) - set(SESSION_CONFIG):
        return False
    return not signed_activations(model)


def signed_activations(model: onnx.ModelProto) -> bool:
    """Whether a QuantizeLinear writes int8 (its zero point's type), or a DequantizeLinear reads an
    int8 tensor that is not an initializer."""
    types = {t.name: t.data_type for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output:
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            types[node.output[0]] = value.data_type if value is not None else onnx.TensorProto.UNDEFINED
    for node in model.graph.node:
        zero = types.get(node.input[2]) if len(node.input) > 2 else None
        if node.op_type == "QuantizeLinear" and zero == onnx.TensorProto.INT8:
            return True
        if node.op_type == "DequantizeLinear" and node.input[0] not in types and zero == onnx.TensorProto.INT8:
            return True
    return False


def _first_divergence(tensors: Sequence[TensorAgreement], max_steps: int) -> str | None:
    """First tensor (topological order) off by more than ``max_steps``; -1 steps marks a shape mismatch."""
    return next((t.tensor for t in tensors if t.max_steps > max_steps or t.max_steps < 0), None)


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
        For many batches, use :class:`AgreementChecker` (same result, sessions built once).
    """
    checker = AgreementChecker(model, scheme=scheme, max_steps=max_steps)
    checker.update(feeds)
    return checker.result()


def dataset_agreement(
    model: str | os.PathLike[str] | onnx.ModelProto,
    data: Dataset | str | os.PathLike[str],
    *,
    scheme: str | Scheme = "onnxruntime",
    max_steps: int = 0,
    batch_size: int = 32,
    tensors: Sequence[str] = (),
) -> AgreementResult:
    """:func:`check_agreement` over every record of a dataset, streamed batch by batch.

    Args:
        model: a quantized model (QDQ or QOperator), path or proto.
        data: a dataset or its path (``.h5``/``.hdf5``, ``.npz``, or a folder of ``.npy``).
        scheme: the emulation's scheme (preset name or :class:`Scheme`).
        max_steps: tolerated difference N, in quantization steps.
        batch_size: records per run; memory holds one batch and fixed-size state per tensor.
        tensors: further tensors to compare whatever their type (the model outputs always are).

    Returns:
        the :class:`AgreementResult` of all records.

    Raises:
        InputError: bad data or an unknown scheme (the message names it).
    """
    checker = AgreementChecker(model, scheme=scheme, max_steps=max_steps, tensors=tensors)
    dataset = data if isinstance(data, Dataset) else load_dataset(data)
    try:
        bound = bind_dataset(dataset, graph_inputs(checker.proto))
        with task("agreement", len(bound)) as advance:
            for batch in bound.iter_batches(batch_size if checker.stacks else 1):
                checker.update(batch.stacked())
                advance(len(batch))
    finally:
        if not isinstance(data, Dataset):
            dataset.close()
    return checker.result()
