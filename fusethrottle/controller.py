"""Window controllers: how many un-synced bytes a mount may hold.

Pure: every method takes the time as an argument and does no I/O, so the flusher calls them from
the event loop and tests drive them with made-up samples.

PLACEHOLDER DOCSTRING (rewritten once the simulation numbers are in).
"""

from __future__ import annotations

import errno as errno_mod
import logging
import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .options import Config

log = logging.getLogger(__name__)

MiB = 1024 * 1024

#: Errors that mean "the target is in trouble", not "this request was wrong".
HARD_ERRNOS = frozenset({errno_mod.EIO, errno_mod.ETIMEDOUT})


@dataclass(frozen=True)
class ControllerState:
    """A snapshot for metrics and logs."""

    mode: str  # "static" | "adaptive"
    window: int  # bytes
    baseline_s_per_mib: float | None  # best (lowest) commit cost seen, seconds per MiB
    recent_s_per_mib: float | None  # commit cost over the last few samples
    samples: int
    holds: int  # times a hard signal halved the window


class _CostMeter:
    """Seconds the target needed per MiB of this mount's data, recent and best.

    The time charged to one fsync is its *delivery interval*: from when it started, or from the
    previous completion if that came later. Sequential fsyncs are charged their full duration;
    overlapping ones are not charged again for time already charged to another. So the cost is
    the inverse of the rate this mount's data was committed at, which, unlike fsync latency, does
    not grow with the mount's own queue.
    """

    def __init__(self, samples: int, memory_s: float) -> None:
        self._recent: deque[tuple[float, float]] = deque(maxlen=samples)  # (seconds, MiB)
        self._memory_s = memory_s
        self._last_done: float | None = None
        self._base_time: float | None = None
        self.recent: float | None = None
        self.baseline: float | None = None

    @property
    def full(self) -> bool:
        return len(self._recent) == self._recent.maxlen

    def add(self, now: float, nbytes: int, seconds: float) -> None:
        started = now - max(seconds, 0.0)
        if self._last_done is not None:
            started = max(started, min(self._last_done, now))
        self._last_done = now if self._last_done is None else max(self._last_done, now)
        if nbytes <= 0:
            return
        self._recent.append((now - started, nbytes / MiB))
        spent = sum(s for s, _ in self._recent)
        mib = sum(m for _, m in self._recent)
        self.recent = max(spent / mib, 1e-12)
        if not self.full:
            return
        if self.baseline is None or self._base_time is None:
            self.baseline, self._base_time = self.recent, now
            return
        # Running minimum that forgets slowly: unrefreshed, it may double every memory_s.
        aged = self.baseline * 2.0 ** (max(now - self._base_time, 0.0) / self._memory_s)
        if self.recent <= aged:
            self.baseline, self._base_time = self.recent, now
        else:
            self.baseline, self._base_time = aged, now


class StaticController:
    """A fixed window: the baseline every benchmark compares against (``mode=static``/``off``)."""

    def __init__(self, window: int) -> None:
        if window <= 0:
            raise ValueError("window must be positive")
        self._window = int(window)
        self._samples = 0
        self._costs = _CostMeter(5, math.inf)

    @property
    def window(self) -> int:
        return self._window

    def on_sample(self, now: float, nbytes: int, seconds: float, in_flight: int) -> int:
        self._samples += 1
        self._costs.add(now, nbytes, seconds)
        return self._window

    def on_error(self, now: float, errno: int) -> int:
        return self._window

    def snapshot(self) -> ControllerState:
        return ControllerState(
            "static", self._window, self._costs.baseline, self._costs.recent, self._samples, 0
        )


class AdaptiveController:
    """Sizes the window from how fast the target commits this mount's data (``mode=adaptive``)."""

    def __init__(
        self,
        *,
        initial: int,
        minimum: int,
        maximum: int,
        batch: int,
        tolerance: float = 1.5,
        smoothing: float = 0.2,
        slow_fsync_s: float = 30.0,
        short_samples: int = 5,
        memory_s: float = 1800.0,
        fair_step: int | None = None,
    ) -> None:
        if not 0 < minimum <= maximum:
            raise ValueError("need 0 < minimum <= maximum")
        if batch <= 0:
            raise ValueError("batch must be positive")
        if tolerance < 1.0:
            raise ValueError("tolerance must be at least 1.0")
        if not 0.0 < smoothing <= 1.0:
            raise ValueError("smoothing must be in (0, 1]")
        if slow_fsync_s <= 0 or memory_s <= 0 or short_samples < 1:
            raise ValueError("slow_fsync_s, memory_s and short_samples must be positive")
        self.minimum = int(minimum)
        self.maximum = int(maximum)
        self.batch = int(batch)
        self.tolerance = float(tolerance)
        self.smoothing = float(smoothing)
        self.slow_fsync_s = float(slow_fsync_s)
        self.fair_step = float(fair_step if fair_step is not None else min(batch, minimum) / 4)
        self._window = float(min(max(initial, minimum), maximum))
        self._costs = _CostMeter(short_samples, memory_s)
        self._samples = 0
        self._holds = 0
        self._hold_since: float | None = None

    @property
    def window(self) -> int:
        return int(self._window)

    def target(self) -> float | None:
        """The window the controller is steering toward, bytes (None until measured)."""
        base, recent = self._costs.baseline, self._costs.recent
        if base is None or recent is None:
            return None
        drain_s = self.tolerance * base * self.batch / MiB
        drain_s = min(drain_s, self.slow_fsync_s / 2)
        return self._clamp(drain_s / recent * MiB)

    def on_sample(self, now: float, nbytes: int, seconds: float, in_flight: int) -> int:
        self._samples += 1
        self._costs.add(now, nbytes, seconds)
        if seconds >= self.slow_fsync_s:
            return self._reduce(now)
        started = now - seconds
        holding = self._hold_since is not None and started < self._hold_since
        if not holding:
            self._hold_since = None
        goal = self.target()
        if goal is None or not self._costs.full:
            return self.window
        w = self._window
        goal = min(max(goal, w / 2), w * 2)
        in_use = in_flight + nbytes >= w / 2
        if goal > w and (holding or not in_use):
            goal = w
        step = self.smoothing * (goal - w)
        if in_use and not holding:
            step += self.smoothing * self.fair_step
        self._window = self._clamp(w + step)
        return self.window

    def on_error(self, now: float, errno: int) -> int:
        if errno in HARD_ERRNOS:
            return self._reduce(now)
        return self.window

    def _reduce(self, now: float) -> int:
        before = self._window
        self._window = self._clamp(self._window / 2)
        if self._window < before:
            self._holds += 1
        self._hold_since = now
        return self.window

    def _clamp(self, value: float) -> float:
        return float(min(max(value, self.minimum), self.maximum))

    def snapshot(self) -> ControllerState:
        return ControllerState(
            "adaptive",
            self.window,
            self._costs.baseline,
            self._costs.recent,
            self._samples,
            self._holds,
        )


def make_controller(config: Config) -> StaticController | AdaptiveController:
    """The controller ``config.mode`` asks for (``off`` and ``static`` keep a fixed window)."""
    if config.mode == "adaptive":
        return AdaptiveController(
            initial=config.window,
            minimum=config.window_min,
            maximum=config.window_max,
            batch=config.batch,
            tolerance=config.tolerance,
        )
    return StaticController(config.window)
