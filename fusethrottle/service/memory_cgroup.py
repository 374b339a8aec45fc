"""A memory cgroup of the daemon's own, so the target's page cache is not the application's.

Every page the daemon writes to the target is charged to the memory cgroup of the daemon. When
that cgroup is also the application's (a container, or a daemon started from the database's own
shell), the application's allocations reclaim the backup's pages, and in a cgroup-v1 memory
cgroup reclaim that meets a page under writeback a second time waits for that write: behind a
slow target, seconds. In a cgroup of its own the backup's pages are reclaimed by the backup's
own allocations, against its own limit, and the application never waits for them.

``memory_cgroup=auto`` (the default) does this where the host allows it: root, a writable
memory hierarchy (cgroup v1 ``memory`` or v2 with the memory controller). It creates
``<hierarchy root>/fusethrottle/<pid>`` with the limit ``memory_cgroup_limit``, moves the whole
daemon (every thread) there before it touches the target, and on exit moves back and removes it;
cgroups left by a killed daemon are removed at the next start (a cgroup with tasks cannot be
removed, so only empty ones go; the ``fusethrottle`` directory itself stays). A daemon run by
systemd as a service or mount unit stays in the unit's cgroup, which is its own already. Where
none of this is possible (a daemon confined in a container) it stays and says so once; the
flusher's short syncs and page dropping still apply.

Pure decisions (which hierarchy, whether to move) are separate from the file-system edits so
they can be tested without root.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from .mountinfo import MountInfo, mounts

log = logging.getLogger(__name__)

#: The directory below the hierarchy's root that holds one cgroup per daemon.
PARENT_NAME = "fusethrottle"
#: Removing the daemon's cgroup at exit: how often to try while it is still busy, how far apart.
RMDIR_TRIES = 40
RMDIR_PAUSE = 0.05
#: Cgroups systemd makes for one unit, which the daemon leaves alone.
SYSTEMD_UNITS = (".service", ".mount")


@dataclass(frozen=True)
class Hierarchy:
    """Where the memory controller is mounted and where this process sits in it."""

    version: int  # 1 or 2
    root: Path  # the mount point of the hierarchy
    current: Path  # this process's cgroup directory inside it

    def limit_file(self) -> str:
        return "memory.limit_in_bytes" if self.version == 1 else "memory.max"


#: cgroup v1 reads an unlimited cgroup's limit as about 2**63 rounded to pages.
V1_UNLIMITED = 1 << 62


def parse_limit(text: str) -> int | None:
    """A memory cgroup's limit from its limit file (None: unlimited, v2's ``max`` or v1's
    huge number)."""
    text = text.strip()
    if text == "max" or not text.isdigit():
        return None
    value = int(text)
    return None if value >= V1_UNLIMITED else value


def root_limit(hierarchy: Hierarchy) -> int | None:
    """The memory limit on the root of the hierarchy as this process sees it. The host's own
    root has none (v2 has no ``memory.max`` there); the root of a cgroup namespace is a
    container's cgroup (Kubernetes, Docker and Podman on cgroup v2 give each container one), and
    its limit is the container's, shared by everything inside."""
    try:
        return parse_limit((hierarchy.root / hierarchy.limit_file()).read_text())
    except OSError:
        return None


def find_hierarchy(proc_cgroup: str, mounts: list[MountInfo]) -> Hierarchy | None:
    """The memory hierarchy this process is in, from /proc/self/cgroup and the mount table.

    cgroup v1 names a mount's controllers in its super options (``rw,memory``). v1's ``memory``
    wins over v2 on a hybrid host, where the unified hierarchy has no memory controller."""
    v1_path = v2_path = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if "memory" in controllers.split(","):
            v1_path = path
        elif controllers == "" and parts[0] == "0":
            v2_path = path
    if v1_path is not None:
        for m in mounts:
            if m.fstype == "cgroup" and m.super_option("memory") is not None:
                return Hierarchy(1, Path(m.mountpoint), Path(m.mountpoint) / v1_path.lstrip("/"))
        return None
    if v2_path is not None:
        for m in mounts:
            if m.fstype == "cgroup2":
                return Hierarchy(2, Path(m.mountpoint), Path(m.mountpoint) / v2_path.lstrip("/"))
    return None


def own_unit(hierarchy: Hierarchy) -> bool:
    """Whether the cgroup this process is in is a systemd service's or mount unit's, which
    holds the daemon alone."""
    return hierarchy.current != hierarchy.root and hierarchy.current.name.endswith(SYSTEMD_UNITS)


def should_move(hierarchy: Hierarchy, pid: int) -> str | None:
    """Why the daemon must not move (None: move). A systemd service or mount unit (fstab's
    ``fuse.fusethrottle`` lines run the daemon in the .mount unit) already has a cgroup of its
    own, and systemd must keep finding its process there. Being alone in a cgroup now says
    nothing: a container starts its backup sidecar first and its database next."""
    name = hierarchy.current.name
    if own_unit(hierarchy):
        return f"a systemd unit has a memory cgroup of its own ({hierarchy.current})"
    if hierarchy.current.parent.name == PARENT_NAME and name == str(pid):
        return f"already in {hierarchy.current}"
    return None


#: File systems whose files are the page cache: nothing of theirs can be reclaimed.
IN_MEMORY_FSTYPES = frozenset({"tmpfs", "ramfs"})


def in_memory_target(fstype: str) -> str | None:
    """Why the daemon must not give its target I/O a memory limit of its own (None: it may).

    The files of a tmpfs target are charged to whoever writes them and cannot be written back
    and dropped like the page cache of NFS or a disk: a limit would fill with them and end in
    the OOM killer taking the daemon (seen with a million small files on tmpfs).
    """
    if fstype in IN_MEMORY_FSTYPES:
        return (
            f"SOURCE is on {fstype}: its files cannot be reclaimed, "
            "a memory limit would end in the OOM killer"
        )
    return None


class OwnMemoryCgroup:
    """The daemon's own memory cgroup: :meth:`enter` before the target is touched, :meth:`leave`
    at exit. Both are best effort: a host that refuses is logged once, never fatal."""

    def __init__(self, limit: int, pid: int | None = None) -> None:
        self.limit = limit
        self.pid = pid or os.getpid()
        self.hierarchy: Hierarchy | None = None
        self.path: Path | None = None  # set while the daemon is inside
        self.container_limit: int | None = None  # the limit on the root it sees (a container's)
        self.reason = ""  # why not, when it stayed

    def locate(self) -> str | None:
        """Find the memory hierarchy and where the daemon sits in it (:attr:`hierarchy`);
        why not, if it cannot be known."""
        try:
            self.hierarchy = find_hierarchy(Path("/proc/self/cgroup").read_text(), mounts())
        except OSError as err:
            return f"cannot read the cgroup layout: {err.strerror}"
        if self.hierarchy is not None:
            self.container_limit = root_limit(self.hierarchy)
        return None if self.hierarchy is not None else "no memory cgroup hierarchy is mounted"

    def enter(self) -> bool:
        """Create the cgroup and move the whole process into it; False (with :attr:`reason`)
        when the host does not allow it."""
        why_not = self.locate()
        if why_not is not None:
            return self._stay(why_not)
        hierarchy = self.hierarchy
        assert hierarchy is not None
        why = should_move(hierarchy, self.pid)
        if why:
            return self._stay(why)
        parent = hierarchy.root / PARENT_NAME
        path = parent / str(self.pid)
        try:
            parent.mkdir(exist_ok=True)
            if hierarchy.version == 2:
                _enable_memory(hierarchy.root)
                _enable_memory(parent)
            _remove_stale(parent)
            path.mkdir(exist_ok=True)
            (path / hierarchy.limit_file()).write_text(str(self.limit))
            (path / "cgroup.procs").write_text(str(self.pid))
        except OSError as err:
            with contextlib.suppress(OSError):
                path.rmdir()
            return self._stay(f"cannot use {path}: {err.strerror or err}")
        self.path = path  # the daemon says so once it is mounted
        return True

    def shared(self) -> str | None:
        """Where the target's page cache would be charged to a memory limit the daemon shares
        with others (None: nowhere). Inside a container (a cgroup namespace whose root has a
        limit) everything, a cgroup of the daemon's own included, is below the container's
        limit, and its reclaim meets the target's pages wherever they are charged. On a host,
        where the daemon stayed in a cgroup that is neither the hierarchy's root (no limit:
        reclaim there is global, which never waits for write-back) nor a systemd unit of its
        own."""
        h = self.hierarchy
        if h is None:
            return None
        if self.container_limit is not None:
            return f"the memory limit of {h.root} ({self.container_limit >> 20} MiB, a container's)"
        if self.path is None and h.current != h.root and not own_unit(h):
            return f"the memory cgroup {h.current}"
        return None

    def usage(self) -> int | None:
        """Bytes charged to the cgroup now (None when not inside one, or unreadable)."""
        if self.path is None or self.hierarchy is None:
            return None
        name = "memory.usage_in_bytes" if self.hierarchy.version == 1 else "memory.current"
        try:
            return int((self.path / name).read_text())
        except (OSError, ValueError):
            return None

    def leave(self) -> None:
        """Move back (to where the daemon came from, else to the root) and remove the cgroup."""
        if self.path is None or self.hierarchy is None:
            return
        for home in (self.hierarchy.current, self.hierarchy.root):
            try:
                (home / "cgroup.procs").write_text(str(self.pid))
                break
            except OSError:
                continue
        # A child of the daemon that is still ending (the readiness check's stat) keeps the
        # cgroup populated for a moment: EBUSY then, not for long.
        for attempt in range(RMDIR_TRIES):
            try:
                self.path.rmdir()
                break
            except OSError as err:
                if err.errno == errno.EBUSY and attempt + 1 < RMDIR_TRIES:
                    time.sleep(RMDIR_PAUSE)
                    continue
                log.warning("could not remove the memory cgroup %s: %s", self.path, err.strerror)
                break
        self.path = None

    def _stay(self, reason: str) -> bool:
        self.reason = reason  # logged once mounted; status shows it
        return False


def _enable_memory(cgroup: Path) -> None:
    """cgroup v2: let the children of *cgroup* have memory limits."""
    control = cgroup / "cgroup.subtree_control"
    if "memory" not in control.read_text().split():
        control.write_text("+memory")


def _remove_stale(parent: Path) -> None:
    """Remove cgroups of daemons that died without cleaning up (only empty ones can go; one
    whose daemon lives may be empty for a moment while it starts, and stays)."""
    for child in parent.iterdir():
        if child.is_dir() and child.name.isdigit() and not Path(f"/proc/{child.name}").exists():
            try:
                child.rmdir()
            except OSError as err:
                if err.errno not in (errno.EBUSY, errno.ENOENT):
                    log.debug("stale memory cgroup %s: %s", child, err.strerror)


def direct_target_writes(mode: str, cgroup: OwnMemoryCgroup, in_memory: str | None) -> str | None:
    """Why the daemon writes to the target uncached (target_io, see the engine's
    write_uncached in engine/src/ops.cc), or None: through the target's page cache (pure).

    ``auto`` writes uncached exactly where the target's page cache would be charged to a memory
    cgroup shared with the application (the container case, or memory_cgroup=off): there the
    application's reclaim meets the target's pages under write-back and, in cgroup v1, waits
    for them (seconds behind a slow target). Nowhere else is it needed: in a cgroup of the
    daemon's own the application never reclaims them, and a target in memory has no
    write-back."""
    if mode == "direct":
        return "target_io=direct"
    if mode == "buffered" or in_memory is not None:
        return None
    shared = cgroup.shared()
    return None if shared is None else f"the daemon shares {shared} with others"
