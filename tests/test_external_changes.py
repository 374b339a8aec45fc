"""Another writer changes the target under a live mount (another host on the same export, an
operator in the source directory): files renamed, deleted, truncated, rewritten or replaced
directly in the backing directory while the mount has them cached or open.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
from mount_util import Daemon

from fusethrottle import status_client

pytestmark = pytest.mark.mount

#: Margin past attr_timeout before the mount must show the change: the kernel compares its
#: cache's expiry with jiffies, so "expired" may come a tick later than the timeout.
MARGIN = 0.05


def unsynced(daemon: Daemon, wait: float = 10.0) -> int:
    """The daemon's un-synced bytes once the background syncs of closed files have ended
    (those start when the files are closed; *wait* is a bound, not an expectation)."""
    entry = status_client.find_mount_of(str(daemon.mountpoint))
    deadline = time.monotonic() + wait
    while True:
        held = int(status_client.query(entry)["unsynced_bytes"])
        if held == 0 or time.monotonic() > deadline:
            return held
        time.sleep(0.02)


@pytest.mark.parametrize("attr_timeout", [0.0, 0.1])
def test_a_file_changed_on_the_target_shows_its_new_size_once_closed(
    make_mount: Any, attr_timeout: float
) -> None:
    """With the writeback cache (the default) the kernel keeps a cached file's size and pages
    itself and ignores the size the daemon reports: a file written through the mount and then
    truncated or rewritten on the target kept its old size and old data through the mount for
    as long as the kernel cached it, even with attr_timeout=0. A lookup now hands the kernel a
    new generation for such a file (changed size or mtime), and it takes the target's
    attributes and drops its pages."""
    daemon = make_mount(options=[f"attr_timeout={attr_timeout:g}"])
    assert daemon.source is not None
    mine, theirs = daemon.mountpoint / "f", daemon.source / "f"
    mine.write_bytes(b"a" * 10_000)
    assert mine.stat().st_size == 10_000

    with open(theirs, "r+b") as f:  # the same size, other bytes: told apart by the mtime
        f.write(b"c" * 10)
    time.sleep(attr_timeout + MARGIN)
    assert mine.read_bytes() == b"c" * 10 + b"a" * 9_990

    os.truncate(theirs, 100)
    time.sleep(attr_timeout + MARGIN)
    assert mine.stat().st_size == 100
    assert mine.read_bytes() == b"c" * 10 + b"a" * 90

    with open(theirs, "r+b") as f:
        f.write(b"b" * 20_000)
    time.sleep(attr_timeout + MARGIN)
    assert mine.read_bytes() == b"b" * 20_000

    with open(mine, "rb") as f:  # open through the mount: the kernel's size until close
        assert f.read(3) == b"bbb"
        os.truncate(theirs, 5)
    time.sleep(attr_timeout + MARGIN)
    assert mine.stat().st_size == 5
    assert mine.read_bytes() == b"b" * 5


def test_bytes_of_a_file_another_host_deleted_leave_the_ledger(
    make_memfs: Any, make_mount: Any
) -> None:
    """On NFS a file another client deleted answers ESTALE: its un-synced bytes can never be
    synced. The flusher retried them forever (an ERROR a minute, the bytes held against the
    window) and the unmount exited 1 "data could not be synced". They are dropped now."""
    target, _ = make_memfs("target", stale_unlinked=True)
    daemon = make_mount(
        source=target.mountpoint, options=["writeback_cache=no", "mode=static", "max_age=1h"]
    )
    with open(daemon.mountpoint / "f", "wb") as f:
        f.write(b"x" * 100_000)
        f.flush()
        entry = status_client.find_mount_of(str(daemon.mountpoint))
        assert status_client.query(entry)["unsynced_bytes"] == 100_000
        os.unlink(target.mountpoint / "f")  # another host deletes it
    assert unsynced(daemon) == 0
