"""Drop what the target has committed from the mount's own page cache (the kernel's FUSE side).

Every byte a backup writes through the mount sits in two page caches: the mount's (where the
application's ``write()`` put it) and the target's (where the daemon wrote it). The flusher
drops the target's copy once it is synced (backend.SyncPlan). The mount's copy is charged to
the application's memory cgroup and stays there, clean, until reclaim finds it: a backup of
10 GiB leaves up to 10 GiB of pages nobody reads again, pushing the database's data out.

Only the kernel can drop those pages, and a FUSE daemon asks it with a notification: a
``FUSE_NOTIFY_INVAL_INODE`` message written to the FUSE device names the node and a byte range,
and the kernel invalidates that range of the file's pages (and its cached attributes, which
it asks for again on the next stat). pyfuse3 only offers the whole file, which would also force
out the pages the application has just written and not yet handed over; this module writes the
message for the synced range only.

The kernel handles the notification inside the ``write()`` to the device, and a page still
dirty in the range (the application wrote it again meanwhile) is written back first: through
this daemon, which must be free to answer. So the writes go from a worker thread of their own,
never from the event loop: whatever queued meanwhile in one trip, ranges of one file merged.
Released small files are not dropped here (see Flusher._sync_groups).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import trio

from ..target.workers import WorkerPool
from .fuse_notify import inval_inode_message, write_notifications

PAGE = os.sysconf("SC_PAGE_SIZE")


def find_fuse_device_fd() -> int | None:
    """The descriptor of /dev/fuse this process serves the mount on (None: not found)."""
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "/dev/fuse":
                return int(name)
        except OSError:
            continue
    return None


class KernelPages:
    """Queues synced ranges and asks the kernel to drop them, one worker thread, in order."""

    def __init__(self, enabled: bool = True, known: Callable[[int], bool] | None = None) -> None:
        self.enabled = enabled
        # Whether the kernel still holds a node (checked just before each message: a node it
        # has forgotten may already name another object, which must not be touched).
        self.known = known or (lambda nodeid: True)
        self.device_fd: int | None = None
        self._pending: dict[int, tuple[int, int]] = {}
        self._wakeup = trio.Event()
        self._pool = WorkerPool("kernel-pages", 1)
        self.dropped_ranges = 0

    def attach(self, device_fd: int | None) -> None:
        """Start sending (after the mount exists); without a device nothing is ever sent."""
        self.device_fd = device_fd if self.enabled else None

    def drop_soon(self, nodeid: int, written: tuple[int, int] | None) -> None:
        """Ask for [lo, hi) of *nodeid* to be dropped (None: the whole file)."""
        if self.device_fd is None:
            return
        lo, hi = written if written is not None else (0, 0)
        if hi:
            # Not the page the application may still be filling: dropping it would make its
            # next write read that page back from the daemon first.
            hi -= hi % PAGE
            if hi <= lo:
                return
        if nodeid in self._pending:
            old_lo, old_hi = self._pending[nodeid]
            whole = hi == 0 or old_hi == 0
            lo, hi = min(lo, old_lo), 0 if whole else max(hi, old_hi)
        self._pending[nodeid] = (lo, hi)
        self._wakeup.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            batch = [
                (nodeid, lo, hi - lo if hi else 0)
                for nodeid, (lo, hi) in self._pending.items()
                if self.known(nodeid)
            ]
            self._pending.clear()
            if batch:
                await self._pool.run(self._send_all, batch)

    def _send_all(self, batch: list[tuple[int, int, int]]) -> None:
        """One thread trip for every range queued meanwhile (one message each). ENOENT, the
        kernel has forgotten the file and its pages with it, passes quietly."""
        fd = self.device_fd
        if fd is None:
            return
        messages = [inval_inode_message(*drop) for drop in batch]
        self.dropped_ranges += write_notifications(fd, messages)
