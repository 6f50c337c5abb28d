"""The usage ledger's write rate: N rows recorded on the event loop, then the time until the
writer thread has them all on disk (SQLite, WAL, synchronous=NORMAL, batches of ``--batch``
rows every ``--flush-s``), plus what recording costs the loop and what a report query costs.

Two ways of ending: the background writer alone (the daemon's path: batches as they fill)
and one ``flush()`` of everything (a query's path). The loop's worst stall while the writer
runs is measured by a ticker every 1 ms: the writes must not run on the loop. Goal: at least
5,000 rows/s on disk.

    .venv/bin/python benchmarks/ledger_writes.py [--rows 50000] [--batch 1000] [--flush-s 0.25]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from model_boss.tenancy.usage import UsageLedger, UsageRow

GOAL_ROWS_S = 5000


def rows(n: int) -> list[UsageRow]:
    """``n`` requests over the last day, in the order they finished (as the ledger sees
    them): 20 keys, 200 end users, 8 models."""
    rng = random.Random(1)
    now = time.time()
    return [UsageRow(key=f"key-{rng.randrange(20)}", end_user=f"user-{rng.randrange(200)}",
                     model=f"model-{rng.randrange(8)}", endpoint="chat", outcome="ok",
                     http_status=200, request_id=f"req-{i}", at=now - 86400 * (1 - i / n),
                     queue_wait_s=rng.uniform(0, 1), duration_s=rng.uniform(0, 3),
                     prompt_tokens=rng.randrange(2000), completion_tokens=rng.randrange(500),
                     gpu_seconds=rng.uniform(0, 2), vram_mb_seconds=rng.uniform(0, 8000))
            for i in range(n)]


class Ticker:
    """The loop's worst lateness for a 1 ms sleep while it runs."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            self.worst = max(self.worst, time.perf_counter() - before - 0.001)

    def __enter__(self) -> Ticker:
        self._task = asyncio.create_task(self._tick())
        return self

    def __exit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def one_run(path: Path, batch: list[UsageRow], args: argparse.Namespace,
                  ending: str) -> dict[str, float]:
    ledger = UsageLedger(path, flush_s=args.flush_s, batch=args.batch)
    await ledger.start()
    with Ticker() as ticker:
        began = time.perf_counter()
        for row in batch:
            ledger.record(row)
        recorded = time.perf_counter()
        if ending == "flush()":
            await ledger.flush()
        else:
            while True:  # polled: the ledger offers no "written" signal, nor needs one
                if ledger.written >= len(batch):
                    break
                await asyncio.sleep(0.001)
        done = time.perf_counter()
    asked = time.perf_counter()
    answer = await ledger.query(start=None, end=None, group_by=["key", "model"])
    queried = time.perf_counter()
    await ledger.stop()
    assert sum(r["requests"] for r in answer) >= len(batch)
    return {"record_us": (recorded - began) / len(batch) * 1e6,
            "rows_s": len(batch) / (done - began), "stall_ms": ticker.worst * 1000,
            "query_ms": (queried - asked) * 1000, "groups": len(answer)}


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--flush-s", type=float, default=0.25)
    args = parser.parse_args()
    batch = rows(args.rows)
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for ending in ("background writer", "flush()"):
            results[ending] = await one_run(Path(folder) / f"{ending[:5]}.sqlite3", batch,
                                            args, ending)
    print(f"\nUsage ledger: {args.rows:,} rows recorded at once, batch {args.batch}, "
          f"flush_s {args.flush_s} (goal ≥ {GOAL_ROWS_S:,} rows/s on disk)\n")
    print("| written by | rows/s on disk | record() µs/row | worst loop stall ms | "
          "query key,model ms (groups) |")
    print("|---|---|---|---|---|")
    for ending, r in results.items():
        print(f"| {ending} | {r['rows_s']:,.0f} | {r['record_us']:.2f} | {r['stall_ms']:.1f} | "
              f"{r['query_ms']:.1f} ({r['groups']:.0f}) |")
    return 0 if min(r["rows_s"] for r in results.values()) >= GOAL_ROWS_S else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
