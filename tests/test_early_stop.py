"""A stop sent while the daemon starts, as ``podman stop`` right after ``podman run`` sends it to
a container's PID 1: the daemon must still mount-and-stop cleanly (unmount, exit 0) instead of
keeping on until the runtime's SIGKILL leaves a dead mount. The PID 1 of a PID namespace has no
default action for SIGTERM: the kernel discards one that comes before a handler exists, unless
it is blocked (then it stays pending). The container's entry point execs the daemon with the
stop signals blocked (``env --block-signal``), the daemon keeps them so until its handler is
in place, and then takes what came meanwhile. Here: the same command as the image's, as PID 1
of a PID namespace of its own, signalled as soon as its process holds the signals, then a
little later each round (during the interpreter's start, the imports, the mount)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from mount_util import FUSETHROTTLE, fusermount_unmount, mounts_under, wait_for

pytestmark = pytest.mark.mount

#: How long a daemon may take to mount and stop on a busy shared host before the test calls it
#: a hang (not a speed limit: the daemon that drops the signal never exits).
HANG = 60.0
#: After the signals are held: right away, then later in the daemon's start.
DELAYS = (0.0, 0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5)


def _child_of(pid: int) -> int | None:
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


def _holds_sigterm(pid: int) -> bool:
    """*pid* runs the command (unshare's own child blocks SIGTERM for a moment, then sets it
    free before its exec) and has SIGTERM blocked."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    if status.startswith("Name:\tunshare"):
        return False
    blocked = next(line for line in status.splitlines() if line.startswith("SigBlk:"))
    return bool(int(blocked.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


@pytest.mark.parametrize("delay", DELAYS)
def test_sigterm_right_after_start_as_pid_1_unmounts_and_exits_0(
    workdir: Path, delay: float
) -> None:
    source = workdir / "source"
    mountpoint = workdir / "mnt"
    source.mkdir()
    mountpoint.mkdir()
    log_path = workdir / "daemon.log"
    # As packaging/container/fusethrottle-container execs it, in a PID namespace of its own.
    argv = [
        "unshare", "--pid", "--fork", "--kill-child", "--",
        "env", "--block-signal=TERM,INT,HUP",
        FUSETHROTTLE, str(source), str(mountpoint), "-f", "-o", "log_format=json",
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        outer = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        # The namespace's PID 1, once env has blocked the signals (a SIGTERM before that
        # would be dropped by the kernel: that moment belongs to the runtime and env).
        first: list[int] = []

        def pid_1_holds() -> bool:
            child = _child_of(outer.pid)
            if child is not None and _holds_sigterm(child):
                first.append(child)
                return True
            return outer.poll() is not None

        assert wait_for(pid_1_holds, HANG, interval=0.0005), "no PID 1 came"
        assert first, f"unshare exited {outer.returncode}:\n{log_path.read_text()}"
        if delay:
            wait_for(lambda: False, delay)
        os.kill(first[0], signal.SIGTERM)
        try:
            code = outer.wait(HANG)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"the daemon (PID 1) did not stop within {HANG:.0f}s of a SIGTERM sent "
                f"{delay}s after it started: the signal was lost\n{log_path.read_text()}"
            )
        text = log_path.read_text()
        # unshare --fork passes on its child's exit status.
        assert code == 0, f"exit {code}:\n{text}"
        assert not mounts_under(workdir), f"left mounted:\n{text}"
        assert "SIGTERM: flushing and unmounting" in text, text
    finally:
        if outer.poll() is None:
            outer.kill()  # --kill-child takes the daemon with it
            outer.wait()
        for left in mounts_under(workdir):
            fusermount_unmount(left, lazy=True)
