"""The recipe search's outputs: the table of its steps, the lines a user reads, and the files they
paste (pure formatters and atomic writers; nothing is recomputed).

Files of :func:`write_recipe` (``<stem>`` defaults to the fp32 model's stem):

* ``<stem>.recipe.onnx``: the best recipe's model, as onnxruntime's ``quantize_static`` wrote it;
* ``<stem>.recipe.json``: ``quantize_static`` keyword arguments (enums by name), ``convert_opset``
  (the opset the fp32 model is converted to first, or null), the verdict and every step of the search;
* ``<stem>.recipe.py``: a script that writes the same model with onnxruntime (converting the opset
  first when ``convert_opset`` says so);
* ``<stem>.ranges.json``: the calibration ranges as onnxruntime's calibration cache
  (``calibration_cache_path``), for recipes whose method is ours.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate

from pytest_qaccuracy.analysis.recipe.checks import Check
from pytest_qaccuracy.analysis.recipe.search import RecipeResult, Step
from pytest_qaccuracy.analysis.recipe.space import OTHER_TYPE, python_snippet
from pytest_qaccuracy.atomic import atomic_write, atomic_write_json, atomic_write_text
from pytest_qaccuracy.numbers import format_metric

#: Changes longer than this are cut in the table (the JSON keeps the whole recipe).
CHANGE_WIDTH = 60


def _metric_text(step: Step | Mapping[str, Any], check: Check) -> dict[str, str]:
    """Per target, the check's metric at its worst output (at its one output, for a check of one);
    ``step``: a step, or what one measured (target -> output -> metric)."""
    metric, output = check.metric, check.output
    out = {}
    measured = step.measured if isinstance(step, Step) else step
    for target, per_output in measured.items():
        values = [m[metric] for name, m in per_output.items() if metric in m and output in (None, name)]
        worst = (
            None if not values or any(v is None for v in values) else (min if check.higher_is_better else max)(values)
        )
        out[target] = format_metric(metric, worst)
    return out


def _label(check: Check) -> str:
    """A check's metric, and its one output when it has one: ``cosine``, ``cosine 'scores'``."""
    return check.metric if check.output is None else f"{check.metric} '{check.output}'"


def step_line(step: Step, best: Step | None, checks: Sequence[Check]) -> str:
    """One finished step, for progress on stderr."""
    if step.skipped is not None:
        verdict = f"skipped: {step.skipped}"
    else:
        figures = "; ".join(
            f"{_label(check)} " + ", ".join(f"{v} ({t})" for t, v in _metric_text(step, check).items())
            for check in checks
        )
        verdict = f"{figures}: {'meets the target' if step.passed else 'fails'}"
        if step.estimated:
            verdict = f"estimate, {verdict}"
    tail = "" if best is None else f" (best: step {best.index})"
    return (
        f"recipe: step {step.index} [{step.phase}] {_cut(step.change)}: cost {step.cost:.4g}, "
        f"{verdict}, {step.seconds:.1f}s{tail}"
    )


def steps_table(result: RecipeResult) -> str:
    """Every step: what changed, its cost, each check's metric on each target, and the verdict."""
    headers = ["step", "phase", "change", "cost"]
    for check in result.checks:
        headers += [f"{_label(check)} {target}" for target in result.targets]
    headers.append("verdict")
    rows = []
    for step in result.steps:
        row: list[Any] = [step.index, step.phase, _cut(step.change), f"{step.cost:.4g}"]
        for check in result.checks:
            text = _metric_text(step, check)
            row += [text.get(target, "") for target in result.targets]
        mark = "best" if step.index == result.best else ""
        verdict = ("pass" if step.passed else "fail") + f" {mark}".rstrip()
        row.append(
            f"skipped: {step.skipped}" if step.skipped else f"estimate: {verdict}" if step.estimated else verdict
        )
        rows.append(row)
    return tabulate(rows, headers=headers, disable_numparse=True)


def _cut(text: str) -> str:
    return text if len(text) <= CHANGE_WIDTH else text[: CHANGE_WIDTH - 3] + "..."


def verdict_lines(result: RecipeResult) -> list[str]:
    """What was found: the recipe and its verified figures, or how far the best is from the target."""
    step = result.best_step
    kind = "held-out records" if result.held_out else "records, the calibration records: not held out"
    where = f"on {result.evaluation} ({result.records} {kind})"
    if step is None:
        return [f"no recipe measured ({result.note or result.stopped})"]
    figures = "; ".join(
        ", ".join(f"{_label(check)} {v} on {t}" for t, v in _metric_text(step, check).items())
        for check in result.checks
    )
    targets = " and ".join(map(str, result.checks))
    if result.met:
        head = f"recipe meets {targets} {where}: {figures}; cost {step.cost:.4g} (step {step.index})"
    else:
        head = (
            f"no recipe met {targets} within the search ({result.note or result.stopped}); "
            f"best found (step {step.index}) {where}: {figures}; margin {step.margin:.3g}; cost {step.cost:.4g}"
        )
    recipe = step.recipe
    lines = [
        head,
        f"  method={recipe.method} per_channel={recipe.per_channel} reduce_range={recipe.reduce_range} "
        f"activation_type={recipe.activation_type} weight_type={recipe.weight_type}",
    ]
    if result.convert_opset is not None:
        lines.append(
            f"  convert_opset={result.convert_opset}: the fp32 model is converted to opset {result.convert_opset} "
            "(onnx.version_converter) before quantize_static, for per-channel weights"
        )
    if recipe.float:
        lines.append(f"  nodes_to_exclude={sorted(recipe.float)!r}")
    if recipe.int16:
        lines.append(f"  16-bit activations: {sorted(recipe.int16)!r}")
    for kind, nodes in (
        ("per-tensor" if recipe.per_channel else "per-channel", recipe.flipped),
        ("8-bit" if recipe.reduce_range else "7-bit", recipe.narrowed),
        (OTHER_TYPE[recipe.weight_type], recipe.retyped),
    ):
        if nodes - recipe.float:
            lines.append(f"  {kind} weights (TensorQuantOverrides): {sorted(nodes - recipe.float)!r}")
    return lines


def pair_data_line(pair_data: Mapping[str, Any], checks: Sequence[Check]) -> str:
    """The best recipe on all the pair's records (what the pair's check reads, calibration records
    included), or why it was not measured there."""
    where = f"on all {pair_data['records']} records of the pair's data (what its check reads)"
    if "measured" not in pair_data:
        return "  " + str(pair_data.get("note") or "not measured on all the pair's records")
    figures = "; ".join(
        ", ".join(f"{_label(check)} {v} on {t}" for t, v in _metric_text(pair_data["measured"], check).items())
        for check in checks
    )
    verdict = "meets" if pair_data.get("met") else "MISSES: the pair stays red with this recipe on its own records"
    return f"  {where}: {figures}: {verdict}"


def recipe_file_names(stem: str, arguments: Mapping[str, Any] | None, ranges: bool) -> dict[str, str]:
    """The names :func:`write_recipe` gives the files of a recipe with these ``quantize_static``
    arguments (``ranges``: whether its calibration ranges are known), by kind: ``json``, ``python``
    (when there are arguments), ``ranges`` (when the arguments read a calibration cache), ``steps``."""
    names = {"json": f"{stem}.recipe.json"}
    if arguments:
        names["python"] = f"{stem}.recipe.py"
    if arguments and "calibration_cache_path" in arguments and ranges:
        names["ranges"] = f"{stem}.ranges.json"
    names["steps"] = f"{stem}.recipe.steps.txt"
    return names


def write_recipe(
    result: RecipeResult,
    out_dir: str | os.PathLike[str],
    fp32: str | os.PathLike[str],
    calibration: str | os.PathLike[str],
    stem: str | None = None,
    records: int | None = None,
    staged: bool = False,
) -> list[Path]:
    """Write the recipe's files (see the module docstring) atomically; returns their paths. Their paths
    (fp32 model, calibration records, cache, model) are absolute, so that the script runs from any folder.
    ``records``: the script's data reader reads the first ``records`` of ``calibration`` (all: None).
    ``staged``: ``out_dir`` is renamed once written (pytest's artifacts folder): the recipe's own files
    are then named beside the script, and the model and data as given."""
    from pytest_qaccuracy.analysis.calibration.options import CalibrationResult
    from pytest_qaccuracy.analysis.recipe.build import write_cache

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shown: Callable[[Path], str] = (lambda path: path.name) if staged else os.path.abspath  # symlinks kept
    fp32, calibration = (Path(fp32), Path(calibration)) if staged else (Path(shown(fp32)), Path(shown(calibration)))
    stem = stem or fp32.stem
    written = []
    target = out / f"{stem}.recipe.onnx"
    arguments = dict(result.arguments or {})
    names = recipe_file_names(stem, arguments, result.ranges is not None)
    if "ranges" in names:
        cache = write_cache(CalibrationResult("recipe", result.records, result.ranges or {}), out / names["ranges"])
        arguments["calibration_cache_path"] = shown(cache)
        written.append(cache)
    if result.model is not None and Path(result.model).exists():
        if Path(result.model).resolve() != target.resolve():
            with open(result.model, "rb") as source:  # a full disk or Ctrl-C leaves no half-copied model
                atomic_write(target, lambda handle: shutil.copyfileobj(source, handle), mode="wb")
        written.append(target)
    document = {
        **result.to_dict(),
        "model_input": str(fp32),
        "model_output": shown(target),
        "quantize_static": arguments,
    }
    if records is not None:
        document["calibration_records"] = records  # the head of ``calibration`` the ranges come from
    written.append(atomic_write_json(out / names["json"], document))
    if "python" in names:
        snippet = python_snippet(arguments, str(fp32), shown(target), str(calibration), result.convert_opset, records)
        written.append(atomic_write_text(out / names["python"], snippet))
    written.append(atomic_write_text(out / names["steps"], steps_table(result) + "\n"))
    return written
