"""FUSE notifications: messages the daemon writes to the FUSE device unasked (no request, no reply).

The one place that knows their layout, for kernel_pages.py (drop a synced range of a file's
pages: pyfuse3 only offers the whole file) and kernel_entries.py (drop names when descriptors
run short). The layout is ``include/uapi/linux/fuse.h``: a ``fuse_out_header`` whose ``error``
field carries the notify code and whose ``unique`` is 0, then the code's own struct.

The kernel handles a notification inside the ``write()`` to the device and may wait there for
a request this daemon has to answer (a dirty page in the range is written back first), so
:func:`write_notifications` is called from a worker thread, never from the event loop.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
from collections.abc import Collection, Iterable

log = logging.getLogger(__name__)

#: fuse_notify_code (include/uapi/linux/fuse.h)
NOTIFY_INVAL_INODE = 2
NOTIFY_INVAL_ENTRY = 3
_NAMES = {NOTIFY_INVAL_INODE: "inval_inode", NOTIFY_INVAL_ENTRY: "inval_entry"}

#: fuse_out_header: len, error (the notify code for a notification), unique (0: no request)
HEADER = struct.Struct("<IiQ")
_INVAL_INODE = struct.Struct("<Qqq")  # fuse_notify_inval_inode_out: ino, off, len
_INVAL_ENTRY = struct.Struct("<QII")  # fuse_notify_inval_entry_out: parent, namelen, flags
_NODEID = struct.Struct("<Q")  # the first field of both bodies: the node the message is about


def inval_inode_message(nodeid: int, offset: int, length: int) -> bytes:
    """The notification that drops bytes [offset, offset + length) of node *nodeid* from the
    kernel's page cache (and its cached attributes); a *length* of 0 means to the end of the
    file."""
    size = HEADER.size + _INVAL_INODE.size
    return HEADER.pack(size, NOTIFY_INVAL_INODE, 0) + _INVAL_INODE.pack(nodeid, offset, length)


def inval_entry_message(parent: int, name: bytes) -> bytes:
    """The notification that makes the kernel drop the name *name* in directory *parent*."""
    size = HEADER.size + _INVAL_ENTRY.size + len(name) + 1
    return (
        HEADER.pack(size, NOTIFY_INVAL_ENTRY, 0)
        + _INVAL_ENTRY.pack(parent, len(name), 0)
        + name
        + b"\0"
    )


def write_notifications(
    fd: int, messages: Iterable[bytes], expected: Collection[int] = (errno.ENOENT,)
) -> int:
    """Write each message to the FUSE device *fd* (one ``write()`` each: the kernel reads one
    message per write); returns how many the kernel took. Blocking: call it from a worker
    thread (see the module docstring).

    A notification is advice, so a refusal never stops the others: an errno in *expected*
    (the kernel no longer knows what the message names) passes quietly, any other is logged
    at debug level.
    """
    taken = 0
    for message in messages:
        try:
            os.write(fd, message)
            taken += 1
        except OSError as err:
            if err.errno not in expected:
                _, code, _ = HEADER.unpack_from(message)
                (nodeid,) = _NODEID.unpack_from(message, HEADER.size)
                what = _NAMES.get(code, f"notification {code}")
                log.debug("%s of node %d: %s", what, nodeid, err.strerror)
    return taken
