"""What the mount holds back and why: Prometheus series, the status snapshot, diagnostics.

One module per concern:

* definitions  every series name, type, help text and label (docs/METRICS.md documents them)
* recorder     the injected fsyncs' events and errors, as plain numbers on the event loop
* snapshot     the frozen picture of a mount that the exposition and ``status`` both read
* engine_snapshot  that picture built from the engine's statistics
* publisher    :class:`Publisher`: publishes snapshots on the loop, hands them to other threads
* exposition   Prometheus families from a snapshot (the collector behind ``/metrics``)
* server       the HTTP endpoint, bound before the mount and served from a thread
* diagnostics  the trio task tree and thread stacks (``status --tasks``, SIGUSR1)

This module re-exports the names other modules use; the daemon (service/daemon.py) wires them.
With ``-o metrics=`` off nothing listens on the network, but the recorder, the snapshots and the
status socket (see status_server.py) still run: ``fusethrottle status`` must work on every mount.
"""

from __future__ import annotations

from ...metering.meter import op_class
from .definitions import DEFS, FSYNC_BUCKETS, FSYNC_REASONS, MetricDef, exported_names
from .diagnostics import task_tree, thread_stacks
from .exposition import families, make_registry
from .publisher import Publisher
from .recorder import CLASSIFIED_OPS, Recorder
from .server import MetricsError, bind_endpoint, serve_endpoint, split_address
from .snapshot import Snapshot

__all__ = [
    "CLASSIFIED_OPS",
    "DEFS",
    "FSYNC_BUCKETS",
    "FSYNC_REASONS",
    "MetricDef",
    "MetricsError",
    "Publisher",
    "Recorder",
    "Snapshot",
    "bind_endpoint",
    "exported_names",
    "families",
    "make_registry",
    "op_class",
    "serve_endpoint",
    "split_address",
    "task_tree",
    "thread_stacks",
]
