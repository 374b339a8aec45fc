"""The daemon's side of ``fusethrottle status``: answer requests on the mount's status socket.

Runs as a task on the daemon's event loop, so a mount whose target hangs still answers (see
status_socket for where the socket lives and why it is not an xattr). Nothing here may cost
the mount: a socket that cannot be made is logged and the task idles, and a misbehaving or
flooding client is cut off.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import stat
import struct
from collections.abc import Callable
from typing import Any

import trio

from ..service.mountinfo import find_mount, mounts
from .status_socket import FSTYPE, PRIVILEGED, REQUESTS, RUN_DIR, daemon_dir, socket_name

log = logging.getLogger(__name__)

REQUEST_TIMEOUT = 5.0  # seconds a client gets to send its request line
MAX_CLIENTS = 8

Respond = Callable[[str], dict[str, Any]]


async def serve_control(
    mountpoint: str,
    respond: Respond,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Answer status requests for the mount at *mountpoint* until cancelled.

    *respond* runs on the event loop and returns a JSON-ready dict. A socket that cannot be
    created costs the status command, never the mount: it is logged and this task idles.
    """
    info = find_mount(mountpoint, fstype=FSTYPE)
    if info is None:  # not mounted (unit tests): nothing to name the socket after
        task_status.started()
        return
    directory = daemon_dir()
    with contextlib.suppress(OSError):
        _sweep_stale(directory)
    path = os.path.join(directory, socket_name(info.device))
    await serve_socket(path, info.device, respond, task_status=task_status)


def _make_private_dir(path: str) -> None:
    """Create *path* for our sockets; refuse one that someone else could have prepared.

    A directory another user controls could hold a socket of theirs under our name, and the
    command would show their numbers as ours.
    """
    public = path == RUN_DIR or not path.startswith("/tmp/")
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o755 if public else 0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(f"{path} is not a directory")
    if st.st_uid != os.geteuid():
        raise OSError(f"{path} belongs to uid {st.st_uid}, not to us")
    if st.st_mode & 0o022:
        raise OSError(f"{path} is writable by others")


def _sweep_stale(directory: str) -> None:
    """Remove sockets left by daemons that were killed: their mount is gone and nobody
    listens. A daemon still flushing after a lazy unmount keeps listening and is left alone."""
    live = {entry.device for entry in mounts()}
    for name in os.listdir(directory):
        device = name.removesuffix(".sock")
        if not name.endswith(".sock") or device in live:
            continue
        path = os.path.join(directory, name)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.setblocking(False)
            try:
                probe.connect(path)
            except ConnectionRefusedError:
                with contextlib.suppress(OSError):
                    os.unlink(path)
                    log.debug("removed stale status socket %s", path)
            except OSError:
                pass


async def serve_socket(
    path: str,
    device: str,
    respond: Respond,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen on *path*, answering every request with ``respond(request)`` tagged *device*.

    The tag lets the client tell a stale socket of an earlier mount with the same (reused)
    device number from the right one.
    """
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        _make_private_dir(os.path.dirname(path))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # left by a daemon that died; device numbers are reused
        await sock.bind(path)
        os.chmod(path, 0o666)  # read-only numbers: any local user may ask
        sock.listen(MAX_CLIENTS)
        bound = os.stat(path).st_ino
    except OSError as err:
        sock.close()
        log.warning(
            "status socket %s unavailable (%s); `fusethrottle status` will not work", path, err
        )
        task_status.started()
        return
    limiter = trio.CapacityLimiter(MAX_CLIENTS)
    try:
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                try:
                    conn, _ = await sock.accept()
                except OSError as err:  # EMFILE and the like: try again shortly
                    log.debug("status socket accept: %s", err)
                    await trio.sleep(0.5)
                    continue
                try:  # a flood of clients is turned away, not queued
                    limiter.acquire_on_behalf_of_nowait(conn)
                except trio.WouldBlock:
                    conn.close()
                    continue
                nursery.start_soon(_answer, conn, respond, device, limiter)
    finally:
        sock.close()
        with contextlib.suppress(OSError):
            # Only our own socket: a daemon started since on a reused device number may have
            # replaced it with its own.
            if os.stat(path).st_ino == bound:
                os.unlink(path)


async def _answer(
    conn: trio.socket.SocketType, respond: Respond, device: str, limiter: trio.CapacityLimiter
) -> None:
    try:
        with conn, trio.move_on_after(REQUEST_TIMEOUT):
            try:
                request = (await _read_line(conn)).strip() or "status"
                verb = request.split(" ", 1)[0]
                if verb not in REQUESTS or (verb != "set" and verb != request):
                    reply: dict[str, Any] = {"error": f"unknown request {request!r}"}
                elif verb in PRIVILEGED and _peer_uid(conn) not in (0, os.geteuid()):
                    # Stacks name files and paths, and limits are the mount owner's to change.
                    what = "list its tasks" if verb == "tasks" else "change its settings"
                    reply = {"error": f"only root and the daemon's user may {what}"}
                else:
                    reply = respond(request)
                reply["device"] = device
                data = (json.dumps(reply, separators=(",", ":")) + "\n").encode()
                while data:
                    sent = await conn.send(data)
                    data = data[sent:]
            except OSError as err:  # the client went away
                log.debug("status client: %s", err)
            except Exception:
                log.exception("internal error answering a status request; the mount is fine")
    finally:
        limiter.release_on_behalf_of(conn)


async def _read_line(conn: trio.socket.SocketType, limit: int = 1024) -> str:
    """The request line; bounded, so a client cannot make the daemon buffer without end."""
    buf = b""
    while b"\n" not in buf and len(buf) < limit:
        chunk = await conn.recv(limit)
        if not chunk:
            break
        buf += chunk
    return buf.split(b"\n", 1)[0].decode(errors="replace")


def _peer_uid(conn: trio.socket.SocketType) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]
