"""``fusethrottle set MOUNTPOINT key=value...``: change a running mount's limits.

The daemon validates the request as at mount time (with its own settings beside it) and applies
all of it or none; this side only finds the mount's socket and says what changed, in one line.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ..observability.status_client import StatusError, find_mount_of, query
from .options import LIVE

USAGE = f"usage: fusethrottle set MOUNTPOINT key=value [key=value...] (keys: {', '.join(LIVE)})"


def main(argv: Sequence[str]) -> int:
    """0 when the daemon applied the change, 1 when it could not be asked, 2 for a bad request
    (nothing was changed then)."""
    args = list(argv)
    if len(args) < 2 or args[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        return 2
    mountpoint, items = args[0], args[1:]
    for item in items:
        if "=" not in item or any(c.isspace() for c in item):
            print(
                f"fusethrottle: set: expected key=value without spaces, got {item!r}",
                file=sys.stderr,
            )
            return 2
    try:
        entry = find_mount_of(mountpoint)
    except StatusError as err:
        print(f"fusethrottle: {err}", file=sys.stderr)
        return 1
    try:
        reply = query(entry, "set " + " ".join(items))
    except StatusError as err:
        print(f"fusethrottle: set: {err}", file=sys.stderr)
        return 1
    if "refused" in reply:  # nothing was applied: the running settings stay
        print(f"fusethrottle: set: {reply['refused']} (nothing changed)", file=sys.stderr)
        return 2
    changed = reply.get("changed") or []
    if changed:
        print(f"{entry.mountpoint}: {', '.join(map(str, changed))}")
    else:
        print(f"{entry.mountpoint}: unchanged (already so)")
    return 0
