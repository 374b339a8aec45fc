"""The notifications the daemon writes to the FUSE device: the bytes the kernel reads, and how
a batch of them is written (through a pipe standing in for /dev/fuse)."""

from __future__ import annotations

import errno
import logging
import os
import struct

import pytest

from fusethrottle.adapter.fuse_notify import (
    inval_entry_message,
    inval_inode_message,
    write_notifications,
)


def test_the_inval_inode_message_is_what_the_kernel_reads() -> None:
    message = inval_inode_message(77, 4096, 8192)
    length, code, unique, ino, off, size = struct.unpack("<IiQQqq", message)
    assert (length, code, unique) == (40, 2, 0)  # 16-byte header + 24-byte body; no reply
    assert (ino, off, size) == (77, 4096, 8192)


def test_the_inval_entry_message_is_what_the_kernel_reads() -> None:
    message = inval_entry_message(77, b"base.tar")
    length, code, unique, parent, namelen, flags = struct.unpack("<IiQQII", message[:32])
    assert (length, code, unique) == (len(message), 3, 0)  # a notification: no reply
    assert (parent, namelen, flags) == (77, 8, 0)
    assert message[32:] == b"base.tar\0"


def test_each_message_is_one_write_and_the_count_is_what_went() -> None:
    read_end, write_end = os.pipe()
    try:
        messages = [inval_entry_message(1, b"a"), inval_inode_message(2, 0, 0)]
        assert write_notifications(write_end, messages) == 2
        assert os.read(read_end, 1 << 16) == b"".join(messages)
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_refused_message_does_not_stop_the_others_and_only_the_unexpected_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    read_end, write_end = os.pipe()  # the read end refuses writes: EBADF for every message
    try:
        messages = [inval_inode_message(5, 0, 0), inval_entry_message(6, b"x")]
        with caplog.at_level(logging.DEBUG, logger="fusethrottle.adapter.fuse_notify"):
            assert write_notifications(read_end, messages, expected=(errno.EBADF,)) == 0
            assert caplog.records == []
            assert write_notifications(read_end, messages) == 0
        logged = [r.getMessage() for r in caplog.records]
        assert len(logged) == 2
        assert logged[0].startswith("inval_inode of node 5: ")
        assert logged[1].startswith("inval_entry of node 6: ")
    finally:
        os.close(read_end)
        os.close(write_end)
