// model-boss dashboard: the Jobs panel. The jobs this page's key may see (GET /api/v1/jobs:
// an admin's key every job, a user key its own), newest first: kind, model, status, progress
// (denoising steps as a <progress>, a chat's tokens as a count), times yielded, place in the
// queue while waiting, age, a Cancel button (DELETE /api/v1/jobs/{id}) while unfinished and a
// finished video's MP4. Read every 5 s as the queue is, every second while a job runs and the
// panel is on screen, and never while the tab is hidden.

const READ_EVERY_MS = 5000;   // the dashboard's backstop for the queue
const RUNNING_EVERY_MS = 1000;
const EVENT_GAP_MS = 1000;    // a burst of events asks for one read at most this often
const MAX_ROWS = 50;
const UNFINISHED = new Set(["queued", "loading", "running"]);
const MOVING = new Set(["loading", "running"]);
const KINDS = {
  "/v1/chat/completions": "chat", "/v1/completions": "completion", "/v1/embeddings": "embedding",
  "/v1/rerank": "rerank", "/v1/audio/speech": "speech", "/v1/images/generations": "image",
  "/v1/images/edits": "edit", "/v1/videos": "video",
};
const STATUSES = ["running", "loading", "queued", "succeeded", "failed", "cancelled"];

const kindOf = (job) => KINDS[job.endpoint] || job.endpoint;
const shortId = (id) => id.replace(/^job-/, "").slice(0, 8);
const videoUrl = (job) => `/v1/videos/video_${encodeURIComponent(job.id)}/content`;

export function startJobs({api, h, $, authHeaders, serverNow, fmtDuration, notice, replaceKeepingFocus}) {
  const el = {section: $("#jobs"), summary: $("#jobs-summary"), body: $("#jobs-table tbody")};
  const busy = new Set();  // job ids whose cancel is on its way
  let drawn = new Map();   // job id -> {text, node}: a row that has not changed is kept as is
  let jobs = [];
  let shownText = null;
  let reading = false;
  let again = false;
  let onScreen = true;      // until the observer says otherwise
  let timer = null;
  let lastEventRead = 0;

  // ------------------------------------------------------------ reading

  async function read() {
    if (reading) { again = true; return; }
    reading = true;
    try {
      const answer = await api("GET", "/api/v1/jobs");
      jobs = [...(answer.jobs || [])].sort((a, b) => b.created_at - a.created_at);
      const text = JSON.stringify([jobs, [...busy]]);
      if (text !== shownText) {  // unchanged: no redraw (ages move in tick())
        shownText = text;
        render();
      }
    } catch (err) {
      shownText = null;
      if (err.status === 404 || err.status === 405) el.summary.textContent = "no jobs on this server";
      else if (err.status !== 401) el.summary.textContent = `Could not read the jobs: ${err.message}`;
    } finally {
      reading = false;
      if (again) { again = false; read(); }
      schedule();
    }
  }

  /** The next read: sooner while a job runs where it can be seen. */
  function schedule() {
    clearTimeout(timer);
    const fast = onScreen && jobs.some((job) => MOVING.has(job.status));
    timer = setTimeout(() => { if (document.hidden) schedule(); else read(); },
      fast ? RUNNING_EVERY_MS : READ_EVERY_MS);
  }

  /** A burst of the dashboard's events (a job yielding, a request ending): one read. */
  function onEvent() {
    if (document.hidden || Date.now() - lastEventRead < EVENT_GAP_MS) return;
    lastEventRead = Date.now();
    read();
  }

  async function cancel(job) {
    if (busy.has(job.id)) return;
    busy.add(job.id);
    render();
    try {
      const answer = await api("DELETE", `/api/v1/jobs/${encodeURIComponent(job.id)}`);
      notice(`Job ${shortId(job.id)}: ${answer?.status ?? "cancelled"}`, true);
    } catch (err) {
      notice(`Cancelling job ${shortId(job.id)} failed: ${err.message}`);
    } finally {
      busy.delete(job.id);
      shownText = null;
      read();
    }
  }

  /** A link cannot carry the key: with one, the clip is fetched with it and saved. */
  async function download(event, job) {
    if (!Object.keys(authHeaders()).length) return;  // no key: the plain link works
    event.preventDefault();
    try {
      const response = await fetch(videoUrl(job), {headers: authHeaders(), cache: "no-store"});
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const url = URL.createObjectURL(await response.blob());
      const a = h("a", {href: url, download: `video_${job.id}.mp4`});
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60000);
    } catch (err) {
      notice(`Downloading the video of job ${shortId(job.id)} failed: ${err.message}`);
    }
  }

  // ------------------------------------------------------------ drawing

  function render() {
    const counts = STATUSES.map((s) => [s, jobs.filter((j) => j.status === s).length]).filter(([, n]) => n);
    const rest = Math.max(0, jobs.length - MAX_ROWS);
    el.summary.textContent = jobs.length
      ? `${jobs.length} job${jobs.length === 1 ? "" : "s"}: ${counts.map(([s, n]) => `${n} ${s}`).join(" · ")}` +
        (rest ? ` · the newest ${MAX_ROWS} shown, ${rest} more not shown` : "")
      : "No jobs.";
    const kept = new Map();
    for (const job of jobs.slice(0, MAX_ROWS)) {
      const text = JSON.stringify([job, busy.has(job.id)]);
      const old = drawn.get(job.id);
      kept.set(job.id, old?.text === text ? old : {text, node: row(job)});
    }
    drawn = kept;
    const rows = [...kept.values()].map((r) => r.node);
    replaceKeepingFocus(el.body, rows.length ? rows
      : [h("tr", {}, h("td", {colspan: 8, class: "empty"}, "No jobs."))]);
  }

  function row(job) {
    const unfinished = UNFINISHED.has(job.status);
    const cancelling = busy.has(job.id);
    return h("tr", {"data-job": job.id, "data-status": job.status, "data-kind": kindOf(job)},
      h("td", {}, h("code", {title: job.id}, shortId(job.id))),
      h("td", {}, kindOf(job)),
      h("td", {}, job.model ?? "—"),
      h("td", {class: "job-status"}, h("span", {class: `badge state ${job.status}`}, job.status),
        job.yields > 0 ? h("span", {class: "yields", "data-yields": job.yields,
          title: "times it gave its slot back to more important work and waited again"},
        ` yielded ${job.yields}×`) : null),
      h("td", {class: "job-progress"}, progressView(job)),
      h("td", {}, placeView(job)),
      h("td", {class: "num", "data-created": job.created_at}, fmtDuration(serverNow() - job.created_at)),
      h("td", {class: "job-actions"},
        unfinished ? h("button", {type: "button", class: "secondary", "data-focus": `cancel:${job.id}`,
          "aria-label": `Cancel job ${shortId(job.id)}`, "aria-busy": cancelling ? "true" : null,
          disabled: cancelling, onclick: () => cancel(job)}, cancelling ? "Cancel…" : "Cancel") : null,
        job.status === "succeeded" && job.endpoint === "/v1/videos"
          ? h("a", {href: videoUrl(job), "data-focus": `video:${job.id}`,
            onclick: (event) => download(event, job)}, "MP4") : null));
  }

  function progressView(job) {
    const p = job.progress || {};
    const label = `job ${shortId(job.id)} progress`;
    const failure = job.status === "failed" && job.error?.message
      ? h("div", {class: "error"}, job.error.message) : null;
    if (typeof p.steps === "number" && p.steps > 0) {
      const step = Math.min(p.step ?? 0, p.steps);
      return [h("div", {class: "job-bar"},
        h("progress", {max: p.steps, value: step, "aria-label": `${label}: step ${step} of ${p.steps}`}),
        h("span", {"data-step": step}, `${step}/${p.steps}`)), failure];
    }
    if (typeof p.tokens === "number") {
      return [h("span", {"data-tokens": p.tokens}, `${p.tokens} token${p.tokens === 1 ? "" : "s"}`), failure];
    }
    if (MOVING.has(job.status) && ["image", "edit", "video"].includes(kindOf(job))) {
      return h("div", {class: "job-bar"}, h("progress", {"aria-label": `${label}: starting`}));
    }
    return failure ?? "—";
  }

  function placeView(job) {
    if (job.status !== "queued" || !job.queue_position) return "—";
    const at = job.estimated_start ? Date.parse(job.estimated_start) / 1000 : null;
    return h("span", {"data-position": job.queue_position, title: job.estimated_start || null},
      `#${job.queue_position}`, at === null ? null
        : h("span", {"data-starts": at}, ` · ${startText(at)}`));
  }

  const startText = (at) => (at - serverNow() > 0.5 ? `starts in ~${fmtDuration(at - serverNow())}` : "starting");

  /** Once a second: ages and countdowns move without asking the server. */
  function tick() {
    for (const cell of el.body.querySelectorAll("[data-created]")) {
      cell.textContent = fmtDuration(serverNow() - Number(cell.dataset.created));
    }
    for (const span of el.body.querySelectorAll("[data-starts]")) {
      span.textContent = ` · ${startText(Number(span.dataset.starts))}`;
    }
  }

  // ------------------------------------------------------------ start

  if ("IntersectionObserver" in window) {
    new IntersectionObserver((entries) => {
      const was = onScreen;
      onScreen = entries.some((e) => e.isIntersecting);
      if (onScreen && !was) read();
    }).observe(el.section);
  }
  document.addEventListener("visibilitychange", () => { if (!document.hidden) read(); });
  read();
  setInterval(tick, 1000);
  return {refresh: () => { shownText = null; read(); }, onEvent};
}
