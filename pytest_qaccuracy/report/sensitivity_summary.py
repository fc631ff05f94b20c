"""A pair's sensitivity in the session summary: terminal lines, its ``summary.json`` entry, and the
data of its section in the HTML report. Pure.

Both read the ``"sensitivity"`` entry of a plugin pair record: ``mode``, ``metric``,
``target_from`` (the failed check the sweep aimed at, or None), and either ``report``
(:meth:`SensitivityReport.to_dict`, whose ``stopped`` says what the budget cut short) or ``error``
(one line).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pytest_qaccuracy import defaults

INDENT = "  "


def _report(entry: Mapping[str, Any]) -> Any:
    from pytest_qaccuracy.analysis.sensitivity_report import SensitivityReport

    return SensitivityReport.from_dict(entry["report"])


def _not_analysed(entry: Mapping[str, Any], report: Any) -> str | None:
    """Why a pair has no ranking (an analysis error, a QOperator model), or None when it has one."""
    if "error" in entry:
        return f"sensitivity not analysed: {entry['error']}"
    if report.sensitivity is None and report.unsupported:
        return f"sensitivity of {report.stem}: {report.unsupported}"
    if report.sensitivity is None:
        return "sensitivity not analysed"
    return None


def _suggestion(report: Any, record: Mapping[str, Any]) -> str | None:
    """The exclusion suggestion, naming the failed check it aims at, or why there is none."""
    sweep, target = report.sweep, record["sensitivity"].get("target_from")
    if sweep is not None and sweep.target is not None:
        aim = f" (failed {target['check']} on {target['target']})" if target is not None else ""
        return f"target {sweep.target}{aim}: {sweep.nodes_to_exclude()}"
    if not all(c["passed"] for c in record["checks"]):
        return "no exclusion list suggested: no failed cosine or SQNR check on an output to aim at"
    return None


def sensitivity_lines(record: Mapping[str, Any], top: int = defaults.TOP) -> list[str]:
    """The ranked table and the exclusion suggestion of a pair (nothing when it was not analysed)."""
    from pytest_qaccuracy.report.sensitivity_tables import sensitivity_table

    entry = record.get("sensitivity")
    if not entry:
        return []
    report = _report(entry) if "report" in entry else None
    note = _not_analysed(entry, report)
    if note is not None:
        return [INDENT + line for line in [note, *recipe_lines(entry)]]
    lines = sensitivity_table(report.sensitivity, top).splitlines()
    if report.stopped:  # a deadline cut the analysis short: the nodes it did not measure are not shown
        lines.insert(1, report.stopped)
    suggestion = _suggestion(report, record)
    task = task_suggestion(entry.get("task"))
    extra = [*([suggestion] if suggestion else []), *([task] if task else []), *recipe_lines(entry)]
    return [INDENT + line for line in [*lines, *extra]]


def task_suggestion(task: Mapping[str, Any] | None) -> str | None:
    """``target max_drop:cer <= 0.005: nodes_to_exclude=[...]`` (measured, each step a deployed run), or why not."""
    if not task:
        return None
    op = ">=" if task["check"].startswith("min:") else "<="
    aim = f"target {task['check']} {op} {task['threshold']:g}"
    if task.get("error"):
        return f"{aim}: not analysed: {task['error']}"
    steps = task.get("steps") or []
    side = "drop" if task["check"].startswith("max_drop:") else "quantized"
    measured = f"{task['records']} records, {' -> '.join(_number(s.get(side)) for s in (steps[:1] + steps[-1:]))}"
    if task.get("suggestion") is not None:
        return f"{aim} (task metric, {measured}): nodes_to_exclude={task['suggestion']}"
    tried = len(steps[-1]["excluded"]) if steps else 0
    return f"{aim} (task metric, {measured}): not met with up to {tried} nodes in float"


def _number(value: Any) -> str:
    from pytest_qaccuracy.numbers import format_number

    return format_number(value, missing="undefined")


def recipe_lines(entry: Mapping[str, Any]) -> list[str]:
    """The recipe search's verdict and recipe (its verified figures), or why it was not searched."""
    from pytest_qaccuracy.analysis.recipe.search import RecipeResult
    from pytest_qaccuracy.report.recipe_tables import pair_data_line, verdict_lines

    if entry.get("recipe_note"):
        return [entry["recipe_note"]]
    if not entry.get("recipe"):
        return []
    result = RecipeResult.from_dict(entry["recipe"])
    lines = verdict_lines(result)
    if entry["recipe"].get("pair_data") and result.best_step is not None:
        lines.insert(1, pair_data_line(entry["recipe"]["pair_data"], result.checks))
    for why in entry["recipe"].get("not_aimed") or ():
        lines.append(f"  not aimed at: {why}")
    files = entry.get("recipe_files") or {}
    args = recipe_arguments(entry)
    if files:  # the arguments are in the .recipe.json, with the calibration cache they name
        lines.append(f"  recipe files in the artifacts folder: {', '.join(files.values())}")
        return lines
    if args:
        lines.append(f"  quantize_static arguments: {json.dumps(args, sort_keys=True)}")
    if args and args.get("calibration_cache_path", "") is None:
        lines.append("  its calibration ranges (calibration_cache_path) are written with the session's artifacts only")
    return lines


def recipe_arguments(entry: Mapping[str, Any]) -> dict[str, Any] | None:
    """The recipe's ``quantize_static`` arguments; ``calibration_cache_path`` names the ranges file
    written with the artifacts (``recipe_files``), else it stays None (the ranges are ours)."""
    data = entry.get("recipe") or {}
    args = data.get("quantize_static")
    if args is None:
        return None
    ranges = (entry.get("recipe_files") or {}).get("ranges")
    return {**args, "calibration_cache_path": ranges} if ranges and "calibration_cache_path" in args else dict(args)


def with_recipe_files(record: Mapping[str, Any], files: Mapping[str, str] | None) -> Mapping[str, Any]:
    """``record`` with the files its recipe was written to (``{"json": path, ...}``) in its
    sensitivity entry (``recipe_files``), which the terminal lines, ``summary.json`` and the HTML
    report name; the record itself when there are none."""
    if not files:
        return record
    return {**record, "sensitivity": {**record["sensitivity"], "recipe_files": dict(files)}}


def recipe_files_in(record: Mapping[str, Any], folder: str | None = None) -> dict[str, str]:
    """The recipe files of ``record`` in the artifacts folder ``folder`` (its ``pairs/``; relative to
    the folder when None), as :func:`~pytest_qaccuracy.plugin.artifacts.write_artifacts` writes them;
    none when no recipe was measured."""
    from pytest_qaccuracy.report.recipe_tables import recipe_file_names

    data = (record.get("sensitivity") or {}).get("recipe")
    if not data or data.get("best") is None:
        return {}
    names = recipe_file_names(record["stem"], data.get("quantize_static"), data.get("ranges") is not None)
    where = "pairs" if folder is None else f"{folder}/pairs"
    return {kind: f"{where}/{name}" for kind, name in names.items()}


def recipe_brief(entry: Mapping[str, Any]) -> dict[str, Any] | None:
    """The recipe in ``summary.json``: met, why it stopped, the arguments and the best step's figures."""
    if entry.get("recipe_note"):
        return {"searched": False, "note": entry["recipe_note"]}
    data = entry.get("recipe")
    if not data:
        return None
    best = data["steps"][data["best"]] if data.get("best") is not None else None
    return {
        "searched": True,
        "met": data["met"],
        "stopped": data["stopped"],
        "checks": data["checks"],
        "not_aimed": list(data.get("not_aimed") or ()),
        "targets": data["targets"],
        "evaluation_records": data["records"],
        "quantize_static": recipe_arguments(entry),
        "convert_opset": data.get("convert_opset"),  # convert the fp32 model first (per-channel, opset < 13)
        "cost": None if best is None else best["cost"],
        "measured": None if best is None else best["measured"],
        # the best recipe on all the pair's records (what its check reads): records, measured, met
        "pair_data": data.get("pair_data"),
        "experiments": len(data["steps"]),
        "seconds": data["seconds"],
        "budget": data.get("budget"),  # seconds the search was given (what the ranking left)
        "calibration_records": data.get("calibration_records"),  # the head of the data it calibrated on
        "files": entry.get("recipe_files"),  # the recipe as written in the artifacts folder
    }


def sensitivity_brief(record: Mapping[str, Any], top: int = defaults.TOP) -> dict[str, Any] | None:
    """The pair's ``sensitivity`` in ``summary.json``: ranking head, target and suggestion, or why not."""
    entry = record.get("sensitivity")
    if not entry:
        return None
    brief: dict[str, Any] = {
        "mode": entry["mode"],
        "metric": entry["metric"],
        "target_from": entry.get("target_from"),
        "target": None,
        "nodes_to_exclude": None,
        "most_sensitive": [],
        "unsupported": None,
        "stopped": None,  # what the budget's deadline cut short (``report.stopped``)
        "error": entry.get("error"),
        "recipe": recipe_brief(entry),
        "seconds": entry.get("seconds"),  # what the whole analysis (ranking and recipe) took
        "budget": entry.get("budget"),  # and the budget it had
    }
    if "report" in entry:
        report = _report(entry)
        brief["unsupported"] = report.unsupported
        brief["stopped"] = report.stopped
        if report.sensitivity is not None:
            brief["most_sensitive"] = [n.node for n in report.sensitivity.ranked()[:top]]
        if report.sweep is not None and report.sweep.target is not None:
            brief["target"] = str(report.sweep.target)
            brief["nodes_to_exclude"] = report.sweep.suggestion
    if entry.get("task"):  # the sweep aimed at a failed task-metric check
        brief["task"] = entry["task"]
    return brief


def sensitivity_view(record: Mapping[str, Any], top: int | None = None) -> dict[str, Any] | None:
    """The pair's section of the HTML report: the terminal table's title, its rows (``top`` of them,
    all by default) and suggestion as data, and the cumulative curves as chart series; ``note`` alone
    when the pair was not analysed."""
    from pytest_qaccuracy.report.sensitivity_tables import sensitivity_title

    entry = record.get("sensitivity")
    if not entry:
        return None
    report = _report(entry) if "report" in entry else None
    note = _not_analysed(entry, report)
    if note is not None:
        lines = recipe_lines(entry)
        return {"note": note, "recipe": lines} if lines else {"note": note}
    result = report.sensitivity
    metric = result.metric_names[0]
    ranked = result.ranked()
    rows = [
        {"rank": i + 1, "node": n.node, "op_type": n.op_type, "value": n.metrics.get(metric)}
        for i, n in enumerate(ranked[:top])
    ]
    return {
        "title": sensitivity_title(result),
        "metric": metric,
        "rows": rows,
        "more": len(ranked) - len(rows),
        "baseline": result.baseline.get(metric),
        "stopped": report.stopped,
        "suggestion": "; ".join(x for x in (_suggestion(report, record), task_suggestion(entry.get("task"))) if x)
        or None,
        "chart": report.cumulative.chart_data() if report.cumulative is not None else None,
        "recipe": recipe_lines(entry),
    }
