"""From the end of a spoken question to the first audio byte of its answer: ``/v1/realtime``
beside the three HTTP calls a client makes today, on the same models in one run.

Serves a realtime pipeline of the test suite's tiny models (a random-weight Whisper that writes
letters, so the LLM answers in words; the demo LLM SmolLM2-135M at temperature 0; a
random-weight VITS voice) and asks one question spoken by espeak-ng, in turns, each round:

- **realtime**: a fresh session (``server_vad``), the question sent as PCM16 at 24 kHz in
  20 ms pieces in real time, then silence, as a microphone sends it. Split into VAD wait
  (speech end → ``speech_stopped``), transcription (→ ``transcription.completed``), first
  LLM sentence (→ the transcript delta after which the voice is asked: the first whole
  sentence, or the answer's end when it has none) and first voice chunk (→ the first
  ``response.output_audio.delta``).
- **HTTP, sentence by sentence**: at the speech's end (a push-to-talk client: no VAD wait) the
  recording goes to ``/v1/audio/transcriptions``, the transcript to a streamed
  ``/v1/chat/completions`` (the same instructions and ``max_tokens``), and its first whole
  sentence (the realtime session's own splitter) to ``/v1/audio/speech`` while the answer
  goes on; clocked to the speech answer's first byte.
- **HTTP, whole answer**: the same, but the voice is asked for the whole answer once the
  stream ends (a client that does not split sentences).

Prints one table of medians (ms), each side's answer length and the coordinator process's own
CPU time a round (the live microphone's turn detection runs there); ``--each`` prints every
round's figures too.

    .venv/bin/python benchmarks/realtime_latency.py [--rounds 7] [--max-tokens 48] [--each]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson
import psutil
import websockets

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.harness import DEMO_GGUF, BenchServer, check_sides, coordinator_side
from model_boss.services.realtime.audio import wav_of
from model_boss.services.realtime.calls import sentences
from tests.realtime_fixtures import build_lettered_whisper, silence, spoken
from tests.transformers_fixtures import build_voice

RATE = 24000
PIECE = RATE * 2 // 50  # 20 ms of PCM16
QUESTION = "What is the capital of France?"
INSTRUCTIONS = "Answer in one or two short sentences."
STAGES = ("VAD wait", "transcription", "first LLM sentence", "first voice chunk")


async def realtime_round(url: str, lead: bytes, speech: bytes, silence_ms: int,
                         max_tokens: int) -> dict[str, float]:
    """One spoken question over ``/v1/realtime``: each stage's end, in ms after the speech's
    end, and the answer's length in characters."""
    marks: dict[str, float] = {}
    answer = ""
    async with websockets.connect(url, max_size=None) as socket:
        assert orjson.loads(await socket.recv())["type"] == "session.created"
        await socket.send(orjson.dumps({"type": "session.update", "session": {
            "type": "realtime", "instructions": INSTRUCTIONS, "max_output_tokens": max_tokens,
            "audio": {"input": {"turn_detection": {"type": "server_vad",
                                                   "silence_duration_ms": silence_ms}}}}}))
        assert orjson.loads(await socket.recv())["type"] == "session.updated"
        done = asyncio.Event()
        speech_end: list[float] = []

        async def microphone() -> None:
            audio, start = lead + speech, time.perf_counter()
            sent = 0
            while not done.is_set():  # after the question, silence, as a live microphone
                piece = audio[sent:sent + PIECE] or bytes(PIECE)
                await socket.send(orjson.dumps({"type": "input_audio_buffer.append",
                                                "audio": base64.b64encode(piece).decode()}))
                sent += PIECE
                if sent >= len(audio) and not speech_end:
                    speech_end.append(start + len(audio) / (2 * RATE))
                await asyncio.sleep(max(0.0, start + sent / (2 * RATE) - time.perf_counter()))

        sending = asyncio.create_task(microphone())
        try:
            last_delta = None
            async with asyncio.timeout(300):
                async for raw in socket:
                    now, event = time.perf_counter(), orjson.loads(raw)
                    kind = event["type"]
                    if kind == "error":
                        raise RuntimeError(f"realtime error: {event['error']}")
                    if kind == "input_audio_buffer.speech_stopped":
                        marks.setdefault("VAD wait", now)
                    elif kind == "conversation.item.input_audio_transcription.completed":
                        marks.setdefault("transcription", now)
                    elif kind == "response.output_audio_transcript.delta":
                        answer += event["delta"]
                        last_delta = now
                    elif kind == "response.output_audio.delta" and "first voice chunk" \
                            not in marks:
                        marks["first LLM sentence"] = last_delta or now
                        marks["first voice chunk"] = now
                    elif kind == "response.done":
                        break
        finally:
            done.set()
            await sending
    end = speech_end[0]
    return {**{stage: 1000 * (marks[stage] - end) for stage in STAGES},
            "chars": float(len(answer))}


def http_round(base: str, recording: bytes, max_tokens: int, *, split: bool
               ) -> dict[str, float]:
    """The three HTTP calls from the speech's end (the recording is whole then): each stage's
    end in ms after it, and the answer's length in characters."""
    marks: dict[str, float] = {}
    with httpx.Client(base_url=base, timeout=300) as http:
        start = time.perf_counter()
        heard = http.post("/v1/audio/transcriptions", data={"model": "whisper"},
                          files={"file": ("question.wav", recording, "audio/wav")})
        heard.raise_for_status()
        marks["transcription"] = time.perf_counter()
        messages = [{"role": "system", "content": INSTRUCTIONS},
                    {"role": "user", "content": heard.json()["text"].strip()}]
        answer, said = "", None
        with http.stream("POST", "/v1/chat/completions", json={
                "model": "smol", "messages": messages, "max_tokens": max_tokens,
                "stream": True}) as stream:
            stream.raise_for_status()
            for line in stream.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                for choice in orjson.loads(line[6:]).get("choices") or ():
                    answer += (choice.get("delta") or {}).get("content") or ""
                whole, _ = sentences(answer)
                if split and said is None and whole:
                    marks["first LLM sentence"] = time.perf_counter()
                    said = first_byte(http, whole[0])
                    marks["first voice chunk"] = said
        if said is None:  # no whole sentence (or no splitting): the answer, once it is done
            marks["first LLM sentence"] = time.perf_counter()
            marks["first voice chunk"] = first_byte(http, answer.strip())
    return {**{stage: 1000 * (marks[stage] - start) for stage in STAGES[1:]},
            "VAD wait": 0.0, "chars": float(len(answer))}


def first_byte(http: httpx.Client, text: str) -> float:
    """When the first byte of ``text`` spoken arrives (the rest is read, as a player would)."""
    first = None
    with http.stream("POST", "/v1/audio/speech", json={
            "model": "voice", "input": text, "response_format": "pcm"}) as speech:
        speech.raise_for_status()
        for chunk in speech.iter_raw():
            if chunk and first is None:
                first = time.perf_counter()
    assert first is not None, "the voice answered no audio"
    return first


def voiced(pcm: bytes, floor: int = 300) -> bytes:
    """``pcm`` up to its last sample louder than ``floor`` (of 32768): espeak-ng ends a clip
    with quiet of its own, and the speech's end is where the voice stops."""
    samples = memoryview(pcm).cast("h")
    end = len(samples)
    while end and abs(samples[end - 1]) <= floor:
        end -= 1
    return pcm[:2 * end]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--each", action="store_true", help="print every round's figures")
    parser.add_argument("--silence-ms", type=int, default=500,
                        help="server_vad's silence_duration_ms (OpenAI's default: 500)")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="realtime-bench-"))
    server = BenchServer(root / "server", {
        "gpus": [{"index": 0, "name": "sim", "vram_mb": 8192}], "use_nvml": False}, [
        {"id": "whisper", "backend": "transformers", "category": "stt",
         "path": str(build_lettered_whisper(root / "whisper")), "vram_mb": 500},
        {"id": "voice", "backend": "transformers", "category": "tts",
         "path": str(build_voice(root / "voice")), "vram_mb": 500},
        {"id": "smol", "category": "llm", "backend": "llama-server", "path": str(DEMO_GGUF),
         "ctx_size": 2048, "threads": os.cpu_count() or 1, "args": ["--temp", "0"]},
        {"id": "talk", "category": "realtime",
         "pipeline": {"transcriber": "whisper", "llm": "smol", "voice": "voice"}}])
    mb = coordinator_side(server)
    lead, speech = silence(0.3), voiced(spoken(QUESTION))
    recording = wav_of(lead + speech, RATE)
    asked = {"question": f"'{QUESTION}' (espeak-ng, {len(speech) / (2 * RATE):.2f} s)",
             "instructions": INSTRUCTIONS, "max_tokens": args.max_tokens,
             "models": f"{mb['whisper.path']} {mb['smol.path']} {mb['voice.path']}",
             "smol.threads": mb["smol.threads"]}
    check_sides({
        "realtime": {"path": f"/v1/realtime server_vad silence {args.silence_ms} ms, "
                             "voice per sentence", **asked},
        "http-sentence": {"path": "transcriptions, chat stream, speech of the first "
                                  "sentence", **asked},
        "http-whole": {"path": "transcriptions, chat stream, speech of the whole answer",
                       **asked}}, ["path"])
    server.start(timeout=120)
    assert server.proc is not None
    coordinator = psutil.Process(server.proc.pid)  # its own CPU, not its workers'
    url = server.url.replace("http", "ws", 1) + "/v1/realtime?model=talk"
    sides = {
        "realtime": lambda: asyncio.run(realtime_round(url, lead, speech, args.silence_ms,
                                                       args.max_tokens)),
        "http-sentence": lambda: http_round(server.url, recording, args.max_tokens,
                                            split=True),
        "http-whole": lambda: http_round(server.url, recording, args.max_tokens, split=False),
    }
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    load = [os.getloadavg()[0]]  # the box is shared: said beside the figures
    try:
        for run in sides.values():  # load and warm all three models
            run()
        for _ in range(args.rounds):
            for name, run in sides.items():
                used = coordinator.cpu_times()
                figures = run()
                now = coordinator.cpu_times()
                figures["coordinator CPU"] = 1000 * (now.user + now.system
                                                     - used.user - used.system)
                runs[name].append(figures)
                if args.each:
                    print(name, {k: round(v) for k, v in runs[name][-1].items()}, flush=True)
    finally:
        server.stop()
    load.append(os.getloadavg()[0])

    def median(name: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[name])

    print(f"\nFrom the end of a spoken question to the first audio byte of its answer, ms "
          f"after the speech's end (medians of {args.rounds} rounds in turns; tiny Whisper, "
          f"SmolLM2-135M, tiny VITS on {os.cpu_count()} CPUs; load average "
          f"{load[0]:.1f} before, {load[1]:.1f} after)\n")
    print("| side | VAD wait | transcription | first LLM sentence | first voice chunk "
          "| end to end | answer chars | coordinator CPU ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    words = {"realtime": "`/v1/realtime` (server_vad, voice per sentence)",
             "http-sentence": "3 HTTP calls, first sentence spoken (push-to-talk)",
             "http-whole": "3 HTTP calls, whole answer spoken (push-to-talk)"}
    for name in sides:
        ends = [median(name, stage) for stage in STAGES]
        cells, before = [], 0.0
        for _stage, end in zip(STAGES, ends, strict=True):  # each stage's own share
            cells.append(f"{end - before:.0f}")
            before = end
        print(f"| {words[name]} | {' | '.join(cells)} | {median(name, STAGES[-1]):.0f} "
              f"| {median(name, 'chars'):.0f} | {median(name, 'coordinator CPU'):.0f} |")
    print("\n(each stage: the median of its end minus the median of the stage before; end to "
          "end: the median of the first audio byte; coordinator CPU: the coordinator process's "
          "own CPU time over the whole round, its workers' not counted)")


if __name__ == "__main__":
    main()
