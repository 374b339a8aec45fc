"""What the daemon learns before it mounts: whether the target keeps extended attributes, and
whether this process may act on the target as each caller (both decide what the engine offers)."""

from __future__ import annotations

import errno
import os

_NOT_SUPPORTED = (errno.ENOTSUP, errno.EOPNOTSUPP)
CAPABILITY = b"security.capability"


def target_has_xattrs(root_fd: int) -> bool:
    """Whether the target stores extended attributes at all (NFSv3 and EFS do not).

    Asks for two names that are normally absent: a target with xattrs says ENODATA, one without
    says EOPNOTSUPP for both (NFS may support user.* but not security.*; that counts as support).
    """
    for name in (b"user.fusethrottle.probe", CAPABILITY):
        try:
            os.getxattr(b"/proc/self/fd/%d" % root_fd, name)
            return True
        except OSError as err:
            if err.errno not in _NOT_SUPPORTED:
                return True
    return False


def can_switch() -> bool:
    """Whether the engine's threads may take each caller's credentials (the daemon runs as root:
    setfsuid, setfsgid and setgroups per thread)."""
    return os.geteuid() == 0
