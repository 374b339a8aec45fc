"""Locks through the mount on the real NFS client: they stay on this host (README, "Locks").

NFS directly (NFSv4.1 here; the lab's NFSv3 mounts are nolock, so their locks never reach the
server), a lock taken on client 1 is held by the server, so client 2 (another host) is kept
out; through the mount the kernel of client 1 keeps it, so client 1's processes are kept out
and client 2 is not. A process waiting for a lock through the mount while the server is
stopped can be killed: it waits for client 1's own lock, not for the server.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from locker import KINDS, Locker, held, try_lock
from mount_util import Daemon

from .lab import nfs_mount_options, record, server_start, server_stop, wait_gone

pytestmark = pytest.mark.mount

#: How long a killed process gets to go.
KILL_WAIT = 10.0


@pytest.mark.parametrize("kind", KINDS)
def test_a_lock_through_the_mount_keeps_this_hosts_processes_out_and_not_another_hosts(
    make_mount: Callable[..., Daemon], nfs_dirs: tuple[Path, Path], kind: str
) -> None:
    if "nolock" in nfs_mount_options()[0].split(","):
        pytest.skip("this profile mounts NFS with nolock: its locks never reach the server")
    here, there = nfs_dirs
    (here / "m").mkdir()
    (here / "d").mkdir()
    ft = make_mount(source=here / "m")
    for top in (ft.mountpoint, here / "d"):
        (top / "shared.db").write_bytes(b"x" * 4096)
    # NFS directly the server holds client 1's lock: client 2 is a lock owner of its own to
    # the server, so it is kept out (and what follows through the mount means something).
    with held(kind, here / "d" / "shared.db"):
        direct_other_host = try_lock(kind, there / "d" / "shared.db")
    with held(kind, ft.mountpoint / "shared.db"):
        mount_this_host = try_lock(kind, ft.mountpoint / "shared.db")
        mount_other_host = try_lock(kind, there / "m" / "shared.db")
    record(
        f"locks[{kind}]",
        direct_other_host=direct_other_host,
        mount_this_host=mount_this_host,
        mount_other_host=mount_other_host,
    )
    assert mount_this_host == "refused 11"  # EAGAIN: this host's processes exclude each other
    assert direct_other_host == "refused 11", "client 2 is not another lock owner to the server"
    assert mount_other_host == "locked"  # the server holds no lock of the mount's


@pytest.mark.parametrize("kind", KINDS)
def test_a_process_waiting_for_a_lock_through_the_mount_on_a_stopped_server_can_be_killed(
    make_mount: Callable[..., Daemon], nfs_dir: Path, kind: str
) -> None:
    ft = make_mount(source=nfs_dir)
    # The killed waiter's close reaches the daemon while the server is stopped: its late
    # answer may find nobody, which is logged. Not what is tested here.
    ft.expect_log_problems = True
    (ft.mountpoint / "shared.db").write_bytes(b"x" * 4096)
    holder = Locker(kind, ft.mountpoint / "shared.db")
    waiter = Locker(kind, ft.mountpoint / "shared.db", wait=True)  # both open before the stop
    gone = False
    try:
        holder.lock()
        assert holder.answer() == "locked"
        server_stop()
        try:
            waiter.lock()
            waited = not waiter.answers_within(2.0)
            waiter.proc.send_signal(signal.SIGKILL)
            gone = wait_gone(waiter.proc.pid, KILL_WAIT)
        finally:
            server_start()
        record(f"lock-wait-kill[{kind}]", waited=waited, gone_after_sigkill=gone)
        assert waited, "the waiter got the lock its holder keeps"
        assert gone, "the waiter stays after SIGKILL while the server is stopped"
    finally:
        waiter.kill()
        holder.release()
    assert ft.answers()
    assert try_lock(kind, ft.mountpoint / "shared.db") == "locked"
