"""Real targets that run out of space: small ext4 file systems on loop devices.

Two kinds, as a backup target runs out of space:

* ``small_target``: an ext4 that is simply small. The target refuses a write at once (ENOSPC
  from write(), as an NFS server that is full answers a WRITE).
* ``thin_target``: an ext4 that believes it is larger than the storage under it (a sparse image
  on a second, small ext4: thin provisioning). Writes are accepted into its page cache and fail
  only when they are written back, so an fsync is the first to learn of it, as from an NFS
  server whose disk filled after it took the data. The journal and inode tables are written out
  when it is made, and its blocks are 4 KiB in one group, with the data's extents allocated as
  written (``dioread_lock``: no unwritten extents to split when their write-back fails), so a
  file's extents fit in its inode: only file data can fail, never a metadata block of the
  target's own (whose failed write-back aborts its journal and turns the whole target
  read-only, EROFS, a different fault: CI saw it, with 1 KiB blocks in 8 MiB groups).

Needs root; every mount, loop device and image is removed again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from fusethrottle._libc import syncfs


def skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (loop devices, mount)"
    if not all(shutil.which(tool) for tool in ("losetup", "mkfs.ext4", "mount", "umount")):
        return "needs losetup, mkfs.ext4, mount and umount"
    return None


def _run(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


@contextlib.contextmanager
def _ext4_on_loop(
    image: Path, size: str, mountpoint: Path, mkfs: tuple[str, ...] = (), options: str = ""
) -> Iterator[Path]:
    """An ext4 of *size* in *image* on a loop device, mounted at *mountpoint* with *options*."""
    _run("truncate", "-s", size, str(image))
    device = _run("losetup", "--show", "-f", "--direct-io=on", str(image))
    mounted = False
    try:
        _run("mkfs.ext4", "-q", "-F", *mkfs, device)
        mountpoint.mkdir(exist_ok=True)
        _run("mount", *(("-o", options) if options else ()), device, str(mountpoint))
        mounted = True
        yield mountpoint
    finally:
        if mounted:
            for _ in range(50):
                if subprocess.run(["umount", str(mountpoint)], capture_output=True).returncode == 0:
                    break
                time.sleep(0.2)
            else:
                subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)
        subprocess.run(["losetup", "-d", device], capture_output=True)
        image.unlink(missing_ok=True)


@contextlib.contextmanager
def small_target(size: str = "32M") -> Iterator[Path]:
    """The root of a small, empty ext4."""
    work = Path(tempfile.mkdtemp(prefix="fusethrottle-full-", dir="/var/tmp"))
    try:
        with _ext4_on_loop(work / "image", size, work / "mnt") as root:
            yield root
    finally:
        shutil.rmtree(work, ignore_errors=True)


_WRITTEN_OUT = "lazy_itable_init=0,lazy_journal_init=0"


@contextlib.contextmanager
def thin_target(storage: str = "32M", claimed: str = "128M") -> Iterator[Path]:
    """A directory ``backups`` on an ext4 that claims *claimed* but is backed by *storage*.

    The directory's own block is written out before it is handed over, while the storage has
    room: a directory block left to the journal's checkpoint lands after the data filled the
    storage, and its failure aborts the journal (EROFS), a fault other than the one meant."""
    work = Path(tempfile.mkdtemp(prefix="fusethrottle-thin-", dir="/var/tmp"))
    try:
        with (
            _ext4_on_loop(work / "storage.img", storage, work / "storage") as storage_root,
            _ext4_on_loop(
                storage_root / "thin.img",
                claimed,
                work / "mnt",
                # 4 KiB blocks (one group: few extents), a small journal and few inodes (room
                # for data on the 32 MiB), all written out now
                mkfs=("-b", "4096", "-J", "size=4", "-N", "2048", "-E", _WRITTEN_OUT),
                options="dioread_lock",
            ) as root,
        ):
            directory = root / "backups"
            directory.mkdir()
            fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
            try:
                syncfs(fd)  # this file system's metadata in place, nobody else's writes
            finally:
                os.close(fd)
            yield directory
    finally:
        shutil.rmtree(work, ignore_errors=True)


def free_bytes(path: Path) -> int:
    """What the target still takes, as root sees it."""
    st = os.statvfs(path)
    return st.f_bfree * st.f_frsize
