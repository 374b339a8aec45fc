"""The controller against the model target: the claims of issue 4, checked deterministically.

Every run is model time (no clock, no threads), seeded, and takes milliseconds. The model is
described in ``bench/model.py``. Targets jitter each fsync's cost by +-10% (+-20%
where noted), so "does not oscillate" means something.
"""

from __future__ import annotations

import pytest

from bench import model as sim
from bench.model import MiB
from fusethrottle.window.controller import DEFAULT_DRAIN_S, AdaptiveController, StaticController

MIN, MAX, DRAIN = 16 * MiB, 2048 * MiB, DEFAULT_DRAIN_S
SETTLE_SAMPLES = 20  # the bound the claims are held to


def adaptive(i: int = 0, initial: int = 256 * MiB) -> AdaptiveController:
    return AdaptiveController(initial=initial, minimum=MIN, maximum=MAX, drain_s=DRAIN)


def expected_window(capacity: float) -> float:
    """Capacity x target latency: the window that drains in ``drain_s``, within bounds."""
    return min(max(capacity * DRAIN, MIN), MAX)


# --- the model itself -------------------------------------------------------------------------


def test_a_lone_fsync_takes_its_bytes_over_capacity_plus_base_latency() -> None:
    target = sim.ModelTarget.steps((0.0, 10 * MiB), latency=0.5)
    spec = sim.MountSpec(StaticController(64 * MiB), batch=64 * MiB, writer_rate=1e12)
    first = sim.simulate(target, [spec], 10.0).mounts[0].samples[0]
    # As the real flusher does (ledger.sync_trigger), the first fsync starts at half the window.
    assert first.nbytes == 32 * MiB
    assert first.seconds == pytest.approx(3.2 + 0.5)


def test_a_fifo_target_gives_each_mount_a_share_in_proportion_to_what_it_queues() -> None:
    # Why fairness is the controllers' job in this model: static windows stay unequal shares.
    # (Windows below ``batch``, so each fsync carries a whole window.)
    target = sim.ModelTarget.steps((0.0, 100 * MiB))
    specs = [sim.MountSpec(StaticController(w * MiB)) for w in (16, 48)]
    small, big = sim.simulate(target, specs, 200.0).mounts
    assert big.throughput(50, 200) / small.throughput(50, 200) == pytest.approx(3.0, rel=0.1)


def test_static_window_is_never_exceeded_and_a_fast_target_is_kept_busy() -> None:
    target = sim.ModelTarget.steps((0.0, 50 * MiB), jitter=0.1)
    trace = sim.simulate(target, [sim.MountSpec(StaticController(256 * MiB))], 120.0).mounts[0]
    assert max(trace.unsynced) <= 256 * MiB
    assert trace.throughput(20, 120) == pytest.approx(50 * MiB, rel=0.02)


# --- claims -----------------------------------------------------------------------------------

STEPS = [(100, 25), (25, 100), (100, 10), (10, 100), (20, 1), (1, 20), (50, 200), (200, 50)]


@pytest.mark.parametrize(("before", "after"), STEPS, ids=[f"{a}->{b}MiBps" for a, b in STEPS])
def test_after_a_step_the_window_settles_near_capacity_times_drain_time(
    before: int, after: int
) -> None:
    res = sim.run_step(adaptive, before=before * MiB, after=after * MiB, at=300, duration=700)
    trace = res.mounts[0]
    start = sim.settling_samples(trace, 0, 300, expected_window(before * MiB))
    step = sim.settling_samples(trace, 300, 700, expected_window(after * MiB))
    assert start is not None and start <= SETTLE_SAMPLES
    assert step is not None and step <= SETTLE_SAMPLES


@pytest.mark.parametrize("capacity", [5, 20, 100, 400])
def test_in_steady_state_the_window_does_not_oscillate(capacity: int) -> None:
    res = sim.run_step(
        adaptive,
        before=capacity * MiB,
        after=capacity * MiB,
        at=0,
        duration=900,
        jitter=0.2,
        writer_rate=max(400, 2 * capacity) * MiB,
    )
    trace = res.mounts[0]
    assert len(trace.samples_between(300, 900)) >= 30
    assert sim.oscillation(trace, 300, 900) <= 0.2
    windows = [s.window for s in trace.samples_between(300, 900)]
    mean = sum(windows) / len(windows)
    assert mean == pytest.approx(expected_window(capacity * MiB), rel=0.2)


@pytest.mark.parametrize("capacity", [20, 50, 100])
def test_after_a_60_s_stall_it_recovers_without_a_burst(capacity: int) -> None:
    cap = capacity * MiB
    res = sim.run_stall(adaptive, capacity=cap, at=200, length=60, duration=500)
    trace = res.mounts[0]
    before = [s.window for s in trace.samples_between(100, 200)]
    settled = sum(before) / len(before)
    # The stall is one event: the window is halved once, not once per late answer.
    after_stall = trace.samples_between(260, 500)
    assert sum(1 for s in after_stall if s.seconds >= 30) == 1
    # No burst: neither the window nor the un-synced bytes go above their pre-stall level.
    assert max(s.window for s in after_stall) <= 1.2 * settled
    assert trace.unsynced_between(260, 500) <= 1.05 * trace.unsynced_between(100, 200)
    # ...and it comes back: throughput within 10 s, the window within the settling bound.
    recovery = sim.recovery_time(trace, 260, cap, fraction=0.9)
    assert recovery is not None and recovery <= 10.0
    resettle = sim.settling_samples(trace, 260, 500, settled)
    assert resettle is not None and resettle <= SETTLE_SAMPLES


def _shares(res: sim.SimResult, start: float, end: float) -> list[float]:
    return [m.throughput(start, end) for m in res.mounts]


@pytest.mark.parametrize("count", [2, 8])
@pytest.mark.parametrize("stagger", [0.0, 60.0])
def test_hosts_sharing_one_target_converge_to_fair_shares(count: int, stagger: float) -> None:
    # Backup hosts with the same settings, on a FIFO target (a host's share follows what it
    # queues, so fairness is up to the controllers), starting together or a minute apart.
    cap = 100 * MiB
    last = (count - 1) * stagger
    res = sim.run_shared(adaptive, count, capacity=cap, stagger=stagger, duration=last + 300)
    shares = _shares(res, last + 200, last + 300)
    assert sim.jain_index(shares) >= 0.9
    assert sum(shares) >= 0.95 * cap  # fair, and the target is still kept busy


@pytest.mark.parametrize(("count", "capacity"), [(2, 100), (2, 400), (8, 100)])
def test_even_windows_64x_apart_converge_to_fair_shares(count: int, capacity: int) -> None:
    # The slow case: the fixed fairness step closes the gap by about smoothing x step / window
    # per fsync, so large, unequal windows take minutes (see controller.py, rule 5).
    def factory(i: int) -> AdaptiveController:
        return adaptive(i, initial=(16 if i % 2 else 1024) * MiB)

    res = sim.run_shared(factory, count, capacity=capacity * MiB, duration=1200)
    assert sim.jain_index(_shares(res, 1100, 1200)) >= 0.9


def test_jain_index_spans_one_over_n_to_one() -> None:
    assert sim.jain_index([5.0, 5.0, 5.0, 5.0]) == pytest.approx(1.0)
    assert sim.jain_index([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)


def test_when_the_target_slows_adaptive_holds_far_less_than_static() -> None:
    # The bench's degrade scenario in the model: 20 MiB/s, then 1 MiB/s for 60 s, then 20.
    def run(controller_factory: sim.ControllerFactory) -> sim.MountTrace:
        target = sim.ModelTarget.steps(
            (0.0, 20 * MiB), (120.0, 1 * MiB), (180.0, 20 * MiB), jitter=0.1
        )
        spec = sim.MountSpec(controller_factory(0))
        return sim.simulate(target, [spec], 300.0).mounts[0]

    static = run(lambda i: StaticController(256 * MiB))
    adapt = run(adaptive)
    # Data that anything waiting on the target must wait for, at the worst moment of the slow
    # phase: a quarter or less of static's.
    assert adapt.unsynced_between(120, 180) <= 0.25 * static.unsynced_between(120, 180)
    # And it gives the speed back: after the slow phase it is within 20% of the window for
    # 20 MiB/s again.
    assert sim.settling_samples(adapt, 180, 300, expected_window(20 * MiB)) is not None
