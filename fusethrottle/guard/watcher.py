"""The pressure guard's edge: read the protected workload's PSI, step the rule, apply its limit.

Runs as a task on the daemon's event loop. The PSI files are the kernel's (procfs, cgroupfs),
never the target's, so reading them cannot hang the loop. Between readings the kernel's own
trigger (a PSI file opened for writing with ``some STALL WINDOW``) wakes the task the moment
the workload stalls past the line; where a trigger cannot be armed the task only polls.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
from collections.abc import Callable, Iterator
from pathlib import Path

import trio

from ..observability.metrics.snapshot import GuardFacts
from .pressure import Reading, some_total, stall_share
from .rule import GuardDecision, GuardRule, GuardSettings, GuardState

log = logging.getLogger(__name__)

#: Seconds between two readings.
INTERVAL = 0.5
#: The kernel's trigger window (microseconds): the stall it reports is within this long.
TRIGGER_WINDOW_US = 1_000_000


class PressureGuard:
    """One mount's guard: *written* says how many bytes the backup wrote so far, *apply* is told
    the rate the backup may write at (None: no limit from the guard)."""

    def __init__(
        self,
        files: tuple[Path, ...],
        settings: GuardSettings,
        written: Callable[[], int],
        apply: Callable[[float | None], None],
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.files = files
        self.rule = GuardRule(settings)
        self.written = written
        self.apply = apply
        self.clock = clock
        self.last: GuardDecision | None = None
        self.triggers_armed = False

    def facts(self, protects: str) -> GuardFacts:
        """What status and the metrics show of the guard."""
        d = self.last
        return GuardFacts(
            protects=protects,
            state=(d.state if d else self.rule.state()).value,
            share=d.share if d else 0.0,
            line=self.rule.line(),
            limit=(d.limit or 0.0) if d else 0.0,
            held_seconds=self.rule.held_seconds,
            triggers=self.triggers_armed,
        )

    def read(self) -> Reading:
        totals = tuple(some_total(f.read_text()) for f in self.files)
        return Reading(self.clock(), totals)

    def step(self, before: Reading, after: Reading, written: int) -> GuardDecision:
        """One step of the rule on two readings: the limit applied and a change of state
        logged (once per change)."""
        decision = self.rule.step(after.at, stall_share(before, after), written)
        previous = self.last
        self.last = decision
        if previous is None or decision.limit != previous.limit:
            self.apply(decision.limit)
        if decision.changed:
            self._say(decision)
        return decision

    def _say(self, decision: GuardDecision) -> None:
        if decision.state is GuardState.HOLDING:
            log.info(
                "guard: the protected workload stalls %.1f%% of the time (line %.1f%%): the "
                "backup is held to %.1f MiB/s",
                decision.share * 100,
                decision.line * 100,
                (decision.limit or 0) / 2**20,
            )
        elif decision.state is GuardState.OPEN:
            log.info(
                "guard: the protected workload is calm (line %.1f%% stalled): the backup "
                "writes unthrottled",
                decision.line * 100,
            )
        else:
            log.info("guard: learning the protected workload's pressure with the backup idle")

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read, step and apply every INTERVAL (sooner when a trigger fires) until cancelled."""
        with self._triggers() as poller:
            before = self.read()
            written = self.written()
            task_status.started()
            while True:
                with trio.move_on_after(INTERVAL):
                    if poller is None:
                        await trio.sleep_forever()
                    else:
                        await trio.lowlevel.wait_readable(poller.fileno())
                        poller.poll(0)  # the trigger's event is taken by looking at it
                        await trio.sleep(0.05)  # let the stall it saw show in the totals
                after = self.read()
                now_written = self.written()
                self.step(before, after, max(0, now_written - written))
                before, written = after, now_written

    @contextlib.contextmanager
    def _triggers(self) -> Iterator[select.epoll | None]:
        """An epoll set that turns readable when a PSI trigger fires (trio waits for
        readability; a trigger reports POLLPRI, which an epoll set inside it turns into that),
        or None where no trigger can be armed (an old kernel, a file we may not write)."""
        line = self.rule.line()
        stall_us = max(1, min(TRIGGER_WINDOW_US, int(line * TRIGGER_WINDOW_US)))
        spec = f"some {stall_us} {TRIGGER_WINDOW_US}".encode()
        opened: list[int] = []
        poller = select.epoll()
        try:
            for path in self.files:
                try:
                    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
                except OSError as err:
                    log.info("guard: no trigger on %s (%s): polling every %ss", path, err, INTERVAL)
                    continue
                opened.append(fd)
                try:
                    os.write(fd, spec + b"\0")
                    poller.register(fd, select.EPOLLPRI)
                except OSError as err:
                    log.info("guard: no trigger on %s (%s): polling every %ss", path, err, INTERVAL)
            self.triggers_armed = bool(opened) and len(opened) == len(self.files)
            yield poller if self.triggers_armed else None
        finally:
            poller.close()
            for fd in opened:
                os.close(fd)
