"""What a sync does on the target: write the new range back in pieces, fdatasync, drop what
is committed from the page cache."""

from __future__ import annotations

import os
from dataclasses import dataclass

from .. import _libc
from .target_calls import proc_path


@dataclass(frozen=True)
class SyncPlan:
    """How an injected sync goes easy on the target's queue and on the page cache.

    ``written`` is the byte range written since the file's previous sync began. It is written
    back ``piece`` bytes at a time, two pieces in flight, before the fdatasync that makes it
    durable: a page waits in the target's queue behind two pieces, not behind the whole batch
    (memory cgroup reclaim that meets a page under writeback waits for it). ``drop`` then evicts the
    range from the page cache: the target has it, and the backup never reads it again.
    """

    written: tuple[int, int] | None = None
    piece: int = 0
    drop: bool = False


#: Passes over what was written past a sync's range while it was written back.
TAIL_PASSES = 8


def _write_back_in_pieces(fd: int, lo: int, hi: int, piece: int) -> None:
    """Two pieces in the target's queue at a time: the next one is started before the previous
    one is waited for, so the target never idles between pieces, and no page waits behind
    more than two."""
    previous: int | None = None
    for off in range(lo, hi, piece):
        _libc.start_writeback(fd, off, min(piece, hi - off))
        if previous is not None:
            _libc.write_range_and_wait(fd, previous, piece)
        previous = off
    if previous is not None:
        _libc.write_range_and_wait(fd, previous, min(piece, hi - previous))


def _fsync_path(
    path_fd: int, datasync: bool, plan: SyncPlan | None = None, fd: int | None = None
) -> None:
    """Sync a file through *fd*, an open descriptor of it (a released handle's, which the
    caller closes: on NFS another open of the file is an OPEN and a CLOSE on the wire, and its
    close after the handle's a second CLOSE or an OPEN_DOWNGRADE), or else through a
    descriptor reopened from *path_fd*."""
    own = fd is None
    if fd is None:
        try:
            fd = os.open(proc_path(path_fd), os.O_RDONLY | os.O_CLOEXEC)
        except PermissionError:  # a write-only file and an unprivileged daemon
            fd = os.open(proc_path(path_fd), os.O_WRONLY | os.O_CLOEXEC)
    try:
        lo, hi = plan.written if plan and plan.written else (0, 0)
        if plan and plan.piece > 0:
            _write_back_in_pieces(fd, lo, hi, plan.piece)
            # What was written past the range while it was written back: also in pieces, or
            # the fdatasync would put all of it under writeback at once. (It is the next
            # sync's to account for; that one then finds it on the target already.) The size
            # is the one the target's client holds, which counts our writes not yet sent: a
            # plain fstat on NFS first writes back every dirty page of the file and then asks
            # the server (a GETATTR), which would defeat the pieces.
            # Again while the writer added more than a piece during a pass (TAIL_PASSES at
            # most; the window bounds what it can add).
            done = hi
            for _ in range(TAIL_PASSES):
                size = _libc.stat_cached(fd).st_size
                if size <= done:
                    break
                _write_back_in_pieces(fd, done, size, plan.piece)
                if size - done < plan.piece:
                    break
                done = size
        (os.fdatasync if datasync else os.fsync)(fd)
        if plan and plan.drop:
            # Whole file when the range is unknown (a released small file).
            os.posix_fadvise(fd, lo, hi - lo, os.POSIX_FADV_DONTNEED)
    finally:
        if own:
            os.close(fd)


def _fsync_dir(path_fd: int, datasync: bool) -> None:
    fd = os.open(proc_path(path_fd), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        (os.fdatasync if datasync else os.fsync)(fd)
    finally:
        os.close(fd)
