"""The dirty ledger: how many bytes each file and the whole mount hold un-synced.

Pure bookkeeping, no I/O and no clock reads (``now`` is passed in), so it is tested exhaustively
with a Hypothesis state machine. Called only from the event loop; each method is atomic.

A file's bytes move through these states::

    reserve(n)        admitted by the gate                        -> ``reserved`` (mount-wide)
    sending(id, n)    its call to the target started              -> also file.sending
    written(id, n)    the target accepted the write               -> file.dirty
    unsent(id, n)     the call failed, or never started           -> gone
    begin_sync(id)    an fsync started: dirty is handed to it     -> file.syncing
    end_sync(id, ok)  success: gone; failure: back to dirty, error kept for the application

``unsynced`` = reserved + every file's dirty + syncing. That is the quantity the window bounds:
data the kernel may still hold as Dirty/Writeback pages on behalf of this mount. A write's bytes
stay reserved until the call that carries them has ended, whoever stopped waiting for it: a
call still running in a worker thread may yet land on the target. ``file.sending`` names the
file they belong to, so that a stop that cannot wait for them says which file is incomplete.

Error semantics follow the kernel's errseq model: a failed fsync's errno is kept on the file and
handed out once, to the next write, fsync or close of that file (:meth:`take_error`).

Files whose data the target failed to store (``lost``) are remembered apart from that, for the
unmount's report: the writer was told, but the operator should not have to search for which
backups are incomplete. A retried fsync that succeeds does not clear it (the target dropped the
pages it could not write); only the data ceasing to matter does (unlinked, truncated to zero).
"""

from __future__ import annotations

import errno as errno_mod
from collections.abc import Container
from dataclasses import dataclass

#: Errors of a write or fsync that mean the target did not store the data (not a bad request).
LOSS_ERRNOS = frozenset(
    {
        errno_mod.ENOSPC,
        errno_mod.EDQUOT,
        errno_mod.EFBIG,
        errno_mod.EIO,
        errno_mod.EROFS,
        errno_mod.ETIMEDOUT,
    }
)


def sync_trigger(batch: int, window: int) -> int:
    """Dirty bytes at which a file is synced: ``batch``, or half the window if that is smaller.

    A window under two batches would idle the target while the writer refills it: syncing at
    half the window lets one half sync while the other is written.
    """
    return max(1, min(batch, window // 2))


@dataclass
class FileState:
    """One file's un-synced data."""

    nodeid: int
    dirty: int = 0
    syncing: int = 0
    #: Bytes whose write to the target is under way (counted in the mount's ``reserved``).
    sending: int = 0
    dirty_since: float | None = None
    syncing_since: float | None = None
    error: int | None = None
    errors: int = 0
    released: bool = False
    retry_after: float = 0.0

    @property
    def unsynced(self) -> int:
        """Bytes of this file that may not be durable on the target yet."""
        return self.dirty + self.syncing + self.sending

    def oldest(self) -> float | None:
        times = [t for t in (self.dirty_since, self.syncing_since) if t is not None]
        return min(times) if times else None


@dataclass(frozen=True)
class SyncTicket:
    """What one fsync covers; handed back to :meth:`Ledger.end_sync`."""

    nodeid: int
    nbytes: int
    since: float | None


@dataclass(frozen=True)
class LedgerSnapshot:
    unsynced: int
    reserved: int
    syncing: int
    dirty_files: int
    oldest_age: float
    written_total: int
    synced_total: int
    failed_syncs: int


class Ledger:
    """Per-file and mount-wide un-synced bytes."""

    def __init__(self) -> None:
        self.files: dict[int, FileState] = {}
        self.reserved = 0
        self._unsynced_files = 0
        self.written_total = 0
        self.synced_total = 0
        self.failed_syncs = 0
        #: node id -> errno of the first failure that left the file incomplete on the target.
        self.lost: dict[int, int] = {}

    # --- totals ----------------------------------------------------------------------------
    @property
    def unsynced(self) -> int:
        return self.reserved + self._unsynced_files

    def file(self, nodeid: int) -> FileState | None:
        return self.files.get(nodeid)

    def _state(self, nodeid: int) -> FileState:
        state = self.files.get(nodeid)
        if state is None:
            state = self.files[nodeid] = FileState(nodeid)
        return state

    def _gc(self, state: FileState) -> None:
        if state.unsynced == 0 and state.error is None:
            self.files.pop(state.nodeid, None)

    # --- the write path --------------------------------------------------------------------
    def reserve(self, nbytes: int) -> None:
        """Count a write the gate admitted but the target has not yet accepted."""
        self.reserved += nbytes

    def unreserve(self, nbytes: int) -> None:
        """An admitted write that never went to the target."""
        self.reserved = max(0, self.reserved - nbytes)

    def sending(self, nodeid: int, nbytes: int) -> None:
        """The call carrying *nbytes* reserved for *nodeid* started: they are the file's now,
        and stay counted until :meth:`written` or :meth:`unsent` says how it ended."""
        self._state(nodeid).sending += nbytes

    def unsent(self, nodeid: int, nbytes: int) -> None:
        """The call carrying *nbytes* for *nodeid* failed: nothing of them reached the target."""
        self._end_sending(nodeid, nbytes)
        self.unreserve(nbytes)

    def _end_sending(self, nodeid: int, nbytes: int) -> None:
        state = self.files.get(nodeid)
        if state is not None and state.sending:
            state.sending = max(0, state.sending - nbytes)
            self._gc(state)

    def written(self, nodeid: int, reserved: int, nbytes: int, now: float) -> None:
        """The target accepted *nbytes* of a write that had reserved *reserved*."""
        self._end_sending(nodeid, reserved)
        self.unreserve(reserved)
        if nbytes <= 0:
            return
        state = self._state(nodeid)
        if state.dirty == 0:
            state.dirty_since = now
        state.dirty += nbytes
        state.released = False
        self._unsynced_files += nbytes
        self.written_total += nbytes

    def released(self, nodeid: int) -> bool:
        """The last open handle closed; True if the file still holds un-synced data."""
        state = self.files.get(nodeid)
        if state is None or state.dirty == 0:
            return False
        state.released = True
        return True

    def retry_now(self, nodeid: int) -> None:
        """Forget the file's retry backoff: its next sync may start at once (at unmount)."""
        state = self.files.get(nodeid)
        if state is not None:
            state.retry_after = 0.0

    def lost_data(self, nodeid: int, error: int) -> None:
        """The target failed to store some of the file's data (a write or fsync failed)."""
        if error in LOSS_ERRNOS:
            self.lost.setdefault(nodeid, error)

    def discard(self, nodeid: int) -> int:
        """The file's data needs no sync any more (unlinked, or truncated to zero)."""
        self.lost.pop(nodeid, None)
        state = self.files.get(nodeid)
        if state is None:
            return 0
        gone = state.dirty
        self._unsynced_files -= gone
        state.dirty = 0
        state.dirty_since = None
        self._gc(state)
        return gone

    # --- the sync path ---------------------------------------------------------------------
    def begin_sync(self, nodeid: int) -> SyncTicket:
        """Hand the file's dirty bytes to an fsync that is about to start."""
        state = self._state(nodeid)
        ticket = SyncTicket(nodeid, state.dirty, state.dirty_since)
        state.syncing += state.dirty
        if state.syncing_since is None:
            state.syncing_since = state.dirty_since
        state.dirty = 0
        state.dirty_since = None
        state.released = False
        return ticket

    def end_sync(
        self, ticket: SyncTicket, error: int | None, now: float, *, reported: bool = False
    ) -> None:
        """An fsync ended: its bytes are durable, or (on *error*) un-synced again.

        With ``reported`` the error already reached the application (its own fsync failed), so
        the bytes leave the ledger instead of waiting for a retry.
        """
        state = self._state(ticket.nodeid)
        if error is not None:
            self.lost_data(ticket.nodeid, error)
        covered = min(ticket.nbytes, state.syncing)
        state.syncing -= covered
        if state.syncing == 0:
            state.syncing_since = None
        if error is not None and reported:
            self._unsynced_files -= covered
        elif error is None:
            self._unsynced_files -= covered
            self.synced_total += covered
            state.retry_after = 0.0
        else:
            self.failed_syncs += 1
            state.errors += 1
            state.error = error
            state.dirty += covered
            if covered and (state.dirty_since is None or (ticket.since or now) < state.dirty_since):
                state.dirty_since = ticket.since if ticket.since is not None else now
            backoff = min(30.0, 0.5 * 2 ** min(state.errors, 6))
            state.retry_after = now + backoff
        self._gc(state)

    def abandon_sync(self, ticket: SyncTicket) -> None:
        """Nobody waits for the fsync of *ticket* any more (its caller was killed): its bytes
        are dirty again, as before it began, with no error and no backoff."""
        state = self._state(ticket.nodeid)
        covered = min(ticket.nbytes, state.syncing)
        state.syncing -= covered
        if state.syncing == 0:
            state.syncing_since = None
        state.dirty += covered
        since = ticket.since
        earlier = state.dirty_since is None or (since is not None and since < state.dirty_since)
        if covered and since is not None and earlier:
            state.dirty_since = since
        self._gc(state)

    def take_error(self, nodeid: int) -> int | None:
        """The pending fsync error for the file, reported once (errseq-style)."""
        state = self.files.get(nodeid)
        if state is None or state.error is None:
            return None
        error, state.error = state.error, None
        state.errors = 0
        self._gc(state)
        return error

    # --- choosing what to flush ------------------------------------------------------------
    def due(
        self, now: float, *, batch: int, window: int, max_age: float, pressure: bool
    ) -> list[tuple[int, str]]:
        """Files whose dirty data should be fsynced now, with the reason, most urgent first.

        A file already being synced is left alone: one fsync per file at a time, the next one
        starts when it ends. Under window pressure (writers waiting, or the window full) the
        largest dirty file is flushed even below ``batch``.
        """
        ready = [
            s
            for s in self.files.values()
            if s.dirty > 0 and s.syncing == 0 and now >= s.retry_after
        ]
        ready.sort(key=lambda s: (-s.dirty, s.dirty_since or now))
        trigger = sync_trigger(batch, window)
        chosen: list[tuple[int, str]] = []
        for state in ready:
            if state.dirty >= trigger:
                chosen.append((state.nodeid, "batch"))
            elif state.released:
                chosen.append((state.nodeid, "release"))
            elif state.dirty_since is not None and now - state.dirty_since >= max_age:
                chosen.append((state.nodeid, "age"))
        if (pressure or self.unsynced >= window) and not chosen and ready:
            in_flight = sum(s.syncing for s in self.files.values())
            if in_flight < self.unsynced // 2 or in_flight == 0:
                chosen.append((ready[0].nodeid, "window"))
        return chosen

    def all_dirty(self) -> list[int]:
        return [s.nodeid for s in self.files.values() if s.dirty > 0]

    def next_deadline(self, max_age: float, busy: Container[int] = ()) -> float | None:
        """When the oldest dirty data reaches *max_age* (or a retry is due).

        Files being synced (or in *busy*) are left out: ``due`` will not pick them until their
        fsync ends, and that end wakes the flusher anyway. Counting them made a deadline that
        had passed during a long fsync come back at once, and the flusher spun on a whole core
        for as long as the fsync took (found by the degrade bench: 116% daemon CPU in a stall).
        """
        times = [
            max(s.dirty_since + max_age, s.retry_after)
            for s in self.files.values()
            if s.dirty > 0 and s.dirty_since is not None and s.syncing == 0 and s.nodeid not in busy
        ]
        return min(times) if times else None

    def snapshot(self, now: float) -> LedgerSnapshot:
        oldest = [s.oldest() for s in self.files.values()]
        ages = [now - t for t in oldest if t is not None]
        return LedgerSnapshot(
            unsynced=self.unsynced,
            reserved=self.reserved,
            syncing=sum(s.syncing for s in self.files.values()),
            dirty_files=sum(1 for s in self.files.values() if s.dirty + s.syncing > 0),
            oldest_age=max(ages) if ages else 0.0,
            written_total=self.written_total,
            synced_total=self.synced_total,
            failed_syncs=self.failed_syncs,
        )
