"""The serving order alone, in process: what an arrival and a grant cost as the queue grows.

Fills :class:`~model_boss.scheduling.ordering.Lines` (what the queue keeps its order in) with
n waiters over 4 models and 64 clients, then times, per operation: an arrival (``add``), and a
grant (the first waiter of the walk, then its ``discard``), each over 2,000 operations at that
size. Prints one table; the goal is a cost per operation flat within 2× from 1,000 to 100,000.

    .venv/bin/python benchmarks/ordering_scale.py [--sizes 1000,10000,100000]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from model_boss.scheduling.ordering import Lines, OrderPolicy, Waiter

OPS = 2000


class Waiting:
    def __init__(self, waiter: Waiter) -> None:
        self.waiter, self.model_id = waiter, waiter.model_id


def waiting(rng: random.Random, at: float) -> Waiting:
    return Waiting(Waiter(f"m{rng.randrange(4)}", rng.randrange(10), f"c{rng.randrange(64)}",
                          at, float(rng.randrange(50))))


def measure(n: int) -> tuple[float, float]:
    rng = random.Random(n)
    lines = Lines(OrderPolicy())
    for i in range(n):
        lines.add(waiting(rng, i * 0.001))
    credits = {"m0": 2.0, "m1": 5.0}
    extra = [waiting(rng, n * 0.001 + i * 0.001) for i in range(OPS)]
    started = time.perf_counter()
    for item in extra:
        lines.add(item)
    arrival = (time.perf_counter() - started) / OPS
    started = time.perf_counter()
    for _ in range(OPS):
        first = next(iter(lines.walk(credits)))
        lines.discard(first)
    grant = (time.perf_counter() - started) / OPS
    return arrival, grant


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    args = parser.parse_args()
    rows = [(n, *measure(n)) for n in (int(s) for s in args.sizes.split(","))]
    base_a, base_g = rows[0][1], rows[0][2]
    print(f"\nThe serving order alone: {OPS:,} arrivals and {OPS:,} grants at each size, "
          "4 models, 64 clients, aging and fair share on\n")
    print("| waiting | arrival, µs | x smallest | grant, µs | x smallest |")
    print("|---:|---:|---:|---:|---:|")
    for n, arrival, grant in rows:
        print(f"| {n:,} | {arrival * 1e6:.1f} | {arrival / base_a:.2f}× | {grant * 1e6:.1f} | "
              f"{grant / base_g:.2f}× |")


if __name__ == "__main__":
    main()
