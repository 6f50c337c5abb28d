"""LoRA adapters on a warm base against swapping whole copies, and a draft model against none.

1. Adapter switching. One coordinator serves the demo GGUF (SmolLM2-135M) as ``smol`` with two
   LoRA adapters (``smol-a``, ``smol-b``: random rank-4 LoRAs the benchmark writes with
   ``tests.lora_fixtures.write_lora_gguf``), and two plain copies of the same GGUF (``copy-a``,
   ``copy-b``) on a declared GPU sized so that it holds ``smol`` and one copy, not both
   (``smol`` is pinned so the copies swap with each other, not with it). In turns, ``--rounds``
   each, each request a chat completion of 16 tokens at temperature 0 (``ignore_eos``: every
   answer is 16 tokens long), timed by the client:

   - (a) ``smol`` right after ``smol`` (the baseline);
   - ``smol-a`` right after ``smol-a`` (the adapter applied, no switch);
   - (b) ``smol-a`` right after ``smol-b`` (a switch between adapters on the warm base);
   - (c) ``copy-a`` right after ``copy-b`` (a swap between two copies: a stop and a load).

   The order of the four turns rotates from round to round.

2. Draft. A second coordinator serves the demo GGUF with itself as its draft (``draft_max``
   8) and without one; in turns, 64 tokens at temperature 0 (``ignore_eos``) of an answer
   that runs long; tokens/s from the worker's ``timings.predicted_per_second`` and from the
   client's wall time, and the acceptance rate from the model's status.

Each part prints one table of medians with ratios against its baseline, measured in the same
run. A draft as big as its model cannot speed anything up (it costs what the model costs):
this shows the machinery (acceptance near 1), not a speed-up, which needs a real pair (a 7B
with a 0.5B draft of its family) on a GPU.

    .venv/bin/python benchmarks/adapters_drafts.py [--rounds 7] [--threads N]

``--threads`` defaults to llama.cpp's own (a thread per core); on a CPU box shared with other
work give 1: two spinning threads a worker on two busy cores wait on each other and collapse.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.harness import (
    DEFAULT_THREADS,
    DEMO_GGUF,
    BenchServer,
    check_sides,
    demo_manifest,
    llama_flags,
    worker_argv,
)
from tests.lora_fixtures import write_lora_gguf

CTX_SIZE = 1024
SWITCH_TOKENS = 16
DRAFT_TOKENS = 64
DRAFT_MAX = 8
MODEL_MB = 1000  # each copy's and the base's vram_mb
# the declared GPU holds the base and one copy (2 x 1000 + the default 512 MB margin), not two
GPU_MB = 3000
SWITCH_PROMPT = "The capital of France is"
DRAFT_PROMPT = ("Write a long, detailed story about a lighthouse keeper who finds a message "
                "in a bottle. Describe every day of the week.")
# (label, model asked for just before, model timed)
SWITCH_TURNS = (("(a) base after base", "smol", "smol"),
                ("adapter A after adapter A", "smol-a", "smol-a"),
                ("(b) adapter A after adapter B", "smol-b", "smol-a"),
                ("(c) copy-a after copy-b (swap)", "copy-b", "copy-a"))


def chat(server: BenchServer, model: str, content: str, max_tokens: int) -> dict[str, Any]:
    """One chat completion, its answer with the client's seconds as ``elapsed``."""
    started = time.perf_counter()
    reply = httpx.post(server.url + "/v1/chat/completions", timeout=600, json={
        "model": model, "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens, "temperature": 0, "seed": 1, "ignore_eos": True})
    elapsed = time.perf_counter() - started
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    assert answer["usage"]["completion_tokens"] == max_tokens, answer["usage"]
    return {**answer, "elapsed": elapsed}


def timing(answer: dict[str, Any], name: str) -> float:
    """One of llama.cpp's own timings of an answer (nan where it gave none)."""
    return float((answer.get("timings") or {}).get(name, float("nan")))


def worker_side(server: BenchServer, manifest: dict, **more: Any) -> dict[str, Any]:
    """A side: its manifest's fields (less its id) and the figure-changing flags its worker
    really runs with."""
    return {**{k: v for k, v in manifest.items() if k != "id"},
            **llama_flags(worker_argv(server, manifest["id"])), **more}


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def adapter_switching(root: Path, rounds: int, threads: int) -> None:
    loras = {name: write_lora_gguf(root / f"smol-{name}.gguf", DEMO_GGUF, seed=seed)
             for seed, name in enumerate("ab")}
    base = demo_manifest("smol", threads=threads, ctx_size=CTX_SIZE, vram_mb=MODEL_MB, pin=True,
                         adapters=[{"id": f"smol-{n}", "path": str(p)} for n, p in loras.items()])
    copies = [demo_manifest(m, threads=threads, ctx_size=CTX_SIZE, vram_mb=MODEL_MB)
              for m in ("copy-a", "copy-b")]
    server = BenchServer(root / "switching", {
        "log_level": "WARNING", "gpus": [{"index": 0, "name": "sim-3g", "vram_mb": GPU_MB}]},
        [base, *copies]).start()
    answers: dict[str, list[dict]] = {label: [] for label, _, _ in SWITCH_TURNS}
    try:
        for model in ("smol", "smol-a", "smol-b", "copy-a", "copy-b"):
            chat(server, model, SWITCH_PROMPT, SWITCH_TOKENS)  # every worker started once
        sides = {"(a) base": worker_side(server, base, asked="smol"),
                 "(b) adapters": worker_side(server, base, asked="smol-a/smol-b"),
                 "(c) copies": worker_side(server, copies[1], asked="copy-a/copy-b")}
        check_sides(sides, ["adapters", "pin", "asked"], "adapter switching, sides compared")
        for turn in range(rounds):
            for i in range(len(SWITCH_TURNS)):
                label, before, timed = SWITCH_TURNS[(turn + i) % len(SWITCH_TURNS)]
                chat(server, before, SWITCH_PROMPT, SWITCH_TOKENS)
                answers[label].append(chat(server, timed, SWITCH_PROMPT, SWITCH_TOKENS))
        events = httpx.get(server.url + "/api/v1/events?stream=false", timeout=30).json()
        slots = server.status()["slots"]
    finally:
        server.stop()
    loads = [e["seconds"] for e in events["events"]
             if e["type"] == "loaded" and e.get("model", "").startswith("copy-")]
    smol = next(s for s in slots if s["model"] == "smol")
    baseline = med([a["elapsed"] for a in answers[SWITCH_TURNS[0][0]]])
    print(f"\nadapter switching, SmolLM2-135M Q4_1 on the CPU ({threads} threads), "
          f"{SWITCH_TOKENS} tokens per answer, temperature 0, medians of {rounds} rounds "
          "taken in turns; seconds from the client, and the worker's own timings")
    print(f"{'request':<33}{'median s':>9}{'x (a)':>7}{'prompt tokens computed':>24}"
          f"{'prompt s':>10}{'generation s':>14}")
    for label, _, _ in SWITCH_TURNS:
        taken = answers[label]
        elapsed = med([a["elapsed"] for a in taken])
        print(f"{label:<33}{elapsed:>9.3f}{elapsed / baseline:>7.2f}"
              f"{med([timing(a, 'prompt_n') for a in taken]):>24.0f}"
              f"{med([timing(a, 'prompt_ms') for a in taken]) / 1000:>10.3f}"
              f"{med([timing(a, 'predicted_ms') for a in taken]) / 1000:>14.3f}")
    print(f"of (c): the copy's load (the coordinator's 'loaded' event, worker start to "
          f"ready) {med(loads):.3f} s, median of {len(loads)}, and the default reclaim_sleep_s "
          "of 2 s (without NVML a stopped worker's VRAM is waited for that long); "
          f"smol: {smol['loads']} load in the whole run, adapters {smol.get('adapters')}")
    print("(b) computes its prompt again: llama.cpp drops a slot's cached prompt when a "
          "request's adapters differ from the last one's (that KV was computed under other "
          "weights), so a switch costs the prompt's prefill, growing with its length")


def draft_speed(root: Path, rounds: int, threads: int) -> None:
    plain = demo_manifest("plain", threads=threads, ctx_size=CTX_SIZE)
    fast = demo_manifest("fast", threads=threads, ctx_size=CTX_SIZE, draft=str(DEMO_GGUF),
                         draft_max=DRAFT_MAX)
    server = BenchServer(root / "draft", {
        "log_level": "WARNING", "gpus": [{"index": 0, "name": "sim-8g", "vram_mb": 8192}]},
        [plain, fast]).start()
    worker: dict[str, list[float]] = {"plain": [], "fast": []}
    wall: dict[str, list[float]] = {"plain": [], "fast": []}
    try:
        for model in ("plain", "fast"):
            chat(server, model, DRAFT_PROMPT, DRAFT_TOKENS)  # both loaded, before the counts
        before = httpx.get(server.url + "/api/v1/models/fast/status",
                           timeout=30).json()["draft_figures"]
        check_sides({"without a draft": worker_side(server, plain),
                     "with itself as draft": worker_side(server, fast)},
                    ["draft", "draft_max"], "draft, sides compared")
        for turn in range(rounds):
            for model in ("plain", "fast") if turn % 2 == 0 else ("fast", "plain"):
                answer = chat(server, model, DRAFT_PROMPT, DRAFT_TOKENS)
                timings = answer.get("timings") or {}
                if "predicted_per_second" in timings:
                    worker[model].append(timings["predicted_per_second"])
                wall[model].append(DRAFT_TOKENS / answer["elapsed"])
        after = httpx.get(server.url + "/api/v1/models/fast/status",
                          timeout=30).json()["draft_figures"]
    finally:
        server.stop()
    drafted = after["drafted_tokens"] - (before or {}).get("drafted_tokens", 0)
    accepted = after["accepted_tokens"] - (before or {}).get("accepted_tokens", 0)
    print(f"\ndraft model, SmolLM2-135M Q4_1 with itself as draft (draft_max {DRAFT_MAX}) "
          f"against none, on the CPU ({threads} threads), {DRAFT_TOKENS} tokens per answer, "
          f"temperature 0, medians of {rounds} rounds taken in turns")
    print(f"{'side':<28}{'worker tok/s':>14}{'x none':>8}{'client tok/s':>14}{'x none':>8}"
          f"{'acceptance':>12}")
    for model, label in (("plain", "without a draft"), ("fast", "itself as draft")):
        own = f"{med(worker[model]):>14.1f}{med(worker[model]) / med(worker['plain']):>8.2f}" \
            if worker[model] else f"{'(none)':>14}{'':>8}"
        print(f"{label:<28}{own}{med(wall[model]):>14.1f}"
              f"{med(wall[model]) / med(wall['plain']):>8.2f}"
              f"{f'{accepted / drafted:.3f}' if model == 'fast' and drafted else '':>12}")
    print(f"the draft's counters over the timed rounds: {drafted} tokens drafted, {accepted} "
          f"accepted; over the whole run (status): {after}")
    print("a draft as big as its model costs what the model costs: acceptance near 1 shows "
          "the machinery works, not a speed-up; on 2 shared CPU cores the model's verification "
          "of a drafted batch is not free as it is on a GPU. A real pair (a 7B with a 0.5B "
          "draft of its family) needs a GPU to show the gain.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    parser.add_argument("--skip-draft", action="store_true", help="part 1 only")
    parser.add_argument("--skip-switching", action="store_true", help="part 2 only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_switching:
            adapter_switching(Path(tmp), args.rounds, args.threads)
        if not args.skip_draft:
            draft_speed(Path(tmp), args.rounds, args.threads)


if __name__ == "__main__":
    main()
