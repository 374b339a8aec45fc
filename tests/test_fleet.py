"""Mounts sharing a fleet budget (fleet.py), on trio's MockClock with an in-memory fleet.

The fake fleet keeps the same rules as the Lua script in fleet_redis.py (that script itself is
tested against a real redis-server in test_fleet_redis.py); here the clock is fake, so rates and
shares are exact and the tests take milliseconds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest
import trio
import trio.testing

from fusethrottle.metering.fleet import FleetShare
from fusethrottle.metering.fleet_redis import StoreError
from fusethrottle.metering.fleet_share import (
    BUCKET_SECONDS,
    GRANT_CAP_SECONDS,
    PACE_BURST_SECONDS,
    Fallback,
    Grant,
    Spending,
)
from fusethrottle.metering.token_bucket import TokenBucket

MiB = 1 << 20
RATE = 60 * MiB


@dataclass
class FakeFleet:
    """The shared bucket of fleet_redis.py, in memory, on the trio clock."""

    rate: float = RATE
    tokens: float = RATE * BUCKET_SECONDS
    last: float | None = None
    active: dict[str, tuple[float, float]] = field(default_factory=dict)  # id -> weight, until
    down: bool = False
    calls: int = 0
    releases: list[str] = field(default_factory=list)

    def grant(
        self,
        mount_id: str,
        weight: float,
        want: tuple[float, float],
        *,
        hold: float,
        give_back: tuple[float, float] = (0.0, 0.0),
    ) -> Grant:
        self.calls += 1
        if self.down:
            raise StoreError("connection refused")
        now = trio.current_time()
        self.active = {m: a for m, a in self.active.items() if a[1] > now}
        releasing = want[0] <= 0 and want[1] <= 0
        if releasing:
            self.active.pop(mount_id, None)
            self.releases.append(mount_id)
        else:
            self.active[mount_id] = (weight, now + hold)
        total = sum(w for w, _ in self.active.values()) + (weight if releasing else 0)
        cap = self.rate * BUCKET_SECONDS
        if self.last is not None:
            self.tokens = min(cap, self.tokens + (now - self.last) * self.rate + give_back[0])
        self.last = now
        share = self.rate * weight / total
        granted = 0.0
        if not releasing:
            granted = max(0.0, min(want[0], share * GRANT_CAP_SECONDS, self.tokens))
            self.tokens -= granted
        return Grant(granted, 0.0, share, 0.0, self.rate, 0.0, len(self.active), total)

    def close(self) -> None:
        pass


def fleet_budget(fake: FakeFleet, name: str = "m", **kw: object) -> FleetShare:
    return FleetShare(lambda: fake, url="redis://test/x", mount_id=name, threads=False, **kw)  # type: ignore[arg-type]


def run_mock(fn: Callable[[], Awaitable[None]]) -> None:
    trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))


async def greedy(fleet: FleetShare, counter: dict[str, float], size: int = MiB) -> None:
    while True:
        await fleet.acquire(size, 0)
        counter[fleet.mount_id] = counter.get(fleet.mount_id, 0) + size


def test_three_greedy_mounts_share_the_fleet_rate_equally() -> None:
    async def main() -> None:
        fake = FakeFleet()
        mounts = [fleet_budget(fake, f"m{i}") for i in range(3)]
        passed: dict[str, float] = {}
        async with trio.open_nursery() as nursery:
            for m in mounts:
                await nursery.start(m.run)
                nursery.start_soon(greedy, m, passed)
            await trio.sleep(10.0)
            first = sum(passed.values())
            await trio.sleep(60.0)
            nursery.cancel_scope.cancel()
        total = sum(passed.values())
        assert total <= RATE * 70 * 1.01
        assert total >= RATE * 70 * 0.95  # the budget is used, not wasted
        assert total - first <= RATE * 60 * 1.01
        for n in passed.values():
            assert n == pytest.approx(total / 3, rel=0.05)

    run_mock(main)


def test_small_writes_cost_no_round_trip_each() -> None:
    async def main() -> None:
        fake = FakeFleet()
        fleet = fleet_budget(fake)
        passed: dict[str, float] = {}
        async with trio.open_nursery() as nursery:
            await nursery.start(fleet.run)
            nursery.start_soon(greedy, fleet, passed, 4096)
            await trio.sleep(10.0)
            nursery.cancel_scope.cancel()
        writes = passed["m"] / 4096
        assert writes > 100_000
        assert fake.calls < writes / 1000
        gib = passed["m"] / (1 << 30)
        assert fleet.round_trips_total / gib < 100

    run_mock(main)


def test_a_mount_that_stops_writing_hands_its_share_to_the_others() -> None:
    async def main() -> None:
        fake = FakeFleet()
        a, b = fleet_budget(fake, "a"), fleet_budget(fake, "b")
        passed: dict[str, float] = {}
        async with trio.open_nursery() as nursery:
            await nursery.start(a.run)
            await nursery.start(b.run)
            nursery.start_soon(greedy, a, passed)
            with trio.move_on_after(5.0):
                await greedy(b, passed)  # b's writer, stopped after 5 s
            await trio.sleep(1.0)
            assert "b" in fake.releases
            before = passed["a"]
            await trio.sleep(10.0)
            nursery.cancel_scope.cancel()
        assert passed["a"] - before == pytest.approx(RATE * 10, rel=0.03)

    run_mock(main)


def test_weights_tilt_the_shares() -> None:
    async def main() -> None:
        fake = FakeFleet()
        heavy, light = fleet_budget(fake, "heavy", weight=2.0), fleet_budget(fake, "light")
        passed: dict[str, float] = {}
        async with trio.open_nursery() as nursery:
            for m in (heavy, light):
                await nursery.start(m.run)
                nursery.start_soon(greedy, m, passed)
            await trio.sleep(60.0)
            nursery.cancel_scope.cancel()
        assert passed["heavy"] / passed["light"] == pytest.approx(2.0, rel=0.05)

    run_mock(main)


def test_redis_down_writes_go_on_at_the_last_share_and_rejoin(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        fake = FakeFleet()
        mounts = [fleet_budget(fake, f"m{i}") for i in range(3)]
        passed: dict[str, float] = {}
        async with trio.open_nursery() as nursery:
            for m in mounts:
                await nursery.start(m.run)
                nursery.start_soon(greedy, m, passed)
            await trio.sleep(10.0)
            fake.down = True
            await trio.sleep(3.0)
            assert all(m.fallback_since is not None for m in mounts)
            during = dict(passed)
            await trio.sleep(20.0)
            # on the last share each: the fleet's rate, no more, with no Redis at all
            for m in mounts:
                moved = passed[m.mount_id] - during[m.mount_id]
                assert moved == pytest.approx(RATE / 3 * 20, rel=0.03)
            fake.down = False
            await trio.sleep(3.0)
            assert all(m.fallback_since is None for m in mounts)
            stats = mounts[0].statistics(trio.current_time())
            assert stats.fallback_seconds_total == pytest.approx(23, abs=1)
            assert stats.errors_total > 0
            nursery.cancel_scope.cancel()

    with caplog.at_level(logging.INFO, logger="fusethrottle.metering.fleet"):
        run_mock(main)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3  # once per mount, not once per try
    assert sum("is back after" in r.getMessage() for r in caplog.records) == 3


def test_a_fixed_fallback_rate() -> None:
    async def main() -> None:
        fake = FakeFleet(down=True)
        fleet = fleet_budget(fake, "m", fallback=Fallback(5 * MiB))
        passed: dict[str, float] = {}
        async with trio.open_nursery() as nursery:
            await nursery.start(fleet.run)
            nursery.start_soon(greedy, fleet, passed)
            await trio.sleep(10.0)
            nursery.cancel_scope.cancel()
        assert passed["m"] == pytest.approx(5 * MiB * 10, rel=0.03)

    run_mock(main)


def test_unmount_gives_the_lease_back() -> None:
    async def main() -> None:
        fake = FakeFleet()
        fleet = fleet_budget(fake, "m")
        async with trio.open_nursery() as nursery:
            await nursery.start(fleet.run)
            nursery.start_soon(greedy, fleet, {})
            await trio.sleep(1.0)
            nursery.cancel_scope.cancel()
        assert fake.releases == ["m"]
        assert fake.active == {}

    run_mock(main)


def test_a_hung_redis_never_holds_a_writer() -> None:
    """Real threads and the real clock: the store blocks forever; the write still passes."""
    release = threading.Event()

    class Hung(FakeFleet):
        def grant(self, *args: object, **kw: object) -> Grant:  # type: ignore[override]
            release.wait(30)
            raise StoreError("gave up")

    async def main() -> None:
        fleet = FleetShare(
            Hung, url="redis://test/x", mount_id="m", timeout=0.1, fallback=Fallback(MiB)
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(fleet.run)
            with trio.fail_after(20):  # a hang guard, not a speed claim
                await fleet.acquire(4096, 0)
            assert fleet.fallback_since is not None
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        release.set()


def test_writes_already_waiting_speed_up_when_the_share_grows() -> None:
    """A mount leaves: the writes queued at the old, smaller share must not finish at it."""

    async def main() -> None:
        fake = FakeFleet()
        a, b = fleet_budget(fake, "a"), fleet_budget(fake, "b")
        passed: dict[str, float] = {}
        async with trio.open_nursery() as nursery:
            await nursery.start(a.run)
            await nursery.start(b.run)
            for _ in range(12):  # the kernel sends a dozen writes at once
                nursery.start_soon(greedy, b, passed)
            with trio.move_on_after(5.0):
                await greedy(a, passed)
            while b.pool.statistics().pace_metered < RATE:
                await trio.sleep(0.01)
            before = passed["b"]
            await trio.sleep(0.3)
            assert passed["b"] - before >= 0.9 * RATE * 0.3
            nursery.cancel_scope.cancel()

    run_mock(main)


@dataclass
class EngineGate:
    """The native engine's side of the hand-out (fleet_gate.h) on the trio clock: requests take
    from totals up to the allowance handed out, then wait out the pace. Its own rules are
    tested in C++ (window_test.cc); here, that the renewer keeps it fed and within the fleet."""

    fleet: FleetShare
    metered: float = 0.0
    allow: float = 0.0
    pace: TokenBucket = field(default_factory=lambda: TokenBucket(0, 1, 0.0))
    waiting: int = 0
    handed_out: int = 0

    def fleet_spending(self) -> Spending:
        return Spending(self.metered, 0.0, self.waiting, 0, 0, 0.0)

    def fleet_hand_out(self, allowance: tuple[float, float], pace: tuple[float, float]) -> None:
        self.allow = allowance[0]
        self.handed_out += 1
        if pace[0] != self.pace.rate:
            self.pace.set_rate(trio.current_time(), pace[0], pace[0] * PACE_BURST_SECONDS)

    async def spend(self, size: float) -> None:
        if self.metered >= self.allow:
            self.waiting += 1
            self.fleet.wake()
            while self.metered >= self.allow:
                await trio.sleep(0.001)
            self.waiting -= 1
        self.metered += size
        await trio.sleep(self.pace.delay_for(trio.current_time(), size))


def test_the_engines_requests_spend_the_share_the_renewer_hands_out() -> None:
    """engine=native: the lease is renewed in Python and spent by the engine's threads; two
    mounts still split the fleet's rate, and no more passes than Redis granted."""

    async def main() -> None:
        fake = FakeFleet()
        mounts = [fleet_budget(fake, f"m{i}") for i in range(2)]
        gates = [EngineGate(m) for m in mounts]
        for m, gate in zip(mounts, gates, strict=True):
            m.spend_through(gate)

        async def writer(gate: EngineGate) -> None:
            while True:
                await gate.spend(MiB)

        async with trio.open_nursery() as nursery:
            for m, gate in zip(mounts, gates, strict=True):
                await nursery.start(m.run)
                nursery.start_soon(writer, gate)
            await trio.sleep(30.0)
            nursery.cancel_scope.cancel()
        spent = [g.metered for g in gates]
        granted = sum(m.granted_metered_total for m in mounts)
        assert sum(spent) <= granted + 2 * MiB  # a request of debt each, at most
        assert sum(spent) == pytest.approx(RATE * 30, rel=0.05)
        assert spent[0] == pytest.approx(spent[1], rel=0.05)
        assert max(m.round_trips_total for m in mounts) < 30 * 20  # leases, not a trip a write

    run_mock(main)
