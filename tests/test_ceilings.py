"""EFS-style ceilings through a real mount: the target never receives more than the limit allows.

The bucket's arithmetic and the hold of a write over the budget are the engine's unit tests
(engine/tests/window_test.cc)."""

from __future__ import annotations

import pytest
from mount_util import stream_landing

MiB = 1 << 20
#: What the engine's bucket may spend at once, in seconds of its rate (engine/src/ceilings.h).
BURST_SECONDS = 0.25


@pytest.mark.mount
def test_a_real_mount_never_lets_more_than_the_limit_through(make_mount) -> None:
    """Through a real mount, a writer that hands over several bursts' worth at once (and
    fsyncs it): the target receives no more than the metered limit allows over the time that
    passed (plus the burst), and all of it arrives. The bucket's exactness is the engine's
    unit test; the rate a real mount delivers is the bench's to measure (``python -m
    bench run --target tmpfs --victim none --arms ft-adaptive:metered_limit=16M``).

    Measured at the target, because the writeback cache lets the writer run ahead of it by the
    kernel's share of the window; what the ceiling promises is the rate the target sees.

    No margin of time here can flake: the bound grows with the time that passed, so a loaded
    machine (a late write, a late sample) only makes it looser, and the size is read before
    the clock, which starts before the first write. Nothing has to happen by a deadline
    either: the test waits until everything has landed, and its one limit is a hang guard.
    """
    limit = 8 * MiB
    burst = int(max(limit * BURST_SECONDS, MiB))  # the bucket starts full
    total = 2 * burst + 4 * MiB  # at least half a second at the limit, past the burst
    daemon = make_mount(options=[f"metered_limit={limit}", "mode=off"])
    assert daemon.source is not None
    samples = stream_landing(daemon.mountpoint / "stream.bin", daemon.source / "stream.bin", total)
    for elapsed, size in samples:
        allowed = burst + limit * elapsed + MiB  # one write may be passing the gate
        assert size <= allowed, f"{size / MiB:.1f} MiB landed after {elapsed:.2f} s"
