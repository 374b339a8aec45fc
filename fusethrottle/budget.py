"""The write budget: the one place where bytes enter, leave and move through the window.

Every change to the un-synced bytes goes through :class:`WriteBudget`, and each change that may
make room wakes the writers queued at the gate, so no caller has to remember to:

====================  ===================================================  ===============
call                  what happened                                        wakes writers
====================  ===================================================  ===============
``write(...)``        admit (may wait), send to the target, land the bytes  if short/failed
``discard(id)``       the file's data needs no sync (unlink, truncate)      yes
``begin_sync(id)``    an fsync starts and takes the file's dirty bytes      no
``end_sync(...)``     it ended: durable, or dirty again with the error      yes
====================  ===================================================  ===============

The ledger (pure bookkeeping) and the gate (waiting) stay separate and unit-tested on their own;
this class only sequences them. Called from the event loop only: code between awaits is atomic.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from .admission import WindowGate
from .ledger import Ledger, SyncTicket, sync_trigger


class WriteBudget:
    """Admits, lands, gives back, discards and syncs bytes; wakes queued writers."""

    def __init__(
        self,
        ledger: Ledger,
        gate: WindowGate,
        *,
        batch: int,
        on_admission_wait: Callable[[float], None] | None = None,
    ) -> None:
        self.ledger = ledger
        self.gate = gate
        self.batch = batch
        self.on_admission_wait = on_admission_wait
        #: Called when a file's dirty bytes reach the sync trigger (the flusher's poke).
        self.on_batch_ready: Callable[[], None] = lambda: None

    @property
    def waiting(self) -> int:
        return self.gate.waiting

    def trigger(self) -> int:
        return sync_trigger(self.batch, self.gate.window())

    async def write(self, nodeid: int, nbytes: int, send: Callable[[], Awaitable[int]]) -> int:
        """Admit *nbytes* for *nodeid*, run *send* (the pwrite), and account for what it wrote."""
        waited = await self.gate.admit(nbytes)
        if waited and self.on_admission_wait is not None:
            self.on_admission_wait(waited)
        try:
            written = await send()
        except BaseException as exc:
            self.ledger.unreserve(nbytes)
            self.gate.wake()
            if isinstance(exc, OSError) and exc.errno is not None:
                self.ledger.lost_data(nodeid, exc.errno)
            raise
        self.ledger.written(nodeid, nbytes, written, trio.current_time())
        if written != nbytes:
            self.gate.wake()
        state = self.ledger.file(nodeid)
        if state is not None and state.dirty >= self.trigger():
            self.on_batch_ready()
        return written

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

    def abandon_sync(self, ticket: SyncTicket) -> None:
        """Nobody waits for that fsync any more: its bytes are un-synced again, no error."""
        self.ledger.abandon_sync(ticket)
        self.on_batch_ready()
