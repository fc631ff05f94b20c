"""Unit tests of the session's progress and status (``plugin/progress.py``), in-process with stand-ins
for pytest's objects: which tests ran, which checks were announced and lost, the status and the
reason a session gives, why stale baselines are not pruned, what the end of a session does (Ctrl-C,
SIGTERM, a worker's payload, the exit code, the recipe's JUnit properties), and the progress lines a
test's check and the end-of-session analysis write to the terminal (a stand-in stderr)."""

from __future__ import annotations

import io
import os
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from _pytest.junitxml import xml_key

from pytest_qaccuracy.data import progress as lines
from pytest_qaccuracy.plugin.progress import (
    REPORT_ATTR,
    SessionProgress,
    _checks_pairs,
    _Uncaptured,
    _worker_progress,
    analysis_progress,
    check_artifacts_dir,
    check_progress,
    finish_session,
    prune_refusal,
    sigterm_as_interrupt,
    stopped_reason,
)
from pytest_qaccuracy.report.completeness import SessionStatus

NOTSET = object()


class Terminal(io.StringIO):
    """The user's stderr: what was written, what was flushed, whether it is a terminal."""

    def __init__(self, tty: bool = False) -> None:
        super().__init__()
        self.tty = tty
        self.flushed = ""

    def isatty(self) -> bool:
        return self.tty

    def flush(self) -> None:
        self.flushed = self.getvalue()


class Capture:
    """pytest's capture manager: ``sys.stderr`` is its buffer, except inside
    ``global_and_fixture_disabled()``, where it is the user's terminal."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, terminal: Terminal) -> None:
        self.terminal, self.buffer = terminal, io.StringIO()
        monkeypatch.setattr(sys, "stderr", self.buffer)

    @contextmanager
    def global_and_fixture_disabled(self):
        sys.stderr = self.terminal
        try:
            yield
        finally:
            sys.stderr = self.buffer


class Config:
    """A pytest config: verbosity, options (a missing option without a default is an error, as in
    pytest), the capture manager, and an xdist worker's ``workerinput``."""

    def __init__(
        self,
        verbosity: int = 0,
        options: dict[str, Any] | None = None,
        capture: Any = None,
        workerinput: dict[str, Any] | None = None,
        rootpath: Path | None = None,
        invocation_dir: Path | None = None,
    ) -> None:
        self.verbosity = verbosity
        self.options = {"keyword": "", "markexpr": ""} if options is None else options
        self.pluginmanager = SimpleNamespace(get_plugin=lambda name: capture if name == "capturemanager" else None)
        self.stash = pytest.Stash()
        if workerinput is not None:
            self.workerinput, self.workeroutput = workerinput, {}
        self.rootpath = rootpath
        self.invocation_params = SimpleNamespace(dir=invocation_dir)

    def get_verbosity(self) -> int:
        return self.verbosity

    def getoption(self, name: str, default: Any = NOTSET) -> Any:
        if name not in self.options and default is NOTSET:
            raise ValueError(f"no option named {name!r}")
        return self.options.get(name, default)


class Item:
    """A collected test: its config, markers and fixtures."""

    def __init__(self, config: Config, markers: tuple[str, ...] = (), fixturenames: tuple[str, ...] = ()) -> None:
        self.config, self.markers, self.fixturenames = config, markers, fixturenames

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name in self.markers else None


class SuiteItem(Item):
    """An item of a declarative suite: its class lives in the plugin (and it has no fixtures)."""

    __module__ = "pytest_qaccuracy.plugin.suite"

    def __init__(self, config: Config) -> None:
        self.config, self.markers = config, ()


class PlainItem:
    """An item that is not a Python function: no ``fixturenames`` at all."""

    def __init__(self, config: Config) -> None:
        self.config = config

    def get_closest_marker(self, name: str) -> None:
        return None


def _record(pair: str, *tests: str) -> SimpleNamespace:
    return SimpleNamespace(id=pair, checks=[SimpleNamespace(test=t) for t in tests])


def _wrapped(hook: Any, *args: Any, result: Any = None) -> Any:
    """Run a new-style hook wrapper around an inner result; return what it returns."""
    gen = hook(*args)
    next(gen)
    with pytest.raises(StopIteration) as stop:
        gen.send(result)
    return stop.value.value


def _report(progress: SessionProgress, nodeid: str) -> Any:
    report = SimpleNamespace(nodeid=nodeid)
    assert _wrapped(progress.pytest_runtest_makereport, SimpleNamespace(nodeid=nodeid), None, result=report) is report
    return report


@pytest.fixture(autouse=True)
def _no_forced_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(lines.ENV, raising=False)


class Terminated(Exception):
    """SIGTERM reached the test's own handler: nothing turned it into KeyboardInterrupt."""


@pytest.fixture
def sigterm_guard() -> Any:
    """A SIGTERM handler of the test's own while it runs (the default one would end the process), as
    the handler that must come back; restored after."""

    def guard(signum: int, frame: Any) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, guard)
    yield guard
    signal.signal(signal.SIGTERM, previous)


def _sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(1000):  # the handler runs between bytecodes
        pass


# --- SessionProgress: reports, announcements, status -------------------------------------------------


def test_a_report_announces_the_pairs_its_test_checked_since_the_last_report() -> None:
    records = {"k1": _record("p1"), "k2": _record("p2")}
    progress = SessionProgress(records)
    records["k1"].checks.append(SimpleNamespace(test="t::a"))  # the first check of k1
    records["k2"].checks.append(SimpleNamespace(test="t::other"))
    records["k2"].checks.append(SimpleNamespace(test="t::a"))
    assert getattr(_report(progress, "t::a"), REPORT_ATTR) == [["k1", "p1"], ["k2", "p2"]]
    # teardown's report of the same test: nothing new
    assert not hasattr(_report(progress, "t::a"), REPORT_ATTR)
    # a later test's report names only the pair it checked, not the earlier checks of another test
    records["k2"].checks.append(SimpleNamespace(test="t::b"))
    assert getattr(_report(progress, "t::b"), REPORT_ATTR) == [["k2", "p2"]]
    assert not hasattr(_report(progress, "t::other"), REPORT_ATTR)


def test_a_check_made_before_the_progress_started_watching_is_announced_once() -> None:
    records = {"k": _record("p", "t::a")}
    progress = SessionProgress(records)
    assert getattr(_report(progress, "t::a"), REPORT_ATTR) == [["k", "p"]]
    assert not hasattr(_report(progress, "t::a"), REPORT_ATTR)


def test_interrupt_keeps_where_the_session_was_first_interrupted() -> None:
    progress = SessionProgress({})
    assert progress.interrupted is None and progress.status is None  # no status before the end
    progress.interrupt("during the tests")
    progress.interrupt("during the sensitivity analysis")
    assert progress.interrupted == "during the tests"


def test_collection_deselection_and_reports_are_counted() -> None:
    progress = SessionProgress({})
    progress.pytest_collection_finish(SimpleNamespace(items=[SimpleNamespace(nodeid=n) for n in ("t::b", "t::a")]))
    assert progress.collected == ["t::b", "t::a"]
    progress.pytest_deselected([object(), object()])
    progress.pytest_deselected([object()])
    assert progress.deselected == 3
    progress.pytest_runtest_logreport(SimpleNamespace(nodeid="t::a"))
    progress.pytest_runtest_logreport(SimpleNamespace(nodeid="t::b", **{REPORT_ATTR: [["k1", "p1"], ["k2", "p2"]]}))
    progress.pytest_runtest_logreport(SimpleNamespace(nodeid="t::b", **{REPORT_ATTR: [["k3", "p3"]]}))
    assert progress.reported == {"t::a", "t::b"}
    assert progress.announced == {"t::b": {"k1": "p1", "k2": "p2", "k3": "p3"}}


def test_the_controller_keeps_the_first_workers_collection() -> None:
    progress = SessionProgress({})
    progress.pytest_xdist_node_collection_finished(None, ("t::a", "t::b"))
    progress.pytest_xdist_node_collection_finished(None, ("t::c",))
    assert progress.collected == ["t::a", "t::b"]


def test_a_worker_that_went_down_interrupted_marks_the_session_interrupted() -> None:
    progress = SessionProgress({})
    progress.pytest_testnodedown(SimpleNamespace(), None)  # crashed: no output at all
    progress.pytest_testnodedown(SimpleNamespace(workeroutput={}), None)
    progress.pytest_testnodedown(SimpleNamespace(workeroutput={"qaccuracy": {"records": {}}}), None)
    assert progress.interrupted is None
    node = SimpleNamespace(workeroutput={"qaccuracy": {"records": {}, "interrupted": "during the tests"}})
    progress.pytest_testnodedown(node, None)
    assert progress.interrupted == "during the tests"


def _progress(collected: list[str], reported: list[str], records: dict[str, Any] | None = None) -> SessionProgress:
    progress = SessionProgress(records or {})
    progress.collected = collected
    progress.reported = set(reported)
    return progress


def test_a_session_where_every_test_reported_is_complete() -> None:
    progress = _progress(["t::a", "t::b"], ["t::b", "t::a"], {"k": _record("p", "t::a")})
    progress.announced = {"t::a": {"k": "p"}}
    status = progress.finish(0, None)
    assert status == SessionStatus() and status.complete and progress.status is status


def test_a_session_interrupted_before_collection_finished_lacks_no_test() -> None:
    progress = SessionProgress({})
    progress.interrupt("during the tests")
    assert progress.finish(0, None) == SessionStatus("interrupted", "during the tests")


def test_tests_that_never_reported_did_not_run_in_collection_order() -> None:
    status = _progress(["t::c", "t::a", "t::b", "t::d"], ["t::a"]).finish(0, None)
    assert (status.status, status.reason, status.not_run) == (
        "incomplete",
        "not every test reported",
        ("t::c", "t::b", "t::d"),
    )
    assert status.lost == () and status.workers_lost == 0


def test_pytest_stopping_early_is_the_reason() -> None:
    status = _progress(["t::a", "t::b"], ["t::a"]).finish(0, "stopping after 1 failures")
    assert (status.status, status.reason, status.not_run) == ("incomplete", "stopping after 1 failures", ("t::b",))


def test_announced_checks_whose_records_never_arrived_were_lost_with_a_worker() -> None:
    records = {"k1": _record("p1", "t::b"), "k2": _record("p2")}
    progress = _progress(["t::a", "t::b"], ["t::a", "t::b"], records)
    progress.announced = {"t::b": {"k2": "p2", "k1": "p1"}, "t::a": {"k2": "p2", "k1": "p1"}}
    status = progress.finish(0, "stopping after 1 failures")
    assert status.status == "incomplete" and status.reason == "an xdist worker crashed"
    # t::b's check of k1 arrived; the others were lost (sorted by test, then pair)
    assert status.lost == (("t::a", "p1"), ("t::a", "p2"), ("t::b", "p2"))
    assert status.not_run == () and status.workers_lost == 0


def test_a_worker_without_results_makes_the_session_incomplete() -> None:
    status = _progress(["t::a"], ["t::a"]).finish(2, "stopping after 1 failures")
    assert (status.status, status.reason, status.not_run, status.lost, status.workers_lost) == (
        "incomplete",
        "an xdist worker crashed",
        (),
        (),
        2,
    )


def test_an_interrupted_session_says_where_and_what_it_lacks() -> None:
    progress = _progress(["t::a", "t::b"], ["t::a"], {"k": _record("p")})
    progress.announced = {"t::a": {"k": "p"}}
    progress.interrupt("during the tests")
    status = progress.finish(1, "stopping after 1 failures")
    assert status == SessionStatus("interrupted", "during the tests", ("t::b",), (("t::a", "p"),), 1)


# --- prune_refusal, stopped_reason --------------------------------------------------------------------


def test_an_incomplete_or_interrupted_session_refuses_to_prune() -> None:
    progress = SessionProgress({})
    assert prune_refusal(Config(), SessionStatus("incomplete", "x"), progress) == "the session is incomplete"
    assert prune_refusal(Config(), SessionStatus("interrupted", "x"), progress) == "the session is interrupted"


def test_a_complete_session_with_every_test_selected_may_prune() -> None:
    assert prune_refusal(Config(), SessionStatus(), SessionProgress({})) is None  # no --lf option (cacheprovider off)
    options = {"keyword": "", "markexpr": "", "lf": False}
    assert prune_refusal(Config(options=options), SessionStatus(), SessionProgress({})) is None


@pytest.mark.parametrize(
    ("options", "deselected", "why"),
    [
        ({"keyword": "fast"}, 0, "-k"),
        ({"markexpr": "slow"}, 0, "-m"),
        ({"lf": True}, 0, "--lf"),
        ({"keyword": "fast", "markexpr": "slow", "lf": True}, 4, "-k, -m, --lf"),
        ({}, 3, "3 by a plugin"),
        ({"markexpr": "slow"}, 3, "-m"),
    ],
)
def test_deselected_tests_refuse_to_prune(options: dict[str, Any], deselected: int, why: str) -> None:
    progress = SessionProgress({})
    progress.deselected = deselected
    config = Config(options={"keyword": "", "markexpr": "", **options})
    assert prune_refusal(config, SessionStatus(), progress) == f"tests were deselected ({why})"


def test_stopped_reason_is_pytests_own_words() -> None:
    def session(shouldfail: Any, shouldstop: Any) -> Any:
        return SimpleNamespace(shouldfail=shouldfail, shouldstop=shouldstop)

    assert stopped_reason(session(False, False)) is None
    assert stopped_reason(session("", True)) is None  # a bare True says nothing
    assert stopped_reason(session("stopping after 2 failures", False)) == "stopping after 2 failures"
    assert stopped_reason(session(False, "Interrupted: 1 error during collection")) == (
        "Interrupted: 1 error during collection"
    )
    assert stopped_reason(session("stopping after 1 failures", "other")) == "stopping after 1 failures"


# --- SIGTERM while artifacts are written ------------------------------------------------------------


def test_sigterm_while_writing_raises_keyboardinterrupt_and_the_handler_comes_back(sigterm_guard: Any) -> None:
    with pytest.raises(KeyboardInterrupt), sigterm_as_interrupt():
        _sigterm()
    assert signal.getsignal(signal.SIGTERM) is sigterm_guard
    with sigterm_as_interrupt():
        pass
    assert signal.getsignal(signal.SIGTERM) is sigterm_guard
    with pytest.raises(Terminated):  # outside the block, SIGTERM is the process's own business again
        _sigterm()


def test_sigterm_handling_is_left_alone_outside_the_main_thread() -> None:
    before, seen, errors = signal.getsignal(signal.SIGTERM), [], []

    def writer() -> None:
        try:
            with sigterm_as_interrupt():
                seen.append(signal.getsignal(signal.SIGTERM))
        except BaseException as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    thread.join()
    assert errors == [] and seen == [before]


# --- the artifacts folder ----------------------------------------------------------------------------


def _settings(folder: Path) -> Any:
    return SimpleNamespace(
        artifacts_dir=folder, where=lambda name: "--qaccuracy-artifacts-dir" if name == "artifacts_dir" else "?"
    )


def test_an_artifacts_folder_holding_the_project_or_the_current_folder_is_a_usage_error(tmp_path: Path) -> None:
    root, cwd = tmp_path / "proj", tmp_path / "work"
    root.mkdir()
    cwd.mkdir()
    config = Config(rootpath=root, invocation_dir=root / ".." / "work")  # as given, not yet resolved
    with pytest.raises(pytest.UsageError) as info:
        check_artifacts_dir(config, _settings(root))
    assert str(info.value) == f"--qaccuracy-artifacts-dir {root}: holds {root}; artifacts need a folder of their own"
    assert info.value.__cause__ is None and info.value.__suppress_context__
    with pytest.raises(pytest.UsageError) as info:
        check_artifacts_dir(config, _settings(tmp_path))
    assert str(info.value) == (
        f"--qaccuracy-artifacts-dir {tmp_path}: holds {root}; artifacts need a folder of their own"
    )
    with pytest.raises(pytest.UsageError) as info:
        check_artifacts_dir(config, _settings(cwd))
    assert str(info.value) == f"--qaccuracy-artifacts-dir {cwd}: holds {cwd}; artifacts need a folder of their own"
    assert check_artifacts_dir(config, _settings(cwd / "artifacts")) is None


def test_an_artifacts_folder_with_a_foreign_subfolder_is_a_usage_error(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    (folder / "mine").mkdir(parents=True)
    config = Config(rootpath=tmp_path / "proj", invocation_dir=tmp_path / "proj")
    with pytest.raises(pytest.UsageError, match=r"^--qaccuracy-artifacts-dir .*out: holds mine/, not written by"):
        check_artifacts_dir(config, _settings(folder))
    # the folders the plugin writes are its own
    (folder / "mine").rmdir()
    (folder / "pairs").mkdir()
    assert check_artifacts_dir(config, _settings(folder)) is None


# --- which tests show a check's progress -------------------------------------------------------------


def test_tests_that_check_pairs() -> None:
    config = Config()
    assert _checks_pairs(SuiteItem(config))
    assert _checks_pairs(Item(config, markers=("qaccuracy",)))
    assert _checks_pairs(Item(config, fixturenames=("tmp_path", "qaccuracy_pair")))
    assert _checks_pairs(Item(config, fixturenames=("qaccuracy",)))
    assert not _checks_pairs(Item(config, markers=("slow",), fixturenames=("tmp_path", "my_qaccuracy")))
    assert not _checks_pairs(PlainItem(config))

    class Lookalike(Item):
        __module__ = "pytest_qaccuracy_extras.items"

    assert not _checks_pairs(Lookalike(config))


# --- the progress lines on the terminal --------------------------------------------------------------


def _steps(context: Any) -> None:
    """What a long job reports: a task of 4 records, then a step."""
    with context:
        with lines.task("compare pair", 4) as advance:
            advance(4)
        lines.step("ranking nodes")


def test_uncaptured_writes_to_the_users_terminal_and_flushes(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = Terminal(tty=True)
    capture = Capture(monkeypatch, terminal)
    stream = _Uncaptured(capture)
    stream.write("shown")
    assert terminal.getvalue() == "shown" and terminal.flushed == "shown"
    assert capture.buffer.getvalue() == ""
    assert stream.isatty()  # the terminal's answer, not the capture buffer's
    stream.flush()
    assert sys.stderr is capture.buffer


def test_a_checking_test_shows_redrawn_progress_under_its_line_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = Terminal(tty=True)
    capture = Capture(monkeypatch, terminal)
    _steps(check_progress(Item(Config(capture=capture), markers=("qaccuracy",))))
    shown = terminal.getvalue()
    assert shown.startswith("\n\rcompare pair: 0 / 4 records\x1b[K\rcompare pair: 4 / 4 records")
    assert shown.endswith("\r\x1b[K\x1b[A\n\rranking nodes\x1b[K\r\x1b[K\x1b[A")
    assert capture.buffer.getvalue() == ""


def test_a_checking_test_writes_plain_lines_to_a_log(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = Terminal(tty=False)
    capture = Capture(monkeypatch, terminal)
    _steps(check_progress(Item(Config(capture=capture), fixturenames=("qaccuracy",))))
    assert terminal.getvalue() == "\nranking nodes\n"  # a short task prints nothing in a log
    assert capture.buffer.getvalue() == ""


@pytest.mark.parametrize(
    "case", ["quiet", "no capture manager", "other test", "plain item", "worker on a terminal", "worker quiet"]
)
def test_no_check_progress(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = Terminal(tty=case != "plain item")
    capture = Capture(monkeypatch, terminal)
    config = Config(
        verbosity=-1 if case == "quiet" else 0,
        capture=None if case == "no capture manager" else capture,
        workerinput={"workerid": "gw0"} if case.startswith("worker") else None,
    )
    if case == "worker quiet":
        terminal.tty = False
        monkeypatch.setenv(lines.ENV, " 0 ")
    if case == "other test":
        item: Any = Item(config, markers=("slow",), fixturenames=("tmp_path",))
    elif case == "plain item":
        item = PlainItem(config)
    else:
        item = Item(config, markers=("qaccuracy",))
    _steps(check_progress(item))
    assert terminal.getvalue() == "" and capture.buffer.getvalue() == ""


def test_a_workers_check_progress_is_plain_lines_with_its_id(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = Terminal(tty=False)
    capture = Capture(monkeypatch, terminal)
    config = Config(capture=capture, workerinput={"workerid": "gw3"})
    _steps(check_progress(Item(config, markers=("qaccuracy",))))
    assert terminal.getvalue() == "\n[gw3] ranking nodes\n"
    assert capture.buffer.getvalue() == ""


def test_the_run_hook_shows_the_check_progress_around_the_test(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = Terminal(tty=False)
    capture = Capture(monkeypatch, terminal)
    progress = SessionProgress({})
    item = Item(Config(capture=capture), markers=("qaccuracy",))
    gen = progress.pytest_runtest_call(item)
    next(gen)
    lines.step("inside the test")
    with pytest.raises(StopIteration) as stop:
        gen.send("the test's result")
    assert stop.value.value == "the test's result"
    lines.step("after the test")
    assert terminal.getvalue() == "\ninside the test\n"


def test_a_workers_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = Terminal(tty=False)
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setenv(lines.ENV, "1")  # forces the redrawn line on the controller, not a worker's log
    log = _worker_progress(Config(workerinput={}))  # no capture manager: stderr itself
    assert isinstance(log, lines.ProgressLog)
    with lines.reporting(log):
        lines.step("one")
        lines.step("two")
    assert terminal.getvalue() == "\n[worker] one\n[worker] two\n"
    assert _worker_progress(Config(verbosity=-1, workerinput={})) is None
    terminal.tty = True
    assert _worker_progress(Config(workerinput={})) is None
    monkeypatch.setenv(lines.ENV, "0")
    terminal.tty = False
    assert _worker_progress(Config(workerinput={})) is None


# --- the end-of-session analysis's progress ---------------------------------------------------------


def _state(**changes: Any) -> Any:
    fields = {"records": {"k": object()}, "worker": False}
    return SimpleNamespace(**{**fields, **changes})


@pytest.mark.parametrize(("tty", "shown"), [(False, "\nranking nodes\n"), (True, None)])
def test_the_analysis_shows_progress_on_stderr(tty: bool, shown: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = Terminal(tty=tty)
    monkeypatch.setattr(sys, "stderr", terminal)
    _steps(analysis_progress(Config(), _state()))
    if shown is not None:
        assert terminal.getvalue() == shown
    else:
        assert terminal.getvalue().startswith("\n\rcompare pair: 0 / 4 records\x1b[K")
        assert terminal.getvalue().endswith("\n\rranking nodes\x1b[K\r\x1b[K\x1b[A")


def test_no_analysis_progress_with_q_or_without_records(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = Terminal(tty=True)
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setenv(lines.ENV, "1")
    _steps(analysis_progress(Config(verbosity=-1), _state()))
    _steps(analysis_progress(Config(), _state(records={})))
    assert terminal.getvalue() == ""


def test_a_workers_analysis_progress_is_its_log(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = Terminal(tty=False)
    capture = Capture(monkeypatch, terminal)
    config = Config(capture=capture, workerinput={"workerid": "gw1"})
    _steps(analysis_progress(config, _state(worker=True)))
    assert terminal.getvalue() == "\n[gw1] ranking nodes\n"


# --- the end of a session -----------------------------------------------------------------------------


class State:
    """The plugin's session state at the end: what it analysed, wrote and sent."""

    def __init__(self, worker: bool = False, written: bool = True, folder: Path | None = None, **kw: Any) -> None:
        self.worker, self.result, self.records = worker, written, {}
        self.workers_without_data = kw.get("workers_lost", 0)
        self.status: SessionStatus | None = None
        self.settings = SimpleNamespace(artifacts_dir=folder, junit_properties=kw.get("junit", True))
        self.written: list[Path] = []
        self.docs = kw.get("documents", [])
        self.on_analyse = kw.get("on_analyse")
        self.on_finish = kw.get("on_finish")
        self.calls: list[Any] = []

    def analyse(self) -> None:
        self.calls.append("analyse")
        if self.on_analyse is not None:
            self.on_analyse()

    def payload(self, interrupted: str | None = None) -> dict[str, Any]:
        return {"records": {}, "interrupted": interrupted}

    def finish(self, refusal: str | None) -> bool:
        self.calls.append(("finish", refusal, self.status))
        if self.on_finish is not None:
            self.on_finish()
        if self.result and self.settings.artifacts_dir is not None:
            self.written.append(self.settings.artifacts_dir / "summary.json")
        return self.result

    def documents(self) -> list[dict[str, Any]]:
        return self.docs


def _session(config: Config | None = None, exitstatus: int = pytest.ExitCode.OK, **stop: Any) -> Any:
    return SimpleNamespace(
        config=config or Config(),
        exitstatus=exitstatus,
        shouldfail=stop.get("shouldfail", False),
        shouldstop=stop.get("shouldstop", False),
    )


def test_a_complete_session_analyses_writes_and_keeps_its_exit_code() -> None:
    state, progress = State(), _progress(["t::a"], ["t::a"])
    session = _session()
    finish_session(session, state, progress)
    assert state.calls == ["analyse", ("finish", None, SessionStatus())]
    assert state.status == SessionStatus() and session.exitstatus == pytest.ExitCode.OK


@pytest.mark.parametrize(("verbosity", "shown"), [(0, "\nranking nodes\n"), (-1, "")])
def test_the_end_of_a_session_shows_the_analysis_progress_but_with_q(
    verbosity: int, shown: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    terminal = Terminal(tty=False)
    monkeypatch.setattr(sys, "stderr", terminal)
    state = State(on_analyse=lambda: lines.step("ranking nodes"))
    state.records = {"k": _record("p", "t::a")}
    finish_session(_session(Config(verbosity=verbosity)), state, _progress(["t::a"], ["t::a"]))
    assert terminal.getvalue() == shown


def test_artifacts_not_written_fail_the_session() -> None:
    session = _session()
    finish_session(session, State(written=False), _progress(["t::a"], ["t::a"]))
    assert session.exitstatus == pytest.ExitCode.TESTS_FAILED


def test_an_incomplete_session_fails_says_why_and_refuses_to_prune() -> None:
    state, session = State(), _session(shouldfail="stopping after 1 failures")
    finish_session(session, state, _progress(["t::a", "t::b"], ["t::a"]))
    expected = SessionStatus("incomplete", "stopping after 1 failures", ("t::b",))
    assert state.calls == ["analyse", ("finish", "the session is incomplete", expected)]
    assert state.status == expected and session.exitstatus == pytest.ExitCode.TESTS_FAILED


def test_a_failed_session_keeps_its_exit_code() -> None:
    session = _session(exitstatus=pytest.ExitCode.TESTS_FAILED)
    finish_session(session, State(written=False), _progress(["t::a", "t::b"], ["t::a"]))
    assert session.exitstatus == pytest.ExitCode.TESTS_FAILED
    session = _session(exitstatus=pytest.ExitCode.USAGE_ERROR)
    finish_session(session, State(written=False), _progress(["t::a"], ["t::a"]))
    assert session.exitstatus == pytest.ExitCode.USAGE_ERROR


def test_an_interrupted_session_skips_the_analysis_and_writes_its_status() -> None:
    state, session = State(), _session(exitstatus=pytest.ExitCode.INTERRUPTED)
    finish_session(session, state, _progress(["t::a", "t::b"], ["t::a"]))
    expected = SessionStatus("interrupted", "during the tests", ("t::b",))
    assert state.calls == [("finish", "the session is interrupted", expected)]
    assert session.exitstatus == pytest.ExitCode.INTERRUPTED


def test_ctrl_c_during_the_analysis_skips_it_and_marks_the_session_interrupted() -> None:
    def interrupted() -> None:
        raise KeyboardInterrupt

    state, session = State(on_analyse=interrupted), _session()
    finish_session(session, state, _progress(["t::a"], ["t::a"]))
    expected = SessionStatus("interrupted", "during the sensitivity analysis")
    assert state.calls == ["analyse", ("finish", "the session is interrupted", expected)]
    assert session.exitstatus == pytest.ExitCode.INTERRUPTED


def test_a_worker_sends_its_records_and_where_it_was_interrupted() -> None:
    state = State(worker=True)
    session = _session(Config(workerinput={"workerid": "gw0"}))
    finish_session(session, state, _progress(["t::a", "t::b"], ["t::a"]))
    assert session.config.workeroutput == {"qaccuracy": {"records": {}, "interrupted": None}}
    assert state.calls == ["analyse"] and state.status is None and session.exitstatus == pytest.ExitCode.OK

    def interrupted() -> None:
        raise KeyboardInterrupt

    state = State(worker=True, on_analyse=interrupted)
    session = _session(Config(workerinput={"workerid": "gw0"}))
    finish_session(session, state, _progress([], []))
    assert session.config.workeroutput == {
        "qaccuracy": {"records": {}, "interrupted": "during the sensitivity analysis"}
    }
    assert session.exitstatus == pytest.ExitCode.INTERRUPTED


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_an_interrupt_while_writing_artifacts_ends_pytest_with_one_line(
    how: str, tmp_path: Path, sigterm_guard: Any
) -> None:
    def interrupted() -> None:
        if how == "ctrl-c":
            raise KeyboardInterrupt
        _sigterm()

    state = State(folder=tmp_path / "out", on_finish=interrupted)
    with pytest.raises(pytest.exit.Exception) as info:
        finish_session(_session(), state, _progress(["t::a"], ["t::a"]))
    assert info.value.msg == f"qaccuracy: interrupted while writing artifacts; {tmp_path / 'out'} left as it was"
    assert info.value.returncode == 2
    assert signal.getsignal(signal.SIGTERM) is sigterm_guard


# --- the recipes as JUnit XML properties --------------------------------------------------------------


class Xml:
    """pytest's JUnit XML writer: the test-suite properties added."""

    def __init__(self) -> None:
        self.properties: list[tuple[str, str]] = []

    def add_global_property(self, name: str, value: str) -> None:
        self.properties.append((name, value))


RECIPE = {
    "met": True,
    "stopped": "met",
    "quantize_static": {"per_channel": True},
    "best": 0,
    "steps": [{"measured": {}}],
}


def _documents() -> list[dict[str, Any]]:
    return [
        {"id": "a", "stem": "a-1", "sensitivity": {"recipe": RECIPE}},
        {"id": "b", "stem": "b-2", "sensitivity": {"recipe_note": "not searched: every check passed"}},
    ]


def _junit(state: State, junit: bool = True) -> list[tuple[str, str]]:
    config = Config()
    xml = Xml()
    if junit:
        config.stash[xml_key] = xml
    finish_session(_session(config), state, _progress(["t::a"], ["t::a"]))
    return xml.properties


def test_the_recipes_become_junit_properties_naming_their_published_files(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    files = f"{folder.as_posix()}/pairs/a-1.recipe.json,{folder.as_posix()}/pairs/a-1.recipe.py,"
    files += f"{folder.as_posix()}/pairs/a-1.recipe.steps.txt"
    assert _junit(State(folder=folder, documents=_documents())) == [
        ("qaccuracy.recipe.a.met", "true"),
        ("qaccuracy.recipe.a.stopped", "met"),
        ("qaccuracy.recipe.a.quantize_static", '{"per_channel": true}'),
        ("qaccuracy.recipe.a.files", files),
        ("qaccuracy.recipe.b.note", "not searched: every check passed"),
    ]


def test_recipe_properties_without_published_files() -> None:
    # no artifacts folder: the recipe's arguments, no files
    assert _junit(State(documents=_documents())) == [
        ("qaccuracy.recipe.a.met", "true"),
        ("qaccuracy.recipe.a.stopped", "met"),
        ("qaccuracy.recipe.a.quantize_static", '{"per_channel": true}'),
        ("qaccuracy.recipe.b.note", "not searched: every check passed"),
    ]


def test_recipe_properties_when_the_artifacts_were_not_written(tmp_path: Path) -> None:
    props = _junit(State(written=False, folder=tmp_path / "out", documents=_documents()))
    assert [name for name, _ in props] == [
        "qaccuracy.recipe.a.met",
        "qaccuracy.recipe.a.stopped",
        "qaccuracy.recipe.a.quantize_static",
        "qaccuracy.recipe.b.note",
    ]


def test_no_recipe_properties_without_junit_xml_or_with_properties_off(tmp_path: Path) -> None:
    assert _junit(State(folder=tmp_path / "out", documents=_documents()), junit=False) == []
    assert _junit(State(folder=tmp_path / "out", documents=_documents(), junit=False)) == []
