"""The inode table: FUSE node ids <-> backing objects, with the kernel's lookup counts.

Each known inode holds an O_PATH descriptor of the backing object. Holding the object rather than
its path makes renames, hard links and deep trees free of bookkeeping: whatever happens to the
names, the descriptor still refers to the same file, and a held inode number cannot be reused by
the target while we hold it.

Node ids are the backing ``st_ino`` where that is unambiguous (same device as the root, not 1,
not taken), so ``stat`` through the mount shows what the target shows and hard links keep equal
inode numbers; anything else gets a number from a private range.

Concurrency: all methods are synchronous and called from the trio event loop only, so each call
is atomic with respect to other handlers. No method does I/O except ``os.close`` of O_PATH
descriptors, which never touches the target's data path.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Container, Iterator
from dataclasses import dataclass, field

import pyfuse3
import trio

from ..target.credentials import Caller

ROOT = pyfuse3.ROOT_INODE
_PRIVATE_BASE = 1 << 62


@dataclass(eq=False, slots=True)  # slots: a million of these cost a third of the memory
class Inode:
    nodeid: int
    path_fd: int
    key: tuple[int, int]
    mode: int
    lookups: int = 0
    #: The target's file handle of the object (None: the target has none), see _known.
    handle: bytes | None = None
    # Negative cache of the security.capability xattr the kernel probes on every write().
    no_capability_until: float = 0.0
    # The file's xattr names as last listed, and until when that list answers "absent".
    xattr_names: frozenset[bytes] = frozenset()
    xattr_names_until: float = 0.0
    # With xattrs not offered, the kernel cannot see a file capability, so the next write
    # through the mount must remove it (as the kernel would have).
    capability_to_drop: bool = False
    # Writes of this file take turns (see Operations.write); made on the first write.
    write_lock: trio.Lock | None = None
    # Set once its last name was unlinked through the mount: what it looked like then.
    removed: os.stat_result | None = None
    # When this node was registered (time.monotonic): attributes taken earlier under the same
    # inode number belong to an object that number named before (see Operations.getattr).
    born: float = field(default_factory=time.monotonic)
    # The byte range written since the file's last injected sync began (None: nothing), which
    # the next one writes back in pieces and then drops from the page cache.
    written: tuple[int, int] | None = None
    # Who last opened it for writing: its background fsyncs run as them (credentials.py).
    writer: Caller | None = None
    # The name the kernel last learned it under (parent node id 0: none), so that the daemon
    # can ask the kernel to drop it when descriptors run short (kernel_entries.py).
    entry_parent: int = 0
    entry_name: bytes = b""
    asked_until: float = 0.0
    # Handles open on it through the mount (a name of an open file is never dropped, nor is an
    # open file renewed, see Operations._renew_if_changed).
    open_handles: int = 0
    # The kernel's FUSE generation of this node: changed to make the kernel drop a cached
    # inode whose size it would otherwise keep (see Operations._renew_if_changed).
    generation: int = 0
    # Its last name was removed through the mount and the daemon let go of the object: the
    # descriptor number now holds a placeholder, and nothing may reach the target through it.
    detached: bool = False
    # A removal of its last name is under way (nothing new may take hold of its descriptor).
    detaching: bool = False
    # The target answered ESTALE through its descriptor: another client removed or replaced
    # the object. The next lookup that finds the same object has the target's client look the
    # name up again (see Operations.lookup).
    stale: bool = False
    # What the kernel was last told (or made itself, by writing) of its size and mtime (None:
    # not known, e.g. after our own writes moved the target's mtime).
    shown_size: int | None = None
    shown_mtime_ns: int | None = None
    # When our last write to it landed on the target (Operations.write_seq). A call that
    # learns the file's size or mtime from a stat (lookup, create, open, flush, setattr) uses
    # it only if no write of ours landed while the call ran: a write moves the target past
    # what the stat saw, and that stale value would make a later open or lookup take our own
    # write for another writer's change (changed_behind_our_back) and renew the node, which
    # fails the I/O of anyone who has the old one open (EIO).
    last_write_seq: int = 0
    # Writes of ours to it under way: the target may already show them, the kernel's size not.
    writes_in_flight: int = 0
    # Opens and hard links of it under way (see busy_opening).
    opening: int = 0

    def written_since(self, seq: int) -> bool:
        """Whether a write of ours landed after *seq*, or is under way: a stat taken meanwhile
        says nothing about changes by others."""
        return self.writes_in_flight > 0 or self.last_write_seq > seq

    def busy_opening(self) -> bool:
        """Open through the mount, or an open or link of it under way: a removal of its last
        name must not let go of its descriptor (the call would reach through a placeholder, or
        the file would live on under the new link with nothing of it held)."""
        return self.open_handles > 0 or self.opening > 0

    def needed(self, owes_data: bool) -> bool:
        """Whether this node must stay: open through the mount, or *owes_data* (the window
        holds data of it not yet synced, or a sync of it is queued or running)."""
        return self.open_handles > 0 or owes_data

    def droppable(self, owes_data: bool) -> bool:
        """The one answer to "may the table close this node's descriptor now": the kernel
        forgot it and it is not :meth:`needed`."""
        return self.lookups <= 0 and not self.needed(owes_data)

    # An mtime the kernel keeps of its own (its writeback cache stamps writes) that was not
    # set on the target, whose own write time stands for it (see Operations.setattr).
    kernel_mtime_ns: int | None = None

    def show(self, st: os.stat_result) -> None:
        """The kernel was handed these attributes in an entry (it takes the size from those)."""
        self.shown_size = st.st_size
        self.shown_mtime_ns = st.st_mtime_ns

    def changed_behind_our_back(self, st: os.stat_result) -> bool:
        """Whether *st* differs from what the kernel was last shown of this file."""
        if self.shown_size is None:
            return False
        if st.st_size != self.shown_size:
            return True
        return self.shown_mtime_ns is not None and st.st_mtime_ns != self.shown_mtime_ns

    def note_written(self, offset: int, length: int) -> None:
        self.written = grow(self.written, offset, length)

    def take_written(self) -> tuple[int, int] | None:
        """The range for a sync that starts now; writes from here on start a new one."""
        taken, self.written = self.written, None
        return taken

    def give_back_written(self, taken: tuple[int, int] | None) -> None:
        """A failed sync: its range is still to be written back."""
        if taken is not None:
            self.note_written(taken[0], taken[1] - taken[0])


def grow(span: tuple[int, int] | None, offset: int, length: int) -> tuple[int, int] | None:
    """The smallest byte range covering *span* and [offset, offset + length)."""
    if length <= 0:
        return span
    if span is None:
        return (offset, offset + length)
    return (min(span[0], offset), max(span[1], offset + length))


def _fd_path(fd: int) -> str | None:
    """The path of what *fd* refers to, from /proc (no I/O on the target)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


class InodeTable:
    """Maps node ids to :class:`Inode` and counts the kernel's references to each."""

    def __init__(
        self,
        root_fd: int,
        root_st: os.stat_result,
        *,
        full_at: int | None = None,
        keep_path_of: Container[int] = (),
    ) -> None:
        self._by_id: dict[int, Inode] = {}
        self._by_key: dict[tuple[int, int], Inode] = {}
        self._next_private = _PRIVATE_BASE
        self.root_dev = root_st.st_dev
        #: A registration that takes the table past this size wakes :meth:`wait_full` at once.
        self.full_at = full_at
        self._full = trio.Event()
        #: (parent node id, name) -> the node the kernel learned under that name (last lookup,
        #: create or readdirplus): what an unlink or a rename over the name is about to remove.
        self._names: dict[tuple[int, bytes], Inode] = {}
        #: Node ids whose path must outlive their descriptor (files left incomplete on the
        #: target, named at unmount), and those paths once the descriptor is gone.
        self.keep_path_of = keep_path_of
        self.dropped_paths: dict[int, str] = {}
        root = Inode(ROOT, root_fd, (root_st.st_dev, root_st.st_ino), root_st.st_mode, 1 << 62)
        self._by_id[ROOT] = root
        self._by_key[root.key] = root

    def __len__(self) -> int:
        return len(self._by_id)

    def __getitem__(self, nodeid: int) -> Inode:
        """The node, for a call that reaches the target through it (ESTALE: unknown; ENOENT:
        its last name was removed and the daemon let go of the object)."""
        try:
            inode = self._by_id[nodeid]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ESTALE) from None
        if inode.detached:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return inode

    def nodeids(self) -> list[int]:
        return list(self._by_id)

    def values(self) -> Iterator[Inode]:
        """Every known inode, the earliest registered first."""
        return iter(self._by_id.values())

    def get(self, nodeid: int) -> Inode | None:
        return self._by_id.get(nodeid)

    def find(self, st: os.stat_result) -> Inode | None:
        """The registered inode of this backing object, if the kernel knows it (the caller
        knows *st* is that object's: an unlink's stat, taken just before it went)."""
        return self._by_key.get((st.st_dev, st.st_ino))

    def _known(self, st: os.stat_result, handle: bytes | None) -> Inode | None:
        """The registered inode of the object *st* and *handle* describe, unless its device and
        inode number now name another object.

        A file system gives the number of a deleted file or directory to a new one, and another
        NFS client may remove an object and make a new one in its place, while the kernel still
        holds the old node (it forgets asynchronously). Answering for the new object with the
        old node would show the kernel a node that changed type (it fails the next stat with
        EIO), serve the deleted file's data, or keep a directory every call of which answers
        ESTALE (NFS: the old object's handle is stale). The file handle tells the two apart,
        from what was just looked up, without asking the target (the old object may be gone,
        and on NFS a stat of it may be answered from a cache that does not know that yet).
        Where the target has no handles, only a change of file type shows. The old node keeps
        its id until the kernel forgets it; the new object gets another.
        """
        key = (st.st_dev, st.st_ino)
        known = self._by_key.get(key)
        if known is None or known.nodeid == ROOT:
            return known
        if handle is not None and known.handle is not None:
            same = handle == known.handle
        else:
            same = stat.S_IFMT(known.mode) == stat.S_IFMT(st.st_mode)
        if same:
            return known
        del self._by_key[key]
        return None

    def nodeid_for(self, st: os.stat_result, handle: bytes | None = None) -> int:
        """The node id this backing object has, or would get if registered now."""
        known = self._known(st, handle)
        if known is not None:
            return known.nodeid
        if st.st_dev == self.root_dev and 1 < st.st_ino < _PRIVATE_BASE:
            holder = self._by_id.get(st.st_ino)
            if holder is None or self._reusable(holder):
                return st.st_ino
        while self._next_private in self._by_id:
            self._next_private += 1
        return self._next_private

    @staticmethod
    def _reusable(holder: Inode) -> bool:
        """Whether a node's id may go to a new object with its inode number: its own object is
        gone (let go of at its last unlink) and nothing of the daemon's needs it. The target
        gives a deleted file's number to the next new one, often while the kernel still holds
        the old node (until it forgets it); a new generation tells the kernel that the id now
        names another object (it makes its old inode bad and starts a new one), so stat
        through the mount keeps showing the target's inode number."""
        return holder.detached and holder.open_handles == 0 and not holder.detaching

    def generation_for(self, nodeid: int) -> int:
        """The generation an entry for *nodeid* carries (see _reusable)."""
        holder = self._by_id.get(nodeid)
        if holder is None:
            return 0
        return holder.generation + 1 if self._reusable(holder) else holder.generation

    def register(self, path_fd: int, st: os.stat_result, handle: bytes | None = None) -> Inode:
        """Count one kernel reference to the object *path_fd* refers to.

        Takes ownership of *path_fd*: if the object is already known, the new descriptor is
        closed and the existing inode is returned.
        """
        key = (st.st_dev, st.st_ino)
        known = self._known(st, handle)
        if known is not None:
            os.close(path_fd)
            known.lookups += 1
            known.mode = st.st_mode
            return known
        nodeid = self.nodeid_for(st, handle)
        inode = Inode(nodeid, path_fd, key, st.st_mode, 1, handle)
        old = self._by_id.get(nodeid)
        if old is not None:  # the id of an object that is gone: _reusable
            inode.lookups += old.lookups  # the kernel forgets the old one's references too
            inode.generation = old.generation + 1
            if self._names.get((old.entry_parent, old.entry_name)) is old:
                del self._names[(old.entry_parent, old.entry_name)]
            os.close(old.path_fd)  # the placeholder it was left with
        self._by_id[inode.nodeid] = inode
        self._by_key[key] = inode
        if self.full_at is not None and len(self._by_id) > self.full_at:
            self._full.set()
        return inode

    async def wait_full(self) -> None:
        """Until a registration takes the table past ``full_at`` (a tree copy registers a
        thousand inodes a second: the relief must not wait for its next periodic check)."""
        await self._full.wait()
        self._full = trio.Event()

    # --- names ---------------------------------------------------------------------------
    def name(self, inode: Inode, parent: int, name: bytes) -> None:
        """The kernel learned *inode* as *name* in *parent*."""
        inode.entry_parent, inode.entry_name = parent, name
        self._names[(parent, name)] = inode

    def named(self, parent: int, name: bytes) -> Inode | None:
        """The live node the kernel knows as *name* in *parent*, if any."""
        inode = self._names.get((parent, name))
        if inode is None:
            return None
        if self._by_id.get(inode.nodeid) is not inode or inode.detached:
            del self._names[(parent, name)]
            return None
        return inode

    def unname(self, parent: int, name: bytes) -> None:
        """*name* in *parent* is gone (unlinked, removed, or renamed away)."""
        self._names.pop((parent, name), None)

    def renamed(
        self, old_parent: int, old: bytes, new_parent: int, new: bytes, exchange: bool
    ) -> None:
        moved = self._names.pop((old_parent, old), None)
        other = self._names.pop((new_parent, new), None)
        if moved is not None:
            self.name(moved, new_parent, new)
        if exchange and other is not None:
            self.name(other, old_parent, old)

    def stale_match(self, st: os.stat_result, handle: bytes | None) -> Inode | None:
        """The known node of this very object, if the target called it stale."""
        known = self._by_key.get((st.st_dev, st.st_ino))
        if known is None or not known.stale:
            return None
        return known if handle is None or known.handle in (None, handle) else None

    def retire(self, inode: Inode) -> None:
        """*inode*'s object is gone from the target: a new object with its inode number is
        another node (the kernel may still hold this one until it forgets it)."""
        if self._by_key.get(inode.key) is inode:
            del self._by_key[inode.key]

    def forget(self, nodeid: int, count: int) -> Inode | None:
        """Drop *count* kernel references; returns the inode if it is now unreferenced.

        The caller decides when to :meth:`drop` it (the ledger may still need its descriptor
        to fsync data written before the kernel forgot the file).
        """
        inode = self._by_id.get(nodeid)
        if inode is None or nodeid == ROOT:
            return None
        inode.lookups -= count
        if inode.lookups > 0:
            return None
        return inode

    def drop(self, inode: Inode) -> None:
        """Forget an unreferenced inode and close its descriptor."""
        if inode.lookups > 0 or inode.nodeid == ROOT:
            return
        if inode.nodeid in self.keep_path_of:
            self.dropped_paths[inode.nodeid] = _fd_path(inode.path_fd) or f"inode {inode.nodeid}"
        if self._by_id.get(inode.nodeid) is inode:
            del self._by_id[inode.nodeid]
        if self._by_key.get(inode.key) is inode:
            del self._by_key[inode.key]
        if self._names.get((inode.entry_parent, inode.entry_name)) is inode:
            del self._names[(inode.entry_parent, inode.entry_name)]
        if inode.detaching:
            return  # an abandoned removal's thread still owns the descriptor (NameOps._let_go)
        os.close(inode.path_fd)

    def path(self, nodeid: int) -> str:
        """Where the object is on the target now (for a log line)."""
        inode = self._by_id.get(nodeid)
        known = _fd_path(inode.path_fd) if inode is not None and not inode.detached else None
        return known or self.dropped_paths.get(nodeid, f"inode {nodeid} (name unknown)")

    def close_all(self) -> None:
        for inode in list(self._by_id.values()):
            if inode.nodeid != ROOT and not inode.detaching:
                os.close(inode.path_fd)
        self._by_id = {ROOT: self._by_id[ROOT]}
        self._names.clear()
