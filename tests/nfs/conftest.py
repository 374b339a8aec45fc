"""Fixtures of the NFS lab tests: a fresh directory on the lab's export, and a fusethrottle
mount over it (through the fixtures of tests/conftest.py, which unmount and check the log)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from lab import IN_LAB, fresh_dir
from mount_util import Daemon

#: The same name as tests/conftest.py's: both files are imported as the module "conftest", and
#: whichever pytest loaded last is what ``from conftest import MakeMount`` finds in the tests of
#: the ordinary suite (collected after tests/nfs/, they failed to import without this).
MakeMount = Callable[..., Daemon]


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
