// The HTML report's script: builds the page from the JSON in #qaccuracy-data with DOM calls
// (textContent, never innerHTML), so names from model files cannot inject markup. Python formats and
// colours every value (report/html_data.py, report/verdicts.py); this script only places text, sorts
// by the raw numbers, and draws bars and curves on the axes Python labelled. After rendering it sets
// data-ready="1" on <body>; on an error it shows the message in #qa-error and sets data-error.
(() => {
  "use strict";
  const SVGNS = "http://www.w3.org/2000/svg";
  const DARK = new Set(["#e31a1c", "#bd0026", "#800026"]);
  const CURVE_COLORS = ["#bd0026", "#fd8d3c", "#2c7fb8", "#31a354", "#756bb1"];
  const STATES = new Map(); // pair id -> the pair's state (rows, chart, graph view)
  const VERDICT_NAMES = { passed: "passed", failed: "failed", xfailed: "expected failures", unchecked: "no checks" };

  // Charts are drawn 1:1 at the window's width (up to 1200 units), so their text stays readable on a phone.
  const chartWidth = () => Math.max(320, Math.min(1200, (document.documentElement.clientWidth || 1200) - 80));

  function el(tag, props, children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (key === "text") node.textContent = value;
      else if (key === "cls") node.className = value;
      else node.setAttribute(key, value);
    }
    for (const child of children || []) {
      if (child !== null && child !== undefined) {
        node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
      }
    }
    return node;
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVGNS, tag);
    for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  const finite = (v) => typeof v === "number" && Number.isFinite(v);
  const byName = (pair, name) => pair.metrics.find((m) => m.name === name);

  function table(cls, headers, rows, wrapCls) {
    const head = el(
      "tr",
      {},
      headers.map((h) => el("th", { cls: h[1] ? "num" : "", text: h[0], title: h[2] || "" })),
    );
    return el("div", { cls: wrapCls || "table-wrap short" }, [
      el("table", { cls: cls }, [el("thead", {}, [head]), el("tbody", {}, rows)]),
    ]);
  }

  function valueCell(metric, entry) {
    const text = entry.text?.[metric.name];
    const td = el("td", { cls: "num", text: text === undefined ? "n/a" : text });
    const color = entry.color?.[metric.name];
    if (color) {
      td.style.backgroundColor = color;
      if (DARK.has(color)) td.className += " dark";
      td.setAttribute("data-color", color);
    } else {
      td.className += " na";
      const why = entry.undefined?.[metric.name];
      if (why) td.title = why;
    }
    return td;
  }

  function badge(verdict) {
    return el("span", { cls: `badge ${verdict.status}`, "data-verdict": verdict.status, text: verdict.label });
  }

  function card(key, value, sub) {
    return el("div", { cls: "card" }, [
      el("div", { cls: "k", text: key }),
      el("div", { cls: "v", text: value, title: value }),
      sub ? el("div", { cls: "s", text: sub, title: sub }) : null,
    ]);
  }

  function checkRow(row) {
    const failed = row.status !== "pass";
    return el("tr", { cls: failed ? "check-row failed" : "check-row", title: row.test }, [
      el("td", { cls: `status-${row.status}`, text: row.status }),
      el("td", { cls: "tensor", text: row.target, title: row.target }),
      el("td", { text: row.check }),
      el("td", { cls: "num", text: row.value }),
      el("td", { cls: "num", text: row.tolerance }),
      el("td", { cls: "source", text: row.source }),
      el("td", { cls: "message", text: row.message }),
    ]);
  }

  const CHECK_HEADERS = [
    ["status"],
    ["target"],
    ["check"],
    ["value", true],
    ["tolerance", true],
    ["source"],
    ["message"],
  ];

  function checksTable(rows, cls) {
    const wrap = rows.length > 12 ? "table-wrap" : "table-wrap short";
    return table(cls, CHECK_HEADERS, rows.map(checkRow), wrap);
  }

  function topkTable(rows) {
    const headers = [
      ["output"],
      ["k"],
      ["agreement", true, "quantized top-k holds the fp32 top-1 class"],
      ["fp32 accuracy", true],
      ["quantized accuracy", true],
      ["accuracy drop", true],
      ["records"],
    ];
    const keys = ["output", "k", "agreement", "fp32_accuracy", "quantized_accuracy", "accuracy_drop", "records"];
    const body = rows.map((r) =>
      el(
        "tr",
        { cls: "topk-row" },
        keys.map((k, i) => el("td", { cls: i > 1 && i < 6 ? "num" : "", text: r[k] })),
      ),
    );
    return table("topk", headers, body);
  }

  function taskTable(rows) {
    const headers = [
      ["value"],
      ["metric"],
      ["scored against"],
      ["fp32", true],
      ["quantized", true],
      ["drop", true, "how much worse the quantized side is, in the metric's direction"],
      ["better"],
    ];
    const keys = ["value", "metric", "against", "fp32", "quantized", "drop", "better"];
    const body = rows.map((r) =>
      el(
        "tr",
        { cls: "task-row" },
        keys.map((k, i) => el("td", { cls: i > 2 && i < 6 ? "num" : "", text: r[k] })),
      ),
    );
    return table("task", headers, body);
  }

  function outputsTable(pair) {
    const headers = [["output"]].concat(pair.metrics.map((m) => [m.label, true, m.definition]));
    const rows = pair.outputs.map((out, k) =>
      el(
        "tr",
        { id: `${pair.id}-output-${k}`, cls: "output-row", "data-tensor": out.name },
        [el("td", { cls: "tensor", text: out.name, title: out.name })].concat(
          pair.metrics.map((m) => valueCell(m, out)),
        ),
      ),
    );
    if (!rows.length) rows.push(el("tr", {}, [el("td", { text: "no outputs compared" })]));
    return table("outputs", headers, rows);
  }

  // the last row is each target's verdict: coloured by view.passed, never by its text
  function targetsTable(view) {
    const last = view.rows.length - 1;
    const failed = (r, i) => r === last && i > 1 && !view.passed[i - 2];
    const rows = view.rows.map((row, r) =>
      el(
        "tr",
        {},
        row.map((cell, i) => el("td", { cls: (i > 1 ? "num" : "") + (failed(r, i) ? " fail" : ""), text: cell })),
      ),
    );
    return table(
      "targets",
      view.headers.map((h, i) => [h, i > 1]),
      rows,
    );
  }

  function drawChart(state) {
    const { pair, metric, chart } = state;
    while (chart.firstChild) chart.removeChild(chart.firstChild);
    const W = chartWidth();
    const H = W < 700 ? 240 : 300;
    const L = W < 700 ? 58 : 78;
    const R = 14;
    const T = 14;
    const B = 42;
    const pw = W - L - R;
    const ph = H - T - B;
    chart.setAttribute("viewBox", `0 0 ${W} ${H}`);
    state.chartDrawnAt = W;
    const layers = pair.layers;
    const n = layers.length;
    state.log.disabled = !metric.log_axis;
    const log = state.log.checked && Boolean(metric.log_axis);
    const scale = log ? metric.log_axis : metric.axis;
    chart.appendChild(svg("title", {}, `${metric.label} per layer, in topological order${log ? " (log scale)" : ""}`));
    if (!scale) {
      chart.appendChild(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, `no values of ${metric.label}`));
      return;
    }
    const tf = log ? Math.log10 : (v) => v;
    const y = (pos) => T + ph - ((pos - scale.lo) / (scale.hi - scale.lo)) * ph;
    for (const [pos, label] of scale.ticks) {
      chart.appendChild(svg("line", { class: "grid", x1: L, x2: W - R, y1: y(pos), y2: y(pos) }));
      chart.appendChild(svg("text", { x: L - 6, y: y(pos) + 4, "text-anchor": "end" }, label));
    }
    const step = pw / n;
    const gap = step > 4 ? Math.max(Math.min(2, step * 0.2), step - 56) : 0;
    layers.forEach((layer, i) => {
      const v = layer.metrics[metric.name];
      const x = L + i * step;
      if (!finite(v)) {
        const stub = { class: "missing", x: x, y: T + ph - 3, width: Math.max(step - gap, 0.5), height: 3 };
        chart.appendChild(svg("rect", stub));
        return;
      }
      const top = Math.max(T, Math.min(T + ph, y(tf(v))));
      const rect = svg("rect", {
        class: "bar",
        x: x + gap / 2,
        y: top,
        width: Math.max(step - gap, 0.5),
        height: Math.max(T + ph - top, 1),
        fill: layer.color[metric.name],
        "data-order": layer.order,
      });
      const tip = `#${layer.order}  ${layer.tensor} (${layer.op_type || "?"})\n`;
      rect.appendChild(svg("title", {}, `${tip}${metric.label}: ${layer.text[metric.name]}`));
      rect.addEventListener("click", () => highlight(state, layer.order));
      chart.appendChild(rect);
    });
    chart.appendChild(svg("line", { class: "axis", x1: L, x2: W - R, y1: T + ph, y2: T + ph }));
    chart.appendChild(svg("line", { class: "axis", x1: L, x2: L, y1: T, y2: T + ph }));
    const every = Math.max(1, Math.ceil(n / Math.max(4, Math.floor(pw / 50))));
    for (let i = 0; i < n; i += every) {
      const at = { x: L + (i + 0.5) * step, y: T + ph + 15, "text-anchor": "middle" };
      chart.appendChild(svg("text", at, String(layers[i].order)));
    }
    const caption =
      W < 700
        ? `${n} layers in topological order (click a bar: its row)`
        : `layers in topological order (${n}; bar colour = visq slot, click a bar to find its row)`;
    chart.appendChild(svg("text", { x: L + pw / 2, y: H - 6, "text-anchor": "middle" }, caption));
  }

  function highlight(state, order) {
    for (const row of state.section.querySelectorAll("tr.hl")) row.classList.remove("hl");
    if (!state.tbody) return null;
    let row = state.tbody.querySelector(`tr[data-order="${order}"]`);
    if (!row && state.filter.value) {
      state.filter.value = "";
      renderRows(state);
      row = state.tbody.querySelector(`tr[data-order="${order}"]`);
    }
    if (row) {
      row.classList.add("hl");
      row.scrollIntoView({ block: "center" }); // centred: never under the table's sticky header
    }
    return row;
  }

  // An in-page link to a layer or output row (#pair-0-layer-12): show it highlighted and centred.
  function goToAnchor(id) {
    const found = /^(pair-\d+)-layer-(-?\d+)$/.exec(id);
    const state = found ? STATES.get(found[1]) : null;
    if (state?.tbody) return highlight(state, Number(found[2]));
    const target = id ? document.getElementById(id) : null;
    if (!target) return null;
    if (target.tagName === "TR") {
      for (const row of document.querySelectorAll("tr.hl")) row.classList.remove("hl");
      target.classList.add("hl");
      target.scrollIntoView({ block: "center" });
    } else {
      target.scrollIntoView({ block: "start" });
    }
    return target;
  }

  function keyOf(layer, key) {
    if (key === "order") return layer.order;
    if (key === "tensor") return layer.tensor;
    if (key === "op_type") return layer.op_type || "";
    return layer.metrics[key];
  }

  function compare(key, metric, dir) {
    return (a, b) => {
      const va = keyOf(a, key);
      const vb = keyOf(b, key);
      if (metric) {
        const fa = finite(va);
        const fb = finite(vb);
        if (!fa || !fb) return fa === fb ? a.order - b.order : fa ? -1 : 1; // missing values last
      }
      if (va < vb) return -dir;
      if (va > vb) return dir;
      return a.order - b.order;
    };
  }

  function renderRows(state) {
    const { pair, sort, tbody } = state;
    const rows = pair.layers.slice().sort(compare(sort.key, byName(pair, sort.key), sort.dir));
    const needle = state.filter.value.trim().toLowerCase();
    while (tbody.firstChild) tbody.removeChild(tbody.firstChild);
    for (const layer of rows) {
      const hay = `${layer.tensor} ${layer.op_type || ""} ${layer.quantized_tensor}`.toLowerCase();
      if (needle && !hay.includes(needle)) continue;
      const tip = `quantized: ${layer.quantized_tensor}${layer.node ? `\nnode: ${layer.node}` : ""}`;
      const props = {
        cls: "layer-row",
        id: `${pair.id}-layer-${layer.order}`,
        "data-order": layer.order,
        "data-tensor": layer.tensor,
      };
      tbody.appendChild(
        el(
          "tr",
          props,
          [
            el("td", { cls: "num plain", text: String(layer.order) }),
            el("td", { cls: "tensor", text: layer.tensor, title: `${layer.tensor}\n${tip}` }),
            el("td", { cls: "plain", text: layer.op_type || "?" }),
          ].concat(pair.metrics.map((m) => valueCell(m, layer))),
        ),
      );
    }
    for (const th of state.heads) {
      const key = th.getAttribute("data-key");
      if (key === sort.key) th.setAttribute("aria-sort", sort.dir > 0 ? "ascending" : "descending");
      else th.removeAttribute("aria-sort");
      th.classList.toggle("sel", key === state.metric.name);
    }
    state.count.textContent = `${tbody.childNodes.length} of ${pair.layers.length} layers`;
    tableHint(state);
  }

  // Say when the layer table is wider than its box (its last columns are a sideways scroll away).
  function tableHint(state) {
    const wrap = state.tableWrap;
    if (!wrap?.isConnected) return;
    const wider = wrap.scrollWidth > wrap.clientWidth + 1;
    wrap.classList.toggle("overflows", wider);
    state.count.textContent =
      state.count.textContent.split(" \u00b7 ")[0] + (wider ? " \u00b7 scroll sideways for more columns" : "");
  }

  function layersTable(state) {
    const fixed = [
      ["order", "#", true],
      ["tensor", "tensor", false],
      ["op_type", "op", false],
    ];
    const columns = fixed.concat(state.pair.metrics.map((m) => [m.name, m.label, true, m]));
    state.heads = columns.map((col) => {
      const button = el("button", { type: "button", text: col[1] });
      const th = el("th", { cls: col[2] ? "num" : "", "data-key": col[0], title: col[3] ? col[3].definition : "" }, [
        button,
      ]);
      button.addEventListener("click", () => {
        if (state.sort.key === col[0]) state.sort.dir = -state.sort.dir;
        else state.sort = { key: col[0], dir: col[3] && !col[3].higher_is_better ? -1 : 1 }; // worst first
        renderRows(state);
      });
      return th;
    });
    state.tbody = el("tbody");
    state.tableWrap = el("div", { cls: "table-wrap" }, [
      el("table", { cls: "layers" }, [el("thead", {}, [el("tr", {}, state.heads)]), state.tbody]),
    ]);
    return state.tableWrap;
  }

  function legend(metric) {
    return el(
      "div",
      { cls: "legend" },
      metric.slots.map((s) =>
        el("span", { cls: DARK.has(s[2]) ? "dark" : "", style: `background:${s[2]}`, text: s[3] }),
      ),
    );
  }

  function unmatched(pair) {
    const lists = [
      ["fp32", "fp32 tensors without a quantized counterpart"],
      ["quantized", "quantized tensors without an fp32 counterpart"],
    ];
    return el(
      "div",
      {},
      lists.map(([key, what]) => {
        const names = pair.unmatched?.[key] || [];
        return el("details", { cls: `unmatched-${key}` }, [
          el("summary", { text: `${names.length} ${what}` }),
          el(
            "ul",
            {},
            names.map((name) => el("li", { text: name })),
          ),
        ]);
      }),
    );
  }

  function definitions(pair) {
    const items = [];
    for (const m of pair.metrics) {
      const direction = m.higher_is_better ? "higher is better" : "lower is better";
      items.push(el("dt", { text: m.label }));
      items.push(
        el("dd", {}, [
          el("div", { text: m.definition || "(no definition recorded)" }),
          el("div", { cls: "dir", text: `${direction}; colour scale ${m.scale}` }),
          legend(m),
        ]),
      );
    }
    return el("dl", { cls: "defs" }, items);
  }

  function sensitivitySection(view) {
    const box = el("div", { cls: "sensitivity" });
    if (view.note) {
      box.appendChild(el("p", { cls: "meta", text: view.note }));
      if (view.recipe?.length) box.appendChild(el("pre", { cls: "recipe", text: view.recipe.join("\n") }));
      return box;
    }
    box.appendChild(el("p", { cls: "meta", text: view.title }));
    if (view.stopped) box.appendChild(el("p", { cls: "hint", text: view.stopped }));
    const headers = [["rank", true], ["node"], ["op"], [view.metric.toUpperCase(), true]];
    const rows = view.rows.map((r) =>
      el("tr", { cls: "sens-row" }, [
        el("td", { cls: "num plain", text: String(r.rank) }),
        el("td", { cls: "tensor", text: r.node }),
        el("td", { cls: "plain", text: r.op_type || "?" }),
        el("td", { cls: "num plain", text: r.text }),
      ]),
    );
    box.appendChild(table("sensitivity-table", headers, rows));
    if (view.more)
      box.appendChild(el("p", { cls: "hint", text: `${view.more} more node(s) in the sensitivity artifact` }));
    if (view.baseline_text) {
      box.appendChild(el("p", { cls: "meta", text: `fully quantized model: ${view.metric} ${view.baseline_text}` }));
    }
    if (view.suggestion) box.appendChild(el("p", {}, [el("code", { cls: "suggestion", text: view.suggestion })]));
    if (view.chart?.x.length) box.appendChild(curveChart(view));
    if (view.recipe?.length) box.appendChild(el("pre", { cls: "recipe", text: view.recipe.join("\n") }));
    return box;
  }

  function curveChart(view) {
    const chart = view.chart;
    const scale = view.chart_axis;
    const W = chartWidth();
    const H = W < 700 ? 240 : 280;
    const L = W < 700 ? 58 : 78;
    const R = 14;
    const T = 14;
    const B = 42;
    const pw = W - L - R;
    const ph = H - T - B;
    const root = svg("svg", { class: "chart curves", viewBox: `0 0 ${W} ${H}`, role: "img" });
    root.appendChild(svg("title", {}, `${chart.title} per quantized node`));
    const wrap = el("div", { cls: "chart-wrap" }, [root]);
    if (!scale) {
      root.appendChild(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, `no values of ${chart.y_label}`));
      return wrap;
    }
    const n = chart.x.length;
    const x = (i) => L + (n === 1 ? pw / 2 : (i * pw) / (n - 1));
    const y = (v) => T + ph - ((v - scale.lo) / (scale.hi - scale.lo)) * ph;
    for (const [pos, label] of scale.ticks) {
      root.appendChild(svg("line", { class: "grid", x1: L, x2: W - R, y1: y(pos), y2: y(pos) }));
      root.appendChild(svg("text", { x: L - 6, y: y(pos) + 4, "text-anchor": "end" }, label));
    }
    chart.series.forEach((s, k) => {
      const color = CURVE_COLORS[k % CURVE_COLORS.length];
      const points = [];
      s.y.forEach((v, i) => {
        if (finite(v)) points.push(`${x(i).toFixed(1)},${y(v).toFixed(1)}`);
      });
      root.appendChild(
        svg("polyline", { class: "curve", points: points.join(" "), stroke: color, "data-series": s.name }),
      );
      s.y.forEach((v, i) => {
        if (!finite(v)) return;
        const dot = svg("circle", { class: "point", cx: x(i), cy: y(v), r: 3, fill: color });
        dot.appendChild(
          svg("title", {}, `${s.name}\n#${i}  ${chart.x[i]}\n${chart.y_label}: ${view.chart_text[k][i]}`),
        );
        root.appendChild(dot);
      });
    });
    root.appendChild(svg("line", { class: "axis", x1: L, x2: W - R, y1: T + ph, y2: T + ph }));
    root.appendChild(svg("line", { class: "axis", x1: L, x2: L, y1: T, y2: T + ph }));
    const every = Math.max(1, Math.ceil(n / Math.max(3, Math.floor(pw / 100))));
    for (let i = 0; i < n; i += every) {
      root.appendChild(svg("text", { x: x(i), y: T + ph + 15, "text-anchor": "middle" }, chart.x[i]));
    }
    const caption = `${chart.title} after each quantized node, in ${chart.x_label}`;
    root.appendChild(svg("text", { x: L + pw / 2, y: H - 6, "text-anchor": "middle" }, caption));
    wrap.appendChild(
      el(
        "div",
        { cls: "curve-legend" },
        chart.series.map((s, k) =>
          el("span", {}, [el("i", { style: `background:${CURVE_COLORS[k % CURVE_COLORS.length]}` }), s.name]),
        ),
      ),
    );
    return wrap;
  }

  function graphSection(state) {
    const graph = state.pair.graph;
    const box = el("div", { cls: "graph-box" });
    const source = graph.note ? null : document.getElementById(`${state.pair.id}-graph-src`);
    const drawn = source?.querySelector("svg");
    if (!drawn) {
      box.appendChild(el("p", { cls: "meta", text: graph.note || "no graph" }));
      return box;
    }
    state.graphCaption = el("p", { cls: "meta" });
    state.graphWrap = el("div", { cls: "graph-wrap", tabindex: "0", "aria-label": "graph: drag to pan" }, [drawn]);
    box.appendChild(state.graphCaption);
    box.appendChild(graphToolbar(state));
    box.appendChild(state.graphWrap);
    source.remove();
    state.graph = drawn;
    state.graphEngine = graph.engine;
    state.nodes = new Map();
    for (const node of drawn.querySelectorAll("g.node[data-tensor]")) state.nodes.set(node.dataset.tensor, node);
    for (const link of drawn.querySelectorAll("a[data-anchor]")) {
      link.addEventListener("click", (event) => {
        event.preventDefault();
        if (state.dragged) return; // the end of a pan, not a click
        const target = link.getAttribute("data-anchor");
        const layer = state.pair.layers.find((x) => `${state.pair.id}-layer-${x.order}` === target);
        if (layer) highlight(state, layer.order);
        else goToAnchor(target);
        markNode(state, link.parentNode);
      });
    }
    return box;
  }

  function button(text, title, action) {
    const node = el("button", { type: "button", cls: "tool", text: text, title: title, "aria-label": title });
    node.addEventListener("click", action);
    return node;
  }

  function graphToolbar(state) {
    state.zoomLabel = el("span", { cls: "hint zoom" });
    state.find = el("input", { type: "search", placeholder: "find node by name", "aria-label": "find node" });
    state.findCount = el("span", { cls: "hint" });
    state.back = button("\u2190 back to the row", "back to the table row you came from", () => backToRow(state));
    state.back.hidden = true;
    state.find.addEventListener("input", () => findNodes(state, 0));
    state.find.addEventListener("keydown", (event) => {
      if (event.key !== "Enter") return;
      event.preventDefault();
      findNodes(state, (state.matchAt || 0) + (event.shiftKey ? -1 : 1));
    });
    return el("div", { cls: "controls graph-tools" }, [
      el("span", { cls: "zoom-buttons" }, [
        button("\u2212", "zoom out", () => zoomBy(state, 1 / 1.25)),
        button("+", "zoom in", () => zoomBy(state, 1.25)),
        button("fit", "fit the whole graph", () => fitGraph(state)),
        button("1:1", "actual size", () => zoomTo(state, 1)),
        state.zoomLabel,
      ]),
      state.find,
      state.findCount,
      state.back,
    ]);
  }

  // The drawing's size at 100 % in CSS pixels (Graphviz gives points).
  function naturalSize(drawn) {
    const box = drawn.viewBox.baseVal;
    const length = (text, fallback) => {
      const found = /^\s*([\d.]+)\s*(pt|px)?\s*$/.exec(text || "");
      return found ? Number.parseFloat(found[1]) * (found[2] === "pt" ? 4 / 3 : 1) : fallback;
    };
    const width = length(drawn.getAttribute("width"), box?.width || 800);
    const height = length(drawn.getAttribute("height"), box?.height || 600);
    return { width: width, height: height };
  }

  // Called once the section is in the page (sizes are known): size the drawing, wire pan and zoom.
  function initGraph(state) {
    if (!state.graph) return;
    const wrap = state.graphWrap;
    const size = naturalSize(state.graph);
    state.view = { scale: 1, width: size.width, height: size.height };
    state.graph.removeAttribute("width");
    state.graph.removeAttribute("height");
    const across = (wrap.clientWidth - 16) / size.width;
    zoomTo(state, Math.min(1, Math.max(across, 0.5)));
    wrap.scrollLeft = (wrap.scrollWidth - wrap.clientWidth) / 2;
    wrap.scrollTop = 0;
    let drag = null;
    wrap.addEventListener("pointerdown", (event) => {
      if (event.button !== 0) return;
      drag = { x: event.clientX, y: event.clientY, left: wrap.scrollLeft, top: wrap.scrollTop };
      state.dragged = false;
    });
    wrap.addEventListener("pointermove", (event) => {
      if (!drag) return;
      const dx = event.clientX - drag.x;
      const dy = event.clientY - drag.y;
      if (!state.dragged && Math.abs(dx) + Math.abs(dy) < 5) return;
      state.dragged = true;
      wrap.classList.add("panning");
      wrap.scrollLeft = drag.left - dx;
      wrap.scrollTop = drag.top - dy;
    });
    const stop = () => {
      drag = null;
      wrap.classList.remove("panning");
      setTimeout(() => {
        state.dragged = false;
      }, 0);
    };
    wrap.addEventListener("pointerup", stop);
    wrap.addEventListener("pointerleave", stop);
    wrap.addEventListener(
      "wheel",
      (event) => {
        if (!event.ctrlKey && !event.metaKey) return; // a plain wheel scrolls
        event.preventDefault();
        const r = wrap.getBoundingClientRect();
        zoomTo(
          state,
          state.view.scale * Math.exp(-event.deltaY * 0.002),
          event.clientX - r.left,
          event.clientY - r.top,
        );
      },
      { passive: false },
    );
    wrap.addEventListener("keydown", (event) => {
      const keys = { "+": 1.25, "=": 1.25, "-": 0.8 };
      if (keys[event.key]) zoomBy(state, keys[event.key]);
      else if (event.key === "0") fitGraph(state);
      else return;
      event.preventDefault();
    });
  }

  function fitScale(state) {
    const wrap = state.graphWrap;
    const v = state.view;
    return Math.min((wrap.clientWidth - 16) / v.width, (wrap.clientHeight - 16) / v.height);
  }

  // Zoom to ``scale`` keeping the point (px, py) of the box (default: its centre) where it is.
  function zoomTo(state, scale, px, py) {
    const wrap = state.graphWrap;
    const v = state.view;
    if (!v) return;
    const next = Math.max(Math.min(fitScale(state), 0.5) / 2, Math.min(4, scale));
    const x = px === undefined ? wrap.clientWidth / 2 : px;
    const y = py === undefined ? wrap.clientHeight / 2 : py;
    const ox = (wrap.scrollLeft + x) / v.scale;
    const oy = (wrap.scrollTop + y) / v.scale;
    v.scale = next;
    state.graph.style.width = `${(v.width * next).toFixed(1)}px`;
    state.graph.style.height = `${(v.height * next).toFixed(1)}px`;
    wrap.scrollLeft = ox * next - x;
    wrap.scrollTop = oy * next - y;
    state.zoomLabel.textContent = `${Math.round(next * 100)} %`;
    state.graph.setAttribute("data-scale", next.toFixed(4));
  }

  function zoomBy(state, factor) {
    if (state.view) zoomTo(state, state.view.scale * factor);
  }

  function fitGraph(state) {
    if (!state.view) return;
    zoomTo(state, fitScale(state));
    state.graphWrap.scrollLeft = 0;
    state.graphWrap.scrollTop = 0;
  }

  function markNode(state, node) {
    for (const other of state.graph.querySelectorAll("g.node.hl")) other.classList.remove("hl");
    node.classList.add("hl");
  }

  // Scroll the graph box so that ``node`` is in its middle, and the box into the window.
  function revealNode(state, node) {
    markNode(state, node);
    const wrap = state.graphWrap;
    if (state.view && state.view.scale < 0.6) zoomTo(state, 1);
    wrap.scrollIntoView({ block: "nearest" });
    const outer = wrap.getBoundingClientRect();
    const inner = node.getBoundingClientRect();
    wrap.scrollLeft += inner.left - outer.left + inner.width / 2 - wrap.clientWidth / 2;
    wrap.scrollTop += inner.top - outer.top + inner.height / 2 - wrap.clientHeight / 2;
  }

  // A table row (layer or output) shows its node in the graph; "back" returns to the row.
  function rowToNode(state, row) {
    const node = state.nodes?.get(row.dataset.tensor);
    if (!node) return false;
    for (const other of state.section.querySelectorAll("tr.hl")) other.classList.remove("hl");
    row.classList.add("hl");
    state.backTo = row.id;
    state.back.hidden = false;
    revealNode(state, node);
    return true;
  }

  function backToRow(state) {
    state.back.hidden = true;
    if (state.backTo) goToAnchor(state.backTo);
  }

  function findNodes(state, at) {
    const needle = state.find.value.trim().toLowerCase();
    for (const node of state.graph.querySelectorAll("g.node.match")) node.classList.remove("match");
    state.matches = [];
    if (needle) {
      for (const node of state.graph.querySelectorAll("g.node")) {
        const name = `${node.dataset.tensor || ""} ${node.querySelector("title")?.textContent || ""}`;
        if (name.toLowerCase().includes(needle)) state.matches.push(node);
      }
    }
    for (const node of state.matches) node.classList.add("match");
    const n = state.matches.length;
    if (!n) {
      state.findCount.textContent = needle ? "no node matches" : "";
      return;
    }
    state.matchAt = (((at || 0) % n) + n) % n;
    state.findCount.textContent = `${state.matchAt + 1} of ${n} (Enter: next)`;
    revealNode(state, state.matches[state.matchAt]);
  }

  // Colour the graph's nodes by the selected metric (the colours Python computed per tensor).
  function colourGraph(state) {
    if (!state.graph) return;
    const metric = state.metric;
    const entries = new Map();
    for (const entry of state.pair.outputs.concat(state.pair.layers)) entries.set(entry.name || entry.tensor, entry);
    for (const node of state.graph.querySelectorAll("g.node[data-tensor]")) {
      const entry = entries.get(node.getAttribute("data-tensor"));
      const color = entry?.color[metric.name] || "#c0c0c0";
      node.setAttribute("data-color", color);
      node.querySelector(".shape")?.setAttribute("fill", color);
      const texts = node.querySelectorAll("text");
      for (const text of texts) text.setAttribute("fill", DARK.has(color) ? "white" : "black");
      const value = entry?.text[metric.name] || "n/a";
      if (texts.length > 2) texts[texts.length - 1].textContent = `${metric.label} ${value}`;
    }
    const how = state.graphEngine === "graphviz" ? "laid out by Graphviz" : "built-in layered layout";
    state.graphCaption.textContent =
      `fp32 graph coloured by ${metric.label} (the chart's metric), ${how}; ` +
      "gray: not compared; drag to pan, Ctrl+wheel to zoom; click a node to find its row, a row to find its node";
  }

  function metaLine(pair) {
    const scheme = pair.scheme ? ` (${pair.scheme})` : "";
    return el("p", { cls: "meta" }, [
      "fp32 ",
      el("b", { text: pair.fp32_model }),
      " \u00b7 quantized ",
      el("b", { text: pair.quantized_model }),
      " \u00b7 data ",
      el("b", { text: pair.data }),
      ` \u00b7 ${pair.records} records \u00b7 backend ${pair.backend}${scheme} \u00b7 capture ${pair.capture}`,
    ]);
  }

  function cards(pair) {
    const found = [
      card("Layers compared", String(pair.layers.length)),
      card("Outputs", String(pair.outputs.length)),
      card(
        "Unmatched",
        String(pair.unmatched.fp32.length + pair.unmatched.quantized.length),
        `${pair.unmatched.fp32.length} fp32, ${pair.unmatched.quantized.length} quantized`,
      ),
    ];
    const worst = pair.worst[0];
    const metric = byName(pair, pair.first_metric);
    if (worst && metric) {
      found.push(card(`Worst layer by ${metric.label}`, worst.text, `${worst.tensor} (${worst.op_type})`));
    }
    return el("div", { cls: "cards" }, found);
  }

  function layersSection(state, section) {
    const pair = state.pair;
    const select = el(
      "select",
      { "aria-label": "metric" },
      pair.metrics.map((m) => el("option", { value: m.name, text: m.label })),
    );
    select.value = state.metric.name;
    state.log = el("input", { type: "checkbox" });
    state.filter = el("input", { type: "search", placeholder: "filter tensor / op", "aria-label": "filter" });
    state.count = el("span", { cls: "hint" });
    section.appendChild(
      el("div", { cls: "controls" }, [
        el("label", {}, ["Metric ", select]),
        el("label", {}, [state.log, " log scale"]),
        state.filter,
        state.count,
      ]),
    );
    state.chart = svg("svg", { class: "chart", role: "img" });
    section.appendChild(el("div", { cls: "chart-wrap" }, [state.chart]));
    section.appendChild(layersTable(state));
    select.addEventListener("change", () => {
      state.metric = byName(pair, select.value);
      drawChart(state);
      renderRows(state);
      colourGraph(state);
    });
    state.log.addEventListener("change", () => drawChart(state));
    state.filter.addEventListener("input", () => renderRows(state));
    drawChart(state);
    renderRows(state);
  }

  function add(section, heading, ...nodes) {
    section.appendChild(el("h3", { text: heading }));
    for (const node of nodes) section.appendChild(node);
  }

  function renderPair(pair) {
    const metric = byName(pair, pair.first_metric) || pair.metrics[0];
    const section = el("section", {
      cls: "pair",
      id: pair.id,
      "data-pair": String(pair.index),
      "data-status": pair.verdict.status,
    });
    const state = { pair: pair, metric: metric, sort: { key: "order", dir: 1 }, section: section };
    STATES.set(pair.id, state);
    section.appendChild(el("h2", {}, [badge(pair.verdict), pair.title]));
    const reason = pair.verdict.reason ? `; ${pair.verdict.reason}` : "";
    section.appendChild(el("p", { cls: "verdict", text: pair.verdict.detail + reason }));
    section.appendChild(metaLine(pair));
    section.appendChild(cards(pair));
    if (pair.checks.length) add(section, "Checks", checksTable(pair.checks, "checks"));
    if (pair.drift.length) add(section, "Drift against the baseline", checksTable(pair.drift, "drift"));
    if (pair.topk.length) add(section, "Top-k accuracy", topkTable(pair.topk));
    if (pair.task?.length) add(section, "Task metrics", taskTable(pair.task));
    add(section, "Outputs", outputsTable(pair));
    if (pair.targets) add(section, "Deployment targets", targetsTable(pair.targets));
    section.appendChild(el("h3", { text: "Layers" }));
    if (!metric || !pair.layers.length) {
      section.appendChild(el("p", { cls: "meta", text: "No intermediate layers were compared." }));
    } else {
      layersSection(state, section);
    }
    add(section, "Graph", graphSection(state));
    if (metric) colourGraph(state);
    if (pair.sensitivity) add(section, "Sensitivity", sensitivitySection(pair.sensitivity));
    add(section, "Unmatched tensors", unmatched(pair));
    add(section, "Metrics", definitions(pair));
    section.addEventListener("click", (event) => {
      const row = event.target.closest("tr[data-tensor]");
      if (!row || !state.nodes || String(window.getSelection?.() || "")) return;
      rowToNode(state, row);
    });
    if (state.graph) section.setAttribute("data-graph", "1");
    return section;
  }

  function overviewRow(pair) {
    const out = pair.outputs[0];
    const cell = (name) => {
      const m = byName(pair, name);
      // plain text: each pair's colour scale is relative to its own layers, so colours do not compare
      return el("td", { cls: "num", text: m && out ? out.text[name] : "n/a" });
    };
    const worstCell = el("td", { cls: "worst" });
    pair.worst.forEach((layer, i) => {
      const link = el("a", { href: `#${pair.id}-layer-${layer.order}`, title: `${layer.tensor} (${layer.op_type})` }, [
        el("code", { text: layer.tensor }),
      ]);
      link.addEventListener("click", (event) => {
        event.preventDefault();
        history.replaceState(null, "", link.getAttribute("href"));
        goToAnchor(link.getAttribute("href").slice(1));
      });
      worstCell.append(i ? " \u00b7 " : "", link, ` ${layer.text}`);
    });
    return el("tr", { cls: "overview-row", "data-status": pair.verdict.status }, [
      el("td", {}, [badge(pair.verdict)]),
      el("td", {}, [el("a", { href: `#${pair.id}`, text: pair.title })]),
      el("td", { text: pair.verdict.detail, title: pair.verdict.reason }),
      cell("cosine"),
      cell("sqnr"),
      worstCell,
    ]);
  }

  function overview(data) {
    const headers = [
      ["verdict"],
      ["pair"],
      ["checks"],
      ["COSINE", true, "first output"],
      ["SQNR", true, "first output"],
      ["worst layers", false, "by the metric each pair shows first (SQNR when measured)"],
    ];
    return el("section", { cls: "overview" }, [
      el("h2", { text: "Overview" }),
      el("p", { cls: "verdict", text: data.summary }),
      verdictFilter(data),
      table("overview-table", headers, data.pairs.map(overviewRow)),
    ]);
  }

  // Checkboxes per verdict, with counts, as pytest-html has per outcome; ?verdict=failed,xfailed
  // in the address starts with only those shown.
  function verdictFilter(data) {
    const counts = new Map();
    for (const pair of data.pairs) counts.set(pair.verdict.status, (counts.get(pair.verdict.status) || 0) + 1);
    const asked = new URLSearchParams(window.location.search).get("verdict");
    const wanted = asked ? new Set(asked.split(",").map((x) => x.trim())) : null;
    const boxes = [];
    const apply = () => {
      const shown = new Set(boxes.filter((b) => b.checked).map((b) => b.value));
      for (const node of document.querySelectorAll("section.pair[data-status], tr.overview-row[data-status]")) {
        node.hidden = !shown.has(node.getAttribute("data-status"));
      }
      document.body.setAttribute("data-verdicts", Array.from(shown).sort().join(","));
    };
    const labels = Object.keys(VERDICT_NAMES)
      .filter((status) => counts.has(status))
      .map((status) => {
        const box = el("input", { type: "checkbox", value: status });
        box.checked = !wanted || wanted.has(status);
        box.addEventListener("change", apply);
        boxes.push(box);
        return el("label", { cls: `verdict-filter ${status}` }, [
          box,
          ` ${counts.get(status)} ${VERDICT_NAMES[status]}`,
        ]);
      });
    const box = el("div", { cls: "controls verdicts", role: "group", "aria-label": "show pairs by verdict" }, [
      el("span", { cls: "hint", text: "Show:" }),
      ...labels,
    ]);
    box.apply = apply;
    return box;
  }

  function environmentSection(rows) {
    const body = rows.map(([name, value]) =>
      el("tr", { cls: "env-row" }, [el("th", { text: name, scope: "row" }), el("td", { text: value, title: value })]),
    );
    const value = (name) => rows.find((row) => row[0] === name)?.[1];
    const brief = [
      value("created (UTC)") && `${value("created (UTC)").replace("T", " ").replace("+00:00", "")} UTC`,
      value("commit") && `commit ${value("commit").slice(0, 12)}`,
      value("onnxruntime") && `onnxruntime ${value("onnxruntime")}`,
      value("onnxruntime int8 family"),
    ].filter(Boolean);
    return el("section", { cls: "environment", id: "environment" }, [
      el("details", {}, [
        el("summary", {}, [
          el("h2", { text: "Environment" }),
          el("span", { cls: "hint", text: brief.join(" \u00b7 ") }),
        ]),
        el("div", { cls: "table-wrap short" }, [el("table", { cls: "env" }, [el("tbody", {}, body)])]),
      ]),
    ]);
  }

  function main() {
    const data = JSON.parse(document.getElementById("qaccuracy-data").textContent);
    const root = document.getElementById("qa-root");
    let filter = null;
    if (!data.pairs.length) root.appendChild(el("p", { text: "No comparisons in this report." }));
    else {
      const section = overview(data);
      filter = section.querySelector(".verdicts");
      root.appendChild(section);
    }
    if (data.environment?.length) root.appendChild(environmentSection(data.environment));
    for (const pair of data.pairs) root.appendChild(renderPair(pair));
    for (const state of STATES.values()) {
      initGraph(state);
      if (state.chart && state.chartDrawnAt !== chartWidth()) drawChart(state);
      if (state.tableWrap) tableHint(state);
    }
    filter?.apply();
    let width = chartWidth();
    window.addEventListener("resize", () => {
      if (chartWidth() === width) return;
      width = chartWidth();
      for (const state of STATES.values()) {
        if (state.chart) drawChart(state);
        if (state.tableWrap) tableHint(state);
      }
    });
    window.addEventListener("hashchange", () => goToAnchor(window.location.hash.slice(1)));
    if (window.location.hash) goToAnchor(decodeURIComponent(window.location.hash.slice(1)));
    document.body.setAttribute("data-ready", "1");
  }

  try {
    main();
  } catch (err) {
    const box = document.getElementById("qa-error");
    box.style.display = "block";
    box.textContent = `The report could not be rendered: ${err?.stack ? err.stack : err}`;
    document.body.setAttribute("data-error", String(err));
  }
})();
