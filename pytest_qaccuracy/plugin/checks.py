"""Evaluate a pair's tolerances against its results, and write the failure message. Pure: no pytest.

Each check gives :class:`~pytest_qaccuracy.plugin.records.Outcome` rows, built here by keyword:
the named output tolerances, the rules on outputs and layers, the saturation check and the
agreement gate (``max_backend_steps``).
The failure message follows numpy's layout: the first failed rule and by how much, where its
tolerance came from, the other failures, the worst records or elements, then the worst layers and
the first layer where the error jumps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from pytest_qaccuracy.analysis.compare import first_jump, worst_layers
from pytest_qaccuracy.analysis.outputs import OutputStats
from pytest_qaccuracy.analysis.results import ComparisonResult
from pytest_qaccuracy.assertions import SHOW, fmt
from pytest_qaccuracy.plugin.records import Outcome
from pytest_qaccuracy.plugin.rules import (
    GATE,
    OPS,
    SATURATION,
    TASK_KINDS,
    Rule,
    Tolerances,
    rules_for,
    task_tolerance,
)
from pytest_qaccuracy.plugin.schemes import SCHEMES

#: The tolerance on how many quantization steps each varying channel of an output spans.
CHANNELS = "min_channel_steps"
#: Tolerance -> (metric of ComparisonResult, op, unit) for the simple output checks.
SIMPLE = {"min_cosine": ("cosine", ">=", ""), "min_sqnr": ("sqnr", ">=", " dB"), "max_lsb": ("lsb", "<=", "")}
_NEGATED = {">=": "<", "<=": ">", ">": "<=", "<": ">="}


#: Diverging tensors listed in a failure message of the agreement gate after the first one.
SHOW_TENSORS = 5

#: Separates a check's target from the deployment target it ran on: ``output 'y' on onnxruntime-avx2``.
ON_TARGET = " on "


def deployment_target(target: str) -> str | None:
    """The deployment target a check's target names (``... on <preset>``), or None for the pair's own run."""
    head, _, tail = target.rpartition(ON_TARGET)
    return tail if head and tail in SCHEMES else None


def _compare(
    check: str,
    target: str,
    metric: str,
    op: str,
    threshold: float,
    value: float | None,
    source: str,
    unit: str = "",
    why: str | None = None,
) -> Outcome:
    value = None if value is None else float(value)  # exact floats: execnet refuses numpy scalars
    passed = value is not None and OPS[op](value, threshold)
    if value is None:
        detail = f"{metric} undefined for {target}" + (f" ({why})" if why else "")
    else:
        verb = op if passed else _NEGATED[op]
        detail = f"{metric} {fmt(value)}{unit} {verb} {fmt(threshold)}{unit} for {target}"
    return Outcome(
        check=check,
        target=target,
        metric=metric,
        op=op,
        threshold=threshold,
        value=value,
        passed=passed,
        source=source,
        detail=detail,
    )


def _output_checks(
    result: ComparisonResult, stats: OutputStats | None, tolerances: Tolerances, slices: Sequence[Any] = ()
) -> list[Outcome]:
    rows = []
    # a view's own tolerance replaces the pair's for the checks asked for (a suite item asks for one)
    own = {s.name: {k: (v, f"slice '{s.name}' {k}=") for k, v in s.tolerances if k in tolerances} for s in slices}
    for output in result.outputs:
        target = f"output '{output.name}'"
        mine = {k: v for k, v in {**tolerances, **own.get(output.name, {})}.items() if v[0] == v[0]}  # NaN: none
        for name, (metric, op, unit) in SIMPLE.items():
            if name in mine:
                value, source = mine[name]
                why = output.undefined.get(metric) or (None if metric in output.metrics else "metric not computed")
                rows.append(_compare(name, target, metric, op, value, output.metrics.get(metric), source, unit, why))
        if CHANNELS in mine:
            rows.append(_channel_steps(target, output.channels, *mine[CHANNELS]))
        if ("rtol" in mine or "atol" in mine) and stats is not None:
            rows.append(_relative(target, stats.relative.get(output.name), mine))
        if stats is not None and output.name in stats.topk:
            rows.extend(_topk(target, stats.topk[output.name], mine))
    wanted = [
        n for n in ("min_top1_agreement", "max_top1_drop") if n in tolerances and tolerances[n][0] == tolerances[n][0]
    ]
    counted = stats is not None and any(o.name in stats.topk for o in result.outputs)
    if wanted and stats is not None and not counted and stats.problems:
        # one line per output that could not be counted: its name, dtype, shape and why
        for name, why in stats.problems.items():
            detail = f"{wanted[0]}: cannot count top-1 on {why}"
            rows.append(_unmeasured(wanted[0], f"output '{name}'", "top-1", tolerances[wanted[0]][1], detail))
    elif wanted and not counted:
        names = ", ".join(o.name for o in result.outputs)
        detail = f"{wanted[0]} needs class scores (records, classes), but no output is ({names})"
        rows.append(_unmeasured(wanted[0], "outputs", "top-1", tolerances[wanted[0]][1], detail))
    return rows


def _unmeasured(check: str, target: str, metric: str, source: str, detail: str, op: str = "") -> Outcome:
    """A failed check that has no value to compare: what is missing is in ``detail``."""
    return Outcome(
        check=check,
        target=target,
        metric=metric,
        op=op,
        threshold=None,
        value=None,
        passed=False,
        source=source,
        detail=detail,
    )


def _channel_steps(target: str, report: Any, threshold: float, source: str) -> Outcome:
    """``min_channel_steps``: the fewest steps a varying channel of the output spans (axes 1..3)."""
    if report is None:
        why = "the quantized output has no single scale, or no channel varies"
        return _compare(CHANNELS, target, "channel steps", ">=", threshold, None, source, why=why)
    row = _compare(CHANNELS, target, "channel steps", ">=", threshold, report.min_steps, source)
    if report.low and not row.passed:
        where = f" (channels {report.low} of axis {report.axis}, scale {fmt(report.scale)})"
        row = replace(row, detail=row.detail + where)
    return row


def _relative(target: str, rel: Any, tolerances: Tolerances) -> Outcome:
    name = "rtol" if "rtol" in tolerances else "atol"
    source = tolerances[name][1]
    if rel is None:
        return Outcome(
            check=name,
            target=target,
            metric="relative",
            op="<=",
            threshold=0.0,
            value=None,
            passed=False,
            source=source,
            detail=f"no element stats for {target}",
        )
    fraction = rel.violations / max(rel.elements, 1)
    detail = (
        f"{rel.violations} / {rel.elements} elements ({fmt(100 * fraction)}%) outside atol + rtol*|fp32| "
        f"(rtol={fmt(rel.rtol)}, atol={fmt(rel.atol)}) for {target}"
    )
    return Outcome(
        check=name,
        target=target,
        metric="relative",
        op="<=",
        threshold=0.0,
        value=fraction,
        passed=rel.violations == 0,
        source=source,
        detail=detail,
    )


def _topk(target: str, counts: Mapping[str, Any], tolerances: Tolerances) -> list[Outcome]:
    """Top-k checks of one class-score output (others are skipped: a detector's boxes have no top-1)."""
    rows = []
    if "min_top1_agreement" in tolerances:
        value, source = tolerances["min_top1_agreement"]
        agreement = counts["k"]["1"]["agreement"]
        rows.append(_compare("min_top1_agreement", target, "top-1 agreement", ">=", value, agreement, source))
    if "max_top1_drop" in tolerances:
        value, source = tolerances["max_top1_drop"]
        for k in sorted({1, int(tolerances.get("topk", (1, ""))[0])}):
            per_k = counts["k"].get(str(k))
            drop = None if per_k is None else per_k.get("accuracy_drop")
            why = (
                "the dataset has no labels" if per_k is not None else f"a {counts.get('counted')} output has top-1 only"
            )
            row = _compare("max_top1_drop", target, f"top-{k} accuracy drop", "<=", value, drop, source, why=why)
            if drop is not None:
                extra = f" (fp32 {fmt(per_k['fp32_accuracy'])}, quantized {fmt(per_k['quantized_accuracy'])})"
                row = replace(row, detail=row.detail + extra)
            rows.append(row)
    return rows


#: How a check's target names a task-metric value: ``task 'cer'``.
TASK_TARGET = "task '{}'"


def _task_checks(stats: OutputStats | None, tolerances: Tolerances) -> list[Outcome]:
    """``min:<value>``, ``max:<value>`` (the quantized side) and ``max_drop:<value>`` (how much worse
    than fp32, in the metric's direction) for every task-metric tolerance in effect."""
    rows = []
    computed = {} if stats is None else stats.task
    for name, (threshold, source) in tolerances.items():
        parsed = task_tolerance(name)
        if parsed is None or threshold != threshold:  # NaN: asked for on views only
            continue
        kind, value_name = parsed
        op, what = TASK_KINDS[kind]
        target = TASK_TARGET.format(value_name)
        value = computed.get(value_name)
        metric = f"{value_name} drop" if what == "drop" else value_name
        if value is None:
            known = ", ".join(computed) or "none"
            detail = f"{name}: no task metric computes '{value_name}' (computed: {known}); name one in task_metrics"
            rows.append(_unmeasured(name, target, metric, source, detail, op))
            continue
        measured = value.drop if what == "drop" else value.quantized
        side = "the fp32 or the quantized side" if what == "drop" else "the quantized side"
        row = _compare(name, target, metric, op, threshold, measured, source, why=f"nothing to count on {side}")
        against = "the targets" if value.against == "targets" else "the fp32 predictions"
        extra = (
            f" (fp32 {fmt(value.fp32)}, quantized {fmt(value.quantized)}; against {against}, {value.records} records)"
        )
        rows.append(replace(row, detail=row.detail + extra))
    return rows


def _rule_checks(result: ComparisonResult, pair_id: str, rules: Sequence[Rule]) -> list[Outcome]:
    rows = []
    for output in result.outputs:
        for rule in rules_for(rules, pair_id, [output.name], layer=False).values():
            rows.append(_rule_outcome(rule, f"output '{output.name}'", output.metrics, output.undefined))
    used: set[Rule] = set()
    for layer in sorted(result.layers, key=lambda x: x.order):
        target = f"layer '{layer.tensor}'" + (f" ({layer.op_type})" if layer.op_type else "")
        for rule in rules_for(rules, pair_id, [layer.tensor, layer.node], layer=True).values():
            rows.append(_rule_outcome(rule, target, layer.metrics, layer.undefined))
            used.add(rule)
    for rule in rules:
        if rule.required and rule.layer is not None and rule not in used and not _matches_any(rule, result):
            names = ", ".join(x.tensor for x in result.layers[:10]) or "none"
            detail = f"layer rule '{rule.text}' matches no compared layer (layers: {names})"
            rows.append(
                Outcome(
                    check=rule.text,
                    target="layers",
                    metric=rule.metric,
                    op=rule.op,
                    threshold=rule.value,
                    value=None,
                    passed=False,
                    source=rule.source,
                    detail=detail,
                )
            )
    return rows


def _matches_any(rule: Rule, result: ComparisonResult) -> bool:
    from fnmatch import fnmatchcase

    return any(fnmatchcase(n, rule.layer or "*") for x in result.layers for n in (x.tensor, x.node) if n)


def _rule_outcome(rule: Rule, target: str, metrics: Mapping[str, Any], undefined: Mapping[str, str]) -> Outcome:
    why = undefined.get(rule.metric) or (None if rule.metric in metrics else "metric not computed")
    unit = " dB" if rule.metric == "sqnr" else ""
    source = f"{rule.source}, rule '{rule.text}'"
    return _compare(rule.text, target, rule.metric, rule.op, rule.value, metrics.get(rule.metric), source, unit, why)


def evaluate(
    result: ComparisonResult,
    stats: OutputStats | None,
    tolerances: Tolerances,
    rules: Sequence[Rule],
    pair_id: str,
    slices: Sequence[Any] = (),
) -> list[Outcome]:
    """Every named tolerance on every output, every task-metric tolerance, then every winning rule on
    outputs and layers.

    ``slices`` (:class:`~pytest_qaccuracy.analysis.slices.SliceSpec`) are compared as outputs; each
    view's own tolerances win over the pair's on that view (its rules come in ``rules``, see
    :func:`~pytest_qaccuracy.plugin.rules.slice_rules`).
    """
    rows = _output_checks(result, stats, tolerances, slices) + _task_checks(stats, tolerances)
    return rows + _rule_checks(result, pair_id, rules)


def failure_message(
    pair_id: str,
    failed: Sequence[Outcome],
    result: ComparisonResult | None,
    stats: OutputStats | None = None,
    extra: Sequence[str] = (),
) -> str:
    """The message of a failed pair check (see the module docstring), with control characters of
    tensor names escaped: pytest prints it to the terminal as it is."""
    from pytest_qaccuracy.assertions import failure_message as layout
    from pytest_qaccuracy.report.terminal import escape_control

    first = failed[0]
    sections: list[list[str]] = []
    if len(failed) > 1:
        others = [f" {o.detail}" for o in failed[1 : 1 + 2 * SHOW]]
        more = len(failed) - 1 - len(others)
        sections.append([f"Also failed ({len(failed) - 1}):", *others, *([f" ... and {more} more"] if more else [])])
    if result is not None:
        sections.append(_worst_records(first, result))
        sections.append(_worst_elements(first, stats))
        sections.append(_layers(first, result))
    sections.append(list(extra))
    return escape_control(layout(f"{first.detail} (pair '{pair_id}')", first.source, sections))


def saturation_outcome(report: Any, threshold: float, source: str) -> Outcome:
    """``max_saturated``: the share of u8 x s8 pair sums that saturate on ``onnxruntime-avx2``."""
    from pytest_qaccuracy.analysis.saturation import SATURATING

    share = float(report.share)
    passed = share <= threshold
    worst = report.worst()
    where = ""
    if worst is not None:
        record = "" if worst.worst_record is None else f", most in record {worst.worst_record}"
        where = f" (worst layer '{worst.node}': {worst.saturated} / {worst.pairs}{record})"
    verb = "<=" if passed else ">"
    detail = (
        f"saturated pair sums {fmt(100 * share)}% {verb} {fmt(100 * threshold)}% on {SATURATING}: "
        f"{report.saturated} / {report.pairs}{where}"
    )
    return Outcome(
        check=SATURATION,
        target=f"{SATURATING} pair sums",
        metric="saturated",
        op="<=",
        threshold=threshold,
        value=share,
        passed=passed,
        source=source,
        detail=detail,
    )


def saturation_notes(report: Any) -> list[str]:
    """Message lines of a failed ``max_saturated``: the saturating layers and what their outputs lost."""
    from pytest_qaccuracy.analysis.saturation import EXACT

    layers = sorted((x for x in report.layers if x.saturated), key=lambda x: -x.share)
    lines = ["Saturating layers:"]
    for layer in layers[:SHOW]:
        moved = f"; output moved in {layer.differing} / {layer.elements} elements" if layer.tensor else ""
        lines.append(f" {layer.node}: {layer.saturated} / {layer.pairs} ({fmt(100 * layer.share)}%){moved}")
    for name, sqnr in report.outputs.items():
        if sqnr is not None:
            lines.append(f"Output '{name}': SQNR {fmt(sqnr)} dB against {EXACT} (exact sums)")
    lines.append("Remedies: 7-bit weights (reduce_range=True), u8 x u8 weights, or the worst layers in float")
    return lines


def gate_outcome(agreement: Any, source: str) -> Outcome:
    """``max_backend_steps``: one ``AgreementResult`` (the pair's scheme against onnxruntime over its
    dataset, judged against N steps) as an outcome; it fails on the first tensor, in topological
    order, that differs by more than N steps."""
    n, scheme = agreement.max_steps_allowed, agreement.scheme
    rule = f"integer emulation ({scheme}) within {_steps(n)} of onnxruntime"

    def outcome(target: str, value: float | None, passed: bool, detail: str) -> Outcome:
        return Outcome(
            check=GATE,
            target=target,
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
    target = f"tensor '{bad.tensor}' ({scheme})"
    if bad.max_steps < 0:
        return outcome(
            target, None, False, f"{rule}: tensor '{bad.tensor}' (order {bad.order}) has another shape on onnxruntime"
        )
    share = 100.0 * bad.mismatches / max(bad.elements, 1)
    detail = (
        f"{rule}: tensor '{bad.tensor}' (order {bad.order}) differs by up to {bad.steps()}, "
        f"{bad.mismatches} / {bad.elements} elements ({share:.3g}%)"
    )
    return outcome(target, float(bad.max_steps), False, detail)


def gate_notes(agreement: Any) -> list[str]:
    """Message lines of the agreement gate after the first divergence: the next diverging tensors,
    then the totals."""
    if agreement.ok:
        return []
    n = agreement.max_steps_allowed
    after = [t for t in agreement.tensors if t.max_steps > n or t.max_steps < 0][1:]  # [0] is the first line
    lines = [f"Next diverging tensors (> {_steps(n)}):"] if after else []
    for t in after[:SHOW_TENSORS]:
        shape = "another shape" if t.max_steps < 0 else t.steps()
        lines.append(f" {t.tensor} (order {t.order}): {shape}, {t.mismatches} / {t.elements} elements")
    if len(after) > SHOW_TENSORS:
        lines.append(f" ... and {len(after) - SHOW_TENSORS} more")
    worst = max(agreement.tensors, key=lambda t: t.max_steps)
    lines.append(
        f"Tensors that differ: {agreement.num_mismatched_tensors} / {len(agreement.tensors)}; "
        f"max {worst.steps()} at '{worst.tensor}' ({agreement.records} records)"
    )
    return lines


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def _output_name(target: str) -> str:
    """The output a check's target names: ``output 'y'`` or ``output 'y' on <preset>`` -> ``y``."""
    if deployment_target(target) is not None:
        target = target.rpartition(ON_TARGET)[0]
    return target.removeprefix("output '").removesuffix("'")


def _worst_records(outcome: Outcome, result: ComparisonResult) -> list[str]:
    name = _output_name(outcome.target)
    output = next((o for o in result.outputs if o.name == name), None)
    rows = [] if output is None else output.worst_records.get(outcome.metric, [])
    return [f"Worst records ({outcome.metric}):", *(f" record {r}: {fmt(v)}" for r, v in rows[:SHOW])] if rows else []


def _worst_elements(outcome: Outcome, stats: OutputStats | None) -> list[str]:
    if outcome.metric != "relative" or stats is None:
        return []
    name = _output_name(outcome.target)
    rel = stats.relative.get(name)
    if rel is None or not rel.worst:
        return []
    rows = [f" record {r} {i}: {fmt(q)} (ACTUAL), {fmt(f)} (EXPECTED)" for r, i, q, f in rel.worst]
    return [
        f"Max absolute difference among violations: {fmt(rel.max_abs)}",
        f"Max relative difference among violations: {fmt(rel.max_rel)}",
        "Worst elements:",
        *rows,
    ]


def _layers(outcome: Outcome, result: ComparisonResult) -> list[str]:
    metric = outcome.metric if outcome.metric in result.metric_names else "sqnr"
    if metric not in result.metric_names or not result.layers:
        return []
    unit = " dB" if metric == "sqnr" else ""
    lines = [f"Worst layers ({metric}):"]
    for layer in worst_layers(result, metric, SHOW):
        lines.append(f" {layer.tensor} ({layer.op_type}): {fmt(layer.metrics.get(metric))}{unit}")
    jump = first_jump(result, metric)
    if jump is not None:
        ordered = sorted(result.layers, key=lambda x: x.order)
        before = [x for x in ordered if x.order < jump.order and x.metrics.get(metric) is not None]
        prev = f"{fmt(before[-1].metrics[metric])}{unit} -> " if before else ""
        lines.append(
            f"First jump ({metric}): {jump.tensor} ({jump.op_type}): {prev}{fmt(jump.metrics.get(metric))}{unit}"
        )
    return lines


__all__ = [
    "ON_TARGET",
    "SIMPLE",
    "TASK_TARGET",
    "Outcome",
    "Tolerances",
    "deployment_target",
    "evaluate",
    "failure_message",
    "gate_notes",
    "gate_outcome",
    "saturation_notes",
    "saturation_outcome",
]
