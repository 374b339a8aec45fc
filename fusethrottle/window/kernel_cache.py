"""The kernel's cache of this mount: its share of the window, and how far it reads ahead.

With the writeback cache on, a ``write()`` lands in the FUSE mount's page cache and returns; the
kernel later writes those pages back to the daemon in large FUSE_WRITE requests (up to 1 MiB
instead of one request per 4 KiB ``write()``). Those pages are un-synced data of this mount
too, so they come out of the same window: the daemon tells the kernel how much it may hold
(``/sys/class/bdi/<mount device>/max_bytes``; FUSE mounts always run with ``strict_limit``, so
the kernel throttles the writer in ``balance_dirty_pages`` once the mount's dirty plus
writeback pages reach it) and admits to the target only the rest of the window.

Chain of back-pressure on a slow target: fsyncs slow down -> the gate delays FUSE_WRITE replies
-> the kernel's pages stay under writeback -> the mount's dirty limit is reached -> the writer
sleeps in ``write()``. The kernel bounds its share only approximately (each task may dirty a
few dozen pages past the limit before it is next checked), which is why the share is kept small.

Reads: the kernel reads ahead 128 KiB by default, so a restore reaches the daemon as 128 KiB
requests, each a trip to a worker thread. A larger read-ahead (``read_ahead``, 4 MiB by
default) lets it ask for 1 MiB at a time and keep several in flight (measured on tmpfs: a
1 GiB sequential read went from 517 MB/s at 128 KiB to 1.7 GB/s at 4 MiB).

:func:`kernel_share` is pure; :class:`KernelCache` is the only code that writes these files.
"""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass

log = logging.getLogger(__name__)

MiB = 1 << 20
#: Below this the kernel writes back in pieces so small that the daemon's cost per byte rises
#: (measured on tmpfs: 4 MiB 173 MB/s, 8 MiB 493, 32 MiB 631, 64 MiB 661 for 1 MiB writes).
MIN_SHARE = 4 * MiB
#: The share's floor where the window has room for it (up to half the window). The kernel paces a
#: writer at its estimate of the mount's write-back speed once the mount's dirty plus writeback
#: pages pass about three quarters of the share, and after a slow spell that estimate lags the
#: target's recovery by seconds (measured: 0.65 MB/s at recovery, 10 MB/s after 7 s). Its own
#: write-back requests to the daemon hold 4-9 MiB, so a share of 4-6 MiB kept the writer paced
#: at the stale speed: the recovered 20 MiB/s target ran 19.18-19.74 MiB/s, and 19.32-19.98
#: with this floor (10 repeats each; docs/DESIGN.md, "Data path").
RECOVERY_SHARE = 12 * MiB
#: A new share is written to sysfs only when it differs from the one in force by this factor,
#: so an adaptive window that moves a little on every fsync does not rewrite it every time.
RESHARE_FACTOR = 1.25


def kernel_share(window: int, limit: int) -> int:
    """Bytes the kernel may hold dirty for this mount: a quarter of the window, at most *limit*.

    A quarter leaves three quarters of the window for data the target has accepted but not yet
    committed, which is what keeps the target busy. Two floors: RECOVERY_SHARE, as far as half
    the window, so a small window after a slow spell does not leave the writer paced at the
    kernel's stale speed estimate; and MIN_SHARE, which keeps writeback requests large. The
    share stays a quarter where the neighbour's memory matters most: a large window at speed
    (a half there doubled the pages charged to the writer's memory cgroup).
    """
    if limit <= 0:
        return 0
    return min(limit, max(window // 4, min(RECOVERY_SHARE, window // 2), MIN_SHARE))


def mount_gone(err: OSError) -> bool:
    """Did writing a bdi file fail because the mount is gone? The directory is gone
    (ENOENT), or it went while the file was open (sysfs answers ENODEV): an unmount that came
    right after the start, before the daemon got to set its limits."""
    return err.errno in (errno.ENOENT, errno.ENODEV)


def bdi_dir(device: str) -> str:
    """The backing-device directory of a mount whose device is ``major:minor``."""
    return f"/sys/class/bdi/{device}"


@dataclass(frozen=True)
class KernelCacheStatistics:
    enabled: bool
    limit_bytes: int  # the share in force (what the kernel was told, or its own default)
    enforced: bool  # False: the kernel's own default is in force (not root, or kernel < 6.2)


class KernelCache:
    """Keeps the mount's kernel dirty limit at :func:`kernel_share` of the window."""

    def __init__(self, *, enabled: bool, limit: int, read_ahead: int = 0) -> None:
        self.enabled = enabled
        self.limit = limit
        self.read_ahead = read_ahead
        self.share = 0
        self.enforced = False
        self._path: str | None = None
        self._warned = False

    def attach(self, device: str | None, window: int) -> None:
        """Called once the mount exists: find its bdi, set the read-ahead and the first share."""
        if device is None:
            return
        if not self.set_read_ahead(device):
            return  # unmounted already
        if not self.enabled:
            return
        path = os.path.join(bdi_dir(device), "max_bytes")
        if self.limit <= 0:  # kernel_cache=0: the user leaves the kernel's own limit in force
            self._read_kernel_limit(path)
            return
        if not os.path.isdir(bdi_dir(device)):
            return  # unmounted already (a very short mount): nothing left to bound
        if not os.path.exists(path):
            self._fallback(path, "the kernel has no per-mount max_bytes (needs Linux 6.2)")
            return
        self._path = path
        self.update(window, force=True)

    def set_read_ahead(self, device: str) -> bool:
        """Set the mount's read-ahead (``read_ahead``). Only once the kernel has its answer to
        FUSE_INIT: that answer lowers the read-ahead to what the kernel offered in its INIT,
        the default, undoing any setting made before it. False: the mount is gone."""
        if self.read_ahead <= 0:
            return True
        try:
            with open(os.path.join(bdi_dir(device), "read_ahead_kb"), "w") as f:
                f.write(str(self.read_ahead // 1024))
        except OSError as err:
            if mount_gone(err):
                return False
            log.info("kernel read-ahead left at its default: %s", err.strerror or err)
        return True

    def update(self, window: int, *, force: bool = False) -> None:
        """The window moved: move the kernel's share with it (rarely: see RESHARE_FACTOR)."""
        if self._path is None:
            return
        share = kernel_share(window, self.limit)
        if not force and self.share and (1 / RESHARE_FACTOR) < share / self.share < RESHARE_FACTOR:
            return
        try:
            with open(self._path, "w") as f:
                f.write(str(share))
        except OSError as err:
            if not mount_gone(err):
                self._fallback(self._path, err.strerror or str(err))
            self._path = None
            return
        self.share = share
        self.enforced = True

    def _read_kernel_limit(self, path: str) -> None:
        self.enforced = False
        try:
            with open(path) as f:
                self.share = int(f.read())
        except (OSError, ValueError):
            self.share = 0

    def _fallback(self, path: str, why: str) -> None:
        """Report the kernel's own limit for this mount when we cannot set ours."""
        self._read_kernel_limit(path)
        if not self._warned:
            self._warned = True
            log.warning(
                "cannot bound the kernel's cache of this mount (%s); its own limit applies "
                "(%s); writeback_cache=no avoids the kernel cache altogether",
                why,
                f"{self.share >> 20} MiB" if self.share else "unknown",
            )

    def ledger_window(self, window: int) -> int:
        """What the gate may admit to the target: the window less the kernel's share."""
        if not self.enabled:
            return window
        return max(window // 2, window - self.share)

    def statistics(self) -> KernelCacheStatistics:
        return KernelCacheStatistics(self.enabled, self.share if self.enabled else 0, self.enforced)
