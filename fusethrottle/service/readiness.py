"""Whether a mount answers, asked from outside the daemon."""

from __future__ import annotations

import subprocess
import sys

#: The child that asks the mount for its root's attributes; prints why it could not.
_STAT_CHILD = """
import os, sys
try:
    os.stat(sys.argv[1])
except OSError as err:
    sys.exit(err.strerror)
"""


def stat_from_child(mountpoint: str) -> str | None:
    """Stat *mountpoint* from a child process: None if it answered, else why not.

    Never from a thread of the daemon: once the daemon has read a request, the kernel waits
    for its answer without letting the asking thread die, so a daemon killed (systemd's start
    timeout) while its own stat waits on a slow target could never exit. A child is released
    with ENOTCONN as soon as the daemon's descriptor closes.
    """
    child = subprocess.run(
        [sys.executable, "-I", "-S", "-c", _STAT_CHILD, mountpoint],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    if child.returncode == 0:
        return None
    return child.stderr.strip() or f"the check exited with {child.returncode}"
