"""BusyShare: a slot's busy time divided among the requests it served at once."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model_boss.tenancy.usage import BusyShare

# (name, [(enter_at, leave_at) per request], expected share per request)
CASES = [
    ("alone", [(0, 10)], [10]),
    ("one after another", [(0, 4), (4, 10)], [4, 6]),
    ("a gap between", [(0, 2), (5, 6)], [2, 1]),
    ("two at once, same span", [(0, 10), (0, 10)], [5, 5]),
    # 0-2 alone (2), 2-4 shared (1 each), 4-8 the second alone (4)
    ("two overlapping", [(0, 4), (2, 8)], [3, 5]),
    # 0-6 the long one; 2-4 three at once
    ("three nested", [(0, 6), (2, 4), (2, 4)], [2 + 2 / 3 + 2, 2 / 3, 2 / 3]),
    ("zero length", [(3, 3)], [0]),
]


def _shares(spans: list[tuple[float, float]]) -> tuple[list[float], BusyShare]:
    clock = BusyShare()
    # at one moment: leaves first, then enters, then the leaves of zero-length requests
    events = sorted([(start, 1, n) for n, (start, _) in enumerate(spans)]
                    + [(stop, 0 if stop > start else 2, n)
                       for n, (start, stop) in enumerate(spans)])
    tokens: dict[int, int] = {}
    shares = [0.0] * len(spans)
    for at, kind, n in events:
        if kind == 1:
            tokens[n] = clock.enter(at)
        else:
            shares[n] = clock.leave(tokens.pop(n), at)
    return shares, clock


@pytest.mark.parametrize(("spans", "expected"), [(s, e) for _, s, e in CASES],
                         ids=[name for name, _, _ in CASES])
def test_each_request_is_charged_its_share(spans, expected) -> None:
    shares, clock = _shares(spans)
    assert shares == pytest.approx(expected)
    assert sum(shares) == pytest.approx(clock.busy_s)
    assert clock.running == 0


def test_a_clock_going_back_counts_as_standing_still() -> None:
    clock = BusyShare()
    token = clock.enter(10.0)
    assert clock.leave(token, 9.0) == 0.0


def test_leaving_twice_is_an_error() -> None:
    clock = BusyShare()
    token = clock.enter(0.0)
    clock.leave(token, 1.0)
    with pytest.raises(ValueError, match="left twice"):
        clock.leave(token, 2.0)


def _busy_time(spans: list[tuple[float, float]]) -> float:
    """The length of the union of the spans (the slot's busy time, computed apart)."""
    total, end = 0.0, None
    for start, stop in sorted(spans):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 200)), min_size=1,
                max_size=40))
def test_shares_add_up_to_the_busy_time(raw: list[tuple[int, int]]) -> None:
    spans = [(float(start), float(start + length)) for start, length in raw]
    shares, clock = _shares(spans)
    assert sum(shares) == pytest.approx(_busy_time(spans), rel=1e-9, abs=1e-9)
    assert clock.busy_s == pytest.approx(_busy_time(spans), rel=1e-9, abs=1e-9)
    for share, (start, stop) in zip(shares, spans, strict=True):
        assert -1e-9 <= share <= stop - start + 1e-9  # never more than its own time
