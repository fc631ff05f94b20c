"""Hold a pair's results to its tolerances and rules: typed :class:`~pytest_qaccuracy.outcomes.Outcome`
records, built here by keyword. Pure: no pytest (the plugin and ``qaccuracy compare`` both call it).

The named output tolerances, the task-metric bounds, the rules on outputs and layers, the
saturation check and the agreement gate (``max_backend_steps``). Each outcome's ``detail`` is
written here once from its fields.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from fnmatch import fnmatchcase
from typing import Any

from pytest_qaccuracy.analysis.outputs import OutputStats
from pytest_qaccuracy.analysis.results import ComparisonResult
from pytest_qaccuracy.assertions import fmt
from pytest_qaccuracy.outcomes import Outcome
from pytest_qaccuracy.tolerances import (
    GATE,
    OPS,
    SATURATION,
    TASK_KINDS,
    Rule,
    Tolerance,
    Tolerances,
    rules_for,
    task_tolerance,
)

#: The tolerance on how many quantization steps each varying channel of an output spans.
CHANNELS = "min_channel_steps"
#: Tolerance -> (metric of ComparisonResult, op, unit) for the simple output checks.
SIMPLE = {"min_cosine": ("cosine", ">=", ""), "min_sqnr": ("sqnr", ">=", " dB"), "max_lsb": ("lsb", "<=", "")}
_NEGATED = {">=": "<", "<=": ">", ">": "<=", "<": ">="}
#: The metric of the element-wise check: the share of elements outside ``atol + rtol*|fp32|``.
RELATIVE = "relative"
#: How a check's subject names a task-metric value: ``task 'cer'``.
TASK_TARGET = "task '{}'"
#: The check of a task metric that raised and that no tolerance gates (its source: the option naming it).
TASK_METRIC = "task_metrics"


def compared(
    kind: str,
    check: str,
    scope: str,
    subject: str,
    metric: str,
    op: str,
    threshold: float,
    value: float | None,
    source: str,
    unit: str = "",
    why: str | None = None,
) -> Outcome:
    """``value op threshold`` as an outcome; ``why`` says why a missing value is missing."""
    value = None if value is None else float(value)  # exact floats: execnet refuses numpy scalars
    passed = value is not None and OPS[op](value, threshold)
    if value is None:
        detail = f"{metric} undefined for {subject}" + (f" ({why})" if why else "")
    else:
        verb = op if passed else _NEGATED[op]
        detail = f"{metric} {fmt(value)}{unit} {verb} {fmt(threshold)}{unit} for {subject}"
    return Outcome(
        kind=kind,
        check=check,
        scope=scope,
        subject=subject,
        metric=metric,
        op=op,
        threshold=float(threshold),
        value=value,
        passed=passed,
        source=source,
        detail=detail,
    )


def unmeasured(kind: str, check: str, scope: str, subject: str, metric: str, source: str, detail: str) -> Outcome:
    """A failed check that has no value to compare: what is missing is in ``detail``."""
    return Outcome(
        kind=kind,
        check=check,
        scope=scope,
        subject=subject,
        metric=metric,
        op="",
        threshold=None,
        value=None,
        passed=False,
        source=source,
        detail=detail,
    )


def _output_checks(
    result: ComparisonResult, stats: OutputStats | None, tolerances: Tolerances, slices: Sequence[Any] = ()
) -> list[Outcome]:
    rows = []
    # a view's own tolerance replaces the pair's for the checks asked for (a suite item asks for one)
    own = {
        s.name: {k: Tolerance(k, v, f"slice '{s.name}' {k}=") for k, v in s.tolerances if k in tolerances}
        for s in slices
    }
    for output in result.outputs:
        subject = f"output '{output.name}'"
        mine = {k: t for k, t in {**tolerances, **own.get(output.name, {})}.items() if t.applies}
        found = []
        for name, (metric, op, unit) in SIMPLE.items():
            if name in mine:
                why = output.undefined.get(metric) or (None if metric in output.metrics else "metric not computed")
                value, tol = output.metrics.get(metric), mine[name]
                found.append(
                    compared("tolerance", name, "output", subject, metric, op, tol.value, value, tol.source, unit, why)
                )
        if CHANNELS in mine:
            found.append(_channel_steps(subject, output.channels, mine[CHANNELS]))
        if ("rtol" in mine or "atol" in mine) and stats is not None:
            found.append(_relative(subject, stats.relative.get(output.name), mine))
        if stats is not None and output.name in stats.topk:
            found.extend(_topk(subject, stats.topk[output.name], mine))
        rows.extend(replace(row, output=output.name) for row in found)
    wanted = [n for n in ("min_top1_agreement", "max_top1_drop") if n in tolerances and tolerances[n].applies]
    counted = stats is not None and any(o.name in stats.topk for o in result.outputs)
    if wanted and stats is not None and not counted and stats.problems:
        # one line per output that could not be counted: its name, dtype, shape and why
        for name, why in stats.problems.items():
            detail = f"{wanted[0]}: cannot count top-1 on {why}"
            source = tolerances[wanted[0]].source
            row = unmeasured("tolerance", wanted[0], "output", f"output '{name}'", "top-1", source, detail)
            rows.append(replace(row, output=name))
    elif wanted and not counted:
        names = ", ".join(o.name for o in result.outputs)
        detail = f"{wanted[0]} needs class scores (records, classes), but no output is ({names})"
        rows.append(
            unmeasured("tolerance", wanted[0], "output", "outputs", "top-1", tolerances[wanted[0]].source, detail)
        )
    return rows


def _channel_steps(subject: str, report: Any, tolerance: Tolerance) -> Outcome:
    """``min_channel_steps``: the fewest steps a varying channel of the output spans (axes 1..3)."""
    args = ("tolerance", CHANNELS, "output", subject, "channel steps", ">=", tolerance.value)
    if report is None:
        why = "the quantized output has no single scale, or no channel varies"
        return compared(*args, None, tolerance.source, why=why)
    row = compared(*args, report.min_steps, tolerance.source)
    if report.low and not row.passed:
        where = f" (channels {report.low} of axis {report.axis}, scale {fmt(report.scale)})"
        row = replace(row, detail=row.detail + where)
    return row


def _relative(subject: str, rel: Any, tolerances: Tolerances) -> Outcome:
    """``rtol``/``atol``: the share of elements outside ``atol + rtol*|fp32|``, which must be 0; both
    numbers ride in ``params``."""
    name = "rtol" if "rtol" in tolerances else "atol"
    params = {k: float(tolerances[k].value or 0.0) for k in ("rtol", "atol") if k in tolerances}
    fraction = None if rel is None else rel.violations / max(rel.elements, 1)
    if rel is None:
        detail = f"no element stats for {subject}"
    else:
        detail = (
            f"{rel.violations} / {rel.elements} elements ({fmt(100 * fraction)}%) outside atol + rtol*|fp32| "
            f"(rtol={fmt(rel.rtol)}, atol={fmt(rel.atol)}) for {subject}"
        )
    return Outcome(
        kind="tolerance",
        check=name,
        scope="output",
        subject=subject,
        metric=RELATIVE,
        op="<=",
        threshold=0.0,
        value=fraction,
        passed=rel is not None and rel.violations == 0,
        source=tolerances[name].source,
        detail=detail,
        params=params,
    )


def _topk(subject: str, counts: Mapping[str, Any], tolerances: Tolerances) -> list[Outcome]:
    """Top-k checks of one class-score output (others are skipped: a detector's boxes have no top-1)."""
    rows = []
    if "min_top1_agreement" in tolerances:
        tol = tolerances["min_top1_agreement"]
        agreement = counts["k"]["1"]["agreement"]
        args = ("tolerance", tol.name, "output", subject, "top-1 agreement", ">=", tol.value, agreement, tol.source)
        rows.append(replace(compared(*args), k=1))
    if "max_top1_drop" in tolerances:
        tol = tolerances["max_top1_drop"]
        k_max = int(tolerances["topk"].value or 1) if "topk" in tolerances else 1
        for k in sorted({1, k_max}):
            per_k = counts["k"].get(str(k))
            drop = None if per_k is None else per_k.get("accuracy_drop")
            why = (
                "the dataset has no labels" if per_k is not None else f"a {counts.get('counted')} output has top-1 only"
            )
            metric = f"top-{k} accuracy drop"
            row = compared("tolerance", tol.name, "output", subject, metric, "<=", tol.value, drop, tol.source, why=why)
            row = replace(row, k=k)
            if drop is not None:
                extra = f" (fp32 {fmt(per_k['fp32_accuracy'])}, quantized {fmt(per_k['quantized_accuracy'])})"
                row = replace(row, detail=row.detail + extra)
            rows.append(row)
    return rows


def _task_checks(stats: OutputStats | None, tolerances: Tolerances, ungated: bool = False) -> list[Outcome]:
    """``min:<value>``, ``max:<value>`` (the quantized side) and ``max_drop:<value>`` (how much worse
    than fp32, in the metric's direction) for every task-metric tolerance in effect. A metric that
    raised fails the checks of its values with its one line (the metric and the records); with
    ``ungated`` (the check holds all the pair's tolerances), one that no tolerance gates fails too."""
    rows = []
    computed = {} if stats is None else stats.task
    gated: set[str] = set()
    for name, tol in tolerances.items():
        parsed = task_tolerance(name)
        if parsed is None or not tol.applies:
            continue
        kind, value_name = parsed
        op, what = TASK_KINDS[kind]
        subject = TASK_TARGET.format(value_name)
        value = computed.get(value_name)
        metric = f"{value_name} drop" if what == "drop" else value_name
        if value is None:
            known = ", ".join(computed) or "none"
            detail = f"{name}: no task metric computes '{value_name}' (computed: {known}); name one in task_metrics"
            rows.append(replace(unmeasured("task", name, "task", subject, metric, tol.source, detail), op=op))
            continue
        gated.add(value.metric)
        if value.error is not None:
            row = unmeasured("task", name, "task", subject, metric, tol.source, f"{name}: {value.error}")
            rows.append(replace(row, op=op, threshold=float(tol.value)))
            continue
        measured = value.drop if what == "drop" else value.quantized
        side = "the fp32 or the quantized side" if what == "drop" else "the quantized side"
        why = f"nothing to count on {side}"
        row = compared("task", name, "task", subject, metric, op, tol.value, measured, tol.source, why=why)
        against = "the targets" if value.against == "targets" else "the fp32 predictions"
        extra = (
            f" (fp32 {fmt(value.fp32)}, quantized {fmt(value.quantized)}; against {against}, {value.records} records)"
        )
        rows.append(replace(row, detail=row.detail + extra))
    if ungated:
        broken = {v.metric: v.error for v in computed.values() if v.error is not None and v.metric not in gated}
        for label, error in broken.items():
            subject = f"task metric '{label}'"
            rows.append(unmeasured("task", TASK_METRIC, "task", subject, "error", TASK_METRIC, str(error)))
    return rows


def _rule_checks(result: ComparisonResult, pair_id: str, rules: Sequence[Rule]) -> list[Outcome]:
    rows = []
    for output in result.outputs:
        for rule in rules_for(rules, pair_id, [output.name], layer=False).values():
            row = _rule_outcome(rule, "output", f"output '{output.name}'", output.metrics, output.undefined)
            rows.append(replace(row, output=output.name))
    used: set[Rule] = set()
    for layer in sorted(result.layers, key=lambda x: x.order):
        subject = f"layer '{layer.tensor}'" + (f" ({layer.op_type})" if layer.op_type else "")
        for rule in rules_for(rules, pair_id, [layer.tensor, layer.node], layer=True).values():
            rows.append(_rule_outcome(rule, "layer", subject, layer.metrics, layer.undefined))
            used.add(rule)
    for rule in rules:
        if rule.required and rule.layer is not None and rule not in used and not _matches_any(rule, result):
            names = ", ".join(x.tensor for x in result.layers[:10]) or "none"
            detail = f"layer rule '{rule.text}' matches no compared layer (layers: {names})"
            row = unmeasured("rule", rule.text, "layer", "layers", rule.metric, rule.source, detail)
            rows.append(replace(row, op=rule.op, threshold=rule.value))
    return rows


def _matches_any(rule: Rule, result: ComparisonResult) -> bool:
    return any(fnmatchcase(n, rule.layer or "*") for x in result.layers for n in (x.tensor, x.node) if n)


def _rule_outcome(
    rule: Rule, scope: str, subject: str, metrics: Mapping[str, Any], undefined: Mapping[str, str]
) -> Outcome:
    why = undefined.get(rule.metric) or (None if rule.metric in metrics else "metric not computed")
    unit = " dB" if rule.metric == "sqnr" else ""
    source = f"{rule.source}, rule '{rule.text}'"
    value = metrics.get(rule.metric)
    return compared("rule", rule.text, scope, subject, rule.metric, rule.op, rule.value, value, source, unit, why)


def evaluate(
    result: ComparisonResult,
    stats: OutputStats | None,
    tolerances: Tolerances,
    rules: Sequence[Rule],
    pair_id: str,
    slices: Sequence[Any] = (),
    whole: bool = False,
) -> list[Outcome]:
    """Every named tolerance on every output, every task-metric tolerance, then every winning rule on
    outputs and layers. ``whole``: ``tolerances`` are all the pair's (one check of the whole pair, not
    one suite item of several), so a task metric that raised fails here even when nothing gates it.

    ``slices`` (:class:`~pytest_qaccuracy.analysis.slices.SliceSpec`) are compared as outputs; each
    view's own tolerances win over the pair's on that view (its rules come in ``rules``, see
    :func:`~pytest_qaccuracy.tolerances.slice_rules`).
    """
    rows = _output_checks(result, stats, tolerances, slices) + _task_checks(stats, tolerances, whole)
    return rows + _rule_checks(result, pair_id, rules)


def on_target(outcomes: Sequence[Outcome], preset: str) -> list[Outcome]:
    """``outcomes`` as checks of a deployment target's run (``preset``): its output and task checks."""
    return [
        replace(o, deployment=preset, detail=f"{o.detail} on {preset}")
        for o in outcomes
        if o.scope in ("output", "task")
    ]


def saturation_outcome(report: Any, tolerance: Tolerance) -> Outcome:
    """``max_saturated``: the share of int16 pair sums that overflow on the report's preset (saturate on
    ``onnxruntime-avx2``, wrap on the ARM64 presets)."""
    threshold = float(tolerance.value or 0.0)
    share = float(report.share)
    passed = share <= threshold
    worst = report.worst()
    where = ""
    if worst is not None:
        record = "" if worst.worst_record is None else f", most in record {worst.worst_record}"
        where = f" (worst layer '{worst.node}': {worst.saturated} / {worst.pairs}{record})"
    verb = "<=" if passed else ">"
    done = "saturated" if report.effect == "saturate" else "wrapped"
    detail = (
        f"{done} pair sums {fmt(100 * share)}% {verb} {fmt(100 * threshold)}% on {report.preset}: "
        f"{report.saturated} / {report.pairs}{where}"
    )
    return Outcome(
        kind="saturation",
        check=SATURATION,
        scope="model",
        subject=f"{report.preset} pair sums",
        metric="saturated",
        op="<=",
        threshold=threshold,
        value=share,
        passed=passed,
        source=tolerance.source,
        detail=detail,
    )


def gate_outcome(agreement: Any, source: str) -> Outcome:
    """``max_backend_steps``: one ``AgreementResult`` (the pair's scheme against onnxruntime over its
    dataset, judged against N steps) as an outcome; it fails on the first tensor, in topological
    order, that differs by more than N steps."""
    n, scheme = agreement.max_steps_allowed, agreement.scheme
    rule = f"integer emulation ({scheme}) within {_steps(n)} of onnxruntime"

    def outcome(subject: str, value: float | None, passed: bool, detail: str) -> Outcome:
        return Outcome(
            kind="gate",
            check=GATE,
            scope="model",
            subject=subject,
            metric="steps vs onnxruntime",
            op="<=",
            threshold=float(n),
            value=value,
            passed=passed,
            source=source,
            detail=detail,
        )

    if not agreement.tensors:
        return outcome("integer tensors", None, False, f"{rule}: the model has no 8-bit tensors to compare")
    if agreement.ok:
        worst = max(t.max_steps for t in agreement.tensors)
        detail = f"{rule}: ok on {len(agreement.tensors)} tensors (max {_steps(worst)})"
        return outcome(f"{len(agreement.tensors)} tensors ({scheme})", float(worst), True, detail)
    bad = next(t for t in agreement.tensors if t.tensor == agreement.first_divergence)
    subject = f"tensor '{bad.tensor}' ({scheme})"
    if bad.max_steps < 0:
        detail = f"{rule}: tensor '{bad.tensor}' (order {bad.order}) has another shape on onnxruntime"
        return outcome(subject, None, False, detail)
    share = 100.0 * bad.mismatches / max(bad.elements, 1)
    detail = (
        f"{rule}: tensor '{bad.tensor}' (order {bad.order}) differs by up to {bad.steps()}, "
        f"{bad.mismatches} / {bad.elements} elements ({share:.3g}%)"
    )
    return outcome(subject, float(bad.max_steps), False, detail)


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"
