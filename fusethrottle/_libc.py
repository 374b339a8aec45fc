"""The few Linux syscalls Python's os module does not expose, through ctypes.

Each function raises OSError with the syscall's errno, like the os module does. They are called
from worker threads only (see backend.py), never on the event loop.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)

AT_FDCWD = -100
AT_SYMLINK_NOFOLLOW = 0x100
AT_EMPTY_PATH = 0x1000
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
UTIME_NOW = (1 << 30) - 1
UTIME_OMIT = (1 << 30) - 2


class _Timespec(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long))


def _check(result: int) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


_libc.renameat2.argtypes = (
    ctypes.c_int,
    ctypes.c_char_p,
    ctypes.c_int,
    ctypes.c_char_p,
    ctypes.c_uint,
)
_libc.fchownat.argtypes = (
    ctypes.c_int,
    ctypes.c_char_p,
    ctypes.c_uint,
    ctypes.c_uint,
    ctypes.c_int,
)
_libc.utimensat.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(_Timespec), ctypes.c_int)
_libc.fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long)


def renameat2(olddirfd: int, oldname: bytes, newdirfd: int, newname: bytes, flags: int) -> None:
    """rename(2) with RENAME_NOREPLACE / RENAME_EXCHANGE, relative to directory fds."""
    _check(_libc.renameat2(olddirfd, oldname, newdirfd, newname, flags))


def fchown_empty(fd: int, uid: int, gid: int) -> None:
    """chown the object an O_PATH fd refers to (symlinks included, never following)."""
    _check(_libc.fchownat(fd, b"", uid & 0xFFFFFFFF, gid & 0xFFFFFFFF, AT_EMPTY_PATH))


def _ts(ns: int | None) -> _Timespec:
    if ns is None:
        return _Timespec(0, UTIME_OMIT)
    return _Timespec(ns // 1_000_000_000, ns % 1_000_000_000)


def utimens_empty(fd: int, atime_ns: int | None, mtime_ns: int | None) -> None:
    """Set times on the object an O_PATH fd refers to; None leaves that time unchanged."""
    times = (_Timespec * 2)(_ts(atime_ns), _ts(mtime_ns))
    _check(_libc.utimensat(fd, b"", times, AT_EMPTY_PATH))


class _StatxTimestamp(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_int64), ("tv_nsec", ctypes.c_uint32), ("_pad", ctypes.c_int32))


class _Statx(ctypes.Structure):
    _fields_ = (
        ("stx_mask", ctypes.c_uint32),
        ("stx_blksize", ctypes.c_uint32),
        ("stx_attributes", ctypes.c_uint64),
        ("stx_nlink", ctypes.c_uint32),
        ("stx_uid", ctypes.c_uint32),
        ("stx_gid", ctypes.c_uint32),
        ("stx_mode", ctypes.c_uint16),
        ("_spare0", ctypes.c_uint16),
        ("stx_ino", ctypes.c_uint64),
        ("stx_size", ctypes.c_uint64),
        ("stx_blocks", ctypes.c_uint64),
        ("stx_attributes_mask", ctypes.c_uint64),
        ("stx_atime", _StatxTimestamp),
        ("stx_btime", _StatxTimestamp),
        ("stx_ctime", _StatxTimestamp),
        ("stx_mtime", _StatxTimestamp),
        ("stx_rdev_major", ctypes.c_uint32),
        ("stx_rdev_minor", ctypes.c_uint32),
        ("stx_dev_major", ctypes.c_uint32),
        ("stx_dev_minor", ctypes.c_uint32),
        ("_spare", ctypes.c_uint64 * 14),
    )


AT_STATX_DONT_SYNC = 0x4000
STATX_BASIC_STATS = 0x7FF
_libc.statx.argtypes = (
    ctypes.c_int,
    ctypes.c_char_p,
    ctypes.c_int,
    ctypes.c_uint,
    ctypes.POINTER(_Statx),
)


def _ns(ts: _StatxTimestamp) -> int:
    return ts.tv_sec * 1_000_000_000 + ts.tv_nsec


def _seconds(ts: _StatxTimestamp) -> float:
    return ts.tv_sec + ts.tv_nsec * 1e-9  # as os.stat computes its float times


def stat_cached(dir_fd: int, name: bytes = b"") -> os.stat_result:
    """lstat of *name* in *dir_fd* (of *dir_fd* itself when empty) as the kernel has it cached.

    statx with AT_STATX_DONT_SYNC: a network file system answers from its attribute cache
    instead of asking the server (NFS: no GETATTR, and no write-back of the file's dirty pages
    first); a local one answers as stat does. For attributes nobody but this mount changes
    (a directory's mode and owner, a file's identity) or that only need to be recent.
    """
    buf = _Statx()
    flags = AT_STATX_DONT_SYNC | AT_SYMLINK_NOFOLLOW | (AT_EMPTY_PATH if not name else 0)
    _check(_libc.statx(dir_fd, name, flags, STATX_BASIC_STATS, ctypes.byref(buf)))
    atime, mtime, ctime = _ns(buf.stx_atime), _ns(buf.stx_mtime), _ns(buf.stx_ctime)
    return os.stat_result(
        (
            buf.stx_mode,
            buf.stx_ino,
            os.makedev(buf.stx_dev_major, buf.stx_dev_minor),
            buf.stx_nlink,
            buf.stx_uid,
            buf.stx_gid,
            buf.stx_size,
            atime // 1_000_000_000,
            mtime // 1_000_000_000,
            ctime // 1_000_000_000,
            _seconds(buf.stx_atime),
            _seconds(buf.stx_mtime),
            _seconds(buf.stx_ctime),
            atime,
            mtime,
            ctime,
            buf.stx_blksize,
            buf.stx_blocks,
            os.makedev(buf.stx_rdev_major, buf.stx_rdev_minor),
        )
    )


def fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    """fallocate(2) with its mode flags (os.posix_fallocate has none)."""
    _check(_libc.fallocate(fd, mode, offset, length))


_libc.syncfs.argtypes = (ctypes.c_int,)
_libc.syncfs.restype = ctypes.c_int


def syncfs(fd: int) -> None:
    """Write back every dirty page of the file system *fd* is on (syncfs(2))."""
    _check(_libc.syncfs(fd))


_libc.sync_file_range.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
_libc.sync_file_range.restype = ctypes.c_int
SYNC_FILE_RANGE_WAIT_BEFORE = 1
SYNC_FILE_RANGE_WRITE = 2
SYNC_FILE_RANGE_WAIT_AFTER = 4


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Start writing back the dirty pages of one byte range (sync_file_range(2), WRITE only)."""
    _check(_libc.sync_file_range(fd, offset, length, SYNC_FILE_RANGE_WRITE))


def write_range_and_wait(fd: int, offset: int, length: int) -> None:
    """Write back the dirty pages of one byte range and wait for them (sync_file_range(2) with
    all three flags). No metadata, no device cache flush: an fdatasync after the last range
    makes it durable."""
    flags = SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER
    _check(_libc.sync_file_range(fd, offset, length, flags))


_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_request_buffers_in_the_heap(largest: int) -> None:
    """Serve buffers up to *largest* bytes from the heap and keep freed ones for reuse.

    Each FUSE write of up to 1 MiB arrives as a new bytes object. glibc hands out blocks that
    large as fresh mmaps and unmaps them on free, so every request paid page faults and page
    zeroing for its buffer: 1 MiB writes went at 399 MB/s with most of the daemon's time there,
    948 MB/s with the buffers kept (tmpfs, 1 GiB dd). Best effort: a libc without mallopt, or
    one that refuses, leaves things as they were.
    """
    mallopt = getattr(_libc, "mallopt", None)
    if mallopt is None:
        return
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    mallopt(_M_MMAP_THRESHOLD, largest)
    mallopt(_M_TRIM_THRESHOLD, 4 * largest)


def release_free_heap() -> None:
    """Give the free memory of every malloc arena back to the system (malloc_trim(3)).

    The request buffers kept by :func:`keep_request_buffers_in_the_heap` are worth keeping
    while requests arrive, not while the mount is idle. Best effort, like that call.
    """
    trim = getattr(_libc, "malloc_trim", None)
    if trim is None:
        return
    trim.argtypes = (ctypes.c_size_t,)
    trim.restype = ctypes.c_int
    trim(0)


MAX_HANDLE_SZ = 128


class _FileHandle(ctypes.Structure):
    _fields_ = (
        ("handle_bytes", ctypes.c_uint),
        ("handle_type", ctypes.c_int),
        ("f_handle", ctypes.c_ubyte * MAX_HANDLE_SZ),
    )


_libc.name_to_handle_at.argtypes = (
    ctypes.c_int,
    ctypes.c_char_p,
    ctypes.POINTER(_FileHandle),
    ctypes.POINTER(ctypes.c_int),
    ctypes.c_int,
)
_libc.name_to_handle_at.restype = ctypes.c_int


def file_handle(fd: int) -> bytes | None:
    """The file system's handle of the object *fd* (an O_PATH descriptor) refers to, or None
    where the file system has none.

    A handle names one object for its whole life: unlike an inode number, the target never
    gives it to another object (NFS carries it on the wire; local file systems put the inode's
    generation in it). So it tells a file that replaced another under the same inode number
    from the one the kernel still knows. On NFS the client encodes it from what it holds: no
    call to the server.
    """
    handle = _FileHandle()
    handle.handle_bytes = MAX_HANDLE_SZ
    mount_id = ctypes.c_int()
    found = _libc.name_to_handle_at(
        fd, b"", ctypes.byref(handle), ctypes.byref(mount_id), AT_EMPTY_PATH
    )
    if found < 0:
        return None
    size = min(handle.handle_bytes, MAX_HANDLE_SZ)
    return handle.handle_type.to_bytes(4, "little", signed=True) + bytes(handle.f_handle[:size])
