"""Options of the plugin: declared once, read once into a frozen :class:`QAccuracySettings`.

Ini keys are declared as strings or lists of strings and parsed here (:mod:`.ini`), never by pytest,
so a bad value (``5%``, an inline comment, a string where a number belongs) reads the same on every
pytest. Every option is read by :func:`~.options.read_option` (the command line first, then the ini
file): a bad value is ``pytest.UsageError`` with one line naming the flag or the ini key it came
from, exit code 4 and no traceback.

Only stdlib and pytest at module level.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import pytest

from pytest_qaccuracy import defaults
from pytest_qaccuracy.plugin.ini import parse_bool
from pytest_qaccuracy.plugin.options import Option, given, read_option, usage_error
from pytest_qaccuracy.plugin.schemes import (
    BACKENDS,
    DEFAULT_BACKEND,
    DEFAULT_SCHEME,
    check_backend,
    check_scheme,
    check_targets,
)
from pytest_qaccuracy.tolerances import (
    DEFAULTS,
    GATE,
    TASK_KINDS,
    TOLERANCES,
    Rule,
    Tolerance,
    check_tolerance,
    parse_rules,
    parse_task_line,
)

GROUP = ("qaccuracy", "quantization accuracy regression testing (pytest-qaccuracy)")
DEFAULT_ARTIFACTS = ".qaccuracy"
DEFAULT_BASELINES = ".qaccuracy-baselines"
#: When the end-of-session sensitivity analysis runs, and how it ranks.
SENSITIVITY_SCOPES = ("failed", "all", "off")
SENSITIVITY_MODES = ("single", "leave-one-out")
DEFAULT_SENSITIVITY_METRIC = "cosine"
#: How far the end-of-session analysis of a failing pair goes: nothing, the node ranking, or the
#: ranking and a verified recipe search.
ANALYSIS_LEVELS = ("off", "rank", "recipe")
#: The analysis of a pair costs at most this multiple of the pair's own check time by default.
DEFAULT_ANALYSIS_BUDGET = (2.0, None)
#: Records the analysis reads by default: its cost grows with records times nodes (0: all records).
DEFAULT_SENSITIVITY_RECORDS = 32

T = TypeVar("T")

_RULE_TEXT = "'<pair glob>[::<layer glob>] <metric><op><value>'"
_TASK_LINE = f"'<{'|'.join(TASK_KINDS)}>:<value name> = <number>', e.g. 'max_drop:cer = 0.005'"
_TARGETS_HELP = (
    "Deployment targets every pair's output checks also run on, e.g. 'onnxruntime-avx2 onnxruntime-vnni' "
    "(scheme presets, onnxruntime's optionally pinned to a release: onnxruntime-arm64@1.28; this machine's "
    "own runs on onnxruntime, the others on the integer backend)"
)
_BUDGET_HELP = (
    "Time the analysis of one pair may take: a multiple of its check time (2x) or seconds (60s, 5m) (default 2x)"
)


def _flag(name: str, help: str) -> Option:
    """A command-line switch without a value or an ini key."""
    return Option(flag="--qaccuracy-" + name.replace("_", "-"), help=help, action="store_true")


#: Every option of the plugin, in ``--help`` order; :func:`add_options` declares them all from here.
OPTIONS: dict[str, Option] = {
    **{
        name: Option.named(
            name, f"{text} (overrides ini)", "N", ini_help=f"{text} ({'integer' if kind is int else 'number'})"
        )
        for name, (kind, text) in TOLERANCES.items()
    },
    "metrics": Option.named(
        "metrics",
        "Comma-separated metrics to compute (default: all registered)",
        "LIST",
        ini_help="Metrics to compute (default: all registered)",
        ini_type="args",
    ),
    "rules": Option("qaccuracy_tolerances", help=f"Rules {_RULE_TEXT}", ini_type="linelist"),
    "rules_cli": Option(
        flag="--qaccuracy-tolerance",
        dest="qaccuracy_tolerances",
        help=f"Add a {_RULE_TEXT} rule",
        metavar="RULE",
        action="append",
    ),
    "artifacts_dir": Option.named(
        "artifacts_dir",
        f"Where artifacts go (default: {DEFAULT_ARTIFACTS}/ under the rootdir)",
        "DIR",
        ini_help=f"Artifacts folder (default {DEFAULT_ARTIFACTS}/ under rootdir)",
    ),
    "no_artifacts": _flag("no_artifacts", "Write no artifacts"),
    "report": Option.named(
        "report",
        "Where the HTML report goes (default: report.html in the artifacts folder)",
        "PATH",
        ini_help="HTML report path (default report.html in the artifacts folder)",
    ),
    "providers": Option.named(
        "providers",
        "Comma-separated onnxruntime execution providers",
        "LIST",
        ini_help="onnxruntime execution providers",
        ini_type="args",
    ),
    "batch_size": Option("qaccuracy_batch_size", help=f"Records per onnxruntime run (default {defaults.BATCH_SIZE})"),
    "update_baselines": _flag(
        "update_baselines", "(Re)write the baselines of the pairs that ran and passed, in qaccuracy_baseline_dir"
    ),
    "update_all_baselines": _flag(
        "update_all_baselines", "(Re)write the baselines of every pair that ran, failing ones included"
    ),
    "baseline_dir": Option(
        "qaccuracy_baseline_dir",
        "--qaccuracy-baseline",
        "Use DIR as the baseline folder; every pair that runs must have a baseline there",
        f"Baseline folder, compared when it exists (default {DEFAULT_BASELINES}/ under the rootdir; commit it)",
        "DIR",
    ),
    "prune_baselines": _flag(
        "prune_baselines", "Delete the baseline files no pair of the session produced (only when every test ran)"
    ),
    "fail_on_improvement": Option.named(
        "fail_on_improvement",
        "Fail the drift check when a metric is better than its baseline beyond the drift rule",
        action="store_const",
        ini_help="Fail the drift check when a metric is better than its baseline beyond the rule (default false)",
    ),
    "max_drift": Option.named(
        "max_drift",
        "Add a drift rule such as sqnr:-1.0 or mse:+20%%",  # argparse formats a flag's help: %% is one %
        "RULE",
        action="append",
        ini_help="Drift rules such as 'sqnr:-1.0' or 'mse:+20%' (default sqnr:-1.0)",
        ini_type="linelist",
    ),
    "junit_properties": Option(
        "qaccuracy_junit_properties", help="Add key metrics to JUnit XML as properties (default true)"
    ),
    "sensitivity": Option.named(
        "sensitivity", "Sensitivity tables for failed pairs, all pairs, or off (default failed)", "WHEN"
    ),
    "sensitivity_metric": Option.named(
        "sensitivity_metric",
        f"Metric the sensitivity table ranks nodes by (default {DEFAULT_SENSITIVITY_METRIC})",
        "NAME",
    ),
    "sensitivity_mode": Option.named(
        "sensitivity_mode", "Sensitivity mode: single or leave-one-out (default single)", "MODE"
    ),
    "sensitivity_top": Option.named("sensitivity_top", f"Rows of the sensitivity table (default {defaults.TOP})", "N"),
    "sensitivity_records": Option.named(
        "sensitivity_records",
        f"Records the sensitivity analysis reads, from the first (default {DEFAULT_SENSITIVITY_RECORDS}; 0: all)",
        "N",
    ),
    "analysis": Option.named(
        "analysis", "End-of-session analysis of failed pairs: off, rank (nodes) or recipe (default recipe)", "LEVEL"
    ),
    "analysis_budget": Option.named("analysis_budget", _BUDGET_HELP, "LIMIT"),
    "backend": Option.named(
        "backend", f"Backend running the quantized model: {' or '.join(BACKENDS)} (default {DEFAULT_BACKEND})", "NAME"
    ),
    "scheme": Option.named(
        "scheme", f"Integer scheme preset of the integer backend and of {GATE} (default {DEFAULT_SCHEME})", "PRESET"
    ),
    "targets": Option.named("targets", _TARGETS_HELP, "PRESETS", ini_type="linelist"),
    "task_metrics": Option.named(
        "task_metrics",
        "Task metrics every pair computes: 'module:Class', an entry point or a built-in (ctc, ...)",
        "LIST",
        ini_type="linelist",
    ),
    "task_tolerances": Option(
        "qaccuracy_task_tolerances", help=f"Task-metric tolerances {_TASK_LINE}", ini_type="linelist"
    ),
    "task_tolerances_cli": Option(
        flag="--qaccuracy-task-tolerance",
        dest="qaccuracy_task_tolerances",
        help=f"Task-metric tolerances {_TASK_LINE} (repeatable; wins over the ini line of the same name)",
        metavar="LINE",
        action="append",
    ),
}


@dataclass(frozen=True, slots=True)
class QAccuracySettings:
    """Everything read from the command line and ini files, validated.

    ``tolerances`` maps a tolerance name to its :class:`Tolerance` (value and source); rules are not yet checked against
    the metric registry (that needs numpy; it happens on first use).
    """

    tolerances: Mapping[str, Tolerance]
    metrics: tuple[str, ...] | None
    rules: tuple[Rule, ...]
    max_drift: tuple[str, ...]
    artifacts_dir: Path | None
    providers: tuple[str, ...]
    batch_size: int
    baseline_dir: Path | None
    save_baseline_dir: Path | None
    junit_properties: bool
    #: ``--qaccuracy-baseline=DIR`` was given: compare even if DIR is missing, and a pair without a
    #: baseline fails its drift check; otherwise ``baseline_dir`` is compared only when it exists
    baseline_required: bool = False
    #: write the baselines of failing pairs too (``--qaccuracy-update-all-baselines``)
    save_failing_baselines: bool = False
    #: delete the baseline files no pair of a complete session produced (``--qaccuracy-prune-baselines``)
    prune_baselines: bool = False
    #: a metric better than its baseline beyond the drift rule fails the drift check
    fail_on_improvement: bool = False
    sensitivity: str = "failed"
    sensitivity_metric: str = DEFAULT_SENSITIVITY_METRIC
    sensitivity_mode: str = "single"
    sensitivity_top: int = defaults.TOP
    sensitivity_records: int = DEFAULT_SENSITIVITY_RECORDS
    analysis: str = "recipe"
    #: (factor of the pair's check time, None) or (None, seconds)
    analysis_budget: tuple[float | None, float | None] = DEFAULT_ANALYSIS_BUDGET
    backend: str = DEFAULT_BACKEND
    scheme: str = DEFAULT_SCHEME
    targets: tuple[str, ...] = ()
    #: task metrics every pair computes (import paths, entry points or built-in names), checked at session start
    task_metrics: tuple[str, ...] = ()
    #: the HTML report (``--qaccuracy-report``); None: ``report.html`` in the artifacts folder
    report: Path | None = None
    #: option name (a key of :data:`OPTIONS`) -> the flag or ini key it was given by, for checks
    #: that run after configure time
    origins: Mapping[str, str] = field(default_factory=dict)

    def where(self, name: str) -> str:
        """How an error names option ``name``: the flag or ini key it was given by (the ini key if unset)."""
        option = OPTIONS[name]
        return self.origins.get(name) or option.ini or option.flag or name


def add_options(parser: pytest.Parser) -> None:
    """Declare every ``--qaccuracy-*`` flag and ``qaccuracy_*`` ini key of :data:`OPTIONS`."""
    group = parser.getgroup(*GROUP)
    for option in OPTIONS.values():
        option.declare(parser, group)


# -- parsers: a value as given -> the setting; ValueError (a reason) when it is bad ------------------


def _choice(choices: Sequence[str]) -> Callable[[object], str]:
    def parse(value: object) -> str:
        text = str(value).strip().lower()
        if text not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {value!r}")
        return text

    return parse


def _budget(value: object) -> tuple[float | None, float | None]:
    """``2x`` (a multiple of the pair's check time) or ``90s``, ``5m`` (seconds)."""
    text = str(value).strip().lower()
    units = {"x": 0, "s": 1, "m": 60, "h": 3600}
    try:
        number, unit = float(text[:-1]), text[-1:]
    except ValueError:
        number, unit = -1.0, ""
    if unit not in units or not number > 0:
        raise ValueError(f"expected a multiple of the check time (2x) or a time (90s, 5m), got {value!r}")
    return (number, None) if unit == "x" else (None, number * units[unit])


def _integer(minimum: int) -> Callable[[object], int]:
    def parse(value: object) -> int:
        try:
            number = int(str(value).strip())
        except ValueError:
            number = minimum - 1
        if isinstance(value, bool) or number < minimum:
            raise ValueError(f"expected an integer >= {minimum}, got {value!r}")
        return number

    return parse


def _metric_name(value: object) -> str:
    """A metric name (the registry is checked at session start, since it needs numpy)."""
    text = str(value).strip().lower()
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", text):
        raise ValueError(f"expected one metric name such as cosine, got {value!r}")
    return text


def _names(value: object) -> tuple[str, ...] | None:
    """Names separated by commas (the command line) or a list of them (the ini file); None if empty."""
    parts = [value] if isinstance(value, str) else [str(part) for part in value] if isinstance(value, list) else []
    names = tuple(x.strip() for part in parts for x in part.split(",") if x.strip())
    return names or None


def _targets(value: object) -> tuple[str, ...]:
    return check_targets(" ".join(value) if isinstance(value, list) else value)


def _drift_rules(value: object) -> tuple[str, ...]:
    from pytest_qaccuracy.report.baseline import parse_drift_rule  # stdlib only; imported when needed

    lines = tuple(str(line) for line in value) if isinstance(value, list) else ()
    for text in lines:
        parse_drift_rule(text)
    return lines


def _tolerances(config: pytest.Config) -> dict[str, Tolerance]:
    found = {name: Tolerance(name, value, "default") for name, value in DEFAULTS.items()}
    for name in TOLERANCES:
        read = read_option(config, OPTIONS[name], lambda value, name=name: check_tolerance(name, value))
        if read is not None:
            found[name] = Tolerance(name, read[0], read[1].source)
    return found


def _task_tolerances(config: pytest.Config) -> dict[str, Tolerance]:
    """``max_drop:cer = 0.005`` lines of the ini file, then of the command line (which wins)."""
    found: dict[str, Tolerance] = {}
    for name in ("task_tolerances", "task_tolerances_cli"):
        given_lines = given(config, OPTIONS[name])
        if given_lines is None:
            continue
        lines, origin = given_lines
        for line in lines if isinstance(lines, list) else [lines]:
            if not str(line).strip() or str(line).strip().startswith("#"):
                continue
            try:
                key, value = parse_task_line(str(line))
            except ValueError as exc:
                raise usage_error(origin.where, exc) from None
            found[key] = Tolerance(key, value, origin.source)
    return found


def _rules(config: pytest.Config) -> list[Rule]:
    """Ini rules, then command-line rules (positions count rules: the command line's come after every ini rule)."""
    rules: list[Rule] = []
    for name in ("rules", "rules_cli"):
        found = given(config, OPTIONS[name])
        if found is None:
            continue
        lines, origin = found
        try:
            parsed = parse_rules([str(line) for line in lines] if isinstance(lines, list) else [], origin.source)
        except ValueError as exc:
            raise usage_error(origin.where, exc) from None
        rules += [replace(r, position=r.position + len(rules)) for r in parsed]
    return rules


def _path(config: pytest.Config, name: str) -> Path | None:
    """A path option: relative to where pytest was invoked (command line) or to the ini file."""
    found = given(config, OPTIONS[name])
    if found is None:
        return None
    value, origin = found
    if origin.command_line:
        return (config.invocation_params.dir / str(value)).resolve()
    base = config.inipath.parent if config.inipath else config.invocation_params.dir
    return (base / str(value)).resolve()


def _baselines(config: pytest.Config) -> dict[str, Any]:
    """The baseline folder (``--qaccuracy-baseline`` > ini > default) and where the session writes."""
    folder = _path(config, "baseline_dir") or config.rootpath / DEFAULT_BASELINES
    save_all = bool(config.getoption("qaccuracy_update_all_baselines"))
    save = folder if save_all or config.getoption("qaccuracy_update_baselines") else None
    return {
        "baseline_dir": folder,
        "save_baseline_dir": save,
        "baseline_required": bool(config.getoption("qaccuracy_baseline")),
        "save_failing_baselines": save_all,
        "prune_baselines": bool(config.getoption("qaccuracy_prune_baselines")),
    }


def load_settings(config: pytest.Config) -> QAccuracySettings:
    """Read and check every option once; ``pytest.UsageError`` on a bad value."""
    origins: dict[str, str] = {}

    def read(name: str, parse: Callable[[object], T], default: T) -> T:
        found = read_option(config, OPTIONS[name], parse)
        if found is None:
            return default
        origins[name] = found[1].where
        return found[0]

    tolerances = {**_tolerances(config), **_task_tolerances(config)}
    rules = _rules(config)
    batch_size = read("batch_size", _integer(1), defaults.BATCH_SIZE)
    drift = read("max_drift", _drift_rules, ())
    artifacts = None
    if not config.getoption("qaccuracy_no_artifacts"):
        artifacts = _path(config, "artifacts_dir") or (config.rootpath / DEFAULT_ARTIFACTS)
        found = given(config, OPTIONS["artifacts_dir"])
        if found is not None:
            origins["artifacts_dir"] = found[1].where
    backend = read("backend", check_backend, DEFAULT_BACKEND)
    scheme = read("scheme", check_scheme, DEFAULT_SCHEME)
    return QAccuracySettings(
        tolerances=tolerances,
        metrics=read("metrics", _names, None),
        rules=tuple(rules),
        max_drift=drift,
        artifacts_dir=artifacts,
        providers=read("providers", _names, None) or ("CPUExecutionProvider",),
        batch_size=batch_size,
        **_baselines(config),
        junit_properties=read("junit_properties", parse_bool, True),
        fail_on_improvement=read("fail_on_improvement", parse_bool, False),
        sensitivity=read("sensitivity", _choice(SENSITIVITY_SCOPES), "failed"),
        sensitivity_metric=read("sensitivity_metric", _metric_name, DEFAULT_SENSITIVITY_METRIC),
        sensitivity_mode=read("sensitivity_mode", _choice(SENSITIVITY_MODES), "single"),
        sensitivity_top=read("sensitivity_top", _integer(1), defaults.TOP),
        sensitivity_records=read("sensitivity_records", _integer(0), DEFAULT_SENSITIVITY_RECORDS),
        analysis=read("analysis", _choice(ANALYSIS_LEVELS), "recipe"),
        analysis_budget=read("analysis_budget", _budget, DEFAULT_ANALYSIS_BUDGET),
        backend=backend,
        scheme=scheme,
        targets=read("targets", _targets, ()),
        task_metrics=read("task_metrics", _names, None) or (),
        report=_path(config, "report"),
        origins=origins,
    )


def check_metrics(settings: QAccuracySettings) -> None:
    """Every metric the options name (``qaccuracy_metrics``, the metric of each ``qaccuracy_tolerances``
    rule, the sensitivity metric) must be in the registry: else one usage error naming the option as
    it was given, before any test (not a failure of every test). The registry (numpy) is imported
    only when one of them is given."""
    named: list[tuple[str, str, list[str]]] = []  # (where, what, names)
    if settings.metrics:
        named.append((settings.where("metrics"), "", list(settings.metrics)))
    for rule in settings.rules:
        option = OPTIONS["rules_cli" if rule.source.startswith("command line") else "rules"]
        named.append((option.flag or option.ini or "", f"tolerance rule {rule.text!r}: ", [rule.metric]))
    if settings.sensitivity != "off" and settings.sensitivity_metric != DEFAULT_SENSITIVITY_METRIC:
        named.append((settings.where("sensitivity_metric"), "", [settings.sensitivity_metric]))
    if not named:
        return
    from pytest_qaccuracy.errors import QAccuracyError
    from pytest_qaccuracy.metrics import parse_metric_names

    for where, what, names in named:
        try:
            parse_metric_names(names)
        except QAccuracyError as exc:
            raise usage_error(where, ValueError(f"{what}{exc}")) from None


def check_task_metrics(settings: QAccuracySettings) -> None:
    """Every configured task metric imported and created once: one that cannot be (an import path that
    does not resolve, a class missing a method) is a usage error naming the option and the metric."""
    if not settings.task_metrics:
        return
    from pytest_qaccuracy.metrics.task import parse_task_specs

    try:
        parse_task_specs(list(settings.task_metrics))
    except ValueError as exc:
        raise usage_error(settings.where("task_metrics"), exc) from None
