"""A backup killed with SIGKILL while it waits in write() or in close() loses nothing write()
acknowledged, through the mount as on NFS directly (issue 34).

On NFS a close() writes the file's dirty pages back to the server and waits; a writer killed
there dies, and the client writes the pages back all the same. Through the mount, with the
writeback cache, the close waits for the kernel to hand the mount's cached pages to the daemon:
those write-back requests name the dying writer's handle but are nobody's, and must never be
answered early (a failed write-back drops the pages). Without the cache, the close waits for
the daemon's own close on NFS, which may be answered early: the data is in the NFS client's
cache already, which writes it back.

The link to the server carries 1 MiB/s while the writer writes 1 MiB blocks; it is killed 3 s
after its 8th write() returned (waiting in a later one), or 3 s into its close() of 24; the link
is restored, and the file on the server's own disk must hold every MiB a write() returned for.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from mount_util import Daemon, wait_for

from .lab import on_server, record, slow_link, wait_gone

pytestmark = [pytest.mark.mount]

MakeMount = Callable[..., Daemon]
MiB = 1 << 20

#: Block i is the byte i+1; prints the count after each write() returned, "closing", "closed".
#: Writes argv[2] blocks, then closes.
WRITER = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
for i in range(int(sys.argv[2])):
    block = bytes([i + 1]) * (1 << 20)
    done = 0
    while done < len(block):
        done += os.write(fd, block[done:])
    print(i + 1, flush=True)
print("closing", flush=True)
os.close(fd)
print("closed", flush=True)
"""


def kill_writer(path: Path, when: str) -> dict[str, object]:
    """Write to *path* and kill -9 the writer 3 s after its 8th write() returned (*when*
    "write": 64 blocks, it waits in a later write()) or 3 s into its close() of 24 ("close")."""
    blocks = 24 if when == "close" else 64
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(blocks)], stdout=subprocess.PIPE, text=True
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(x.strip() for x in proc.stdout))  # type: ignore[union-attr]
    reader.start()

    def acknowledged() -> int:
        return max((int(x) for x in lines if x.isdigit()), default=0)

    try:
        if when == "close":
            assert wait_for(lambda: "closing" in lines, 300), lines
        else:
            assert wait_for(lambda: acknowledged() >= 8, 300), lines
        time.sleep(3.0)
        running = proc.poll() is None and "closed" not in lines
        waiting = running and (when == "close" or "closing" not in lines)
        proc.kill()
    finally:
        proc.kill()
    return {"acknowledged": acknowledged(), "killed_waiting": waiting, "pid": proc.pid}


def on_disk(path: Path, acknowledged: int) -> dict[str, object]:
    """What the server's disk holds of the writer's file."""
    data = path.read_bytes()
    intact = sum(
        1 for i in range(acknowledged) if data[i * MiB : (i + 1) * MiB] == bytes([i + 1]) * MiB
    )
    return {"size_mib": round(len(data) / MiB, 2), "intact_blocks": intact}


@pytest.mark.parametrize("when", ["write", "close"])
@pytest.mark.parametrize("cache", ["yes", "no"])
def test_a_writer_killed_on_a_slow_link_loses_nothing_it_was_told_was_written(
    make_mount: MakeMount, nfs_dir: Path, cache: str, when: str
) -> None:
    mnt = make_mount(source=nfs_dir, options=(f"writeback_cache={cache}",))
    seen: dict[str, dict[str, object]] = {}
    procs: dict[str, int] = {}
    with slow_link(1 * MiB):
        for side, where in (("direct", nfs_dir), ("mount", mnt.mountpoint)):
            seen[side] = kill_writer(where / f"{side}.bin", when)
            procs[side] = int(seen[side].pop("pid"))  # type: ignore[call-overload]
    for side, pid in procs.items():
        seen[side]["gone"] = wait_gone(pid, 240)
    assert mnt.stop() == 0, mnt.log()
    for side in seen:
        seen[side].update(on_disk(on_server(nfs_dir / f"{side}.bin"), seen[side]["acknowledged"]))  # type: ignore[arg-type]
    record(
        f"killed-in-{when}[cache={cache}]",
        **seen,
        log_not_on_target="not on the target" in mnt.log(),
    )
    # Directly on NFS the client may take a whole 64 MiB into its cache: that writer can be
    # past its writes when it is killed. Through the mount the window holds it back.
    assert seen["mount"]["killed_waiting"], f"the writer did not wait in {when}(): {seen}"
    for side, facts in seen.items():
        assert facts["intact_blocks"] == facts["acknowledged"], (
            f"{side}: acknowledged data lost: {seen}"
        )
    assert "not on the target" not in mnt.log()
