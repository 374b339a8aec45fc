"""Directory handles and listings, and extended attributes.

A part of :class:`~.ops.Operations` (the state it uses is set up there)."""

from __future__ import annotations

import errno
import os
from typing import Any

import pyfuse3
import trio

from .inodes import Inode
from .requests import CAPABILITY, CAPABILITY_TTL, DirHandle, replies

# Names in these namespaces are always listed by listxattr when present (unlike virtual ones).
LISTED_NAMESPACES = (b"user.", b"security.", b"trusted.", b"system.posix_acl_")


class DirOps:
    def _xattrs_offered(self) -> None:
        """ENOSYS makes the kernel answer EOPNOTSUPP itself from now on, as the target would."""
        if not self.offer_xattrs:
            raise pyfuse3.FUSEError(errno.ENOSYS)

    @replies
    async def getxattr(self, inode: int, name: bytes, ctx: Any = None) -> bytes:
        """An xattr, asking the target as rarely as the answer allows.

        The kernel asks for security.capability before every write(), and ``ls -l`` asks for
        an ACL and a security label of every file it lists; almost always the answer is "no
        such attribute". So the first question lists the file's names in the same trip to the
        target, and absent names are answered from that list for ``attr_timeout`` (a missing
        capability for longer: the kernel asks it per write). Only namespaces whose names
        listxattr always shows are answered from the list.
        """
        self._xattrs_offered()
        node = self.inodes[inode]
        now = trio.current_time()
        if name == CAPABILITY and node.no_capability_until > now:
            raise pyfuse3.FUSEError(errno.ENODATA)
        if not name.startswith(LISTED_NAMESPACES) or self.attr_timeout <= 0:
            return await self.backend.getxattr(self.callers.of(ctx), node.path_fd, name)
        if node.xattr_names_until <= now or name in node.xattr_names:
            value, names = await self.backend.getxattr_listed(
                self.callers.of(ctx), node.path_fd, name
            )
            node.xattr_names = frozenset(names)
            node.xattr_names_until = now + self.attr_timeout
            if value is not None:
                return value
        if name == CAPABILITY:
            node.no_capability_until = now + CAPABILITY_TTL
        raise pyfuse3.FUSEError(errno.ENODATA)

    def _xattrs_changed(self, node: Inode) -> None:
        node.no_capability_until = 0.0
        node.xattr_names_until = 0.0
        self.dir_attrs.forget(node)

    @replies
    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: Any = None) -> None:
        self._xattrs_offered()
        node = self.inodes[inode]
        self._xattrs_changed(node)
        await self.backend.setxattr(self.callers.of(ctx), node.path_fd, name, value)

    @replies
    async def listxattr(self, inode: int, ctx: Any = None) -> Any:
        self._xattrs_offered()
        return await self.backend.listxattr(self.callers.of(ctx), self.inodes[inode].path_fd)

    @replies
    async def removexattr(self, inode: int, name: bytes, ctx: Any = None) -> None:
        self._xattrs_offered()
        node = self.inodes[inode]
        self._xattrs_changed(node)
        await self.backend.removexattr(self.callers.of(ctx), node.path_fd, name)

    @replies
    async def opendir(self, inode: int, ctx: Any = None) -> int:
        node = self.inodes[inode]
        caller = self.callers.of(ctx)
        fd = await self.backend.opendir(caller, node.path_fd)
        fh = self._new_fh()
        self.dirs[fh] = DirHandle(fd, node, caller, pid=getattr(ctx, "pid", 0))
        return fh

    @replies
    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        handle = self.dirs.get(fh)
        if handle is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        if start_id == 0:
            handle.names = None  # rewinddir(): take a fresh snapshot
        index = start_id
        while True:
            names, batch = await self.backend.list_entries(
                handle.caller, handle.fd, handle.names, index, 256
            )
            handle.names = names
            if not batch:
                return
            for position, (next_index, name, created) in enumerate(batch):
                shown = True
                if created.path_fd < 0:  # "." or ".."
                    nodeid = self._dot_nodeid(handle.inode, name, created.st)
                else:
                    nodeid = self.inodes.nodeid_for(created.st, created.handle)
                    known = self.inodes.get(nodeid)
                    if known is not None and not known.detached:
                        shown = self._renew_if_changed(known, created.st)
                attr = self._attr(nodeid, created.st)
                if not pyfuse3.readdir_reply(token, name, attr, next_index):
                    for _, _, unused in batch[position:]:
                        if unused.path_fd >= 0:
                            os.close(unused.path_fd)
                    return
                if created.path_fd >= 0:
                    # readdirplus: the kernel now holds a reference, exactly as after lookup().
                    node = self.inodes.register(created.path_fd, created.st, created.handle)
                    self.inodes.name(node, handle.inode.nodeid, name)
                    if shown:
                        node.show(created.st)
            index = batch[-1][0]

    def _dot_nodeid(self, directory: Inode, name: bytes, st: os.stat_result) -> int:
        if name == b"." or directory.nodeid == pyfuse3.ROOT_INODE:
            return directory.nodeid
        return self.inodes.nodeid_for(st)

    @replies
    async def releasedir(self, fh: int) -> None:
        handle = self.dirs.pop(fh, None)
        if handle is not None:
            await self.backend.close_dir(handle.fd)

    @replies
    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        handle = self.dirs.get(fh)
        if handle is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        await self.backend.fsyncdir(handle.caller, handle.inode.path_fd, bool(datasync))
