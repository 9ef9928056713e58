"""The injection pacer: a token bucket that never lets more through than the receiver's."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from crosstalk.core.pacing import CLAUDE_CAPACITY, CLAUDE_REFILL_PER_SECOND, TokenBucket


def test_a_full_bucket_then_the_refill_rate() -> None:
    b = TokenBucket(capacity=3, rate=0.5)
    assert [b.take(100.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert b.take(100.0) == pytest.approx(2.0)  # one token takes 2 s at 0.5/s
    assert b.take(101.0) == pytest.approx(1.0)
    assert b.take(102.0) == 0.0
    assert b.take(102.0) == pytest.approx(2.0)


def test_drain_empties_the_bucket() -> None:
    b = TokenBucket(capacity=5, rate=1.0)
    assert b.take(0.0) == 0.0
    b.drain(0.0)
    assert b.wait_time(0.0) == pytest.approx(1.0)
    assert b.take(1.0) == 0.0


def test_claude_defaults_stay_under_claudes_bucket() -> None:
    assert CLAUDE_CAPACITY < 30
    assert CLAUDE_REFILL_PER_SECOND <= 0.5


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="capacity"):
        TokenBucket(capacity=0.5)
    with pytest.raises(ValueError, match="capacity"):
        TokenBucket(rate=0)


@given(st.lists(st.floats(min_value=0, max_value=5, allow_nan=False), min_size=1,
                max_size=200))
def test_never_more_than_capacity_plus_rate_times_elapsed(gaps: list[float]) -> None:
    """Whatever the arrival pattern, taken tokens <= capacity + rate * elapsed: what Claude's
    own bucket (30, 0.5/s) would admit, with margin."""
    b = TokenBucket(capacity=CLAUDE_CAPACITY, rate=CLAUDE_REFILL_PER_SECOND)
    now, taken = 0.0, 0
    for gap in gaps:
        now += gap
        if b.take(now) == 0.0:
            taken += 1
        assert taken <= CLAUDE_CAPACITY + CLAUDE_REFILL_PER_SECOND * now + 1e-9
