"""A mount made up by a test: the engine's statistics as the test sets them, and the Publisher
the daemon builds over them, without a kernel or the engine's library.

Why: status, the Prometheus series and the fleet's series are what a user reads, and the daemon
builds them from what the engine counted (Daemon._snapshot). Here a test "writes" by replacing
the statistics (``dataclasses.replace``), so every number in a snapshot is one the test chose.
"""

from __future__ import annotations

from dataclasses import replace

from fusethrottle.engine.native import EngineStats
from fusethrottle.metering import fleet
from fusethrottle.metering.meter import UNMETERED, ClassTotals, Meter, op_class, profile_for
from fusethrottle.observability.metrics import Publisher, Recorder
from fusethrottle.observability.metrics.engine_snapshot import EngineView, engine_snapshot
from fusethrottle.observability.metrics.snapshot import RateHistory, Snapshot
from fusethrottle.service.memory_cgroup import OwnMemoryCgroup
from fusethrottle.service.options import Config
from fusethrottle.service.placement import Placement
from fusethrottle.window.controller import effective_window, make_controller


class MadeUpMount:
    """What Daemon keeps beside the engine, with the engine's side made up.

    Set ``stats`` (the engine's statistics), append to ``errors`` (its error answers:
    ``(op, errno, count)``), record injected fsyncs in ``fsyncs`` as the daemon does for each
    event, and feed ``controller`` samples as Daemon._sampled does; ``publisher`` makes
    snapshots of it all exactly as the daemon's does.
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        # A fresh mount: the root is known, the window is slow start's (engine_config).
        self.stats = EngineStats(
            known_files=1,
            writeback_cache=config.writeback_cache,
            written_bytes=0,
            window_bytes=effective_window(config.window, None),
        )
        self.errors: list[tuple[str, int, int]] = []
        self.fsyncs = Recorder()
        self.controller = make_controller(config)
        self.kernel_cache_bytes = 0
        #: budget=: the daemon's share of the fleet (its renewer not started, no spender yet).
        self.fleet = fleet.from_config(config)
        cgroup = OwnMemoryCgroup(1 << 30)  # never entered: nothing on the host changes
        cgroup.reason = "memory_cgroup=off"
        self.placement = Placement(cgroup, None, config)
        self._meter = Meter(profile_for(config))
        self.publisher = Publisher(config, self._snapshot)

    def wrote(self, nbytes: int) -> None:
        """The engine took *nbytes* more of writes (the rates and scrapes follow this total)."""
        self.stats = replace(self.stats, written_bytes=self.stats.written_bytes + nbytes)

    def request(self, op: str, nbytes: int = 0) -> None:
        """The engine served one *op* request: counted and, if it reaches the target, priced by
        meter.py's rules (the engine's own pricing is checked against them in
        test_engine_meter.py)."""
        s = self.stats
        meter = dict(s.meter)
        if op not in UNMETERED:
            cls = op_class(op)
            totals = meter.get(cls.value, ClassTotals())
            meter[cls.value] = totals.plus(nbytes, self._meter.charge(cls, nbytes))
        operations = {**s.operations, op: s.operations.get(op, 0) + 1}
        self.stats = replace(s, operations=operations, meter=meter)

    def _snapshot(self, history: RateHistory, now: float, sample: bool) -> Snapshot:
        """Daemon._snapshot, over the made-up engine (the window as Daemon._control keeps it)."""
        view = EngineView(
            self.stats,
            list(self.errors),
            self.controller,
            effective_window(self.controller.window, self.controller.commit_rate),
            self.kernel_cache_bytes,
            self.fleet.statistics(now) if self.fleet is not None else None,
        )
        return engine_snapshot(
            self.config,
            self.placement,
            view,
            self.fsyncs,
            history,
            started=self.publisher.started,
            now=now,
            sample=sample,
        )
