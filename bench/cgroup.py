"""A memory cgroup shared by the backup and its neighbour (TARGETS.md recipe B).

The container case: when both live in one memory cgroup, the neighbour's allocations reclaim
pages whose writeback waits on the slow target, and its 4 KiB fdatasync stalls for seconds. A
fresh cgroup per arm keeps one arm's page cache from charging the next.

The cgroup is created below the harness's own memory cgroup (hierarchically), so it never escapes
a limit the harness itself runs under. Both hierarchies work: cgroup v1's ``memory`` controller
(the machines this harness grew up on) and cgroup v2 (the NFS lab's kernel has no v1 memory
controller). On v2 a cgroup that holds processes cannot hand the memory controller to children
(the no-internal-process rule), so the new cgroup goes below the nearest ancestor that can.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from bench.system import BenchError, Teardown, read_text, write_sysfs

log = logging.getLogger(__name__)

MEMORY_ROOT = Path("/sys/fs/cgroup/memory")
UNIFIED_ROOT = Path("/sys/fs/cgroup")

#: memory.stat keys of each version -> the harness's names (v1's own, kept for old results).
STAT_KEYS = {
    1: {"dirty": "dirty", "writeback": "writeback", "cache": "cache", "rss": "rss"},
    2: {"file_dirty": "dirty", "file_writeback": "writeback", "file": "cache", "anon": "rss"},
}


@dataclass(frozen=True)
class Layout:
    """Which memory hierarchy the harness is in: the version and its own cgroup directory."""

    version: int
    own: Path

    @property
    def limit_file(self) -> str:
        return "memory.limit_in_bytes" if self.version == 1 else "memory.max"

    @property
    def usage_file(self) -> str:
        return "memory.usage_in_bytes" if self.version == 1 else "memory.current"


def find_layout(proc_cgroup: str, v2_controllers: str) -> Layout | None:
    """From /proc/self/cgroup and the v2 root's cgroup.controllers (pure). A v1 ``memory`` line
    wins: on a hybrid host the unified hierarchy has no memory controller."""
    v2_path = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if "memory" in parts[1].split(","):
            return Layout(1, MEMORY_ROOT / parts[2].lstrip("/"))
        if parts[0] == "0" and parts[1] == "":
            v2_path = parts[2]
    if v2_path is not None and "memory" in v2_controllers.split():
        return Layout(2, UNIFIED_ROOT / v2_path.lstrip("/"))
    return None


def parse_stat(text: str, version: int) -> dict[str, int]:
    """memory.stat -> dirty, writeback, cache, rss in bytes, whatever the version (pure)."""
    keys = STAT_KEYS[version]
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key in keys and value.strip().isdigit():
            out[keys[key]] = int(value)
    return out


def parse_events(text: str) -> dict[str, int]:
    """``key value`` lines (memory.events, v1's memory.oom_control) -> a dict (pure)."""
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[key] = int(value)
    return out


def parse_events_max(text: str) -> int:
    """v2's memory.events ``max``: how often usage hit the limit (v1's failcnt; pure)."""
    return parse_events(text).get("max", 0)


def v2_parents(own: Path, root: Path = UNIFIED_ROOT) -> list[Path]:
    """Where a v2 child may go, nearest first: the harness's own cgroup, then its ancestors up
    to the root (pure)."""
    out = [own]
    while out[-1] != root and out[-1] != out[-1].parent:
        out.append(out[-1].parent)
    return out


def own_layout() -> Layout:
    layout = find_layout(
        read_text("/proc/self/cgroup"), read_text(UNIFIED_ROOT / "cgroup.controllers")
    )
    if layout is None:
        raise BenchError("no memory cgroup controller (cgroup v1 memory or v2 with memory)")
    return layout


def own_memory_cgroup() -> Path:
    """The memory cgroup directory this process lives in (v1 or v2)."""
    return own_layout().own


def _v2_parent(own: Path) -> Path:
    """The nearest cgroup (own first) whose children can have a memory limit; enables it."""
    last = ""
    for candidate in v2_parents(own):
        control = candidate / "cgroup.subtree_control"
        if "memory" in read_text(control).split():
            return candidate
        try:
            write_sysfs(control, "+memory")
            return candidate
        except BenchError as err:  # EBUSY: it holds processes
            last = str(err)
    raise BenchError(f"no cgroup v2 parent can have memory limits: {last}")


class MemoryCgroup:
    """One memory cgroup with a limit; removed (tasks moved back, pages emptied) by teardown.

    Not a context manager on purpose: on Ctrl-C the global teardown must lift the throttle
    before emptying the cgroup, or emptying waits on writeback to a stalled device."""

    def __init__(self, name: str, limit: int, teardown: Teardown) -> None:
        self.layout = own_layout()
        self.parent = self.layout.own if self.layout.version == 1 else _v2_parent(self.layout.own)
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
        # Leftover tasks go back where the harness lives (on v2 maybe not the parent).
        self.key = self.teardown.push(
            "remove-cgroup", str(self.path), str(self.layout.own / "cgroup.procs")
        )
        write_sysfs(self.path / self.layout.limit_file, str(self.limit))
        return self

    def stat(self) -> dict[str, int]:
        """dirty, writeback, page cache, anonymous memory and usage of the cgroup, in bytes
        (empty once removed). On v2 NFS pages written but not yet committed by the server
        (the old "unstable" pages) count as writeback, as they do in /proc/meminfo."""
        out = parse_stat(read_text(self.path / "memory.stat"), self.layout.version)
        usage = read_text(self.path / self.layout.usage_file).strip()
        if usage:
            out["usage"] = int(usage)
        return out

    def failcnt(self) -> int:
        if self.layout.version == 2:
            return parse_events_max(read_text(self.path / "memory.events"))
        text = read_text(self.path / "memory.failcnt").strip()
        return int(text) if text else 0

    def oom_kills(self) -> int | None:
        """Processes the OOM killer took in this cgroup (None: the kernel does not say)."""
        name = "memory.events" if self.layout.version == 2 else "memory.oom_control"
        return parse_events(read_text(self.path / name)).get("oom_kill")


def memory_cgroup_skip_reason() -> str | None:
    try:
        own_layout()
    except BenchError as err:
        return str(err)
    if os.geteuid() != 0:
        return "memory cgroups need root"
    return None
