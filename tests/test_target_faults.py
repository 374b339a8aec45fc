"""Faults a backup target really has, through a real mount: it fills up (issue #13).

A full target must fail the backup with ENOSPC, at the write, the fsync or the close that first
learns of it, and never leave a silently short file. An injected (background) fsync's ENOSPC
reaches the writer once, like the kernel's errseq: at its next write, fsync or close, and not
again. ``status`` and the metrics show it. Once space is freed the next backup succeeds. An
unmount that leaves data off the target exits 1 and names every such file.

The targets are real ext4 file systems on loop devices (tests/full_target.py).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest
from full_target import free_bytes, skip_reason, small_target, thin_target
from mount_util import FUSETHROTTLE, Daemon, start_fusethrottle, wait_for

from fusethrottle.observability.status_client import find_mount_of, query

MiB = 1 << 20
pytestmark = [
    pytest.mark.mount,
    pytest.mark.slow_target,
    pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or ""),
]


def status(mnt: Path) -> dict:
    result = subprocess.run(
        [FUSETHROTTLE, "status", str(mnt), "--json"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def injected_fsync_errors(mnt: Path) -> int:
    """Failed background fsyncs, asked in this process: a child started while the test holds
    a file of the mount open would close it at its exec, and that close is a FUSE flush (the
    writer's close, as far as the error report is concerned)."""
    reply = query(find_mount_of(str(mnt)))
    return sum(n for reason, n in reply["fsync_errors"].items() if reason != "application")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def pattern(i: int) -> bytes:
    """Chunk *i* of a backup: 1 MiB, different for every chunk."""
    return hashlib.sha256(str(i).encode()).digest() * (MiB // 32)


def back_up(path: Path, chunks: int) -> list[tuple[str, int]]:
    """Write a backup of *chunks* MiB, fsync and close it, as a backup tool does.

    Returns the errors the writer saw as (call, errno); stops writing at the first failed
    write, and always still fsyncs and closes (a tool reports, then cleans up).
    """
    errors: list[tuple[str, int]] = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for i in range(chunks):
            data = pattern(i)
            try:
                while data:  # a short write is not an error: write the rest, as tools do
                    data = data[os.write(fd, data) :]
            except OSError as err:
                errors.append(("write", err.errno))
                break
        try:
            os.fsync(fd)
        except OSError as err:
            errors.append(("fsync", err.errno))
    finally:
        try:
            os.close(fd)
        except OSError as err:
            errors.append(("close", err.errno))
    return errors


def is_backup(path: Path, chunks: int) -> bool:
    with open(path, "rb") as f:
        return all(f.read(MiB) == pattern(i) for i in range(chunks)) and f.read(1) == b""


def stopped(daemon: Daemon) -> int | None:
    """Unmount (the writer has closed everything) and return the daemon's exit code."""
    code = daemon.stop()
    assert not daemon.hung, daemon.log()
    return code


# --- a target that is full ----------------------------------------------------------------------
@pytest.mark.parametrize("cache", ["yes", "no"])
def test_a_full_target_fails_the_backup_with_enospc_and_the_next_one_succeeds(
    workdir: Path, cache: str
) -> None:
    """A 64 MiB backup into a 32 MiB target that holds an older 12 MiB one: the writer gets
    ENOSPC (from the write without the writeback cache, from the fsync with it), once; status
    and metrics show it; the daemon keeps serving; once the old backup is deleted the next one
    arrives intact; the unmount exits 0, since the writer was told of everything that did not
    arrive, and names the incomplete file."""
    with small_target("32M") as root:
        source = root / "backups"
        source.mkdir()
        (source / "old.bin").write_bytes(b"o" * 12 * MiB)
        mnt = workdir / "mnt"
        mnt.mkdir()
        port = free_port()
        daemon = start_fusethrottle(
            source, mnt, [f"writeback_cache={cache}", "batch=4M", f"metrics=127.0.0.1:{port}"]
        )
        daemon.expect_log_problems = True  # the target's ENOSPC is logged, on purpose
        try:
            errors = back_up(mnt / "big.bin", 64)
            assert len(errors) == 1 and errors[0][1] == errno.ENOSPC, errors
            assert errors[0][0] == ("fsync" if cache == "yes" else "write"), errors
            assert (source / "big.bin").stat().st_size < 64 * MiB

            shown = status(mnt)["target_errors"]
            assert ["write", "ENOSPC"] in [entry[:2] for entry in shown], shown
            metric = 'fusethrottle_target_errors_total{errno="ENOSPC",op="write"}'
            assert wait_for(lambda: metric in scrape(port), 10)  # published twice a second

            (mnt / "old.bin").unlink()  # the operator frees space
            assert wait_for(lambda: free_bytes(root) > 10 * MiB, 30)
            assert back_up(mnt / "next.bin", 8) == []
            assert is_backup(source / "next.bin", 8)
        finally:
            code = stopped(daemon)
    assert code == 0, daemon.log()
    assert "all data synced" in daemon.log()
    assert named(daemon, "incomplete on the target:") == [source / "big.bin"]


def named(daemon: Daemon, words: str) -> list[Path]:
    """The files the daemon's log names after *words* (its unmount report)."""
    lines = [line.split(words, 1)[1] for line in daemon.log().splitlines() if words in line]
    return [Path(line.strip().rsplit(" (", 1)[0]) for line in lines]


def test_a_write_the_target_takes_only_in_part_is_not_acknowledged_whole(workdir: Path) -> None:
    """A nearly full target takes part of a write (a short write). The kernel treats the reply
    to a write-back request as all or nothing, so the daemon writes the rest or fails the
    request: the writer's fsync fails, and never reports a short file as complete.

    RLIMIT_FSIZE on the daemon makes the target stop short at 1.5 MiB, in the middle of the
    kernel's second 1 MiB write-back request, every time."""
    with small_target("32M") as root:
        source = root / "backups"
        source.mkdir()
        mnt = workdir / "mnt"
        mnt.mkdir()
        limit = 3 * MiB // 2
        daemon = start_fusethrottle(
            source, mnt, ["batch=4M"], wrapper=["prlimit", f"--fsize={limit}", "--"]
        )
        daemon.expect_log_problems = True
        try:
            errors = back_up(mnt / "big.bin", 2)
            assert [call for call, _ in errors] == ["fsync"], errors
            assert errors[0][1] == errno.EFBIG
            assert (source / "big.bin").stat().st_size == limit
        finally:
            stopped(daemon)


# --- a target that fills while the daemon syncs in the background ------------------------------
def write_until_an_injected_fsync_fails(mnt: Path, fd: int) -> list[tuple[str, int]]:
    """Write into *fd* until a background fsync has found the target full; the write errors.

    Up to 96 MiB (the thin target stores 32): with the writeback cache the kernel may keep
    48 MiB of a FUSE mount's pages dirty before it writes any back (its share of the host's
    dirty limit), and the daemon syncs only what reached it."""
    errors: list[tuple[str, int]] = []
    for i in range(96):
        try:
            os.write(fd, pattern(i))
        except OSError as err:
            errors.append(("write", err.errno))
            break
        if i >= 16 and i % 4 == 0 and injected_fsync_errors(mnt):
            break
    assert wait_for(lambda: injected_fsync_errors(mnt) > 0, 30), "no background fsync failed"
    return errors


def calls(fd: int, *names: str) -> list[tuple[str, int]]:
    """Run fsync/close on *fd* in order; the errors they returned."""
    errors: list[tuple[str, int]] = []
    for name in names:
        try:
            os.fsync(fd) if name == "fsync" else os.close(fd)
        except OSError as err:
            errors.append((name, err.errno))
    return errors


def calls_write(fd: int) -> list[tuple[str, int]]:
    try:
        os.write(fd, b"one more")
    except OSError as err:
        return [("write", err.errno)]
    return []


@pytest.mark.parametrize("first", ["write", "fsync", "close"])
def test_a_background_fsyncs_enospc_reaches_the_writer_exactly_once(
    workdir: Path, first: str
) -> None:
    """The target takes the writes, then cannot store them (thin provisioning: an fsync is the
    first to learn). The failure of the daemon's own background fsync goes to the writer's
    next call (*first*: write without the writeback cache, fsync or close with it), and the
    calls after it succeed: one failure, one report."""
    with thin_target() as source:
        mnt = workdir / "mnt"
        mnt.mkdir()
        cache = "no" if first == "write" else "yes"
        daemon = start_fusethrottle(source, mnt, [f"writeback_cache={cache}", "batch=4M"])
        daemon.expect_log_problems = True
        try:
            fd = os.open(mnt / "big.bin", os.O_WRONLY | os.O_CREAT, 0o644)
            closed = False
            try:
                errors = write_until_an_injected_fsync_fails(mnt, fd)
                if first == "write":
                    if not errors:  # the failure came after the last write: one more
                        errors = calls_write(fd)
                    errors += calls(fd, "fsync", "fsync", "close")
                elif first == "fsync":
                    errors += calls(fd, "fsync", "fsync", "close")
                else:
                    errors += calls(fd, "close")
                closed = True
            finally:
                if not closed:
                    os.close(fd)
            assert errors == [(first, errno.ENOSPC)], errors
            # Nor does a later open hear of it again.
            assert calls(os.open(mnt / "big.bin", os.O_WRONLY), "fsync", "close") == []
            assert status(mnt)["fsync_errors"], "status shows no failed fsync"
            shown = [entry[:2] for entry in status(mnt)["target_errors"]]
            assert ["fsync", "ENOSPC"] in shown, shown
        finally:
            code = stopped(daemon)
    assert code == 0, daemon.log()  # the writer was told
    assert named(daemon, "incomplete on the target:") == [source / "big.bin"]
    assert named(daemon, "not on the target:") == []


def test_a_write_past_the_cache_whose_write_back_fails_is_refused(workdir: Path) -> None:
    """target_io=direct (a backup in its application's memory cgroup) writes what is not whole
    pages through the target's cache and waits for its write-back at once. On a target that
    cannot store it, that wait is told of the failure and the fsync after on that descriptor
    is not: a write fails with ENOSPC (the one that carried the bytes, or the next, told by the
    daemon's own sync), before the backup is told it succeeded."""
    with thin_target() as source:
        mnt = workdir / "mnt"
        mnt.mkdir()
        daemon = start_fusethrottle(
            source, mnt, ["target_io=direct", "writeback_cache=no", "batch=4M"]
        )
        daemon.expect_log_problems = True
        errors: list[tuple[str, int]] = []
        try:
            fd = os.open(mnt / "big.bin", os.O_WRONLY | os.O_CREAT, 0o644)
            for i in range(96):  # 96 MiB onto 32 of storage, none of it in whole pages
                try:
                    os.write(fd, pattern(i) + b"!")
                except OSError as err:
                    errors.append(("write", err.errno))
                    break
            errors += calls(fd, "fsync", "close")
        finally:
            stopped(daemon)
    assert errors[:1] == [("write", errno.ENOSPC)], errors


def test_an_unmount_that_leaves_data_off_the_target_exits_1_naming_each_file(
    workdir: Path,
) -> None:
    """SIGTERM while a backup is open and a background fsync has found the target full, before
    the writer heard of it: the daemon cannot make that data durable, so it exits 1 and logs
    the file's path on the target; a file that did arrive is not named."""
    with thin_target() as source:
        mnt = workdir / "mnt"
        mnt.mkdir()
        daemon = start_fusethrottle(source, mnt, ["batch=4M"])
        daemon.expect_log_problems = True
        try:
            assert back_up(mnt / "small.bin", 1) == []
            fd = os.open(mnt / "big.bin", os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                assert write_until_an_injected_fsync_fails(mnt, fd) == []
                daemon.signal(signal.SIGTERM)
                code = daemon.wait(60)
            finally:
                with contextlib.suppress(OSError):  # the mount is gone: ENOTCONN
                    os.close(fd)
        finally:
            stopped(daemon)
    assert code == 1, daemon.log()
    assert f"not on the target: {source / 'big.bin'} (No space left on device)" in daemon.log()
    assert named(daemon, "not on the target:") == [source / "big.bin"]
    assert named(daemon, "incomplete on the target:") == []  # named once, above


@pytest.mark.parametrize("how", ["rm", "mv over"])
def test_space_freed_through_the_mount_is_free_at_once(workdir: Path, how: str) -> None:
    """A backup filled the target; the operator removes it through the mount (or a new file is
    renamed over it) and at once writes the next one. The removed file's space must be free
    the moment the removal returns: a descriptor the daemon still held (a close deferred
    after release, the O_PATH of a looked-up file) kept it allocated, and the next file stayed
    empty with ENOSPC. On NFS the same descriptors turned the removal into a .nfsXXXXXXXX
    silly rename."""
    with small_target("64M") as root:
        source = root / "backups"
        source.mkdir()
        mnt = workdir / "mnt"
        mnt.mkdir()
        daemon = start_fusethrottle(source, mnt, [])
        daemon.expect_log_problems = True  # the target's ENOSPC is logged, on purpose
        try:
            for attempt in range(3):
                if how == "mv over":
                    # Made first: the backup fills the target to its last block (ext4 keeps
                    # its metadata reserve even from root), where no new file has room.
                    (mnt / "tiny").write_bytes(b"t")
                back_up(mnt / "big.bin", 80)  # more than fits: ends in ENOSPC
                assert (mnt / "big.bin").stat().st_size > 32 * MiB
                before = free_bytes(root)
                if how == "rm":
                    os.unlink(mnt / "big.bin")
                else:
                    os.rename(mnt / "tiny", mnt / "big.bin")
                freed = free_bytes(root) - before
                assert freed > 32 * MiB, f"attempt {attempt}: only {freed} bytes free at once"
                (mnt / "next").write_text("ok\n")
                assert (source / "next").read_text() == "ok\n", f"attempt {attempt}"
                (mnt / "next").unlink()
                (mnt / "big.bin").unlink(missing_ok=True)
        finally:
            code = stopped(daemon)
    assert code == 0, daemon.log()  # every writer was told of what did not fit
