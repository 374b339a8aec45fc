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

import math
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
        self.event = trio.Event()  # set when this waiter should look again (it may be first)


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
    """Admits writes while ``ledger.unsynced + n <= window()``, paced above half the window.

    One queue, first come first served, for both reasons to wait: only its first waiter
    waits for room or for the pacing clock, and a write that arrives while anyone waits goes
    behind them. (Pacing used to book each arrival a slot on the clock: slots booked while
    the pace was slow outlived it, and writers arriving after the window drained went ahead
    of those still asleep. With 64 writers one took six times the mean share.)
    """

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
        #: The pacing clock: when the next write may be admitted (set by each admission).
        self._next_paced = 0.0
        self.throttled_total = 0
        self.paced_total = 0
        self.timeouts_total = 0
        self.wait_seconds_total = 0.0

    @property
    def waiting(self) -> int:
        """Writes waiting for room in the window; none while the line only waits for its
        pacing turn (the flusher reads this as "writers need a sync now")."""
        if not self._queue or self._fits(self._queue[0].nbytes):
            return 0
        return len(self._queue)

    def _fits(self, nbytes: int) -> bool:
        unsynced = self.ledger.unsynced
        # An empty mount always admits, so a write larger than the window still progresses.
        return unsynced == 0 or unsynced + nbytes <= self.window()

    def _pace(self) -> float | None:
        rate = self.commit_rate() if self.commit_rate is not None else None
        if not rate:
            return None
        return pacing_rate(rate, self.ledger.unsynced, self.window())

    def _admit_now(self, nbytes: int, now: float) -> None:
        """Reserve *nbytes* and move the pacing clock on by their time at the current pace."""
        pace = self._pace()
        self.ledger.reserve(nbytes)
        self._next_paced = now if pace is None else max(now, self._next_paced) + nbytes / pace

    def _ready_at(self, nbytes: int, now: float) -> float | None:
        """When a first-in-line write of *nbytes* may go: now, a later time (pacing), or
        None (no room: wait for a sync to end)."""
        if not self._fits(nbytes):
            return None
        if self._pace() is None:
            return now
        return max(now, self._next_paced)

    async def admit(self, nbytes: int) -> float:
        """Reserve *nbytes* in the ledger, waiting for room; returns the seconds waited."""
        if not self.enabled:
            self.ledger.reserve(nbytes)
            return 0.0
        now_at_start = trio.current_time()
        if not self._queue and self._ready_at(nbytes, now_at_start) == now_at_start:
            self._admit_now(nbytes, now_at_start)
            return 0.0
        waiter = _Waiter(nbytes)
        self._queue.append(waiter)
        if self.on_pressure is not None:
            self.on_pressure()
        full = False  # whether it ever waited for room, not only for the pacing clock
        try:
            with trio.move_on_after(self.timeout) as bound:
                while True:
                    full = full or not self._fits(nbytes)
                    now = trio.current_time()
                    ready = self._ready_at(nbytes, now) if self._queue[0] is waiter else None
                    if ready == now:
                        break
                    with trio.move_on_at(math.inf if ready is None else ready):
                        await waiter.event.wait()
                    waiter.event = trio.Event()
        finally:
            self._leave(waiter)  # also when cancelled from outside: nothing was reserved
        self._admit_now(nbytes, trio.current_time())
        if bound.cancelled_caught:  # waited the full bound: admitted anyway, and counted
            self.timeouts_total += 1
        if full or bound.cancelled_caught:
            self.throttled_total += 1
        else:
            self.paced_total += 1
        waited = trio.current_time() - now_at_start
        self.wait_seconds_total += waited
        return waited

    def _leave(self, waiter: _Waiter) -> None:
        """Take *waiter* out of the line; whoever is first now looks again."""
        was_first = self._queue[0] is waiter
        self._queue.remove(waiter)
        if was_first:
            self.wake()

    def wake(self) -> None:
        """Room or pace may have changed: the first waiter looks again. Call whenever room may
        have appeared."""
        if self._queue:
            self._queue[0].event.set()
            if self.on_pressure is not None:
                self.on_pressure()

    def statistics(self) -> GateStatistics:
        return GateStatistics(
            self.waiting,
            self.throttled_total,
            self.timeouts_total,
            self.wait_seconds_total,
            self.paced_total,
        )
