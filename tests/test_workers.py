"""The worker pool every call into the target runs in (real threads, real trio, no mount)."""

from __future__ import annotations

import threading
import time

import pytest
import trio

from fusethrottle.target.workers import WorkerPool


def test_results_and_exceptions_come_back_to_the_caller() -> None:
    async def main() -> None:
        pool = WorkerPool("t", 2)
        assert await pool.run(lambda a, b: a + b, 2, 3) == 5
        assert await pool.run(threading.get_ident) != threading.get_ident()
        with pytest.raises(FileNotFoundError):
            await pool.run(open, "/nonexistent/fusethrottle")

    trio.run(main)


def test_never_more_threads_than_its_size_and_queued_calls_still_run() -> None:
    async def main() -> None:
        pool = WorkerPool("t", 3)
        running = 0
        peak = 0
        lock = threading.Lock()

        def job() -> None:
            nonlocal running, peak
            with lock:
                running += 1
                peak = max(peak, running)
            time.sleep(0.02)
            with lock:
                running -= 1

        async with trio.open_nursery() as nursery:
            for _ in range(12):
                nursery.start_soon(pool.run, job)
        assert peak == 3 and pool.threads == 3

    trio.run(main)


def test_a_cancelled_caller_leaves_a_hung_call_behind_and_the_loop_goes_on() -> None:
    """A hung NFS server: the call never returns; unmount must not wait for it."""
    release = threading.Event()
    finished = threading.Event()

    def hung() -> str:
        release.wait(10)
        finished.set()
        return "late"

    async def main() -> None:
        pool = WorkerPool("t", 2)
        with trio.move_on_after(0.2) as scope:
            await pool.run(hung)
        assert scope.cancelled_caught
        assert await pool.run(lambda: "other thread") == "other thread"
        release.set()
        await trio.to_thread.run_sync(finished.wait, 5)
        await trio.sleep(0.05)  # its late result is dropped, nothing is rescheduled twice

    trio.run(main)
    assert finished.is_set()


def test_idle_threads_end_and_new_calls_start_new_ones() -> None:
    """After a burst the pool shrinks back, so a long backup's thread count follows what it
    does now, not the busiest moment it ever had."""

    async def main() -> None:
        pool = WorkerPool("t", 4, idle_seconds=0.2)
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(pool.run, time.sleep, 0.05)
        assert pool.threads == 4
        deadline = time.monotonic() + 5
        while pool.threads and time.monotonic() < deadline:
            await trio.sleep(0.05)
        assert pool.threads == 0
        assert await pool.run(lambda: "again") == "again"
        assert pool.threads == 1

    trio.run(main)


def test_no_call_is_lost_while_threads_are_ending() -> None:
    """A call submitted just as the idle thread it counted on times out must still run."""

    async def main() -> None:
        pool = WorkerPool("t", 2, idle_seconds=0.0005)
        done = 0
        with trio.fail_after(30):
            for round_ in range(400):
                async with trio.open_nursery() as nursery:
                    for _ in range(1 + round_ % 3):
                        nursery.start_soon(pool.run, time.sleep, 0)
                done += 1 + round_ % 3
                if round_ % 7 == 0:
                    await trio.sleep(0.001)
        assert done == sum(1 + r % 3 for r in range(400))
        assert pool.threads <= 2

    trio.run(main)


def test_a_close_queued_behind_a_hung_call_still_runs_once_its_caller_gives_up() -> None:
    """A shutdown stops waiting for the closes of released files (on NFS a close waits for the
    server), but the descriptors are still closed once a thread is free: none is leaked, and
    none is closed twice; what nobody waits for at all (spawn) runs too."""

    async def main() -> None:
        pool = WorkerPool("t", 1)
        release = threading.Event()
        ran: list[str] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pool.run, release.wait)  # the one thread, hung on the target
            await trio.sleep(0.05)
            with trio.move_on_after(0.2) as scope:
                await pool.run(ran.append, "must run", must_run=True)
            assert scope.cancelled_caught
            with trio.move_on_after(0.2):
                await pool.run(ran.append, "skipped")
            pool.spawn(ran.append, "spawned")
            assert ran == []
            release.set()
        for _ in range(100):
            if len(ran) == 2:
                break
            await trio.sleep(0.02)
        assert ran == ["must run", "spawned"]

    trio.run(main)
