"""HourlyTotals: what a key spent since a moment, from hour and day sums, equal to adding up
every row of those hours; and the periods quotas count over."""

from __future__ import annotations

import random
from datetime import UTC, datetime

from model_boss.tenancy.usage import UsageRow, day_start, hour_of, month_start
from model_boss.tenancy.usage.totals import HourlyTotals, Spent

NOW = datetime(2025, 3, 31, 13, 20, tzinfo=UTC).timestamp()


def row(key: str, at: float, tokens: int, gpu: float) -> UsageRow:
    return UsageRow(key=key, end_user="", model="m", endpoint="chat", outcome="ok",
                    http_status=200, at=at, prompt_tokens=tokens, completion_tokens=1,
                    images=tokens % 2, audio_seconds=0.5, gpu_seconds=gpu)


def test_spent_is_the_sum_of_every_row_since_its_hour():
    rng = random.Random(39)
    rows = [row(rng.choice("ab"), NOW - rng.uniform(0, 31 * 86400), rng.randrange(100),
                rng.randrange(1000) / 8) for _ in range(3000)]
    totals = HourlyTotals()
    for one in sorted(rows, key=lambda r: r.at):
        totals.add(one)
    seeded = HourlyTotals()  # a restart: the database's hours seeded, then new rows
    for one in rows:
        if one.at < NOW - 86400:
            seeded.seed(one.key, hour_of(one.at), Spent(1, one.tokens, one.images, 0.5,
                                                        one.gpu_seconds))
    for one in rows:
        if one.at >= NOW - 86400:
            seeded.add(one)
    sinces = [day_start(NOW), month_start(NOW), NOW - 7 * 86400 - 1234, NOW - 5, 0.0,
              *(NOW - rng.uniform(0, 32 * 86400) for _ in range(50))]
    for key in "abz":
        for since in sinces:
            first = hour_of(since)
            counted = [r for r in rows if r.key == key and hour_of(r.at) >= first]
            for book in (totals, seeded):
                spent = book.spent(key, since)
                assert (spent.requests, spent.tokens, spent.images) == (
                    len(counted), sum(r.tokens for r in counted),
                    sum(r.images for r in counted)), (key, since)
                assert spent.gpu_seconds == sum(r.gpu_seconds for r in counted)
                assert spent.audio_seconds == 0.5 * len(counted)


def test_day_and_month_starts_agree_with_the_calendar():
    rng = random.Random(7)
    for now in [0.0, 86399.999, 86400.0, 951782400.0, NOW,
                *(rng.uniform(0, 4e9) for _ in range(2000))]:
        moment = datetime.fromtimestamp(now, UTC)
        assert day_start(now) == moment.replace(hour=0, minute=0, second=0,
                                                microsecond=0).timestamp()
        assert month_start(now) == moment.replace(day=1, hour=0, minute=0, second=0,
                                                  microsecond=0).timestamp()
