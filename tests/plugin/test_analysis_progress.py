"""The end-of-session sensitivity analysis shows progress on stderr, and is quiet with ``-q``."""

from __future__ import annotations

import re

import pytest

from .conftest import PAIRS_MODULE


def test_analysis_progress_on_stderr_and_none_with_quiet(digits: pytest.Pytester, monkeypatch) -> None:
    monkeypatch.setenv("QACCURACY_PROGRESS", "1")  # stderr is no terminal here
    digits.makepyfile(test_pairs=PAIRS_MODULE)
    result = digits.runpytest("--qaccuracy-no-artifacts")
    result.assert_outcomes(passed=1, failed=1)
    err = result.stderr.str()  # "\r" splits lines here
    assert "sensitivity: 0 / 32 records" in err and "sensitivity: 32 / 32 records, " in err and " left" in err
    # each job is drawn below pytest's last line of results, erased, and the cursor goes back up
    assert err.startswith("\n") and err.endswith("\x1b[K\x1b[A")
    assert err.count(" 0 / 32 records") >= 2  # sensitivity, cumulative
    # the pair checks inside the tests too (the 300 test records), on the stderr pytest does not capture
    assert err.count("compare: 300 / 300 records, ") == 2
    assert err.count("\x1b[A") == err.count(": 0 / ")  # every job went back up when done
    assert any("sensitivity (node) of" in line for line in result.outlines)  # the analysis ran as before

    quiet = digits.runpytest("--qaccuracy-no-artifacts", "-q")
    quiet.assert_outcomes(passed=1, failed=1)
    assert "records" not in quiet.stderr.str()


#: Loaded by the xdist workers too: a plain line for every advance instead of every 30 seconds.
FAST_LOG = """
from pytest_qaccuracy.data import progress

progress.LOG_INTERVAL = 0.0
"""


def test_xdist_workers_print_plain_lines_to_a_log(digits: pytest.Pytester, monkeypatch) -> None:
    monkeypatch.delenv("QACCURACY_PROGRESS", raising=False)
    digits.makepyfile(test_pairs=PAIRS_MODULE)
    digits.makeconftest(FAST_LOG)
    result = digits.runpytest_subprocess("--qaccuracy-no-artifacts", "-n", "2", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    lines = result.stderr.lines  # the workers share the controller's stderr, a pipe here
    worker_lines = [line for line in lines if line.startswith("[gw")]
    assert worker_lines, result.stderr.str()
    assert all("\x1b" not in line and "\r" not in line for line in lines)  # plain lines, no redrawing
    # the pair checks inside the tests and the end-of-session analysis, each line naming its worker
    assert any(re.fullmatch(r"\[gw[01]\] compare: \d+ / 300 records, .* rec/s, .* left", line) for line in lines)
    assert any(re.fullmatch(r"\[gw[01]\] sensitivity: \d+ / 32 records in \d+s", line) for line in lines)

    for quiet in (["-q"], []):
        if not quiet:
            monkeypatch.setenv("QACCURACY_PROGRESS", "0")
        silent = digits.runpytest_subprocess("--qaccuracy-no-artifacts", "-n", "2", "-p", "no:cacheprovider", *quiet)
        silent.assert_outcomes(passed=1, failed=1)
        assert not [line for line in silent.stderr.lines if line.startswith("[gw")]
