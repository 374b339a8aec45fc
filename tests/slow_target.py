"""A real slow target for tests: ext4 on a loop device behind a cgroup-v1 blkio write throttle.

TARGETS.md recipe A. Kernel writeback to it is throttled as well, so Dirty/Writeback pages pile
up exactly as in front of a degraded NFS server. Needs root; always torn down.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

BLKIO = Path("/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device")
EXT4_IOC_SHUTDOWN = 0x8004587D
EXT4_GOING_FLAGS_NOLOGFLUSH = 2


def skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (loop device, blkio throttle)"
    if not BLKIO.exists():
        return "no cgroup-v1 blkio throttle on this kernel"
    return None


@dataclass
class SlowTarget:
    mountpoint: Path
    device: str
    majmin: str

    def throttle(self, bytes_per_second: int) -> None:
        """0 lifts the limit."""
        BLKIO.write_text(f"{self.majmin} {bytes_per_second}\n")

    def shutdown(self) -> None:
        """Make the file system fail every later write and fsync with EIO, like a dead server."""
        fd = os.open(self.mountpoint, os.O_RDONLY)
        try:
            fcntl.ioctl(fd, EXT4_IOC_SHUTDOWN, struct.pack("I", EXT4_GOING_FLAGS_NOLOGFLUSH))
        finally:
            os.close(fd)


def _run(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


@contextlib.contextmanager
def slow_target(size: str = "4G", rate: int = 20 << 20) -> Iterator[SlowTarget]:
    work = Path(tempfile.mkdtemp(prefix="fusethrottle-target-", dir="/var/tmp"))
    image = work / "image"
    mnt = work / "mnt"
    mnt.mkdir()
    _run("truncate", "-s", size, str(image))
    device = _run("losetup", "--show", "-f", "--direct-io=on", str(image))
    majmin = Path(f"/sys/block/{Path(device).name}/dev").read_text().strip()
    target = SlowTarget(mnt, device, majmin)
    mounted = False
    try:
        _run("mkfs.ext4", "-q", "-F", device)
        # noatime: a listing would otherwise update the directory's atime, a journal transaction
        # that waits behind a commit stuck on the throttled device (seen in CI for both data
        # planes): the target itself hanging, which no daemon can answer around. The tests
        # here are about what the daemon does while the target is slow.
        _run("mount", "-o", "noatime", device, str(mnt))
        mounted = True
        target.throttle(rate)
        yield target
    finally:
        with contextlib.suppress(OSError):
            target.throttle(0)
        if mounted:
            for _ in range(50):
                if subprocess.run(["umount", str(mnt)], capture_output=True).returncode == 0:
                    break
                time.sleep(0.2)
            else:
                subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
        subprocess.run(["losetup", "-d", device], capture_output=True)
        image.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            mnt.rmdir()
            work.rmdir()


def dirty_and_writeback() -> int:
    """Dirty + Writeback from /proc/meminfo, in bytes."""
    total = 0
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("Dirty", "Writeback"):
                total += int(rest.split()[0]) * 1024
    return total
