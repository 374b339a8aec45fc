"""One mount's parts: every collaborator built from a Config, and how they are wired.

Kept apart from daemon.py (which runs a mount: serve, signals, shutdown) so that the metrics and
the tests can name a Mount without importing the service around it.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Callable
from dataclasses import dataclass

from ..adapter.dir_attrs import DirAttrs
from ..adapter.init_flags import KillprivV2
from ..adapter.inodes import Inode, InodeTable
from ..adapter.kernel_entries import KernelEntries, bounds_for
from ..adapter.kernel_pages import KernelPages
from ..adapter.ops import Operations
from ..metering.ceilings import Ceilings
from ..metering.fleet import FleetShare
from ..metering.fleet import from_config as fleet_from_config
from ..metering.meter import Meter, profile_for
from ..observability.events import Events, NullEvents
from ..target.backend import Backend
from ..target.credentials import Callers, ThreadCredentials, can_switch
from ..target.target_calls import target_has_xattrs
from ..window.budget import WriteBudget
from ..window.controller import Controller, make_controller
from ..window.flusher import Flusher
from ..window.kernel_cache import KernelCache
from ..window.ledger import Ledger
from .memory_cgroup import OwnMemoryCgroup
from .options import Config


@dataclass
class Mount:
    """Every collaborator of one mount, built from a Config (no I/O but opening the root)."""

    config: Config
    backend: Backend
    inodes: InodeTable
    ledger: Ledger
    #: The window's owner: the gate, the window's size, the kernel's share, every wake-up.
    budget: WriteBudget
    flusher: Flusher
    ops: Operations
    controller: Controller
    events: Events
    ceilings: Ceilings
    #: The mount's one meter: the ceilings price requests with it, the metrics count into it.
    meter: Meter
    kernel_cache: KernelCache
    #: Drops synced ranges from the mount's page cache (attached once mounted).
    kernel_pages: KernelPages
    #: Keeps the inode table within the descriptor limit (attached once mounted).
    kernel_entries: KernelEntries | None = None
    #: Where the target's page cache is charged (set by serve; None in tests that build alone).
    memory_cgroup: OwnMemoryCgroup | None = None
    #: This mount's part of a fleet budget (budget=redis://...), drawn from by the ceilings.
    fleet: FleetShare | None = None
    #: Why writes leave nothing in the target's page cache (None: they go through it).
    direct_writes: str | None = None


def build(
    config: Config,
    events: Events | None = None,
    observer: Callable[[str, int], None] | None = None,
    meter: Meter | None = None,
    direct_writes: str | None = None,
) -> Mount:
    """Assemble a mount's parts; the root of SOURCE is opened here (it must exist).

    *meter*: the mount's one Meter, when the caller already counts into it (the metrics' target
    observer does); otherwise one is made from the config's profile. *direct_writes*: why
    writes leave nothing in the target's page cache (memory_cgroup.direct_target_writes), None
    when they go through it (target_io=direct asks for it without a reason).
    """
    if direct_writes is None and config.target_io == "direct":
        direct_writes = "target_io=direct"
    events = events or NullEvents()
    if meter is None:
        meter = Meter(profile_for(config))
    switching = config.credentials == "caller" and can_switch()
    dir_attrs = DirAttrs(config.attr_timeout)
    backend = Backend(
        config.threads,
        observer=observer,
        credentials=ThreadCredentials() if switching else None,
        kernel_checked=config.permissions == "kernel",
        on_dir_changed=dir_attrs.changed,
    )
    root_fd = os.open(config.source, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    ledger = Ledger()
    bounds = bounds_for(fd_limit())
    inodes = InodeTable(
        root_fd,
        os.fstat(root_fd),
        full_at=bounds.high,
        keep_path_of=ledger.lost,  # named at unmount even if the kernel forgot them
    )
    target_xattrs = target_has_xattrs(root_fd)
    # auto: offer xattrs exactly when the target has them (NFSv3 and EFS do not).
    xattrs = {"on": True, "off": False}.get(config.xattrs, target_xattrs)
    controller = make_controller(config)
    enforce = config.mode != "off"

    def held_by_kernel(nodeid: int) -> bool:
        inode = inodes.get(nodeid)
        return inode is not None and inode.lookups > 0 and inode.removed is None

    kernel_pages = KernelPages(enabled=config.drop_synced, known=held_by_kernel)
    kernel_cache = KernelCache(
        enabled=config.writeback_cache and enforce,
        limit=config.kernel_cache,
        read_ahead=config.read_ahead,
    )

    budget = WriteBudget(
        ledger,
        controller,
        batch=config.batch,
        kernel_cache=kernel_cache,
        enforce=enforce,
        admission_timeout=config.admission_timeout,
        on_admission_wait=events.admission_wait,
    )
    flusher = Flusher(
        budget,
        backend,
        inodes,
        batch=config.batch,
        max_age=config.max_age,
        inject=enforce,
        on_fsync=events.fsync,
        pieces=config.writeback_pieces,
        drop_synced=config.drop_synced,
        kernel_pages=kernel_pages,
    )

    def busy(inode: Inode) -> bool:
        """Whether the kernel must keep this inode's name: open, or data still to sync."""
        return inode.needed(flusher.owes(inode.nodeid))

    fleet = fleet_from_config(config)
    ceilings = Ceilings(
        meter,
        metered_limit=config.metered_limit,
        ops_limit=config.ops_limit,
        throttle_reads=config.throttle_reads,
        fleet=fleet,
    )
    ops = Operations(
        backend=backend,
        inodes=inodes,
        budget=budget,
        flusher=flusher,
        attr_timeout=config.attr_timeout,
        dir_attrs=dir_attrs,
        target_decides=config.permissions == "target",
        writeback_cache=config.writeback_cache,
        events=events,
        ceilings=ceilings if ceilings.active else None,
        offer_xattrs=xattrs,
        target_xattrs=target_xattrs,
        callers=Callers(switching),
        # The target does the set-ID and capability removal itself only when it sees the
        # writer: calls made as the caller, or a mount nobody but the daemon's user writes to.
        killpriv_v2=KillprivV2() if switching or not config.allow_other else None,
        target_direct=direct_writes is not None,
    )
    return Mount(
        config,
        backend,
        inodes,
        ledger,
        budget,
        flusher,
        ops,
        controller,
        events,
        ceilings,
        meter,
        kernel_cache,
        kernel_pages,
        KernelEntries(inodes, bounds, busy),
        fleet=fleet,
        direct_writes=direct_writes,
    )


def fuse_options(config: Config) -> set[str]:
    options = {
        f"fsname={config.fsname or config.source}",
        "subtype=fusethrottle",
    }
    if config.permissions == "kernel":
        options.add("default_permissions")
    if config.allow_other:
        options.add("allow_other")
    if config.read_only:
        options.add("ro")
    options.update(config.kernel_options)
    return options


def fd_limit() -> int:
    """The descriptors this process may hold (after :func:`raise_fd_limit`)."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def raise_fd_limit() -> None:
    """Each inode the kernel remembers holds one O_PATH descriptor: allow many."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if os.geteuid() == 0:
        try:
            with open("/proc/sys/fs/nr_open") as f:
                target = max(hard, int(f.read()))
        except OSError:
            pass
    for limit in (target, hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, max(limit, hard)))
            return
        except (ValueError, OSError):
            continue
