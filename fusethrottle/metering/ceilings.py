"""Optional EFS-style ceilings: metered bytes/s and op units/s, as token buckets (token_bucket.py).

Separate from the window gate (admission.py), which bounds un-synced bytes: a ceiling bounds a
rate, and it prices each request the way EFS bills it (meter.py), so a 1-byte write pays a full
minimum. Every request waits for its tokens (a delayed reply, never an error).
"""

from __future__ import annotations

from dataclasses import dataclass

import trio

from .fleet import FleetShare
from .meter import Meter, OpClass
from .token_bucket import TokenBucket

#: A quarter of a second of budget may be spent at once: enough to absorb the jitter of a busy
#: writer, small enough that the rate over any 10 s stays within a few percent of the limit.
BURST_SECONDS = 0.25


@dataclass(frozen=True)
class CeilingStatistics:
    metered_limit: float
    ops_limit: float
    delayed_total: int
    delay_seconds_total: float


class Ceilings:
    """Optional token-bucket ceilings on metered bytes/s and EFS op units/s.

    Writes always pay before they go to the target (a delayed reply, never an error); reads and
    metadata operations pay only when ``throttle_reads`` is set. The price of a request comes
    from the meter's profile, so a 1-byte write costs a full 32 KiB under the ``efs`` profile.
    """

    def __init__(
        self,
        meter: Meter,
        *,
        metered_limit: float = 0.0,
        ops_limit: float = 0.0,
        throttle_reads: bool = False,
        now: float = 0.0,
        fleet: FleetShare | None = None,
    ) -> None:
        self.meter = meter
        #: The fleet budget (budget=redis://...), drawn from before the local ceilings.
        self.fleet = fleet
        self.throttle_reads = throttle_reads
        self.metered_limit = metered_limit
        self.ops_limit = ops_limit
        self.bytes = TokenBucket(metered_limit, max(metered_limit * BURST_SECONDS, 1 << 20), now)
        self.units = TokenBucket(ops_limit, max(ops_limit * BURST_SECONDS, 5.0), now)
        self.delayed_total = 0
        self.delay_seconds_total = 0.0

    @property
    def active(self) -> bool:
        return self.fleet is not None or not (self.bytes.unlimited and self.units.unlimited)

    def applies_to(self, op: OpClass) -> bool:
        return self.active and (op is OpClass.DATA_WRITE or self.throttle_reads)

    def delay_for(self, now: float, op: OpClass, nbytes: int) -> float:
        """Reserve the request's cost in both buckets; seconds it must wait (pure)."""
        charge = self.meter.charge(op, nbytes)
        return max(
            self.bytes.delay_for(now, charge.metered_bytes),
            self.units.delay_for(now, charge.units),
        )

    async def wait(self, op: OpClass, nbytes: int) -> float:
        """Sleep until the request fits under the ceilings; returns the seconds waited."""
        if not self.applies_to(op):
            return 0.0
        fleet_wait = 0.0
        if self.fleet is not None:
            # The fleet's share first: a write waits for the tighter of the fleet and the
            # local ceilings, and only the local ones below are counted as "delayed".
            charge = self.meter.charge(op, nbytes)
            fleet_wait = await self.fleet.acquire(charge.metered_bytes, charge.units)
        delay = self.delay_for(trio.current_time(), op, nbytes)
        if delay > 0:
            self.delayed_total += 1
            self.delay_seconds_total += delay
            try:
                await trio.sleep(delay)
            except BaseException:
                # Cancelled (unmount): the request never reaches the target, so neither
                # should its cost.
                charge = self.meter.charge(op, nbytes)
                now = trio.current_time()
                self.bytes.refund(now, charge.metered_bytes)
                self.units.refund(now, charge.units)
                raise
        return delay + fleet_wait

    def statistics(self) -> CeilingStatistics:
        return CeilingStatistics(
            self.metered_limit, self.ops_limit, self.delayed_total, self.delay_seconds_total
        )
