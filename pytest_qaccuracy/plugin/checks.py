"""A failed pair check's message, in numpy's layout. Pure: no pytest.

The first failed check and by how much, where its tolerance came from, the other failures (worst
first), the worst records or elements, then the worst layers and the first layer where the error
jumps; the saturation and agreement-gate notes. The outcomes themselves are built by
:mod:`pytest_qaccuracy.analysis.checks`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pytest_qaccuracy.analysis.compare import first_jump, worst_layers
from pytest_qaccuracy.analysis.outputs import OutputStats
from pytest_qaccuracy.analysis.results import ComparisonResult
from pytest_qaccuracy.assertions import SHOW, fmt
from pytest_qaccuracy.outcomes import Outcome

#: Diverging tensors listed in a failure message of the agreement gate after the first one.
SHOW_TENSORS = 5


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


def saturation_notes(report: Any) -> list[str]:
    """Message lines of a failed ``max_saturated``: the overflowing layers and what their outputs lost."""
    layers = sorted((x for x in report.layers if x.saturated), key=lambda x: -x.share)
    lines = [f"Layers whose pair sums {report.effect} on {report.preset}:"]
    for layer in layers[:SHOW]:
        moved = f"; output moved in {layer.differing} / {layer.elements} elements" if layer.tensor else ""
        lines.append(f" {layer.node}: {layer.saturated} / {layer.pairs} ({fmt(100 * layer.share)}%){moved}")
    if len(layers) > SHOW:
        lines.append(f" ... and {len(layers) - SHOW} more")
    for name, sqnr in report.outputs.items():
        if sqnr is not None:
            lines.append(f"Output '{name}': SQNR {fmt(sqnr)} dB against {report.exact}")
    if report.effect == "wrap":
        lines.append("Remedies: symmetric int8 weights (WeightSymmetric), or the worst layers in float")
    else:
        lines.append("Remedies: 7-bit weights (reduce_range=True), u8 x u8 weights, or the worst layers in float")
    return lines


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


def _worst_records(outcome: Outcome, result: ComparisonResult) -> list[str]:
    name = outcome.output
    output = next((o for o in result.outputs if o.name == name), None)
    rows = [] if output is None else output.worst_records.get(outcome.metric, [])
    return [f"Worst records ({outcome.metric}):", *(f" record {r}: {fmt(v)}" for r, v in rows[:SHOW])] if rows else []


def _worst_elements(outcome: Outcome, stats: OutputStats | None) -> list[str]:
    if outcome.metric != "relative" or stats is None:
        return []
    name = outcome.output
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


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"
