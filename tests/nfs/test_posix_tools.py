"""Item 1: the POSIX tools the ordinary suite runs (fio with verification, stress-ng's
filesystem stressors with --verify, tar and rsync round trips), through fusethrottle over NFS
and, as the reference, on the same NFS export directly in the same run. A backup tool must fail
through the mount nowhere it does not fail on NFS itself.

Sizes are small: the lab's VM runs without KVM, each job is seconds of work there."""

from __future__ import annotations

import errno
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import test_mount_tools
from mount_util import Daemon
from test_mount_tools import FIO_JOBS, build_tree, fio, require_tool, run

from .lab import version

pytestmark = pytest.mark.mount

# The ordinary suite's jobs, a quarter of the size or less (fio takes the last --size).
SMALL_FIO = {
    "sequential": ["--size=4M"],
    "random-4k-64k": ["--size=2M", "--numjobs=2"],
    "random-fsync": ["--size=512k"],
    "mmap": ["--size=2M"],
    "direct": ["--size=2M"],
}


def manifest(root: Path) -> dict[str, Any]:
    """test_mount_tools.manifest, with "no xattrs" for EOPNOTSUPP: NFSv4.1 lists none, the
    mount says it has none (xattrs=auto); tar and rsync treat both alike."""
    real = os.listxattr
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "listxattr", lambda path: _listxattr_real(real, path))
        return test_mount_tools.manifest(root)


def _listxattr_real(real: Any, path: object) -> list[str]:
    try:
        return real(path)  # type: ignore[no-any-return]
    except OSError as err:
        if err.errno != errno.EOPNOTSUPP:
            raise
        return []


def _outcome(fn: object, *args: object) -> str | None:
    """None if the call passed, else its assertion text."""
    try:
        fn(*args)  # type: ignore[operator]
    except AssertionError as err:
        return str(err)[-1500:]
    return None


@pytest.mark.parametrize("name", sorted(SMALL_FIO))
def test_fio_verifies_through_the_mount_wherever_it_does_on_nfs(
    ft_nfs: Daemon, nfs_dir: Path, name: str
) -> None:
    """fio writes with checksums, reads them back through the mount and then straight from
    the NFS target: every byte a job wrote is there, as when it writes NFS directly."""
    require_tool("fio")
    assert ft_nfs.source is not None
    job = [*FIO_JOBS[name], *SMALL_FIO[name]]
    direct = nfs_dir.parent / (nfs_dir.name + "-direct")
    direct.mkdir()
    on_nfs = _outcome(fio, direct, name, job)
    through = _outcome(fio, ft_nfs.mountpoint, name, job)
    read_back = _outcome(fio, ft_nfs.source, name, job, "--verify_only")
    print(f"directly: {on_nfs or 'ok'}\nthrough: {through or 'ok'}\nback: {read_back or 'ok'}")
    assert through is None or on_nfs is not None, f"NFS {version()}: fio {name}:\n{through}"
    assert read_back is None or on_nfs is not None, (
        f"NFS {version()}: fio {name} verified through the mount, but the target holds other "
        f"bytes:\n{read_back}"
    )


# The ordinary suite's stressors, minus xattr (NFSv3 and v4.1 store none), with small files.
STRESSORS = {
    "namespace": [
        "--dir", "1", "--dir-dirs", "64",
        "--dentry", "1", "--dentries", "64",
        "--rename", "1",
        "--chmod", "1",
        "--utime", "1",
    ],
    "data": [
        "--hdd", "1", "--hdd-bytes", "2M",
        "--seek", "1", "--seek-size", "2M",
        "--fallocate", "1", "--fallocate-bytes", "1M",
        "--readahead", "1", "--readahead-bytes", "2M",
        "--flock", "1",
        "--lockf", "1",
    ],
}  # fmt: skip


def _stress(directory: Path, group: str) -> tuple[bool, str]:
    args = ["stress-ng", *STRESSORS[group], "--timeout", "3s", "--verify", "--metrics-brief"]
    result = run([*args, "--temp-path", str(directory)], timeout=300)
    output = result.stdout + result.stderr
    ok = (
        result.returncode == 0
        and "successful run completed" in output
        and not re.search(r"fail|verif.*error", output, re.IGNORECASE)
    )
    return ok, output[-3000:]


@pytest.mark.parametrize("group", sorted(STRESSORS))
def test_stress_ng_passes_through_the_mount_wherever_it_does_on_nfs(
    ft_nfs: Daemon, nfs_dir: Path, group: str
) -> None:
    """stress-ng's filesystem stressors with --verify: no failure through the mount that NFS
    directly does not have too."""
    require_tool("stress-ng")
    direct = nfs_dir.parent / (nfs_dir.name + "-direct")
    direct.mkdir()
    on_nfs, nfs_output = _stress(direct, group)
    through, output = _stress(ft_nfs.mountpoint, group)
    assert through or not on_nfs, f"NFS {version()}: stress-ng {group}:\n{output}"
    if not on_nfs:
        pytest.xfail(f"stress-ng {group} fails on NFS {version()} directly too:\n{nfs_output}")


TAR_FLAGS = ["--xattrs", "--xattrs-include=user.*", "--numeric-owner", "--sparse"]


def _tar(src: Path, dst: Path) -> tuple[int, str]:
    """tar -c | tar -x; the worse of the two exit statuses, and their messages."""
    dst.mkdir(exist_ok=True)
    create = subprocess.Popen(
        ["tar", "-C", str(src), *TAR_FLAGS, "-cf", "-", "."],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    extract = run(["tar", "-C", str(dst), *TAR_FLAGS, "-xpf", "-"], stdin=create.stdout)
    assert create.stdout is not None
    create.stdout.close()
    create_err = create.communicate(timeout=120)[1].decode()
    return max(create.returncode, extract.returncode), create_err + extract.stderr


def test_tar_round_trip_as_on_nfs(ft_nfs: Daemon, nfs_dir: Path, tmp_path: Path) -> None:
    """A tree with every kind of entry, restored with tar onto the mount, holds on the target
    exactly what the same restore onto NFS directly holds, and backs up again unchanged."""
    require_tool("tar")
    assert ft_nfs.source is not None
    src = tmp_path / "tree"
    build_tree(src)
    direct = nfs_dir.parent / (nfs_dir.name + "-direct")
    code_nfs, _ = _tar(src, direct)
    code, err = _tar(src, ft_nfs.mountpoint / "restore")
    assert code <= code_nfs, f"NFS {version()}: tar onto the mount: exit {code}:\n{err}"
    expected = manifest(direct)
    assert manifest(ft_nfs.mountpoint / "restore") == expected
    assert manifest(ft_nfs.source / "restore") == expected
    code_nfs, _ = _tar(direct, tmp_path / "back-direct")
    code, err = _tar(ft_nfs.mountpoint / "restore", tmp_path / "back")
    assert code <= code_nfs, f"NFS {version()}: tar from the mount: exit {code}:\n{err}"
    assert manifest(tmp_path / "back") == manifest(tmp_path / "back-direct")


def test_rsync_round_trip_as_on_nfs(ft_nfs: Daemon, nfs_dir: Path, tmp_path: Path) -> None:
    """rsync -aHX onto the mount gives the target what rsync onto NFS directly gives it; a
    second run finds exactly as much (nothing, or the xattrs NFS cannot store) to do."""
    require_tool("rsync")
    assert ft_nfs.source is not None
    src = tmp_path / "tree"
    build_tree(src)
    rsync = ["rsync", "-aHX", "--numeric-ids"]
    direct = nfs_dir.parent / (nfs_dir.name + "-direct")
    on_nfs = run([*rsync, f"{src}/", f"{direct}/"])
    result = run([*rsync, f"{src}/", f"{ft_nfs.mountpoint}/r/"])
    assert result.returncode <= on_nfs.returncode, (
        f"NFS {version()}: rsync onto the mount: exit {result.returncode}:\n{result.stderr}"
    )
    expected = manifest(direct)
    assert manifest(ft_nfs.mountpoint / "r") == expected
    assert manifest(ft_nfs.source / "r") == expected
    again_nfs = run([*rsync, "--itemize-changes", f"{src}/", f"{direct}/"])
    again = run([*rsync, "--itemize-changes", f"{src}/", f"{ft_nfs.mountpoint}/r/"])
    assert again.returncode <= again_nfs.returncode, again.stderr
    assert sorted(again.stdout.splitlines()) == sorted(again_nfs.stdout.splitlines())
    back_nfs = run([*rsync, f"{direct}/", f"{tmp_path}/back-direct/"])
    back = run([*rsync, f"{ft_nfs.mountpoint}/r/", f"{tmp_path}/back/"])
    assert back.returncode <= back_nfs.returncode, back.stderr
    assert manifest(tmp_path / "back") == manifest(tmp_path / "back-direct")
