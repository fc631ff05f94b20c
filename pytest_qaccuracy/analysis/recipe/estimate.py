"""Cheap estimates that order the recipe search's experiments (never its answer).

They run on the base recipe's quantized model edited in place (a node in float = its Q/DQ pairs
removed, :mod:`pytest_qaccuracy.analysis.partial`), with the sensitivity analysis' work reuse, on the
first few calibration records: one pass for every node's leave-one-out gain, one for a set of
exclusion prefixes, one for the nodes a passing set may drop. A 16-bit node is estimated as float.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from pytest_qaccuracy.analysis.experiments import Experiment
from pytest_qaccuracy.analysis.recipe.measure import judge
from pytest_qaccuracy.analysis.sensitivity import open_session
from pytest_qaccuracy.analysis.sweep import Target
from pytest_qaccuracy.data import Dataset
from pytest_qaccuracy.model.pair import ModelPair
from pytest_qaccuracy.runtime import RuntimeOptions

#: Experiments per pass over the records, so that a long ranking reports progress between passes.
CHUNK = 64


class Estimator:
    """Estimates on the base model; a context manager (it holds a sensitivity session)."""

    def __init__(
        self,
        fp32: str | os.PathLike[str],
        quantized: str | os.PathLike[str],
        calibration: Dataset | str | os.PathLike[str],
        checks: Sequence[Target],
        options: RuntimeOptions,
        records: int,
        note: Callable[[str], None],
    ) -> None:
        self.checks, self.note = list(checks), note
        metrics = list(dict.fromkeys(c.metric for c in checks))
        pair = ModelPair(str(fp32), str(quantized))
        self.session = open_session(pair, calibration, metrics, options, records=records)
        self.qgraph = self.session.qgraph
        self.label = Path(quantized).name

    def __enter__(self) -> Estimator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.session.close()

    def margins(self, floats: Sequence[Sequence[str]], what: str) -> list[float]:
        """The estimated margin (:func:`~.measure.judge`) with each set of nodes in float."""
        qg, out = self.qgraph, []
        for start in range(0, len(floats), CHUNK):
            chunk = floats[start : start + CHUNK]
            experiments = [
                Experiment(str(i), qg.all_edges - qg.edges_of(names, "node")) for i, names in enumerate(chunk)
            ]
            for metrics in self.session.runner.run(experiments, "quantized"):
                out.append(judge({"estimate": metrics}, self.checks).margin)
            if len(floats) > CHUNK:
                self.note(f"{what}: {min(start + CHUNK, len(floats))}/{len(floats)} estimated")
        return out

    def order(self, nodes: Sequence[str], cost: Callable[[str], float]) -> list[str]:
        """Nodes by estimated gain per cost: leave-one-out margin gain over the base, divided by
        the node's float cost; nodes that gain nothing last, by gain."""
        self.note(f"ranking {len(nodes)} node(s) by leave-one-out gain on {self.session.records} calibration record(s)")
        base, *single = self.margins([[], *([n] for n in nodes)], "ranking")
        gains = {
            n: (m - base if math.isfinite(m) and math.isfinite(base) else 0.0)
            for n, m in zip(nodes, single, strict=True)
        }
        helpful = sorted((n for n in nodes if gains[n] > 0), key=lambda n: -gains[n] / max(cost(n), 1e-9))
        rest = sorted((n for n in nodes if gains[n] <= 0), key=lambda n: -gains[n])
        return helpful + rest

    def prefixes(self, order: Sequence[str], ks: Sequence[int]) -> list[float]:
        return self.margins([order[:k] for k in ks], "prefixes")

    def droppable(self, kept: Sequence[str], cost: Callable[[str], float]) -> list[str]:
        """Nodes of a passing float set whose removal is estimated to still pass, costliest first."""
        margins = self.margins([[m for m in kept if m != n] for n in kept], "pruning")
        return sorted((n for n, m in zip(kept, margins, strict=True) if m >= 0), key=lambda n: -cost(n))


__all__ = ["Estimator"]
