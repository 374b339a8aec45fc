"""Where the neighbour waits in the kernel when it stalls: its kernel stack, sampled.

A database operation that takes seconds is either running or made to wait by the kernel, and
which wait it is decides the fix: reclaim in a cgroup-v1 memory cgroup that meets a page under
write-back waits for that page (``folio_wait_writeback`` under ``shrink_folio_list``), cgroup v2
and global reclaim throttle instead (``reclaim_throttle``), a writer of dirty pages is paced in
``balance_dirty_pages``, a read waits for its I/O. Every ``interval`` this thread reads the
neighbour's ``/proc/PID/task/*/stack`` (root only) and keeps the time and the wait it names;
:func:`stall_waits` then says, for the operations that took longer than a threshold, how many
seconds each wait accounted for. Nothing here is needed for the numbers the bench reports; it
says why they are what they are.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

#: (wait, frames that must all be on the stack), first match wins: the most specific first.
WAITS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reclaim waits on write-back", ("shrink_folio_list", "folio_wait_writeback")),
    ("reclaim waits on write-back", ("shrink_page_list", "wait_on_page_writeback")),
    ("reclaim throttled", ("reclaim_throttle",)),
    ("memcg OOM", ("mem_cgroup_out_of_memory",)),
    ("memcg reclaim", ("try_to_free_mem_cgroup_pages",)),
    ("global reclaim", ("try_to_free_pages",)),
    ("dirty throttling", ("balance_dirty_pages",)),
    ("waits for its own write-back", ("file_write_and_wait_range", "folio_wait_writeback")),
    ("journal commit", ("jbd2_log_wait_commit",)),
    ("device cache flush", ("blkdev_issue_flush",)),
    ("read I/O", ("filemap_read", "folio_wait_bit_common")),
    ("page fault I/O", ("filemap_fault",)),
    ("block I/O", ("io_schedule",)),
)
#: What a thread that is not waiting for the kernel shows (running, or its own sleep).
IDLE = ("do_nanosleep", "hrtimer_nanosleep", "do_sys_poll", "do_select", "ep_poll")


def classify(stack: str) -> str | None:
    """The wait a kernel stack shows; one not listed is "other wait" with its two innermost
    frames, so a run's results say what to list next; None for none."""
    frames = [line.split()[-1].split("+")[0] for line in stack.splitlines() if line.strip()]
    if not frames:
        return None  # running in user space
    present = set(frames)
    for name, needed in WAITS:
        if all(frame in present for frame in needed):
            return name
    if present & set(IDLE):
        return None
    return f"other wait ({' < '.join(frames[:2])})"


class StackSampler:
    """Samples the kernel stacks of process *pid*'s threads from a thread of its own."""

    def __init__(self, pid: int, interval: float = 0.01) -> None:
        self.pid = pid
        self.interval = interval
        self.samples: list[tuple[float, str]] = []  # (monotonic time, wait)
        self.readable = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="stall-stacks")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> list[tuple[float, str]]:
        self._stop.set()
        self._thread.join(timeout=5)
        return list(self.samples)

    def _loop(self) -> None:
        tasks = Path(f"/proc/{self.pid}/task")
        while not self._stop.wait(self.interval):
            now = time.monotonic()
            try:
                stacks = [(t / "stack").read_text() for t in tasks.iterdir()]
            except PermissionError:
                self.readable = False
                return
            except OSError:
                continue  # a thread or the process went
            for stack in stacks:
                wait = classify(stack)
                if wait is not None:
                    self.samples.append((now, wait))
                    break


def stall_waits(
    ops: Sequence[tuple[float, float]],
    samples: Sequence[tuple[float, str]],
    interval: float,
    longer_than: float = 0.1,
) -> dict[str, float]:
    """Seconds of each wait sampled inside the operations longer than *longer_than* (pure)."""
    stalls = sorted((t, t + latency) for t, latency in ops if latency > longer_than)
    seconds: dict[str, float] = {}
    if not stalls:
        return {}
    i = 0
    for t, wait in sorted(samples):
        while i < len(stalls) and stalls[i][1] < t:
            i += 1
        if i == len(stalls):
            break
        if stalls[i][0] <= t:
            seconds[wait] = seconds.get(wait, 0.0) + interval
    ranked = sorted(seconds.items(), key=lambda item: -item[1])
    return {wait: round(s, 2) for wait, s in ranked}
