"""The fleet budget's local rules (fleet_share.py): lease sizes, pacing, expiry, fallback.

Pure and on a fake clock: each test states one rule a user relies on.
"""

from __future__ import annotations

import math

import pytest

from fusethrottle.metering.fleet_share import (
    IDLE_RELEASE,
    LEASE_EXPIRY_FACTOR,
    LEASE_MAX_SECONDS,
    LEASE_MIN_SECONDS,
    LEASE_TARGET_BYTES,
    Fallback,
    Grant,
    LeasePool,
    lease_seconds,
)

MiB = 1 << 20
GiB = 1 << 30


def grant(metered: float, share: float, units: float = 0.0, share_units: float = 0.0) -> Grant:
    return Grant(metered, units, share, share_units, 3 * share, 3 * share_units, 3, 3.0)


@pytest.mark.parametrize("share", [16 * MiB, 20 * MiB, 60 * MiB, 160 * MiB])
def test_round_trips_per_gib_stay_under_100_from_16_mib_per_second(share: float) -> None:
    seconds = lease_seconds(share, 0)
    assert GiB / (share * seconds) < 100
    assert LEASE_MIN_SECONDS <= seconds <= LEASE_MAX_SECONDS


def test_a_very_fast_mount_asks_at_most_ten_times_a_second() -> None:
    assert lease_seconds(2000 * MiB, 0) == LEASE_MIN_SECONDS


def test_a_slow_mount_does_not_hoard_more_than_a_second_of_its_share() -> None:
    assert lease_seconds(1 * MiB, 0) == LEASE_MAX_SECONDS
    assert lease_seconds(0, 0) == LEASE_MAX_SECONDS


def test_the_tighter_resource_sizes_the_lease() -> None:
    # 20 MiB/s alone would allow 0.8 s; 20000 units/s wants 4096 units = 0.2 s.
    assert lease_seconds(20 * MiB, 20000) == pytest.approx(0.2048)


def test_no_lease_means_wait_for_one() -> None:
    pool = LeasePool(now=0.0)
    assert pool.allowance(0.0) == (0.0, 0.0)
    assert pool.needs_lease(0.0, waiting=True)


def test_small_writes_spend_the_lease_without_asking_redis_again() -> None:
    pool = LeasePool(now=0.0)
    pool.granted(0.0, grant(16 * MiB, 20 * MiB))
    asks = 0
    now = 0.0
    for _ in range(1000):  # 4 MiB in 4 KiB writes at the pace: a quarter of the lease
        assert pool.allowance(now)[0] >= 4096
        pool.spent(now, 4096, 0, busy=False)
        now += 4096 / pool.pace()[0]
        asks += pool.needs_lease(now, waiting=False)
    assert asks == 0


def test_a_lease_is_spent_at_the_share_it_was_granted_for() -> None:
    """A mount cannot burn 16 MiB in a moment and crowd out the fleet: the writers are handed
    its share as their pace (the engine's gate waits it out: window_test.cc)."""
    pool = LeasePool(now=0.0)
    pool.granted(0.0, grant(16 * MiB, 20 * MiB))
    assert pool.pace() == (20 * MiB, 0)
    assert pool.allowance(0.0) == (16 * MiB, math.inf)  # the fleet limits no units/s


def test_a_request_bigger_than_what_is_left_passes_and_the_next_lease_pays() -> None:
    pool = LeasePool(now=0.0)
    pool.granted(0.0, grant(MiB // 2, 20 * MiB))
    assert pool.allowance(0.0)[0] > 0  # so a request of 1 MiB goes
    pool.spent(0.0, MiB, 0, busy=False)
    assert pool.allowance(0.0)[0] == 0  # in debt now: the next one waits
    metered, _ = pool.want()
    lease = 20 * MiB * lease_seconds(20 * MiB, 0, 60 * MiB, 0)
    assert metered == pytest.approx(MiB // 2 + lease)  # a whole lease plus the debt


def test_renewal_comes_before_the_lease_runs_out() -> None:
    pool = LeasePool(now=0.0)
    pool.granted(0.0, grant(16 * MiB, 20 * MiB))
    now = 0.0
    while not pool.needs_lease(now, waiting=False):
        assert pool.allowance(now)[0] >= MiB, "writers had to wait for a lease"
        pool.spent(now, MiB, 0, busy=False)
        now += MiB / pool.pace()[0]
    assert pool.balance_metered > 0


def test_unspent_tokens_expire() -> None:
    pool = LeasePool(now=0.0)
    pool.granted(0.0, grant(16 * MiB, 20 * MiB))
    later = pool.period * LEASE_EXPIRY_FACTOR + 0.01
    assert pool.allowance(pool.period)[0] == 16 * MiB
    assert pool.allowance(later)[0] == 0


def test_an_idle_mount_gives_its_lease_back() -> None:
    pool = LeasePool(now=0.0)
    pool.granted(0.0, grant(16 * MiB, 20 * MiB))
    pool.spent(0.0, MiB, 0, busy=False)
    assert not pool.idle(IDLE_RELEASE / 2)
    assert pool.idle(IDLE_RELEASE + 0.01)
    assert not pool.needs_lease(IDLE_RELEASE + 0.01, waiting=False)
    back, _ = pool.release()
    assert back == 15 * MiB
    assert not pool.idle(10.0)  # released once


def test_a_short_grant_is_not_retried_at_once() -> None:
    """The fleet's bucket was empty: asking again every tick would only cost round trips."""
    pool = LeasePool(now=0.0)
    pool.granted(0.0, grant(0, 20 * MiB))
    assert not pool.needs_lease(0.01, waiting=True)
    assert pool.needs_lease(pool.next_ask, waiting=True)


def test_the_pace_is_the_share_whatever_was_granted() -> None:
    pool = LeasePool(now=0.0)
    pool.granted(0.0, grant(2 * MiB, 20 * MiB))  # a short grant: the bucket was low
    assert pool.statistics().pace_metered == 20 * MiB


def test_fallback_paces_at_the_last_share_and_needs_no_lease() -> None:
    pool = LeasePool(now=0.0)
    pool.granted(0.0, grant(16 * MiB, 20 * MiB))
    rates = Fallback().rates(pool.share_metered, pool.share_units)
    pool.fallback(1.0, *rates)
    assert not pool.needs_lease(1.0, waiting=True)
    assert pool.allowance(1.0) == (math.inf, math.inf)
    assert pool.pace() == (20 * MiB, 0)


def test_fixed_fallback_rate() -> None:
    assert Fallback(5 * MiB).rates(20 * MiB, 100) == (5 * MiB, 100)
    assert Fallback().rates(0, 0) == (0, 0)  # never joined: only local ceilings


def test_a_new_lease_after_fallback_rejoins() -> None:
    pool = LeasePool(now=0.0)
    pool.fallback(0.0, 10 * MiB, 0)
    pool.granted(1.0, grant(16 * MiB, 20 * MiB))
    assert pool.leasing
    assert pool.allowance(1.0)[0] == 16 * MiB


def test_first_ask_is_one_target_lease() -> None:
    assert LeasePool(now=0.0).want()[0] == LEASE_TARGET_BYTES


def test_a_budget_of_bytes_only_never_holds_a_write_for_units() -> None:
    pool = LeasePool(now=0.0)
    pool.granted(0.0, grant(16 * MiB, 20 * MiB))  # the fleet sets no units/s
    for _ in range(100):
        pool.spent(0.0, 1024, 5, busy=False)
    assert pool.allowance(0.0)[1] == math.inf
    assert pool.pace()[1] == 0
    assert pool.want()[1] == 0


def test_a_lease_is_at_most_half_the_shared_bucket() -> None:
    """A lone mount's ask must fit the fleet's bucket, or every grant would come back short."""
    from fusethrottle.metering.fleet_share import BUCKET_SECONDS

    for fleet in (10 * MiB, 60 * MiB, 600 * MiB):
        lease = fleet * lease_seconds(fleet, 0, fleet, 0)
        assert lease <= fleet * BUCKET_SECONDS / 2 or lease_seconds(fleet, 0) == LEASE_MIN_SECONDS


def test_the_first_lease_after_the_fallback_keeps_the_old_pace() -> None:
    """The first mount back from an outage sees a fleet of one: it must not take it all."""
    pool = LeasePool(now=0.0)
    pool.granted(0.0, grant(16 * MiB, 20 * MiB))
    pool.fallback(1.0, 20 * MiB, 0)
    pool.granted(2.0, grant(16 * MiB, 60 * MiB), gentle=True)
    assert pool.statistics().pace_metered == 20 * MiB
    pool.granted(3.0, grant(16 * MiB, 60 * MiB))
    assert pool.statistics().pace_metered == 60 * MiB


def test_writes_queued_for_their_pace_keep_the_mount_active() -> None:
    """Twelve 1 MiB writes at 20 MiB/s wait up to 0.55 s: the mount is not idle meanwhile."""
    pool = LeasePool(now=0.0)
    pool.granted(0.0, grant(16 * MiB, 20 * MiB))
    pool.spent(0.0, 12 * MiB, 0, busy=True)
    for now in (0.1, 0.2, 0.3, 0.4, 0.5):  # the renewer's looks while they wait
        assert not pool.idle(now)
        pool.spent(now, 0, 0, busy=True)
    pool.spent(0.55, 0, 0, busy=False)  # the last one went
    assert not pool.idle(0.5 + IDLE_RELEASE)
    assert pool.idle(0.55 + IDLE_RELEASE + 0.01)
