"""MinuteWindows: each key's last minute of requests and tokens, its token sum kept as
entries come and go, read without copying the minute."""

from __future__ import annotations

import random

from model_boss.tenancy.keys import MinuteWindows


def test_a_reading_holds_the_last_minute_and_its_token_sum():
    rng = random.Random(39)
    windows = MinuteWindows()
    events: list[tuple[float, int]] = []
    admitted: list[float] = []
    now = 1000.0
    for _ in range(5000):
        now += rng.uniform(0, 0.1)
        if rng.random() < 0.5:
            windows.admitted("k", now)
            admitted.append(now)
        else:
            tokens = rng.randrange(-1, 50)
            windows.used("k", now, tokens)
            if tokens > 0:
                events.append((now, tokens))
        if rng.random() < 0.1:
            reading = windows.reading("k", now)
            recent = [e for e in events if e[0] > now - 60]
            assert list(reading.token_events) == recent
            assert reading.tokens == sum(n for _, n in recent)
            assert list(reading.request_times) == [t for t in admitted if t > now - 60]
    assert windows.reading("k", now + 61).tokens == 0
    empty = windows.reading("nobody", now)
    assert (len(empty.request_times), empty.tokens) == (0, 0)
