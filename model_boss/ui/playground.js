// model-boss dashboard: the Playground. Pick a model (GET /v1/models) or a task (GET
// /api/v1/tasks) and send it a chat, an image prompt, an audio file or a rerank, through the
// same public routes and with the same key as any client: the key this page keeps.
// Chat streams (fetch + ReadableStream over SSE, so the key rides in a header); Stop aborts.
// Talk holds a spoken conversation with a realtime pipeline (talk.js) until Stop.

import {talk} from "/ui/talk.js";

const MODES = ["chat", "image", "transcription", "rerank", "talk"];
// what a model's category is used for first; the mode can still be changed by hand
const MODE_OF = {llm: "chat", vision: "chat", diffusion: "image", stt: "transcription", rerank: "rerank",
  realtime: "talk"};
// the two buttons' words in each mode (Send's and Stop's)
const SEND_WORDS = {talk: ["Start talking", "Stop talking"]};
const TASK_PREFIX = "task:";

/** The error a route answered, in words: its envelope's message, else the status line. */
async function errorOf(response) {
  const text = await response.text().catch(() => "");
  let data = null;
  try { data = JSON.parse(text); } catch { /* not JSON: the text itself is the message */ }
  const message = data?.error?.message ?? data?.detail ?? data?.message ?? text.trim();
  const words = typeof message === "string" ? message : JSON.stringify(message);
  const status = `HTTP ${response.status}${response.statusText ? ` ${response.statusText}` : ""}`;
  return new Error(words ? `${words} (${status})` : status);
}

export function startPlayground({api, h, $, authHeaders}) {
  const el = {
    section: $("#playground"), form: $("#pg-form"), model: $("#pg-model"), mode: $("#pg-mode"),
    send: $("#pg-send"), stop: $("#pg-stop"), status: $("#pg-status"), error: $("#pg-error"),
    meta: $("#pg-meta"), output: $("#pg-output"),
  };
  const kinds = new Map();  // picker value -> category (a task: its first candidate's)
  let controller = null;

  // ------------------------------------------------------------ the picker

  async function readModels() {
    const chosen = el.model.value;
    let models = [];
    let tasks = [];
    try {  // a client's read: no key dialog here, the admin key may not be a client key
      const response = await fetch("/v1/models", {headers: authHeaders(), cache: "no-store"});
      if (!response.ok) throw await errorOf(response);
      models = (await response.json()).data || [];
    } catch (err) {
      try {  // the page's own read, with the admin key (the status lists every manifest)
        models = (await api("GET", "/api/v1/status")).models || [];
      } catch {
        showError(`Could not list the models: ${err.message}`);
      }
    }
    try {
      tasks = (await api("GET", "/api/v1/tasks")).tasks || [];
    } catch { /* no tasks route, or no key for it: models only */ }
    kinds.clear();
    for (const m of models) kinds.set(m.id, m.category);
    const modelOptions = models.map((m) => h("option", {value: m.id, disabled: m.available === false},
      `${m.id}${m.category ? ` (${m.category})` : ""}${m.available === false ? " · unavailable" : ""}`));
    const taskOptions = tasks.map((t) => {
      const value = TASK_PREFIX + t.name;
      kinds.set(value, kinds.get(t.candidates?.[0]));
      return h("option", {value}, `${value}${t.default ? " (default)" : ""}`);
    });
    el.model.replaceChildren(...[
      modelOptions.length ? h("optgroup", {label: "Models"}, modelOptions) : null,
      taskOptions.length ? h("optgroup", {label: "Tasks"}, taskOptions) : null].filter(Boolean));
    if (!models.length && !tasks.length) {
      el.model.append(h("option", {value: ""}, "no models"));
    }
    const keep = [...el.model.options].find((o) => o.value === chosen && !o.disabled);
    const first = [...el.model.options].find((o) => !o.disabled && o.value);
    el.model.value = keep ? chosen : first?.value ?? "";
    if (!keep) defaultMode();
  }

  function defaultMode() {
    const mode = MODE_OF[kinds.get(el.model.value)];
    if (mode) el.mode.value = mode;
    showMode();
  }

  /** Only the chosen mode's fields show; the others are disabled, so the form checks them not. */
  function showMode() {
    for (const fieldset of el.form.querySelectorAll("fieldset[data-mode]")) {
      const off = fieldset.dataset.mode !== el.mode.value;
      fieldset.hidden = off;
      fieldset.disabled = off;
    }
    el.section.dataset.mode = el.mode.value;
    [el.send.textContent, el.stop.textContent] = SEND_WORDS[el.mode.value] ?? ["Send", "Stop"];
  }

  // ------------------------------------------------------------ what the panel shows

  function showError(text) {
    el.error.textContent = text;
    el.error.hidden = !text;
  }

  function setRunning(running) {
    el.send.disabled = running;
    el.stop.disabled = !running;
    el.section.dataset.state = running ? "running" : el.error.hidden ? "done" : "error";
  }

  function showMeta(facts) {
    el.meta.replaceChildren(...Object.entries(facts)
      .filter(([, value]) => value !== null && value !== undefined && value !== "")
      .flatMap(([name, value]) => [h("dt", {}, name), h("dd", {"data-fact": name}, String(value))]));
  }

  function served(response) {
    const wait = response.headers.get("x-model-boss-queue-wait-s");
    return {
      "Served by": response.headers.get("x-model-boss-model") || "—",
      "Queue wait": wait === null ? "—" : `${Number(wait).toFixed(2)} s`,
    };
  }

  const seconds = (t0) => (performance.now() - t0) / 1000;

  async function post(path, body) {
    const headers = {...authHeaders()};
    if (!(body instanceof FormData)) headers["content-type"] = "application/json";
    const response = await fetch(path, {
      method: "POST", headers, cache: "no-store", signal: controller.signal,
      body: body instanceof FormData ? body : JSON.stringify(body),
    });
    if (!response.ok) {
      const err = await errorOf(response);
      if (response.status === 401) {
        err.message += ": the key this page keeps (Admin key button) must open the client routes too";
      }
      throw err;
    }
    return response;
  }

  // ------------------------------------------------------------ the four modes

  async function chat(model, t0) {
    const content = $("#pg-message").value;
    const maxTokens = Number($("#pg-max-tokens").value) || undefined;
    const text = h("pre", {class: "pg-text", id: "pg-text", "aria-live": "polite"});
    el.output.replaceChildren(text);
    el.status.textContent = "Waiting for the first token…";
    const response = await post("/v1/chat/completions", {
      model, messages: [{role: "user", content}], max_tokens: maxTokens, stream: true,
      stream_options: {include_usage: true}});
    const head = served(response);
    showMeta(head);
    let chunks = 0, usage = null, firstAt = null, finish = null;
    const take = (line) => {
      if (line.startsWith(":")) {  // a comment: the coordinator tells a load's stages so
        el.status.textContent = line.slice(1).trim();
        return;
      }
      if (!line.startsWith("data:")) return;
      const payload = line.slice(5).trim();
      if (!payload || payload === "[DONE]") return;
      const data = JSON.parse(payload);
      if (data.error) {
        const message = data.error.message ?? JSON.stringify(data.error);
        throw new Error(typeof message === "string" ? message : JSON.stringify(message));
      }
      if (data.usage) usage = data.usage;
      const choice = data.choices?.[0];
      if (choice?.finish_reason) finish = choice.finish_reason;
      const delta = choice?.delta?.content ?? choice?.text;
      if (delta) {
        if (firstAt === null) firstAt = seconds(t0);
        text.append(delta);
        chunks += 1;
        el.status.textContent = `Streaming… ${chunks} chunk${chunks === 1 ? "" : "s"}`;
      }
    };
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buffer += value;
      let nl;
      while ((nl = buffer.indexOf("\n")) >= 0) {
        take(buffer.slice(0, nl).replace(/\r$/, ""));
        buffer = buffer.slice(nl + 1);
      }
    }
    if (buffer) take(buffer.replace(/\r$/, ""));
    const total = seconds(t0);
    const tokens = usage?.completion_tokens ?? chunks;
    const genTime = firstAt === null ? null : total - firstAt;
    showMeta({...head,
      "Tokens": `${tokens}${usage ? "" : " (chunks)"}${usage?.prompt_tokens !== undefined ? ` · ${usage.prompt_tokens} in` : ""}`,
      "Time": `${total.toFixed(2)} s${firstAt !== null ? ` · first token ${firstAt.toFixed(2)} s` : ""}`,
      "Speed": genTime && tokens > 1 ? `${((tokens - 1) / genTime).toFixed(1)} tokens/s` : null,
      "Finish": finish});
    if (!text.textContent) text.textContent = "(the model answered no text)";
  }

  async function image(model, t0) {
    const body = {model, prompt: $("#pg-prompt").value, size: $("#pg-size").value,
      response_format: "b64_json", n: 1};
    const steps = Number($("#pg-steps").value);
    if (steps) body.x_steps = steps;
    el.status.textContent = "Generating…";
    const response = await post("/v1/images/generations", body);
    const data = await response.json();
    const images = (data.data || []).map((item, i) => h("img", {
      src: item.b64_json ? `data:image/png;base64,${item.b64_json}` : item.url,
      alt: `image ${i + 1} for: ${body.prompt}`, class: "pg-image"}));
    el.output.replaceChildren(...(images.length ? images : [h("p", {class: "summary"}, "No image came back.")]));
    showMeta({...served(response), "Images": images.length, "Time": `${seconds(t0).toFixed(2)} s`});
  }

  async function transcription(model, t0) {
    const file = $("#pg-file").files[0];
    const form = new FormData();
    form.append("file", file, file.name);
    form.append("model", model);
    el.status.textContent = "Transcribing…";
    const response = await post("/v1/audio/transcriptions", form);
    const data = await response.json();
    el.output.replaceChildren(h("pre", {class: "pg-text", id: "pg-text"}, data.text ?? JSON.stringify(data)));
    showMeta({...served(response), "File": `${file.name} (${Math.ceil(file.size / 1024)} KB)`,
      "Time": `${seconds(t0).toFixed(2)} s`});
  }

  async function rerank(model, t0) {
    const query = $("#pg-query").value;
    const documents = $("#pg-documents").value.split("\n").map((d) => d.trim()).filter(Boolean);
    if (!documents.length) throw new Error("Give at least one document (one a line).");
    el.status.textContent = "Ranking…";
    const response = await post("/v1/rerank", {model, query, documents});
    const data = await response.json();
    const results = data.results || data.data || [];
    const score = (r) => r.relevance_score ?? r.score;
    const docText = (r) => (typeof r.document === "string" ? r.document : r.document?.text)
      ?? documents[r.index] ?? "—";
    const rows = results.map((r) => h("tr", {"data-index": r.index},
      h("td", {}, r.index), h("td", {}, typeof score(r) === "number" ? score(r).toFixed(4) : "—"),
      h("td", {}, docText(r))));
    el.output.replaceChildren(h("div", {class: "scroll"}, h("table", {id: "pg-rerank"},
      h("caption", {}, `Ranked for: ${query}`),
      h("thead", {}, h("tr", {}, h("th", {scope: "col"}, "Index"), h("th", {scope: "col"}, "Score"),
        h("th", {scope: "col"}, "Document"))),
      h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", {colspan: 3, class: "empty"}, "No results."))))));
    showMeta({...served(response), "Documents": documents.length, "Time": `${seconds(t0).toFixed(2)} s`});
  }

  async function conversation(model) {
    const bearer = authHeaders().authorization ?? "";
    await talk(model, bearer.replace(/^Bearer /, ""), controller.signal, {
      h, output: el.output, warn: showError, facts: showMeta,
      say: (text) => { el.status.textContent = text; },
      instructions: $("#pg-talk-instructions").value.trim(),
      maxTokens: Number($("#pg-talk-max-tokens").value) || undefined});
  }

  const RUN = {chat, image, transcription, rerank, talk: conversation};

  async function send(event) {
    event.preventDefault();
    if (controller) return;  // one request at a time
    const model = el.model.value;
    const mode = el.mode.value;
    showError("");
    el.meta.replaceChildren();
    el.output.replaceChildren();  // no answer from before beside this one's error
    if (!model) {
      showError("Pick a model first.");
      setRunning(false);
      return;
    }
    controller = new AbortController();
    setRunning(true);
    const t0 = performance.now();
    try {
      await RUN[mode](model, t0);
      el.status.textContent = `Done in ${seconds(t0).toFixed(2)} s.`;
    } catch (err) {
      if (err.name === "AbortError") {
        el.status.textContent = `Stopped after ${seconds(t0).toFixed(2)} s.`;
      } else {
        el.status.textContent = `Failed after ${seconds(t0).toFixed(2)} s.`;
        showError(err.message || String(err));
      }
    } finally {
      controller = null;
      setRunning(false);
    }
  }

  // ------------------------------------------------------------ wiring

  for (const mode of MODES) el.mode.append(h("option", {value: mode}, mode));
  el.model.addEventListener("change", defaultMode);
  el.mode.addEventListener("change", showMode);
  el.form.addEventListener("submit", send);
  el.stop.addEventListener("click", () => controller?.abort());
  // Ctrl+Enter (or Cmd+Enter) in a text box sends, as in most chat clients
  el.form.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey) && !el.send.disabled) {
      event.preventDefault();
      el.form.requestSubmit(el.send);
    }
  });
  $("#pg-refresh").addEventListener("click", readModels);
  showMode();
  readModels();
  return {refresh: readModels};
}
