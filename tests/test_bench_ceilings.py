"""bench/ceilings.py: the time a backup should take at the ceiling, its burst spent first."""

from __future__ import annotations

from bench.ceilings import expected_seconds

MiB = 1 << 20


def test_a_backup_at_the_ceiling_takes_its_size_less_the_burst_over_the_rate() -> None:
    assert expected_seconds(512 * MiB, 64 * MiB) == (512 - 16) / 64
    assert expected_seconds(8 * MiB, 64 * MiB) == 0.0  # all of it within the burst
