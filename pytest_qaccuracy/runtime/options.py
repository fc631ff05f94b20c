"""How models are run: execution providers, graph optimization, threads, batch size."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from pytest_qaccuracy import defaults
from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.ort_session import GRAPH_OPTIMIZATION

OPTIMIZATION_LEVELS = tuple(GRAPH_OPTIMIZATION)

#: What the quantized model's tensors mean, by how its session is optimized (docs/data.md, "capture").
CAPTURE_MODES = {
    "deployed": "the quantized model as onnxruntime deploys it: graph optimizations on, so QDQ groups run "
    "as fused integer kernels (QLinearConv, ...) where onnxruntime fuses them",
    "reference": "QDQ reference semantics (fake quantization): graph optimizations off, every op runs in "
    "float between QuantizeLinear/DequantizeLinear, as onnxruntime's qdq_loss_debug measures",
}


@dataclass(frozen=True, slots=True)
class RuntimeOptions:
    """Options of the onnxruntime sessions that run a pair.

    Attributes:
        providers: execution providers in priority order.
        optimization: graph optimization level of the fp32 session (and of the quantized session in
            ``deployed`` capture mode): one of ``disable``, ``basic``, ``extended``, ``all``.
        threads: intra-op threads (0 lets onnxruntime choose).
        batch_size: records per run where the model's batch dimension allows it.
        session_config: extra ``SessionOptions.add_session_config_entry`` items, e.g.
            ``{"session.qdqisint8allowed": "1"}`` to fuse int8 QDQ groups on x86.
    """

    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    optimization: str = "all"
    threads: int = 0
    batch_size: int = defaults.BATCH_SIZE
    session_config: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.optimization not in OPTIMIZATION_LEVELS:
            raise InputError(f"optimization must be one of {', '.join(OPTIMIZATION_LEVELS)}, got {self.optimization!r}")
        if self.batch_size < 1:
            raise InputError(f"batch size must be >= 1, got {self.batch_size}")
        if self.threads < 0:
            raise InputError(f"threads must be >= 0, got {self.threads}")
        if not self.providers:
            raise InputError("at least one execution provider is needed")

    def for_capture(self, capture: str) -> RuntimeOptions:
        """The options of the quantized session for a capture mode."""
        if capture not in CAPTURE_MODES:
            raise InputError(f"capture mode must be one of {', '.join(CAPTURE_MODES)}, got {capture!r}")
        return self if capture == "deployed" else replace(self, optimization="disable")
