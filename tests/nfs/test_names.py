"""Item 2: names the daemon still holds. On NFS a file that is removed (or renamed over) while
some descriptor still refers to it is not removed but renamed to ``.nfsXXXXXXXX`` (the client's
"silly rename") until that descriptor goes; the directory then cannot be removed (ENOTEMPTY) and
the file's space is not freed. The daemon holds descriptors of its own (of every file the kernel
knows, of released files, of files it syncs), so each test removes what was just written
through the mount and checks what a user sees: ``rm -rf`` succeeds, no ``.nfs`` file outlives
its last writer by more than a few seconds, and freed space is usable at once. Each test does
the same on NFS directly in the same run: the mount must be no worse."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from mount_util import Daemon

from .lab import SillyHolders, fill_file, held_by, poll, silly_renamed, version

pytestmark = pytest.mark.mount

#: How long a silly-renamed file may outlive its writer's close (generous: the VM is slow).
SETTLE = 5.0


@dataclass
class Outcome:
    """What one run of a scenario left for the user to see."""

    where: str
    errors: list[str] = field(default_factory=list)  # failed steps, with their message
    silly_at_once: int = 0  # .nfs files right after the last step
    silly_seconds: float | None = 0.0  # until none were left (None: still there at SETTLE)
    left: list[str] = field(default_factory=list)  # what the target still holds
    held: list[str] = field(default_factory=list)  # daemon descriptors on .nfs files

    def describe(self) -> str:
        took = "never" if self.silly_seconds is None else f"{self.silly_seconds:.2f} s"
        return (
            f"{self.where} (NFS {version()}): errors {self.errors}; {self.silly_at_once} .nfs "
            f"files right after, gone after: {took}; left on the target: {self.left}; "
            f"daemon descriptors seen on .nfs files: {self.held}"
        )


def _settle(outcome: Outcome, target: Path, daemon: Daemon | None) -> None:
    """Wait (boundedly) for silly-renamed files under *target* to go."""
    outcome.silly_at_once = len(silly_renamed(target))
    if outcome.silly_at_once and daemon is not None:
        outcome.held += held_by(daemon.pid, target)
    outcome.silly_seconds = poll(lambda: not silly_renamed(target), SETTLE)


def _rm_rf(path: Path, outcome: Outcome, daemon: Daemon | None, target: Path) -> None:
    with SillyHolders(daemon.pid if daemon else None, target) as holders:
        done = subprocess.run(["rm", "-rf", str(path)], capture_output=True, text=True, check=False)
    outcome.held += sorted(holders.seen)
    if done.returncode != 0:
        outcome.errors.append(f"rm -rf: exit {done.returncode}: {done.stderr.strip()[-800:]}")


def _listing(target: Path) -> list[str]:
    return sorted(str(p.relative_to(target)) for p in target.rglob("*"))


def _compare(through: Outcome, direct: Outcome) -> None:
    report = f"\n{through.describe()}\n{direct.describe()}"
    print(report)  # for the lab's report (pytest -rA)
    assert not through.errors or direct.errors, "failed through the mount only:" + report
    assert through.silly_seconds is not None or direct.silly_seconds is None, (
        f".nfs files left {SETTLE:.0f} s after the writer closed:" + report
    )
    assert not through.left or direct.left, "left on the target:" + report


def _write_tree(top: Path, files: int, size: int, dirs: int) -> None:
    for i in range(files):
        directory = top / f"d{i % dirs}"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"f{i}").write_bytes(os.urandom(size))


def _remove_right_after_writing(
    ft: Daemon, nfs_dir: Path, files: int, size: int, dirs: int
) -> tuple[Outcome, Outcome]:
    assert ft.source is not None
    direct_dir = nfs_dir.parent / (nfs_dir.name + "-direct")
    direct_dir.mkdir()
    outcomes = []
    for where, top, target, daemon in (
        ("through the mount", ft.mountpoint, ft.source, ft),
        ("NFS directly", direct_dir, direct_dir, None),
    ):
        outcome = Outcome(where)
        _write_tree(top / "tree", files, size, dirs)
        _rm_rf(top / "tree", outcome, daemon, target)
        _settle(outcome, target, daemon)
        outcome.left = _listing(target)
        outcomes.append(outcome)
    return outcomes[0], outcomes[1]


def test_rm_rf_of_many_small_files_just_written(ft_nfs: Daemon, nfs_dir: Path) -> None:
    """A backup's rotation removes a tree right after writing it: rm -rf succeeds (no
    ENOTEMPTY from files the daemon still holds) and leaves nothing on the target. Forty
    directories of five files: each rmdir comes right after the unlink of its last file."""
    through, direct = _remove_right_after_writing(ft_nfs, nfs_dir, files=200, size=3000, dirs=40)
    _compare(through, direct)


def test_rm_rf_of_a_few_large_files_just_written(ft_nfs: Daemon, nfs_dir: Path) -> None:
    """The same with files of several MiB (the daemon syncs each of them when it is closed)."""
    through, direct = _remove_right_after_writing(ft_nfs, nfs_dir, files=3, size=6 << 20, dirs=3)
    _compare(through, direct)


def test_rename_over_a_file_just_written_and_looked_up(ft_nfs: Daemon, nfs_dir: Path) -> None:
    """rsync's pattern: each file is written to a temporary name, closed, and renamed over the
    old version, which rsync looked at first. The old versions must not stay behind as .nfs
    files, the new contents are on the target, and the directory can be removed right away."""
    assert ft_nfs.source is not None
    direct_dir = nfs_dir.parent / (nfs_dir.name + "-direct")
    direct_dir.mkdir()
    outcomes = []
    for where, top, target, daemon in (
        ("through the mount", ft_nfs.mountpoint, ft_nfs.source, ft_nfs),
        ("NFS directly", direct_dir, direct_dir, None),
    ):
        outcome = Outcome(where)
        tree = top / "r"
        tree.mkdir()
        for i in range(20):
            (tree / f"f{i}").write_bytes(b"old version\n" * (i + 1))
        with SillyHolders(daemon.pid if daemon else None, target) as holders:
            for i in range(20):
                name = tree / f"f{i}"
                os.stat(name)  # rsync compares size and mtime first
                temp = tree / f".f{i}.XXXXXX"
                temp.write_bytes(b"new version\n" * (i + 2))
                os.rename(temp, name)
            _settle(outcome, target, daemon)
        outcome.held += sorted(holders.seen)
        wrong = [
            f"f{i}"
            for i in range(20)
            if (target / "r" / f"f{i}").read_bytes() != b"new version\n" * (i + 2)
        ]
        if wrong:
            outcome.errors.append(f"old contents on the target: {wrong}")
        _rm_rf(tree, outcome, daemon, target)
        outcome.left = _listing(target)
        outcomes.append(outcome)
    _compare(outcomes[0], outcomes[1])


def test_unlinked_open_file_leaves_nothing_once_closed(ft_nfs: Daemon, nfs_dir: Path) -> None:
    """A file removed while its writer still has it open stays readable and writable through
    that descriptor (as .nfsXXXX on NFS, directly too); once it is closed, the .nfs file goes
    and its directory can be removed."""
    assert ft_nfs.source is not None
    direct_dir = nfs_dir.parent / (nfs_dir.name + "-direct")
    direct_dir.mkdir()
    outcomes = []
    for where, top, target, daemon in (
        ("through the mount", ft_nfs.mountpoint, ft_nfs.source, ft_nfs),
        ("NFS directly", direct_dir, direct_dir, None),
    ):
        outcome = Outcome(where)
        (top / "u").mkdir()
        path = top / "u" / "open-file"
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            os.write(fd, b"a" * (1 << 20))
            os.unlink(path)
            os.write(fd, b"b" * 4096)
            os.fsync(fd)
            if os.pread(fd, 4096, 1 << 20) != b"b" * 4096:
                outcome.errors.append("the open file reads back wrong after its unlink")
        except OSError as err:
            outcome.errors.append(f"{err!r}")
        finally:
            os.close(fd)
        with SillyHolders(daemon.pid if daemon else None, target) as holders:
            _settle(outcome, target, daemon)
        outcome.held += sorted(holders.seen)
        try:
            os.rmdir(top / "u")
        except OSError as err:
            outcome.errors.append(f"rmdir right after the close: {err!r}")
        outcome.left = _listing(target)
        outcomes.append(outcome)
    _compare(outcomes[0], outcomes[1])


def test_a_directory_emptied_of_a_file_removed_while_open_goes_right_after_the_close(
    ft_nfs: Daemon, nfs_dir: Path
) -> None:
    """stress-ng's hdd stressor: create a file, remove it while open, write through the
    descriptor, close it, and at once rmdir its directory. The removed file is a .nfsXXXX on
    NFS until the last close, after which the client removes it; through the mount, the
    daemon's own close comes a moment after the caller's (the kernel does not wait for the
    release), and the rmdir met the .nfs file (ENOTEMPTY). Twenty times each way; the mount
    must fail no more often than NFS directly (which may lose the same race itself)."""
    assert ft_nfs.source is not None
    direct_dir = nfs_dir.parent / (nfs_dir.name + "-direct")
    direct_dir.mkdir()
    outcomes = []
    for where, top in (("through the mount", ft_nfs.mountpoint), ("NFS directly", direct_dir)):
        outcome = Outcome(where)
        for i in range(20):
            directory = top / f"hdd-{i}"
            directory.mkdir()
            fd = os.open(directory / "data", os.O_CREAT | os.O_RDWR, 0o600)
            try:
                os.unlink(directory / "data")
                os.write(fd, b"h" * 65536)
            finally:
                os.close(fd)
            try:
                os.rmdir(directory)
            except OSError as err:
                outcome.errors.append(f"rmdir {i} right after the close: {err!r}")
        outcomes.append(outcome)
    print("\n".join(f"{o.where}: {len(o.errors)} of 20 failed {o.errors[:2]}" for o in outcomes))
    assert len(outcomes[0].errors) <= len(outcomes[1].errors), outcomes[0].errors


def _free_then_write(top: Path, target: Path, daemon: Daemon | None, where: str) -> Outcome:
    """Fill the small target through *top* until ENOSPC, rm -f that file, at once write a
    small new one; then, if that failed, how long until such a write succeeds."""
    outcome = Outcome(where)
    top.mkdir(exist_ok=True)
    _, events = fill_file(top / "big", FILL)
    if not any(errno_name == "ENOSPC" for _, errno_name in events):
        outcome.errors.append(f"filling the target met no ENOSPC: {events}")
    content = b"written right after the rm\n" * 100
    try:
        with SillyHolders(daemon.pid if daemon else None, target) as holders:
            os.unlink(top / "big")
            (top / "new").write_bytes(content)
    except OSError as err:
        outcome.errors.append(f"the write right after the rm: {err!r}")
        outcome.held += sorted(holders.seen)
        if daemon is not None:
            outcome.held += held_by(daemon.pid, target)
        outcome.silly_at_once = len(silly_renamed(target))

        def writes() -> bool:
            try:
                (top / "retry").write_bytes(content)
                return True
            except OSError:
                return False

        took = poll(writes, SETTLE, interval=0.2)
        later = "not within" if took is None else f"{took:.2f} s later, within"
        outcome.errors.append(f"a small write succeeded {later} {SETTLE:.0f} s")
    else:
        if (target / "new").read_bytes() != content:
            outcome.errors.append("the new file's content is not on the target")
    outcome.silly_seconds = poll(lambda: not silly_renamed(target), SETTLE)
    outcome.left = _listing(target)
    return outcome


#: More than the small export holds (64 MiB, 51 MiB free).
FILL = 96 << 20


def test_space_freed_through_the_mount_is_usable_at_once(
    small_nfs: tuple[Path, Path], make_mount: Callable[..., Daemon]
) -> None:
    """A full target: the backup removes an old file through the mount and at once writes a
    new one, which must succeed and be on the target (a removed file whose descriptor is still
    held is silly-renamed on NFS, and its space stays taken)."""
    for_mount, for_direct = small_nfs
    direct = _free_then_write(for_direct, for_direct, None, "NFS directly")
    ft = make_mount(source=for_mount)
    ft.expect_log_problems = True  # ENOSPC is logged, as it should be
    through = _free_then_write(ft.mountpoint, for_mount, ft, "through the mount")
    _compare(through, direct)
    assert "Traceback" not in ft.log() and "internal error" not in ft.log(), ft.log()
