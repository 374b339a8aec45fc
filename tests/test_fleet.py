"""Mounts sharing a fleet budget (fleet.py), on trio's MockClock with an in-memory fleet.

The fake fleet keeps the same rules as the Lua script in fleet_redis.py (that script itself is
tested against a real redis-server in test_fleet_redis.py); here the clock is fake, so rates and
shares are exact and the tests take milliseconds. Each mount's writes are spent as the native
engine's requests spend them (fleet_spender.py): the renewer hands them the share.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest
import trio
import trio.testing
from fleet_spender import EngineSpender

from fusethrottle.metering.fleet import FleetShare
from fusethrottle.metering.fleet_redis import StoreError
from fusethrottle.metering.fleet_share import BUCKET_SECONDS, GRANT_CAP_SECONDS, Fallback, Grant

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


def mount(fake: FakeFleet, name: str = "m", **kw: object) -> EngineSpender:
    """A mount on the fake fleet: its share, spent by (a model of) the engine's requests."""
    return EngineSpender.attach(fleet_budget(fake, name, **kw))


def run_mock(fn: Callable[[], Awaitable[None]]) -> None:
    trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))


async def greedy(writes: EngineSpender, counter: dict[str, float], size: int = MiB) -> None:
    """A writer that never stops: *counter* holds what passed, per mount."""
    name = writes.fleet.mount_id
    while True:
        await writes.spend(size)
        counter[name] = counter.get(name, 0) + size


def test_three_greedy_mounts_share_the_fleet_rate_equally() -> None:
    async def main() -> None:
        fake = FakeFleet()
        mounts = [mount(fake, f"m{i}") for i in range(3)]
        passed: dict[str, float] = {}
        async with trio.open_nursery() as nursery:
            for m in mounts:
                await nursery.start(m.fleet.run)
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
        m = mount(fake)
        passed: dict[str, float] = {}
        async with trio.open_nursery() as nursery:
            await nursery.start(m.fleet.run)
            nursery.start_soon(greedy, m, passed, 4096)
            await trio.sleep(10.0)
            nursery.cancel_scope.cancel()
        writes = passed["m"] / 4096
        assert writes > 100_000
        assert fake.calls < writes / 1000
        gib = passed["m"] / (1 << 30)
        assert m.fleet.round_trips_total / gib < 100

    run_mock(main)


def test_a_mount_that_stops_writing_hands_its_share_to_the_others() -> None:
    async def main() -> None:
        fake = FakeFleet()
        a, b = mount(fake, "a"), mount(fake, "b")
        passed: dict[str, float] = {}
        async with trio.open_nursery() as nursery:
            await nursery.start(a.fleet.run)
            await nursery.start(b.fleet.run)
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
        heavy, light = mount(fake, "heavy", weight=2.0), mount(fake, "light")
        passed: dict[str, float] = {}
        async with trio.open_nursery() as nursery:
            for m in (heavy, light):
                await nursery.start(m.fleet.run)
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
        mounts = [mount(fake, f"m{i}") for i in range(3)]
        passed: dict[str, float] = {}
        async with trio.open_nursery() as nursery:
            for m in mounts:
                await nursery.start(m.fleet.run)
                nursery.start_soon(greedy, m, passed)
            await trio.sleep(10.0)
            fake.down = True
            await trio.sleep(3.0)
            assert all(m.fleet.fallback_since is not None for m in mounts)
            during = dict(passed)
            await trio.sleep(20.0)
            # on the last share each: the fleet's rate, no more, with no Redis at all
            for m in mounts:
                name = m.fleet.mount_id
                assert passed[name] - during[name] == pytest.approx(RATE / 3 * 20, rel=0.03)
            fake.down = False
            await trio.sleep(3.0)
            assert all(m.fleet.fallback_since is None for m in mounts)
            stats = mounts[0].fleet.statistics(trio.current_time())
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
        m = mount(fake, "m", fallback=Fallback(5 * MiB))
        passed: dict[str, float] = {}
        async with trio.open_nursery() as nursery:
            await nursery.start(m.fleet.run)
            nursery.start_soon(greedy, m, passed)
            await trio.sleep(10.0)
            nursery.cancel_scope.cancel()
        assert passed["m"] == pytest.approx(5 * MiB * 10, rel=0.03)

    run_mock(main)


def test_unmount_gives_the_lease_back() -> None:
    async def main() -> None:
        fake = FakeFleet()
        m = mount(fake, "m")
        async with trio.open_nursery() as nursery:
            await nursery.start(m.fleet.run)
            nursery.start_soon(greedy, m, {})
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
        writes = EngineSpender.attach(fleet)
        async with trio.open_nursery() as nursery:
            await nursery.start(fleet.run)
            with trio.fail_after(20):  # a hang guard, not a speed claim
                await writes.spend(4096)
            assert fleet.fallback_since is not None
            assert writes.allow_metered == math.inf  # the fallback needs no lease
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        release.set()


def test_writes_already_waiting_speed_up_when_the_share_grows() -> None:
    """A mount leaves: the writes queued at the old, smaller share must not finish at it."""

    async def main() -> None:
        fake = FakeFleet()
        a, b = mount(fake, "a"), mount(fake, "b")
        passed: dict[str, float] = {}
        async with trio.open_nursery() as nursery:
            await nursery.start(a.fleet.run)
            await nursery.start(b.fleet.run)
            for _ in range(12):  # the kernel sends a dozen writes at once
                nursery.start_soon(greedy, b, passed)
            with trio.move_on_after(5.0):
                await greedy(a, passed)
            while b.fleet.pool.statistics().pace_metered < RATE:
                await trio.sleep(0.01)
            before = passed["b"]
            await trio.sleep(0.3)
            assert passed["b"] - before >= 0.9 * RATE * 0.3
            nursery.cancel_scope.cancel()

    run_mock(main)


def test_no_more_is_spent_than_redis_granted_and_the_waits_are_shown() -> None:
    """The lease is renewed in Python and spent by the engine's threads: two mounts split the
    fleet's rate, no more passes than Redis granted, and the statistics (status, metrics) show
    how many requests waited for the fleet budget, and how long, as the engine counted them."""

    async def main() -> None:
        fake = FakeFleet()
        mounts = [mount(fake, f"m{i}") for i in range(2)]
        async with trio.open_nursery() as nursery:
            for m in mounts:
                await nursery.start(m.fleet.run)
            async with trio.open_nursery() as writers:
                for m in mounts:
                    writers.start_soon(greedy, m, {})
                await trio.sleep(30.0)
                writers.cancel_scope.cancel()
            await trio.sleep(0.1)  # the renewer collects what they did last
            for m in mounts:
                stats = m.fleet.statistics(trio.current_time())
                assert stats.waited_total == m.waited > 0
                assert stats.wait_seconds_total == m.wait_seconds
                assert 0.5 * 30 <= stats.wait_seconds_total <= 30  # one writer: about its runtime
            nursery.cancel_scope.cancel()
        spent = [m.metered for m in mounts]
        granted = sum(m.fleet.granted_metered_total for m in mounts)
        assert sum(spent) <= granted + 2 * MiB  # a request of debt each, at most
        assert sum(spent) == pytest.approx(RATE * 30, rel=0.05)
        assert spent[0] == pytest.approx(spent[1], rel=0.05)
        trips = max(m.fleet.round_trips_total for m in mounts)
        assert trips < 30 * 20  # leases, not a trip a write
        assert all(m.handed_out > 0 for m in mounts)

    run_mock(main)
