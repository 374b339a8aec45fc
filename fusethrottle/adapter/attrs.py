"""Attributes: getattr and setattr, and what the daemon keeps so that the kernel's own caches of
them cost no extra round trip to the target.

A part of :class:`~.ops.Operations` (the state it uses is set up there)."""

from __future__ import annotations

import errno
import stat
from typing import Any

import pyfuse3

from .inodes import Inode
from .requests import replies


class AttrOps:
    @replies
    async def getattr(self, inode: int, ctx: Any = None) -> Any:
        """The target's attributes, or the ones we took right after changing a directory
        (dir_attrs.py). Those are real stats: the target client's cached attributes
        (AT_STATX_DONT_SYNC) showed an NFSv4.1 directory with the mtime of its last change, not
        the one rsync then set on it."""
        self._refuse_when_closing()
        gone = self.inodes.get(inode)
        if gone is not None and gone.detached and gone.removed is not None:
            return self._attr(inode, gone.removed)  # unlinked: nobody can see it change
        node = self.inodes[inode]
        fresh = self.dir_attrs.fresh(node)
        if fresh is not None:
            return self._attr(inode, fresh)
        st = await self.backend.stat(self.callers.of(ctx), node.path_fd)
        if (node.detaching or node.detached) and stat.S_IFMT(st.st_mode) != stat.S_IFMT(node.mode):
            raise pyfuse3.FUSEError(errno.ENOENT)  # let go of while this stat ran
        self.dir_attrs.seen(st)
        return self._attr(inode, st)

    @replies
    async def setattr(self, inode: int, attr: Any, fields: Any, fh: Any, ctx: Any) -> Any:
        handle = self.files.get(fh) if fh is not None else None
        gone = self.inodes.get(inode)
        if gone is not None and gone.detached and gone.removed is not None and handle is None:
            return self._attr(inode, gone.removed)  # see the times-only case below
        node = self.inodes[inode]
        self.dir_attrs.forget(node)
        size = attr.st_size if fields.update_size else None
        times_only = not (
            fields.update_size or fields.update_mode or fields.update_uid or fields.update_gid
        )
        if times_only and node.removed is not None and handle is None:
            # The writeback cache keeps times in the kernel and sends them when it evicts the
            # inode, which for a deleted file is right after the unlink (once per file of an
            # rm -rf). Nobody can see a deleted file's times: answer without the target.
            return self._attr(inode, node.removed)
        if times_only and self._kernels_own_times(node, attr, fields, handle is not None):
            return self._attr(inode, await self.backend.stat_cached(None, node.path_fd))
        # A change of its own to the file's size or times: others learning from a stat
        # meanwhile must not (see Inode.last_write_seq).
        since = self.write_seq
        node.writes_in_flight += 1
        try:
            st = await self.backend.setattr(
                self.callers.of(ctx),
                node.path_fd,
                handle.fd if handle is not None else None,
                mode=stat.S_IMODE(attr.st_mode) if fields.update_mode else None,
                uid=attr.st_uid if fields.update_uid else None,
                gid=attr.st_gid if fields.update_gid else None,
                size=size,
                atime_ns=attr.st_atime_ns if fields.update_atime else None,
                mtime_ns=attr.st_mtime_ns if fields.update_mtime else None,
            )
        finally:
            node.writes_in_flight -= 1
            others = node.written_since(since)
            self.write_seq += 1
            node.last_write_seq = self.write_seq
        if size == 0:
            self.budget.discard(inode)
        if size is not None:
            node.shown_size = st.st_size  # a truncate's size is one the kernel takes
        # The mtime this call read is the file's unless another change of ours came meanwhile.
        node.shown_mtime_ns = None if others else st.st_mtime_ns
        if fields.update_mtime:
            node.kernel_mtime_ns = None  # the target has the kernel's mtime now
        return self._attr(inode, st)

    def _kernels_own_times(self, node: Inode, attr: Any, fields: Any, with_handle: bool) -> bool:
        """Whether a times-only setattr is the writeback cache handing back times the target
        keeps itself, so that sending it would be a round trip that changes nothing we promise.

        With the writeback cache the kernel stamps a file's mtime and ctime itself when it
        writes or renames it, and sends them in a SETATTR (mtime and ctime, never atime) on
        close, fsync, rename, link and unlink: on NFS one GETATTR and one SETATTR per file
        written, two more per rename over an existing file. The target stamped its own mtime
        when our writes reached it, as it does for an application writing to NFS directly, and
        it keeps ctime itself. Such a request is recognised as: no atime, and
        - no mtime (ctime alone, which no target lets us set); or
        - a file handle with it: only the kernel's write-back of its cached times carries one
          (an application's utimes or futimens never does, a truncate changes the size too);
          its mtime is then the kernel's own, remembered; or
        - an mtime the target already has (the one the kernel was shown), or the kernel's own
          one remembered above: the kernel sending the time it holds again with a new ctime.
        An application setting any other mtime reaches the target as before.
        """
        if not self.enable_writeback_cache or fields.update_atime or not stat.S_ISREG(node.mode):
            return False
        if not fields.update_mtime:
            return True
        if with_handle:
            node.kernel_mtime_ns = attr.st_mtime_ns
            return True
        return attr.st_mtime_ns in (node.shown_mtime_ns, node.kernel_mtime_ns)
