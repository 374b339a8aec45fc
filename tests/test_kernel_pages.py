"""Dropping synced ranges from the mount's page cache: the message the kernel reads, and which
ranges are sent (through a pipe standing in for /dev/fuse)."""

from __future__ import annotations

import os
import struct

import trio

from fusethrottle.adapter.kernel_pages import PAGE, KernelPages

MiB = 1 << 20


def decode(message: bytes) -> tuple[int, int, int, int, int, int]:
    return struct.unpack("<IiQQqq", message)


def _sent(calls: list[tuple[int, tuple[int, int] | None]]) -> list[tuple[int, int, int]]:
    """What KernelPages writes to the device after *calls* to drop_soon."""
    read_end, write_end = os.pipe()
    pages = KernelPages()
    pages.attach(write_end)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(pages.run)
            for nodeid, written in calls:
                pages.drop_soon(nodeid, written)
            await trio.sleep(0.2)
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
        os.set_blocking(read_end, False)
        data = b""
        while True:
            try:
                chunk = os.read(read_end, 4096)
            except BlockingIOError:
                break
            if not chunk:
                break
            data += chunk
    finally:
        os.close(read_end)
        os.close(write_end)
    out = []
    for k in range(0, len(data), 40):
        _, _, _, ino, off, size = decode(data[k : k + 40])
        out.append((ino, off, size))
    return sorted(out)


def test_ranges_of_one_file_merge_and_stop_short_of_the_page_being_filled() -> None:
    sent = _sent([(5, (0, 8 * MiB)), (5, (8 * MiB, 16 * MiB + 100)), (6, (4096, 3 * PAGE + 1))])
    assert sent == [(5, 0, 16 * MiB), (6, 4096, 3 * PAGE - 4096)]


def test_a_whole_file_wins_and_a_range_inside_one_page_is_not_sent() -> None:
    assert _sent([(5, (0, MiB)), (5, None), (9, (100, 200))]) == [(5, 0, 0)]


def test_nothing_is_sent_when_disabled_or_not_attached() -> None:
    pages = KernelPages(enabled=False)
    pages.attach(99)
    pages.drop_soon(5, None)
    assert pages.device_fd is None
    assert not pages._pending
