"""The inline CSS and JavaScript of the HTML report (no external URLs: the file must work offline).

The script reads the JSON embedded in ``<script type="application/json" id="qaccuracy-data">`` and
builds the page with DOM calls (``textContent``, never ``innerHTML``), so tensor names cannot inject
markup. After rendering it sets ``data-ready="1"`` on ``<body>``; on an error it shows the message in
``#qa-error`` and sets ``data-error`` instead (the browser test checks both).

This module is over 400 lines because it is the whole front end as text; it holds no Python logic.
"""

from __future__ import annotations

CSS = """
:root { --fg: #1f2328; --muted: #656d76; --line: #d0d7de; --soft: #eaeef2; --panel: #f6f8fa; --wine: #4a0d1c; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--fg); background: #f3f4f6;
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; }
header.top { background: linear-gradient(90deg, #4a0d1c, #800026); color: #fff; padding: 18px 0; }
header.top .inner, main { max-width: 1320px; margin: 0 auto; padding: 0 24px; }
header.top h1 { margin: 0; font-size: 22px; font-weight: 600; }
header.top p { margin: 4px 0 0; opacity: .85; font-size: 13px; }
main { padding-top: 20px; padding-bottom: 40px; }
nav.pairs { margin: 0 0 16px; }
nav.pairs a { display: inline-block; margin: 0 8px 6px 0; padding: 3px 10px; border-radius: 999px;
  background: #fff; border: 1px solid var(--line); color: var(--fg); text-decoration: none; font-size: 13px; }
section.pair, section.overview { background: #fff; border: 1px solid var(--line); border-radius: 10px;
  padding: 18px 24px 24px; margin-bottom: 28px; box-shadow: 0 1px 3px rgba(0, 0, 0, .05); }
section h2 { margin: 0 0 4px; font-size: 19px; word-break: break-all; }
section h3 { margin: 22px 0 8px; font-size: 15px; }
p.meta { margin: 0 0 14px; color: var(--muted); font-size: 13px; word-break: break-all; }
p.meta b { color: var(--fg); font-weight: 600; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(190px, 1fr)); gap: 12px; }
.card { border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px; background: var(--panel); min-width: 0; }
.card .k { font-size: 11px; color: var(--muted); text-transform: uppercase; letter-spacing: .05em; }
.card .v { font-size: 20px; font-weight: 600; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.card .s { font-size: 12px; color: var(--muted); white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
table { border-collapse: separate; border-spacing: 0; width: 100%; font-variant-numeric: tabular-nums; }
th, td { padding: 4px 10px; border-bottom: 1px solid var(--soft); text-align: left; white-space: nowrap; }
th { font-size: 12px; color: var(--muted); font-weight: 600; }
td.num, th.num { text-align: right; }
td.fail { color: #b3261e; font-weight: 600; }
td.num { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12.5px; }
td.dark { color: #fff; }
td.na { color: var(--muted); }
td.tensor { max-width: 460px; overflow: hidden; text-overflow: ellipsis;
  font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12.5px; }
.table-wrap { max-height: 70vh; overflow: auto; border: 1px solid var(--line); border-radius: 8px; }
.table-wrap.short { max-height: none; }
thead th { position: sticky; top: 0; background: var(--panel); z-index: 1; border-bottom: 1px solid var(--line); }
th button { all: unset; cursor: pointer; }
th button:focus-visible { outline: 2px solid #1f6feb; }
th[aria-sort="ascending"] button::after { content: " \\25B2"; }
th[aria-sort="descending"] button::after { content: " \\25BC"; }
th.sel { color: var(--fg); box-shadow: inset 0 -2px 0 #bd0026; }
tr.hl td { background-image: linear-gradient(rgba(31, 111, 235, .18), rgba(31, 111, 235, .18)); }
tbody tr:hover td.tensor, tbody tr:hover td.plain { background: #f0f4ff; }
.controls { display: flex; flex-wrap: wrap; gap: 16px; align-items: center; margin: 4px 0 10px; font-size: 13px; }
.controls select, .controls input[type=search] { font: inherit; padding: 3px 6px; border: 1px solid var(--line);
  border-radius: 6px; background: #fff; }
.controls .hint { color: var(--muted); }
.chart-wrap { border: 1px solid var(--line); border-radius: 8px; padding: 6px 8px; margin-bottom: 14px; }
svg.chart { width: 100%; height: auto; display: block; }
svg.chart text { font: 11px system-ui, sans-serif; fill: #57606a; }
svg.chart .axis { stroke: #8c959f; stroke-width: 1; }
svg.chart .grid { stroke: #eaeef2; stroke-width: 1; }
svg.chart rect.bar { cursor: pointer; }
svg.chart rect.bar:hover { stroke: #1f2328; stroke-width: 1; }
svg.chart rect.missing { fill: #afb8c1; }
.legend { display: flex; flex-wrap: wrap; gap: 0; margin: 4px 0 2px; }
svg.chart polyline.curve { fill: none; stroke-width: 2; }
svg.chart circle.point { stroke: none; }
.curve-legend { display: flex; flex-wrap: wrap; gap: 14px; font-size: 12px; margin: 4px 0 0; }
.curve-legend i { display: inline-block; width: 18px; height: 3px; margin-right: 6px; vertical-align: middle; }
code.suggestion { white-space: pre-wrap; word-break: break-all; }
.legend span { font: 11px ui-monospace, Menlo, Consolas, monospace; padding: 2px 6px; }
.legend span.dark { color: #fff; }
dl.defs { display: grid; grid-template-columns: max-content 1fr; gap: 6px 18px; margin: 0; }
dl.defs dt { font-weight: 600; }
dl.defs dd { margin: 0; }
dl.defs .dir { color: var(--muted); font-size: 12px; }
details { margin: 4px 0; }
details ul { margin: 6px 0; columns: 2; font: 12.5px ui-monospace, Menlo, Consolas, monospace; word-break: break-all; }
#qa-error { display: none; background: #ffebe9; border: 1px solid #ff8182; color: #82071e; padding: 10px 14px;
  border-radius: 8px; margin-bottom: 16px; white-space: pre-wrap; }
footer { color: var(--muted); font-size: 12px; text-align: center; padding: 10px 0 30px; }
"""

JS = r"""
(function () {
  "use strict";
  var SVGNS = "http://www.w3.org/2000/svg";
  var DARK = { "#e31a1c": 1, "#bd0026": 1, "#800026": 1 };

  function el(tag, props, children) {
    var node = document.createElement(tag);
    Object.keys(props || {}).forEach(function (key) {
      if (key === "text") node.textContent = props[key];
      else if (key === "cls") node.className = props[key];
      else node.setAttribute(key, props[key]);
    });
    (children || []).forEach(function (child) {
      if (child !== null && child !== undefined) {
        node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
      }
    });
    return node;
  }

  function svg(tag, attrs, text) {
    var node = document.createElementNS(SVGNS, tag);
    Object.keys(attrs).forEach(function (key) { node.setAttribute(key, attrs[key]); });
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function finite(v) { return typeof v === "number" && isFinite(v); }

  // Mirrors pytest_qaccuracy.report.tables.format_value.
  function fmt(name, v) {
    if (v === null || v === undefined) return "n/a";
    if (!finite(v)) return String(v);
    if (name === "sqnr") return v.toFixed(2) + " dB";
    if (name === "cosine") {
      var gap = 1 - Math.abs(v);
      var digits = gap <= 0 ? 4 : Math.min(12, Math.max(4, 1 - Math.floor(Math.log10(gap))));
      return v.toFixed(digits);
    }
    if (v === 0) return "0";
    return String(Number(v.toPrecision(4)));
  }

  // Mirrors pytest_qaccuracy.report._palette.slot_color: slots are [begin, end, colour], ascending.
  function slotColor(slots, v) {
    if (v <= slots[0][1]) return slots[0][2];
    for (var i = 0; i < slots.length; i++) {
      if (slots[i][0] <= v && v <= slots[i][1]) return slots[i][2];
    }
    return slots[slots.length - 1][2];
  }

  function valueCell(metric, entry) {
    var v = entry.metrics[metric.name];
    var td = el("td", { cls: "num", text: fmt(metric.name, v) });
    if (finite(v)) {
      var color = slotColor(metric.slots, v);
      td.style.backgroundColor = color;
      if (DARK[color]) td.className += " dark";
      td.setAttribute("data-color", color);
    } else {
      td.className += " na";
      var why = entry.undefined && entry.undefined[metric.name];
      if (why) td.title = why;
    }
    return td;
  }

  function card(key, value, sub) {
    return el("div", { cls: "card" }, [
      el("div", { cls: "k", text: key }),
      el("div", { cls: "v", text: value, title: value }),
      sub ? el("div", { cls: "s", text: sub, title: sub }) : null,
    ]);
  }

  function worstLayer(pair, metric) {
    var best = null;
    pair.layers.forEach(function (layer) {
      var v = layer.metrics[metric.name];
      if (!finite(v)) return;
      var worse = best === null || (metric.higher_is_better ? v < best.v : v > best.v);
      if (worse) best = { layer: layer, v: v };
    });
    return best;
  }

  function outputsTable(pair) {
    var head = el("tr", {}, [el("th", { text: "output" })].concat(pair.metrics.map(function (m) {
      return el("th", { cls: "num", text: m.label, title: m.definition });
    })));
    var rows = pair.outputs.map(function (out) {
      return el("tr", {}, [el("td", { cls: "tensor", text: out.name, title: out.name })].concat(
        pair.metrics.map(function (m) { return valueCell(m, out); })));
    });
    if (!rows.length) rows = [el("tr", {}, [el("td", { text: "no outputs compared" })])];
    return el("div", { cls: "table-wrap short" }, [
      el("table", { cls: "outputs" }, [el("thead", {}, [head]), el("tbody", {}, rows)]),
    ]);
  }

  function targetsTable(view) {
    var head = el("tr", {}, view.headers.map(function (h, i) {
      return el("th", { cls: i > 1 ? "num" : "", text: h });
    }));
    var rows = view.rows.map(function (row) {
      return el("tr", {}, row.map(function (cell, i) {
        var cls = i > 1 ? "num" : "";
        if (cell === "FAIL") cls += " fail";
        return el("td", { cls: cls, text: cell });
      }));
    });
    return el("div", { cls: "table-wrap short" }, [
      el("table", { cls: "targets" }, [el("thead", {}, [head]), el("tbody", {}, rows)]),
    ]);
  }

  function ticks(lo, hi, log) {
    var out = [];
    if (log) {
      for (var p = Math.floor(lo); p <= Math.ceil(hi); p++) if (p >= lo - 1e-9 && p <= hi + 1e-9) out.push(p);
      if (out.length < 2) out = [lo, hi];
      return out;
    }
    var span = hi - lo, step = Math.pow(10, Math.floor(Math.log10(span / 5)));
    [1, 2, 2.5, 5, 10].some(function (m) { if (span / (step * m) <= 6) { step *= m; return true; } return false; });
    for (var t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) {
      out.push(Math.abs(t) < step * 1e-9 ? 0 : t);
    }
    return out;
  }

  function drawChart(state) {
    var pair = state.pair, metric = state.metric, chart = state.chart;
    while (chart.firstChild) chart.removeChild(chart.firstChild);
    var W = 1200, H = 300, L = 78, R = 14, T = 14, B = 42, pw = W - L - R, ph = H - T - B;
    chart.setAttribute("viewBox", "0 0 " + W + " " + H);
    var layers = pair.layers, n = layers.length;
    var values = layers.map(function (x) { return x.metrics[metric.name]; });
    var present = values.filter(finite);
    var log = state.log.checked && present.length > 0 && present.every(function (v) { return v > 0; });
    state.log.disabled = !(present.length > 0 && present.every(function (v) { return v > 0; }));
    var title = metric.label + " per layer, in topological order" + (log ? " (log scale)" : "");
    chart.appendChild(svg("title", {}, title));
    if (!present.length) {
      chart.appendChild(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "no values of " + metric.label));
      return;
    }
    var tf = log ? Math.log10 : function (v) { return v; };
    var lo = Math.min.apply(null, present.map(tf)), hi = Math.max.apply(null, present.map(tf));
    if (!log && !metric.higher_is_better) lo = Math.min(0, lo);
    if (lo === hi) { var pad = Math.abs(lo) / 2 || 1; lo -= pad; hi += pad; }
    else if (log || metric.higher_is_better) { var m = (hi - lo) * 0.05; lo -= m; hi += m; }
    function y(v) { return T + ph - (tf(v) - lo) / (hi - lo) * ph; }
    ticks(lo, hi, log).forEach(function (t) {
      var py = T + ph - (t - lo) / (hi - lo) * ph;
      chart.appendChild(svg("line", { "class": "grid", x1: L, x2: W - R, y1: py, y2: py }));
      var label = log ? "1e" + t : fmt(metric.name, t);
      chart.appendChild(svg("text", { x: L - 6, y: py + 4, "text-anchor": "end" }, label));
    });
    var step = pw / n, gap = step > 4 ? Math.max(Math.min(2, step * 0.2), step - 56) : 0;
    layers.forEach(function (layer, i) {
      var v = values[i], x = L + i * step;
      if (!finite(v)) {
        var stub = { "class": "missing", x: x, y: T + ph - 3, width: Math.max(step - gap, 0.5), height: 3 };
        chart.appendChild(svg("rect", stub));
        return;
      }
      var top = Math.max(T, Math.min(T + ph, y(v)));
      var rect = svg("rect", {
        "class": "bar", x: x + gap / 2, y: top, width: Math.max(step - gap, 0.5), height: Math.max(T + ph - top, 1),
        fill: slotColor(metric.slots, v), "data-order": layer.order,
      });
      var tip = "#" + layer.order + "  " + layer.tensor + " (" + (layer.op_type || "?") + ")\n";
      rect.appendChild(svg("title", {}, tip + metric.label + ": " + fmt(metric.name, v)));
      rect.addEventListener("click", function () { highlight(state, layer.order); });
      chart.appendChild(rect);
    });
    chart.appendChild(svg("line", { "class": "axis", x1: L, x2: W - R, y1: T + ph, y2: T + ph }));
    chart.appendChild(svg("line", { "class": "axis", x1: L, x2: L, y1: T, y2: T + ph }));
    var every = Math.max(1, Math.ceil(n / 20));
    for (var i = 0; i < n; i += every) {
      var at = { x: L + (i + 0.5) * step, y: T + ph + 15, "text-anchor": "middle" };
      chart.appendChild(svg("text", at, String(layers[i].order)));
    }
    chart.appendChild(svg("text", { x: L + pw / 2, y: H - 6, "text-anchor": "middle" },
      "layers in topological order (" + n + "; bar colour = visq slot, click a bar to find its row)"));
  }

  function highlight(state, order) {
    var rows = state.tbody.querySelectorAll("tr.hl");
    for (var i = 0; i < rows.length; i++) rows[i].classList.remove("hl");
    var row = state.tbody.querySelector('tr[data-order="' + order + '"]');
    if (row) { row.classList.add("hl"); row.scrollIntoView({ block: "center" }); }
  }

  function keyOf(layer, key) {
    if (key === "order") return layer.order;
    if (key === "tensor") return layer.tensor;
    if (key === "op_type") return layer.op_type || "";
    return layer.metrics[key];
  }

  function compare(key, metric, dir) {
    return function (a, b) {
      var va = keyOf(a, key), vb = keyOf(b, key);
      if (metric) {
        var fa = finite(va), fb = finite(vb);
        if (!fa || !fb) return fa === fb ? a.order - b.order : (fa ? -1 : 1);  // missing values last
      }
      if (va < vb) return -dir;
      if (va > vb) return dir;
      return a.order - b.order;
    };
  }

  function renderRows(state) {
    var pair = state.pair, sort = state.sort, tbody = state.tbody;
    var metric = pair.metrics.filter(function (m) { return m.name === sort.key; })[0];
    var rows = pair.layers.slice().sort(compare(sort.key, metric, sort.dir));
    var needle = state.filter.value.trim().toLowerCase();
    while (tbody.firstChild) tbody.removeChild(tbody.firstChild);
    rows.forEach(function (layer) {
      var hay = (layer.tensor + " " + (layer.op_type || "") + " " + layer.quantized_tensor).toLowerCase();
      if (needle && hay.indexOf(needle) < 0) return;
      var tip = "quantized: " + layer.quantized_tensor + (layer.node ? "\nnode: " + layer.node : "") +
        "\nmatched by: " + layer.matched_by;
      tbody.appendChild(el("tr", { cls: "layer-row", "data-order": layer.order }, [
        el("td", { cls: "num plain", text: String(layer.order) }),
        el("td", { cls: "tensor", text: layer.tensor, title: layer.tensor + "\n" + tip }),
        el("td", { cls: "plain", text: layer.op_type || "?" }),
      ].concat(pair.metrics.map(function (m) { return valueCell(m, layer); }))));
    });
    state.heads.forEach(function (th) {
      var key = th.getAttribute("data-key");
      if (key === sort.key) th.setAttribute("aria-sort", sort.dir > 0 ? "ascending" : "descending");
      else th.removeAttribute("aria-sort");
      th.classList.toggle("sel", key === state.metric.name);
    });
    state.count.textContent = tbody.childNodes.length + " of " + pair.layers.length + " layers";
  }

  function layersTable(state) {
    var pair = state.pair;
    var columns = [["order", "#", true], ["tensor", "tensor", false], ["op_type", "op", false]].concat(
      pair.metrics.map(function (m) { return [m.name, m.label, true, m]; }));
    state.heads = columns.map(function (col) {
      var button = el("button", { type: "button", text: col[1] });
      var props = { cls: col[2] ? "num" : "", "data-key": col[0], title: col[3] ? col[3].definition : "" };
      var th = el("th", props, [button]);
      button.addEventListener("click", function () {
        if (state.sort.key === col[0]) state.sort.dir = -state.sort.dir;
        else state.sort = { key: col[0], dir: col[3] && !col[3].higher_is_better ? -1 : 1 };  // worst first
        renderRows(state);
      });
      return th;
    });
    state.tbody = el("tbody");
    return el("div", { cls: "table-wrap" }, [
      el("table", { cls: "layers" }, [el("thead", {}, [el("tr", {}, state.heads)]), state.tbody]),
    ]);
  }

  function legend(metric) {
    return el("div", { cls: "legend" }, metric.slots.map(function (s) {
      return el("span", { cls: DARK[s[2]] ? "dark" : "", style: "background:" + s[2],
        text: fmt(metric.name, s[0]) + " \u2013 " + fmt(metric.name, s[1]) });
    }));
  }

  function unmatched(pair) {
    var lists = [["fp32", "fp32 tensors without a quantized counterpart"],
      ["quantized", "quantized tensors without an fp32 counterpart"]];
    return el("div", {}, lists.map(function (item) {
      var names = (pair.unmatched && pair.unmatched[item[0]]) || [];
      return el("details", { cls: "unmatched-" + item[0] }, [
        el("summary", { text: names.length + " " + item[1] }),
        el("ul", {}, names.map(function (name) { return el("li", { text: name }); })),
      ]);
    }));
  }

  function definitions(pair) {
    var items = [];
    pair.metrics.forEach(function (m) {
      items.push(el("dt", { text: m.label }));
      items.push(el("dd", {}, [
        el("div", { text: m.definition || "(no definition recorded)" }),
        el("div", { cls: "dir", text: (m.higher_is_better ? "higher is better" : "lower is better") +
          "; colour scale " + m.scale }),
        legend(m),
      ]));
    });
    return el("dl", { cls: "defs" }, items);
  }

  var CURVE_COLORS = ["#bd0026", "#fd8d3c", "#2c7fb8", "#31a354", "#756bb1"];

  function sensitivitySection(view) {
    var box = el("div", { cls: "sensitivity" });
    if (view.note) { box.appendChild(el("p", { cls: "meta", text: view.note })); return box; }
    box.appendChild(el("p", { cls: "meta", text: view.title }));
    var head = el("tr", {}, [el("th", { cls: "num", text: "rank" }), el("th", { text: "node" }),
      el("th", { text: "op" }), el("th", { cls: "num", text: view.metric.toUpperCase() })]);
    var rows = view.rows.map(function (r) {
      return el("tr", { cls: "sens-row" }, [el("td", { cls: "num plain", text: String(r.rank) }),
        el("td", { cls: "tensor", text: r.node }), el("td", { cls: "plain", text: r.op_type || "?" }),
        el("td", { cls: "num plain", text: fmt(view.metric, r.value) })]);
    });
    box.appendChild(el("div", { cls: "table-wrap short" }, [
      el("table", { cls: "sensitivity-table" }, [el("thead", {}, [head]), el("tbody", {}, rows)])]));
    if (view.more) {
      box.appendChild(el("p", { cls: "hint", text: view.more + " more node(s) in the sensitivity artifact" }));
    }
    if (finite(view.baseline)) {
      box.appendChild(el("p", { cls: "meta", text: "fully quantized model: " + view.metric + " " +
        fmt(view.metric, view.baseline) }));
    }
    if (view.suggestion) box.appendChild(el("p", {}, [el("code", { cls: "suggestion", text: view.suggestion })]));
    if (view.chart && view.chart.x.length) box.appendChild(curveChart(view.chart));
    return box;
  }

  function curveChart(chart) {
    var W = 1200, H = 280, L = 78, R = 14, T = 14, B = 42, pw = W - L - R, ph = H - T - B;
    var root = svg("svg", { "class": "chart curves", viewBox: "0 0 " + W + " " + H, role: "img" });
    root.appendChild(svg("title", {}, chart.title + " per quantized node"));
    var values = [];
    chart.series.forEach(function (s) { s.y.forEach(function (v) { if (finite(v)) values.push(v); }); });
    var wrap = el("div", { cls: "chart-wrap" }, [root]);
    if (!values.length) {
      root.appendChild(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "no values of " + chart.y_label));
      return wrap;
    }
    var lo = Math.min.apply(null, values), hi = Math.max.apply(null, values);
    if (lo === hi) { var pad = Math.abs(lo) / 2 || 1; lo -= pad; hi += pad; }
    else { var m = (hi - lo) * 0.05; lo -= m; hi += m; }
    var n = chart.x.length;
    function x(i) { return L + (n === 1 ? pw / 2 : i * pw / (n - 1)); }
    function y(v) { return T + ph - (v - lo) / (hi - lo) * ph; }
    ticks(lo, hi, false).forEach(function (t) {
      root.appendChild(svg("line", { "class": "grid", x1: L, x2: W - R, y1: y(t), y2: y(t) }));
      root.appendChild(svg("text", { x: L - 6, y: y(t) + 4, "text-anchor": "end" }, fmt(chart.y_label, t)));
    });
    chart.series.forEach(function (s, k) {
      var color = CURVE_COLORS[k % CURVE_COLORS.length], points = [];
      s.y.forEach(function (v, i) { if (finite(v)) points.push(x(i).toFixed(1) + "," + y(v).toFixed(1)); });
      var line = { "class": "curve", points: points.join(" "), stroke: color, "data-series": s.name };
      root.appendChild(svg("polyline", line));
      s.y.forEach(function (v, i) {
        if (!finite(v)) return;
        var dot = svg("circle", { "class": "point", cx: x(i), cy: y(v), r: 3, fill: color });
        dot.appendChild(svg("title", {}, s.name + "\n#" + i + "  " + chart.x[i] + "\n" + chart.y_label + ": " +
          fmt(chart.y_label, v)));
        root.appendChild(dot);
      });
    });
    root.appendChild(svg("line", { "class": "axis", x1: L, x2: W - R, y1: T + ph, y2: T + ph }));
    root.appendChild(svg("line", { "class": "axis", x1: L, x2: L, y1: T, y2: T + ph }));
    var every = Math.max(1, Math.ceil(n / 12));
    for (var i = 0; i < n; i += every) {
      root.appendChild(svg("text", { x: x(i), y: T + ph + 15, "text-anchor": "middle" }, chart.x[i]));
    }
    root.appendChild(svg("text", { x: L + pw / 2, y: H - 6, "text-anchor": "middle" },
      chart.title + " after each quantized node, in " + chart.x_label));
    wrap.appendChild(el("div", { cls: "curve-legend" }, chart.series.map(function (s, k) {
      return el("span", {}, [el("i", { style: "background:" + CURVE_COLORS[k % CURVE_COLORS.length] }), s.name]);
    })));
    return wrap;
  }

  function renderPair(pair, index) {
    var state = { pair: pair, metric: pair.metrics[0], sort: { key: "order", dir: 1 } };
    var section = el("section", { cls: "pair", id: "pair-" + index, "data-pair": String(index) });
    section.appendChild(el("h2", { text: pair.title }));
    section.appendChild(el("p", { cls: "meta" }, [
      "fp32 ", el("b", { text: pair.fp32_model }), " \u00b7 quantized ", el("b", { text: pair.quantized_model }),
      " \u00b7 data ", el("b", { text: pair.data }), " \u00b7 " + pair.records + " records \u00b7 backend " +
        pair.backend + (pair.scheme ? " (" + pair.scheme + ")" : "") + " \u00b7 capture " + pair.capture,
    ]));
    var cards = [
      card("Layers compared", String(pair.layers.length)),
      card("Outputs", String(pair.outputs.length)),
      card("Unmatched", String(pair.unmatched.fp32.length + pair.unmatched.quantized.length),
        pair.unmatched.fp32.length + " fp32, " + pair.unmatched.quantized.length + " quantized"),
    ];
    if (state.metric) {
      var worst = worstLayer(pair, state.metric);
      if (worst) cards.push(card("Worst layer by " + state.metric.label, fmt(state.metric.name, worst.v),
        worst.layer.tensor + " (" + (worst.layer.op_type || "?") + ")"));
    }
    section.appendChild(el("div", { cls: "cards" }, cards));
    section.appendChild(el("h3", { text: "Outputs" }));
    section.appendChild(outputsTable(pair));
    if (pair.targets) {
      section.appendChild(el("h3", { text: "Deployment targets" }));
      section.appendChild(targetsTable(pair.targets));
    }
    section.appendChild(el("h3", { text: "Layers" }));
    if (!state.metric || !pair.layers.length) {
      section.appendChild(el("p", { cls: "meta", text: "No intermediate layers were compared." }));
    } else {
      var select = el("select", { "aria-label": "metric" }, pair.metrics.map(function (m) {
        return el("option", { value: m.name, text: m.label });
      }));
      state.log = el("input", { type: "checkbox" });
      state.filter = el("input", { type: "search", placeholder: "filter tensor / op", "aria-label": "filter" });
      state.count = el("span", { cls: "hint" });
      section.appendChild(el("div", { cls: "controls" }, [
        el("label", {}, ["Chart metric ", select]), el("label", {}, [state.log, " log scale"]),
        state.filter, state.count,
      ]));
      state.chart = svg("svg", { "class": "chart", role: "img" });
      section.appendChild(el("div", { cls: "chart-wrap" }, [state.chart]));
      section.appendChild(layersTable(state));
      select.addEventListener("change", function () {
        state.metric = pair.metrics.filter(function (m) { return m.name === select.value; })[0];
        drawChart(state);
        renderRows(state);
      });
      state.log.addEventListener("change", function () { drawChart(state); });
      state.filter.addEventListener("input", function () { renderRows(state); });
      drawChart(state);
      renderRows(state);
    }
    if (pair.sensitivity) {
      section.appendChild(el("h3", { text: "Sensitivity" }));
      section.appendChild(sensitivitySection(pair.sensitivity));
    }
    section.appendChild(el("h3", { text: "Unmatched tensors" }));
    section.appendChild(unmatched(pair));
    section.appendChild(el("h3", { text: "Metrics" }));
    section.appendChild(definitions(pair));
    return section;
  }

  function overview(pairs) {
    var names = [];
    pairs.forEach(function (p) {
      p.metrics.forEach(function (m) { if (names.indexOf(m.name) < 0) names.push(m.name); });
    });
    var rows = [];
    pairs.forEach(function (p, i) {
      p.outputs.forEach(function (out) {
        var link = el("a", { href: "#pair-" + i, text: p.title });
        rows.push(el("tr", {}, [el("td", {}, [link]), el("td", { cls: "tensor", text: out.name })].concat(
          names.map(function (name) {
            var m = p.metrics.filter(function (x) { return x.name === name; })[0];
            return m ? valueCell(m, out) : el("td", { cls: "num na", text: "n/a" });
          }))));
      });
    });
    var head = el("tr", {}, [el("th", { text: "pair" }), el("th", { text: "output" })].concat(
      names.map(function (n) { return el("th", { cls: "num", text: n.toUpperCase() }); })));
    return el("section", { cls: "overview" }, [el("h2", { text: "Overview" }), el("div", { cls: "table-wrap short" }, [
      el("table", { cls: "overview-table" }, [el("thead", {}, [head]), el("tbody", {}, rows)])])]);
  }

  function main() {
    var data = JSON.parse(document.getElementById("qaccuracy-data").textContent);
    var root = document.getElementById("qa-root");
    if (data.pairs.length > 1) {
      root.appendChild(el("nav", { cls: "pairs" }, data.pairs.map(function (p, i) {
        return el("a", { href: "#pair-" + i, text: p.title });
      })));
      root.appendChild(overview(data.pairs));
    }
    if (!data.pairs.length) root.appendChild(el("p", { text: "No comparisons in this report." }));
    data.pairs.forEach(function (pair, i) { root.appendChild(renderPair(pair, i)); });
    document.body.setAttribute("data-ready", "1");
  }

  try {
    main();
  } catch (err) {
    var box = document.getElementById("qa-error");
    box.style.display = "block";
    box.textContent = "The report could not be rendered: " + (err && err.stack ? err.stack : err);
    document.body.setAttribute("data-error", String(err));
  }
})();
"""
