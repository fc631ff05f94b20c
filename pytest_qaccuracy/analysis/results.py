"""Results of a comparison: frozen dataclasses that round-trip the comparison JSON exactly.

Writers in :mod:`pytest_qaccuracy.report` format these and never recompute them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_qaccuracy.metrics.channels import ChannelReport
from pytest_qaccuracy.numbers import finite

SCHEMA_VERSION = 1


def _metrics_dict(metrics: Mapping[str, float | None]) -> dict[str, float | None]:
    return {name: finite(value) for name, value in metrics.items()}


def _metrics_from(data: Any, where: str) -> dict[str, float | None]:
    """Read metrics from JSON: every value a number or null (``where`` names the layer or output)."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: 'metrics' is not an object")
    for name, value in data.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"{where}, metric '{name}': {value!r} is not a number")
    return dict(data)


def _channels_from(data: Mapping[str, Any]) -> ChannelReport | None:
    return ChannelReport.from_dict(data["channels"]) if data.get("channels") else None


@dataclass(frozen=True, slots=True)
class OutputResult:
    """Metrics of one model output over all records.

    ``undefined`` maps a metric whose value is ``None`` to the reason (e.g. an all-zero reference).
    ``worst_records`` keeps, per metric, the few worst ``(record, value)`` pairs for failure messages.
    """

    name: str
    metrics: Mapping[str, float | None]
    undefined: Mapping[str, str] = field(default_factory=dict)
    worst_records: Mapping[str, list[tuple[int, float]]] = field(default_factory=dict)
    quantized_tensor: str | None = None
    #: its narrowest varying channels in quantization steps, when it has one scale
    channels: ChannelReport | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "metrics": _metrics_dict(self.metrics)}
        if self.quantized_tensor and self.quantized_tensor != self.name:
            out["quantized_tensor"] = self.quantized_tensor
        if self.undefined:
            out["undefined"] = dict(self.undefined)
        if self.worst_records:
            out["worst_records"] = {m: [[int(r), float(v)] for r, v in rows] for m, rows in self.worst_records.items()}
        if self.channels is not None:
            out["channels"] = self.channels.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OutputResult:
        return cls(
            name=data["name"],
            metrics=_metrics_from(data["metrics"], f"output '{data['name']}'"),
            undefined=dict(data.get("undefined", {})),
            worst_records={
                m: [(int(r), float(v)) for r, v in rows] for m, rows in data.get("worst_records", {}).items()
            },
            quantized_tensor=data.get("quantized_tensor"),
            channels=_channels_from(data),
        )


@dataclass(frozen=True, slots=True)
class LayerResult:
    """Metrics of one matched intermediate tensor (an entry of the JSON's ``layers``)."""

    tensor: str
    quantized_tensor: str
    node: str | None
    op_type: str | None
    order: int
    metrics: Mapping[str, float | None]
    undefined: Mapping[str, str] = field(default_factory=dict)
    matched_by: str = "name"
    scale: float | None = None
    channels: ChannelReport | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "tensor": self.tensor,
            "quantized_tensor": self.quantized_tensor,
            "node": self.node,
            "op_type": self.op_type,
            "order": self.order,
            "metrics": _metrics_dict(self.metrics),
            "matched_by": self.matched_by,
        }
        if self.scale is not None:
            out["scale"] = float(self.scale)
        if self.undefined:
            out["undefined"] = dict(self.undefined)
        if self.channels is not None:
            out["channels"] = self.channels.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LayerResult:
        return cls(
            tensor=data["tensor"],
            quantized_tensor=data["quantized_tensor"],
            node=data.get("node"),
            op_type=data.get("op_type"),
            order=int(data["order"]),
            metrics=_metrics_from(data["metrics"], f"layer '{data['tensor']}'"),
            undefined=dict(data.get("undefined", {})),
            matched_by=data.get("matched_by", "name"),
            scale=data.get("scale"),
            channels=_channels_from(data),
        )


@dataclass(frozen=True, slots=True)
class ComparisonResult:
    """Everything one fp32-vs-quantized comparison measured."""

    fp32_model: str
    quantized_model: str
    data: str
    records: int
    metric_definitions: Mapping[str, str]
    outputs: list[OutputResult]
    layers: list[LayerResult]
    unmatched_fp32: list[str] = field(default_factory=list)
    unmatched_quantized: list[str] = field(default_factory=list)
    backend: str = "onnxruntime"
    scheme: str | None = None
    capture: str = "deployed"
    higher_is_better: Mapping[str, bool] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    #: Where the layers' per-record sums were computed: inside onnxruntime, or (and why) in numpy.
    reduction: str | None = None

    @property
    def metric_names(self) -> list[str]:
        return list(self.metric_definitions)

    def output(self, name: str) -> OutputResult:
        for out in self.outputs:
            if out.name == name:
                return out
        raise KeyError(f"no output '{name}'; outputs are {[o.name for o in self.outputs]}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "fp32_model": self.fp32_model,
            "quantized_model": self.quantized_model,
            "data": self.data,
            "records": self.records,
            "backend": self.backend,
            "scheme": self.scheme,
            "capture": self.capture,
            "metric_definitions": dict(self.metric_definitions),
            "higher_is_better": dict(self.higher_is_better),
            "outputs": [o.to_dict() for o in self.outputs],
            "layers": [layer.to_dict() for layer in self.layers],
            "unmatched": {"fp32": list(self.unmatched_fp32), "quantized": list(self.unmatched_quantized)},
            "reduction": self.reduction,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ComparisonResult:
        if data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"unsupported comparison schema_version {data.get('schema_version')!r}")
        unmatched = data.get("unmatched", {})
        return cls(
            fp32_model=data["fp32_model"],
            quantized_model=data["quantized_model"],
            data=data["data"],
            records=int(data["records"]),
            metric_definitions=dict(data["metric_definitions"]),
            outputs=[OutputResult.from_dict(o) for o in data["outputs"]],
            layers=[LayerResult.from_dict(x) for x in data["layers"]],
            unmatched_fp32=list(unmatched.get("fp32", [])),
            unmatched_quantized=list(unmatched.get("quantized", [])),
            backend=data.get("backend", "onnxruntime"),
            scheme=data.get("scheme"),
            capture=data.get("capture", "deployed"),
            higher_is_better=dict(data.get("higher_is_better", {})),
            reduction=data.get("reduction"),
        )
