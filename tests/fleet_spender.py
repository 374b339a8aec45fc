"""The native engine's requests as a fleet budget's spender, on the trio clock (for tests).

The engine's side of the hand-out (engine/src/fleet_gate.h, handed to the renewer by the daemon
through ``FleetShare.spend_through``), with the same rules: a request takes from totals up to
the allowance the renewer handed out, waits for the next hand-out beyond it (and wakes the
renewer, as the engine pokes it), then waits out the pace; when the pace moves, requests
waiting for their turn queue again at the new one. Its own rules are tested in C++
(window_test.cc); the tests here use it to check that the renewer keeps it fed and within the
fleet's rate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import trio

from fusethrottle.metering.fleet import FleetShare
from fusethrottle.metering.fleet_share import PACE_BURST_SECONDS, Spending
from fusethrottle.metering.token_bucket import TokenBucket


def _unpaced() -> TokenBucket:
    return TokenBucket(0, 1, 0.0)


@dataclass(eq=False)
class EngineSpender:
    """The engine's requests of one mount, spending *fleet*'s share (fleet_gate.h)."""

    fleet: FleetShare
    metered: float = 0.0  # spent, in all
    units: float = 0.0
    allow_metered: float = 0.0  # nothing before the first hand-out
    allow_units: float = 0.0
    waiting: int = 0  # requests waiting for a lease now
    pacing: int = 0  # requests waiting out the pace now
    waited: int = 0  # requests that waited, for a lease or the pace
    wait_seconds: float = 0.0
    handed_out: int = 0
    pace_metered: TokenBucket = field(default_factory=_unpaced)
    pace_units: TokenBucket = field(default_factory=_unpaced)
    _generation: int = 0  # bumped when the pace moves
    _changed: trio.Event = field(default_factory=trio.Event)

    @classmethod
    def attach(cls, fleet: FleetShare) -> EngineSpender:
        """The spender of *fleet*'s share, as the daemon hands it the engine."""
        spender = cls(fleet)
        fleet.spend_through(spender)
        return spender

    # --- what the renewer calls ---------------------------------------------------------------
    def fleet_spending(self) -> Spending:
        return Spending(
            self.metered, self.units, self.waiting, self.pacing, self.waited, self.wait_seconds
        )

    def fleet_hand_out(self, allowance: tuple[float, float], pace: tuple[float, float]) -> None:
        self.handed_out += 1
        more = allowance[0] > self.allow_metered or allowance[1] > self.allow_units
        self.allow_metered, self.allow_units = allowance
        if pace != (self.pace_metered.rate, self.pace_units.rate):
            now = trio.current_time()
            self.pace_metered.set_rate(now, pace[0], pace[0] * PACE_BURST_SECONDS)
            self.pace_units.set_rate(now, pace[1], pace[1] * PACE_BURST_SECONDS)
            self._generation += 1
            more = True
        if more:
            self._changed.set()
            self._changed = trio.Event()

    # --- one request ---------------------------------------------------------------------------
    def _within_allowance(self, metered: float, units: float) -> bool:
        return (metered == 0 or self.metered < self.allow_metered) and (
            units == 0 or self.units < self.allow_units
        )

    async def spend(self, metered: float, units: float = 0.0) -> None:
        """One request: returns once the allowance holds it and its pace turn has come."""
        if metered == 0 and units == 0:
            return
        start = trio.current_time()
        waited = False
        if not self._within_allowance(metered, units):
            waited = True
            self.waiting += 1
            self.fleet.wake()
            try:
                while not self._within_allowance(metered, units):
                    await self._changed.wait()
            finally:
                self.waiting -= 1
        self.metered += metered
        self.units += units
        while True:
            now = trio.current_time()
            delay = max(
                self.pace_metered.delay_for(now, metered), self.pace_units.delay_for(now, units)
            )
            if delay <= 0:
                break
            waited = True
            generation = self._generation
            self.pacing += 1
            try:
                with trio.move_on_after(delay) as turn:
                    while self._generation == generation:
                        await self._changed.wait()
            finally:
                self.pacing -= 1
            if turn.cancelled_caught:
                break  # its turn came
            # The pace moved (a mount left, this one's share grew): queue again at the new one.
            now = trio.current_time()
            self.pace_metered.refund(now, metered)
            self.pace_units.refund(now, units)
        if waited:
            self.waited += 1
            self.wait_seconds += trio.current_time() - start
