"""The HTML report of a real detector (YOLOv8n: 328 ONNX nodes, 235 drawn) in headless Chromium at 1400 and
420 px: screenshots for a person to look at (``$QACCURACY_SCREENSHOTS``, kept by CI), and the
checks a person would make on them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from browser import DevTools, find_chromium
from corpus_helpers import run_cli

pytestmark = pytest.mark.corpus


@pytest.mark.parametrize("width", [1400, 420])
def test_detector_report_in_a_browser(corpus, tmp_path: Path, capsys, width: int) -> None:
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("no headless Chromium found (apt-get install -y chromium)")
    entry = corpus["yolov8n"]
    out = tmp_path / "artifacts"
    argv = ["compare", entry.fp32, entry.model("qdq_u8s8"), "--data", entry.data("smoke"), "--out-dir", out, "-q"]
    code, _, stderr = run_cli(argv, capsys)
    assert code == 0, stderr
    shots = Path(os.environ.get("QACCURACY_SCREENSHOTS") or tmp_path / "screenshots")
    with DevTools(chromium, tmp_path) as browser:
        browser.open((out / "report.html").as_uri(), width, 1000)
        assert browser.run("document.body.dataset.ready") == "1" and browser.console == []
        assert browser.run("document.documentElement.scrollWidth") == width  # only boxes scroll sideways
        assert browser.run("document.querySelectorAll('svg.graph g.node').length") >= 200  # 235 drawn
        browser.screenshot(shots / f"yolov8n-{width}.png")
        sqnr = browser.run(
            "(() => { const h = document.querySelector('table.layers th[data-key=\"sqnr\"]').getBoundingClientRect();"
            " const w = document.querySelector('.table-wrap:has(table.layers)').getBoundingClientRect();"
            " return h.right <= w.right + 1; })()"
        )
        assert sqnr or width < 1400  # the whole layer table at 1400 px; a sideways scroll on a phone
        browser.run("document.querySelector('tr.overview-row td.worst a').click()")
        assert browser.run("document.querySelector('tr.hl') !== null")
        browser.screenshot(shots / f"yolov8n-{width}-worst-layer.png")
        browser.run("document.querySelector('tr.hl td.tensor').click()")  # the worst layer's node
        assert browser.run("document.querySelector('g.node.hl') !== null")
        browser.screenshot(shots / f"yolov8n-{width}-row-to-node.png")
        browser.run("document.querySelector('.graph-tools button[title=\"fit the whole graph\"]').click()")
        browser.screenshot(shots / f"yolov8n-{width}-fit.png")
        assert browser.console == []
