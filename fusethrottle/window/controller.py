"""Window controllers: how many un-synced bytes one mount may hold.

Pure: time is an argument, there is no I/O, no clock and no trio, so the daemon calls these from
the event loop (service/daemon.py, one call per fsync event of the engine) and tests feed them
made-up samples. One sample per completed injected fsync:
``on_sample(now, nbytes, seconds, in_flight, admitted)``, where ``in_flight`` is the mount's
un-synced bytes once this fsync's bytes are gone (the engine's ledger, as its event reports it)
and ``admitted`` the most the gate admits to the target (the window less the kernel's share).

``StaticController`` keeps the configured window (``mode=static`` and ``mode=off``): the baseline
every benchmark compares against.

``AdaptiveController`` (``mode=adaptive``) sizes the window so that it **drains in about
``drain_s`` seconds (default 2.5) at the rate the target commits this mount's data now**::

    W* = rate x drain_s          rate = MiB committed / seconds spent, over the last 5 fsyncs

Why drain time and not bytes: whatever has to wait for this mount's data (a sync(), reclaim, the
backup's own fsync) then waits about ``drain_s`` whether the target runs at 200 MiB/s or 1 MiB/s,
and hosts sharing one target need no learned baseline (the order they join in does not matter).

Each fsync is charged its *delivery interval*: from its start, or from the previous completion if
that came later. Overlapping fsyncs are not charged twice, so the rate is this mount's commit rate
and does not fall as the mount's own queue grows (raw fsync latency does).

Rules, in order:

1. Hard signals (an fsync of ``slow_fsync_s`` or more, or EIO/ETIMEDOUT) halve the window and
   *hold*: no growth until an fsync that started after the cut comes back in time. Then the
   samples from before the cut are forgotten: a stall that is over must not set the pace (nor
   the gate's pacing, which uses the same rate) for five more fsyncs.
2. Until ``short_samples`` fsyncs have been seen, the initial window is only a guess, and the
   first evidence that it is too big replaces it outright.
3. If the window is more than ``tolerance`` x W*, the target is clearly slower than the window
   assumes: cut at once to W*, but by at most half per sample (one odd sample must not empty
   the window). The other way round, if the two newest fsyncs (a quarter of the window between
   them) committed more than ``tolerance`` x faster than the older ones, the older ones are
   forgotten: a faster target is believed after two fsyncs. One is not enough (its data may
   have been written back already).
4. Otherwise move ``smoothing`` of the way toward W*. Shrink only when the latest sample *and*
   the 5-sample mean both say "too big"; grow only when both say "too small", and only while at
   least half of what the gate admits is in use (a writer slower than the target needs no
   bigger window; the kernel's share of the window is out of the engine's ledger's sight).
   When both say W* is at least twice the window, move half of the way (after a stall or a
   speed-up the window is far too small, and the target idles while it grows).
5. Every update made while the window is in use and not held adds a small fixed step
   (``fair_step``, default ``minimum / 4``, at most W*/8): the additive half of AIMD. On a FIFO
   server a host's share follows its window, so W* is proportional to the window and without a
   fixed step nothing pulls unequal windows together. It costs a bias of at most +12.5% over W*.
6. The window never grows past 1.25x the bytes the target delivered in the last ``drain_s`` of
   delivery time (pro-rated, whatever the samples say one by one). Fsyncs of many files on one
   target are entangled: while the kernel writes files back on its own, each fsync waits
   behind it and looks slow; then thirty fsyncs in a row find nothing left to write and look a
   hundred times faster. With 64 files on ext4 the per-sample view opened the window from 20 to
   700 MiB in half a second (bench.many_writers, series.jsonl). Growth after a real speed-up
   waits until the faster target has carried one drain time of data.

Limits: the target's base latency counts toward the drain time, so a target whose fsync round
trip approaches ``drain_s`` gets ``window_min``; and a slowdown is only seen when an fsync
completes, so data admitted before it still drains at the new speed. The evidence for these rules
(the model, the degrade bench, the design they replaced) is in docs/DESIGN.md, "Controllers",
with the commands that reproduce it.
"""

from __future__ import annotations

import errno as errno_mod
import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..service.options import Config

MiB = 1024 * 1024
_ROUNDING = 1e-3  # relative; see AdaptiveController.on_sample

#: Default target drain time of the window, seconds.
DEFAULT_DRAIN_S = 2.5

#: How far past the bytes delivered in the last ``drain_s`` the window may grow (rule 6): room
#: for rule 5's step (at most +12.5%) and for a target that is getting faster.
CEILING_HEADROOM = 1.25

#: Errors that mean "the target is in trouble", not "this request was wrong".
HARD_ERRNOS = frozenset({errno_mod.EIO, errno_mod.ETIMEDOUT})


@dataclass(frozen=True)
class ControllerState:
    """A snapshot for metrics and logs."""

    mode: str  # "static" | "adaptive"
    window: int  # bytes
    baseline_s_per_mib: float | None  # lowest commit cost seen lately, seconds per MiB
    recent_s_per_mib: float | None  # commit cost over the last few fsyncs
    samples: int
    holds: int  # times a hard signal halved the window


class Controller(Protocol):
    """What the engine's fsync events feed, and what the engine's gate, the metrics and the
    bench read."""

    @property
    def window(self) -> int:
        """Bytes of un-synced data the mount may hold now."""
        ...

    @property
    def commit_rate(self) -> float | None:
        """Bytes/s the target recently committed this mount's data at; None until measured."""
        ...

    @property
    def target_window(self) -> int | None:
        """The window it steers toward (W*); None when it does not steer or has no measure."""
        ...

    def on_sample(
        self, now: float, nbytes: int, seconds: float, in_flight: int, admitted: int | None = None
    ) -> int: ...

    def on_error(self, now: float, errno: int) -> int: ...

    def snapshot(self) -> ControllerState: ...


class _CostMeter:
    """Seconds the target needed per MiB of this mount's data: recent, and the best lately.

    ``recent`` is total delivery time over total MiB for the last *samples* fsyncs; a tiny fsync
    (a small file's release) therefore barely moves it. ``baseline`` is the lowest ``recent``,
    allowed to double every *memory_s* seconds when nothing refreshes it; it is reported, not
    steered by: it tells an operator how far the target is from its best.
    """

    def __init__(self, samples: int, memory_s: float, horizon_s: float = 0.0) -> None:
        self._recent: deque[tuple[float, float]] = deque(maxlen=samples)  # (seconds, MiB)
        #: Every sample of the last *horizon_s* seconds of delivery time, for ``delivered``.
        self._history: deque[tuple[float, float]] = deque()
        self._history_spent = 0.0
        self._history_mib = 0.0
        self._horizon_s = horizon_s
        self._memory_s = memory_s
        self._last_done: float | None = None
        self._base_time = 0.0
        self.recent: float | None = None
        self.baseline: float | None = None

    @property
    def full(self) -> bool:
        return len(self._recent) == self._recent.maxlen

    @property
    def rate(self) -> float | None:
        """Bytes/s over the recent samples; None until one was recorded."""
        return None if self.recent is None else MiB / self.recent

    def keep_newest(self, count: int, *, history: bool) -> None:
        """Forget all but the newest *count* samples: they describe a target that is gone.
        With *history*, ``delivered`` forgets them too (a stall that is over); without, only
        the recent cost does (a speed-up: two samples may be flukes, the history is not)."""
        while len(self._recent) > max(count, 1):
            self._recent.popleft()
        while history and len(self._history) > max(count, 1):
            old_spent, old_mib = self._history.popleft()
            self._history_spent -= old_spent
            self._history_mib -= old_mib
        self._update_recent()

    def delivered(self) -> float | None:
        """MiB committed in the last *horizon_s* seconds of delivery time (the oldest sample
        pro-rated); None until the samples cover that long. O(1): called once per fsync, and
        a tree of small files brings thousands of them a second."""
        if self._horizon_s <= 0 or self._history_spent < self._horizon_s:
            return None
        oldest_spent, oldest_mib = self._history[0]
        newer_spent = self._history_spent - oldest_spent  # < horizon: see _remember
        share = (self._horizon_s - newer_spent) / oldest_spent if oldest_spent > 0 else 1.0
        return self._history_mib - oldest_mib + oldest_mib * min(max(share, 0.0), 1.0)

    def _remember(self, spent: float, mib: float) -> None:
        """Keep just enough samples to cover *horizon_s* of delivery time."""
        self._history.append((spent, mib))
        self._history_spent += spent
        self._history_mib += mib
        while len(self._history) > 1 and (
            self._history_spent - self._history[0][0] >= self._horizon_s
        ):
            old_spent, old_mib = self._history.popleft()
            self._history_spent -= old_spent
            self._history_mib -= old_mib
        if len(self._history) == 1:  # start the sums afresh: no float drift over a long run
            self._history_spent, self._history_mib = self._history[0]

    def upturn(self, count: int, factor: float, min_mib: float) -> bool:
        """Did the newest *count* samples (at least *min_mib* between them) commit more than
        *factor* times faster than the older ones?"""
        if len(self._recent) <= count:
            return False
        samples = list(self._recent)
        new, old = samples[-count:], samples[:-count]
        new_mib = sum(m for _, m in new)
        if new_mib < min_mib:
            return False
        new_cost = sum(s for s, _ in new) / new_mib
        old_cost = sum(s for s, _ in old) / sum(m for _, m in old)
        return new_cost * factor < old_cost

    def _update_recent(self) -> None:
        if not self._recent:
            return
        self.recent = max(sum(s for s, _ in self._recent) / sum(m for _, m in self._recent), 1e-12)

    def add(self, now: float, nbytes: int, seconds: float) -> float | None:
        """Record one completed fsync; returns its own cost (None for an empty one)."""
        started = now - max(seconds, 0.0)
        if self._last_done is not None:
            started = max(started, min(self._last_done, now))
            self._last_done = max(self._last_done, now)
        else:
            self._last_done = now
        if nbytes <= 0:
            return None
        spent, mib = now - started, nbytes / MiB
        self._recent.append((spent, mib))
        self._remember(spent, mib)
        self._update_recent()
        if self.full:
            aged = math.inf
            if self.baseline is not None:
                age = max(now - self._base_time, 0.0)
                aged = self.baseline * 2.0 ** min(age / self._memory_s, 64.0)
            recent = self.recent if self.recent is not None else aged
            self.baseline, self._base_time = min(recent, aged), now
        return max(spent / mib, 1e-12)


class StaticController:
    """A fixed window (``mode=static`` and ``mode=off``); it still measures, for metrics."""

    def __init__(self, window: int) -> None:
        if window <= 0:
            raise ValueError("window must be positive")
        self._window = int(window)
        self._samples = 0
        self._costs = _CostMeter(5, 1800.0)

    @property
    def window(self) -> int:
        return self._window

    def on_sample(
        self, now: float, nbytes: int, seconds: float, in_flight: int, admitted: int | None = None
    ) -> int:
        self._samples += 1
        self._costs.add(now, nbytes, seconds)
        return self._window

    def on_error(self, now: float, errno: int) -> int:
        return self._window

    @property
    def commit_rate(self) -> float | None:
        """Bytes/s the target recently committed this mount's data at; None until measured."""
        return self._costs.rate

    @property
    def target_window(self) -> int | None:
        return None

    def snapshot(self) -> ControllerState:
        costs = self._costs
        return ControllerState(
            "static", self._window, costs.baseline, costs.recent, self._samples, 0
        )


class AdaptiveController:
    """Sizes the window to drain in about ``drain_s`` at the target's current commit rate.

    See the module docstring for the rules and the measurements behind them.
    """

    def __init__(
        self,
        *,
        initial: int,
        minimum: int,
        maximum: int,
        tolerance: float = 1.5,
        smoothing: float = 0.2,
        slow_fsync_s: float = 30.0,
        drain_s: float = DEFAULT_DRAIN_S,
        short_samples: int = 5,
        memory_s: float = 1800.0,
        fair_step: int | None = None,
    ) -> None:
        if not 0 < minimum <= maximum:
            raise ValueError("need 0 < minimum <= maximum")
        if tolerance < 1.0:
            raise ValueError("tolerance must be at least 1.0")
        if not 0.0 < smoothing <= 1.0:
            raise ValueError("smoothing must be in (0, 1]")
        if min(slow_fsync_s, drain_s, memory_s) <= 0 or short_samples < 1:
            raise ValueError("slow_fsync_s, drain_s, memory_s and short_samples must be positive")
        if fair_step is not None and fair_step < 0:
            raise ValueError("fair_step must not be negative")
        self.minimum = int(minimum)
        self.maximum = int(maximum)
        self.tolerance = float(tolerance)
        self.smoothing = float(smoothing)
        self.slow_fsync_s = float(slow_fsync_s)
        self.drain_s = float(drain_s)
        self.fair_step = float(minimum / 4 if fair_step is None else fair_step)
        self._window = self._clamp(float(initial))
        self._costs = _CostMeter(short_samples, memory_s, horizon_s=self.drain_s)
        self.short_samples = int(short_samples)
        self._samples = 0
        self._holds = 0
        self._hold_since: float | None = None
        self._since_cut = 0  # non-empty samples that arrived after the last cut

    @property
    def window(self) -> int:
        return int(self._window)

    def on_sample(
        self, now: float, nbytes: int, seconds: float, in_flight: int, admitted: int | None = None
    ) -> int:
        """One completed fsync of *nbytes* that took *seconds*; returns the new window.

        *admitted*: the most the gate admits (None: the whole window). With the writeback
        cache, up to half of a small window is the kernel's, and the gate paces the rest at
        about half full: measured against the whole window, a writer held back at the gate
        would never count as using it, and a cut window could never grow again.
        """
        self._samples += 1
        warming = self._samples <= self.short_samples
        latest = self._costs.add(now, nbytes, seconds)
        if seconds >= self.slow_fsync_s:
            self._reduce(now)
            fit = self._fit(min(latest, self._costs.recent or latest)) if latest else None
            if warming and fit is not None:
                self._window = self._clamp(min(self._window, fit))
            return self.window
        if self._hold_since is not None:
            self._since_cut += latest is not None
            if now - seconds >= self._hold_since:
                # An fsync that started after the cut came back in time. What led to the cut
                # (a stall, a failing target) is over: steer by what came since.
                self._hold_since = None
                self._costs.keep_newest(self._since_cut, history=True)
        elif self._costs.upturn(2, self.tolerance, self._window / 4 / MiB):
            # Clearly faster now: do not wait for the mean to agree (rule 6 still bounds growth).
            self._costs.keep_newest(2, history=False)
        mean = self._costs.recent
        if latest is None or mean is None:
            return self.window
        fit_fast = self._fit(min(latest, mean))  # the larger W* of the two views
        fit_slow = self._fit(max(latest, mean))  # the smaller
        w = self._window
        in_use = in_flight + nbytes >= (w if admitted is None else admitted) / 2
        may_grow = in_use and self._hold_since is None and not warming
        # Gaps within _ROUNDING are float error (a tiny fsync's duration is the difference of
        # two large clock readings), not a slower target: never shrink for them.
        slack = 1.0 + _ROUNDING
        if warming and w > fit_fast * slack:
            w = fit_fast
        elif w > self.tolerance * fit_fast * slack:
            w = max(fit_fast, w / 2)
        else:
            goal, smoothing = w, self.smoothing
            # Rule 6: never grow far past what the target delivered in the last drain_s.
            delivered = self._costs.delivered()
            ceiling = math.inf if delivered is None else delivered * MiB * CEILING_HEADROOM
            may_grow = may_grow and w < ceiling
            if w > fit_fast * slack:
                goal = fit_fast
            elif may_grow and fit_slow > w:
                goal = min(fit_slow, 2 * w, ceiling)  # above w: may_grow says w < ceiling
                if fit_slow >= 2 * w:  # far below what the target takes: catch up faster
                    smoothing = max(smoothing, 0.5)
            step = min(self.fair_step, fit_fast / 8) if may_grow else 0.0
            # Growth (goal and step together) stops at the ceiling; a cut is never held back.
            w = min(w + smoothing * (goal - w + step), max(w, ceiling))
        self._window = self._clamp(w)
        return self.window

    def on_error(self, now: float, errno: int) -> int:
        """An fsync failed; EIO and ETIMEDOUT halve the window, other errors say nothing about
        the target's speed (ENOSPC, EDQUOT, ...) and leave it alone."""
        if errno in HARD_ERRNOS:
            self._reduce(now)
        return self.window

    @property
    def commit_rate(self) -> float | None:
        """Bytes/s the target recently committed this mount's data at; None until measured."""
        return self._costs.rate

    @property
    def target_window(self) -> int | None:
        """W* at the recent commit rate, clamped; None until an fsync was measured."""
        recent = self._costs.recent
        return None if recent is None else int(self._fit(recent))

    def snapshot(self) -> ControllerState:
        costs = self._costs
        return ControllerState(
            "adaptive", self.window, costs.baseline, costs.recent, self._samples, self._holds
        )

    def _fit(self, s_per_mib: float) -> float:
        """The window that drains in ``drain_s`` at *s_per_mib*, clamped."""
        return self._clamp(self.drain_s / s_per_mib * MiB)

    def _reduce(self, now: float) -> None:
        before = self._window
        self._window = self._clamp(self._window / 2)
        if self._window < before:
            self._holds += 1
        self._hold_since = now
        self._since_cut = 0

    def _clamp(self, value: float) -> float:
        return float(min(max(value, self.minimum), self.maximum))


def make_controller(config: Config) -> Controller:
    """The controller ``config.mode`` asks for; ``off`` and ``static`` keep ``config.window``.

    In adaptive mode ``config.window`` is the initial window and ``config.drain`` (seconds) is
    how long the window should take to drain at the rate the target commits.
    """
    if config.mode == "adaptive":
        return AdaptiveController(
            initial=config.window,
            minimum=config.window_min,
            maximum=config.window_max,
            tolerance=config.tolerance,
            drain_s=config.drain,
        )
    return StaticController(config.window)


#: What is admitted until the first fsync has measured the target (see effective_window).
STARTUP_WINDOW = 16 << 20


def effective_window(window: int, commit_rate: float | None) -> int:
    """Slow start: until one fsync has shown how fast the target commits, admit little.

    Without it the first write burst fills the whole window before anything is known, and the
    first fsync (which writes back everything dirty in the file, not just one batch) then holds
    the writer for window / target speed: ten seconds at 256 MiB and 20 MiB/s.
    """
    return window if commit_rate is not None else min(window, STARTUP_WINDOW)
