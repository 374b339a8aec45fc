"""Where the daemon's writes to the target are charged: its own memory cgroup or the one it
shares, and what follows from that (target_io=auto, writeback_cache=auto). Decided before
anything touches the target, for either data plane."""

from __future__ import annotations

import dataclasses
import os

from .memory_cgroup import OwnMemoryCgroup, direct_target_writes, in_memory_target
from .mountinfo import containing_mount, mounts
from .options import Config, memory_cgroup_limit


@dataclasses.dataclass
class Placement:
    """Where the daemon's writes to the target are charged, decided before any touches it."""

    cgroup: OwnMemoryCgroup
    #: Why writes leave nothing in the target's page cache (None: they go through it).
    direct_writes: str | None
    #: The config as served (writeback_cache=auto resolved).
    config: Config


def place(config: Config) -> Placement:
    """Enter a memory cgroup of the daemon's own where it should, and decide target_io and
    writeback_cache=auto from where the daemon ends up."""
    own_cgroup = OwnMemoryCgroup(memory_cgroup_limit(config))
    source_mount = containing_mount(os.path.realpath(config.source), mounts())
    in_memory = in_memory_target(source_mount.fstype) if source_mount is not None else None
    if config.memory_cgroup != "auto":
        own_cgroup.reason = "memory_cgroup=off"
        own_cgroup.locate()  # where it stays: shared with others or not (target_io=auto)
    elif in_memory:
        own_cgroup.reason = in_memory
    else:
        own_cgroup.enter()
    direct_writes = direct_target_writes(config.target_io, own_cgroup, in_memory)
    if direct_writes is not None and config.writeback_cache_auto and config.writeback_cache:
        # The mount's own cache is the writer's, charged to the same shared cgroup: its pages
        # wait dirty and under write-back for the slow target there too, and reclaim throttles
        # on them (cgroup v1: 100 ms at a time). Without it every write() waits for the target
        # itself, and nothing of the backup waits for the target in the cgroup.
        config = dataclasses.replace(config, writeback_cache=False)
    return Placement(own_cgroup, direct_writes, config)
