"""Calls against the target run as the process that asked for them.

An NFS export with root_squash treats a daemon running as root as ``nobody``: it could not enter
a 0700 directory of the backup user, and what it created would belong to nobody, where the same
backup run directly works. So each call runs with the caller's file-system user and group ids
and supplementary groups, and the target checks permissions and charges quotas to the caller, as
it does without fusethrottle.

Linux keeps these per thread. ``setfsuid`` and ``setfsgid`` change only the calling thread, and
so does the raw ``setgroups`` system call (glibc's wrapper changes every thread of the process,
which would hand one caller's groups to calls running for another). Each worker thread keeps the
credentials it last took and switches only when a call is for someone else, so a backup run by
one user costs one switch per thread, not three system calls per request. A thread inherits the
credentials of the thread that starts it: worker threads are started from the event loop's
thread, which never switches.

Only a daemon running as root can switch (it needs CAP_SETUID and CAP_SETGID); otherwise every
call runs as the daemon, as before. Calls the kernel makes on nobody's behalf (a released file's
background fsync by a file nobody has open, the writeback of the page cache) run as the last
process that opened the file for writing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.setfsuid.argtypes = (ctypes.c_uint,)
_libc.setfsgid.argtypes = (ctypes.c_uint,)
_libc.syscall.restype = ctypes.c_long

#: setgroups(2) by machine: glibc's wrapper would change every thread of the process.
_SYS_SETGROUPS = {"x86_64": 116, "aarch64": 159, "ppc64le": 81, "s390x": 206}
#: Most groups a caller's set may hold here (Linux allows 65536; NFS AUTH_SYS sends 16).
MAX_GROUPS = 65536
#: How long a caller's supplementary groups are taken as known: a process's groups almost never
#: change, and reading /proc for every request would cost a tree copy more than the copy.
GROUPS_TTL = 1.0
_CACHE_MAX = 4096


@dataclass(frozen=True, slots=True)
class Caller:
    """Whom a call to the target runs as."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()


class RequestContext(Protocol):
    uid: int
    gid: int
    pid: int


def parse_groups(status: str) -> tuple[int, ...] | None:
    """The ``Groups:`` line of a /proc/PID/status text; None if it has none."""
    for line in status.splitlines():
        if line.startswith("Groups:"):
            return tuple(sorted({int(g) for g in line.split()[1:]}))
    return None


def groups_of(pid: int) -> tuple[int, ...] | None:
    """The supplementary groups of process *pid*, None if it is gone or unknown (pid 0: the
    kernel itself, e.g. the page cache's writeback)."""
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            return parse_groups(f.read())
    except (OSError, ValueError):
        return None


class Callers:
    """Turns a request's context into the :class:`Caller` its calls run as.

    ``None`` means "as the daemon": always when the daemon cannot switch, and for requests from
    the daemon's own user and group. A caller whose process is gone before its groups are read
    runs with its primary group only: fewer rights than it had, never more.
    """

    def __init__(
        self,
        switching: bool,
        *,
        daemon: tuple[int, int] | None = None,
        read_groups: Callable[[int], tuple[int, ...] | None] = groups_of,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.switching = switching
        self.daemon = daemon if daemon is not None else (os.geteuid(), os.getegid())
        self._read_groups = read_groups
        self._clock = clock
        self._known: dict[tuple[int, int, int], tuple[Caller, float]] = {}

    def of(self, ctx: RequestContext | None) -> Caller | None:
        if not self.switching or ctx is None:
            return None
        uid, gid = ctx.uid, ctx.gid
        if (uid, gid) == self.daemon:
            return None
        key = (ctx.pid, uid, gid)
        now = self._clock()
        known = self._known.get(key)
        if known is not None and known[1] > now:
            return known[0]
        groups = self._read_groups(ctx.pid)
        caller = Caller(uid, gid, groups if groups is not None else (gid,))
        if len(self._known) >= _CACHE_MAX:
            self._known = {k: v for k, v in self._known.items() if v[1] > now}
            if len(self._known) >= _CACHE_MAX:
                self._known.clear()
        self._known[key] = (caller, now + GROUPS_TTL)
        return caller


def can_switch() -> bool:
    """Whether this process may take other users' credentials per thread (it runs as root
    on a machine whose setgroups system call number is known)."""
    return os.geteuid() == 0 and platform.machine() in _SYS_SETGROUPS


class ThreadCredentials:
    """Switches a worker thread to a caller's credentials, and back to the daemon's.

    Raises PermissionError if the kernel refused a switch, so a call never runs with the wrong
    credentials: it fails instead (and the thread is back to the daemon's own).
    """

    def __init__(self) -> None:
        self._sys_setgroups = _SYS_SETGROUPS[platform.machine()]
        self._daemon = Caller(os.geteuid(), os.getegid(), tuple(sorted(set(os.getgroups()))))
        self._local = threading.local()

    def call_as(self, caller: Caller | None, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` in this thread as *caller* (None: as the daemon)."""
        want = caller if caller is not None else self._daemon
        current = getattr(self._local, "current", self._daemon)
        if current is not want and current != want:
            self._become(want)
        return fn(*args)

    def _become(self, who: Caller) -> None:
        try:
            self._set_groups(who.groups)
            _libc.setfsgid(who.gid)
            _libc.setfsuid(who.uid)
            # Both calls return the previous id whether or not they succeeded: ask again.
            if _libc.setfsgid(0xFFFFFFFF) != who.gid or _libc.setfsuid(0xFFFFFFFF) != who.uid:
                raise PermissionError(1, "the kernel refused to switch credentials")
        except OSError:
            self._local.current = None
            if who is not self._daemon:
                self._become(self._daemon)
            raise
        self._local.current = who

    def _set_groups(self, groups: tuple[int, ...]) -> None:
        groups = groups[:MAX_GROUPS]
        array = (ctypes.c_uint * max(len(groups), 1))(*groups)
        if _libc.syscall(self._sys_setgroups, len(groups), array) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
