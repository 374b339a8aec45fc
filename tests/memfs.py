"""A tiny in-memory pyfuse3 filesystem that stands in for the target in mount tests.

Two things a plain directory cannot do: it writes every fsync it receives (and every write) to a
log file outside itself, so a test can see that an fsync issued on the fusethrottle mount
reached the target; and it can be frozen with SIGSTOP, so every request into it hangs exactly
like a dead NFS server.

Run as ``python memfs.py MOUNTPOINT LOGFILE [--stale-unlinked] [--slow-getattr=SECONDS]
[--slow-all-while=PATH:SECONDS]``;
SIGTERM or ``fusermount3 -u`` ends it. With ``--stale-unlinked`` a removed file is gone for
everyone, as on an NFS server when another client deletes it: opening, reading, writing or syncing
it answers ESTALE. With ``--slow-getattr`` every stat takes that long to answer, as on a server
that is slow but alive. With ``--slow-all-while`` every call but statfs and release takes SECONDS
while PATH (outside the file system) exists: a target that turns slow once a test has set up its
files. Only what the tests need is implemented; everything else answers ENOSYS.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import sys
import time
from dataclasses import dataclass, field

import pyfuse3
import trio


@dataclass
class Node:
    mode: int
    name: bytes
    data: bytearray = field(default_factory=bytearray)
    children: dict[bytes, int] = field(default_factory=dict)
    nlink: int = 1
    mtime_ns: int = field(default_factory=time.time_ns)


class MemFS(pyfuse3.Operations):
    def __init__(
        self,
        log_path: str,
        stale_unlinked: bool = False,
        slow_getattr: float = 0.0,
        slow_all_while: tuple[str, float] | None = None,
    ):
        super().__init__()
        self.stale_unlinked = stale_unlinked
        self.slow_getattr = slow_getattr
        self.slow_all_while = slow_all_while
        self.nodes: dict[int, Node] = {pyfuse3.ROOT_INODE: Node(stat.S_IFDIR | 0o755, b"", nlink=2)}
        self.next_ino = pyfuse3.ROOT_INODE + 1
        self.log = open(log_path, "a", buffering=1)  # noqa: SIM115 - lives as long as the fs

    async def _slow(self) -> None:
        if self.slow_all_while is not None:
            path, seconds = self.slow_all_while
            if os.path.exists(path):
                await trio.sleep(seconds)

    def record(self, *words: object) -> None:
        self.log.write(" ".join(str(w) for w in words) + "\n")

    def _attr(self, ino: int) -> pyfuse3.EntryAttributes:
        node = self._node(ino)
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = ino
        attr.st_mode = node.mode
        attr.st_nlink = node.nlink
        attr.st_uid = os.getuid()
        attr.st_gid = os.getgid()
        attr.st_size = len(node.data)
        attr.st_blksize = 4096
        attr.st_blocks = (len(node.data) + 511) // 512
        attr.st_atime_ns = attr.st_mtime_ns = attr.st_ctime_ns = node.mtime_ns
        attr.attr_timeout = attr.entry_timeout = 0.0
        return attr

    def _node(self, ino: int) -> Node:
        try:
            return self.nodes[ino]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ENOENT) from None

    def _live(self, ino: int) -> Node:
        """A file to open, read, write or sync: ESTALE once removed, with --stale-unlinked."""
        node = self._node(ino)
        if self.stale_unlinked and node.nlink == 0:
            raise pyfuse3.FUSEError(errno.ESTALE)
        return node

    def _new(self, parent: int, name: bytes, mode: int) -> int:
        directory = self._node(parent)
        if name in directory.children:
            raise pyfuse3.FUSEError(errno.EEXIST)
        ino = self.next_ino
        self.next_ino += 1
        self.nodes[ino] = Node(mode, name, nlink=2 if stat.S_ISDIR(mode) else 1)
        directory.children[name] = ino
        return ino

    async def lookup(self, parent_inode, name, ctx=None):
        await self._slow()
        ino = self._node(parent_inode).children.get(name)
        if ino is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attr(ino)

    async def getattr(self, inode, ctx=None):
        await self._slow()
        if self.slow_getattr:
            await trio.sleep(self.slow_getattr)
        return self._attr(inode)

    async def setattr(self, inode, attr, fields, fh, ctx):
        await self._slow()
        node = self._node(inode)
        if fields.update_size:
            del node.data[attr.st_size :]
            node.data.extend(b"\0" * (attr.st_size - len(node.data)))
        if fields.update_mode:
            node.mode = stat.S_IFMT(node.mode) | stat.S_IMODE(attr.st_mode)
        return self._attr(inode)

    async def mkdir(self, parent_inode, name, mode, ctx):
        await self._slow()
        return self._attr(self._new(parent_inode, name, stat.S_IFDIR | stat.S_IMODE(mode)))

    async def create(self, parent_inode, name, mode, flags, ctx):
        await self._slow()
        ino = self._new(parent_inode, name, stat.S_IFREG | stat.S_IMODE(mode))
        return pyfuse3.FileInfo(fh=ino), self._attr(ino)

    async def open(self, inode, flags, ctx):
        await self._slow()
        self._live(inode)
        return pyfuse3.FileInfo(fh=inode)

    async def read(self, fh, off, size):
        await self._slow()
        return bytes(self._live(fh).data[off : off + size])

    async def write(self, fh, off, buf):
        await self._slow()
        node = self._live(fh)
        if off > len(node.data):
            node.data.extend(b"\0" * (off - len(node.data)))
        node.data[off : off + len(buf)] = buf
        self.record("write", node.name.decode(), off, len(buf))
        return len(buf)

    async def fsync(self, fh, datasync):
        await self._slow()
        node = self._live(fh)
        self.record("fsync", node.name.decode(), len(node.data), int(bool(datasync)))

    async def flush(self, fh):
        await self._slow()
        pass

    async def release(self, fh):
        pass

    async def unlink(self, parent_inode, name, ctx):
        await self._slow()
        directory = self._node(parent_inode)
        ino = directory.children.pop(name, None)
        if ino is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        self.nodes[ino].nlink -= 1

    async def opendir(self, inode, ctx):
        await self._slow()
        if not stat.S_ISDIR(self._node(inode).mode):
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return inode

    async def readdir(self, fh, start_id, token):
        await self._slow()
        entries = sorted(self._node(fh).children.items())
        for index, (name, ino) in enumerate(entries[start_id:], start_id + 1):
            if not pyfuse3.readdir_reply(token, name, self._attr(ino), index):
                return

    async def releasedir(self, fh):
        pass

    async def statfs(self, ctx):
        out = pyfuse3.StatvfsData()
        out.f_bsize = out.f_frsize = 4096
        out.f_blocks = out.f_bfree = out.f_bavail = 1 << 20
        out.f_files = out.f_ffree = out.f_favail = 1 << 20
        out.f_namemax = 200  # not the usual 255, so a test can tell it was passed through
        return out


async def _serve() -> None:
    async with trio.open_nursery() as nursery:

        async def stop_on_signal() -> None:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    pyfuse3.terminate()
                    return

        nursery.start_soon(stop_on_signal)
        await pyfuse3.main()
        nursery.cancel_scope.cancel()


def main(argv: list[str]) -> int:
    mountpoint, log_path, *flags = argv
    slow = next((float(f.split("=", 1)[1]) for f in flags if f.startswith("--slow-getattr=")), 0.0)
    slow_all = next((f.split("=", 1)[1] for f in flags if f.startswith("--slow-all-while=")), None)
    slow_all_while = None
    if slow_all is not None:
        path, seconds = slow_all.rsplit(":", 1)
        slow_all_while = (path, float(seconds))
    fs = MemFS(
        log_path,
        stale_unlinked="--stale-unlinked" in flags,
        slow_getattr=slow,
        slow_all_while=slow_all_while,
    )
    pyfuse3.init(fs, mountpoint, {"fsname=memfs", "subtype=memfs"})
    try:
        trio.run(_serve)
    finally:
        pyfuse3.close(unmount=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
