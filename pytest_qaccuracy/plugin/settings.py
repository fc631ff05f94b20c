"""Options of the plugin: declared once, read once into a frozen :class:`QAccuracySettings`.

Ini keys are declared as strings or lists of strings and parsed here (:mod:`.ini`), never by pytest,
so a bad value (``5%``, an inline comment, a string where a number belongs) reads the same on every
pytest: ``pytest.UsageError`` with one line naming the option, exit code 4 and no traceback.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from pytest_qaccuracy.plugin.backend import add_backend_options, read_backend, read_targets
from pytest_qaccuracy.plugin.ini import ini_lines, ini_text, parse_bool
from pytest_qaccuracy.plugin.rules import DEFAULTS, TOLERANCES, Rule, check_tolerance, parse_number, parse_rules
from pytest_qaccuracy.plugin.sensitivity import add_sensitivity_options, sensitivity_settings

GROUP = ("qaccuracy", "quantization accuracy regression testing (pytest-qaccuracy)")
DEFAULT_ARTIFACTS = ".qaccuracy"
DEFAULT_BASELINES = ".qaccuracy-baselines"
DEFAULT_BATCH_SIZE = 8


@dataclass(frozen=True, slots=True)
class QAccuracySettings:
    """Everything read from the command line and ini files, validated.

    ``tolerances`` maps a tolerance name to ``(value, source)``; rules are not yet checked against
    the metric registry (that needs numpy; it happens on first use).
    """

    tolerances: Mapping[str, tuple[float, str]]
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
    ini_source: str = "ini file"
    extra: Mapping[str, str] = field(default_factory=dict)
    sensitivity: str = "failed"
    sensitivity_metric: str = "cosine"
    sensitivity_mode: str = "single"
    sensitivity_top: int = 10
    sensitivity_records: int = 32
    backend: str = "onnxruntime"
    scheme: str = "onnxruntime"
    targets: tuple[str, ...] = ()
    #: the HTML report (``--qaccuracy-report``); None: ``report.html`` in the artifacts folder
    report: Path | None = None


def add_options(parser: pytest.Parser) -> None:
    """Declare every ``--qaccuracy-*`` flag and ``qaccuracy_*`` ini key."""
    group = parser.getgroup(*GROUP)
    for name, (kind, help_text) in TOLERANCES.items():
        flag = "--qaccuracy-" + name.replace("_", "-")
        group.addoption(flag, dest=f"qaccuracy_{name}", default=None, metavar="N", help=f"{help_text} (overrides ini)")
        parser.addini(f"qaccuracy_{name}", f"{help_text} ({'integer' if kind is int else 'number'})", default=None)
    group.addoption(
        "--qaccuracy-metrics",
        dest="qaccuracy_metrics",
        default=None,
        metavar="LIST",
        help="Comma-separated metrics to compute (default: all registered)",
    )
    parser.addini("qaccuracy_metrics", "Metrics to compute (default: all registered)", type="args", default=[])
    group.addoption(
        "--qaccuracy-tolerance",
        dest="qaccuracy_tolerances",
        action="append",
        default=[],
        metavar="RULE",
        help="Add a '<pair glob>[::<layer glob>] <metric><op><value>' rule",
    )
    parser.addini("qaccuracy_tolerances", "Rules '<pair glob>[::<layer glob>] <metric><op><value>'", type="linelist")
    group.addoption(
        "--qaccuracy-artifacts-dir",
        dest="qaccuracy_artifacts_dir",
        default=None,
        metavar="DIR",
        help=f"Where artifacts go (default: {DEFAULT_ARTIFACTS}/ under the rootdir)",
    )
    parser.addini("qaccuracy_artifacts_dir", f"Artifacts folder (default {DEFAULT_ARTIFACTS}/ under rootdir)")
    group.addoption(
        "--qaccuracy-no-artifacts", dest="qaccuracy_no_artifacts", action="store_true", help="Write no artifacts"
    )
    group.addoption(
        "--qaccuracy-report",
        dest="qaccuracy_report",
        default=None,
        metavar="PATH",
        help="Where the HTML report goes (default: report.html in the artifacts folder)",
    )
    parser.addini("qaccuracy_report", "HTML report path (default report.html in the artifacts folder)")
    group.addoption(
        "--qaccuracy-providers",
        dest="qaccuracy_providers",
        default=None,
        metavar="LIST",
        help="Comma-separated onnxruntime execution providers",
    )
    parser.addini("qaccuracy_providers", "onnxruntime execution providers", type="args", default=[])
    parser.addini("qaccuracy_batch_size", f"Records per onnxruntime run (default {DEFAULT_BATCH_SIZE})", default=None)
    parser.addini(
        "qaccuracy_baseline_dir",
        f"Baseline folder, compared when it exists (default {DEFAULT_BASELINES}/ under the rootdir; commit it)",
    )
    group.addoption(
        "--qaccuracy-update-baselines",
        dest="qaccuracy_update_baselines",
        action="store_true",
        help="(Re)write the baselines of the pairs that ran and passed, in qaccuracy_baseline_dir",
    )
    group.addoption(
        "--qaccuracy-update-all-baselines",
        dest="qaccuracy_update_all_baselines",
        action="store_true",
        help="(Re)write the baselines of every pair that ran, failing ones included",
    )
    group.addoption(
        "--qaccuracy-baseline",
        dest="qaccuracy_baseline",
        default=None,
        metavar="DIR",
        help="Use DIR as the baseline folder; every pair that runs must have a baseline there",
    )
    group.addoption(
        "--qaccuracy-save-baseline",
        dest="qaccuracy_save_baseline",
        default=None,
        metavar="DIR",
        help="Write the baselines of every pair that ran to DIR, failing ones included (older spelling)",
    )
    group.addoption(
        "--qaccuracy-max-drift",
        dest="qaccuracy_max_drift",
        action="append",
        default=[],
        metavar="RULE",
        help="Add a drift rule such as sqnr:-1.0 or mse:+20%%",
    )
    parser.addini(
        "qaccuracy_max_drift", "Drift rules such as 'sqnr:-1.0' or 'mse:+20%' (default sqnr:-1.0)", type="linelist"
    )
    parser.addini(
        "qaccuracy_junit_properties", "Add key metrics to JUnit XML as properties (default true)", default=None
    )
    add_sensitivity_options(parser, group)
    add_backend_options(parser, group)


def _tolerances(config: pytest.Config, ini_source: str) -> dict[str, tuple[float, str]]:
    found: dict[str, tuple[float, str]] = {name: (value, "default") for name, value in DEFAULTS.items()}
    for name in TOLERANCES:
        key = f"qaccuracy_{name}"
        cli = config.getoption(key)
        try:
            if cli is not None:
                found[name] = (check_tolerance(name, cli), f"command line --qaccuracy-{name.replace('_', '-')}")
            else:
                value = ini_text(config, key)
                if value is not None:
                    found[name] = (check_tolerance(name, value), f"{ini_source} ({key})")
        except ValueError as exc:
            where = f"--qaccuracy-{name.replace('_', '-')}" if cli is not None else key
            raise pytest.UsageError(f"{where}: {str(exc).split(': ', 1)[-1]}") from None
    return found


def _path(config: pytest.Config, cli_key: str, ini_key: str | None = None) -> Path | None:
    value = config.getoption(cli_key)
    if value:
        return (config.invocation_params.dir / value).resolve()
    if ini_key:
        text = ini_text(config, ini_key)
        if text is not None:
            base = config.inipath.parent if config.inipath else config.invocation_params.dir
            return (base / str(text)).resolve()
    return None


def _list(config: pytest.Config, cli_key: str, ini_key: str) -> tuple[str, ...] | None:
    value = config.getoption(cli_key)
    items = value.split(",") if value else [x for part in ini_lines(config, ini_key) for x in part.split(",")]
    names = tuple(x.strip() for x in items if x.strip())
    return names or None


def _batch_size(config: pytest.Config) -> int:
    value = ini_text(config, "qaccuracy_batch_size")
    if value is None:
        return DEFAULT_BATCH_SIZE
    try:
        number = parse_number(value, int)
    except ValueError:
        number = 0
    if number < 1:
        raise pytest.UsageError(f"qaccuracy_batch_size: expected an integer >= 1, got {value!r}")
    return int(number)


def _junit_properties(config: pytest.Config) -> bool:
    value = ini_text(config, "qaccuracy_junit_properties")
    try:
        return True if value is None else parse_bool(value)
    except ValueError as exc:
        raise pytest.UsageError(f"qaccuracy_junit_properties: {exc}") from None


def _baselines(config: pytest.Config) -> dict[str, object]:
    """The baseline folder (``--qaccuracy-baseline`` > ini > default) and where the session writes.

    ``--qaccuracy-save-baseline=DIR`` keeps its old meaning: every pair, to DIR.
    """
    folder = _path(config, "qaccuracy_baseline", "qaccuracy_baseline_dir") or config.rootpath / DEFAULT_BASELINES
    save_all = bool(config.getoption("qaccuracy_update_all_baselines"))
    save = _path(config, "qaccuracy_save_baseline")
    if save is None and (save_all or config.getoption("qaccuracy_update_baselines")):
        save = folder
    return {
        "baseline_dir": folder,
        "save_baseline_dir": save,
        "baseline_required": bool(config.getoption("qaccuracy_baseline")),
        "save_failing_baselines": save_all or config.getoption("qaccuracy_save_baseline") is not None,
    }


def load_settings(config: pytest.Config) -> QAccuracySettings:
    """Read and check every option once; ``pytest.UsageError`` on a bad value."""
    ini_source = f"ini file {config.inipath.name}" if config.inipath else "ini file"
    tolerances = _tolerances(config, ini_source)
    try:
        rules = parse_rules(ini_lines(config, "qaccuracy_tolerances"), f"{ini_source} (qaccuracy_tolerances)")
        cli_rules = parse_rules(config.getoption("qaccuracy_tolerances"), "command line --qaccuracy-tolerance")
    except ValueError as exc:
        raise pytest.UsageError(f"qaccuracy_tolerances: {exc}") from None
    offset = len(rules)  # positions count rules, not lines: command-line rules come after every ini rule
    rules += [replace(r, position=r.position + offset) for r in cli_rules]
    batch_size = _batch_size(config)
    drift = tuple(config.getoption("qaccuracy_max_drift")) or tuple(ini_lines(config, "qaccuracy_max_drift"))
    from pytest_qaccuracy.report.baseline import parse_drift_rule  # stdlib only; imported when needed

    try:
        for text in drift:
            parse_drift_rule(text)
    except ValueError as exc:
        raise pytest.UsageError(f"qaccuracy_max_drift: {exc}") from None
    artifacts = None
    if not config.getoption("qaccuracy_no_artifacts"):
        artifacts = _path(config, "qaccuracy_artifacts_dir", "qaccuracy_artifacts_dir") or (
            config.rootpath / DEFAULT_ARTIFACTS
        )
    backend, scheme = read_backend(config)
    return QAccuracySettings(
        tolerances=tolerances,
        metrics=_list(config, "qaccuracy_metrics", "qaccuracy_metrics"),
        rules=tuple(rules),
        max_drift=drift,
        artifacts_dir=artifacts,
        providers=_list(config, "qaccuracy_providers", "qaccuracy_providers") or ("CPUExecutionProvider",),
        batch_size=batch_size,
        **_baselines(config),
        junit_properties=_junit_properties(config),
        ini_source=ini_source,
        **sensitivity_settings(config),
        backend=backend,
        scheme=scheme,
        targets=read_targets(config),
        report=_path(config, "qaccuracy_report", "qaccuracy_report"),
    )


__all__ = ["GROUP", "QAccuracySettings", "add_options", "load_settings"]
