"""JUnit XML properties of a pair check: plain strings, never numpy scalars.

``qaccuracy.pair``, ``qaccuracy.passed``, one ``qaccuracy.check`` per check (its typed fields as JSON),
where the quantized model ran, the key output figures,
the task metrics' (``qaccuracy.task.<value>.{fp32,quantized,drop}``), each deployment target's
(``qaccuracy.target.<name>.*``) and the agreement gate's
(``qaccuracy.agreement.*``). Pure: stdlib only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_qaccuracy.numbers import format_number
from pytest_qaccuracy.plugin.records import TargetRun

Properties = list[tuple[str, str]]


def pair_properties(pair_id: str, backend: str, scheme: str, result: Any, stats: Any, passed: bool) -> Properties:
    """The pair, its verdict, where it ran (``scheme``: the preset, resolved) and its output figures."""
    props = [("qaccuracy.pair", pair_id), ("qaccuracy.passed", str(passed).lower())]
    props += [("qaccuracy.backend", backend), ("qaccuracy.scheme", scheme)]
    for output in result.outputs:
        for metric in ("cosine", "sqnr", "lsb"):
            value = output.metrics.get(metric)
            if value is not None:
                props.append((f"qaccuracy.{output.name}.{metric}", format_number(float(value))))
        counts = stats.topk.get(output.name) if stats is not None else None
        for k, row in (counts or {}).get("k", {}).items():
            for name in ("agreement", "accuracy_drop"):
                if row.get(name) is not None:
                    props.append((f"qaccuracy.{output.name}.top{k}_{name}", format_number(float(row[name]))))
    for name, value in (stats.task if stats is not None else {}).items():
        for side, number in (("fp32", value.fp32), ("quantized", value.quantized), ("drop", value.drop)):
            if number is not None:
                props.append((f"qaccuracy.task.{name}.{side}", format_number(float(number))))
    return props


def check_properties(outcomes: Sequence[Any]) -> Properties:
    """One ``qaccuracy.check`` property per check of the test: its typed fields as compact JSON
    (kind, check, scope, subject, deployment, metric, op, threshold, value, params, output, k, passed,
    source)."""
    fields = ("kind", "check", "scope", "subject", "deployment", "metric", "op", "threshold", "value", "output", "k")
    props = []
    for outcome in outcomes:
        data = {name: getattr(outcome, name) for name in fields}
        data |= {"params": dict(outcome.params), "passed": outcome.passed, "source": outcome.source}
        for name in ("threshold", "value"):  # inf (identical tensors' SQNR) as its text: strict JSON
            if isinstance(data[name], float) and not math.isfinite(data[name]):
                data[name] = str(data[name])
        props.append(("qaccuracy.check", json.dumps(data, separators=(",", ":"))))
    return props


def target_properties(targets: Mapping[str, TargetRun]) -> Properties:
    """Each deployment target's verdict and output figures: ``qaccuracy.target.<name>.<output>.<metric>``."""
    props = []
    for name, run in targets.items():
        props.append((f"qaccuracy.target.{name}.passed", str(run.passed).lower()))
        for output, metrics in run.outputs.items():
            for metric in ("cosine", "sqnr"):
                if metrics.get(metric) is not None:
                    props.append((f"qaccuracy.target.{name}.{output}.{metric}", format_number(float(metrics[metric]))))
        for value, entry in run.task.items():
            if entry.get("quantized") is not None:
                props.append((f"qaccuracy.target.{name}.task.{value}", format_number(float(entry["quantized"]))))
    return props


def gate_properties(agreement: Any) -> Properties:
    """The agreement gate's scheme, its largest step difference and its first diverging tensor."""
    worst = max((t.max_steps for t in agreement.tensors), default=0)
    return [
        ("qaccuracy.agreement.scheme", agreement.scheme),
        ("qaccuracy.agreement.max_steps", str(worst)),
        ("qaccuracy.agreement.first_divergence", agreement.first_divergence or ""),
    ]


def recipe_properties(records: Sequence[Mapping[str, Any]]) -> Properties:
    """Each analysed pair's recipe, as test-suite properties (the recipe is found after the pair's
    test case was written): ``qaccuracy.recipe.<pair>.met``, ``.quantize_static`` (JSON),
    ``.convert_opset`` (when the fp32 model is converted first), ``.files`` (the recipe's files in the
    artifacts folder, comma-separated), ``.pair_data.met`` (the recipe on all the pair's records),
    or ``.note``."""
    from pytest_qaccuracy.report.sensitivity_summary import recipe_arguments

    props = []
    for record in records:
        entry = record.get("sensitivity") or {}
        prefix = f"qaccuracy.recipe.{record['id']}"
        if entry.get("recipe_note"):
            props.append((f"{prefix}.note", entry["recipe_note"]))
        recipe = entry.get("recipe")
        if recipe:
            props.append((f"{prefix}.met", str(recipe["met"]).lower()))
            props.append((f"{prefix}.stopped", recipe["stopped"]))
            props.append((f"{prefix}.quantize_static", json.dumps(recipe_arguments(entry), sort_keys=True)))
            if recipe.get("convert_opset") is not None:
                props.append((f"{prefix}.convert_opset", str(recipe["convert_opset"])))
            if entry.get("recipe_files"):
                props.append((f"{prefix}.files", ",".join(entry["recipe_files"].values())))
            best = recipe["steps"][recipe["best"]] if recipe.get("best") is not None else None
            for target, outputs in (best or {}).get("measured", {}).items():
                for output, metrics in outputs.items():
                    for metric, value in metrics.items():
                        shown = "n/a" if value is None else format_number(float(value))
                        props.append((f"{prefix}.{target}.{output}.{metric}", shown))
            whole = recipe.get("pair_data") or {}
            if "met" in whole:  # the same recipe on all the pair's records, what its check reads
                props.append((f"{prefix}.pair_data.met", str(whole["met"]).lower()))
    return props
