"""Node ids for backing objects: the same object keeps its node, a new object that reuses a
deleted one's inode number gets a node of its own (the kernel may still hold the old one)."""

from __future__ import annotations

import os
from pathlib import Path

from fusethrottle.inodes import InodeTable


def _with_ino(st: os.stat_result, ino: int) -> os.stat_result:
    fields = list(st)
    fields[1] = ino  # st_ino
    return os.stat_result(fields)


def _open(path: Path) -> tuple[int, os.stat_result]:
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW)
    return fd, os.fstat(fd)


def test_a_live_object_keeps_its_node(tmp_path: Path) -> None:
    root = os.open(tmp_path, os.O_PATH)
    table = InodeTable(root, os.fstat(root))
    (tmp_path / "f").write_bytes(b"x")
    first = table.register(*_open(tmp_path / "f"))
    os.link(tmp_path / "f", tmp_path / "hard")
    again = table.register(*_open(tmp_path / "hard"))
    assert again is first and first.lookups == 2
    table.close_all()


def test_a_reused_inode_number_is_a_new_node(tmp_path: Path) -> None:
    """A file is deleted while the kernel still holds its node; the file system gives its
    inode number to a new directory. The directory must not answer as the old file's node."""
    root = os.open(tmp_path, os.O_PATH)
    table = InodeTable(root, os.fstat(root))
    (tmp_path / "f").write_bytes(b"old data")
    old = table.register(*_open(tmp_path / "f"))
    os.unlink(tmp_path / "f")
    (tmp_path / "d").mkdir()
    fd, st = _open(tmp_path / "d")
    reused = _with_ino(st, old.key[1])
    assert table.nodeid_for(reused) != old.nodeid
    new = table.register(fd, reused)
    assert new is not old and new.nodeid != old.nodeid
    assert table.get(old.nodeid) is old  # until the kernel forgets it
    assert table.find(reused) is new
    assert table.find(os.fstat(old.path_fd)) is new  # find goes by number alone
    table.forget(old.nodeid, 1)
    table.drop(old)
    assert table.find(reused) is new  # dropping the old node leaves the new one alone
    table.close_all()


def test_a_kept_path_outlives_its_descriptor(tmp_path: Path) -> None:
    """Files named at unmount keep their path when the kernel forgets them first (renamed
    since they were looked up: the descriptor knows the new name)."""
    root = os.open(tmp_path, os.O_PATH)
    table = InodeTable(root, os.fstat(root))
    (tmp_path / "kept").write_bytes(b"x")
    (tmp_path / "other").write_bytes(b"y")
    kept = table.register(*_open(tmp_path / "kept"))
    other = table.register(*_open(tmp_path / "other"))
    table.keep_path_of = {kept.nodeid}
    os.rename(tmp_path / "kept", tmp_path / "renamed")
    for inode in (kept, other):
        table.forget(inode.nodeid, 1)
        table.drop(inode)
    assert table.get(kept.nodeid) is None
    assert table.path(kept.nodeid) == str(tmp_path / "renamed")
    assert "name unknown" in table.path(other.nodeid)
    table.close_all()
