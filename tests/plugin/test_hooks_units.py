"""Unit tests of the plugin's hooks (``plugin/__init__.py``), in-process with stand-ins for pytest's
config, plugin manager, session, items, reports and terminal: what ``pytest_configure`` sets up on a
controller, a worker and with xdist, what ``pytest_unconfigure`` takes down, the suites collected,
the marker read at setup, the outcomes a report gives, the usage errors at the start and end of a
session, the ``-v`` header and the summary's lines and colours. The hooks run in real sessions in
the pytester tests (``test_pytest_verdicts.py``, ``test_xdist.py``, ...)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import pytest_qaccuracy.plugin as plugin
from pytest_qaccuracy.outcomes import XPASS_STRICT
from pytest_qaccuracy.plugin.fixtures import marker_key, session_key
from pytest_qaccuracy.plugin.suite import USAGE_OUTPUT


class PluginManager:
    def __init__(self, plugins: tuple[str, ...] = ()) -> None:
        self.plugins: dict[str, Any] = {name: object() for name in plugins}
        self.events: list[tuple[str, str]] = []

    def register(self, plugin: Any, name: str) -> None:
        self.plugins[name] = plugin
        self.events.append(("register", name))

    def unregister(self, plugin: Any) -> None:
        name = next(n for n, p in self.plugins.items() if p is plugin)
        del self.plugins[name]
        self.events.append(("unregister", name))

    def get_plugin(self, name: str) -> Any:
        return self.plugins.get(name)

    def hasplugin(self, name: str) -> bool:
        return name in self.plugins


class Config:
    def __init__(self, worker: bool = False, plugins: tuple[str, ...] = (), verbosity: int = 0) -> None:
        self.stash = pytest.Stash()
        self.pluginmanager = PluginManager(plugins)
        self.rootpath = Path("/root/project")
        self.lines: list[tuple[str, str]] = []
        self.verbosity = verbosity
        if worker:
            self.workerinput = {"workerid": "gw0"}

    def addinivalue_line(self, name: str, line: str) -> None:
        self.lines.append((name, line))

    def get_verbosity(self) -> int:
        return self.verbosity


def settings(artifacts_dir: Any = None, **fields: Any) -> SimpleNamespace:
    return SimpleNamespace(artifacts_dir=artifacts_dir, **fields)


@pytest.fixture
def loaded(monkeypatch: pytest.MonkeyPatch) -> list:
    """load_settings and check_artifacts_dir stand-ins; what the latter was called with."""
    checked: list = []
    monkeypatch.setattr(plugin, "load_settings", lambda config: settings(getattr(config, "artifacts", None)))
    monkeypatch.setattr(plugin, "check_artifacts_dir", lambda config, s: checked.append((config, s)))
    return checked


def test_configure_on_a_controller(loaded: list) -> None:
    config = Config()
    plugin.pytest_configure(config)
    ((name, line),) = config.lines
    assert name == "markers" and line == plugin.MARKER_HELP
    state = config.stash[session_key]
    assert state.worker is False and state.rootpath == Path("/root/project")
    progress = config.stash[plugin.progress_key]
    assert progress.records is state.records
    assert config.pluginmanager.events == [("register", "qaccuracy-progress"), ("register", "qaccuracy-outcomes")]
    assert config.pluginmanager.plugins["qaccuracy-progress"] is progress
    assert config.pluginmanager.plugins["qaccuracy-outcomes"].state is state
    assert loaded == []  # no artifacts folder: nothing to check


def test_configure_checks_the_artifacts_folder_on_the_controller_only(loaded: list) -> None:
    config = Config()
    config.artifacts = Path("/out")
    plugin.pytest_configure(config)
    assert loaded == [(config, config.stash[session_key].settings)]
    worker = Config(worker=True)
    worker.artifacts = Path("/out")
    plugin.pytest_configure(worker)
    assert len(loaded) == 1


def test_configure_on_a_worker_and_with_xdist(loaded: list) -> None:
    worker = Config(worker=True, plugins=("xdist",))
    plugin.pytest_configure(worker)
    assert worker.stash[session_key].worker is True
    assert worker.pluginmanager.events == [("register", "qaccuracy-progress")]
    controller = Config(plugins=("xdist",))
    plugin.pytest_configure(controller)
    assert [n for _, n in controller.pluginmanager.events] == [
        "qaccuracy-progress",
        "qaccuracy-outcomes",
        "qaccuracy-xdist",
    ]
    xdist = controller.pluginmanager.plugins["qaccuracy-xdist"]
    assert xdist.state is controller.stash[session_key]


def test_unconfigure_takes_down_what_configure_set_up(loaded: list) -> None:
    config = Config(plugins=("xdist",))
    plugin.pytest_configure(config)
    config.pluginmanager.events.clear()
    plugin.pytest_unconfigure(config)
    assert config.pluginmanager.events == [
        ("unregister", "qaccuracy-progress"),
        ("unregister", "qaccuracy-xdist"),
        ("unregister", "qaccuracy-outcomes"),
    ]
    assert session_key not in config.stash and plugin.progress_key not in config.stash
    bare = Config()  # never configured (an early usage error): nothing to take down
    plugin.pytest_unconfigure(bare)
    assert bare.pluginmanager.events == []


def test_unconfigure_after_a_partial_configure(loaded: list) -> None:
    config = Config()
    config.stash[session_key] = "state"
    plugin.pytest_unconfigure(config)
    assert session_key not in config.stash and config.pluginmanager.events == []
    other = Config()
    other.pluginmanager.register(object(), "qaccuracy-outcomes")
    plugin.pytest_unconfigure(other)
    assert other.pluginmanager.events[-1] == ("unregister", "qaccuracy-outcomes")


def test_xdist_merges_a_worker_payload_and_keeps_its_first_usage_error() -> None:
    merged = []
    state = SimpleNamespace(merge=merged.append, usage_error=None)
    hooks = plugin.QAccuracyXdist(state)
    hooks.pytest_testnodedown(SimpleNamespace(workeroutput={"qaccuracy": {"records": {}}}), None)
    hooks.pytest_testnodedown(SimpleNamespace(), "crashed")  # no output at all
    assert merged == [{"records": {}}, None] and state.usage_error is None
    hooks.pytest_testnodedown(SimpleNamespace(workeroutput={USAGE_OUTPUT: "bad metric"}), None)
    hooks.pytest_testnodedown(SimpleNamespace(workeroutput={USAGE_OUTPUT: "second"}), None)
    hooks.pytest_testnodedown(SimpleNamespace(workeroutput={USAGE_OUTPUT: ""}), None)
    assert state.usage_error == "bad metric"


def test_addoption_declares_the_options(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    monkeypatch.setattr(plugin, "add_options", seen.append)
    plugin.pytest_addoption("parser")
    assert seen == ["parser"]


def test_collect_file_makes_a_suite_of_suites_only(monkeypatch: pytest.MonkeyPatch) -> None:
    made = []

    class File:
        @staticmethod
        def from_parent(parent: Any, path: Path) -> Any:
            made.append((parent, path))
            return "suite"

    monkeypatch.setattr(plugin, "QAccuracyFile", File)
    monkeypatch.setattr(plugin, "is_suite", lambda path: path.name.startswith("qaccuracy"))
    assert plugin.pytest_collect_file(Path("qaccuracy_x.toml"), "parent") == "suite"
    assert plugin.pytest_collect_file(Path("pyproject.toml"), "parent") is None
    assert made == [("parent", Path("qaccuracy_x.toml"))]


def test_collection_hooks_mark_items_and_raise_usage_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(plugin, "mark_item", lambda item: calls.append(("mark", item)))
    monkeypatch.setattr(plugin, "raise_usage_errors", lambda config, items: calls.append(("usage", config, items)))
    plugin.pytest_itemcollected("item")
    plugin.pytest_collection_modifyitems("config", ["a"])
    assert calls == [("mark", "item"), ("usage", "config", ["a"])]


def test_setup_reads_the_marker_or_fails_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    item = SimpleNamespace(stash=pytest.Stash(), marks={"min_cosine": 0.9})
    monkeypatch.setattr(plugin, "read_marker", lambda it: it.marks)  # the item's own marker
    plugin.pytest_runtest_setup(item)
    assert item.stash[marker_key] == {"min_cosine": 0.9}

    def bad(it: Any) -> Any:
        raise ValueError("qaccuracy marker: min_cosine: expected a number")

    monkeypatch.setattr(plugin, "read_marker", bad)
    with pytest.raises(pytest.fail.Exception) as caught:
        plugin.pytest_runtest_setup(SimpleNamespace(stash=pytest.Stash()))
    assert str(caught.value) == "qaccuracy marker: min_cosine: expected a number"
    assert caught.value.pytrace is False


# --- pytest's outcomes ---------------------------------------------------------------------------


def report(when: str = "call", outcome: str = "passed", longrepr: Any = None, **extra: Any) -> SimpleNamespace:
    return SimpleNamespace(
        when=when,
        outcome=outcome,
        passed=outcome == "passed",
        failed=outcome == "failed",
        skipped=outcome == "skipped",
        longrepr=longrepr,
        nodeid="t.py::x",
        **extra,
    )


def test_judged_outcome_as_the_terminal_shows_it() -> None:
    assert plugin.judged_outcome(report("setup")) is None
    assert plugin.judged_outcome(report("teardown")) is None
    assert plugin.judged_outcome(report("setup", "failed")) == "failed"
    assert plugin.judged_outcome(report("setup", "skipped")) == "skipped"
    assert plugin.judged_outcome(report()) == "passed"
    assert plugin.judged_outcome(report("call", "failed", "AssertionError")) == "failed"
    assert plugin.judged_outcome(report("call", "skipped", wasxfail="why")) == "xfailed"
    assert plugin.judged_outcome(report("call", "passed", wasxfail="why")) == "xpassed"
    assert plugin.judged_outcome(report("call", "failed", "[XPASS(strict)] why")) == XPASS_STRICT
    assert plugin.judged_outcome(report("call", "passed", "[XPASS(strict)] why")) == "passed"
    assert plugin.judged_outcome(report("call", "failed", "x [XPASS(strict)]")) == "failed"


def test_outcomes_reach_the_session_with_their_xfail_reason() -> None:
    seen = []
    hooks = plugin.QAccuracyOutcomes(SimpleNamespace(record_report=lambda *a: seen.append(a)))
    hooks.pytest_runtest_logreport(report("setup"))
    hooks.pytest_runtest_logreport(report("call", "skipped", wasxfail="known"))
    hooks.pytest_runtest_logreport(report("call", "skipped", wasxfail=""))
    hooks.pytest_runtest_logreport(report("call", "failed"))
    assert seen == [("xfailed", "t.py::x", "known"), ("xfailed", "t.py::x", None), ("failed", "t.py::x", None)]


# --- the session's start and end -----------------------------------------------------------------


def test_sessionstart_checks_metrics_on_the_controller(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(plugin, "check_metrics", lambda s: calls.append(("metrics", s)))
    monkeypatch.setattr(plugin, "check_task_metrics", lambda s: calls.append(("tasks", s)))
    config = Config()
    plugin.pytest_sessionstart(SimpleNamespace(config=config))  # no state: the plugin was not configured
    config.stash[session_key] = SimpleNamespace(worker=True, settings="w")
    plugin.pytest_sessionstart(SimpleNamespace(config=config))
    assert calls == []
    config.stash[session_key] = SimpleNamespace(worker=False, settings="s")
    plugin.pytest_sessionstart(SimpleNamespace(config=config))
    assert calls == [("metrics", "s"), ("tasks", "s")]


def test_sessionfinish_ends_a_worker_usage_error_or_finishes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    finished = []
    monkeypatch.setattr(plugin, "finish_session", lambda *a: finished.append(a))
    config = Config()
    session = SimpleNamespace(config=config, exitstatus=0)
    plugin.pytest_sessionfinish(session)
    assert finished == [] and session.exitstatus == 0
    state = SimpleNamespace(usage_error=None)
    config.stash[session_key] = state
    config.stash[plugin.progress_key] = "progress"
    plugin.pytest_sessionfinish(session)
    assert finished == [(session, state, "progress")]
    state.usage_error = "task metric 'x': no module"
    plugin.pytest_sessionfinish(session)
    assert len(finished) == 1 and session.exitstatus == pytest.ExitCode.USAGE_ERROR
    assert capsys.readouterr().err == "ERROR: task metric 'x': no module\n"


def test_report_header_with_v_only() -> None:
    config = Config(verbosity=1)
    assert plugin.pytest_report_header(config) is None
    config.stash[session_key] = SimpleNamespace(header=lambda: "qaccuracy: min_cosine=0.99")
    assert plugin.pytest_report_header(config) == "qaccuracy: min_cosine=0.99"
    config.verbosity = 0
    assert plugin.pytest_report_header(config) is None


# --- the summary -----------------------------------------------------------------------------------


class Terminal:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict]] = []

    def write_sep(self, sep: str, title: str) -> None:
        self.lines.append((f"{sep} {title}", {}))

    def write_line(self, text: str, **markup: Any) -> None:
        self.lines.append((text, markup))


def state(**fields: Any) -> SimpleNamespace:
    base = {
        "worker": False,
        "records": {},
        "workers_without_data": 0,
        "errors": [],
        "written": [],
        "baselines": None,
        "status": None,
        "settings": SimpleNamespace(artifacts_dir=Path("/out"), sensitivity_top=3, report=None),
        "documents": lambda: ["docs"],
    }
    return SimpleNamespace(**{**base, **fields})


def summary(monkeypatch: pytest.MonkeyPatch, s: Any, rows: list | None = None) -> tuple[list, list]:
    import pytest_qaccuracy.report.summary as summary_module

    calls = []
    made = rows if rows is not None else []
    monkeypatch.setattr(summary_module, "summary_rows", lambda *a: calls.append(a) or made)
    monkeypatch.setattr(
        plugin,
        "report_path",
        lambda settings, written: (
            getattr(s, "report", None) if (settings, written) == (s.settings, s.written) else None
        ),
    )
    config = Config()
    if s is not None:
        config.stash[session_key] = s
    terminal = Terminal()
    plugin.pytest_terminal_summary(terminal, config)
    return terminal.lines, calls


def test_no_summary_without_anything_to_say(monkeypatch: pytest.MonkeyPatch) -> None:
    assert summary(monkeypatch, None) == ([], [])
    assert summary(monkeypatch, state()) == ([], [])
    assert summary(monkeypatch, state(worker=True, records={"k": 1})) == ([], [])


def test_summary_rows_coloured_by_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [
        SimpleNamespace(text="p passed", status="passed"),
        SimpleNamespace(text="q FAILED", status="failed"),
        SimpleNamespace(text="x xfailed", status="xfailed"),
        SimpleNamespace(text="  detail", status=None),
        SimpleNamespace(text="u", status="unchecked"),
    ]
    lines, calls = summary(monkeypatch, state(records={"k": 1}, written=[Path("/out/a")]), rows)
    assert lines == [
        ("= quantization accuracy summary", {}),
        ("p passed", {"green": True}),
        ("q FAILED", {"red": True}),
        ("x xfailed", {"yellow": True}),
        ("  detail", {}),
        ("u", {}),
    ]
    assert calls == [(["docs"], "/out", 3)]


def test_summary_names_artifacts_only_when_written(monkeypatch: pytest.MonkeyPatch) -> None:
    _, calls = summary(monkeypatch, state(records={"k": 1}))
    assert calls == [(["docs"], None, 3)]
    _, calls = summary(monkeypatch, state(workers_without_data=1))
    assert len(calls) == 1
    _, calls = summary(monkeypatch, state(errors=["e"]))
    assert len(calls) == 1


def test_summary_tail_report_baselines_errors_and_status(monkeypatch: pytest.MonkeyPatch) -> None:
    status = SimpleNamespace(complete=False, headline=lambda: "qaccuracy: session incomplete: 2 tests not run")
    s = state(
        records={"k": 1},
        written=[Path("/out/report.html")],
        report=Path("/out/report.html"),
        baselines=SimpleNamespace(line=lambda: "baselines: 1 compared"),
        errors=["could not write", "second"],
        status=status,
    )
    lines, _ = summary(monkeypatch, s)
    assert lines[1:] == [
        ("report: file:///out/report.html", {}),
        ("baselines: 1 compared", {}),
        ("could not write", {"red": True}),
        ("second", {"red": True}),
        ("qaccuracy: session incomplete: 2 tests not run", {"red": True}),
    ]
    complete = state(records={"k": 1}, status=SimpleNamespace(complete=True, headline=lambda: "complete"))
    lines, _ = summary(monkeypatch, complete)
    assert lines == [("= quantization accuracy summary", {})]
