"""The window gate and the flusher, on trio's MockClock: deterministic and fast.

The target here is a test double with a commit latency in (mock) seconds; real targets are
exercised by the real-mount tests.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio
import trio.testing

from fusethrottle.adapter.inodes import InodeTable
from fusethrottle.window.admission import WindowGate, pacing_rate
from fusethrottle.window.budget import WriteBudget
from fusethrottle.window.flusher import Flusher
from fusethrottle.window.ledger import Ledger

MiB = 1 << 20


class FixedWindow:
    """A controller whose window never moves. Until its first sample it has measured no commit
    rate (the budget's slow start applies, as on a fresh mount); then the rate of that sample."""

    def __init__(self, window: int, measured: bool = False) -> None:
        self.window = window
        self.commit_rate: float | None = float(window) if measured else None
        self.samples: list[tuple[int, float]] = []
        self.errors: list[int] = []

    def on_sample(
        self, now: float, nbytes: int, seconds: float, in_flight: int, admitted: int | None = None
    ) -> int:
        self.samples.append((nbytes, seconds))
        if self.commit_rate is None and seconds > 0:
            self.commit_rate = nbytes / seconds
        return self.window

    def on_error(self, now: float, err: int) -> int:
        self.errors.append(err)
        return self.window


class SlowTarget:
    """Commits at a fixed rate: an fsync of N bytes takes latency + N / rate (mock) seconds."""

    def __init__(self, ledger: Ledger, rate: float = 20 * MiB, latency: float = 0.01) -> None:
        self.ledger = ledger
        self.rate = rate
        self.latency = latency
        self.fail_with: int | None = None
        self.fsyncs: list[int] = []
        self.plans: list[object] = []  # the SyncPlan of every injected sync

    async def fsync_path(
        self,
        caller: object,
        path_fd: int,
        datasync: bool = False,
        plan: object = None,
        fd: int | None = None,
    ) -> None:
        self.fsyncs.append(path_fd)
        self.plans.append(plan)
        syncing = sum(s.syncing for s in self.ledger.files.values())
        await trio.sleep(self.latency + syncing / self.rate)
        if self.fail_with is not None:
            raise OSError(self.fail_with, os.strerror(self.fail_with))

    async def fsync_paths(
        self,
        files: list[tuple[object, int, int | None]],
        datasync: bool = False,
        plan: object = None,
    ) -> list[int | None]:
        """A group of released files: one call, one commit of everything being synced."""
        path_fds = [path_fd for _, path_fd, _ in files]
        self.fsyncs.extend(path_fds)
        syncing = sum(s.syncing for s in self.ledger.files.values())
        await trio.sleep(self.latency + syncing / self.rate)
        return [self.fail_with] * len(path_fds)


def run_mock(fn: Callable[[], Awaitable[None]]) -> None:
    trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))


@pytest.fixture
def table(tmp_path: Path):
    root = os.open(tmp_path, os.O_PATH)
    inodes = InodeTable(root, os.fstat(root))
    nodes = []
    for i in range(40):
        (tmp_path / f"f{i}").write_bytes(b"")
        fd = os.open(tmp_path / f"f{i}", os.O_PATH)
        nodes.append(inodes.register(fd, os.fstat(fd)).nodeid)
    yield inodes, nodes
    inodes.close_all()


def make(inodes: InodeTable, window: int, batch: int, max_age: float = 30.0):
    """The window's parts as the mount builds them: the budget owns the gate, the flusher
    speaks to the budget."""
    ledger = Ledger()
    controller = FixedWindow(window)
    budget = WriteBudget(
        ledger,
        controller,  # type: ignore[arg-type]
        batch=batch,
        admission_timeout=600.0,
    )
    target = SlowTarget(ledger)
    flusher = Flusher(budget, target, inodes, batch=batch, max_age=max_age)  # type: ignore[arg-type]
    return ledger, budget.gate, flusher, target, controller


async def write(ledger: Ledger, gate: WindowGate, flusher: Flusher, node: int, size: int) -> None:
    await gate.admit(size)
    await trio.sleep(0.001)  # the pwrite itself
    ledger.written(node, size, size, trio.current_time())
    flusher.poke()


def test_window_is_never_exceeded_by_many_writers(table) -> None:
    inodes, nodes = table
    window, batch = 16 * MiB, 4 * MiB

    async def main() -> None:
        ledger, gate, flusher, _target, _ = make(inodes, window, batch)
        peak = 0

        async def writer(node: int) -> None:
            nonlocal peak
            for _ in range(32):
                await write(ledger, gate, flusher, node, MiB)
                peak = max(peak, ledger.unsynced)

        async with trio.open_nursery() as outer:
            await outer.start(flusher.run)
            async with trio.open_nursery() as writers:
                for node in nodes[:8]:
                    writers.start_soon(writer, node)
            await flusher.flush_all()
            outer.cancel_scope.cancel()
        assert peak <= window
        assert ledger.synced_total == 8 * 32 * MiB
        assert ledger.unsynced == 0
        assert gate.throttled_total > 0  # back-pressure really happened

    run_mock(main)


def test_more_waiting_writers_than_worker_tasks_never_deadlock(table) -> None:
    """pyfuse3 runs at most max_tasks handlers; 300 blocked writers must still all finish."""
    inodes, nodes = table

    async def main() -> None:
        ledger, gate, flusher, _target, _ = make(inodes, 2 * MiB, MiB)
        done = 0

        async def writer(node: int) -> None:
            nonlocal done
            for _ in range(4):
                await write(ledger, gate, flusher, node, 256 * 1024)
            done += 1

        async with trio.open_nursery() as outer:
            await outer.start(flusher.run)
            with trio.fail_after(3600):
                async with trio.open_nursery() as writers:
                    for i in range(300):
                        writers.start_soon(writer, nodes[i % len(nodes)])
            outer.cancel_scope.cancel()
        assert done == 300
        assert gate.timeouts_total == 0

    run_mock(main)


def test_max_age_flushes_a_small_idle_file(table) -> None:
    inodes, nodes = table

    async def main() -> None:
        ledger, gate, flusher, _target, _ = make(inodes, 64 * MiB, 16 * MiB, max_age=30.0)
        reasons: list[str] = []
        flusher.on_fsync = lambda reason, s, n, e: reasons.append(reason)
        async with trio.open_nursery() as nursery:
            await nursery.start(flusher.run)
            await write(ledger, gate, flusher, nodes[0], 4096)
            await trio.sleep(29.0)
            assert ledger.unsynced == 4096
            await trio.sleep(2.0)
            assert ledger.unsynced == 0
            nursery.cancel_scope.cancel()
        assert reasons == ["age"]

    run_mock(main)


def test_data_aging_behind_a_long_fsync_does_not_spin_the_flusher(table) -> None:
    """A stalled target: one file's fsync takes 40 s while newer data in it passes max_age.

    The flusher must sleep until that fsync ends, then sync the aged data. (It used to wake
    at once, over and over, because the passed deadline counted a file it could not start:
    a whole core burnt and every request slowed for as long as the stall lasted.)
    """
    inodes, nodes = table

    async def main() -> None:
        ledger, gate, flusher, target, _ = make(inodes, 64 * MiB, 4 * MiB, max_age=1.0)
        target.rate = 0.1 * MiB  # the 4 MiB batch takes 40 s
        reasons: list[str] = []
        flusher.on_fsync = lambda reason, s, n, e: reasons.append(reason)
        passes = 0
        due = ledger.due

        def counting_due(*args, **kwargs):
            nonlocal passes
            passes += 1
            if passes > 1000:
                raise AssertionError("the flusher is spinning")
            return due(*args, **kwargs)

        ledger.due = counting_due  # type: ignore[method-assign]
        async with trio.open_nursery() as nursery:
            await nursery.start(flusher.run)
            await write(ledger, gate, flusher, nodes[0], 4 * MiB)  # a batch: its fsync starts
            await trio.sleep(0.5)
            await write(ledger, gate, flusher, nodes[0], MiB)  # dirty behind that fsync
            await trio.sleep(30.0)  # past max_age, the fsync still running
            assert passes < 50
            assert ledger.unsynced == 5 * MiB
            await trio.sleep(30.0)  # the batch ends at ~40 s, then the aged MiB is synced
            assert ledger.unsynced == 0
            nursery.cancel_scope.cancel()
        assert reasons == ["batch", "age"]

    run_mock(main)


def test_batch_trigger_overlaps_with_writing(table) -> None:
    """While one batch syncs, the writer keeps writing into the window (not stop-and-wait)."""
    inodes, nodes = table

    async def main() -> None:
        ledger, gate, flusher, _target, controller = make(inodes, 64 * MiB, 16 * MiB)
        overlapped = 0
        async with trio.open_nursery() as nursery:
            await nursery.start(flusher.run)
            for _ in range(256):
                await write(ledger, gate, flusher, nodes[0], MiB)
                overlapped += flusher.statistics().in_flight > 0
            await flusher.flush_all()
            nursery.cancel_scope.cancel()
        assert len(controller.samples) >= 4
        # The first sync comes early, within the slow-start window (nothing measured yet);
        # every later one at the batch.
        assert all(n >= 16 * MiB for n, _ in controller.samples[1:-1])
        assert overlapped > 200

    run_mock(main)


def test_unmount_flushes_every_file(table) -> None:
    inodes, nodes = table

    async def main() -> None:
        ledger, gate, flusher, target, _ = make(inodes, 256 * MiB, 64 * MiB)
        async with trio.open_nursery() as nursery:
            await nursery.start(flusher.run)
            for node in nodes[:10]:
                await write(ledger, gate, flusher, node, 1000)
            assert target.fsyncs == []
            failed = await flusher.flush_all("unmount")
            nursery.cancel_scope.cancel()
        assert failed == []
        assert ledger.unsynced == 0
        assert len(target.fsyncs) == 10

    run_mock(main)


def test_failed_fsync_is_kept_and_reported_not_swallowed(table) -> None:
    inodes, nodes = table

    async def main() -> None:
        ledger, gate, flusher, target, controller = make(inodes, 8 * MiB, 4 * MiB)
        target.fail_with = errno.EIO
        async with trio.open_nursery() as nursery:
            await nursery.start(flusher.run)
            for _ in range(4):
                await write(ledger, gate, flusher, nodes[0], MiB)
            await trio.sleep(0.5)
            assert flusher.fsync_errors_total >= 1
            assert ledger.unsynced == 4 * MiB  # still owed to the target
            assert controller.errors and controller.errors[0] == errno.EIO
            assert ledger.take_error(nodes[0]) == errno.EIO  # next write/fsync/close sees it
            assert ledger.take_error(nodes[0]) is None  # ...once
            target.fail_with = None
            failed = await flusher.flush_all()
            nursery.cancel_scope.cancel()
        assert failed == []
        assert ledger.unsynced == 0

    run_mock(main)


def test_a_gate_wait_is_bounded(table) -> None:
    """A target that never commits makes writes slow, never stuck forever."""
    _inodes, _nodes = table

    async def main() -> None:
        ledger = Ledger()
        gate = WindowGate(ledger, lambda: MiB, timeout=60.0)
        await gate.admit(MiB)
        start = trio.current_time()
        await gate.admit(MiB)
        assert trio.current_time() - start == pytest.approx(60.0)
        assert gate.timeouts_total == 1
        assert ledger.unsynced == 2 * MiB

    run_mock(main)


def test_mode_off_never_waits() -> None:
    async def main() -> None:
        ledger = Ledger()
        gate = WindowGate(ledger, lambda: MiB, enabled=False)
        for _ in range(10):
            assert await gate.admit(MiB) == 0.0
        assert ledger.unsynced == 10 * MiB  # still accounted

    run_mock(main)


def test_pacing_starts_at_half_the_window_and_slows_toward_the_edge() -> None:
    rate = 20 * MiB
    assert pacing_rate(rate, 100 * MiB, 256 * MiB) is None
    assert pacing_rate(rate, 128 * MiB, 256 * MiB) == pytest.approx(rate)
    assert pacing_rate(rate, 192 * MiB, 256 * MiB) == pytest.approx(rate / 2)
    assert pacing_rate(rate, 256 * MiB, 256 * MiB) == pytest.approx(rate / 10)


def test_paced_writer_never_stops_for_a_whole_fsync(table) -> None:
    """Stop-and-go is what a backup sees as a multi-second freeze; pacing spreads the wait."""
    inodes, nodes = table

    async def main() -> None:
        ledger, gate, flusher, target, controller = make(inodes, 256 * MiB, 64 * MiB)
        target.rate = 20 * MiB
        gate.commit_rate = lambda: 20 * MiB if controller.samples else None
        worst = 0.0
        async with trio.open_nursery() as nursery:
            await nursery.start(flusher.run)
            start = trio.current_time()
            for _ in range(1024):
                before = trio.current_time()
                measured = bool(controller.samples)  # the commit rate is known
                await write(ledger, gate, flusher, nodes[0], MiB)
                if measured:
                    worst = max(worst, trio.current_time() - before)
            elapsed = trio.current_time() - start
            await flusher.flush_all()
            nursery.cancel_scope.cancel()
        assert worst < 1.0, f"a write waited {worst:.1f} s"
        assert gate.paced_total > 500
        assert 1024 * MiB / elapsed > 0.9 * 20 * MiB  # pacing costs no throughput

    run_mock(main)


def test_discarding_a_files_data_wakes_the_writers_it_was_blocking() -> None:
    """open(O_TRUNC), truncate to 0 and the last unlink all go through the budget, which wakes
    queued writers (open(O_TRUNC) used to drop the bytes and leave the writers asleep)."""

    async def main() -> None:
        ledger = Ledger()
        budget = WriteBudget(ledger, FixedWindow(MiB, measured=True), batch=MiB)  # type: ignore[arg-type]
        gate = budget.gate
        ledger.reserve(MiB)
        ledger.written(7, MiB, MiB, trio.current_time())  # the window is full of file 7's data
        admitted_at: list[float] = []

        async def writer() -> None:
            async def send() -> int:
                return 4096

            await budget.write(8, 4096, send)
            admitted_at.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            await nursery.start(budget.run)
            nursery.start_soon(writer)
            await trio.sleep(1.0)
            assert admitted_at == [] and gate.waiting == 1
            budget.discard(7)
            await trio.sleep(0.1)
            nursery.cancel_scope.cancel()
        assert admitted_at == [pytest.approx(1.0)]
        assert ledger.unsynced == 4096

    run_mock(main)


def test_a_write_that_fails_gives_its_admission_back_and_wakes_the_next() -> None:
    async def main() -> None:
        ledger = Ledger()
        budget = WriteBudget(ledger, FixedWindow(MiB, measured=True), batch=MiB)  # type: ignore[arg-type]

        async def failing() -> int:
            raise OSError(errno.EIO, "target gone")

        async with trio.open_nursery() as nursery:
            await nursery.start(budget.run)
            with pytest.raises(OSError):
                await budget.write(1, MiB, failing)
            nursery.cancel_scope.cancel()
        assert ledger.unsynced == 0 and ledger.reserved == 0
        assert ledger.file(1) is None

    run_mock(main)


def test_each_injected_sync_writes_back_and_drops_what_was_written_since_the_last(table) -> None:
    """The sync plan carries the byte range written since the previous sync began; a range
    whose sync failed is carried into the next one, so no written page is left out."""
    inodes, nodes = table
    node = inodes[nodes[0]]

    async def main() -> None:
        ledger, gate, flusher, target, _ = make(inodes, 8 * MiB, 2 * MiB)
        async with trio.open_nursery() as nursery:
            await nursery.start(flusher.run)
            for k in range(2):
                node.note_written(k * MiB, MiB)
                await write(ledger, gate, flusher, nodes[0], MiB)
            await trio.sleep(0.5)
            assert [(p.written, p.drop) for p in target.plans] == [((0, 2 * MiB), True)]
            assert target.plans[0].piece >= 128 << 10
            target.fail_with = errno.EIO
            for k in range(2, 4):
                node.note_written(k * MiB, MiB)
                await write(ledger, gate, flusher, nodes[0], MiB)
            await trio.sleep(0.5)
            assert target.plans[1].written == (2 * MiB, 4 * MiB)
            target.fail_with = None
            node.note_written(4 * MiB, MiB)
            await write(ledger, gate, flusher, nodes[0], MiB)
            assert await flusher.flush_all() == []
            nursery.cancel_scope.cancel()
        assert target.plans[-1].written == (2 * MiB, 5 * MiB)

    run_mock(main)


def test_many_writers_get_equal_shares_paced_or_queued(table) -> None:
    """Sixty-four backups through one mount: each is admitted in turn. A writer that arrives
    while others wait (for room, or for their pacing slot) goes behind them, so no writer
    takes a run of admissions while the rest sleep (issue 13's "no writer starves")."""
    inodes, nodes = table
    writers = 32

    async def main() -> None:
        ledger, gate, flusher, target, controller = make(inodes, 64 * MiB, 64 * MiB)
        target.rate = 20 * MiB
        gate.commit_rate = lambda: 20 * MiB if controller.samples else None
        written = [0] * writers

        async def writer(i: int) -> None:
            while True:
                await write(ledger, gate, flusher, nodes[i], MiB)
                written[i] += MiB

        async with trio.open_nursery() as nursery:
            await nursery.start(flusher.run)
            for i in range(writers):
                nursery.start_soon(writer, i)
            await trio.sleep(10.0)  # warm up: the commit rate is measured, pacing runs
            start = list(written)
            await trio.sleep(60.0)
            shares = [now - then for now, then in zip(written, start, strict=True)]
            nursery.cancel_scope.cancel()
        mean = sum(shares) / writers
        assert gate.paced_total > 0  # the pacing clock ran
        assert max(shares) <= 1.25 * mean, f"fastest writer {max(shares) / mean:.2f}x the mean"
        assert min(shares) >= mean / 1.25, f"slowest writer 1/{mean / min(shares):.2f} of it"
        assert sum(shares) > 0.8 * 60 * 20 * MiB  # and the target stays busy

    run_mock(main)


def test_a_writer_that_gives_up_first_in_line_hands_its_turn_on() -> None:
    """A writer killed while it waits (its request interrupted) leaves the line and reserves
    nothing; the one behind it is admitted as soon as there is room."""

    async def main() -> None:
        ledger = Ledger()
        budget = WriteBudget(ledger, FixedWindow(MiB, measured=True), batch=MiB)  # type: ignore[arg-type]
        gate = budget.gate
        ledger.reserve(MiB)
        ledger.written(7, MiB, MiB, trio.current_time())  # the window is full
        admitted_at: list[float] = []

        async def second() -> None:
            await gate.admit(4096)
            admitted_at.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            with trio.move_on_after(1.0):  # the first writer gives up after a second
                async with trio.open_nursery() as first:
                    first.start_soon(gate.admit, MiB)
                    await trio.sleep(0.1)
                    nursery.start_soon(second)
                    await trio.sleep(10.0)
            assert gate.waiting == 1 and admitted_at == []
            await trio.sleep(1.0)
            budget.discard(7)
        assert admitted_at == [pytest.approx(2.0)]
        assert ledger.unsynced == 4096 and gate.waiting == 0

    run_mock(main)


def test_a_write_waiting_only_for_its_pacing_turn_does_not_count_as_blocked() -> None:
    """The flusher syncs the largest file at once when writers are blocked; a write that only
    waits its pacing turn (room is there) must not trigger that, or syncs shrink to whatever is
    dirty at the moment and the measured commit rate with them."""

    async def main() -> None:
        ledger = Ledger()
        gate = WindowGate(ledger, lambda: 64 * MiB, timeout=60.0, commit_rate=lambda: 20 * MiB)
        ledger.reserve(40 * MiB)
        ledger.written(7, 40 * MiB, 40 * MiB, trio.current_time())  # above half the window
        seen: list[int] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(gate.admit, MiB)  # admitted at once, starts the pacing clock
            nursery.start_soon(gate.admit, MiB)  # waits its turn
            await trio.sleep(0.01)
            seen.append(gate.waiting)
        assert seen == [0] and gate.paced_total == 1 and gate.throttled_total == 0
        ledger.reserve(22 * MiB)  # now the window is full
        async with trio.open_nursery() as nursery:
            nursery.start_soon(gate.admit, 4 * MiB)
            await trio.sleep(0.01)
            seen.append(gate.waiting)
            ledger.unreserve(22 * MiB)
            gate.wake()
        assert seen == [0, 1] and gate.throttled_total == 1

    run_mock(main)
