"""A backup killed with SIGKILL loses nothing that write() had acknowledged (issue 34).

On the target directly (ext4, NFS) the kernel writes back a dead process's page cache like
anyone else's: every byte a write() returned for reaches the file. Through the mount the same
must hold: with the writeback cache, the kernel's write-back requests name the dying opener's
handle but carry data nobody else holds, so they are never answered early; without it, a
write() still waiting in the daemon may be answered EINTR (it was never acknowledged), and what
the target then still receives stays counted until the call that carries it ends.

The target is a real ext4 on a loop device throttled to 1 MiB/s (slow_target.py): the writer
waits on it, in write() or in close(), when it is killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from mount_util import running, start_fusethrottle, wait_for
from slow_target import SlowTarget, skip_reason, slow_target

MiB = 1 << 20
pytestmark = [
    pytest.mark.mount,
    pytest.mark.slow_target,
    pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or ""),
]

#: Writes 1 MiB blocks, block i filled with the byte i+1, and prints the count after each
#: write() returned; with "close" it prints "closing" after the last and then closes.
_WRITER = """
import os, sys
path, blocks, then = sys.argv[1], int(sys.argv[2]), sys.argv[3]
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
for i in range(blocks):
    block = bytes([(i + 1) % 256]) * (1 << 20)
    done = 0
    while done < len(block):
        done += os.write(fd, block[done:])
    print(i + 1, flush=True)
if then == "close":
    print("closing", flush=True)
os.close(fd)
print("closed", flush=True)
"""


def _acknowledged(lines: list[str]) -> int:
    return max((int(line) for line in lines if line.isdigit()), default=0)


def _kill_writer(path: Path, *, in_close: bool) -> tuple[int, list[str]]:
    """Start the writer on *path*, kill -9 it while it waits in write() (after 8 blocks were
    acknowledged, 3 s more) or in close(); returns (blocks acknowledged, its output)."""
    # Enough to fill the window and the kernel's share of it: close() then waits for write-back.
    blocks = 32 if in_close else 64
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(path), str(blocks), "close" if in_close else "-"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(line.strip() for line in proc.stdout))  # type: ignore[union-attr]
    reader.start()
    try:
        if in_close:
            assert wait_for(lambda: "closing" in lines, 60), lines
        else:
            assert wait_for(lambda: _acknowledged(lines) >= 8, 60), lines
        # In write(): long enough for its requests to wait at the gate. In close(): a moment
        # only, the write-back of what the kernel holds may drain in a few seconds.
        time.sleep(1.0 if in_close else 3.0)
        # Still waiting: in write() for the target, or in close() for the write-back.
        assert proc.poll() is None and "closed" not in lines, lines
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(120)
        reader.join(10)
    return _acknowledged(lines), lines


def _check_on_target(path: Path, acknowledged: int) -> None:
    data = path.read_bytes()
    assert len(data) >= acknowledged * MiB, (
        f"{acknowledged} MiB acknowledged, {len(data) / MiB:.2f} MiB on the target"
    )
    for i in range(acknowledged):
        block = data[i * MiB : (i + 1) * MiB]
        assert block == bytes([(i + 1) % 256]) * MiB, f"block {i} differs on the target"


# Without the writeback cache a close() on ext4 has nothing to wait for (every write() already
# reached the target): the writer cannot be caught there. The NFS lab kills one in close(), where
# the daemon's own close writes back.
@pytest.mark.parametrize(
    ("writeback_cache", "in_close"),
    [("yes", False), ("yes", True), ("no", False)],
    ids=["cache-in-write", "cache-in-close", "nocache-in-write"],
)
def test_a_writer_killed_while_it_waits_loses_nothing_it_was_told_was_written(
    workdir: Path, writeback_cache: str, in_close: bool
) -> None:
    with slow_target(size="1G", rate=1 * MiB) as target:
        _run_kill(target, workdir, writeback_cache, in_close)


def _run_kill(target: SlowTarget, workdir: Path, writeback_cache: str, in_close: bool) -> None:
    source = target.mountpoint / "backups"
    source.mkdir()
    mountpoint = workdir / "mnt"
    mountpoint.mkdir()
    daemon = start_fusethrottle(source, mountpoint, [f"writeback_cache={writeback_cache}"])
    with running(daemon):
        acknowledged, lines = _kill_writer(mountpoint / "backup", in_close=in_close)
        assert acknowledged >= (32 if in_close else 8), lines
        # Let the daemon's kill watch look at the dying writer's requests for a while at the
        # slow rate (the landed code answered them EINTR here), then drain quickly.
        time.sleep(4.0)
        target.throttle(0)
        assert daemon.answers(60)
        code = daemon.stop()
    assert code == 0, daemon.log()
    assert "not on the target" not in daemon.log()
    _check_on_target(source / "backup", acknowledged)
