// model-boss dashboard: the playground's talk tab. A conversation with a realtime pipeline over
// /v1/realtime, as OpenAI's browser clients hold one: the key rides in the WebSocket's
// subprotocols (a page cannot set a header on a socket), the microphone goes up as PCM16 mono
// at 24 kHz in 20 ms pieces (an AudioWorklet), the server finds the turns (server_vad), and
// the answer's audio is played through WebAudio as it arrives, its words shown beside what
// was heard. Speech while the answer plays (barge-in) stops it where it was, and the server is
// told how much was heard (conversation.item.truncate).

const RATE = 24000;  // the socket's audio, both ways
const FORMAT = {type: "audio/pcm", rate: RATE};
const WORKLET = "/ui/talk-worklet.js";
const KEY_PROTOCOL = "openai-insecure-api-key.";

function base64Of(buffer) {
  let text = "";
  for (const byte of new Uint8Array(buffer)) text += String.fromCharCode(byte);
  return btoa(text);
}

function samplesOf(base64) {
  const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
  const pcm = new Int16Array(bytes.buffer, 0, bytes.length >> 1);
  return Float32Array.from(pcm, (s) => s / 0x8000);
}

/** The answer's voice: pieces queued back to back on one AudioContext, each counted as heard
 * once it has played (a piece cut short counts what was heard of it). */
class Player {
  constructor(audio, onPlayed) {
    this.audio = audio;
    this.onPlayed = onPlayed;
    this.sources = new Set();
    this.until = 0;        // when the last queued piece ends (the context's clock)
    this.item = null;      // the answer item being played
    this.itemStart = 0;    // when its first piece began
    this.played = 0;       // samples heard in all
    this.queued = 0;       // samples received to play
  }

  get playing() {
    return this.sources.size > 0;
  }

  play(item, samples) {
    if (!samples.length) return;
    this.queued += samples.length;
    const buffer = this.audio.createBuffer(1, samples.length, RATE);
    buffer.copyToChannel(samples, 0);
    const source = this.audio.createBufferSource();
    source.buffer = buffer;
    source.connect(this.audio.destination);
    const at = Math.max(this.audio.currentTime, this.until);
    if (item !== this.item) {
      this.item = item;
      this.itemStart = at;
    }
    source.addEventListener("ended", () => {
      this.sources.delete(source);
      // played to its end, or cut: then what was heard of it by the cut (never started: 0)
      const heard = source.cutAt === undefined ? samples.length
        : Math.round((source.cutAt - at) * RATE);
      this.played += Math.max(0, Math.min(samples.length, heard));
      this.onPlayed(this.played);
    });
    source.start(at);
    this.sources.add(source);
    this.until = at + buffer.duration;
  }

  /** Stop what plays; the milliseconds of the current item heard up to now. */
  cut() {
    const now = Math.min(this.audio.currentTime, this.until);
    for (const source of this.sources) {
      source.cutAt = this.audio.currentTime;
      source.stop();
    }
    this.until = this.audio.currentTime;
    return Math.max(0, Math.round((now - this.itemStart) * 1000));
  }
}

/** The microphone, at the context's rate, in 20 ms pieces of PCM16 handed to ``take``. */
async function listen(audio, take) {
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: {channelCount: 1, echoCancellation: true, noiseSuppression: true}});
  await audio.audioWorklet.addModule(WORKLET);
  const source = audio.createMediaStreamSource(stream);
  const tap = new AudioWorkletNode(audio, "pcm-tap");
  const mute = audio.createGain();  // the tap must be pulled, and never heard
  mute.gain.value = 0;
  tap.port.onmessage = (message) => take(message.data);
  source.connect(tap).connect(mute).connect(audio.destination);
  return () => {
    for (const track of stream.getTracks()) track.stop();
    source.disconnect();
    tap.port.onmessage = null;
  };
}

/** The socket, once open; a refusal (the page cannot read the handshake's answer) is
 * explained by what the same key is told about the pipeline on /v1/models. */
function connect(model, key, signal) {
  const url = new URL(`/v1/realtime?model=${encodeURIComponent(model)}`, location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  const socket = new WebSocket(url, key ? ["realtime", KEY_PROTOCOL + key] : ["realtime"]);
  return new Promise((resolve, reject) => {
    const stop = () => socket.close();
    const refused = () => {
      signal.removeEventListener("abort", stop);
      if (signal.aborted) reject(new DOMException("stopped", "AbortError"));
      else refusal(model, key).then(reject, reject);
    };
    signal.addEventListener("abort", stop, {once: true});
    socket.addEventListener("close", refused, {once: true});
    socket.addEventListener("open", () => {
      signal.removeEventListener("abort", stop);
      socket.removeEventListener("close", refused);
      resolve(socket);
    }, {once: true});
  });
}

async function refusal(model, key) {
  const response = await fetch(`/v1/models/${encodeURIComponent(model)}`, {
    headers: key ? {authorization: `Bearer ${key}`} : {}, cache: "no-store"}).catch(() => null);
  const data = response ? await response.json().catch(() => null) : null;
  const why = !response ? "the server cannot be reached"
    : !response.ok ? (data?.error?.message ?? `HTTP ${response.status}`)
      : data?.available === false ? (data.unavailable_reason ?? "the pipeline is unavailable")
        : "the server closed the connection";
  return new Error(`The talk socket was refused: ${why}`);
}

/**
 * Talk to ``model`` until ``signal`` aborts (an AbortError) or the server ends the session.
 * ``ui``: {h, output (where the conversation is drawn), say(status), warn(error text),
 * facts(object), instructions, maxTokens}. Call it from a click: the AudioContext it makes
 * at once may then play.
 */
export async function talk(model, key, signal, ui) {
  const audio = new AudioContext({sampleRate: RATE, latencyHint: "interactive"});
  // the log says how many samples of answer came (queued) and were heard (played)
  const log = ui.h("ol", {class: "pg-talk", id: "pg-talk-log", "aria-live": "polite",
    "data-played-samples": "0", "data-queued-samples": "0"});
  ui.output.replaceChildren(log);
  const lines = new Map();  // item id -> its line
  const cut = new Set();    // answer items stopped by barge-in: their late audio is dropped
  const facts = {Pipeline: model, Turns: 0, Played: "0.00 s", "First audio": null};
  const player = new Player(audio, (samples) => {
    log.dataset.playedSamples = String(samples);
    facts.Played = `${(samples / RATE).toFixed(2)} s`;
    ui.facts(facts);
  });
  let stopMicrophone = null, stoppedAt = null, firstAudio = false;

  const line = (item, who) => {
    let li = lines.get(item);
    if (!li) {
      li = ui.h("li", {class: who === "user" ? "pg-heard" : "pg-answer", "data-item": item},
        ui.h("span", {class: "who"}, who === "user" ? "You" : "Answer"),
        ui.h("span", {class: "words"}));
      lines.set(item, li);
      log.append(li);
    }
    return li;
  };
  const words = (item, who) => line(item, who).querySelector(".words");

  let socket = null;
  const send = (event) => {
    if (socket?.readyState === WebSocket.OPEN) socket.send(JSON.stringify(event));
  };

  async function handle(event) {
    switch (event.type) {
      case "session.created":
        send({type: "session.update", session: {
          type: "realtime", instructions: ui.instructions || undefined,
          max_output_tokens: ui.maxTokens || undefined,
          audio: {input: {format: FORMAT, turn_detection: {type: "server_vad", create_response: true}},
            output: {format: FORMAT}}}});
        break;
      case "session.updated":
        if (stopMicrophone) break;
        stopMicrophone = await listen(audio, (pcm) => send({
          type: "input_audio_buffer.append", audio: base64Of(pcm)}));
        ui.say("Listening… speak, then pause.");
        break;
      case "input_audio_buffer.speech_started":
        if (player.playing && player.item) {  // barge-in: stop the answer where it is
          const heard = player.cut();
          cut.add(player.item);
          Object.assign(line(player.item, "assistant").dataset, {status: "cut", heardMs: heard});
          send({type: "conversation.item.truncate", item_id: player.item, content_index: 0,
            audio_end_ms: heard});
        }
        line(event.item_id, "user").dataset.status = "hearing";
        ui.say("Hearing you…");
        break;
      case "input_audio_buffer.speech_stopped":
        stoppedAt = performance.now();
        firstAudio = false;
        line(event.item_id, "user").dataset.status = "heard";
        ui.say("Thinking…");
        break;
      case "conversation.item.input_audio_transcription.delta":
        words(event.item_id, "user").textContent += event.delta;
        break;
      case "conversation.item.input_audio_transcription.completed":
        words(event.item_id, "user").textContent = event.transcript;
        line(event.item_id, "user").dataset.status = "done";
        break;
      case "response.output_audio_transcript.delta":
        if (!cut.has(event.item_id)) words(event.item_id, "assistant").textContent += event.delta;
        break;
      case "response.output_audio_transcript.done":
        if (!cut.has(event.item_id)) words(event.item_id, "assistant").textContent = event.transcript;
        break;
      case "response.output_audio.delta":
        if (cut.has(event.item_id)) break;
        if (!firstAudio && stoppedAt !== null) {
          facts["First audio"] = `${((performance.now() - stoppedAt) / 1000).toFixed(2)} s after you stopped`;
        }
        firstAudio = true;
        player.play(event.item_id, samplesOf(event.delta));
        log.dataset.queuedSamples = String(player.queued);
        ui.say("Speaking… (talk over it to interrupt)");
        break;
      case "response.done": {
        facts.Turns += 1;
        for (const item of event.response?.output ?? []) {
          const li = lines.get(item.id);
          if (li && !li.dataset.status) li.dataset.status = event.response.status;
        }
        ui.facts(facts);
        ui.say("Listening… speak, then pause.");
        break;
      }
      case "conversation.item.truncated":  // the server's word for where the answer was cut
        line(event.item_id, "assistant").dataset.truncatedMs = event.audio_end_ms;
        break;
      case "error":
        ui.warn(event.error?.message ?? JSON.stringify(event.error));
        break;
      default:
        break;
    }
  }

  try {
    ui.facts(facts);
    ui.say("Connecting…");
    await audio.resume();
    socket = await connect(model, key, signal);
    await new Promise((resolve, reject) => {
      let chain = Promise.resolve();  // one event at a time, in the order they came
      signal.addEventListener("abort", () => reject(new DOMException("stopped", "AbortError")),
        {once: true});
      socket.addEventListener("message", (message) => {
        chain = chain.then(() => handle(JSON.parse(message.data))).catch(reject);
      });
      socket.addEventListener("close", (closed) => (closed.code === 1000 ? resolve()
        : reject(new Error(`The talk socket closed (${closed.code}${closed.reason ? `: ${closed.reason}` : ""})`))));
    });
  } finally {
    stopMicrophone?.();
    socket?.close();
    await audio.close();
  }
}
