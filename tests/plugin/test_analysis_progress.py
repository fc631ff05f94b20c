"""The end-of-session sensitivity analysis shows progress on stderr, and is quiet with ``-q``."""

from __future__ import annotations

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
