"""Start and stop a fusethrottle mount for one arm.

The daemon runs in the foreground (``-f``) as our child, so its CPU time is exact and we can stop
it with SIGTERM — which makes it flush every dirty file and exit 0. Its stop time is part of the
arm's durable time: data the daemon still holds is not on the target yet.

A mode the daemon refuses (it exits non-zero before mounting) makes the arm *skipped* with the
daemon's own message; anything that fails after mounting is a *failed* arm.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import sys
import time
from pathlib import Path

from bench.system import (
    ArmSkipped,
    BenchError,
    Child,
    Teardown,
    answers,
    findmnt_type,
    fuse_abort,
    read_text,
    start,
)

log = logging.getLogger(__name__)


def find_executable(explicit: str | None) -> str | None:
    """The fusethrottle command: --fusethrottle, else next to our Python (the venv), else PATH."""
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    beside = Path(sys.executable).parent / "fusethrottle"
    if os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("fusethrottle")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _last_line(path: Path) -> str:
    lines = [ln.strip() for ln in read_text(path).splitlines() if ln.strip()]
    return lines[-1] if lines else ""


class FuseThrottleMount:
    """One mount: SOURCE (on the target) at MOUNTPOINT (on local tmpfs)."""

    def __init__(
        self,
        exe: str,
        source: Path,
        mountpoint: Path,
        options: str,
        log_path: Path,
        teardown: Teardown,
        cgroup_procs: str | None,
        metrics: bool,
    ) -> None:
        self.exe = exe
        self.source = source
        self.mountpoint = mountpoint
        self.metrics_url: str | None = None
        self.user_options = options.strip(",")  # what the arm asked for (stable across runs)
        if metrics:
            port = free_port()
            options = f"{options},metrics=127.0.0.1:{port}"
            self.metrics_url = f"http://127.0.0.1:{port}/metrics"
        self.options = options.strip(",")
        self.log_path = log_path
        self.teardown = teardown
        self.cgroup_procs = cgroup_procs
        self.child: Child | None = None
        self.mount_key = 0
        self.mount_seconds = float("nan")

    @property
    def command(self) -> list[str]:
        return [self.exe, str(self.source), str(self.mountpoint), "-o", self.options, "-f"]

    def start(self, timeout: float = 30.0) -> None:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        self.child = start(
            "fusethrottle",
            self.command,
            teardown=self.teardown,
            cgroup_procs=self.cgroup_procs,
            stdout=self.log_path,
            stderr=self.log_path.with_suffix(".err"),
        )
        # Registered after the child: LIFO teardown unmounts only after SIGTERM had its chance.
        self.mount_key = self.teardown.push("fusermount", str(self.mountpoint))
        while not findmnt_type(self.mountpoint).startswith("fuse"):
            code = self.child.poll()
            if code is not None:
                reason = _last_line(self.log_path.with_suffix(".err")) or f"exit status {code}"
                self.teardown.forget(self.child.key)
                raise ArmSkipped(f"fusethrottle refused -o {self.user_options}: {reason}")
            if time.monotonic() - t0 > timeout:
                raise BenchError(f"fusethrottle did not mount {self.mountpoint} in {timeout:g}s")
            time.sleep(0.02)
        if not answers(self.mountpoint, timeout=10.0):
            fuse_abort(self.mountpoint)
            raise BenchError(f"fusethrottle mounted {self.mountpoint} but stat() on it hung 10s")
        self.mount_seconds = time.monotonic() - t0
        log.debug("mounted %s in %.2fs (pid %d)", self.mountpoint, self.mount_seconds, self.pid)

    @property
    def pid(self) -> int | None:
        return self.child.pid if self.child else None

    def close(self) -> None:
        """After a failure: make sure no daemon and no mount are left (idempotent)."""
        if self.child is not None and self.child.alive():
            self.child.signal(15)
            if self.child.wait(30) is None:
                fuse_abort(self.mountpoint)
                self.child.stop(grace=5)
            self.teardown.forget(self.child.key)
        if self.mount_key:
            self.teardown.undo(self.mount_key)

    def stop(self, timeout: float) -> dict[str, object]:
        """SIGTERM (the daemon flushes, unmounts, exits 0); returns how long and how it went."""
        assert self.child is not None
        t0 = time.monotonic()
        self.child.signal(15)
        code = self.child.wait(timeout)
        if code is None:
            log.error("fusethrottle did not exit %gs after SIGTERM; unmounting it", timeout)
            self.teardown.undo(self.mount_key)
            code = self.child.stop(grace=10)
        self.teardown.forget(self.child.key)
        if findmnt_type(self.mountpoint):
            log.error("fusethrottle exited (%s) but %s is still mounted", code, self.mountpoint)
        self.teardown.undo(self.mount_key)
        return {
            "stop_seconds": time.monotonic() - t0,
            "exit_code": code,
            "daemon_cpu_s": self.child.cpu_seconds,
            "mount_seconds": self.mount_seconds,
            "stderr_tail": _last_line(self.log_path.with_suffix(".err")),
        }
