"""The session summary: terminal lines (verdict first, 100 columns) and ``summary.json``. Pure: no pytest.

Both take the plugin's pair records (plain dicts: ``id``, ``comparison`` (the comparison JSON), ``topk``,
``checks``), so they read the same whether the results came from this process or xdist workers.
"""

from __future__ import annotations

import hashlib
import platform
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from pytest_qaccuracy import defaults
from pytest_qaccuracy.numbers import format_number
from pytest_qaccuracy.outcomes import Outcome, pair_status, worst_first
from pytest_qaccuracy.report.completeness import SessionStatus
from pytest_qaccuracy.report.terminal import escape_control, match_warning

SUMMARY_SCHEMA = 1
#: Columns every line of the terminal summary fits in.
WIDTH = 100
#: Failed checks listed per pair, worst first, before "and N more".
SHOW_FAILED = 5
#: Warnings listed (of all pairs) before "and N more"; all of them are in ``summary.json``.
SHOW_WARNINGS = 3
#: Where the lines the terminal leaves out are (a session's artifacts); the first also has every warning.
MORE_IN = "summary.json, report.html"
#: A pair's worst layers at a glance: the terminal's "most sensitive layers", the report's overview.
SENSITIVE_LAYERS = 3
#: The metric those layers are ranked by, and the report's graph and chart show first, in order of preference.
FIRST_METRICS = ("sqnr", "cosine", "mse")
#: A pair's default (backend, scheme): not shown in its summary line.
DEFAULT_RUN = ("onnxruntime", "onnxruntime")
#: The word of each pair status, as pytest words its outcomes (the terminal summary and the report's badges).
LABELS = {"passed": "PASSED", "failed": "FAILED", "xfailed": "XFAIL", "unchecked": "NO CHECKS"}


def _fmt(value: float | None) -> str:
    """A number in a summary cell or line; a missing one as ``-``."""
    return format_number(value, missing="-")


def record_status(record: Mapping[str, Any]) -> tuple[str, str | None]:
    """:func:`~pytest_qaccuracy.outcomes.pair_status` of a pair record's builtins form."""
    return pair_status(record["checks"], record.get("tests"))


def record_passed(record: Mapping[str, Any]) -> bool:
    """Whether the pair passed: every check passed (a pair without checks passes) and pytest failed
    none of its tests for passing against a strict xfail."""
    return record_status(record)[0] in ("passed", "unchecked")


def _shown_checks(record: Mapping[str, Any]) -> list[Outcome]:
    """The pair's checks as typed outcomes, one per (kind, check, subject, deployment, metric): a
    check made by two tests (a suite item and a fixture test) is shown once, a failure winning."""
    found: dict[tuple[Any, ...], Outcome] = {}
    for data in record["checks"]:
        outcome = Outcome.from_dict(data)
        key = (outcome.kind, outcome.check, outcome.subject, outcome.deployment, outcome.metric)
        if key not in found or not outcome.passed:
            found[key] = outcome
    return list(found.values())


def _unit(metric: str) -> str:
    return " dB" if metric == "sqnr" else ""


def _bound(outcome: Outcome) -> str:
    """The tolerance a check was held to, as written: ``>= 0.99``, ``rtol 0.01, atol 0.001``."""
    if outcome.params:
        return ", ".join(f"{name} {_fmt(value)}" for name, value in outcome.params.items())
    if outcome.threshold is None:
        return "-"
    return f"{outcome.op} {_fmt(outcome.threshold)}{_unit(outcome.metric)}".strip()


def _failed_rows(failed: Sequence[Outcome], indent: str) -> list[str]:
    """Aligned rows ``subject  metric  value  tolerance  [n]``, then the sources ``[n] <source>`` (a
    source is shared by many rows: the rule or the ini key that set the tolerance)."""
    sources: dict[str, int] = {}
    cells = []
    for o in failed:
        value = "-" if o.value is None else f"{_fmt(o.value)}{_unit(o.metric)}"
        number = sources.setdefault(o.source, len(sources) + 1)
        cells.append([o.target, o.metric, value, _bound(o), f"[{number}]"])
    widths = [max(len(row[i]) for row in cells) for i in range(4)]
    rows = [indent + "  ".join(c.ljust(w) for c, w in zip(row, [*widths, 0], strict=True)).rstrip() for row in cells]
    return rows + [f"{indent}[{number}] {source}" for source, number in sources.items()]


def _failed_lines(record: Mapping[str, Any], show: int, more_in: str) -> list[str]:
    """The failed checks of a pair, worst first (farthest beyond their tolerance), ``show`` of them
    and how many more."""
    checks = _shown_checks(record)
    failed = worst_first([o for o in checks if not o.passed])
    if not failed:
        return []
    kinds = Counter(KIND_NAMES[o.kind] for o in failed)
    order = list(KIND_NAMES.values())
    what = ", ".join(f"{name} {n}" for name, n in sorted(kinds.items(), key=lambda item: order.index(item[0])))
    lines = [f"  failed {len(failed)} of {len(checks)} checks ({what}), worst first:"]
    rows = _failed_rows(failed[:show], "    ")
    more = [f"    and {len(failed) - show} more ({more_in})"] if len(failed) > show else []
    return lines + rows[: min(show, len(failed))] + more + rows[min(show, len(failed)) :]


#: How the failed-checks line counts each kind of check.
KIND_NAMES = {
    "tolerance": "output tolerances",
    "rule": "rules",
    "task": "task metrics",
    "drift": "baseline drift",
    "saturation": "saturation",
    "gate": "agreement gate",
    "error": "errors",
}


def _layer_line(record: Mapping[str, Any]) -> list[str]:
    """``most sensitive layers (sqnr): x (input) 0.23 dB, ...``: the three worst layers."""
    layers = record["comparison"]["layers"]
    higher = record["comparison"].get("higher_is_better", {})
    metric = next((m for m in FIRST_METRICS if m in record["comparison"]["metric_definitions"]), None)
    if not metric or not layers:
        return []
    sign = 1.0 if higher.get(metric, False) else -1.0  # worst first
    defined = [x for x in layers if x["metrics"].get(metric) is not None]
    worst = sorted(defined, key=lambda x: sign * x["metrics"][metric])[:SENSITIVE_LAYERS]
    names = ", ".join(f"{x['tensor']} ({x['op_type']}) {_fmt(x['metrics'][metric])}{_unit(metric)}" for x in worst)
    return [f"  most sensitive layers ({metric}): {names}"]


def target_view(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """Deployment targets side by side, values formatted: ``{headers, rows, passed}`` (rows per output:
    cosine, SQNR, top-1 agreement; the last row the verdict of each target's checks, which ``passed``
    gives per target), or None without targets."""
    targets = record.get("targets") or {}
    if not targets:
        return None
    names = sorted(targets)
    kinds = {n: "emulated" if targets[n]["backend"] == "integer" else "onnxruntime" for n in names}
    rows = []
    for output in sorted({o for n in names for o in targets[n]["outputs"]}):
        for metric in ("cosine", "sqnr"):
            rows.append([output, metric, *(_fmt(targets[n]["outputs"].get(output, {}).get(metric)) for n in names)])
        if any(output in targets[n]["topk"] for n in names):
            agreement = [targets[n]["topk"].get(output, {}).get("k", {}).get("1", {}).get("agreement") for n in names]
            rows.append([output, "top-1 agreement", *(_fmt(a) for a in agreement)])
    for value in sorted({v for n in names for v in targets[n].get("task") or {}}):
        quantized = [(targets[n].get("task") or {}).get(value, {}).get("quantized") for n in names]
        rows.append([f"task '{value}'", value, *(_fmt(q) for q in quantized)])
    passed = [bool(targets[n]["passed"]) for n in names]
    rows.append(["", "checks", *("pass" if ok else "FAIL" for ok in passed)])
    return {"headers": ["output", "metric", *(f"{n} ({kinds[n]})" for n in names)], "rows": rows, "passed": passed}


def _target_lines(record: Mapping[str, Any]) -> list[str]:
    """The deployment targets side by side (:func:`target_view`), for a pair that did not pass."""
    from tabulate import tabulate

    view = target_view(record)
    if view is None:
        return []
    headers, rows = view["headers"], view["rows"]

    def block(columns: list[int]) -> list[str]:
        picked = [0, 1, *columns]  # output and metric head every block
        table = tabulate([[r[i] for i in picked] for r in rows], [headers[i] for i in picked], tablefmt="simple")
        return ["    " + line for line in table.splitlines()]

    lines, left = ["  deployment targets:"], list(range(2, len(headers)))
    while left:  # as many targets side by side as fit the width, then the next ones below
        take = len(left)
        while take > 1 and max(map(len, block(left[:take]))) > WIDTH:
            take -= 1
        lines += ([""] if len(lines) > 1 else []) + block(left[:take])
        left = left[take:]
    return lines


def _task_lines(record: Mapping[str, Any]) -> list[str]:
    """``task metric cer: fp32 0.012 -> quantized 0.031 (drop 0.019), against the targets, 8 records``;
    a metric that raised: ``task metric boom: not computed (task metric 'm:Boom' on records 0..7: ...)``."""
    lines = []
    for name, value in sorted((record.get("task") or {}).items()):
        if value.get("error"):
            lines.append(f"  task metric {name}: not computed ({value['error']})")
            continue
        against = "the targets" if value.get("against") == "targets" else "the fp32 predictions"
        lines.append(
            f"  task metric {name}: fp32 {_fmt(value.get('fp32'))} -> quantized {_fmt(value.get('quantized'))} "
            f"(drop {_fmt(value.get('drop'))}; {value.get('metric')} against {against}, {value.get('records')} records)"
        )
    return lines


def _run_label(record: Mapping[str, Any]) -> str:
    """``, backend integer, scheme tflite`` when a pair does not run with the defaults, else empty."""
    backend, scheme = record.get("backend", DEFAULT_RUN[0]), record.get("scheme", DEFAULT_RUN[1])
    return "" if (backend, scheme) == DEFAULT_RUN else f", backend {backend}, scheme {scheme}"


@dataclass(frozen=True, slots=True)
class SummaryLine:
    """One line of the terminal summary; ``status`` is the verdict of the pair it names (passed,
    failed, xfailed, unchecked) on its verdict lines, the writer's colour, else None."""

    text: str
    status: str | None = None


def verdict_line(record: Mapping[str, Any]) -> SummaryLine:
    """``digits_qdq: PASSED (digits_cnn.qdq.onnx vs digits_cnn.onnx on digits_test.npz, 300 records)``."""
    comparison = record["comparison"]
    status, _ = record_status(record)
    models = f"{Path(comparison['quantized_model']).name} vs {Path(comparison['fp32_model']).name}"
    count = f"{comparison['records']} records{_run_label(record)}"
    text = f"{record['id']}: {LABELS[status]} ({models} on {Path(comparison['data']).name}, {count})"
    if len(text) > WIDTH:  # the data file is named in the pair's block and in summary.json
        text = f"{record['id']}: {LABELS[status]} ({models}, {count})"
    return SummaryLine(text, status)


def pair_warnings(record: Mapping[str, Any]) -> list[str]:
    """Everything worth a second look about a pair that does not decide its verdict: few layers
    matched, channels one scale loses, top-k counted over other units than records."""
    comparison = record["comparison"]
    found = []
    warning = match_warning(len(comparison["layers"]), len(comparison.get("unmatched", {}).get("fp32", [])))
    if warning:
        found.append(warning.removeprefix("warning: "))
    found += channel_warnings(comparison)
    found += [line.strip() for line in _counted_lines(record)]
    return found


def summary_rows(
    records: Sequence[Mapping[str, Any]],
    artifacts: str | None = None,
    sensitivity_top: int = defaults.TOP,
    show: int = SHOW_FAILED,
    more_in: str = MORE_IN,
    show_warnings: int | None = SHOW_WARNINGS,
) -> list[SummaryLine]:
    """The terminal summary, verdict first: one line per pair; then, per pair that did not pass, its
    failed checks worst first (``show`` of them and how many more), its most sensitive layers, task
    metrics and sensitivity analysis; the warnings of every pair grouped (the first
    :data:`SHOW_WARNINGS`); the counts. Every line fits :data:`WIDTH` columns."""
    from pytest_qaccuracy.report.sensitivity_summary import recipe_files_in, sensitivity_lines, with_recipe_files

    rows: list[SummaryLine] = [verdict_line(record) for record in records]
    for record in records:
        status, reason = record_status(record)
        if status in ("passed", "unchecked") and not record.get("sensitivity"):
            continue  # a pair analysed although it passed (qaccuracy_sensitivity = all) shows its table
        why = f"expected to fail: {reason}" if status == "xfailed" else reason
        data = f" on {Path(record['comparison']['data']).name}"
        block = [f"{record['id']}: {LABELS[status]}{data}" + (f", {why}" if why else "")]
        block += _failed_lines(record, show, more_in)
        block += _layer_line(record) + _task_lines(record) + _target_lines(record)
        written = with_recipe_files(record, recipe_files_in(record)) if artifacts else record
        block += sensitivity_lines(written, sensitivity_top)
        rows += [SummaryLine("")] + [SummaryLine(line, status if i == 0 else None) for i, line in enumerate(block)]
    warnings = [f"{record['id']}: {text}" for record in records for text in pair_warnings(record)]
    if warnings:
        shown = warnings[:show_warnings]
        where = f"; all in {more_in.split(',')[0]}" if len(shown) < len(warnings) else ""
        rows += [SummaryLine(""), SummaryLine(f"warnings ({len(warnings)}{where}):")]
        rows += [SummaryLine(f"  {text}") for text in shown]
        if len(warnings) > len(shown):
            rows.append(SummaryLine(f"  and {len(warnings) - len(shown)} more"))
    rows += [SummaryLine(""), SummaryLine(counts_line(records) + (f"; artifacts in {artifacts}" if artifacts else ""))]
    return [SummaryLine(line, row.status if i == 0 else None) for row in rows for i, line in enumerate(fit(row.text))]


def counts_line(records: Sequence[Mapping[str, Any]]) -> str:
    """``7 / 9 pairs passed, 2 failed as expected``; pairs without checks are counted apart."""
    return counts_text([record_status(r)[0] for r in records])


def counts_text(statuses: Sequence[str]) -> str:
    """The counts of pair statuses (:data:`~pytest_qaccuracy.outcomes.STATUSES`), as the terminal and
    the report word them."""
    unchecked = list(statuses).count("unchecked")
    checked = len(statuses) - unchecked
    if not checked:
        return f"{len(statuses)} comparison{'s' if len(statuses) != 1 else ''}, no tolerances checked"
    expected = list(statuses).count("xfailed")
    line = f"{list(statuses).count('passed')} / {checked} pairs passed"
    line += f", {expected} failed as expected" if expected else ""
    return line + (f"; {unchecked} without checks" if unchecked else "")


def fit(line: str, width: int = WIDTH) -> list[str]:
    """``line`` (control characters escaped) as lines of at most ``width`` columns: wrapped at spaces,
    continuation lines indented four more than the first; a word longer than a line (a path) stays whole."""
    import textwrap

    line = escape_control(line)
    if len(line) <= width:
        return [line]
    indent = " " * (len(line) - len(line.lstrip(" ")))
    return textwrap.wrap(
        line.strip(),
        width,
        initial_indent=indent,
        subsequent_indent=indent + "    ",
        break_on_hyphens=False,
        break_long_words=False,
    )


def summary_lines(
    records: Sequence[Mapping[str, Any]],
    artifacts: str | None = None,
    sensitivity_top: int = defaults.TOP,
    more_in: str = MORE_IN,
    show_warnings: int | None = SHOW_WARNINGS,
) -> list[str]:
    """:func:`summary_rows` as text."""
    rows = summary_rows(records, artifacts, sensitivity_top, more_in=more_in, show_warnings=show_warnings)
    return [row.text for row in rows]


def channel_warnings(comparison: Mapping[str, Any]) -> list[str]:
    """``output0 channels 4..21 (axis 1) span < 1 step ...`` for every flagged output, view or layer
    of a comparison dict (its ``channels`` entries), outputs first."""
    from pytest_qaccuracy.metrics.channels import ChannelReport

    layers = sorted(comparison.get("layers", []), key=lambda x: x.get("order", 0))
    named = [(o["name"], o) for o in comparison.get("outputs", [])] + [(x["tensor"], x) for x in layers]
    reports = {name: ChannelReport.from_dict(entry["channels"]) for name, entry in named if entry.get("channels")}
    return [report.warning(name) for name, report in reports.items() if report.flagged]


def _counted_lines(record: Mapping[str, Any]) -> list[str]:
    """How top-k counted an output, when not one class decision per record."""
    lines = []
    for output, counts in sorted(record.get("topk", {}).items()):
        counted = counts.get("counted", "per record")
        if counted != "per record":
            units = f": {counts.get('units')} decisions in {counts.get('records')} records"
            lines.append(f"  top-k on output '{output}' counted {counted}{units}")
    return lines


def file_sha256(path: Path) -> str | None:
    """SHA-256 of a file, or of a folder's files (relative names and contents, sorted)."""
    digest = hashlib.sha256()
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file())
    else:
        return None
    for file in files:
        if path.is_dir():
            digest.update(file.relative_to(path).as_posix().encode() + b"\0")
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def versions() -> dict[str, str | None]:
    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    names = ("pytest-qaccuracy", "onnx", "onnxruntime", "numpy", "pytest")
    return {"python": platform.python_version(), **{name: version(name) for name in names}}


def summary_document(
    records: Sequence[Mapping[str, Any]],
    root: Path,
    artifacts: Mapping[str, Mapping[str, Any]],
    status: SessionStatus | None = None,
) -> dict[str, Any]:
    """``summary.json``: versions, UTC time, the host's onnxruntime preset, whether the session is
    complete (``status``, and under ``missing`` what it lacks), and per pair its files' SHA-256,
    checks, artifacts, sensitivity (None when not analysed) and deployment targets. ``passed`` is
    true only for a complete session whose pairs all passed."""
    status = status or SessionStatus()
    from pytest_qaccuracy.report.sensitivity_summary import sensitivity_brief

    def file_entry(path: str | None) -> dict[str, str | None] | None:
        if path is None:
            return None
        p = Path(path)
        try:
            shown = p.relative_to(root).as_posix()
        except ValueError:
            shown = p.as_posix()
        return {"path": shown, "sha256": file_sha256(p)}

    pairs = []
    for record in records:
        pairs.append(
            {
                "id": record["id"],
                "key": record["key"],
                "passed": record_passed(record),
                "status": record_status(record)[0],
                "reason": record_status(record)[1],
                "tests": dict(record.get("tests") or {}),
                "warnings": pair_warnings(record),
                "fp32": file_entry(record["fp32"]),
                "quantized": file_entry(record["quantized"]),
                "data": file_entry(record["data"]),
                "labels": file_entry(record.get("labels")),
                "backend": record.get("backend", DEFAULT_RUN[0]),
                "scheme": record.get("scheme", DEFAULT_RUN[1]),
                "records": record["comparison"]["records"],
                "outputs": {o["name"]: o["metrics"] for o in record["comparison"]["outputs"]},
                "topk": record.get("topk", {}),
                "task": record.get("task") or {},
                "checks": list(record["checks"]),
                "artifacts": dict(artifacts.get(record["key"], {})),
                "sensitivity": sensitivity_brief(record),
                "agreement": record.get("agreement"),
                "targets": record.get("targets") or {},
            }
        )
    from pytest_qaccuracy.backend.host import host_preset

    return {
        "schema_version": SUMMARY_SCHEMA,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": versions(),
        "host_preset": host_preset(),  # what this machine's onnxruntime computes (docs/cpus.md)
        "status": status.status,
        "missing": status.to_dict(),
        "passed": status.complete and all(p["passed"] for p in pairs),
        "pairs": pairs,
    }
