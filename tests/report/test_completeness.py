"""How summary.json, report.html and the terminal word an interrupted or incomplete session."""

from __future__ import annotations

import html

from pytest_qaccuracy.report.completeness import SessionStatus
from pytest_qaccuracy.report.html import render_html


def test_a_complete_session_says_nothing():
    status = SessionStatus()
    assert status.complete and status.to_dict() is None and status.headline() is None


def test_an_incomplete_session_names_what_is_missing():
    not_run = tuple(f"t.py::test_{i}" for i in range(7))
    status = SessionStatus("incomplete", "an xdist worker crashed", not_run, (("t.py::test_a", "qdq"),), 1)
    assert status.to_dict() == {
        "reason": "an xdist worker crashed",
        "not_run": list(not_run),
        "lost": [{"test": "t.py::test_a", "pair": "qdq"}],
        "workers_lost": 1,
    }
    assert status.headline() == (
        "session incomplete (an xdist worker crashed); 7 test(s) did not run: t.py::test_0, t.py::test_1, "
        "t.py::test_2, t.py::test_3, t.py::test_4 and 2 more; 1 check(s) ran but their results were lost: "
        "t.py::test_a (pair 'qdq'); 1 xdist worker(s) sent no results (crashed?). "
        "These artifacts do not cover the whole session."
    )


def test_the_html_report_shows_the_notice_without_javascript(small_result):
    notice = "session interrupted (during the tests); 1 test(s) did not run: t.py::test_<b>."
    page = render_html([small_result], notice=notice)
    assert f'<p class="qa-notice" role="alert">{html.escape(notice)}</p>' in page
    assert "test_<b>" not in page.split("<script")[0]  # escaped in the static part
    assert 'class="qa-notice"' not in render_html([small_result])
