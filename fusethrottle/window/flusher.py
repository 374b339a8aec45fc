"""The flusher: background fsyncs that keep the un-synced window moving.

It fsyncs (fdatasync) a file when its dirty bytes reach ``batch``, when its oldest dirty byte is
``max_age`` old, when it is released with dirty data, and the largest file when writers are
waiting at the gate. One fsync per file at a time; many files in parallel, bounded by the
backend's ``sync`` thread pool. Writing continues while earlier batches sync, which is what makes
the throttle nearly free when the target keeps up.

Small files closed with dirty data (a tar or rsync of a tree closes thousands a second) are
synced in groups: one worker-thread call fsyncs every file released since the previous group
started, because the hop into a thread and back costs more than an fsync of a few KiB.

An injected sync goes easy on the target's queue and on memory (backend.SyncPlan): it writes
the file's newly written range back in pieces of about ``PIECE_SECONDS`` of the target's
measured commit rate, waiting for each, then fdatasyncs and drops the range from the page cache.
A page then waits in the target's queue for one piece, not a whole batch: reclaim in a memory
cgroup that meets a page under writeback waits for it (seconds behind a 1 MiB/s target, for
whoever allocates). And synced data does not crowd the page cache, neither the target's nor the
mount's own (kernel_pages.py): the backup never reads it again.

Every completed fsync is timed and fed to the controller, which may move the window; the budget
wakes the writers. A failed fsync is logged once per file (rate-limited), counted, and its bytes
stay un-synced; the ledger keeps the errno for the application (see ledger.py).
"""

from __future__ import annotations

import errno as errno_mod
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import trio

from ..adapter.inodes import Inode, InodeTable
from ..adapter.kernel_pages import KernelPages
from ..loglimit import LogLimiter
from ..target.backend import Backend
from ..target.credentials import Caller
from ..target.syncs import SyncPlan
from .budget import WriteBudget
from .ledger import SyncTicket

log = logging.getLogger(__name__)

FsyncObserver = Callable[[str, float, int, "int | None"], None]

#: Released files at most this dirty are synced in groups (see the module docstring).
GROUP_SYNC_MAX_BYTES = 1 << 20
#: How long released files gather before a group starts: nobody waits for these fsyncs.
GROUP_SYNC_GATHER = 0.02
#: At most this many files per group, so one group's thread call stays short.
GROUP_SYNC_MAX_FILES = 256
#: Released handles' descriptors kept for their files' syncs at most (see Flusher.start):
#: beyond, a sync reopens the file, as it must after an unmount's wait. Each one is a
#: descriptor the inode table's share of the limit does not count (kernel_entries.py).
HELD_HANDLES_MAX = 64
#: A writeback piece is this many seconds of the target's commit rate ...
PIECE_SECONDS = 0.1
#: ... but at least this (a smaller piece only adds system calls) ...
PIECE_MIN = 128 << 10
#: ... and until the rate is known, this.
PIECE_UNKNOWN_RATE = 1 << 20
#: An injected sync that fails with this found the file gone from the target: on NFS, another
#: client deleted it. Its data can never be synced; retrying would hold it forever.
GONE = frozenset({errno_mod.ESTALE})


def writeback_piece(commit_rate: float | None, trigger: int) -> int:
    """Bytes written back at a time in an injected sync (whole pages; never above *trigger*,
    the most one sync has to write)."""
    want = PIECE_UNKNOWN_RATE if commit_rate is None else commit_rate * PIECE_SECONDS
    piece = max(PIECE_MIN, min(int(want), trigger))
    return max(PIECE_MIN, piece - piece % 4096)


@dataclass(frozen=True)
class FlusherStatistics:
    in_flight: int
    fsyncs_total: int
    fsync_errors_total: int
    last_fsync_seconds: float


class Flusher:
    """Starts injected fsyncs as the ledger makes them due."""

    def __init__(
        self,
        budget: WriteBudget,
        backend: Backend,
        inodes: InodeTable,
        *,
        batch: int,
        max_age: float,
        inject: bool = True,
        on_fsync: FsyncObserver | None = None,
        pieces: bool = True,
        drop_synced: bool = True,
        kernel_pages: KernelPages | None = None,
    ) -> None:
        self.budget = budget
        self.ledger = budget.ledger
        self.backend = backend
        self.inodes = inodes
        self.batch = batch
        self.max_age = max_age
        self.inject = inject
        self.on_fsync = on_fsync
        self.pieces = pieces
        self.drop_synced = drop_synced
        self.kernel_pages = kernel_pages if drop_synced else None
        self._nursery: trio.Nursery | None = None
        self._syncing: set[int] = set()
        #: Node ids someone waits for the sync of (see let_go), with the event _done sets.
        self._ended: dict[int, trio.Event] = {}
        self._idle = trio.Event()
        self._idle.set()
        self.fsyncs_total = 0
        self.fsync_errors_total = 0
        self.last_fsync_seconds = 0.0
        self._error_log = LogLimiter(60.0)  # one line per file a minute
        self._group: list[int] = []  # released small files waiting for the next group sync
        self._group_running = False
        #: Released handles' descriptors kept for the file's release sync (see start).
        self._handle_fds: dict[int, int] = {}

    def poke(self) -> None:
        """Something changed (a write landed, a file closed, writers queued): look again."""
        self.budget.wake_flusher()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled; in-flight fsyncs are children of this task."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                if self.inject:
                    self._start_due(trio.current_time())
                deadline = (
                    self.ledger.next_deadline(self.max_age, self._syncing) if self.inject else None
                )
                await self.budget.flusher_wakeup(deadline if deadline is not None else math.inf)

    def _start_due(self, now: float) -> None:
        due = self.ledger.due(
            now,
            batch=self.batch,
            window=self.budget.window(),
            max_age=self.max_age,
            # Writers queued or paced: keep the target busy with the largest dirty file.
            pressure=self.budget.waiting > 0 or self.ledger.unsynced * 2 >= self.budget.window(),
        )
        for nodeid, reason in due:
            self.start(nodeid, reason)

    def start(self, nodeid: int, reason: str, fd: int | None = None) -> bool:
        """Begin an fsync of *nodeid* in the background unless one is already running.

        *fd*: the descriptor of the handle just released, which the sync then uses and closes
        (True: it was taken; otherwise the caller closes it). On NFS a sync through a new
        descriptor is an OPEN and a CLOSE (or OPEN_DOWNGRADE) on the wire, one through the
        handle's none at all: its close already wrote and committed the data.
        """
        if nodeid in self._syncing or self._nursery is None:
            return False
        inode = self.inodes.get(nodeid)
        if inode is None or inode.detached:
            self.budget.discard(nodeid)
            return False
        if inode.detaching:
            return False  # its last name is being removed: its data will not need a sync
        state = self.ledger.file(nodeid)
        if fd is not None and len(self._handle_fds) >= HELD_HANDLES_MAX:
            fd = None
        if reason == "release" and state is not None and state.dirty <= GROUP_SYNC_MAX_BYTES:
            self._mark_busy(nodeid)
            self._group.append(nodeid)
            if fd is not None:
                self._handle_fds[nodeid] = fd
            if not self._group_running:
                self._group_running = True
                self._nursery.start_soon(self._sync_groups)
            return fd is not None
        ticket = self.budget.begin_sync(nodeid)
        self._mark_busy(nodeid)
        if fd is not None:
            self._handle_fds[nodeid] = fd  # counted while held; _sync takes it back
        self._nursery.start_soon(self._sync, inode, ticket, reason, self.plan(inode))
        return fd is not None

    def plan(self, inode: Inode) -> SyncPlan:
        """How the next injected sync of *inode* writes back and what it drops (takes the
        range written so far: later writes belong to the next sync)."""
        rate = self.budget.controller.commit_rate
        piece = writeback_piece(rate, self.budget.trigger()) if self.pieces else 0
        return SyncPlan(inode.take_written(), piece, self.drop_synced)

    def holds(self, nodeid: int) -> bool:
        """Whether an fsync of the file is queued or running (its descriptor must stay open)."""
        return nodeid in self._syncing

    def owes(self, nodeid: int) -> bool:
        """Whether the file has data not yet durable: un-synced in the window, or a sync of it
        queued or running (what :meth:`Inode.needed` asks)."""
        state = self.ledger.file(nodeid)
        return nodeid in self._syncing or (state is not None and state.unsynced > 0)

    async def let_go(self, nodeid: int, timeout: float) -> bool:
        """The file's last name is being removed: drop its queued sync, and wait (at most
        *timeout*) for a running one to end. True if nothing of the flusher holds it now."""
        if nodeid in self._group:
            self._group.remove(nodeid)
            fd = self._handle_fds.pop(nodeid, None)
            if fd is not None:
                # Into the close queue, where the removal takes it back (take_closes) to
                # close before the name goes: an open descriptor would keep the file.
                self.backend.close_soon(fd, nodeid)
            self._done(nodeid)
        with trio.move_on_after(timeout):
            while nodeid in self._syncing:
                ended = self._ended.setdefault(nodeid, trio.Event())
                await ended.wait()
        return nodeid not in self._syncing

    def _mark_busy(self, nodeid: int) -> None:
        self._syncing.add(nodeid)
        if self._idle.is_set():
            self._idle = trio.Event()

    def _done(self, nodeid: int) -> None:
        self._syncing.discard(nodeid)
        ended = self._ended.pop(nodeid, None)
        if ended is not None:
            ended.set()
        if not self._syncing:
            self._idle.set()

    async def _sync(self, inode: Inode, ticket: SyncTicket, reason: str, plan: SyncPlan) -> None:
        start = trio.current_time()
        error: int | None = None
        try:
            fd = self._handle_fds.get(ticket.nodeid)
            await self.backend.fsync_path(
                inode.writer, inode.path_fd, datasync=True, plan=plan, fd=fd
            )
        except OSError as err:
            error = err.errno or errno_mod.EIO
        except Exception:  # a bug must not end the flusher (and with it the mount)
            log.exception(
                "injected fsync (%s) of inode %d failed unexpectedly", reason, ticket.nodeid
            )
            error = errno_mod.EIO
        finally:
            self._handle_fds.pop(ticket.nodeid, None)  # closed by fsync_path
            now = trio.current_time()
            self._done(ticket.nodeid)
        if error is not None:
            inode.give_back_written(plan.written)
        elif self.kernel_pages is not None:
            self.kernel_pages.drop_soon(ticket.nodeid, plan.written)
        self._finish([(ticket, error)], reason, now - start, now)

    async def _sync_groups(self) -> None:
        """Sync released small files, one thread call per group, until none are left."""
        try:
            while self._group:
                await trio.sleep(GROUP_SYNC_GATHER)  # let the next released files join in
                nodeids = self._group[:GROUP_SYNC_MAX_FILES]
                del self._group[:GROUP_SYNC_MAX_FILES]
                tickets: list[SyncTicket] = []
                files: list[tuple[Caller | None, int, int | None]] = []
                for nodeid in nodeids:
                    inode = self.inodes.get(nodeid)
                    state = self.ledger.file(nodeid)
                    fd = self._handle_fds.pop(nodeid, None)
                    if inode is None or inode.detached or state is None or state.dirty == 0:
                        # Unlinked or truncated since it was released: nothing left to sync.
                        if fd is not None:
                            self.backend.close_soon(fd, nodeid)
                        self.budget.discard(nodeid)
                        self._done(nodeid)
                        self._maybe_drop(nodeid)
                        continue
                    tickets.append(self.budget.begin_sync(nodeid))
                    files.append((inode.writer, inode.path_fd, fd))
                    inode.take_written()  # small: synced whole, dropped whole
                start = trio.current_time()
                try:
                    errors = await self.backend.fsync_paths(
                        files, datasync=True, plan=SyncPlan(drop=self.drop_synced)
                    )
                except Exception:  # a bug must not end the flusher (and with it the mount)
                    log.exception("group fsync of %d released files failed", len(files))
                    errors = [errno_mod.EIO] * len(files)
                finally:
                    now = trio.current_time()
                    for ticket in tickets:
                        self._done(ticket.nodeid)
                # The mount's copies of released small files are left to reclaim: a message per
                # file (and the attributes it makes the kernel ask for again) cost a tree copy
                # more than the pages are worth. Their target copies are dropped in the sync.
                self._finish(list(zip(tickets, errors, strict=True)), "release", now - start, now)
        finally:
            self._group_running = False
            for nodeid in self._group:  # cancelled (a shutdown past its grace): not leaked
                fd = self._handle_fds.pop(nodeid, None)
                if fd is not None:
                    self.backend.close_soon(fd, nodeid)

    def _finish(
        self,
        results: list[tuple[SyncTicket, int | None]],
        reason: str,
        seconds: float,
        now: float,
    ) -> None:
        """Account for one fsync call (a group counts as one: one commit round trip)."""
        synced = 0
        for ticket, error in results:
            if error in GONE:
                self._gone(ticket, reason)
                continue
            self.budget.end_sync(ticket, error, now)
            if error is None:
                synced += ticket.nbytes
            else:
                self.fsync_errors_total += 1
                self.budget.sync_failed(now, error)
                self._log_error(ticket.nodeid, reason, error, now)
            self._maybe_drop(ticket.nodeid)
        if not results:
            return
        self.fsyncs_total += 1
        self.last_fsync_seconds = seconds
        if synced or all(error is None for _, error in results):
            self.budget.sampled(now, synced, seconds)
        if self.on_fsync is not None:
            failed = next((error for _, error in results if error is not None), None)
            self.on_fsync(reason, seconds, sum(t.nbytes for t, _ in results), failed)
        self.poke()

    def _gone(self, ticket: SyncTicket, reason: str) -> None:
        """The file is gone from the target (another writer deleted it): its un-synced bytes
        leave the ledger, the synced bytes and the sync's time say nothing about the target,
        and nobody is told of an error (the application's own fsync or close of the file meets
        the target's ESTALE itself)."""
        self.budget.end_sync(ticket, errno_mod.ESTALE, trio.current_time(), reported=True)
        self.budget.discard(ticket.nodeid)  # and what was written while the sync ran
        log.info(
            "injected fsync (%s) of inode %d: the file is gone from the target (deleted by "
            "another writer); its %d un-synced bytes are dropped",
            reason,
            ticket.nodeid,
            ticket.nbytes,
        )
        self._maybe_drop(ticket.nodeid)

    def _log_error(self, nodeid: int, reason: str, error: int, now: float) -> None:
        if not self._error_log.allow(nodeid, now):
            return
        log.error(
            "injected fsync (%s) of inode %d failed: %s; data kept as un-synced, "
            "the error goes to the application's next write, fsync or close",
            reason,
            nodeid,
            os.strerror(error),
        )

    def _maybe_drop(self, nodeid: int) -> None:
        """Close the descriptor of a file the kernel forgot once its data is durable."""
        inode = self.inodes.get(nodeid)
        if inode is not None and inode.droppable(self.owes(nodeid)):
            self.inodes.drop(inode)

    async def _settle(self) -> None:
        """Wait until no fsync is in flight (new ones may start while we wait)."""
        while self._syncing:
            await self._idle.wait()

    async def flush_all(self, reason: str = "unmount") -> list[int]:
        """fsync every file with un-synced data and wait; returns node ids still un-synced.

        Failed files get three attempts, ignoring their retry backoff. Writes still under way
        land first: a sync that began before them would not cover them.
        """
        await self.budget.landed()
        for _ in range(3):
            await self._settle()
            dirty = self.ledger.all_dirty()
            if not dirty:
                break
            for nodeid in dirty:
                self.budget.retry_now(nodeid)
                self.start(nodeid, reason)
        await self._settle()
        return [n for n, s in self.ledger.files.items() if s.unsynced > 0]

    def statistics(self) -> FlusherStatistics:
        return FlusherStatistics(
            len(self._syncing), self.fsyncs_total, self.fsync_errors_total, self.last_fsync_seconds
        )
