"""The write budget owns the window: it changes once per fsync sample or error, a window that
grows lets queued writers in at once, and the kernel's share follows it off the event loop."""

from __future__ import annotations

import errno
import threading
from pathlib import Path

import pytest
import trio
import trio.testing

from fusethrottle.window import kernel_cache
from fusethrottle.window.budget import STARTUP_WINDOW, WriteBudget
from fusethrottle.window.controller import AdaptiveController
from fusethrottle.window.kernel_cache import KernelCache, kernel_share
from fusethrottle.window.ledger import Ledger

MiB = 1 << 20


class Steerable:
    """A controller the test moves by hand: its window is whatever the test last set."""

    def __init__(self, window: int, commit_rate: float | None = 20.0 * MiB) -> None:
        self.window = window
        self.commit_rate = commit_rate
        self.next_window = window

    def on_sample(
        self, now: float, nbytes: int, seconds: float, in_flight: int, admitted: int | None = None
    ) -> int:
        self.window = self.next_window
        self.commit_rate = nbytes / seconds
        return self.window

    def on_error(self, now: float, err: int) -> int:
        self.window = self.next_window
        return self.window


def run_mock(fn) -> None:  # type: ignore[no-untyped-def]
    trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))


def test_the_window_moves_only_when_a_sync_reports() -> None:
    controller = Steerable(64 * MiB)
    budget = WriteBudget(Ledger(), controller, batch=16 * MiB)  # type: ignore[arg-type]
    assert budget.window() == budget.total_window() == 64 * MiB
    controller.next_window = controller.window = 32 * MiB  # moved behind the budget's back
    assert budget.window() == 64 * MiB  # a value, not a computation per write
    budget.sampled(1.0, 16 * MiB, 1.0)
    assert budget.window() == 32 * MiB
    controller.next_window = 16 * MiB
    budget.sync_failed(2.0, errno.EIO)
    assert budget.window() == 16 * MiB and budget.statistics().window_bytes == 16 * MiB


def test_a_fresh_mount_admits_the_slow_start_window_until_a_sync_measures_the_target() -> None:
    controller = AdaptiveController(initial=256 * MiB, minimum=16 * MiB, maximum=2048 * MiB)
    budget = WriteBudget(Ledger(), controller, batch=64 * MiB)
    assert budget.window() == STARTUP_WINDOW
    budget.sampled(1.0, 8 * MiB, 0.4)
    assert budget.window() > STARTUP_WINDOW


def test_a_window_that_grows_lets_queued_writers_in_at_once() -> None:
    async def main() -> None:
        controller = Steerable(MiB)
        ledger = Ledger()
        budget = WriteBudget(ledger, controller, batch=MiB)  # type: ignore[arg-type]
        ledger.reserve(MiB)
        ledger.written(7, MiB, MiB, trio.current_time())  # the window is full
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
            assert admitted_at == [] and budget.waiting == 1
            controller.next_window = 2 * MiB
            budget.sampled(trio.current_time(), 0, 1.0)  # no byte synced, the window grew
            await trio.sleep(0.1)
            nursery.cancel_scope.cancel()
        assert admitted_at == [pytest.approx(1.0)]

    run_mock(main)


@pytest.fixture
def bdi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for /sys/class/bdi/<dev>/ (the real one is exercised by the mount tests)."""
    (tmp_path / "0:99").mkdir()
    (tmp_path / "0:99" / "max_bytes").write_text("0\n")
    monkeypatch.setattr(kernel_cache, "bdi_dir", lambda device: str(tmp_path / device))
    return tmp_path / "0:99" / "max_bytes"


def test_the_kernel_share_follows_the_window_in_a_thread(
    bdi: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sysfs write never runs on the event loop's thread, and the gate's part of the window
    is the total less the share in force."""
    cache = KernelCache(enabled=True, limit=32 * MiB)
    cache.attach("0:99", 256 * MiB)
    assert int(bdi.read_text()) == 32 * MiB
    writers: list[str] = []
    update = cache.update

    def recording_update(window: int, *, force: bool = False) -> None:
        writers.append(threading.current_thread().name)
        update(window, force=force)

    monkeypatch.setattr(cache, "update", recording_update)
    controller = Steerable(256 * MiB)

    async def main() -> None:
        budget = WriteBudget(Ledger(), controller, batch=64 * MiB, kernel_cache=cache)  # type: ignore[arg-type]
        loop_thread = threading.current_thread().name
        assert budget.window() == 224 * MiB
        async with trio.open_nursery() as nursery:
            await nursery.start(budget.keep_kernel_share)
            controller.next_window = 32 * MiB
            budget.sampled(trio.current_time(), MiB, 1.0)
            await trio.sleep(1.0)
            nursery.cancel_scope.cancel()
        assert writers and loop_thread not in writers
        assert int(bdi.read_text()) == kernel_share(32 * MiB, 32 * MiB)
        assert budget.window() == 32 * MiB - kernel_share(32 * MiB, 32 * MiB)

    trio.run(main)


def test_a_write_whose_request_stops_waiting_stays_counted_until_its_call_ends() -> None:
    """A caller killed while its pwrite is in a worker thread (or a shutdown that gives up on
    it): the request is answered, but the bytes may still land, so they stay in the window and
    are named as the file's until the call ends; then they count as landed, to be synced."""

    async def main() -> None:
        ledger = Ledger()
        budget = WriteBudget(ledger, Steerable(64 * MiB), batch=64 * MiB)  # type: ignore[arg-type]
        target_answers = trio.Event()
        ended: list[str] = []

        async def slow_pwrite() -> int:
            await target_answers.wait()
            return MiB

        async with trio.open_nursery() as nursery:
            await nursery.start(budget.run)
            with trio.move_on_after(1.0) as request:
                await budget.write(3, MiB, slow_pwrite, ended=lambda: ended.append("ended"))
            assert request.cancelled_caught  # the request was answered without the write
            state = ledger.file(3)
            assert ledger.unsynced == MiB and state is not None and state.unsynced == MiB
            assert ended == []
            target_answers.set()
            await budget.landed()
            nursery.cancel_scope.cancel()
        state = ledger.file(3)
        assert ended == ["ended"]
        assert state is not None and state.dirty == MiB and ledger.unsynced == MiB
        assert ledger.reserved == 0

    run_mock(main)


def test_a_write_abandoned_before_its_turn_is_never_sent() -> None:
    """Writes of one file go one at a time: one whose request stopped waiting while it queued
    behind another is not sent later, and gives its admission back."""

    async def main() -> None:
        ledger = Ledger()
        budget = WriteBudget(ledger, Steerable(64 * MiB), batch=64 * MiB)  # type: ignore[arg-type]
        order = trio.Lock()
        sent: list[int] = []
        first_may_end = trio.Event()

        def pwrite(n: int):  # type: ignore[no-untyped-def]
            async def send() -> int:
                sent.append(n)
                if n == 1:
                    await first_may_end.wait()
                return 4096

            return send

        async with trio.open_nursery() as nursery:
            await nursery.start(budget.run)
            nursery.start_soon(lambda: budget.write(5, 4096, pwrite(1), order=order))
            await trio.sleep(0.1)
            with trio.move_on_after(1.0):
                await budget.write(5, 4096, pwrite(2), order=order)
            first_may_end.set()
            await budget.landed()
            nursery.cancel_scope.cancel()
        assert sent == [1]
        assert ledger.unsynced == 4096 and ledger.reserved == 0

    run_mock(main)


def test_a_write_that_fails_after_its_request_stopped_waiting_is_uncounted_and_kept_as_lost() -> (
    None
):
    async def main() -> None:
        ledger = Ledger()
        budget = WriteBudget(ledger, Steerable(64 * MiB), batch=64 * MiB)  # type: ignore[arg-type]
        target_answers = trio.Event()

        async def failing() -> int:
            await target_answers.wait()
            raise OSError(errno.ENOSPC, "full")

        async with trio.open_nursery() as nursery:
            await nursery.start(budget.run)
            with trio.move_on_after(1.0):
                await budget.write(4, MiB, failing)
            target_answers.set()
            await budget.landed()
            nursery.cancel_scope.cancel()
        assert ledger.unsynced == 0 and ledger.reserved == 0
        assert ledger.lost == {4: errno.ENOSPC}

    run_mock(main)
