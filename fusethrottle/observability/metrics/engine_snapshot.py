"""The Snapshot (snapshot.py) of a mount, built from what the engine counted, behind both
``fusethrottle status`` and the Prometheus series.

The engine counts (its statistics and error answers, read through the ABI); this process knows
the rest: the controller, the kernel's share of the window, the memory cgroup, and the injected
fsyncs the engine reported as events, which a :class:`Recorder` turns into histograms. Pure:
every input is an argument.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ...engine.native import PASSTHROUGH, EngineStats
from ...metering.fleet import FleetStatistics
from ...metering.meter import UNMETERED, ClassTotals, OpClass
from ...service.options import Config
from ...service.placement import Placement
from ...window.controller import Controller
from .definitions import ADMISSION_BUCKETS
from .recorder import HistogramSnapshot, Recorder
from .snapshot import (
    ControllerFacts,
    GuardFacts,
    MountFacts,
    RateHistory,
    Snapshot,
    cgroup_facts,
    errno_name,
    recent_fsyncs,
)


@dataclass(frozen=True)
class EngineView:
    """What the engine said at one instant, and what this process decided meanwhile."""

    stats: EngineStats
    errors: list[tuple[str, int, int]]  # (operation, errno, count)
    controller: Controller
    window_bytes: int  # the bound on everything un-synced, the kernel's share included
    kernel_cache_bytes: int
    fleet: FleetStatistics | None = None  # budget=: this mount's share, as the renewer sees it
    guard: GuardFacts | None = None  # guard=: the pressure guard's last decision
    changes: tuple[str, ...] = ()  # settings changed while serving (set, reload), newest last
    schedule: str = ""  # the ceilings' schedule: what applies now ("": no schedule)


def passthrough_facts(stats: EngineStats) -> str:
    """FUSE passthrough: on (and how many opens the kernel served), or why it is off."""
    said = PASSTHROUGH.get(stats.passthrough, f"off (code {stats.passthrough})")
    return f"on, {stats.passthrough_opens} open(s) served" if stats.passthrough == 1 else said


def capability_question(stats: EngineStats) -> str:
    """How often the kernel asks security.capability before a write: what small writes cost."""
    if not stats.xattrs:
        return "never (xattrs not served)"
    if stats.killpriv_v2:
        return "once per file (FUSE_HANDLE_KILLPRIV_V2)"
    return "before every write()"


def engine_snapshot(
    config: Config,
    placement: Placement,
    view: EngineView,
    recorder: Recorder,
    history: RateHistory,
    *,
    started: float,
    now: float,
    sample: bool,
) -> Snapshot:
    """The Snapshot of *view* (*now*: the event loop's clock, for the rates)."""
    s = view.stats
    meter = {cls.value: s.meter.get(cls.value, ClassTotals()) for cls in OpClass}
    read_bytes = meter[OpClass.DATA_READ.value].bytes
    totals = (
        s.written_bytes,
        read_bytes,
        s.synced_bytes,
        sum(c.metered_bytes for c in meter.values()),
        sum(c.units for c in meter.values()),
    )
    waits = s.admission_waits or (0,) * (len(ADMISSION_BUCKETS) + 1)
    # The engine's error answers, and the injected fsyncs that failed (no request of a caller).
    failed: dict[tuple[str, int], int] = dict(recorder.target_errors)
    for op, code, n in view.errors:
        failed[(op, code)] = failed.get((op, code), 0) + n
    errors = tuple(sorted((op, errno_name(code), n) for (op, code), n in failed.items()))
    mono = time.monotonic()
    return Snapshot(
        taken=time.time(),
        monotonic=mono,
        mount=MountFacts.of(config, started),
        unsynced_bytes=s.unsynced_bytes,
        reserved_bytes=s.reserved_bytes,
        syncing_bytes=s.syncing_bytes,
        dirty_files=s.dirty_files,
        oldest_unsynced_age_seconds=s.oldest_age,
        window_bytes=view.window_bytes,
        kernel_cache_bytes=view.kernel_cache_bytes,
        written_bytes=s.written_bytes,
        read_bytes=read_bytes,
        synced_bytes=s.synced_bytes,
        failed_syncs=s.fsync_errors,
        waiting_writes=s.waiting_writes,
        throttled_writes=s.throttled_writes,
        admission_timeouts=s.admission_timeouts,
        admission_wait=HistogramSnapshot(
            ADMISSION_BUCKETS, tuple(waits[: len(ADMISSION_BUCKETS) + 1]), s.admission_wait_seconds
        ),
        fsyncs_in_flight=s.fsyncs_in_flight,
        fsync_duration={r: h.freeze() for r, h in recorder.fsync_duration.items()},
        fsync_bytes=dict(recorder.fsync_bytes),
        fsync_errors=dict(recorder.fsync_errors),
        fsync_recent=recent_fsyncs(recorder.recent_fsyncs, mono),
        controller=ControllerFacts.of(config.mode, view.controller),
        operations=dict(s.operations),
        target_operations={op: n for op, n in s.operations.items() if op not in UNMETERED},
        target_errors=errors,
        meter=meter,
        ceiling_delayed=s.ceiling_delayed,
        ceiling_delay_seconds=s.ceiling_delay_seconds,
        rates=history.rates(now, totals, sample=sample),
        inodes=s.known_files,
        open_handles=s.open_handles,
        inodes_bound=s.relief_high,
        names_dropped=s.names_dropped,
        capability_question=capability_question(s),
        page_cache_drops=s.page_cache_drops,
        target_writes_uncached=placement.direct_writes or "",
        fleet=view.fleet,
        guard=view.guard,
        settings_changed=view.changes,
        schedule=view.schedule,
        passthrough=passthrough_facts(s),
        **cgroup_facts(placement.cgroup),
    )
