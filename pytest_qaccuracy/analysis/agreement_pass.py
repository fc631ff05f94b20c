"""The agreement gate folded into a comparison's pass over the data.

:func:`~pytest_qaccuracy.analysis.compare.compare` takes an :class:`AgreementPass` and runs the quantized
model through :meth:`AgreementPass.runner`, which feeds every batch to the gate's
:class:`~pytest_qaccuracy.backend.agreement.AgreementChecker` as well. The gate needs the integer
emulation's 8-bit tensors and onnxruntime's (deployed kernels, ``session.qdqisint8allowed=1``):

* on onnxruntime, when the comparison's session computes what the gate's would
  (:func:`~pytest_qaccuracy.backend.agreement.shares_deployed_session`), the comparison's session gets
  the gate's config entry and its tensors as extra outputs, so the quantized model runs once per batch.
  A comparison on the merged graph of both models does the same through :meth:`AgreementPass.merged_tensors`
  (the quantized side fetches the gate's tensors) and :meth:`AgreementPass.fold`;
* on the integer backend, when the comparison's scheme is the gate's and no compared tensor lies
  inside a fused group, one emulated run gives both the comparison's tensors and the gate's;
  onnxruntime then runs the batch once, for the gate.

Otherwise (int8 activations on x86, other providers or options, another scheme) the gate shares no run
and *declines*: folded, it would only add its batch of 8-bit tensors to the pass's memory (on the
integer backend that measured slower than two passes). The result is the one
:func:`~pytest_qaccuracy.backend.agreement.dataset_agreement` gives in a pass of its own. When the gate
declines or fails to run (an op the emulation lacks), the comparison goes on and
:meth:`AgreementPass.result` is None: the caller measures the gate in a pass of its own, which raises
the same error where it did before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import numpy as np
import onnx

from pytest_qaccuracy.backend.agreement import (
    SESSION_CONFIG,
    AgreementChecker,
    AgreementResult,
    shares_deployed_session,
    signed_activations,
)
from pytest_qaccuracy.backend.scheme import get_scheme
from pytest_qaccuracy.data.binding import Batch, join_records
from pytest_qaccuracy.runtime import RuntimeOptions, make_runner
from pytest_qaccuracy.runtime.ort_runner import OrtRunner, bakes_batch


class AgreementPass:
    """An agreement gate measured in a comparison's pass; read :meth:`result` after the pass."""

    def __init__(self, checker: AgreementChecker) -> None:
        self.checker = checker
        self.error: BaseException | None = None
        #: which run the gate shares: ``shared`` (the comparison's onnxruntime session), ``merged`` (the
        #: quantized side of the comparison's merged graph), ``emulation shared`` (one emulated run for
        #: both), or None (before the first batch, or declined)
        self.mode: str | None = None
        #: True when the gate would share no run with the comparison: it is then not measured in the
        #: pass (:meth:`result` is None) and the caller measures it in a pass of its own
        self.declined = False
        self._first: tuple[int, int, dict[str, np.ndarray]] | None = None  # an emulated batch not folded yet
        self._merged = False

    def emulated(self, batch: Batch) -> dict[str, np.ndarray] | None:
        """The emulation's 8-bit tensors of ``batch`` (None once the gate failed: the error is kept)."""
        if self._first is not None and self._first[:2] == (batch.start, len(batch)):
            ours, self._first = self._first[2], None
            return ours
        if self.error is not None:
            return None
        try:
            return _joined(self.checker, batch, lambda feeds: self.checker.emulate(feeds)[1])
        except Exception as exc:  # the gate's own pass reports it; the comparison goes on
            self.error = exc
            return None

    def merged_tensors(
        self, model: onnx.ModelProto, options: RuntimeOptions, first: Batch
    ) -> tuple[list[str], RuntimeOptions]:
        """Before a merged-graph comparison: the gate's tensors for its quantized side to fetch, and
        that side's options (with the gate's config entry), when its run computes what the gate's
        session would; else ``([], options)`` and the gate declines (:attr:`declined`). Runs
        ``first`` on the emulation (to name the tensors); :meth:`fold` takes it from there."""
        if not shares_deployed_session(model, options):
            self.declined = True
            return [], options
        ours = self.emulated(first)
        if ours is not None:
            self._first = (first.start, len(first), ours)
        self._merged = ours is not None and bool(self.checker.names)
        if not self._merged:
            return [], options
        config = {**options.session_config, **SESSION_CONFIG}
        return list(self.checker.names or []), replace(options, session_config=config)

    def fold(self, batch: Batch, values: Mapping[str, np.ndarray]) -> None:
        """Fold a batch of a merged-graph comparison: ``values`` are its quantized side's tensors."""
        ours = None if self.declined else self.emulated(batch)
        if ours is None:
            return
        try:
            if self._merged:
                self.mode = "merged"
                self.checker.fold(ours, values, len(batch))
            else:  # a model without 8-bit tensors
                self.checker.fold(ours, _joined(self.checker, batch, self.checker.onnxruntime_values), len(batch))
        except Exception as exc:  # the gate's own pass reports it
            self.error = exc

    def runner(
        self,
        model: onnx.ModelProto,
        tensors: Sequence[str],
        options: RuntimeOptions,
        label: str,
        backend: str = "onnxruntime",
        scheme: str | None = None,
    ) -> _GatedRunner:
        """The quantized model's runner of a comparison (as :func:`~pytest_qaccuracy.runtime.make_runner`
        makes it) that also folds every batch into the gate."""
        return _GatedRunner(self, model, list(dict.fromkeys(tensors)), options, label, backend, scheme)

    def result(self) -> AgreementResult | None:
        """The gate's measurement over the batches run, or None if it failed or declined in the pass."""
        return None if self.error is not None or self.declined else self.checker.result()


class _GatedRunner:
    """``run(batch) -> {tensor: array}`` like the comparison's runner; the gate sees every batch."""

    def __init__(
        self,
        gate: AgreementPass,
        model: onnx.ModelProto,
        tensors: list[str],
        options: RuntimeOptions,
        label: str,
        backend: str,
        scheme: str | None,
    ) -> None:
        self.gate, self.model, self.tensors, self.options, self.label = gate, model, tensors, options, label
        checker = gate.checker
        # the emulation runs the comparison's tensors too when it is the comparison's backend and scheme
        self.emulated = (
            backend == "integer" and _same_emulation(model, scheme, checker) and checker.plans_alike(tensors)
        )
        self.shared = backend == "onnxruntime" and shares_deployed_session(model, options)
        self.backend = backend
        self._inner = None
        if self.emulated:  # what the comparison's result reads of its runner, as IntegerRunner says it
            self.scheme_name, self.capture = checker.session.scheme.name, "emulated"
        elif not self.shared:  # sharing nothing, the gate would only add its memory to the pass
            gate.declined = True
            self._inner = make_runner(model, tensors, options, label, backend, scheme)
            for name in ("scheme_name", "capture"):
                if hasattr(self._inner, name):
                    setattr(self, name, getattr(self._inner, name))

    def run(self, batch: Batch) -> dict[str, np.ndarray]:
        gate, checker = self.gate, self.gate.checker
        if gate.declined:
            return self._inner.run(batch)
        feeds = batch.stacked()
        if self.emulated:  # one emulated run: the comparison's tensors and the gate's
            values, ours = checker.emulate(feeds, self.tensors)
            self._fold_own(ours, feeds, len(batch), "emulation shared")
            return dict(zip(self.tensors, values, strict=True))
        ours = gate.emulated(batch)
        if self._inner is None:
            self._inner = self._shared_runner()
        values = self._inner.run(batch)
        if ours is not None and self.shared and gate.error is None:
            gate.mode = "shared"
            checker.fold(ours, values, len(batch))
        return {name: values[name] for name in self.tensors}

    def _shared_runner(self) -> OrtRunner:
        """The comparison's onnxruntime runner, with the gate's tensors and config entry when they are
        known (the first batch ran on the emulation), else as the comparison alone would make it."""
        if not self.shared or self.gate.error is not None:
            self.shared = False
            return make_runner(self.model, self.tensors, self.options, self.label)
        config = {**self.options.session_config, **SESSION_CONFIG}
        options = replace(self.options, session_config=config)
        return OrtRunner(self.model, [*self.tensors, *(self.gate.checker.names or [])], options, self.label)

    def _fold_own(self, ours: dict, feeds: dict[str, np.ndarray], records: int, mode: str) -> None:
        """Fold a batch whose onnxruntime tensors come from the gate's own session."""
        gate = self.gate
        if gate.error is not None:
            return
        gate.mode = mode
        try:
            gate.checker.fold(ours, gate.checker.onnxruntime_values(feeds), records)
        except Exception as exc:  # the gate's own pass reports it
            gate.error = exc


def _joined(
    checker: AgreementChecker, batch: Batch, run: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    """``run(feeds)`` over ``batch`` as the checker's model takes it: stacked, or record by record, joined."""
    if checker.stacks or len(batch) == 1:
        return run(batch.stacked())
    parts = [run(record) for record in batch.records]
    return {name: join_records([part[name] for part in parts]) for name in parts[0]}


def _same_emulation(model: onnx.ModelProto, scheme: str | None, checker: AgreementChecker) -> bool:
    """Whether the comparison's emulation (``scheme``) computes what the gate's does: the same scheme
    but for running int8 QDQ activations as uint8, which the gate never does and which changes nothing
    in a model without int8 activations; and records that run stacked, as the gate runs them."""
    ours = get_scheme(scheme or "onnxruntime")
    if ours.replace(name=ours.name, qdq_int8_to_uint8=False) != checker.session.scheme or bakes_batch(model):
        return False
    return not ours.qdq_int8_to_uint8 or not signed_activations(model)
