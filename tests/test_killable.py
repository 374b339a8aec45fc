"""Requests of callers that are being killed are answered (killable.py): pure rules, then the
watch on trio's MockClock. The real-mount test is in test_mount_lifecycle.py."""

from __future__ import annotations

import trio
import trio.testing

from fusethrottle.adapter.killable import GRACE, POLL, KillWatch, dying

ALIVE = "Name:\tcat\nSigQ:\t0/1\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000000000\n"
KILLED = "Name:\tcat\nSigPnd:\t0000000000000100\nShdPnd:\t0000000000000000\n"
TERM_HANDLED = "Name:\trsync\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000004000\n"


def test_a_pending_sigkill_is_dying_a_handled_sigterm_is_not() -> None:
    assert dying(KILLED)
    assert dying(
        KILLED.replace("SigPnd:\t0000000000000100", "SigPnd:\t0").replace(
            "ShdPnd:\t0000000000000000", "ShdPnd:\t0000000000000100"
        )
    )
    assert not dying(ALIVE)
    assert not dying(TERM_HANDLED)  # NFS waits through it too (its waits are killable only)
    assert not dying("garbage\nSigPnd:\tzz\n")


def _run(statuses: dict[int, str | None], seconds: float) -> dict[int, str]:
    """Requests of each tid that wait *seconds* on a hung target: how each ended."""
    ended: dict[int, str] = {}

    async def main() -> None:
        watch = KillWatch(status_of=statuses.get)
        async with trio.open_nursery() as nursery:
            await nursery.start(watch.run)

            async def request(tid: int) -> None:
                with watch.request(tid) as scope:
                    await trio.sleep(seconds)
                ended[tid] = "answered EINTR" if scope.cancelled_caught else "finished"

            async with trio.open_nursery() as requests:
                for tid in statuses:
                    requests.start_soon(request, tid)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return ended


def test_only_the_request_of_a_dying_caller_is_answered_early() -> None:
    ended = _run({11: KILLED, 12: ALIVE, 13: None, 0: KILLED}, seconds=60)
    assert ended == {11: "answered EINTR", 12: "finished", 13: "finished", 0: "finished"}


def test_a_request_shorter_than_the_grace_is_never_looked_at() -> None:
    looked: list[int] = []

    def status_of(tid: int) -> str:
        looked.append(tid)
        return KILLED

    async def main() -> None:
        watch = KillWatch(status_of=status_of)
        async with trio.open_nursery() as nursery:
            await nursery.start(watch.run)
            for _ in range(20):
                with watch.request(7):
                    await trio.sleep(GRACE / 4)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert looked == []
    assert POLL < GRACE
