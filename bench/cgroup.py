"""A memory cgroup shared by the backup and its neighbour (TARGETS.md recipe B).

The container case: when both live in one memory cgroup, the neighbour's allocations reclaim
pages whose writeback waits on the slow target, and its 4 KiB fdatasync stalls for seconds. A
fresh cgroup per arm keeps one arm's page cache from charging the next.

The cgroup is created below the harness's own memory cgroup (hierarchically), so it never escapes
a limit the harness itself runs under.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from bench.system import BenchError, Teardown, read_text, write_sysfs

log = logging.getLogger(__name__)

MEMORY_ROOT = Path("/sys/fs/cgroup/memory")


def own_memory_cgroup() -> Path:
    """The cgroup-v1 memory directory this process lives in."""
    for line in read_text("/proc/self/cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return MEMORY_ROOT / path.lstrip("/")
    raise BenchError("no cgroup-v1 memory controller (need /sys/fs/cgroup/memory)")


class MemoryCgroup:
    """One memory cgroup with a limit; removed (tasks moved back, pages emptied) by teardown.

    Not a context manager on purpose: on Ctrl-C the global teardown must lift the throttle
    before emptying the cgroup, or emptying waits on writeback to a stalled device."""

    def __init__(self, name: str, limit: int, teardown: Teardown) -> None:
        self.parent = own_memory_cgroup()
        self.path = self.parent / name
        self.limit = limit
        self.teardown = teardown
        self.key = 0

    @property
    def procs(self) -> str:
        return str(self.path / "cgroup.procs")

    def create(self) -> MemoryCgroup:
        """Make the cgroup; the teardown removes it (at the end of the arm, or on abort)."""
        try:
            self.path.mkdir()
        except OSError as err:
            raise BenchError(f"cannot create memory cgroup {self.path}: {err.strerror}") from None
        self.key = self.teardown.push(
            "remove-cgroup", str(self.path), str(self.parent / "cgroup.procs")
        )
        write_sysfs(self.path / "memory.limit_in_bytes", str(self.limit))
        return self

    def stat(self) -> dict[str, int]:
        """dirty, writeback, page cache, anonymous memory and usage of the cgroup, in bytes
        (empty once removed)."""
        out: dict[str, int] = {}
        for line in read_text(self.path / "memory.stat").splitlines():
            key, _, value = line.partition(" ")
            if key in ("dirty", "writeback", "cache", "rss"):
                out[key] = int(value)
        usage = read_text(self.path / "memory.usage_in_bytes").strip()
        if usage:
            out["usage"] = int(usage)
        return out

    def failcnt(self) -> int:
        text = read_text(self.path / "memory.failcnt").strip()
        return int(text) if text else 0


def memory_cgroup_skip_reason() -> str | None:
    if not MEMORY_ROOT.exists():
        return "no cgroup-v1 memory controller at /sys/fs/cgroup/memory"
    if os.geteuid() != 0:
        return "memory cgroups need root"
    return None
