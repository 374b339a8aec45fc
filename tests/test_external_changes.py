"""Another writer changes the target under a live mount (another host on the same export, an
operator in the source directory): files renamed, deleted, truncated, rewritten or replaced
directly in the backing directory while the mount has them cached or open.

A Hypothesis state machine interleaves operations through the mount with such changes and checks
what the mount shows against a model:

* once ``attr_timeout`` has passed, names, sizes and contents through the mount are the backing
  directory's, by name and through handles that are still open;
* before it has passed, a name shows its old file, its new one or ENOENT, never EIO and never a
  third file's data;
* a handle opened before its name was replaced or removed reads its own file (as POSIX gives an
  open descriptor), never another file's data;
* no call fails with EIO, the daemon logs no warning or error, holds no un-synced bytes once
  every handle is closed, and unmounts with exit code 0 (the fixture checks the last two).

Every file is written with a tag byte of its own, so "another file's data" is any byte that is
neither zero (holes, extending truncates) nor the file's tag.

With the writeback cache the kernel owns the size and pages of a file open through the mount
(close-to-open, as on NFS): it writes whole cached pages back over the other writer's bytes and
takes no size from the daemon while the file is open. So in those runs the other writer changes
files open for writing through the mount only by name (rename, unlink, replace); one open only
for reading may also change in place, and shows only its own bytes until its last close.
"""

from __future__ import annotations

import errno
import itertools
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    multiple,
    rule,
    run_state_machine_as_test,
)
from mount_util import Daemon

from fusethrottle.observability import status_client

pytestmark = pytest.mark.mount

NAMES = ["a", "b", "c", "d/a", "d/b"]
names = st.sampled_from(NAMES)
offsets = st.one_of(st.integers(0, 3000), st.integers(8000, 12_000))
lengths = st.integers(0, 3000)
sizes = st.one_of(st.integers(0, 3000), st.integers(5000, 9000))
#: Margin past attr_timeout before the mount must show the change. It covers the kernel's clock,
#: not the machine's load: the kernel stamps a cached name or attribute with an expiry of jiffies
#: at the reply + attr_timeout rounded up to a tick, and counts it expired once jiffies are past
#: that (up to two ticks late), jiffies trailing the monotonic clock by at most one more tick:
#: 30 ms at the coarsest Linux tick (HZ=100; 12 ms at Debian's HZ=250). The wait is counted from
#: a moment after the last reply the kernel cached old facts from (every call here returns
#: before the next is made, and a lookup made after the change is answered with the new facts),
#: so a loaded machine that runs the test late only lengthens the wait: it cannot flake.
MARGIN = 0.05
READ_ALL = 1 << 16
_tags = itertools.count()


@dataclass(eq=False)
class File:
    """One backing object (an inode), whatever names it has had."""

    tag: int
    data: bytearray = field(default_factory=bytearray)

    def write(self, offset: int, length: int) -> bytes:
        chunk = bytes([self.tag]) * length
        if length:
            if offset > len(self.data):
                self.data.extend(bytes(offset - len(self.data)))
            self.data[offset : offset + length] = chunk
        return chunk

    def truncate(self, size: int) -> None:
        del self.data[size:]
        self.data.extend(bytes(size - len(self.data)))

    def could_be(self, data: bytes) -> bool:
        """Whether *data* holds nothing but this file's bytes (and zeros)."""
        return not data.replace(bytes([self.tag]), b"").replace(b"\0", b"")


@dataclass(eq=False)
class Handle:
    fd: int
    file: File
    writable: bool = True


def new_file() -> File:
    return File(next(_tags) % 255 + 1)


def read_path(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


class ExternalWriters(RuleBasedStateMachine):
    """Rules named ``mount_*``/``handle_*`` go through the mount, ``other_*`` change the backing
    directory directly, as another writer would."""

    daemon: ClassVar[Daemon]
    attr_timeout: ClassVar[float]
    writeback_cache: ClassVar[bool]
    counter = itertools.count()
    handles = Bundle("handles")

    def __init__(self) -> None:
        super().__init__()
        n = next(self.counter)
        assert self.daemon.source is not None
        self.mnt = str(self.daemon.mountpoint / f"ex{n}")
        self.back = str(self.daemon.source / f"ex{n}")
        os.mkdir(self.mnt)
        os.mkdir(os.path.join(self.mnt, "d"))
        self.names: dict[str, File] = {}
        self.open: list[Handle] = []
        # Since the last settle: what each name changed behind the mount's back has shown
        # (None: absent), and the files changed in place behind its back.
        self.recent: dict[str, list[File | None]] = {}
        self.changed: set[File] = set()
        self.changed_at = 0.0
        self.pending = False  # something changed behind the mount's back since the last settle
        # Writeback cache: files changed in place behind the mount's back while open through it
        # (read-only). Until their last close the kernel keeps its own size and pages of them.
        self.kernels_own: set[File] = set()
        # The directory the model calls "d" is named this now (it moves between "d" and "e").
        self.dirname = "d"

    # --- helpers ------------------------------------------------------------------------------
    def path(self, name: str) -> str:
        """Where the model's *name* is now: "d/..." follows the directory when it moves."""
        if name == "d" or name.startswith("d/"):
            return self.dirname + name[1:]
        return name

    def m(self, name: str) -> str:
        return os.path.join(self.mnt, self.path(name))

    def b(self, name: str) -> str:
        return os.path.join(self.back, self.path(name))

    def is_open(self, file: File) -> bool:
        return any(h.file is file for h in self.open)

    def behind_the_back(self, *changed: str) -> None:
        """Note what *changed* names showed before another writer changes them."""
        for name in changed:
            self.recent.setdefault(name, []).append(self.names.get(name))
        self.changed_at = time.monotonic()
        self.pending = True

    def settle(self) -> None:
        """Wait until the kernel's cache of what changed behind the mount's back has expired,
        then the mount must show the backing directory exactly."""
        if self.pending:
            remaining = self.changed_at + self.attr_timeout + MARGIN - time.monotonic()
            if self.attr_timeout > 0 and remaining > 0:
                time.sleep(remaining)
        self.recent.clear()
        self.changed.clear()
        self.pending = False
        self.check_exact()

    def check_exact(self) -> None:
        for directory in ("", "d"):
            expected = {
                n.rpartition("/")[2] for n in self.names if n.rpartition("/")[0] == directory
            }
            if directory == "":
                expected.add(self.dirname)
            assert set(os.listdir(self.b(directory))) == expected, "model out of step"
            assert set(os.listdir(self.m(directory))) == expected
        inos = set()
        for name in NAMES:
            file = self.names.get(name)
            if file is None:
                with pytest.raises(FileNotFoundError):
                    os.stat(self.m(name))
                continue
            st_mount = os.stat(self.m(name))
            inos.add(st_mount.st_ino)
            # (Through the mount first: its close writes back what the kernel holds.)
            through_mount = read_path(self.m(name))
            assert read_path(self.b(name)) == file.data, f"model out of step: {name}"
            if file in self.kernels_own:
                assert file.could_be(through_mount), name
                continue
            assert st_mount.st_size == len(file.data), name
            assert through_mount == file.data, name
        assert len(inos) == len(self.names), "two names of different files share an inode"
        for handle in self.open:
            data = os.pread(handle.fd, READ_ALL, 0)
            if handle.file in self.kernels_own:
                assert handle.file.could_be(data)
                continue
            assert os.fstat(handle.fd).st_size == len(handle.file.data)
            assert data == handle.file.data

    # --- setup --------------------------------------------------------------------------------
    @initialize(
        target=handles,
        chosen=st.lists(st.tuples(names, lengths), min_size=1, max_size=4),
        kept=st.lists(st.tuples(st.integers(0, 4), st.booleans()), max_size=3),
    )
    def populate(self, chosen: list[tuple[str, int]], kept: list[tuple[int, bool]]) -> Any:
        """Some files, some of them open: most steps then change something that is cached."""
        for name, length in chosen:
            self.mount_create(name, 0, length)
        existing = sorted(self.names)
        opened = [self.mount_open(existing[i % len(existing)], rw) for i, rw in kept]
        return multiple(*opened)

    # --- through the mount --------------------------------------------------------------------
    @rule(name=names, offset=offsets, length=lengths)
    def mount_create(self, name: str, offset: int, length: int) -> None:
        """open(O_CREAT | O_TRUNC), write, close: a backup writing a file."""
        self.settle()
        file = self.names.get(name)
        if file in self.kernels_own:
            return  # see _in_place
        if file is None:
            file = self.names[name] = new_file()
        file.truncate(0)
        chunk = file.write(offset, length)
        fd = os.open(self.m(name), os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
        try:
            assert os.pwrite(fd, chunk, offset) == length
        finally:
            os.close(fd)

    @rule(name=names, offset=offsets, length=lengths)
    def mount_write(self, name: str, offset: int, length: int) -> None:
        self.settle()
        file = self.names.get(name)
        if file is None:
            with pytest.raises(FileNotFoundError):
                os.open(self.m(name), os.O_WRONLY)
            return
        if file in self.kernels_own:
            return  # see _in_place
        fd = os.open(self.m(name), os.O_WRONLY)
        try:
            assert os.pwrite(fd, file.write(offset, length), offset) == length
        finally:
            os.close(fd)

    @rule(name=names)
    def mount_read(self, name: str) -> None:
        """By name, without waiting: the old file, the new one or ENOENT."""
        seen = [*self.recent.get(name, []), self.names.get(name)]
        try:
            data = read_path(self.m(name))
        except FileNotFoundError:
            assert None in seen, f"{name} vanished"
            return
        candidates = [f for f in seen if f is not None]
        assert candidates, f"{name} should not exist"
        assert any(f.could_be(data) for f in candidates), f"{name} shows another file's data"
        current = self.names.get(name)
        if (
            not self.recent.get(name)
            and current is not None
            and current not in self.changed
            and current not in self.kernels_own
        ):
            assert data == current.data, name

    @rule(src=names, dst=names)
    def mount_rename(self, src: str, dst: str) -> None:
        self.settle()
        if src not in self.names:
            with pytest.raises(FileNotFoundError):
                os.rename(self.m(src), self.m(dst))
            return
        os.rename(self.m(src), self.m(dst))
        self.names[dst] = self.names.pop(src)

    @rule(name=names)
    def mount_unlink(self, name: str) -> None:
        self.settle()
        if name not in self.names:
            with pytest.raises(FileNotFoundError):
                os.unlink(self.m(name))
            return
        os.unlink(self.m(name))
        del self.names[name]

    @rule(target=handles, name=names, writable=st.booleans())
    def mount_open(self, name: str, writable: bool) -> Any:
        self.settle()
        file = self.names.get(name)
        flags = os.O_RDWR if writable else os.O_RDONLY
        if file is None:
            with pytest.raises(FileNotFoundError):
                os.open(self.m(name), flags)
            return multiple()
        if writable and file in self.kernels_own:
            return multiple()  # see _in_place
        handle = Handle(os.open(self.m(name), flags), file, writable)
        self.open.append(handle)
        return handle

    @rule(handle=handles, offset=offsets, length=lengths)
    def handle_write(self, handle: Handle, offset: int, length: int) -> None:
        if not handle.writable:
            with pytest.raises(OSError) as refused:
                os.pwrite(handle.fd, b"x", offset)
            assert refused.value.errno == errno.EBADF
            return
        if handle.file in self.changed:
            # Its size in the kernel may still be the one before the other writer's change.
            self.settle()
        assert os.pwrite(handle.fd, handle.file.write(offset, length), offset) == length

    @rule(handle=handles)
    def handle_read(self, handle: Handle) -> None:
        """An open file reads as itself whatever happened to its name."""
        data = os.pread(handle.fd, READ_ALL, 0)
        if handle.file in self.changed or handle.file in self.kernels_own:
            assert handle.file.could_be(data), "an open file shows another file's data"
        else:
            assert data == handle.file.data

    @rule(handle=handles, datasync=st.booleans())
    def handle_fsync(self, handle: Handle, datasync: bool) -> None:
        (os.fdatasync if datasync else os.fsync)(handle.fd)

    @rule(handle=consumes(handles))
    def handle_close(self, handle: Handle) -> None:
        os.close(handle.fd)
        self.open.remove(handle)
        if handle.file in self.kernels_own and not self.is_open(handle.file):
            # Closed: the next lookup shows the target's file, once the kernel's cached name
            # (attr_timeout) has expired and it asks.
            self.kernels_own.discard(handle.file)
            self.changed.add(handle.file)
            self.changed_at = time.monotonic()
            self.pending = True

    @rule()
    def mount_move_dir(self) -> None:
        self.settle()
        moved = "e" if self.dirname == "d" else "d"
        os.rename(os.path.join(self.mnt, self.dirname), os.path.join(self.mnt, moved))
        self.dirname = moved

    @rule()
    def mount_settle(self) -> None:
        self.settle()

    # --- the other writer -----------------------------------------------------------------------
    @rule(src=names, dst=names)
    def other_rename(self, src: str, dst: str) -> None:
        if src not in self.names or src == dst:
            return
        self.behind_the_back(src, dst)
        os.rename(self.b(src), self.b(dst))
        self.names[dst] = self.names.pop(src)

    @rule(name=names)
    def other_unlink(self, name: str) -> None:
        if name not in self.names:
            return
        self.behind_the_back(name)
        os.unlink(self.b(name))
        del self.names[name]

    def _in_place(self, name: str) -> File | None:
        """The file the other writer changes in place, if the model can follow it.

        With the writeback cache the kernel keeps the size and pages of a file open through
        the mount: pages written through it go back whole over the other writer's bytes, so
        files open for writing are left alone (see the module docstring), and one open only for
        reading shows the kernel's copy until it is closed and must not be opened for writing
        meanwhile."""
        file = self.names.get(name)
        if file is None:
            return None
        if self.writeback_cache and self.is_open(file):
            if any(h.writable for h in self.open if h.file is file):
                return None
            self.kernels_own.add(file)
        self.behind_the_back(name)
        self.changed.add(file)
        return file

    @rule(name=names, size=sizes)
    def other_truncate(self, name: str, size: int) -> None:
        file = self._in_place(name)
        if file is not None:
            os.truncate(self.b(name), size)
            file.truncate(size)

    @rule(name=names, offset=offsets, length=lengths)
    def other_write(self, name: str, offset: int, length: int) -> None:
        file = self._in_place(name)
        if file is not None:
            fd = os.open(self.b(name), os.O_WRONLY)
            try:
                os.pwrite(fd, file.write(offset, length), offset)
            finally:
                os.close(fd)

    @rule(handle=handles, size=sizes)
    def other_truncate_open(self, handle: Handle, size: int) -> None:
        """Truncate a file the mount has open, by whatever name it has now."""
        name = next((n for n, f in self.names.items() if f is handle.file), None)
        if name is not None:
            self.other_truncate(name, size)

    @rule(handle=handles, offset=offsets, length=lengths)
    def other_write_open(self, handle: Handle, offset: int, length: int) -> None:
        """Write into a file the mount has open, by whatever name it has now."""
        name = next((n for n, f in self.names.items() if f is handle.file), None)
        if name is not None:
            self.other_write(name, offset, length)

    @rule(name=names, length=lengths)
    def other_replace(self, name: str, length: int) -> None:
        """Write a new file aside and rename it over the name (what rsync does)."""
        self.behind_the_back(name)
        file = new_file()
        directory, _, base = name.rpartition("/")
        aside = self.b(os.path.join(directory, f".{base}.new"))
        Path(aside).write_bytes(file.write(0, length))
        os.rename(aside, self.b(name))
        self.names[name] = file

    @rule(name=names, length=lengths, churn=st.integers(0, 3))
    def other_recreate(self, name: str, length: int, churn: int) -> None:
        """Delete and make anew: the file system hands out the freed inode number again."""
        self.behind_the_back(name)
        if name in self.names:
            os.unlink(self.b(name))
        for i in range(churn):
            spare = self.b(f".spare{i}")
            Path(spare).write_bytes(b"")
            os.unlink(spare)
        file = new_file()
        Path(self.b(name)).write_bytes(file.write(0, length))
        self.names[name] = file

    @rule()
    def other_move_dir(self) -> None:
        """The directory and everything in it (cached or open through the mount) moves."""
        self.behind_the_back()
        moved = "e" if self.dirname == "d" else "d"
        os.rename(os.path.join(self.back, self.dirname), os.path.join(self.back, moved))
        self.dirname = moved

    # --- the end ------------------------------------------------------------------------------
    def teardown(self) -> None:
        try:
            self.settle()
        finally:
            for handle in self.open:
                os.close(handle.fd)
        held = unsynced(self.daemon)
        assert held == 0, f"{held} un-synced bytes held after every file was closed"
        shutil.rmtree(self.mnt)
        assert not os.path.exists(self.back)


def unsynced(daemon: Daemon, wait: float = 10.0) -> int:
    """The daemon's un-synced bytes once the background syncs of closed files have ended
    (those start when the files are closed; *wait* is a bound, not an expectation)."""
    entry = status_client.find_mount_of(str(daemon.mountpoint))
    deadline = time.monotonic() + wait
    while True:
        held = int(status_client.query(entry)["unsynced_bytes"])
        if held == 0 or time.monotonic() > deadline:
            return held
        time.sleep(0.02)


@pytest.mark.parametrize(
    ("attr_timeout", "writeback_cache"),
    [(0.0, True), (0.1, True), (0.0, False), (0.1, False)],
    ids=["attr0-wb", "attr0.1-wb", "attr0-nowb", "attr0.1-nowb"],
)
def test_the_mount_follows_another_writer(
    make_mount: Any, attr_timeout: float, writeback_cache: bool
) -> None:
    daemon = make_mount(
        options=[
            f"attr_timeout={attr_timeout:g}",
            f"writeback_cache={'yes' if writeback_cache else 'no'}",
        ]
    )
    ExternalWriters.daemon = daemon
    ExternalWriters.attr_timeout = attr_timeout
    ExternalWriters.writeback_cache = writeback_cache
    run_state_machine_as_test(
        ExternalWriters,
        settings=settings(
            max_examples=12,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


# --- focused regressions ----------------------------------------------------------------------


@pytest.mark.parametrize("attr_timeout", [0.0, 0.1])
def test_a_file_changed_on_the_target_shows_its_new_size_once_closed(
    make_mount: Any, attr_timeout: float
) -> None:
    """With the writeback cache (the default) the kernel keeps a cached file's size and pages
    itself and ignores the size the daemon reports: a file written through the mount and then
    truncated or rewritten on the target kept its old size and old data through the mount for
    as long as the kernel cached it, even with attr_timeout=0. A lookup now hands the kernel a
    new generation for such a file (changed size or mtime), and it takes the target's
    attributes and drops its pages."""
    daemon = make_mount(options=[f"attr_timeout={attr_timeout:g}"])
    assert daemon.source is not None
    mine, theirs = daemon.mountpoint / "f", daemon.source / "f"
    mine.write_bytes(b"a" * 10_000)
    assert mine.stat().st_size == 10_000

    with open(theirs, "r+b") as f:  # the same size, other bytes: told apart by the mtime
        f.write(b"c" * 10)
    time.sleep(attr_timeout + MARGIN)
    assert mine.read_bytes() == b"c" * 10 + b"a" * 9_990

    os.truncate(theirs, 100)
    time.sleep(attr_timeout + MARGIN)
    assert mine.stat().st_size == 100
    assert mine.read_bytes() == b"c" * 10 + b"a" * 90

    with open(theirs, "r+b") as f:
        f.write(b"b" * 20_000)
    time.sleep(attr_timeout + MARGIN)
    assert mine.read_bytes() == b"b" * 20_000

    with open(mine, "rb") as f:  # open through the mount: the kernel's size until close
        assert f.read(3) == b"bbb"
        os.truncate(theirs, 5)
    time.sleep(attr_timeout + MARGIN)
    assert mine.stat().st_size == 5
    assert mine.read_bytes() == b"b" * 5


def test_bytes_of_a_file_another_host_deleted_leave_the_ledger(
    make_memfs: Any, make_mount: Any
) -> None:
    """On NFS a file another client deleted answers ESTALE: its un-synced bytes can never be
    synced. The flusher retried them forever (an ERROR a minute, the bytes held against the
    window) and the unmount exited 1 "data could not be synced". They are dropped now."""
    target, _ = make_memfs("target", stale_unlinked=True)
    daemon = make_mount(
        source=target.mountpoint, options=["writeback_cache=no", "mode=static", "max_age=1h"]
    )
    with open(daemon.mountpoint / "f", "wb") as f:
        f.write(b"x" * 100_000)
        f.flush()
        entry = status_client.find_mount_of(str(daemon.mountpoint))
        assert status_client.query(entry)["unsynced_bytes"] == 100_000
        os.unlink(target.mountpoint / "f")  # another host deletes it
    assert unsynced(daemon) == 0


@pytest.mark.parametrize("cache", ["yes", "no"])
def test_an_open_sees_what_another_writer_wrote_at_once_close_to_open(
    make_mount: Any, cache: str
) -> None:
    """NFS's promise to every application: a file another client closed is seen whole by the
    next open (close-to-open), whatever the attribute cache holds. Through the mount an open
    is the same moment: the open's fresh attributes show the change, and the kernel (which
    keeps the size of a cached file itself with the writeback cache) is made to look the file
    up again instead of serving its old size and pages, even with a long attr_timeout."""
    daemon = make_mount(options=["attr_timeout=60", f"writeback_cache={cache}"])
    assert daemon.source is not None
    mine, theirs = daemon.mountpoint / "f", daemon.source / "f"
    mine.write_bytes(b"a" * 10_000)
    assert mine.read_bytes() == b"a" * 10_000  # cached in the kernel, size and pages
    theirs.write_bytes(b"b" * 300)  # another client rewrites it, shorter
    assert mine.read_bytes() == b"b" * 300
    with open(theirs, "r+b") as f:  # the same size again, other bytes
        f.write(b"c" * 10)
    assert mine.read_bytes() == b"c" * 10 + b"b" * 290


@pytest.mark.mount
def test_a_directory_left_with_nfs_files_about_to_go_is_removed_once_they_went(
    make_mount: Any,
) -> None:
    """On NFS a file removed while open stays as .nfsXXXX until its last close, and the client
    removes it just after, without waiting; the daemon's own close of a file its caller closed
    comes a moment after the caller's (the kernel does not wait for the release). So an rmdir
    right after the close met the .nfs file (stress-ng's hdd stressor, ENOTEMPTY). A directory
    holding nothing but .nfs files is retried for that moment; one holding a file that stays,
    .nfs or not, is refused as before. (The NFS lab proves the real case, test_names.py.)"""
    ft = make_mount()
    assert ft.source is not None
    going = ft.mountpoint / "going"
    going.mkdir()
    (ft.source / "going" / ".nfs000000000012345600000001").write_bytes(b"removed while open")
    remover = threading.Timer(0.3, (ft.source / "going" / ".nfs000000000012345600000001").unlink)
    remover.start()
    try:
        os.rmdir(going)  # waits for the .nfs file to go
    finally:
        remover.join()
    assert not (ft.source / "going").exists()
    for kept in (".nfs000000000012345600000002", "data"):
        staying = ft.mountpoint / f"staying-{kept}"
        staying.mkdir()
        (ft.source / staying.name / kept).write_bytes(b"still open elsewhere")
        with pytest.raises(OSError) as refused:
            os.rmdir(staying)
        assert refused.value.errno == errno.ENOTEMPTY
        assert (ft.source / staying.name / kept).exists()
