"""The pyfuse3 Operations adapter: FUSE requests in, backend calls and budget updates out.

Thin by design. Each handler resolves node ids and handles, calls the backend (which does the
I/O in worker threads), tells the write budget and replies. The handlers are grouped by what
they act on: names.py (lookups, making and removing names), files.py (open files: read, write,
flush, release, fsync), attrs.py (getattr, setattr), dirs.py (listings, extended attributes);
this class holds the state they share. Errors are mapped in one place (requests.replies): an
OSError from the target becomes a FUSEError with the same errno; anything unexpected is logged
once with context and becomes EIO, because pyfuse3 ends its main loop on any exception that is
not a FUSEError and would leave a hung mount behind.

Concurrency: handlers run as trio tasks; code between two awaits is atomic, which is what keeps
the inode table and the ledger consistent without locks.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from typing import Any

import pyfuse3

from ..metering.ceilings import Ceilings
from ..observability.events import Events, NullEvents
from ..target.backend import Backend
from ..target.credentials import Callers
from ..target.target_calls import Created
from ..window.budget import WriteBudget
from ..window.flusher import Flusher
from .attrs import AttrOps
from .dir_attrs import DirAttrs
from .dirs import DirOps
from .files import FileOps
from .init_flags import KillprivV2
from .inodes import Inode, InodeTable
from .killable import KillWatch
from .names import NameOps
from .requests import DirHandle, ErrorLog, FileHandle, replies


class Operations(NameOps, FileOps, AttrOps, DirOps, pyfuse3.Operations):
    """Passthrough of every operation to the backing directory, with write admission."""

    supports_dot_lookup = False
    enable_writeback_cache = False

    def __init__(
        self,
        *,
        backend: Backend,
        inodes: InodeTable,
        budget: WriteBudget,
        flusher: Flusher,
        attr_timeout: float = 1.0,
        dir_attrs: DirAttrs | None = None,
        target_decides: bool = False,
        writeback_cache: bool = False,
        events: Events | None = None,
        ceilings: Ceilings | None = None,
        offer_xattrs: bool = True,
        target_xattrs: bool = True,
        callers: Callers | None = None,
        killpriv_v2: KillprivV2 | None = None,
        target_direct: bool = False,
    ) -> None:
        super().__init__()
        self.killpriv_v2 = killpriv_v2
        self.ceilings = ceilings
        self.backend = backend
        self.inodes = inodes
        self.budget = budget
        self.ledger = budget.ledger  # read-only here: every change goes through the budget
        self.flusher = flusher
        self.attr_timeout = attr_timeout
        # permissions=target: the kernel checks nothing (no default_permissions) and every
        # call reaches the target as its caller, which decides. A cached name would let a
        # path walk pass a directory without asking anyone: names are not cached then.
        self.target_decides = target_decides
        self.entry_timeout = 0.0 if target_decides else attr_timeout
        self.enable_writeback_cache = writeback_cache
        # Without xattrs, getxattr answers ENOSYS once and the kernel stops asking, which takes
        # its security.capability question (one round trip per write()) off the write path.
        self.offer_xattrs = offer_xattrs
        self._drop_capabilities = not offer_xattrs and target_xattrs
        #: Writes leave nothing in the target's page cache (target_io, see files.py).
        self.target_direct = target_direct
        self._told_no_direct_io = False
        self.events = events or NullEvents()
        self.callers = callers or Callers(switching=False)
        self.closing = False
        self.requests_total = 0  # requests answered or in progress (the daemon's idle check)
        #: Counts our writes landing on the target (see Inode.last_write_seq).
        self.write_seq = 0
        #: Directory attributes taken with our own changes (the backend tells it of those).
        self.dir_attrs = dir_attrs or DirAttrs(attr_timeout)
        self.files: dict[int, FileHandle] = {}
        self.dirs: dict[int, DirHandle] = {}
        self._next_fh = 1
        self._errors = ErrorLog()
        self._uid = os.geteuid()
        self._gid = os.getegid()
        #: Answers the requests of callers that are being killed (run by the daemon).
        self.kills = KillWatch()

    # --- helpers ---------------------------------------------------------------------------
    def _attr(self, nodeid: int, st: os.stat_result) -> pyfuse3.EntryAttributes:
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = nodeid
        attr.generation = self.inodes.generation_for(nodeid)
        attr.entry_timeout = self.entry_timeout
        attr.attr_timeout = self.attr_timeout
        attr.st_mode = st.st_mode
        attr.st_nlink = st.st_nlink
        attr.st_uid = st.st_uid
        attr.st_gid = st.st_gid
        attr.st_rdev = st.st_rdev
        attr.st_size = st.st_size
        attr.st_blksize = st.st_blksize
        attr.st_blocks = st.st_blocks
        attr.st_atime_ns = st.st_atime_ns
        attr.st_mtime_ns = st.st_mtime_ns
        attr.st_ctime_ns = st.st_ctime_ns
        return attr

    def _entry(
        self,
        created: Created,
        parent: int,
        name: bytes,
        *,
        shown: bool = True,
        renew: bool = False,
        since: int | None = None,
    ) -> pyfuse3.EntryAttributes:
        """Register a found or made object under *name* in *parent*. *shown*: the kernel takes
        its size from this reply (not so for a hard link, which names an inode the kernel may
        hold already); *renew*: a lookup, which may hand the kernel a new generation (see
        _renew_if_changed); *since*: the write_seq when the call that found it began."""
        inode = self.inodes.register(created.path_fd, created.st, created.handle)
        self.inodes.name(inode, parent, name)
        if since is not None and inode.written_since(since):
            # A write of ours landed while the call ran: its stat is older than what the
            # kernel holds; nothing to learn from it.
            renew = shown = False
        if renew:
            shown = self._renew_if_changed(inode, created.st)
        if shown:
            inode.show(created.st)
        return self._attr(inode.nodeid, created.st)

    def _renew_if_changed(self, node: Inode, st: os.stat_result) -> bool:
        """Make the kernel drop its inode of a file another writer changed behind our back.

        With the writeback cache the kernel keeps the size (and mtime) of a cached regular
        file itself and ignores the daemon's: a file truncated, extended or rewritten on the
        target by another host or in the source directory would show its old size (and its
        old cached pages) through the mount for as long as the kernel caches the inode, even
        with attr_timeout=0. An entry with a new generation makes the kernel drop that inode
        at this lookup and make a new one from the target's attributes. Only for files nobody
        has open through the mount: the kernel fails I/O on a dropped inode (EIO), and an open
        file's size and pages are the kernel's own until close, as on NFS (close-to-open).
        Returns whether the kernel takes *st*'s size (False: it keeps its own, and the change
        is still to be made known at a lookup after the file's last close).
        """
        if not (
            self.enable_writeback_cache
            and stat.S_ISREG(st.st_mode)
            and node.changed_behind_our_back(st)
        ):
            return True
        if node.open_handles > 0:
            return False
        node.generation += 1
        return True

    def _owner(self, ctx: pyfuse3.RequestContext) -> tuple[int, int] | None:
        """Who a new object must be given to; None when that is us already, or when it was
        made by the caller's own credentials (it is theirs then, as on the target itself)."""
        if self.callers.switching or (ctx.uid == self._uid and ctx.gid == self._gid):
            return None
        return ctx.uid, ctx.gid

    def _called_stale(self, args: tuple[Any, ...]) -> None:
        """The target answered ESTALE to a call through the node (a lookup: through its
        parent): another client removed or replaced the object. The kernel then looks the
        name up again; that lookup must not take the target client's cached name as it is."""
        node = self.inodes.get(args[0]) if args and isinstance(args[0], int) else None
        if node is not None:
            node.stale = True

    def _caller_tid(self, args: tuple[Any, ...], op: str, by_handle: bool) -> int:
        """Whose request this is (0: nobody the daemon can tell, or nobody's: never answered
        early, see killable.py)."""
        if by_handle:
            if not args or not isinstance(args[0], int):
                return 0
            handle = self.files.get(args[0]) or self.dirs.get(args[0])
            if handle is None:
                return 0
            if op == "write" and isinstance(handle, FileHandle) and handle.write_back:
                return 0  # the kernel's write-back: nobody's (FileHandle.write_back)
            return handle.pid
        pid = getattr(args[-1], "pid", 0) if args else 0
        return pid if isinstance(pid, int) else 0

    def _new_fh(self) -> int:
        fh = self._next_fh
        self._next_fh += 1
        return fh

    def _handle(self, fh: int) -> FileHandle:
        try:
            return self.files[fh]
        except KeyError:
            raise pyfuse3.FUSEError(errno.EBADF) from None

    def init(self) -> None:
        """Runs inside libfuse's INIT handling, before its reply is written."""
        if self.killpriv_v2 is not None:
            self.killpriv_v2.arm()

    # --- shutdown with the writeback cache ----------------------------------------------------
    def close_the_cache(self) -> None:
        """Stop new writes from landing in a page cache nobody will write back.

        With the writeback cache a write() succeeds once its pages are in the kernel's cache,
        and the kernel asks the daemon nothing but the file's attributes (when they expired).
        From here on every inode's attributes are expired and asking for them fails, so a
        writer still writing gets ENOTCONN, as from a mount that is gone, instead of an
        acknowledgement for data that would be lost. The caller then has the kernel write back
        what it holds (syncfs), which needs none of the refused requests.
        """
        self.closing = True
        for nodeid in self.inodes.nodeids():
            # OSError: the kernel forgot the inode meanwhile, so nothing is cached to expire.
            with contextlib.suppress(OSError):
                pyfuse3.invalidate_inode(nodeid, attr_only=True)

    def _refuse_when_closing(self) -> None:
        if self.closing:
            raise pyfuse3.FUSEError(errno.ENOTCONN)

            # else: the flusher drops it once its data is durable (or its fsync has ended).

    @replies
    async def access(self, inode: int, mode: int, ctx: Any = None) -> bool:
        """access(2) and chdir with permissions=target (the kernel asks only then): the
        target's answer to the caller."""
        node = self.inodes[inode]
        return await self.backend.access(self.callers.of(ctx), node.path_fd, mode)

    @replies
    async def statfs(self, ctx: Any = None) -> Any:
        vfs = await self.backend.statfs(
            self.callers.of(ctx), self.inodes[pyfuse3.ROOT_INODE].path_fd
        )
        out = pyfuse3.StatvfsData()
        out.f_bsize = vfs.f_bsize
        out.f_frsize = vfs.f_frsize
        out.f_blocks = vfs.f_blocks
        out.f_bfree = vfs.f_bfree
        out.f_bavail = vfs.f_bavail
        out.f_files = vfs.f_files
        out.f_ffree = vfs.f_ffree
        out.f_favail = vfs.f_favail
        out.f_namemax = vfs.f_namemax
        return out
