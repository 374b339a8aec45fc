"""Node ids for backing objects: the same object keeps its node, a new object that reuses a
deleted one's inode number gets a node of its own (the kernel may still hold the old one)."""

from __future__ import annotations

import os
from pathlib import Path

from fusethrottle._libc import file_handle
from fusethrottle.adapter.inodes import Inode, InodeTable


def _with_ino(st: os.stat_result, ino: int) -> os.stat_result:
    fields = list(st)
    fields[1] = ino  # st_ino
    return os.stat_result(fields)


def _open(path: Path) -> tuple[int, os.stat_result, bytes | None]:
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW)
    return fd, os.fstat(fd), file_handle(fd)


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
    fd, st, handle = _open(tmp_path / "d")
    reused = _with_ino(st, old.key[1])
    assert table.nodeid_for(reused, handle) != old.nodeid
    new = table.register(fd, reused, handle)
    assert new is not old and new.nodeid != old.nodeid
    assert table.get(old.nodeid) is old  # until the kernel forgets it
    assert table.find(reused) is new
    assert table.find(os.fstat(old.path_fd)) is new  # find goes by number alone
    table.forget(old.nodeid, 1)
    table.drop(old)
    assert table.find(reused) is new  # dropping the old node leaves the new one alone
    table.close_all()


def test_an_object_replaced_by_one_of_the_same_type_is_a_new_node(tmp_path: Path) -> None:
    """Another NFS client removes a directory the kernel holds and makes a new one that gets
    the same inode number: the new directory must get its own node (the old one's handle is
    stale: every call through it would answer ESTALE), although both are directories and the
    old one may still look alive from a cache."""
    root = os.open(tmp_path, os.O_PATH)
    table = InodeTable(root, os.fstat(root))
    (tmp_path / "d").mkdir()
    old = table.register(*_open(tmp_path / "d"))
    os.rename(tmp_path / "d", tmp_path / "gone")
    (tmp_path / "d").mkdir()
    fd, st, handle = _open(tmp_path / "d")
    assert handle is not None and handle != old.handle
    reused = _with_ino(st, old.key[1])
    new = table.register(fd, reused, handle)
    assert new is not old and new.nodeid != old.nodeid
    again = table.register(*_open(tmp_path / "d")[:1], reused, handle)
    assert again is new and new.lookups == 2  # the same object keeps the node it got
    table.close_all()


def test_a_kept_path_outlives_its_descriptor(tmp_path: Path) -> None:
    """Files named at unmount keep their path when the kernel forgets them first (renamed
    since they were looked up: the descriptor knows the new name)."""
    root = os.open(tmp_path, os.O_PATH)
    incomplete: set[int] = set()  # the ledger's lost files, as the mount passes them
    table = InodeTable(root, os.fstat(root), keep_path_of=incomplete)
    (tmp_path / "kept").write_bytes(b"x")
    (tmp_path / "other").write_bytes(b"y")
    kept = table.register(*_open(tmp_path / "kept"))
    other = table.register(*_open(tmp_path / "other"))
    incomplete.add(kept.nodeid)
    os.rename(tmp_path / "kept", tmp_path / "renamed")
    for inode in (kept, other):
        table.forget(inode.nodeid, 1)
        table.drop(inode)
    assert table.get(kept.nodeid) is None
    assert table.path(kept.nodeid) == str(tmp_path / "renamed")
    assert "name unknown" in table.path(other.nodeid)
    table.close_all()


def test_the_number_of_a_file_let_go_of_goes_to_the_next_object_with_a_new_generation(
    tmp_path: Path,
) -> None:
    """The daemon let go of a file at its last unlink; the target gives its inode number to
    the next new file while the kernel still holds the old node. The new file gets the same
    node id (stat through the mount shows the target's number) with a new generation (the
    kernel then makes its old inode bad instead of reusing it), and the references the kernel
    still has to the old one are counted on."""
    root = os.open(tmp_path, os.O_PATH)
    table = InodeTable(root, os.fstat(root))
    (tmp_path / "f").write_bytes(b"old")
    old = table.register(*_open(tmp_path / "f"))
    old.detached = True  # what Operations.unlink does once the last name is gone
    table.retire(old)
    (tmp_path / "g").write_bytes(b"new")
    fd, st, handle = _open(tmp_path / "g")
    reused = _with_ino(st, old.nodeid)
    assert table.nodeid_for(reused, handle) == old.nodeid
    assert table.generation_for(old.nodeid) == old.generation + 1
    new = table.register(fd, reused, handle)
    assert new.nodeid == old.nodeid and new is not old and not new.detached
    assert new.generation == old.generation + 1 and new.lookups == 2
    assert table.get(old.nodeid) is new
    assert table.forget(new.nodeid, 1) is None  # the old incarnation's FORGET
    assert table.forget(new.nodeid, 1) is new
    table.drop(new)
    table.close_all()


def test_a_node_is_dropped_only_once_forgotten_closed_and_owing_nothing() -> None:
    """The one rule the forget handler, the flusher and the descriptor relief all ask."""
    node = Inode(nodeid=5, path_fd=-1, key=(0, 5), mode=0o100644)
    node.lookups, node.open_handles = 0, 0
    assert node.droppable(owes_data=False) and not node.needed(owes_data=False)
    assert not node.droppable(owes_data=True)  # un-synced data, or a sync queued or running
    node.open_handles = 1
    assert not node.droppable(owes_data=False) and node.needed(owes_data=False)
    node.open_handles, node.lookups = 0, 1
    assert not node.droppable(owes_data=False)  # the kernel still holds its name
