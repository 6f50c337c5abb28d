// model-boss dashboard: the Usage panel. What each key used, from the ledger (GET
// /api/v1/usage): a table per key and model with a totals row; bars of GPU-seconds and tokens
// per key, per day over the last 30 days or per hour today; and the keys themselves (GET
// /api/v1/keys) where the page's key is an admin's. A user key sees its own usage only: the
// server answers it no other rows, and its 401 or 403 from the key list asks for no key.
// Days and hours are UTC, as the ledger counts them.

import {svg} from "/ui/timeline.js";

const READ_EVERY_MS = 15000;
const HOUR_MS = 3600 * 1000;
const DAY_MS = 24 * HOUR_MS;
const W = 720;           // the charts' user units; the SVG stretches to the panel's width
const H = 140;
const PALETTE = 8;       // --series-0 … --series-7 in dashboard.css
const PERIODS = {
  today: {bucket: "hour", words: "today", per: "per hour today"},
  month: {bucket: "day", words: "in the last 30 days", per: "per day, the last 30 days", days: 30},
};

// Number formats: counts grouped, seconds to a sensible precision, big figures compact.
const whole = new Intl.NumberFormat(undefined, {maximumFractionDigits: 0});
const compact = new Intl.NumberFormat(undefined, {notation: "compact", maximumFractionDigits: 1});
const fixed = [2, 1, 0].map((digits) => new Intl.NumberFormat(undefined,
  {minimumFractionDigits: digits, maximumFractionDigits: digits}));
const count = (n) => whole.format(n || 0);
const big = (n) => ((n || 0) < 100000 ? whole.format(n || 0) : compact.format(n));
function seconds(v) {
  if (!v) return "0";
  return fixed[v < 10 ? 0 : v < 100 ? 1 : 2].format(v);
}

const COLUMNS = [
  {field: "requests", label: "Requests", fmt: count},
  {field: "prompt_tokens", label: "Prompt tokens", fmt: count},
  {field: "completion_tokens", label: "Completion tokens", fmt: count},
  {field: "cached_tokens", label: "Cached tokens", fmt: count},
  {field: "images", label: "Images", fmt: count},
  {field: "audio_seconds", label: "Audio seconds", fmt: seconds},
  {field: "gpu_seconds", label: "GPU-seconds", fmt: seconds},
  {field: "vram_mb_seconds", label: "VRAM MB·s", fmt: big},
];
const tokensOf = (row) => (row.prompt_tokens || 0) + (row.completion_tokens || 0);
const CHARTS = [
  {chart: "gpu_seconds", title: "GPU-seconds", value: (row) => row.gpu_seconds || 0, fmt: seconds},
  {chart: "tokens", title: "Tokens (prompt and completion)", value: tokensOf, fmt: count},
];
const keyLabel = (key) => key || "(no key)";  // a server without keys books every row to ""

/** The start of each bucket of the period, as the ledger names it ('YYYY-MM-DD' or
 *  'YYYY-MM-DDTHH:00Z'), from the answer's bounds; any bucket the rows name is kept too. */
function buckets(kind, from, to, rows) {
  const names = new Set();
  const start = Date.parse(from);
  if (kind === "day") {
    for (let t = start; t < Date.parse(to); t += DAY_MS) names.add(new Date(t).toISOString().slice(0, 10));
  } else {  // today: every hour of the day, the ones still to come empty
    for (let t = start; t < start + DAY_MS; t += HOUR_MS) names.add(`${new Date(t).toISOString().slice(0, 13)}:00Z`);
  }
  for (const row of rows) names.add(row[kind]);
  return [...names].sort();
}

function bucketLabel(kind, name) {
  if (kind === "hour") return `${name.slice(11, 16)} UTC`;
  return new Date(`${name}T00:00:00Z`).toLocaleDateString(undefined,
    {month: "short", day: "numeric", timeZone: "UTC"});
}

function utcDay(ms) {
  return new Date(ms).toISOString().slice(0, 10);
}

function when(iso) {
  return iso ? iso.replace("T", " ").replace(/:\d\dZ$/, " UTC") : "";
}

function keyState(key) {
  if (key.revoked_at) return {state: "revoked", text: `revoked ${when(key.revoked_at)}`};
  if (key.expires_at && Date.parse(key.expires_at) <= Date.now()) {
    return {state: "expired", text: `expired ${when(key.expires_at)}`};
  }
  if (key.expires_at) return {state: "active", text: `active, expires ${when(key.expires_at)}`};
  return {state: "active", text: "active"};
}

function sum(rows, field) {
  return rows.reduce((total, row) => total + (row[field] || 0), 0);
}

export function startUsage({api, h, $, authHeaders, fmtDuration}) {
  const el = {
    section: $("#usage"), key: $("#usage-key"), summary: $("#usage-summary"),
    table: $("#usage-table"), charts: $("#usage-charts"), keys: $("#usage-keys"),
    keysSummary: $("#usage-keys-summary"), keysBox: $("#usage-keys-box"),
  };
  const chosen = {period: "today", key: ""};
  const colours = new Map();  // key -> palette slot, kept for the page's life
  let shownText = null;
  let reading = false;
  let again = false;

  const colourOf = (key) => {
    if (!colours.has(key)) colours.set(key, colours.size % PALETTE);
    return `var(--series-${colours.get(key)})`;
  };

  // ------------------------------------------------------------ reading

  function usageQuery(groups, key = chosen.key) {
    const query = new URLSearchParams({group_by: groups, format: "json"});
    const days = PERIODS[chosen.period].days;
    if (days) query.set("from", utcDay(Date.now() - (days - 1) * DAY_MS));  // today among them
    if (key) query.set("key", key);
    return `/api/v1/usage?${query}`;
  }

  /** The key list where this page's key is an admin's; null where it is refused (a user
   *  key: its own usage only), or the server has no key API. Never asks for a key. */
  async function readKeys() {
    const response = await fetch("/api/v1/keys", {headers: authHeaders(), cache: "no-store"});
    if (response.ok) return (await response.json()).keys || [];
    if ([401, 403, 404, 405].includes(response.status)) return null;
    throw new Error(`the key list answered HTTP ${response.status}`);
  }

  async function read() {
    if (reading) { again = true; return; }
    reading = true;
    const asked = {...chosen};
    const bucket = PERIODS[asked.period].bucket;
    try {
      // the key list tells every key's spend, whichever key the table shows
      const [keys, table, series, perKey] = await Promise.all([
        readKeys(), api("GET", usageQuery("key,model")), api("GET", usageQuery(`key,${bucket}`)),
        api("GET", usageQuery("key", ""))]);
      if (asked.period !== chosen.period || asked.key !== chosen.key) return;  // read again below
      // ``to`` is now: only its hour can move a bucket
      const text = JSON.stringify([asked, keys, table.rows, series.rows, series.from,
        series.to.slice(0, 13), perKey.rows]);
      if (text === shownText) return;  // unchanged: no redraw
      shownText = text;
      render(asked, keys, table, series, perKey.rows || []);
    } catch (err) {
      shownText = null;
      if (err.status === 404 || err.status === 405) {
        el.summary.textContent = "no usage ledger on this server";
      } else if (err.status !== 401) {  // the key dialog says 401
        el.summary.textContent = `Could not read the usage: ${err.message}`;
      }
    } finally {
      reading = false;
      if (again || asked.period !== chosen.period || asked.key !== chosen.key) {
        again = false;
        read();
      }
    }
  }

  // ------------------------------------------------------------ drawing

  function render(asked, keys, table, series, perKey) {
    const period = PERIODS[asked.period];
    const rows = table.rows || [];
    // colours in name order the first time, so they do not hang on which key spent first
    for (const name of [...new Set([...(keys || []).map((k) => k.name), ...rows.map((r) => r.key)])].sort()) {
      colourOf(name);
    }
    renderKeyChoice(keys, rows);
    const who = keys === null ? "Your key's own usage" : asked.key ? `Key ${keyLabel(asked.key)}` : "Every key";
    el.summary.textContent = rows.length
      ? `${who} ${period.words}: ${count(sum(rows, "requests"))} requests · ` +
        `${count(sum(rows, "prompt_tokens") + sum(rows, "completion_tokens"))} tokens · ` +
        `${seconds(sum(rows, "gpu_seconds"))} GPU-seconds · days and hours in UTC`
      : `No usage ${period.words}${asked.key ? ` by key ${keyLabel(asked.key)}` : ""}.`;
    renderTable(rows, period);
    renderCharts(period, series, rows.length > 0);
    renderKeys(keys, perKey, period);
  }

  function renderKeyChoice(keys, rows) {
    el.key.closest("label").hidden = keys === null;  // a user key has only its own to pick
    const names = [...new Set([...(keys || []).map((k) => k.name), ...rows.map((r) => r.key)])].sort();
    if (chosen.key && !names.includes(chosen.key)) names.push(chosen.key);
    const same = [...el.key.options].slice(1).map((o) => o.value).join("\n") === names.join("\n");
    if (same) return;  // rebuilt only when the keys change: an open picker stays open
    el.key.replaceChildren(h("option", {value: ""}, "every key"),
      ...names.map((name) => h("option", {value: name, selected: name === chosen.key}, keyLabel(name))));
  }

  function numberCells(row) {
    return COLUMNS.map(({field, fmt}) => {
      const value = row[field] || 0;
      const long = field.endsWith("seconds") && value >= 60 ? fmtDuration(value) : null;
      return h("td", {class: value ? "num" : "num zero", "data-field": field, "data-value": value,
        title: long}, fmt(value));
    });
  }

  function renderTable(rows, period) {
    const body = rows.map((row) => h("tr", {"data-key": row.key, "data-model": row.model},
      h("th", {scope: "row"}, h("i", {class: "swatch", style: `background:${colourOf(row.key)}`}),
        keyLabel(row.key)),
      h("td", {}, row.model), numberCells(row)));
    el.table.tBodies[0].replaceChildren(...(body.length ? body
      : [h("tr", {}, h("td", {colspan: COLUMNS.length + 2, class: "empty"}, `No usage ${period.words}.`))]));
    const totals = Object.fromEntries(COLUMNS.map(({field}) => [field, sum(rows, field)]));
    el.table.tFoot.replaceChildren(...(rows.length > 1 ? [h("tr", {"data-total": ""},
      h("th", {scope: "row", colspan: 2}, "Total"), numberCells(totals))] : []));
  }

  function renderCharts(period, series, any) {
    if (!any) { el.charts.replaceChildren(); return; }
    const kind = period.bucket;
    const rows = series.rows || [];
    const names = buckets(kind, series.from, series.to, rows);
    const keys = [...new Set(rows.map((r) => r.key))].sort();
    el.charts.replaceChildren(...CHARTS.map((c) => barChart(c, kind, names, keys, rows)));
  }

  /** Stacked bars, one per bucket, a layer per key (in name order, bottom first). */
  function barChart({chart, title, value, fmt}, kind, names, keys, rows) {
    const at = new Map();  // "bucket\0key" -> value
    for (const row of rows) at.set(`${row[kind]}\u0000${row.key}`, value(row));
    const totals = names.map((name) => keys.reduce((s, key) => s + (at.get(`${name}\u0000${key}`) || 0), 0));
    const max = Math.max(...totals, 0) || 1;
    const slot = W / names.length;
    const width = Math.max(1, slot * 0.72);
    const y = (v) => (v / max) * (H - 4);  // a little room at the top
    const bars = names.map((name, i) => {
      let base = H;
      const x = (i * slot + (slot - width) / 2).toFixed(2);
      const label = bucketLabel(kind, name);
      return svg("g", {"data-bucket": name}, keys.map((key) => {
        const v = at.get(`${name}\u0000${key}`) || 0;
        if (!v) return null;
        const tall = Math.max(1, y(v));  // the smallest still shows
        base -= tall;
        return svg("rect", {class: "usage-bar", "data-key": key, "data-value": v, x, width: width.toFixed(2),
          y: base.toFixed(2), height: tall.toFixed(2), style: `fill:${colourOf(key)}`},
        svg("title", {}, `${label} · ${keyLabel(key)}: ${fmt(v)}`));
      }));
    });
    const grid = [0.5, 1].map((f) => svg("line", {class: "gridline", x1: 0, x2: W,
      y1: (H - f * (H - 4)).toFixed(2), y2: (H - f * (H - 4)).toFixed(2)}));
    const peak = Math.max(...totals, 0);
    const per = kind === "day" ? "per day" : "per hour";
    const legend = keys.map((key) => h("li", {"data-key": key},
      h("i", {style: `background:${colourOf(key)}`}),
      `${keyLabel(key)} ${fmt(rows.filter((r) => r.key === key).reduce((s, r) => s + value(r), 0))}`));
    const middle = names[Math.floor((names.length - 1) / 2)];
    return h("figure", {class: "chart", "data-chart": chart},
      h("h3", {}, `${title} ${per} by key (peak ${fmt(peak)})`),
      svg("svg", {viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", class: "bars", role: "img",
        "aria-label": `${title} ${per} by key, ${names.length} ${kind}s: ` +
          keys.map((key) => keyLabel(key)).join(", ")}, grid, bars),
      h("div", {class: "axis"}, h("span", {}, bucketLabel(kind, names[0])),
        h("span", {}, bucketLabel(kind, middle)), h("span", {}, bucketLabel(kind, names[names.length - 1]))),
      h("ul", {class: "legend"}, legend));
  }

  const spent = (field, value, fmt) => h("td", {class: value ? "num" : "num zero",
    "data-field": field, "data-value": value}, fmt(value));

  function renderKeys(keys, rows, period) {
    el.keysBox.hidden = keys === null;
    if (keys === null) {
      el.keysSummary.textContent = "The key list and every key's usage need an admin key; " +
        "this page's key sees its own.";
      return;
    }
    el.keysSummary.textContent = keys.length
      ? `${keys.length} key${keys.length === 1 ? "" : "s"}; requests, tokens and GPU-seconds ${period.words}.`
      : "No keys: this server takes requests without one.";
    const body = keys.map((key) => {
      const own = rows.filter((r) => r.key === key.name);
      const {state, text} = keyState(key);
      return h("tr", {"data-key": key.name, "data-state": state},
        h("th", {scope: "row"}, h("i", {class: "swatch", style: `background:${colourOf(key.name)}`}), key.name),
        h("td", {class: "prefix"}, key.prefix || "—"),
        h("td", {}, key.admin ? "admin" : "user"),
        h("td", {}, key.models?.length ? key.models.join(", ") : "all"),
        h("td", {class: "key-state"}, text),
        spent("requests", sum(own, "requests"), count),
        spent("tokens", own.reduce((s, r) => s + tokensOf(r), 0), count),
        spent("gpu_seconds", sum(own, "gpu_seconds"), seconds));
    });
    el.keys.tBodies[0].replaceChildren(...(body.length ? body
      : [h("tr", {}, h("td", {colspan: 8, class: "empty"}, "No keys."))]));
  }

  // ------------------------------------------------------------ controls

  function choosePeriod(period) {
    chosen.period = period;
    for (const button of el.section.querySelectorAll("[data-period]")) {
      button.setAttribute("aria-pressed", String(button.dataset.period === period));
    }
    read();
  }

  for (const button of el.section.querySelectorAll("[data-period]")) {
    button.addEventListener("click", () => choosePeriod(button.dataset.period));
  }
  el.key.addEventListener("change", () => { chosen.key = el.key.value; read(); });
  $("#usage-refresh").addEventListener("click", () => { shownText = null; read(); });
  read();
  setInterval(() => { if (!document.hidden) read(); }, READ_EVERY_MS);
  return {refresh: read};
}
