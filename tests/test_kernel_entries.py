"""Keeping the daemon's descriptors within its limit by asking the kernel to drop names.

The message and the choice of names first (pure), then a real mount whose daemon may hold only
a few hundred descriptors backing up, listing and restoring a tree of thousands of files.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import MakeMount

from fusethrottle.adapter.inodes import ROOT, Inode
from fusethrottle.adapter.kernel_entries import Bounds, bounds_for, pick


def test_bounds_leave_room_for_open_files() -> None:
    assert bounds_for(20000) == Bounds(15000, 12000)
    bounds = bounds_for(1024)
    assert bounds.low < bounds.high < 1024


def node(nodeid: int, lookups: int = 1, parent: int = ROOT, name: bytes = b"f") -> Inode:
    inode = Inode(nodeid, -1, (1, nodeid), 0o100644, lookups)
    inode.entry_parent, inode.entry_name = parent, name
    return inode


def test_the_oldest_names_nothing_needs_go_first() -> None:
    root = Inode(ROOT, -1, (1, 1), 0o40755, 1 << 62)
    busy = node(10)
    unnamed = node(11, parent=0)  # known without a name (never looked up by one)
    forgotten = node(12, lookups=0)  # the kernel let go already: its FORGET came
    removed = node(13)
    removed.removed = os.stat(".")
    asked = node(14)
    asked.asked_until = 105.0
    free = [node(n) for n in range(20, 25)]
    table = [root, busy, unnamed, forgotten, removed, asked, *free]
    chosen = pick(table, 3, lambda inode: inode is busy, now=100.0)
    assert chosen == free[:3]
    assert pick(table, 10, lambda inode: inode is busy, now=106.0) == [asked, *free]
    assert pick(table, 0, lambda inode: False, now=0.0) == []


# --- a real mount with few descriptors -----------------------------------------------------------
FILES = 3000  # far more than the 1024 descriptors the daemon below may hold
DIRS = 30


@pytest.mark.mount
def test_a_tree_larger_than_the_descriptor_limit_backs_up_lists_and_restores(
    make_mount: MakeMount, workdir: Path
) -> None:
    if subprocess.run(["which", "prlimit"], capture_output=True).returncode != 0:
        pytest.skip("prlimit (util-linux) is needed")
    backing = workdir / "target"
    backing.mkdir()
    mnt = make_mount(backing, (), wrapper=("prlimit", "--nofile=1024:1024"))
    tree = mnt.mountpoint / "tree"
    tree.mkdir()
    for d in range(DIRS):
        (tree / f"d{d:02d}").mkdir()
    for i in range(FILES):
        (tree / f"d{i % DIRS:02d}" / f"f{i:05d}").write_bytes(b"%d\n" % i)
    listed = subprocess.run(
        ["find", str(tree), "-type", "f", "-ls"], capture_output=True, text=True, timeout=300
    )
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert len(listed.stdout.splitlines()) == FILES
    for i in range(FILES):  # a restore reads every file back through the mount
        assert (tree / f"d{i % DIRS:02d}" / f"f{i:05d}").read_bytes() == b"%d\n" % i
    held = len(os.listdir(f"/proc/{mnt.pid}/fd"))
    assert held < 1024
    assert sum(1 for _ in (backing / "tree").rglob("f*")) == FILES
