"""The engine fails closed: a request whose caller's credentials cannot be taken is refused
rather than served with someone else's rights (real mounts)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from mount_util import FUSETHROTTLE, wait_for

pytestmark = pytest.mark.mount

#: A group only the daemon has: a caller served with the daemon's groups could read its file.
DAEMONS_GROUP = 4242
CALLER = 1000


def _in_namespace(pid: int) -> bool:
    return os.readlink(f"/proc/{pid}/ns/user") != os.readlink("/proc/self/ns/user")


@contextlib.contextmanager
def daemon_in_a_user_namespace(
    backing: Path, mountpoint: Path, log_path: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """fusethrottle as root of a user namespace (ids 0-65535 mapped to themselves) whose
    setgroups is denied, in a mount namespace of its own, with DAEMONS_GROUP among its groups."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                "setpriv",
                f"--groups={DAEMONS_GROUP}",
                "unshare",
                "--user",
                "--mount",
                "--propagation=private",
                "sh",
                "-c",
                'read go; exec "$@"',
                "sh",
                FUSETHROTTLE,
                str(backing),
                str(mountpoint),
                "-f",
                "-o",
                "permissions=target,allow_other",
            ],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    try:
        assert wait_for(lambda: _in_namespace(proc.pid), 10), "unshare did not start"
        # Written from outside, as root of the parent namespace: setgroups first, as the kernel
        # demands before a gid map of an unprivileged writer, and here to deny it.
        Path(f"/proc/{proc.pid}/setgroups").write_text("deny")
        Path(f"/proc/{proc.pid}/uid_map").write_text("0 0 65536")
        Path(f"/proc/{proc.pid}/gid_map").write_text("0 0 65536")
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.close()
        mounted = f" {mountpoint} ".encode()  # (another mount's name may not be UTF-8)
        assert wait_for(
            lambda: (
                proc.poll() is not None
                or mounted in Path(f"/proc/{proc.pid}/mountinfo").read_bytes()
            ),
            30,
        ), log_path.read_text()
        assert proc.poll() is None, log_path.read_text()
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(60)


def test_a_caller_whose_groups_cannot_be_taken_is_refused(workdir: Path) -> None:
    """In a user namespace that denies setgroups, no request thread can take a caller's
    groups: a caller without the daemon's group reading a file only that group may read is
    refused, not served with the daemon's groups."""
    backing = workdir / "backing"
    backing.mkdir()
    secret = backing / "secret"
    secret.write_text("for the group only\n")
    os.chown(secret, 0, DAEMONS_GROUP)
    secret.chmod(0o640)
    mountpoint = workdir / "mnt"
    mountpoint.mkdir()
    with daemon_in_a_user_namespace(backing, mountpoint, workdir / "mnt.log") as daemon:
        # The caller: no supplementary group at all (cleared before it enters the namespaces),
        # then CALLER's ids inside them.
        read = subprocess.run(
            [
                "setpriv",
                "--clear-groups",
                "nsenter",
                "--preserve-credentials",
                "--user",
                "--mount",
                f"--target={daemon.pid}",
                "setpriv",
                f"--reuid={CALLER}",
                f"--regid={CALLER}",
                "--keep-groups",
                "cat",
                str(mountpoint / "secret"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert read.returncode != 0, f"read with the daemon's groups: {read.stdout!r}"
    assert "Operation not permitted" in read.stderr or "Permission denied" in read.stderr, (
        read.stderr
    )
