"""Read /proc/self/mountinfo: is a path a mount point, of which type, which device.

Used to refuse a busy or stale mountpoint before mounting, and to notice an unmount without
asking the mount itself (a stat through a stale mount would hang or fail).
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class MountInfo:
    mountpoint: str
    device: str  # "major:minor"
    fstype: str
    source: str


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounts(path: str = "/proc/self/mountinfo") -> list[MountInfo]:
    result = []
    with open(path) as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields = left.split()
            rest = right.split()
            if len(fields) < 5 or len(rest) < 2:
                continue
            result.append(MountInfo(_unescape(fields[4]), fields[2], rest[0], _unescape(rest[1])))
    return result


def find_mount(
    mountpoint: str, *, fstype: str | None = None, device: str | None = None
) -> MountInfo | None:
    """The topmost mount at *mountpoint* (optionally of *fstype* / on *device*), or None.

    Never touches *mountpoint* itself (no realpath, no stat): asking a mount that is not yet
    serving, or is stale, about itself would hang. Pass an already resolved path.
    """
    target = os.path.abspath(mountpoint)
    found = None
    for info in mounts():
        if info.mountpoint != target:
            continue
        if fstype is not None and info.fstype != fstype:
            continue
        if device is not None and info.device != device:
            continue
        found = info
    return found
