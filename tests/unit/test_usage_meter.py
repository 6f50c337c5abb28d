"""Meter over the copies of one model: each copy (a slot key, ``smol`` and ``smol#2``) has its
own busy clock and its own load mark, so two copies busy at once are each charged their own
time, and a load is charged once per load of each copy, however requests alternate."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from model_boss.slot_key import SlotKey, slot_key
from model_boss.tenancy.usage.figures import Figures
from model_boss.tenancy.usage.meter import Meter


@dataclass
class Copy:
    """A slot as the meter reads it: one copy of the model ``smol``."""

    replica: int
    loaded_at: float | None
    ready_in_s: float
    leased_mb: int = 1000
    model_id: str = "smol"

    @property
    def key(self) -> SlotKey:
        return slot_key(self.model_id, self.replica)


@dataclass
class Asked:
    key: str = "k"
    end_user: str = ""
    endpoint: str = "/v1/chat/completions"
    request_id: str = "r"


@dataclass
class Ticket:
    slot: Copy
    request: Asked = field(default_factory=Asked)
    figures: Figures = field(default_factory=Figures)
    status: int = 200
    metered: int | None = None
    load_s: float = 0.0
    waited_s: float = 0.0


# (name, the copies' (loaded_at, ready_in_s), requests as (copy, start, end),
#  per request: (gpu_seconds less its load, the load charged to it))
CASES = [
    ("two copies busy at once: each its own time",
     [(100.0, 2.0), (200.0, 3.0)], [(1, 0, 10), (2, 0, 10)],
     [(10, 2.0), (10, 3.0)]),
    ("two copies, overlapping", [(100.0, 2.0), (200.0, 3.0)], [(1, 0, 6), (2, 4, 10)],
     [(6, 2.0), (6, 3.0)]),
    ("alternating: one load per copy", [(100.0, 2.0), (200.0, 3.0)],
     [(1, 0, 1), (2, 1, 2), (1, 2, 3), (2, 3, 4), (1, 4, 5), (2, 5, 6)],
     [(1, 2.0), (1, 3.0), (1, 0.0), (1, 0.0), (1, 0.0), (1, 0.0)]),
    ("two at once on one copy share it", [(100.0, 2.0), (200.0, 3.0)],
     [(1, 0, 10), (1, 0, 10), (2, 0, 10)],
     [(5, 2.0), (5, 0.0), (10, 3.0)]),
    ("a copy never loaded charges no load", [(None, 0.0), (200.0, 3.0)],
     [(1, 0, 4), (2, 0, 4)], [(4, 0.0), (4, 3.0)]),
]


@pytest.mark.parametrize("copies, spans, wanted", [case[1:] for case in CASES],
                         ids=[case[0] for case in CASES])
def test_each_copy_is_charged_its_own_time_and_loads(copies, spans, wanted) -> None:
    meter = Meter()
    slots = {n: Copy(n, loaded_at, ready) for n, (loaded_at, ready) in enumerate(copies, 1)}
    tickets = [Ticket(slots[copy]) for copy, _, _ in spans]
    events = sorted([(start, 1, n) for n, (_, start, _) in enumerate(spans)]
                    + [(end, 0, n) for n, (_, _, end) in enumerate(spans)])
    rows = {}
    for at, kind, n in events:
        if kind == 1:
            meter.granted(tickets[n], now=at)
        else:
            rows[n] = meter.finished(tickets[n], ok=True, client_fault=False,
                                     duration_s=spans[n][2] - spans[n][1], now=at)
    charged = [(round(rows[n].gpu_seconds - rows[n].load_seconds, 9), rows[n].load_seconds)
               for n in range(len(spans))]
    assert charged == [(float(time), load) for time, load in wanted]
    for n, slot in slots.items():  # the shares add up to each copy's busy time
        busy = meter.busy_s(slot.key)
        assert busy == pytest.approx(sum(rows[i].gpu_seconds - rows[i].load_seconds
                                         for i, (copy, _, _) in enumerate(spans) if copy == n))
    assert all(row.model == "smol" for row in rows.values())  # billed to the model


def test_running_is_per_copy() -> None:
    meter = Meter()
    first, second = Ticket(Copy(1, 1.0, 0.0)), Ticket(Copy(2, 1.0, 0.0))
    meter.granted(first, now=0.0)
    meter.granted(second, now=0.0)
    assert meter.running("smol") == [first] and meter.running("smol#2") == [second]
    meter.finished(second, ok=True, client_fault=False, duration_s=1.0, now=1.0)
    assert meter.running("smol#2") == [] and meter.running("smol") == [first]
