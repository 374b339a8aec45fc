"""Directory attributes taken in the same trip as our own change to the directory.

Every create or unlink in a directory makes the kernel forget the directory's attributes and ask
again at the next permission check: a second round trip per file in a tree copy or an rm -rf. A
fresh stat of a directory (a lookup or a getattr that asked the target) opens a window of
``attr_timeout``, the freshness the user chose for everything else the kernel caches; within it
the stat each of our changes took answers. The backend tells this object of those stats; the
handlers ask it first.
"""

from __future__ import annotations

import os
import stat
import time

import trio

from .inodes import Inode

#: Windows kept at most (expired ones are dropped when it fills).
MAX_WINDOWS = 4096


class DirAttrs:
    """(st_dev, st_ino) -> (attributes, fresh until (trio clock), taken at (monotonic))."""

    def __init__(self, attr_timeout: float) -> None:
        self.attr_timeout = attr_timeout
        self._windows: dict[tuple[int, int], tuple[os.stat_result, float, float]] = {}

    def seen(self, st: os.stat_result) -> None:
        """Attributes fresh from the target: a directory's open a window."""
        if self.attr_timeout <= 0 or not stat.S_ISDIR(st.st_mode):
            return
        now = trio.current_time()
        if len(self._windows) >= MAX_WINDOWS:
            self._windows = {k: v for k, v in self._windows.items() if v[1] > now}
        self._windows[(st.st_dev, st.st_ino)] = (st, now + self.attr_timeout, time.monotonic())

    def changed(self, st: os.stat_result) -> None:
        """A directory we just changed, stat'ed in the same trip: it answers within its window."""
        key = (st.st_dev, st.st_ino)
        window = self._windows.get(key)
        if window is not None and window[1] > trio.current_time():
            self._windows[key] = (st, window[1], time.monotonic())

    def fresh(self, node: Inode) -> os.stat_result | None:
        """The attributes that answer for *node* now, if any."""
        window = self._windows.get(node.key)
        if (
            window is not None
            and window[1] > trio.current_time()
            # Not of an earlier object with the same inode number (a directory removed, its
            # number given to a new file or directory within attr_timeout).
            and window[2] >= node.born
            and stat.S_IFMT(window[0].st_mode) == stat.S_IFMT(node.mode)
        ):
            return window[0]
        return None

    def forget(self, node: Inode) -> None:
        """Something the stats do not see changed it (its times, mode or xattrs)."""
        self._windows.pop(node.key, None)
