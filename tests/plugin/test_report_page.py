"""The session's HTML report, as a person opens it: a passing and a failing session in headless Chromium."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from browser import DevTools, find_chromium, painted, png_rgb, run_chromium

from .conftest import PAIRS_MODULE

PASSING_MODULE = PAIRS_MODULE.split("def test_broken")[0]
YLORRD9 = {"#ffffcc", "#ffeda0", "#fed976", "#feb24c", "#fd8d3c", "#fc4e2a", "#e31a1c", "#bd0026", "#800026"}
BADGE = {"passed": "#1a7f37", "failed": "#cf222e"}


@pytest.fixture(scope="module")
def chromium() -> str:
    path = find_chromium()
    if path is None:
        pytest.skip("no headless Chromium found (apt-get install -y chromium)")
    return path


def report_link(stdout: str) -> Path:
    """The report the session printed as its last ``report: file://...`` line."""
    found = re.findall(r"^report: file://(\S+)$", stdout, re.M)
    assert found, stdout[-2000:]
    return Path(found[-1])


def check_page(chromium: str, path: Path, tmp_path: Path) -> str:
    """Render ``path``; check it drew without console messages, every link lands on an element, and
    the graph's nodes are filled with visq colours. Returns the DOM."""
    page = run_chromium(chromium, tmp_path, path.as_uri(), "--dump-dom")
    assert page.console == []
    dom = page.dom
    assert 'data-ready="1"' in dom and 'data-error="' not in dom
    ids = set(re.findall(r'\sid="([^"]+)"', dom))
    links = re.findall(r'\shref="#([^"]+)"', dom)
    assert links and set(links) <= ids, set(links) - ids
    anchors = re.findall(r'data-anchor="([^"]+)"', dom)  # graph nodes link to layer rows
    assert anchors and all(a in ids and "-layer-" in a for a in anchors)
    fills = re.findall(r'<g class="node op" data-color="(#[0-9a-f]{6})"', dom)
    assert set(fills) & YLORRD9 and set(fills) <= YLORRD9 | {"#c0c0c0"}, fills
    return dom


def verdicts(dom: str) -> list[str]:
    overview = dom[dom.index('class="overview-table"') : dom.index('<section class="pair"')]
    return re.findall(r'data-verdict="(\w+)"', overview)


def test_passing_and_failing_sessions(digits: pytest.Pytester, chromium: str, tmp_path: Path) -> None:
    digits.makepyfile(test_good=PASSING_MODULE)
    passing = digits.runpytest()
    passing.assert_outcomes(passed=1)
    path = report_link(passing.stdout.str())
    assert path == digits.path / ".qaccuracy" / "report.html"
    dom = check_page(chromium, path, tmp_path)
    assert verdicts(dom) == ["passed"] and "1 / 1 pairs passed" in dom

    digits.makepyfile(test_good="", test_pairs=PAIRS_MODULE)
    failing = digits.runpytest("--qaccuracy-report=site/qa.html")
    failing.assert_outcomes(passed=1, failed=1)
    path = report_link(failing.stdout.str())
    assert path == digits.path / "site" / "qa.html" and not (digits.path / ".qaccuracy" / "report.html").exists()
    summary = json.loads((digits.path / ".qaccuracy" / "summary.json").read_text())
    assert summary["report"] == path.as_posix()
    dom = check_page(chromium, path, tmp_path)
    assert verdicts(dom) == ["failed", "passed"] and "1 / 2 pairs passed" in dom
    broken = dom[dom.index('id="pair-0"') : dom.index('id="pair-1"')]
    assert 'class="check-row failed"' in broken and "min_top1_agreement" in broken
    assert 'class="topk-row"' in broken and "Drift against the baseline" not in broken

    shot = tmp_path / "failing.png"
    run_chromium(chromium, tmp_path, path.as_uri(), "--window-size=1100,700", f"--screenshot={shot}")
    image = png_rgb(shot.read_bytes())
    assert painted(image, BADGE["failed"]) > 100 and painted(image, BADGE["passed"]) > 100

    # the verdict filter: ?verdict=failed starts with the failing pair only; the boxes toggle
    shots = Path(os.environ.get("QACCURACY_SCREENSHOTS") or tmp_path / "screenshots")
    visible = "Array.from(document.querySelectorAll('section.pair')).filter(s => !s.hidden).map(s => s.id)"
    rows = "Array.from(document.querySelectorAll('tr.overview-row')).filter(r => !r.hidden).length"
    with DevTools(chromium, tmp_path) as browser:
        browser.open(path.as_uri() + "?verdict=failed", 1100, 900)
        assert browser.run(visible) == ["pair-0"] and browser.run(rows) == 1
        assert browser.run("document.body.dataset.verdicts") == "failed"
        browser.screenshot(shots / "verdict-filter-failed.png")
        for status in ("failed", "passed"):  # failed off, passed on
            browser.run(f"document.querySelector('.verdict-filter.{status} input').click()")
        assert browser.run(visible) == ["pair-1"] and browser.run("document.body.dataset.verdicts") == "passed"
        browser.open(path.as_uri(), 1100, 900)
        assert browser.run(visible) == ["pair-0", "pair-1"] and browser.run(rows) == 2
        labels = browser.run("Array.from(document.querySelectorAll('.verdict-filter')).map(l => l.textContent.trim())")
        assert labels == ["1 passed", "1 failed"]
        assert browser.console == []
