"""Cheap estimates that order the recipe search's experiments (never its answer).

They run on the base recipe's quantized model edited in place (nodes in float = Q/DQ edges removed
as ``quantize_static(nodes_to_exclude=...)`` removes them, :meth:`Estimator.enabled`), as deployed
(onnxruntime's optimizations and integer kernels), on the first few evaluation records: many sets
in one pass of the sensitivity analysis' work-reuse runner (each node's gain alone in float, the
nodes a passing set may drop), one or two sets as whole edited models (the bisection). A 16-bit node
is estimated as float.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from pytest_qaccuracy.analysis.experiments import Experiment
from pytest_qaccuracy.analysis.recipe.checks import Check
from pytest_qaccuracy.analysis.recipe.measure import judge
from pytest_qaccuracy.analysis.sensitivity import open_session
from pytest_qaccuracy.data import Dataset
from pytest_qaccuracy.model.pair import ModelPair
from pytest_qaccuracy.runtime import RuntimeOptions

#: Experiments in the first pass over the records; later passes hold what fits in NOTE_SECONDS, so
#: that a long ranking reports progress (a line per pass) at least twice a minute.
FIRST_CHUNK = 8
MAX_CHUNK = 128
NOTE_SECONDS = 30.0
#: The share of the room left that one pass may fill at the slowest pace so far (the next nodes' pace
#: differs: on the PP-OCRv4 recognizer 0.25 s per node for the first 8, 0.35 s for the next 57; on
#: YOLOv8n, ranked by loss per cost, 0.09 s then 0.25 s as the costly convolutions come).
ROOM_SHARE = 0.5
#: Above this many candidate nodes the ranking is one layer-wise pass instead of one experiment per node.
LEAVE_ONE_OUT_NODES = 64
#: Up to this many sets, estimates run whole edited models instead of the work-reuse runner.
WHOLE_MODELS = 2
#: Nodes of a passing set whose removal is estimated (the costliest).
PRUNE_NODES = 32
#: An input with no measured error (a graph input) counts as this SQNR, in dB.
EXACT_DB = 100.0
#: What ranks nodes when the targets are checks the edited-graph runner cannot compute: the output
#: SQNR (its margin against 100 dB grows with the SQNR).
PROXY = Check("sqnr", EXACT_DB, True)


class Estimator:
    """Estimates on the base model; a context manager (it holds a sensitivity session)."""

    def __init__(
        self,
        fp32: str | os.PathLike[str],
        quantized: str | os.PathLike[str],
        evaluation: Dataset | str | os.PathLike[str],
        checks: Sequence[Check],
        options: RuntimeOptions,
        records: int,
        note: Callable[[str], None],
        measure: Callable[[Any], float] | None = None,
    ) -> None:
        self.checks, self.note = list(checks), note
        # checks the edited-graph runner computes (tensor metrics on every output); the others (top-k,
        # allclose, task values, one output's or view's) are estimated by ``measure`` on the edited
        # model, ranked by the SQNR as a proxy
        self.direct = all(c.kind == "tensor" and c.output is None for c in self.checks) or measure is None
        self.measure = measure
        metrics = list(dict.fromkeys(c.metric for c in checks if c.kind == "tensor" and c.output is None))
        metrics = metrics or [PROXY.metric]
        if not self.direct:
            metrics = list(dict.fromkeys([*metrics, PROXY.metric]))
        pair = ModelPair(str(fp32), str(quantized))
        # as deployed (onnxruntime's graph optimizations and integer kernels), as the answer is measured
        # the first ``records`` evaluation records (those the answer is measured on), not the calibration's
        self.session = open_session(pair, evaluation, metrics, options, capture="deployed", records=records)
        self.options = options
        self.qgraph = self.session.qgraph
        self.label = Path(quantized).name
        self.base: float | None = None  # the base model's estimated margin, once ranked
        self.gains: dict[str, float] = {}  # the nodes' single gains, once ranked

    def enabled(self, floats: Sequence[str]) -> frozenset:
        """The edges still quantized with ``floats`` excluded as ``quantize_static(nodes_to_exclude=...)``
        excludes them: a node's weights go float, but a quantized tensor stays quantized for *every*
        reader (onnxruntime rewires all consumers to its DequantizeLinear) unless every node that asks
        for it (its producer, its quantized readers) is excluded."""
        qg, out = self.qgraph, set(self.qgraph.all_edges)
        floats = set(floats)
        for name in floats:
            out -= qg.node(name).weights
        for edges, owners in self.groups:
            if owners <= floats:
                out -= edges
        return frozenset(out)

    @cached_property
    def groups(self) -> list[tuple[frozenset, frozenset]]:
        """Per quantized activation tensor: its edges, and the nodes that ask for it quantized."""
        qg = self.qgraph
        by_tensor: dict[str, set] = {}
        for edge, tensor in qg.quantized_tensor.items():
            by_tensor.setdefault(tensor, set()).add(edge)
        found = []
        for edges in by_tensor.values():
            owners = frozenset(n.name for n in qg.nodes if (n.inputs | n.outputs) & edges)
            found.append((frozenset(edges), owners))
        return found

    def __enter__(self) -> Estimator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.session.close()

    def margins(
        self,
        floats: Sequence[Sequence[str]],
        what: str,
        proxy: bool = False,
        room: Callable[[], float | None] | None = None,
        enough: Callable[[list[float]], bool] | None = None,
    ) -> list[float]:
        """The estimated margin (:func:`~.measure.judge`) with each set of nodes in float (``proxy``:
        the proxy check's, for ranking); with ``room`` (the seconds estimates may still use, None:
        unbounded), the work-reuse runner's passes hold what fits in half of it at the slowest pace so
        far (short passes cost more per set: the PP-OCRv4 recognizer's ranking in passes of 8 took
        0.39 s per node, in one pass 0.15 s), and the list is as long as what was estimated; it also
        ends after a pass when ``enough(margins so far)``."""
        # one or two sets: whole edited models run as deployed (faster than the partial sessions of
        # the work-reuse runner when most of a large graph changes); many: the runner packs them
        if self.measure is not None and not proxy and (not self.direct or len(floats) <= WHOLE_MODELS):
            qg, out = self.qgraph, []
            for names in floats:
                out.append(self.measure(qg.build(self.enabled(names))))
                if len(floats) > FIRST_CHUNK and len(out) % FIRST_CHUNK == 0:
                    self.note(f"{what}: {len(out)}/{len(floats)} estimated")
            return out
        checks = [PROXY] if proxy else self.checks
        qg, out, size = self.qgraph, [], FIRST_CHUNK
        pace, slowest = None, 0.0
        while len(out) < len(floats):
            left = None if room is None or pace is None else room()
            if left is not None:  # half the room at the slowest pace so far: a slower pass cannot overrun it
                size = min(size, int(ROOM_SHARE * left / max(slowest, 1e-3)))
                if size < 1:
                    self.note(f"{what}: {len(out)}/{len(floats)} estimated, no time left for the others")
                    break
            chunk = floats[len(out) : len(out) + size]
            began = time.monotonic()
            experiments = [Experiment(str(i), self.enabled(names)) for i, names in enumerate(chunk)]
            for metrics in self.session.runner.run(experiments, "quantized"):
                out.append(judge({"estimate": metrics}, checks).margin)
            if len(floats) > FIRST_CHUNK:
                self.note(f"{what}: {len(out)}/{len(floats)} estimated")
            # the next pass holds as many experiments as fit in NOTE_SECONDS at this pass's pace
            pace = (time.monotonic() - began) / len(chunk)
            slowest = max(slowest, pace)
            size = max(1, min(MAX_CHUNK, int(NOTE_SECONDS / max(pace, 1e-3))))
            if enough is not None and enough(out):
                break
        return out

    def order(
        self, nodes: Sequence[str], cost: Callable[[str], float], room: Callable[[], float | None] | None = None
    ) -> list[str]:
        """Nodes by estimated gain per cost, those that gain nothing last (cheapest first).

        The gain of a node is the margin gained with it alone in float (one edited-graph experiment
        per node, the work-reuse runner). Above :data:`LEAVE_ONE_OUT_NODES` nodes, those are the
        nodes that lose the most SQNR between their worst input and their output (one layer-wise
        comparison pass, :func:`.layer_drops`), the others follow by that loss per cost: one
        experiment per node would cost hundreds of forward passes on a large model. Nodes whose
        gain was not estimated in the ``room()`` left (seconds, :meth:`margins`) rank as gaining nothing;
        those chosen by their loss are estimated by that loss per cost, the output's writers first.
        With ``room``, the ranking ends after the pass that finds a node estimated to pass alone.
        """
        records = self.session.records
        drops: dict[str, float] = {}
        chosen = list(nodes)
        if len(nodes) > LEAVE_ONE_OUT_NODES:
            self.note(f"ranking {len(nodes)} node(s) by their SQNR drop, one pass over {records} evaluation record(s)")
            drops = layer_drops(self.session, nodes, self.options)
            # the nodes that write a graph output always: their output pair is the last rounding
            outputs = {o.name for o in self.session.pair.quantized.graph.output}
            last = [n.name for n in self.qgraph.nodes if n.name in set(nodes) and set(self._writes(n)) & outputs]
            chosen = list(dict.fromkeys([*last, *sorted(nodes, key=lambda n: -drops[n])]))[:LEAVE_ONE_OUT_NODES]
            # estimated by SQNR drop per cost (the order's own measure), so that a ranking cut short by
            # the budget has the cheap nodes that matter (YOLOv8n from MSE calibration: /model.22/Mul_5,
            # 30th by drop, 2nd per cost, passes alone)
            chosen = [*last, *sorted(chosen[len(last) :], key=lambda n: -drops[n] / max(cost(n), 1e-9))]
        self.note(f"ranking {len(chosen)} node(s) by the gain of each alone in float on {records} evaluation record(s)")

        # with a time budget, the ranking ends at a node estimated to pass alone: the prefix search's
        # head has its answer, and the time left goes to verifying it
        def passes_alone(margins: list[float]) -> bool:
            return room is not None and self.direct and any(m >= 0 for m in margins[1:])

        base, *single = self.margins(
            [[], *([n] for n in chosen)], "ranking", proxy=not self.direct, room=room, enough=passes_alone
        )
        gains = {  # the nodes estimated before time ran out
            n: (m - base if math.isfinite(m) and math.isfinite(base) else 0.0)
            for n, m in zip(chosen, single, strict=False)
        }
        self.base, self.gains = base, gains  # what the prefix search reads of the order's head
        helpful = sorted((n for n in gains if gains[n] > 0), key=lambda n: -gains[n] / max(cost(n), 1e-9))
        taken = set(helpful)
        # then by SQNR drop per cost; no estimated gain at all: the cheapest first (a prefix pays least)
        rest = sorted(
            (n for n in nodes if n not in taken),
            key=lambda n: (-(drops.get(n, 0.0) / max(cost(n), 1e-9)), cost(n)),
        )
        return helpful + rest

    def _writes(self, node: Any) -> list[str]:
        """The tensors a quantized node's output pairs deliver (its outputs, and their DequantizeLinear's)."""
        view = self.qgraph.view
        own = list(view.nodes[node.index].output)
        delivered = [c.output[0] for t in own for _, c, _ in view.consumers.get(t, []) if c.op_type == "QuantizeLinear"]
        return own + [c.output[0] for t in delivered for _, c, _ in view.consumers.get(t, [])]

    def droppable_margins(self, kept: Sequence[str], nodes: Sequence[str]) -> list[float]:
        """The estimated margin of the float set ``kept`` with each of ``nodes`` quantized again."""
        return self.margins([[m for m in kept if m != n] for n in nodes], "pruning")


def layer_drops(session: Any, nodes: Sequence[str], options: RuntimeOptions) -> dict[str, float]:
    """Per node, the SQNR (dB) lost from its worst activation input to its output: its own share of
    the error, from one layer-wise comparison (QDQ reference semantics) on the session's records."""
    from pytest_qaccuracy.analysis.compare import compare

    result = compare(session.pair, session.dataset, "sqnr", options, capture="reference")
    sqnr = {layer.tensor: layer.metrics.get("sqnr") for layer in result.layers}
    sqnr.update({o.name: o.metrics.get("sqnr") for o in result.outputs})
    fp32 = {n.name: n for n in session.pair.fp32.graph.node if n.name}

    def db(tensor: str) -> float:
        value = sqnr.get(tensor)
        return EXACT_DB if value is None or not math.isfinite(value) else min(float(value), EXACT_DB)

    drops = {}
    for name in nodes:
        node = fp32.get(name)
        if node is None:
            drops[name] = 0.0
            continue
        inputs = [db(t) for t in node.input if t in sqnr]
        before = min(inputs) if inputs else EXACT_DB
        after = min((db(t) for t in node.output if t), default=before)
        drops[name] = max(before - after, 0.0)
    return drops
