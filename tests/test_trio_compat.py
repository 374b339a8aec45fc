"""The trio compatibility shim: the keyword that abandons a stuck thread works on this trio."""

from __future__ import annotations

import threading

import trio

from fusethrottle.trio_compat import ABANDON_KW, run_sync_abandoning


def test_a_cancelled_caller_leaves_a_stuck_thread_behind() -> None:
    stuck = threading.Event()
    unstick = threading.Timer(30.0, stuck.set)  # only so that a broken shim cannot hang the run
    unstick.start()

    async def main() -> None:
        with trio.move_on_after(0.05):
            await trio.to_thread.run_sync(stuck.wait, **ABANDON_KW)
        # Out of the call while its thread still waits: the thread was abandoned, not awaited.
        assert not stuck.is_set()

    try:
        trio.run(main)
    finally:
        stuck.set()
        unstick.cancel()


def test_run_sync_abandoning_leaves_a_stuck_thread_behind_and_returns_what_it_returns() -> None:
    stuck = threading.Event()
    unstick = threading.Timer(30.0, stuck.set)
    unstick.start()

    async def main() -> None:
        assert await run_sync_abandoning(lambda a, b: a + b, 2, 3) == 5
        with trio.move_on_after(0.05):
            await run_sync_abandoning(stuck.wait)
        assert not stuck.is_set()

    try:
        trio.run(main)
    finally:
        stuck.set()
        unstick.cancel()
