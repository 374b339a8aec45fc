"""EFS-style ceilings: writes wait for tokens, the delivered rate matches the configured one."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from mount_util import stream_landing

from fusethrottle.metering.ceilings import BURST_SECONDS, Ceilings
from fusethrottle.metering.meter import Meter, OpClass, profile

MiB = 1 << 20


def run_mock(fn) -> None:  # type: ignore[no-untyped-def]
    trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))


def test_many_writers_share_the_metered_limit_exactly() -> None:
    async def main() -> None:
        ceilings = Ceilings(Meter(profile("efs")), metered_limit=10 * MiB)
        passed = 0

        async def writer() -> None:
            nonlocal passed
            while True:
                await ceilings.wait(OpClass.DATA_WRITE, 256 * 1024)
                passed += 256 * 1024

        async with trio.open_nursery() as nursery:
            for _ in range(7):
                nursery.start_soon(writer)
            await trio.sleep(100.0)
            nursery.cancel_scope.cancel()
        expected = 10 * MiB * (100.0 + BURST_SECONDS)
        assert abs(passed - expected) / expected < 0.01

    run_mock(main)


def test_one_byte_writes_pay_a_full_minimum_and_five_units() -> None:
    async def main() -> None:
        ceilings = Ceilings(Meter(profile("efs")), ops_limit=500)  # 100 writes/s
        count = 0
        with trio.move_on_after(10.0):
            while True:
                await ceilings.wait(OpClass.DATA_WRITE, 1)
                count += 1
        assert 1000 <= count <= 1000 + 500 * BURST_SECONDS / 5 + 1

    run_mock(main)


def test_reads_and_metadata_pass_free_unless_asked() -> None:
    meter = Meter(profile("efs"))
    free = Ceilings(meter, metered_limit=MiB, ops_limit=10)
    assert not free.applies_to(OpClass.DATA_READ)
    assert not free.applies_to(OpClass.META_WRITE)
    assert free.applies_to(OpClass.DATA_WRITE)
    strict = Ceilings(meter, metered_limit=MiB, throttle_reads=True)
    assert strict.applies_to(OpClass.META_READ)
    assert not Ceilings(meter).active


@pytest.mark.mount
def test_a_real_mount_never_lets_more_than_the_limit_through(make_mount) -> None:
    """Through a real mount, a writer that hands over several bursts' worth at once (and
    fsyncs it): the target receives no more than the metered limit allows over the time that
    passed (plus the burst), and all of it arrives. The bucket's exactness is tested above
    under MockClock; the rate a real mount delivers is the bench's to measure (``python -m
    bench run --target tmpfs --victim none --arms ft-adaptive:metered_limit=16M``).

    Measured at the target, because the writeback cache lets the writer run ahead of it by the
    kernel's share of the window; what the ceiling promises is the rate the target sees.

    No margin of time here can flake: the bound grows with the time that passed, so a loaded
    machine (a late write, a late sample) only makes it looser, and the size is read before
    the clock, which starts before the first write. Nothing has to happen by a deadline
    either: the test waits until everything has landed, and its one limit is a hang guard.
    """
    limit = 8 * MiB
    burst = int(max(limit * BURST_SECONDS, MiB))  # the bucket starts full (ceilings.Ceilings)
    total = 2 * burst + 4 * MiB  # at least half a second at the limit, past the burst
    daemon = make_mount(options=[f"metered_limit={limit}", "mode=off"])
    assert daemon.source is not None
    samples = stream_landing(daemon.mountpoint / "stream.bin", daemon.source / "stream.bin", total)
    for elapsed, size in samples:
        allowed = burst + limit * elapsed + MiB  # one write may be passing the gate
        assert size <= allowed, f"{size / MiB:.1f} MiB landed after {elapsed:.2f} s"
