#!/usr/bin/python3
"""Play systemd's part of ``Type=notify`` against the installed daemon, without systemd.

CI machines and containers seldom run systemd as PID 1, so ``fusethrottle@.service`` cannot be
started there. This does what the service manager would: it binds a notify socket, writes the
instance's settings file (named as a dashed mount point's instance is, backslash and all) and
starts ``fusethrottle --conf FILE MOUNTPOINT -f`` as the unit's ExecStart does, with
NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID set, and checks the contract the unit relies on:

- READY=1 arrives from the main PID, and only once the mount answers;
- WATCHDOG=1 arrives about every half WATCHDOG_USEC;
- SIGTERM (systemd's stop) brings STOPPING=1, an exit status of 0, and no mount left behind.

Prints ``ok: ...`` or ``FAIL: ...`` per check (one line each) and exits 1 if any failed. Uses
the standard library only; the daemon is always stopped and its mount removed before exit.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WATCHDOG_USEC = 2_000_000
READY_TIMEOUT = 60.0
STOP_TIMEOUT = 120.0
UCRED = struct.Struct("3i")


class Checks:
    """Counts and prints results, one line each."""

    def __init__(self) -> None:
        self.failed = 0

    def ok(self, what: str) -> None:
        print(f"ok: {what}", flush=True)

    def fail(self, what: str) -> None:
        self.failed += 1
        print(f"FAIL: {what}", flush=True)

    def check(self, condition: bool, what: str, why: str = "") -> bool:
        if condition:
            self.ok(what)
        else:
            self.fail(f"{what}: {why}" if why else what)
        return condition


def mount_type(mountpoint: str) -> str | None:
    """The type of the topmost mount at *mountpoint*, read from mountinfo (never stats it)."""
    found = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            target = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            if target == mountpoint:
                found = fields[sep + 1]
    return found


class Manager:
    """The notify socket, with the sender's PID of every datagram."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)

    def receive(self, timeout: float) -> tuple[int, list[str]] | None:
        """One datagram as (sender pid, lines), or None after *timeout* seconds."""
        self.sock.settimeout(max(timeout, 0.001))
        try:
            data, ancdata, _flags, _addr = self.sock.recvmsg(4096, socket.CMSG_SPACE(UCRED.size))
        except TimeoutError:
            return None
        pid = -1
        for level, kind, payload in ancdata:
            if (level, kind) == (socket.SOL_SOCKET, socket.SCM_CREDENTIALS):
                pid = UCRED.unpack(payload[: UCRED.size])[0]
        return pid, data.decode(errors="replace").splitlines()

    def wait_for(self, key: str, deadline: float) -> tuple[int, float] | None:
        """Wait for a datagram carrying *key*; returns (sender pid, arrival time)."""
        while (left := deadline - time.monotonic()) > 0:
            got = self.receive(left)
            if got and key in got[1]:
                return got[0], time.monotonic()
        return None

    def close(self) -> None:
        self.sock.close()


def run(source: str, mountpoint: str, options: str, checks: Checks) -> None:
    with tempfile.TemporaryDirectory(prefix="ft-notify-") as tmp:
        manager = Manager(tmp)
        env = dict(os.environ, NOTIFY_SOCKET=manager.path, WATCHDOG_USEC=str(WATCHDOG_USEC))
        conf = os.path.join(tmp, "mnt-ft\\x2dnotify.conf")
        with open(conf, "w") as f:
            f.write(f"SOURCE={source}\nOPTIONS={options}\n")
        # WATCHDOG_PID must name the daemon itself, as systemd sets it: exec keeps the shell's PID.
        argv = ["fusethrottle", "--conf", conf, mountpoint, "-f"]
        proc = subprocess.Popen(
            ["/bin/sh", "-c", 'WATCHDOG_PID=$$; export WATCHDOG_PID; exec "$@"', "sh", *argv],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            exercise(proc, manager, mountpoint, checks)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if mount_type(mountpoint) is not None:
                subprocess.run(["umount", "--lazy", mountpoint], check=False)
            manager.close()
            if checks.failed and proc.stderr:
                for line in proc.stderr.read().splitlines()[-5:]:
                    print(f"  daemon: {line}", flush=True)


def exercise(
    proc: subprocess.Popen[str], manager: Manager, mountpoint: str, checks: Checks
) -> None:
    ready = manager.wait_for("READY=1", time.monotonic() + READY_TIMEOUT)
    if not checks.check(
        ready is not None,
        "READY=1 received",
        f"none within {READY_TIMEOUT:.0f}s ("
        + ("daemon still running" if proc.poll() is None else f"daemon exited {proc.poll()}")
        + ")",
    ):
        return
    pid, _ = ready
    checks.check(pid == proc.pid, "READY=1 sent by the main PID", f"from {pid}, main is {proc.pid}")
    fstype = mount_type(mountpoint)
    answered = True
    try:
        os.stat(mountpoint)
    except OSError:
        answered = False
    checks.check(
        fstype == "fuse.fusethrottle" and answered,
        "the mount answers when READY=1 arrives",
        f"type {fstype!r}, stat {'ok' if answered else 'failed'}",
    )

    interval = WATCHDOG_USEC / 1e6
    pings = []
    deadline = time.monotonic() + 2.5 * interval
    while len(pings) < 3 and (got := manager.wait_for("WATCHDOG=1", deadline)) is not None:
        pings.append(got[1])
    gaps = [b - a for a, b in itertools.pairwise(pings)]
    checks.check(
        len(pings) >= 3 and all(g < interval for g in gaps),
        f"WATCHDOG=1 about every {interval / 2:.1f}s",
        f"{len(pings)} pings in {2.5 * interval:.0f}s, gaps {[round(g, 2) for g in gaps]}",
    )

    probe = Path(mountpoint, "notify-probe.txt")
    probe.write_text("written before SIGTERM\n")
    checks.check(probe.read_text() == "written before SIGTERM\n", "write and read back")

    proc.send_signal(signal.SIGTERM)
    stopping = manager.wait_for("STOPPING=1", time.monotonic() + STOP_TIMEOUT)
    checks.check(stopping is not None, "STOPPING=1 after SIGTERM")
    try:
        code = proc.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        checks.fail(f"daemon exits after SIGTERM: still running after {STOP_TIMEOUT:.0f}s")
        return
    checks.check(code == 0, "daemon exits 0 after SIGTERM", f"exit status {code}")
    checks.check(mount_type(mountpoint) is None, "no mount left after SIGTERM", "still mounted")


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4):
        print("usage: check-notify.py SOURCE MOUNTPOINT [OPTIONS]", file=sys.stderr)
        return 2
    source, mountpoint = (os.path.abspath(p) for p in argv[1:3])
    options = argv[3] if len(argv) == 4 else "batch=1M,window=4M"
    checks = Checks()
    run(source, mountpoint, options, checks)
    probe = Path(source, "notify-probe.txt")
    checks.check(
        probe.exists() and probe.read_text() == "written before SIGTERM\n",
        "data written through the mount is in SOURCE after stop",
    )
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
