"""What the mount holds back and why: Prometheus series, the status snapshot, diagnostics.

One module per concern:

* definitions  every series name, type, help text and label (docs/METRICS.md documents them)
* recorder     the Events the data path reports to, as plain numbers on the event loop
* snapshot     the frozen picture of a mount that the exposition and ``status`` both read
* publisher    :class:`Metrics`: publishes snapshots on the loop, hands them to other threads
* exposition   Prometheus families from a snapshot (the collector behind ``/metrics``)
* server       the HTTP endpoint, bound before the mount and served from a thread
* diagnostics  the trio task tree and thread stacks (``status --tasks``, SIGUSR1)

This module only wires them together for the daemon (:func:`attach_metrics`) and re-exports the
names other modules use. With ``-o metrics=`` off nothing listens on the network, but the
recorder, the snapshots and the status socket (see status_server.py) still run:
``fusethrottle status`` must work on every mount.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

import trio

from ...metering.meter import Meter
from ...service.options import Config
from .definitions import DEFS, FSYNC_BUCKETS, FSYNC_REASONS, MetricDef, exported_names
from .diagnostics import run_diagnostics, task_tree, thread_stacks
from .exposition import families, make_registry
from .publisher import Metrics
from .recorder import CLASSIFIED_OPS, Recorder, op_class
from .server import MetricsError, bind_endpoint, serve_endpoint, split_address
from .snapshot import Snapshot

if TYPE_CHECKING:
    from ...service.mount import Mount

#: A task for the daemon's nursery, started with ``nursery.start`` (it reports when it is up).
Task = Callable[..., Any]


class Attached(NamedTuple):
    """One mount's metrics, in the order daemon.serve needs them."""

    #: Give to ``build``: the data path reports here.
    events: Recorder
    #: Give to ``build``: the backend reports every operation sent to the target here.
    observer: Callable[[str, int], None]
    #: Call once with the built mount: the tasks that publish, serve and answer for it.
    tasks: Callable[[Mount], list[Task]]


def attach_metrics(config: Config, meter: Meter) -> Attached:
    """Build one mount's observability, before anything is mounted.

    *meter* is the mount's one :class:`Meter`, the one ``build`` gives the
    ceilings: the recorder counts every target operation into it. With
    ``-o metrics=HOST:PORT`` the endpoint is bound here, so a bad address or a port in use fails
    the mount (``MetricsError``, a RuntimeError, one line) before pyfuse3.init.
    """
    recorder = Recorder(meter)
    server = bind_endpoint(config.metrics) if config.metrics else None

    def tasks(mount: Mount) -> list[Task]:
        metrics = Metrics(mount, recorder)
        out: list[Task] = [metrics.run_publisher]
        if server is not None:
            out.append(partial(serve_endpoint, server, make_registry(metrics)))
        out.append(partial(_serve_status, metrics))
        out.append(run_diagnostics)
        return out

    return Attached(recorder, recorder.target, tasks)


async def _serve_status(
    metrics: Metrics, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """The per-mount status socket, answered from the latest state (see status_server.py)."""
    from ..status_server import serve_control

    await serve_control(metrics.config.mountpoint, metrics.status, task_status=task_status)


__all__ = [
    "CLASSIFIED_OPS",
    "DEFS",
    "FSYNC_BUCKETS",
    "FSYNC_REASONS",
    "Attached",
    "MetricDef",
    "Metrics",
    "MetricsError",
    "Recorder",
    "Snapshot",
    "attach_metrics",
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
