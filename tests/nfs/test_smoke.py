"""The NFS smoke test CI runs in the lab VM: a backup of a tree onto NFSv4.1 through
fusethrottle arrives byte for byte, can be removed again leaving nothing behind, and the daemon
exits 0 (everything on the target)."""

from __future__ import annotations

import filecmp
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from mount_util import Daemon

from .lab import silly_renamed, version

pytestmark = [pytest.mark.mount, pytest.mark.smoke]


def make_tree(root: Path, files: int = 120) -> dict[str, str]:
    """A small tree of files of varied sizes; name -> sha256."""
    sums = {}
    for i in range(files):
        d = root / f"d{i % 6}"
        d.mkdir(parents=True, exist_ok=True)
        data = hashlib.sha256(str(i).encode()).digest() * (1 + (i * 97) % 3000)
        (d / f"f{i}").write_bytes(data)
        sums[f"d{i % 6}/f{i}"] = hashlib.sha256(data).hexdigest()
    return sums


def test_a_tree_backed_up_through_the_mount_arrives_and_is_removed_cleanly(
    ft_nfs: Daemon, nfs_dir: Path, tmp_path: Path
) -> None:
    source = tmp_path / "source"
    sums = make_tree(source)
    subprocess.run(["cp", "-a", f"{source}/.", str(ft_nfs.mountpoint)], check=True)
    for name, digest in sums.items():
        on_target = hashlib.sha256((nfs_dir / name).read_bytes()).hexdigest()
        assert on_target == digest, f"{name} differs on the NFS target"
    diff = filecmp.dircmp(source, ft_nfs.mountpoint)
    assert not diff.left_only and not diff.right_only
    # rm -rf right after writing: every file was just closed, some still being synced.
    shutil.rmtree(ft_nfs.mountpoint / "d0")
    subprocess.run(["rm", "-rf", *(str(p) for p in ft_nfs.mountpoint.iterdir())], check=True)
    assert os.listdir(ft_nfs.mountpoint) == []
    assert silly_renamed(nfs_dir) == [], "files removed through the mount were silly-renamed"
    assert ft_nfs.stop() == 0
    assert os.listdir(nfs_dir) == [], f"left on the NFS {version()} target"
