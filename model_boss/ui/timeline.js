// model-boss dashboard: the panels that show time. The Timeline draws GET /api/v1/history as
// inline SVG (VRAM by holder per GPU with marks for loads, evictions and failures; queue
// depth and wait by priority; tokens/s and requests/s per model; the CPU tier's RAM) and
// lists the marks in words; the Requests panel lists GET /api/v1/requests and each client's
// waits, each row's trace id linked to the trace viewer the config names (tracing.trace_url).
// A server without either route answers 404: the panel says so and the page carries on.

const READ_EVERY_MS = 5000;
const EVENT_GAP_MS = 1000;   // a burst of events re-reads these at most once a second
const MAX_POINTS = 720;      // per series: more would be finer than the chart's pixels
const W = 720;               // the charts' user units; the SVG stretches to the panel's width
const GPU_H = 140;
const SMALL_H = 80;
const PALETTE = 8;           // --series-0 … --series-7 in dashboard.css
const REQUEST_ROWS = 100;
const MARK_ROWS = 50;        // the marks listed in words under the charts, newest first

// The SVG namespace, taken from the parser rather than spelled out here.
const SVG_NS = (() => {
  const template = document.createElement("template");
  template.innerHTML = "<svg></svg>";
  return template.content.firstChild.namespaceURI;
})();

export function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value !== null && value !== undefined) el.setAttribute(name, String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child !== null && child !== undefined) el.append(child);
  }
  return el;
}

const colours = new Map();  // label -> palette slot, kept for the page's life: stable colours
function colourOf(label) {
  if (!colours.has(label)) colours.set(label, colours.size % PALETTE);
  return `var(--series-${colours.get(label)})`;
}

/** Bucket the times so no series has more than MAX_POINTS; each bucket keeps its mean
 *  (nulls ignored; all null stays null). The same buckets for every series keep stacks aligned. */
export function downsample(t, seriesList) {
  const step = Math.max(1, Math.ceil(t.length / MAX_POINTS));
  if (step === 1) return {t, series: seriesList};
  const mean = (values, from, to) => {
    let sum = 0, n = 0;
    for (let i = from; i < to; i++) {
      const v = values[i];
      if (v !== null && v !== undefined) { sum += v; n++; }
    }
    return n ? sum / n : null;
  };
  const times = [];
  const out = seriesList.map(() => []);
  for (let from = 0; from < t.length; from += step) {
    const to = Math.min(from + step, t.length);
    times.push(mean(t, from, to));
    seriesList.forEach((values, k) => out[k].push(mean(values || [], from, to)));
  }
  return {t: times, series: out};
}

function scaleX(t) {
  const t0 = t[0];
  const span = Math.max(1e-9, t[t.length - 1] - t0);
  return (ts) => ((ts - t0) / span) * W;
}

const scaleY = (height, max) => (v) => height - (Math.max(0, v || 0) / (max || 1)) * height;
const fmt = (n) => (Math.round(n * 10) / 10).toString();

/** One stacked area per series, bottom first: ``[{label, values, cls, fill}]``. */
function stackedAreas(t, layers, height, max) {
  const x = scaleX(t);
  const y = scaleY(height, max);
  const below = t.map(() => 0);
  return layers.map((layer) => {
    const above = below.map((b, i) => b + Math.max(0, layer.values[i] || 0));
    const top = t.map((ts, i) => `${fmt(x(ts))},${fmt(y(above[i]))}`);
    const bottom = t.map((ts, i) => `${fmt(x(ts))},${fmt(y(below[i]))}`).reverse();
    above.forEach((v, i) => { below[i] = v; });
    return svg("path", {class: layer.cls, "data-holder": layer.label,
      style: layer.fill ? `fill:${layer.fill}` : null, "fill-opacity": layer.opacity, d: `M${top.join("L")}L${bottom.join("L")}Z`},
    svg("title", {}, layer.title));
  });
}

/** A line per series; a null breaks it. */
function lines(t, series, height, max) {
  const x = scaleX(t);
  const y = scaleY(height, max);
  return series.map(({label, values}) => {
    let d = "";
    let pen = false;
    values.forEach((v, i) => {
      if (v === null || v === undefined) { pen = false; return; }
      d += `${pen ? "L" : "M"}${fmt(x(t[i]))},${fmt(y(v))}`;
      pen = true;
    });
    return svg("path", {class: "series", "data-series": label, d: d || "M0,0",
      style: `stroke:${colourOf(label)}`}, svg("title", {}, label));
  });
}

function marksFor(t, marks, height, fmtClock) {
  const x = scaleX(t);
  return svg("g", {class: "marks"}, marks.map((m) => {
    const at = fmt(x(Math.min(Math.max(m.t, t[0]), t[t.length - 1])));  // bucket means move the ends
    const what = [m.type, m.model, m.reason].filter(Boolean).join(" · ");
    return svg("line", {class: "mark", "data-type": m.type, "data-model": m.model ?? "",
      "data-t": m.t, "data-gpu": m.gpu ?? "", x1: at, x2: at, y1: 0, y2: height},
    svg("title", {}, `${fmtClock(m.t)} ${what}`));
  }));
}

export function startTimePanels({api, h, fmtMB, fmtClock, fmtDuration, $}) {
  const last = {history: null, requests: null, requestsText: null, traceUrl: null};
  let reading = false;
  let lastRead = 0;
  let eventTimer = null;

  function chart(title, height, cls, body, legend, t) {
    return h("figure", {class: "chart"},
      h("h3", {}, title),
      svg("svg", {viewBox: `0 0 ${W} ${height}`, preserveAspectRatio: "none", class: cls,
        role: "img", "aria-label": title}, body),
      h("div", {class: "axis"}, h("span", {}, fmtClock(t[0])), h("span", {}, fmtClock(t[t.length - 1]))),
      h("ul", {class: "legend"}, legend));
  }

  const legendItem = (colour, text) => h("li", {}, h("i", {style: `background:${colour}`}), text);
  const lastValue = (values) => [...values].reverse().find((v) => v !== null && v !== undefined);

  function withData(figure, index) {
    figure.dataset.gpu = index;
    return figure;
  }

  function lineChart(title, kind, t, named, name, marks = []) {
    const labels = Object.keys(named);
    const sampled = downsample(t, labels.map((k) => named[k]));
    const series = labels.map((label, k) => ({label, values: sampled.series[k]}));
    const max = Math.max(1, ...series.flatMap((s) => s.values.filter((v) => v !== null)));
    const legend = series.map((s) => legendItem(colourOf(s.label),
      `${name(s.label)}: ${fmt(lastValue(named[s.label]) ?? 0)}`));
    const body = [lines(sampled.t, series, SMALL_H, max), marks.length ? marksFor(sampled.t, marks, SMALL_H, fmtClock) : null];
    const figure = chart(`${title} (peak ${fmt(max)})`, SMALL_H, "small", body, legend, sampled.t);
    figure.dataset.chart = kind;
    return figure;
  }

  function renderHistory(history) {
    const t = history.t || [];
    const summary = $("#timeline-summary");
    if (t.length < 2) {
      summary.textContent = "No history yet: the server keeps one point every " +
        `${history.step_s ?? 5} s.`;
      $("#timeline-charts").replaceChildren();
      return;
    }
    // every mark of the window, one before the first point too (a load as the server started):
    // the charts draw it at their left edge
    const marks = [...(history.marks || [])].sort((a, b) => a.t - b.t);
    const models = new Set(Object.keys(history.models || {}));
    summary.textContent = `The last ${fmtDuration(t[t.length - 1] - t[0])}, one point every ` +
      `${history.step_s} s · ${marks.length} mark${marks.length === 1 ? "" : "s"}`;
    const figures = Object.entries(history.gpus || {}).map(([index, gpu]) =>
      withData(gpuChart(index, gpu, t, marks, models), index));
    // no GPU to draw them on (models on the CPU): the marks go on the queue's chart
    figures.push(lineChart("Queue depth by priority", "queue", t, history.queue?.depth || {},
      (priority) => `priority ${priority}`, figures.length ? [] : marks));
    const tokens = Object.fromEntries(Object.entries(history.models || {})
      .map(([id, m]) => [id, m.tokens_per_s || []]));
    figures.push(lineChart("Queue wait by priority, seconds", "wait", t,
      history.queue?.wait_s || {}, (priority) => `priority ${priority}`));
    figures.push(lineChart("Tokens/s per model", "tokens", t, tokens, (id) => `${id} tok/s`));
    const requests = Object.fromEntries(Object.entries(history.models || {})
      .map(([id, m]) => [id, m.requests_per_s || []]));
    figures.push(lineChart("Requests/s per model", "requests", t, requests, (id) => `${id} req/s`));
    if ((history.cpu_tier_mb || []).some((mb) => mb > 0)) {  // only where something was parked
      figures.push(lineChart("CPU-tier RAM, MB", "cpu-tier", t, {"CPU tier": history.cpu_tier_mb},
        (label) => label));
    }
    figures.push(markList(marks));
    $("#timeline-charts").replaceChildren(...figures);
  }

  const MARK_WORDS = {load: "loaded", evict: "evicted", unload: "unloaded", offload: "offloaded",
    onload: "onloaded", oom_retry: "out of memory, retried", crash: "crashed",
    lease_lost: "lost its lease"};

  /** The marks in words, so why each eviction happened reads without hovering. */
  function markList(marks) {
    const shown = marks.slice(-MARK_ROWS).reverse();  // newest first, as the events table
    const rows = shown.map((m) => h("li", {"data-type": m.type, "data-model": m.model ?? ""},
      h("time", {}, fmtClock(m.t)), " ",
      h("strong", {}, m.model ?? "—"), ` ${MARK_WORDS[m.type] ?? m.type}`,
      m.gpu === null || m.gpu === undefined ? "" : ` on GPU ${m.gpu}`,
      m.reason ? h("span", {class: "reason"}, ` — ${m.reason}`) : ""));
    return h("figure", {class: "marks-list", "data-chart": "marks"},
      h("h3", {}, marks.length > shown.length
        ? `What happened, newest first (the last ${shown.length} of ${marks.length})`
        : "What happened, newest first"),
      rows.length ? h("ol", {reversed: true}, rows) : h("p", {class: "summary"}, "No loads or evictions yet."));
  }

  function gpuChart(index, gpu, t, marks, models) {
    const holders = Object.keys(gpu.held || {});
    const sampled = downsample(t, [...holders.map((k) => gpu.held[k]), gpu.free_mb || []]);
    let outside = 0;
    const layers = holders.map((label, k) => {
      // the server names holders "model:<id>" and "lease:<holder>"; a bare id is a model too
      const name = label.replace(/^(model|lease):/, "");
      const model = label.startsWith("model:") || (!label.startsWith("lease:") && models.has(name));
      return {label, name, values: sampled.series[k], cls: model ? "area model" : "area outside",
        fill: model ? colourOf(name) : "var(--bar-outside)",
        opacity: model ? null : Math.max(0.35, 1 - 0.25 * outside++),
        latest: lastValue(gpu.held[label])};
    });
    layers.push({label: "free", values: sampled.series[holders.length], cls: "area free",
      fill: null, opacity: null, latest: lastValue(gpu.free_mb || [])});
    for (const layer of layers) layer.title = `${layer.name ?? layer.label} ${fmtMB(layer.latest)}`;
    const totals = sampled.t.map((_, i) => layers.reduce((s, l) => s + Math.max(0, l.values[i] || 0), 0));
    const max = Math.max(gpu.capacity_mb || 0, ...totals, 1);
    const areas = stackedAreas(sampled.t, layers, GPU_H, max);
    const own = marks.filter((m) => m.gpu === null || m.gpu === undefined || String(m.gpu) === index);
    const legend = layers.map((l) => legendItem(l.fill || "var(--bar-free)", l.title));
    return chart(`GPU ${index} · ${gpu.name} · VRAM by holder of ${fmtMB(gpu.capacity_mb)}`, GPU_H,
      null, [areas, marksFor(sampled.t, own, GPU_H, fmtClock)], legend, sampled.t);
  }

  async function readHistory() {
    try {
      const history = await api("GET", "/api/v1/history");
      const text = JSON.stringify(history);
      if (text === last.history) return;  // unchanged: no redraw
      last.history = text;
      renderHistory(history);
    } catch (err) {
      if (routeMissing(err, "#timeline-summary", "#timeline-charts", "no history on this server")) {
        last.history = null;
      }
    }
  }

  /** A 404 (or 405) is a server without the route: the panel says so. True when it was. */
  function routeMissing(err, summary, content, note) {
    if (err.status === 404 || err.status === 405) {
      $(summary).textContent = note;
      $(content).replaceChildren();
      return true;
    }
    if (err.status !== 401) console.debug(`${summary}: read failed`, err);  // the key dialog says 401
    return false;
  }

  const requestFilter = () => ({model: $("#request-model").value.trim(),
    client: $("#request-client").value.trim()});

  /** A row's OpenTelemetry trace id (traces on): a link where the server names a trace
   *  viewer (tracing.trace_url), else the id to copy; its first 8 digits shown, all in title. */
  function traceCell(r) {
    if (!r.trace_id) return "—";
    const short = r.trace_id.slice(0, 8);
    if (!last.traceUrl) return h("code", {class: "trace-id", title: r.trace_id}, short);
    return h("a", {class: "trace-id", title: r.trace_id, target: "_blank", rel: "noopener",
      href: last.traceUrl.replaceAll("{trace_id}", encodeURIComponent(r.trace_id))}, h("code", {}, short));
  }

  function renderRequests(rows, filter) {
    const shown = rows.filter((r) =>
      (!filter.model || String(r.model ?? "").toLowerCase().includes(filter.model.toLowerCase())) &&
      (!filter.client || String(r.client_id ?? "").toLowerCase().includes(filter.client.toLowerCase())));
    $("#requests-summary").textContent = `${shown.length} request${shown.length === 1 ? "" : "s"}` +
      ` (the last ${REQUEST_ROWS} at most, newest first)`;
    const secs = (v) => (v === null || v === undefined ? "—" : `${Number(v).toFixed(2)} s`);
    const body = shown.map((r) => h("tr", {"data-model": r.model, "data-status": r.status},
      h("td", {}, fmtClock(r.t)), h("td", {}, r.model), h("td", {}, r.client_id ?? "—"),
      h("td", {}, r.priority ?? "—"), h("td", {}, secs(r.queue_wait_s)), h("td", {}, secs(r.load_wait_s)),
      h("td", {}, secs(r.duration_s)), h("td", {}, r.tokens ?? "—"), h("td", {}, r.status ?? "—"),
      h("td", {}, r.task ? `${r.task} · rung ${r.rung ?? "?"}` : "—"), h("td", {}, traceCell(r))));
    $("#request-table tbody").replaceChildren(...(body.length ? body
      : [h("tr", {}, h("td", {colspan: 11, class: "empty"}, "No requests."))]));
    renderClientWaits(shown);
  }

  /** Each client's waits over the rows shown: requests, mean and longest queue wait, and the
   *  mean part of it spent before its model was ready (a load, and making room for it). */
  function renderClientWaits(rows) {
    const by = new Map();
    for (const r of rows) {
      const key = `${r.client_id ?? "—"}\u0000${r.priority ?? "—"}`;
      const c = by.get(key) ?? {client: r.client_id ?? "—", priority: r.priority ?? "—", n: 0,
        waits: [], loads: 0};
      c.n += 1;
      if (r.queue_wait_s !== null && r.queue_wait_s !== undefined) c.waits.push(r.queue_wait_s);
      c.loads += r.load_wait_s || 0;
      by.set(key, c);
    }
    let table = $("#client-waits");
    if (!table) {
      table = h("table", {id: "client-waits"}, h("caption", {}, "Waits by client"),
        h("thead", {}, h("tr", {}, ...["Client", "Priority", "Requests", "Mean wait",
          "Longest wait", "Mean of it loading"].map((th) => h("th", {scope: "col"}, th)))),
        h("tbody"));
      $("#requests-summary").after(h("div", {class: "scroll"}, table));
    }
    const secs = (v) => `${v.toFixed(2)} s`;
    const body = [...by.values()].sort((a, b) => String(a.priority).localeCompare(String(b.priority))
      || a.client.localeCompare(b.client)).map((c) => h("tr", {"data-client": c.client},
      h("td", {}, c.client), h("td", {}, c.priority), h("td", {}, c.n),
      h("td", {}, c.waits.length ? secs(c.waits.reduce((a, b) => a + b, 0) / c.waits.length) : "—"),
      h("td", {}, c.waits.length ? secs(Math.max(...c.waits)) : "—"), h("td", {}, secs(c.loads / c.n))));
    table.querySelector("tbody").replaceChildren(...(body.length ? body
      : [h("tr", {}, h("td", {colspan: 6, class: "empty"}, "No requests."))]));
  }

  async function readRequests() {
    const filter = requestFilter();
    const query = new URLSearchParams({limit: REQUEST_ROWS, model: filter.model, client: filter.client});
    try {
      const answer = await api("GET", `/api/v1/requests?${query}`);
      const text = JSON.stringify([answer.requests, answer.trace_url, filter]);
      if (text === last.requestsText) return;  // unchanged: no redraw
      last.requestsText = text;
      last.traceUrl = answer.trace_url || null;
      last.requests = answer.requests || [];
      renderRequests(last.requests, requestFilter());
    } catch (err) {
      if (routeMissing(err, "#requests-summary", "#request-table tbody",
        "no request log on this server")) last.requests = last.requestsText = null;
    }
  }

  async function readBoth() {
    if (reading) return;
    reading = true;
    lastRead = Date.now();
    try {
      await Promise.all([readHistory(), readRequests()]);
    } finally {
      reading = false;
    }
  }

  /** Called on each event: one read for a burst, at most every EVENT_GAP_MS. */
  function onEvent() {
    if (eventTimer) return;
    eventTimer = setTimeout(() => { eventTimer = null; readBoth(); },
      Math.max(0, lastRead + EVENT_GAP_MS - Date.now()));
  }

  let filterTimer = null;
  const onFilter = () => {
    if (last.requests) renderRequests(last.requests, requestFilter());  // at once, from what we have
    clearTimeout(filterTimer);
    filterTimer = setTimeout(readRequests, 250);
  };
  $("#request-model").addEventListener("input", onFilter);
  $("#request-client").addEventListener("input", onFilter);
  readBoth();
  setInterval(readBoth, READ_EVERY_MS);
  return {onEvent, refresh: readBoth};
}
