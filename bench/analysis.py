"""Turn one arm's raw records into the numbers the report compares.

Definitions (bench/README.md explains them to users):
- app MiB/s: bytes the backup wrote / its wall time. What the tool reports; flattering when
  the page cache swallows the data.
- target MiB/s: bytes the target absorbed (device sectors or NFS bytes) / time from the writer's
  start until the data is durable (writer done, daemon flushed and exited, syncfs returned).
- Dirty+Writeback: host-wide /proc/meminfo, peak over the arm and growth over its baseline.
- victim p50/p99/max: the neighbour's operations that started while the arm ran.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from bench.plan import GiB, MiB
from bench.sampler import MetricsSnapshot
from bench.stats import finite, percentile


def _peak(rows: Sequence[dict], key: str | tuple[str, ...]) -> float | None:
    keys = (key,) if isinstance(key, str) else key
    vals = []
    for r in rows:
        parts = [r.get(k) for k in keys]
        if all(p is not None for p in parts):
            vals.append(sum(p for p in parts if p is not None))
    return max(vals) if vals else None


def _mean(values: Sequence[float]) -> float | None:
    vals = finite(values)
    return sum(vals) / len(vals) if vals else None


def mib(value: float | None) -> float | None:
    return None if value is None else value / MiB


def victim_stats(ops: Sequence[tuple[float, float]], t_from: float, t_to: float) -> dict:
    """The neighbour over [t_from, t_to]: p50/p99/max latency of the operations that started
    in it, its throughput, and how long it went without finishing anything (a database that
    commits nothing for a second is down for that second, whatever its percentiles say)."""
    lat = sorted(latency for t, latency in ops if t_from <= t <= t_to)
    if not lat:
        return {"victim_ops": 0}
    done = sorted(t + latency for t, latency in ops if t_from <= t + latency <= t_to)
    seconds = max(1, int(t_to - t_from))
    busy = {int(t - t_from) for t in done}
    gaps = [b - a for a, b in zip([t_from, *done], [*done, t_to], strict=True)]
    return {
        "victim_ops": len(lat),
        "victim_ops_per_s": len(done) / (t_to - t_from) if t_to > t_from else None,
        "victim_p50_ms": percentile(lat, 50) * 1e3,
        "victim_p99_ms": percentile(lat, 99) * 1e3,
        "victim_max_ms": lat[-1] * 1e3,
        "victim_over_100ms": sum(1 for v in lat if v > 0.1),
        "victim_over_500ms": sum(1 for v in lat if v > 0.5),
        # whole seconds of the arm in which no operation completed
        "victim_dead_seconds": sum(1 for k in range(seconds) if k not in busy),
        "victim_longest_gap_ms": max(gaps) * 1e3,
    }


def probe_stats(ops: Sequence[tuple[float, str, float]]) -> dict:
    """How long stat and readdir on the mount took while the backup ran (bench.prober)."""
    out: dict[str, float | int] = {}
    for op in ("stat", "readdir"):
        lat = sorted(latency for _, kind, latency in ops if kind == op)
        if lat:
            out[f"probe_{op}_ops"] = len(lat)
            out[f"probe_{op}_p99_ms"] = percentile(lat, 99) * 1e3
            out[f"probe_{op}_max_ms"] = lat[-1] * 1e3
    return out


def histogram_quantile(buckets: dict[float, float], q: float) -> float | None:
    """Upper bound of the bucket holding quantile q of a cumulative Prometheus histogram."""
    if not buckets:
        return None
    total = max(buckets.values())
    if total <= 0:
        return None
    for bound in sorted(buckets):
        if buckets[bound] >= q * total:
            return bound
    return math.inf


def metrics_stats(snaps: Sequence[MetricsSnapshot], t_from: float, t_to: float) -> dict:
    """fusethrottle's own view over the arm: peak un-synced, window, fsync latency."""
    inside = [s for s in snaps if t_from <= s.t <= t_to]
    if not inside:
        return {}
    out: dict[str, float | None] = {
        "ft_unsynced_peak_mib": mib(_peak([{"u": s.unsynced} for s in inside], "u")),
        "ft_window_mean_mib": mib(_mean([s.window for s in inside if s.window is not None])),
        "ft_window_min_mib": mib(
            min((s.window for s in inside if s.window is not None), default=None)
        ),
    }
    first = next((s for s in snaps if s.fsync_count is not None), None)
    last = next((s for s in reversed(snaps) if s.fsync_count is not None), None)
    if first is not None and last is not None and last.fsync_count is not None:
        base_count = first.fsync_count if first.t < t_from else 0.0
        base_sum = (first.fsync_sum or 0.0) if first.t < t_from else 0.0
        count = last.fsync_count - (base_count or 0.0)
        out["ft_fsyncs"] = count
        if count > 0 and last.fsync_sum is not None:
            out["ft_fsync_mean_ms"] = (last.fsync_sum - base_sum) / count * 1e3
        if last.throttled is not None and first.throttled is not None:
            out["ft_throttled_writes"] = last.throttled - (
                first.throttled if first.t < t_from else 0
            )
        p99 = histogram_quantile(last.fsync_buckets, 0.99)
        if p99 is not None:
            out["ft_fsync_p99_le_ms"] = p99 * 1e3
    return out


def sample_stats(rows: Sequence[dict], t_from: float, t_to: float) -> dict:
    """Dirty memory over the arm (rows hold absolute monotonic ``t``)."""
    before = [r for r in rows if r["t"] < t_from]
    inside = [r for r in rows if t_from <= r["t"] <= t_to]
    if not inside:
        return {}
    base = _peak(before[-1:], ("dirty", "writeback")) if before else None
    peak = _peak(inside, ("dirty", "writeback"))
    out = {
        "dirty_wb_peak_mib": mib(peak),
        "dirty_wb_base_mib": mib(base),
        "dirty_wb_growth_mib": mib(peak - base) if peak is not None and base is not None else None,
        "dirty_wb_mean_mib": mib(
            _mean(
                [
                    (r["dirty"] or 0) + (r["writeback"] or 0)
                    for r in inside
                    if r["dirty"] is not None
                ]
            )
        ),
        # Dirty and Writeback apart: on NFS a page written to the server but not yet committed
        # by it (the old NFS_Unstable, which reads 0 since Linux 5.8) counts as Writeback.
        "dirty_peak_mib": mib(_peak(inside, "dirty")),
        "writeback_peak_mib": mib(_peak(inside, "writeback")),
        "machine_busy_pct": _mean(
            [r["machine_busy"] * 100 for r in inside if r["machine_busy"] is not None]
        ),
    }
    cg = _peak(inside, ("cg_dirty", "cg_writeback"))
    if cg is not None:
        out["cg_dirty_wb_peak_mib"] = mib(cg)
        out["cg_usage_peak_mib"] = mib(_peak(inside, "cg_usage"))
        out["cg_writeback_peak_mib"] = mib(_peak(inside, "cg_writeback"))
        out["cg_dirty_peak_mib"] = mib(_peak(inside, "cg_dirty"))
    out |= cache_split(inside)
    return out


def cache_split(inside: Sequence[dict]) -> dict:
    """The shared cgroup's page cache split into the victim's (its files, by mincore) and the
    rest, which is the backup's (FUSE and target pages charged to the cgroup); at its peak and
    in the last sample (after the data is durable: what the backup leaves behind)."""
    rows = [
        r for r in inside if r.get("cg_cache") is not None and r.get("victim_cached") is not None
    ]
    if not rows:
        return {}
    backup = [max(0, r["cg_cache"] - r["victim_cached"]) for r in rows]
    out = {
        "cg_backup_cached_peak_mib": mib(max(backup)),
        "cg_backup_cached_end_mib": mib(backup[-1]),
        "victim_cached_min_mib": mib(min(r["victim_cached"] for r in rows)),
        "victim_cached_end_mib": mib(rows[-1]["victim_cached"]),
    }
    if rows[-1].get("target_cached") is not None:
        out["target_cached_end_mib"] = mib(rows[-1]["target_cached"])
    return out


def rate(nbytes: float | None, seconds: float | None) -> float | None:
    if nbytes is None or not seconds or seconds <= 0 or not math.isfinite(seconds):
        return None
    return nbytes / MiB / seconds


def cpu_per_gib(cpu_s: float | None, nbytes: float) -> float | None:
    if cpu_s is None or nbytes <= 0:
        return None
    return cpu_s / (nbytes / GiB)
