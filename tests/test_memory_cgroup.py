"""Where the daemon's own memory cgroup goes (pure decisions; the real move is in test_memory)."""

from __future__ import annotations

from pathlib import Path

from fusethrottle.service.memory_cgroup import (
    Hierarchy,
    OwnMemoryCgroup,
    direct_target_writes,
    find_hierarchy,
    in_memory_target,
    parse_limit,
    root_limit,
    should_move,
)
from fusethrottle.service.mountinfo import MountInfo

HYBRID_CGROUP = """12:memory:/process_api/7a7f
11:blkio:/
1:name=systemd:/user.slice
0::/user.slice/session-3.scope
"""
HYBRID_MOUNTS = [
    MountInfo("/sys/fs/cgroup/memory", "0:30", "cgroup", "cgroup", "rw,memory"),
    MountInfo("/sys/fs/cgroup/blkio", "0:31", "cgroup", "cgroup", "rw,blkio"),
    MountInfo("/sys/fs/cgroup/unified", "0:27", "cgroup2", "cgroup2", "rw,nsdelegate"),
]


def test_on_a_hybrid_host_the_v1_memory_hierarchy_is_the_one() -> None:
    h = find_hierarchy(HYBRID_CGROUP, HYBRID_MOUNTS)
    assert h == Hierarchy(
        1, Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup/memory/process_api/7a7f")
    )
    assert h.limit_file() == "memory.limit_in_bytes"


def test_on_a_unified_host_the_v2_hierarchy_is_the_one() -> None:
    mounts = [MountInfo("/sys/fs/cgroup", "0:27", "cgroup2", "cgroup2", "rw")]
    h = find_hierarchy("0::/system.slice/backup.scope\n", mounts)
    assert h == Hierarchy(
        2, Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/system.slice/backup.scope")
    )
    assert h.limit_file() == "memory.max"


def test_no_memory_hierarchy_mounted_means_none() -> None:
    assert find_hierarchy(HYBRID_CGROUP, HYBRID_MOUNTS[1:]) is None
    assert find_hierarchy("", []) is None


def test_a_shared_cgroup_or_the_root_is_left_for_one_of_its_own() -> None:
    root = Path("/sys/fs/cgroup/memory")
    assert should_move(Hierarchy(1, root, root / "docker" / "abc"), 42) is None
    assert should_move(Hierarchy(1, root, root), 42) is None


def test_a_systemd_unit_or_a_daemon_already_moved_stays() -> None:
    root = Path("/sys/fs/cgroup")
    service = Hierarchy(2, root, root / "system.slice" / "fusethrottle@backups.service")
    assert "systemd unit" in (should_move(service, 42) or "")
    mount_unit = Hierarchy(1, root, root / "system.slice" / "srv-backups.mount")
    assert should_move(mount_unit, 42) is not None
    moved = Hierarchy(1, root, root / "fusethrottle" / "42")
    assert should_move(moved, 42) is not None


def test_a_target_kept_in_memory_gets_no_limit_of_its_own() -> None:
    for fstype in ("tmpfs", "ramfs"):
        reason = in_memory_target(fstype)
        assert reason is not None and fstype in reason and "OOM" in reason
    for fstype in ("nfs4", "nfs", "ext4", "xfs", "fuse.sshfs"):
        assert in_memory_target(fstype) is None


def _stayed(current: Path, root: Path = Path("/sys/fs/cgroup/memory")) -> OwnMemoryCgroup:
    """A daemon that stayed in *current* (memory_cgroup=off, or the host refused)."""
    cgroup = OwnMemoryCgroup(1 << 30, pid=42)
    cgroup.hierarchy = Hierarchy(1, root, current)
    return cgroup


def test_writes_leave_the_target_uncached_exactly_where_its_cache_would_be_shared() -> None:
    """The container case (the daemon stayed in the application's cgroup) writes uncached;
    a cgroup of the daemon's own, a systemd unit's, the root (no limit: global reclaim, which
    does not wait for write-back) or a target in memory go through the page cache."""
    root = Path("/sys/fs/cgroup/memory")
    pod = _stayed(root / "kubepods" / "pod7" / "db")
    reason = direct_target_writes("auto", pod, None)
    assert reason is not None and "kubepods/pod7/db" in reason
    assert direct_target_writes("auto", _stayed(root), None) is None
    assert direct_target_writes("auto", _stayed(root / "system.slice" / "x.service"), None) is None
    moved = _stayed(root)
    moved.path = root / "fusethrottle" / "42"  # it entered a cgroup of its own
    assert direct_target_writes("auto", moved, None) is None
    assert direct_target_writes("auto", pod, "SOURCE is on tmpfs") is None
    assert direct_target_writes("auto", OwnMemoryCgroup(1 << 30), None) is None  # no hierarchy
    assert direct_target_writes("buffered", pod, None) is None
    assert direct_target_writes("direct", moved, None) == "target_io=direct"


def test_inside_a_container_every_cgroup_the_daemon_can_use_shares_the_containers_limit() -> None:
    """In a cgroup namespace (Kubernetes and Docker on cgroup v2) the daemon sees its container's
    cgroup as the root: staying there, or in a cgroup of its own below it, its writes to the
    target are charged under the container's limit, which the database's reclaim runs against.
    So it writes uncached there, and says whose limit it shares."""
    root = Path("/sys/fs/cgroup")
    for cgroup in (_stayed(root, root), _stayed(root / "sidecar", root)):
        cgroup.container_limit = 1 << 30
        reason = direct_target_writes("auto", cgroup, None)
        assert reason is not None and "1024 MiB" in reason and "container" in reason
    moved = _stayed(root, root)
    moved.container_limit = 1 << 30
    moved.path = root / "fusethrottle" / "42"
    assert direct_target_writes("auto", moved, None) is not None
    assert direct_target_writes("buffered", moved, None) is None


def test_a_limit_file_says_unlimited_as_each_version_writes_it() -> None:
    assert parse_limit("max\n") is None
    assert parse_limit("9223372036854771712\n") is None  # v1's unlimited
    assert parse_limit("1073741824\n") == 1 << 30
    assert parse_limit("") is None


def test_the_roots_limit_is_read_where_the_version_keeps_it(tmp_path: Path) -> None:
    """The host's v2 root has no memory.max at all; a container's root has its limit."""
    assert root_limit(Hierarchy(2, tmp_path, tmp_path)) is None
    (tmp_path / "memory.max").write_text("536870912\n")
    assert root_limit(Hierarchy(2, tmp_path, tmp_path)) == 512 << 20
    (tmp_path / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert root_limit(Hierarchy(1, tmp_path, tmp_path)) is None
