"""Keeping the daemon's descriptors within its limit by asking the kernel to drop names.

A real mount whose daemon may hold only a few hundred descriptors backing up, listing and
restoring a tree of thousands of files (the engine's relief.cc chooses the names).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import MakeMount

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
