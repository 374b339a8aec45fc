"""Fixtures of the NFS lab tests: a fresh directory on the lab's export, and a fusethrottle
mount over it (through the fixtures of tests/conftest.py, which unmount and check the log)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from mount_util import Daemon

from .lab import IN_LAB, fresh_dir, small_export


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if IN_LAB:
        return
    skip = pytest.mark.skip(reason="runs in the NFS lab VM (python -m bench.nfslab run ...)")
    for item in items:
        if "tests/nfs/" in str(item.fspath):
            item.add_marker(skip)


@pytest.fixture
def nfs_dirs() -> tuple[Path, Path]:
    """(this client's path, the other client's path) of a new directory on the export."""
    return fresh_dir("rw")


@pytest.fixture
def nfs_dir(nfs_dirs: tuple[Path, Path]) -> Path:
    return nfs_dirs[0]


@pytest.fixture
def ft_nfs(make_mount: Callable[..., Daemon], nfs_dir: Path) -> Daemon:
    """fusethrottle with default options over a fresh directory of the NFS export."""
    return make_mount(source=nfs_dir)


@pytest.fixture
def small_nfs() -> Iterator[tuple[Path, Path]]:
    """Two small (64 MiB) exports of their own, mounted through client 1: targets that fill
    up, one for the mount and one for NFS directly (a full NFS client may keep a removed file
    as .nfsXXXX for a long time, which would fill the other's target). Ask for it before
    make_mount/ft fixtures, so that their mounts go first."""
    with small_export() as one, small_export() as two:
        yield one, two


@pytest.fixture
def quota_nfs() -> Iterator[tuple[Path, Path]]:
    """As small_nfs, with user quotas enforced on the server (lab.set_block_quota)."""
    with small_export(quota=True) as one, small_export(quota=True) as two:
        yield one, two
