"""A server that stops mid-backup (issue 31, item 5).

The NFS server goes away for a while (knfsd stopped with ``rpc.nfsd 0``, or every packet of
the client's link dropped) while a backup streams through the mount. What the operator and the
backup tool must still get:

* on a hard mount: ``fusethrottle status`` and the metrics endpoint keep answering; another
  fusethrottle mount on the host (over a healthy local directory) is unaffected; SIGTERM or an
  unmount ends the daemon within its ``unmount_timeout`` (plus the bounded grace its design
  adds) with exit 1, naming every file not on the target; and when the server comes back
  instead, the backup completes byte for byte;
* on a soft mount: the writer is told (EIO or ETIMEDOUT from write, fsync or close), as on the
  soft mount directly, and nothing an fsync acknowledged before the outage is lost;
* a process waiting on the mount can be killed whenever the same call directly on NFS can.

Outages are kept short (about 25 s; the lab's NFSv4 grace period is 10 s, bench/nfslab/guest.py)
and the server is always restarted in a ``finally``, so later tests run.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from mount_util import FUSETHROTTLE, Daemon, problems_in_log

from bench.nfslab import profiles
from fusethrottle.service.daemon import LOOP_END_GRACE

from .lab import (
    alive,
    nfs_mount,
    nfs_unmount,
    on_server,
    outage,
    record,
    server_start,
    server_stop,
    wait_gone,
    wchan,
)

pytestmark = [pytest.mark.mount]

MakeMount = Callable[..., Daemon]  # the make_mount fixture of tests/conftest.py

MiB = 1 << 20
#: How long the server stays away in the tests where it comes back.
OUTAGE_SECONDS = 25.0
#: The daemons' unmount_timeout in these tests (the default is 600 s).
UNMOUNT_TIMEOUT = 10.0
#: How long a SIGTERM may take with the target gone: the kernel cache's write-back and the
#: final fsyncs are each bounded by unmount_timeout, the loop's end by LOOP_END_GRACE at each of
#: its three steps (daemon.py), plus a generous margin for the lab's slow CPU. The server stays
#: away this long.
STOP_BOUND = 2 * UNMOUNT_TIMEOUT + 3 * LOOP_END_GRACE + 24.0
#: "Eventually" after the server is back: NFS reconnects, TCP backs off, v4 recovers state.
RECOVERY = 240.0

#: A backup tool streaming one file: 1 MiB chunks, an fsync every *every* chunks; says how far
#: it got ("written N", "fsynced N") and what failed ("error CALL ERRNO"); *total* 0: until an
#: error. Stops writing at the first error, and still closes (a tool cleans up).
WRITER = textwrap.dedent(
    """
    import errno, hashlib, itertools, os, sys
    path, total, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

    def say(*words):
        print(*words, flush=True)

    def chunk(i):
        return hashlib.sha256(str(i).encode()).digest() * (1 << 15)

    def name(err):
        return errno.errorcode.get(err.errno, str(err.errno))

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    call = "write"
    try:
        for i in itertools.count() if total == 0 else range(total):
            data = chunk(i)
            while data:
                data = data[os.write(fd, data):]
            say("written", i + 1)
            if (i + 1) % every == 0:
                call = "fsync"
                os.fsync(fd)
                call = "write"
                say("fsynced", i + 1)
        call = "fsync"
        os.fsync(fd)
        say("fsynced", total)
        call = "close"
        os.close(fd)
        say("closed")
    except OSError as err:
        say("error", call, name(err))
        if call != "close":
            try:
                os.close(fd)
            except OSError as err:
                say("error", "close", name(err))
    """
)


def chunk(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest() * (MiB // 32)


class Writer:
    """WRITER in a child process; its progress as it reports it."""

    def __init__(self, path: Path, total: int = 0, every: int = 4) -> None:
        self.path = path
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), str(total), str(every)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.strip())

    def _count(self, word: str) -> int:
        return max((int(x.split()[1]) for x in self.lines if x.startswith(word + " ")), default=0)

    def written(self) -> int:
        return self._count("written")

    def fsynced(self) -> int:
        """MiB acknowledged by an fsync (the tool may rely on them)."""
        return self._count("fsynced")

    def has_fsynced(self, chunks: int) -> Callable[[], bool]:
        return lambda: self.fsynced() >= chunks

    def errors(self) -> list[tuple[str, str]]:
        return [tuple(x.split()[1:3]) for x in self.lines if x.startswith("error ")]  # type: ignore[misc]

    def closed(self) -> bool:
        return "closed" in self.lines

    def ended(self) -> bool:
        return self.proc.poll() is not None

    def wait_until(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert self.proc.poll() is None or predicate(), f"the writer ended: {self.lines}"
            assert time.monotonic() < deadline, f"{what} not within {timeout:.0f} s: {self.lines}"
            time.sleep(0.2)

    def reap(self, timeout: float) -> None:
        """Wait for the writer to end; kill it (by pid) if it does not."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):  # stuck in the kernel
                self.proc.wait(30)


def arrived(path: Path, chunks: int) -> bool:
    """Whether the first *chunks* MiB of *path* are the writer's."""
    with open(path, "rb") as f:
        return all(f.read(MiB) == chunk(i) for i in range(chunks))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=15) as response:
        return str(response.read().decode())


def bounded(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str] | None:
    """Run *argv*; None if it did not end within *timeout* (then it is killed, by pid, and
    not waited for: it may be stuck in the kernel)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return None
    return subprocess.CompletedProcess(argv, proc.returncode, out, "")


def status_answers(mountpoint: Path) -> subprocess.CompletedProcess[str] | None:
    return bounded([FUSETHROTTLE, "status", str(mountpoint), "--json"], 20)


#: What a backup does on a healthy mount: write, fsync, read back, list, statfs, remove.
HEALTHY_WORK = textwrap.dedent(
    """
    import os, sys
    d = sys.argv[1]
    data = os.urandom(4 << 20)
    with open(os.path.join(d, "h.bin"), "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    with open(os.path.join(d, "h.bin"), "rb") as f:
        assert f.read() == data
    assert "h.bin" in os.listdir(d)
    os.statvfs(d)
    os.unlink(os.path.join(d, "h.bin"))
    print("ok")
    """
)


@pytest.fixture
def healthy_mount(make_mount: MakeMount, workdir: Path) -> Iterator[Daemon]:
    """A second fusethrottle mount on this host, over a local tmpfs the outage cannot touch."""
    source = workdir / "tmpfs"
    source.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m", "ft-healthy", str(source)], check=True
    )
    try:
        yield make_mount(source=source, name="healthy")
    finally:
        # The fixture unmounts the FUSE mount after this; a busy tmpfs then goes lazily.
        subprocess.run(["umount", "-l", str(source)], check=False)


def daemon_threads(daemon: Daemon) -> dict[str, int]:
    """Where the daemon's threads wait in the kernel: wchan and state -> how many threads."""
    counts: dict[str, int] = {}
    for task in Path(f"/proc/{daemon.pid}/task").glob("*"):
        where = wchan(int(task.name))
        counts[where] = counts.get(where, 0) + 1
    return counts


@pytest.mark.parametrize("kind", ["server", "link"])
def test_during_an_outage_status_metrics_and_other_mounts_answer_and_the_backup_completes(
    make_mount: MakeMount, nfs_dir: Path, healthy_mount: Daemon, kind: str
) -> None:
    """While the server is away (hard mount) the operator still sees the mount's state
    (``status``, metrics), a backup on another fusethrottle mount of the host goes on, and
    once the server is back the interrupted backup completes byte for byte, exit 0."""
    port = free_port()
    mnt = make_mount(source=nfs_dir, options=(f"metrics={port}",))
    total = 64
    writer = Writer(mnt.mountpoint / "backup.bin", total=total, every=4)
    try:
        writer.wait_until(writer.has_fsynced(4), 180, "the first fsync")
        facts: dict[str, object] = {"kind": kind}
        with outage(kind):
            stopped = time.monotonic()
            time.sleep(3)
            status = status_answers(mnt.mountpoint)
            try:
                metrics: str | None = scrape(port)
            except OSError as err:
                metrics = None
                facts["metrics_error"] = str(err)
            healthy = bounded(
                [sys.executable, "-c", HEALTHY_WORK, str(healthy_mount.mountpoint)], 60
            )
            healthy_status = status_answers(healthy_mount.mountpoint)
            time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - stopped)))
            late_status = status_answers(mnt.mountpoint)
            facts.update(
                written_at_return=writer.written(),
                fsynced_at_return=writer.fsynced(),
                writer_ended_during_outage=writer.ended(),
                daemon_threads=daemon_threads(mnt),
            )
        returned = time.monotonic()
        while not writer.ended() and time.monotonic() - returned < RECOVERY:
            time.sleep(0.2)
        facts.update(writer=writer.lines[-3:], ended_after_return=writer.ended())
        facts["seconds_to_end_after_return"] = round(time.monotonic() - returned, 1)
        record(f"outage-backup-completes[{kind}]", **facts)
        assert status is not None and status.returncode == 0, f"status during the outage: {status}"
        assert late_status is not None and late_status.returncode == 0, late_status
        assert metrics is not None and "fusethrottle_" in metrics, facts.get("metrics_error")
        assert healthy is not None, "the healthy mount's backup hung during the outage"
        assert healthy.stdout.strip() == "ok", healthy.stdout
        assert healthy_status is not None and healthy_status.returncode == 0, healthy_status
        assert writer.ended(), f"the backup did not end {RECOVERY:.0f} s after the outage"
        assert writer.errors() == [] and writer.closed(), writer.lines
        assert arrived(on_server(nfs_dir / "backup.bin"), total)
        assert on_server(nfs_dir / "backup.bin").stat().st_size == total * MiB
    finally:
        writer.reap(RECOVERY)
    assert mnt.stop() == 0, mnt.log()


@pytest.mark.parametrize("how", ["SIGTERM", "umount -l"])
def test_stopping_the_daemon_during_an_outage_ends_it_in_time_naming_what_is_not_on_the_target(
    make_mount: MakeMount, nfs_dir: Path, how: str
) -> None:
    """systemctl stop (SIGTERM), or an unmount, while the server is away and a backup is
    streaming: within unmount_timeout the daemon gives up, logs which file is not on the
    target (so the operator knows the backup is incomplete) and lets the mount go, so the host
    can go on without waiting for the server. Its exit status is 1.

    What the daemon cannot do: end a thread the target's client holds. An fsync waiting for
    NFS page write-back sleeps uninterruptibly on a hard mount (as a writer on NFS directly
    does), so the kernel keeps the process, its main thread already ended, until the server
    answers; the status arrives then."""
    mnt = make_mount(source=nfs_dir, options=(f"unmount_timeout={UNMOUNT_TIMEOUT:.0f}s",))
    mnt.expect_log_problems = True  # it must log what is not on the target
    writer = Writer(mnt.mountpoint / "backup.bin", total=0, every=4)
    facts: dict[str, object] = {"how": how, "bound": STOP_BOUND}
    try:
        writer.wait_until(writer.has_fsynced(4), 180, "the first fsync")
        with outage("server"):
            time.sleep(3)  # the writer now waits on the server, with data not on it
            status = status_answers(mnt.mountpoint)
            facts["status_rc"] = status.returncode if status is not None else None
            start = time.monotonic()
            if how == "SIGTERM":
                mnt.signal(signal.SIGTERM)
            else:
                # --no-canonicalize: no stat of the mountpoint, which the daemon would answer
                # from the stopped server.
                detach = ["umount", "-l", "--no-canonicalize", str(mnt.mountpoint)]
                subprocess.run(detach, check=True, timeout=30)
            code = mnt.wait(STOP_BOUND)
            facts.update(exit=code, seconds=round(time.monotonic() - start, 1))
            log_at_bound = mnt.log()
            mounted_at_bound = mnt.is_mounted()
            threads = daemon_threads(mnt) if code is None else {}
            facts.update(mounted_at_bound=mounted_at_bound, daemon_threads=threads)
            facts["writer"] = writer.lines[-2:]
        late = code if code is not None else mnt.wait(RECOVERY)
        facts.update(exit_after_return=late, ended_after=round(time.monotonic() - start, 1))
        record(f"outage-stop[{how}]", **facts)
    finally:
        writer.reap(RECOVERY)
    said = [line for line in log_at_bound.splitlines() if "not on the target:" in line]
    assert any(f"not on the target: {nfs_dir / 'backup.bin'}" in line for line in said), (
        f"{how} with the server stopped: no word of what is not on the target after "
        f"{STOP_BOUND:.0f} s (unmount_timeout={UNMOUNT_TIMEOUT:.0f}s)\n{log_at_bound[-6000:]}"
    )
    assert not mounted_at_bound, "the mount was still there"
    if code is None:  # only the kernel's uninterruptible waits may hold what is left of it
        held = {where: n for where, n in threads.items() if not where.endswith(" D")}
        assert set(held) <= {"0 Z"}, f"threads still running after the bound: {threads}"
    assert late == 1, mnt.log()


def test_on_a_soft_mount_the_writer_is_told_and_nothing_fsynced_is_lost(
    make_mount: MakeMount, workdir: Path
) -> None:
    """On a soft NFS mount a backup whose server goes away fails (EIO or ETIMEDOUT from write,
    fsync or close) instead of waiting forever, through the mount as directly, and every MiB
    an fsync acknowledged before is on the server."""
    soft = Path(f"/mnt/ftsoft-{uuid.uuid4().hex[:8]}")
    nfs_mount(soft, "soft", "timeo=20", "retrans=1")
    writers: dict[str, Writer] = {}
    mnt: Daemon | None = None
    try:
        base = soft / f"t-{uuid.uuid4().hex[:10]}"
        for side in ("direct", "mount"):
            (base / side).mkdir(parents=True)
        mnt = make_mount(source=base / "mount", options=("unmount_timeout=10s",))
        mnt.expect_log_problems = True  # the target's errors are logged
        writers["direct"] = Writer(base / "direct" / "backup.bin", total=0, every=2)
        writers["mount"] = Writer(mnt.mountpoint / "backup.bin", total=0, every=2)
        for w in writers.values():
            w.wait_until(w.has_fsynced(4), 180, "four fsynced MiB")
        with outage("server"):
            acked = {side: w.fsynced() for side, w in writers.items()}
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not all(w.ended() for w in writers.values()):
                time.sleep(0.5)
            told = {side: w.errors() for side, w in writers.items()}
            hung = {side: wchan(w.proc.pid) for side, w in writers.items() if not w.ended()}
        for w in writers.values():
            w.reap(RECOVERY)
        code = mnt.stop()
        log = mnt.log()
        record(
            "soft-mount",
            acked=acked,
            told=told,
            hung=hung,
            exit=code,
            fsynced_at_end={side: w.fsynced() for side, w in writers.items()},
            log=[line for line in log.splitlines() if "target" in line][-8:],
        )
        on_disk = Path(profiles.DISK_MOUNT) / "rw" / base.name
        told_errno = (errno.errorcode[errno.EIO], errno.errorcode[errno.ETIMEDOUT])
        assert told["direct"], f"directly, the soft mount did not fail the writer: {hung}"
        assert not hung.get("mount"), f"through the mount the writer still waits: {hung}"
        assert told["mount"], f"the writer through the mount was not told: {writers['mount'].lines}"
        assert told["mount"][0][1] in told_errno, told
        for side, w in writers.items():
            assert arrived(on_disk / side / "backup.bin", w.fsynced()), f"{side}: fsynced MiB lost"
    finally:
        for w in writers.values():
            w.reap(RECOVERY)
        if mnt is not None:
            mnt.stop()
        nfs_unmount(soft)
        soft.rmdir()


# --- a process waiting on the mount can be killed ----------------------------------------------
#: Each call, started when the server is already gone. {root}: the root of the NFS directory or
#: of the mount (known to both, so a statfs is asked for, not a lookup). {dir}: a directory
#: neither this client nor the mount has seen (made through the other client), holding "file"
#: (4 MiB), "sub" (a directory of three files) and "out" (empty). The read and the write open
#: their file first, while the server is up ("ready"), and make their call on a line on stdin.
CALLS: dict[str, str] = {
    "statfs": "exec stat -f {root}",
    "stat": "exec stat {dir}/file",
    "ls": "exec ls {dir}/sub",
    "read": "exec 3<{dir}/file; echo ready; read go; exec cat <&3",
    "write": "exec 3>>{dir}/out; echo ready; read go; "
    "exec dd if=/dev/zero bs=1M count=4 conv=fsync status=none >&3",
}
#: How long a signalled process gets to go (SIGTERM, then SIGKILL).
KILL_WAIT = 10.0


def make_unseen(root2: Path) -> None:
    """The call's directory, made through client 2: client 1 has nothing of it cached."""
    root2.mkdir()
    (root2 / "file").write_bytes(os.urandom(4 * MiB))
    (root2 / "sub").mkdir()
    for n in range(3):
        (root2 / "sub" / f"e{n}").write_bytes(b"e")
    (root2 / "out").write_bytes(b"")


def start_call(call: str, directory: Path) -> subprocess.Popen[str]:
    script = CALLS[call].format(dir=directory, root=directory.parent)
    proc = subprocess.Popen(
        ["bash", "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE if "ready" in script else subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    if "ready" in script:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready", f"{call} could not open its file"
    return proc


def go(proc: subprocess.Popen[str]) -> None:
    if proc.stdin is not None:
        proc.stdin.write("go\n")
        proc.stdin.flush()


def wait_blocked(pid: int, timeout: float) -> bool:
    """Wait until *pid* sleeps in the kernel on the server (D state) or on the daemon's answer
    (request_wait_answer), and stays there a second."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        where, _, state = wchan(pid).partition(" ")
        if state == "D" or where == "request_wait_answer":
            time.sleep(1)
            return alive(pid) and wchan(pid) != "gone"
        if not alive(pid):
            return False
        time.sleep(0.1)
    return False


def kill(proc: subprocess.Popen[str]) -> dict[str, object]:
    """SIGTERM, then SIGKILL: when it went, and where it waited."""
    seen: dict[str, object] = {"waits_in": wchan(proc.pid)}
    proc.send_signal(signal.SIGTERM)
    if wait_gone(proc.pid, KILL_WAIT):
        seen["gone_after"] = "SIGTERM"
        return seen
    seen["after_sigterm"] = wchan(proc.pid)
    proc.send_signal(signal.SIGKILL)
    if wait_gone(proc.pid, KILL_WAIT):
        seen["gone_after"] = "SIGKILL"
        return seen
    seen["gone_after"] = None
    seen["after_sigkill"] = wchan(proc.pid)
    return seen


@pytest.mark.parametrize("call", list(CALLS))
def test_a_process_waiting_on_the_mount_can_be_killed_as_on_nfs_directly(
    make_mount: MakeMount, nfs_dirs: tuple[Path, Path], call: str
) -> None:
    """A backup tool waiting on a server that went away can be stopped (systemctl stop,
    Ctrl-C, kill -9) through the mount whenever it can be stopped on the hard NFS mount
    directly, instead of staying in D state until the server returns."""
    nfs_dir, nfs_dir2 = nfs_dirs
    for side in ("direct", "mount"):
        make_unseen(nfs_dir2 / side)
    mnt = make_mount(source=nfs_dir)
    # A killed reader leaves its read-ahead request behind; the daemon's late reply to it may
    # find nobody, which is logged. Not what is tested here.
    mnt.expect_log_problems = True
    directories = {"direct": nfs_dir / "direct", "mount": mnt.mountpoint / "mount"}
    procs: dict[str, subprocess.Popen[str]] = {}
    seen: dict[str, dict[str, object]] = {}
    try:
        if "ready" in CALLS[call]:
            procs = {side: start_call(call, d) for side, d in directories.items()}
        server_stop()
        try:
            for side, d in directories.items():
                if side in procs:
                    go(procs[side])
                else:
                    procs[side] = start_call(call, d)
            waiting = {side: wait_blocked(p.pid, 60) for side, p in procs.items()}
            for side, p in procs.items():
                seen[side] = kill(p) if waiting[side] else {"ended_early": p.poll()}
        finally:
            server_start()
        returned = time.monotonic()
        for p in procs.values():
            wait_gone(p.pid, RECOVERY)
        for side, p in procs.items():
            seen[side]["ended_after_return_in"] = round(time.monotonic() - returned, 1)
            seen[side]["status"] = p.poll()
        record(f"kill[{call}]", **seen, daemon_log_problems=problems_in_log(mnt.log()))
        assert waiting["direct"] and waiting["mount"], (
            f"the call did not wait on the server: {seen}"
        )
        if seen["direct"]["gone_after"] is not None:
            assert seen["mount"]["gone_after"] is not None, (
                f"{call}: directly on NFS the process went after {seen['direct']['gone_after']}; "
                f"through the mount it still waits after SIGKILL: {seen['mount']}"
            )
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(RECOVERY)
