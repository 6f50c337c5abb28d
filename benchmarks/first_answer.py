"""Cold first answer vs warm answer for the demo model, through model-boss and direct.

Starts a coordinator (declared GPU, embedded store) serving SmolLM2-135M, then measures with
the official ``openai`` client, in one run:
  - cold: unload, then time one chat request (worker start + model load + answer);
  - warm: the same request with the model loaded (median of N);
  - direct: the same request straight to the worker's own port (the proxy's baseline).
Prints one table of medians and the ratios.

    .venv/bin/python benchmarks/first_answer.py [--rounds 5] [--warm 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.harness import (
    DEFAULT_THREADS,
    BenchServer,
    demo_manifest,
    llama_flags,
    print_sides,
    worker_argv,
    worker_process,
)

BODY = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8,
        "temperature": 0}


def timed(client: openai.OpenAI, model: str) -> float:
    started = time.perf_counter()
    reply = client.chat.completions.create(model=model, **BODY)
    assert reply.choices[0].message.content is not None
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5, help="cold loads to measure")
    parser.add_argument("--warm", type=int, default=20, help="warm requests to measure")
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                        help="llama.cpp threads (its own default: a thread per core)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = BenchServer(Path(tmp), {"log_level": "WARNING"},
                             [demo_manifest("smol", threads=args.threads, ctx_size=1024)]).start()
        try:
            via = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
            cold, loads = [], []
            for _ in range(args.rounds):
                httpx.post(server.url + "/api/v1/models/smol/unload", timeout=30)
                cold.append(timed(via, "smol"))
                loads.append(server.status()["slots"][0]["last_load_s"])
            warm = [timed(via, "smol") for _ in range(args.warm)]
            port = server.status()["slots"][0]["port"]
            key = worker_process(server, "smol").environ()["LLAMA_API_KEY"]  # its own secret
            direct_client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1",
                                          api_key=key, max_retries=0)
            direct = [timed(direct_client, "smol") for _ in range(args.warm)]
            flags = llama_flags(worker_argv(server, "smol"))  # one worker serves both sides
        finally:
            server.stop()
    med = statistics.median
    rows = [
        ("cold first answer (through model-boss)", med(cold), med(cold) / med(direct)),
        ("  of which worker start + load", med(loads), med(loads) / med(direct)),
        ("warm answer (through model-boss)", med(warm), med(warm) / med(direct)),
        ("warm answer (direct to the worker)", med(direct), 1.0),
    ]
    print(f"SmolLM2-135M-Instruct Q4_1, 8 tokens, CPU; medians of {args.rounds} cold / "
          f"{args.warm} warm")
    print(f"{'measurement':<42}{'median s':>10}{'x direct':>10}")
    for name, value, ratio in rows:
        print(f"{name:<42}{value:>10.3f}{ratio:>10.2f}")
    print(f"{'proxy overhead, warm (ms)':<42}{(med(warm) - med(direct)) * 1000:>10.1f}")
    print("the one llama.cpp worker both sides used ran with:")
    print_sides({"worker": flags})


if __name__ == "__main__":
    main()
