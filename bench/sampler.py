"""Sampling every 250 ms: the kernel's dirty memory, the shared cgroup's page cache and how much
of it is the victim's, what the target absorbed, what the writer wrote, and — when the daemon
serves metrics — fusethrottle's own window and un-synced bytes.

Two threads: the sampler reads only local files (/proc, /sys) and never blocks for long; the
metrics scraper talks HTTP to the daemon with a short timeout, so a daemon stuck on a hung target
can never delay or gap the memory samples.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.system import cpu_times, meminfo, process_cpu_seconds, process_wchar

log = logging.getLogger(__name__)

# Columns of samples.csv, in order. Bytes unless named otherwise; t is seconds since the
# writer started (negative during the lead-in).
COLUMNS = (
    "t",
    "dirty",
    "writeback",
    "writeback_tmp",
    "nfs_unstable",
    "cg_dirty",
    "cg_writeback",
    "cg_usage",
    "cg_cache",
    "victim_cached",
    "target_cached",
    "absorbed",
    "app_written",
    "writer_pid",
    "daemon_cpu_s",
    "machine_busy",
    "ft_unsynced",
    "ft_window",
    "ft_fsyncs",
    "ft_fsync_seconds",
    "ft_synced",
    "ft_fsync_buckets",
)

_SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LE_RE = re.compile(r'le="([^"]+)"')


@dataclass
class MetricsSnapshot:
    """What one scrape of fusethrottle's Prometheus endpoint said, summed over labels."""

    t: float
    unsynced: float | None = None
    window: float | None = None
    fsync_count: float | None = None
    fsync_sum: float | None = None
    fsync_buckets: dict[float, float] = field(default_factory=dict)
    synced: float | None = None
    throttled: float | None = None


def parse_metrics(text: str, t: float) -> MetricsSnapshot:
    """Pick our series out of the Prometheus text format.

    Names per issue 6: fusethrottle_unsynced_bytes and fusethrottle_window_bytes (gauges) and an
    fsync duration histogram (any fusethrottle_fsync*_seconds family), summed over its labels
    (the reason: batch, window, age, ...).
    """
    snap = MetricsSnapshot(t)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE_RE.match(line)
        if not m:
            continue
        name, labels, raw = m.groups()
        try:
            value = float(raw)
        except ValueError:
            continue
        if name == "fusethrottle_unsynced_bytes":
            snap.unsynced = (snap.unsynced or 0.0) + value
        elif name == "fusethrottle_window_bytes":
            snap.window = (snap.window or 0.0) + value
        elif name == "fusethrottle_synced_bytes_total":
            snap.synced = (snap.synced or 0.0) + value
        elif name == "fusethrottle_throttled_writes_total":
            snap.throttled = (snap.throttled or 0.0) + value
        elif name.startswith("fusethrottle_fsync") and "_seconds" in name:
            if name.endswith("_seconds_count"):
                snap.fsync_count = (snap.fsync_count or 0.0) + value
            elif name.endswith("_seconds_sum"):
                snap.fsync_sum = (snap.fsync_sum or 0.0) + value
            elif name.endswith("_seconds_bucket") and labels:
                le = _LE_RE.search(labels)
                if le:
                    bound = math.inf if le.group(1) == "+Inf" else float(le.group(1))
                    snap.fsync_buckets[bound] = snap.fsync_buckets.get(bound, 0.0) + value
    return snap


def format_buckets(buckets: dict[float, float]) -> str | None:
    """A cumulative histogram as one CSV cell: ``le:count`` pairs joined by ``;``."""
    if not buckets:
        return None
    return ";".join(f"{le:g}:{count:g}" for le, count in sorted(buckets.items()))


def parse_buckets(text: str | None) -> dict[float, float]:
    """The inverse of format_buckets (``inf`` for +Inf)."""
    out: dict[float, float] = {}
    for pair in (text or "").split(";"):
        if ":" in pair:
            le, count = pair.split(":", 1)
            out[float(le)] = float(count)
    return out


class MetricsScraper:
    """Polls a Prometheus text endpoint; keeps every snapshot. Silent when nothing answers."""

    def __init__(self, url: str, interval: float) -> None:
        self.url = url
        self.interval = interval
        self.snapshots: list[MetricsSnapshot] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="scrape")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def latest(self, max_age: float) -> MetricsSnapshot | None:
        snaps = self.snapshots
        if snaps and time.monotonic() - snaps[-1].t <= max_age:
            return snaps[-1]
        return None

    def _loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                with urllib.request.urlopen(self.url, timeout=min(1.0, self.interval * 2)) as r:
                    body = r.read().decode("utf-8", "replace")
                self.snapshots.append(parse_metrics(body, time.monotonic()))
            except (OSError, urllib.error.URLError, ValueError):
                self.errors += 1
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - t0)))


class Sampler:
    """One row every ``interval`` seconds until stopped; rows are dicts keyed by COLUMNS."""

    def __init__(
        self,
        interval: float,
        absorbed: Callable[[], int | None],
        cgroup_stat: Callable[[], dict[str, int]] | None = None,
        daemon_pid: int | None = None,
        metrics_url: str | None = None,
        residency: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        self.interval = interval
        self.absorbed = absorbed
        self.cgroup_stat = cgroup_stat
        self.daemon_pid = daemon_pid
        # mincore counts: the victim's files, and the backup's files on the target
        self.residency = residency
        self.writer_pid: int | None = None  # set by the workload as its phases start
        self.t0 = time.monotonic()  # rebased when the writer starts
        self.rows: list[dict[str, float | str | None]] = []
        self.scraper = MetricsScraper(metrics_url, interval) if metrics_url else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="sampler")
        self._last_cpu = cpu_times()
        self._lock = threading.Lock()

    def start(self) -> None:
        if self.scraper:
            self.scraper.start()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if self.scraper:
            self.scraper.stop()

    def _loop(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                with self._lock:
                    self.rows.append(self.sample())
            except Exception:  # a sampler bug must not kill the run; log it once per row
                log.exception("sampler")
            next_at += self.interval
            delay = next_at - time.monotonic()
            if delay < 0:
                next_at = time.monotonic()
                delay = 0
            self._stop.wait(delay)

    def sample(self) -> dict[str, float | str | None]:
        now = time.monotonic()
        mem = meminfo()
        row: dict[str, float | str | None] = dict.fromkeys(COLUMNS)
        row["t"] = now  # absolute; rebased when written out
        row["dirty"] = mem.get("Dirty")
        row["writeback"] = mem.get("Writeback")
        row["writeback_tmp"] = mem.get("WritebackTmp")
        row["nfs_unstable"] = mem.get("NFS_Unstable")
        if self.cgroup_stat:
            cg = self.cgroup_stat()
            row["cg_dirty"] = cg.get("dirty")
            row["cg_writeback"] = cg.get("writeback")
            row["cg_usage"] = cg.get("usage")
            row["cg_cache"] = cg.get("cache")
        if self.residency:
            row |= self.residency()
        row["absorbed"] = self.absorbed()
        pid = self.writer_pid
        if pid:
            row["writer_pid"] = pid
            row["app_written"] = process_wchar(pid)
        if self.daemon_pid:
            row["daemon_cpu_s"] = process_cpu_seconds(self.daemon_pid)
        busy, total = cpu_times()
        d_total = total - self._last_cpu[1]
        row["machine_busy"] = (busy - self._last_cpu[0]) / d_total if d_total > 0 else None
        self._last_cpu = (busy, total)
        snap = self.scraper.latest(max_age=3 * self.interval) if self.scraper else None
        if snap is not None:
            row["ft_unsynced"] = snap.unsynced
            row["ft_window"] = snap.window
            row["ft_fsyncs"] = snap.fsync_count
            row["ft_fsync_seconds"] = snap.fsync_sum
            row["ft_synced"] = snap.synced
            row["ft_fsync_buckets"] = format_buckets(snap.fsync_buckets)
        return row

    def mark(self) -> None:
        """Take one sample now (at t0 and when data is durable), so even an arm shorter than
        the interval has samples inside it."""
        with self._lock:
            self.rows.append(self.sample())
