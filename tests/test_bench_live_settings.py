"""bench.live_settings' arithmetic: when a changed limit shows in the bytes landed on the target.

These numbers are what the issue's "takes effect within a second" is judged by; a reading that
called a limit in effect while the backup still ran at full speed would claim what never held.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # bench/ is not an installed package; import it from the tree
    sys.path.insert(0, str(REPO))

from bench.live_settings import (  # noqa: E402
    SAMPLE,
    landed_between,
    lift_effect,
    limit_effect,
)

MiB = 1 << 20


def trace(rates: list[tuple[float, float]], end: float) -> list[tuple[float, int]]:
    """Samples every SAMPLE seconds of a writer landing at *rates* ((from second, bytes/s))."""
    samples, landed, t = [], 0.0, 0.0
    while t <= end:
        rate = [r for start, r in rates if start <= t][-1]
        samples.append((round(t, 4), int(landed)))
        landed += rate * SAMPLE
        t += SAMPLE
    return samples


def test_landed_between_reads_the_last_sample_before_each_end() -> None:
    samples = [(0.0, 0), (1.0, 10 * MiB), (2.0, 30 * MiB)]
    assert landed_between(samples, 0.5, 2.0) == 30 * MiB
    assert landed_between(samples, 1.0, 1.9) == 0


def test_a_limit_in_effect_after_the_time_the_rate_came_down() -> None:
    limit = 8 * MiB
    samples = trace([(0.0, 200 * MiB), (4.6, 7 * MiB)], end=8.0)
    effect = limit_effect(samples, 4.0, 8.0, limit)
    assert effect is not None and 0.55 <= effect <= 0.7, effect


def test_a_limit_that_never_held_is_none() -> None:
    samples = trace([(0.0, 200 * MiB)], end=8.0)
    assert limit_effect(samples, 4.0, 8.0, 8 * MiB) is None


def test_a_lift_shows_when_the_rate_goes_back_up() -> None:
    limit = 8 * MiB
    samples = trace([(0.0, 7 * MiB), (8.3, 200 * MiB)], end=12.0)
    effect = lift_effect(samples, 8.0, 12.0, limit)
    assert effect is not None and 0.3 <= effect <= 0.5, effect
    assert lift_effect(trace([(0.0, 7 * MiB)], end=12.0), 8.0, 12.0, limit) is None
