"""What the quick start says about its run, in sentences computed from that run's numbers.

The quick start writes one backup directly and one through fusethrottle while a database shares
their memory cgroup. What the user must be told is the database's worst wait in each case, the
backup's speed in each case, and, when the run does not show the database protected, that it
does not: a fixed closing text would claim the protection whether this run showed it or not.
Pure: numbers in, lines out, so every branch is tested without a mount
(tests/test_quickstart_verdict.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: A wait a database's client notices (the bench's stall bound, bench.neighbour.STALL_S).
STALL_MS = 500.0
#: How many times shorter the worst wait through the mount must be to count as protection.
FACTOR = 2.0


@dataclass(frozen=True)
class ArmNumbers:
    """One arm of the run, as the verdict needs it (None: not measured)."""

    #: The database's longest transaction, ms.
    worst_ms: float
    #: Whole seconds of the arm in which it finished no transaction.
    dead_seconds: int
    #: Its transactions per second over the arm.
    ops_per_s: float | None
    #: The backup's MiB on the target while the target's rate schedule ran.
    backup_mib: float | None
    #: Peak of the pages dirty or under write-back in the shared memory cgroup, MiB.
    cgroup_dirty_peak_mib: float | None


def _ms(value: float) -> str:
    return f"{value / 1000:.1f} s" if value >= 10_000 else f"{value:.0f} ms"


def _times(a: float, b: float) -> str:
    """How many times *a* is *b*, rounded the way a person reads it."""
    ratio = a / b if b > 0 else math.inf
    if ratio >= 100:
        return "over 100 times"
    return f"{ratio:.0f} times" if ratio >= 10 else f"{ratio:.1f} times"


def _count(n: int) -> str:
    return "none" if n == 0 else str(n)


def database_lines(direct: ArmNumbers, through: ArmNumbers) -> list[str]:
    """The database's worst transaction directly and through the mount, and what that shows."""
    both = (
        f"directly its worst transaction took {_ms(direct.worst_ms)}, through fusethrottle "
        f"{_ms(through.worst_ms)}"
    )
    slow = (
        f"Seconds in which it finished no transaction: {_count(direct.dead_seconds)} directly, "
        f"{_count(through.dead_seconds)} through fusethrottle."
    )
    if direct.worst_ms < STALL_MS:
        return [
            f"This run shows no difference: {both}. Written directly, the backup did not hold "
            f"the database up for {STALL_MS / 1000:.1f} s or more this time, so there was "
            "nothing to protect it from."
        ]
    if through.worst_ms > direct.worst_ms:
        return [f"This run shows no protection: {both}, longer. {slow}"]
    if through.worst_ms * FACTOR > direct.worst_ms:
        return [f"This run shows no difference: {both}, not {FACTOR:.0f} times less. {slow}"]
    lines = [f"The database: {both}, {_times(direct.worst_ms, through.worst_ms)} less. {slow}"]
    if through.worst_ms >= STALL_MS:
        lines.append(
            f"Through fusethrottle too a transaction took {_ms(through.worst_ms)}: less, "
            "not nothing."
        )
    return lines


def throughput_line(direct: ArmNumbers, through: ArmNumbers) -> str | None:
    """The database's transactions per second in each arm (None: not measured)."""
    if not direct.ops_per_s or not through.ops_per_s:
        return None
    return (
        f"It completed {through.ops_per_s:.1f} transactions a second through fusethrottle, "
        f"{direct.ops_per_s:.1f} directly ({_compare(through.ops_per_s, direct.ops_per_s)})."
    )


def _compare(a: float, b: float) -> str:
    """*a* against *b* in words: how many percent more or less, or how many times as much."""
    if a >= 1.5 * b:
        return f"{a / b:.1f} times as many"
    if b >= 1.5 * a:
        return f"{b / a:.1f} times fewer"
    pct = (a / b - 1) * 100
    if round(abs(pct), 1) == 0:
        return "the same"
    return f"{abs(pct):.{1 if abs(pct) < 10 else 0}f}% {'more' if pct > 0 else 'less'}"


def backup_line(direct: ArmNumbers, through: ArmNumbers, seconds: float | None) -> str | None:
    """The backup's bytes on the target while the schedule ran, in each arm (None: not
    measured). Over the schedule both arms had the same target; the time until the data was
    durable would favour the direct write, whose cache drains after it at the fast last rate."""
    if not seconds or not direct.backup_mib or not through.backup_mib:
        return None
    return (
        f"The backup put {through.backup_mib:.0f} MiB on the target in the {seconds:g} s "
        f"through fusethrottle, {direct.backup_mib:.0f} MiB directly "
        f"({_compare(through.backup_mib, direct.backup_mib)})."
    )


def memory_line(direct: ArmNumbers, through: ArmNumbers) -> str | None:
    """What waited for the target in the memory the database shares (None: not measured)."""
    if direct.cgroup_dirty_peak_mib is None or through.cgroup_dirty_peak_mib is None:
        return None
    return (
        f"Pages waiting to be written (Dirty+Writeback) in the shared memory cgroup peaked at "
        f"{direct.cgroup_dirty_peak_mib:.0f} MiB directly, "
        f"{through.cgroup_dirty_peak_mib:.0f} MiB through fusethrottle."
    )


def verdict(direct: ArmNumbers, through: ArmNumbers, seconds: float | None) -> list[str]:
    """Every sentence the quick start prints about its result, from its numbers alone;
    *seconds*: how long the target's rate schedule ran."""
    lines = database_lines(direct, through)
    lines += [
        line
        for line in (
            throughput_line(direct, through),
            memory_line(direct, through),
            backup_line(direct, through, seconds),
        )
        if line is not None
    ]
    return lines
