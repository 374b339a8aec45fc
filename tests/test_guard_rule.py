"""The pressure guard's rule and PSI arithmetic, without a mount (pure: given times and shares)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fusethrottle.guard.pressure import (
    PressureUnavailable,
    Reading,
    pressure_files,
    some_total,
    stall_share,
)
from fusethrottle.guard.rule import GuardRule, GuardSettings, GuardState

MiB = 1024 * 1024
STEP = 0.5  # seconds between readings, as the watcher takes them

PSI = """some avg10=1.46 avg60=0.60 avg300=0.53 total=3150084
full avg10=0.08 avg60=0.23 avg300=0.41 total=2693417
"""


def run(rule: GuardRule, trace: list[tuple[float, int]], start: float = 0.0) -> list:
    """Feed (share, bytes written per step) readings, STEP apart; the decisions."""
    out = []
    for i, (share, written) in enumerate(trace):
        out.append(rule.step(start + i * STEP, share, written))
    return out


def idle(n: int, share: float = 0.01) -> list[tuple[float, int]]:
    return [(share, 0)] * n


def writing(n: int, share: float, rate: float = 200 * MiB) -> list[tuple[float, int]]:
    return [(share, int(rate * STEP))] * n


def test_the_psi_some_total_is_read_and_a_garbled_file_is_refused() -> None:
    assert some_total(PSI) == 3150084
    with pytest.raises(ValueError):
        some_total("full avg10=0.00 total=5\n")


def test_the_stall_share_is_the_worst_resource_and_a_reset_counter_counts_nothing() -> None:
    before = Reading(10.0, (1_000_000, 5_000_000))
    after = Reading(11.0, (1_100_000, 5_400_000))  # memory 10%, io 40% of one second
    assert stall_share(before, after) == pytest.approx(0.4)
    assert stall_share(after, Reading(12.0, (0, 0))) == 0.0  # a cgroup made anew
    assert stall_share(after, after) == 0.0


def test_a_guard_without_pressure_files_says_so_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(PressureUnavailable) as err:
        pressure_files("db.slice", cgroup_root=tmp_path)
    assert "\n" not in str(err.value) and "guard=db.slice" in str(err.value)
    (tmp_path / "pressure").mkdir()
    for name in ("memory", "io"):
        (tmp_path / "pressure" / name).write_text(PSI)
    assert [f.name for f in pressure_files("host", proc=tmp_path)] == ["memory", "io"]


def test_the_line_is_learned_from_the_idle_workload_above_its_own_noise() -> None:
    rule = GuardRule()
    decisions = run(rule, idle(5, 0.03))
    assert decisions[-1].state is GuardState.LEARNING
    assert rule.line() == GuardSettings().default_some
    run(rule, idle(40, 0.03), start=10)
    assert rule.state() is GuardState.OPEN
    assert rule.line() == pytest.approx(0.03 + GuardSettings().margin)
    # A workload that never stalls gets the floor, not zero: PSI's noise would hold it shut.
    calm = GuardRule()
    run(calm, idle(40, 0.0))
    assert calm.line() == max(GuardSettings().floor, GuardSettings().margin)


def test_guard_some_sets_the_line_by_hand() -> None:
    rule = GuardRule(GuardSettings(some=0.2))
    run(rule, idle(40, 0.15))
    assert rule.line() == 0.2
    assert run(rule, writing(4, 0.19), start=30)[-1].limit is None


def test_a_stall_while_the_backup_writes_cuts_its_rate_and_a_calm_one_gives_it_back() -> None:
    rule = GuardRule()
    run(rule, idle(20, 0.01) + writing(10, 0.01, 200 * MiB))
    assert rule.limit is None
    cut = run(rule, writing(1, 0.30, 200 * MiB), start=15)[-1]
    assert cut.state is GuardState.HOLDING and cut.changed
    assert cut.limit == pytest.approx(100 * MiB, rel=0.05)
    # Still stalled: one more cut per hold period, not one per reading.
    later = run(rule, writing(3, 0.30, 100 * MiB), start=15.5)
    assert [d.limit for d in later[:1]] == [cut.limit]
    assert later[-1].limit == pytest.approx(cut.limit / 2, rel=0.01)
    # Calm again: the rate climbs back additively, then the limit goes.
    climbing = run(rule, writing(60, 0.005, 50 * MiB), start=20)
    limits = [d.limit for d in climbing if d.limit is not None]
    assert limits == sorted(limits)
    assert climbing[-1].limit is None and climbing[-1].state is GuardState.OPEN
    assert sum(d.changed for d in climbing) == 1
    assert climbing[-1].held_seconds > 5


def test_the_backup_is_never_held_below_guard_min_so_it_always_finishes() -> None:
    rule = GuardRule(GuardSettings(min_rate=8 * MiB))
    decisions = run(rule, idle(20) + writing(200, 0.9, 10 * MiB))
    assert min(d.limit for d in decisions if d.limit is not None) == 8 * MiB


def test_an_idle_backup_teaches_nothing_while_it_is_held_back() -> None:
    rule = GuardRule()
    run(rule, idle(20, 0.01) + writing(2, 0.5))
    assert rule.limit is not None
    line = rule.line()
    run(rule, idle(20, 0.5), start=20)  # the backup paused, the workload still stalls
    assert rule.line() == line


@given(
    st.lists(
        st.tuples(st.floats(0.0, 5.0), st.floats(0.0, 1.0), st.integers(0, 1 << 31)),
        max_size=200,
    ),
    st.floats(1024, 64 * MiB),
)
def test_whatever_the_readings_the_limit_is_none_or_at_least_guard_min(
    steps: list[tuple[float, float, int]], min_rate: float
) -> None:
    rule = GuardRule(GuardSettings(min_rate=min_rate))
    now, held = 0.0, 0.0
    for dt, share, written in steps:
        now += dt
        decision = rule.step(now, share, written)
        assert decision.limit is None or decision.limit >= min_rate
        assert decision.held_seconds >= held
        assert (decision.limit is not None) == (decision.state is GuardState.HOLDING)
        held = decision.held_seconds
