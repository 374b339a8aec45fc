"""Token buckets (token_bucket.py): exact numbers, then properties."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fusethrottle.metering.token_bucket import TokenBucket

KiB = 1024
MiB = 1024 * KiB


def test_a_full_bucket_lets_the_burst_through_at_once_then_paces_at_the_rate() -> None:
    bucket = TokenBucket(rate=100.0, burst=50.0, now=0.0)
    assert bucket.delay_for(0.0, 50.0) == 0.0
    assert bucket.delay_for(0.0, 10.0) == pytest.approx(0.1)
    assert bucket.delay_for(0.0, 10.0) == pytest.approx(0.2)  # waits behind the first


def test_a_request_larger_than_the_burst_passes_after_its_debt_is_paid() -> None:
    bucket = TokenBucket(rate=1000.0, burst=100.0, now=0.0)
    assert bucket.delay_for(0.0, 1100.0) == pytest.approx(1.0)
    assert bucket.available(1.0) == pytest.approx(0.0)


def test_rate_zero_is_unlimited() -> None:
    bucket = TokenBucket(rate=0.0, burst=0.0, now=0.0)
    assert all(bucket.delay_for(0.0, 1e12) == 0.0 for _ in range(10))


def test_an_idle_bucket_refills_only_up_to_its_burst() -> None:
    bucket = TokenBucket(rate=10.0, burst=5.0, now=0.0)
    bucket.delay_for(0.0, 5.0)
    assert bucket.available(1000.0) == pytest.approx(5.0)
    assert bucket.delay_for(1000.0, 6.0) == pytest.approx(0.1)


def test_a_refund_returns_an_abandoned_reservation() -> None:
    bucket = TokenBucket(rate=10.0, burst=10.0, now=0.0)
    bucket.delay_for(0.0, 10.0)
    assert bucket.delay_for(0.0, 10.0) == pytest.approx(1.0)
    bucket.refund(0.0, 10.0)  # that waiter timed out
    assert bucket.delay_for(0.0, 10.0) == pytest.approx(1.0)


def _run_writers(
    bucket: TokenBucket, sizes: list[float], until: float
) -> list[tuple[float, float]]:
    """Writers that each send a request, sleep what the bucket says, and send again.

    Returns (time the request passed, size) for every request; writers run in a round so
    concurrent callers interleave exactly as they would on the event loop.
    """
    ready = [0.0] * len(sizes)
    passed: list[tuple[float, float]] = []
    while min(ready) < until:
        i = min(range(len(ready)), key=lambda k: ready[k])
        now = ready[i]
        go = now + bucket.delay_for(now, sizes[i])
        passed.append((go, sizes[i]))
        ready[i] = go
    return passed


@pytest.mark.parametrize(
    "sizes",
    [[1 * MiB], [64 * KiB] * 8, [1 * MiB, 4 * KiB, 256 * KiB], [64 * MiB]],
    ids=["one-writer", "8-small-writers", "mixed", "bigger-than-burst"],
)
def test_long_run_rate_is_within_one_percent(sizes: list[float]) -> None:
    rate, burst = 20 * MiB, 8 * MiB
    bucket = TokenBucket(rate=rate, burst=burst, now=0.0)
    passed = _run_writers(bucket, sizes, until=200.0)
    # Measure after the initial burst: the whole run, and every 10 s window a user would see.
    moved = sum(n for t, n in passed if 10.0 <= t < 200.0)
    assert moved / 190.0 == pytest.approx(rate, rel=0.01)
    for start in range(10, 190, 10):
        window = sum(n for t, n in passed if start <= t < start + 10)
        assert window / 10.0 == pytest.approx(rate, rel=0.05 + max(sizes) / (10 * rate))


def test_small_requests_are_not_starved_behind_a_large_one() -> None:
    bucket = TokenBucket(rate=1 * MiB, burst=1 * MiB, now=0.0)
    passed = _run_writers(bucket, [16 * MiB, 4 * KiB], until=120.0)
    small = [t for t, n in passed if n == 4 * KiB]
    gaps = [b - a for a, b in itertools.pairwise(small)]
    assert max(gaps) <= 16.1  # at most one large request ahead of each small one


@given(
    rate=st.floats(1.0, 1e9),
    burst=st.floats(1.0, 1e9),
    requests=st.lists(st.tuples(st.floats(0.0, 10.0), st.floats(0.0, 1e9)), max_size=40),
)
def test_what_passes_never_exceeds_burst_plus_rate_times_elapsed(
    rate: float, burst: float, requests: list[tuple[float, float]]
) -> None:
    bucket = TokenBucket(rate=rate, burst=burst, now=0.0)
    now, total = 0.0, 0.0
    for gap, amount in requests:
        now += gap
        delay = bucket.delay_for(now, amount)
        assert delay >= 0.0
        if amount == 0:
            assert delay == 0.0  # nothing to move, nothing to wait for
            continue
        total += amount
        passes_at = now + delay
        assert total <= burst + rate * passes_at + 1e-6 * (total + burst)


@given(rate=st.floats(1.0, 1e6), burst=st.floats(1.0, 1e6), amount=st.floats(0.0, 1.0))
def test_a_rested_bucket_never_delays_a_request_within_its_burst(
    rate: float, burst: float, amount: float
) -> None:
    bucket = TokenBucket(rate=rate, burst=burst, now=0.0)
    bucket.delay_for(0.0, burst * 3)
    rested = 3 * burst / rate + burst / rate  # debt paid, then a full refill
    assert bucket.delay_for(rested, amount * burst) == 0.0
