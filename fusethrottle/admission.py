"""The write gate: a write waits until it fits in the un-synced window.

Without the kernel writeback cache every write() is a synchronous FUSE_WRITE, so delaying our
reply *is* the back-pressure: the writer sleeps in write() instead of filling the page cache.

Why waiting here cannot deadlock pyfuse3's bounded pool of request tasks: what frees the window
is the flusher's fsync, which runs in its own task and its own thread pool and needs no FUSE
request to make progress. fsync, flush, release, forget and reads never pass this gate. And every
wait is bounded (``timeout``): a write that waited that long is admitted anyway and counted, so
even a target that never completes an fsync turns into slow writes, never a wedged mount.

Waiters are served first come, first served, so a large write is not starved by small ones.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import trio

from .ledger import Ledger


@dataclass(frozen=True)
class GateStatistics:
    waiting: int
    throttled_total: int
    timeouts_total: int
    wait_seconds_total: float
    paced_total: int = 0


class _Waiter:
    __slots__ = ("event", "nbytes")

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.event = trio.Event()


def pacing_rate(commit_rate: float, unsynced: int, window: int) -> float | None:
    """How fast to admit writes once the window is half full; None below that (pure).

    Waiting for room only at the window's edge makes a writer stop and go: the window fills in
    a moment, then nothing moves until a whole fsync completes (many seconds on a slow target).
    Above half the window, writes are instead spaced at a rate proportional to the room left:
    the target's commit rate at half full, falling linearly to a tenth of it at the edge. The
    un-synced bytes settle near half the window and every write waits a little, not a lot.
    """
    if window <= 0 or unsynced * 2 < window:
        return None
    room = max(0.0, 1.0 - unsynced / window)
    return commit_rate * max(0.1, 2.0 * room)


class WindowGate:
    """Admits writes while ``ledger.unsynced + n <= window()``, paced above half the window."""

    def __init__(
        self,
        ledger: Ledger,
        window: Callable[[], int],
        *,
        enabled: bool = True,
        timeout: float = 60.0,
        on_pressure: Callable[[], None] | None = None,
        commit_rate: Callable[[], float | None] | None = None,
    ) -> None:
        self.ledger = ledger
        self.window = window
        self.enabled = enabled
        self.timeout = timeout
        self.on_pressure = on_pressure
        self.commit_rate = commit_rate
        self._queue: deque[_Waiter] = deque()
        self._next_paced = 0.0
        self.throttled_total = 0
        self.paced_total = 0
        self.timeouts_total = 0
        self.wait_seconds_total = 0.0

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def _fits(self, nbytes: int) -> bool:
        unsynced = self.ledger.unsynced
        # An empty mount always admits, so a write larger than the window still progresses.
        return unsynced == 0 or unsynced + nbytes <= self.window()

    def _pace_delay(self, nbytes: int, now: float) -> float:
        """Book the write a slot on the pacing clock; seconds until that slot."""
        rate = self.commit_rate() if self.commit_rate is not None else None
        if not rate:
            return 0.0
        pace = pacing_rate(rate, self.ledger.unsynced, self.window())
        if pace is None:
            self._next_paced = now
            return 0.0
        start = max(now, self._next_paced)
        self._next_paced = start + nbytes / pace
        return start - now

    async def admit(self, nbytes: int) -> float:
        """Reserve *nbytes* in the ledger, waiting for room; returns the seconds waited."""
        if not self.enabled:
            self.ledger.reserve(nbytes)
            return 0.0
        paced = self._pace_delay(nbytes, trio.current_time())
        if paced > 0:
            self.paced_total += 1
            self.wait_seconds_total += paced
            if self.on_pressure is not None:
                self.on_pressure()
            await trio.sleep(paced)
        if not self._queue and self._fits(nbytes):
            self.ledger.reserve(nbytes)
            return paced
        waiter = _Waiter(nbytes)
        self._queue.append(waiter)
        self.throttled_total += 1
        start = trio.current_time()
        if self.on_pressure is not None:
            self.on_pressure()
        try:
            with trio.move_on_after(self.timeout):
                await waiter.event.wait()
        except BaseException:
            # Cancelled from outside while queued (or just granted): give back what we hold.
            if waiter.event.is_set():
                self.ledger.unreserve(waiter.nbytes)
            else:
                self._queue.remove(waiter)
            self.wake()
            raise
        if not waiter.event.is_set():  # waited the full bound: admit anyway, and count it
            self._queue.remove(waiter)
            self.timeouts_total += 1
            self.ledger.reserve(nbytes)
            self.wake()
        waited = trio.current_time() - start
        self.wait_seconds_total += waited
        return paced + waited

    def wake(self) -> None:
        """Grant queued writes, in order, while they fit. Call whenever room may have appeared."""
        while self._queue and (not self.enabled or self._fits(self._queue[0].nbytes)):
            waiter = self._queue.popleft()
            self.ledger.reserve(waiter.nbytes)
            waiter.event.set()
        if self._queue and self.on_pressure is not None:
            self.on_pressure()

    def statistics(self) -> GateStatistics:
        return GateStatistics(
            self.waiting,
            self.throttled_total,
            self.timeouts_total,
            self.wait_seconds_total,
            self.paced_total,
        )
