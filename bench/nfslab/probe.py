"""A fixed CPU-bound probe, timed inside the VM and on the host: how much slower the guest is.

Under TCG every instruction is translated, so the guest runs a pure-Python loop several times
slower than the host. Times measured in the VM compare only with each other (a ratio of two arms
in one run); this probe says how far they are from the host's.
"""

from __future__ import annotations

import time

ROUNDS = 3


def cpu_probe_seconds() -> float:
    """Best of three runs of a fixed pure-Python loop (seconds)."""
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.perf_counter()
        total = 0
        for i in range(2_000_000):
            total += i * i % 7
        best = min(best, time.perf_counter() - start)
    return round(best, 4)
