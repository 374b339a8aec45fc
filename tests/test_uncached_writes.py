"""Writes that leave nothing in the target's page cache (target_io=direct), on a real file.

What they are for: a daemon that shares a memory cgroup with the application (the container
case) must leave no page of the target dirty or under write-back there, where the
application's reclaim would wait for it. Whole pages go through O_DIRECT, the rest through the
cache, written back and dropped at once; either way the file holds exactly what was written.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.system import resident_bytes
from fusethrottle.target.target_calls import _open_direct, _pwrite_uncached


@pytest.fixture
def files(tmp_path: Path):  # type: ignore[no-untyped-def]
    path = tmp_path / "backup.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    direct_fd = _open_direct(fd)
    if direct_fd < 0:
        os.close(fd)
        pytest.skip("this file system has no direct I/O")
    yield path, fd, direct_fd
    os.close(direct_fd)
    os.close(fd)


def test_whole_pages_and_partial_ones_land_and_none_stays_cached(files) -> None:  # type: ignore[no-untyped-def]
    path, fd, direct_fd = files
    expected = bytearray()
    pieces = [os.urandom(1 << 20), os.urandom(64 << 10), os.urandom(10_000), os.urandom(123)]
    for data in pieces:  # whole pages first, then a file's last partial ones
        assert _pwrite_uncached(fd, direct_fd, data, len(expected)) == len(data)
        expected += data
    # An unaligned rewrite in the middle, as a write without the writeback cache may be.
    patch = os.urandom(5000)
    assert _pwrite_uncached(fd, direct_fd, patch, 3000) == len(patch)
    expected[3000 : 3000 + len(patch)] = patch
    assert resident_bytes(path) == 0
    assert path.read_bytes() == bytes(expected)


def test_without_a_direct_descriptor_every_write_is_written_back_and_dropped(files) -> None:  # type: ignore[no-untyped-def]
    path, fd, _ = files
    data = os.urandom(256 << 10)
    assert _pwrite_uncached(fd, -1, data, 0) == len(data)
    assert resident_bytes(path) == 0
    assert path.read_bytes() == data
