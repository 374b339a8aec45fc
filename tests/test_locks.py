"""Locks through the mount stay on this host (README, "Locks"), on purpose.

The engine does not take flock or fcntl locks on the target: the kernel keeps them, so
processes of this host that lock through the mount exclude each other as on a local file
system, a lock taken through the mount is not held on the target (another host, or a process
using the target directly, does not see it), and a process waiting for one can be killed at any
time. The NFS lab shows the same against a second NFS client and a stopped server
(tests/nfs/test_locks.py).
"""

from __future__ import annotations

import signal

import pytest
from locker import KINDS, Locker, try_lock
from mount_util import Daemon

pytestmark = pytest.mark.mount


@pytest.mark.parametrize("kind", KINDS)
def test_a_lock_through_the_mount_excludes_this_hosts_processes_and_is_not_on_the_target(
    ft: Daemon, kind: str
) -> None:
    (ft.mountpoint / "shared.db").write_bytes(b"x" * 4096)
    assert ft.source is not None
    holder = Locker(kind, ft.mountpoint / "shared.db")
    try:
        holder.lock()
        assert holder.answer() == "locked"
        # EAGAIN (11): another process of this host, through the mount, is kept out.
        assert try_lock(kind, ft.mountpoint / "shared.db") == "refused 11"
        # The target holds no lock: a process that uses it directly is not kept out.
        assert try_lock(kind, ft.source / "shared.db") == "locked"
    finally:
        holder.release()
    assert try_lock(kind, ft.mountpoint / "shared.db") == "locked"


@pytest.mark.parametrize("kind", KINDS)
def test_a_process_waiting_for_a_lock_through_the_mount_can_be_killed(
    ft: Daemon, kind: str
) -> None:
    (ft.mountpoint / "shared.db").write_bytes(b"x" * 4096)
    holder = Locker(kind, ft.mountpoint / "shared.db")
    waiter = Locker(kind, ft.mountpoint / "shared.db", wait=True)
    try:
        holder.lock()
        assert holder.answer() == "locked"
        waiter.lock()
        assert not waiter.answers_within(0.5), f"the waiter did not wait: {waiter.answer()}"
        waiter.proc.send_signal(signal.SIGKILL)
        assert waiter.proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        waiter.kill()
        holder.release()
    assert ft.answers()
    assert try_lock(kind, ft.mountpoint / "shared.db") == "locked"
