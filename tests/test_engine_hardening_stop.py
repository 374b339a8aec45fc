"""The engine fails closed: a request whose caller's credentials cannot be taken is refused
rather than served with someone else's rights; and a stop ends within unmount_timeout while
the page-drop thread is held by the kernel behind a request thread the target holds (real
mounts)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import MakeMount
from mount_util import FUSETHROTTLE, Daemon, wait_for

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


# --- the stop with the page-drop thread held -----------------------------------------------------
HANG = 30.0  # seconds each call into the target takes once it hangs
HANG_GUARD = 60.0  # what a step that should come at once may take on a loaded machine
UNMOUNT_TIMEOUT = 3.0
#: Opens the file, then on each line of its stdin: rewrites its first page (into the mount's
#: page cache: the writeback cache), and holds the file open, never closing it (a close
#: would write the page back and wait for the hung target).
REWRITER = textwrap.dedent(
    """
    import os, sys
    fd = os.open(sys.argv[1], os.O_WRONLY)
    print("open", flush=True)
    sys.stdin.readline()
    os.pwrite(fd, b"y" * 4096, 0)
    print("rewritten", flush=True)
    sys.stdin.readline()
    """
)


def thread_states(pid: int, name: str) -> list[str]:
    """The scheduler states (R, S, D...) of *pid*'s threads named *name*."""
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            if (task / "comm").read_text().strip() == name:
                stat = (task / "stat").read_text()
                states.append(stat.rsplit(")", 1)[1].split()[0])
    return states


def test_a_stop_with_the_page_drop_thread_held_behind_a_hung_target_ends_within_unmount_timeout(
    make_memfs: Callable[..., tuple[Daemon, Path]],
    make_mount: MakeMount,
    workdir: Path,
) -> None:
    """The engine asks the kernel to drop a synced file's pages from its own thread
    (kernel_pages.cc). The kernel writes a page of the range that is dirty again back first,
    through a request thread, and the notification waits for it: on a hung target it waits as
    long as the target does, and a stop that joined the thread waited with it. A test-only
    switch holds the engine's first drop at a FIFO until a page of its range was rewritten
    with the target hung; let go, the drop thread is seen blocked in the kernel, and SIGTERM
    then unmounts within unmount_timeout, long before the target answers; the daemon exits
    once it does."""
    backing = workdir / "backing"
    backing.mkdir()
    switch = workdir / "hang-now"
    target, _ = make_memfs("backing/slow", slow_all_while=(switch, HANG))
    hold = workdir / "page-drop-hold"
    os.mkfifo(hold)
    ft = make_mount(
        source=backing,
        options=[
            "writeback_cache=yes",
            "batch=1M",
            "max_age=1h",
            "attr_timeout=1h",
            f"unmount_timeout={UNMOUNT_TIMEOUT:g}s",
        ],
        name="top",
        wrapper=["env", f"FUSETHROTTLE_TEST_HOLD_PAGE_DROP={hold}"],
    )
    data = ft.mountpoint / "slow" / "data"
    # 2 MiB: written back at the close, its first batch synced by the engine, which asks the
    # kernel to drop those pages: the drop thread waits at the FIFO.
    data.write_bytes(b"x" * (2 << 20))
    assert wait_for(lambda: "a page drop waits for" in ft.log(), HANG_GUARD), ft.log()
    rewriter = subprocess.Popen(
        [sys.executable, "-c", REWRITER, str(data)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert rewriter.stdin is not None and rewriter.stdout is not None
    took = None
    try:
        assert rewriter.stdout.readline().strip() == "open"
        switch.touch()
        rewriter.stdin.write("\n")
        rewriter.stdin.flush()
        assert rewriter.stdout.readline().strip() == "rewritten"
        # The drop goes on: the kernel holds it behind the rewritten page's write-back, which
        # a request thread serves on the hung target.
        with open(hold, "wb"):
            pass
        assert wait_for(lambda: "the page drop goes on" in ft.log(), HANG_GUARD), ft.log()
        assert wait_for(lambda: thread_states(ft.pid, "ft-drop-pages") == ["D"], HANG_GUARD), (
            thread_states(ft.pid, "ft-drop-pages")
        )
        stop = time.monotonic()
        ft.signal(signal.SIGTERM)
        # Bounded by unmount_timeout (and the engine's 1 s wait for the drop), not by the
        # target's HANG seconds.
        gone = wait_for(lambda: not ft.is_mounted(), UNMOUNT_TIMEOUT + HANG / 2)
        took = time.monotonic() - stop
        assert thread_states(ft.pid, "ft-drop-pages") in ([], ["D"])
        switch.unlink()
        code = ft.wait(HANG + HANG_GUARD)
    finally:
        switch.unlink(missing_ok=True)
        rewriter.kill()
        rewriter.wait(HANG + HANG_GUARD)
    assert gone, f"the mount outlived the stop by {took:.1f} s"
    assert code is not None, "the daemon did not exit once the target answered"
    ft.expect_log_problems = True
    target.expect_log_problems = True
