"""The recipe search: from an fp32 model to a quantization recipe that meets the targets, verified.

Every step is an *experiment*: onnxruntime's ``quantize_static`` writes the recipe's model from the
fp32 model, and the model is measured on held-out evaluation records on every deployment target
(:mod:`.measure`). A recipe is reported as passing only from such a measurement. Cheap *estimates*
(the sensitivity analysis' edited-graph experiments, :mod:`pytest_qaccuracy.analysis.experiments`,
on a few calibration records) only decide which experiment to run next.

Phases (docs/recipe.md):

1. **global**: the starting recipe, then one global choice changed at a time (per-channel weights,
   7-bit weights, each calibration method, activation and weight types), keeping each change that
   improves the worst check's margin, until a pass changes nothing. These cost nothing, so a passing
   recipe here is optimal.
2. **nodes**, on the best global recipe. With at most ``exhaustive_nodes`` candidate nodes:
   every per-node assignment (int8, int16, float) in increasing cost, verified until one passes:
   the optimum for those global choices. Otherwise: nodes ordered by estimated gain per cost
   (leave-one-out on the edited graph), the shortest estimated-passing prefix in float verified,
   bisected, then pruned (nodes dropped, float nodes narrowed to 16-bit) one verified step at a time.

The search stops when done, at the budget (time or experiments), or at Ctrl-C, and returns the
best recipe found either way: the cheapest passing one, else the one closest to passing.
"""

from __future__ import annotations

import heapq
import math
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pytest_qaccuracy.analysis.recipe.build import RecipeBuilder, check_method, default_methods
from pytest_qaccuracy.analysis.recipe.cost import CostModel, node_work
from pytest_qaccuracy.analysis.recipe.measure import HOST, Evaluator, Measured, judge
from pytest_qaccuracy.analysis.recipe.space import Recipe
from pytest_qaccuracy.analysis.sweep import Target
from pytest_qaccuracy.data import Dataset
from pytest_qaccuracy.errors import InputError, QAccuracyError
from pytest_qaccuracy.runtime import RuntimeOptions

SCHEMA_VERSION = 1
#: The global choices the first phase varies (all by default).
GLOBAL_CHOICES = ("per_channel", "reduce_range", "method", "activation_type", "weight_type")
#: How the search ended.
STOPS = ("done", "budget", "interrupted")


@dataclass(frozen=True, slots=True)
class Budget:
    """At most ``seconds`` of search and at most ``experiments`` experiments (None: unbounded)."""

    seconds: float | None = None
    experiments: int | None = None

    @classmethod
    def parse(cls, text: str) -> Budget:
        """``90s``, ``10m``, ``1h`` (time) or ``40`` (experiments); several joined by commas."""
        seconds = experiments = None
        for part in filter(None, (p.strip() for p in (text or "").split(","))):
            match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smh]?)", part)
            if not match or float(match.group(1)) <= 0:
                raise InputError(f"budget {part!r}: expected a time (90s, 10m, 1h) or a number of experiments (40)")
            value, unit = float(match.group(1)), match.group(2)
            if unit:
                seconds = value * {"s": 1, "m": 60, "h": 3600}[unit]
            elif value != int(value):
                raise InputError(f"budget {part!r}: a number of experiments is a whole number")
            else:
                experiments = int(value)
        return cls(seconds, experiments)

    def __str__(self) -> str:
        parts = [f"{self.seconds:g}s"] if self.seconds is not None else []
        parts += [f"{self.experiments} experiments"] if self.experiments is not None else []
        return ", ".join(parts) or "unbounded"


@dataclass(frozen=True, slots=True)
class Step:
    """One experiment: the recipe, what changed, its cost and its measured metrics on every target.

    ``skipped`` holds the reason when onnxruntime refused the recipe or a target could not run it.
    """

    index: int
    phase: str
    change: str
    recipe: Recipe
    cost: float
    measured: Measured
    passed: bool
    margin: float | None
    seconds: float
    skipped: str | None = None
    estimated: bool = False  # an estimate (the edited model, this host): ranks, never reported as the answer

    def to_dict(self) -> dict[str, Any]:
        return {
            "estimated": self.estimated,
            "index": self.index,
            "phase": self.phase,
            "change": self.change,
            "recipe": self.recipe.to_dict(),
            "cost": self.cost,
            "measured": self.measured,
            "passed": self.passed,
            "margin": self.margin,
            "seconds": self.seconds,
            "skipped": self.skipped,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Step:
        return cls(
            int(data["index"]),
            str(data["phase"]),
            str(data["change"]),
            Recipe.from_dict(data["recipe"]),
            float(data["cost"]),
            {t: {o: dict(m) for o, m in per.items()} for t, per in data["measured"].items()},
            bool(data["passed"]),
            None if data["margin"] is None else float(data["margin"]),
            float(data["seconds"]),
            data.get("skipped"),
            bool(data.get("estimated", False)),
        )


@dataclass(frozen=True, slots=True)
class RecipeResult:
    """The search: every step, the best one, and why it stopped."""

    fp32: str
    calibration: str
    evaluation: str
    records: int
    checks: list[str]
    targets: list[str]
    weights: dict[str, float]
    steps: list[Step]
    best: int | None
    stopped: str
    seconds: float
    note: str = ""
    arguments: dict[str, Any] | None = None  # the best recipe's quantize_static arguments (JSON-able)
    model: str | None = field(default=None, compare=False)  # the best model's file while it exists
    ranges: dict[str, tuple[float, float]] | None = field(default=None, compare=False)  # its calibration

    @property
    def best_step(self) -> Step | None:
        return None if self.best is None else self.steps[self.best]

    @property
    def met(self) -> bool:
        step = self.best_step
        return step is not None and step.passed

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "kind": "recipe",
            "fp32_model": self.fp32,
            "calibration": self.calibration,
            "evaluation": self.evaluation,
            "records": self.records,
            "checks": list(self.checks),
            "targets": list(self.targets),
            "weights": dict(self.weights),
            "met": self.met,
            "best": self.best,
            "stopped": self.stopped,
            "seconds": self.seconds,
            "note": self.note,
            "quantize_static": self.arguments,
            "steps": [s.to_dict() for s in self.steps],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RecipeResult:
        return cls(
            data["fp32_model"],
            data["calibration"],
            data["evaluation"],
            int(data["records"]),
            list(data["checks"]),
            list(data["targets"]),
            dict(data["weights"]),
            [Step.from_dict(s) for s in data["steps"]],
            data["best"],
            data["stopped"],
            float(data["seconds"]),
            data.get("note", ""),
            data.get("quantize_static"),
        )


class _OutOfBudget(Exception):
    pass


def _better(a: Step, b: Step | None) -> bool:
    """Whether ``a`` beats ``b``: passing and cheaper, or (neither passing) a larger margin. An
    estimate never beats anything: only verified steps are answers."""
    if a.estimated:
        return False
    if b is None:
        return a.skipped is None
    if a.skipped is not None:
        return False
    if a.passed != b.passed:
        return a.passed
    if a.passed:
        return (a.cost, -(a.margin or 0.0)) < (b.cost, -(b.margin or 0.0))
    return (a.margin if a.margin is not None else -math.inf) > (b.margin if b.margin is not None else -math.inf)


class RecipeSearch:
    """One search; :meth:`run` returns the :class:`RecipeResult` (see :func:`search_recipe`)."""

    def __init__(
        self,
        fp32: str | os.PathLike[str],
        calibration: Dataset | str | os.PathLike[str],
        evaluation: Dataset | str | os.PathLike[str],
        checks: Sequence[Target],
        targets: Sequence[str],
        workdir: str | os.PathLike[str],
        start: Recipe,
        budget: Budget,
        weights: Mapping[str, float],
        methods: Sequence[str],
        options: RuntimeOptions,
        estimate_records: int,
        exhaustive_nodes: int,
        on_step: Callable[[Step, Step | None], None] | None,
        on_note: Callable[[str], None] | None,
        vary: Sequence[str] = GLOBAL_CHOICES,
    ) -> None:
        self.started = time.monotonic()
        self.fp32, self.calibration, self.evaluation = Path(fp32), calibration, evaluation
        self.checks, self.targets, self.workdir = list(checks), list(targets), Path(workdir)
        self.start, self.budget, self.options = start, budget, options
        self.methods = [check_method(m) for m in methods]
        self.estimate_records, self.exhaustive_nodes = estimate_records, exhaustive_nodes
        self.on_step, self.on_note = on_step, on_note
        unknown = [v for v in vary if v not in GLOBAL_CHOICES]
        if unknown:
            raise InputError(f"cannot vary {unknown[0]!r}; the global choices are {', '.join(GLOBAL_CHOICES)}")
        self.vary = tuple(vary)
        self.builder = RecipeBuilder(self.fp32, calibration, options)
        self.cost = CostModel(node_work(self.builder.model), **weights)
        self.steps: list[Step] = []
        self.best: Step | None = None
        self.seen: dict[Recipe, Step] = {}
        self.estimates: dict[Recipe, Step] = {}
        self.evaluator: Evaluator | None = None

    # -- experiments ---------------------------------------------------------------------------

    def _note(self, text: str) -> None:
        if self.on_note is not None:
            self.on_note(text)

    def _check_budget(self, estimate: bool = False) -> None:
        """Raise when the next experiment (or estimate) would not fit: it is assumed to last as long as
        the longest of its kind so far, so the search stops before the budget, not after. The
        experiment budget counts verified experiments only."""
        elapsed = time.monotonic() - self.started
        expected = max((s.seconds for s in self.steps if s.estimated == estimate), default=0.0)
        if self.budget.seconds is not None and elapsed + expected >= self.budget.seconds:
            raise _OutOfBudget
        verified = sum(not s.estimated for s in self.steps)
        if not estimate and self.budget.experiments is not None and verified >= self.budget.experiments:
            raise _OutOfBudget

    def model_path(self, index: int) -> Path:
        return self.workdir / f"step{index}.onnx"

    def measure(self, recipe: Recipe, phase: str, change: str) -> Step:
        """One verified experiment (or the earlier one of the same recipe)."""
        if recipe in self.seen:
            return self.seen[recipe]
        self._check_budget()
        began, index = time.monotonic(), len(self.steps)
        out = self.model_path(index)
        skipped, verdict = None, None
        try:
            self.builder.write(recipe, out)
            verdict = self.evaluator.measure(out)
        except QAccuracyError as exc:
            skipped = _first_line(exc)
        except Exception as exc:  # onnxruntime refusing a model it wrote, a target that cannot run it
            skipped = f"{type(exc).__name__}: {_first_line(exc)}"
        step = Step(
            index,
            phase,
            change,
            recipe,
            self.cost.relative(recipe),
            {} if verdict is None else verdict.measured,
            verdict is not None and verdict.passed,
            None if verdict is None else verdict.margin,
            time.monotonic() - began,
            skipped,
        )
        self.steps.append(step)
        self.seen[recipe] = step
        previous = self.best
        if _better(step, self.best):
            self.best = step
            if previous is not None:
                self.model_path(previous.index).unlink(missing_ok=True)
        else:
            out.unlink(missing_ok=True)
        if self.on_step is not None:
            self.on_step(step, self.best)
        return step

    def estimate(self, recipe: Recipe, phase: str, change: str, model: Callable[[], Any]) -> Step:
        """One estimate: ``model()`` (an edited model, :mod:`.edit`) measured on this host on the
        evaluation records. A table row marked estimated; it orders the search, it is never the answer."""
        import onnx

        if recipe in self.estimates:
            return self.estimates[recipe]
        self._check_budget(estimate=True)
        began, index = time.monotonic(), len(self.steps)
        path = self.workdir / "estimate.onnx"
        skipped, verdict = None, None
        try:
            onnx.save(model(), str(path))
            verdict = self.evaluator.measure(path, (HOST,))
        except QAccuracyError as exc:
            skipped = _first_line(exc)
        except Exception as exc:  # an edit onnxruntime cannot run: the estimate is skipped, the search goes on
            skipped = f"{type(exc).__name__}: {_first_line(exc)}"
        finally:
            path.unlink(missing_ok=True)
        step = Step(
            index,
            phase,
            change,
            recipe,
            self.cost.relative(recipe),
            {} if verdict is None else verdict.measured,
            verdict is not None and verdict.passed,
            None if verdict is None else verdict.margin,
            time.monotonic() - began,
            skipped,
            estimated=True,
        )
        self.steps.append(step)
        self.estimates[recipe] = step
        if self.on_step is not None:
            self.on_step(step, self.best)
        return step

    # -- the search ------------------------------------------------------------------------------

    def run(self) -> RecipeResult:
        stopped, note = "done", ""
        try:
            self._note("measuring the fp32 model on the evaluation records")
            self.evaluator = Evaluator(self.fp32, self.evaluation, self.checks, self.targets, self.options)
            base = self._global_phase()
            if not (self.best is not None and self.best.passed and self.best.cost == 0):
                self._node_phase(base)
        except _OutOfBudget:
            stopped, note = "budget", f"budget reached ({self.budget})"
        except KeyboardInterrupt:
            stopped, note = "interrupted", "interrupted"
        best = self.best
        arguments = ranges = None
        if best is not None:
            arguments = best.recipe.arguments(self.builder.reads, None)
            ranges = dict(self.builder.ranges(best.recipe).ranges)
        return RecipeResult(
            self.fp32.name,
            _name(self.calibration),
            _name(self.evaluation),
            0 if self.evaluator is None else self.evaluator.records,
            [str(c) for c in self.checks],
            list(self.targets),
            {"int16": self.cost.int16, "float": self.cost.float},
            list(self.steps),
            None if best is None else best.index,
            stopped,
            time.monotonic() - self.started,
            note,
            arguments,
            None if best is None else str(self.model_path(best.index)),
            ranges,
        )

    def _global_phase(self) -> Recipe:
        """Start (verified), then single global changes while one improves, each *estimated* on the
        start's model edited in place (:class:`~.edit.GlobalEdits`); the best estimated global recipe
        is then verified. Returns the better verified global recipe (the node phase's base)."""
        import onnx

        from pytest_qaccuracy.analysis.recipe.edit import GlobalEdits

        first = self.measure(self.start, "start", "starting recipe")
        if first.passed or first.skipped is not None or not any(self.vary):
            return self.start
        edits = GlobalEdits(
            onnx.load(str(self.model_path(first.index))),
            self.start,
            self.builder.model,
            self.builder.ranges(self.start).ranges,
        )
        host = judge({HOST: first.measured[HOST]}, self.checks).margin if HOST in first.measured else None
        if host is None:
            host = self._estimate_global(edits, self.start, "starting recipe").margin
        current, margin = self.start, host if host is not None else -math.inf
        tried = {("per_channel", self.start.per_channel), ("reduce_range", self.start.reduce_range)}
        tried |= {("method", self.start.method), ("activation_type", self.start.activation_type)}
        tried.add(("weight_type", self.start.weight_type))
        improved = True
        while improved and margin < 0:
            improved = False
            for change, recipe in self._global_moves(current):
                dimension, _, value = change.partition("=")
                if dimension not in self.vary or (dimension, _parsed(value)) in tried:
                    continue  # each value of a global choice is tried once, on the best recipe of its time
                tried.add((dimension, _parsed(value)))
                step = self._estimate_global(edits, recipe, change)
                if step.skipped is None and step.margin is not None and step.margin > margin:
                    current, margin, improved = recipe, step.margin, True
                    break  # the next moves start from the improved recipe
        if current == self.start:
            return self.start
        verified = self.measure(current, "global", current.changes_from(self.start))
        return verified.recipe if _better(verified, first) else self.start

    def _estimate_global(self, edits: Any, recipe: Recipe, change: str) -> Step:
        return self.estimate(
            recipe, "global", change, lambda: edits.model(recipe, self.builder.estimated_ranges(recipe))
        )

    def _global_moves(self, recipe: Recipe) -> Iterator[tuple[str, Recipe]]:
        flip = {"uint8": "int8", "int8": "uint8"}
        yield f"per_channel={not recipe.per_channel}", replace(recipe, per_channel=not recipe.per_channel)
        yield f"reduce_range={not recipe.reduce_range}", replace(recipe, reduce_range=not recipe.reduce_range)
        for method in self.methods:
            if method != recipe.method:
                yield f"method={method}", replace(recipe, method=method)
        activation = flip[recipe.activation_type]
        yield f"activation_type={activation}", replace(recipe, activation_type=activation)
        weight = flip[recipe.weight_type]
        yield f"weight_type={weight}", replace(recipe, weight_type=weight)

    def _candidates(self, base: Recipe) -> list[str]:
        """Nodes the base recipe's model quantizes (and that the fp32 model names)."""
        from pytest_qaccuracy.analysis.partial import QdqGraph
        from pytest_qaccuracy.model.loading import load_model

        step = self.seen[base]
        path = self.model_path(step.index)
        if not path.exists():  # not kept: write it again (same recipe, same model)
            self.builder.write(base, path)
        graph = QdqGraph(load_model(path), None, path.name)
        names = set(self.cost.work)
        return [n.name for n in graph.nodes if n.name in names]

    def _node_phase(self, base: Recipe) -> None:
        nodes = self._candidates(base)
        if not nodes:
            return
        levels = ["int8", "float"] if self.cost.int16 >= self.cost.float else ["int8", "int16", "float"]
        if len(nodes) <= self.exhaustive_nodes:
            self._note(f"{len(nodes)} candidate node(s): every assignment of {'/'.join(levels)} in order of cost")
            self._exhaustive(base, nodes, levels)
        else:
            self._guided(base, nodes, "int16" in levels)

    def _exhaustive(self, base: Recipe, nodes: list[str], levels: list[str]) -> None:
        """Assignments in increasing cost, each verified, until one passes: the optimum."""
        for assignment in cost_ordered(nodes, levels, self.cost):
            recipe = base.with_nodes(dict(zip(nodes, assignment, strict=True)))
            step = self.measure(recipe, "exhaustive", recipe.changes_from(base))
            if step.passed:
                return

    def _guided(self, base: Recipe, nodes: list[str], widen: bool) -> None:
        from pytest_qaccuracy.analysis.recipe.estimate import Estimator

        float_cost = lambda n: self.cost.node(n, "float")  # noqa: E731
        with Estimator(
            self.fp32,
            self.model_path(self.seen[base].index),
            self.evaluation,
            self.checks,
            self.options,
            self.estimate_records,
            self._note,
        ) as estimator:
            order = estimator.order(nodes, float_cost)
            ks = _geometric(len(order))
            self._note(f"estimating {len(ks)} exclusion prefixes on the edited graph")
            estimates = estimator.prefixes(order, ks)
            k = self._estimated_boundary(estimator, order, ks, estimates)
            passing = None
            for size in [k, *(s for s in ks if s > k)]:  # verified: the estimated boundary, then longer
                step = self.measure(base.with_nodes({n: "float" for n in order[:size]}), "nodes", f"float: top {size}")
                if step.passed:
                    passing = step
                    break
            if passing is None:
                return
            kept = list(passing.recipe.float)
            self._note(f"pruning {len(kept)} float node(s): estimating which can be quantized again")
            drops = estimator.droppable(kept, float_cost)
            if drops:
                # the drops taken together, costliest first: the longest run still estimated to pass
                margins = estimator.margins(
                    [[n for n in kept if n not in set(drops[:j])] for j in range(1, len(drops) + 1)], "pruning"
                )
                count = max((j + 1 for j, m in enumerate(margins) if m >= 0), default=0)
                while count > 0:
                    recipe = passing.recipe.with_nodes(
                        {n: "float" for n in kept if n not in set(drops[:count])}
                        | {n: "int16" for n in passing.recipe.int16}
                    )
                    if self.measure(recipe, "prune", f"float -{_names(drops[:count])}").passed:
                        break
                    count //= 2
        if widen and self.best is not None and self.best.passed and self.best.recipe.float:
            # 16-bit instead of float: all of them, else the costliest half (each one verified experiment)
            floats = sorted(self.best.recipe.float, key=lambda n: -float_cost(n))
            for part in (floats, floats[: len(floats) // 2]):
                if not part:
                    break
                current = self.best.recipe
                recipe = current.with_nodes(
                    {n: "float" for n in current.float if n not in part} | {n: "int16" for n in [*current.int16, *part]}
                )
                if self.measure(recipe, "widen", f"float -> int16: {_names(part)}").passed:
                    break

    def _estimated_boundary(self, estimator: Any, order: list[str], ks: list[int], estimates: list[float]) -> int:
        """The shortest prefix of ``order`` estimated to pass: bisected on estimates between the
        geometric prefixes around the first one estimated to pass (all of them when none is)."""
        first = next((i for i, m in enumerate(estimates) if m >= 0), None)
        if first is None:
            return ks[-1]
        low, high = (ks[first - 1] if first > 0 else 0), ks[first]
        while high - low > 1:
            self._check_budget(estimate=True)
            mid = (low + high) // 2
            if estimator.margins([order[:mid]], "bisecting")[0] >= 0:
                high = mid
            else:
                low = mid
        self._note(f"estimated boundary: the top {high} node(s) in float")
        return high


def cost_ordered(nodes: Sequence[str], levels: Sequence[str], cost: CostModel) -> Iterator[tuple[str, ...]]:
    """Every assignment of ``levels`` to ``nodes`` in nondecreasing cost (ties: fewer wide nodes,
    then lexicographic), lazily: a heap over assignments, each raised one level at one node."""
    rank = {level: i for i, level in enumerate(levels)}
    start = tuple(levels[0] for _ in nodes)

    def key(assignment: tuple[str, ...]) -> tuple[float, int, tuple[int, ...]]:
        total = sum(cost.node(n, p) for n, p in zip(nodes, assignment, strict=True))
        return (round(total, 9), sum(p != levels[0] for p in assignment), tuple(rank[p] for p in assignment))

    heap, seen = [(key(start), start)], {start}
    while heap:
        _, assignment = heapq.heappop(heap)
        yield assignment
        for i, level in enumerate(assignment):
            if rank[level] + 1 < len(levels):
                raised = (*assignment[:i], levels[rank[level] + 1], *assignment[i + 1 :])
                if raised not in seen:
                    seen.add(raised)
                    heapq.heappush(heap, (key(raised), raised))


def _parsed(value: str) -> str | bool:
    return {"True": True, "False": False}.get(value, value)


def _geometric(count: int) -> list[int]:
    ks, k = [], 1
    while k < count:
        ks.append(k)
        k *= 2
    return [*ks, count]


def _names(names: Sequence[str], shown: int = 3) -> str:
    more = len(names) - shown
    return ",".join(names[:shown]) + (f" (+{more} more)" if more > 0 else "")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def _name(data: Any) -> str:
    return getattr(data, "name", None) or Path(str(data)).name


def search_recipe(
    fp32: str | os.PathLike[str],
    calibration: Dataset | str | os.PathLike[str],
    evaluation: Dataset | str | os.PathLike[str],
    checks: Sequence[Target],
    targets: Sequence[str] = (HOST,),
    workdir: str | os.PathLike[str] | None = None,
    start: Recipe | None = None,
    budget: Budget | None = None,
    weights: Mapping[str, float] | None = None,
    methods: Sequence[str] | None = None,
    options: RuntimeOptions | None = None,
    estimate_records: int = 4,
    exhaustive_nodes: int = 16,
    on_step: Callable[[Step, Step | None], None] | None = None,
    on_note: Callable[[str], None] | None = None,
    model_out: str | os.PathLike[str] | None = None,
    vary: Sequence[str] = GLOBAL_CHOICES,
) -> RecipeResult:
    """Search a recipe of ``fp32`` that meets ``checks`` on ``evaluation`` on every target.

    Args:
        fp32: the fp32 ONNX model (not quantized).
        calibration: the records ranges are computed on (and estimates run on).
        evaluation: held-out records every experiment is measured on.
        checks: targets such as ``Target.parse("cosine>=0.99")`` (:func:`.measure.parse_checks`).
        targets: deployment targets: ``onnxruntime`` (this host) and scheme presets.
        workdir: where experiment models are written (a temporary folder, removed at the end,
            when None).
        start: the starting recipe (default: MinMax, uint8 activations, int8 per-tensor weights).
        budget: time and experiments (default: unbounded).
        weights: cost weights ``{"int16": 0.5, "float": 1.0}`` (:mod:`.cost`).
        methods: calibration methods the search tries (default: every method).
        options: onnxruntime options.
        estimate_records: calibration records the estimates run on.
        exhaustive_nodes: at most this many candidate nodes: the exhaustive, optimal node phase.
        on_step: called after every experiment with the step and the best so far.
        on_note: called with a line before a long phase (progress).
        model_out: write the best recipe's model here (atomically), passing or not.
        vary: the global choices the first phase may change (:data:`GLOBAL_CHOICES`; ``()``: keep
            ``start``'s and search nodes only).

    Returns:
        A :class:`RecipeResult`; ``result.met`` says whether the best recipe passes.
    """
    from pytest_qaccuracy.analysis.recipe.build import check_onnxruntime

    check_onnxruntime()
    from pytest_qaccuracy.model.graph import GraphView
    from pytest_qaccuracy.model.loading import load_model
    from pytest_qaccuracy.model.quant_params import detect_format

    proto = load_model(fp32)
    kind = detect_format(GraphView(proto))
    if kind != "float":
        raise InputError(f"{fp32}: a {kind} model is already quantized; the recipe search needs the fp32 model")
    start = start or Recipe()
    check_method(start.method)
    tmp = None
    if workdir is None:
        import tempfile

        tmp = tempfile.mkdtemp(prefix="qaccuracy-recipe-")
    search = RecipeSearch(
        fp32,
        calibration,
        evaluation,
        checks,
        targets,
        workdir or tmp,
        start,
        budget or Budget(),
        {"int16": 0.5, "float": 1.0, **(weights or {})},
        default_methods() if methods is None else methods,
        options or RuntimeOptions(),
        estimate_records,
        exhaustive_nodes,
        on_step,
        on_note,
        vary,
    )
    try:
        result = search.run()
        if model_out is not None and result.model is not None:
            from pytest_qaccuracy.atomic import atomic_write

            payload = Path(result.model).read_bytes()
            atomic_write(Path(model_out), lambda handle: handle.write(payload), mode="wb")
            result = replace(result, model=str(model_out))
        return result
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


__all__ = [
    "GLOBAL_CHOICES",
    "STOPS",
    "Budget",
    "RecipeResult",
    "RecipeSearch",
    "Step",
    "cost_ordered",
    "judge",
    "search_recipe",
]
