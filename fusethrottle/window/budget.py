"""The write budget: the one owner of the window, and of every byte that enters and leaves it.

It holds the ledger (how many bytes are un-synced, per file and in all), the gate (where writes
wait for room), the window's size and the kernel's share of it, and wakes whoever a change
concerns: writers queued at the gate when room appears or the window grows, the flusher when a
file reaches its sync trigger or writers queue up. Handlers and the flusher speak to it in verbs:

====================  ===================================================  ===============
call                  what happened                                        wakes
====================  ===================================================  ===============
``write(...)``        admit (may wait), send to the target, land the bytes  writers if short
``landed()``          wait until every write under way has ended            -
``discard(id)``       the file's data needs no sync (unlink, truncate)      writers
``begin_sync(id)``    an fsync starts and takes the file's dirty bytes      -
``end_sync(...)``     it ended: durable, or dirty again with the error      writers
``sampled(...)``      a sync measured the target: the window may move       writers if it grew
``sync_failed(...)``  a sync failed: the window may shrink                  -
``take_error(id)``    the file's pending sync error, handed out once        -
``lost(id, errno)``   the target failed to store some of the file's data    -
``released(id)``      the file's last handle closed                         -
====================  ===================================================  ===============

The window is a value, not a computation: it changes only in ``sampled``/``sync_failed`` (once
per fsync), and the kernel's share follows it in :meth:`keep_kernel_share`, whose sysfs write
runs in a thread, never on the event loop. The ledger (pure bookkeeping), the gate (waiting) and
the controller (the window's size) stay separate and unit-tested on their own; this class only
sequences them. Called from the event loop only: code between awaits is atomic.

A write, once admitted, is carried by a task of the budget's own (:meth:`run`), not by the
request that asked for it: the request may stop waiting (its caller is being killed, a shutdown
gives up on it) while its call still runs in a worker thread and may yet land on the target. The
carrying task keeps the bytes counted, and the file's order of writes held, until that call has
ended; then it accounts for what landed.
"""

from __future__ import annotations

import errno
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import outcome
import trio

from .admission import GateStatistics, WindowGate
from .controller import Controller
from .kernel_cache import KernelCache
from .ledger import Ledger, SyncTicket, sync_trigger


class _NotSent(Exception):
    """The request stopped waiting before its write was sent: it is not sent at all."""


class _NoOrder:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


_NO_ORDER = _NoOrder()

#: What is admitted until the first fsync has measured the target (see effective_window).
STARTUP_WINDOW = 16 << 20


def effective_window(window: int, commit_rate: float | None) -> int:
    """Slow start: until one fsync has shown how fast the target commits, admit little.

    Without it the first write burst fills the whole window before anything is known, and the
    first fsync (which writes back everything dirty in the file, not just one batch) then holds
    the writer for window / target speed: ten seconds at 256 MiB and 20 MiB/s.
    """
    return window if commit_rate is not None else min(window, STARTUP_WINDOW)


@dataclass(frozen=True)
class BudgetStatistics:
    #: The bound in force on everything un-synced (kernel cache and target), slow start included.
    window_bytes: int
    #: What the gate admits to the target: the window less the kernel's share.
    target_window_bytes: int
    gate: GateStatistics


@dataclass(eq=False)
class _Carried:
    """One admitted write, between the request that asked for it and the task that carries it."""

    done: trio.Event = field(default_factory=trio.Event)
    result: outcome.Outcome | None = None
    #: The request stopped waiting: a write not yet sent is then not sent at all.
    abandoned: bool = False


class WriteBudget:
    """Admits, lands, gives back, discards and syncs bytes; sizes the window; wakes."""

    def __init__(
        self,
        ledger: Ledger,
        controller: Controller,
        *,
        batch: int,
        kernel_cache: KernelCache | None = None,
        enforce: bool = True,
        admission_timeout: float = 60.0,
        on_admission_wait: Callable[[float], None] | None = None,
    ) -> None:
        self.ledger = ledger
        self.controller = controller
        self.batch = batch
        self.kernel_cache = kernel_cache
        self.on_admission_wait = on_admission_wait
        self._total = effective_window(controller.window, controller.commit_rate)
        self.gate = WindowGate(
            ledger,
            self.window,
            enabled=enforce,
            timeout=admission_timeout,
            on_pressure=self.wake_flusher,
            commit_rate=lambda: controller.commit_rate,
        )
        self._flusher_wakeup = trio.Event()
        self._share_moved = trio.Event()
        self._carriers: trio.Nursery | None = None
        #: Writes admitted and not yet ended (sent or not), and who waits for none to be left.
        self._under_way = 0
        self._all_landed = trio.Event()
        self._all_landed.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Carry admitted writes to the target until cancelled (see the module docstring)."""
        async with trio.open_nursery() as nursery:
            self._carriers = nursery
            task_status.started()
            await trio.sleep_forever()

    # -- the window ------------------------------------------------------------------------

    def total_window(self) -> int:
        """The bound on everything un-synced (the kernel's cache and the target), slow start
        included."""
        return self._total

    def window(self) -> int:
        """The part of the window the gate admits to the target: the total less the kernel's
        share of it."""
        if self.kernel_cache is None:
            return self._total
        return self.kernel_cache.ledger_window(self._total)

    def trigger(self) -> int:
        """Dirty bytes at which a file is synced: ``batch``, or half the window if smaller."""
        return sync_trigger(self.batch, self.window())

    def sampled(self, now: float, synced: int, seconds: float) -> None:
        """A sync of *synced* bytes took *seconds*: let the controller resize the window."""
        self.controller.on_sample(now, synced, seconds, self.ledger.unsynced, self.window())
        self._resized()

    def sync_failed(self, now: float, errno: int) -> None:
        self.controller.on_error(now, errno)
        self._resized()

    def _resized(self) -> None:
        total = effective_window(self.controller.window, self.controller.commit_rate)
        if total == self._total:
            return
        grew = total > self._total
        self._total = total
        self._share_moved.set()
        if grew:
            self.gate.wake()

    async def keep_kernel_share(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Keep the kernel's share of the window in step with it, until cancelled. The sysfs
        write runs in a thread: a write to /sys can wait (on the bdi's lock, on a busy
        kernel), and the event loop answers every request of the mount."""
        task_status.started()
        if self.kernel_cache is None:
            return
        while True:
            await self._share_moved.wait()
            self._share_moved = trio.Event()
            before = self.window()
            await trio.to_thread.run_sync(self.kernel_cache.update, self._total)
            if self.window() > before:
                self.gate.wake()

    def statistics(self) -> BudgetStatistics:
        return BudgetStatistics(self._total, self.window(), self.gate.statistics())

    # -- the flusher's wake-up -----------------------------------------------------------------

    def wake_flusher(self) -> None:
        """Something changed that the flusher acts on (a file reached its trigger, a file
        closed, writers queued, a sync was abandoned): it looks again."""
        self._flusher_wakeup.set()

    async def flusher_wakeup(self, deadline: float) -> None:
        """Wait (until *deadline* at most) for :meth:`wake_flusher`."""
        with trio.move_on_at(deadline):
            await self._flusher_wakeup.wait()
        self._flusher_wakeup = trio.Event()

    # -- bytes -------------------------------------------------------------------------------

    @property
    def waiting(self) -> int:
        return self.gate.waiting

    async def write(
        self,
        nodeid: int,
        nbytes: int,
        send: Callable[[], Awaitable[int]],
        *,
        order: trio.Lock | None = None,
        ended: Callable[[], None] | None = None,
    ) -> int:
        """Admit *nbytes* for *nodeid*, run *send* (the pwrite) in a task of :meth:`run`, one at
        a time per *order*, and account for what it wrote. *ended* is called once the write
        has ended, landed or not (also when the request stopped waiting for it first)."""
        assert self._carriers is not None, "WriteBudget.run is not running"
        try:
            waited = await self.gate.admit(nbytes)
        except BaseException:
            if ended is not None:
                ended()
            raise
        if waited and self.on_admission_wait is not None:
            self.on_admission_wait(waited)
        carried = _Carried()
        self._begin()
        self._carriers.start_soon(self._carry, nodeid, nbytes, send, order, ended, carried)
        try:
            await carried.done.wait()
        except BaseException:
            carried.abandoned = True  # the carrier keeps it counted until its call has ended
            raise
        assert carried.result is not None
        return carried.result.unwrap()  # type: ignore[no-any-return]

    async def _carry(
        self,
        nodeid: int,
        nbytes: int,
        send: Callable[[], Awaitable[int]],
        order: trio.Lock | None,
        ended: Callable[[], None] | None,
        carried: _Carried,
    ) -> None:
        sent = False
        try:
            async with order if order is not None else _NO_ORDER:
                if carried.abandoned:
                    raise _NotSent
                self.ledger.sending(nodeid, nbytes)
                sent = True
                written = await send()
        except _NotSent:
            self.ledger.unreserve(nbytes)
            self.gate.wake()
        except trio.Cancelled:
            # A shutdown that stopped waiting for the target: the call may still land, so its
            # bytes stay counted (and the file named) rather than pass for synced.
            if not sent:
                self.ledger.unreserve(nbytes)
            carried.result = outcome.Error(OSError(errno.EIO, "the write was abandoned"))
            raise
        except BaseException as exc:
            self.ledger.unsent(nodeid, nbytes)
            self.gate.wake()
            if isinstance(exc, OSError) and exc.errno is not None:
                self.ledger.lost_data(nodeid, exc.errno)
            carried.result = outcome.Error(exc)
        else:
            self.ledger.written(nodeid, nbytes, written, trio.current_time())
            if written != nbytes:
                self.gate.wake()
            state = self.ledger.file(nodeid)
            if state is not None and state.dirty >= self.trigger():
                self.wake_flusher()
            carried.result = outcome.Value(written)
        finally:
            if ended is not None:
                ended()
            carried.done.set()
            self._end()

    def _begin(self) -> None:
        self._under_way += 1
        if self._under_way == 1:
            self._all_landed = trio.Event()

    def _end(self) -> None:
        self._under_way -= 1
        if self._under_way == 0:
            self._all_landed.set()

    async def landed(self) -> None:
        """Wait until every admitted write has ended: landed on the target, or failed."""
        await self._all_landed.wait()

    def discard(self, nodeid: int) -> None:
        """The file's un-synced data needs no fsync any more (last name gone, truncated)."""
        if self.ledger.discard(nodeid):
            self.gate.wake()

    def begin_sync(self, nodeid: int) -> SyncTicket:
        return self.ledger.begin_sync(nodeid)

    def end_sync(
        self, ticket: SyncTicket, error: int | None, now: float, *, reported: bool = False
    ) -> None:
        self.ledger.end_sync(ticket, error, now, reported=reported)
        self.gate.wake()

    def take_error(self, nodeid: int) -> int | None:
        """The file's pending sync error, handed out once (the kernel's errseq rule)."""
        return self.ledger.take_error(nodeid)

    def lost(self, nodeid: int, errno: int) -> None:
        """The target failed to store some of the file's data: name it at unmount."""
        self.ledger.lost_data(nodeid, errno)

    def released(self, nodeid: int) -> bool:
        """The file's last handle closed; True if data of it still waits for a sync."""
        return self.ledger.released(nodeid)

    def retry_now(self, nodeid: int) -> None:
        """Skip the file's retry backoff (the final syncs at unmount)."""
        self.ledger.retry_now(nodeid)

    def abandon_sync(self, ticket: SyncTicket) -> None:
        """Nobody waits for that fsync any more: its bytes are un-synced again, no error."""
        self.ledger.abandon_sync(ticket)
        self.wake_flusher()
