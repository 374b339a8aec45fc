"""One mount's observability hub: it publishes snapshots on the event loop and hands them out.

Data flows one way, and only frozen copies cross threads::

    engine     --statistics, events->  EngineView       the engine's counters, its fsync events
    event loop --publish(), 0.5 s -->  Snapshot         frozen copy of the view, the recorder,
                                                        the controller and the placement
    scrape thread, status socket  -->  Snapshot         never the live objects

A scrape first asks the loop for a fresh snapshot and waits at most ``FRESH_WAIT`` for it, so a
stuck loop gives a stale (but answered) scrape whose ``fusethrottle_snapshot_age_seconds`` says
so. Nothing here may end the mount: every task catches and logs its own failures.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from .diagnostics import task_tree, thread_stacks
from .snapshot import RateHistory, Snapshot

if TYPE_CHECKING:
    from ...service.options import Config

log = logging.getLogger(__package__)

PUBLISH_INTERVAL = 0.5  # seconds between snapshots published by the event loop
FRESH_WAIT = 0.25  # how long a scrape waits for the loop to publish a fresh snapshot
RATE_SPAN = 10.0  # seconds of history behind the throughput figures


#: Builds a snapshot of the live state (event loop only): given the rates' history, the loop's
#: clock and whether this one's totals join the history.
SnapshotSource = Callable[[RateHistory, float, bool], Snapshot]


class Publisher:
    """The latest snapshot of one mount, and who reads it.

    *take* copies the live state (see SnapshotSource). ``publish`` runs on the event loop only;
    ``latest`` and ``fresh`` may be read anywhere.
    """

    def __init__(self, config: Config, take: SnapshotSource) -> None:
        self.config = config
        self._take = take
        self.started = time.time()
        self.latest: Snapshot | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._history = RateHistory(PUBLISH_INTERVAL, RATE_SPAN)
        self._failures = 0

    # --- building snapshots (event loop) ---------------------------------------------------
    def publish(self, *, sample: bool = False) -> Snapshot:
        """Copy the live state into a new Snapshot and make it the latest; with *sample* its
        totals also join the history behind the rates (the periodic publish does that)."""
        snap = self._take(self._history, trio.current_time(), sample)
        self.latest = snap
        return snap

    # --- reading snapshots (any thread) ----------------------------------------------------
    def fresh(self, timeout: float = FRESH_WAIT) -> Snapshot | None:
        """Ask the event loop for a new snapshot; after *timeout*, settle for the last one."""
        token = self._token
        if token is None:
            return self.latest
        done = threading.Event()

        def refresh() -> None:  # runs on the loop, outside any task: must never raise
            try:
                self.publish()
            except Exception:
                self.log_failure("building a metrics snapshot")
            finally:
                done.set()

        try:
            token.run_sync_soon(refresh)
        except trio.RunFinishedError:
            return self.latest
        done.wait(timeout)
        return self.latest

    def log_failure(self, what: str) -> None:
        """Log an internal error (the first few, then one in a thousand): a bug in the metrics
        must cost a scrape or a snapshot, never the journal or the mount."""
        self._failures += 1
        if self._failures <= 3 or self._failures % 1000 == 0:
            log.exception(
                "internal error %s (failure %d); the mount is unaffected", what, self._failures
            )

    # --- tasks (started by the daemon's nursery) ------------------------------------------
    async def run_publisher(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Publish a snapshot every PUBLISH_INTERVAL (and keep the history behind the rates)."""
        self._token = trio.lowlevel.current_trio_token()
        try:
            self.publish(sample=True)
            task_status.started()
            while True:
                await trio.sleep(PUBLISH_INTERVAL)
                try:
                    self.publish(sample=True)
                except Exception:
                    self.log_failure("publishing metrics")
        finally:
            self._token = None

    def status(self, request: str) -> dict[str, Any]:
        """What the control socket answers (on the event loop, so always fresh)."""
        if request == "tasks":
            return {"tasks": task_tree(), "threads": thread_stacks()}
        return self.publish().to_json()
