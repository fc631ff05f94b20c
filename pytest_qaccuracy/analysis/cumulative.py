"""Cumulative error curves: the error at every quantized node, in topological order, for one
partial-quantization configuration (Horizon's ``plot_acc_error``).

For each quantized node the value compared is what its consumers read: the Q/DQ output of the node
when its output pair is quantized in the configuration, else its float output. The reference is the
same tensor of the model with every pair removed (the fp32 computation, named as in the QDQ model).
With ``average_mode`` point n is the mean of points 1..n.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pytest_qaccuracy.analysis.deadline import Deadline, check
from pytest_qaccuracy.analysis.partial import OUTPUT, Edge, QdqGraph, QuantizedNode
from pytest_qaccuracy.analysis.sensitivity import SCHEMA_VERSION, Session, checked
from pytest_qaccuracy.data.progress import task
from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.metrics import TensorPair, get_metric
from pytest_qaccuracy.numbers import finite
from pytest_qaccuracy.plain import Plain, fields_form, from_plain, plain_field
from pytest_qaccuracy.runtime import OrtRunner

KINDS = ("node", "weight", "activation")


@dataclass(frozen=True, slots=True)
class PartialConfig:
    """A partial quantization: ``quantize`` only these nodes, or all but ``exclude``.

    ``kind`` restricts the pairs: ``node`` (all), ``weight`` or ``activation`` pairs only.
    """

    label: str
    quantize: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()
    kind: str = "node"

    def edges(self, qg: QdqGraph) -> frozenset[Edge]:
        if self.kind not in KINDS:
            raise InputError(f"configuration {self.label!r}: unknown kind {self.kind!r}; expected {', '.join(KINDS)}")
        if self.quantize is not None:
            chosen = qg.edges_of(self.quantize, self.kind)
        else:
            chosen = frozenset(e for e, k in qg.kinds.items() if self.kind in ("node", k))
        return chosen - qg.edges_of(self.exclude, "node")


DEFAULT_CONFIGS = (
    PartialConfig("fully quantized"),
    PartialConfig("weights only", kind="weight"),
    PartialConfig("activations only", kind="activation"),
)


@dataclass(frozen=True, slots=True)
class CumulativeCurve(Plain):
    """One configuration's error per quantized node (``values``), topological order."""

    label: str
    quantize: list[str] | None
    exclude: list[str]
    kind: str
    values: list[float | None] = plain_field(dump=lambda values: [finite(v) for v in values])


@dataclass(frozen=True, slots=True)
class CumulativeResult(Plain):
    """Cumulative error curves of a pair: ``nodes``/``op_types`` give the x axis."""

    fp32_model: str
    quantized_model: str
    data: str
    records: int
    metric: str
    formula: str
    higher_is_better: bool
    average_mode: bool
    nodes: list[str]
    op_types: list[str]
    curves: list[CumulativeCurve] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "kind": "cumulative", **fields_form(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CumulativeResult:
        return from_plain(cls, checked(data, "cumulative"))

    def chart_data(self) -> dict[str, Any]:
        """The curves as chart-ready series: ``{"x": [...], "series": [{"name", "y"}], ...}``."""
        return {
            "title": f"cumulative {self.metric}{' (running mean)' if self.average_mode else ''}",
            "x_label": "node (topological order)",
            "y_label": self.metric,
            "x": list(self.nodes),
            "series": [{"name": c.label, "y": [finite(v) for v in c.values]} for c in self.curves],
        }


def _layer_tensors(qg: QdqGraph, node: QuantizedNode, enabled: frozenset[Edge]) -> tuple[str, str]:
    """(reference tensor in the float model, tensor in the configured model) of one node."""
    outputs = sorted(node.outputs)
    if not outputs:
        first = next(o for o in qg.view.nodes[node.index].output if o)
        return first, first
    ref = qg.sources[outputs[0]]
    for edge in outputs:
        if edge in enabled:
            consumer, pos = edge
            read = qg.view.output_names[pos] if consumer == OUTPUT else qg.view.nodes[consumer].input[pos]
            return ref, read
    return ref, ref


def cumulative_in(
    session: Session,
    configs: Sequence[PartialConfig] = DEFAULT_CONFIGS,
    average_mode: bool = False,
    deadline: Deadline | None = None,
) -> CumulativeResult:
    """Cumulative error curves of ``configs`` on a prepared :class:`Session` (first metric); a
    ``deadline``, checked before each model's run on each batch, raises :class:`~.deadline.DeadlineReached`."""
    qg, metric = session.qgraph, session.metrics[0]
    options, label = session.runner.options, qg.name
    layers = list(qg.nodes)
    enabled = [c.edges(qg) for c in configs]
    tensors = [[_layer_tensors(qg, n, e) for n in layers] for e in enabled]
    refs = sorted({r for config in tensors for r, _ in config})
    ref_runner = OrtRunner(qg.build(frozenset(), refs), refs, options, f"{label} (float)")
    runners = []
    for config, edges, pairs in zip(configs, enabled, tensors, strict=True):
        names = sorted({t for _, t in pairs})
        runners.append(OrtRunner(qg.build(edges, names), names, options, f"{label} [{config.label}]"))
    accs = [[get_metric(metric)() for _ in layers] for _ in configs]
    data = session.runner.data
    with task("cumulative", len(data)) as advance:
        for batch in data.iter_batches(options.batch_size):
            check(deadline)
            ref = ref_runner.run(batch)
            for runner, pairs, row in zip(runners, tensors, accs, strict=True):
                check(deadline)
                test = runner.run(batch)
                for (r, t), acc in zip(pairs, row, strict=True):
                    acc.update(TensorPair(ref[r], test[t]))
                del test
            advance(len(batch))
    curves = []
    for config, row in zip(configs, accs, strict=True):
        values = [acc.result()[0] for acc in row]
        curves.append(
            CumulativeCurve(
                config.label,
                list(config.quantize) if config.quantize is not None else None,
                list(config.exclude),
                config.kind,
                running_mean(values) if average_mode else values,
            )
        )
    cls = get_metric(metric)
    pair = session.pair
    return CumulativeResult(
        pair.fp32_path.name,
        pair.quantized_path.name,
        session.dataset.name,
        session.records,
        metric,
        cls.formula,
        cls.higher_is_better,
        average_mode,
        [n.name for n in layers],
        [n.op_type for n in layers],
        curves,
    )


def running_mean(values: Sequence[float | None]) -> list[float | None]:
    """Point n becomes the mean of the defined values among points 1..n (Horizon's average_mode)."""
    out, total, count = [], 0.0, 0
    for value in values:
        if value is not None and np.isfinite(value):
            total, count = total + value, count + 1
        out.append(total / count if count else None)
    return out


def parse_configs(quantize: Sequence[Sequence[str]] = (), exclude: Sequence[Sequence[str]] = ()) -> list[PartialConfig]:
    """Configurations from node lists: each ``quantize`` list and each ``exclude`` list is one curve."""
    configs = [PartialConfig(f"quantize {','.join(q)}", quantize=tuple(q)) for q in quantize]
    configs += [PartialConfig(f"all but {','.join(x)}", exclude=tuple(x)) for x in exclude]
    return configs


def as_mapping(result: CumulativeResult) -> Mapping[str, list[float | None]]:
    """``{curve label: values}`` (handy in tests and notebooks)."""
    return {c.label: list(c.values) for c in result.curves}
