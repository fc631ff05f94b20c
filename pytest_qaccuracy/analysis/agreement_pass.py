"""The agreement gate folded into a comparison's pass over the data.

:func:`~pytest_qaccuracy.analysis.compare.compare` takes an :class:`AgreementPass` and runs the quantized
model through :meth:`AgreementPass.runner`, which feeds every batch to the gate's
:class:`~pytest_qaccuracy.backend.agreement.AgreementChecker` as well. The gate needs the integer
emulation's 8-bit tensors and onnxruntime's (deployed kernels, ``session.qdqisint8allowed=1``):

* on onnxruntime, when the comparison's session computes what the gate's would
  (:func:`~pytest_qaccuracy.backend.agreement.shares_deployed_session`), the comparison's session gets
  the gate's config entry and its tensors as extra outputs, so the quantized model runs once per batch;
  otherwise (int8 activations on x86, other providers or options) the gate's own session runs the batch;
* on the integer backend, when the comparison's scheme is the gate's, one emulated run gives both the
  comparison's tensors and the gate's; onnxruntime then runs the batch once, for the gate.

The result is the one :func:`~pytest_qaccuracy.backend.agreement.dataset_agreement` gives in a pass of
its own. When the gate fails to run (an op the emulation lacks), the comparison goes on and
:meth:`AgreementPass.result` is None: the caller measures the gate on its own, which raises the same
error where it did before.
"""

from __future__ import annotations

from collections.abc import Sequence
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
from pytest_qaccuracy.data.binding import Batch
from pytest_qaccuracy.runtime import RuntimeOptions, make_runner
from pytest_qaccuracy.runtime.ort_runner import OrtRunner, bakes_batch


class AgreementPass:
    """An agreement gate measured in a comparison's pass; read :meth:`result` after the pass."""

    def __init__(self, checker: AgreementChecker) -> None:
        self.checker = checker
        self.error: BaseException | None = None
        #: how the gate's onnxruntime tensors were obtained: ``shared`` (the comparison's run),
        #: ``own`` (the gate's session), or None before the first batch
        self.mode: str | None = None

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
        """The gate's measurement over the batches run, or None if it failed in the pass."""
        return None if self.error is not None else self.checker.result()


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
        elif not self.shared:
            self._inner = make_runner(model, tensors, options, label, backend, scheme)
            for name in ("scheme_name", "capture"):
                if hasattr(self._inner, name):
                    setattr(self, name, getattr(self._inner, name))

    def run(self, batch: Batch) -> dict[str, np.ndarray]:
        gate, checker = self.gate, self.gate.checker
        feeds = batch.stacked()
        if self.emulated:  # one emulated run: the comparison's tensors and the gate's
            values, ours = checker.emulate(feeds, self.tensors)
            self._fold_own(ours, feeds, len(batch), "emulation shared")
            return dict(zip(self.tensors, values, strict=True))
        ours = None
        if gate.error is None:
            try:
                _, ours = checker.emulate(feeds)
            except Exception as exc:  # the gate's own pass reports it; the comparison goes on
                gate.error = exc
        if self._inner is None:
            self._inner = self._shared_runner()
        values = self._inner.run(batch)
        if ours is not None:
            if self.shared and gate.error is None:
                gate.mode = "shared"
                checker.fold(ours, values, len(batch))
            else:
                self._fold_own(ours, feeds, len(batch))
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

    def _fold_own(self, ours: dict, feeds: dict[str, np.ndarray], records: int, mode: str = "own") -> None:
        """Fold a batch whose onnxruntime tensors come from the gate's own session."""
        gate = self.gate
        if gate.error is not None:
            return
        gate.mode = mode
        try:
            gate.checker.fold(ours, gate.checker.onnxruntime_values(feeds), records)
        except Exception as exc:  # the gate's own pass reports it
            gate.error = exc


def _same_emulation(model: onnx.ModelProto, scheme: str | None, checker: AgreementChecker) -> bool:
    """Whether the comparison's emulation (``scheme``) computes what the gate's does: the same scheme
    but for running int8 QDQ activations as uint8, which the gate never does and which changes nothing
    in a model without int8 activations; and records that run stacked, as the gate runs them."""
    ours = get_scheme(scheme or "onnxruntime")
    if ours.replace(name=ours.name, qdq_int8_to_uint8=False) != checker.session.scheme or bakes_batch(model):
        return False
    return not ours.qdq_int8_to_uint8 or not signed_activations(model)


__all__ = ["AgreementPass"]
