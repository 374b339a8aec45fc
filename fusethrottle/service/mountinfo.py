"""Read /proc/self/mountinfo: is a path a mount point, of which type, which device.

Used to refuse a busy or stale mountpoint before mounting, to notice an unmount without asking
the mount itself (a stat through a stale mount would hang or fail), and by ``fusethrottle
status`` to find the device and owner of the mount a path is on.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

MOUNTINFO = "/proc/self/mountinfo"


@dataclass(frozen=True)
class MountInfo:
    mountpoint: str
    device: str  # "major:minor"
    fstype: str
    source: str
    super_options: str = ""  # the filesystem's own options, e.g. "rw,user_id=0,group_id=0"

    def super_option(self, name: str) -> str | None:
        """The value of super option *name* ("" for a bare flag), None when absent.

        FUSE records who mounted it as ``user_id=``, which says whose runtime directory the
        daemon's status socket is in, without asking the mount.
        """
        for option in self.super_options.split(","):
            key, sep, value = option.partition("=")
            if key == name:
                return value if sep else ""
        return None


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


def parse(text: str) -> list[MountInfo]:
    """Every well-formed line of a mountinfo file, in the kernel's order (later on top)."""
    result = []
    # At newlines and spaces only: the kernel escapes those in a path, never a carriage
    # return or another separator that splitlines() or split() would cut a path at.
    for line in text.split("\n"):
        # Optional fields ("shared:1", ...) sit before the " - " separator, so split there.
        left, _, right = line.partition(" - ")
        fields = left.split(" ")
        rest = right.split(" ")
        if len(fields) < 5 or len(rest) < 2:
            continue
        result.append(
            MountInfo(
                _unescape(fields[4]),
                fields[2],
                rest[0],
                _unescape(rest[1]),
                rest[2] if len(rest) > 2 else "",
            )
        )
    return result


def mounts(path: str = MOUNTINFO) -> list[MountInfo]:
    """The mount table. Paths are bytes to the kernel: one that is not UTF-8 (anyone's mount,
    anywhere on the host) is read as Python reads file names (surrogateescape), never a
    UnicodeDecodeError out of status, the mount's checks or the unmount watcher; a carriage
    return in a path is its own (newline="": no universal newlines)."""
    with open(path, encoding="utf-8", errors="surrogateescape", newline="") as f:
        return parse(f.read())


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


def containing_mount(path: str, table: Sequence[MountInfo]) -> MountInfo | None:
    """The mount *path* is on: the topmost one at *path* or its nearest mounted ancestor.

    Pure string work on an absolute, already resolved *path*, for the same reason as
    find_mount. Of mounts on the same directory the later one in *table* is on top.
    """
    best: MountInfo | None = None
    for entry in table:
        mp = entry.mountpoint
        if (path == mp or path.startswith(mp.rstrip("/") + "/")) and (
            best is None or len(mp) >= len(best.mountpoint)
        ):
            best = entry
    return best
