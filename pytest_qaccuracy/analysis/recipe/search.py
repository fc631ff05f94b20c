"""The recipe search: from an fp32 model to a quantization recipe that meets the targets, verified.

A verified step is an *experiment*: onnxruntime's ``quantize_static`` writes the recipe's model from
the fp32 model, and the model is measured on held-out evaluation records on every deployment target
(:mod:`.measure`). A recipe is reported as passing only from such a measurement. Cheap *estimates*
(a QDQ model onnxruntime wrote, edited for other global choices, :mod:`.edit`, or with nodes
excluded, :mod:`.estimate`, run on this host on the evaluation records) only decide which
experiment to run next.

Phases (docs/recipe.md):

1. **global**: the starting recipe (verified), then one global choice changed at a time (per-channel
   weights, 7-bit weights, each calibration method, activation and weight types), each estimated,
   keeping each change that improves the worst check's margin, until a pass changes nothing; the
   methods that need a histogram pass after the others, cheapest first, with a floor in a time
   budget (:data:`STATISTICS_SHARE`). These cost nothing, so a verified pass here is optimal.
2. **nodes**. With at most ``exhaustive_nodes`` candidate nodes: every per-node assignment (int8,
   int16, float) in increasing cost and, for each, every global recipe of the space (the product of
   the varied choices, best estimated first), verified until one passes: the joint optimum.
   Otherwise, on the best global recipe: nodes ordered by estimated gain per cost, the
   shortest prefix in float estimated to pass (bisected on estimates) verified, longer ones after a
   verified miss; then pruned and widened (float nodes narrowed to 16-bit), each verified.

The search stops when done, at the budget (time or experiments), or at Ctrl-C, and returns the
best recipe found either way: the cheapest passing one, else the one closest to passing.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import itertools
import math
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from pytest_qaccuracy.analysis.recipe.build import (
    RecipeBuilder,
    check_method,
    default_methods,
    method_rank,
)
from pytest_qaccuracy.analysis.recipe.checks import Check, parse_checks
from pytest_qaccuracy.analysis.recipe.cost import DEFAULT_WEIGHTS, CostModel, node_work
from pytest_qaccuracy.analysis.recipe.measure import HOST, Evaluator, Measured, judge
from pytest_qaccuracy.analysis.recipe.space import OTHER_TYPE, REFUSED, WEIGHT_MOVES, Recipe, refusal
from pytest_qaccuracy.data import Dataset
from pytest_qaccuracy.errors import InputError, QAccuracyError
from pytest_qaccuracy.plain import Plain, plain_field
from pytest_qaccuracy.runtime import RuntimeOptions

SCHEMA_VERSION = 1
#: The global choices the first phase varies (all by default).
GLOBAL_CHOICES = ("per_channel", "reduce_range", "method", "activation_type", "weight_type")
#: The per-node choice that costs nothing: a node's weight per channel or per tensor, against the global
#: ``per_channel`` (``vary`` names it with the global choices; the node phase tries it first).
NODE_WEIGHTS = "node_weights"
#: What a search varies by default: every global choice and the per-node weight granularity.
VARY = (*GLOBAL_CHOICES, NODE_WEIGHTS)
#: The global choices in :class:`~.space.Recipe`'s field order.
_GLOBAL_FIELDS = ("method", "per_channel", "reduce_range", "activation_type", "weight_type")
#: How the search ended.
STOPS = ("done", "budget", "interrupted")
#: The share of a time budget the global phase's estimates may use (the node phase needs the rest);
#: the time its histogram passes take is added to it (statistics are an investment, not an estimate).
GLOBAL_SHARE = 0.3
#: The floor of the first histogram method: its statistics may start while they are expected to end
#: within this share of a time budget, whatever the estimates before them took (a model whose
#: comparison is quick leaves the global phase a few seconds, less than one histogram pass).
STATISTICS_SHARE = 0.5
#: Verified prefixes of the node order before the search keeps every candidate in float.
RETRIES = 3
#: What the node phase keeps for the experiment after its estimates, in longest experiments so far
#: (an estimate pass and the experiment's own time vary from one to the next on a loaded host).
EXPERIMENT_SLACK = 1.25
#: Estimates (the longest so far) the node ranking leaves for the prefix search: the whole order in
#: float, the order's head, a bisection step.
PREFIX_RESERVE = 3
#: A widening experiment (16-bit activations: onnxruntime writes an opset-21 model) in longest
#: experiments so far (the PP-OCRv4 recognizer: 6.5 s against 4.0 s, and 17 s against 15 s).
WIDEN_EXPERIMENTS = 2.0
#: Candidate nodes (the costliest) whose weight granularity the node phase tries flipping, one estimate each.
FLIP_NODES = 16
#: The share of a time budget the per-node weight moves' estimates may use (flips first, then 7-bit,
#: then the other type): unbounded, three passes over 16 nodes took the node phase's time on the
#: PP-OCRv4 recognizer (10x: no recipe met, where flips alone met at cost 0.993).
WEIGHTS_SHARE = 0.2
#: Prefix lengths (past the last one known to miss) estimated before the node order is bisected.
SHORT_PREFIXES = (1, 2, 4, 8)


@dataclass(frozen=True, slots=True)
class Budget:
    """At most ``seconds`` of search and at most ``experiments`` experiments (None: unbounded)."""

    seconds: float | None = None
    experiments: int | None = None

    @classmethod
    def parse(cls, text: str) -> Budget:
        """``90s``, ``10m``, ``1h`` (time) or ``40`` (experiments); one of each joined by a comma."""
        seconds = experiments = None
        for part in filter(None, (p.strip() for p in (text or "").split(","))):
            match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smh]?)", part)
            if not match or float(match.group(1)) <= 0:
                raise InputError(f"budget {part!r}: expected a time (90s, 10m, 1h) or a number of experiments (40)")
            value, unit = float(match.group(1)), match.group(2)
            if (seconds if unit else experiments) is not None:
                kind = "time" if unit else "number of experiments"
                raise InputError(f"budget {text!r}: at most one {kind} (10m,40 for both)")
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
class Step(Plain):
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
    margin: float | None = plain_field(load=float)
    seconds: float
    skipped: str | None = None
    # an estimate (the edited model, this host): ranks, never reported as the answer
    estimated: bool = plain_field(False, first=True)


@dataclass(frozen=True, slots=True)
class RecipeResult:
    """The search: every step, the best one, and why it stopped."""

    fp32: str
    calibration: str
    evaluation: str
    records: int
    checks: list[Check]  # in the JSON as their text (``checks``) and their fields (``check_fields``)
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
    convert_opset: int | None = None  # the opset the fp32 model is converted to before quantize_static
    held_out: bool = True  # False: the evaluation records are the calibration records (the same file)

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
            "held_out": self.held_out,
            "records": self.records,
            "checks": [str(c) for c in self.checks],
            "check_fields": [asdict(c) for c in self.checks],
            "targets": list(self.targets),
            "weights": dict(self.weights),
            "met": self.met,
            "best": self.best,
            "stopped": self.stopped,
            "seconds": self.seconds,
            "note": self.note,
            "quantize_static": self.arguments,
            "convert_opset": self.convert_opset,
            "steps": [s.to_dict() for s in self.steps],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RecipeResult:
        return cls(
            data["fp32_model"],
            data["calibration"],
            data["evaluation"],
            int(data["records"]),
            [Check(**c) for c in data["check_fields"]],
            list(data["targets"]),
            dict(data["weights"]),
            [Step.from_dict(s) for s in data["steps"]],
            data["best"],
            data["stopped"],
            float(data["seconds"]),
            data.get("note", ""),
            data.get("quantize_static"),
            convert_opset=data.get("convert_opset"),
            held_out=bool(data.get("held_out", True)),
        )


class _OutOfBudget(Exception):
    pass


class _Refused(Exception):
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
        checks: Sequence[Check],
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
        vary: Sequence[str] = VARY,
        tasks: Sequence[Any] = (),
        task_targets: Sequence[Any] | None = None,
    ) -> None:
        self.started = time.monotonic()
        self.fp32, self.calibration, self.evaluation = Path(fp32), calibration, evaluation
        self.checks, self.targets, self.workdir = list(checks), list(targets), Path(workdir)
        self.tasks, self.task_targets = list(tasks), task_targets
        self.start, self.budget, self.options = start, budget, options
        self.methods = [check_method(m) for m in methods]
        self.estimate_records, self.exhaustive_nodes = estimate_records, exhaustive_nodes
        self.on_step, self.on_note = on_step, on_note
        unknown = [v for v in vary if v not in VARY]
        if unknown:
            raise InputError(f"cannot vary {unknown[0]!r}; the choices are {', '.join(VARY)}")
        self.vary = tuple(vary)
        self.builder = RecipeBuilder(self.fp32, calibration, options)
        self.cost = CostModel(node_work(self.builder.model), **weights)
        self.steps: list[Step] = []
        self.best: Step | None = None
        self.seen: dict[Recipe, Step] = {}
        self.verdicts: dict[str, Any] = {}  # a written model's digest -> its measurement (equal models: one)
        self.estimates: dict[Recipe, Step] = {}
        self.global_rows: dict[tuple[Any, ...], Step] = {}  # global choices (ranges as estimated) -> their estimate
        #: (method, activation type) -> its estimated ranges, sorted (equal ranges: the same edited model)
        self.fingerprints: dict[tuple[str, str], tuple[Any, ...]] = {}
        self.base_models: dict[Recipe, Path] = {}
        self.statistics_seconds = 0.0  # the global phase's histogram passes (not counted in its share)
        self.extended = False  # a histogram method improved the global phase's margin: its share grows
        self.evaluator: Evaluator | None = None
        self.edits: Any = None  # the start's model, edited for other global choices (.edit.GlobalEdits)

    # -- experiments ---------------------------------------------------------------------------

    def _note(self, text: str) -> None:
        if self.on_note is not None:
            self.on_note(text)

    def _longest(self, estimated: bool) -> float:
        """The longest estimate (or verified experiment) so far, in seconds: what the next one is
        assumed to take."""
        return max((s.seconds for s in self.steps if s.estimated == estimated), default=0.0)

    def _check_budget(self, estimate: bool = False, recipe: Recipe | None = None) -> None:
        """Raise when the next experiment (or estimate) would not fit: it is assumed to last as long as
        the longest of its kind so far (an experiment of ``recipe``: plus onnxruntime's calibrator
        when it names one not run yet), so the search stops before the budget, not after. The
        experiment budget counts verified experiments only."""
        elapsed = time.monotonic() - self.started
        expected = self._longest(estimate)
        if recipe is not None and self.steps:  # (step 0 always runs)
            expected += self.builder.write_seconds(recipe)
        if self.budget.seconds is not None and elapsed + expected >= self.budget.seconds:
            raise _OutOfBudget
        verified = sum(not s.estimated for s in self.steps)
        if not estimate and self.budget.experiments is not None and verified >= self.budget.experiments:
            raise _OutOfBudget

    def _estimates_left(self) -> float | None:
        """The seconds estimates may still use (None: unbounded): the budget left less one experiment
        (the longest so far), so that the node phase stops estimating in time to verify what it found."""
        if self.budget.seconds is None:
            return None
        experiment = self._longest(False)
        return self.budget.seconds - (time.monotonic() - self.started) - EXPERIMENT_SLACK * experiment

    def _ranking_left(self) -> float | None:
        """The seconds the node ranking may still use: :meth:`_estimates_left` less
        :data:`PREFIX_RESERVE` estimates (the longest so far), kept for the prefix search after it,
        and one experiment more: when the prefix found misses, every node in float (the pass the
        search can always verify)."""
        left = self._estimates_left()
        if left is None:
            return None
        estimate = self._longest(True)
        experiment = self._longest(False)
        return left - PREFIX_RESERVE * estimate - experiment

    def _room_for(self, experiments: float) -> bool:
        """Whether ``experiments`` times the longest experiment so far fit in the time budget left."""
        if self.budget.seconds is None:
            return True
        longest = self._longest(False)
        return time.monotonic() - self.started + experiments * longest < self.budget.seconds

    def _room_for_estimate(self) -> bool:
        """Whether one more estimate (the longest so far) fits in :meth:`_estimates_left`."""
        left = self._estimates_left()
        return left is None or left > self._longest(True)

    def model_path(self, index: int) -> Path:
        return self.workdir / f"step{index}.onnx"

    def measure(self, recipe: Recipe, phase: str, change: str) -> Step:
        """One verified experiment (or the earlier one of the same recipe)."""
        if recipe in self.seen:
            return self.seen[recipe]
        self._check_budget(recipe=recipe)
        began, index = time.monotonic(), len(self.steps)
        out = self.model_path(index)
        skipped, verdict = None, None
        try:
            self.builder.write(recipe, out)
            digest = hashlib.sha256(out.read_bytes()).hexdigest()  # another recipe, the same model
            verdict = self.verdicts.get(digest) or self.evaluator.measure(out)
            self.verdicts[digest] = verdict
        except QAccuracyError as exc:
            skipped = _first_line(exc)
        except Exception as exc:  # onnxruntime refusing a model it wrote, a target that cannot run it
            skipped = f"{type(exc).__name__}: {_first_line(exc)}"
        step = self._step(index, phase, change, recipe, verdict, began, skipped)
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

    def _step(
        self,
        index: int,
        phase: str,
        change: str,
        recipe: Recipe,
        verdict: Any,
        began: float,
        skipped: str | None,
        estimated: bool = False,
    ) -> Step:
        """The table row of one experiment or estimate (``verdict`` None when it was skipped)."""
        return Step(
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
            estimated=estimated,
        )

    def estimate(self, recipe: Recipe, phase: str, change: str, model: Callable[[], Any]) -> Step:
        """One estimate: ``model()`` (an edited model, :mod:`.edit`) measured on this host on the
        evaluation records. A table row marked estimated; it orders the search, it is never the answer."""
        import onnx

        if recipe in self.estimates:
            return self.estimates[recipe]
        self._check_budget(estimate=True)
        began, index = time.monotonic(), len(self.steps)
        path = self.workdir / "estimate.onnx"
        skipped, verdict = refusal(recipe), None
        try:
            if skipped is not None:
                raise _Refused
            onnx.save(model(), str(path))
            verdict = self.evaluator.measure(path, (HOST,))
        except _Refused:
            pass
        except QAccuracyError as exc:
            skipped = _first_line(exc)
        except Exception as exc:  # an edit onnxruntime cannot run: the estimate is skipped, the search goes on
            skipped = f"{type(exc).__name__}: {_first_line(exc)}"
        finally:
            path.unlink(missing_ok=True)
        step = self._step(index, phase, change, recipe, verdict, began, skipped, estimated=True)
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
            self.evaluator = Evaluator(
                self.fp32, self.evaluation, self.checks, self.targets, self.options, self.tasks, self.task_targets
            )
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
            arguments = best.recipe.arguments(self.builder.reads, None, self.builder.weights)
            ranges = dict(self.builder.ranges(best.recipe).ranges)
        return RecipeResult(
            self.fp32.name,
            _name(self.calibration),
            _name(self.evaluation),
            0 if self.evaluator is None else self.evaluator.records,
            list(self.checks),
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
            convert_opset=None if best is None else self.builder.convert_opset(best.recipe),
            held_out=held_out(self.calibration, self.evaluation),
        )

    def _global_phase(self) -> Recipe:
        """Start (verified), then single global changes while one improves, each *estimated* on the
        start's model edited in place (:class:`~.edit.GlobalEdits`), within :data:`GLOBAL_SHARE` of a
        time budget. A recipe estimated to pass is verified (the answer at cost 0 when it passes).
        Returns the node phase's base: the best estimated global recipe (its edited model kept in
        :attr:`base_models`), or the start."""
        import onnx

        from pytest_qaccuracy.analysis.recipe.edit import GlobalEdits

        first = self.measure(self.start, "start", "starting recipe")
        if first.passed or first.skipped is not None or not any(v in GLOBAL_CHOICES for v in self.vary):
            return self.start
        edits = self.edits = GlobalEdits(
            onnx.load(str(self.model_path(first.index))),
            self.start,
            self.builder.model,
            self.builder.ranges(self.start).ranges,
        )
        host = judge({HOST: first.measured[HOST]}, self.checks).margin if HOST in first.measured else None
        if host is not None:  # the start's own model is what an estimate of its choices would run
            self.global_rows[self._row_key(self.start)] = replace(
                first, measured={HOST: first.measured[HOST]}, passed=host >= 0, margin=host, estimated=True
            )
        if host is None:
            host = self._estimate_global(edits, self.start, "starting recipe").margin
        current, margin = self.start, host if host is not None else -math.inf
        # coordinate descent on the moves whose statistics exist; then the cheapest method that needs a
        # histogram pass (within the floor even when the descent spent the phase's share), and the
        # descent again from it when it improves
        tried = {self.start}
        values = {(dimension, getattr(self.start, dimension)) for dimension in GLOBAL_CHOICES}
        while margin < 0:
            current, margin = self._descend(edits, current, margin, tried, values)
            if margin >= 0:
                break
            pending = sorted(
                (
                    (self.builder.expected_seconds(recipe), change, recipe)
                    for change, recipe in self._global_moves(current)
                    if "method" in self.vary and recipe not in tried and self.builder.needs(recipe) is not None
                ),
                key=lambda move: move[0],
            )
            if not pending:
                break
            expected, change, recipe = pending[0]
            if not self._global_fits(recipe):
                self._note(
                    f"global phase: {change} not estimated: its histograms (expected {expected:.1f}s) "
                    "would not end within the phase's share of the budget"
                )
                break
            tried.add(recipe)
            values.add(("method", recipe.method))
            self._statistics(recipe)
            step = self._estimate_global(edits, recipe, change)
            if step.skipped is None and step.margin is not None and step.margin > margin:
                current, margin, self.extended = recipe, step.margin, True  # the others decided again on it
        if current == self.start:
            return self.start
        if margin >= 0:  # estimated to pass at cost 0: verified, it is the answer
            verified = self.measure(current, "global", current.changes_from(self.start))
            if verified.passed or not _better(verified, first):
                return current if verified.skipped is None and _better(verified, first) else self.start
        # the node phase starts from the best estimated global recipe, on its edited model (equal to
        # what quantize_static writes up to rounding, docs/recipe.md); its answers are verified
        path = self.workdir / "global.onnx"
        onnx.save(edits.model(current, self.builder.estimated_ranges(current)), str(path))
        self.base_models[current] = path
        return current

    def _descend(
        self, edits: Any, current: Recipe, margin: float, tried: set[Recipe], values: set[tuple[str, Any]]
    ) -> tuple[Recipe, float]:
        """Coordinate descent over the global moves whose statistics exist: first each value of each
        choice once, on the best recipe of its time; when a pass over the moves changes nothing, every
        choice again from the best recipe; each global recipe estimated once (``tried``, ``values``:
        shared by the calls), while they fit in the phase's share (:meth:`_global_fits`). Returns the
        best recipe and its margin."""
        improved, revisit = True, False
        while margin < 0:
            if not improved:
                if revisit:
                    break
                revisit = True
            improved = False
            for change, recipe in self._global_moves(current):
                dimension = change.partition("=")[0]
                value = (dimension, getattr(recipe, dimension, None))
                if dimension not in self.vary or recipe in tried or (not revisit and value in values):
                    continue
                if self.builder.needs(recipe) is not None:  # a histogram pass first: the caller's choice
                    continue
                if not self._global_fits(recipe):
                    if self.builder.write_seconds(recipe) > 0:  # its calibrator's run: the others may fit
                        continue
                    self._note("global phase: its share of the budget is spent")
                    return current, margin
                tried.add(recipe)
                values.add(value)
                step = self._estimate_global(edits, recipe, change)
                if step.skipped is None and step.margin is not None and step.margin > margin:
                    if method_rank(recipe.method) > method_rank(current.method):
                        self.extended = True  # new ranges: the other choices deserve another look
                    current, margin, improved = recipe, step.margin, True
                    break  # the next moves start from the improved recipe
        return current, margin

    def _statistics(self, recipe: Recipe) -> None:
        """The histogram pass the recipe's ranges need, if any, timed apart from its estimate (it
        counts in :attr:`statistics_seconds`, not as an estimate's time)."""
        kind = self.builder.needs(recipe)
        if kind is None:
            return
        expected = self.builder.expected_seconds(recipe)
        self._note(f"global phase: the {kind} histograms for method={recipe.method} (expected {expected:.1f}s)")
        began = time.monotonic()
        self.builder.estimated_ranges(recipe)
        took = time.monotonic() - began
        self.statistics_seconds += took
        self._note(f"global phase: the {kind} histograms took {took:.1f}s")

    def _global_fits(self, recipe: Recipe) -> bool:
        """Whether the global phase may estimate ``recipe`` now, its statistics included (their
        expected time, :meth:`~.build.RecipeBuilder.expected_seconds`): within :data:`GLOBAL_SHARE` of
        a time budget plus the time its histogram passes took; within :data:`STATISTICS_SHARE` for
        the first histogram method (the floor), and for the moves that need no histogram pass once a
        histogram method improved the margin (the other choices are decided again on its ranges).
        onnxruntime's calibrators count the time of their first run (its verification's,
        :meth:`~.build.RecipeBuilder.write_seconds`)."""
        if self.budget.seconds is None:
            return True
        seconds = self.budget.seconds
        share = GLOBAL_SHARE * seconds + self.statistics_seconds
        expected = self.builder.expected_seconds(recipe)
        if (expected == 0 and self.extended) or (expected > 0 and not self.builder.folded):
            share = max(share, STATISTICS_SHARE * seconds)
        # a method of onnxruntime's own calibrators: its verification will run that calibrator, so its
        # time counts here too (adopted, it is the node phase's base, whose every experiment runs it)
        return time.monotonic() - self.started + expected + self.builder.write_seconds(recipe) < share

    def _row_key(self, recipe: Recipe) -> tuple[Any, ...]:
        """What a global recipe's edited model depends on: its choices but the method, and the method's
        estimated ranges (a fingerprint; the recipe itself while they need a histogram pass: a
        starting recipe of onnxruntime's percentile calibrator)."""
        if self.builder.needs(recipe) is not None:
            return recipe, None
        key = (recipe.method, recipe.activation_type)
        if key not in self.fingerprints:
            ranges = self.builder.estimated_ranges(recipe)
            self.fingerprints[key] = tuple(sorted(ranges.items()))  # equal ranges, equal key
        rest = replace(recipe, method=self.start.method)
        return rest, self.fingerprints[key]

    def _estimate_global(self, edits: Any, recipe: Recipe, change: str) -> Step:
        """An estimate of global choices; a recipe whose edited model is one already estimated (a
        method whose estimated ranges equal another's: onnxruntime's MinMax and Entropy calibrators,
        :data:`~.build.ESTIMATED_AS`, or ``moving-average`` over fewer records than its batch) reuses that row."""
        same = self._row_key(recipe)
        earlier = self.global_rows.get(same)
        if earlier is not None and recipe not in self.estimates:
            step = replace(
                earlier,
                index=len(self.steps),
                phase="global",
                change=f"{change} (estimated as step {earlier.index})",
                recipe=recipe,
                seconds=0.0,
            )
            self.steps.append(step)
            self.estimates[recipe] = step
            if self.on_step is not None:
                self.on_step(step, self.best)
            return step
        step = self.estimate(
            recipe, "global", change, lambda: edits.model(recipe, self.builder.estimated_ranges(recipe))
        )
        self.global_rows.setdefault(same, step)
        return step

    def _global_moves(self, recipe: Recipe) -> Iterator[tuple[str, Recipe]]:
        flip = {"uint8": "int8", "int8": "uint8"}
        yield f"per_channel={not recipe.per_channel}", replace(recipe, per_channel=not recipe.per_channel)
        yield f"reduce_range={not recipe.reduce_range}", replace(recipe, reduce_range=not recipe.reduce_range)
        slow = sorted((m for m in self.methods if method_rank(m)[0]), key=method_rank)
        for method in [m for m in self.methods if m not in slow]:
            if method != recipe.method:
                yield f"method={method}", replace(recipe, method=method)
        activation = flip[recipe.activation_type]
        yield f"activation_type={activation}", replace(recipe, activation_type=activation)
        weight = flip[recipe.weight_type]
        yield f"weight_type={weight}", replace(recipe, weight_type=weight)
        for method in slow:  # their ranges need a histogram pass over the calibration records: last
            if method != recipe.method:
                yield f"method={method}", replace(recipe, method=method)

    def _candidates(self, base: Recipe) -> list[str]:
        """Nodes the base recipe's model quantizes (and that the fp32 model names)."""
        from pytest_qaccuracy.analysis.partial import QdqGraph
        from pytest_qaccuracy.model.loading import load_model

        path = self._base_model(base)
        graph = QdqGraph(load_model(path), None, path.name)
        names = set(self.cost.work)
        return [n.name for n in graph.nodes if n.name in names]

    def _base_model(self, base: Recipe) -> Path:
        """The base recipe's model: the edited one the global phase estimated, or the one it verified
        (written again when it was not kept)."""
        if base in self.base_models:
            return self.base_models[base]
        path = self.model_path(self.seen[base].index)
        if not path.exists():  # not kept: write it again (same recipe, same model)
            self.builder.write(base, path)
        return path

    def _node_phase(self, base: Recipe) -> None:
        nodes = self._candidates(base)
        if not nodes:
            return
        base = self._weight_phase(base, nodes)
        if self.best is not None and self.best.passed and self.best.cost == 0:
            return
        levels = ["int8", "float"] if self.cost.int16 >= self.cost.float else ["int8", "int16", "float"]
        if len(nodes) <= self.exhaustive_nodes:
            self._note(f"{len(nodes)} candidate node(s): every assignment of {'/'.join(levels)} in order of cost")
            self._exhaustive(base, nodes, levels)
        else:
            self._guided(base, nodes, "int16" in levels)

    def _weight_phase(self, base: Recipe, nodes: list[str]) -> Recipe:
        """Per-node weight moves, which cost nothing, before any node pays for float or 16 bits: each
        candidate's weight flipped (per channel <-> per tensor), then narrowed (the other
        ``reduce_range``), then retyped (int8 <-> uint8), on the recipe so far, estimated on the edited
        model, kept when it improves the estimated margin (one pass per kind over the
        :data:`FLIP_NODES` costliest, while estimates fit the budget; a kind onnxruntime refuses,
        :func:`~.space.refusal`, is skipped with its reason); the moves kept are verified together.
        Returns the node phase's base: the moved recipe when its verified margin beats the base's
        (verified, else estimated), else the base."""
        from pytest_qaccuracy.analysis.calibration.quantize import PER_CHANNEL_OPSET
        from pytest_qaccuracy.model.graph import GraphView

        if NODE_WEIGHTS not in self.vary:
            return base
        flippable = sorted((n for n in nodes if n in self.builder.weights), key=lambda n: -self.cost.work.get(n, 1.0))
        flippable = flippable[:FLIP_NODES]
        per_channel_ok = base.per_channel or GraphView(self.builder.model).opset >= PER_CHANNEL_OPSET
        start = self.seen.get(self.start)
        if not flippable or start is None or start.skipped is not None:
            return base
        kinds = [k for k in WEIGHT_MOVES if k != "flipped" or per_channel_ok]
        edits = self._edits()
        ranges = self.builder.estimated_ranges(base)
        first = self.estimate(base, "weights", "base (weights as the global choice)", lambda: edits.model(base, ranges))
        if first.skipped is not None or first.margin is None:
            return base
        other = OTHER_TYPE[base.weight_type]
        self._note(
            f"weights: {len(flippable)} node(s) whose weight may take the other granularity, "
            f"reduce_range={not base.reduce_range} or {other} (cost 0)"
        )
        recipe, margin = base, first.margin
        # a time budget's share: the moves cost nothing, but their estimates come out of the node phase
        until = None if self.budget.seconds is None else time.monotonic() + WEIGHTS_SHARE * self.budget.seconds
        for kind in kinds:
            refused = refusal(base.with_move(kind, flippable[0]))
            if refused is not None:
                self._note(f"weights: no {kind} weights: {refused}")
                continue
            for node in flippable:
                late = until is not None and time.monotonic() + self._longest(True) > until
                if late or not self._room_for_estimate():
                    break
                trial = recipe.with_move(kind, node)
                step = self.estimate(
                    trial, "weights", trial.changes_from(recipe), lambda t=trial: edits.model(t, ranges)
                )
                if step.skipped is None and step.margin is not None and step.margin > margin:
                    recipe, margin = trial, step.margin
        if recipe == base:
            return base
        verified = self.measure(recipe, "weights", recipe.changes_from(base))
        known = self.seen.get(base, first)
        before = known.margin if known.skipped is None and known.margin is not None else -math.inf
        if verified.skipped is None and verified.margin is not None and (verified.passed or verified.margin > before):
            return recipe
        return base

    def _edits(self) -> Any:
        """The start's model, edited for other global choices (made from its verified model when the
        global phase made none)."""
        import onnx

        from pytest_qaccuracy.analysis.recipe.edit import GlobalEdits

        if self.edits is None:
            model = onnx.load(str(self._base_model(self.start)))
            self.edits = GlobalEdits(model, self.start, self.builder.model, self.builder.ranges(self.start).ranges)
        return self.edits

    def _exhaustive(self, base: Recipe, nodes: list[str], levels: list[str]) -> None:
        """The joint optimum, a good answer first. (1) Assignments in increasing cost under the base's
        global choices, verified until one passes: the optimum for those choices, found as fast as a
        search of node assignments alone. (2) Only the assignments cheaper than that one, each under
        every global recipe of the space (best estimated first), verified until one passes: the joint
        optimum, since global choices cost nothing and every cheaper assignment was verified to miss
        under every global recipe. A budget that ends in (2) keeps the answer of (1)."""
        bound = math.inf
        for assignment in cost_ordered(nodes, levels, self.cost):
            recipe = base.with_nodes(dict(zip(nodes, assignment, strict=True)))
            if self.measure(recipe, "exhaustive", recipe.changes_from(base)).passed:
                bound = self._assignment_cost(nodes, assignment)
                break
        space = self.global_space(base)
        if len(space) < 2:
            return
        self._note(f"cheaper assignments under each of {len(space)} global recipe(s), best estimated first")
        for assignment in cost_ordered(nodes, levels, self.cost):
            if self._assignment_cost(nodes, assignment) >= bound:
                return
            precisions = dict(zip(nodes, assignment, strict=True))
            for recipe in (choices.with_nodes(precisions) for choices in space):
                if self.measure(recipe, "exhaustive", recipe.changes_from(base)).passed:
                    return

    def _assignment_cost(self, nodes: Sequence[str], assignment: Sequence[str]) -> float:
        return assignment_cost(nodes, assignment, self.cost)

    def global_space(self, base: Recipe) -> list[Recipe]:
        """Every global recipe the search may choose: the product of the choices it varies (the others
        as the start has them), without the type pairs onnxruntime refuses. The base first, then by
        margin (a verified one, else the global phase's estimate; best first), those never measured
        last in the order of the choices: estimates order, they never leave a recipe out."""
        values = {
            "method": list(dict.fromkeys([self.start.method, *self.methods])),
            "per_channel": [self.start.per_channel, not self.start.per_channel],
            "reduce_range": [self.start.reduce_range, not self.start.reduce_range],
            "activation_type": list(dict.fromkeys([self.start.activation_type, "uint8", "int8"])),
            "weight_type": list(dict.fromkeys([self.start.weight_type, "int8", "uint8"])),
        }
        axes = [values[name] if name in self.vary else [getattr(self.start, name)] for name in _GLOBAL_FIELDS]
        space = [Recipe(*choices) for choices in itertools.product(*axes)]
        space = [r for r in space if (r.activation_type, r.weight_type) not in REFUSED]
        if base.with_nodes({}) not in space:
            space.insert(0, base.with_nodes({}))

        def margin(recipe: Recipe) -> float:
            step = self.seen.get(recipe) or self.estimates.get(recipe)
            if step is None or step.skipped is not None or step.margin is None:
                return -math.inf
            return step.margin

        order = {r: i for i, r in enumerate(space)}
        return sorted(space, key=lambda r: (r != base.with_nodes({}), -margin(r), order[r]))

    def _guided(self, base: Recipe, nodes: list[str], widen: bool) -> None:
        from pytest_qaccuracy.analysis.recipe.estimate import Estimator

        float_cost = lambda n: self.cost.node(n, "float")  # noqa: E731
        with Estimator(
            self.fp32,
            self._base_model(base),
            self.evaluation,
            self.checks,
            self.options,
            self.estimate_records,
            self._note,
            self._measured_margin,
        ) as estimator:
            # the ranking first (the prefix search is only as good as its order), then what time is left
            order = estimator.order(nodes, float_cost, self._ranking_left)
            passing = self._verified_prefix(base, estimator, order)
            if passing is None:
                return
            self._prune(estimator, passing, float_cost)
        if widen and self.best is not None and self.best.passed and self.best.recipe.float:
            # 16-bit instead of float: all of them, else the costliest half (each one verified experiment)
            floats = sorted(self.best.recipe.float, key=lambda n: -float_cost(n))
            for part in (floats, floats[: len(floats) // 2]):
                if not part or not self._room_for(WIDEN_EXPERIMENTS):
                    break
                current = self.best.recipe
                recipe = current.with_nodes(
                    {n: "float" for n in current.float if n not in part} | {n: "int16" for n in [*current.int16, *part]}
                )
                if self.measure(recipe, "widen", f"float -> int16: {_names(part)}").passed:
                    break

    def _measured_margin(self, model: Any) -> float:
        """An edited model's margin on every check, measured on this host on the evaluation records
        (the estimate of checks the edited-graph runner cannot compute: top-k, allclose, task values)."""
        import onnx

        path = self.workdir / "estimate.onnx"
        try:
            onnx.save(model, str(path))
            return self.evaluator.measure(path, (HOST,)).margin
        finally:
            path.unlink(missing_ok=True)

    def _verified_prefix(self, base: Recipe, estimator: Any, order: list[str]) -> Step | None:
        """The shortest prefix of ``order`` in float estimated to pass, verified. When the estimate was
        optimistic (the verified margin below the estimated one), the next prefix must be estimated to
        pass by that much more (bisected again, longer); after :data:`RETRIES` misses, all of them."""
        low, required = 0, 0.0
        for _ in range(RETRIES):
            size, estimated = self._estimated_boundary(estimator, order, low, required)
            step = self.measure(base.with_nodes({n: "float" for n in order[:size]}), "nodes", f"float: top {size}")
            if step.passed:
                return step
            if size >= len(order) or step.margin is None or estimated is None:
                return None
            low, required = size, required + max(estimated - step.margin, 0.0) + 1e-3
        step = self.measure(base.with_nodes({n: "float" for n in order}), "nodes", f"float: all {len(order)}")
        return step if step.passed else None

    def _estimated_boundary(
        self, estimator: Any, order: list[str], low: int, required: float
    ) -> tuple[int, float | None]:
        """The shortest prefix longer than ``low`` estimated to have a margin of at least ``required``,
        bisected on estimates, and its estimated margin (all nodes and None when even that falls short)."""
        high = len(order)
        if not self._room_for_estimate():  # the budget holds one experiment more: every node in float
            self._note("no time left to bisect: verifying every ordered node in float")
            return high, None
        self._note(f"bisecting {high - low} ordered node(s) on estimates (margin >= {required:.3g})")
        margin = estimator.margins([order], "bisecting")[0]
        if margin < required:
            return high, None
        # the order's head first: when a few nodes matter, a short prefix passes while a longer one
        # may not (margins are not monotone in the prefix: a node in float can move the error onto
        # a tensor it shares), and bisection alone would settle on the long one
        # (together: the work-reuse runner's partial passes, cheap while few nodes change)
        sizes = [low + k for k in SHORT_PREFIXES if low + k < high]
        if sizes and self._room_for_estimate() and _head_may_pass(estimator, order[: sizes[-1]], required):
            self._note(f"estimating the order's head: the top {', '.join(str(k - low) for k in sizes)} node(s)")
            for size, found in zip(sizes, estimator.margins([order[:k] for k in sizes], "short prefixes"), strict=True):
                if found >= required:
                    high, margin = size, found
                    break
                low = size
        while high - low > 1 and self._room_for_estimate():  # out of time: the shortest pass so far
            mid = (low + high) // 2
            found = estimator.margins([order[:mid]], "bisecting")[0]
            if found >= required:
                high, margin = mid, found
            else:
                low = mid
        self._note(f"estimated boundary: the top {high} node(s) in float (estimated margin {margin:.3g})")
        return high, margin

    def _prune(self, estimator: Any, passing: Step, cost: Callable[[str], float]) -> None:
        """Rounds of :meth:`_prune_round`, each from the last verified pass, while the budget lasts and
        a round brings nodes back to 8 bits or estimates nodes not estimated before: a node estimated
        to miss alone is not estimated again (it misses all the more with fewer float nodes), so each
        round reaches further down the costliest."""
        missed: set[str] = set()
        while True:
            before = len(missed)
            found = self._prune_round(estimator, passing, cost, missed)
            if found is not None:
                passing = found
            elif len(missed) == before:
                return

    def _prune_round(
        self, estimator: Any, passing: Step, cost: Callable[[str], float], missed: set[str]
    ) -> Step | None:
        """Float nodes of a verified pass quantized again: of the costliest not in ``missed`` (as many
        as the budget's pace allows, at most :data:`~.estimate.PRUNE_NODES`), those estimated to pass
        alone (the others join ``missed``); then the longest run of them (costliest first) estimated to
        pass together, bisected on estimates; then verified, halving the run until a verified pass
        (returned) or none."""
        from pytest_qaccuracy.analysis.recipe.estimate import PRUNE_NODES

        kept = list(passing.recipe.float)
        affordable = len(kept)
        if self.budget.seconds is not None:
            paces = sorted(s.seconds for s in self.steps if s.estimated)  # the median: a first
            pace = paces[len(paces) // 2] if paces else 1.0  # estimate of a method computes its statistics
            left = self.budget.seconds - (time.monotonic() - self.started)
            longest = self._longest(False)
            affordable = int(max(left - 2 * longest, 0.0) / 2 / max(pace, 1e-3))
        costly = sorted((n for n in kept if n not in missed), key=lambda n: -cost(n))
        costly = costly[: min(affordable, PRUNE_NODES)]
        if not costly:
            return None
        self._note(f"pruning: estimating {len(costly)} of {len(kept)} float node(s) quantized again")
        margins = estimator.droppable_margins(kept, costly)
        missed.update(n for n, m in zip(costly, margins, strict=True) if m < 0)
        drops = [n for n, m in zip(costly, margins, strict=True) if m >= 0]
        low, high = 0, len(drops)  # the longest run estimated to pass together
        while high > low:
            self._check_budget(estimate=True)
            mid = (low + high + 1) // 2
            if estimator.margins([[n for n in kept if n not in set(drops[:mid])]], "pruning")[0] >= 0:
                low = mid
            else:
                high = mid - 1
        count = low
        while count > 0:
            recipe = passing.recipe
            for node in drops[:count]:
                recipe = recipe.with_precision(node, "int8")
            step = self.measure(recipe, "prune", f"float -{_names(drops[:count])}")
            if step.passed:
                return step
            count //= 2
        return None


def assignment_cost(nodes: Sequence[str], assignment: Sequence[str], cost: CostModel) -> float:
    """The absolute cost of one per-node assignment, rounded so that equal sums compare equal."""
    return round(sum(cost.node(n, p) for n, p in zip(nodes, assignment, strict=True)), 9)


def cost_ordered(nodes: Sequence[str], levels: Sequence[str], cost: CostModel) -> Iterator[tuple[str, ...]]:
    """Every assignment of ``levels`` to ``nodes`` in nondecreasing cost (ties: fewer wide nodes,
    then lexicographic), lazily: a heap over assignments, each raised one level at one node."""
    rank = {level: i for i, level in enumerate(levels)}
    start = tuple(levels[0] for _ in nodes)

    def key(assignment: tuple[str, ...]) -> tuple[float, int, tuple[int, ...]]:
        return (
            assignment_cost(nodes, assignment, cost),
            sum(p != levels[0] for p in assignment),
            tuple(rank[p] for p in assignment),
        )

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


def _head_may_pass(estimator: Any, head: Sequence[str], required: float) -> bool:
    """Whether the order's head is worth estimating, that is whether few nodes matter: one of them
    alone in float gains at least half of what ``required`` asks of the base's margin (True when the
    order has no gains)."""
    base, gains = getattr(estimator, "base", None), getattr(estimator, "gains", None)
    if base is None or not gains or not math.isfinite(base):
        return True
    return base + 2 * max(max(gains.get(n, 0.0), 0.0) for n in head) >= required


def _names(names: Sequence[str], shown: int = 3) -> str:
    more = len(names) - shown
    return ",".join(names[:shown]) + (f" (+{more} more)" if more > 0 else "")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def _open(path: Any) -> Any:
    from pytest_qaccuracy.data import load_dataset

    return load_dataset(path)


def held_out(calibration: Any, evaluation: Any) -> bool:
    """False when the evaluation records are the calibration records: the same dataset, or two paths
    to the same file or folder."""
    if calibration is evaluation:
        return False
    if isinstance(calibration, (str, os.PathLike)) and isinstance(evaluation, (str, os.PathLike)):
        with contextlib.suppress(OSError):
            return not os.path.samefile(calibration, evaluation)
    return True


def _name(data: Any) -> str:
    return getattr(data, "name", None) or Path(str(data)).name


def search_recipe(
    fp32: str | os.PathLike[str],
    calibration: Dataset | str | os.PathLike[str],
    evaluation: Dataset | str | os.PathLike[str],
    checks: Sequence[Check | str],
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
    vary: Sequence[str] = VARY,
    tasks: Sequence[Any] = (),
    task_targets: Sequence[Any] | str | os.PathLike[str] | None = None,
) -> RecipeResult:
    """Search a recipe of ``fp32`` that meets ``checks`` on ``evaluation`` on every target.

    Args:
        fp32: the fp32 ONNX model (not quantized).
        calibration: the records ranges are computed on (and estimates run on).
        evaluation: held-out records every experiment is measured on.
        checks: targets: ``"cosine>=0.99"``, ``"max_drop:cer<=0.01"``, ... (:mod:`.checks`) or parsed checks.
        targets: deployment targets: ``onnxruntime`` (this host) and scheme presets.
        workdir: where experiment models are written (a temporary folder, removed at the end,
            when None).
        start: the starting recipe (default: MinMax, uint8 activations, int8 per-tensor weights).
        budget: time and experiments (default: unbounded).
        weights: cost weights, e.g. ``{"int16": 0.5}`` (default :data:`~.cost.DEFAULT_WEIGHTS`: 16-bit
            costs what float does, as on onnxruntime's CPU provider).
        methods: calibration methods the search tries (default: every method).
        options: onnxruntime options.
        estimate_records: how many evaluation records (the first) the node phase's estimates run on.
        exhaustive_nodes: at most this many candidate nodes: the exhaustive, optimal node phase.
        on_step: called after every experiment with the step and the best so far.
        on_note: called with a line before a long phase (progress).
        model_out: write the best recipe's model here (atomically), passing or not.
        vary: the choices the search may change: the global ones (:data:`GLOBAL_CHOICES`) and
            ``node_weights`` (a node's weight per channel or per tensor, against ``per_channel``);
            ``()``: keep ``start``'s and search node precisions only.
        tasks: task metrics that task checks (``max_drop:cer<=0.01``) read: import paths, built-in
            names, ``{"metric": ..., <options>}`` or :class:`~pytest_qaccuracy.metrics.task.TaskSpec`.
        task_targets: one task target per evaluation record, or a JSON-lines sidecar file; default: the
            evaluation data's targets, else its labels, else none (agreement with the fp32 model).

    Returns:
        A :class:`RecipeResult`; ``result.met`` says whether the best recipe passes.
    """
    from pytest_qaccuracy.analysis.recipe.build import check_onnxruntime

    check_onnxruntime()
    checks = parse_checks(checks)
    if tasks:
        from pytest_qaccuracy.metrics.task import parse_task_specs

        try:
            tasks = parse_task_specs(list(tasks))
        except ValueError as exc:
            raise InputError(str(exc)) from None
    if isinstance(task_targets, (str, os.PathLike)):
        from pytest_qaccuracy.data.targets import read_sidecar

        if isinstance(evaluation, Dataset):
            count = len(evaluation)
        else:
            with _open(evaluation) as data:
                count = len(data)
        task_targets = read_sidecar(Path(task_targets), count)
    from pytest_qaccuracy.model.graph import GraphView
    from pytest_qaccuracy.model.loading import load_model
    from pytest_qaccuracy.model.quant_params import detect_format

    proto = load_model(fp32)
    kind = detect_format(GraphView(proto))
    if kind != "float":
        raise InputError(f"{fp32}: a {kind} model is already quantized; the recipe search needs the fp32 model")
    start = start or Recipe()
    check_method(start.method)
    refused = REFUSED.get((start.activation_type, start.weight_type))
    if refused is not None:  # before any work: the starting recipe is every other recipe's base
        raise InputError(
            f"starting recipe activation_type={start.activation_type} weight_type={start.weight_type}: {refused}"
        )
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
        {**DEFAULT_WEIGHTS, **(weights or {})},
        default_methods() if methods is None else methods,
        options or RuntimeOptions(),
        estimate_records,
        exhaustive_nodes,
        on_step,
        on_note,
        vary,
        tasks,
        task_targets,
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
