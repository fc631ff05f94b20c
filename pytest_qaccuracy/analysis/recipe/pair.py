"""From a failing pair to a recipe, within a time budget: what the pytest plugin's end-of-session
analysis calls (the command line calls :func:`~.search.search_recipe` directly).

The pair's own data is split: its first half calibrates, its second half is held out and every
recipe is measured on it. The search starts from the pair's quantized model's own choices (its
activation and weight types, per-channel weights), with MinMax calibration, and aims at the pair's
failed check on every target the pair runs on.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from pytest_qaccuracy.analysis.recipe.checks import Check, parse_checks
from pytest_qaccuracy.analysis.recipe.search import Budget, RecipeResult, Step, search_recipe
from pytest_qaccuracy.analysis.recipe.space import Recipe
from pytest_qaccuracy.data import load_dataset
from pytest_qaccuracy.data.head import Head
from pytest_qaccuracy.model.graph import GraphView
from pytest_qaccuracy.model.loading import load_model
from pytest_qaccuracy.runtime import RuntimeOptions

_TYPES = {np.dtype(np.uint8): "uint8", np.dtype(np.int8): "int8"}


def starting_recipe(quantized: str | os.PathLike[str]) -> Recipe:
    """The recipe a QDQ model looks made with: its activation type, and its weights' type and
    per-channel scales, read from the weights of Conv, ConvTranspose, Gemm and MatMul (a constant input
    of another op is quantized as an activation, per tensor)."""
    from pytest_qaccuracy.analysis.recipe.edit import WEIGHT_OPS

    view = GraphView(load_model(quantized))
    activation = weight = None
    per_channel = False
    for node in view.nodes:
        if len(node.input) < 3:
            continue
        zero = view.constant(node.input[2])
        if zero is None or zero.dtype not in _TYPES:
            continue
        if node.op_type == "QuantizeLinear" and not view.is_constant(node.input[0]) and activation is None:
            activation = _TYPES[zero.dtype]
        elif node.op_type == "DequantizeLinear" and node.input[0] in view.initializers:
            readers = view.consumers.get(node.output[0], [])
            if not any(c.op_type in WEIGHT_OPS and position == 1 for _, c, position in readers):
                continue
            scale = view.constant(node.input[1])
            weight = weight or _TYPES[zero.dtype]
            per_channel = per_channel or (scale is not None and scale.size > 1)
    return Recipe(activation_type=activation or "uint8", weight_type=weight or "int8", per_channel=per_channel)


def ranking_seconds(quantized: onnx.ModelProto, check_seconds: float, share: float) -> float:
    """What the node ranking (single or leave-one-out, the sweep and the cumulative curves) is expected
    to cost: one experiment per quantized node plus 14 (sweep and curves), each about half a forward
    pass of the quantized model on ``share`` of the checked records; a check is one pass of each model.
    An estimate that decides whether the ranking runs within the budget, not a measurement."""
    view = GraphView(quantized)
    nodes = sum(
        1
        for node in view.nodes
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear", "Constant")
        and any(
            view.producer.get(i, (0, None))[1] is not None and view.producer[i][1].op_type == "DequantizeLinear"
            for i in node.input
        )
    )
    return (nodes + 14) * 0.5 * (check_seconds / 2) * share


@dataclass(frozen=True, slots=True)
class PairRecipe:
    """The search's result, or why it was not searched (``note``); ``calibration_records``: the head
    of the pair's data its ranges were calibrated on (the rest is held out); ``pair_data``: the best
    recipe measured on all the pair's records, what the pair's own check reads (:func:`on_pair_data`)."""

    result: RecipeResult | None
    note: str | None
    calibration_records: int = 0
    pair_data: dict[str, Any] | None = None


#: The first experiment of a pair's search, in the pair's check times, plus onnxruntime's
#: ``quantize_static`` per node of the fp32 model: it calibrates on half the records (an fp32 pass),
#: has onnxruntime write the model, and runs the fp32 model and the recipe's on the other half on
#: every target. Measured on this AVX2 host: the PP-OCRv4 recognizer (398 nodes) 8.9-10.5 s against a
#: 4.7-5.0 s check under load (``quantize_static`` alone 2.3 s on a quiet host), the example suite's
#: digits CNN (8 nodes) 0.2-0.4 s against a 0.5 s check. The search admits later experiments on the
#: longest so far, so the analysis ends within its budget unless a step takes longer than predicted.
EXPERIMENT_CHECKS = 1.25
QUANTIZE_SECONDS_PER_NODE = 0.01


def first_experiment_seconds(fp32: str | os.PathLike[str], check_seconds: float) -> float:
    """What the first experiment of a pair's search is expected to take (:data:`EXPERIMENT_CHECKS`)."""
    return EXPERIMENT_CHECKS * check_seconds + QUANTIZE_SECONDS_PER_NODE * len(load_model(fp32).graph.node)


def pair_recipe(
    fp32: str | os.PathLike[str],
    quantized: str | os.PathLike[str],
    data: str | os.PathLike[str],
    check: Check | str | Sequence[Check | str],
    targets: Sequence[str],
    seconds: float,
    check_seconds: float,
    options: RuntimeOptions | None = None,
    tasks: Sequence[Any] = (),
    task_targets: Sequence[Any] | None = None,
    on_step: Callable[[Step, Step | None], None] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> PairRecipe:
    """Search within ``seconds``; not at all when they cannot hold the first experiment
    (:func:`first_experiment_seconds` of the pair's ``check_seconds``). ``check``: one check or several
    (all must hold); ``tasks`` and ``task_targets`` (one per record of ``data``) serve task checks;
    ``on_step`` and ``on_note``: progress, as :func:`~.search.search_recipe`'s."""
    first_experiment = first_experiment_seconds(fp32, check_seconds)
    if seconds < first_experiment:
        return PairRecipe(
            None,
            f"recipe not searched: budget ({seconds:.1f}s left, one experiment takes about {first_experiment:.1f}s)",
        )
    with load_dataset(data) as probe:
        count = len(probe)
    if count < 2:
        return PairRecipe(
            None, f"recipe not searched: {count} record(s) in the data; it needs one to calibrate and one held out"
        )
    head = math.ceil(count / 2)
    checks = parse_checks([check] if isinstance(check, (str, Check)) else list(check))
    began = time.monotonic()
    # the whole-data measurement after the search, when the budget can spare one check for it
    search_seconds = seconds - check_seconds if seconds - check_seconds >= first_experiment else seconds
    calibration = Head(load_dataset(data), head)
    evaluation = Head(load_dataset(data), count - head, skip=head)
    with tempfile.TemporaryDirectory(prefix="qaccuracy-pair-recipe-") as tmp:
        best = Path(tmp) / "best.onnx"
        try:
            result = search_recipe(
                fp32,
                calibration,
                evaluation,
                checks,
                targets,
                start=starting_recipe(quantized),
                budget=Budget(seconds=search_seconds),
                options=options,
                tasks=tasks,
                task_targets=None if task_targets is None else list(task_targets)[head:],
                on_step=on_step,
                on_note=on_note,
                model_out=best,
            )
        finally:
            calibration.close()
            evaluation.close()
        whole = None
        if result.best_step is not None and best.exists() and result.stopped != "interrupted":
            left = seconds - (time.monotonic() - began)
            whole = on_pair_data(
                fp32, data, best, checks, targets, options, tasks, task_targets, count, left >= check_seconds
            )
    return PairRecipe(result, None, head, whole)


def on_pair_data(
    fp32: str | os.PathLike[str],
    data: str | os.PathLike[str],
    model: Path,
    checks: Sequence[Check],
    targets: Sequence[str],
    options: RuntimeOptions | None,
    tasks: Sequence[Any],
    task_targets: Sequence[Any] | None,
    count: int,
    fits: bool,
) -> dict[str, Any]:
    """The best recipe's model measured on all ``count`` records of the pair's data, the records the
    pair's own check reads (its calibration half included: not a held-out figure, the one the pair
    will show once the recipe is pasted): ``{"records", "measured", "met", "margin"}``, or
    ``{"records", "note"}`` when the budget cannot spare the measurement (``fits`` false)."""
    from pytest_qaccuracy.analysis.recipe.measure import Evaluator

    if not fits:
        return {"records": count, "note": "not measured on all the pair's records: budget"}
    if tasks:
        from pytest_qaccuracy.metrics.task import parse_task_specs

        tasks = parse_task_specs(list(tasks))
    evaluator = Evaluator(
        fp32,
        data,
        checks,
        targets,
        options or RuntimeOptions(),
        tasks=tasks,
        task_targets=None if task_targets is None else list(task_targets),
    )
    verdict = evaluator.measure(model)
    return {"records": count, "measured": verdict.measured, "met": verdict.passed, "margin": verdict.margin}
