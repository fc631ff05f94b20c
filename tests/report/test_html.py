"""HTML report: self-contained, safely embedded data, and rendered by a real headless Chromium."""

from __future__ import annotations

import json
import re

import pytest
from browser import find_chromium, painted, png_rgb, run_chromium

from pytest_qaccuracy.report.html import ReportPair, embed_json, pair_data, render_html, write_html
from pytest_qaccuracy.report.summary import target_view

DATA = re.compile(r'<script type="application/json" id="qaccuracy-data">(.*?)</script>', re.S)
HOSTILE = 'a"b</script><img src=x onerror=alert(1)>'


@pytest.fixture
def hostile_result(make_result):
    rows = [
        ("conv1_out", "Conv", {"mse": 0.002, "cosine": 0.999, "sqnr": 30.0}),
        (HOSTILE, "Relu", {"mse": 0.02, "cosine": float("nan"), "sqnr": None}),
        ("back\\slash\u2028", "Add", {"mse": 0.0, "cosine": 1.0, "sqnr": 60.0}),
    ]
    defs = {"mse": "mean((f - q)^2)", "cosine": "cos </script>", "sqnr": "dB"}
    return make_result(rows, outputs=[("y", {"mse": 0.01, "cosine": 0.99, "sqnr": 20.0})], definitions=defs)


def embedded(text: str) -> dict:
    return json.loads(DATA.search(text)[1])


def test_self_contained(small_result):
    text = render_html([small_result], title="Nightly <int8> & co")
    urls = set(re.findall(r"https?://[^\s\"')]+", text))
    assert urls <= {"http://www.w3.org/2000/svg"}  # the SVG namespace name, never fetched
    assert not re.search(r"<(link|img|iframe)\b|src=", text)
    assert "<title>Nightly &lt;int8&gt; &amp; co</title>" in text
    assert text.count("<script") == 2 and text.count("</script>") == 2


def test_embedded_data(small_result):
    data = embedded(render_html([small_result]))
    assert data["title"] == "Quantization accuracy report"
    (pair,) = data["pairs"]
    assert pair["title"] == "net.int8.onnx vs net.onnx"
    assert [m["name"] for m in pair["metrics"]] == ["mse", "mpeir", "cosine", "sqnr"]
    mse = pair["metrics"][0]
    assert mse["higher_is_better"] is False and mse["label"] == "MSE"
    assert mse["slots"][0] == [0.0005, pytest.approx(0.0005 + 0.0195 / 9), "#ffffcc", "0.0005 – 0.002667"]
    assert mse["slots"][-1][1:] == [0.02, "#800026", "0.01783 – 0.02"]
    assert pair["metrics"][2]["slots"][0][2] == "#800026"  # cosine: lowest values are dark red
    assert pair["metrics"][1]["scale"] == "fixed 0..1"
    assert [x["order"] for x in pair["layers"]] == [0, 1, 2, 3]
    assert pair["unmatched"] == {"fp32": ["pool_out"], "quantized": ["pool_out_quantized"]}
    assert pair["outputs"][0]["metrics"]["sqnr"] == 25.0
    # every value formatted and coloured in Python: the page's script never formats a number
    assert pair["outputs"][0]["text"] == {"mse": "0.01", "mpeir": "0.2", "cosine": "0.9950", "sqnr": "25.00 dB"}
    assert pair["layers"][1]["text"]["mpeir"] == "n/a" and "mpeir" not in pair["layers"][1]["color"]
    assert pair["layers"][2]["color"] == {"mse": "#800026", "mpeir": "#fed976", "cosine": "#800026", "sqnr": "#800026"}
    sqnr = pair["metrics"][3]
    assert sqnr["axis"]["ticks"][0] == [20.0, "20.00 dB"] and sqnr["log_axis"]["ticks"][0][1] == "19.32 dB"
    assert pair["first_metric"] == "sqnr" and pair["worst"][0] == {
        "tensor": "conv2_out",
        "op_type": "Conv",
        "order": 2,
        "text": "20.00 dB",
    }
    assert pair["verdict"]["status"] == "unchecked" and pair["verdict"]["label"] == "NO CHECKS"
    assert pair["graph"] == {"note": "no graph: the fp32 model was not available to this report"}


def test_hostile_names_and_non_finite_values(hostile_result):
    text = render_html([hostile_result])
    assert "NaN" not in DATA.search(text)[1]
    assert "\u2028" not in text
    pair = embedded(text)["pairs"][0]
    assert pair["layers"][1]["tensor"] == HOSTILE
    assert pair["layers"][1]["metrics"]["cosine"] is None
    assert pair["layers"][2]["tensor"] == "back\\slash\u2028"
    assert pair_data(hostile_result)["metrics"][1]["definition"] == "cos </script>"


def test_embed_json_escapes():
    text = embed_json({"k": "</script><!-- & \u2028", "v": [1.5, None]})
    assert "<" not in text and ">" not in text and "&" not in text and "\u2028" not in text
    assert json.loads(text) == {"k": "</script><!-- & \u2028", "v": [1.5, None]}
    with pytest.raises(ValueError):
        embed_json({"v": float("nan")})


def test_no_results_and_write(tmp_path):
    path = write_html(tmp_path / "sub" / "report.html", [])
    assert embedded(path.read_text(encoding="utf-8"))["pairs"] == []


# --- a real browser --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chromium():
    path = find_chromium()
    if path is None:
        pytest.skip("no headless Chromium found (apt-get install -y chromium)")
    return path


def load(chromium, tmp_path, path, *extra) -> str:
    """The DOM of ``path`` after its script ran; the page must render with no console message."""
    page = run_chromium(chromium, tmp_path, path.as_uri(), "--dump-dom", *extra)
    assert page.console == []
    assert 'data-ready="1"' in page.dom and 'data-error="' not in page.dom
    return page.dom


def _targets(passed: dict[str, bool]) -> dict:
    """A pair record's deployment targets, one output's cosine each, with these verdicts."""
    run = {"backend": "integer", "scheme": "s", "outputs": {"y": {"cosine": 0.99}}, "topk": {}}
    return {"targets": {name: {**run, "passed": ok} for name, ok in passed.items()}}


def test_browser_builds_tables_and_chart(chromium, tmp_path, small_result, hostile_result):
    view = target_view(_targets({"avx2": False, "vnni": True}))
    assert view["passed"] == [False, True] and view["rows"][-1] == ["", "checks", "FAIL", "pass"]
    # the verdict row's cells say the opposite of the data: the colour must follow the data
    view["rows"][-1] = ["", "checks", "pass", "FAIL"]
    pairs = [ReportPair(small_result, targets=view), hostile_result]
    path = write_html(tmp_path / "report.html", pairs, title="browser test")
    dom = load(chromium, tmp_path, path)
    targets = re.search(r'<table class="targets".*?</table>', dom, re.S)[0]
    assert re.findall(r'<td class="([^"]*)">(pass|FAIL)</td>', targets) == [("num fail", "pass"), ("num", "FAIL")]
    assert dom.count('<section class="pair"') == 2
    assert dom.count('class="layer-row"') == 4 + 3
    # the chart shows SQNR first: every layer of the first pair has a value, one of the second has none
    assert dom.count('<rect class="bar"') == 4 + 2
    assert dom.count('class="overview-table"') == 1 and dom.count('data-verdict="unchecked"') == 4
    # 4 metrics x (4 layers + 1 output) cells, coloured with the visq palette, for the first pair
    first = dom[dom.index('id="pair-0"') : dom.index('id="pair-1"')]
    assert len(re.findall(r'data-color="#[0-9a-f]{6}"', first)) == 4 * 5 - 1  # relu1_out's MPEIR is None
    assert "pool_out_quantized" in first and "no graph: the fp32 model was not available" in first
    # the hostile name is text, not markup
    assert 'a"b&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;' in dom
    assert "<img" not in dom


def test_browser_screenshot(chromium, tmp_path, small_result, small_model):
    """The page paints at the window's size, and every visq colour the cells, bars and graph nodes use
    is on screen. Not caught: cells without their background (the legend swatches show the same colours)."""
    from pytest_qaccuracy.report.html import ReportPair

    path = write_html(tmp_path / "report.html", [ReportPair(small_result, model=small_model)])
    shot = tmp_path / "report.png"
    run_chromium(chromium, tmp_path, path.as_uri(), "--window-size=1300,1500", f"--screenshot={shot}")
    image = png_rgb(shot.read_bytes())
    assert image.shape == (1500, 1300, 3)
    dom = load(chromium, tmp_path, path)
    cells = set(re.findall(r'<td class="num[^"]*" [^>]*data-color="(#[0-9a-f]{6})"', dom))
    bars = set(re.findall(r'<rect class="bar"[^>]*fill="(#[0-9a-f]{6})"', dom))
    assert len(cells) >= 5 and bars <= cells, (cells, bars)  # 19 cells spread over the palette
    for colour in sorted(cells):
        assert painted(image, colour) >= 500, colour  # exact fills, not anti-aliased edges


INTERACT = """<script>
(function () {
  var out = {};
  var section = document.getElementById("pair-0");
  var head = section.querySelector('table.layers th[data-key="mse"] button');
  head.click();  // first click on an error metric sorts worst first
  out.sortedByMse = Array.prototype.map.call(section.querySelectorAll("tr.layer-row td.tensor"), function (td) {
    return td.textContent;
  });
  out.ariaSort = section.querySelector('th[data-key="mse"]').getAttribute("aria-sort");
  head.click();
  out.reversedFirst = section.querySelector("tr.layer-row td.tensor").textContent;
  var select = section.querySelector("select");
  select.value = "mpeir";
  select.dispatchEvent(new Event("change"));
  out.mpeirBars = section.querySelectorAll("rect.bar").length;
  out.mpeirMissing = section.querySelectorAll("rect.missing").length;
  var filter = section.querySelector('input[type="search"]');
  filter.value = "CONV";
  filter.dispatchEvent(new Event("input"));
  out.filtered = section.querySelectorAll("tr.layer-row").length;
  section.querySelector('rect.bar[data-order="2"]').dispatchEvent(new MouseEvent("click"));
  out.highlighted = section.querySelector("tr.hl").getAttribute("data-order");
  document.body.setAttribute("data-interaction", JSON.stringify(out));
})();
</script>
"""


def test_browser_interaction(chromium, tmp_path, small_result):
    text = render_html([small_result]).replace("</body>", INTERACT + "</body>")
    path = tmp_path / "interactive.html"
    path.write_text(text, encoding="utf-8")
    dom = load(chromium, tmp_path, path)
    found = re.search(r"data-interaction=\"([^\"]*)\"", dom)
    assert found, dom[-3000:]
    result = json.loads(found[1].replace("&quot;", '"').replace("&amp;", "&"))
    assert result == {
        "sortedByMse": ["conv2_out", "logits", "conv1_out", "relu1_out"],
        "ariaSort": "descending",
        "reversedFirst": "relu1_out",
        "mpeirBars": 3,
        "mpeirMissing": 1,
        "filtered": 2,
        "highlighted": "2",
    }


SENSITIVITY_VIEW = {
    "title": "single sensitivity (node) of net.int8.onnx on d.npz (4 records), ranked by cosine",
    "metric": "cosine",
    "rows": [
        {"rank": 1, "node": "conv2", "op_type": "Conv", "value": 0.91},
        {"rank": 2, "node": HOSTILE, "op_type": "Relu", "value": None},
    ],
    "more": 3,
    "baseline": 0.9,
    "suggestion": "target cosine >= 0.99: nodes_to_exclude=['conv2']",
    "chart": {
        "title": "cumulative cosine",
        "x_label": "node (topological order)",
        "y_label": "cosine",
        "x": ["conv1", "conv2", "fc"],
        "series": [
            {"name": "fully quantized", "y": [0.99, 0.95, float("nan")]},
            {"name": "weights only", "y": [1.0, 0.999, 0.998]},
        ],
    },
}


def test_sensitivity_section_is_embedded_per_pair(small_result):
    note = {"note": "sensitivity of net: needs a QDQ model"}
    pairs = embedded(render_html([small_result, small_result], sensitivity=[SENSITIVITY_VIEW, note]))["pairs"]
    assert pairs[0]["sensitivity"]["rows"][1]["node"] == HOSTILE
    assert pairs[0]["sensitivity"]["chart"]["series"][0]["y"] == [0.99, 0.95, None]  # NaN -> null
    assert pairs[1]["sensitivity"] == note
    assert embedded(render_html([small_result]))["pairs"][0]["sensitivity"] is None
    named = embedded(render_html([small_result, small_result], names=["int8-on-tflite", None]))["pairs"]
    assert [p["title"] for p in named] == ["int8-on-tflite: net.int8.onnx vs net.onnx", "net.int8.onnx vs net.onnx"]


def test_browser_draws_the_sensitivity_section(chromium, tmp_path, small_result):
    note = {"note": "sensitivity of net: needs a QDQ model"}
    path = write_html(tmp_path / "report.html", [small_result, small_result], sensitivity=[SENSITIVITY_VIEW, note])
    dom = load(chromium, tmp_path, path)
    first = dom[dom.index('id="pair-0"') : dom.index('id="pair-1"')]
    assert first.count('class="sens-row"') == 2 and "3 more node(s)" in first
    assert first.count('class="curve"') == 2 and first.count('class="point"') == 5  # the NaN point is left out
    assert "nodes_to_exclude=['conv2']" in first and "fully quantized model: cosine 0.9000" in first
    assert 'a"b&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;' in first and "<img" not in dom
    second = dom[dom.index('id="pair-1"') :]
    assert "needs a QDQ model" in second and 'class="sens-row"' not in second
