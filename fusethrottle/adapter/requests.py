"""How a FUSE request is answered: the handles it names, the one error mapping every handler
ends in, and what a log line may say of its arguments."""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pyfuse3
import trio

from ..loglimit import LogLimiter
from ..metering.meter import METADATA_CLASS
from ..target.credentials import Caller
from .inodes import Inode

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

# The kernel asks for this on every write() to decide whether to drop privileges.
CAPABILITY = b"security.capability"
CAPABILITY_TTL = 60.0
ERRNO_LOG_INTERVAL = 10.0
#: Longest an unlink (or a rename over a file) waits for a running background fsync of the
#: file it removes: that fsync's own descriptor keeps the file (see _let_go).
LET_GO_WAIT = 2.0


@dataclass(eq=False)
class FileHandle:
    fd: int
    inode: Inode
    flags: int
    direct: bool
    #: Who opened it: reads, writes and fsyncs of the handle run as them.
    caller: Caller | None = None
    #: The opener's thread id: the kernel does not say who reads or writes through a handle,
    #: so a request through it counts as the opener's (see killable.py).
    pid: int = 0
    #: Writes through it are the kernel writing back its cache (the writeback cache, a handle
    #: without O_DIRECT): they carry data nobody else holds, on nobody's behalf, and are never
    #: answered early, whatever becomes of the opener (a failed write-back drops the pages).
    write_back: bool = False
    #: The same file opened again with O_DIRECT, for writes that leave nothing in the target's
    #: page cache (target_io=direct): None until the first whole-page write, -1 where the
    #: target has no direct I/O. Closed with the handle.
    direct_fd: int | None = None

    def extra_fds(self) -> list[int]:
        """Descriptors besides ``fd`` to close with the handle."""
        return [self.direct_fd] if self.direct_fd is not None and self.direct_fd >= 0 else []


@dataclass(eq=False)
class DirHandle:
    fd: int
    inode: Inode
    caller: Caller | None = None
    names: list[bytes] | None = None
    pid: int = 0


class ErrorLog:
    """Logs each (operation, errno) of the target at most once per interval."""

    _QUIET = frozenset(
        {
            errno.ENOENT,
            errno.EEXIST,
            errno.ENOTEMPTY,
            errno.ENODATA,
            errno.EACCES,
            errno.EPERM,
            errno.ENOTDIR,
            errno.EISDIR,
            errno.EINVAL,
            errno.ERANGE,
            errno.EXDEV,
            errno.ENOTSUP,
            errno.ENAMETOOLONG,
            errno.ELOOP,
            errno.ESTALE,
            errno.EMLINK,
            errno.EBADF,
        }
    )

    def __init__(self) -> None:
        self._limit = LogLimiter(ERRNO_LOG_INTERVAL)

    def report(self, op: str, err: int, detail: str) -> None:
        if err in self._QUIET or not self._limit.allow((op, err), time.monotonic()):
            return
        log.warning("target error in %s (%s): %s", op, detail, os.strerror(err))


@contextlib.contextmanager
def let_go_races(node: Inode) -> Iterator[None]:
    """A call through a node whose last name was removed meanwhile (its descriptor now points
    at a placeholder, see names.NameOps._let_go) fails as for a removed file: ENOENT."""
    try:
        yield
    except OSError:
        if node.detaching or node.detached:
            raise pyfuse3.FUSEError(errno.ENOENT) from None
        raise


#: Requests that name a file or directory handle (first argument) rather than a node.
HANDLE_OPS = frozenset(
    {"read", "write", "flush", "release", "fsync", "readdir", "releasedir", "fsyncdir"}
)


def replies(fn: F) -> F:
    """Every handler ends in a reply or a FUSEError, whatever happens inside it; a request
    whose caller is being killed is answered EINTR at once (killable.py)."""
    op = fn.__name__

    charged = METADATA_CLASS.get(op)
    by_handle = op in HANDLE_OPS

    @functools.wraps(fn)
    async def handler(self: Any, *args: Any) -> Any:
        self.requests_total += 1
        self.events.operation(op)
        with self.kills.request(self._caller_tid(args, op, by_handle)):
            try:
                if charged is not None and self.ceilings is not None:
                    await self.ceilings.wait(charged, 0)
                return await fn(self, *args)
            except pyfuse3.FUSEError:
                raise
            except OSError as err:
                code = err.errno or errno.EIO
                self.events.target_error(op, code)
                self._errors.report(op, code, describe(args, op))
                if code == errno.ESTALE and not by_handle:
                    self._called_stale(args)
                raise pyfuse3.FUSEError(code) from None
            except trio.Cancelled:
                raise
            except Exception:
                log.exception("internal error in %s%s; answered EIO", op, describe(args, op))
                raise pyfuse3.FUSEError(errno.EIO) from None
        # Only a cancelled request gets here: its caller is being killed.
        raise pyfuse3.FUSEError(errno.EINTR)

    return handler  # type: ignore[return-value]


# Arguments after these positions are file data or xattr values: never written to a log.
DATA_ARG = {"write": 2, "setxattr": 2}
SHOWN_BYTES = 255


def describe(args: tuple[Any, ...], op: str = "") -> str:
    """Node ids, offsets and names of a request, for a log line; never the data it carries."""
    shown = []
    for arg in args[: DATA_ARG.get(op, 3)]:
        if isinstance(arg, bool) or not isinstance(arg, int | bytes):
            continue
        if isinstance(arg, bytes) and len(arg) > SHOWN_BYTES:
            shown.append(f"<{len(arg)} bytes>")
        else:
            shown.append(repr(arg))
    return "(" + ", ".join(shown) + ")"
