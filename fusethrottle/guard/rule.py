"""The pressure guard's rule: how fast the backup may write, from the protected workload's stall.

Pure (no clock, no files): each step is given the time, the share of time the protected
workload spent stalled since the last step (pressure.py) and the bytes the backup wrote
meanwhile. Like TCP's congestion control, driven by the neighbour's stall instead of a lost
packet: a stall above what the workload showed with the backup idle cuts the allowed rate
multiplicatively, and a calm workload gets it back additively, never below ``min_rate`` (the
backup always finishes).

Why learned: a database that stalls 3% of the time on its own would hold a fixed 1% guard shut
for ever, one that never stalls would be hurt long before a fixed 10% guard reacts. The rule
keeps the shares seen while the backup wrote nothing and sets the line a margin above their
95th percentile; ``guard_some=`` sets it by hand.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum

MiB = 1024 * 1024


class GuardState(Enum):
    """What the guard is doing, as logged once per change and shown by ``status``."""

    LEARNING = "learning"  # no idle pressure known yet: the default line applies
    OPEN = "open"  # the workload is calm: the backup writes as fast as it can
    HOLDING = "holding"  # the workload stalls: the backup's rate is held back


@dataclass(frozen=True)
class GuardSettings:
    """``guard_some=``, ``guard_min=`` and the rule's constants."""

    #: The stall share above which the backup is held back; None: learned from idle readings.
    some: float | None = None
    #: The rate the backup is never held below (bytes/s), so it always finishes.
    min_rate: float = 4 * MiB
    #: Each cut keeps this share of the rate.
    cut: float = 0.5
    #: Seconds between two cuts, and from a cut to the first rise: PSI's totals show a cut's
    #: effect only once the workload's stalled tasks ran again.
    hold: float = 1.0
    #: Seconds a rise from nothing to the backup's unthrottled rate takes (the additive step).
    climb: float = 10.0
    #: The line until idle readings are known (guard_some unset).
    default_some: float = 0.05
    #: The learned line: a margin above the 95th percentile of the idle shares, at least floor.
    margin: float = 0.02
    floor: float = 0.01
    #: Idle readings needed before the learned line replaces the default, and kept at most.
    idle_needed: int = 10
    idle_kept: int = 600
    #: Writing slower than this (bytes/s) counts as idle.
    idle_rate: float = 256 * 1024
    #: Below this share of the line the workload counts as calm (no rise in between).
    calm: float = 0.75


@dataclass(frozen=True)
class GuardDecision:
    """The outcome of one step: the rate the backup may write at (None: no limit)."""

    limit: float | None
    state: GuardState
    line: float  # the stall share that holds the backup back now
    share: float  # the workload's stall share over this step
    changed: bool  # state differs from the previous step's (log it)
    held_seconds: float  # total time spent holding back


@dataclass
class GuardRule:
    """One mount's guard: feed it :meth:`step` at each reading."""

    settings: GuardSettings = field(default_factory=GuardSettings)
    limit: float | None = None
    held_seconds: float = 0.0
    _idle: deque[float] = field(default_factory=deque)
    _rate: float = 0.0  # the backup's smoothed write rate
    _peak: float = 0.0  # its highest smoothed rate while not held back
    _last: float | None = None
    _last_cut: float = float("-inf")
    _state: GuardState | None = None

    def line(self) -> float:
        """The stall share above which the backup is held back."""
        s = self.settings
        if s.some is not None:
            return s.some
        if len(self._idle) < s.idle_needed:
            return s.default_some
        ordered = sorted(self._idle)
        p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
        return max(s.floor, p95 + s.margin)

    def state(self) -> GuardState:
        if self.limit is not None:
            return GuardState.HOLDING
        if self.settings.some is None and len(self._idle) < self.settings.idle_needed:
            return GuardState.LEARNING
        return GuardState.OPEN

    def step(self, now: float, share: float, written: int) -> GuardDecision:
        """One reading: *share* of the time since the last step the workload stalled, and the
        bytes the backup wrote meanwhile."""
        s = self.settings
        dt = 0.0 if self._last is None else max(0.0, now - self._last)
        self._last = now
        if dt > 0:
            rate = written / dt
            self._rate = rate if self._rate == 0 else 0.7 * self._rate + 0.3 * rate
            if self.limit is None:
                self._peak = max(self._peak, self._rate)
            else:
                self.held_seconds += dt
        writing = dt > 0 and written / dt >= s.idle_rate
        line = self.line()
        if dt > 0 and not writing and self.limit is None:
            self._idle.append(share)
            while len(self._idle) > s.idle_kept:
                self._idle.popleft()
        elif dt > 0 and share > line and writing:
            if self.limit is None:
                self.limit = max(s.min_rate, self._rate * s.cut)
                self._last_cut = now
            elif now - self._last_cut >= s.hold:
                self.limit = max(s.min_rate, self.limit * s.cut)
                self._last_cut = now
        elif self.limit is not None and share < line * s.calm and now - self._last_cut >= s.hold:
            ceiling = max(self._peak, s.min_rate)
            self.limit += max(ceiling, s.min_rate) / s.climb * dt
            if self.limit >= ceiling:
                self.limit = None
        state = self.state()
        changed = state is not self._state
        self._state = state
        return GuardDecision(self.limit, state, line, share, changed, self.held_seconds)
