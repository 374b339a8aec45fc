"""Every series the daemon exports, in one place: name, type, help text and labels.

docs/METRICS.md documents each of them and a test checks that both agree; Grafana dashboards and
alerts depend on these strings, so a name, a label or a help text changes only on purpose.
The bucket bounds and the label values that are fixed in advance live here too, next to the
series that use them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...metering.meter import OpClass

FSYNC_REASONS = ("batch", "window", "age", "release", "application", "unmount")
FSYNC_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0,
)  # fmt: skip
ADMISSION_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)  # fmt: skip
#: The values of the ``class`` label, in the order the exposition lists them.
OP_CLASSES = tuple(c.value for c in OpClass)


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
    # the fleet budget (budget=redis://..., issue 14); only with a budget
    MetricDef("fusethrottle_budget_rate", "gauge",
              "The fleet budget per second, as last read from Redis (0: no limit on it).",
              ("resource",)),
    MetricDef("fusethrottle_budget_share_rate", "gauge",
              "This mount's fair share of the fleet budget per second, at its last lease.",
              ("resource",)),
    MetricDef("fusethrottle_budget_granted_total", "counter",
              "Tokens leased from the fleet budget (metered bytes or EFS units).", ("resource",)),
    MetricDef("fusethrottle_budget_leases_total", "counter",
              "Leases that brought tokens from the fleet budget."),
    MetricDef("fusethrottle_budget_round_trips_total", "counter",
              "Calls to Redis for the fleet budget, failed ones included."),
    MetricDef("fusethrottle_budget_errors_total", "counter",
              "Calls to Redis that failed or timed out."),
    MetricDef("fusethrottle_budget_waited_operations_total", "counter",
              "Requests that waited for this mount's share of the fleet budget."),
    MetricDef("fusethrottle_budget_wait_seconds_total", "counter",
              "Seconds requests waited for this mount's share of the fleet budget."),
    MetricDef("fusethrottle_budget_fallback", "gauge",
              "1 while Redis cannot be reached and the mount runs on its fallback budget."),
    MetricDef("fusethrottle_budget_fallback_seconds_total", "counter",
              "Seconds spent on the fallback budget."),
    MetricDef("fusethrottle_budget_active_mounts", "gauge",
              "Mounts drawing from the fleet budget, this one included, at the last lease."),
    # the pressure guard (guard=); only with a guard
    MetricDef("fusethrottle_guard_pressure_ratio", "gauge",
              "Share of time the protected workload stalled on memory or I/O (PSI some, the "
              "worse of the two) at the guard's last reading."),
    MetricDef("fusethrottle_guard_line_ratio", "gauge",
              "Stall share above which the guard holds the backup back (learned or guard_some)."),
    MetricDef("fusethrottle_guard_allowed_bytes_per_second", "gauge",
              "Rate the guard lets the backup write at (0: no limit from the guard)."),
    MetricDef("fusethrottle_guard_held_back_seconds_total", "counter",
              "Seconds the guard held the backup back."),
    MetricDef("fusethrottle_guard_state", "gauge",
              "1 for the guard's state (learning, open or holding).", ("state",)),
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
    MetricDef("fusethrottle_inodes_bound", "gauge",
              "Past this many inodes the daemon asks the kernel to drop the oldest names it "
              "holds (three quarters of the descriptor limit)."),
    MetricDef("fusethrottle_kernel_names_dropped_total", "counter",
              "Names the daemon asked the kernel to drop to stay within its descriptors."),
    MetricDef("fusethrottle_open_handles", "gauge",
              "Open file and directory handles."),
    MetricDef("fusethrottle_snapshot_age_seconds", "gauge",
              "Age of the numbers in this scrape; above ~1 s the event loop is not answering."),
    MetricDef("fusethrottle_build", "info",
              "Versions of fusethrottle and the libraries it runs on.",
              ("version", "python", "libfuse", "trio", "prometheus_client")),
    MetricDef("fusethrottle_mount", "info",
              "The mount this daemon serves.", ("mountpoint", "source", "mode", "meter")),
)  # fmt: skip


def exported_names() -> list[str]:
    """Every series name as it appears in a scrape (counters with _total, infos with _info)."""
    out = []
    for d in DEFS.values():
        out.append(d.name + "_info" if d.kind == "info" else d.name)
    return out
