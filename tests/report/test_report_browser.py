"""The HTML report at real size, driven in headless Chromium over the DevTools protocol: the graph's
zoom, fit and find, a table row to its node and back, linked rows clear of the sticky header, the
layer table's columns at 1400 px, the layout at 420 px. Screenshots go to ``$QACCURACY_SCREENSHOTS``
(kept by CI) or the test's temporary folder."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from browser import DevTools, find_chromium

from pytest_qaccuracy.report.html import ReportPair, write_html

from .conftest import build_result, chain_model

#: Every metric the comparison measures by default, as a real report shows them.
METRICS = {
    "mse": False,
    "mpeir": False,
    "tae": False,
    "srmse": False,
    "mre": False,
    "max_abs": False,
    "lsb": False,
    "clipped": False,
    "cosine": True,
    "sqnr": True,
}
LAYERS = 300
OPS = ("Conv", "Sigmoid", "Mul", "Add", "Concat", "Split")


@pytest.fixture(scope="module")
def chromium() -> str:
    path = find_chromium()
    if path is None:
        pytest.skip("no headless Chromium found (apt-get install -y chromium)")
    return path


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = os.environ.get("QACCURACY_SCREENSHOTS")
    return Path(folder) if folder else tmp_path / "screenshots"


def _tensor(i: int) -> str:
    """Names as long as a detector's (``/model.22/cv3.2/cv3.2.1/conv/Conv_output_0``)."""
    return f"/model.{i // 12}/cv{i % 3}.{i % 5}/m.{i % 7}/{OPS[i % len(OPS)].lower()}/{OPS[i % len(OPS)]}_output_{i}"


@pytest.fixture(scope="module")
def large_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 300-node model's report with all ten metrics; values vary smoothly along the graph."""
    rows = []
    for i in range(LAYERS):
        sqnr = 20 + 15 * math.sin(i / 17)
        metrics = {name: abs(math.cos(i / (k + 3))) * (10 ** (k % 4 - 2)) for k, name in enumerate(METRICS)}
        metrics |= {"sqnr": sqnr, "cosine": 1 - 10 ** (-sqnr / 10), "clipped": 0.0}
        rows.append((_tensor(i), OPS[i % len(OPS)], metrics))
    definitions = {name: f"{name} of the layer" for name in METRICS}
    result = build_result(rows, outputs=[("output0", rows[-1][2])], definitions=definitions, higher_is_better=METRICS)
    model = chain_model([(tensor, op) for tensor, op, _ in rows] + [("output0", "Concat")])
    path = tmp_path_factory.mktemp("large") / "report.html"
    return write_html(path, [ReportPair(result, name="detector", model=model)])


def _rect(browser: DevTools, selector: str) -> dict:
    script = f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
    return browser.run(script + " return {top: r.top, bottom: r.bottom, left: r.left, right: r.right}; })()")


def _inside(inner: dict, outer: dict) -> bool:
    vertical = inner["top"] >= outer["top"] - 1 and inner["bottom"] <= outer["bottom"] + 1
    return vertical and inner["left"] >= outer["left"] - 1 and inner["right"] <= outer["right"] + 1


def _open(browser: DevTools, path: Path, width: int, height: int, query: str = "") -> None:
    browser.open(path.as_uri() + query, width, height)
    assert browser.run("document.body.dataset.ready") == "1", browser.run("document.body.dataset.error")
    assert browser.console == []


def test_graph_zoom_fit_find_and_rows_at_1400(chromium: str, tmp_path: Path, large_report: Path, shots: Path) -> None:
    with DevTools(chromium, tmp_path) as browser:
        _open(browser, large_report, 1400, 1000)
        browser.screenshot(shots / "large-1400.png")
        # the layer table shows its last column (SQNR) without cutting it
        table = _rect(browser, ".table-wrap:has(table.layers)")
        assert _inside(_rect(browser, 'table.layers th[data-key="sqnr"]'), {**table, "top": 0, "bottom": 1e9})
        scale = lambda: float(browser.run("document.querySelector('svg.graph').dataset.scale"))  # noqa: E731
        tool = "document.querySelector('.graph-tools button[title=\"{}\"]').click()"
        start = scale()
        browser.run(tool.format("zoom in"))
        assert scale() == pytest.approx(start * 1.25, rel=1e-3)
        browser.run(tool.format("zoom out"))
        browser.run(tool.format("zoom out"))
        assert scale() == pytest.approx(start / 1.25, rel=1e-3)
        browser.run(tool.format("fit the whole graph"))
        browser.run("document.querySelector('.graph-wrap').scrollIntoView()")
        assert _inside(_rect(browser, "svg.graph"), _rect(browser, ".graph-wrap"))  # all of it in the box
        browser.screenshot(shots / "large-1400-fit.png")

        # find a node by part of its name: highlighted and brought into the box
        wanted = _tensor(150)
        browser.run(
            "const f = document.querySelector('.graph-tools input[type=search]');"
            f"f.value = {json.dumps(wanted[-22:])}; f.dispatchEvent(new Event('input'))"
        )
        assert browser.run("document.querySelector('g.node.hl').dataset.tensor") == wanted
        assert browser.run("document.querySelector('.graph-tools .hint:not(.zoom)').textContent").startswith("1 of 1")
        assert _inside(_rect(browser, "g.node.hl"), _rect(browser, ".graph-wrap"))
        browser.screenshot(shots / "large-1400-find.png")

        # a table row shows its node; "back" returns to the row, highlighted, below the sticky header
        browser.run("document.querySelector('tr.layer-row[data-order=\"240\"] td.tensor').click()")
        assert browser.run("document.querySelector('g.node.hl').dataset.tensor") == _tensor(240)
        assert _inside(_rect(browser, "g.node.hl"), _rect(browser, ".graph-wrap"))
        browser.screenshot(shots / "large-1400-row-to-node.png")
        browser.run(tool.format("back to the table row you came from"))
        assert browser.run("document.querySelector('tr.hl').dataset.order") == "240"
        row, head = _rect(browser, "tr.hl"), _rect(browser, "table.layers thead")
        assert row["top"] >= head["bottom"] - 1 and row["top"] >= 0 and row["bottom"] <= 1000

        # the overview's worst-layer link lands on its row, highlighted and clear of the sticky header
        browser.run("document.querySelector('tr.overview-row td.worst a').click()")
        worst = browser.run("document.querySelector('tr.overview-row td.worst a').getAttribute('href')")
        assert browser.run("document.querySelector('tr.hl').id") == worst[1:]
        row, head = _rect(browser, "tr.hl"), _rect(browser, "table.layers thead")
        assert row["top"] >= head["bottom"] - 1 and row["top"] >= 0 and row["bottom"] <= 1000
        browser.screenshot(shots / "large-1400-worst-layer.png")
        # a node's click leads back to its row
        first = "document.querySelector('g.node[data-tensor] a[data-anchor]')"
        browser.run(f"{first}.dispatchEvent(new MouseEvent('click'))")
        assert browser.run("document.querySelector('tr.hl').dataset.order") == "0"
        assert browser.console == []


def test_readable_at_420_px(chromium: str, tmp_path: Path, large_report: Path, shots: Path) -> None:
    with DevTools(chromium, tmp_path) as browser:
        _open(browser, large_report, 420, 900)
        browser.screenshot(shots / "large-420.png")
        # nothing wider than the phone but the boxes that scroll (tables, graph)
        assert browser.run("document.documentElement.scrollWidth") == 420
        # the chart is drawn for this width: its 11 px text is shown at 10 px or more
        ratio = browser.run(
            "(() => { const c = document.querySelector('svg.chart');"
            " return c.getBoundingClientRect().width / c.viewBox.baseVal.width; })()"
        )
        assert 11 * ratio >= 10
        # the overview is a card per pair; the layer table scrolls sideways and says so
        assert browser.run("getComputedStyle(document.querySelector('tr.overview-row')).display") == "block"
        assert browser.run("document.querySelector('.table-wrap:has(table.layers)').classList.contains('overflows')")
        assert "scroll sideways" in browser.run("document.querySelector('section.pair .controls .hint').textContent")
        browser.run("document.querySelector('tr.layer-row[data-order=\"120\"] td.tensor').click()")
        assert _inside(_rect(browser, "g.node.hl"), _rect(browser, ".graph-wrap"))
        browser.screenshot(shots / "large-420-row-to-node.png")
        assert browser.console == []


def test_environment_section(chromium: str, tmp_path: Path, small_result, monkeypatch) -> None:
    from pytest_qaccuracy.report.environment import environment

    monkeypatch.setenv("GITHUB_SHA", "0123456789abcdef0123456789abcdef01234567")
    rows = dict(environment())
    assert rows["commit"] == "0123456789abcdef0123456789abcdef01234567"
    assert {"created (UTC)", "python", "onnxruntime", "numpy", "platform", "CPU"} <= set(rows)
    assert rows["onnxruntime int8 family"] in ("onnxruntime-avx2", "onnxruntime-vnni")
    path = write_html(tmp_path / "r.html", [small_result], environment=[["commit", "abc123"], ["CPU", "a <b> CPU"]])
    with DevTools(chromium, tmp_path) as browser:
        _open(browser, path, 1000, 800)
        shown = browser.run(
            "Array.from(document.querySelectorAll('tr.env-row')).map(r => [r.cells[0]"
            " ? r.querySelector('th').textContent : '', r.querySelector('td').textContent])"
        )
        assert shown == [["commit", "abc123"], ["CPU", "a <b> CPU"]]
        assert "commit abc123" in browser.run("document.querySelector('section.environment summary').textContent")
