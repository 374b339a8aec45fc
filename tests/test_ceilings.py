"""EFS-style ceilings: writes wait for tokens, the delivered rate matches the configured one."""

from __future__ import annotations

import os
import threading
import time

import pytest
import trio
import trio.testing

from fusethrottle.ceilings import BURST_SECONDS, Ceilings
from fusethrottle.meter import Meter, OpClass, profile

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
    """Through a real mount, a writer that could go at hundreds of MiB/s: the target receives no
    more than the metered limit allows over the time that passed (plus the burst), and writing
    goes on. The bucket's exactness is tested above under MockClock; the rate a real mount
    delivers is the bench's to measure (``python -m bench run --target tmpfs --victim none
    --arms ft-adaptive:metered_limit=16M``), since a loaded machine only ever delivers less.

    Measured at the target, because the writeback cache lets the writer run ahead of it by the
    kernel's share of the window; what the ceiling promises is the rate the target sees.
    """
    limit = 8 * MiB
    daemon = make_mount(options=[f"metered_limit={limit}", "mode=off"])
    assert daemon.source is not None
    path = daemon.mountpoint / "stream.bin"
    landed = daemon.source / "stream.bin"
    block = os.urandom(MiB)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    start = time.monotonic()
    stop = start + 6.0
    sizes: list[tuple[float, int]] = []

    def writer() -> None:
        while time.monotonic() < stop:
            os.write(fd, block)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        while time.monotonic() < stop:
            time.sleep(0.5)
            # Size first, then the clock: the bound is checked against at least the time passed.
            size = landed.stat().st_size
            sizes.append((time.monotonic() - start, size))
    finally:
        thread.join()
        os.close(fd)
    for elapsed, size in sizes:
        allowed = limit * (elapsed + BURST_SECONDS) + MiB  # one write may be passing the gate
        assert size <= allowed, f"{size / MiB:.1f} MiB landed after {elapsed:.1f} s"
    assert sizes[-1][1] > sizes[0][1] > 0  # throttled, not stopped
