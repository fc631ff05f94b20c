"""A pair's verdict, checks, top-k accuracy and baseline drift as the HTML report shows them. Pure.

Each view reads a plugin pair record (``checks``, ``topk``; see :mod:`.summary`) and formats every
value here, once, with :func:`~pytest_qaccuracy.numbers.format_metric`; the page's script
only places the text. Raw numbers ride along (``sort``) for sorting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pytest_qaccuracy.analysis.results import ComparisonResult
from pytest_qaccuracy.numbers import format_metric, format_number
from pytest_qaccuracy.report.summary import LABELS, SENSITIVE_LAYERS, counts_text, record_status
from pytest_qaccuracy.report.tables import rank_layers

DRIFT = "drift"


def verdict_view(record: Mapping[str, Any] | None) -> dict[str, str]:
    """``{status, label, detail, reason}``: the status is passed, failed, xfailed (every failure was
    expected; ``reason`` says why) or unchecked; ``detail`` counts the checks that passed."""
    checks = list(record["checks"]) if record else []
    if not checks:
        detail = "measured only: no tolerances checked"
        return {"status": "unchecked", "label": LABELS["unchecked"], "detail": detail, "reason": ""}
    passed = sum(bool(c["passed"]) for c in checks)
    status, why = record_status(record) if record else ("unchecked", None)
    detail = f"{passed} / {len(checks)} checks passed"
    reason = f"expected to fail: {why}" if status == "xfailed" else why or ""
    return {"status": status, "label": LABELS[status], "detail": detail, "reason": reason}


def _status(check: Mapping[str, Any]) -> str:
    if check["passed"]:
        return "pass"
    return "xfail" if check.get("xfail") else "FAIL"


def check_row(check: Mapping[str, Any]) -> dict[str, Any]:
    """One check, formatted: value and tolerance as text, its source, status and message."""
    metric, threshold, params = str(check["metric"]), check.get("threshold"), check.get("params") or {}
    tolerance = "-" if threshold is None else f"{check['op']} {format_metric(metric, threshold)}".strip()
    if params:  # rtol/atol: the numbers the user set, not the share of elements outside them (0)
        tolerance = ", ".join(f"{name} {format_number(value)}" for name, value in params.items())
    value = check.get("value")
    return {
        "test": check.get("test", ""),
        "kind": check["kind"],
        "scope": check["scope"],
        "check": check["check"],
        "target": check["target"],
        "metric": metric,
        "value": "-" if value is None else format_metric(metric, value),
        "sort": value,
        "tolerance": tolerance,
        "source": check.get("source", ""),
        "status": _status(check),
        "message": check.get("detail", ""),
    }


def check_rows(record: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Every check but the baseline drift ones, failures first, then by target (stable otherwise)."""
    checks = [c for c in (record or {}).get("checks", []) if c["kind"] != DRIFT]
    rows = [check_row(c) for c in checks]
    return sorted(rows, key=lambda r: (r["status"] == "pass", r["scope"] != "output"))


def drift_rows(record: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The baseline drift checks: one row per metric that moved too far, or the one 'no drift' row."""
    return [check_row(c) for c in (record or {}).get("checks", []) if c["kind"] == DRIFT]


def _percent(value: Any) -> str:
    return "-" if value is None else f"{100 * float(value):.2f} %"


def topk_rows(record: Mapping[str, Any] | None) -> list[dict[str, str]]:
    """Per classifier output and k: agreement, accuracy of both models (when labelled) and the drop."""
    rows = []
    for output, counts in sorted(((record or {}).get("topk") or {}).items()):
        for k, row in sorted(counts.get("k", {}).items(), key=lambda item: int(item[0])):
            drop = row.get("accuracy_drop")
            rows.append(
                {
                    "output": output,
                    "k": f"top-{k}",
                    "agreement": _percent(row.get("agreement")),
                    "fp32_accuracy": _percent(row.get("fp32_accuracy")),
                    "quantized_accuracy": _percent(row.get("quantized_accuracy")),
                    "accuracy_drop": "-" if drop is None else f"{100 * float(drop):+.2f} pp",
                    "records": f"{counts.get('records', 0)} ({counts.get('labelled', 0)} labelled)",
                }
            )
    return rows


def task_rows(record: Mapping[str, Any] | None) -> list[dict[str, str]]:
    """Per task-metric value: the metric computing it, what it was scored against, both sides and the drop."""
    rows = []
    for name, value in sorted(((record or {}).get("task") or {}).items()):
        against = "targets" if value.get("against") == "targets" else "fp32 predictions"
        scored = f"{against}, {value.get('records', 0)} records"
        rows.append(
            {
                "value": name,
                "metric": str(value.get("metric", "")),
                "against": f"not computed: {value['error']}" if value.get("error") else scored,
                "fp32": format_number(value.get("fp32"), missing="-"),
                "quantized": format_number(value.get("quantized"), missing="-"),
                "drop": format_number(value.get("drop"), missing="-"),
                "better": "higher" if value.get("higher_is_better") else "lower",
            }
        )
    return rows


def worst_layers(result: ComparisonResult, metric: str | None, count: int = SENSITIVE_LAYERS) -> list[dict[str, Any]]:
    """The ``count`` worst layers by ``metric``, formatted, with the topological order to link to."""
    if metric is None:
        return []
    ranked = [x for x in rank_layers(result, metric) if x.metrics.get(metric) is not None][:count]
    return [
        {
            "tensor": x.tensor,
            "op_type": x.op_type or "?",
            "order": x.order,
            "text": format_metric(metric, x.metrics.get(metric)),
        }
        for x in ranked
    ]


def counts_line(verdicts: Sequence[Mapping[str, str]]) -> str:
    """``6 / 8 pairs passed, 2 failed as expected``, as the terminal summary counts them."""
    return counts_text([v["status"] for v in verdicts])
