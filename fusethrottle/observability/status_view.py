"""The human view of a status answer: what ``fusethrottle status`` prints, and nothing else.

Pure functions of the JSON document the daemon sends (a Snapshot, see docs/METRICS.md), kept
apart from the socket code so the screen can be tested, and changed, without a daemon. The
layout is documented in docs/METRICS.md; tests/test_status.py checks it against that example.
"""

from __future__ import annotations

import time
from typing import Any

from ..names import shown as shown_path


def fmt_bytes(n: float | None) -> str:
    """Binary units, as the window and batch options are given; "-" for not known."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} PiB"  # pragma: no cover


def fmt_rate(n: float | None) -> str:
    return "-" if n is None else fmt_bytes(n) + "/s"


def fmt_seconds(s: float | None) -> str:
    """Milliseconds to days in a few characters: fsyncs take ms, a mount is up for days."""
    if s is None:
        return "-"
    if s < 1:
        return f"{s * 1000:.0f} ms" if s >= 0.0095 else f"{s * 1000:.1f} ms"
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    if s < 86400:
        return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    return f"{int(s // 86400)}d{int(s % 86400 // 3600):02d}h"


def fmt_count(n: float) -> str:
    """Operations and metering units: decimal prefixes, they are counts, not bytes."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}" if float(n).is_integer() else f"{n:.1f}"


def fmt_fsync_recent(fr: dict[str, Any]) -> str:
    """The last 5 minutes' fsync durations (a ``fsync_recent`` answer), in one phrase."""
    if not fr["samples"]:
        return "none in the last 5 min"
    return (
        f"p50 {fmt_seconds(fr['p50'])}, p99 {fmt_seconds(fr['p99'])}, max "
        f"{fmt_seconds(fr['max'])} ({fr['samples']} in 5 min)"
    )


def _bucket_quantile(hist: dict[str, Any], q: float) -> float | None:
    """Upper bound of the histogram bucket holding quantile *q* (None: no samples)."""
    counts = hist.get("counts") or []
    total = sum(counts)
    if not total:
        return None
    running = 0
    for bound, n in zip([*hist.get("bounds", []), float("inf")], counts, strict=False):
        running += n
        if running >= q * total:
            return bound
    return float("inf")


def format_status(s: dict[str, Any], now: float | None = None) -> str:
    """The human view of one status answer (a Snapshot as JSON)."""
    now = time.time() if now is None else now
    m, c, r, fr = s["mount"], s["controller"], s["rates"], s["fsync_recent"]
    window = s["window_bytes"] or 1
    lines = [
        f"fusethrottle on {shown_path(m['mountpoint'])} "
        f"(source {shown_path(m['source'])}), pid {m['pid']}, "
        f"up {fmt_seconds(max(0.0, now - m['started']))}, mode {m['mode']}",
    ]
    used = 100.0 * s["unsynced_bytes"] / window
    oldest = fmt_seconds(s["oldest_unsynced_age_seconds"]) if s["dirty_files"] else "-"
    lines.append(
        f"  un-synced    {fmt_bytes(s['unsynced_bytes'])} of {fmt_bytes(s['window_bytes'])} "
        f"window ({used:.0f}%), {s['dirty_files']} file(s), oldest {oldest}"
    )
    commit_rate = c["recent_bytes_per_second"]
    if s["unsynced_bytes"] and commit_rate:
        lines[-1] += f"; drains in ~{fmt_seconds(s['unsynced_bytes'] / commit_rate)}"
    if s.get("kernel_cache_bytes"):
        lines.append(
            f"               + up to {fmt_bytes(s['kernel_cache_bytes'])} in the kernel's cache "
            "of this mount (writeback cache), part of the window"
        )
    lines.append(
        f"               in flight to target {fmt_bytes(s['reserved_bytes'])}, being synced "
        f"{fmt_bytes(s['syncing_bytes'])}; batch {fmt_bytes(m['batch'])}, "
        f"max_age {fmt_seconds(m['max_age'])}"
    )
    span = f"last {r['span_seconds']:.0f} s" if r["span_seconds"] else "no history yet"
    lines.append(
        f"  throughput   write {fmt_rate(r['written'])}, read {fmt_rate(r['read'])}, "
        f"synced {fmt_rate(r['synced'])} ({span})"
    )
    lines.append(
        f"  totals       written {fmt_bytes(s['written_bytes'])}, read "
        f"{fmt_bytes(s['read_bytes'])}, synced {fmt_bytes(s['synced_bytes'])}"
    )
    durations = s["fsync_duration"]
    by_reason = ", ".join(
        f"{reason} {sum(h['counts'])}" for reason, h in durations.items() if sum(h["counts"])
    )
    errors = sum(s["fsync_errors"].values())
    recent = fmt_fsync_recent(fr)
    lines.append(f"  fsync        {recent}; {s['fsyncs_in_flight']} in flight, {errors} failed")
    lines.append(f"               by reason: {by_reason or 'none yet'}")
    wait_p99 = _bucket_quantile(s["admission_wait"], 0.99)
    if wait_p99 is None:
        wait_text = ""
    elif wait_p99 == float("inf"):
        wait_text = f", p99 wait > {fmt_seconds(s['admission_wait']['bounds'][-1])}"
    else:
        wait_text = f", p99 wait <= {fmt_seconds(wait_p99)}"
    lines.append(
        f"  admission    {s['waiting_writes']} write(s) waiting now; {s['throttled_writes']} "
        f"throttled{wait_text}, {s['admission_timeouts']} timed out"
    )
    ctl = f"window {fmt_bytes(c['window'])}"
    if c["mode"] == "adaptive":
        ctl += f" in [{fmt_bytes(m['window_min'])}, {fmt_bytes(m['window_max'])}]"
    if c["target_window"] is not None:
        ctl += f", target {fmt_bytes(c['target_window'])}"
    lines.append(f"  controller   {c['mode']}: {ctl}")
    measured = f"{c['samples']} samples, {c['holds']} halvings"
    if c["baseline_bytes_per_second"] or c["recent_bytes_per_second"]:
        measured = (
            f"commit rate best {fmt_rate(c['baseline_bytes_per_second'])}, recent "
            f"{fmt_rate(c['recent_bytes_per_second'])}; {measured}"
        )
    lines.append(f"               {measured}")
    meter = s["meter"]
    if meter is not None:
        metered = sum(t["metered_bytes"] for t in meter.values())
        units = sum(t["units"] for t in meter.values())
        lines.append(
            f"  meter        {m['meter']}: metered {fmt_bytes(metered)} "
            f"({fmt_rate(r['metered'])}), {fmt_count(units)} units ({fmt_count(r['units'])}/s)"
        )
        for label, t in meter.items():
            if t["ops"]:
                lines.append(
                    f"               {label:<11}{fmt_count(t['ops']):>8} ops "
                    f"{fmt_bytes(t['bytes']):>11} {fmt_bytes(t['metered_bytes']):>11} metered "
                    f"{fmt_count(t['units']):>8} units"
                )
    ceilings = _ceilings(m, r)
    if s["ceiling_delayed"]:
        ceilings += (
            f"; {s['ceiling_delayed']} request(s) delayed, "
            f"{fmt_seconds(s['ceiling_delay_seconds'])} in all"
        )
    lines.append(f"  ceilings     {ceilings}")
    if s.get("schedule"):
        lines.append(f"  schedule     {s['schedule']}")
    if s.get("fleet"):
        lines += _fleet_lines(s["fleet"])
    if s.get("guard"):
        lines.append(_guard_line(s["guard"]))
    for i, change in enumerate(s.get("settings_changed") or ()):
        lines.append(f"  {'changed' if i == 0 else '':<12} {change}")
    target_errors = s["target_errors"]
    if target_errors:
        shown = ", ".join(f"{op} {name} x{n}" for op, name, n in target_errors[:8])
        more = f" (+{len(target_errors) - 8} more)" if len(target_errors) > 8 else ""
        lines.append(f"  errors       {shown}{more}")
    else:
        lines.append("  errors       none from the target")
    lines += _memory_lines(s)
    lines.append(
        f"  daemon       {s['inodes']} inodes held (bound {s.get('inodes_bound', 0)}, "
        f"{s.get('names_dropped', 0)} names handed back to the kernel), "
        f"{s['open_handles']} open handles; "
        f"metrics {'http://' + m['metrics'] + '/metrics' if m['metrics'] else 'off'}"
    )
    if s.get("capability_question"):
        lines.append(f"               security.capability asked {s['capability_question']}")
    if s.get("passthrough"):
        lines.append(f"               reads: kernel passthrough {s['passthrough']}")
    return "\n".join(lines)


def _memory_lines(s: dict[str, Any]) -> list[str]:
    """Where the target's page cache is charged, and what the mount dropped once synced."""
    if s.get("memory_cgroup_own"):
        usage = s.get("memory_cgroup_usage_bytes")
        used = fmt_bytes(usage) if usage is not None else "?"
        first = (
            f"  memory       target's cache charged to {s['memory_cgroup']} ({used} of "
            f"{fmt_bytes(s['memory_cgroup_limit_bytes'])})"
        )
    else:
        why = s.get("memory_cgroup") or "started there"
        first = f"  memory       in the cgroup it started in: {why}"
    first = first if len(first) <= 110 else first[:107] + "..."
    drops = s.get("page_cache_drops", 0)
    lines = [first]
    if s.get("target_writes_uncached"):
        lines.append("               writes leave no page in the target's cache (O_DIRECT)")
    lines.append(f"               {drops} synced range(s) dropped from the page cache")
    return lines


def _ceilings(m: dict[str, Any], r: dict[str, Any]) -> str:
    """Each configured ceiling with how much of it the last seconds used."""
    parts = []
    if m["metered_limit"]:
        used = 100.0 * r["metered"] / m["metered_limit"]
        parts.append(f"metered {fmt_rate(m['metered_limit'])} ({used:.0f}% used)")
    else:
        parts.append("metered none")
    if m["ops_limit"]:
        used = 100.0 * r["units"] / m["ops_limit"]
        parts.append(f"ops {fmt_count(m['ops_limit'])} units/s ({used:.0f}% used)")
    else:
        parts.append("ops none")
    return ", ".join(parts)


def _guard_line(g: dict[str, Any]) -> str:
    """The pressure guard (guard=): what it protects, the stall it sees and what it allows."""
    if g["state"] == "holding":
        doing = f"HOLDING the backup to {fmt_rate(g['limit'])}"
    elif g["state"] == "learning":
        doing = "learning the idle pressure"
    else:
        doing = "open (no limit)"
    wake = "triggers" if g["triggers"] else "polling"
    return (
        f"  guard        {g['protects']}: {doing}; stalled {g['share'] * 100:.1f}% "
        f"(line {g['line'] * 100:.1f}%), held back {fmt_seconds(g['held_seconds'])} in all; "
        f"{wake}"
    )


def _fleet_lines(f: dict[str, Any]) -> list[str]:
    """The fleet budget (budget=redis://...): the fleet's rate, this mount's share, fallback."""

    def rates(metered: float, units: float) -> str:
        parts = []
        if metered:
            parts.append(f"{fmt_rate(metered)} metered")
        if units:
            parts.append(f"{fmt_count(units)} units/s")
        return ", ".join(parts) or "not known yet"

    lines = [
        f"  fleet        {f['budget']}: {rates(f['fleet_metered'], f['fleet_units'])} "
        f"for {f['mounts']} mount(s)",
        f"               this mount: weight {f['weight']:g}, share "
        f"{rates(f['share_metered'], f['share_units'])}; {f['leases_total']} leases in "
        f"{f['round_trips_total']} round trips, {f['errors_total']} failed",
    ]
    if f["fallback"]:
        pace = rates(f["pace_metered"], f["pace_units"])
        lines.append(
            f"               ON FALLBACK ({f['fallback_reason']}): pacing at "
            f"{pace if pace != 'not known yet' else 'no fleet limit'}"
        )
    lines.append(
        f"               waited {f['waited_total']} request(s), "
        f"{fmt_seconds(f['wait_seconds_total'])} in all; "
        f"{fmt_seconds(f['fallback_seconds_total'])} on fallback"
    )
    return lines
