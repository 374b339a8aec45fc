"""Layer 3: the Operations class called directly on a temporary backing directory, no mount.

Each test plays the kernel: it sends requests with node ids and handles, keeps the references
the kernel would keep, and checks both the replies and what landed in the backing directory.
The harness also checks, for every test, that no descriptor leaked (each inode the kernel knows
holds one O_PATH descriptor; a leak is an EMFILE on a long backup) and that nothing was logged
at WARNING or above unless the test expected it.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import os
import random
import stat
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyfuse3
import pytest
import trio

from fusethrottle import _libc
from fusethrottle.service.mount import Mount, build
from fusethrottle.service.options import Config

ROOT = pyfuse3.ROOT_INODE
MiB = 1 << 20
IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="creating files for other users needs root")


def ctx(uid: int | None = None, gid: int | None = None) -> Any:
    """A request context as pyfuse3 would pass it (the real class cannot be built in Python).

    Another user's request names no process (pid 0), so it runs with its primary group only."""
    return SimpleNamespace(
        uid=os.geteuid() if uid is None else uid,
        gid=os.getegid() if gid is None else gid,
        pid=os.getpid() if uid is None else 0,
        umask=0o022,
    )


def fields(**update: bool) -> Any:
    names = ("atime", "mtime", "ctime", "mode", "uid", "gid", "size")
    return SimpleNamespace(**{f"update_{n}": update.get(n, False) for n in names})


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


@dataclass
class Entry:
    name: bytes
    nodeid: int
    next_id: int


@dataclass
class Token:
    """Stands in for the kernel's readdir buffer: holds ``room`` entries, then says no."""

    room: int
    entries: list[Entry] = field(default_factory=list)


def fake_readdir_reply(token: Token, name: bytes, attr: Any, next_id: int) -> bool:
    if len(token.entries) >= token.room:
        return False
    token.entries.append(Entry(name, attr.st_ino, next_id))
    return True


class Fs:
    """Operations plus the kernel's side: lookups held, handles open, convenience calls."""

    def __init__(self, mount: Mount, backing: Path, calls: collections.Counter[str]) -> None:
        self.mount = mount
        self.ops = mount.ops
        self.backing = backing
        self.calls = calls

    async def lookup(self, parent: int, name: bytes) -> Any:
        return await self.ops.lookup(parent, name, ctx())

    async def resolve(self, path: str) -> int:
        nodeid = ROOT
        for part in path.split("/"):
            nodeid = (await self.lookup(nodeid, part.encode())).st_ino
        return nodeid

    async def create(
        self, parent: int, name: bytes, mode: int = 0o644, flags: int = os.O_RDWR, who: Any = None
    ) -> tuple[int, Any]:
        info, attr = await self.ops.create(parent, name, mode, flags | os.O_CREAT, who or ctx())
        return info.fh, attr

    async def put(self, parent: int, name: bytes, data: bytes) -> int:
        """Create *name* holding *data*; returns its node id (the handle is released)."""
        fh, attr = await self.create(parent, name)
        assert await self.ops.write(fh, 0, data) == len(data)
        await self.ops.release(fh)
        return attr.st_ino

    async def open(self, nodeid: int, flags: int = os.O_RDWR) -> int:
        return (await self.ops.open(nodeid, flags, ctx())).fh

    async def read_all(self, nodeid: int) -> bytes:
        fh = await self.open(nodeid, os.O_RDONLY)
        try:
            chunks, offset = [], 0
            while chunk := await self.ops.read(fh, offset, 1 << 16):
                chunks.append(chunk)
                offset += len(chunk)
            return b"".join(chunks)
        finally:
            await self.ops.release(fh)

    async def mkdir(self, parent: int, name: bytes, mode: int = 0o755, who: Any = None) -> int:
        return (await self.ops.mkdir(parent, name, mode, who or ctx())).st_ino

    async def listdir(self, nodeid: int, room: int = 1000) -> list[Entry]:
        """readdir as the kernel does it: refill a small buffer from the last offset."""
        fh = await self.ops.opendir(nodeid, ctx())
        try:
            out: list[Entry] = []
            start = 0
            while True:
                token = Token(room)
                await self.ops.readdir(fh, start, token)
                if not token.entries:
                    return out
                out.extend(token.entries)
                start = token.entries[-1].next_id
        finally:
            await self.ops.releasedir(fh)

    async def release_all(self) -> None:
        for fh in list(self.ops.files):
            await self.ops.release(fh)
        for fh in list(self.ops.dirs):
            await self.ops.releasedir(fh)


Body = Callable[[Fs], Awaitable[None]]


@pytest.fixture
def backing(tmp_path: Path) -> Path:
    path = tmp_path / "backing"
    path.mkdir()
    return path


@pytest.fixture
def run(
    backing: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., None]:
    """``run(body, expect_log=False, **options)``: one session of Operations over *backing*."""
    monkeypatch.setattr(pyfuse3, "readdir_reply", fake_readdir_reply)

    def runner(body: Body, expect_log: bool = False, **options: Any) -> None:
        # These calls stand for a kernel without the writeback cache, one request per write();
        # tests of the writeback-cache contract ask for it.
        options.setdefault("writeback_cache", False)
        config = Config(source=str(backing), mountpoint="/nonexistent", **options)
        calls: collections.Counter[str] = collections.Counter()

        async def session() -> None:
            mount = build(config, observer=lambda op, nbytes: calls.update([op]))
            fs = Fs(mount, backing, calls)
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(mount.budget.run)
                    await nursery.start(mount.flusher.run)
                    await nursery.start(mount.backend.run_closer)
                    await body(fs)
                    await fs.release_all()
                    assert await mount.flusher.flush_all("test") == []
                    await mount.backend.closes_made()
                    nursery.cancel_scope.cancel()
            finally:
                mount.inodes.close_all()
                os.close(mount.inodes[ROOT].path_fd)

        before = fd_count()
        old_umask = os.umask(0)  # as serve() does: the kernel already applied the caller's
        caplog.set_level(logging.INFO, logger="fusethrottle")
        try:
            trio.run(session)
        finally:
            os.umask(old_umask)
        assert fd_count() == before, "descriptors leaked"
        if not expect_log:
            loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
            assert loud == []

    return runner


async def fails(code: int, awaitable: Awaitable[Any]) -> None:
    with pytest.raises(pyfuse3.FUSEError) as info:
        await awaitable
    assert info.value.errno == code, os.strerror(info.value.errno)


# --- files: create, write, read --------------------------------------------------------------
def test_create_write_read_lands_in_backing_file(run: Callable[..., None], backing: Path) -> None:
    async def body(fs: Fs) -> None:
        fh, attr = await fs.create(ROOT, b"data", 0o640)
        assert stat.S_ISREG(attr.st_mode) and stat.S_IMODE(attr.st_mode) == 0o640
        assert await fs.ops.write(fh, 0, b"hello") == 5
        assert await fs.ops.write(fh, 8192, b"world") == 5  # leaves a hole
        assert await fs.ops.read(fh, 0, 5) == b"hello"
        assert await fs.ops.read(fh, 5, 4) == b"\0" * 4
        assert await fs.ops.read(fh, 8192, 100) == b"world"
        assert await fs.ops.read(fh, 9000, 100) == b""
        await fs.ops.flush(fh)
        await fs.ops.release(fh)
        assert (await fs.ops.getattr(attr.st_ino, ctx())).st_size == 8197

    run(body)
    data = (backing / "data").read_bytes()
    assert data == b"hello" + b"\0" * 8187 + b"world"
    assert stat.S_IMODE((backing / "data").stat().st_mode) == 0o640


def test_each_open_has_its_own_descriptor(run: Callable[..., None], backing: Path) -> None:
    """Closing one open of a file must not disturb another open of the same file."""

    async def body(fs: Fs) -> None:
        nodeid = await fs.put(ROOT, b"f", b"0123456789")
        reader = await fs.open(nodeid, os.O_RDONLY)
        writer = await fs.open(nodeid, os.O_WRONLY)
        assert fs.ops.files[reader].fd != fs.ops.files[writer].fd
        await fs.ops.release(writer)
        assert await fs.ops.read(reader, 2, 3) == b"234"
        await fails(errno.EBADF, fs.ops.read(writer, 0, 1))

    run(body)


def test_with_the_writeback_cache_the_kernel_positions_appends_and_reads_pages(
    run: Callable[..., None], backing: Path
) -> None:
    """The kernel fills partial pages by reading and sends appends at their real offset."""

    async def body(fs: Fs) -> None:
        nodeid = await fs.put(ROOT, b"f", b"head")
        appender = await fs.open(nodeid, os.O_WRONLY | os.O_APPEND)
        assert await fs.ops.write(appender, 4, b"+tail") == 5  # the kernel chose offset 4
        assert await fs.ops.read(appender, 0, 4) == b"head"  # write-only opens can read pages
        await fs.ops.release(appender)

    run(body, writeback_cache=True)
    assert (backing / "f").read_bytes() == b"head+tail"


def test_a_lookup_renews_a_closed_file_another_writer_changed(
    run: Callable[..., None], backing: Path
) -> None:
    """With the writeback cache the kernel ignores the size in the replies for a file it
    caches; a new generation (it then makes a new inode) is the only way to give it the
    target's. Not for our own writes, and not while the file is open through the mount (the
    kernel fails I/O on the inode it drops): then at the first lookup after the last close."""

    async def body(fs: Fs) -> None:
        fh, attr = await fs.create(ROOT, b"f")
        assert await fs.ops.write(fh, 0, b"x" * 100) == 100
        await fs.ops.flush(fh)
        await fs.ops.release(fh)
        first = await fs.lookup(ROOT, b"f")
        assert first.st_ino == attr.st_ino and first.generation == attr.generation

        reader = await fs.open(first.st_ino, os.O_RDONLY)
        os.truncate(backing / "f", 10)  # another writer
        assert (await fs.lookup(ROOT, b"f")).generation == first.generation  # open: kept
        await fs.ops.release(reader)
        renewed = await fs.lookup(ROOT, b"f")
        assert renewed.generation != first.generation and renewed.st_size == 10
        assert (await fs.lookup(ROOT, b"f")).generation == renewed.generation

        mtime = os.stat(backing / "f").st_mtime_ns
        os.utime(backing / "f", ns=(mtime, mtime + 10**9))  # same size, rewritten
        assert (await fs.lookup(ROOT, b"f")).generation != renewed.generation

    run(body, writeback_cache=True)


def test_open_flags_reach_the_backing_file(run: Callable[..., None], backing: Path) -> None:
    async def body(fs: Fs) -> None:
        nodeid = await fs.put(ROOT, b"f", b"old contents")
        fh = await fs.open(nodeid, os.O_WRONLY | os.O_TRUNC)
        assert (backing / "f").stat().st_size == 0
        await fs.ops.write(fh, 0, b"new")
        await fs.ops.release(fh)
        appender = await fs.open(nodeid, os.O_WRONLY | os.O_APPEND)
        await fs.ops.write(appender, 0, b"+tail")  # O_APPEND: the offset is ignored
        await fs.ops.release(appender)
        reader = await fs.open(nodeid, os.O_RDONLY)
        await fails(errno.EBADF, fs.ops.write(reader, 0, b"x"))  # the backing fd is read-only

    run(body)
    assert (backing / "f").read_bytes() == b"new+tail"


def test_create_exclusive_and_existing_names(run: Callable[..., None], backing: Path) -> None:
    async def body(fs: Fs) -> None:
        await fs.put(ROOT, b"f", b"keep")
        await fails(errno.EEXIST, fs.create(ROOT, b"f", flags=os.O_RDWR | os.O_EXCL))
        await fails(errno.EEXIST, fs.mkdir(ROOT, b"f"))

    run(body)
    assert (backing / "f").read_bytes() == b"keep"


@needs_root
def test_create_over_a_name_that_appeared_behind_our_back(
    run: Callable[..., None], backing: Path
) -> None:
    """The kernel sends CREATE after its lookup missed; another NFS client may have made the
    name in between. With calls made as the caller, the target's own permission check refuses
    the caller as it would without the mount; with calls made as the daemon, opening that file
    would skip the kernel's permission check and give it to the caller: the answer must be
    ESTALE (the kernel then looks up again and opens the existing file with the normal
    checks). Either way the file stays untouched."""
    victim = backing / "victim"
    victim.write_bytes(b"root's secret")
    victim.chmod(0o600)

    async def as_caller(fs: Fs) -> None:
        await fails(errno.EACCES, fs.create(ROOT, b"victim", 0o666, os.O_WRONLY, ctx(65534)))

    async def as_daemon(fs: Fs) -> None:
        await fails(errno.ESTALE, fs.create(ROOT, b"victim", 0o666, os.O_WRONLY, ctx(65534)))

    run(as_caller)
    run(as_daemon, credentials="daemon")
    st = victim.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o600)
    assert victim.read_bytes() == b"root's secret"


def test_create_over_a_symlink_or_fifo_that_appeared_is_the_kernels(
    run: Callable[..., None], backing: Path, tmp_path: Path
) -> None:
    """Without O_EXCL a create must not follow a symlink another client made (the kernel
    follows it, relative to the mount, after ESTALE) nor open a FIFO as a file."""
    outside = tmp_path / "outside"
    (backing / "link").symlink_to(outside)
    os.mkfifo(backing / "fifo")

    async def body(fs: Fs) -> None:
        await fails(errno.ESTALE, fs.create(ROOT, b"link", 0o644, os.O_WRONLY, ctx()))
        await fails(
            errno.ELOOP, fs.create(ROOT, b"link", 0o644, os.O_WRONLY | os.O_NOFOLLOW, ctx())
        )
        await fails(errno.ESTALE, fs.create(ROOT, b"fifo", 0o644, os.O_WRONLY, ctx()))

    run(body)
    assert not outside.exists()


@needs_root
def test_new_objects_belong_to_the_caller(run: Callable[..., None], backing: Path) -> None:
    who = ctx(1234, 5678)
    backing.chmod(0o1777)  # where the caller may create

    async def body(fs: Fs) -> None:
        fh, _ = await fs.create(ROOT, b"file", 0o4755, who=who)  # chown must not drop setuid
        await fs.ops.release(fh)
        await fs.mkdir(ROOT, b"dir", 0o750, who=who)  # the kernel strips S_ISGID from mkdir
        await fs.ops.symlink(ROOT, b"link", b"file", who)
        await fs.ops.mknod(ROOT, b"fifo", stat.S_IFIFO | 0o640, 0, who)

    run(body)
    for name, mode in (("file", 0o4755), ("dir", 0o750), ("fifo", 0o640)):
        st = (backing / name).lstat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1234, 5678, mode), name
    st = (backing / "link").lstat()
    assert (st.st_uid, st.st_gid) == (1234, 5678)
    assert os.readlink(backing / "link") == "file"


@needs_root
def test_setgid_directory_passes_its_group_on(run: Callable[..., None], backing: Path) -> None:
    shared = backing / "shared"
    shared.mkdir()
    os.chown(shared, 0, 4321)
    shared.chmod(0o2777)

    async def body(fs: Fs) -> None:
        parent = await fs.resolve("shared")
        fh, _ = await fs.create(parent, b"f", who=ctx(1234, 5678))
        await fs.ops.release(fh)
        await fs.mkdir(parent, b"d", who=ctx(1234, 5678))

    run(body)
    assert (shared / "f").stat().st_gid == 4321
    assert (shared / "d").stat().st_gid == 4321
    assert (shared / "d").stat().st_mode & stat.S_ISGID


def test_target_refusing_chown_still_creates(
    run: Callable[..., None], backing: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A daemon that runs calls as itself (``credentials=daemon``) gives new objects to their
    callers with chown. An NFS export with root_squash refuses that chown: create must behave
    like mkdir does then, keeping what the target made instead of failing after the file
    already exists."""

    def refuse(fd: int, uid: int, gid: int) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(_libc, "fchown_empty", refuse)

    async def body(fs: Fs) -> None:
        fh, _ = await fs.create(ROOT, b"file", 0o600, who=ctx(1234, 5678))
        assert await fs.ops.write(fh, 0, b"data") == 4
        await fs.ops.release(fh)
        await fs.mkdir(ROOT, b"dir", who=ctx(1234, 5678))

    run(body, credentials="daemon")
    assert (backing / "file").read_bytes() == b"data"
    assert (backing / "dir").is_dir()


# --- namespace ---------------------------------------------------------------------------------
def test_cached_stat_is_lstat_on_a_local_file_system(backing: Path) -> None:
    """_libc.stat_cached answers what lstat does wherever the kernel has nothing to fetch."""
    (backing / "f").write_bytes(b"12345")
    (backing / "link").symlink_to("f")
    os.mkfifo(backing / "fifo")
    fd = os.open(backing, os.O_PATH)
    try:
        for name in (b"", b"f", b"link", b"fifo"):
            got = _libc.stat_cached(fd, name)
            want = os.stat(name, dir_fd=fd, follow_symlinks=False) if name else os.fstat(fd)
            assert tuple(got) == tuple(want)
            for extra in ("st_atime_ns", "st_mtime_ns", "st_ctime_ns", "st_mtime", "st_blocks"):
                assert getattr(got, extra) == getattr(want, extra)
        with pytest.raises(FileNotFoundError):
            _libc.stat_cached(fd, b"missing")
    finally:
        os.close(fd)


def test_a_changed_directory_is_asked_for_once_per_attr_timeout(run: Callable[..., None]) -> None:
    """After each create in a directory the kernel asks for its attributes again: answered
    from what the change itself left in the target client's cache, within a window that a
    fresh stat opened, so what the kernel shows is never older than attr_timeout."""

    async def body(fs: Fs) -> None:
        d = await fs.mkdir(ROOT, b"d")
        stats = fs.calls["getattr"]
        await fs.ops.getattr(d, ctx())  # fresh: opens the window
        for name in (b"a", b"b"):
            await fs.put(d, name, b"x")
            assert (await fs.ops.getattr(d, ctx())).st_mtime_ns == os.stat(
                fs.backing / "d"
            ).st_mtime_ns
        assert fs.calls["getattr"] == stats + 1
        await trio.sleep(0.25)
        await fs.put(d, b"c", b"x")
        await fs.ops.getattr(d, ctx())  # the window ended: asked again
        assert fs.calls["getattr"] == stats + 2

    run(body, attr_timeout=0.2)


def test_lookup_getattr_and_errno_mapping(run: Callable[..., None], backing: Path) -> None:
    (backing / "dir").mkdir()
    (backing / "dir" / "child").write_text("x")
    (backing / "file").write_text("x")

    async def body(fs: Fs) -> None:
        await fails(errno.ENOENT, fs.lookup(ROOT, b"missing"))
        await fails(errno.ENOTDIR, fs.lookup(await fs.resolve("file"), b"x"))
        await fails(errno.ESTALE, fs.ops.getattr(987654321, ctx()))  # a node id we never gave
        await fails(errno.ESTALE, fs.lookup(987654321, b"x"))
        await fails(errno.EBADF, fs.ops.read(424242, 0, 1))  # a handle we never gave
        await fails(errno.ENOTEMPTY, fs.ops.rmdir(ROOT, b"dir", ctx()))
        await fails(errno.EISDIR, fs.ops.unlink(ROOT, b"dir", ctx()))
        await fails(errno.ENOENT, fs.ops.unlink(ROOT, b"missing", ctx()))
        await fails(errno.EPERM, fs.ops.link(await fs.resolve("dir"), ROOT, b"dirlink", ctx()))
        attr = await fs.lookup(ROOT, b"file")
        assert attr.st_ino == (backing / "file").stat().st_ino  # stat shows what the target has

    run(body)


def test_forgotten_inode_is_stale_and_its_descriptor_closed(run: Callable[..., None]) -> None:
    async def body(fs: Fs) -> None:
        await fs.put(ROOT, b"f", b"x")  # create: one kernel reference
        nodeid = (await fs.lookup(ROOT, b"f")).st_ino  # lookup: two
        with trio.fail_after(10):  # the release-time fsync of that byte
            while fs.mount.ledger.unsynced:
                await trio.sleep(0.01)
        baseline = fd_count()
        await fs.ops.forget([(nodeid, 1)])
        assert (await fs.ops.getattr(nodeid, ctx())).st_size == 1  # still referenced once
        assert fd_count() == baseline
        await fs.ops.forget([(nodeid, 1)])
        await fails(errno.ESTALE, fs.ops.getattr(nodeid, ctx()))
        assert fd_count() == baseline - 1

    run(body)


def test_rename_plain_noreplace_exchange(run: Callable[..., None], backing: Path) -> None:
    async def body(fs: Fs) -> None:
        a = await fs.put(ROOT, b"a", b"AAAA")
        await fs.put(ROOT, b"b", b"BB")
        sub = await fs.mkdir(ROOT, b"sub")
        c = ctx()
        await fails(
            errno.EEXIST, fs.ops.rename(ROOT, b"a", ROOT, b"b", pyfuse3.RENAME_NOREPLACE, c)
        )
        await fs.ops.rename(ROOT, b"a", ROOT, b"b", pyfuse3.RENAME_EXCHANGE, c)
        assert (backing / "a").read_bytes() == b"BB" and (backing / "b").read_bytes() == b"AAAA"
        await fails(
            errno.ENOENT, fs.ops.rename(ROOT, b"a", ROOT, b"none", pyfuse3.RENAME_EXCHANGE, c)
        )
        await fs.ops.rename(ROOT, b"b", sub, b"moved", pyfuse3.RENAME_NOREPLACE, c)
        await fs.ops.rename(ROOT, b"a", sub, b"moved", 0, c)  # replaces
        # The replaced file (nobody had it open) is gone: the daemon let go of it, so that its
        # space is free at once and NFS does not keep it as a .nfsXXXXXXXX.
        await fails(errno.ENOENT, fs.read_all(a))
        await fails(errno.EINVAL, fs.ops.rename(ROOT, b"sub", sub, b"inside", 0, c))

    run(body)
    assert sorted(os.listdir(backing)) == ["sub"]
    assert (backing / "sub" / "moved").read_bytes() == b"BB"


def test_a_renamed_file_keeps_its_node(run: Callable[..., None], backing: Path) -> None:
    """Inodes hold the object, not the path: an open or a later getattr follows a rename."""

    async def body(fs: Fs) -> None:
        nodeid = await fs.put(ROOT, b"old", b"payload")
        d = await fs.mkdir(ROOT, b"d")
        await fs.ops.rename(ROOT, b"old", d, b"new", 0, ctx())
        assert await fs.read_all(nodeid) == b"payload"
        assert (await fs.lookup(d, b"new")).st_ino == nodeid

    run(body)


def test_hard_links_share_a_node(run: Callable[..., None], backing: Path) -> None:
    async def body(fs: Fs) -> None:
        nodeid = await fs.put(ROOT, b"one", b"shared")
        d = await fs.mkdir(ROOT, b"d")
        attr = await fs.ops.link(nodeid, d, b"two", ctx())
        assert attr.st_ino == nodeid and attr.st_nlink == 2
        assert (await fs.lookup(d, b"two")).st_ino == nodeid
        await fs.ops.unlink(ROOT, b"one", ctx())
        assert (await fs.ops.getattr(nodeid, ctx())).st_nlink == 1
        assert await fs.read_all(nodeid) == b"shared"
        await fails(errno.EEXIST, fs.ops.link(nodeid, d, b"two", ctx()))

    run(body)
    assert (backing / "d" / "two").read_bytes() == b"shared"


def test_symlink_readlink_and_special_files(run: Callable[..., None], backing: Path) -> None:
    async def body(fs: Fs) -> None:
        attr = await fs.ops.symlink(ROOT, b"link", b"../some/where", ctx())
        assert stat.S_ISLNK(attr.st_mode)
        assert await fs.ops.readlink(attr.st_ino, ctx()) == b"../some/where"
        dangling = await fs.lookup(ROOT, b"link")  # a dangling link is looked up, not followed
        assert dangling.st_ino == attr.st_ino
        fifo = await fs.ops.mknod(ROOT, b"fifo", stat.S_IFIFO | 0o600, 0, ctx())
        assert stat.S_ISFIFO(fifo.st_mode)
        if IS_ROOT:
            dev = await fs.ops.mknod(ROOT, b"null", stat.S_IFCHR | 0o666, os.makedev(1, 3), ctx())
            assert stat.S_ISCHR(dev.st_mode) and dev.st_rdev == os.makedev(1, 3)

    run(body)
    assert os.readlink(backing / "link") == "../some/where"
    assert stat.S_ISFIFO((backing / "fifo").lstat().st_mode)


def test_setattr_mode_owner_size_times(run: Callable[..., None], backing: Path) -> None:
    async def body(fs: Fs) -> None:
        nodeid = await fs.put(ROOT, b"f", b"0123456789")
        attr = pyfuse3.EntryAttributes()
        attr.st_mode = stat.S_IFREG | 0o604
        attr.st_size = 4
        new = await fs.ops.setattr(nodeid, attr, fields(mode=True, size=True), None, ctx())
        assert (stat.S_IMODE(new.st_mode), new.st_size) == (0o604, 4)
        fh = await fs.open(nodeid, os.O_WRONLY)
        attr.st_size = 2  # ftruncate(): the kernel passes the handle
        assert (await fs.ops.setattr(nodeid, attr, fields(size=True), fh, ctx())).st_size == 2
        if IS_ROOT:
            attr.st_uid, attr.st_gid = 1234, 5678
            await fs.ops.setattr(nodeid, attr, fields(uid=True, gid=True), None, ctx())
            link = await fs.ops.symlink(ROOT, b"link", b"f", ctx())
            attr.st_uid, attr.st_gid = 4321, 8765  # chown -h: the link itself, not its target
            await fs.ops.setattr(link.st_ino, attr, fields(uid=True, gid=True), None, ctx())
        attr.st_atime_ns = 1_000_000_123
        attr.st_mtime_ns = 2_000_000_456
        new = await fs.ops.setattr(nodeid, attr, fields(atime=True, mtime=True), None, ctx())
        assert (new.st_atime_ns, new.st_mtime_ns) == (1_000_000_123, 2_000_000_456)
        attr.st_mtime_ns = 3_000_000_789  # touch -m: atime stays
        new = await fs.ops.setattr(nodeid, attr, fields(mtime=True), None, ctx())
        assert (new.st_atime_ns, new.st_mtime_ns) == (1_000_000_123, 3_000_000_789)

    run(body)
    st = (backing / "f").stat()
    assert (stat.S_IMODE(st.st_mode), st.st_size) == (0o604, 2)
    assert (st.st_atime_ns, st.st_mtime_ns) == (1_000_000_123, 3_000_000_789)
    if IS_ROOT:
        assert (st.st_uid, st.st_gid) == (1234, 5678)
        lst = (backing / "link").lstat()
        assert (lst.st_uid, lst.st_gid) == (4321, 8765)


def test_the_kernels_own_times_stay_in_the_kernel(run: Callable[..., None], backing: Path) -> None:
    """With the writeback cache the kernel stamps mtime and ctime itself and sends them on
    close, fsync and rename: on NFS a GETATTR and a SETATTR each, for times the target keeps
    itself. Only times an application sets reach the target."""

    async def body(fs: Fs) -> None:
        fh, attr = await fs.create(ROOT, b"f")
        nodeid = attr.st_ino
        await fs.ops.write(fh, 0, b"data")
        target_mtime = (backing / "f").stat().st_mtime_ns
        times = pyfuse3.EntryAttributes()
        times.st_mtime_ns = target_mtime - 7_000  # the kernel's own stamp of the write
        setattrs = fs.calls["setattr"]
        # On close: the kernel's write-back of its times carries the handle.
        await fs.ops.setattr(nodeid, times, fields(mtime=True, ctime=True), fh, ctx())
        await fs.ops.release(fh)
        # On rename: the same mtime again, with a new ctime, without a handle.
        await fs.ops.setattr(nodeid, times, fields(mtime=True, ctime=True), None, ctx())
        await fs.ops.setattr(nodeid, times, fields(ctime=True), None, ctx())
        assert fs.calls["setattr"] == setattrs
        assert (backing / "f").stat().st_mtime_ns == target_mtime
        # touch -m -d: an application's mtime reaches the target, even the kernel's old one.
        for mtime in (1_000_000_000, target_mtime - 7_000):
            times.st_mtime_ns = mtime
            await fs.ops.setattr(nodeid, times, fields(mtime=True, ctime=True), None, ctx())
            assert (backing / "f").stat().st_mtime_ns == mtime
        times.st_atime_ns = times.st_mtime_ns = 2_000_000_000  # touch, utimes: both times
        fh = await fs.open(nodeid)
        await fs.ops.setattr(nodeid, times, fields(atime=True, mtime=True, ctime=True), fh, ctx())
        await fs.ops.release(fh)
        assert fs.calls["setattr"] == setattrs + 3
        assert (backing / "f").stat().st_mtime_ns == 2_000_000_000

    run(body, writeback_cache=True)


def test_without_the_writeback_cache_every_time_reaches_the_target(
    run: Callable[..., None], backing: Path
) -> None:
    async def body(fs: Fs) -> None:
        fh, attr = await fs.create(ROOT, b"f")
        times = pyfuse3.EntryAttributes()
        times.st_mtime_ns = 3_000_000_000
        await fs.ops.setattr(attr.st_ino, times, fields(mtime=True, ctime=True), fh, ctx())
        await fs.ops.release(fh)

    run(body)
    assert (backing / "f").stat().st_mtime_ns == 3_000_000_000


def test_truncate_to_zero_and_unlink_free_the_window(run: Callable[..., None]) -> None:
    """Data that no longer needs an fsync must leave the un-synced window, or writers stall."""

    async def body(fs: Fs) -> None:
        ledger = fs.mount.ledger
        fh, _ = await fs.create(ROOT, b"gone")
        await fs.ops.write(fh, 0, b"x" * 100_000)
        fh2, attr2 = await fs.create(ROOT, b"cut")
        await fs.ops.write(fh2, 0, b"y" * 50_000)
        fh3, attr3 = await fs.create(ROOT, b"linked")
        await fs.ops.write(fh3, 0, b"z" * 10_000)
        await fs.ops.link(attr3.st_ino, ROOT, b"linked2", ctx())
        assert ledger.unsynced == 160_000
        await fs.ops.unlink(ROOT, b"gone", ctx())
        assert ledger.unsynced == 60_000
        empty = pyfuse3.EntryAttributes()
        empty.st_size = 0
        await fs.ops.setattr(attr2.st_ino, empty, fields(size=True), fh2, ctx())
        assert ledger.unsynced == 10_000
        await fs.ops.unlink(ROOT, b"linked", ctx())  # another name remains: still owed an fsync
        assert ledger.unsynced == 10_000
        await fs.ops.fsync(fh3, True)
        assert ledger.unsynced == 0

    run(body)


def test_fsync_reaches_the_backing_file(run: Callable[..., None]) -> None:
    async def body(fs: Fs) -> None:
        fh, _ = await fs.create(ROOT, b"f")
        await fs.ops.write(fh, 0, b"x" * 4096)
        before = fs.calls["fsync"]
        await fs.ops.fsync(fh, False)
        await fs.ops.fsync(fh, True)
        assert fs.calls["fsync"] == before + 2
        d = await fs.ops.opendir(ROOT, ctx())
        await fs.ops.fsyncdir(d, False)
        assert fs.calls["fsync"] == before + 3
        await fs.ops.releasedir(d)

    run(body)


def test_release_with_unsynced_data_gets_it_synced(run: Callable[..., None]) -> None:
    async def body(fs: Fs) -> None:
        fh, _ = await fs.create(ROOT, b"f")
        await fs.ops.write(fh, 0, b"x" * 4096)
        await fs.ops.release(fh)
        with trio.fail_after(10):
            while fs.mount.ledger.unsynced:
                await trio.sleep(0.01)
        assert fs.calls["fsync"] >= 1

    run(body)


def test_a_release_sync_goes_through_the_handles_descriptor(
    run: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On NFS a second open of the file for the sync is an OPEN and a CLOSE (or an
    OPEN_DOWNGRADE) on the wire: the released handle's own descriptor syncs it, then closes."""
    from fusethrottle.target import syncs

    reopened: list[int] = []
    plain = syncs.proc_path
    monkeypatch.setattr(syncs, "proc_path", lambda fd: reopened.append(fd) or plain(fd))

    async def body(fs: Fs) -> None:
        for name, size in ((b"small", 4096), (b"large", 3 << 20)):  # a group sync, a single one
            fh, _ = await fs.create(ROOT, name)
            await fs.ops.write(fh, 0, b"x" * size)
            reopened.clear()
            syncs = fs.calls["fsync"]
            await fs.ops.release(fh)
            with trio.fail_after(10):
                while fs.mount.ledger.unsynced:
                    await trio.sleep(0.01)
            assert fs.calls["fsync"] == syncs + 1
            assert reopened == []

    run(body)


def test_an_unlink_right_after_release_takes_back_the_held_descriptor(
    run: Callable[..., None], backing: Path
) -> None:
    """A released small file waits in the group sync with its handle's descriptor; removing
    its last name before that sync ran must close it first (on NFS an open descriptor turns
    the removal into a .nfsXXXX silly rename, and the space stays allocated)."""

    def held() -> list[str]:
        links = []
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                links.append(os.readlink(f"/proc/self/fd/{fd}"))
        return [link for link in links if link.startswith(str(backing / "gone"))]

    async def body(fs: Fs) -> None:
        fh, _attr = await fs.create(ROOT, b"gone")
        await fs.ops.write(fh, 0, b"x" * 4096)
        await fs.ops.release(fh)  # queued for the group sync (it gathers for 20 ms)
        await fs.ops.unlink(ROOT, b"gone", ctx())
        assert held() == []
        with trio.fail_after(10):
            while fs.mount.ledger.unsynced:
                await trio.sleep(0.01)
        assert held() == []

    run(body)
    assert os.listdir(backing) == []


# --- xattrs -----------------------------------------------------------------------------------
def test_xattrs(run: Callable[..., None], backing: Path) -> None:
    async def body(fs: Fs) -> None:
        nodeid = await fs.put(ROOT, b"f", b"")
        await fs.ops.setxattr(nodeid, b"user.colour", b"blue", ctx())
        await fs.ops.setxattr(nodeid, b"user.empty", b"", ctx())
        assert await fs.ops.getxattr(nodeid, b"user.colour", ctx()) == b"blue"
        assert await fs.ops.getxattr(nodeid, b"user.empty", ctx()) == b""
        assert sorted(await fs.ops.listxattr(nodeid, ctx())) == [b"user.colour", b"user.empty"]
        await fs.ops.removexattr(nodeid, b"user.empty", ctx())
        await fails(errno.ENODATA, fs.ops.getxattr(nodeid, b"user.empty", ctx()))
        await fails(errno.ENODATA, fs.ops.removexattr(nodeid, b"user.none", ctx()))
        link = await fs.ops.symlink(ROOT, b"link", b"f", ctx())
        assert await fs.ops.listxattr(link.st_ino, ctx()) == []  # never the target's

    run(body)
    assert os.getxattr(backing / "f", "user.colour") == b"blue"


def test_capability_probe_is_answered_without_asking_the_target(run: Callable[..., None]) -> None:
    """The kernel asks for security.capability before every write(); one answer is cached."""

    async def body(fs: Fs) -> None:
        created = await fs.put(ROOT, b"new", b"")
        (fs.backing / "f").touch()  # made on the target by someone else
        nodeid = (await fs.ops.lookup(ROOT, b"f", ctx())).st_ino
        asked: list[bytes] = []
        real = fs.mount.backend.getxattr_listed

        async def counting(
            caller: Any, path_fd: int, name: bytes
        ) -> tuple[bytes | None, list[bytes]]:
            asked.append(name)
            return await real(caller, path_fd, name)

        fs.mount.backend.getxattr_listed = counting  # type: ignore[method-assign]
        # A file this mount just created has no capability: the target is never asked.
        await fails(errno.ENODATA, fs.ops.getxattr(created, b"security.capability", ctx()))
        assert asked == []
        for _ in range(5):
            await fails(errno.ENODATA, fs.ops.getxattr(nodeid, b"security.capability", ctx()))
        assert len(asked) == 1
        await fs.ops.setxattr(nodeid, b"user.x", b"1", ctx())  # any change drops the cache
        await fails(errno.ENODATA, fs.ops.getxattr(nodeid, b"security.capability", ctx()))
        assert len(asked) == 2

    run(body)


def test_absent_xattrs_are_answered_from_one_listing(
    run: Callable[..., None], backing: Path
) -> None:
    """ls -l asks every file for an ACL and a security label: one trip to the target answers
    both, a present name still returns its value, and a change through the mount is seen."""
    (backing / "f").touch()
    os.setxattr(backing / "f", "user.colour", b"blue")

    async def body(fs: Fs) -> None:
        nodeid = (await fs.ops.lookup(ROOT, b"f", ctx())).st_ino
        before = fs.calls["getxattr"]
        await fails(errno.ENODATA, fs.ops.getxattr(nodeid, b"security.selinux", ctx()))
        await fails(errno.ENODATA, fs.ops.getxattr(nodeid, b"system.posix_acl_access", ctx()))
        assert fs.calls["getxattr"] == before + 1
        assert await fs.ops.getxattr(nodeid, b"user.colour", ctx()) == b"blue"
        await fs.ops.setxattr(nodeid, b"user.size", b"L", ctx())
        assert await fs.ops.getxattr(nodeid, b"user.size", ctx()) == b"L"

    run(body)


# --- directories ------------------------------------------------------------------------------
def test_readdir_across_many_small_buffers(run: Callable[..., None], backing: Path) -> None:
    names = {f"file-{i:04d}" for i in range(300)}
    for name in names:
        (backing / name).touch()
    (backing / "sub").mkdir()

    async def body(fs: Fs) -> None:
        baseline = len(fs.mount.inodes)
        entries = await fs.listdir(ROOT, room=7)
        listed = [e.name.decode() for e in entries]
        assert sorted(listed) == sorted([".", "..", "sub", *names])  # each exactly once
        by_name = {e.name: e.nodeid for e in entries}
        assert by_name[b"."] == ROOT
        for name in (b"file-0000", b"sub"):
            assert by_name[name] == (backing / name.decode()).stat().st_ino
        # readdirplus: the kernel now holds one reference per entry but "." and "..".
        assert len(fs.mount.inodes) == baseline + len(names) + 1
        await fs.ops.forget([(by_name[n], 1) for n in by_name if n not in (b".", b"..")])
        assert len(fs.mount.inodes) == baseline

    run(body)


def test_readdir_skips_entries_removed_while_listing(
    run: Callable[..., None], backing: Path
) -> None:
    for i in range(20):
        (backing / f"f{i:02d}").touch()

    async def body(fs: Fs) -> None:
        fh = await fs.ops.opendir(ROOT, ctx())
        first = Token(5)
        await fs.ops.readdir(fh, 0, first)
        (backing / "f10").unlink()  # another client removes an entry mid-listing
        seen = [e.name for e in first.entries]
        start = first.entries[-1].next_id
        while True:
            token = Token(5)
            await fs.ops.readdir(fh, start, token)
            if not token.entries:
                break
            seen += [e.name for e in token.entries]
            start = token.entries[-1].next_id
        await fs.ops.releasedir(fh)
        assert b"f10" not in seen and len(seen) == len(set(seen)) == 2 + 19

    run(body)


def test_statfs_reports_the_backing_filesystem(run: Callable[..., None], backing: Path) -> None:
    async def body(fs: Fs) -> None:
        out = await fs.ops.statfs(ctx())
        native = os.statvfs(backing)
        assert out.f_namemax == native.f_namemax
        assert (out.f_bsize, out.f_frsize, out.f_blocks) == (
            native.f_bsize,
            native.f_frsize,
            native.f_blocks,
        )

    run(body)


# --- paths beyond PATH_MAX --------------------------------------------------------------------
def test_deep_tree_beyond_path_max(run: Callable[..., None], backing: Path) -> None:
    component = "d" * 200
    depth = 30  # 30 * 201 bytes: well past PATH_MAX (4096) once the backing root is prefixed

    async def body(fs: Fs) -> None:
        nodeid = ROOT
        for _ in range(depth):
            nodeid = await fs.mkdir(nodeid, component.encode())
        leaf = await fs.put(nodeid, b"leaf", b"deep data")
        await fs.ops.rename(nodeid, b"leaf", nodeid, b"renamed", 0, ctx())
        await fs.ops.link(leaf, nodeid, b"hardlink", ctx())
        await fs.ops.symlink(nodeid, b"symlink", b"renamed", ctx())
        listed = sorted(e.name for e in await fs.listdir(nodeid))
        assert listed == [b".", b"..", b"hardlink", b"renamed", b"symlink"]
        assert await fs.read_all(leaf) == b"deep data"
        await fs.ops.setxattr(leaf, b"user.deep", b"yes", ctx())

    run(body)
    with pytest.raises(OSError) as info:
        os.stat(backing.joinpath(*[component] * depth, "renamed"))
    assert info.value.errno == errno.ENAMETOOLONG  # so nothing path-based could have done this
    fd = os.open(backing, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            next_fd = os.open(component, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = next_fd
        leaf_fd = os.open("renamed", os.O_RDONLY, dir_fd=fd)
        try:
            assert os.read(leaf_fd, 100) == b"deep data"
            assert os.fstat(leaf_fd).st_nlink == 2
        finally:
            os.close(leaf_fd)
    finally:
        os.close(fd)


# --- errors that are not the target's ---------------------------------------------------------
def test_unexpected_exception_becomes_eio_and_the_next_request_works(
    run: Callable[..., None], caplog: pytest.LogCaptureFixture
) -> None:
    async def body(fs: Fs) -> None:
        nodeid = await fs.put(ROOT, b"f", b"x")
        real_stat = fs.mount.backend.stat

        async def broken(path_fd: int) -> os.stat_result:
            raise RuntimeError("a bug in our own code")

        fs.mount.backend.stat = broken  # type: ignore[method-assign]
        await fails(errno.EIO, fs.ops.getattr(nodeid, ctx()))
        fs.mount.backend.stat = real_stat  # type: ignore[method-assign]
        assert (await fs.ops.getattr(nodeid, ctx())).st_size == 1

        async def broken_write(*args: Any) -> int:
            raise ZeroDivisionError

        fh = await fs.open(nodeid)
        real_pwrite = fs.mount.backend.pwrite
        fs.mount.backend.pwrite = broken_write  # type: ignore[method-assign]
        await fails(errno.EIO, fs.ops.write(fh, 0, b"y" * 1000))
        fs.mount.backend.pwrite = real_pwrite  # type: ignore[method-assign]
        assert fs.mount.ledger.reserved == 0  # the failed write gave its admission back
        assert await fs.ops.write(fh, 0, b"z") == 1

    run(body, expect_log=True)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 2  # logged once each, with the operation named
    assert "getattr" in errors[0].getMessage() and "write" in errors[1].getMessage()
    assert b"y" * 20 not in errors[1].getMessage().encode()  # never the user's data
    assert errors[0].exc_info is not None


def test_concurrent_renames_links_unlinks_leave_a_consistent_table(
    run: Callable[..., None], backing: Path
) -> None:
    """Whatever interleaving: every listed name looks up, and names of one file share a node."""
    names = [f"n{i}".encode() for i in range(6)]

    async def body(fs: Fs) -> None:
        dirs = [ROOT, await fs.mkdir(ROOT, b"a"), await fs.mkdir(ROOT, b"b")]
        for name in names[:3]:
            await fs.put(ROOT, name, name)

        async def churn(seed: int) -> None:
            rng = random.Random(seed)
            c = ctx()
            for _ in range(150):
                op = rng.choice(("rename", "link", "unlink", "lookup", "create"))
                src, dst = rng.choice(dirs), rng.choice(dirs)
                a, b = rng.choice(names), rng.choice(names)
                try:
                    if op == "rename":
                        await fs.ops.rename(src, a, dst, b, rng.choice((0, 1, 2)), c)
                    elif op == "link":
                        node = (await fs.lookup(src, a)).st_ino
                        await fs.ops.link(node, dst, b, c)
                    elif op == "unlink":
                        await fs.ops.unlink(src, a, c)
                    elif op == "lookup":
                        await fs.lookup(src, a)
                    else:
                        fh, _ = await fs.create(src, a, flags=os.O_WRONLY | os.O_EXCL)
                        await fs.ops.release(fh)
                except pyfuse3.FUSEError as err:
                    assert err.errno in (errno.ENOENT, errno.EEXIST), os.strerror(err.errno)

        async with trio.open_nursery() as nursery:
            for seed in range(4):
                nursery.start_soon(churn, seed)

        groups: dict[int, set[int]] = collections.defaultdict(set)
        for d in dirs:
            for entry in await fs.listdir(d):
                if entry.name in (b".", b".."):
                    continue
                attr = await fs.lookup(d, entry.name)
                assert attr.st_ino == entry.nodeid
                backing_ino = os.stat(entry.name, dir_fd=fs.mount.inodes[d].path_fd).st_ino
                groups[backing_ino].add(attr.st_ino)
                assert (await fs.ops.getattr(attr.st_ino, ctx())).st_nlink >= 1
        assert all(len(nodes) == 1 for nodes in groups.values())

    run(body)


# --- xattrs not offered (xattrs=off, or a target without them) --------------------------------
# A file capability as setcap writes it: revision 2, CAP_NET_RAW permitted.
_CAPABILITY_BLOB = struct.pack("<IIIII", 0x02000000, 1 << 13, 0, 0, 0)


def test_without_xattrs_the_kernel_is_told_once_and_capabilities_still_go_on_write(
    run: Callable[..., None], backing: Path
) -> None:
    """ENOSYS makes the kernel stop asking (no round trip per write); the daemon then removes
    a file capability on the first write itself, as the kernel would have."""
    (backing / "tool").write_bytes(b"#!")
    try:
        os.setxattr(backing / "tool", "security.capability", _CAPABILITY_BLOB)
    except OSError as err:
        pytest.skip(f"cannot set a file capability here: {err.strerror}")

    async def body(fs: Fs) -> None:
        nodeid = (await fs.lookup(ROOT, b"tool")).st_ino
        for call in (
            fs.ops.getxattr(nodeid, b"security.capability", ctx()),
            fs.ops.listxattr(nodeid, ctx()),
            fs.ops.setxattr(nodeid, b"user.x", b"1", ctx()),
            fs.ops.removexattr(nodeid, b"user.x", ctx()),
        ):
            await fails(errno.ENOSYS, call)
        reader = await fs.open(nodeid, os.O_RDONLY)
        await fs.ops.release(reader)
        assert os.getxattr(backing / "tool", "security.capability") == _CAPABILITY_BLOB
        writer = await fs.open(nodeid, os.O_WRONLY)
        await fs.ops.write(writer, 2, b"x")
        await fs.ops.release(writer)

    run(body, xattrs="off")
    with pytest.raises(OSError) as gone:
        os.getxattr(backing / "tool", "security.capability")
    assert gone.value.errno == errno.ENODATA
    assert (backing / "tool").read_bytes() == b"#!x"


def test_auto_offers_xattrs_when_the_target_has_them(
    run: Callable[..., None], backing: Path
) -> None:
    async def body(fs: Fs) -> None:
        nodeid = await fs.put(ROOT, b"f", b"")
        await fs.ops.setxattr(nodeid, b"user.colour", b"red", ctx())
        assert await fs.ops.getxattr(nodeid, b"user.colour", ctx()) == b"red"

    run(body, xattrs="auto")


# --- the write path's waits ------------------------------------------------------------------
def test_writes_of_one_file_queue_at_the_gate_not_behind_each_other(
    run: Callable[..., None],
) -> None:
    """The kernel's write-back sends several writes of one file at once. They go to the target
    one at a time, but each waits for room at the gate on its own: every one of them counts as
    waiting (the flusher reads that as pressure), and none waits for another's admission, so
    the k-th write waits at most one admission_timeout, not k of them."""

    async def body(fs: Fs) -> None:
        syncs_may_end = trio.Event()
        fsync_path = fs.mount.backend.fsync_path

        async def held_fsync(*args: Any, **kwargs: Any) -> None:
            await syncs_may_end.wait()  # the target commits nothing until the test says so
            await fsync_path(*args, **kwargs)

        fs.mount.backend.fsync_path = held_fsync  # type: ignore[method-assign]
        fh, _ = await fs.create(ROOT, b"big")
        chunk = b"x" * MiB
        async with trio.open_nursery() as nursery:
            await fs.ops.write(fh, 0, chunk)  # fills the 16 MiB window's target part
            for i in range(1, 16):
                await fs.ops.write(fh, i * MiB, chunk)
            for i in range(16, 20):
                nursery.start_soon(fs.ops.write, fh, i * MiB, chunk)
            with trio.fail_after(20):
                while fs.mount.budget.waiting < 4:
                    await trio.sleep(0.05)
            assert fs.mount.budget.waiting == 4
            syncs_may_end.set()
        assert os.fstat(fs.ops.files[fh].fd).st_size == 20 * MiB
        await fs.ops.release(fh)

    run(body, mode="static", window=16 * MiB, batch=16 * MiB, admission_timeout=600.0)
