"""Random sequences of namespace and data operations, applied to a fusethrottle mount and to a
plain directory side by side: after every step the two trees (and the backing directory under
the mount) must look the same to a user - names, types, modes, sizes, link counts, contents,
symlink targets, which names are hard links of each other - and every operation must fail the
same way on both (same errno).

One mount serves all examples; each example works in fresh subdirectories of its own.
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)
from mount_util import Daemon

pytestmark = pytest.mark.mount

AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
_libc = ctypes.CDLL(None, use_errno=True)
_libc.renameat2.argtypes = (
    ctypes.c_int,
    ctypes.c_char_p,
    ctypes.c_int,
    ctypes.c_char_p,
    ctypes.c_uint,
)

PATHS = ["f", "g", "h", "d", "e", "d/f", "d/g", "e/f", "d/d", "d/d/f"]
MODES = [0o644, 0o600, 0o755, 0o777, 0o4755, 0o2711, 0o1777, 0o000, 0o444]
paths = st.sampled_from(PATHS)
modes = st.sampled_from(MODES)
payloads = st.binary(min_size=0, max_size=3000)
offsets = st.one_of(st.integers(0, 4200), st.integers(65_000, 70_000))


def renameat2(src: str, dst: str, flags: int) -> None:
    if _libc.renameat2(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), flags) < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    """What a user sees: the result, or the errno name."""
    try:
        return ("ok", fn(*args))
    except OSError as err:
        return ("error", errno.errorcode.get(err.errno or 0, err.errno))


def snapshot(root: str) -> dict[str, Any]:
    """Everything a user can tell about a tree, minus times and inode numbers."""
    tree: dict[str, Any] = {}
    inodes: dict[int, list[str]] = {}

    def walk(directory: str, prefix: str) -> None:
        for name in sorted(os.listdir(directory)):
            path = os.path.join(directory, name)
            rel = prefix + name
            s = os.lstat(path)
            kind = stat.S_IFMT(s.st_mode)
            entry: dict[str, Any] = {"mode": oct(s.st_mode), "nlink": s.st_nlink}
            if stat.S_ISREG(kind):
                with open(path, "rb") as f:
                    entry["data"] = f.read()
                entry["size"] = s.st_size
                inodes.setdefault(s.st_ino, []).append(rel)
            elif stat.S_ISLNK(kind):
                entry["target"] = os.readlink(path)
                inodes.setdefault(s.st_ino, []).append(rel)
            tree[rel] = entry
            if stat.S_ISDIR(kind):
                walk(path, rel + "/")

    walk(root, "")
    links = sorted(sorted(group) for group in inodes.values() if len(group) > 1)
    return {"tree": tree, "hard links": links}


class Trees(RuleBasedStateMachine):
    """Each rule runs the same call on the mount and on the reference directory."""

    mount: Daemon
    reference: Path
    counter = itertools.count()
    handles = Bundle("handles")
    directories = ("d", "e", "d/d")
    files = ("f", "g", "d/f", "e/f", "d/d/f")

    def __init__(self) -> None:
        super().__init__()
        n = next(self.counter)
        self.roots = [
            str(self.mount.mountpoint / f"ex{n}"),
            str(self.reference / f"ex{n}"),
        ]
        self.backing = str(self.mount.source / f"ex{n}")
        for root in self.roots:
            os.mkdir(root)
        self.open_fds: list[tuple[int, int]] = []

    def both(self, fn: Any, *rels: str, args: tuple[Any, ...] = ()) -> Any:
        results = [outcome(fn, *(os.path.join(r, p) for p in rels), *args) for r in self.roots]
        assert results[0] == results[1], f"mount {results[0]} != plain directory {results[1]}"
        return results[0]

    @initialize(data=st.lists(payloads, min_size=5, max_size=5))
    def populate(self, data: list[bytes]) -> None:
        """Most paths exist at the start, so most steps change something rather than fail."""
        for path in self.directories:
            self.both(os.mkdir, path)
        for path, payload in zip(self.files, data, strict=True):
            self.both(lambda p, payload=payload: Path(p).write_bytes(payload), path)

    # --- data -------------------------------------------------------------------------------
    @rule(path=paths, mode=modes, exclusive=st.booleans())
    def create(self, path: str, mode: int, exclusive: bool) -> None:
        flags = os.O_CREAT | os.O_WRONLY | (os.O_EXCL if exclusive else 0)
        self.both(lambda p: os.close(os.open(p, flags, mode)), path)

    @rule(path=paths, offset=offsets, data=payloads)
    def write(self, path: str, offset: int, data: bytes) -> None:
        def write_at(p: str) -> int:
            fd = os.open(p, os.O_WRONLY)
            try:
                return os.pwrite(fd, data, offset)
            finally:
                os.close(fd)

        self.both(write_at, path)

    @rule(path=paths, size=st.one_of(st.integers(0, 5000), st.integers(60_000, 80_000)))
    def truncate(self, path: str, size: int) -> None:
        self.both(os.truncate, path, args=(size,))

    @rule(path=paths, datasync=st.booleans())
    def fsync(self, path: str, datasync: bool) -> None:
        def sync(p: str) -> None:
            fd = os.open(p, os.O_RDONLY)
            try:
                (os.fdatasync if datasync else os.fsync)(fd)
            finally:
                os.close(fd)

        self.both(sync, path)

    # --- open handles survive renames and unlinks ---------------------------------------------
    @rule(target=handles, path=paths)
    def open_handle(self, path: str) -> Any:
        fds = [outcome(os.open, os.path.join(r, path), os.O_RDWR) for r in self.roots]
        assert fds[0][0] == fds[1][0], fds
        if fds[0][0] != "ok":
            assert fds[0] == fds[1]
            return multiple()
        pair = (fds[0][1], fds[1][1])
        self.open_fds.append(pair)
        return pair

    @rule(handle=handles, offset=offsets, data=payloads)
    def write_handle(self, handle: tuple[int, int], offset: int, data: bytes) -> None:
        results = [outcome(os.pwrite, fd, data, offset) for fd in handle]
        assert results[0] == results[1]
        sizes = [os.fstat(fd).st_size for fd in handle]
        links = [os.fstat(fd).st_nlink for fd in handle]
        assert sizes[0] == sizes[1] and links[0] == links[1]
        contents = [os.pread(fd, sizes[0] + 1, 0) for fd in handle]
        assert contents[0] == contents[1]

    @rule(handle=consumes(handles))
    def close_handle(self, handle: tuple[int, int]) -> None:
        for fd in handle:
            os.close(fd)
        self.open_fds.remove(handle)

    # --- namespace ----------------------------------------------------------------------------
    @rule(src=paths, dst=paths, flags=st.sampled_from([0, RENAME_NOREPLACE, RENAME_EXCHANGE]))
    def rename(self, src: str, dst: str, flags: int) -> None:
        self.both(renameat2, src, dst, args=(flags,))

    @rule(src=paths, dst=paths)
    def link(self, src: str, dst: str) -> None:
        self.both(os.link, src, dst)

    @rule(target_name=st.sampled_from(["f", "../f", "d/f", "nowhere"]), path=paths)
    def symlink(self, target_name: str, path: str) -> None:
        self.both(lambda p: os.symlink(target_name, p), path)

    @rule(path=paths)
    def unlink(self, path: str) -> None:
        self.both(os.unlink, path)

    @rule(path=paths, mode=modes)
    def mkdir(self, path: str, mode: int) -> None:
        self.both(os.mkdir, path, args=(mode,))

    @rule(path=paths)
    def rmdir(self, path: str) -> None:
        self.both(os.rmdir, path)

    @rule(path=paths, mode=modes)
    def chmod(self, path: str, mode: int) -> None:
        self.both(os.chmod, path, args=(mode,))

    # --- what the user sees -------------------------------------------------------------------
    @invariant()
    def same_trees(self) -> None:
        through_mount, plain = (snapshot(r) for r in self.roots)
        assert through_mount == plain
        assert snapshot(self.backing) == plain  # and it really landed on the target

    def teardown(self) -> None:
        for pair in self.open_fds:
            for fd in pair:
                os.close(fd)
        for root in self.roots:
            shutil.rmtree(root)
        assert not os.path.exists(self.backing)


def test_mount_behaves_like_a_plain_directory(ft: Daemon, workdir: Path) -> None:
    reference = workdir / "reference"
    reference.mkdir()
    old_umask = os.umask(0o022)
    try:
        Trees.mount = ft
        Trees.reference = reference
        run_state_machine_as_test(
            Trees,
            settings=settings(
                max_examples=40,
                stateful_step_count=40,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            ),
        )
    finally:
        os.umask(old_umask)


def test_names_reusing_a_removed_directorys_inode_number_stat_cleanly(ft: Daemon) -> None:
    """rm -rf of a tree, then a new tree at once: ext4 hands the removed directories' inode
    numbers to the new files. A stat of a new file must never be answered with the attributes
    the daemon kept of the directory that had its number (the kernel fails it with EIO: found
    by the state machine above when synced pages were dropped and the kernel asked again)."""
    failures = []
    for n in range(400):
        root = ft.mountpoint / f"reuse{n}"
        root.mkdir()
        for d in ("d", "e", "d/d"):
            (root / d).mkdir()
        for f in ("f", "g", "d/f", "e/f", "d/d/f"):
            (root / f).write_bytes(b"x" * n)
        for top, dirs, files in os.walk(root):
            for name in dirs + files:
                try:
                    os.lstat(os.path.join(top, name))
                except OSError as err:
                    failures.append((n, name, err.errno))
        shutil.rmtree(root)
    assert failures == []
