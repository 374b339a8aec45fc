"""What a mount left running between backups holds in memory (issue 13's soak).

Each of the engine's request threads reads into a 1 MiB buffer of its own, which a burst of
parallel writes makes resident; a thread that has served nothing for a moment gives its
buffer's pages back (engine/src/session_io.cc), so the daemon's resident memory follows what it
uses, not the busiest minute it has seen.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from conftest import MakeMount

MiB = 1 << 20


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _burst(mountpoint: Path, writers: int, size: int) -> None:
    """*writers* files written at once in 1 MiB writes: that many request buffers in flight."""
    block = os.urandom(MiB)
    failures: list[BaseException] = []

    def write(i: int) -> None:
        try:
            with open(mountpoint / f"backup{i}.bin", "wb", buffering=0) as f:
                for _ in range(size // MiB):
                    f.write(block)
        except BaseException as err:  # reported below
            failures.append(err)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures


@pytest.mark.mount
def test_a_quiet_mount_gives_back_the_buffers_of_its_busiest_moment(
    make_mount: MakeMount,
) -> None:
    mnt = make_mount(options=["writeback_cache=no"])  # every write() is a request of its own
    _burst(mnt.mountpoint, writers=16, size=16 * MiB)
    busy = _rss_mib(mnt.pid)
    quiet = busy
    deadline = time.monotonic() + 15.0
    while time.monotonic() < deadline and quiet > busy - 8:
        time.sleep(0.5)
        quiet = _rss_mib(mnt.pid)
    assert quiet <= busy - 8, f"resident memory {busy:.0f} MiB after the burst, {quiet:.0f} idle"
    # And the mount still serves, with the data intact.
    _burst(mnt.mountpoint, writers=2, size=2 * MiB)
    assert (mnt.mountpoint / "backup0.bin").stat().st_size == 2 * MiB
    assert mnt.stop() == 0
    assert (mnt.source / "backup15.bin").stat().st_size == 16 * MiB
