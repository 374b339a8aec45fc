"""``fusethrottle status`` for a mount served by the native engine: the window, the gate, the
injected fsyncs and the controller, from the engine's statistics and the fsyncs it reported.

The Python data plane's answer (metrics/snapshot.py) also carries metering, ceilings, the fleet
and per-operation errors, which the engine does not count yet; this answer says
``"engine": "native"`` and carries only what it knows, under the same names where the two
overlap (``unsynced_bytes``, ``window_bytes``, ``controller`` ...), so scripts that read those
work on both. :func:`native_status` is pure; :class:`FsyncLog` keeps the recent durations.
"""

from __future__ import annotations

import os
from collections import Counter, deque
from dataclasses import asdict
from typing import Any

from ..engine.native import EngineStats
from ..service.options import Config
from ..stats import percentile
from ..window.controller import Controller
from .metrics.snapshot import RECENT_FSYNC_SPAN, ControllerFacts
from .status_view import fmt_bytes, fmt_fsync_recent, fmt_rate, fmt_seconds

#: Recent fsync durations kept at most (a span's worth at a few hundred a second).
FSYNC_LOG_MAX = 65536


class FsyncLog:
    """The injected fsyncs' durations of the last RECENT_FSYNC_SPAN seconds, and counts by
    reason since the start."""

    def __init__(self) -> None:
        self.recent: deque[tuple[float, float]] = deque(maxlen=FSYNC_LOG_MAX)
        self.by_reason: Counter[str] = Counter()

    def add(self, at: float, seconds: float, reason: str) -> None:
        self.recent.append((at, seconds))
        self.by_reason[reason] += 1

    def summary(self, now: float) -> dict[str, Any]:
        durations = sorted(s for at, s in self.recent if now - at <= RECENT_FSYNC_SPAN)
        return {
            "samples": len(durations),
            "p50": percentile(durations, 0.5),
            "p99": percentile(durations, 0.99),
            "max": durations[-1] if durations else None,
        }


def capability_question(stats: EngineStats) -> str:
    """How often the kernel asks security.capability before a write (the Python data plane's
    phrases): what small writes cost."""
    if not stats.xattrs:
        return "never (xattrs not served)"
    if stats.killpriv_v2:
        return "once per file (FUSE_HANDLE_KILLPRIV_V2)"
    return "before every write()"


def native_status(
    config: Config,
    started: float,
    stats: EngineStats,
    controller: Controller,
    total_window: int,
    kernel_cache_bytes: int,
    fsyncs: FsyncLog,
    now: float,
) -> dict[str, Any]:
    """The JSON answer of a native mount (*now* on the clock of the fsyncs' ``at``)."""
    return {
        "engine": "native",
        "mount": {
            "mountpoint": config.mountpoint,
            "source": config.source,
            "mode": config.mode,
            "batch": config.batch,
            "window_min": config.window_min,
            "window_max": config.window_max,
            "max_age": config.max_age,
            "pid": os.getpid(),
            "started": started,
        },
        "controller": asdict(ControllerFacts.of(config.mode, controller)),
        # As the Python data plane's: the bound on everything un-synced (slow start included),
        # the kernel's share of it, and what the gate admits to the target.
        "window_bytes": total_window,
        "kernel_cache_bytes": kernel_cache_bytes,
        "target_window_bytes": stats.window_bytes,
        "unsynced_bytes": stats.unsynced_bytes,
        "unsynced_high_bytes": stats.unsynced_high,
        "reserved_bytes": stats.reserved_bytes,
        "syncing_bytes": stats.syncing_bytes,
        "dirty_files": stats.dirty_files,
        "oldest_unsynced_age_seconds": stats.oldest_age,
        "written_bytes": stats.written_bytes,
        "synced_bytes": stats.synced_bytes,
        "fsyncs_total": stats.fsyncs,
        "fsync_errors_total": stats.fsync_errors,
        "fsyncs_in_flight": stats.fsyncs_in_flight,
        "fsyncs_by_reason": dict(fsyncs.by_reason),
        "fsync_recent": fsyncs.summary(now),
        "waiting_writes": stats.waiting_writes,
        "throttled_writes": stats.throttled_writes,
        "paced_writes": stats.paced_writes,
        "admission_timeouts": stats.admission_timeouts,
        "admission_wait_seconds_total": stats.admission_wait_seconds,
        "inodes": stats.known_files,
        "writeback_cache": stats.writeback_cache,
        "events_dropped": stats.events_dropped,
        "operations": dict(stats.operations),
        "capability_question": capability_question(stats),
    }


def format_native_status(s: dict[str, Any], now: float) -> str:
    """The human view of a native mount's answer (*now*: unix time)."""
    m, c, fr = s["mount"], s["controller"], s["fsync_recent"]
    window = s["target_window_bytes"] or 1
    lines = [
        f"fusethrottle on {m['mountpoint']} (source {m['source']}), pid {m['pid']}, up "
        f"{fmt_seconds(max(0.0, now - m['started']))}, mode {m['mode']}, native engine",
        f"  un-synced    {fmt_bytes(s['unsynced_bytes'])} of {fmt_bytes(s['target_window_bytes'])}"
        f" admitted to the target ({100.0 * s['unsynced_bytes'] / window:.0f}%), "
        f"{s['dirty_files']} file(s), oldest "
        f"{fmt_seconds(s['oldest_unsynced_age_seconds']) if s['dirty_files'] else '-'}; "
        f"at most {fmt_bytes(s['unsynced_high_bytes'])} so far",
    ]
    if s["kernel_cache_bytes"]:
        lines.append(
            f"               + up to {fmt_bytes(s['kernel_cache_bytes'])} in the kernel's cache of "
            f"this mount: window {fmt_bytes(s['window_bytes'])} in all"
        )
    lines.append(
        f"               in flight to target {fmt_bytes(s['reserved_bytes'])}, being synced "
        f"{fmt_bytes(s['syncing_bytes'])}; batch {fmt_bytes(m['batch'])}, max_age "
        f"{fmt_seconds(m['max_age'])}"
    )
    lines.append(
        f"  totals       written {fmt_bytes(s['written_bytes'])}, synced "
        f"{fmt_bytes(s['synced_bytes'])}"
    )
    recent = fmt_fsync_recent(fr)
    by_reason = ", ".join(f"{r} {n}" for r, n in sorted(s["fsyncs_by_reason"].items()))
    lines.append(
        f"  fsync        {recent}; {s['fsyncs_in_flight']} in flight, "
        f"{s['fsync_errors_total']} failed"
    )
    lines.append(f"               by reason: {by_reason or 'none yet'}")
    lines.append(
        f"  admission    {s['waiting_writes']} write(s) waiting now; {s['throttled_writes']} "
        f"throttled, {s['paced_writes']} paced, {s['admission_timeouts']} timed out, "
        f"{fmt_seconds(s['admission_wait_seconds_total'])} waited in all"
    )
    ctl = f"window {fmt_bytes(c['window'])}"
    if c["mode"] == "adaptive":
        ctl += f" in [{fmt_bytes(m['window_min'])}, {fmt_bytes(m['window_max'])}]"
    lines.append(f"  controller   {c['mode']}: {ctl}")
    if c["baseline_bytes_per_second"] or c["recent_bytes_per_second"]:
        lines.append(
            f"               commit rate best {fmt_rate(c['baseline_bytes_per_second'])}, recent "
            f"{fmt_rate(c['recent_bytes_per_second'])}; {c['samples']} samples, "
            f"{c['holds']} halvings"
        )
    ops = sorted(s["operations"].items(), key=lambda kv: -kv[1])
    served = ", ".join(f"{op} {n}" for op, n in ops[:8]) or "none yet"
    lines.append(f"  requests     {sum(s['operations'].values())} served: {served}")
    lines.append(f"               security.capability asked {s['capability_question']}")
    lines.append(
        f"  daemon       {s['inodes']} inodes held; writeback cache "
        f"{'on' if s['writeback_cache'] else 'off'}; metering, ceilings and metrics: not on "
        "the native engine yet"
    )
    return "\n".join(lines)
