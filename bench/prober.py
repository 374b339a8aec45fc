"""The metadata prober: does the mount still answer stat and readdir while the target is slow?

A backup target that stalls must not take ``ls`` and ``stat`` down with it (issue 4: "the daemon
still answers stat/readdir"). Every ``interval`` seconds this thread looks up a name that does
not exist (negative lookups are never cached, so each one reaches the daemon and the target)
and lists the directory (readdir always reaches the daemon). Each operation's start time and
latency are kept; one that has not returned when the prober is stopped is recorded with the
time it had been waiting, so a hang shows up as a long probe rather than a missing one.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

MISSING = ".fusethrottle-bench-probe-missing"


class MetadataProber:
    """Times ``stat`` of a missing name and ``listdir`` on *directory* from its own thread."""

    def __init__(self, directory: Path, interval: float) -> None:
        self.directory = directory
        self.interval = interval
        self.ops: list[tuple[float, str, float]] = []  # (start, "stat" | "readdir", seconds)
        self.failures = 0
        self._current: tuple[float, str] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="prober")

    def start(self) -> None:
        self._thread.start()

    def stop(self, grace: float = 5.0) -> list[tuple[float, str, float]]:
        """Stop probing; returns every probe, a still-hanging one included."""
        self._stop.set()
        self._thread.join(timeout=grace)
        current = self._current
        if self._thread.is_alive() and current is not None:
            start, op = current
            self.ops.append((start, op, time.monotonic() - start))
        return list(self.ops)

    def _timed(self, op: str, call) -> None:
        start = time.monotonic()
        self._current = (start, op)
        try:
            call()
        except FileNotFoundError:
            pass  # the expected answer to the stat probe
        except OSError:
            self.failures += 1
        self.ops.append((start, op, time.monotonic() - start))
        self._current = None

    def _loop(self) -> None:
        missing = self.directory / MISSING
        while not self._stop.is_set():
            self._timed("stat", lambda: os.stat(missing))
            self._timed("readdir", lambda: os.listdir(self.directory))
            self._stop.wait(self.interval)
