"""The blocking system calls against the target, one function per operation.

Backend (backend.py) runs each of these in a worker thread; nothing here knows about trio or the
event loop, so each function can be read, and tested, as plain POSIX code. All paths are relative
to directory descriptors, and inodes are O_PATH descriptors reopened through ``/proc/self/fd``.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import stat
import threading
from dataclasses import dataclass
from typing import Any

from .. import _libc

O_PATH = os.O_PATH
# Flags that make sense when *creating* a path but must not reach a re-open through /proc.
_REOPEN_STRIP = os.O_CREAT | os.O_EXCL | os.O_NOCTTY | os.O_NOFOLLOW


def proc_path(fd: int) -> bytes:
    """The magic link that reopens whatever *fd* refers to."""
    return b"/proc/self/fd/%d" % fd


@dataclass(frozen=True)
class Created:
    """A newly created or looked-up object: an O_PATH fd for the inode table plus its stat,
    and its file handle (None where the target has none), which tells it from an object that
    had its inode number before (see inodes.py)."""

    path_fd: int
    st: os.stat_result
    handle: bytes | None = None


def _lookup(dir_fd: int, name: bytes) -> Created:
    fd = os.open(name, O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        return Created(fd, os.fstat(fd), _libc.file_handle(fd))
    except BaseException:
        os.close(fd)
        raise


def _look_again(dir_fd: int, name: bytes, mode: int) -> Created:
    """Look *name* up after the target called what it named stale.

    A lookup by an O_PATH open takes the target client's cached name as it is: on NFS the
    client keeps serving a name another client removed and made anew (with the old, stale
    handle) until the directory's attributes time out (acdirmin: 30 s). An open for reading
    has NFS check the name with the server first (close-to-open), so one is made, and closed,
    before the lookup; only for files and directories (opening a device or a fifo could do
    something), and a refusal (no read permission) is no matter: the lookup follows anyway.
    """
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
        with contextlib.suppress(OSError):
            os.close(os.open(name, flags, dir_fd=dir_fd))
    return _lookup(dir_fd, name)


def close_created(created: Created) -> None:
    """Give back what a lookup or create made, when nobody takes it any more (its caller gave
    up waiting: see WorkerPool.run's *discard*)."""
    if created.path_fd >= 0:
        with contextlib.suppress(OSError):
            os.close(created.path_fd)


def _needs_chown(st: os.stat_result, uid: int, gid: int) -> tuple[int, int]:
    return (uid if st.st_uid != uid else -1, gid if st.st_gid != gid else -1)


def _own(
    path_fd: int, st: os.stat_result, owner: tuple[int, int] | None, mode: int | None
) -> os.stat_result:
    """Give a new object to the calling user, keeping setgid-directory group inheritance.

    chown clears set-user/group-ID bits on regular files, so the requested mode is restored.
    """
    if owner is None:
        return st
    uid, gid = owner
    want_uid, want_gid = _needs_chown(st, uid, gid)
    if want_uid == -1 and want_gid == -1:
        return st
    _libc.fchown_empty(path_fd, want_uid, want_gid)
    if mode is not None and mode & (stat.S_ISUID | stat.S_ISGID) and not stat.S_ISLNK(st.st_mode):
        os.chmod(proc_path(path_fd), stat.S_IMODE(mode))
    return os.fstat(path_fd)


def _owner_for(dir_fd: int, uid: int, gid: int) -> tuple[int, int]:
    """New objects in a setgid directory inherit its group, as the kernel would do."""
    parent = os.fstat(dir_fd)
    if parent.st_mode & stat.S_ISGID:
        return uid, parent.st_gid
    return uid, gid


def _create_file(
    dir_fd: int, name: bytes, flags: int, mode: int, owner: tuple[int, int] | None
) -> tuple[int, Created]:
    """Create *name* and open it; a name that exists already is never given to the caller.

    The kernel sends CREATE only after its own lookup missed. If the name exists now (another
    NFS client made it in between) and the new file is to be chowned to the caller (*owner*),
    opening it would skip the kernel's permission check and chown someone else's file: O_EXCL
    then, and ESTALE makes the kernel look the name up again and open the existing file the
    normal way; O_EXCL callers get their EEXIST. Otherwise the call runs as the caller (or the
    caller is the daemon): opening an existing file is what the target does for the caller's
    own open(O_CREAT), with the target's permission check. O_EXCL is not added there because
    it costs a round trip on NFS: an exclusive create keeps its verifier in the file's times,
    which the client then sets with a SETATTR (v3 and v4.1 alike).
    """
    if owner is not None:
        owner = _owner_for(dir_fd, *owner)
    # Without O_EXCL the name may be one another client made meanwhile: O_NOFOLLOW, as a
    # symlink is the kernel's to follow (ELOOP -> ESTALE: it looks the name up again), and
    # O_NONBLOCK, as a FIFO must not hold the thread (ENXIO, or not a regular file: ESTALE).
    exclusive = os.O_EXCL if owner is not None else os.O_NOFOLLOW | os.O_NONBLOCK
    stale = (
        ()
        if owner is not None
        else (errno.ENXIO,)
        if flags & os.O_NOFOLLOW
        else (
            errno.ENXIO,
            errno.ELOOP,
        )
    )
    try:
        try:
            fd = os.open(name, flags | os.O_CREAT | exclusive | os.O_CLOEXEC, mode, dir_fd=dir_fd)
        except BlockingIOError:  # a lease on it (a local target): wait as the caller's would
            fd = os.open(
                name, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd
            )
    except FileExistsError:
        if flags & os.O_EXCL:
            raise
        raise OSError(errno.ESTALE, os.strerror(errno.ESTALE)) from None
    except OSError as err:
        if err.errno not in stale:
            raise
        raise OSError(errno.ESTALE, os.strerror(errno.ESTALE)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # a FIFO or device another client made: the kernel's
            raise OSError(errno.ESTALE, os.strerror(errno.ESTALE))
        if exclusive & os.O_NONBLOCK and not flags & os.O_NONBLOCK:
            os.set_blocking(fd, True)
        path_fd = os.open(proc_path(fd), O_PATH | os.O_CLOEXEC)
        try:
            # A target that refuses chown (e.g. NFS root_squash) keeps what it made, as in _make.
            with contextlib.suppress(PermissionError):
                st = _own(path_fd, st, owner, mode)
        except BaseException:
            os.close(path_fd)
            raise
    except BaseException:
        os.close(fd)
        raise
    return fd, Created(path_fd, st, _libc.file_handle(path_fd))


def _make(
    kind: str, dir_fd: int, name: bytes, mode: int, arg: Any, owner: tuple[int, int] | None
) -> Created:
    if owner is not None:
        owner = _owner_for(dir_fd, *owner)
    if kind == "mkdir":
        os.mkdir(name, mode, dir_fd=dir_fd)
    elif kind == "mknod":
        os.mknod(name, mode, arg, dir_fd=dir_fd)
    elif kind == "symlink":
        os.symlink(arg, name, dir_fd=dir_fd)
    else:  # pragma: no cover - programming error
        raise ValueError(kind)
    created = _lookup(dir_fd, name)
    try:
        st = _own(created.path_fd, created.st, owner, None if kind == "symlink" else mode)
    except OSError as err:
        if err.errno != errno.EPERM:
            raise
        st = created.st  # target refuses chown (e.g. NFS root_squash): keep what it made
    return Created(created.path_fd, st, created.handle)


def _reopen(path_fd: int, flags: int) -> int:
    return os.open(proc_path(path_fd), (flags & ~_REOPEN_STRIP) | os.O_CLOEXEC)


def _open_file(
    path_fd: int, flags: int, write_only: int | None, check_capability: bool
) -> tuple[int, bool, bool, os.stat_result]:
    """Open a file for I/O: (fd, whether it has a file capability, whether *write_only* was
    used, its attributes as the open found them: on NFS fresh, close-to-open).

    *write_only*: the caller's own write-only flags, tried when the target refuses *flags*
    (read and write, which the writeback cache needs) because the caller may write the file but
    not read it (mode 0277, say): the target checks as the caller (credentials.py), and the
    caller's own open must succeed as it would without fusethrottle."""
    try:
        fd = _reopen(path_fd, flags)
        fell_back = False
    except PermissionError:
        if write_only is None:
            raise
        fd = _reopen(path_fd, write_only)
        fell_back = True
    try:
        st = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd, check_capability and _has_capability(fd), fell_back, st


def _setattr(
    path_fd: int,
    fd: int | None,
    mode: int | None,
    uid: int | None,
    gid: int | None,
    size: int | None,
    atime_ns: int | None,
    mtime_ns: int | None,
) -> os.stat_result:
    # Only its type is wanted here, which never changes: a plain fstat on NFS would be a
    # GETATTR (after writing back the file's dirty pages) before every chmod, chown or utimes.
    is_link = stat.S_ISLNK(_libc.stat_cached(path_fd).st_mode)
    if mode is not None and not is_link:
        if fd is not None:
            os.fchmod(fd, mode)
        else:
            os.chmod(proc_path(path_fd), mode)
    if uid is not None or gid is not None:
        _libc.fchown_empty(path_fd, -1 if uid is None else uid, -1 if gid is None else gid)
    if size is not None:
        if fd is not None:
            os.ftruncate(fd, size)
        else:
            os.truncate(proc_path(path_fd), size)
    if atime_ns is not None or mtime_ns is not None:
        _libc.utimens_empty(path_fd, atime_ns, mtime_ns)
    return os.fstat(path_fd)


def _list_entries(
    dir_fd: int, names: list[bytes] | None, start: int, count: int
) -> tuple[list[bytes], list[tuple[int, bytes, Created]]]:
    """Snapshot a directory's names (once) and look up ``count`` of them from ``start``.

    Entries that vanished since the snapshot are skipped rather than failing the listing.
    """
    if names is None:
        names = [b".", b"..", *(os.fsencode(n) for n in os.listdir(dir_fd))]
    out: list[tuple[int, bytes, Created]] = []
    index = start
    while index < len(names) and len(out) < count:
        name = names[index]
        index += 1
        try:
            if name in (b".", b".."):
                # Shown to readdir only; never registered (the kernel takes no reference).
                out.append((index, name, Created(-1, os.stat(name, dir_fd=dir_fd))))
            else:
                out.append((index, name, _lookup(dir_fd, name)))
        except FileNotFoundError:
            continue
    return names, out


_NOT_SUPPORTED = (errno.ENOTSUP, errno.EOPNOTSUPP)
CAPABILITY = b"security.capability"


def target_has_xattrs(root_fd: int) -> bool:
    """Whether the target stores extended attributes at all (NFSv3 and EFS do not).

    Asks for two names that are normally absent: a target with xattrs says ENODATA, one without
    says EOPNOTSUPP for both (NFS may support user.* but not security.*; that counts as support).
    """
    for name in (b"user.fusethrottle.probe", CAPABILITY):
        try:
            os.getxattr(proc_path(root_fd), name)
            return True
        except OSError as err:
            if err.errno not in _NOT_SUPPORTED:
                return True
    return False


def _has_capability(fd: int) -> bool:
    try:
        os.getxattr(fd, CAPABILITY)
        return True
    except OSError:
        return False


def _drop_capability(fd: int) -> None:
    """What the kernel does on a write when it can ask about xattrs (file_remove_privs)."""
    try:
        os.removexattr(fd, CAPABILITY)
    except OSError as err:
        if err.errno not in (errno.ENODATA, *_NOT_SUPPORTED):
            raise


def _dir_stats(dir_fds: tuple[int, ...]) -> list[os.stat_result]:
    """The directories' attributes right after we changed them (for getattr to answer from)."""
    stats = []
    for fd in dict.fromkeys(dir_fds):
        with contextlib.suppress(OSError):
            stats.append(os.fstat(fd))
    return stats


_buffers = threading.local()


def _aligned_buffer(size: int) -> mmap.mmap:
    """This thread's page-aligned buffer (an anonymous mmap is one) of at least *size* bytes,
    kept for the next call: a new mapping per write faults in every page again."""
    buf: mmap.mmap | None = getattr(_buffers, "buf", None)
    if buf is None or len(buf) < size:
        if buf is not None:
            buf.close()
        buf = _buffers.buf = mmap.mmap(-1, max(size, ALIGNED_BUFFER))
    return buf


def _aligned_pwrite(fd: int, data: bytes, offset: int) -> int:
    """O_DIRECT needs a page-aligned buffer."""
    if not data:
        return 0
    buf = _aligned_buffer(len(data))
    buf[: len(data)] = data
    with memoryview(buf) as view, view[: len(data)] as part:
        return os.pwritev(fd, [part], offset)


#: Offsets and lengths a write to the target with O_DIRECT must be multiples of (the page
#: size: what the writeback cache hands over, and enough for any device's logical block).
DIRECT_ALIGN = 4096
ALIGNED_BUFFER = 1 << 20


def _open_direct(fd: int) -> int:
    """A second descriptor of the file *fd* has open, for writes with O_DIRECT; where there can
    be none, minus the errno why: the target has no direct I/O (EINVAL: tmpfs before Linux 6.6,
    some FUSE file systems), or the caller may not open the file for writing again (EACCES,
    EPERM: a file created read-only, as tar creates a read-only member, is writable through the
    descriptor its creator got and no other). The writes then take the written-back-and-dropped
    path, never fail for it."""
    try:
        return os.open(proc_path(fd), os.O_WRONLY | os.O_DIRECT | os.O_CLOEXEC)
    except OSError as err:
        if err.errno in (errno.EINVAL, errno.EACCES, errno.EPERM):
            return -err.errno
        raise


def _pwrite_uncached(fd: int, direct_fd: int, data: bytes, offset: int) -> int:
    """Write *data* at *offset* leaving none of it in the target's page cache.

    A whole run of pages goes through *direct_fd* (O_DIRECT): no page is made at all. Anything
    else (a file's last partial page, an unaligned write without the writeback cache, a target
    without direct I/O: *direct_fd* -1) is written through the page cache, written back and
    waited for, then dropped: its pages are dirty or under write-back only during this call.
    Reclaim in a memory cgroup the daemon shares with an application then never meets a page
    of the target under write-back (cgroup v1 waits for it: seconds behind a slow target)."""
    if direct_fd >= 0 and offset % DIRECT_ALIGN == 0 and len(data) % DIRECT_ALIGN == 0:
        return _aligned_pwrite(direct_fd, data, offset)
    written = os.pwrite(fd, data, offset)
    if written > 0:
        _libc.write_range_and_wait(fd, offset, written)
        # Whole pages: the kernel keeps a partly covered one (it is clean now all the same).
        first = offset - offset % DIRECT_ALIGN
        end = -(-(offset + written) // DIRECT_ALIGN) * DIRECT_ALIGN
        os.posix_fadvise(fd, first, end - first, os.POSIX_FADV_DONTNEED)
    return written


def _aligned_pread(fd: int, size: int, offset: int) -> bytes:
    if size <= 0:
        return b""
    with mmap.mmap(-1, size) as buf:
        n = os.preadv(fd, [buf], offset)
        return buf[:n]


def _flush(fd: int, want_stat: bool = False) -> os.stat_result | None:
    # close() of a duplicate is what NFS uses to write back and report errors on close(2),
    # without giving up the descriptor the kernel will release later.
    os.close(os.dup(fd))
    return _libc.stat_cached(fd) if want_stat else None


def close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):  # nobody is told: the kernel ignores release errors
            os.close(fd)


def _listxattr(path_fd: int) -> list[bytes]:
    try:
        return [os.fsencode(n) for n in os.listxattr(proc_path(path_fd))]
    except OSError as err:
        if err.errno in (errno.ENOTSUP, errno.EPERM) and stat.S_ISLNK(os.fstat(path_fd).st_mode):
            return []
        raise


def _readlink(path_fd: int) -> bytes:
    return os.readlink(b"", dir_fd=path_fd)
