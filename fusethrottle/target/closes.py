"""Closes of released files, deferred and gathered: one trip to a worker thread for many files,
and taken back when a removal must let go of the file first (see removals.LetGo).

A part of :class:`~.backend.Backend` (its pools and the queue are set up there)."""

from __future__ import annotations

import trio

from .removals import LetGo
from .target_calls import close_all

#: How long released descriptors gather before one thread trip closes them all.
CLOSE_GATHER = 0.02


class DeferredCloses:
    def close_soon(self, fd: int, nodeid: int = 0) -> None:
        """Close a released file's descriptor in the background, with the others released
        meanwhile: one trip to a thread for many files (the kernel does not wait for the
        release reply, so nobody waits for the close; on a tree copy this saves a trip per
        file). Needs :meth:`run_closer` running. An unlink of the file takes it back
        (:meth:`take_closes`): a descriptor still open would keep the file's space, and on
        NFS turn the unlink into a silly rename."""
        self._to_close.append((nodeid, fd))
        self._close_wakeup.set()
        if self._closes_done.is_set():
            self._closes_done = trio.Event()

    def take_closes(self, nodeid: int) -> list[int]:
        """The descriptors of *nodeid* still waiting to be closed, taken out of the queue (the
        caller closes them)."""
        mine = [fd for owner, fd in self._to_close if owner == nodeid]
        if mine:
            self._to_close = [(owner, fd) for owner, fd in self._to_close if owner != nodeid]
        return mine

    async def let_go(self, path_fd: int, fds: list[int]) -> None:
        """Let go of a file nothing needs any more: its O_PATH descriptor's number is pointed at
        a placeholder (see removals.LetGo), *fds* are closed (NFS: a close may write back;
        a thread then)."""
        await self.data.run(LetGo((0, 0), path_fd, fds).release)

    async def closes_made(self) -> None:
        """Wait until every close queued so far has been made (a stop waits for them within
        its bound, so that what it leaves to a thread nobody waits for is only what the
        target would not let close in time)."""
        await self._closes_done.wait()

    async def run_closer(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Close what :meth:`close_soon` queued, until cancelled; then hand the rest to a
        worker thread. Never on the event loop: on NFS a close writes back and waits for the
        server, and a stop must end within unmount_timeout even if the server is gone. A
        batch whose wait is cancelled is still closed (*must_run*), by a thread nobody waits
        for; the process exits without it if the target never answers."""
        task_status.started()
        try:
            while True:
                await self._close_wakeup.wait()
                await trio.sleep(CLOSE_GATHER)  # let a tree copy's next releases join in
                self._close_wakeup = trio.Event()
                fds = [fd for _, fd in self._to_close]
                self._to_close = []
                if fds:
                    await self.data.run(close_all, fds, must_run=True)
                if not self._to_close:
                    self._closes_done.set()
        finally:
            fds = [fd for _, fd in self._to_close]
            self._to_close = []
            if fds:
                self.data.spawn(close_all, fds)
