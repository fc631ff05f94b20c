"""Sensitivity tables for the session summary: their options, and the analysis of checked pairs.

At the end of the session, the process that compared a pair (an xdist worker, or the only process)
ranks the pair's quantized nodes with :func:`~pytest_qaccuracy.analysis.sensitivity_report.analyse_pair`,
once per pair, for the pairs that failed (``failed``, the default; expected failures count) or for
all of them (``all``). The report's ``to_dict()`` goes into the pair's record under
``"sensitivity"``, so it crosses xdist as plain builtins; the controller writes the artifacts and
prints the tables. An analysis that raises leaves a one-line reason instead: it never ends the session.

The sweep target comes from the pair's own failed output tolerance on cosine or SQNR (``min_cosine
= 0.99`` gives ``cosine>=0.99``), so the suggestion says what to keep in float to get back within it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import pytest

from pytest_qaccuracy.plugin.backend import GATE
from pytest_qaccuracy.plugin.ini import ini_text

SCOPES = ("failed", "all", "off")
MODES = ("single", "leave-one-out")
DEFAULT_METRIC = "cosine"
DEFAULT_TOP = 10
#: Records the analysis reads by default: its cost grows with records times nodes (0: all records).
DEFAULT_RECORDS = 32
#: Output metrics whose failed check sets the sweep target (the sweep measures the mean over outputs).
TARGET_METRICS = ("cosine", "sqnr")


class PairFiles(Protocol):
    """The files of a pair that the analysis reads (a :class:`~pytest_qaccuracy.plugin.session.PairSpec`)."""

    @property
    def fp32(self) -> Path: ...
    @property
    def quantized(self) -> Path: ...
    @property
    def data(self) -> Path: ...


class SensitivitySettings(Protocol):
    """The settings the analysis reads (a :class:`~pytest_qaccuracy.plugin.settings.QAccuracySettings`)."""

    @property
    def sensitivity(self) -> str: ...
    @property
    def sensitivity_metric(self) -> str: ...
    @property
    def sensitivity_mode(self) -> str: ...
    @property
    def sensitivity_records(self) -> int: ...


class AnalysedSession(Protocol):
    """What the analysis needs of the run state (a :class:`~pytest_qaccuracy.plugin.session.QAccuracySession`).

    Declared here, so that this module, which the settings and the session both import, imports neither.
    """

    @property
    def settings(self) -> SensitivitySettings: ...
    @property
    def records(self) -> dict[str, dict[str, Any]]: ...
    def model_pair(self, spec: Any) -> Any: ...
    def runtime_options(self) -> Any: ...


def add_sensitivity_options(parser: pytest.Parser, group: Any) -> None:
    """Declare ``qaccuracy_sensitivity*`` ini keys and their ``--qaccuracy-sensitivity*`` flags."""
    options = (
        ("sensitivity", "WHEN", "Sensitivity tables for failed pairs, all pairs, or off (default failed)"),
        ("sensitivity_metric", "NAME", f"Metric the sensitivity table ranks nodes by (default {DEFAULT_METRIC})"),
        ("sensitivity_mode", "MODE", "Sensitivity mode: single or leave-one-out (default single)"),
        ("sensitivity_top", "N", f"Rows of the sensitivity table (default {DEFAULT_TOP})"),
        (
            "sensitivity_records",
            "N",
            f"Records the sensitivity analysis reads, from the first (default {DEFAULT_RECORDS}; 0: all)",
        ),
    )
    for name, metavar, help_text in options:
        flag = "--qaccuracy-" + name.replace("_", "-")
        group.addoption(flag, dest=f"qaccuracy_{name}", default=None, metavar=metavar, help=help_text)
        parser.addini(f"qaccuracy_{name}", help_text, default=None)


def _raw(config: pytest.Config, name: str) -> tuple[object, str]:
    """The value given for option ``name`` (command line first, then ini) and how to name it in errors."""
    cli = config.getoption(f"qaccuracy_{name}")
    if cli is not None:
        return cli, "--qaccuracy-" + name.replace("_", "-")
    return ini_text(config, f"qaccuracy_{name}"), f"qaccuracy_{name}"


def _choice(config: pytest.Config, name: str, choices: Sequence[str], default: str) -> str:
    value, where = _raw(config, name)
    if value is None or value == "":
        return default
    text = str(value).strip().lower()
    if text not in choices:
        raise pytest.UsageError(f"{where}: expected one of {', '.join(choices)}, got {value!r}")
    return text


def get_sensitivity(config: pytest.Config) -> str:
    """``failed``, ``all`` or ``off``."""
    return _choice(config, "sensitivity", SCOPES, "failed")


def get_sensitivity_mode(config: pytest.Config) -> str:
    """``single`` or ``leave-one-out``."""
    return _choice(config, "sensitivity_mode", MODES, "single")


def get_sensitivity_metric(config: pytest.Config) -> str:
    """A metric name (the registry is checked at session start, since it needs numpy)."""
    value, where = _raw(config, "sensitivity_metric")
    text = DEFAULT_METRIC if value is None or value == "" else str(value).strip().lower()
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", text):
        raise pytest.UsageError(f"{where}: expected one metric name such as cosine, got {value!r}")
    return text


def _integer(config: pytest.Config, name: str, default: int, minimum: int) -> int:
    value, where = _raw(config, name)
    if value is None or value == "":
        return default
    try:
        number = int(str(value).strip())
    except ValueError:
        number = minimum - 1
    if isinstance(value, bool) or number < minimum:
        raise pytest.UsageError(f"{where}: expected an integer >= {minimum}, got {value!r}")
    return number


def get_sensitivity_top(config: pytest.Config) -> int:
    """Rows of the table, at least 1."""
    return _integer(config, "sensitivity_top", DEFAULT_TOP, 1)


def get_sensitivity_records(config: pytest.Config) -> int:
    """Records the analysis reads (the first N); 0 for all of them."""
    return _integer(config, "sensitivity_records", DEFAULT_RECORDS, 0)


def sensitivity_settings(config: pytest.Config) -> dict[str, Any]:
    """The sensitivity fields of ``QAccuracySettings``."""
    return {
        "sensitivity": get_sensitivity(config),
        "sensitivity_metric": get_sensitivity_metric(config),
        "sensitivity_mode": get_sensitivity_mode(config),
        "sensitivity_top": get_sensitivity_top(config),
        "sensitivity_records": get_sensitivity_records(config),
    }


def check_metric(scope: str, metric: str) -> None:
    """A metric the registry lacks is a usage error. Only a non-default metric imports the registry."""
    if scope == "off" or metric == DEFAULT_METRIC:
        return
    from pytest_qaccuracy.errors import QAccuracyError
    from pytest_qaccuracy.metrics import parse_metric_names

    try:
        parse_metric_names([metric])
    except QAccuracyError as exc:
        raise pytest.UsageError(f"qaccuracy_sensitivity_metric: {exc}") from None


def exclusion_target(checks: Sequence[Mapping[str, Any]], metric: str) -> dict[str, Any] | None:
    """The failed output check on cosine or SQNR the sweep aims at, or None.

    The strictest one, preferring the ranking metric, then cosine. Every process picks the same way,
    so the controller keeps the xdist worker's pick with the highest :func:`target_rank`.
    """
    from pytest_qaccuracy.plugin.checks import deployment_target

    failed = [
        c
        for c in checks
        if not c["passed"]
        and c["target"].startswith("output ")
        and deployment_target(c["target"]) is None  # the analysis runs the pair's own backend
        and c["metric"] in TARGET_METRICS
        and c["op"] in (">=", ">")
        and c["threshold"] is not None
    ]
    if not failed:
        return None
    best = max(failed, key=lambda c: _check_rank(c, metric))
    keys = ("check", "target", "metric", "threshold", "source")
    return {k: best[k] for k in keys}


def _check_rank(check: Mapping[str, Any], metric: str) -> tuple[bool, bool, float]:
    return (check["metric"] == metric, check["metric"] == "cosine", float(check["threshold"]))


def target_rank(entry: Mapping[str, Any] | None) -> tuple[bool, ...]:
    """Order of two analyses of one pair (from two xdist workers): the one a serial run would make wins."""
    if not entry:
        return (False,)
    target = entry.get("target_from")
    return (True,) if target is None else (True, True, *_check_rank(target, entry["metric"]))


def merge_entry(mine: dict[str, Any], theirs: Mapping[str, Any]) -> None:
    """Keep, in the record ``mine``, the analysis a serial run would have made (see :func:`exclusion_target`)."""
    entry = theirs.get("sensitivity")
    if entry is not None and target_rank(entry) > target_rank(mine.get("sensitivity")):
        mine["sensitivity"] = entry


def analyse_records(state: AnalysedSession, specs: Mapping[str, PairFiles]) -> None:
    """Analyse the selected pairs of ``state.records`` (``specs``: record key -> pair), once per pair."""
    settings = state.settings
    if settings.sensitivity == "off":
        return
    done: dict[tuple[Any, ...], dict[str, Any]] = {}
    for key, record in state.records.items():
        spec = specs.get(key)
        # the agreement gate measures the integer arithmetic, which a node ranking cannot explain
        failed = not all(c["passed"] for c in record["checks"] if c["check"] != GATE)
        if spec is None or "sensitivity" in record or (settings.sensitivity == "failed" and not failed):
            continue
        target = exclusion_target(record["checks"], settings.sensitivity_metric)
        text = None if target is None else f"{target['metric']}>={float(target['threshold'])!r}"
        ident = (spec.fp32, spec.quantized, spec.data, text)
        if ident not in done:
            done[ident] = analyse_one(state, spec, text)
        record["sensitivity"] = {**done[ident], "target_from": target}


def analyse_one(state: AnalysedSession, spec: PairFiles, target: str | None) -> dict[str, Any]:
    """One pair's record entry: the report's ``to_dict()``, or a one-line ``error``."""
    settings = state.settings
    entry: dict[str, Any] = {"mode": settings.sensitivity_mode, "metric": settings.sensitivity_metric}
    try:
        from pytest_qaccuracy.analysis.sensitivity_report import analyse_pair

        report = analyse_pair(
            state.model_pair(spec),
            spec.data,
            metrics=settings.sensitivity_metric,
            mode=settings.sensitivity_mode,
            target=target,
            options=state.runtime_options(),
            records=settings.sensitivity_records or None,
        )
        entry["report"] = report.to_dict()
    except Exception as exc:  # a bad model or dataset must not end the session
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        entry["error"] = f"{type(exc).__name__}: {first}"
    return entry


__all__ = [
    "MODES",
    "SCOPES",
    "AnalysedSession",
    "PairFiles",
    "SensitivitySettings",
    "add_sensitivity_options",
    "analyse_records",
    "check_metric",
    "exclusion_target",
    "get_sensitivity",
    "get_sensitivity_metric",
    "get_sensitivity_mode",
    "get_sensitivity_records",
    "get_sensitivity_top",
    "merge_entry",
    "sensitivity_settings",
]
