"""How an injected sync writes back and what it drops: piece sizes, the written range, and the
effect on a real file's page cache."""

from __future__ import annotations

import os
import tempfile

from hypothesis import given
from hypothesis import strategies as st

from bench.system import resident_bytes
from fusethrottle.adapter.inodes import Inode
from fusethrottle.target.syncs import SyncPlan, _fsync_path
from fusethrottle.window.flusher import PIECE_MIN, PIECE_UNKNOWN_RATE, writeback_piece

MiB = 1 << 20


@given(
    st.one_of(st.none(), st.floats(min_value=0, max_value=1e11)),
    st.integers(min_value=1, max_value=1 << 32),
)
def test_a_piece_is_whole_pages_within_bounds(rate: float | None, trigger: int) -> None:
    piece = writeback_piece(rate, trigger)
    assert piece % 4096 == 0
    assert PIECE_MIN <= piece <= max(PIECE_MIN, trigger)


def test_a_piece_is_a_tenth_of_a_second_of_the_commit_rate() -> None:
    assert writeback_piece(20 * MiB, 64 * MiB) == 2 * MiB
    assert writeback_piece(1 * MiB, 64 * MiB) == PIECE_MIN  # 100 KiB is below the floor
    assert writeback_piece(None, 64 * MiB) == PIECE_UNKNOWN_RATE
    assert writeback_piece(2e9, 64 * MiB) == 64 * MiB  # never more than one sync writes


def test_the_written_range_grows_is_taken_once_and_comes_back_after_a_failure() -> None:
    inode = Inode(5, -1, (0, 5), 0o100644)
    assert inode.take_written() is None
    inode.note_written(4096, 4096)
    inode.note_written(0, 100)
    inode.note_written(1 << 20, 0)  # nothing written: no range
    taken = inode.take_written()
    assert taken == (0, 8192)
    inode.note_written(MiB, MiB)
    inode.give_back_written(taken)
    assert inode.take_written() == (0, 2 * MiB)


def test_a_synced_range_leaves_the_page_cache_and_the_rest_stays() -> None:
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        path = os.path.join(d, "f")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        path_fd = os.open(path, os.O_PATH)
        try:
            os.pwrite(fd, os.urandom(8 * MiB), 0)
            _fsync_path(path_fd, True, SyncPlan((0, 6 * MiB), 256 << 10, drop=True))
            resident = resident_bytes(path)
            assert resident <= 2 * MiB + 64 << 10, resident  # the last 2 MiB was not synced
            assert resident >= MiB, resident
            os.pwrite(fd, os.urandom(MiB), 0)
            _fsync_path(path_fd, True, SyncPlan((0, MiB), 0, drop=False))
            assert resident_bytes(path) >= 3 * MiB  # kept when not told to drop
        finally:
            os.close(path_fd)
            os.close(fd)
