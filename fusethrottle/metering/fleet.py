"""This mount's part of a fleet budget: leases from Redis, spent by the engine's requests.

The writers are the native engine's request threads (fleet_gate.h; the daemon hands the engine
over with :meth:`FleetShare.spend_through`): they spend the lease on their own, up to what they
were handed, at the pace of the share; a write is only ever delayed, never failed. One
background task, the renewer :meth:`FleetShare.run`, keeps them fed: every tick (or at once,
when a request waits for a lease and the engine calls :meth:`FleetShare.wake`) it debits what
they spent from the local lease pool (fleet_share.py), asks Redis (fleet_redis.py) for a lease
shortly before the current one runs out, gives the lease back when the writers stop, and hands
them what is left of the lease and the pace. When Redis cannot be reached it switches the pool
to the fallback budget (no lease needed, the fallback's pace) and tries to rejoin every
:data:`REJOIN_INTERVAL`.

A second task, :meth:`FleetShare._watch`, listens (pub/sub) for other mounts joining or
leaving and has the renewer ask at once, so shares move within a round trip.

Concurrency: every grant runs in a worker thread of its own limiter (one at a time), under a
deadline; a hung Redis holds that one thread, never the event loop. The listener holds one more
thread, abandoned on unmount (it notices within ``WATCH_POLL``). Everything else runs on the
event loop, where code between awaits is atomic.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import trio

from ..service.options import Config
from ..trio_compat import run_sync_abandoning
from .fleet_redis import RedisFleetStore, StoreError, read_password
from .fleet_share import (
    ACTIVE_HOLD_FACTOR,
    LEASE_MAX_SECONDS,
    Fallback,
    Grant,
    LeasePool,
    Spending,
)

log = logging.getLogger(__name__)

#: How often the renewer looks at the pool when nothing wakes it.
TICK = 0.05
#: While on the fallback budget, try Redis again this often.
REJOIN_INTERVAL = 1.0


class FleetStore(Protocol):
    """The shared bucket (fleet_redis.RedisFleetStore); blocking, called from a worker thread."""

    def grant(
        self,
        mount_id: str,
        weight: float,
        want: tuple[float, float],
        *,
        hold: float,
        give_back: tuple[float, float] = (0.0, 0.0),
    ) -> Grant: ...

    def close(self) -> None: ...

    # Optional: ``watch(stop, on_change)`` (fleet_redis.RedisFleetStore.watch), the fleet's news.


class Spender(Protocol):
    """Writers that spend the lease on their own threads (the native engine, fleet_gate.h):
    the renewer reads what they spent and hands them what is left, as totals."""

    def fleet_spending(self) -> Spending: ...

    def fleet_hand_out(self, allowance: tuple[float, float], pace: tuple[float, float]) -> None: ...


@dataclass(frozen=True)
class FleetStatistics:
    """What ``status`` and the metrics show about the fleet budget (rates per second)."""

    budget: str  # the budget= URL, without any password (the key status --json shows)
    weight: float
    fallback: bool  # True while on the fallback budget
    fallback_reason: str
    fallback_seconds_total: float
    fleet_metered: float  # as last read from Redis (0: not known or no limit)
    fleet_units: float
    share_metered: float  # this mount's share, as last granted
    share_units: float
    pace_metered: float  # the rate the writers are held to now (0: unlimited)
    pace_units: float
    mounts: int  # active mounts in the fleet, at the last grant
    granted_metered_total: float
    granted_units_total: float
    leases_total: int  # grants that brought tokens
    round_trips_total: int  # calls to Redis, failed ones included
    errors_total: int
    waited_total: int  # requests that waited for the fleet budget
    wait_seconds_total: float


def default_mount_id(mountpoint: str) -> str:
    """Unique among live mounts: host, pid and mountpoint (a restart is a new mount)."""
    return f"{socket.gethostname()}:{os.getpid()}:{mountpoint}"


class FleetShare:
    """This mount's share of the fleet's rate: leases from the shared bucket, handed to the
    writers that spend them (the spender)."""

    def __init__(
        self,
        store: Callable[[], FleetStore],
        *,
        url: str,
        mount_id: str,
        weight: float = 1.0,
        fallback: Fallback | None = None,
        timeout: float = 0.5,
        threads: bool = True,
    ) -> None:
        self._make_store = store
        #: Off only in tests on trio's MockClock, where the fake store answers at once.
        self._threads = threads
        self._store: FleetStore | None = None
        self.url = url  # the budget= URL, for the log and status
        self.mount_id = mount_id
        self.weight = weight
        self.fallback_policy = fallback or Fallback()
        #: A call to Redis that has not answered by then is abandoned (its thread may linger).
        self.deadline = 2 * timeout + 0.25
        self.pool = LeasePool(now=0.0)
        self._started = False
        self._wake = trio.Event()
        self._limiter = trio.CapacityLimiter(1)
        self.last_grant: Grant | None = None
        self.renew_now = False  # the fleet changed (watch): renew at the next step
        self.notified_total = 0
        self.fallback_since: float | None = None
        self.fallback_reason = ""
        self._fallback_seconds = 0.0
        self._next_rejoin = 0.0
        self.granted_metered_total = 0.0
        self.granted_units_total = 0.0
        self.leases_total = 0
        self.round_trips_total = 0
        self.errors_total = 0
        #: Requests that waited for the fleet budget, and how long: the spender's counts.
        self.waited_total = 0
        self.wait_seconds_total = 0.0
        #: The writers: the native engine's requests (spend_through).
        self._spender: Spender | None = None
        self._spender_seen = (0.0, 0.0)
        self._spender_waiting = 0

    # --- the writers -------------------------------------------------------------------------
    def spend_through(self, spender: Spender) -> None:
        """The writers are *spender*'s (the native engine): it reserves on its own threads,
        and the renewer keeps it handed out (before run())."""
        self._spender = spender

    def wake(self) -> None:
        """The spender's writers wait for a lease: renew now, not at the next tick."""
        self._wake.set()

    def _collect_spender(self, now: float) -> None:
        """Debit what the spender's writers took since the last look."""
        spender = self._spender
        if spender is None:
            return
        spending = spender.fleet_spending()
        seen_metered, seen_units = self._spender_seen
        self.pool.spent(
            now,
            spending.metered - seen_metered,
            spending.units - seen_units,
            busy=spending.waiting + spending.pacing > 0,
        )
        self._spender_seen = (spending.metered, spending.units)
        self._spender_waiting = spending.waiting
        self.waited_total = spending.waited
        self.wait_seconds_total = spending.wait_seconds

    def _hand_out_to_spender(self, now: float) -> None:
        """Hand the spender's writers what is left of the lease and the pace, as totals from
        what was last collected: what they took since counts against it, so no second read."""
        if self._spender is None:
            return
        seen_metered, seen_units = self._spender_seen
        left_metered, left_units = self.pool.allowance(now)
        self._spender.fleet_hand_out(
            (seen_metered + left_metered, seen_units + left_units), self.pool.pace()
        )

    # --- the renewer -------------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the lease pool filled until cancelled (unmount); then give the lease back."""
        now = trio.current_time()
        self.pool = LeasePool(now)  # on the loop's clock from here on
        self._started = True
        self._store = self._make_store()
        task_status.started()
        try:
            async with trio.open_nursery() as nursery:
                if hasattr(self._store, "watch"):
                    nursery.start_soon(self._watch)
                while True:
                    self._collect_spender(trio.current_time())
                    await self._step(trio.current_time())
                    self._hand_out_to_spender(trio.current_time())
                    with trio.move_on_after(TICK):
                        await self._wake.wait()
                    self._wake = trio.Event()
        finally:
            with trio.CancelScope(shield=True):
                await self._leave()
                if self._store is not None:
                    self._store.close()

    async def _watch(self) -> None:
        """Listen for changes of the fleet (fleet_redis.watch) in a thread of its own, so a
        mount joining or leaving moves every share at once, not at each mount's next lease.
        Best effort: without it the shares still follow at the next lease."""
        token = trio.lowlevel.current_trio_token()
        stop = threading.Event()

        def changed(mount_id: str) -> None:
            if mount_id != self.mount_id:
                with contextlib.suppress(trio.RunFinishedError):  # a message after unmount
                    token.run_sync_soon(self._fleet_changed)

        try:
            while True:
                try:
                    await run_sync_abandoning(self._store.watch, stop, changed)  # type: ignore[union-attr]
                except StoreError as err:
                    log.debug("watching the fleet budget %s: %s", self.url, err)
                await trio.sleep(REJOIN_INTERVAL)
        finally:
            stop.set()

    def _fleet_changed(self) -> None:
        """Another mount joined or left: this one's share moved; renew now if writing."""
        self.renew_now = True
        self._wake.set()

    async def _step(self, now: float) -> None:
        pool = self.pool
        if self.renew_now:
            self.renew_now = False
            if self.fallback_since is None and pool.registered and not pool.idle(now):
                self.notified_total += 1
                await self._lease(now)
                return
        if self.fallback_since is not None:
            if now < self._next_rejoin:
                return
            self._next_rejoin = now + REJOIN_INTERVAL
            if self._spender_waiting or now - pool.last_demand < 1.0:
                await self._lease(now)
            else:  # nobody writes: check Redis without taking a share
                await self._call_release((0.0, 0.0), rejoin=True)
        elif pool.needs_lease(now, self._spender_waiting > 0):
            await self._lease(now)
        elif pool.idle(now):
            await self._call_release(pool.release())

    async def _lease(self, now: float) -> None:
        want = self.pool.want()
        hold = max(self.pool.period * ACTIVE_HOLD_FACTOR, 0.5)
        grant = await self._call(want, hold)
        if grant is None:
            return
        now = trio.current_time()
        self.last_grant = grant
        self.pool.granted(now, grant, gentle=self.fallback_since is not None)
        if grant.metered > 0 or grant.units > 0:
            self.leases_total += 1
        self.granted_metered_total += grant.metered
        self.granted_units_total += grant.units
        self._rejoined(now, grant)

    async def _call_release(self, back: tuple[float, float], *, rejoin: bool = False) -> None:
        grant = await self._call((0.0, 0.0), LEASE_MAX_SECONDS, give_back=back)
        if grant is not None:
            self.last_grant = grant
            if rejoin:
                now = trio.current_time()
                self._rejoined(now, grant)
                # Back on leases: the next write asks for one.
                self.pool.leasing = True
                self.pool.balance_metered = self.pool.balance_units = 0.0

    async def _call(
        self, want: tuple[float, float], hold: float, give_back: tuple[float, float] = (0.0, 0.0)
    ) -> Grant | None:
        """One round trip in a worker thread, under the deadline; None (and fallback) on failure."""
        store = self._store
        assert store is not None
        self.round_trips_total += 1

        def call() -> Grant:
            return store.grant(self.mount_id, self.weight, want, hold=hold, give_back=give_back)

        reason = ""
        with trio.move_on_after(self.deadline):
            try:
                if not self._threads:
                    return call()
                return await run_sync_abandoning(call, limiter=self._limiter)
            except StoreError as err:
                reason = str(err)
            except Exception as err:  # a bug or an unexpected reply must not end the mount
                log.exception("asking the fleet budget %s failed", self.url)
                reason = f"unexpected error: {err}"
        self.errors_total += 1
        self._fall_back(trio.current_time(), reason or f"no answer within {self.deadline:.2g} s")
        return None

    async def _leave(self) -> None:
        """Unmount: hand the unspent lease back so the others' shares grow at once."""
        if not self._started or self.fallback_since is not None or not self.pool.registered:
            return
        with trio.move_on_after(self.deadline):
            await self._call_release(self.pool.release())

    def _fall_back(self, now: float, reason: str) -> None:
        if self.fallback_since is not None:
            return
        share = self.last_grant
        rates = self.fallback_policy.rates(
            share.share_metered if share else 0.0, share.share_units if share else 0.0
        )
        self.pool.fallback(now, *rates)
        self.fallback_since = now
        self.fallback_reason = reason
        self._next_rejoin = now + REJOIN_INTERVAL
        what = (
            "no fleet limit (never reached it; local ceilings only)"
            if rates == (0.0, 0.0)
            else f"{rates[0] / 2**20:.1f} MiB/s metered, {rates[1]:.0f} units/s"
        )
        log.warning(
            "fleet budget %s unavailable (%s): on the fallback budget, %s, until it is back",
            self.url,
            reason,
            what,
        )

    def _rejoined(self, now: float, grant: Grant) -> None:
        if self.fallback_since is None:
            return
        self._fallback_seconds += now - self.fallback_since
        log.info(
            "fleet budget %s is back after %.1f s: share %.1f MiB/s of %.1f MiB/s (%d mount(s))",
            self.url,
            now - self.fallback_since,
            grant.share_metered / 2**20,
            grant.fleet_metered / 2**20,
            grant.mounts,
        )
        self.fallback_since = None
        self.fallback_reason = ""

    # --- observability -----------------------------------------------------------------------
    def statistics(self, now: float) -> FleetStatistics:
        g = self.last_grant
        pool = self.pool.statistics()
        fallback_seconds = self._fallback_seconds
        if self.fallback_since is not None:
            fallback_seconds += max(0.0, now - self.fallback_since)
        return FleetStatistics(
            budget=self.url,
            weight=self.weight,
            fallback=self.fallback_since is not None,
            fallback_reason=self.fallback_reason,
            fallback_seconds_total=fallback_seconds,
            fleet_metered=g.fleet_metered if g else 0.0,
            fleet_units=g.fleet_units if g else 0.0,
            share_metered=g.share_metered if g else 0.0,
            share_units=g.share_units if g else 0.0,
            pace_metered=pool.pace_metered,
            pace_units=pool.pace_units,
            mounts=g.mounts if g else 0,
            granted_metered_total=self.granted_metered_total,
            granted_units_total=self.granted_units_total,
            leases_total=self.leases_total,
            round_trips_total=self.round_trips_total,
            errors_total=self.errors_total,
            waited_total=self.waited_total,
            wait_seconds_total=self.wait_seconds_total,
        )


def from_config(config: Config) -> FleetShare | None:
    """The mount's FleetShare for ``budget=...``, or None without one."""
    if config.budget is None:
        return None
    address = config.budget
    password_file = config.budget_password_file

    def store() -> FleetStore:
        return RedisFleetStore(
            address,
            read_password(password_file),
            timeout=config.budget_timeout,
            ca_file=config.budget_ca or None,
        )

    return FleetShare(
        store,
        url=str(address),
        mount_id=default_mount_id(config.mountpoint),
        weight=config.budget_weight,
        fallback=Fallback(config.budget_fallback),
        timeout=config.budget_timeout,
    )
