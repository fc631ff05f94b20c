"""Per-layer baselines: a pair's error profile saved once, and drift checks against it later.

A baseline file holds each output's and each layer's metrics, and the quantized side of each task
metric (``task``, when the pair has task metrics). Drift rules (``qaccuracy_max_drift``)
say how much a metric may worsen: ``sqnr:-1.0`` (SQNR may drop by 1 dB), ``mse:+20%`` (MSE may rise
by 20 %), ``cosine:-0.001``. The sign must point in the metric's worse direction.

Files are written for review in a diff: targets and metrics sorted by name, each value rounded to
what the drift rules can resolve (:func:`rounded`), the sha256 of the models and data and the
versions that produced them alongside; a file whose numbers and hashes did not change is not
rewritten. A metric that moved the better way by more than its rule is an *improvement*
(:func:`find_improvements`): reported, and failed only when the user asks.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_qaccuracy.atomic import atomic_write_json, finite_json
from pytest_qaccuracy.numbers import format_number

if TYPE_CHECKING:
    from pytest_qaccuracy.analysis.results import ComparisonResult

BASELINE_SCHEMA = 1
DEFAULT_DRIFT = ("sqnr:-1.0",)
#: Significant digits kept of every metric value (a rule finer than this keeps more).
SIGNIFICANT = 4
#: A rule's amount is resolved to this fraction of it (a 1 dB rule: 0.01 dB).
RESOLUTION = 100
#: Keys that say what produced the numbers; a change there alone does not rewrite a file.
PRODUCED_BY = "produced_by"

_DRIFT = re.compile(
    r"^\s*(?P<metric>[A-Za-z_][A-Za-z0-9_]*)\s*:\s*(?P<sign>[+-])?(?P<value>[0-9.eE+-]+)(?P<pct>%)?\s*$"
)


@dataclass(frozen=True, slots=True)
class DriftRule:
    """How far ``metric`` may move in its worse direction: an amount, or a percentage of the baseline."""

    metric: str
    limit: float
    percent: bool
    text: str

    def allowed(self, baseline: float, higher_is_better: bool) -> float:
        """The worst current value still accepted."""
        amount = abs(baseline) * self.limit / 100 if self.percent else self.limit
        return baseline - amount if higher_is_better else baseline + amount


def parse_drift_rule(text: str, higher_is_better: Mapping[str, bool] | None = None) -> DriftRule:
    """Parse ``metric:[+-]value[%]``; a ValueError names the problem."""
    match = _DRIFT.match(text)
    if not match:
        raise ValueError(f"bad drift rule {text.strip()!r}: expected '<metric>:<+|-><value>[%]', e.g. 'sqnr:-1.0'")
    metric = match["metric"].lower()
    try:
        limit = float(match["value"])
    except ValueError:
        raise ValueError(f"bad drift rule {text.strip()!r}: {match['value']!r} is not a number") from None
    if higher_is_better is not None:
        if metric not in higher_is_better:
            raise ValueError(f"drift rule {text.strip()!r}: unknown metric '{metric}'")
        worse = "-" if higher_is_better[metric] else "+"
        if match["sign"] and match["sign"] != worse:
            raise ValueError(
                f"drift rule {text.strip()!r}: {metric} gets worse as it {'falls' if worse == '-' else 'rises'}; "
                f"write {metric}:{worse}{match['value']}{match['pct'] or ''}"
            )
    return DriftRule(metric, limit, bool(match["pct"]), text.strip())


def decimals(value: float, metric: str, rules: Sequence[DriftRule] = ()) -> int | None:
    """Decimal places that keep ``value`` of ``metric`` as precise as the drift rules on it can
    tell (1/:data:`RESOLUTION` of an amount or of a percentage of the value) and at least
    :data:`SIGNIFICANT` significant digits; None: keep it whole (zero, not finite, a rule of 0)."""
    if value == 0 or not math.isfinite(value):
        return None
    magnitude = math.floor(math.log10(abs(value)))
    places = SIGNIFICANT - 1 - magnitude
    for rule in rules:
        if rule.metric != metric:
            continue
        step = rule.limit * (abs(value) / 100 if rule.percent else 1.0) / RESOLUTION
        if step <= 0:
            return None
        places = max(places, -math.floor(math.log10(step)))
    return places


def rounded(value: Any, metric: str, rules: Sequence[DriftRule] = ()) -> Any:
    """``value`` rounded by :func:`decimals` (other values as they are)."""
    if isinstance(value, bool) or not isinstance(value, float):
        return value
    places = decimals(value, metric, rules)
    return value if places is None else round(value, places)


def _table(metrics: Mapping[str, Any], rules: Sequence[DriftRule]) -> dict[str, Any]:
    return {metric: rounded(metrics[metric], metric, rules) for metric in sorted(metrics)}


def profile(
    result: ComparisonResult,
    pair_id: str,
    task: Mapping[str, Mapping[str, Any]] | None = None,
    rules: Sequence[DriftRule] = (),
    produced_by: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The baseline document of one comparison; ``task`` (value name -> ``TaskValue.to_dict()``) adds
    the task metrics' quantized values (a pair without task metrics keeps the document it had).
    Values are rounded to what ``rules`` resolve (:func:`rounded`), targets and metrics sorted;
    ``produced_by`` (:func:`provenance`) says from which files and versions."""
    document: dict[str, Any] = {
        "schema_version": BASELINE_SCHEMA,
        "pair": pair_id,
        "fp32_model": result.fp32_model,
        "quantized_model": result.quantized_model,
        "data": result.data,
        "records": result.records,
        "higher_is_better": dict(sorted(result.higher_is_better.items())),
        "outputs": {o.name: _table(o.metrics, rules) for o in sorted(result.outputs, key=lambda o: o.name)},
        "layers": {x.tensor: _table(x.metrics, rules) for x in sorted(result.layers, key=lambda x: x.tensor)},
    }
    if task:
        document["task"] = {name: rounded(task[name].get("quantized"), name, rules) for name in sorted(task)}
        higher = document["higher_is_better"] | {k: bool(v.get("higher_is_better")) for k, v in task.items()}
        document["higher_is_better"] = dict(sorted(higher.items()))
    if produced_by is not None:
        document[PRODUCED_BY] = dict(produced_by)
    return document


def provenance(files: Mapping[str, str | None]) -> dict[str, Any]:
    """``produced_by``: the sha256 of each named file (``fp32_model``, ``quantized_model``, ``data``,
    ``labels``; a folder hashes its files) and the versions of Python and the packages."""
    from pytest_qaccuracy.report.summary import file_sha256, versions

    hashes = {name: file_sha256(Path(path)) for name, path in files.items() if path}
    return {"sha256": hashes, "versions": versions()}


def changed_files(document: Mapping[str, Any], files: Mapping[str, str | None]) -> list[str]:
    """Lines naming each file whose sha256 differs from the one the baseline recorded (an old
    baseline without hashes: none)."""
    from pytest_qaccuracy.report.summary import file_sha256

    saved = (document.get(PRODUCED_BY) or {}).get("sha256") or {}
    lines = []
    for name, path in files.items():
        before = saved.get(name)
        if not path or not isinstance(before, str):
            continue
        now = file_sha256(Path(path))
        if now != before:
            what = name.replace("_", " ")
            lines.append(f"{what} changed since the baseline (sha256 {before[:12]} -> {str(now)[:12]})")
    return lines


def save_baseline(path: Path, document: Mapping[str, Any]) -> Path:
    return atomic_write_json(path, document)


def _versions_aside(document: Any) -> Any:
    """``document`` without the versions that produced it (what decides a rewrite)."""
    if not isinstance(document, dict) or not isinstance(document.get(PRODUCED_BY), dict):
        return document
    return document | {PRODUCED_BY: {k: v for k, v in document[PRODUCED_BY].items() if k != "versions"}}


def write_baseline(path: Path, document: Mapping[str, Any]) -> str:
    """Write ``document`` unless ``path`` already holds its numbers and hashes: ``saved`` (new file),
    ``updated`` or ``unchanged`` (not rewritten, so a committed folder shows no spurious change,
    not even for a new version of a package that computes the same numbers)."""
    new = json.loads(json.dumps(finite_json(document)))
    try:
        old = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, ValueError):
        old = {}  # unreadable: replace it
    if _versions_aside(old) == _versions_aside(new):
        return "unchanged"
    save_baseline(path, new)
    return "saved" if old is None else "updated"


def baseline_files(directory: Path) -> list[str]:
    """The ``*.json`` file names directly in ``directory`` (none when it does not exist), sorted."""
    if not directory.is_dir():
        return []
    return sorted(p.name for p in directory.iterdir() if p.suffix == ".json" and p.is_file())


def _names(items: Sequence[str], limit: int = 10) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f", ... ({len(items) - limit} more)" if len(items) > limit else "")


def _count(label: str, items: Sequence[str], listed: bool) -> str:
    return f"{label} {len(items)}" + (f" ({_names(items)})" if listed and items else "")


@dataclass(frozen=True, slots=True)
class BaselineStatus:
    """What a session did with its baseline folder: compared pairs (and those with no baseline),
    or wrote them; ``stale`` are files there that no pair of the session produced."""

    directory: str
    updating: bool
    compared: tuple[str, ...] = ()
    drifted: tuple[str, ...] = ()
    unreadable: tuple[str, ...] = ()  # a baseline there that could not be compared: its drift check failed
    missing: tuple[str, ...] = ()
    saved: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    failing: tuple[str, ...] = ()
    stale: tuple[str, ...] = ()
    improved: tuple[str, ...] = ()  # pairs with a metric better than its baseline by more than the rule
    pruned: tuple[str, ...] = ()  # stale files deleted (--qaccuracy-prune-baselines)
    prune_refused: str = ""  # why the stale files were kept although pruning was asked for

    def line(self) -> str:
        """One line for the terminal summary, e.g. ``baselines .qaccuracy-baselines: saved 1, updated 0,
        unchanged 2, stale 1 (old-1a2b3c4d.json)``."""
        if self.updating:
            parts = [
                _count("saved", self.saved, False),
                _count("updated", self.updated, True),
                _count("unchanged", self.unchanged, False),
            ]
        else:
            moved = [f"{len(self.drifted)} drifted: {_names(self.drifted)}"] if self.drifted else []
            moved += [f"{len(self.improved)} improved: {_names(self.improved)}"] if self.improved else []
            parts = [f"compared {len(self.compared)}" + (f" ({'; '.join(moved)})" if moved else "")]
            parts.append(_count("missing", self.missing, True))
            if self.unreadable:
                parts.insert(1, _count("not compared (unreadable)", self.unreadable, True))
        stale = [_count("stale", self.stale, True)] if self.stale or not self.pruned else []
        if self.pruned:
            stale.append(_count("pruned", self.pruned, True))
        elif self.prune_refused and self.stale:
            stale[-1] += f" (not pruned: {self.prune_refused})"
        elif self.stale:
            stale[-1] += "; --qaccuracy-prune-baselines deletes them"
        text = f"baselines {self.directory}: " + ", ".join([*parts, *stale])
        if self.failing:
            text += (
                f"; not saved, failing: {_names(self.failing)} "
                "(--qaccuracy-update-all-baselines saves failing pairs too)"
            )
        return text


def load_baseline(path: Path) -> dict[str, Any] | None:
    """The baseline at ``path``, or None if there is none.

    Raises:
        ValueError: the file cannot be read, is not JSON, is not a baseline of this schema, or holds
            a value that is not a number; the message names the file and the key (``layers.'relu1'.sqnr``).
    """
    if not path.is_file():
        return None
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except ValueError as exc:  # JSON syntax, or bytes that are not UTF-8
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(document, dict) or document.get("schema_version") != BASELINE_SCHEMA:
        version = document.get("schema_version") if isinstance(document, dict) else None
        raise ValueError(f"{path}: unsupported baseline schema_version {version!r}")
    for section in ("outputs", "layers"):
        _check_metrics_table(path, section, document.get(section, {}))
    higher = document.get("higher_is_better", {})
    if not isinstance(higher, dict) or not all(isinstance(v, bool) for v in higher.values()):
        raise ValueError(f"{path}: higher_is_better: expected a table of true/false by metric")
    return document


def _check_metrics_table(path: Path, section: str, table: object) -> None:
    """``table`` maps a target to ``{metric: number or null}``; else a ValueError naming the key."""
    if not isinstance(table, dict):
        raise ValueError(f"{path}: {section}: expected a table of {section[:-1]} -> metrics")
    for target, metrics in table.items():
        if not isinstance(metrics, dict):
            raise ValueError(f"{path}: {section}.{target!r}: expected a table of metric -> number")
        for metric, value in metrics.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise ValueError(f"{path}: {section}.{target!r}.{metric}: {value!r} is not a number")


@dataclass(frozen=True, slots=True)
class Drift:
    """One target whose metric moved beyond its rule."""

    target: str
    metric: str
    baseline: float
    current: float | None
    allowed: float
    rule: str
    improved: bool = False  # moved the better way beyond the rule's amount
    #: what ``target`` names, as fields: ``output``, ``layer`` or ``task``, and the output's, tensor's
    #: or task value's name
    scope: str = "model"
    name: str | None = None

    def describe(self) -> str:
        baseline, current, limit = (format_number(v) for v in (self.baseline, self.current, self.allowed))
        if self.improved:
            return f"{self.target}: {self.metric} {baseline} -> {current} (better than {limit}, {self.rule})"
        return f"{self.target}: {self.metric} {baseline} -> {current} (limit {limit}, {self.rule})"


def find_drift(
    baseline: Mapping[str, Any],
    result: ComparisonResult,
    rules: Sequence[DriftRule],
    task: Mapping[str, Mapping[str, Any]] | None = None,
) -> tuple[list[Drift], list[str]]:
    """Drifts beyond ``rules``, and the baseline's outputs/layers (and task values) this result no
    longer has. ``task``: the run's task values (value name -> ``TaskValue.to_dict()``)."""
    moves, missing = _moves(baseline, result, rules, task)
    return [m for m in moves if not m.improved], missing


def find_improvements(
    baseline: Mapping[str, Any],
    result: ComparisonResult,
    rules: Sequence[DriftRule],
    task: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Drift]:
    """Targets whose metric moved the better way by more than its rule's amount (``sqnr:-1.0``: SQNR
    rose by more than 1 dB), with ``allowed`` the mirror of the rule's limit."""
    return [m for m in _moves(baseline, result, rules, task)[0] if m.improved]


def _moves(
    baseline: Mapping[str, Any],
    result: ComparisonResult,
    rules: Sequence[DriftRule],
    task: Mapping[str, Mapping[str, Any]] | None,
) -> tuple[list[Drift], list[str]]:
    """Drifts and improvements beyond ``rules``, and the targets the result no longer has."""
    task = task or {}
    higher = {**baseline.get("higher_is_better", {}), **result.higher_is_better}
    higher |= {name: bool(value.get("higher_is_better")) for name, value in task.items()}
    current = {("output", o.name): o.metrics for o in result.outputs}
    current |= {("layer", x.tensor): x.metrics for x in result.layers}
    current |= {("task", name): {name: value.get("quantized")} for name, value in task.items()}
    saved = {("output", k): v for k, v in baseline.get("outputs", {}).items()}
    saved |= {("layer", k): v for k, v in baseline.get("layers", {}).items()}
    saved |= {("task", k): {k: v} for k, v in baseline.get("task", {}).items()}
    drifts, missing = [], []
    for key, before in saved.items():
        scope, name = key
        target = f"{scope} '{name}'"
        if key not in current:
            missing.append(target)
            continue
        for rule in rules:
            old = before.get(rule.metric)
            if old is None or rule.metric not in current[key]:
                continue
            new = current[key][rule.metric]
            up = higher.get(rule.metric, False)
            worst = rule.allowed(float(old), up)
            ok = new is not None and (new >= worst if up else new <= worst)
            if not ok:
                drifts.append(Drift(target, rule.metric, float(old), new, worst, rule.text, scope=scope, name=name))
                continue
            best = 2 * float(old) - worst  # the limit mirrored to the better side
            if new is not None and (new > best if up else new < best):
                drift = Drift(target, rule.metric, float(old), new, best, rule.text, True, scope, name)
                drifts.append(drift)
    return drifts, missing
