"""The fleet budget's local decisions: how big a lease to ask for, how writers spend it, fallback.

Pure: no I/O and no clock reads (time is an argument), so every rule is tested with a fake clock.

Why leases: the fleet's token bucket lives in Redis (fleet_redis.py), but a round trip per write
would cost more than the write. A mount asks for a *lease*, a lump of tokens meant to last
:func:`lease_seconds` of its share, and its writers spend it locally. Redis caps each grant at
the mount's fair share (the fleet rate x this mount's weight / the weights of the active mounts),
so the number of tokens in the fleet never exceeds the shared bucket. Locally, the lease is paced
at the mount's share, so a mount cannot spend a lease faster than its share and crowd out the
others between two round trips.

Why a lease of about 16 MiB rather than 100 ms of the share: at 20 MiB/s a 100 ms lease is 2 MiB,
which would be 512 round trips per GiB written. A lease is therefore sized to carry about
:data:`LEASE_TARGET_BYTES` (64 round trips per GiB), but never more than
:data:`LEASE_MAX_SECONDS` of the share (a slow mount does not hoard) nor less than
:data:`LEASE_MIN_SECONDS` (a very fast one does not call Redis hundreds of times a second).

Unspent tokens expire (:data:`LEASE_EXPIRY_FACTOR` lease periods after the grant): tokens taken
from the bucket long ago must not be spent on top of today's rate. A mount whose writers stop
gives its unspent lease back and leaves the active set after :data:`IDLE_RELEASE` seconds, so the
others' shares grow at their next round trip.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MiB = 1 << 20

#: A lease should carry about this many metered bytes (or units): few round trips per GiB.
LEASE_TARGET_BYTES = 16 * MiB
LEASE_TARGET_UNITS = 4096.0
#: Bounds on how long one lease lasts at the mount's share.
LEASE_MIN_SECONDS = 0.1
LEASE_MAX_SECONDS = 1.0
#: The shared bucket in Redis holds at most this many seconds of the fleet rate. It is the
#: backstop while shares change (a mount still paced at its old share); in steady state the
#: pace of each mount at its share is what holds the fleet to its rate. A lease is at most half
#: of it, so the asks of a greedy fleet, which come at about the same time, fit in it.
BUCKET_SECONDS = 2.0
#: Redis never grants more than this many seconds of a mount's share in one lease.
GRANT_CAP_SECONDS = LEASE_MAX_SECONDS
#: Ask for the next lease when what is left lasts less than this at the current pace.
RENEW_AHEAD = 0.1
#: A mount with no demand for this long gives its lease back and leaves the active set.
IDLE_RELEASE = 0.2
#: Unspent tokens are dropped this many lease periods after their grant.
LEASE_EXPIRY_FACTOR = 2.0
#: A mount stays in the active set this many lease periods after a grant without another round
#: trip: longer than its lease may last (its unspent tokens expire at LEASE_EXPIRY_FACTOR), or a
#: busy mount whose writer paused (a close, a new file) would drop out between two leases and the
#: others would pace at a share too large. A crashed host's share thus returns within ~2 s; a
#: mount whose writers stop gives its share back at once (IDLE_RELEASE).
ACTIVE_HOLD_FACTOR = 2.5
#: The local pace may run ahead by this much of a second (absorbs the writers' jitter).
PACE_BURST_SECONDS = 0.05
#: After a grant that came back short (the fleet's bucket was empty), wait at least this long.
MIN_RETRY = 0.05


@dataclass(frozen=True)
class Grant:
    """One answer of the shared bucket (fleet_redis.py); rates per second, 0 = no such limit."""

    metered: float  # tokens granted now
    units: float
    share_metered: float  # this mount's fair share of the fleet rate
    share_units: float
    fleet_metered: float  # the fleet's budget, as set with ``fusethrottle budget set``
    fleet_units: float
    mounts: int  # active mounts, this one included
    weight_sum: float


def lease_seconds(
    share_metered: float,
    share_units: float,
    fleet_metered: float = 0.0,
    fleet_units: float = 0.0,
) -> float:
    """How long one lease should last at this share (see the module docstring).

    With the fleet's rates known, a lease is also at most half of the shared bucket.
    """
    candidates = []
    for share, fleet, target in (
        (share_metered, fleet_metered, LEASE_TARGET_BYTES),
        (share_units, fleet_units, LEASE_TARGET_UNITS),
    ):
        if share > 0:
            candidates.append(target / share)
            if fleet > 0:
                candidates.append(fleet * BUCKET_SECONDS / 2 / share)
    if not candidates:
        return LEASE_MAX_SECONDS
    return min(LEASE_MAX_SECONDS, max(LEASE_MIN_SECONDS, min(candidates)))


@dataclass(frozen=True)
class Spending:
    """What the writers (the native engine's requests, fleet_gate.h) report: totals since the
    mount, and who waits now."""

    metered: float
    units: float
    waiting: int  # for a lease
    pacing: int  # for their pace turn
    waited: int  # requests that waited, in all
    wait_seconds: float


@dataclass(frozen=True)
class PoolStatistics:
    """What the pool shows the metrics: in the units of the fleet budget."""

    leasing: bool  # False: on the fallback budget (or no fleet limit known)
    balance_metered: float
    balance_units: float
    pace_metered: float  # the rate writers spend at now (0: unpaced)
    pace_units: float


class LeasePool:
    """The tokens Redis granted to this mount, spent by its writers at the granted pace.

    The writers (the native engine's requests, fleet_gate.h) spend on their own threads: the
    renewer debits what they took (``spent``) and hands them the ``allowance`` left and the
    ``pace``; they wait for the next grant beyond the allowance and spend at the pace. The
    balance may go into debt by one request, so a request larger than what is left still passes
    and the next grant pays for it. With ``leasing`` off (the fallback), only the pace applies.
    """

    def __init__(self, now: float) -> None:
        self.leasing = True
        self.balance_metered = 0.0
        self.balance_units = 0.0
        self.period = LEASE_MIN_SECONDS
        self.expires = now
        self.last_demand = -math.inf  # the last request, or the end of the last one's wait
        self.registered = False  # Redis counts this mount as active
        self.next_ask = now
        self.share_metered = 0.0  # the last share Redis told us (0: none known)
        self.share_units = 0.0
        self.fleet_metered = 0.0  # the fleet's rates, as last granted
        self.fleet_units = 0.0
        # Which resources the fleet limits (a budget may set only one); both until told.
        self.limits_metered = True
        self.limits_units = True
        # The rates writers spend at (0: unpaced); the engine keeps its own buckets at them.
        self.pace_metered = 0.0
        self.pace_units = 0.0

    # --- the writers (the native engine's requests) ------------------------------------------
    def spent(self, now: float, metered: float, units: float, *, busy: bool) -> None:
        """The writers took this much since the last call (*busy*: some wait now, for a lease
        or their pace, which is demand too: a queue of writes that waits longer than
        IDLE_RELEASE must not make the mount look idle and let go): debit it."""
        if metered > 0 or units > 0 or busy:
            self.last_demand = max(self.last_demand, now)
        if self.leasing:
            self._expire(now)
            self.balance_metered -= metered if self.limits_metered else 0.0
            self.balance_units -= units if self.limits_units else 0.0

    def allowance(self, now: float) -> tuple[float, float]:
        """How much more the writers may take before the next lease (inf: no lease needed,
        on the fallback or where the fleet sets no such limit)."""
        if not self.leasing:
            return math.inf, math.inf
        self._expire(now)
        return (
            max(self.balance_metered, 0.0) if self.limits_metered else math.inf,
            max(self.balance_units, 0.0) if self.limits_units else math.inf,
        )

    def pace(self) -> tuple[float, float]:
        """The rates writers spend at now (0: unpaced)."""
        return self.pace_metered, self.pace_units

    # --- the renewer -------------------------------------------------------------------------
    def needs_lease(self, now: float, waiting: bool) -> bool:
        """Should the renewer ask Redis now? (Writers are waiting, or the lease runs out soon.)"""
        if not self.leasing or now < self.next_ask:
            return False
        if waiting:
            return True
        if now - self.last_demand > IDLE_RELEASE:
            return False
        self._expire(now)
        return self._runs_out_within(RENEW_AHEAD)

    def _runs_out_within(self, seconds: float) -> bool:
        limited = [
            (balance, pace)
            for balance, pace, limits in (
                (self.balance_metered, self.pace_metered, self.limits_metered),
                (self.balance_units, self.pace_units, self.limits_units),
            )
            if limits
        ]
        return any(balance <= max(pace * seconds, 0.0) for balance, pace in limited)

    def want(self) -> tuple[float, float]:
        """Tokens to ask for: one lease at the last known share, plus any debt. (What is left
        of the current lease is spent before the new one: renewal comes RENEW_AHEAD early.)

        Before the first grant the share is unknown: ask for one target-sized lease; Redis caps
        it at the real share.
        """
        if self.share_metered > 0 or self.share_units > 0:
            seconds = self.period
            metered = self.share_metered * seconds
            units = self.share_units * seconds
        else:
            metered, units = float(LEASE_TARGET_BYTES), LEASE_TARGET_UNITS
        want_metered = want_units = 0.0
        if self.limits_metered:
            want_metered = max(1.0, metered - min(self.balance_metered, 0.0))
        if self.limits_units:
            want_units = max(1.0, units - min(self.balance_units, 0.0))
        return want_metered, want_units

    def granted(self, now: float, grant: Grant, *, gentle: bool = False) -> None:
        """A lease came back: add it, pace at the share, plan the next ask.

        *gentle*: the first lease after the fallback. The mounts rejoin one by one, so the
        first one back sees a fleet of one; until its next lease it keeps the pace it had.
        """
        was = (self.pace_metered, self.pace_units)
        self.leasing = True
        self.registered = True
        self._expire(now)
        self.share_metered, self.share_units = grant.share_metered, grant.share_units
        self.limits_metered = grant.fleet_metered > 0
        self.limits_units = grant.fleet_units > 0
        self.fleet_metered, self.fleet_units = grant.fleet_metered, grant.fleet_units
        self.period = lease_seconds(
            grant.share_metered, grant.share_units, grant.fleet_metered, grant.fleet_units
        )
        self.balance_metered += grant.metered
        self.balance_units += grant.units
        self.expires = now + self.period * LEASE_EXPIRY_FACTOR
        pace = (grant.share_metered, grant.share_units)
        if gentle:
            pace = (
                min(pace[0], was[0]) if was[0] > 0 else pace[0],
                min(pace[1], was[1]) if was[1] > 0 else pace[1],
            )
        self.pace_metered, self.pace_units = pace
        short = self._runs_out_within(RENEW_AHEAD)
        # Short grant: the fleet's bucket was empty. Ask again once it has refilled a little,
        # not at once (that would be a round trip per tick for nothing).
        self.next_ask = now + (max(MIN_RETRY, self.period / 4) if short else 0.0)

    def idle(self, now: float) -> bool:
        """No demand for IDLE_RELEASE while registered: time to give the share back."""
        return self.leasing and self.registered and now - self.last_demand > IDLE_RELEASE

    def release(self) -> tuple[float, float]:
        """Leave the active set: the unspent tokens to hand back to the fleet's bucket."""
        back = (max(self.balance_metered, 0.0), max(self.balance_units, 0.0))
        self.balance_metered = min(self.balance_metered, 0.0)
        self.balance_units = min(self.balance_units, 0.0)
        self.registered = False
        return back

    def fallback(self, now: float, metered_rate: float, units_rate: float) -> None:
        """Redis is gone: spend without leases, paced at the fallback rates (0: unlimited)."""
        self.leasing = False
        self.registered = False
        self.balance_metered = self.balance_units = 0.0
        self.pace_metered, self.pace_units = metered_rate, units_rate

    def _expire(self, now: float) -> None:
        if now >= self.expires:
            self.balance_metered = min(self.balance_metered, 0.0)
            self.balance_units = min(self.balance_units, 0.0)

    def statistics(self) -> PoolStatistics:
        return PoolStatistics(
            self.leasing,
            self.balance_metered,
            self.balance_units,
            self.pace_metered,
            self.pace_units,
        )


@dataclass(frozen=True)
class Fallback:
    """What a mount spends while Redis cannot be reached: ``share`` or a fixed metered rate."""

    fixed_metered: float = 0.0  # 0: the last known share

    def rates(self, share_metered: float, share_units: float) -> tuple[float, float]:
        """(metered/s, units/s) to pace at; 0 means no fleet limit (only local ceilings)."""
        if self.fixed_metered > 0:
            return self.fixed_metered, share_units
        return share_metered, share_units
