"""What a session ran against what it collected, so interrupted and incomplete sessions are marked.

:class:`SessionProgress` is registered as a plugin in every process. Where tests run (the only
process, or an xdist worker), each report carries the pairs its test checked (``qaccuracy_checks``,
plain lists, so it crosses xdist). The controller keeps the collected ids (its own collection, or
the workers'), the ids that reported, and those announcements. At the end, tests that never
reported did not run, and announced checks whose records never arrived were lost with a crashed
worker. The status reaches ``summary.json``, ``report.html``, the terminal and the exit code.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

import pytest

from pytest_qaccuracy.plugin.records import PairRecord, WorkerPayload
from pytest_qaccuracy.report.completeness import INCOMPLETE, INTERRUPTED, SessionStatus

if TYPE_CHECKING:
    from pytest_qaccuracy.data.progress import ProgressLine
    from pytest_qaccuracy.plugin.session import QAccuracySession
    from pytest_qaccuracy.plugin.settings import QAccuracySettings

#: The report attribute listing ``[pair key, pair id]`` of the checks a test recorded.
REPORT_ATTR = "qaccuracy_checks"


class SessionProgress:
    """Collected, reported and announced tests of one process; see the module docstring."""

    def __init__(self, records: dict[str, PairRecord]) -> None:
        self.records = records  # the session's records, by pair key (appended to as checks run)
        self.collected: list[str] = []
        self.reported: set[str] = set()
        self.announced: dict[str, dict[str, str]] = {}  # test id -> {pair key: pair id}
        self.interrupted: str | None = None  # where, when the session was interrupted
        self.status: SessionStatus | None = None  # set on the controller at the end
        self._seen: dict[str, int] = {}
        self.deselected = 0

    def interrupt(self, where: str) -> None:
        self.interrupted = self.interrupted or where

    # -- where tests run -----------------------------------------------------------------------
    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Any:
        with check_progress(item):
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        report = yield
        checked = self._new_checks(item.nodeid)
        if checked:
            setattr(report, REPORT_ATTR, [[key, pair] for key, pair in checked.items()])
        return report

    def _new_checks(self, nodeid: str) -> dict[str, str]:
        """Pairs ``nodeid`` checked since the last report (records only grow until the end)."""
        found = {}
        for key, record in self.records.items():
            checks = record.checks
            if any(c.test == nodeid for c in checks[self._seen.get(key, 0) :]):
                found[key] = record.id
            self._seen[key] = len(checks)
        return found

    # -- on the controller ---------------------------------------------------------------------
    def pytest_deselected(self, items: Sequence[pytest.Item]) -> None:
        self.deselected += len(items)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.collected = [item.nodeid for item in session.items]

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: Sequence[str]) -> None:
        if not self.collected:  # every worker collects the same ids
            self.collected = list(ids)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        payload = WorkerPayload.from_wire(getattr(node, "workeroutput", {}).get("qaccuracy"))
        if payload is not None and payload.interrupted:
            self.interrupt(payload.interrupted)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.reported.add(report.nodeid)
        for key, pair in getattr(report, REPORT_ATTR, None) or ():
            self.announced.setdefault(report.nodeid, {})[key] = pair

    def finish(self, workers_lost: int, stopped: str | None) -> SessionStatus:
        """The session's status from what was collected, reported and merged; kept in ``status``."""
        not_run = tuple(test for test in self.collected if test not in self.reported)
        arrived = {(check.test, key) for key, record in self.records.items() for check in record.checks}
        lost = tuple(
            sorted(
                (test, pair)
                for test, keys in self.announced.items()
                for key, pair in keys.items()
                if (test, key) not in arrived
            )
        )
        if self.interrupted:
            self.status = SessionStatus(INTERRUPTED, self.interrupted, not_run, lost, workers_lost)
        elif not_run or lost or workers_lost:
            reason = "an xdist worker crashed" if workers_lost or lost else stopped or "not every test reported"
            self.status = SessionStatus(INCOMPLETE, reason, not_run, lost, workers_lost)
        else:
            self.status = SessionStatus()
        return self.status


def prune_refusal(config: pytest.Config, status: SessionStatus, progress: SessionProgress) -> str | None:
    """Why stale baselines must not be pruned: a session that did not run every test cannot tell a
    stale baseline from one of a test it skipped."""
    if not status.complete:
        return f"the session is {status.status}"
    selected = [f"-{o[0]}" for o in (("k", "keyword"), ("m", "markexpr")) if config.getoption(o[1], None)]
    if config.getoption("lf", False):
        selected.append("--lf")
    if progress.deselected or selected:
        return f"tests were deselected ({', '.join(selected) or f'{progress.deselected} by a plugin'})"
    return None


def stopped_reason(session: pytest.Session) -> str | None:
    """Why pytest stopped before the end (``-x``, ``--maxfail``), as pytest words it, or None."""
    for reason in (session.shouldfail, session.shouldstop):
        if isinstance(reason, str) and reason:
            return reason
    return None


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While artifacts are written, SIGTERM raises KeyboardInterrupt as Ctrl-C does, so the writer
    removes its temp folder and leaves the artifacts folder as it was (the default SIGTERM action
    ends the process at once and leaves the temp folder behind). Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def check_artifacts_dir(config: pytest.Config, settings: QAccuracySettings) -> None:
    """A folder the session could not publish its artifacts to is a usage error before any test."""
    from pytest_qaccuracy.errors import InputError
    from pytest_qaccuracy.plugin.artifacts import OWNED
    from pytest_qaccuracy.report.publish import check_publishable

    protected = (config.rootpath, config.invocation_params.dir.resolve())
    try:
        check_publishable(settings.artifacts_dir, settings.where("artifacts_dir"), OWNED, protected)
    except InputError as exc:
        raise pytest.UsageError(str(exc)) from None


def analysis_progress(config: pytest.Config, state: QAccuracySession) -> AbstractContextManager[None]:
    """Shows the end-of-session analysis's progress on stderr (:mod:`pytest_qaccuracy.data.progress`);
    never with ``-q``; an xdist worker prints plain lines to a log only (:func:`_worker_progress`)."""
    if not state.records:  # nothing to show: spare the import
        return nullcontext()
    from pytest_qaccuracy.data.progress import progress_for, reporting

    if state.worker:
        return reporting(_worker_progress(config))
    return reporting(progress_for(sys.stderr, quiet=config.get_verbosity() < 0, below=True))


def _worker_progress(config: pytest.Config) -> ProgressLine | None:
    """An xdist worker's progress: plain lines that start with its id, on the stderr it shares with
    the controller, when that is a log (a CI job's output); none on a terminal, where the workers'
    redrawn lines would overwrite each other and xdist's own, with ``-q`` or ``QACCURACY_PROGRESS=0``."""
    from pytest_qaccuracy.data.progress import ENV, ProgressLog

    capture = config.pluginmanager.get_plugin("capturemanager")
    stream: Any = sys.stderr if capture is None else _Uncaptured(capture)
    quiet = config.get_verbosity() < 0 or os.environ.get(ENV, "").strip() == "0"
    if quiet or stream.isatty():
        return None
    worker = config.workerinput.get("workerid", "worker")  # type: ignore[attr-defined]
    return ProgressLog(stream, below=True, prefix=f"[{worker}] ")


class _Uncaptured:
    """stderr as the user sees it, from inside a test whose output pytest captures."""

    def __init__(self, capture: Any) -> None:
        self.capture = capture

    def write(self, text: str) -> None:
        with self.capture.global_and_fixture_disabled():
            sys.stderr.write(text)
            sys.stderr.flush()

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        with self.capture.global_and_fixture_disabled():
            return sys.stderr.isatty()


def _checks_pairs(item: pytest.Item) -> bool:
    """The test is a suite item, carries the marker or asks for a ``qaccuracy*`` fixture (other
    tests do not pay for importing the data layer)."""
    return (
        type(item).__module__.startswith("pytest_qaccuracy.")
        or item.get_closest_marker("qaccuracy") is not None
        or any(name.startswith("qaccuracy") for name in getattr(item, "fixturenames", ()))
    )


def check_progress(item: pytest.Item) -> AbstractContextManager[None]:
    """Shows the progress of a test's comparisons (a long pair check) on the stderr pytest does not
    capture, under the test's line; never with ``-q`` or for other tests; an xdist worker prints plain
    lines to a log only (:func:`_worker_progress`)."""
    config = item.config
    capture = config.pluginmanager.get_plugin("capturemanager")
    if capture is None or config.get_verbosity() < 0 or not _checks_pairs(item):
        return nullcontext()
    from pytest_qaccuracy.data.progress import progress_for, reporting

    if hasattr(config, "workerinput"):
        return reporting(_worker_progress(config))
    return reporting(progress_for(_Uncaptured(capture), below=True))


def finish_session(session: pytest.Session, state: QAccuracySession, progress: SessionProgress) -> None:
    """End of session: analyse (showing progress, :func:`analysis_progress`), then (worker) send the
    records or (controller) publish artifacts that say whether the session is complete, and let the
    exit code say so too.

    Ctrl-C during the analysis skips it and marks the session interrupted; Ctrl-C (or SIGTERM) while
    the artifacts are written stops at once with one line, leaving the folder as it was.
    """
    if session.exitstatus == pytest.ExitCode.INTERRUPTED:
        progress.interrupt("during the tests")
    else:
        try:
            with analysis_progress(session.config, state):
                state.analyse()  # where the pairs were compared, before a worker sends its records
        except KeyboardInterrupt:
            progress.interrupt("during the sensitivity analysis")
            session.exitstatus = pytest.ExitCode.INTERRUPTED
    if state.worker:
        session.config.workeroutput["qaccuracy"] = state.payload(progress.interrupted)
        return
    status = state.status = progress.finish(state.workers_without_data, stopped_reason(session))
    try:
        with sigterm_as_interrupt():
            written = state.finish(prune_refusal(session.config, status, progress))
    except KeyboardInterrupt:
        folder = state.settings.artifacts_dir
        pytest.exit(f"qaccuracy: interrupted while writing artifacts; {folder} left as it was", 2)
    _recipe_properties(session.config, state)  # after the artifacts: they name the recipe's files
    failed = not written or status.status == INCOMPLETE
    if failed and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED  # missing artifacts or results: say so in CI


def _recipe_properties(config: pytest.Config, state: QAccuracySession) -> None:
    """The recipes found at the end of the session, as JUnit XML test-suite properties (when the
    session writes JUnit XML and the plugin's JUnit properties are on)."""
    from _pytest.junitxml import xml_key

    xml = config.stash.get(xml_key, None)
    if xml is None or not state.settings.junit_properties:
        return
    from pytest_qaccuracy.plugin.properties import recipe_properties
    from pytest_qaccuracy.report.sensitivity_summary import recipe_files_in, with_recipe_files

    records = state.documents()
    folder = state.settings.artifacts_dir
    if folder is not None and state.written:  # the recipe's files were published there
        records = [with_recipe_files(r, recipe_files_in(r, folder.as_posix())) for r in records]
    for name, value in recipe_properties(records):
        xml.add_global_property(name, value)
