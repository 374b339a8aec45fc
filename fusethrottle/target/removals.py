"""Removals that let go of what the daemon holds of a file first (its O_PATH descriptor, its
released descriptors), so that its last name goes for real: on NFS no silly rename, on any
target its space freed at once."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import time
from dataclasses import dataclass, field

from .. import _libc
from .target_calls import O_PATH, close_all


# --- letting go of a file before its last name is removed -----------------------------------
def point_at_placeholder(fd: int) -> None:
    """Replace what *fd* refers to with an unbound socket, keeping the number: it is then not
    reused by another open while the event loop still holds it; anything that reaches through
    it by mistake touches nothing on the target, and a reopen through /proc fails (ENXIO)
    instead of opening something else."""
    placeholder = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        os.dup2(placeholder.fileno(), fd)
    finally:
        placeholder.close()


@dataclass
class LetGo:
    """What the daemon holds of a file whose name is about to be removed (unlink, rename over
    it): its O_PATH descriptor and the released descriptors waiting to be closed.

    On NFS, a file unlinked or renamed over while anything in the client still references it
    is not removed but renamed to ``.nfsXXXXXXXX`` ("silly rename") until the last reference
    goes; on any target its space stays allocated until then. So when the name is the file's
    last link, these are let go of just before the removal, in the same thread: the O_PATH
    descriptor's number is pointed at a placeholder (dup2, so the number is not reused while
    the event loop still holds it), the released ones are closed.
    """

    key: tuple[int, int]
    path_fd: int
    closes: list[int] = field(default_factory=list)
    #: Set by the call: the object was let go of (its name was the last and is gone).
    done: bool = False

    def applies_to(self, st: os.stat_result) -> bool:
        return (st.st_dev, st.st_ino) == self.key and st.st_nlink <= 1

    def release(self) -> None:
        point_at_placeholder(self.path_fd)
        close_all(self.closes)
        self.closes = []

    def restore(self, dir_fd: int, name: bytes) -> None:
        """The removal failed: hold the object again (by the name it still has)."""
        with contextlib.suppress(OSError):
            fd = os.open(name, O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            try:
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) == self.key:
                    os.dup2(fd, self.path_fd)
                    return
            finally:
                os.close(fd)
        self.done = True  # gone after all (or replaced): nothing to hold


def _unlink(dir_fd: int, name: bytes, let_go: LetGo | None) -> os.stat_result:
    """Remove *name*; returns what it was (so the caller knows whether the last link went).
    With *let_go*, what the daemon holds of that file is let go of first if this is its last
    link (see LetGo); its queued descriptors are closed whatever happens."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if let_go is None or not let_go.applies_to(st):
            os.unlink(name, dir_fd=dir_fd)
            return st
        let_go.release()
        let_go.done = True
        try:
            os.unlink(name, dir_fd=dir_fd)
        except OSError:
            let_go.done = False
            let_go.restore(dir_fd, name)
            raise
        return st
    finally:
        if let_go is not None:
            close_all(let_go.closes)
            let_go.closes = []


#: How long an rmdir waits for files removed while open to go (see _rmdir).
REMOVED_WHILE_OPEN_WAIT = 2.0


def _only_removed_while_open(dir_fd: int, name: bytes) -> bool:
    """Whether the directory *name* holds nothing but NFS's .nfsXXXX files (files removed
    while open, which go at their last close); none at all too (the last went meanwhile)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        return all(entry.startswith(".nfs") for entry in os.listdir(fd))
    finally:
        os.close(fd)


def _rmdir(dir_fd: int, name: bytes) -> None:
    """rmdir(2). A file the caller removed while open is a .nfsXXXX on NFS until the last
    close, which the NFS client follows with its removal without waiting for it; the caller's
    own close came before this rmdir, but the daemon's close comes a moment later (the kernel
    does not wait for the release). A directory emptied of all but those is retried for that
    moment, at most REMOVED_WHILE_OPEN_WAIT (stress-ng's hdd stressor saw ENOTEMPTY)."""
    deadline = time.monotonic() + REMOVED_WHILE_OPEN_WAIT
    pause = 0.002
    while True:
        try:
            os.rmdir(name, dir_fd=dir_fd)
            return
        except OSError as err:
            if err.errno != errno.ENOTEMPTY or time.monotonic() >= deadline:
                raise
            if not _only_removed_while_open(dir_fd, name):
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


def _rename(
    old_dir: int, old: bytes, new_dir: int, new: bytes, flags: int, let_go: LetGo | None
) -> None:
    """rename(2) (renameat2 with *flags*); with *let_go*, what the daemon holds of the file the
    rename replaces is let go of first (see LetGo); its queued descriptors are closed whatever
    happens."""

    def rename() -> None:
        if flags:
            _libc.renameat2(old_dir, old, new_dir, new, flags)
        else:
            os.rename(old, new, src_dir_fd=old_dir, dst_dir_fd=new_dir)

    try:
        if let_go is None:
            rename()
            return
        try:
            replaced = os.stat(new, dir_fd=new_dir, follow_symlinks=False)
        except FileNotFoundError:
            rename()
            return
        if not let_go.applies_to(replaced):
            rename()
            return
        let_go.release()
        let_go.done = True
        try:
            rename()
        except OSError:
            let_go.done = False
            let_go.restore(new_dir, new)
            raise
    finally:
        if let_go is not None:
            close_all(let_go.closes)
            let_go.closes = []
