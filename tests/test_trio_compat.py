"""The trio compatibility shim: the keyword that abandons a stuck thread works on this trio."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable

import pytest
import trio

from fusethrottle.trio_compat import ABANDON_KW, run_sync_abandoning


async def _with_keyword(fn: Callable[[], object]) -> object:
    return await trio.to_thread.run_sync(fn, **ABANDON_KW)


@pytest.mark.parametrize("run", [_with_keyword, run_sync_abandoning], ids=["keyword", "helper"])
def test_a_cancelled_caller_leaves_a_stuck_thread_behind(
    run: Callable[[Callable[[], object]], Awaitable[object]],
) -> None:
    stuck = threading.Event()
    unstick = threading.Timer(30.0, stuck.set)  # only so that a broken shim cannot hang the run
    unstick.start()

    async def main() -> None:
        assert await run(lambda: 5) == 5  # what the thread returns comes back
        with trio.move_on_after(0.05):
            await run(stuck.wait)
        # Out of the call while its thread still waits: the thread was abandoned, not awaited.
        assert not stuck.is_set()

    try:
        trio.run(main)
    finally:
        stuck.set()
        unstick.cancel()
