"""What a calibration is asked for (:class:`CalibrationOptions`) and what it gives
(:class:`CalibrationResult`): shared by the methods, ``auto`` and the writer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytest_qaccuracy.analysis.calibration import ranges as R
from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.plain import Plain, none, plain_field

METHODS = ("minmax", "moving-average", "percentile", "kl", "mse", "auto")
QTYPES = {"uint8": (0, 255), "int8": (-128, 127)}
#: the model formats onnxruntime's quantizer writes (``QuantFormat``)
FORMATS = ("qdq", "qoperator")
#: Weight inputs quantized per channel, and their channel axis (onnxruntime's QDQ defaults).
WEIGHT_SLOTS = {"Conv": 0, "ConvTranspose": 1, "Gemm": None, "MatMul": None}


@dataclass(frozen=True, slots=True)
class CalibrationOptions:
    """How ranges are chosen and how the model is quantized.

    Attributes:
        method: one of ``METHODS``.
        activation_type, weight_type: ``uint8`` or ``int8``.
        per_channel: quantize weights per output channel.
        power2: round every scale up to a power of two (activations through their range, weights
            through explicit scale overrides).
        percentiles: ONE's (min, max) percentiles of the per-record minima / maxima.
        moving_average: ONE's (batch, constant).
        bins: histogram bins (odd); default 8001 for ``kl`` (TVM), 2047 for ``mse``.
        quantized_bins: KL's quantized bins (255).
        quant_format: the model onnxruntime writes: ``qdq`` (QuantizeLinear/DequantizeLinear pairs)
            or ``qoperator`` (QLinearConv, QLinearMatMul, ...).
    """

    method: str = "minmax"
    activation_type: str = "uint8"
    weight_type: str = "int8"
    per_channel: bool = False
    power2: bool = False
    percentiles: tuple[float, float] = (1.0, 99.0)
    moving_average: tuple[int, float] = (16, 0.1)
    bins: int | None = None
    quantized_bins: int = R.KL_QUANTIZED_BINS
    quant_format: str = "qdq"

    def __post_init__(self) -> None:
        if self.quant_format not in FORMATS:
            raise InputError(f"quantization format must be one of {', '.join(FORMATS)}, got {self.quant_format!r}")
        if self.method not in METHODS:
            raise InputError(f"unknown calibration method {self.method!r}; expected one of {', '.join(METHODS)}")
        for what, value in (("activation", self.activation_type), ("weight", self.weight_type)):
            if value not in QTYPES:
                raise InputError(f"{what} type must be uint8 or int8, got {value!r}")
        lo, hi = self.percentiles
        if not 0 <= lo < hi <= 100:
            raise InputError(f"percentiles must satisfy 0 <= min < max <= 100, got {self.percentiles}")
        batch, constant = self.moving_average
        if batch < 1 or not 0 <= constant <= 1:
            raise InputError(f"moving average needs batch >= 1 and 0 <= constant <= 1, got {self.moving_average}")
        if self.bins is not None and (self.bins < 3 or self.bins % 2 == 0):
            raise InputError(f"histogram bins must be odd and >= 3, got {self.bins}")

    @property
    def histogram_bins(self) -> int:
        return self.bins or (R.KL_BINS if self.method == "kl" else 2047)


@dataclass(frozen=True, slots=True)
class CalibrationResult(Plain):
    """The chosen range of every calibrated tensor, and the observed extrema behind it."""

    method: str
    records: int
    ranges: dict[str, tuple[float, float]] = plain_field(dump=lambda ranges: _float_pairs(ranges))
    observed: dict[str, tuple[float, float]] = plain_field(default_factory=dict, dump=lambda r: _float_pairs(r))
    #: ``auto`` only: every tensor's candidates with their scores and the winner, and the whole-model
    #: choices measured (``auto.choose``)
    selection: dict[str, Any] | None = plain_field(None, omit=none)
    #: ``auto`` only: the chosen model as onnxruntime wrote it, and what it was written from
    #: (:func:`written_key`), so that writing it again with the same arguments copies it instead
    model: bytes | None = plain_field(None, skip=True, repr=False, compare=False)
    model_key: tuple[Any, ...] | None = plain_field(None, skip=True, repr=False, compare=False)


def _float_pairs(ranges: dict[str, tuple[float, float]]) -> dict[str, list[float]]:
    """Ranges as JSON writes them: ``[lo, hi]`` as Python floats."""
    return {name: [float(lo), float(hi)] for name, (lo, hi) in ranges.items()}


def written_key(model: Any, calibration: CalibrationOptions, nodes_to_exclude: Any) -> tuple[Any, ...]:
    """What a model written by onnxruntime's quantizer depends on besides the ranges."""
    from pathlib import Path

    return (str(Path(model).resolve()), calibration, tuple(nodes_to_exclude or ()))
