"""Ask the kernel to forget names when the daemon's descriptors run short.

Every inode the kernel remembers holds one O_PATH descriptor here (inodes.py), and the kernel
remembers every name it has looked up until memory pressure makes it let go, which on a host
with free memory is never. A backup of a tree of a million files therefore needs a million
descriptors, far past a container's usual limit (20,000 on the test machine; 524,288 under
systemd): lookups past the limit would fail with EMFILE, and the backup with them.

So the daemon bounds its table itself. Past ``high`` inodes it tells the kernel to drop the
oldest names it learned (a ``FUSE_NOTIFY_INVAL_ENTRY`` notification per name, written to the
FUSE device), and the kernel answers with FORGET for each inode nothing else holds, which
closes its descriptor, until the table is back at ``low``. A tree walk registers a directory
before its files, so the oldest names are mostly directories, and dropping one drops the
cached names under it too. Names of files that are open, hold un-synced data or are being
synced are left alone; the kernel looks any dropped name up again when it is next used.

Like kernel_pages.py, the messages go from a worker thread of their own: the kernel handles one
inside the ``write()`` to the device and may wait there for a request in the same directory,
which the event loop must be free to answer.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import trio

from ..target.workers import WorkerPool
from .fuse_notify import inval_entry_message, write_notifications
from .inodes import ROOT, Inode, InodeTable

log = logging.getLogger(__name__)

#: How often the table's size is looked at.
CHECK_INTERVAL = 0.25
#: A name asked about is not asked about again for this long (its FORGET may be on its way).
ASK_AGAIN_AFTER = 5.0
#: What the kernel answers a name it no longer holds (or cannot drop now) with: not worth a log.
_NAME_GONE = (errno.ENOENT, errno.ENOTDIR, errno.EBUSY)


@dataclass(frozen=True)
class Bounds:
    """Past ``high`` inodes, names are dropped until ``low`` remain."""

    high: int
    low: int


def bounds_for(fd_limit: int) -> Bounds:
    """Three quarters of the descriptor limit for inodes, the rest for open files, the
    target's directories being listed, sockets and the daemon itself."""
    high = max(64, fd_limit * 3 // 4)
    return Bounds(high, max(32, high * 4 // 5))


def pick(
    inodes: Iterable[Inode], count: int, busy: Callable[[Inode], bool], now: float
) -> list[Inode]:
    """Up to *count* inodes, oldest first, whose names the kernel may drop now (pure)."""
    chosen: list[Inode] = []
    if count <= 0:
        return chosen
    for inode in inodes:
        if (
            inode.nodeid == ROOT
            or inode.entry_parent == 0
            or inode.lookups <= 0
            or inode.removed is not None
            or inode.asked_until > now
            or busy(inode)
        ):
            continue
        chosen.append(inode)
        if len(chosen) >= count:
            break
    return chosen


class KernelEntries:
    """Keeps the inode table, and with it the daemon's descriptors, within :class:`Bounds`."""

    def __init__(self, inodes: InodeTable, bounds: Bounds, busy: Callable[[Inode], bool]) -> None:
        self.inodes = inodes
        self.bounds = bounds
        self.busy = busy
        self.device_fd: int | None = None
        self._pool = WorkerPool("kernel-entries", 1)
        self.asked_total = 0

    def attach(self, device_fd: int | None) -> None:
        """Start (after the mount exists); without the device nothing is ever sent."""
        self.device_fd = device_fd

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Relieve the table whenever it grows past ``high`` (the table wakes this at once; the
        periodic check catches what a wake-up missed)."""
        task_status.started()
        while True:
            with trio.move_on_after(CHECK_INTERVAL):
                await self.inodes.wait_full()
            if self.device_fd is None or len(self.inodes) <= self.bounds.high:
                continue
            now = trio.current_time()
            excess = len(self.inodes) - self.bounds.low
            chosen = pick(self.inodes.values(), excess, self.busy, now)
            if not chosen:
                continue
            messages = []
            for inode in chosen:
                inode.asked_until = now + ASK_AGAIN_AFTER
                messages.append(inval_entry_message(inode.entry_parent, inode.entry_name))
            self.asked_total += len(messages)
            log.debug(
                "%d inodes known: asking the kernel to drop %d names",
                len(self.inodes),
                len(messages),
            )
            await self._pool.run(self._send_all, messages)

    def _send_all(self, messages: list[bytes]) -> None:
        fd = self.device_fd
        if fd is None:
            return
        write_notifications(fd, messages, expected=_NAME_GONE)
