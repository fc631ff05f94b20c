"""Running many partial-quantization experiments on one dataset, reusing work between them.

An experiment is a set of enabled quantization edges (see :mod:`.partial`). Its outputs are
compared with the fp32 model's on every record. Two strategies give the same numbers:

* ``reuse`` (default): per batch, the fp32 model and one *cached configuration* (all edges off, or
  all on) run once, exposing every tensor an experiment reads; each experiment then runs only its
  *dirty* nodes (those whose values differ from the cache), fed with cached tensors. Experiments are
  packed side by side into a few onnxruntime sessions (shared initializers, renamed activations),
  so sessions are built once and each batch costs one run per session.
* ``naive``: per experiment, build the whole partial model, open a session, run every record
  (what peers do; kept as the reference and for ``bench/sensitivity.py``).

Memory: only the current batch's tensors are alive; metric accumulators have fixed-size state.

With a :class:`~.deadline.Deadline`, :meth:`ExperimentRunner.run` checks it before building each
session and before each batch (one record, for a model that does not batch) and raises
:class:`~.deadline.DeadlineReached` once it passed: none of the experiments of that call is measured.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import onnx

from pytest_qaccuracy.analysis.deadline import Deadline, check
from pytest_qaccuracy.analysis.partial import Edge, QdqGraph, dirty_nodes
from pytest_qaccuracy.data.binding import Batch, BoundDataset
from pytest_qaccuracy.data.progress import task
from pytest_qaccuracy.errors import InputError, ModelError
from pytest_qaccuracy.metrics import TensorPair, get_metric
from pytest_qaccuracy.model.graph import node_reads, renamed_node
from pytest_qaccuracy.ort_session import fetch, first_line, make_session
from pytest_qaccuracy.runtime import OrtRunner, RuntimeOptions

if TYPE_CHECKING:
    from pytest_qaccuracy.analysis.reference_cache import ReferenceCache

STRATEGIES = ("reuse", "naive")
#: Upper bound on the nodes packed into one experiment session (onnxruntime session creation grows
#: faster than linearly with graph size, so small packs are cheaper than one big one).
SESSION_NODES = 256
#: Upper bound on the initializer bytes held by the experiment sessions alive at once.
SESSION_BYTES = 1 << 30

OutputMetrics = dict[str, dict[str, float | None]]  # output name -> metric -> value


@dataclass(frozen=True, slots=True)
class Experiment:
    """One partially quantized configuration: ``enabled`` edges are quantized, all others float."""

    label: str
    enabled: frozenset[Edge]


class _Accumulators:
    """Metric accumulators of one experiment, per model output."""

    def __init__(self, outputs: Sequence[str], names: Sequence[str]) -> None:
        self.metrics = {o: {n: get_metric(n)() for n in names} for o in outputs}

    def update(self, output: str, ref: np.ndarray, test: np.ndarray) -> None:
        pair = TensorPair(ref, test)
        for metric in self.metrics[output].values():
            metric.update(pair)

    def results(self) -> OutputMetrics:
        return {o: {n: m.result()[0] for n, m in metrics.items()} for o, metrics in self.metrics.items()}


def _session(model: onnx.ModelProto, options: RuntimeOptions, label: str, threads: int):
    try:
        return make_session(
            model,
            providers=options.providers,
            threads=threads,
            optimization=options.optimization,
            config=options.session_config,
        )
    except Exception as exc:
        raise ModelError(f"{label}: onnxruntime cannot load the experiment model ({first_line(exc)})") from None


@dataclass(slots=True)
class _Packed:
    """Experiments packed into one session: per experiment, output -> fetched name (or cached name)."""

    experiments: list[int]
    nodes: list[onnx.NodeProto]
    inputs: list[str]
    fetch: dict[int, dict[str, tuple[bool, str]]]  # exp -> output -> (from session?, tensor)
    session: object = None
    names: list[str] | None = None


class ExperimentRunner:
    """Runs experiments of one QDQ model against its fp32 model on a bound dataset.

    Args:
        qgraph: the quantized model's edge index.
        fp32: the fp32 model (its outputs are the reference).
        outputs: (fp32 output, quantized output) pairs.
        data: the bound dataset.
        metrics: metric names.
        options: onnxruntime options; experiments run with ``options.optimization``.
        strategy: ``reuse`` or ``naive``.
        reference: the fp32 values of a comparison pass over the same records
            (:class:`~pytest_qaccuracy.analysis.reference_cache.ReferenceCache`); when it covers the
            measured outputs, they come from it (kept, or computed as the comparison computed them)
            instead of from a run of ``fp32`` on its own.
    """

    def __init__(
        self,
        qgraph: QdqGraph,
        fp32: onnx.ModelProto,
        outputs: Sequence[tuple[str, str]],
        data: BoundDataset,
        metrics: Sequence[str],
        options: RuntimeOptions,
        strategy: str = "reuse",
        label: str = "model",
        reference: ReferenceCache | None = None,
    ) -> None:
        if strategy not in STRATEGIES:
            raise InputError(f"unknown strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")
        self.qgraph, self.fp32, self.outputs = qgraph, fp32, list(outputs)
        self.data, self.metrics, self.options, self.strategy, self.label = data, list(metrics), options, strategy, label
        self._fp32_runner: OrtRunner | None = None
        self.reference = reference if reference is not None and reference.covers(self.output_names) else None
        self.sessions_built = 0
        self.rounds = 0
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._deadline: Deadline | None = None

    @property
    def fp32_runner(self) -> OrtRunner:
        if self._fp32_runner is None:
            names = [f for f, _ in self.outputs]
            self._fp32_runner = OrtRunner(self.fp32, names, self.options, f"{self.label} (fp32)")
        return self._fp32_runner

    def reference_values(self, batch: Batch) -> dict[str, np.ndarray]:
        """The fp32 model's outputs on ``batch``: from the comparison's cache when there is one."""
        if self.reference is not None:
            return self.reference.values(batch)
        return self.fp32_runner.run(batch)

    @property
    def output_names(self) -> list[str]:
        """The measured outputs, by their fp32 names (the keys of every experiment's metrics)."""
        return [f for f, _ in self.outputs]

    def run(
        self, experiments: Sequence[Experiment], cache: str = "float", deadline: Deadline | None = None
    ) -> list[OutputMetrics]:
        """Output metrics of every experiment, in order, per fp32 output name; ``cache`` is ``float``
        or ``quantized``. ``deadline``: checked before every session build and batch; raises
        :class:`~.deadline.DeadlineReached` (nothing of this call measured) once it passed."""
        if not experiments:
            return []
        self._deadline = deadline
        try:
            if self.strategy == "naive":
                return self._run_naive(experiments)
            return self._run_reuse(experiments, cache)
        finally:
            self._deadline = None

    # -- naive ----------------------------------------------------------------------------------

    def _run_naive(self, experiments: Sequence[Experiment]) -> list[OutputMetrics]:
        q_names = [q for _, q in self.outputs]
        with task("sensitivity", len(self.data) * (1 + len(experiments))) as advance:
            refs = []
            for batch in self.data.iter_batches(self.options.batch_size):
                check(self._deadline)
                refs.append(self.reference_values(batch))
                advance(len(batch))
            results = []
            for exp in experiments:
                check(self._deadline)
                model = self.qgraph.build(exp.enabled)
                runner = OrtRunner(model, q_names, self.options, f"{self.label} [{exp.label}]")
                self.sessions_built += 1
                acc = _Accumulators(self.output_names, self.metrics)
                for batch, ref in zip(self.data.iter_batches(self.options.batch_size), refs, strict=True):
                    check(self._deadline)
                    test = runner.run(batch)
                    for f, q in self.outputs:
                        acc.update(f, ref[f], test[q])
                    advance(len(batch))
                results.append(acc.results())
        return results

    # -- reuse ----------------------------------------------------------------------------------

    def _plan(self, experiments: Sequence[Experiment], cache_edges: frozenset[Edge]) -> tuple[list[_Packed], set[str]]:
        """Each experiment's dirty nodes, packed into sessions; and the cached tensors they read."""
        qg = self.qgraph
        cached_nodes, _ = qg.wiring(cache_edges)
        constants = {t.name for t in qg.model.graph.initializer} | set(qg.float_weights)
        packs: list[_Packed] = []
        needed: set[str] = set()
        pack = _Packed([], [], [], {})
        for k, exp in enumerate(experiments):
            nodes, outputs = qg.wiring(exp.enabled)
            dirty, boundary = dirty_nodes(nodes, cached_nodes, constants)
            produced = {o for n in dirty for o in n.output if o}
            fetch = {}
            for q, tensor in zip(qg.view.output_names, outputs, strict=True):
                fetch[q] = (True, f"{tensor}@{k}") if tensor in produced else (False, tensor)
                if tensor not in produced:
                    needed.add(tensor)
            if pack.nodes and len(pack.nodes) + len(dirty) > SESSION_NODES:
                packs.append(pack)
                pack = _Packed([], [], [], {})
            pack.experiments.append(k)
            pack.nodes.extend(_renamed(dirty, produced, k))
            pack.inputs.extend(b for b in boundary if b not in pack.inputs)
            pack.fetch[k] = fetch
            needed.update(boundary)
        packs.append(pack)
        return packs, needed

    def _run_reuse(self, experiments: Sequence[Experiment], cache: str) -> list[OutputMetrics]:
        qg = self.qgraph
        cache_edges = frozenset() if cache == "float" else qg.all_edges
        packs, needed = self._plan(experiments, cache_edges)
        inputs = set(qg.view.input_names)
        fetched = [*qg.view.output_names, *sorted(needed - inputs - set(qg.view.output_names))]
        cache_model = qg.build(cache_edges, extra_outputs=fetched)
        cache_runner = OrtRunner(cache_model, fetched, self.options, f"{self.label} (cache)")
        accs = [_Accumulators(self.output_names, self.metrics) for _ in experiments]
        rounds = _rounds(packs, self._initializer_bytes())
        try:
            with task("sensitivity", len(self.data) * len(rounds)) as advance:
                for group in rounds:
                    self.rounds += 1
                    for batch in self.data.iter_batches(self.options.batch_size):
                        # a model that does not batch runs record by record: its tensors may have no
                        # record axis (a Reshape folds the batch away), so they are never split or stacked
                        for unit in cache_runner.units(batch):
                            check(self._deadline)
                            ref = self.reference_values(unit)
                            values = cache_runner.run(unit)
                            values.update(unit.stacked())
                            results = self._run_group(group, values)
                            for pack, fetched in zip(group, results, strict=True):
                                for k in pack.experiments:
                                    for f, q in self.outputs:
                                        from_session, tensor = pack.fetch[k][q]
                                        accs[k].update(f, ref[f], fetched[tensor] if from_session else values[tensor])
                            del ref, values
                        advance(len(batch))
                    for pack in group:  # free the round's sessions before the next round builds its own
                        pack.session = None
        finally:
            self.close()
        return [acc.results() for acc in accs]

    @property
    def workers(self) -> int:
        """Experiment sessions run side by side: ``options.threads`` of them, or one per core."""
        return self.options.threads or os.cpu_count() or 1

    def _run_group(self, group: list[_Packed], values: dict[str, np.ndarray]):
        """Every pack of a group on one batch; independent sessions run in parallel threads (onnxruntime
        releases the GIL), each with one intra-op thread, so all cores work on different experiments."""
        if self.workers == 1 or len(group) == 1:
            return [self._run_pack(pack, values) for pack in group]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="qaccuracy-experiment")
        return list(self._pool.map(lambda pack: self._run_pack(pack, values), group))

    def close(self) -> None:
        """Stop the worker threads (also done when the runner is garbage collected)."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def _initializer_bytes(self) -> dict[str, int]:
        sizes = {t.name: _tensor_bytes(t) for t in self.qgraph.model.graph.initializer}
        sizes.update({name: _tensor_bytes(t) for name, t in self.qgraph.float_weights.items()})
        return sizes

    def _run_pack(self, pack: _Packed, values: dict[str, np.ndarray]):
        if pack.names is None:
            pack.names = sorted({t for fetch in pack.fetch.values() for s, t in fetch.values() if s})
        if not pack.names:  # every experiment of the pack equals the cache
            return {}
        if pack.session is None:
            check(self._deadline)
            names = pack.names
            value_infos = [
                onnx.helper.make_tensor_value_info(
                    name, onnx.helper.np_dtype_to_tensor_dtype(values[name].dtype), [None] * values[name].ndim
                )
                for name in pack.inputs
            ]
            model = self.qgraph.make_model(pack.nodes, value_infos, names)
            threads = 1 if self.workers > 1 else self.options.threads
            pack.session = _session(model, self.options, self.label, threads)
            with self._lock:
                self.sessions_built += 1
        out = self._call(pack, {name: values[name] for name in pack.inputs})
        return dict(zip(pack.names, out, strict=True))

    def _call(self, pack: _Packed, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        try:
            return fetch(pack.session, pack.names, feeds)
        except Exception as exc:
            raise ModelError(f"{self.label}: onnxruntime failed to run an experiment ({first_line(exc)})") from None


def _tensor_bytes(tensor: onnx.TensorProto) -> int:
    count = int(np.prod(tensor.dims)) if tensor.dims else 1
    return count * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize


def _rounds(packs: list[_Packed], sizes: dict[str, int]) -> list[list[_Packed]]:
    """Packs grouped so that one group's sessions hold at most ``SESSION_BYTES`` of initializers.

    Every session keeps its own copy of the initializers it reads; a group's sessions are alive
    together, and each group costs one more pass over the data (fp32 and cache runs included).
    """
    groups: list[list[_Packed]] = [[]]
    total = 0
    for pack in packs:
        if not pack.experiments:
            continue
        used = {name for node in pack.nodes for name in node_reads(node) if name in sizes}
        weight = sum(sizes[name] for name in used)
        if groups[-1] and total + weight > SESSION_BYTES:
            groups.append([])
            total = 0
        groups[-1].append(pack)
        total += weight
    return [g for g in groups if g]


def _renamed(nodes: Sequence[onnx.NodeProto], produced: set[str], k: int) -> list[onnx.NodeProto]:
    """Copies of ``nodes`` whose produced tensors (and node names) carry the suffix ``@k``."""
    names = {name: f"{name}@{k}" for name in produced}
    # an unnamed node stays unnamed: onnxruntime wants node names unique, and "" is not counted
    return [renamed_node(node, names, f"{node.name}@{k}" if node.name else "") for node in nodes]


def metric_mean(per_output: OutputMetrics, metric: str) -> float | None:
    """The mean of a metric over the outputs where it is defined (None if nowhere)."""
    values = [m[metric] for m in per_output.values() if m.get(metric) is not None]
    return float(np.mean(values)) if values else None
