"""The only code that touches the backing directory (the NFS/EFS target).

Every syscall runs in a worker thread of a bounded pool of our own (workers.py), so a hung NFS
server blocks worker threads, never the event loop: metadata, metrics and unmount keep answering.
Three pools keep classes of work from starving each other:

* ``meta``  lookups, attributes, directory changes, xattrs
* ``data``  read/write/flush/release of open files
* ``sync``  fsync/fdatasync (injected by the flusher or asked for by the application)

All paths are relative to directory file descriptors (``*at()`` calls), so a deep tree that is
legal on the target never overflows PATH_MAX by having the backing root prefixed to it. Inodes
are held as O_PATH descriptors (see inodes.py); operations that need a real open file reopen the
O_PATH descriptor through ``/proc/self/fd``.

Each completed operation is reported to an optional observer ``(op, nbytes)`` so the meter can
account for it the way EFS bills it.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import Any, TypeVar

import trio

from .. import _libc
from .closes import DeferredCloses
from .credentials import Caller, ThreadCredentials
from .removals import LetGo, _rename, _rmdir, _unlink
from .syncs import SyncPlan, _fsync_dir, _fsync_path
from .target_calls import (
    CAPABILITY,
    Created,
    _aligned_pread,
    _aligned_pwrite,
    _create_file,
    _dir_stats,
    _drop_capability,
    _flush,
    _list_entries,
    _listxattr,
    _look_again,
    _lookup,
    _make,
    _open_direct,
    _open_file,
    _pwrite_uncached,
    _readlink,
    _setattr,
    close_all,
    close_created,
    proc_path,
)
from .workers import WorkerPool

T = TypeVar("T")


def _close_if_open(fd: int) -> None:
    if fd >= 0:
        os.close(fd)


O_PATH = os.O_PATH

Observer = Callable[[str, int], None]


class Backend(DeferredCloses):
    """Async facade over the target; every method runs its syscalls in a worker thread."""

    def __init__(
        self,
        threads: int = 32,
        sync_threads: int = 8,
        observer: Observer | None = None,
        credentials: ThreadCredentials | None = None,
        kernel_checked: bool = True,
        on_dir_changed: Callable[[os.stat_result], None] | None = None,
    ) -> None:
        self.meta = WorkerPool("meta", threads)
        self.data = WorkerPool("data", threads)
        self.sync = WorkerPool("sync", sync_threads)
        self.observer = observer
        #: Set when calls run as their callers (credentials.py); None: all as the daemon.
        self.credentials = credentials
        #: The kernel checked each caller's rights before the request (default_permissions);
        #: False with permissions=target, where nothing may be retried with the daemon's.
        self.kernel_checked = kernel_checked
        #: (node id, fd) of released files, closed in batches (see close_soon).
        self._to_close: list[tuple[int, int]] = []
        self._close_wakeup = trio.Event()
        self._closes_done = trio.Event()  # set while nothing is queued or being closed
        self._closes_done.set()
        #: Told the fresh attributes of every directory a call changed.
        self.on_dir_changed = on_dir_changed

    async def _run(
        self,
        pool: WorkerPool,
        caller: Caller | None,
        fn: Callable[..., T],
        *args: Any,
        discard: Callable[[T], None] | None = None,
    ) -> T:
        """Run ``fn(*args)`` in one of *pool*'s threads, as *caller* (None: as the daemon).
        *discard*: gives back what the call made if its caller stopped waiting (killable.py)."""
        if self.credentials is None:
            return await pool.run(fn, *args, discard=discard)
        return await pool.run(self.credentials.call_as, caller, fn, *args, discard=discard)

    def _call_as(self, caller: Caller | None, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` as *caller*, in the worker thread this runs in."""
        if self.credentials is None:
            return fn(*args)
        return self.credentials.call_as(caller, fn, *args)

    async def _change(
        self,
        caller: Caller | None,
        dir_fds: tuple[int, ...],
        fn: Callable[..., T],
        *args: Any,
        discard: Callable[[T], None] | None = None,
    ) -> T:
        """Run a call that changes directories, and stat them in the same trip to the thread.

        The kernel forgets a directory's attributes whenever an entry in it changes, and asks
        for them on the next permission check: once per created or removed file. The stats
        taken here answer that question without a second trip (see ``Operations.getattr``).
        """

        def run() -> tuple[T, list[os.stat_result]]:
            result = fn(*args)
            return result, _dir_stats(dir_fds)

        def give_back(done: tuple[T, list[os.stat_result]]) -> None:
            if discard is not None:
                discard(done[0])

        result, stats = await self._run(self.meta, caller, run, discard=give_back)
        if self.on_dir_changed is not None:
            for st in stats:
                self.on_dir_changed(st)
        return result

    def _seen(self, op: str, nbytes: int = 0) -> None:
        if self.observer is not None:
            self.observer(op, nbytes)

    # --- namespace -------------------------------------------------------------------------

    async def lookup(
        self, caller: Caller | None, dir_fd: int, name: bytes, stale_mode: int | None = None
    ) -> Created:
        """Look *name* up; *stale_mode*: the type of the object it named last, which the
        target called stale (target_calls._look_again)."""
        if stale_mode is None:
            result = await self._run(
                self.meta, caller, _lookup, dir_fd, name, discard=close_created
            )
        else:
            result = await self._run(
                self.meta, caller, _look_again, dir_fd, name, stale_mode, discard=close_created
            )
        self._seen("lookup")
        return result

    async def stat(self, caller: Caller | None, path_fd: int) -> os.stat_result:
        result = await self._run(self.meta, caller, os.fstat, path_fd)
        self._seen("getattr")
        return result

    async def stat_cached(self, caller: Caller | None, path_fd: int) -> os.stat_result:
        """The attributes the target's client holds, without asking the server (and without
        a meter charge: nothing reaches the target)."""
        return await self._run(self.meta, caller, _libc.stat_cached, path_fd)

    async def setattr(
        self,
        caller: Caller | None,
        path_fd: int,
        fd: int | None,
        *,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        size: int | None = None,
        atime_ns: int | None = None,
        mtime_ns: int | None = None,
    ) -> os.stat_result:
        args = (path_fd, fd, mode, uid, gid, size, atime_ns, mtime_ns)
        try:
            result = await self._run(self.meta, caller, _setattr, *args)
        except PermissionError as err:
            # A setattr reaches us only past the kernel's own checks (default_permissions), or
            # from the kernel itself: the set-ID bits it takes away on a non-owner's write, the
            # times the write-back cache keeps. Those need no rights of the caller's on a local
            # file system; the target refusing the caller must not fail them.
            if caller is None or err.errno != errno.EPERM or not self.kernel_checked:
                raise
            result = await self._run(self.meta, None, _setattr, *args)
        self._seen("setattr")
        return result

    async def readlink(self, caller: Caller | None, path_fd: int) -> bytes:
        result = await self._run(self.meta, caller, _readlink, path_fd)
        self._seen("readlink")
        return result

    async def make(
        self,
        caller: Caller | None,
        kind: str,
        dir_fd: int,
        name: bytes,
        mode: int,
        arg: Any = None,
        owner: tuple[int, int] | None = None,
    ) -> Created:
        result = await self._change(
            caller, (dir_fd,), _make, kind, dir_fd, name, mode, arg, owner, discard=close_created
        )
        self._seen(kind)
        return result

    async def unlink(
        self, caller: Caller | None, dir_fd: int, name: bytes, let_go: LetGo | None = None
    ) -> os.stat_result:
        """Remove *name*; returns what it was, so the caller knows if the last link went.
        *let_go*: what the daemon holds of the file, let go of first if this is its last link
        (``let_go.done`` says whether it was)."""
        result = await self._change(caller, (dir_fd,), _unlink, dir_fd, name, let_go)
        self._seen("unlink")
        return result

    async def rmdir(self, caller: Caller | None, dir_fd: int, name: bytes) -> None:
        await self._change(caller, (dir_fd,), _rmdir, dir_fd, name)
        self._seen("rmdir")

    async def rename(
        self,
        caller: Caller | None,
        old_dir: int,
        old: bytes,
        new_dir: int,
        new: bytes,
        flags: int,
        let_go: LetGo | None = None,
    ) -> None:
        """rename(2); *let_go*: what the daemon holds of the file the rename would replace."""
        dirs = (old_dir, new_dir)
        await self._change(caller, dirs, _rename, old_dir, old, new_dir, new, flags, let_go)
        self._seen("rename")

    async def link(self, caller: Caller | None, path_fd: int, new_dir: int, new: bytes) -> Created:
        def run() -> Created:
            os.link(proc_path(path_fd), new, dst_dir_fd=new_dir, follow_symlinks=True)
            return _lookup(new_dir, new)

        result = await self._change(caller, (new_dir,), run, discard=close_created)
        self._seen("link")
        return result

    async def access(self, caller: Caller | None, path_fd: int, mode: int) -> bool:
        """Whether the caller may (access(2) checked by the target, with the caller's file
        system ids: effective_ids makes it faccessat(AT_EACCESS), which uses them)."""

        def may() -> bool:
            return os.access(proc_path(path_fd), mode, effective_ids=True)

        result = await self._run(self.meta, caller, may)
        self._seen("getattr")
        return result

    async def statfs(self, caller: Caller | None, path_fd: int) -> os.statvfs_result:
        result = await self._run(self.meta, caller, os.statvfs, path_fd)
        self._seen("statfs")
        return result

    # --- xattrs ----------------------------------------------------------------------------
    async def getxattr(self, caller: Caller | None, path_fd: int, name: bytes) -> bytes:
        result = await self._run(self.meta, caller, os.getxattr, proc_path(path_fd), name)
        self._seen("getxattr")
        return result

    async def getxattr_listed(
        self, caller: Caller | None, path_fd: int, name: bytes
    ) -> tuple[bytes | None, list[bytes]]:
        """The file's xattr names, and *name*'s value if it is one of them (one thread trip)."""

        def run() -> tuple[bytes | None, list[bytes]]:
            names = _listxattr(path_fd)
            if name not in names:
                return None, names
            return os.getxattr(proc_path(path_fd), name), names

        result = await self._run(self.meta, caller, run)
        self._seen("getxattr")
        return result

    async def setxattr(
        self, caller: Caller | None, path_fd: int, name: bytes, value: bytes
    ) -> None:
        await self._run(self.meta, caller, os.setxattr, proc_path(path_fd), name, value)
        self._seen("setxattr")

    async def listxattr(self, caller: Caller | None, path_fd: int) -> list[bytes]:
        result = await self._run(self.meta, caller, _listxattr, path_fd)
        self._seen("listxattr")
        return result

    async def removexattr(self, caller: Caller | None, path_fd: int, name: bytes) -> None:
        if name == CAPABILITY:
            # Only the kernel's own removal on a write reaches us: the kernel refuses anyone
            # without CAP_SETFCAP who asks for it. It needs no rights of the writer's.
            caller = None
        await self._run(self.meta, caller, os.removexattr, proc_path(path_fd), name)
        self._seen("removexattr")

    # --- files -----------------------------------------------------------------------------
    async def open(
        self,
        caller: Caller | None,
        path_fd: int,
        flags: int,
        check_capability: bool = False,
        write_only: int | None = None,
    ) -> tuple[int, bool, bool, os.stat_result]:
        """Open the file: (fd, whether it has a file capability (asked only with
        *check_capability*), whether it was opened with the fallback *write_only* flags, its
        attributes as the open found them)."""
        result = await self._run(
            self.data,
            caller,
            _open_file,
            path_fd,
            flags,
            write_only,
            check_capability,
            discard=lambda opened: os.close(opened[0]),
        )
        self._seen("open")
        return result

    async def create(
        self,
        caller: Caller | None,
        dir_fd: int,
        name: bytes,
        flags: int,
        mode: int,
        owner: tuple[int, int] | None,
    ) -> tuple[int, Created]:
        def give_back(made: tuple[int, Created]) -> None:
            os.close(made[0])
            close_created(made[1])

        result = await self._change(
            caller, (dir_fd,), _create_file, dir_fd, name, flags, mode, owner, discard=give_back
        )
        self._seen("create")
        return result

    async def pread(
        self, caller: Caller | None, fd: int, size: int, offset: int, direct: bool = False
    ) -> bytes:
        fn = _aligned_pread if direct else os.pread
        result = await self._run(self.data, caller, fn, fd, size, offset)
        self._seen("read", len(result))
        return result

    async def pwrite(
        self,
        caller: Caller | None,
        fd: int,
        data: bytes,
        offset: int,
        direct: bool = False,
        drop_capability: bool = False,
        uncached: int | None = None,
    ) -> int:
        """pwrite(2) on the target; *direct*: *fd* was opened with O_DIRECT (the application
        asked for it); *uncached*: leave nothing in the target's page cache, writing whole
        pages through this O_DIRECT descriptor (-1: the target has none), see
        target_calls._pwrite_uncached."""
        if uncached is not None and not direct:
            direct_fd = uncached

            def fn(fd: int, data: bytes, offset: int) -> int:
                return _pwrite_uncached(fd, direct_fd, data, offset)
        else:
            fn = _aligned_pwrite if direct else os.pwrite
        if drop_capability:
            plain = fn
            credentials = self.credentials

            def fn(fd: int, data: bytes, offset: int) -> int:
                # What the kernel does on anyone's write: as the daemon (see removexattr);
                # the write itself as the caller.
                if credentials is None:
                    _drop_capability(fd)
                    return plain(fd, data, offset)
                credentials.call_as(None, _drop_capability, fd)
                return credentials.call_as(caller, plain, fd, data, offset)

        result = await self._run(self.data, caller, fn, fd, data, offset)
        self._seen("write", result)
        return result

    async def open_direct(self, caller: Caller | None, fd: int) -> int:
        """A descriptor of the file open as *fd*, with O_DIRECT, for writes that leave nothing
        in the target's page cache (-1: the target has no direct I/O)."""
        return await self._run(self.data, caller, _open_direct, fd, discard=_close_if_open)

    async def flush(
        self, caller: Caller | None, fd: int, want_stat: bool = False
    ) -> os.stat_result | None:
        """What close(2) does on the target; with *want_stat*, the file's attributes after."""
        return await self._run(self.data, caller, _flush, fd, want_stat)

    async def fsync(self, caller: Caller | None, fd: int, datasync: bool = False) -> None:
        await self._run(self.sync, caller, os.fdatasync if datasync else os.fsync, fd)
        self._seen("fsync")

    async def fsync_path(
        self,
        caller: Caller | None,
        path_fd: int,
        datasync: bool = False,
        plan: SyncPlan | None = None,
        fd: int | None = None,
    ) -> None:
        """fsync a file through its path descriptor (it may be released already), or through
        *fd*, a released handle's descriptor, which this call closes."""

        def run() -> None:
            try:
                self._call_as(caller, _fsync_path, path_fd, datasync, plan, fd)
            finally:
                if fd is not None:
                    close_all([fd])

        await self.sync.run(run)
        self._seen("fsync")

    async def fsync_paths(
        self,
        files: list[tuple[Caller | None, int, int | None]],
        datasync: bool = False,
        plan: SyncPlan | None = None,
    ) -> list[int | None]:
        """fsync several files (each as its caller, by path descriptor or by a released
        handle's descriptor, which is closed) in one thread call; the errno of each (None:
        synced)."""

        def run() -> list[int | None]:
            errors: list[int | None] = []
            for caller, path_fd, fd in files:
                try:
                    self._call_as(caller, _fsync_path, path_fd, datasync, plan, fd)
                    errors.append(None)
                except OSError as err:
                    errors.append(err.errno or errno.EIO)
                finally:
                    if fd is not None:
                        close_all([fd])
            return errors

        result = await self.sync.run(run)
        for _ in files:
            self._seen("fsync")
        return result

    # --- directories -----------------------------------------------------------------------
    async def opendir(self, caller: Caller | None, path_fd: int) -> int:
        return await self._run(
            self.meta,
            caller,
            os.open,
            proc_path(path_fd),
            os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC,
            discard=os.close,
        )

    async def list_entries(
        self, caller: Caller | None, dir_fd: int, names: list[bytes] | None, start: int, count: int
    ) -> tuple[list[bytes], list[tuple[int, bytes, Created]]]:
        def give_back(listed: tuple[list[bytes], list[tuple[int, bytes, Created]]]) -> None:
            for _, _, created in listed[1]:
                close_created(created)

        result = await self._run(
            self.meta, caller, _list_entries, dir_fd, names, start, count, discard=give_back
        )
        self._seen("readdir")
        return result

    async def fsyncdir(self, caller: Caller | None, path_fd: int, datasync: bool) -> None:
        await self._run(self.sync, caller, _fsync_dir, path_fd, datasync)
        self._seen("fsync")

    async def close_dir(self, fd: int) -> None:
        await self.meta.run(os.close, fd)
