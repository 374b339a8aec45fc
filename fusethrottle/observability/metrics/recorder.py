"""The histograms behind the fsync series, and which operations are classified for metering.

Why not prometheus_client's Counter and Histogram objects: they take a lock on every update and
their values are read by the scrape thread while the loop writes them. The :class:`Recorder` is
called from the event loop only, so plain numbers need no lock. Other threads never read it:
they read frozen snapshots (see snapshot.py).
"""

from __future__ import annotations

import bisect
import time
from collections import defaultdict, deque
from dataclasses import dataclass

from ...metering.meter import METADATA_CLASS
from .definitions import FSYNC_BUCKETS, FSYNC_REASONS

#: fsync durations kept for the status view's recent p50/p99 (see snapshot.recent_fsyncs).
RECENT_FSYNC_MAX = 2048

# --- which EFS class a target operation belongs to -----------------------------------------
#
# One table for the whole daemon: meter.METADATA_CLASS and meter.op_class, which the engine is
# handed too.

#: Operation names classified on purpose (a test checks that the engine sends no other).
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


# --- the injected fsyncs --------------------------------------------------------------------


class Recorder:
    """The injected fsyncs the engine reported (its fsync events), as histograms by reason.

    Everything else the series show the engine counts itself (its statistics); only the fsyncs'
    durations need a distribution the engine does not keep. Called on the event loop only.
    """

    def __init__(self) -> None:
        self.target_errors: defaultdict[tuple[str, int], int] = defaultdict(int)
        self.fsync_duration = {r: Histogram(FSYNC_BUCKETS) for r in FSYNC_REASONS}
        self.fsync_bytes: dict[str, int] = dict.fromkeys(FSYNC_REASONS, 0)
        self.fsync_errors: dict[str, int] = dict.fromkeys(FSYNC_REASONS, 0)
        #: (time.monotonic(), seconds) of the latest fsyncs, for the status view's percentiles.
        self.recent_fsyncs: deque[tuple[float, float]] = deque(maxlen=RECENT_FSYNC_MAX)

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
            if reason != "application":  # the application's own is among the engine's errors
                self.target_errors[("fsync", error)] += 1
