"""Item 3: another host changes the tree. NFS client 2 (another host, its own caches) removes,
renames and rewrites files and directories that the mount (on client 1) has looked up and
cached. After attr_timeout (1 s) and a margin the mount must show what the server holds
wherever NFS directly does on client 1 at that moment (NFS caches too: the claim is "no worse
than NFS directly"); a vanished object is ENOENT or ESTALE, never EIO or another file's bytes;
the daemon survives and keeps no descriptors of what is gone.

Each test builds two copies of the same tree, one under the mount's source and one beside it
used directly, so the two views do not share the client's cached names."""

from __future__ import annotations

import errno
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from mount_util import Daemon

from .lab import forget_cached_names, open_fds, poll, version

pytestmark = pytest.mark.mount

#: attr_timeout (the default, 1 s) and a margin.
AFTER_ATTR_TIMEOUT = 1.5
#: How long the report waits for the mount to catch up when it does not at once.
CATCH_UP = 10.0

Outcome = str  # "ok: <what was seen>" or "errno: <name>"


def attempt(fn: Callable[[], object]) -> Outcome:
    try:
        shown = repr(fn())
        return f"ok: {shown if len(shown) <= 80 else shown[:80] + '...'}"
    except OSError as err:
        return f"errno: {errno.errorcode.get(err.errno or 0, str(err.errno))}"


def _setup(
    make_mount: Callable[..., Daemon], nfs_dirs: tuple[Path, Path]
) -> tuple[Daemon, dict[str, tuple[Path, Path]]]:
    """The mount over <dir>/m; two views, each (client 1's path, client 2's path of it)."""
    here, there = nfs_dirs
    (here / "m").mkdir()
    (here / "d").mkdir()
    ft = make_mount(source=here / "m")
    return ft, {
        "through the mount": (ft.mountpoint, there / "m"),
        "NFS directly": (here / "d", there / "d"),
    }


def _compare(
    checks: dict[str, Callable[[Path], object]],
    views: dict[str, tuple[Path, Path]],
    expected: dict[str, Outcome],
) -> list[str]:
    """Run each check in both views (the mount first); complaints where the mount is worse:
    it differs from what the server holds (*expected*) while NFS directly does not."""
    complaints = []
    for name, check in checks.items():
        seen = {view: attempt(lambda c=check, p=paths[0]: c(p)) for view, paths in views.items()}
        mount, direct = seen["through the mount"], seen["NFS directly"]
        print(f"{name}: through the mount {mount}; NFS directly {direct}")  # pytest -rA
        if mount == expected[name] or mount == direct:
            continue
        complaints.append(
            f"{name}: through the mount {mount}, NFS directly {direct}, "
            f"the server holds {expected[name]}"
        )
    return complaints


def _catch_up(check: Callable[[Path], object], top: Path, want: Outcome) -> str:
    """For the report: how long the mount took to show *want* (bounded)."""
    took = poll(lambda: attempt(lambda: check(top)) == want, CATCH_UP, interval=0.2)
    if took is None:
        return f"still {attempt(lambda: check(top))} {CATCH_UP:.0f} s later"
    return f"right {took:.1f} s later"


def _leaked_descriptors(ft: Daemon, before: int) -> list[str]:
    """Complaints unless the daemon is alive, answers, and, once the kernel forgets what it
    cached, is back to its descriptors of an idle mount (none kept of removed objects)."""
    if ft.proc.poll() is not None:
        return [f"the daemon died:\n{ft.log()}"]
    if not ft.answers():
        return ["the mount stopped answering"]

    def settled() -> bool:
        forget_cached_names()
        return open_fds(ft.pid) <= before

    if poll(settled, CATCH_UP, interval=0.5) is None:
        fds = f"/proc/{ft.pid}/fd"
        held = sorted(os.readlink(f"{fds}/{fd}") for fd in os.listdir(fds))
        return [f"the daemon holds {len(held)} descriptors, {before} before: {held}"]
    print(f"descriptors: {open_fds(ft.pid)} after, {before} before")  # pytest -rA
    return []


def _problems(ft: Daemon) -> list[str]:
    return [line for line in ft.log().splitlines() if "Traceback" in line or "internal" in line]


def test_directory_removed_and_recreated_by_another_host(
    make_mount: Callable[..., Daemon], nfs_dirs: tuple[Path, Path]
) -> None:
    """The mount listed a directory; another host removes it and makes it again with a new
    file. After attr_timeout the new file reads through the mount and a file can be created
    in the directory, wherever NFS directly manages the same on this host."""
    ft, views = _setup(make_mount, nfs_dirs)
    before = open_fds(ft.pid)
    for top, _ in views.values():
        (top / "D").mkdir()
        (top / "D" / "old").write_bytes(b"old file\n")
        (top / "keep").mkdir()
        (top / "keep" / "sub").mkdir()
    for top, _ in views.values():  # cache names and attributes on this host
        assert os.listdir(top / "D") == ["old"]
        assert (top / "D" / "old").read_bytes() == b"old file\n"
        assert os.listdir(top / "keep") == ["sub"]
    for _, other in views.values():
        shutil.rmtree(other / "D")
        (other / "D").mkdir()
        (other / "D" / "new").write_bytes(b"new file\n")
        shutil.rmtree(other / "keep" / "sub")
        (other / "keep" / "sub").mkdir()
        (other / "keep" / "sub" / "inside").write_bytes(b"inside\n")
    time.sleep(AFTER_ATTR_TIMEOUT)
    checks: dict[str, Callable[[Path], object]] = {
        "read D/new": lambda top: (top / "D" / "new").read_bytes(),
        "create D/made-here": lambda top: (top / "D" / "made-here").write_bytes(b"x"),
        "list D": lambda top: sorted(os.listdir(top / "D")),
        "stat D/old": lambda top: (top / "D" / "old").stat().st_size,
        "read keep/sub/inside": lambda top: (top / "keep" / "sub" / "inside").read_bytes(),
        "mkdir keep/sub/x": lambda top: (top / "keep" / "sub" / "x").mkdir(),
    }
    expected = {
        "read D/new": "ok: b'new file\\n'",
        "create D/made-here": "ok: 1",
        "list D": "ok: ['made-here', 'new']",
        "stat D/old": "errno: ENOENT",
        "read keep/sub/inside": "ok: b'inside\\n'",
        "mkdir keep/sub/x": "ok: None",
    }
    complaints = _compare(checks, views, expected)
    if complaints:
        late = _catch_up(checks["read D/new"], ft.mountpoint, expected["read D/new"])
        complaints.append(f"then read D/new through the mount: {late}")
    complaints += _leaked_descriptors(ft, before)
    assert not complaints, f"NFS {version()}:\n" + "\n".join(complaints)
    assert not _problems(ft), ft.log()


def test_files_rewritten_renamed_and_removed_by_another_host(
    make_mount: Callable[..., Daemon], nfs_dirs: tuple[Path, Path]
) -> None:
    """Files the mount has read are rewritten in place, replaced by a new file, renamed,
    truncated and removed by another host; a directory is renamed. After attr_timeout the mount
    shows the server's state wherever NFS directly does; gone is ENOENT or ESTALE, never EIO or
    stale bytes."""
    ft, views = _setup(make_mount, nfs_dirs)
    before = open_fds(ft.pid)
    names = ("rewritten", "replaced", "renamed", "removed", "shrunk")
    for top, _ in views.values():
        for name in names:
            (top / name).write_bytes(f"first {name}\n".encode() * 100)
        (top / "dir").mkdir()
        (top / "dir" / "inner").write_bytes(b"inner\n")
    for top, _ in views.values():  # read everything once: cached names, attributes, pages
        for name in names:
            assert (top / name).read_bytes() == f"first {name}\n".encode() * 100
        assert (top / "dir" / "inner").read_bytes() == b"inner\n"
    for _, other in views.values():
        with open(other / "rewritten", "r+b") as f:  # same size, same inode, new bytes
            f.write(b"SECOND".ljust(len("first rewritten\n") * 100, b"!"))
        (other / "replaced.tmp").write_bytes(b"a new file under the old name\n")
        os.rename(other / "replaced.tmp", other / "replaced")
        os.rename(other / "renamed", other / "renamed-there")
        os.unlink(other / "removed")
        with open(other / "shrunk", "r+b") as f:
            f.truncate(10)
        os.rename(other / "dir", other / "dir-moved")
    time.sleep(AFTER_ATTR_TIMEOUT)
    checks: dict[str, Callable[[Path], object]] = {
        "read rewritten": lambda top: (top / "rewritten").read_bytes()[:8],
        "read replaced": lambda top: (top / "replaced").read_bytes(),
        "stat renamed": lambda top: (top / "renamed").stat().st_size,
        "read renamed-there": lambda top: (top / "renamed-there").read_bytes()[:14],
        "stat removed": lambda top: (top / "removed").stat().st_size,
        "open removed": lambda top: (top / "removed").read_bytes(),
        "read shrunk": lambda top: (top / "shrunk").read_bytes(),
        "list dir": lambda top: os.listdir(top / "dir"),
        "read dir-moved/inner": lambda top: (top / "dir-moved" / "inner").read_bytes(),
    }
    expected = {
        "read rewritten": "ok: b'SECOND!!'",
        "read replaced": "ok: b'a new file under the old name\\n'",
        "stat renamed": "errno: ENOENT",
        "read renamed-there": "ok: b'first renamed\\n'",
        "stat removed": "errno: ENOENT",
        "open removed": "errno: ENOENT",
        "read shrunk": "ok: b'first shru'",
        "list dir": "errno: ENOENT",
        "read dir-moved/inner": "ok: b'inner\\n'",
    }
    complaints = _compare(checks, views, expected)
    eio = [c for c in complaints if "through the mount errno: EIO" in c]
    assert not eio, f"NFS {version()}: EIO through the mount:\n" + "\n".join(eio)
    for complaint in list(complaints):
        name = complaint.split(":", 1)[0]
        late = _catch_up(checks[name], ft.mountpoint, expected[name])
        complaints.append(f"then {name} through the mount: {late}")
    complaints += _leaked_descriptors(ft, before)
    assert not complaints, f"NFS {version()}:\n" + "\n".join(complaints)
    assert not _problems(ft), ft.log()


def _open_then_removed(top: Path, other: Path) -> list[Outcome]:
    """Open a file for reading and for writing, have the other host remove it (and make
    another file, which may get its inode number), then use both descriptors."""
    (top / "victim").write_bytes(b"victim\n" * 1000)
    reader = os.open(top / "victim", os.O_RDONLY)
    writer = os.open(top / "victim", os.O_WRONLY)
    seen: list[Outcome] = []
    try:
        os.read(reader, 7)
        os.unlink(other / "victim")
        (other / "successor").write_bytes(b"successor\n" * 1000)
        time.sleep(AFTER_ATTR_TIMEOUT)
        seen.append(attempt(lambda: os.pread(reader, 9, 700)))
        seen.append(attempt(lambda: os.pwrite(writer, b"late", 0)))
        seen.append(attempt(lambda: os.fsync(writer)))
        seen.append(attempt(lambda: os.fstat(reader).st_size))
    finally:
        seen.append(attempt(lambda: os.close(writer)))
        seen.append(attempt(lambda: os.close(reader)))
    seen.append(attempt(lambda: (top / "successor").read_bytes()[:10]))
    seen.append(attempt(lambda: (top / "victim").stat().st_size))
    return seen


def test_file_removed_by_another_host_while_open_through_the_mount(
    make_mount: Callable[..., Daemon], nfs_dirs: tuple[Path, Path]
) -> None:
    """A file open through the mount is removed by another host: its reader and writer get
    what they get on NFS directly (data, or ESTALE), never EIO or another file's bytes, and
    the daemon lets go of it once closed."""
    ft, views = _setup(make_mount, nfs_dirs)
    before = open_fds(ft.pid)
    seen = {view: _open_then_removed(top, other) for view, (top, other) in views.items()}
    mount, direct = seen["through the mount"], seen["NFS directly"]
    report = f"NFS {version()}: through the mount {mount}\nNFS directly {direct}"
    print(report)  # for the lab's report (pytest -rA)
    assert not any("EIO" in o for o in mount) or any("EIO" in o for o in direct), report
    # The first read after the removal: the file's bytes, or ESTALE, never another file's.
    # NFS directly may still answer it from its page cache; the mount dropped its synced pages
    # from the target's cache (drop_synced), and the kernel asks the daemon for the attributes
    # once attr_timeout has passed, so on NFSv3 (no open state: the server forgets the file)
    # it may hear ESTALE a read earlier than NFS directly (seen in 1 of the lab's v3 runs).
    assert mount[0] in ("ok: b'victim\\nvi'", direct[0], "errno: ESTALE"), "other bytes:\n" + report
    assert mount[-2] == "ok: b'successor\\n'", report
    assert mount[-1] in ("errno: ENOENT", "errno: ESTALE") or mount[-1] == direct[-1], report
    assert not _problems(ft), ft.log()
    ft.expect_log_problems = True  # a sync of the vanished file may be logged: told above
    assert not _leaked_descriptors(ft, before)
