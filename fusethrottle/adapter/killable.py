"""Let a caller die while its request waits on a hung target, as a hard NFS mount lets it.

The kernel waits for a FUSE request the daemon has read without letting the caller die: from
then on only the daemon's answer frees it, whatever signals it gets. On a hard NFS mount whose
server is gone, NFS itself sleeps killable: SIGKILL, or any signal that kills the process, ends
the caller at once. Through the mount the caller would stay in uninterruptible sleep until the
server came back (wchan ``request_wait_answer``), and so would ``kill -9`` of a stuck backup.

pyfuse3 does not pass FUSE_INTERRUPT on, so the daemon watches instead. Every request runs in a
cancel scope of its own, registered with its caller's thread id; once a request has waited
:data:`GRACE`, its caller's ``/proc/TID/status`` is read every :data:`POLL`, and a pending
SIGKILL cancels the request, which is then answered EINTR (the kernel turns every fatal signal
into a SIGKILL pending on each thread of the dying process). The worker thread stuck on the
target is left behind (the pools bound how many) and what it returns later is given back
(WorkerPool.run's *discard*). Nothing is answered early for a caller that is not dying: a
handled SIGTERM waits, as it does on NFS.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import trio

#: A request younger than this is not looked at (almost every request is).
GRACE = 1.0
#: How often the callers of older requests are looked at.
POLL = 0.5
_SIGKILL = 1 << (signal.SIGKILL - 1)


def dying(status: str) -> bool:
    """Whether a /proc/TID/status text shows SIGKILL pending for that thread (pure)."""
    for line in status.splitlines():
        if line.startswith(("SigPnd:", "ShdPnd:")):
            try:
                if int(line.split()[1], 16) & _SIGKILL:
                    return True
            except (IndexError, ValueError):
                continue
    return False


def read_status(tid: int) -> str | None:
    try:
        with open(f"/proc/{tid}/status") as f:
            return f.read()
    except OSError:
        return None  # gone already, or not ours to see: nothing to decide


@dataclass(eq=False)
class _Waiting:
    tid: int
    since: float
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)


class KillWatch:
    """Cancels the requests of callers that are being killed (see the module docstring)."""

    def __init__(
        self,
        *,
        grace: float = GRACE,
        poll: float = POLL,
        status_of: Callable[[int], str | None] = read_status,
    ) -> None:
        self.grace = grace
        self.poll = poll
        self._status_of = status_of
        self._waiting: set[_Waiting] = set()
        self._work = trio.Event()
        #: Requests answered EINTR because their caller was being killed.
        self.answered_total = 0

    @contextlib.contextmanager
    def request(self, tid: int) -> Iterator[trio.CancelScope]:
        """Run a request of thread *tid* (0: unknown, never cancelled) in a cancel scope that
        is cancelled if that thread is being killed; ``cancelled_caught`` then says so."""
        entry = _Waiting(tid, trio.current_time())
        if tid > 0:
            self._waiting.add(entry)
            self._work.set()
        try:
            with entry.scope:
                yield entry.scope
        finally:
            self._waiting.discard(entry)

    def look(self, now: float) -> None:
        """Cancel the requests, older than the grace, whose callers are dying."""
        for entry in list(self._waiting):
            if now - entry.since < self.grace or entry.scope.cancel_called:
                continue
            status = self._status_of(entry.tid)
            if status is not None and dying(status):
                entry.scope.cancel()
                self.answered_total += 1

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            if not self._waiting:
                await self._work.wait()
                self._work = trio.Event()
                continue
            await trio.sleep(self.poll)
            self.look(trio.current_time())
