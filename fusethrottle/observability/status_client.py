"""The command's side of ``fusethrottle status``: find a mount's daemon and ask it.

The mount is found in /proc/self/mountinfo, its device and owner (``user_id=`` in its super
options) name the socket, and the mountpoint itself is never touched: a hung or stale mount
would hang the command, which is exactly when someone runs it. Every way of not getting an
answer is a StatusError whose text is the one line the user sees.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Sequence
from typing import Any

from ..service.mountinfo import MountInfo, containing_mount, mounts
from .status_socket import FSTYPE, client_dirs, socket_name

CLIENT_TIMEOUT = 5.0  # seconds the command waits for an answer


class StatusError(Exception):
    """Why there is no status to show; ``str()`` is the one line printed."""


def owner(entry: MountInfo) -> int | None:
    """The uid that mounted *entry* (FUSE's ``user_id=``), None when it does not say."""
    value = entry.super_option("user_id")
    if value is not None:
        with contextlib.suppress(ValueError):
            return int(value)
    return None


def find_mount_of(path: str, table: Sequence[MountInfo] | None = None) -> MountInfo:
    """The mount *path* is on (the mountpoint itself or inside it), without stat()ing the
    mount: only the parent directory is resolved. Raises StatusError with the reason."""
    table = mounts() if table is None else table
    absolute = os.path.abspath(path)
    best = containing_mount(absolute, table)
    if best is not None and best.fstype == FSTYPE:
        return best
    parent, name = os.path.split(absolute)  # a symlink on the way, e.g. /backups -> /srv/b
    best = containing_mount(os.path.join(os.path.realpath(parent), name), table)
    if best is not None and best.fstype == FSTYPE:
        return best
    if not os.path.lexists(absolute):
        raise StatusError(f"{path}: no such file or directory")
    best = containing_mount(os.path.realpath(absolute), table)
    if best is None or best.fstype != FSTYPE:
        where = f" (it is on {best.fstype} mounted at {best.mountpoint})" if best else ""
        raise StatusError(f"{path} is not a fusethrottle mount{where}")
    return best


def query(
    entry: MountInfo, request: str = "status", timeout: float = CLIENT_TIMEOUT
) -> dict[str, Any]:
    """Ask the daemon serving *entry*; raises StatusError when nobody answers properly."""
    tried = []
    for directory in client_dirs(owner(entry)):
        path = os.path.join(directory, socket_name(entry.device))
        if not os.path.exists(path):
            tried.append(directory)
            continue
        return _ask(path, entry, request, timeout)
    raise StatusError(
        f"no status socket for {entry.mountpoint} (device {entry.device}) in "
        f"{', '.join(tried)}: is its daemon from an older fusethrottle, or in another "
        "mount namespace?"
    )


def _ask(path: str, entry: MountInfo, request: str, timeout: float) -> dict[str, Any]:
    """One request on the socket at *path*; each failure says what it means for the mount."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(path)
            sock.sendall(request.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except TimeoutError:
            raise StatusError(
                f"the daemon for {entry.mountpoint} did not answer within {timeout:g} s "
                "(its event loop is stuck; SIGUSR1 dumps its stacks)"
            ) from None
        except ConnectionRefusedError:
            raise StatusError(
                f"nobody listens on {path}: the daemon for {entry.mountpoint} is gone "
                "(a stale mount? clear it with fusermount3 -u)"
            ) from None
        except PermissionError:
            raise StatusError(f"no permission to connect to {path}") from None
        except (ConnectionResetError, BrokenPipeError):
            chunks = []  # turned away: reported below
        except OSError as err:
            raise StatusError(f"{path}: {err.strerror or err}") from None
    if not chunks:
        raise StatusError(
            f"the daemon for {entry.mountpoint} hung up without answering (too many status "
            "clients at once?)"
        )
    try:
        reply = json.loads(b"".join(chunks))
    except ValueError:
        raise StatusError(f"the daemon for {entry.mountpoint} sent a garbled answer") from None
    if not isinstance(reply, dict):
        raise StatusError(f"the daemon for {entry.mountpoint} sent a garbled answer")
    if reply.get("device") != entry.device:
        raise StatusError(f"{path} belongs to another mount (a stale socket)")
    if "error" in reply:
        raise StatusError(str(reply["error"]))
    return reply
