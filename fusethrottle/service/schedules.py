"""Follow the ceilings' time-of-day schedules (``metered_limit=100M,01:00-06:00=20M``).

A task on the daemon's event loop: at each window's edge (and at least once a minute, so a
clock set by hand or a DST change is followed within a minute) it asks the schedules what
applies now and hands the ceilings to the daemon when that changed, logging the change once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import trio

from ..metering.schedule import Schedule, local_minute

log = logging.getLogger(__name__)

#: The longest the task sleeps: a wall clock moved by hand or by DST is followed this soon.
RECHECK = 60.0


@dataclass(frozen=True)
class Ceilings:
    """The ceilings that apply now, and the windows they come from (None: the base value)."""

    metered: float
    ops: float
    metered_window: str | None = None
    ops_window: str | None = None


def ceilings_at(metered: Schedule, ops: Schedule, minute: int) -> Ceilings:
    mw, ow = metered.window_at(minute), ops.window_at(minute)
    return Ceilings(
        metered.value_at(minute),
        ops.value_at(minute),
        str(mw) if mw else None,
        str(ow) if ow else None,
    )


class ScheduleFollower:
    """Hands *apply* the ceilings that *schedules* (asked anew each time: a set or a reload
    changes them) give for the wall clock *wall* (unix seconds)."""

    def __init__(
        self,
        schedules: Callable[[], tuple[Schedule, Schedule]],
        apply: Callable[[Ceilings], None],
        wall: Callable[[], float],
    ) -> None:
        self.schedules = schedules
        self.apply = apply
        self.wall = wall
        self.now: Ceilings | None = None

    def check(self) -> float:
        """Apply what the schedules say now; seconds until the next look."""
        seconds = self.wall()
        minute = local_minute(seconds)
        metered, ops = self.schedules()
        current = ceilings_at(metered, ops, minute)
        if current != self.now:
            if self.now is not None:
                log.info("schedule: %s", describe(current))
            self.now = current
            self.apply(current)
        to_edge = min(metered.next_change(minute), ops.next_change(minute)) * 60
        return max(1.0, min(RECHECK, to_edge - seconds % 60))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.check()
        task_status.started()
        while True:
            await trio.sleep(self.check())


def describe(c: Ceilings) -> str:
    """The ceilings as the log and status say them."""

    def one(name: str, value: float, window: str | None, unit: str) -> str:
        shown = f"{value / 2**20:g} MiB/s" if unit == "bytes" else f"{value:g} units/s"
        return f"{name} {shown if value else 'none'} ({window or 'outside every window'})"

    return ", ".join(
        [
            one("metered_limit", c.metered, c.metered_window, "bytes"),
            one("ops_limit", c.ops, c.ops_window, "units"),
        ]
    )
