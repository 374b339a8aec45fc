"""Requests that make, find, rename and remove names: lookups, the kinds of object the mount can
make, and letting go of a file whose last name goes.

A part of :class:`~.ops.Operations` (the state it uses is set up there)."""

from __future__ import annotations

import errno
import os
import stat
from typing import Any

import pyfuse3
import trio

from .. import _libc
from ..target.removals import LetGo
from .inodes import Inode
from .requests import LET_GO_WAIT, let_go_races, replies


class NameOps:
    @replies
    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> Any:
        self._refuse_when_closing()
        parent = self.inodes[parent_inode]
        caller = self.callers.of(ctx)
        since = self.write_seq
        found = await self.backend.lookup(caller, parent.path_fd, name)
        stale = self.inodes.stale_match(found.st, found.handle)
        if stale is not None:
            # What the target's client still calls by that name is the object it called
            # stale: have it look again (the kernel's retry after ESTALE would otherwise meet
            # the same stale object, for as long as the client caches the name).
            self.backend.close_soon(found.path_fd)
            found = await self.backend.lookup(caller, parent.path_fd, name, stale.mode)
            if found.handle is not None and found.handle == stale.handle:
                stale.stale = False  # the same object after all
        self.dir_attrs.seen(found.st)
        return self._entry(found, parent_inode, name, renew=True, since=since)

    async def forget(self, inode_list: Any) -> None:
        for nodeid, count in inode_list:
            inode = self.inodes.forget(nodeid, count)
            if inode is None:
                continue
            if inode.droppable(self.flusher.owes(nodeid)):
                self.inodes.drop(inode)

    @replies
    async def readlink(self, inode: int, ctx: Any = None) -> bytes:
        return await self.backend.readlink(self.callers.of(ctx), self.inodes[inode].path_fd)

    @replies
    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: Any) -> Any:
        parent = self.inodes[parent_inode]
        created = await self.backend.make(
            self.callers.of(ctx), "mknod", parent.path_fd, name, mode, rdev, self._owner(ctx)
        )
        return self._entry(created, parent_inode, name)

    @replies
    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: Any) -> Any:
        parent = self.inodes[parent_inode]
        created = await self.backend.make(
            self.callers.of(ctx), "mkdir", parent.path_fd, name, mode, None, self._owner(ctx)
        )
        return self._entry(created, parent_inode, name)

    @replies
    async def symlink(self, parent_inode: int, name: bytes, target: bytes, ctx: Any) -> Any:
        parent = self.inodes[parent_inode]
        created = await self.backend.make(
            self.callers.of(ctx), "symlink", parent.path_fd, name, 0o777, target, self._owner(ctx)
        )
        return self._entry(created, parent_inode, name)

    async def _let_go(self, parent: int, name: bytes) -> tuple[Inode, LetGo] | None:
        """Prepare to let go of the file known as *name* in *parent*, about to be removed.

        Whatever the daemon holds of a file keeps it on the target after its last name is
        gone: its space stays allocated, and on NFS the removal becomes a ``.nfsXXXXXXXX``
        silly rename (and an ``rm -rf`` then fails its rmdir with ENOTEMPTY). Nothing does any
        more once the name is removed, unless the file is open through the mount (then NFS
        itself keeps it, as without fusethrottle, until the last close: see release). So its
        un-synced data is let go of, its queued background sync dropped (a running one is
        waited for, at most LET_GO_WAIT), and its descriptors are handed to the removal, which
        lets go of them if the name is the file's last link (removals.LetGo).
        """
        node = self.inodes.named(parent, name)
        if node is None or node.busy_opening() or node.detaching or stat.S_ISDIR(node.mode):
            return None
        node.detaching = True
        try:
            free = await self.flusher.let_go(node.nodeid, LET_GO_WAIT)
        finally:
            node.detaching = False
        if not free or node.busy_opening() or node.detaching:
            return None
        node.detaching = True
        return node, LetGo(node.key, node.path_fd, self.backend.take_closes(node.nodeid))

    def _let_go_done(
        self, held: tuple[Inode, LetGo] | None, removed: os.stat_result | None
    ) -> None:
        """The removal's thread call ended (it closed the queued descriptors either way)."""
        if held is None:
            return
        node, let_go = held
        node.detaching = False
        if let_go.done:
            node.detached = True
            node.removed = removed
            self.inodes.retire(node)
            self.budget.discard(node.nodeid)

    @replies
    async def unlink(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        parent = self.inodes[parent_inode]
        held = await self._let_go(parent_inode, name)
        try:
            st = await self.backend.unlink(
                self.callers.of(ctx), parent.path_fd, name, held[1] if held else None
            )
        except trio.Cancelled:
            raise  # abandoned: its thread owns the descriptors now (the node stays detaching)
        except BaseException:
            self._let_go_done(held, None)
            raise
        self.inodes.unname(parent_inode, name)
        self._let_go_done(held, st)
        node = self.inodes.find(st) if held is None else held[0]
        if node is not None and st.st_nlink <= 1:
            # The last name went: its data needs no fsync any more.
            node.removed = st
            self.budget.discard(node.nodeid)

    @replies
    async def rmdir(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        await self.backend.rmdir(self.callers.of(ctx), self.inodes[parent_inode].path_fd, name)
        self.inodes.unname(parent_inode, name)

    @replies
    async def rename(
        self,
        parent_inode_old: int,
        name_old: bytes,
        parent_inode_new: int,
        name_new: bytes,
        flags: int,
        ctx: Any,
    ) -> None:
        old = self.inodes[parent_inode_old]
        new = self.inodes[parent_inode_new]
        exchange = bool(flags & _libc.RENAME_EXCHANGE)
        held = None if exchange else await self._let_go(parent_inode_new, name_new)
        try:
            await self.backend.rename(
                self.callers.of(ctx),
                old.path_fd,
                name_old,
                new.path_fd,
                name_new,
                flags,
                held[1] if held else None,
            )
        except trio.Cancelled:
            raise  # abandoned: its thread owns the descriptors now (the node stays detaching)
        except BaseException:
            self._let_go_done(held, None)
            raise
        self._let_go_done(held, None)
        self.inodes.renamed(parent_inode_old, name_old, parent_inode_new, name_new, exchange)

    @replies
    async def link(self, inode: int, new_parent_inode: int, new_name: bytes, ctx: Any) -> Any:
        node = self.inodes[inode]
        parent = self.inodes[new_parent_inode]
        if node.detaching or node.detached:
            raise pyfuse3.FUSEError(errno.ENOENT)  # its last name is going: the unlink won
        # A removal meanwhile must not let go of the file: it would survive under the new name
        # with the daemon holding nothing of it (see _let_go).
        node.opening += 1
        try:
            with let_go_races(node):
                created = await self.backend.link(
                    self.callers.of(ctx), node.path_fd, parent.path_fd, new_name
                )
        finally:
            node.opening -= 1
        return self._entry(created, new_parent_inode, new_name, shown=False)
