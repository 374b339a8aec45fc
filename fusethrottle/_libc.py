"""The one Linux syscall the daemon needs that Python's os module does not expose: syncfs(2),
through ctypes. Raises OSError with the syscall's errno, as the os module does."""

from __future__ import annotations

import ctypes
import ctypes.util
import os

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.syncfs.argtypes = (ctypes.c_int,)
_libc.syncfs.restype = ctypes.c_int


def syncfs(fd: int) -> None:
    """Write back every dirty page of the file system *fd* is on (syncfs(2))."""
    if _libc.syncfs(fd) < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
