"""The plain-data picture of one mount at one instant, which every reader shares.

The Prometheus exposition (exposition.py) and ``fusethrottle status`` (the JSON of
:meth:`Snapshot.to_json`, documented in docs/METRICS.md) both read a :class:`Snapshot` and never
the live objects: it is built on the event loop (engine_snapshot.py) and never changed
afterwards (the dicts are private copies), so any thread may read it.
"""

from __future__ import annotations

import errno as errno_mod
import os
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from ...metering.fleet import FleetStatistics
from ...metering.meter import ClassTotals
from ...service.options import Config
from ...stats import percentile
from ...window.controller import Controller
from .recorder import HistogramSnapshot

if TYPE_CHECKING:
    from ...service.memory_cgroup import OwnMemoryCgroup

RECENT_FSYNC_SPAN = 300.0  # seconds of fsyncs behind the status view's p50/p99
MiB = 1024 * 1024


@dataclass(frozen=True)
class MountFacts:
    """The mount's fixed settings, as the status view and the ``fusethrottle_mount`` info show."""

    mountpoint: str
    source: str
    mode: str
    meter: str
    batch: int
    window_min: int
    window_max: int
    max_age: float
    metered_limit: float
    ops_limit: float
    metrics: str  # "" when the endpoint is off
    pid: int
    started: float  # unix time

    @classmethod
    def of(cls, config: Config, started: float) -> MountFacts:
        return cls(
            config.mountpoint,
            config.source,
            config.mode,
            config.meter,
            config.batch,
            config.window_min,
            config.window_max,
            config.max_age,
            config.metered_limit,
            config.ops_limit,
            config.metrics,
            os.getpid(),
            started,
        )


@dataclass(frozen=True)
class ControllerFacts:
    """What the controller decided and measured (rates in bytes/s; None until measured)."""

    mode: str
    window: int
    target_window: float | None
    baseline_bytes_per_second: float | None
    recent_bytes_per_second: float | None
    samples: int
    holds: int

    @classmethod
    def of(cls, mode: str, controller: Controller) -> ControllerFacts:
        state = controller.snapshot()
        recent, baseline = state.recent_s_per_mib, state.baseline_s_per_mib
        target = controller.target_window
        return cls(
            mode=mode,
            window=controller.window,
            target_window=float(target) if target is not None else None,
            baseline_bytes_per_second=MiB / baseline if baseline else None,
            recent_bytes_per_second=MiB / recent if recent else None,
            samples=state.samples,
            holds=state.holds,
        )


@dataclass(frozen=True)
class FsyncRecent:
    """fsync durations of the last RECENT_FSYNC_SPAN seconds, for the status view."""

    samples: int
    p50: float | None
    p99: float | None
    max: float | None


@dataclass(frozen=True)
class Rates:
    """Per-second rates over the last ``span_seconds`` (up to the history's span)."""

    span_seconds: float = 0.0
    written: float = 0.0
    read: float = 0.0
    synced: float = 0.0
    metered: float = 0.0
    units: float = 0.0


@dataclass(frozen=True)
class GuardFacts:
    """The pressure guard at one instant (guard=): what it protects and what it decided."""

    protects: str  # "host" or the cgroup directory
    state: str  # learning, open, holding (guard.rule.GuardState)
    share: float  # the protected workload's stall share at the last reading
    line: float  # the share above which the backup is held back
    limit: float  # bytes/s the backup may write at (0: no limit from the guard)
    held_seconds: float  # time spent holding the backup back
    triggers: bool  # the kernel's PSI triggers wake the guard (else it polls)


@dataclass(frozen=True)
class Snapshot:
    """Everything a scrape or ``fusethrottle status`` shows, copied at one instant."""

    taken: float  # unix time
    monotonic: float  # time.monotonic(): any thread can tell the snapshot's age from it
    mount: MountFacts
    unsynced_bytes: int
    reserved_bytes: int
    syncing_bytes: int
    dirty_files: int
    oldest_unsynced_age_seconds: float
    window_bytes: int
    kernel_cache_bytes: int
    written_bytes: int
    read_bytes: int
    synced_bytes: int
    failed_syncs: int
    waiting_writes: int
    throttled_writes: int
    admission_timeouts: int
    admission_wait: HistogramSnapshot
    fsyncs_in_flight: int
    fsync_duration: dict[str, HistogramSnapshot]
    fsync_bytes: dict[str, int]
    fsync_errors: dict[str, int]
    fsync_recent: FsyncRecent
    controller: ControllerFacts
    operations: dict[str, int]
    target_operations: dict[str, int]
    target_errors: tuple[tuple[str, str, int], ...]  # (op, errno name, count)
    meter: dict[str, ClassTotals]
    ceiling_delayed: int
    ceiling_delay_seconds: float
    rates: Rates
    inodes: int
    open_handles: int
    inodes_bound: int = 0
    names_dropped: int = 0
    capability_question: str = ""  # how often the kernel asks security.capability (init_flags)
    memory_cgroup: str = ""  # the daemon's own memory cgroup, or why it stayed where it was
    #: Why writes leave nothing in the target's page cache ("": they go through it).
    target_writes_uncached: str = ""
    memory_cgroup_own: bool = False
    memory_cgroup_usage_bytes: int | None = None
    memory_cgroup_limit_bytes: int = 0
    page_cache_drops: int = 0
    fleet: FleetStatistics | None = None  # the fleet budget (budget=redis://...), if any
    guard: GuardFacts | None = None  # the pressure guard (guard=), if any
    #: Settings changed while serving (``fusethrottle set``, a reload), newest last.
    settings_changed: tuple[str, ...] = ()
    #: The ceilings' time-of-day schedule: what applies now ("": no schedule).
    schedule: str = ""
    #: Whether the kernel reads files opened read-only itself (FUSE passthrough), or why not.
    passthrough: str = ""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the status socket's answer; docs/METRICS.md describes it)."""
        return asdict(self)


class RateHistory:
    """Totals sampled at a steady interval; a rate is the change since the oldest one kept.

    Over a span of many samples, not between neighbours: synced bytes arrive in fsync-sized
    lumps, and a rate per half second would jump with each one. Times come from the caller (the
    event loop's clock, so tests can run it on a fake one).
    """

    def __init__(self, interval: float, span: float) -> None:
        self._min_span = interval / 2
        self._points: deque[tuple[float, ...]] = deque(maxlen=int(span / interval) + 1)

    def rates(self, now: float, totals: tuple[float, ...], *, sample: bool) -> Rates:
        """Rates of *totals* (written, read, synced, metered, units) up to *now*; with *sample*
        they are kept as the newest point of the history."""
        point = (now, *totals)
        rates = Rates()
        if self._points:
            first = self._points[0]
            span = now - first[0]
            if span >= self._min_span:
                rates = Rates(
                    span, *((b - a) / span for a, b in zip(first[1:], totals, strict=True))
                )
        if sample:
            self._points.append(point)
        return rates


def errno_name(code: int) -> str:
    return errno_mod.errorcode.get(code, f"errno{code}")


def recent_fsyncs(samples: Iterable[tuple[float, float]], now: float) -> FsyncRecent:
    """Nearest-rank p50/p99 and the max of the fsyncs of the last RECENT_FSYNC_SPAN seconds."""
    durations = sorted(s for t, s in samples if now - t <= RECENT_FSYNC_SPAN)
    return FsyncRecent(
        len(durations),
        percentile(durations, 0.50),
        percentile(durations, 0.99),
        durations[-1] if durations else None,
    )


def cgroup_facts(cgroup: OwnMemoryCgroup | None) -> dict[str, Any]:
    """Where the target's page cache is charged: the daemon's own memory cgroup and its use,
    or why it stayed in the one it started in (both data planes)."""
    if cgroup is None:
        return {}
    if cgroup.path is None:
        return {"memory_cgroup": cgroup.reason or "off (memory_cgroup=off)"}
    return {
        "memory_cgroup": str(cgroup.path),
        "memory_cgroup_own": True,
        "memory_cgroup_usage_bytes": cgroup.usage(),
        "memory_cgroup_limit_bytes": cgroup.limit,
    }
