"""One log line per cause per interval.

A failing target repeats the same error for every request, thousands of times a second; a line
per cause every few seconds tells the operator as much and keeps the journal (and the event loop
writing to it) usable. Pure: the caller passes the time.
"""

from __future__ import annotations

from collections.abc import Hashable


class LogLimiter:
    """Says whether a message about *key* may be logged at *now*: at most once per *interval*
    seconds per key. Remembers at most *max_keys* causes (the oldest are forgotten first), so a
    stream of distinct keys (inode numbers) cannot grow it without bound."""

    def __init__(self, interval: float, max_keys: int = 4096) -> None:
        if interval < 0 or max_keys < 1:
            raise ValueError("need interval >= 0 and max_keys >= 1")
        self.interval = float(interval)
        self.max_keys = int(max_keys)
        self._last: dict[Hashable, float] = {}

    def allow(self, key: Hashable, now: float) -> bool:
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            return False
        self._last.pop(key, None)  # re-insert: the dict's order is the order of last logging
        self._last[key] = now
        while len(self._last) > self.max_keys:
            del self._last[next(iter(self._last))]
        return True
