"""Interrupted and incomplete sessions are marked, and artifacts are published as a set.

Real pytest processes get real signals: SIGINT during a test, SIGINT or SIGTERM at the Nth file the
artifact writer writes; an xdist worker dies in the middle of a session; ``-x`` stops one early.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

CHECK = """
@pytest.mark.qaccuracy(fp32="models/digits_cnn.onnx", quantized="models/digits_cnn.{kind}.onnx",
                       data="data/digits_test.npz")
def test_{name}(qaccuracy):
    qaccuracy.check()
"""

SLOW = """
import pathlib, time

import pytest
{a}

def test_b():
    pathlib.Path("ready").write_text("")
    time.sleep(60)
{c}"""


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _pytest(root: Path, *args: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", *args]
    return subprocess.Popen(command, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_sigint_during_the_tests_marks_summary_and_report_interrupted(digits: pytest.Pytester) -> None:
    source = SLOW.format(a=CHECK.format(kind="qdq", name="a"), c=CHECK.format(kind="qoperator", name="c"))
    digits.makepyfile(test_slow=source)
    process = _pytest(digits.path, "-p", "no:benchmark")
    deadline = time.monotonic() + 60
    while not (digits.path / "ready").exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == pytest.ExitCode.INTERRUPTED, out + err
    summary = json.loads((digits.path / ".qaccuracy" / "summary.json").read_text())
    assert (summary["status"], summary["passed"]) == ("interrupted", False)  # the one pair checked passed
    assert [p["passed"] for p in summary["pairs"]] == [True]
    assert summary["missing"] == {
        "reason": "during the tests",
        "not_run": ["test_slow.py::test_c"],
        "lost": [],
        "workers_lost": 0,
    }
    report = (digits.path / ".qaccuracy" / "report.html").read_text()
    assert "session interrupted (during the tests); 1 test(s) did not run: test_slow.py::test_c." in report
    assert "session interrupted (during the tests)" in out and "Traceback" not in err
    assert [p.name for p in digits.path.iterdir() if p.name.startswith(".qaccuracy.")] == []  # no temp folder


FIRE = """
import os, signal
from pathlib import Path

from pytest_qaccuracy import atomic

_write, _calls = atomic.atomic_write, [0]


def _signalled(path, write, mode="w"):
    result = _write(path, write, mode)
    _calls[0] += 1
    if _calls[0] == int(os.environ["QA_AT"]):  # a real signal, just after the Nth artifact is written
        Path(os.environ["QA_FIRED"]).write_text(str(path))
        os.kill(os.getpid(), getattr(signal, os.environ["QA_SIGNAL"]))
    return result


atomic.atomic_write = _signalled
"""


def test_a_signal_while_artifacts_are_written_leaves_the_folder_as_it_was(digits: pytest.Pytester) -> None:
    """SIGINT after the 1st file, SIGTERM after the 8th: one line, exit 2, the old set untouched."""
    digits.makepyfile(test_a="import pytest\n" + CHECK.format(kind="broken", name="a"))
    assert digits.runpytest("-p", "no:benchmark").ret == pytest.ExitCode.TESTS_FAILED
    old = _tree(digits.path / ".qaccuracy")
    assert len(old) > 8 and json.loads(old["summary.json"])["missing"] is None
    assert json.loads(old["summary.json"])["status"] == "complete" and b'class="qa-notice"' not in old["report.html"]
    digits.makeconftest(FIRE)
    runs = {}
    for at, name in ((1, "SIGINT"), (8, "SIGTERM")):
        folder = digits.path / f"out{at}"
        shutil.copytree(digits.path / ".qaccuracy", folder)
        env = {"QA_AT": str(at), "QA_SIGNAL": name, "QA_FIRED": str(digits.path / f"fired{at}")}
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:benchmark"]
        runs[at] = subprocess.Popen(
            [*command, f"--qaccuracy-artifacts-dir={folder.name}"],
            cwd=digits.path,
            env={**__import__("os").environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    for at, process in runs.items():
        out, err = process.communicate(timeout=120)
        assert (digits.path / f"fired{at}").exists(), out + err
        assert process.returncode == pytest.ExitCode.INTERRUPTED, out + err
        folder = digits.path / f"out{at}"
        assert err.strip().splitlines() == [
            f"Exit: qaccuracy: interrupted while writing artifacts; {folder} left as it was"
        ]
        assert "Traceback" not in out + err
        assert _tree(folder) == old, at
    leftovers = [p.name for p in digits.path.iterdir() if p.name.startswith(".out") or p.name.endswith(".tmp")]
    assert leftovers == []


CRASH = """
import os

import pytest
{a}

def test_b():
    os._exit(3)  # the worker dies: the results of test_a, which ran on it, never reach the controller
{c}"""


def test_a_crashed_xdist_worker_marks_the_session_incomplete(digits: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    source = CRASH.format(a=CHECK.format(kind="qdq", name="a"), c=CHECK.format(kind="qoperator", name="c"))
    digits.makepyfile(test_crash=source)
    result = digits.runpytest_subprocess("-n", "1", "-p", "no:randomly", "-p", "no:benchmark")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    summary = json.loads((digits.path / ".qaccuracy" / "summary.json").read_text())
    assert (summary["status"], summary["passed"]) == ("incomplete", False)
    assert [p["id"] for p in summary["pairs"]] == ["digits_cnn.qoperator"]  # test_c ran on the new worker
    assert summary["missing"] == {
        "reason": "an xdist worker crashed",
        "not_run": [],
        "lost": [{"test": "test_crash.py::test_a", "pair": "digits_cnn.qdq"}],
        "workers_lost": 1,
    }
    headline = (
        "session incomplete (an xdist worker crashed); 1 check(s) ran but their results were lost: "
        "test_crash.py::test_a (pair 'digits_cnn.qdq'); 1 xdist worker(s) sent no results (crashed?). "
        "These artifacts do not cover the whole session."
    )
    result.stdout.fnmatch_lines([headline])
    assert headline in (digits.path / ".qaccuracy" / "report.html").read_text()


def test_stopping_at_the_first_failure_marks_the_session_incomplete(digits: pytest.Pytester) -> None:
    digits.makepyfile(
        test_x="import pytest\n" + CHECK.format(kind="broken", name="a") + CHECK.format(kind="qdq", name="b")
    )
    result = digits.runpytest("-x")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    summary = json.loads((digits.path / ".qaccuracy" / "summary.json").read_text())
    assert summary["status"] == "incomplete"
    assert summary["missing"]["reason"] == "stopping after 1 failures"
    assert summary["missing"]["not_run"] == ["test_x.py::test_b"]
