"""The session summary: terminal lines (tabulate) and the ``summary.json`` document. Pure: no pytest.

Both take the plugin's pair records (plain dicts: ``id``, ``comparison`` (the comparison JSON), ``topk``,
``checks``), so they read the same whether the results came from this process or xdist workers.
"""

from __future__ import annotations

import hashlib
import platform
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from pytest_qaccuracy.numbers import format_number
from pytest_qaccuracy.outcomes import pair_status
from pytest_qaccuracy.report.completeness import SessionStatus
from pytest_qaccuracy.report.terminal import escape_control, match_warning

SUMMARY_SCHEMA = 1
#: Output metrics shown in the terminal summary when present.
KEY_METRICS = ("cosine", "sqnr", "mse", "max_abs", "lsb")
SENSITIVE_LAYERS = 3
#: A pair's default (backend, scheme): not shown in its summary line.
DEFAULT_RUN = ("onnxruntime", "onnxruntime")


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


def expected_failure(record: Mapping[str, Any]) -> str | None:
    """The xfail reason when pytest reported every failed check's test as xfailed, else None."""
    status, reason = record_status(record)
    return reason if status == "xfailed" else None


def _check_rows(record: Mapping[str, Any]) -> list[list[str]]:
    """One row per distinct (target, metric, op, threshold) among output checks, failures first."""
    rows: dict[tuple[Any, ...], list[str]] = {}
    for check in record["checks"]:
        if check["target"].startswith("layer "):
            continue
        key = (check["target"], check["metric"], check["op"], check["threshold"])
        limit = "-" if check["threshold"] is None else f"{check['op']} {_fmt(check['threshold'])}"
        row = [check["target"], check["metric"], _fmt(check["value"]), limit, "pass" if check["passed"] else "FAIL"]
        if key not in rows or row[-1] == "FAIL":
            rows[key] = row
    checked = {(r[0], r[1]) for r in rows.values()}
    for output in record["comparison"]["outputs"]:
        target = f"output '{output['name']}'"
        for metric in KEY_METRICS:
            if metric in output["metrics"] and (target, metric) not in checked:
                rows[(target, metric)] = [target, metric, _fmt(output["metrics"][metric]), "-", ""]
    return sorted(rows.values(), key=lambda r: (r[-1] != "FAIL", r[0], r[1]))


def _layer_line(record: Mapping[str, Any]) -> list[str]:
    layers = record["comparison"]["layers"]
    checks = [c for c in record["checks"] if c["target"].startswith("layer ")]
    lines = []
    if checks:
        failed = [c for c in checks if not c["passed"]]
        lines.append(f"  layer rules: {len(checks) - len(failed)} / {len(checks)} pass")
        lines += [f"    FAIL {c['detail']}" for c in failed[:5]]
    higher = record["comparison"].get("higher_is_better", {})
    metric = next((m for m in ("sqnr", "cosine", "mse") if m in record["comparison"]["metric_definitions"]), None)
    if metric and layers:
        sign = 1.0 if higher.get(metric, False) else -1.0  # worst first
        defined = [x for x in layers if x["metrics"].get(metric) is not None]
        worst = sorted(defined, key=lambda x: sign * x["metrics"][metric])[:SENSITIVE_LAYERS]
        unit = " dB" if metric == "sqnr" else ""
        names = ", ".join(f"{x['tensor']} ({x['op_type']}) {_fmt(x['metrics'][metric])}{unit}" for x in worst)
        lines.append(f"  most sensitive layers ({metric}): {names}")
    return lines


def target_view(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """Deployment targets side by side, values formatted: ``{headers, rows}`` (rows per output: cosine,
    SQNR, top-1 agreement; the last row the verdict of each target's checks), or None without targets."""
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
    rows.append(["", "checks", *("pass" if targets[n]["passed"] else "FAIL" for n in names)])
    return {"headers": ["output", "metric", *(f"{n} ({kinds[n]})" for n in names)], "rows": rows}


def _target_lines(record: Mapping[str, Any]) -> list[str]:
    from tabulate import tabulate

    view = target_view(record)
    if view is None:
        return []
    table = tabulate(view["rows"], headers=view["headers"], tablefmt="simple")
    return ["  deployment targets:", *("    " + line for line in table.splitlines())]


def _task_lines(record: Mapping[str, Any]) -> list[str]:
    """``task metrics: cer fp32 0.012 -> quantized 0.031 (drop 0.019), against the targets, 8 records``."""
    lines = []
    for name, value in sorted((record.get("task") or {}).items()):
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


def summary_lines(
    records: Sequence[Mapping[str, Any]], artifacts: str | None = None, sensitivity_top: int = 10
) -> list[str]:
    """The terminal summary: one block per pair (header, tabulate table, sensitive layers, and the
    sensitivity table with at most ``sensitivity_top`` rows when the pair was analysed)."""
    from tabulate import tabulate

    from pytest_qaccuracy.report.sensitivity_summary import sensitivity_lines

    lines: list[str] = []
    for record in records:
        comparison = record["comparison"]
        expected = expected_failure(record)
        verdict = "PASSED" if record_passed(record) else f"FAILED as expected: {expected};" if expected else "FAILED"
        lines.append(
            f"{record['id']}: {verdict} ({comparison['fp32_model']} vs {comparison['quantized_model']} "
            f"on {comparison['data']}, {comparison['records']} records{_run_label(record)})"
        )
        warning = match_warning(len(comparison["layers"]), len(comparison.get("unmatched", {}).get("fp32", [])))
        if warning:
            lines.append(f"  {warning}")
        lines += [f"  warning: {text}" for text in channel_warnings(comparison)]
        lines += _counted_lines(record)
        rows = _check_rows(record)
        for output, counts in sorted(record.get("topk", {}).items()):
            for k, row in counts["k"].items():
                target = f"output '{output}'"
                if not any(r[0] == target and r[1] == f"top-{k} agreement" for r in rows):
                    rows.append([target, f"top-{k} agreement", _fmt(row["agreement"]), "-", ""])
        table = tabulate(rows, headers=["target", "metric", "value", "tolerance", "status"], tablefmt="simple")
        lines += ["  " + line for line in table.splitlines()]
        lines += _task_lines(record)
        lines += _target_lines(record)
        lines += _layer_line(record)
        lines += sensitivity_lines(record, sensitivity_top)
        lines.append("")
    passed = sum(record_passed(r) for r in records)
    expected = sum(expected_failure(r) is not None for r in records)
    counts = f"{passed} / {len(records)} pairs passed" + (f", {expected} failed as expected" if expected else "")
    lines.append(counts + (f"; artifacts in {artifacts}" if artifacts else ""))
    return [escape_control(line) for line in lines]


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


__all__ = [
    "SUMMARY_SCHEMA",
    "file_sha256",
    "record_passed",
    "summary_document",
    "summary_lines",
    "target_view",
    "versions",
]
