"""Requests on open files: open and create, read, write (through the write budget), flush, release
and fsync.

A part of :class:`~.ops.Operations` (the state it uses is set up there)."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from typing import Any

import pyfuse3
import trio

from ..metering.meter import OpClass
from ..target.credentials import Caller
from ..target.target_calls import DIRECT_ALIGN
from .inodes import Inode
from .requests import CAPABILITY_TTL, LET_GO_WAIT, FileHandle, let_go_races, replies

log = logging.getLogger(__name__)


class FileOps:
    def _raise_pending(self, nodeid: int) -> None:
        error = self.budget.take_error(nodeid)
        if error is not None:
            raise pyfuse3.FUSEError(error)

    async def _report_pending(self, handle: FileHandle) -> None:
        """Hand a failed injected fsync's errno to the application through *handle*, once.

        The target keeps its own record of that failure for this descriptor (errseq: it was
        open before the failed sync), so the application's next fsync would hear of it a
        second time. An fdatasync here consumes that record; whatever it reports is the same
        failure, or one after it that this report covers as the kernel's errseq would.
        """
        error = self.budget.take_error(handle.inode.nodeid)
        if error is None:
            return
        with contextlib.suppress(OSError):
            await self.backend.fsync(handle.caller, handle.fd, True)
        raise pyfuse3.FUSEError(error)

    def _open_flags(self, flags: int) -> int:
        if self.enable_writeback_cache:
            # The kernel then reads pages to fill partial writes and positions appends itself.
            if flags & os.O_ACCMODE == os.O_WRONLY:
                flags = (flags & ~os.O_ACCMODE) | os.O_RDWR
            flags &= ~os.O_APPEND
        return flags

    def _file_info(
        self,
        fd: int,
        inode: Inode,
        flags: int,
        caller: Caller | None,
        ctx: Any,
        *,
        direct_io: bool = False,
    ) -> pyfuse3.FileInfo:
        fh = self._new_fh()
        pid = getattr(ctx, "pid", 0)
        direct = bool(flags & os.O_DIRECT)
        # Through the kernel's cache unless the handle bypasses it (O_DIRECT, direct_io).
        write_back = self.enable_writeback_cache and not direct and not direct_io
        self.files[fh] = FileHandle(fd, inode, flags, direct, caller, pid, write_back)
        inode.open_handles += 1
        if flags & os.O_ACCMODE != os.O_RDONLY:
            inode.writer = caller  # background fsyncs run as the last one to open it for writing
        return pyfuse3.FileInfo(fh=fh)

    @replies
    async def open(self, inode: int, flags: int, ctx: Any = None) -> Any:
        self._refuse_when_closing()
        node = self.inodes[inode]
        wanted = flags
        flags = self._open_flags(flags)
        check = self._drop_capabilities and flags & os.O_ACCMODE != os.O_RDONLY
        caller = self.callers.of(ctx)
        # The writeback cache opens write-only files for reading too; a caller who may write a
        # file but not read it gets its own write-only open, with the page cache bypassed for
        # this handle (the kernel would read pages through it to fill partial writes).
        write_only = None
        if wanted & os.O_ACCMODE == os.O_WRONLY and flags & os.O_ACCMODE == os.O_RDWR:
            write_only = (flags & ~os.O_ACCMODE) | os.O_WRONLY
        since = self.write_seq
        if node.detaching or node.detached:
            # Its last name is being removed (or is gone): the open lost the race, as it would
            # on the target had the unlink come first.
            raise pyfuse3.FUSEError(errno.ENOENT)
        node.opening += 1  # a removal meanwhile must not let go of the file (see _let_go)
        try:
            with let_go_races(node):
                fd, has_capability, fell_back, st = await self.backend.open(
                    caller, node.path_fd, flags, check, write_only
                )
        finally:
            node.opening -= 1
        # (O_TRUNC changed it itself: the kernel knows, and takes the new size at this open.)
        changed = (
            stat.S_ISREG(st.st_mode)
            and not flags & os.O_TRUNC
            and not node.written_since(since)
            and node.changed_behind_our_back(st)
        )
        if changed and self.enable_writeback_cache and node.open_handles == 0:
            # Close-to-open, as NFS itself: the file changed on the target since the kernel
            # was shown it (another client), and with the writeback cache the kernel keeps its
            # own size of a cached file. ESTALE makes it look the name up again (the open is
            # retried), and that lookup hands it a new generation with the new size
            # (_renew_if_changed).
            self.backend.close_soon(fd, node.nodeid)
            raise pyfuse3.FUSEError(errno.ESTALE)
        if has_capability:
            node.capability_to_drop = True
        if flags & os.O_TRUNC:
            self.budget.discard(inode)
            node.shown_size = 0
            node.shown_mtime_ns = None
        if fell_back:
            info = self._file_info(fd, node, os.O_WRONLY, caller, ctx, direct_io=True)
            info.direct_io = True
            return info
        info = self._file_info(fd, node, flags, caller, ctx)
        info.keep_cache = not changed  # pages cached of what it was are not what it is
        return info

    @replies
    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: Any) -> Any:
        self._refuse_when_closing()
        parent = self.inodes[parent_inode]
        flags = self._open_flags(flags)
        caller = self.callers.of(ctx)
        since = self.write_seq
        fd, created = await self.backend.create(
            caller, parent.path_fd, name, flags, mode, self._owner(ctx)
        )
        attr = self._entry(created, parent_inode, name, since=since)
        node = self.inodes[attr.st_ino]
        # A file this call created carries no capability: no need to ask the target on write.
        node.no_capability_until = trio.current_time() + CAPABILITY_TTL
        return self._file_info(fd, node, flags, caller, ctx), attr

    @replies
    async def read(self, fh: int, off: int, size: int) -> bytes:
        handle = self._handle(fh)
        if self.ceilings is not None:
            await self.ceilings.wait(OpClass.DATA_READ, size)
        data = await self.backend.pread(handle.caller, handle.fd, size, off, handle.direct)
        self.events.bytes_read(len(data))
        return data

    @replies
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        handle = self._handle(fh)
        node = handle.inode
        if not self.enable_writeback_cache:
            # With the cache, this request is the kernel writing back pages the application
            # wrote earlier: failing it would drop that data, not tell the application. The
            # error goes to its next fsync or close instead (flush, fsync).
            await self._report_pending(handle)
        if self.ceilings is not None:
            await self.ceilings.wait(OpClass.DATA_WRITE, len(buf))
        drop = node.capability_to_drop
        failed: list[OSError] = []

        async def send() -> int:
            """Runs in the budget's carrier: also after the request stopped waiting for it."""
            uncached = await self._uncached_fd(handle, off, len(buf))
            written = await self.backend.pwrite(
                handle.caller, handle.fd, buf, off, handle.direct, drop, uncached
            )
            if self.enable_writeback_cache and written < len(buf):
                # The kernel takes the count of a write-back reply for all of it: short would
                # be a silently short file. Write the rest, or fail the whole request.
                written = await self._write_rest(handle, buf, off, written, failed, uncached)
            node.note_written(off, written)
            if node.shown_size is not None:
                node.shown_size = max(node.shown_size, off + written)  # the kernel's grew too
            node.shown_mtime_ns = None
            if drop:
                node.capability_to_drop = False
            self.events.bytes_written(written)
            if failed:
                self.budget.lost(node.nodeid, failed[0].errno or errno.EIO)
            return written  # what landed is accounted for (it needs its fsync) ...

        def ended() -> None:
            node.writes_in_flight -= 1
            self.write_seq += 1
            node.last_write_seq = self.write_seq

        # With the writeback cache the kernel sends up to a dozen writes of one file at once.
        # The target serialises them on the file's lock anyway; in parallel they only spin on
        # it (measured on tmpfs: 1 MiB writes at 326 MB/s with half the daemon's CPU spinning,
        # against over 1 GB/s one at a time). So they go one at a time (*order*), but only
        # once admitted: the order is taken after the gate, so a write waits at most one
        # admission_timeout and then only for the pwrites ahead of it, and every write that
        # waits for room counts at the gate as waiting.
        if node.write_lock is None:
            node.write_lock = trio.Lock()
        node.writes_in_flight += 1
        written = await self.budget.write(
            node.nodeid, len(buf), send, order=node.write_lock, ended=ended
        )
        if failed:
            raise failed[0]  # ... and the request fails all the same
        return written

    async def _uncached_fd(self, handle: FileHandle, off: int, size: int) -> int | None:
        """With target_io=direct, the descriptor whole pages of this write go through (see
        backend.pwrite's *uncached*); None: write through the target's page cache. Opened at
        the file's first whole-page write: a small file never needs one (on NFS an open is a
        round trip)."""
        if not self.target_direct or handle.direct:
            return None
        if handle.direct_fd is None and off % DIRECT_ALIGN == 0 and size >= DIRECT_ALIGN:
            handle.direct_fd = await self.backend.open_direct(handle.caller, handle.fd)
            if handle.direct_fd == -errno.EINVAL and not self._told_no_direct_io:
                self._told_no_direct_io = True
                log.info(
                    "target_io=direct: the target has no direct I/O (%s); its pages are "
                    "written back and dropped after each write instead",
                    self.inodes.path(handle.inode.nodeid),
                )
        return handle.direct_fd if handle.direct_fd is not None else -1

    async def _write_rest(
        self,
        handle: FileHandle,
        buf: bytes,
        off: int,
        written: int,
        failed: list[OSError],
        uncached: int | None,
    ) -> int:
        """Continue a short write-back write; an error ends it in *failed* (what it wrote
        still counts)."""
        while written < len(buf):
            try:
                n = await self.backend.pwrite(
                    handle.caller,
                    handle.fd,
                    buf[written:],
                    off + written,
                    handle.direct,
                    False,
                    uncached,
                )
            except OSError as err:
                failed.append(err)
                break
            if n <= 0:
                failed.append(OSError(errno.EIO, "the target accepted no more of a write"))
                break
            written += n
        return written

    @replies
    async def flush(self, fh: int) -> None:
        handle = self._handle(fh)
        node = handle.inode
        await self._report_pending(handle)
        # Written through the mount since the kernel was shown its mtime: learn the one our
        # writes left (every cached page reached us before this flush), so that a later change
        # by another writer that keeps the size is still told apart (see _renew_if_changed).
        # From the target client's cache: asking the server would be a GETATTR per file
        # written (NFSv4.1 marks the mtime stale after a write under a delegation). A stale one
        # only makes the first lookup or open after it renew the file in the kernel (an open
        # answers ESTALE once and is retried; the kernel's pages of it are dropped), it does
        # not hide another writer's change.
        learn = self.enable_writeback_cache and node.shown_mtime_ns is None
        since = self.write_seq
        st = await self.backend.flush(handle.caller, handle.fd, learn)
        if st is not None and node.shown_mtime_ns is None and not node.written_since(since):
            node.shown_mtime_ns = st.st_mtime_ns

    @replies
    async def release(self, fh: int) -> None:
        handle = self.files.pop(fh, None)
        if handle is None:
            return
        node = handle.inode
        node.open_handles -= 1
        for fd in handle.extra_fds():  # nothing of the target's cache in them to sync
            self.backend.close_soon(fd, node.nodeid)
        if node.removed is not None and node.open_handles == 0 and not node.detached:
            # Unlinked while open: its data needs no sync, and on NFS the file lives on as a
            # .nfsXXXXXXXX while anything holds it. Let go of it now, as NFS does at the last
            # close (the kernel may keep the node until it forgets it).
            self.budget.discard(node.nodeid)
            if await self.flusher.let_go(node.nodeid, LET_GO_WAIT):
                node.detached = True
                self.inodes.retire(node)
                closes = [handle.fd, *self.backend.take_closes(node.nodeid)]
                await self.backend.let_go(node.path_fd, closes)
                return
        if (
            self.budget.released(node.nodeid)
            and self.flusher.inject
            and self.flusher.start(node.nodeid, "release", handle.fd)
        ):
            return  # the release sync goes through the handle's descriptor, then closes it
        self.backend.close_soon(handle.fd, node.nodeid)

    @replies
    async def fsync(self, fh: int, datasync: bool) -> None:
        handle = self._handle(fh)
        nodeid = handle.inode.nodeid
        ticket = self.budget.begin_sync(nodeid)
        start = trio.current_time()
        try:
            await self.backend.fsync(handle.caller, handle.fd, bool(datasync))
        except OSError as err:
            self.budget.end_sync(ticket, err.errno, trio.current_time(), reported=True)
            # The target reported it on this descriptor: a kept error of an injected sync is
            # the same failure (or an earlier one), and the application hears of it only once.
            self.budget.take_error(nodeid)
            self.events.fsync("application", trio.current_time() - start, ticket.nbytes, err.errno)
            raise
        except trio.Cancelled:
            # The caller is being killed: its data is as un-synced as before, and the flusher's
            # to sync (the abandoned fsync may still finish; then that one is merely early).
            self.budget.abandon_sync(ticket)
            raise
        self.budget.end_sync(ticket, None, trio.current_time())
        self.events.fsync("application", trio.current_time() - start, ticket.nbytes, None)
        self._raise_pending(nodeid)

    def open_handles(self) -> int:
        return len(self.files) + len(self.dirs)
