"""Prometheus families from a snapshot: what a scrape of ``/metrics`` shows.

A custom collector turns the latest frozen :class:`~.snapshot.Snapshot` into metric families at
scrape time, so the scrape thread never touches a live object. Names, types, help texts and
labels come from :data:`~.definitions.DEFS`; which value goes into which series is decided here.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import trio
from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)

from ... import __version__
from ...guard.rule import GuardState
from ...metering.fleet import FleetStatistics
from ...metering.meter import ClassTotals
from ...service.options import MODES
from .definitions import DEFS, OP_CLASSES
from .publisher import Publisher
from .recorder import HistogramSnapshot
from .snapshot import Snapshot

GUARD_STATES = tuple(state.value for state in GuardState)

#: One family of any kind: each kind's add_metric takes its own arguments.
_Family = CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily | InfoMetricFamily


def families(snap: Snapshot, age: float) -> list[Metric]:
    """The metric families of one snapshot (*age*: seconds since it was taken). Pure."""
    out: dict[str, Any] = {}  # name -> _Family, whose add_metric the caller knows by the name

    def family(name: str) -> Any:
        d = DEFS[name]
        if d.kind == "counter":
            m: _Family = CounterMetricFamily(d.name, d.help, labels=d.labels)
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

    if snap.fleet is not None:
        _fleet_families(snap.fleet, value)
    if snap.guard is not None:
        g = snap.guard
        value("fusethrottle_guard_pressure_ratio", g.share)
        value("fusethrottle_guard_line_ratio", g.line)
        value("fusethrottle_guard_allowed_bytes_per_second", g.limit)
        value("fusethrottle_guard_held_back_seconds_total", g.held_seconds)
        for state in GUARD_STATES:
            value("fusethrottle_guard_state", 1 if g.state == state else 0, state)

    value("fusethrottle_memory_cgroup_usage_bytes", snap.memory_cgroup_usage_bytes or 0)
    value("fusethrottle_memory_cgroup_limit_bytes", snap.memory_cgroup_limit_bytes)
    value("fusethrottle_page_cache_drops_total", snap.page_cache_drops)
    value("fusethrottle_inodes", snap.inodes)
    value("fusethrottle_inodes_bound", snap.inodes_bound)
    value("fusethrottle_kernel_names_dropped_total", snap.names_dropped)
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


def _fleet_families(f: FleetStatistics, value: Callable[..., None]) -> None:
    """The fleet budget's series (only on a mount with ``budget=``)."""
    for resource, fleet, share, granted in (
        ("metered_bytes", f.fleet_metered, f.share_metered, f.granted_metered_total),
        ("units", f.fleet_units, f.share_units, f.granted_units_total),
    ):
        value("fusethrottle_budget_rate", fleet, resource)
        value("fusethrottle_budget_share_rate", share, resource)
        value("fusethrottle_budget_granted_total", granted, resource)
    value("fusethrottle_budget_leases_total", f.leases_total)
    value("fusethrottle_budget_round_trips_total", f.round_trips_total)
    value("fusethrottle_budget_errors_total", f.errors_total)
    value("fusethrottle_budget_waited_operations_total", f.waited_total)
    value("fusethrottle_budget_wait_seconds_total", f.wait_seconds_total)
    value("fusethrottle_budget_fallback", 1 if f.fallback else 0)
    value("fusethrottle_budget_fallback_seconds_total", f.fallback_seconds_total)
    value("fusethrottle_budget_active_mounts", f.mounts)


@functools.cache
def build_labels() -> dict[str, str]:
    """The labels of ``fusethrottle_build``; computed once (they cannot change while running)."""
    import prometheus_client

    from ...engine.native import libfuse_version

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
        "libfuse": libfuse_version(),
        "trio": version(trio, "trio"),
        "prometheus_client": version(prometheus_client, "prometheus_client"),
    }


class SnapshotCollector:
    """A prometheus_client collector that serves the latest frozen snapshot, nothing live."""

    def __init__(self, metrics: Publisher) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        snap = self.metrics.fresh()
        if snap is None:
            return iter(())
        try:
            return iter(families(snap, time.monotonic() - snap.monotonic))
        except Exception:  # a bug here must cost a scrape, not a traceback per scrape
            self.metrics.log_failure("rendering metrics")
            return iter(())

    def describe(self) -> Iterator[Metric]:
        return iter(())  # no live state to describe; skips a collect() at registration


def make_registry(metrics: Publisher) -> CollectorRegistry:
    """The daemon's own registry (never prometheus_client's global one)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(metrics))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry
