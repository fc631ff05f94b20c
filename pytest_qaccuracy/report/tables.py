"""Plain-text tables of a comparison: the outputs, then the worst layers (printed by the CLI and the plugin)."""

from __future__ import annotations

from tabulate import tabulate

from pytest_qaccuracy import defaults
from pytest_qaccuracy.analysis.results import ComparisonResult, LayerResult
from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.numbers import finite, format_metric
from pytest_qaccuracy.report._palette import higher_is_better, metric_names
from pytest_qaccuracy.report.terminal import escape_control, match_warning

#: Tensor names longer than this are shortened in the middle so tables stay readable in a terminal.
MAX_NAME = 60


def shorten(name: str, width: int = MAX_NAME) -> str:
    """``name`` with control characters escaped, cut in the middle with ``…`` when longer than ``width``."""
    name = escape_control(name)
    if len(name) <= width:
        return name
    head = (width - 1) // 2
    return name[:head] + "…" + name[len(name) - (width - 1 - head) :]


def rank_layers(result: ComparisonResult, metric: str) -> list[LayerResult]:
    """All layers, worst first by ``metric``; layers without a value come last, in topological order.

    Worst is the lowest value for higher-is-better metrics (cosine, SQNR) and the highest otherwise.
    Ties keep topological order.

    Raises:
        InputError: ``metric`` is not one of the result's metrics.
    """
    names = metric_names(result)
    if metric not in names:
        raise InputError(f"cannot rank layers by {metric!r}: the result's metrics are {', '.join(names) or 'none'}")
    sign = 1.0 if higher_is_better(result, metric) else -1.0

    def key(layer: LayerResult) -> tuple[int, float, int]:
        value = finite(layer.metrics.get(metric))
        return (1, 0.0, layer.order) if value is None else (0, sign * value, layer.order)

    return sorted(result.layers, key=key)


def outputs_table(result: ComparisonResult, tablefmt: str = "simple") -> str:
    """One row per model output with every metric."""
    metrics = metric_names(result)
    rows = [[shorten(o.name)] + [format_metric(m, o.metrics.get(m)) for m in metrics] for o in result.outputs]
    return _tabulate(rows, ["output", *metrics], tablefmt, _align(1, metrics))


def layers_table(
    result: ComparisonResult, top: int = defaults.TOP, rank_by: str | None = None, tablefmt: str = "simple"
) -> str:
    """The ``top`` worst layers by ``rank_by``: columns order, tensor, op_type and every metric."""
    metrics = metric_names(result)
    layers = rank_layers(result, rank_by or metrics[0])[: max(top, 0)]
    rows = [
        [str(x.order), shorten(x.tensor), shorten(x.op_type or "?")]
        + [format_metric(m, x.metrics.get(m)) for m in metrics]
        for x in layers
    ]
    headers = ["order", "tensor", "op_type", *metrics]
    return _tabulate(rows, headers, tablefmt, _align(3, metrics, 1))


def _tabulate(rows: list[list[str]], headers: list[str], tablefmt: str, colalign: tuple[str, ...]) -> str:
    """The rows as text, cells as written; ``colalign`` only with rows (tabulate 0.9.0 fails on an
    alignment for the columns of an empty table, whose header has the same width either way)."""
    return tabulate(
        rows, headers=headers, tablefmt=tablefmt, disable_numparse=True, colalign=colalign if rows else None
    )


def _align(text_columns: int, metrics: list[str], numeric_first: int = 0) -> tuple[str, ...]:
    """Right-align numbers (the first ``numeric_first`` columns and the metrics), left-align names."""
    left = ["right"] * numeric_first + ["left"] * (text_columns - numeric_first)
    return (*left, *(["right"] * len(metrics)))


def comparison_table(result: ComparisonResult, top: int = defaults.TOP, rank_by: str | None = None) -> str:
    """The outputs with all their metrics, then the ``top`` worst layers ranked by one metric.

    Args:
        result: the comparison to show.
        top: how many layers to list (0 lists none).
        rank_by: the metric that ranks layers; default the result's first metric.

    Returns:
        Text without a trailing newline.

    Raises:
        InputError: ``rank_by`` is not one of the result's metrics.
    """
    metrics = metric_names(result)
    if not metrics:
        return f"{result.quantized_model}: no metrics were computed"
    metric = rank_by or metrics[0]
    direction = "lowest" if higher_is_better(result, metric) else "highest"
    parts = [f"{result.quantized_model} vs {result.fp32_model} on {result.data} ({result.records} records)", ""]
    if result.outputs:
        parts += ["Outputs", outputs_table(result)]
    else:
        parts.append("Outputs: none compared")
    if not result.layers:
        parts += ["", "Layers: none compared"]
    elif top > 0:
        shown = min(top, len(result.layers))
        parts += [
            "",
            f"Worst {shown} of {len(result.layers)} layers by {metric} ({direction} first)",
            layers_table(result, top, metric),
        ]
    unmatched = len(result.unmatched_fp32)
    if unmatched:
        parts += ["", f"{unmatched} fp32 tensor(s) had no quantized counterpart (see the JSON's 'unmatched')"]
    warning = match_warning(len(result.layers), unmatched)
    if warning:
        parts.append(warning)
    return escape_control("\n".join(parts))
