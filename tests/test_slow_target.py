"""Admission on a real slow target: ext4 on a loop device throttled to 20 MiB/s (recipe A).

What a user cares about: a buffered 1 GiB backup written through the mount never holds much
more than the window as Dirty+Writeback pages (the thing that stalls every other process on the
host), the file arrives intact, and a failing target's errors reach the writer. mode=off, the
plain passthrough, shows the problem the window removes.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mount_util import FUSETHROTTLE, start_fusethrottle
from slow_target import SlowTarget, dirty_and_writeback, skip_reason, slow_target

MiB = 1 << 20
pytestmark = [
    pytest.mark.mount,
    pytest.mark.slow_target,
    pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or ""),
]


@pytest.fixture
def target() -> Iterator[SlowTarget]:
    with slow_target(rate=20 * MiB) as t:
        yield t


class PeakSampler:
    """Largest growth of Dirty+Writeback over the baseline, sampled every 50 ms."""

    def __init__(self) -> None:
        self.baseline = dirty_and_writeback()
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, dirty_and_writeback() - self.baseline)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def write_stream(
    path: Path, total: int, stop_after_growth: int | None = None, sampler: PeakSampler | None = None
) -> tuple[str, int]:
    """Buffered 1 MiB writes of a reproducible pattern; returns (sha256, bytes written)."""
    digest = hashlib.sha256()
    block = bytearray(os.urandom(MiB))
    written = 0
    with open(path, "wb", buffering=0) as f:
        while written < total:
            block[:8] = written.to_bytes(8, "little")
            f.write(block)
            digest.update(block)
            written += MiB
            if stop_after_growth and sampler and sampler.peak > stop_after_growth:
                break
    return digest.hexdigest(), written


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 * MiB):
            digest.update(chunk)
    return digest.hexdigest()


def test_window_bounds_dirty_pages_and_the_backup_arrives_intact(target, workdir) -> None:
    window = 64 * MiB
    source = target.mountpoint / "backups"
    source.mkdir()
    mnt = workdir / "mnt"
    mnt.mkdir()
    daemon = start_fusethrottle(source, mnt, ["mode=static", "batch=16M", "window=64M"])
    try:
        with PeakSampler() as sampler:
            digest, written = write_stream(mnt / "backup.bin", 1024 * MiB)
        target.throttle(0)
        assert daemon.stop() == 0
    finally:
        daemon.stop()
    assert written == 1024 * MiB
    assert sampler.peak <= window + 64 * MiB, f"Dirty+Writeback grew {sampler.peak / MiB:.0f} MiB"
    assert sha256_of(source / "backup.bin") == digest


def test_by_default_the_window_shrinks_to_what_a_slow_target_drains(target, workdir) -> None:
    """mode=adaptive, the default: on a 20 MiB/s target the window settles near 20 MiB/s x
    drain (2.5 s), far below the 256 MiB it starts from, and so do the dirty pages."""
    source = target.mountpoint / "backups"
    source.mkdir()
    mnt = workdir / "mnt"
    mnt.mkdir()
    daemon = start_fusethrottle(source, mnt, [])
    try:
        with PeakSampler() as sampler:
            digest, written = write_stream(mnt / "backup.bin", 512 * MiB)
        status = subprocess.run(
            [FUSETHROTTLE, "status", str(mnt), "--json"], capture_output=True, text=True, timeout=30
        )
        target.throttle(0)
        assert daemon.stop() == 0
    finally:
        daemon.stop()
    assert status.returncode == 0, status.stderr
    controller = json.loads(status.stdout)["controller"]
    assert controller["mode"] == "adaptive"
    assert 16 * MiB <= controller["window"] <= 128 * MiB, controller
    grew = f"Dirty+Writeback grew {sampler.peak / MiB:.0f} MiB"
    assert sampler.peak <= 128 * MiB + 64 * MiB, grew
    assert written == 512 * MiB
    assert sha256_of(source / "backup.bin") == digest


def _answers(call, timeout: float = 30.0) -> bool:
    """Run *call* in a thread; did it return (or raise) within *timeout*? A liveness check,
    not a speed one: a hung mount would leave it blocked for good."""
    done = threading.Event()

    def run() -> None:
        try:
            call()
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    return done.wait(timeout)


def _kernel_stacks(pid: int) -> str:
    """Where each thread of *pid* waits in the kernel: why a call into the mount hung."""
    out = []
    for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
        try:
            comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            stack = Path(f"/proc/{pid}/task/{tid}/stack").read_text().split("\n")[:8]
        except OSError:
            continue
        if stack[0] and "do_epoll_wait" not in stack[0]:  # not the event loop at rest
            out.append(f"{tid} {comm}: " + " < ".join(x.split(" ", 1)[-1] for x in stack if x))
    return "\n".join(out)


def test_a_stalled_target_holds_writers_back_without_errors_and_still_answers(
    target, workdir
) -> None:
    """Stall and recovery: the target takes 1 byte/s for 10 s in the middle of a backup.

    The writer waits, gets no error, and its data arrives intact once the target is back;
    meanwhile stat and readdir through the mount answer, and the un-synced bytes never exceed
    the largest window the controller may use (window_max).
    """
    source = target.mountpoint / "backups"
    source.mkdir()
    mnt = workdir / "mnt"
    mnt.mkdir()
    daemon = start_fusethrottle(source, mnt, ["batch=8M", "window=16M", "window_max=32M"])
    # The backup runs in a process of its own. Were it a thread of this one, every child this
    # test starts (the status command) would inherit the open file, and its exec would close
    # it: a close of a file with cached writes waits until they reach the target (as on NFS),
    # so the child and this test would wait for the very stall they are meant to observe.
    writer = subprocess.Popen(
        [sys.executable, "-c", _BACKUP_SCRIPT, str(mnt / "backup.bin"), str(256 * MiB)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    unsynced: list[int] = []
    answered: list[bool] = []
    stacks: list[str] = []  # the daemon's threads when a call hung, for the failure message
    try:
        time.sleep(2)
        target.throttle(1)  # blk-throttle has no "stop": 1 byte/s is a hung server
        stall_end = time.monotonic() + 10
        while time.monotonic() < stall_end:
            for call in (lambda: os.stat(mnt / "backup.bin"), lambda: os.listdir(mnt)):
                answered.append(_answers(call))
                if not answered[-1] and not stacks:
                    stacks.append(_kernel_stacks(daemon.pid))
            status = subprocess.run(
                [FUSETHROTTLE, "status", str(mnt), "--json"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert status.returncode == 0, status.stderr
            unsynced.append(json.loads(status.stdout)["unsynced_bytes"])
            time.sleep(0.5)
        stalled_progress = writer.poll() is None
        target.throttle(0)
        out, err = writer.communicate(timeout=300)
        assert daemon.stop() == 0
    finally:
        target.throttle(0)
        if writer.poll() is None:
            writer.kill()
            writer.wait()
        daemon.stop()
    assert stalled_progress, "the backup finished during the stall: nothing was held back"
    assert writer.returncode == 0, err  # no error reached the writer
    assert all(answered), (
        f"{answered.count(False)} of {len(answered)} stat/readdir hung; the daemon's threads "
        f"then:\n{stacks[0] if stacks else '?'}"
    )
    assert max(unsynced) <= 32 * MiB, [u // MiB for u in unsynced]
    assert max(unsynced) > 0
    digest, written = out.split()
    assert int(written) == 256 * MiB
    assert sha256_of(source / "backup.bin") == digest


# write_stream() as a program: prints "sha256 bytes" once the file is closed.
_BACKUP_SCRIPT = """
import hashlib, os, sys
path, total = sys.argv[1], int(sys.argv[2])
digest, block, written = hashlib.sha256(), bytearray(os.urandom(1 << 20)), 0
with open(path, "wb", buffering=0) as f:
    while written < total:
        block[:8] = written.to_bytes(8, "little")
        f.write(block)
        digest.update(block)
        written += len(block)
print(digest.hexdigest(), written)
"""


def test_plain_passthrough_is_not_bounded(target, workdir) -> None:
    """mode=off: the same backup piles up in the page cache, which is what the window prevents."""
    source = target.mountpoint / "backups"
    source.mkdir()
    mnt = workdir / "mnt"
    mnt.mkdir()
    daemon = start_fusethrottle(source, mnt, ["mode=off"])
    try:
        with PeakSampler() as sampler:
            _, _written = write_stream(mnt / "backup.bin", 1024 * MiB, 400 * MiB, sampler)
            deadline = time.monotonic() + 5
            while sampler.peak <= 400 * MiB and time.monotonic() < deadline:
                time.sleep(0.1)
        target.throttle(0)  # let the unmount flush finish quickly
        assert daemon.stop() == 0
    finally:
        daemon.stop()
    assert sampler.peak > 400 * MiB, f"only {sampler.peak / MiB:.0f} MiB piled up"


def test_a_failing_target_reports_eio_to_the_writer_and_stays_up(target, workdir) -> None:
    """A dead target (ext4 shut down: every write and fsync fails with EIO) is never hidden."""
    source = target.mountpoint / "backups"
    source.mkdir()
    mnt = workdir / "mnt"
    mnt.mkdir()
    daemon = start_fusethrottle(source, mnt, ["batch=4M", "window=16M"])
    daemon.expect_log_problems = True  # the target errors are logged, on purpose
    try:
        fd = os.open(mnt / "backup.bin", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.write(fd, b"x" * MiB)
            target.shutdown()
            with pytest.raises(OSError) as info:
                for _ in range(64):
                    os.write(fd, b"y" * MiB)
                os.fsync(fd)
            assert info.value.errno == errno.EIO
            with pytest.raises(OSError) as info:
                os.fsync(fd)
            assert info.value.errno == errno.EIO
        finally:
            os.close(fd)
        # the daemon is still serving
        assert not (mnt / "other").exists()
        assert os.statvfs(mnt).f_namemax > 0
    finally:
        code = daemon.stop()
    assert code == 0  # every error reached the application, so nothing is left owed
    assert "Input/output error" in daemon.log()
