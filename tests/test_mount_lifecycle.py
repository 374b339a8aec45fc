"""Mount lifecycle: every way a mount ends loses no acknowledged byte; every way to start one
wrongly is one clear line and nothing mounted; a killed daemon's stale mount is recoverable; a
hung target freezes only the paths that lead into it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import select
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import MakeMount
from mount_util import (
    FUSETHROTTLE,
    UNMOUNT_TRIES,
    Daemon,
    command_for_other_users,
    fusermount_unmount,
    mounted,
    status_json,
    wait_for,
)

from bench.system import fuse_abort

pytestmark = pytest.mark.mount

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
CHUNK = 64 * 1024

WRITER = textwrap.dedent(
    """
    import os, sys
    fd = os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o644)
    total, i = 0, 0
    while True:
        try:
            n = os.write(fd, bytes([i % 251]) * 65536)
        except OSError as err:
            print("stopped", err.strerror, flush=True)
            break
        if n != 65536:
            print("short write", n, flush=True)
            break
        total += n
        i += 1
        print(total, flush=True)
    """
)


def expected_stream(nbytes: int) -> bytes:
    return b"".join(bytes([i % 251]) * CHUNK for i in range(nbytes // CHUNK))


def read_lines_until(proc: subprocess.Popen[str], enough: Callable[[str], bool]) -> list[str]:
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        if ready:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.strip())
            if enough(line.strip()):
                return lines
    raise AssertionError(f"writer did not get there: {lines[-3:]}")


def last_fsync_follows_last_write(record: Path, name: str, size: int) -> bool:
    """The target saw an fsync of *name* at its final size, after the last write to it."""
    lines = record.read_text().splitlines()
    writes = [i for i, line in enumerate(lines) if line.startswith(f"write {name} ")]
    fsyncs = [i for i, line in enumerate(lines) if line.startswith(f"fsync {name} {size} ")]
    return bool(writes and fsyncs and fsyncs[-1] > writes[-1])


# --- ending a mount -----------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "fusermount3 -u", "umount"])
def test_every_way_of_ending_a_mount_keeps_every_acknowledged_byte(
    make_memfs: Callable[[str], tuple[Daemon, Path]], make_mount: MakeMount, how: str
) -> None:
    """A writer streams into the mount; the mount is ended under it. The daemon must exit 0,
    leave no mount behind, and the target must hold every byte write() acknowledged, fsynced
    after the last of them (the target here is memfs, which logs what reaches it)."""
    if how == "umount" and os.geteuid() != 0:
        pytest.skip("umount(8) of a FUSE mount needs root")
    target, record = make_memfs("target")
    ft = make_mount(source=target.mountpoint, name="top")
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(ft.mountpoint / "stream")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        seen = read_lines_until(writer, lambda line: line.isdigit() and int(line) >= (2 << 20))
        if how.startswith("SIG"):
            ft.signal(getattr(signal, how))  # the writer is still writing, the file still open
        else:
            writer.kill()  # an unmount needs the file closed, or the kernel says EBUSY
            writer.wait(30)
            command = ["umount"] if how == "umount" else ["fusermount3", "-u"]
            # As the harness's own stop: the kernel may still call the mount busy for a moment
            # after the writer's exit (its last file's release is asynchronous); an operator
            # retries, and so does this test, up to UNMOUNT_TRIES times half a second apart.
            for _ in range(UNMOUNT_TRIES):
                result = subprocess.run(
                    [*command, str(ft.mountpoint)], capture_output=True, text=True
                )
                if result.returncode == 0 or "busy" not in result.stderr.lower():
                    break
                time.sleep(0.5)
            assert result.returncode == 0, result.stderr
        assert ft.wait(60) == 0, ft.log()
        out, _ = writer.communicate(timeout=60)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    assert not ft.is_mounted()
    acked = max(int(line) for line in [*seen, *out.split()] if line.isdigit())
    assert acked >= 2 << 20
    data = (target.mountpoint / "stream").read_bytes()
    assert len(data) >= acked and data[:acked] == expected_stream(acked)
    assert last_fsync_follows_last_write(record, "stream", len(data)), record.read_text()[-500:]
    assert "all data synced" in ft.log()


MAPPED_WRITER = textwrap.dedent(
    """
    import mmap, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
    os.ftruncate(fd, 1 << 20)
    m = mmap.mmap(fd, 1 << 20)
    m[:] = bytes(range(256)) * 4096  # dirty pages, never msynced
    print("stored", flush=True)
    time.sleep(120)  # still mapped (FUSE writes a mapping back as it is unmapped)
    """
)


def first_difference(data: bytes, expected: bytes) -> int | None:
    """Where *data* first differs from *expected* (None: equal). Asserting on two MiB-long
    bytes would have pytest diff them, for many minutes."""
    if data == expected:
        return None
    pairs = zip(data, expected, strict=False)
    return next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(data), len(expected)))


@pytest.mark.parametrize("cache", ["yes", "no"])
def test_pages_stored_through_a_mapping_reach_the_target_at_a_stop(
    make_mount: MakeMount, cache: str
) -> None:
    """A process stored into a shared mapping of a file through the mount and keeps it
    mapped; the daemon is told to stop. The kernel writes those pages back while the daemon
    stops: it must take them (they are the kernel's write-back, not a caller's write to
    refuse), so the target holds them after the daemon exits 0."""
    ft = make_mount(options=[f"writeback_cache={cache}"])
    path = ft.mountpoint / "mapped"
    writer = subprocess.Popen(
        [sys.executable, "-c", MAPPED_WRITER, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "stored"
        assert ft.source is not None
        # Still only in the mount's page cache: the stop is what writes them back.
        assert first_difference((ft.source / "mapped").read_bytes(), bytes(1 << 20)) is None
        ft.signal(signal.SIGTERM)
        assert ft.wait(60) == 0, ft.log()
    finally:
        writer.kill()
        writer.wait()
    stored = bytes(range(256)) * 4096
    assert first_difference((ft.source / "mapped").read_bytes(), stored) is None


def test_background_mode_returns_once_the_mount_answers(workdir: Path) -> None:
    source, mountpoint = workdir / "src", workdir / "mnt"
    source.mkdir()
    mountpoint.mkdir()
    (source / "hello").write_text("world")
    result = subprocess.run(
        [FUSETHROTTLE, str(source), str(mountpoint)], capture_output=True, text=True, timeout=60
    )
    pids = _daemons_for(mountpoint)
    try:
        assert result.returncode == 0, result.stderr
        assert mounted(mountpoint, "fuse.fusethrottle")
        assert (mountpoint / "hello").read_text() == "world"  # usable the moment it returned
        assert len(pids) == 1
        assert fusermount_unmount(mountpoint).returncode == 0
        assert wait_for(lambda: not _daemons_for(mountpoint), 60), "daemon did not exit"
    finally:
        if mounted(mountpoint):
            fusermount_unmount(mountpoint, lazy=True)
        for pid in _daemons_for(mountpoint):
            os.kill(pid, signal.SIGKILL)


def _handles(pid: int, signum: int) -> bool:
    """Whether *pid* ignores or catches *signum* (it will not die of it)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":\t", 1) for line in f if ":\t" in line)
    except OSError:
        return False
    mask = int(fields["SigIgn"], 16) | int(fields["SigCgt"], 16)
    return bool(mask & (1 << (signum - 1)))


def test_a_stack_dump_request_while_starting_does_not_end_the_daemon(workdir: Path) -> None:
    """SIGUSR1 asks for a stack dump (status says so when a mount is stuck), and an operator
    may send it to a daemon that is still starting, or to the parent that waits for its
    mount. Both take care of it from their first steps (only the interpreter's own start-up
    comes before), then it arrives every 5 ms until the mount answers, in both modes."""
    source, mountpoint = workdir / "src", workdir / "mnt"
    source.mkdir()
    mountpoint.mkdir()
    (source / "hello").write_text("world")
    for extra in (["-f"], []):
        proc = subprocess.Popen(
            [FUSETHROTTLE, str(source), str(mountpoint), *extra],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        signalled = 0
        try:
            deadline = time.monotonic() + 30
            while not mounted(mountpoint, "fuse.fusethrottle") and time.monotonic() < deadline:
                if proc.poll() is not None:
                    break
                for pid in {proc.pid, *_daemons_for(mountpoint)}:
                    if _handles(pid, signal.SIGUSR1):
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGUSR1)
                            signalled += pid == proc.pid
                time.sleep(0.005)
            assert mounted(mountpoint, "fuse.fusethrottle"), (proc.poll(), proc.stderr)
            # The foreground daemon, or the parent waiting for the mount, took care of it
            # before the mount answered.
            assert signalled > 0, "the process started left SIGUSR1 fatal while starting"
            assert (mountpoint / "hello").read_text() == "world"
            if not extra:
                assert proc.wait(timeout=30) == 0  # the parent returns once it is mounted
            assert fusermount_unmount(mountpoint).returncode == 0
            assert wait_for(lambda: not _daemons_for(mountpoint), 60), "daemon did not exit"
            assert proc.wait(timeout=30) == 0
        finally:
            if mounted(mountpoint):
                fusermount_unmount(mountpoint, lazy=True)
            for pid in _daemons_for(mountpoint):
                os.kill(pid, signal.SIGKILL)
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=10)


def _daemons_for(mountpoint: Path) -> list[int]:
    """Processes whose command line names *mountpoint* (it is unique to this test)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if os.fsencode(mountpoint) in argv:
            found.append(int(entry))
    return found


# --- refusing bad input -------------------------------------------------------------------------
def assert_refused(result: subprocess.CompletedProcess[str], mountpoint: Path, *words: str) -> None:
    """Non-zero exit, exactly one line on stderr naming the problem, no traceback, no mount."""
    lines = result.stderr.splitlines()
    assert result.returncode != 0, result
    assert len(lines) == 1 and lines[0].startswith("fusethrottle: "), result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    assert not mounted(mountpoint)


def fusethrottle(
    *args: str, prefix: tuple[str, ...] = (), as_other_user: bool = False
) -> subprocess.CompletedProcess[str]:
    command = command_for_other_users() if as_other_user else [FUSETHROTTLE]
    return subprocess.run(
        [*prefix, *command, *args], capture_output=True, text=True, timeout=60, cwd="/"
    )


BAD_INPUT = {
    "missing source": (["{w}/nosuch", "{w}/mnt", "-f"], ["does not exist"]),
    "source is a file": (["{w}/file", "{w}/mnt", "-f"], ["not a directory"]),
    "missing mountpoint": (["{w}/src", "{w}/nosuch", "-f"], ["does not exist"]),
    "mountpoint is a file": (["{w}/src", "{w}/file", "-f"], ["not a directory"]),
    "mountpoint inside source": (["{w}/src", "{w}/src/inner", "-f"], ["inside"]),
    "unknown option": (["{w}/src", "{w}/mnt", "-o", "bogus_option", "-f"], ["bogus_option"]),
    "malformed size": (["{w}/src", "{w}/mnt", "-o", "batch=12Q", "-f"], ["batch", "12Q"]),
    "option without value": (["{w}/src", "{w}/mnt", "-o", "window", "-f"], ["window"]),
    "window below batch": (["{w}/src", "{w}/mnt", "-o", "batch=64M,window=32M"], ["window"]),
    "unknown argument": (["{w}/src", "{w}/mnt", "--bogus"], ["--bogus"]),
    "one path only": (["{w}/src"], ["SOURCE and MOUNTPOINT"]),
    "background, missing source": (["{w}/nosuch", "{w}/mnt"], ["does not exist"]),
    "instance file missing": (
        ["--conf", "{w}/nosuch.conf", "{w}/mnt", "-f"],
        ["cannot read", "nosuch.conf"],
    ),
    "instance file not KEY=value": (["--conf", "{w}/file", "{w}/mnt", "-f"], ["file", "line 1"]),
    "instance file and a source": (
        ["--conf", "{w}/file", "{w}/src", "{w}/mnt", "-f"],
        ["only MOUNTPOINT"],
    ),
    "permissions=target as the daemon": (
        ["{w}/src", "{w}/mnt", "-o", "permissions=target,credentials=daemon", "-f"],
        ["permissions=target", "credentials=caller"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input_is_one_line_and_nothing_mounted(workdir: Path, case: str) -> None:
    for name in ("src", "mnt", "src/inner"):
        (workdir / name).mkdir()
    (workdir / "file").write_text("not a directory")
    template, words = BAD_INPUT[case]
    result = fusethrottle(*(arg.format(w=workdir) for arg in template))
    assert_refused(result, workdir / "mnt", *words)


def test_busy_mountpoint_is_refused_and_the_mount_there_keeps_serving(
    ft: Daemon, workdir: Path
) -> None:
    (ft.mountpoint / "still").write_text("here")
    other = workdir / "other-src"
    other.mkdir()
    result = fusethrottle(str(other), str(ft.mountpoint), "-f")
    lines = result.stderr.splitlines()
    assert result.returncode != 0 and len(lines) == 1 and "busy" in lines[0], result.stderr
    assert [m for m in _mount_sources(ft.mountpoint)] == [str(ft.source)]
    assert (ft.mountpoint / "still").read_text() == "here"


def _mount_sources(mountpoint: Path) -> list[str]:
    from mount_util import mount_table

    return [src for m, _, src in mount_table() if m == str(mountpoint)]


@needs_root
def test_missing_dev_fuse_is_one_line(workdir: Path) -> None:
    """In a private mount namespace whose /dev has no fuse device."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    for name in ("src", "mnt"):
        (workdir / name).mkdir()
    script = 'mount -t tmpfs none /dev && exec "$@"'
    prefix = ("unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh")
    result = fusethrottle(str(workdir / "src"), str(workdir / "mnt"), "-f", prefix=prefix)
    assert_refused(result, workdir / "mnt", "/dev/fuse")


@needs_root
@pytest.mark.parametrize("allow_other", [False, True])
def test_unprivileged_user_is_refused_with_one_line(workdir: Path, allow_other: bool) -> None:
    """As nobody: without access to /dev/fuse, and - in a private mount namespace where a
    world-writable fuse device node stands in for /dev/fuse - asking for allow_other without
    'user_allow_other' in /etc/fuse.conf."""
    if shutil.which("unshare") is None or shutil.which("setpriv") is None:
        pytest.skip("unshare and setpriv are needed")
    with open("/etc/fuse.conf") as f:
        if any(line.strip() == "user_allow_other" for line in f):
            pytest.skip("/etc/fuse.conf allows allow_other for every user here")
    for name in ("src", "mnt"):
        (workdir / name).mkdir()
        os.chown(workdir / name, 65534, 65534)
    as_nobody = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
    args = [str(workdir / "src"), str(workdir / "mnt"), "-f"]
    if not allow_other:
        result = fusethrottle(*args, prefix=as_nobody, as_other_user=True)
        assert_refused(result, workdir / "mnt")
        return
    device = workdir / "fuse"
    os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(10, 229))
    os.chmod(device, 0o666)
    script = f'mount --bind {device} /dev/fuse && exec "$@"'
    prefix = ("unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh")
    result = fusethrottle(
        *args, "-o", "allow_other", prefix=(*prefix, *as_nobody), as_other_user=True
    )
    assert_refused(result, workdir / "mnt", "allow_other")


# --- a killed daemon ----------------------------------------------------------------------------
def test_killed_daemon_leaves_a_stale_mount_that_can_be_cleared(make_mount: MakeMount) -> None:
    # A long attribute timeout, and the root's attributes fresh in the kernel's cache when the
    # daemon dies: a stat of the dead mount is then answered from that cache, so only a
    # question that always reaches the daemon (statfs) tells a stale mount from a busy one.
    first = make_mount(options=["attr_timeout=600"])
    assert first.source is not None
    (first.mountpoint / "before").write_text("written before the crash")
    os.stat(first.mountpoint)
    first.signal(signal.SIGKILL)
    assert first.wait(30) == -signal.SIGKILL
    assert first.is_mounted()  # the kernel keeps the dead mount until someone clears it
    with pytest.raises(OSError) as dead:
        os.statvfs(first.mountpoint)
    assert dead.value.errno == errno.ENOTCONN

    result = fusethrottle(str(first.source), str(first.mountpoint), "-f")
    lines = result.stderr.splitlines()
    assert result.returncode != 0 and len(lines) == 1, result.stderr
    assert "stale" in lines[0] and "fusermount3 -u" in lines[0]

    assert fusermount_unmount(first.mountpoint).returncode == 0
    assert not mounted(first.mountpoint)
    second = make_mount(source=first.source)
    assert (second.mountpoint / "before").read_text() == "written before the crash"
    (second.mountpoint / "after").write_text("and after it")
    assert (first.source / "after").read_text() == "and after it"


def test_a_daemon_killed_before_its_mount_answers_still_exits(
    make_memfs: Callable[..., tuple[Daemon, Path]], workdir: Path
) -> None:
    """systemd kills a daemon whose start takes too long (TimeoutStartSec), for instance while
    a slow target answers the daemon's check that its new mount answers. A process waiting on
    the mount it serves itself cannot be killed once it has read that request (the kernel waits
    for the answer, and the answer would have to come from the process being killed), so the
    check must not run in the daemon: SIGKILL must end it and leave a stale mount that
    ``fusermount3 -u`` clears, as for a daemon killed at any other time."""
    delay = 2.0
    slow, _ = make_memfs("slow", slow_getattr=delay)  # every stat of the target takes 2 s
    mountpoint = workdir / "mnt"
    mountpoint.mkdir()
    log_path = workdir / "mnt.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [FUSETHROTTLE, str(slow.mountpoint), str(mountpoint), "-f"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    try:
        assert wait_for(lambda: mounted(mountpoint) or proc.poll() is not None, 60)
        assert mounted(mountpoint), log_path.read_text()
        time.sleep(delay / 3)  # the check's stat has reached the daemon and waits on the target
        assert f"on {mountpoint}" not in log_path.read_text(), "the check was not in flight"
        proc.send_signal(signal.SIGKILL)
        try:
            code = proc.wait(timeout=delay + 30)
        except subprocess.TimeoutExpired:
            pytest.fail("the daemon, killed while checking its own mount, never exited")
        assert code == -signal.SIGKILL
        assert mounted(mountpoint)  # stale, as after any kill
        assert fusermount_unmount(mountpoint).returncode == 0
        assert not mounted(mountpoint)
    finally:
        if proc.poll() is None:
            fuse_abort(mountpoint)  # the old bug: only aborting its connection ends it
            proc.kill()
            proc.wait(timeout=30)
        if mounted(mountpoint):
            fusermount_unmount(mountpoint, lazy=True)


FSYNCING_WRITER = textwrap.dedent(
    """
    import os, sys
    fd = os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o644)
    acked, i = 0, 0
    while True:
        try:
            n = os.write(fd, bytes([i % 251]) * 65536)
            os.fsync(fd)
        except OSError as err:
            print("error", err.errno, flush=True)
            break
        if n != 65536:
            print("short write", n, flush=True)
            break
        acked += n
        i += 1
        print(acked, flush=True)
    """
)
CLEAR_STALE_MOUNT = Path(__file__).parents[1] / "systemd" / "clear-stale-mount"


@needs_root  # clear-stale-mount unmounts with umount(8)
def test_a_daemon_killed_mid_backup_fails_the_writer_keeps_what_was_fsynced_and_restarts(
    make_mount: MakeMount,
) -> None:
    """SIGKILL while a backup writes and fsyncs: its next call fails (the mount is gone: no
    hang), every byte an fsync acknowledged is on the target, and what systemd does next
    (fusethrottle@.service: ExecStartPre=clear-stale-mount, then ExecStart) serves again.
    systemd need not run here: the unit's two commands are run as it would run them."""
    first = make_mount(options=["defaults"])
    assert first.source is not None
    writer = subprocess.Popen(
        [sys.executable, "-c", FSYNCING_WRITER, str(first.mountpoint / "stream")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        seen = read_lines_until(writer, lambda line: line.isdigit() and int(line) >= (1 << 20))
        first.signal(signal.SIGKILL)
        assert first.wait(30) == -signal.SIGKILL
        try:
            out, _ = writer.communicate(timeout=60)  # bounds a hang; no claim on speed
        except subprocess.TimeoutExpired:
            pytest.fail("the writer hung on the dead mount")
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    lines = [*seen, *out.split()]
    # ENOTCONN or ECONNABORTED from the dead connection; EIO when the kill came while the
    # writer's fsync had the kernel's cached pages on their way (their write-back failed, and
    # the kernel reports a failed write-back as EIO): either way an error, and no byte of it
    # acknowledged.
    failures = (errno.ENOTCONN, errno.ECONNABORTED, errno.EIO)
    assert out.splitlines()[-1] in [f"error {code}" for code in failures], out
    acked = max(int(line) for line in lines if line.isdigit())
    assert (first.source / "stream").read_bytes()[:acked] == expected_stream(acked)

    assert first.is_mounted()  # stale: "Transport endpoint is not connected"
    cleared = subprocess.run(
        [str(CLEAR_STALE_MOUNT), str(first.mountpoint)], capture_output=True, text=True, timeout=60
    )
    assert cleared.returncode == 0, cleared.stderr
    assert not mounted(first.mountpoint)
    second = make_mount(source=first.source, options=["defaults"])
    assert (second.mountpoint / "stream").read_bytes()[:acked] == expected_stream(acked)
    (second.mountpoint / "after").write_text("served again")
    assert (first.source / "after").read_text() == "served again"


# --- a hung target ------------------------------------------------------------------------------
def answers(args: list[str], timeout: float = 10.0) -> subprocess.CompletedProcess[str]:
    """Run a command that must come back; a hang here is the failure being tested for."""
    try:
        result = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(args)} hung while the target was frozen")
    assert result.returncode == 0, result.stderr
    return result


@pytest.mark.parametrize("ending", ["fusermount3 -u", "fusermount3 -uz", "SIGTERM"])
def test_hung_target_freezes_only_the_paths_into_it(
    make_memfs: Callable[[str], tuple[Daemon, Path]],
    make_mount: MakeMount,
    workdir: Path,
    ending: str,
) -> None:
    """A backing directory with a FUSE sub-mount whose daemon is stopped (a dead NFS server):
    stat, readdir, statfs, reads and fsynced writes elsewhere answer, and the mount can be
    ended. With a process stuck in the dead subtree ("victim"), the kernel will not let it go
    (it waits uninterruptibly once the daemon has read its request, even through SIGKILL) and
    refuses a plain unmount as busy; a lazy unmount or SIGTERM must still end the daemon within
    its grace period, which releases the victim."""
    backing = workdir / "backing"
    (backing / "ok").mkdir(parents=True)
    (backing / "ok" / "a").write_text("fine")
    (backing / "hung").mkdir()
    frozen, _ = make_memfs("backing/hung")
    (frozen.mountpoint / "file").write_text("in the hung subtree")
    ft = make_mount(source=backing, name="top")
    top = ft.mountpoint
    # Warm up with a stat, not a read: the daemon's close() of a file it read is asynchronous,
    # and a FUSE server stopped while holding that request would make the daemon unkillable
    # (an artifact of using FUSE as the dead target; NFS waits are killable).
    assert (top / "hung" / "file").stat().st_size == len("in the hung subtree")

    frozen.freeze()
    victim = None
    if ending != "fusermount3 -u":
        victim = subprocess.Popen(
            ["stat", str(top / "hung" / "never-seen")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        time.sleep(1.0)
        assert victim.poll() is None  # stuck, as it would be on the dead server itself
    assert "fine" in answers(["cat", str(top / "ok" / "a")]).stdout
    assert answers(["ls", str(top / "ok")]).stdout.split() == ["a"]
    answers(["stat", str(top / "ok" / "a")])
    answers(["stat", "-f", str(top)])
    answers(["stat", str(top)])
    dd = ["dd", "if=/dev/zero", f"of={top / 'ok' / 'new'}", "bs=64k", "count=16"]
    answers([*dd, "conv=fsync"])
    assert (backing / "ok" / "new").stat().st_size == 16 * 65536

    if ending == "fusermount3 -u":
        answers(["fusermount3", "-u", str(top)], timeout=30)
    else:
        assert victim is not None
        busy = subprocess.run(
            ["fusermount3", "-u", str(top)], capture_output=True, text=True, timeout=30
        )
        assert busy.returncode != 0 and "busy" in busy.stderr  # answers, and says why
        if ending == "SIGTERM":
            ft.signal(signal.SIGTERM)
        else:
            answers(["fusermount3", "-u", "-z", str(top)], timeout=30)
    assert ft.wait(60) == 0, "daemon did not exit while its target was hung:\n" + ft.log()
    assert not ft.is_mounted()
    if victim is not None:
        try:
            victim.wait(30)  # released with an error once the daemon's connection closed
        except subprocess.TimeoutExpired:
            pytest.fail("the process stuck in the dead subtree was never released")
        assert victim.returncode != 0
    # The daemon abandons the request stuck on the dead target; that is the one thing it says.
    problems = [line for line in ft.log().splitlines() if re.search(r"WARNING|ERROR", line)]
    assert all("stuck" in line for line in problems), problems
    ft.expect_log_problems = True


def _stuck_then_killed(victim: subprocess.Popen[Any], frozen: Daemon) -> None:
    """*victim* waits on the frozen target, as on the dead server itself; SIGKILL ends it."""
    time.sleep(2.0)
    assert victim.poll() is None
    victim.kill()
    try:
        victim.wait(20)
    except subprocess.TimeoutExpired:
        wchan = Path(f"/proc/{victim.pid}/wchan").read_text()
        frozen.signal(signal.SIGCONT)  # let it go, or the test run hangs on it
        victim.wait(60)
        pytest.fail(f"SIGKILL did not end a process waiting on the hung target ({wchan})")
    assert victim.returncode == -signal.SIGKILL


@pytest.mark.parametrize("call", ["stat", "ls", "cat", "create"])
def test_a_process_waiting_on_a_hung_target_can_be_killed(
    make_memfs: Callable[[str], tuple[Daemon, Path]],
    make_mount: MakeMount,
    workdir: Path,
    call: str,
) -> None:
    """On a hard NFS mount whose server is gone a process still dies on SIGKILL (or on a
    SIGTERM it does not handle): NFS sleeps killable. Through a FUSE mount the kernel holds the
    caller of a request the daemon has read until the daemon answers, so ``kill -9`` of a
    backup stuck on the hung target did nothing. The daemon answers the request of a caller
    that is being killed (EINTR): it dies as on NFS, and the mount keeps serving."""
    backing = workdir / "backing"
    (backing / "ok").mkdir(parents=True)
    (backing / "hung").mkdir()
    frozen, _ = make_memfs("backing/hung")
    (frozen.mountpoint / "file").write_text("in the hung subtree")
    (frozen.mountpoint / "dir").mkdir()
    ft = make_mount(source=backing, name="top")
    hung = ft.mountpoint / "hung"
    assert hung.is_dir()
    command = {
        "stat": ["stat", str(hung / "never-seen")],
        "ls": ["ls", str(hung / "dir")],
        "cat": ["cat", str(hung / "file")],
        "create": ["dd", "if=/dev/zero", f"of={hung / 'new'}", "count=1", "conv=fsync"],
    }[call]
    frozen.freeze()
    victim = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    _stuck_then_killed(victim, frozen)
    # The daemon, and every path outside the hung subtree, kept serving.
    assert answers(["ls", str(ft.mountpoint / "ok")]).returncode == 0
    assert status_json(ft.mountpoint)


# Opens its file (or directory) through the mount, says so, waits for a line on stdin (the
# target is frozen then) and makes one call through the open descriptor.
_STUCK_ON_AN_OPEN_FILE = """
import os, sys
path, call = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY if call == "readdir" else os.O_RDWR)
print("open", flush=True)
sys.stdin.readline()
if call == "read":
    os.read(fd, 4096)
elif call == "write":
    os.write(fd, b"x" * 4096)
else:
    os.listdir(fd)
"""


@pytest.mark.parametrize("call", ["read", "write", "readdir"])
def test_a_process_stuck_on_an_open_file_of_a_hung_target_can_be_killed(
    make_memfs: Callable[[str], tuple[Daemon, Path]],
    make_mount: MakeMount,
    workdir: Path,
    call: str,
) -> None:
    """As above, for a call through a descriptor opened before the target hung: a backup
    reading its source or writing its archive when the server went away. The daemon answers
    the killed caller at once while its own call still waits on the target, and the kernel may
    release the handle meanwhile: the descriptor stays the handler's until it returns (it
    must not be closed, nor its number reused, under it). Writes without the writeback
    cache, where each write() is a request of its own."""
    backing = workdir / "backing"
    (backing / "ok").mkdir(parents=True)
    (backing / "hung").mkdir()
    frozen, _ = make_memfs("backing/hung")
    (frozen.mountpoint / "file").write_text("in the hung subtree")
    (frozen.mountpoint / "dir").mkdir()
    (frozen.mountpoint / "dir" / "entry").write_text("listed")
    ft = make_mount(source=backing, name="top", options=("writeback_cache=no",))
    path = ft.mountpoint / "hung" / ("dir" if call == "readdir" else "file")
    victim = subprocess.Popen(
        [sys.executable, "-c", _STUCK_ON_AN_OPEN_FILE, str(path), call],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert victim.stdout is not None and victim.stdin is not None
    assert victim.stdout.readline() == "open\n"
    frozen.freeze()
    victim.stdin.write("go\n")
    victim.stdin.flush()
    _stuck_then_killed(victim, frozen)
    assert answers(["ls", str(ft.mountpoint / "ok")]).returncode == 0
    assert status_json(ft.mountpoint)
    # The target comes back: the call the daemon still made ends, and the mount serves on.
    frozen.signal(signal.SIGCONT)
    frozen.stopped = False
    # (The write the killed writer sent reaches the target, as an NFS WRITE sent before the
    # kill does.)
    landed = ("in the hung subtree", "x" * 4096) if call == "write" else ("in the hung subtree",)
    assert (ft.mountpoint / "hung" / "file").read_text() in landed
    assert sorted(os.listdir(ft.mountpoint / "hung" / "dir")) == ["entry"]
    assert ft.stop() == 0, ft.log()


def test_a_stop_with_a_hung_target_and_closes_queued_ends_within_unmount_timeout(
    make_memfs: Callable[..., tuple[Daemon, Path]],
    make_mount: MakeMount,
    workdir: Path,
) -> None:
    """SIGTERM while the target hangs (each call takes 20 s), with a file's data not yet
    synced and released files' descriptors waiting to be closed (on NFS a close writes back
    and waits for the server): the mount is gone within unmount_timeout, the file that is not
    on the target is named, and the daemon exits 1 once the target lets its threads go. The
    closes run in worker threads, never on the event loop, where each would have held the stop
    for the whole 20 s."""
    backing = workdir / "backing"
    backing.mkdir()
    switch = workdir / "slow-now"
    target, _ = make_memfs("backing/slow", slow_all_while=(switch, 20.0))
    ft = make_mount(
        source=backing,
        options=["writeback_cache=no", "unmount_timeout=3s", "max_age=1h"],
        name="top",
    )
    slow = ft.mountpoint / "slow"
    holder_program = textwrap.dedent(
        """
        import os, sys, time
        fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
        os.write(fd, b"x" * (1 << 20))
        print("ready", flush=True)
        time.sleep(3600)
        """
    )
    holders = {
        name: subprocess.Popen(
            [sys.executable, "-c", holder_program, str(slow / name)],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for name in ("first", "second", "dirty")
    }
    try:
        for name, holder in holders.items():
            assert read_lines_until(holder, lambda line: line == "ready")
            if name != "dirty":
                os.fsync(os.open(slow / name, os.O_RDONLY))  # nothing of it left to sync
        switch.touch()
        # A killed holder's close at exit is a FLUSH that waits on the target (answered
        # EINTR: the caller is dying), then a RELEASE: the first one's descriptor is being
        # closed in a worker thread (held by the target) when the second one's queues up.
        holders["first"].kill()
        time.sleep(0.6)  # the daemon looks at dying callers every 0.5 s
        holders["second"].kill()
        for name in ("first", "second"):
            holders[name].wait(60)
        stop = time.monotonic()
        ft.signal(signal.SIGTERM)
        assert wait_for(lambda: not ft.is_mounted(), 3 + 4), "the mount outlived the stop"
        took = time.monotonic() - stop
        switch.unlink()  # the target is back: the calls it holds end within 20 s
        code = ft.wait(90)
    finally:
        for holder in holders.values():
            holder.kill()
            holder.wait(60)
        switch.unlink(missing_ok=True)
    assert took < 3 + 4, f"the stop took {took:.1f} s"
    assert code == 1, ft.log()
    assert f"not on the target: {backing / 'slow' / 'dirty'}" in ft.log()
    ft.expect_log_problems = True
    target.expect_log_problems = True
