"""The counters behind every series: what the data path and the backend report, as plain numbers.

Why not prometheus_client's Counter and Histogram objects: they take a lock on every update and
their values are read by the scrape thread while the loop writes them. The :class:`Recorder` is
called from the event loop only, so plain ints need no lock; each call is a few bytecodes because
it runs on every FUSE request. Other threads never read it: they read frozen snapshots (see
snapshot.py).
"""

from __future__ import annotations

import bisect
import time
from collections import defaultdict, deque
from dataclasses import dataclass

from ...metering.meter import METADATA_CLASS, Meter, op_class
from .definitions import ADMISSION_BUCKETS, FSYNC_BUCKETS, FSYNC_REASONS

#: fsync durations kept for the status view's recent p50/p99 (see snapshot.recent_fsyncs).
RECENT_FSYNC_MAX = 2048

# --- which EFS class a target operation belongs to -----------------------------------------
#
# One table for the whole daemon: meter.METADATA_CLASS and meter.op_class, which the ceilings
# (ops.py) use too.

#: Operation names classified on purpose (a test checks that the backend reports no other).
CLASSIFIED_OPS = frozenset({"read", "write", "fsync", *METADATA_CLASS})


# --- histograms ----------------------------------------------------------------------------


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
        """``(le, count)`` pairs the way Prometheus wants them: cumulative, bounds as text."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return out


class Histogram:
    """A fixed-bucket histogram updated on the event loop; ``freeze`` copies it for readers."""

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


# --- the hot path --------------------------------------------------------------------------


class Recorder:
    """The data path's :class:`Events` and the backend's target observer.

    *meter* is the mount's own :class:`Meter` (the one its ceilings price requests with): every
    operation sent to the target is recorded in it. Without one (tests of
    the counters alone) nothing is metered.
    """

    def __init__(self, meter: Meter | None = None) -> None:
        self.meter = meter
        self.written_bytes = 0
        self.read_bytes = 0
        self.operations: defaultdict[str, int] = defaultdict(int)
        self.target_operations: defaultdict[str, int] = defaultdict(int)
        self.target_errors: defaultdict[tuple[str, int], int] = defaultdict(int)
        self.fsync_duration = {r: Histogram(FSYNC_BUCKETS) for r in FSYNC_REASONS}
        self.fsync_bytes: dict[str, int] = dict.fromkeys(FSYNC_REASONS, 0)
        self.fsync_errors: dict[str, int] = dict.fromkeys(FSYNC_REASONS, 0)
        self.admission_waits = Histogram(ADMISSION_BUCKETS)
        #: (time.monotonic(), seconds) of the latest fsyncs, for the status view's percentiles.
        self.recent_fsyncs: deque[tuple[float, float]] = deque(maxlen=RECENT_FSYNC_MAX)

    # --- Events ----------------------------------------------------------------------------
    def operation(self, op: str) -> None:
        self.operations[op] += 1

    def target_error(self, op: str, errno: int) -> None:
        self.target_errors[(op, errno)] += 1

    def fsync(self, reason: str, seconds: float, nbytes: int, error: int | None) -> None:
        hist = self.fsync_duration.get(reason)
        if hist is None:  # a reason this module does not know yet: count it all the same
            hist = self.fsync_duration[reason] = Histogram(FSYNC_BUCKETS)
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
            self.meter.record(op_class(op), nbytes)
