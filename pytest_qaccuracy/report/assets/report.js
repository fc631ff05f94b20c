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
        { id: `${pair.id}-output-${k}`, cls: "output-row" },
        [el("td", { cls: "tensor", text: out.name, title: out.name })].concat(
          pair.metrics.map((m) => valueCell(m, out)),
        ),
      ),
    );
    if (!rows.length) rows.push(el("tr", {}, [el("td", { text: "no outputs compared" })]));
    return table("outputs", headers, rows);
  }

  function targetsTable(view) {
    const rows = view.rows.map((row) =>
      el(
        "tr",
        {},
        row.map((cell, i) => el("td", { cls: (i > 1 ? "num" : "") + (cell === "FAIL" ? " fail" : ""), text: cell })),
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
    const W = 1200;
    const H = 300;
    const L = 78;
    const R = 14;
    const T = 14;
    const B = 42;
    const pw = W - L - R;
    const ph = H - T - B;
    chart.setAttribute("viewBox", `0 0 ${W} ${H}`);
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
    const every = Math.max(1, Math.ceil(n / 20));
    for (let i = 0; i < n; i += every) {
      const at = { x: L + (i + 0.5) * step, y: T + ph + 15, "text-anchor": "middle" };
      chart.appendChild(svg("text", at, String(layers[i].order)));
    }
    const caption = `layers in topological order (${n}; bar colour = visq slot, click a bar to find its row)`;
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
      row.scrollIntoView({ block: "center" });
    }
    return row;
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
      const props = { cls: "layer-row", id: `${pair.id}-layer-${layer.order}`, "data-order": layer.order };
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
    return el("div", { cls: "table-wrap" }, [
      el("table", { cls: "layers" }, [el("thead", {}, [el("tr", {}, state.heads)]), state.tbody]),
    ]);
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
    const W = 1200;
    const H = 280;
    const L = 78;
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
    const every = Math.max(1, Math.ceil(n / 12));
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
    box.appendChild(state.graphCaption);
    box.appendChild(el("div", { cls: "graph-wrap" }, [drawn]));
    source.remove();
    state.graph = drawn;
    state.graphEngine = graph.engine;
    for (const link of drawn.querySelectorAll("a[data-anchor]")) {
      link.addEventListener("click", (event) => {
        event.preventDefault();
        const target = link.getAttribute("data-anchor");
        const layer = state.pair.layers.find((x) => `${state.pair.id}-layer-${x.order}` === target);
        const row = layer ? highlight(state, layer.order) : document.getElementById(target);
        if (row && !layer) row.scrollIntoView({ block: "center" });
        for (const node of drawn.querySelectorAll("g.node.hl")) node.classList.remove("hl");
        link.parentNode.classList.add("hl");
      });
    }
    return box;
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
      "gray: not compared; click a node to find its row";
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
    const section = el("section", { cls: "pair", id: pair.id, "data-pair": String(pair.index) });
    const state = { pair: pair, metric: metric, sort: { key: "order", dir: 1 }, section: section };
    section.appendChild(el("h2", {}, [badge(pair.verdict), pair.title]));
    const reason = pair.verdict.reason ? `; ${pair.verdict.reason}` : "";
    section.appendChild(el("p", { cls: "verdict", text: pair.verdict.detail + reason }));
    section.appendChild(metaLine(pair));
    section.appendChild(cards(pair));
    if (pair.checks.length) add(section, "Checks", checksTable(pair.checks, "checks"));
    if (pair.drift.length) add(section, "Drift against the baseline", checksTable(pair.drift, "drift"));
    if (pair.topk.length) add(section, "Top-k accuracy", topkTable(pair.topk));
    if (pair.task && pair.task.length) add(section, "Task metrics", taskTable(pair.task));
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
      worstCell.append(i ? " \u00b7 " : "", link, ` ${layer.text}`);
    });
    return el("tr", { cls: "overview-row" }, [
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
      table("overview-table", headers, data.pairs.map(overviewRow)),
    ]);
  }

  function main() {
    const data = JSON.parse(document.getElementById("qaccuracy-data").textContent);
    const root = document.getElementById("qa-root");
    if (!data.pairs.length) root.appendChild(el("p", { text: "No comparisons in this report." }));
    else root.appendChild(overview(data));
    for (const pair of data.pairs) root.appendChild(renderPair(pair));
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
