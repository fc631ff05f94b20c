"""Node sensitivity, partial-quantization sweeps and exclusion lists for QDQ models.

Definitions (docs/sensitivity.md):

* **single**: only the node's Q/DQ pairs are kept (the rest of the model runs in fp32), so the
  output error is the error this node's quantization introduces on its own (Horizon's
  ``get_sensitivity_of_nodes``).
* **leave-one-out**: every pair except the node's is kept, so the output error is what remains when
  this node alone stays in float.
* granularity ``node`` takes all of a node's pairs, ``weight`` its weight pairs only, ``activation``
  its activation pairs only (inputs and output).

Metrics are measured on the model outputs against the fp32 model over all records, per output; a
node's ``metrics`` are the mean over outputs. Nodes are ranked worst first by the first metric.

With a :class:`~.deadline.Deadline` the experiments run in chunks of nodes (topological order), each a
pass over the records; the ranking stops at the deadline with the chunks it finished, and names the
nodes it did not measure (``unmeasured``) rather than showing them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from pytest_qaccuracy.analysis.deadline import Deadline, DeadlineReached
from pytest_qaccuracy.analysis.experiments import Experiment, ExperimentRunner, OutputMetrics, metric_mean
from pytest_qaccuracy.analysis.partial import QdqGraph, QuantizedNode
from pytest_qaccuracy.analysis.results import _metrics_dict
from pytest_qaccuracy.data import Dataset, Head, bind_dataset, load_dataset
from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.metrics import get_metric, parse_metric_names
from pytest_qaccuracy.model.cut import cut_pair
from pytest_qaccuracy.model.pair import ModelPair
from pytest_qaccuracy.numbers import finite
from pytest_qaccuracy.plain import Plain, empty, from_plain, plain_field
from pytest_qaccuracy.runtime import RuntimeOptions

if TYPE_CHECKING:
    from pytest_qaccuracy.analysis.reference_cache import ReferenceCache

SCHEMA_VERSION = 1
MODES = ("single", "leave-one-out")
GRANULARITIES = ("node", "weight", "activation")
#: With a deadline, the first chunk holds this share of the nodes (and the fully quantized model)...
FIRST_CHUNK_SHARE = 1 / 8
#: ... and every later one as many as are expected to take this share of the time left, at the rate
#: the chunks before measured: few chunks when the budget is ample, ever smaller ones near the deadline.
CHUNK_SHARE = 1 / 2


def outputs_dict(outputs: Mapping[str, Mapping[str, float | None]]) -> dict[str, dict[str, float | None]]:
    """Per output, its metrics as JSON writes them (``finite``)."""
    return {name: _metrics_dict(metrics) for name, metrics in outputs.items()}


@dataclass(frozen=True, slots=True)
class NodeSensitivity(Plain):
    """Output metrics of one node's experiment (``metrics``: mean over outputs; ``outputs``: each)."""

    node: str
    op_type: str
    order: int
    metrics: Mapping[str, float | None] = plain_field(dump=_metrics_dict)
    outputs: Mapping[str, Mapping[str, float | None]] = plain_field(default_factory=dict, dump=outputs_dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class SensitivityResult(Plain):
    """Sensitivity of every quantized node of a pair, ranked worst first by the first metric.

    ``baseline`` holds the fully quantized model's output metrics (mean over outputs);
    ``measured_at`` names the fp32 tensors measured when the pair was cut (empty: the model outputs);
    ``unmeasured`` names the nodes a deadline left unmeasured (empty: every node is in ``nodes``).
    """

    fp32_model: str
    quantized_model: str
    data: str
    records: int
    mode: str
    granularity: str
    metric_definitions: Mapping[str, str]
    higher_is_better: Mapping[str, bool]
    baseline: Mapping[str, float | None] = plain_field(default_factory=dict, dump=_metrics_dict)
    nodes: list[NodeSensitivity]
    unremovable: list[str] = field(default_factory=list)
    measured_at: list[str] = field(default_factory=list)
    unmeasured: list[str] = plain_field(default_factory=list, omit=empty)
    schema_version: int = plain_field(SCHEMA_VERSION, first=True, then=("kind",))
    kind: ClassVar[str] = "sensitivity"

    @property
    def stopped(self) -> str | None:
        """``ranking stopped at the budget after N of M nodes``, or None when every node was measured."""
        if not self.unmeasured:
            return None
        total = len(self.nodes) + len(self.unmeasured)
        return f"ranking stopped at the budget after {len(self.nodes)} of {total} nodes"

    @property
    def metric_names(self) -> list[str]:
        return list(self.metric_definitions)

    def ranked(self, metric: str | None = None) -> list[NodeSensitivity]:
        """Nodes worst first by ``metric`` (default: the first); undefined values last."""
        return rank(self.nodes, metric or self.metric_names[0], self.higher_is_better, self.mode)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SensitivityResult:
        return from_plain(cls, checked(data, "sensitivity"))


def checked(data: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    """``data``, a result dict of ``kind`` (its ``schema_version`` and ``kind``); ValueError otherwise."""
    if data.get("schema_version") != SCHEMA_VERSION or data.get("kind") != kind:
        raise ValueError(f"not a {kind} result (schema_version {SCHEMA_VERSION}, kind {kind!r})")
    return data


def rank(
    nodes: Sequence[NodeSensitivity], metric: str, higher_is_better: Mapping[str, bool], mode: str = "single"
) -> list[NodeSensitivity]:
    """Most sensitive first.

    In ``single`` mode a node is sensitive when its output metric is bad. In ``leave-one-out`` mode
    it is sensitive when keeping it in float makes the output metric *good*, so the order flips.
    """
    higher = higher_is_better.get(metric, False)
    worst_first_sign = 1.0 if higher else -1.0
    if mode == "leave-one-out":
        worst_first_sign = -worst_first_sign

    def key(node: NodeSensitivity) -> tuple[int, float, int]:
        value = node.metrics.get(metric)
        return (1, 0.0, node.order) if value is None else (0, worst_first_sign * value, node.order)

    return sorted(nodes, key=key)


@dataclass(slots=True)
class Session:
    """Everything an analysis of one pair needs, prepared once (graph index, bound data, runner)."""

    pair: ModelPair
    dataset: Dataset
    qgraph: QdqGraph
    runner: ExperimentRunner
    metrics: list[str]
    owns_dataset: bool = True
    measured_at: list[str] = field(default_factory=list)  # fp32 tensors where the pair was cut; [] = outputs

    @property
    def records(self) -> int:
        return len(self.runner.data)

    def definitions(self) -> tuple[dict[str, str], dict[str, bool]]:
        return (
            {n: get_metric(n).formula for n in self.metrics},
            {n: get_metric(n).higher_is_better for n in self.metrics},
        )

    def close(self) -> None:
        """Close the dataset if the session opened it (a Dataset passed in stays open)."""
        self.runner.close()
        if self.owns_dataset:
            self.dataset.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_session(
    pair: ModelPair,
    data: Dataset | str | os.PathLike[str],
    metrics: str | Sequence[str] | None = "cosine",
    options: RuntimeOptions | None = None,
    capture: str = "reference",
    strategy: str = "reuse",
    allow_nonfinite: bool = False,
    records: int | None = None,
    outputs: Sequence[str] | None = None,
    reference: ReferenceCache | None = None,
) -> Session:
    """Index the quantized model, bind the dataset and prepare the experiment runner.

    ``capture`` is ``reference`` (QDQ fake quantization, graph optimizations off: the default, so
    partial models mean the same as the whole one) or ``deployed`` (``options.optimization``).
    ``records`` limits every analysis of the session to the first N records (:class:`Head`).
    ``outputs`` cuts both models at these tensors or nodes (:func:`~pytest_qaccuracy.model.cut.cut_pair`):
    every analysis of the session then measures there, and nodes after the cut are not analysed.
    ``reference`` holds the fp32 values of a comparison of the same pair over the same records
    (:mod:`.reference_cache`): the analyses read them instead of running the fp32 model again.
    """
    names = parse_metric_names(metrics)
    options = (options or RuntimeOptions()).for_capture(capture)
    if outputs is not None:
        pair = cut_pair(pair, outputs)
    qgraph = QdqGraph(pair.quantized, pair.fp32, pair.quantized_path.name)
    dataset = data if isinstance(data, Dataset) else load_dataset(data)
    try:
        if records is not None:
            dataset = Head(dataset, records)  # closing the head closes the dataset it samples
        bound = bind_dataset(dataset, pair.inputs, allow_nonfinite=allow_nonfinite)
    except BaseException:
        if not isinstance(data, Dataset):
            dataset.close()
        raise
    runner = ExperimentRunner(
        qgraph, pair.fp32, pair.output_pairs(), bound, names, options, strategy, pair.quantized_path.name, reference
    )
    measured_at = runner.output_names if outputs is not None else []
    return Session(pair, dataset, qgraph, runner, names, not isinstance(data, Dataset), measured_at)


def _check_choice(value: str, choices: Sequence[str], what: str) -> None:
    if value not in choices:
        raise InputError(f"unknown {what} {value!r}; expected one of {', '.join(choices)}")


def node_sensitivity(
    pair: ModelPair,
    data: Dataset | str | os.PathLike[str],
    mode: str = "single",
    granularity: str = "node",
    metrics: str | Sequence[str] | None = "cosine",
    nodes: Sequence[str] | None = None,
    options: RuntimeOptions | None = None,
    capture: str = "reference",
    strategy: str = "reuse",
    allow_nonfinite: bool = False,
    outputs: Sequence[str] | None = None,
) -> SensitivityResult:
    """Sensitivity of every quantized node (or of ``nodes``) of a QDQ pair.

    Args:
        pair: the fp32 and QDQ models.
        data: a dataset or its path.
        mode: ``single`` (only this node quantized) or ``leave-one-out`` (all but this node).
        granularity: ``node``, ``weight`` or ``activation``: which of the node's pairs count.
        metrics: metric names; the first ranks the nodes.
        nodes: node names to analyse (default: every quantized node).
        options: onnxruntime options (batch size, threads, providers).
        capture: ``reference`` (fake quantization) or ``deployed``.
        strategy: ``reuse`` (cached activations, dirty subgraphs) or ``naive`` (one model per node).
        allow_nonfinite: accept NaN/Inf in the inputs.
        outputs: measure at these fp32 tensors or nodes instead of the model outputs (Horizon's
            ``output_node``); only the nodes they depend on are analysed.

    Returns:
        A :class:`SensitivityResult`, nodes ranked most sensitive first.

    Raises:
        InputError: bad data or options, a QOperator model, an unknown node or output.
    """
    _check_choice(mode, MODES, "mode")
    _check_choice(granularity, GRANULARITIES, "granularity")
    session = open_session(pair, data, metrics, options, capture, strategy, allow_nonfinite, outputs=outputs)
    try:
        return sensitivity_in(session, mode, granularity, nodes)
    finally:
        session.close()


def node_experiments(
    qg: QdqGraph, chosen: Sequence[QuantizedNode], mode: str, granularity: str = "node"
) -> list[Experiment]:
    """One experiment per chosen node (only it quantized, or all but it), then the fully quantized model."""
    all_edges = qg.all_edges
    experiments = [
        Experiment(n.name, n.edges(granularity) if mode == "single" else all_edges - n.edges(granularity))
        for n in chosen
    ]
    return [*experiments, Experiment("fully quantized", all_edges)]


def sensitivity_cache(mode: str) -> str:
    """The configuration whose tensors a mode's experiments reuse: float for single, quantized otherwise."""
    return "float" if mode == "single" else "quantized"


def sensitivity_in(
    session: Session,
    mode: str = "single",
    granularity: str = "node",
    nodes: Sequence[str] | None = None,
    deadline: Deadline | None = None,
) -> SensitivityResult:
    """:func:`node_sensitivity` on a prepared :class:`Session`. With a ``deadline``: the nodes measured
    before it (in chunks, :func:`measure_until`), the others in ``unmeasured``; raises
    :class:`~.deadline.DeadlineReached` when it came before the first chunk was measured."""
    qg = session.qgraph
    chosen = [qg.node(n) for n in nodes] if nodes else list(qg.nodes)
    chosen = [n for n in chosen if n.edges(granularity)]
    experiments = node_experiments(qg, chosen, mode, granularity)
    if deadline is None:
        results = session.runner.run(experiments, sensitivity_cache(mode))
        measured, whole = results[:-1], results[-1]
    else:
        measured, whole = measure_until(session.runner, experiments, sensitivity_cache(mode), deadline)
    definitions, higher = session.definitions()
    entries = [
        NodeSensitivity(n.name, n.op_type, n.order, _mean(r, session.metrics), r)
        for n, r in zip(chosen, measured, strict=False)
    ]
    pair = session.pair
    return SensitivityResult(
        fp32_model=pair.fp32_path.name,
        quantized_model=pair.quantized_path.name,
        data=session.dataset.name,
        records=session.records,
        mode=mode,
        granularity=granularity,
        metric_definitions=definitions,
        higher_is_better=higher,
        nodes=rank(entries, session.metrics[0], higher, mode),
        baseline=_mean(whole, session.metrics),
        unremovable=list(qg.unremovable),
        measured_at=list(session.measured_at),
        unmeasured=[n.name for n in chosen[len(measured) :]],
    )


def measure_until(
    runner: ExperimentRunner, experiments: Sequence[Experiment], cache: str, deadline: Deadline
) -> tuple[list[OutputMetrics], OutputMetrics]:
    """The node experiments (all but the last) measured before ``deadline``, in order, and the last
    (the fully quantized model). They run in chunks, each a pass over the records: the first holds
    :data:`FIRST_CHUNK_SHARE` of the nodes and the last experiment, the next ones as many as take
    :data:`CHUNK_SHARE` of the time left at the rate measured so far. A chunk the deadline interrupts
    is dropped; one interrupted before the first chunk ended raises :class:`~.deadline.DeadlineReached`."""
    *nodes, whole = experiments
    began = deadline.clock()
    size = max(1, math.ceil(len(nodes) * FIRST_CHUNK_SHARE))
    first = runner.run([*nodes[:size], whole], cache, deadline)
    measured = first[:-1]
    while len(measured) < len(nodes):
        rate = (deadline.clock() - began) / (len(measured) + 1)  # seconds per experiment so far
        size = max(1, int(CHUNK_SHARE * deadline.left() / max(rate, 1e-9)))
        try:
            measured += runner.run(nodes[len(measured) : len(measured) + size], cache, deadline)
        except DeadlineReached:
            break
    return measured, first[-1]


def _mean(result: OutputMetrics, metrics: Sequence[str]) -> dict[str, float | None]:
    return {m: finite(metric_mean(result, m)) for m in metrics}
