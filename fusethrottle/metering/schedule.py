"""Time-of-day schedules for the ceilings: ``metered_limit=100M,01:00-06:00=20M``, or the
same in a file (``metered_limit=/etc/fusethrottle/backups.limits``, one entry per line).

Pure: a schedule is a base value and windows of local wall-clock time, each with its own
value; what applies is asked with the minute of the day. Wall-clock minutes make it DST-safe
by construction: on the night the clocks change, 01:00-06:00 still means what the clock on
the wall says (a window the jump skips into starts at the jump, one it repeats is not applied
twice), and a window may cross midnight (22:00-02:00).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

_WINDOW_RE = re.compile(r"^(\d{1,2}):(\d{2})-(\d{1,2}):(\d{2})$")
_WINDOW_START_RE = re.compile(r"^\d{1,2}:\d{2}-")
DAY = 24 * 60


class ScheduleError(ValueError):
    """A schedule the user got wrong; ``str()`` is the one line."""


@dataclass(frozen=True)
class Window:
    """Minutes of the day [start, end), crossing midnight when end <= start."""

    start: int
    end: int
    value: float

    def covers(self, minute: int) -> bool:
        if self.start < self.end:
            return self.start <= minute < self.end
        return minute >= self.start or minute < self.end

    def __str__(self) -> str:
        return (
            f"{self.start // 60:02d}:{self.start % 60:02d}-{self.end // 60:02d}:{self.end % 60:02d}"
        )


@dataclass(frozen=True)
class Schedule:
    """A base value and the windows that override it (the first that covers a minute wins)."""

    base: float
    windows: tuple[Window, ...] = ()

    def value_at(self, minute: int) -> float:
        for window in self.windows:
            if window.covers(minute % DAY):
                return window.value
        return self.base

    def window_at(self, minute: int) -> Window | None:
        return next((w for w in self.windows if w.covers(minute % DAY)), None)

    def next_change(self, minute: int) -> int:
        """Minutes from *minute* until the value may change (at least 1)."""
        edges = sorted({w.start for w in self.windows} | {w.end for w in self.windows})
        if not edges:
            return DAY
        return min((edge - minute) % DAY or DAY for edge in edges)


def parse_window(text: str, parse_value: Callable[[str], float]) -> Window:
    """``01:00-06:00=20M`` -> Window(60, 360, 20 MiB)."""
    span, eq, raw = text.partition("=")
    m = _WINDOW_RE.match(span)
    if not m or not eq:
        raise ScheduleError(f"expected HH:MM-HH:MM=VALUE, got {text!r}")
    h1, m1, h2, m2 = (int(g) for g in m.groups())
    if h1 > 23 or h2 > 24 or m1 > 59 or m2 > 59 or (h2 == 24 and m2 != 0):
        raise ScheduleError(f"not a time of day in {text!r}")
    start, end = h1 * 60 + m1, h2 * 60 + m2
    if start == end % DAY:
        raise ScheduleError(f"an empty or whole-day window in {text!r}: set the value itself")
    return Window(start, end % DAY, parse_value(raw))


def schedule_file_items(text: str) -> list[str]:
    """A schedule file's *text* as the option's items: the base value first, then each window.

    One entry per line, ``#`` starts a comment: a bare value is the base (the value outside
    every window, at most one line; none: 0, no ceiling), ``HH:MM-HH:MM = VALUE`` a window (the
    first that covers a minute wins, as inline). Values are checked by the option's parser."""
    base: str | None = None
    windows: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        entry = line.partition("#")[0].strip()
        if not entry:
            continue
        span, eq, value = (part.strip() for part in entry.partition("="))
        if eq or _WINDOW_START_RE.match(entry):
            if not _WINDOW_RE.match(span):
                raise ScheduleError(f"line {number}: expected HH:MM-HH:MM = VALUE, got {entry!r}")
            windows.append(f"{span}={value}")
        elif base is None:
            base = entry
        else:
            raise ScheduleError(
                f"line {number}: a second base value {entry!r} (the first was {base!r})"
            )
    return [base or "0", *windows]


def local_minute(seconds: float) -> int:
    """The minute of the local wall-clock day at unix time *seconds* (the host's zone)."""
    import time

    t = time.localtime(seconds)
    return t.tm_hour * 60 + t.tm_min
