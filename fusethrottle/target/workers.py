"""Worker threads for calls into the target: trio.to_thread.run_sync without the extras.

Every FUSE request that touches the target is one trip to a worker thread and back, so on a
tree of small files the trip, not the syscall, is the daemon's main cost. trio's general
version pays for things this daemon does not use on every trip (a capacity limiter's
bookkeeping, a copied context, renaming the worker thread for each job); measured here, a trip
cost 76 us with it against 70 us without on trio 0.35, and 122 us against 77 us on Debian 12's
trio 0.22. What stays is what the daemon relies on:

* at most ``size`` threads per pool; more calls queue (a hung NFS server fills one pool, and
  the others, and the event loop, keep going);
* a cancelled caller (unmount giving up on a hung target, a caller being killed) returns at once
  and leaves its thread behind; whatever that thread returns later is given to the call's
  *discard* (in a thread: it may close descriptors of the target) or dropped;
* an exception in the call is raised in the caller;
* a thread idle for ``idle_seconds`` ends, so the count follows recent concurrency rather
  than the highest ever seen (a burst of a long backup would otherwise keep its threads).

Concurrency: ``run`` is called from the event loop only; the counters shared with the threads
are guarded by one lock, held for a few instructions.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import outcome
import trio

T = TypeVar("T")


class _Job:
    __slots__ = ("abandoned", "args", "discard", "fn", "must_run", "task", "token")

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        task: Any,
        token: trio.lowlevel.TrioToken | None,
        discard: Callable[[Any], None] | None,
        must_run: bool = False,
    ) -> None:
        self.fn = fn
        self.args = args
        self.task = task
        self.token = token
        self.discard = discard
        self.abandoned = False
        #: Run even if nobody waits for it any more (a close: the descriptor is nobody else's).
        self.must_run = must_run


def _give_back(job: _Job, result: outcome.Outcome) -> None:
    """What an abandoned call made (descriptors): to its *discard*, in this thread."""
    if job.discard is not None and isinstance(result, outcome.Value):
        # Nobody to tell if it fails; a worker must never end over it.
        with contextlib.suppress(Exception):
            job.discard(result.value)


def _deliver(job: _Job, result: outcome.Outcome) -> None:
    """On the event loop: hand the result to the caller, unless it gave up waiting."""
    if not job.abandoned:
        trio.lowlevel.reschedule(job.task, result)
    elif job.discard is not None and isinstance(result, outcome.Value):
        # Gave up after the worker looked: give it back from a thread of its own (rare).
        threading.Thread(target=_give_back, args=(job, result), daemon=True).start()


class WorkerPool:
    """Up to ``size`` threads, started on demand, ended when idle; jobs run in submission order."""

    def __init__(self, name: str, size: int, idle_seconds: float = 10.0) -> None:
        if size < 1:
            raise ValueError("a pool needs at least one thread")
        self.name = name
        self.size = size
        self.idle_seconds = idle_seconds
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._queued = 0

    @property
    def threads(self) -> int:
        return self._threads

    async def run(
        self,
        fn: Callable[..., T],
        *args: Any,
        discard: Callable[[T], None] | None = None,
        must_run: bool = False,
    ) -> T:
        """Run ``fn(*args)`` in a worker thread; a cancelled caller abandons the thread, and
        what the call returns after that goes to *discard*. A job abandoned before a thread
        took it is skipped, unless it *must_run*."""
        await trio.lowlevel.checkpoint_if_cancelled()
        job = _Job(
            fn,
            args,
            trio.lowlevel.current_task(),
            trio.lowlevel.current_trio_token(),
            discard,
            must_run,
        )
        self._submit(job)

        def abort(_: Any) -> trio.lowlevel.Abort:
            job.abandoned = True
            return trio.lowlevel.Abort.SUCCEEDED

        return await trio.lowlevel.wait_task_rescheduled(abort)  # type: ignore[no-any-return]

    def spawn(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` in a worker thread; nobody waits for it (safe from a ``finally``
        of a cancelled task: it never blocks)."""
        job = _Job(fn, args, None, None, None, must_run=True)
        job.abandoned = True
        self._submit(job)

    def _submit(self, job: _Job) -> None:
        with self._lock:
            self._queued += 1
            start = self._idle < self._queued and self._threads < self.size
            if start:
                self._threads += 1
        if start:
            threading.Thread(
                target=self._work, name=f"fusethrottle {self.name}", daemon=True
            ).start()
        self._jobs.put(job)

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            try:
                job = self._jobs.get(timeout=self.idle_seconds)
            except queue.Empty:
                with self._lock:
                    # A caller that counted on an idle thread has raised _queued before its
                    # put: while anything is queued, nobody may leave.
                    if self._queued == 0:
                        self._idle -= 1
                        self._threads -= 1
                        return
                    self._idle -= 1
                continue
            with self._lock:
                self._idle -= 1
                self._queued -= 1
            if job.abandoned and not job.must_run:  # cancelled before it started: nobody waits
                continue
            result = outcome.capture(job.fn, *job.args)
            if job.abandoned or job.token is None:
                _give_back(job, result)
                continue
            try:
                job.token.run_sync_soon(_deliver, job, result)
            except trio.RunFinishedError:
                return  # the event loop is gone (shutdown): nothing to deliver to
