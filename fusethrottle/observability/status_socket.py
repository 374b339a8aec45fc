"""Where a mount's status socket lives, and what it may be asked: shared by daemon and client.

Every daemon listens on a per-mount Unix stream socket, whether or not the metrics endpoint is
on. Its name is the mount's device number from /proc/self/mountinfo (FUSE mounts get an
anonymous ``0:NN`` that is unique among live mounts), in a runtime directory:

* ``/run/fusethrottle/0:NN.sock``                 daemon running as root (the systemd service)
* ``$XDG_RUNTIME_DIR/fusethrottle/0:NN.sock``     an unprivileged daemon with a runtime dir
* ``/tmp/fusethrottle-UID/0:NN.sock``             otherwise (directory 0700, checked on use)

The protocol is one request line (one of REQUESTS, ``set`` followed by ``key=value`` words)
answered by one JSON document and a close,
so ``socat - UNIX-CONNECT:/run/fusethrottle/0:NN.sock <<<status`` works too. The answer is
described in docs/METRICS.md. daemon_dir and client_dirs sit side by side so that where a
daemon puts its socket and where the command looks cannot drift apart.

Why not an xattr on the mount root: reading it is a FUSE request, which queues behind whatever
the mount is stuck on; the socket is answered by the event loop directly.
"""

from __future__ import annotations

import os

FSTYPE = "fuse.fusethrottle"
RUN_DIR = "/run/fusethrottle"
REQUESTS = ("status", "tasks", "set")
#: Requests only root and the daemon's own user may make (tasks name files; set changes limits).
PRIVILEGED = ("tasks", "set")


def socket_name(device: str) -> str:
    return f"{device}.sock"


def daemon_dir() -> str:
    """The directory this process (a daemon) puts its socket in."""
    uid = os.geteuid()
    if uid == 0:
        return RUN_DIR
    xdg = os.environ.get("XDG_RUNTIME_DIR", "")
    if xdg and os.path.isabs(xdg) and os.path.isdir(xdg):
        return os.path.join(xdg, "fusethrottle")
    return f"/tmp/fusethrottle-{uid}"


def client_dirs(owner: int | None) -> list[str]:
    """Where a daemon run by *owner* (None: unknown) may have put its socket, best first.

    The command may run as another user than the daemon (root looking at a user's mount, a
    user looking at the service's), so every place daemon_dir could have picked is listed.
    """
    dirs = [RUN_DIR]
    uids = [owner] if owner is not None else []
    if os.geteuid() not in uids:
        uids.append(os.geteuid())
    for uid in uids:
        dirs.append(f"/run/user/{uid}/fusethrottle")
        if uid == os.geteuid() and os.environ.get("XDG_RUNTIME_DIR"):
            dirs.append(os.path.join(os.environ["XDG_RUNTIME_DIR"], "fusethrottle"))
        dirs.append(f"/tmp/fusethrottle-{uid}")
    return list(dict.fromkeys(dirs))
