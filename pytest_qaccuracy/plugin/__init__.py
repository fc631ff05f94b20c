"""pytest plugin entry point (``pytest11`` = ``pytest_qaccuracy.plugin``): hooks only wire.

Options live in :mod:`.settings`, run state in :mod:`.session` (kept in ``config.stash``), fixtures
and the marker in :mod:`.fixtures`, declarative suites in :mod:`.suite`. Only stdlib and pytest are
imported here; numpy, onnx and onnxruntime load when a pair is first compared.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

try:  # Ctrl-C while pytest loads this plugin: one line and pytest's exit code of an interrupted run
    from pytest_qaccuracy.outcomes import XPASS_STRICT
    from pytest_qaccuracy.plugin.artifacts import report_path
    from pytest_qaccuracy.plugin.fixtures import (
        MARKER_HELP,
        mark_item,
        marker_key,
        qaccuracy,
        qaccuracy_calibrate,
        qaccuracy_dataset,
        qaccuracy_pair,
        read_marker,
        session_key,
    )
    from pytest_qaccuracy.plugin.progress import SessionProgress, check_artifacts_dir, finish_session
    from pytest_qaccuracy.plugin.session import QAccuracySession
    from pytest_qaccuracy.plugin.settings import add_options, check_metrics, check_task_metrics, load_settings
    from pytest_qaccuracy.plugin.suite import USAGE_OUTPUT, QAccuracyFile, is_suite, raise_usage_errors
except KeyboardInterrupt:
    sys.stderr.write("qaccuracy: interrupted while pytest loaded its plugins\n")
    raise SystemExit(int(pytest.ExitCode.INTERRUPTED)) from None

__all__ = ["qaccuracy", "qaccuracy_calibrate", "qaccuracy_dataset", "qaccuracy_pair"]

progress_key = pytest.StashKey[SessionProgress]()

#: The terminal colour of a pair's verdict lines, by its status.
COLOURS = {"passed": {"green": True}, "failed": {"red": True}, "xfailed": {"yellow": True}}


class QAccuracyXdist:
    """Controller-side xdist hooks, registered only when xdist is active."""

    def __init__(self, state: QAccuracySession) -> None:
        self.state = state

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        output = getattr(node, "workeroutput", {})
        self.state.merge(output.get("qaccuracy"))
        if output.get(USAGE_OUTPUT) and self.state.usage_error is None:  # printed at the session's end, exit 4
            self.state.usage_error = str(output[USAGE_OUTPUT])


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)
    worker = hasattr(config, "workerinput")
    state = QAccuracySession(load_settings(config), config.rootpath, worker)
    if not worker and state.settings.artifacts_dir is not None:  # one ERROR line, exit 4, before any test
        check_artifacts_dir(config, state.settings)
    config.stash[session_key] = state
    config.stash[progress_key] = SessionProgress(state.records)
    config.pluginmanager.register(config.stash[progress_key], "qaccuracy-progress")
    if not worker:
        config.pluginmanager.register(QAccuracyOutcomes(state), "qaccuracy-outcomes")
    if not worker and config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(QAccuracyXdist(state), "qaccuracy-xdist")


def pytest_unconfigure(config: pytest.Config) -> None:
    progress = config.pluginmanager.get_plugin("qaccuracy-progress")
    if progress is not None:
        config.pluginmanager.unregister(progress)
        del config.stash[progress_key]
    for name in ("qaccuracy-xdist", "qaccuracy-outcomes"):
        plugin = config.pluginmanager.get_plugin(name)
        if plugin is not None:
            config.pluginmanager.unregister(plugin)
    if session_key in config.stash:
        del config.stash[session_key]


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    return QAccuracyFile.from_parent(parent, path=file_path) if is_suite(file_path) else None


def pytest_itemcollected(item: pytest.Item) -> None:
    mark_item(item)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    raise_usage_errors(config, items)  # a suite's or marker's unusable task metric: exit 4, one line, no test runs


def judged_outcome(report: pytest.TestReport) -> str | None:
    """pytest's verdict on a test from one phase's report, as the terminal shows it: passed, failed,
    xfailed, xpassed, xpassed-strict (failed by pytest) or skipped; None for a phase that decides
    nothing (a passed setup or teardown)."""
    if report.when != "call" and report.passed:
        return None
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    if report.failed and str(report.longrepr).startswith("[XPASS(strict)]"):
        return XPASS_STRICT
    return report.outcome


class QAccuracyOutcomes:
    """What pytest made of each test (``--runxfail``, ``-p no:skipping``, strict xfail): the pair
    verdicts follow it. On xdist's controller every worker's reports arrive here."""

    def __init__(self, state: QAccuracySession) -> None:
        self.state = state

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        outcome = judged_outcome(report)
        if outcome is not None:
            self.state.record_report(outcome, report.nodeid, getattr(report, "wasxfail", None) or None)


def pytest_runtest_setup(item: pytest.Item) -> None:
    try:
        item.stash[marker_key] = read_marker(item)
    except ValueError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    state = session.config.stash.get(session_key, None)
    if state is not None and state.usage_error is not None:  # an xdist worker's: as pytest ends a usage error
        sys.stderr.write(f"ERROR: {state.usage_error}\n")
        session.exitstatus = pytest.ExitCode.USAGE_ERROR
        return
    if state is not None:
        finish_session(session, state, session.config.stash[progress_key])


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    state = session.config.stash.get(session_key, None)
    if state is not None and not state.worker:  # a metric the registry lacks: exit 4 before any test
        check_metrics(state.settings)
        check_task_metrics(state.settings)


def pytest_report_header(config: pytest.Config) -> str | None:
    state = config.stash.get(session_key, None)
    if state is None or config.get_verbosity() < 1:
        return None
    return state.header()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = config.stash.get(session_key, None)
    if state is None or state.worker or not (state.records or state.workers_without_data or state.errors):
        return
    from pytest_qaccuracy.report.summary import summary_rows

    artifacts = state.settings.artifacts_dir if state.written else None
    terminalreporter.write_sep("=", "quantization accuracy summary")
    top = state.settings.sensitivity_top
    for row in summary_rows(state.documents(), str(artifacts) if artifacts else None, top):
        colour = COLOURS.get(row.status or "", {})  # the pair's verdict, never a search of the text
        terminalreporter.write_line(row.text, **colour)
    report = report_path(state.settings, state.written)
    if report is not None:
        terminalreporter.write_line(f"report: {report.as_uri()}")
    if state.baselines is not None:
        terminalreporter.write_line(state.baselines.line())
    for error in state.errors:
        terminalreporter.write_line(error, red=True)
    if state.status is not None and not state.status.complete:
        terminalreporter.write_line(state.status.headline(), red=True)
