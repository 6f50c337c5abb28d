// model-boss dashboard: plain modern JS, no build step, no libraries.
// The page comes with the first snapshot (status, queue, config) where the caller may read it,
// and draws every panel from it before the first paint; else from its first reads, together.
// Live from GET /api/v1/events (read with fetch streaming, so the key can ride in a header);
// each burst of events re-reads /api/v1/status at most a few times a second.

import {startTimePanels} from "/ui/timeline.js";
import {startPlayground} from "/ui/playground.js";
import {startUsage} from "/ui/usage.js";
import {startJobs} from "/ui/jobs.js";

const KEY_STORE = "model-boss-admin-key";    // sessionStorage: this tab only
const THEME_STORE = "model-boss-theme";      // localStorage: not a secret
const MAX_EVENTS = 300;
const REFRESH_GAP_MS = 300;                  // at most ~3 status reads a second
const BACKSTOP_MS = 5000;                    // arrivals and outside leases come without events
const PROGRESS_STAGES = ["leasing", "starting", "loading", "warming", "ready", "failed"];

const $ = (selector) => document.querySelector(selector);
const state = {
  status: null, fetchedAt: 0, skew: 0, config: null, queue: null, queueRoute: null,
  events: [], eventTypes: new Set(), progress: new Map(), busy: new Set(), lastSeq: 0,
};
const keyEvents = new EventTarget();
let timePanels = null;  // the Timeline and Requests panels (timeline.js)
let usagePanel = null;  // the Usage panel (usage.js)
let jobsPanel = null;   // the Jobs panel (jobs.js)

// ---------------------------------------------------------------- small helpers

function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "class") el.className = value;
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

/** Replace a container's children, keeping keyboard focus on the same control. */
function replaceKeepingFocus(container, nodes) {
  const active = document.activeElement;
  const key = container.contains(active) ? active?.dataset?.focus : null;
  container.replaceChildren(...nodes);
  if (key) container.querySelector(`[data-focus="${CSS.escape(key)}"]`)?.focus({preventScroll: true});
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const serverNow = () => Date.now() / 1000 + state.skew;

function fmtMB(mb) {
  if (mb === null || mb === undefined) return "—";
  return mb >= 1024 ? `${(mb / 1024).toFixed(1)} GB` : `${Math.round(mb)} MB`;
}

function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) return "—";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

const fmtClock = (ts) => new Date(ts * 1000).toLocaleTimeString([], {hour12: false});
const words = (camel) => camel.replace(/([a-z])([A-Z])/g, "$1 $2").toLowerCase();

function notice(text, ok = false) {
  const el = $("#notice");
  el.textContent = text;
  el.classList.toggle("ok", ok);
  el.hidden = !text;
  clearTimeout(notice.timer);
  if (text) notice.timer = setTimeout(() => { el.hidden = true; }, ok ? 4000 : 10000);
}

function setLive(kind, text) {
  const el = $("#live");
  el.dataset.state = kind;
  el.textContent = text;
}

// ---------------------------------------------------------------- the API and the key

const storedKey = () => sessionStorage.getItem(KEY_STORE) || "";
const authHeaders = () => (storedKey() ? {authorization: `Bearer ${storedKey()}`} : {});

class ApiError extends Error {
  constructor(status, body) {
    super(body?.error?.message || `HTTP ${status}`);
    this.status = status;
    this.code = body?.error?.code;
  }
}

let keyPrompt = null;

const keyReason = () => (storedKey() ? "The key was refused. Enter the admin key."
  : "This server asks for a key. It is kept in this browser tab only (sessionStorage).");

/** Ask for the key once, however many requests were refused. Resolves true when one is set. */
function askKey(reason) {
  if (keyPrompt) return keyPrompt;
  keyPrompt = new Promise((resolve) => {
    const dialog = $("#key-dialog");
    const input = $("#key-input");
    $("#key-why").textContent = reason;
    input.value = "";
    dialog.returnValue = "";
    dialog.addEventListener("close", () => {
      keyPrompt = null;
      if (dialog.returnValue === "save" && input.value) {
        sessionStorage.setItem(KEY_STORE, input.value);
        keyEvents.dispatchEvent(new Event("key"));
        resolve(true);
        return;
      }
      if (dialog.returnValue === "forget") sessionStorage.removeItem(KEY_STORE);
      resolve(false);
    }, {once: true});
    dialog.showModal();
    input.focus();
  });
  return keyPrompt;
}

const keySet = () => new Promise((resolve) => keyEvents.addEventListener("key", resolve, {once: true}));

async function api(method, path, body) {
  for (;;) {
    const sentWith = storedKey();
    const init = {method, headers: {...authHeaders()}, cache: "no-store"};
    if (body !== undefined) {
      init.headers["content-type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(path, init);
    if (response.status === 401) {
      if (storedKey() !== sentWith) continue;  // a newer key came while it was on its way
      setLive("locked", "key needed");
      if (await askKey(keyReason())) continue;
      throw new ApiError(401, {error: {message: "no key given", code: "invalid_api_key"}});
    }
    const data = await response.json().catch(() => null);
    if (!response.ok) throw new ApiError(response.status, data);
    return data;
  }
}

// ---------------------------------------------------------------- reading state

let refreshTimer = null;
let refreshing = false;
let refreshAgain = false;
let lastRefresh = 0;

/** Coalesce bursts of events into one status read, at most every REFRESH_GAP_MS. */
function scheduleRefresh() {
  if (refreshing) { refreshAgain = true; return; }
  if (refreshTimer) return;
  const wait = Math.max(0, lastRefresh + REFRESH_GAP_MS - Date.now());
  refreshTimer = setTimeout(async () => {
    refreshTimer = null;
    refreshing = true;
    lastRefresh = Date.now();
    try {
      await refresh();
    } catch (err) {
      if (err.status !== 401) notice(`Could not read the status: ${err.message}`);
    } finally {
      refreshing = false;
      if (refreshAgain) { refreshAgain = false; scheduleRefresh(); }
    }
  }, wait);
}

/** Read, then draw: nothing is shown from a status whose queue and config are still on
 *  their way, so no panel is drawn while another waits empty. */
async function refresh() {
  const status = await api("GET", "/api/v1/status");
  const queue = await readQueue(status);
  const config = state.config === null ? await api("GET", "/api/v1/config") : null;
  takeStatus(status);
  state.queue = queue;
  if (config !== null) {  // only when read anew: a redraw would undo edits in the form
    state.config = config;
    renderConfig();
  }
  render();
}

function takeStatus(status) {
  state.status = status;
  state.fetchedAt = Date.now() / 1000;
  state.skew = typeof status.time === "number" ? status.time - state.fetchedAt : 0;
}

/** The first snapshot the server put in the page: only for a caller whose key the API
 *  takes, so a page that asks for a key has none and reads the API once it has one. */
function embeddedSnapshot() {
  const el = document.getElementById("snapshot");
  if (!el) return null;
  try {
    return JSON.parse(el.textContent);
  } catch (err) {
    console.debug("unreadable snapshot", err);
    return null;
  }
}

/** Draw every panel from the embedded snapshot, synchronously: before the first paint. */
function renderSnapshot(snapshot) {
  takeStatus(snapshot.status);
  state.queue = takeQueuePage(snapshot.queue);
  state.config = snapshot.config;
  renderConfig();
  render();
}

const QUEUE_ROWS = 100;  // the first rows of the queue shown; the summary counts them all

/** GET /api/v1/queue where the server has it; else the waiting list inside the status. */
async function readQueue(status) {
  if (state.queueRoute !== false) {
    try {
      return takeQueuePage(await api("GET", `/api/v1/queue?limit=${QUEUE_ROWS}`));
    } catch (err) {
      if (err.status !== 404 && err.status !== 405) throw err;
      state.queueRoute = false;
    }
  }
  state.queueTotal = status.queue?.depth;
  return (status.queue?.waiting || []).map((w, i) => ({...w, position: i + 1}));
}

function takeQueuePage(page) {
  state.queueRoute = true;
  state.queueTotal = page.total;
  return page.waiting;
}

async function readConfig() {
  state.config = await api("GET", "/api/v1/config");
  renderConfig();
}

// ---------------------------------------------------------------- the events stream

function onEvent(event) {
  if (typeof event.seq === "number") state.lastSeq = Math.max(state.lastSeq, event.seq);
  state.events.push(event);
  if (state.events.length > MAX_EVENTS) state.events.splice(0, state.events.length - MAX_EVENTS);
  if (!state.eventTypes.has(event.type)) {
    state.eventTypes.add(event.type);
    renderEventTypes();
  }
  if (event.type === "load_progress" && PROGRESS_STAGES.includes(event.stage)) {
    state.progress.set(event.model, event);
  }
  if (event.type === "config_changed" && !$("#config-form").contains(document.activeElement)) {
    readConfig().catch(() => {});
  }
  scheduleEventRender();
  scheduleRefresh();
  timePanels?.onEvent();
  jobsPanel?.onEvent();
}

let eventRenderQueued = false;
function scheduleEventRender() {
  if (eventRenderQueued) return;
  eventRenderQueued = true;
  requestAnimationFrame(() => { eventRenderQueued = false; renderEvents(); renderModels(); });
}

/** SSE over fetch: EventSource cannot send the Authorization header. Reconnects with
 *  ?since=<last seq>, so nothing is missed or shown twice. */
async function streamEvents() {
  let delay = 1000;
  for (;;) {
    try {
      const sentWith = storedKey();
      const response = await fetch(`/api/v1/events?since=${state.lastSeq}`, {
        headers: {...authHeaders(), accept: "text/event-stream"}, cache: "no-store"});
      if (response.status === 401) {
        if (storedKey() !== sentWith) continue;  // refused an older key: try the new one
        setLive("locked", "key needed");
        if (!(await askKey(keyReason()))) await keySet();
        continue;
      }
      if (!response.ok || !response.body) throw new Error(`HTTP ${response.status}`);
      setLive("live", "live");
      delay = 1000;
      scheduleRefresh();
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        buffer += value.replace(/\r\n/g, "\n");
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          const data = block.split("\n").filter((l) => l.startsWith("data:"))
            .map((l) => l.slice(5).trimStart()).join("\n");
          if (data) onEvent(JSON.parse(data));
        }
      }
    } catch (err) {
      console.debug("events stream dropped", err);
    }
    setLive("reconnecting", "reconnecting…");
    await sleep(delay);
    delay = Math.min(delay * 2, 5000);
  }
}

// ---------------------------------------------------------------- actions

const ACTIONS = {
  load: {label: "Load", path: "load", done: "loaded"},
  unload: {label: "Unload", path: "unload", done: "unloaded"},
  offload: {label: "Offload", path: "offload", done: "offloaded to CPU RAM"},
  pin: {label: "Pin", path: "pin", done: "pinned"},
  unpin: {label: "Unpin", path: "unpin", done: "unpinned"},
};

async function act(model, action) {
  const key = `${model}:${action}`;
  if (state.busy.has(key)) return;
  state.busy.add(key);
  renderModels();
  try {
    const answer = await api("POST", `/api/v1/models/${encodeURIComponent(model)}/${ACTIONS[action].path}`);
    if (answer?.unloaded === false || answer?.offloaded === false) notice(`${model}: nothing to do`, true);
    else notice(`${model} ${ACTIONS[action].done}`, true);
  } catch (err) {
    notice(`${ACTIONS[action].label} ${model} failed: ${err.message}`);
  } finally {
    state.busy.delete(key);
    scheduleRefresh();
    renderModels();
  }
}

function actionButton(model, action, enabled) {
  const key = `${model}:${action}`;
  const busy = state.busy.has(key);
  // pin and unpin are one toggle: focus stays on it when it flips
  const focusKey = action === "unpin" ? `${model}:pin` : key;
  return h("button", {
    type: "button", class: action === "load" ? null : "secondary", "data-focus": focusKey,
    "data-action": action, "aria-label": `${ACTIONS[action].label} ${model}`,
    "aria-busy": busy ? "true" : null, disabled: !enabled,
    onclick: () => act(model, action),
  }, busy ? `${ACTIONS[action].label}…` : ACTIONS[action].label);
}

// ---------------------------------------------------------------- rendering

function render() {
  renderMeta();
  renderGpus();
  renderModels();
  renderQueue();
  renderSessions();
}

function renderMeta() {
  const s = state.status;
  const models = s.models?.length ?? 0;
  $("#meta").textContent = `up ${fmtDuration(s.uptime_s)} · lease store ${s.lease_store} · ` +
    `${models} model${models === 1 ? "" : "s"}` +
    (s.cluster?.host_id ? ` · cluster member ${s.cluster.host_id}` : "");
  // e.g. an open address without keys; set only when it changes (a screen reader says it)
  const warnings = (s.warnings || []).map((w) => `Warning: ${w}`).join(" · ");
  const banner = $("#warnings");
  banner.hidden = !warnings;
  if (banner.textContent !== warnings) banner.textContent = warnings;
}

/** Whose lease is this: a model-boss slot's (its key: the model, or "id#n" for replica n)
 * or an outside holder's. */
function leaseOwners() {
  const bySlot = new Map();
  for (const slot of state.status.slots) if (slot.lease) bySlot.set(slot.lease.id, slot.key || slot.model);
  return bySlot;
}

function renderGpus() {
  const s = state.status;
  const bySlot = leaseOwners();
  const total = s.gpus.reduce((sum, g) => sum + g.capacity_mb, 0);
  const leased = s.gpus.reduce((sum, g) => sum + g.leased_mb, 0);
  const free = s.gpus.reduce((sum, g) => sum + g.free_mb, 0);
  const sources = [...new Set(s.gpus.map((g) => g.source))];
  $("#gpu-summary").textContent = s.gpus.length === 0 ? "No GPUs: models run on the CPU." :
    `${s.gpus.length} GPU${s.gpus.length === 1 ? "" : "s"} · ${fmtMB(total)} total · ` +
    `${fmtMB(leased)} leased · ${fmtMB(free)} free · inventory: ` +
    sources.map((src) => (src === "declared" ? "declared in settings (simulated)" : src)).join(", ");
  replaceKeepingFocus($("#gpu-list"), s.gpus.map((gpu) => gpuCard(gpu, bySlot)));

  const rows = s.leases.map((lease) => {
    const model = bySlot.get(lease.id);
    return h("tr", {"data-lease": lease.id},
      model ? h("td", {}, "model-boss") : holderCell(lease),
      h("td", {}, lease.kind),
      h("td", {}, model ? model : (lease.note || "outside holder")),
      h("td", {}, Object.entries(lease.allocations).map(([i, mb]) => `${i}: ${fmtMB(mb)}`).join(", ")),
      h("td", {}, lease.priority),
      h("td", {"data-expires": lease.expires_at}, fmtDuration(lease.expires_at - serverNow())));
  });
  $("#lease-table tbody").replaceChildren(
    ...(rows.length ? rows : [h("tr", {}, h("td", {colspan: 6, class: "empty"}, "No leases."))]));
}

/** The name the lease was taken with; where an HTTP caller asked from, unless the name says. */
function holderCell(lease) {
  const from = lease.address && lease.holder !== `http:${lease.address}`
    ? h("span", {class: "address"}, ` from ${lease.address}`) : null;
  return h("td", {}, lease.holder, from);
}

function gpuCard(gpu, bySlot) {
  const segments = [];
  const legend = [];
  for (const lease of state.status.leases) {
    const mb = lease.allocations[String(gpu.index)];
    if (!mb) continue;
    const model = bySlot.get(lease.id);
    const who = model ? model : `${lease.kind}: ${[lease.note, lease.holder].filter(Boolean).join(" · ")}`;
    const cls = model ? "slot" : "outside";
    const width = gpu.capacity_mb ? (100 * mb) / gpu.capacity_mb : 0;
    segments.push(h("span", {class: cls, style: `width:${width.toFixed(2)}%`, title: `${who} ${fmtMB(mb)}`}));
    legend.push(h("li", {}, h("i", {class: cls, style: `background:var(--${model ? "accent" : "bar-outside"})`}),
      `${who} ${fmtMB(mb)}`));
  }
  // capacity not leased and not free: the safety margin, or memory NVML sees used elsewhere
  const reserved = Math.max(0, gpu.capacity_mb - gpu.leased_mb - Math.max(0, gpu.free_mb));
  const pct = (mb) => (gpu.capacity_mb ? (100 * mb) / gpu.capacity_mb : 0).toFixed(2);
  segments.push(h("span", {class: "free", style: `width:${pct(Math.max(0, gpu.free_mb))}%`}));
  legend.push(h("li", {}, h("i", {style: "background:var(--bar-free)"}), `free ${fmtMB(gpu.free_mb)}`));
  if (reserved > 0) {
    legend.push(h("li", {title: "the safety margin, or memory in use outside any lease (NVML)"},
      h("i", {style: "background:var(--bar-bg);border:1px solid var(--border)"}), `reserved ${fmtMB(reserved)}`));
  }
  const source = gpu.source === "declared" ? "declared" : gpu.source;
  return h("article", {class: "card gpu", "data-gpu": gpu.index},
    h("header", {}, h("h3", {}, `GPU ${gpu.index} · ${gpu.name}`),
      h("span", {class: `badge ${source}`, title: source === "declared"
        ? "declared in settings: no NVIDIA GPU was found, workers run on the CPU"
        : "read from NVML"}, source)),
    h("div", {class: "bar", role: "img", "aria-label":
      `GPU ${gpu.index}: ${fmtMB(gpu.leased_mb)} leased of ${fmtMB(gpu.capacity_mb)}, ${fmtMB(gpu.free_mb)} free`},
    segments),
    h("ul", {class: "legend"}, legend),
    h("p", {class: "gpu-totals"}, `${fmtMB(gpu.capacity_mb)} total · ${fmtMB(gpu.leased_mb)} leased · ` +
      `${fmtMB(gpu.free_mb)} free` + (gpu.nvml_free_mb !== null && gpu.nvml_free_mb !== undefined
        ? ` · NVML free ${fmtMB(gpu.nvml_free_mb)}` : "")));
}

/** Every manifest, joined with its slot (replica 1; a manifest never asked for has none
 * yet) and every replica's slot, the first first. */
function modelRows() {
  const s = state.status;
  const slots = new Map();  // model id -> its replicas' slots
  for (const slot of s.slots) slots.set(slot.model, [...(slots.get(slot.model) || []), slot]);
  for (const copies of slots.values()) copies.sort((a, b) => (a.replica ?? 1) - (b.replica ?? 1));
  const queued = new Map();
  for (const w of state.queue || []) queued.set(w.model, (queued.get(w.model) || 0) + 1);
  return s.models.map((m) => {
    const replicas = slots.get(m.base || m.id) || [];  // an adapter runs on its base's workers
    return {...m, slot: replicas[0] || null, replicas, queuedNow: m.queued ?? queued.get(m.id) ?? 0};
  });
}

/** One replica's line: its key, state, the GPU(s) its lease holds and its requests. */
function replicaItem(slot) {
  const st = slot.state || "idle";
  const allocations = Object.entries(slot.lease?.allocations || {});
  const where = allocations.length
    ? allocations.map(([i, mb]) => `GPU ${i} ${fmtMB(mb)}`).join(", ")
    : slot.tier === "cpu" ? "CPU RAM" : "no GPU";
  return h("li", {"data-replica": slot.key || slot.model, "data-state": st},
    h("span", {class: "replica-key"}, slot.key || slot.model), " ",
    h("span", {class: `badge ${st}`, title: "replica state"}, st),
    h("span", {class: "replica-gpus"}, ` ${where}`),
    ` · ${slot.active_requests ?? 0} active`);
}

function placementText(slot) {
  const p = slot?.placement;
  const onGpu = slot?.tier === "gpu" || slot?.state === "loading";  // a load holds its lease
  if (!p || !onGpu) return slot?.tier === "cpu" ? "CPU RAM (offloaded)" : "—";
  const gpus = Object.entries(p.allocations).map(([i, mb]) => `GPU ${i} ${fmtMB(mb)}`).join(", ");
  // the placement's partial offload, else the worker's own split (a manifest's gpu_layers)
  const counted = (x) => x?.gpu_layers !== null && x?.gpu_layers !== undefined;
  const part = counted(p) ? p : counted(slot.processor) ? slot.processor : null;
  const layers = part ? `${part.gpu_layers}/${part.total_layers} layers` : "all layers";
  const split = p.tensor_split?.length ? ` · split ${p.tensor_split.join("/")}` : "";
  // the processor split as `ollama ps` tells it (declared GPUs marked), where the server says
  const label = slot.processor?.label;
  const where = label && label !== "-" ? label : p.share;  // "-": not placed yet (loading)
  return `${gpus} · ${p.kind} · ${layers} on GPU · ${where}${split}`;
}

function keepAliveText(m) {
  const slot = m.slot;
  if (!slot || slot.tier === "disk") return "—";
  if (slot.pinned) return "pinned: stays loaded";
  if (slot.active_requests > 0) return "serving (clock restarts after)";
  if (slot.unload_at === null || slot.unload_at === undefined) return "until evicted";
  return `unloads in ${fmtDuration(slot.unload_at - serverNow())}`;
}

function progressView(m) {
  const p = state.progress.get(m.id);
  const loading = m.slot?.state === "loading";
  // every load ends with ready or failed; that last stage stays a few seconds
  const final = p && (p.stage === "ready" || p.stage === "failed");
  if (p && (!final || serverNow() - p.ts < 5)) {
    const pct = typeof p.fraction === "number" ? Math.round(p.fraction * 100) : null;
    return h("div", {class: `progress ${p.stage}`, "data-stage": p.stage},
      h("div", {}, `${p.stage}${pct !== null ? ` ${pct}%` : ""} · ${(p.elapsed_s ?? 0).toFixed(1)} s` +
        (p.stage === "failed" && p.error ? ` · ${p.error}` : "")),
      h("progress", {max: 100, value: pct ?? undefined, "aria-label": `${m.id} load progress`}));
  }
  if (loading) {
    const started = [...state.events].reverse().find((e) => e.type === "load_started" && e.model === m.id);
    return h("div", {class: "progress", "data-stage": "loading"},
      h("div", {}, started ? `loading · ${fmtDuration(serverNow() - started.ts)}` : "loading"),
      h("progress", {"aria-label": `${m.id} load progress`}));
  }
  return null;
}

function modelCard(m) {
  const slot = m.slot;
  const st = slot?.state || "idle";
  const tier = slot?.tier || "disk";
  const pinned = slot ? slot.pinned : Boolean(m.pin);
  const est = slot?.vram_estimate || m.vram_estimate;
  const copies = m.replicas?.length > 1 ? m.replicas : null;  // one replica: as it always was
  const parallel = copies ? copies.reduce((sum, r) => sum + (r.parallel ?? 1), 0)
    : slot?.parallel ?? m.parallel ?? 1;
  const active = copies ? copies.reduce((sum, r) => sum + (r.active_requests ?? 0), 0)
    : slot?.active_requests ?? 0;
  const canAct = m.available;
  return h("article", {class: "card model", "data-model": m.id, "data-state": st, "aria-label": `model ${m.id}`},
    h("header", {},
      h("h3", {}, m.id),
      h("span", {class: `badge state ${st}`, title: "slot state"}, st),
      h("span", {class: `badge tier ${tier}`, title: "tier: gpu, cpu (RAM) or disk"},
        tier === "gpu" ? "GPU" : tier === "cpu" ? "CPU RAM" : "disk"),
      pinned ? h("span", {class: "badge pinned"}, "pinned") : null,
      m.available ? null : h("span", {class: "badge unavailable"}, "unavailable")),
    progressView(m),
    h("dl", {class: "facts"},
      m.aliases?.length ? [h("dt", {}, "Aliases"), h("dd", {}, m.aliases.join(", "))] : null,
      m.base ? [h("dt", {}, "Adapter on"), h("dd", {class: "base"}, m.base)] : null,
      slot?.adapters?.length && !m.base ? [h("dt", {}, "Adapters"),
        h("dd", {class: "adapters"}, slot.adapters.join(", "))] : null,
      slot?.draft && !m.base ? [h("dt", {}, "Draft"), h("dd", {class: "draft"}, slot.draft.split("/").pop())] : null,
      m.source ? [h("dt", {}, "Source"), h("dd", {class: "source"}, m.source)] : null,
      h("dt", {}, "Kind"), h("dd", {}, [m.category || slot?.category, m.backend || slot?.backend].filter(Boolean).join(" · ") || "—"),
      copies ? [h("dt", {}, "Replicas"), h("dd", {class: "replicas"}, `${copies.length} replicas`,
        h("ul", {class: "replica-list"}, copies.map(replicaItem)))] : null,
      h("dt", {}, "Placement"), h("dd", {class: "placement"}, placementText(slot)),
      h("dt", {}, "VRAM"), h("dd", {class: "vram"},
        est ? `est. ${fmtMB(est.mb)} (${est.rung})` : "est. —",
        slot?.measured_mb ? ` · measured ${fmtMB(slot.measured_mb)}` : ""),
      h("dt", {}, "Requests"), h("dd", {class: "requests"},
        `${active} active · ${active}/${parallel} parallel slots · ${m.queuedNow} queued`),
      h("dt", {}, "Keep-alive"), h("dd", {class: "keep-alive"}, keepAliveText(m)),
      h("dt", {}, "Last load"), h("dd", {}, slot?.last_load_s
        ? `${slot.last_load_s.toFixed(1)} s${slot.loaded_at ? ` at ${fmtClock(slot.loaded_at)}` : ""} · ${slot.loads} load${slot.loads === 1 ? "" : "s"}`
        : "never"),
      slot?.prompt_cache?.files ? [h("dt", {}, "Prompt cache"), h("dd", {class: "prompt-cache"},
        `${slot.prompt_cache.files} saved · ${fmtMB(slot.prompt_cache.mb)} · ` +
        `${slot.prompt_cache.restores} restored (${slot.prompt_cache.restored_tokens} tokens)`)] : null,
      slot?.last_error ? [h("dt", {}, "Last error"), h("dd", {class: "error"}, slot.last_error)] : null,
      m.available ? null : [h("dt", {}, "Why"), h("dd", {}, m.unavailable_reason || "unavailable")]),
    h("div", {class: "actions"},
      actionButton(m.id, "load", canAct && st !== "ready"),
      actionButton(m.id, "unload", tier !== "disk" || st === "loading"),
      actionButton(m.id, "offload", canAct && tier === "gpu"),
      pinned ? actionButton(m.id, "unpin", true) : actionButton(m.id, "pin", true)));
}

function renderModels() {
  if (!state.status) return;
  const errors = state.status.catalog?.errors || [];
  const banner = $("#catalog-errors");
  banner.hidden = !errors.length;
  banner.textContent = errors.length ? `The last reload kept the previous models: ${errors.join("; ")}` : "";
  const pulls = state.status.pulls || [];
  const downloads = $("#downloads");
  downloads.hidden = !pulls.length;
  downloads.textContent = pulls.length ? "Downloads: " + pulls.map((p) => p.total
    ? `${p.source} ${fmtMB(p.completed / 1048576)} of ${fmtMB(p.total / 1048576)}`
    : `${p.source} ${p.status}`).join(" · ") : "";
  replaceKeepingFocus($("#model-list"), modelRows().map(modelCard));
}

function renderQueue() {
  const waiting = state.queue || [];
  const q = state.status.queue || {};
  const total = state.queueTotal ?? waiting.length;
  const shown = total > waiting.length ? ` (the first ${waiting.length} shown)` : "";
  $("#queue-summary").textContent = `${total} waiting${shown} · ${q.granted_total ?? 0} granted since start` +
    (state.queueRoute === false ? " · (queue listing from the status document)" : "");
  const elapsed = Date.now() / 1000 - state.fetchedAt;
  const rows = waiting.map((w, i) => h("tr", {"data-model": w.model},
    h("td", {}, w.position ?? i + 1), h("td", {}, w.model), h("td", {}, w.priority),
    h("td", {}, w.client_id ?? "—"), h("td", {}, w.endpoint || "—"),
    h("td", {}, fmtDuration((w.waited_s ?? 0) + elapsed))));
  $("#queue-table tbody").replaceChildren(
    ...(rows.length ? rows : [h("tr", {}, h("td", {colspan: 6, class: "empty"}, "Nothing waiting."))]));
}

/** Open /v1/realtime sessions, where the status document lists them (a server without them
 * shows no such table). */
function renderSessions() {
  const sessions = state.status.realtime_sessions;
  $("#sessions-box").hidden = !Array.isArray(sessions);
  if (!Array.isArray(sessions)) return;
  const rows = sessions.map((s) => h("tr", {"data-session": s.id},
    h("td", {}, s.id), h("td", {}, s.model), h("td", {}, s.key ?? "—"), h("td", {}, s.priority ?? "—"),
    h("td", {class: "num"}, typeof s.opened_at === "number" ? fmtDuration(serverNow() - s.opened_at) : "—"),
    h("td", {class: "num"}, s.turns ?? 0)));
  $("#session-table tbody").replaceChildren(
    ...(rows.length ? rows : [h("tr", {}, h("td", {colspan: 6, class: "empty"}, "No open sessions."))]));
}

function renderEventTypes() {
  const select = $("#event-type");
  const chosen = select.value;
  const types = [...state.eventTypes].sort();
  select.replaceChildren(h("option", {value: ""}, "all"),
    ...types.map((t) => h("option", {value: t, selected: t === chosen}, t)));
}

const EVENT_KEYS = new Set(["seq", "ts", "type", "model"]);

function renderEvents() {
  const type = $("#event-type").value;
  const model = $("#event-model").value.trim().toLowerCase();
  const shown = state.events.filter((e) => (!type || e.type === type) &&
    (!model || String(e.model ?? "").toLowerCase().includes(model))).reverse();
  const rows = shown.map((e) => h("tr", {"data-type": e.type},
    h("td", {}, fmtClock(e.ts)), h("td", {}, e.type), h("td", {}, e.model ?? ""),
    h("td", {class: "details"}, Object.entries(e).filter(([k]) => !EVENT_KEYS.has(k))
      .map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join(" "))));
  $("#event-table tbody").replaceChildren(
    ...(rows.length ? rows : [h("tr", {}, h("td", {colspan: 4, class: "empty"}, "No events."))]));
}

function renderConfig() {
  const fields = Object.entries(state.config || {}).map(([name, value]) => {
    const id = `config-${name}`;
    if (typeof value === "boolean") {
      return h("label", {for: id}, h("input", {type: "checkbox", id, name, checked: value}), words(name));
    }
    return h("label", {for: id}, words(name),
      h("input", {type: typeof value === "number" ? "number" : "text", id, name, value}));
  });
  replaceKeepingFocus($("#config-fields"), fields);
}

async function saveConfig(event) {
  event.preventDefault();
  const patch = {};
  for (const [name, old] of Object.entries(state.config || {})) {
    const input = $("#config-form").elements[name];
    const value = typeof old === "boolean" ? input.checked
      : typeof old === "number" ? Number(input.value) : input.value;
    if (value !== old) patch[name] = value;
  }
  if (Object.keys(patch).length === 0) { notice("Config unchanged.", true); return; }
  try {
    state.config = await api("PUT", "/api/v1/config", patch);
    renderConfig();
    notice("Config saved.", true);
  } catch (err) {
    notice(`Saving the config failed: ${err.message}`);
  }
}

/** Once a second: countdowns and waits move without asking the server. */
function tick() {
  if (!state.status) return;
  for (const cell of document.querySelectorAll("[data-expires]")) {
    cell.textContent = fmtDuration(Number(cell.dataset.expires) - serverNow());
  }
  const rows = new Map(modelRows().map((m) => [m.id, m]));
  for (const card of document.querySelectorAll("article.model")) {
    const m = rows.get(card.dataset.model);
    if (m) card.querySelector(".keep-alive").textContent = keepAliveText(m);
  }
  renderQueue();
  renderSessions();
}

// ---------------------------------------------------------------- theme and start

function applyTheme(theme) {
  if (theme) document.documentElement.dataset.theme = theme;
  const dark = theme ? theme === "dark" : matchMedia("(prefers-color-scheme: dark)").matches;
  const button = $("#theme-button");
  button.setAttribute("aria-pressed", String(dark));
  button.textContent = dark ? "Light theme" : "Dark theme";
}

function start() {
  applyTheme(localStorage.getItem(THEME_STORE));
  $("#theme-button").addEventListener("click", () => {
    const next = $("#theme-button").getAttribute("aria-pressed") === "true" ? "light" : "dark";
    localStorage.setItem(THEME_STORE, next);
    applyTheme(next);
  });
  $("#key-button").addEventListener("click", async () => {
    if (await askKey("Enter the admin key (kept in this browser tab only).")) {
      state.config = null;
      scheduleRefresh();
    }
  });
  $("#config-form").addEventListener("submit", saveConfig);
  $("#event-type").addEventListener("change", renderEvents);
  $("#event-model").addEventListener("input", renderEvents);
  keyEvents.addEventListener("key", () => {
    state.config = null;
    scheduleRefresh();
    usagePanel?.refresh();
    jobsPanel?.refresh();
  });
  const snapshot = embeddedSnapshot();
  if (snapshot) renderSnapshot(snapshot);
  renderEvents();
  scheduleRefresh();
  timePanels = startTimePanels({api, h, fmtMB, fmtClock, fmtDuration, $});
  startPlayground({api, h, $, authHeaders});
  usagePanel = startUsage({api, h, $, authHeaders, fmtDuration});
  jobsPanel = startJobs({api, h, $, authHeaders, serverNow, fmtDuration, notice, replaceKeepingFocus});
  streamEvents();
  setInterval(tick, 1000);
  setInterval(scheduleRefresh, BACKSTOP_MS);
}

start();
