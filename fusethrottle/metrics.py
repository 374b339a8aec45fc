"""What the mount holds back and why: Prometheus series and the status snapshot.

Data flows one way, and only frozen copies cross threads::

    data path  --Events / observer-->  Recorder         plain ints, event loop only, no locks
    event loop --publish(), 0.5 s -->  Snapshot         frozen copy of Recorder + ledger, gate,
                                                        flusher, controller, meter
    scrape thread, status socket  -->  Snapshot         never the live objects

Why not prometheus_client's Counter and Histogram objects: they take a lock on every update and
their values are read by the scrape thread while the loop writes them. Here the hot path adds to
plain Python numbers from the event loop (a dict increment per request) and a custom collector
turns the latest Snapshot into metric families. A scrape first asks the loop for a fresh
snapshot and waits at most ``FRESH_WAIT`` for it, so a stuck loop gives a stale (but answered)
scrape whose ``fusethrottle_snapshot_age_seconds`` says so.

Every metric name is defined in :data:`DEFS` below and documented in docs/METRICS.md (a test
checks that both agree). With ``-o metrics=`` off nothing listens on the network, but the
recorder, the snapshots and the status socket (see status.py) still run: ``fusethrottle status``
must work on every mount.

Nothing here may end the mount: every task catches and logs its own failures.
"""

from __future__ import annotations

import bisect
import errno as errno_mod
import faulthandler
import functools
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from functools import partial
from socketserver import TCPServer, ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

import trio
from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)

from . import __version__
from .controller import Controller
from .meter import ClassTotals, Meter, OpClass
from .meter import profile as meter_profile
from .options import MODES, Config

log = logging.getLogger(__name__)

PUBLISH_INTERVAL = 0.5  # seconds between snapshots published by the event loop
FRESH_WAIT = 0.25  # how long a scrape waits for the loop to publish a fresh snapshot
RATE_SPAN = 10.0  # seconds of history behind the throughput figures
RECENT_FSYNC_SPAN = 300.0  # seconds of fsyncs behind the status view's p50/p99
RECENT_FSYNC_MAX = 2048
MiB = 1024 * 1024

# --- every metric name, in one place -------------------------------------------------------

FSYNC_REASONS = ("batch", "window", "age", "release", "application", "unmount")
FSYNC_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0,
)  # fmt: skip
ADMISSION_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)  # fmt: skip
OP_CLASSES = ("data_read", "data_write", "meta_read", "meta_write")


@dataclass(frozen=True)
class MetricDef:
    """One exported series family; ``name`` is what Prometheus shows (counters end in _total)."""

    name: str
    kind: str  # counter | gauge | histogram | info
    help: str
    labels: tuple[str, ...] = ()


def _defs(*items: MetricDef) -> dict[str, MetricDef]:
    return {d.name: d for d in items}


DEFS: dict[str, MetricDef] = _defs(
    # the window and what is in it
    MetricDef("fusethrottle_unsynced_bytes", "gauge",
              "Bytes admitted but not yet made durable by an fsync (what the window bounds)."),
    MetricDef("fusethrottle_window_bytes", "gauge",
              "Current window: the most un-synced bytes the mount admits (kernel cache included)."),
    MetricDef("fusethrottle_kernel_cache_bytes", "gauge",
              "The window's share the kernel may hold dirty in the mount's page cache "
              "(writeback cache; 0 when off)."),
    MetricDef("fusethrottle_reserved_bytes", "gauge",
              "Bytes of admitted writes still on their way to the target."),
    MetricDef("fusethrottle_syncing_bytes", "gauge",
              "Bytes covered by fsyncs in progress."),
    MetricDef("fusethrottle_dirty_files", "gauge",
              "Files holding un-synced data."),
    MetricDef("fusethrottle_oldest_unsynced_age_seconds", "gauge",
              "Age of the oldest un-synced byte."),
    MetricDef("fusethrottle_batch_bytes", "gauge",
              "Configured batch: a file is fsynced once it holds this many dirty bytes."),
    MetricDef("fusethrottle_window_min_bytes", "gauge",
              "Configured lower bound of the window."),
    MetricDef("fusethrottle_window_max_bytes", "gauge",
              "Configured upper bound of the window."),
    MetricDef("fusethrottle_max_age_seconds", "gauge",
              "Configured max_age: dirty data older than this is fsynced."),
    # traffic
    MetricDef("fusethrottle_written_bytes_total", "counter",
              "Bytes written through the mount and accepted by the target."),
    MetricDef("fusethrottle_read_bytes_total", "counter",
              "Bytes read through the mount."),
    MetricDef("fusethrottle_synced_bytes_total", "counter",
              "Bytes made durable by successful fsyncs (injected or the application's)."),
    MetricDef("fusethrottle_operations_total", "counter",
              "FUSE requests handled, by operation.", ("op",)),
    MetricDef("fusethrottle_target_operations_total", "counter",
              "Operations issued to the target (the NFS/EFS directory), by operation.", ("op",)),
    MetricDef("fusethrottle_target_errors_total", "counter",
              "Operations the target failed, by operation and errno name.", ("op", "errno")),
    # admission
    MetricDef("fusethrottle_waiting_writes", "gauge",
              "Writes waiting for room in the window right now."),
    MetricDef("fusethrottle_throttled_writes_total", "counter",
              "Writes that had to wait for room in the window."),
    MetricDef("fusethrottle_admission_timeouts_total", "counter",
              "Writes admitted only because they waited admission_timeout."),
    MetricDef("fusethrottle_admission_wait_seconds", "histogram",
              "How long each throttled write waited for room in the window."),
    # fsync
    MetricDef("fusethrottle_fsync_duration_seconds", "histogram",
              "Duration of each fsync sent to the target, by why it was sent.", ("reason",)),
    MetricDef("fusethrottle_fsync_bytes_total", "counter",
              "Bytes made durable by successful fsyncs, by reason.", ("reason",)),
    MetricDef("fusethrottle_fsync_errors_total", "counter",
              "fsyncs the target failed, by reason.", ("reason",)),
    MetricDef("fusethrottle_fsyncs_in_flight", "gauge",
              "Injected fsyncs in progress."),
    # controller
    MetricDef("fusethrottle_controller_mode", "gauge",
              "1 for the admission mode in use (off, static or adaptive).", ("mode",)),
    MetricDef("fusethrottle_controller_target_window_bytes", "gauge",
              "Window the adaptive controller steers toward (absent until measured)."),
    MetricDef("fusethrottle_controller_commit_bytes_per_second", "gauge",
              "Rate the target commits this mount's data, as the controller measures it "
              "(baseline: best seen, recent: last few fsyncs).", ("estimate",)),
    MetricDef("fusethrottle_controller_samples_total", "counter",
              "fsync samples the controller has been fed."),
    MetricDef("fusethrottle_controller_holds_total", "counter",
              "Times a hard signal (very slow fsync, EIO/ETIMEDOUT) halved the window."),
    # EFS-style metering
    MetricDef("fusethrottle_metered_operations_total", "counter",
              "Target operations by EFS metering class.", ("class",)),
    MetricDef("fusethrottle_metered_bytes_total", "counter",
              "Bytes as EFS meters them (minimum per operation, reads discounted), by class.",
              ("class",)),
    MetricDef("fusethrottle_efs_units_total", "counter",
              "EFS file-operation units (read 1, write 5 in General Purpose mode), by class.",
              ("class",)),
    MetricDef("fusethrottle_metered_limit_bytes_per_second", "gauge",
              "Configured ceiling on metered bytes per second (0: none)."),
    MetricDef("fusethrottle_ops_limit_units_per_second", "gauge",
              "Configured ceiling on EFS units per second (0: none)."),
    MetricDef("fusethrottle_ceiling_delayed_operations_total", "counter",
              "Requests delayed by the metered_limit / ops_limit ceilings."),
    MetricDef("fusethrottle_ceiling_delay_seconds_total", "counter",
              "Seconds requests spent waiting for the ceilings."),
    # memory (issue 15)
    MetricDef("fusethrottle_memory_cgroup_usage_bytes", "gauge",
              "Memory charged to the daemon's own memory cgroup (the target's page cache and the "
              "daemon itself); 0 when it stays in the cgroup it was started in."),
    MetricDef("fusethrottle_memory_cgroup_limit_bytes", "gauge",
              "Limit of the daemon's own memory cgroup (memory_cgroup_limit); 0: none of its own."),
    MetricDef("fusethrottle_page_cache_drops_total", "counter",
              "Synced ranges the daemon asked the kernel to drop from the mount's page cache "
              "(the target's copy is dropped in the same sync)."),
    # the daemon
    MetricDef("fusethrottle_inodes", "gauge",
              "Inodes the kernel holds references to (each keeps one descriptor open)."),
    MetricDef("fusethrottle_open_handles", "gauge",
              "Open file and directory handles."),
    MetricDef("fusethrottle_snapshot_age_seconds", "gauge",
              "Age of the numbers in this scrape; above ~1 s the event loop is not answering."),
    MetricDef("fusethrottle_build", "info",
              "Versions of fusethrottle and the libraries it runs on.",
              ("version", "python", "pyfuse3", "trio", "prometheus_client")),
    MetricDef("fusethrottle_mount", "info",
              "The mount this daemon serves.", ("mountpoint", "source", "mode", "meter")),
)  # fmt: skip


def exported_names() -> list[str]:
    """Every series name as it appears in a scrape (counters with _total, infos with _info)."""
    out = []
    for d in DEFS.values():
        out.append(d.name + "_info" if d.kind == "info" else d.name)
    return out


# --- which EFS class a target operation belongs to -----------------------------------------

_DATA_READ = frozenset({"read"})
_DATA_WRITE = frozenset({"write"})
_META_READ = frozenset(
    {"lookup", "getattr", "readlink", "readdir", "statfs", "getxattr", "listxattr", "open"}
)
_META_WRITE = frozenset(
    {
        "create", "mkdir", "mknod", "symlink", "unlink", "rmdir", "rename", "link",
        "setattr", "setxattr", "removexattr", "fsync", "fallocate",
    }
)  # fmt: skip
CLASSIFIED_OPS = _DATA_READ | _DATA_WRITE | _META_READ | _META_WRITE


def op_class(op: str) -> str:
    """The metering class of a backend operation name. Changes to the target's namespace or
    attributes, fsync, and anything unknown are metadata writes: the expensive class."""
    if op in _DATA_WRITE:
        return "data_write"
    if op in _DATA_READ:
        return "data_read"
    if op in _META_READ:
        return "meta_read"
    return "meta_write"


# --- the hot path --------------------------------------------------------------------------


@dataclass(frozen=True)
class HistogramSnapshot:
    """Bucket counts (not cumulative; the last one is +Inf), their sum and bounds."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return out


class _Histogram:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # bisect_left: a value equal to a bound belongs to that bucket (Prometheus' "le").
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def freeze(self) -> HistogramSnapshot:
        return HistogramSnapshot(self.bounds, tuple(self.counts), self.sum)


class Recorder:
    """The data path's :class:`~fusethrottle.events.Events` and the backend's target observer.

    Called from the event loop only, so plain ints need no lock; each call is a few bytecodes
    because it runs on every FUSE request.
    """

    def __init__(self, meter: TargetMeter | None = None) -> None:
        self.meter = meter
        self.written_bytes = 0
        self.read_bytes = 0
        self.operations: defaultdict[str, int] = defaultdict(int)
        self.target_operations: defaultdict[str, int] = defaultdict(int)
        self.target_errors: defaultdict[tuple[str, int], int] = defaultdict(int)
        self.fsync_duration = {r: _Histogram(FSYNC_BUCKETS) for r in FSYNC_REASONS}
        self.fsync_bytes: dict[str, int] = dict.fromkeys(FSYNC_REASONS, 0)
        self.fsync_errors: dict[str, int] = dict.fromkeys(FSYNC_REASONS, 0)
        self.admission_waits = _Histogram(ADMISSION_BUCKETS)
        self.recent_fsyncs: deque[tuple[float, float]] = deque(maxlen=RECENT_FSYNC_MAX)

    # --- Events ----------------------------------------------------------------------------
    def operation(self, op: str) -> None:
        self.operations[op] += 1

    def target_error(self, op: str, errno: int) -> None:
        self.target_errors[(op, errno)] += 1

    def fsync(self, reason: str, seconds: float, nbytes: int, error: int | None) -> None:
        hist = self.fsync_duration.get(reason)
        if hist is None:  # a reason this module does not know yet: count it all the same
            hist = self.fsync_duration[reason] = _Histogram(FSYNC_BUCKETS)
            self.fsync_bytes[reason] = 0
            self.fsync_errors[reason] = 0
        hist.observe(seconds)
        self.recent_fsyncs.append((time.monotonic(), seconds))
        if error is None:
            self.fsync_bytes[reason] += nbytes
        else:
            self.fsync_errors[reason] += 1
            if reason != "application":  # the application's own fsync came via target_error
                self.target_errors[("fsync", error)] += 1

    def admission_wait(self, seconds: float) -> None:
        self.admission_waits.observe(seconds)

    def bytes_written(self, nbytes: int) -> None:
        self.written_bytes += nbytes

    def bytes_read(self, nbytes: int) -> None:
        self.read_bytes += nbytes

    # --- backend observer ------------------------------------------------------------------
    def target(self, op: str, nbytes: int) -> None:
        self.target_operations[op] += 1
        if self.meter is not None:
            self.meter.record(op, nbytes)


# --- metering -------------------------------------------------------------------------------


class TargetMeter:
    """Feeds every target operation to an EFS-style :class:`~fusethrottle.meter.Meter`."""

    def __init__(self, profile_name: str, overrides: tuple[tuple[str, float], ...] = ()) -> None:
        self.profile_name = profile_name
        self.meter = Meter(meter_profile(profile_name, **dict(overrides)))
        self._classes: dict[str, OpClass] = {}

    def record(self, op: str, nbytes: int) -> None:
        cls = self._classes.get(op)
        if cls is None:
            cls = self._classes[op] = OpClass(op_class(op))
        self.meter.record(cls, nbytes)

    def totals(self) -> dict[str, ClassTotals]:
        snap = self.meter.snapshot()
        return {cls.value: snap[cls] for cls in OpClass}


# --- frozen snapshots ----------------------------------------------------------------------


@dataclass(frozen=True)
class MountFacts:
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
    mode: str
    window: int
    target_window: float | None
    baseline_bytes_per_second: float | None
    recent_bytes_per_second: float | None
    samples: int
    holds: int


@dataclass(frozen=True)
class FsyncRecent:
    """fsync durations of the last RECENT_FSYNC_SPAN seconds, for the status view."""

    samples: int
    p50: float | None
    p99: float | None
    max: float | None


@dataclass(frozen=True)
class Rates:
    """Per-second rates over the last ``span_seconds`` (up to RATE_SPAN)."""

    span_seconds: float = 0.0
    written: float = 0.0
    read: float = 0.0
    synced: float = 0.0
    metered: float = 0.0
    units: float = 0.0


@dataclass(frozen=True)
class Snapshot:
    """Everything a scrape or ``fusethrottle status`` shows, copied at one instant.

    Built on the event loop and never changed afterwards (the dicts are private copies), so any
    thread may read it.
    """

    taken: float  # unix time
    monotonic: float
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
    memory_cgroup: str = ""  # the daemon's own memory cgroup, or why it stayed where it was
    memory_cgroup_own: bool = False
    memory_cgroup_usage_bytes: int | None = None
    memory_cgroup_limit_bytes: int = 0
    page_cache_drops: int = 0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the status socket's answer; docs/METRICS.md describes it)."""
        return asdict(self)


def errno_name(code: int) -> str:
    return errno_mod.errorcode.get(code, f"errno{code}")


def _percentile(ordered: list[float], q: float) -> float | None:
    """Nearest-rank percentile of an ascending list."""
    if not ordered:
        return None
    rank = max(1, min(len(ordered), math.ceil(q * len(ordered))))
    return ordered[rank - 1]


def recent_fsyncs(samples: Iterable[tuple[float, float]], now: float) -> FsyncRecent:
    durations = sorted(s for t, s in samples if now - t <= RECENT_FSYNC_SPAN)
    return FsyncRecent(
        len(durations),
        _percentile(durations, 0.50),
        _percentile(durations, 0.99),
        durations[-1] if durations else None,
    )


def _controller_facts(config: Config, controller: Controller) -> ControllerFacts:
    state = controller.snapshot()
    recent, baseline = state.recent_s_per_mib, state.baseline_s_per_mib
    target = controller.target_window
    return ControllerFacts(
        mode=config.mode,
        window=controller.window,
        target_window=float(target) if target is not None else None,
        baseline_bytes_per_second=MiB / baseline if baseline else None,
        recent_bytes_per_second=MiB / recent if recent else None,
        samples=state.samples,
        holds=state.holds,
    )


class Metrics:
    """One mount's observability: the recorder, the latest snapshot, and who reads it.

    ``publish`` runs on the event loop only; ``latest`` and ``fresh`` may be read anywhere.
    """

    def __init__(self, config: Config, meter: TargetMeter | None = None) -> None:
        self.config = config
        self.meter = meter
        self.recorder = Recorder(meter)
        self.mount: Any = None
        self.started = time.time()
        self.latest: Snapshot | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        # (monotonic, written, read, synced, metered, units), one per PUBLISH_INTERVAL
        self._history: deque[tuple[float, ...]] = deque(
            maxlen=int(RATE_SPAN / PUBLISH_INTERVAL) + 1
        )
        self._failures = 0

    # --- building snapshots (event loop) ---------------------------------------------------
    def publish(self, *, sample: bool = False) -> Snapshot:
        """Copy the live state into a new Snapshot and make it the latest."""
        snap = self._build(trio.current_time(), time.monotonic(), sample)
        self.latest = snap
        return snap

    def _build(self, now: float, mono: float, sample: bool) -> Snapshot:
        rec, mount, config = self.recorder, self.mount, self.config
        ledger = mount.ledger.snapshot(now)
        gate = mount.gate.statistics()
        flusher = mount.flusher.statistics()
        meter = self.meter.totals() if self.meter is not None else {}
        metered = sum(c.metered_bytes for c in meter.values())
        units = sum(c.units for c in meter.values())
        point = (mono, rec.written_bytes, rec.read_bytes, ledger.synced_total, metered, units)
        rates = Rates()
        if self._history:
            first = self._history[0]
            span = mono - first[0]
            if span >= PUBLISH_INTERVAL / 2:
                r = [(b - a) / span for a, b in zip(first[1:], point[1:], strict=True)]
                rates = Rates(span, *r)
        if sample:
            self._history.append(point)
        errors = tuple(
            sorted((op, errno_name(code), n) for (op, code), n in rec.target_errors.items())
        )
        ops = mount.ops
        ceilings = getattr(mount, "ceilings", None)
        ceiling = ceilings.statistics() if ceilings is not None else None
        return Snapshot(
            taken=time.time(),
            monotonic=mono,
            mount=MountFacts.of(config, self.started),
            unsynced_bytes=ledger.unsynced,
            reserved_bytes=ledger.reserved,
            syncing_bytes=ledger.syncing,
            dirty_files=ledger.dirty_files,
            oldest_unsynced_age_seconds=ledger.oldest_age,
            # The bound in force (slow start included), not just what the controller decided.
            window_bytes=int(mount.window()),
            kernel_cache_bytes=mount.kernel_cache.statistics().limit_bytes,
            written_bytes=rec.written_bytes,
            read_bytes=rec.read_bytes,
            synced_bytes=ledger.synced_total,
            failed_syncs=ledger.failed_syncs,
            waiting_writes=gate.waiting,
            throttled_writes=gate.throttled_total,
            admission_timeouts=gate.timeouts_total,
            admission_wait=rec.admission_waits.freeze(),
            fsyncs_in_flight=flusher.in_flight,
            fsync_duration={r: h.freeze() for r, h in rec.fsync_duration.items()},
            fsync_bytes=dict(rec.fsync_bytes),
            fsync_errors=dict(rec.fsync_errors),
            fsync_recent=recent_fsyncs(rec.recent_fsyncs, time.monotonic()),
            controller=_controller_facts(config, mount.controller),
            operations=dict(rec.operations),
            target_operations=dict(rec.target_operations),
            target_errors=errors,
            meter=meter,
            ceiling_delayed=ceiling.delayed_total if ceiling else 0,
            ceiling_delay_seconds=ceiling.delay_seconds_total if ceiling else 0.0,
            rates=rates,
            inodes=len(mount.inodes),
            open_handles=ops.open_handles() if hasattr(ops, "open_handles") else 0,
            **_memory_facts(mount),
        )

    # --- reading snapshots (any thread) ----------------------------------------------------
    def fresh(self, timeout: float = FRESH_WAIT) -> Snapshot | None:
        """Ask the event loop for a new snapshot; after *timeout*, settle for the last one."""
        token = self._token
        if token is None:
            return self.latest
        done = threading.Event()

        def refresh() -> None:  # runs on the loop, outside any task: must never raise
            try:
                self.publish()
            except Exception:
                self._log_failure("building a metrics snapshot")
            finally:
                done.set()

        try:
            token.run_sync_soon(refresh)
        except trio.RunFinishedError:
            return self.latest
        done.wait(timeout)
        return self.latest

    def _log_failure(self, what: str) -> None:
        self._failures += 1
        if self._failures <= 3 or self._failures % 1000 == 0:
            log.exception(
                "internal error %s (failure %d); the mount is unaffected", what, self._failures
            )

    # --- tasks (started by the daemon's nursery) ------------------------------------------
    async def run_publisher(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Publish a snapshot every PUBLISH_INTERVAL (and keep the history behind the rates)."""
        self._token = trio.lowlevel.current_trio_token()
        try:
            self.publish(sample=True)
            task_status.started()
            while True:
                await trio.sleep(PUBLISH_INTERVAL)
                try:
                    self.publish(sample=True)
                except Exception:
                    self._log_failure("publishing metrics")
        finally:
            self._token = None

    def status(self, request: str) -> dict[str, Any]:
        """What the control socket answers (on the event loop, so always fresh)."""
        if request == "tasks":
            return {"tasks": task_tree(), "threads": thread_stacks()}
        return self.publish().to_json()


# --- Prometheus exposition -----------------------------------------------------------------


def families(snap: Snapshot, age: float) -> list[Metric]:
    """The metric families of one snapshot (*age*: seconds since it was taken). Pure."""
    out: dict[str, Metric] = {}

    def family(name: str) -> Metric:
        d = DEFS[name]
        if d.kind == "counter":
            m: Metric = CounterMetricFamily(d.name, d.help, labels=d.labels)
        elif d.kind == "gauge":
            m = GaugeMetricFamily(d.name, d.help, labels=d.labels)
        elif d.kind == "histogram":
            m = HistogramMetricFamily(d.name, d.help, labels=d.labels)
        else:
            m = InfoMetricFamily(d.name, d.help, labels=())
        out[name] = m
        return m

    def value(name: str, v: float | None, *labels: str) -> None:
        m = out.get(name) or family(name)
        if v is not None:
            m.add_metric(list(labels), float(v))

    def hist(name: str, h: HistogramSnapshot, *labels: str) -> None:
        m = out.get(name) or family(name)
        m.add_metric(list(labels), buckets=h.cumulative(), sum_value=h.sum)

    c, facts = snap.controller, snap.mount
    value("fusethrottle_unsynced_bytes", snap.unsynced_bytes)
    value("fusethrottle_window_bytes", snap.window_bytes)
    value("fusethrottle_kernel_cache_bytes", snap.kernel_cache_bytes)
    value("fusethrottle_reserved_bytes", snap.reserved_bytes)
    value("fusethrottle_syncing_bytes", snap.syncing_bytes)
    value("fusethrottle_dirty_files", snap.dirty_files)
    value("fusethrottle_oldest_unsynced_age_seconds", snap.oldest_unsynced_age_seconds)
    value("fusethrottle_batch_bytes", facts.batch)
    value("fusethrottle_window_min_bytes", facts.window_min)
    value("fusethrottle_window_max_bytes", facts.window_max)
    value("fusethrottle_max_age_seconds", facts.max_age)

    value("fusethrottle_written_bytes_total", snap.written_bytes)
    value("fusethrottle_read_bytes_total", snap.read_bytes)
    value("fusethrottle_synced_bytes_total", snap.synced_bytes)
    family("fusethrottle_operations_total")
    for op, n in sorted(snap.operations.items()):
        value("fusethrottle_operations_total", n, op)
    family("fusethrottle_target_operations_total")
    for op, n in sorted(snap.target_operations.items()):
        value("fusethrottle_target_operations_total", n, op)
    family("fusethrottle_target_errors_total")
    for op, name, n in snap.target_errors:
        value("fusethrottle_target_errors_total", n, op, name)

    value("fusethrottle_waiting_writes", snap.waiting_writes)
    value("fusethrottle_throttled_writes_total", snap.throttled_writes)
    value("fusethrottle_admission_timeouts_total", snap.admission_timeouts)
    hist("fusethrottle_admission_wait_seconds", snap.admission_wait)

    for reason, h in snap.fsync_duration.items():
        hist("fusethrottle_fsync_duration_seconds", h, reason)
        value("fusethrottle_fsync_bytes_total", snap.fsync_bytes.get(reason, 0), reason)
        value("fusethrottle_fsync_errors_total", snap.fsync_errors.get(reason, 0), reason)
    value("fusethrottle_fsyncs_in_flight", snap.fsyncs_in_flight)

    for mode in MODES:
        value("fusethrottle_controller_mode", 1 if mode == c.mode else 0, mode)
    value("fusethrottle_controller_target_window_bytes", c.target_window)
    family("fusethrottle_controller_commit_bytes_per_second")
    value(
        "fusethrottle_controller_commit_bytes_per_second", c.baseline_bytes_per_second, "baseline"
    )
    value("fusethrottle_controller_commit_bytes_per_second", c.recent_bytes_per_second, "recent")
    value("fusethrottle_controller_samples_total", c.samples)
    value("fusethrottle_controller_holds_total", c.holds)

    if snap.meter:
        for label in OP_CLASSES:
            t = snap.meter.get(label, ClassTotals())
            value("fusethrottle_metered_operations_total", t.ops, label)
            value("fusethrottle_metered_bytes_total", t.metered_bytes, label)
            value("fusethrottle_efs_units_total", t.units, label)
    value("fusethrottle_metered_limit_bytes_per_second", facts.metered_limit)
    value("fusethrottle_ops_limit_units_per_second", facts.ops_limit)
    value("fusethrottle_ceiling_delayed_operations_total", snap.ceiling_delayed)
    value("fusethrottle_ceiling_delay_seconds_total", snap.ceiling_delay_seconds)

    value("fusethrottle_memory_cgroup_usage_bytes", snap.memory_cgroup_usage_bytes or 0)
    value("fusethrottle_memory_cgroup_limit_bytes", snap.memory_cgroup_limit_bytes)
    value("fusethrottle_page_cache_drops_total", snap.page_cache_drops)
    value("fusethrottle_inodes", snap.inodes)
    value("fusethrottle_open_handles", snap.open_handles)
    value("fusethrottle_snapshot_age_seconds", max(0.0, age))
    family("fusethrottle_build").add_metric([], dict(build_labels()))
    family("fusethrottle_mount").add_metric(
        [],
        {
            "mountpoint": facts.mountpoint,
            "source": facts.source,
            "mode": facts.mode,
            "meter": facts.meter,
        },
    )
    return list(out.values())


@functools.cache
def build_labels() -> dict[str, str]:
    import prometheus_client
    import pyfuse3

    def version(module: Any, dist: str) -> str:
        v = getattr(module, "__version__", None)
        if v:
            return str(v)
        try:
            from importlib.metadata import version as dist_version

            return dist_version(dist)
        except Exception:
            return "unknown"

    return {
        "version": __version__,
        "python": ".".join(map(str, sys.version_info[:3])),
        "pyfuse3": version(pyfuse3, "pyfuse3"),
        "trio": version(trio, "trio"),
        "prometheus_client": version(prometheus_client, "prometheus_client"),
    }


class SnapshotCollector:
    """A prometheus_client collector that serves the latest frozen snapshot, nothing live."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        snap = self.metrics.fresh()
        if snap is None:
            return iter(())
        try:
            return iter(families(snap, time.monotonic() - snap.monotonic))
        except Exception:  # a bug here must cost a scrape, not a traceback per scrape
            self.metrics._log_failure("rendering metrics")
            return iter(())

    def describe(self) -> Iterator[Metric]:
        return iter(())  # no live state to describe; skips a collect() at registration


def make_registry(metrics: Metrics) -> CollectorRegistry:
    """The daemon's own registry (never prometheus_client's global one)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(metrics))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry


class MetricsError(RuntimeError):
    """The endpoint cannot be served; the message is the one line shown to the user."""


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per scrape would flood the journal

    def log_error(self, format: str, *args: Any) -> None:
        log.debug("metrics request: " + format, *args)


class _MetricsServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True  # TIME_WAIT only: a port another process listens on is refused

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver prints a traceback to stderr; a scraper that hangs up is not news.
        log.debug("metrics request from %s failed", client_address, exc_info=True)

    def server_bind(self) -> None:
        # HTTPServer.server_bind asks DNS for the host's FQDN, which can hang; we need no name.
        TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)
        self.setup_environ()


_BIND_HINTS = {
    errno_mod.EADDRINUSE: "address already in use (another process listens on it)",
    errno_mod.EADDRNOTAVAIL: "not an address of this host",
    errno_mod.EACCES: "permission denied (ports below 1024 need root)",
}


def split_address(address: str) -> tuple[str, int]:
    """``"127.0.0.1:9420"``, ``"[::1]:9420"``, ``":9420"`` -> (host, port)."""
    host, _, port = address.rpartition(":")
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "127.0.0.1", int(port)


def bind_endpoint(address: str, registry: CollectorRegistry) -> _MetricsServer:
    """Listen on *address* now (before anything is mounted); serving starts later."""
    host, port = split_address(address)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise MetricsError(
            f"metrics endpoint {address}: cannot resolve {host}: {err.strerror}"
        ) from None
    family, _, _, _, sockaddr = infos[0]
    server_class = type("MetricsServer", (_MetricsServer,), {"address_family": family})
    try:
        server = server_class(sockaddr, _QuietHandler)
    except OSError as err:
        reason = _BIND_HINTS.get(err.errno or 0, err.strerror or str(err))
        raise MetricsError(f"metrics endpoint {address}: {reason}") from None
    server.set_app(make_wsgi_app(registry))
    return server


async def serve_endpoint(
    server: _MetricsServer, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run the HTTP server's thread for as long as this task lives."""
    thread = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": 0.2},
        name="metrics-http",
        daemon=True,
    )
    thread.start()
    host, port = server.server_address[:2]
    log.info("serving metrics on http://%s/metrics", _url_host(str(host), int(port)))
    task_status.started()
    try:
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(server.shutdown)
        server.server_close()


def _url_host(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# --- diagnostics: what is every task and thread doing? -------------------------------------


def _await_frames(coro: Any) -> Iterator[tuple[str, int, str]]:
    """(file, line, function) down a coroutine's await chain (trio 0.22 lacks
    Task.iter_await_frames)."""
    seen = 0
    while coro is not None and seen < 200:
        frame = (
            getattr(coro, "cr_frame", None)
            or getattr(coro, "gi_frame", None)
            or getattr(coro, "ag_frame", None)
        )
        if frame is None:
            return
        yield frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name
        coro = (
            getattr(coro, "cr_await", None)
            or getattr(coro, "gi_yieldfrom", None)
            or getattr(coro, "ag_await", None)
        )
        seen += 1


_TRIO_DIR = os.path.dirname(trio.__file__) + os.sep


def task_tree() -> str:
    """Every trio task, indented under its parent, with where each one waits (event loop)."""
    lines: list[str] = []

    def walk(task: trio.lowlevel.Task, depth: int) -> None:
        pad = "  " * depth
        lines.append(f"{pad}{task.name}")
        for filename, lineno, func in _await_frames(task.coro):
            if _TRIO_DIR not in filename:  # where trio itself waits says nothing new
                lines.append(f"{pad}    {filename}:{lineno} in {func}")
        for nursery in task.child_nurseries:
            for child in nursery.child_tasks:
                walk(child, depth + 1)

    walk(trio.lowlevel.current_root_task(), 0)
    return "\n".join(lines)


def thread_stacks() -> str:
    """Every thread's Python stack (worker threads stuck on the target show up here)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame))
        parts.append(f"thread {names.get(ident, '?')} ({ident}):\n{stack}")
    return "\n".join(parts)


async def run_diagnostics(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """On SIGUSR1, log the trio task tree (faulthandler still dumps every thread's stack).

    daemon.serve registers faulthandler on SIGUSR1, and one signal has one handler. So: take
    faulthandler off, install trio's handler, and put faulthandler back on top of it with
    ``chain=True``: its C handler dumps thread stacks even when the event loop is stuck, then
    passes the signal on to trio, which wakes this task. On exit the original arrangement is
    restored.
    """
    if threading.current_thread() is not threading.main_thread():
        task_status.started()
        return
    had_faulthandler = faulthandler.unregister(signal.SIGUSR1)
    try:
        with trio.open_signal_receiver(signal.SIGUSR1) as signals:
            chained = _register_faulthandler(chain=True)
            task_status.started()
            try:
                async for _ in signals:
                    try:
                        tree = task_tree()
                    except Exception:
                        log.exception("could not walk the trio task tree")
                        continue
                    log.warning("SIGUSR1: trio tasks (thread stacks went to stderr):\n%s", tree)
            finally:
                if chained:
                    faulthandler.unregister(signal.SIGUSR1)
    finally:
        if had_faulthandler:
            _register_faulthandler(chain=False)


def _register_faulthandler(chain: bool) -> bool:
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True, chain=chain)
    except (ValueError, OSError, AttributeError, RuntimeError):  # stderr without a descriptor
        return False
    return True


# --- wiring --------------------------------------------------------------------------------

TaskFactory = Callable[[Any], list[Callable[..., Any]]]


def attach_metrics(config: Config) -> tuple[Recorder, Callable[[str, int], None], TaskFactory]:
    """Build one mount's observability, before anything is mounted.

    Returns ``(events, observer, extra_tasks_factory)`` for daemon.serve. With
    ``-o metrics=HOST:PORT`` the endpoint is bound here, so a bad address or a port in use fails
    the mount (``MetricsError``, a RuntimeError, one line) before pyfuse3.init.
    """
    metrics = Metrics(config, TargetMeter(config.meter, config.meter_overrides))
    server = bind_endpoint(config.metrics, make_registry(metrics)) if config.metrics else None

    def extra_tasks(mount: Any) -> list[Callable[..., Any]]:
        metrics.mount = mount
        tasks: list[Callable[..., Any]] = [metrics.run_publisher]
        if server is not None:
            tasks.append(partial(serve_endpoint, server))
        tasks.append(partial(_serve_status, metrics))
        tasks.append(run_diagnostics)
        return tasks

    return metrics.recorder, metrics.recorder.target, extra_tasks


async def _serve_status(
    metrics: Metrics, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    from .status import serve_control

    await serve_control(metrics.config.mountpoint, metrics.status, task_status=task_status)


def _memory_facts(mount: Any) -> dict[str, Any]:
    """Where the target's page cache is charged, and how much the mount dropped."""
    pages = getattr(mount, "kernel_pages", None)
    out: dict[str, Any] = {"page_cache_drops": pages.dropped_ranges if pages else 0}
    cgroup = getattr(mount, "memory_cgroup", None)
    if cgroup is None:
        return out
    if cgroup.path is not None:
        out |= {
            "memory_cgroup": str(cgroup.path),
            "memory_cgroup_own": True,
            "memory_cgroup_usage_bytes": cgroup.usage(),
            "memory_cgroup_limit_bytes": cgroup.limit,
        }
    else:
        out["memory_cgroup"] = cgroup.reason or "off (memory_cgroup=off)"
    return out
