"""Run one mount: C++ threads of the engine serve every FUSE request, this process keeps the
daemon's life (readiness, signals, the stop) and the control plane.

The engine keeps the write window itself (the ledger, the gate, injected fsyncs); this process
keeps the controller: the engine queues every injected fsync's time as an event, an eventfd wakes
trio, the controller resizes the window and the kernel's share of it, and the engine is told the
new window. The engine meters every request by the rules this process hands it (meter.py)
and holds writes at the ceilings; its statistics become the Snapshot (engine_snapshot.py) behind
``fusethrottle status`` and the Prometheus endpoint alike. With a fleet budget (budget=), this
process renews the lease from Redis (fleet.py) and the engine's requests spend it
(fleet_gate.h): every tick the renewer debits what they spent and hands them what is left, so no
engine thread waits on Python.

The stop, whichever way it starts (``fusermount3 -u``/``umount``, SIGTERM, SIGINT): write the
kernel's cache back through the engine, stop taking requests, fsync every file written since
its last fsync (bounded by ``unmount_timeout``; what could not be synced is logged and the exit
code says so), unmount if the kernel has not already.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import faulthandler
import logging
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import trio

from .. import _libc
from ..engine.native import (
    PASSTHROUGH,
    EngineConfig,
    EngineUnavailable,
    LibfuseLog,
    LostEvent,
    NativeEngine,
    SyncEvent,
)
from ..guard.pressure import pressure_files
from ..guard.rule import GuardSettings
from ..guard.watcher import PressureGuard
from ..loglimit import LogLimiter
from ..metering import fleet
from ..metering.meter import profile_for
from ..metering.schedule import Schedule
from ..names import shown
from ..observability.metrics import Recorder, bind_endpoint, make_registry, serve_endpoint
from ..observability.metrics.definitions import ADMISSION_BUCKETS
from ..observability.metrics.diagnostics import run_diagnostics
from ..observability.metrics.engine_snapshot import EngineView, engine_snapshot
from ..observability.metrics.publisher import Publisher
from ..observability.metrics.server import MetricsServer
from ..observability.metrics.snapshot import RateHistory, Snapshot
from ..observability.status_server import serve_control
from ..trio_compat import run_sync_abandoning
from ..window.controller import effective_window, make_controller
from ..window.kernel_cache import KernelCache
from . import sdnotify
from .held_signals import HELD_SIGNALS, release_held_signals
from .live_settings import CONF_ENV, Change, apply_reload, apply_set
from .logformat import JsonFormatter
from .mountinfo import find_mount
from .options import Config, OptionError
from .placement import Placement, place
from .readiness import stat_from_child
from .schedules import Ceilings as ScheduledCeilings
from .schedules import ScheduleFollower, describe
from .target_probe import can_switch, target_has_xattrs

log = logging.getLogger(__name__)

#: Longer than the kernel's longest dirty-throttling pause (200 ms): see _write_back.
CACHE_QUIET_PAUSE = 0.3
#: How long the loop may take to notice the stop before the connection is aborted.
LOOP_END_GRACE = 2.0
#: Changes of settings status shows.
CHANGES_KEPT = 10
#: Request threads of the engine at most (the kernel's max_background is 12 by default).
MAX_THREADS = 16


def serve(config: Config, on_ready: Callable[[], None] | None = None) -> int:
    """Mount and serve until unmounted; returns the process exit code."""
    os.umask(0)  # the kernel already applied the caller's umask to every mode we receive
    raise_fd_limit()
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # Before anything touches the target: its page cache is charged to whoever writes it.
    placement = place(config)
    try:
        return serve_placed(placement, on_ready)
    finally:
        placement.cgroup.leave()


def configure_logging(level: str, foreground: bool, log_format: str = "text") -> None:
    """stderr in the foreground and under systemd (the journal), syslog otherwise;
    *log_format* ``json``: one JSON object a line (logformat.py), for log collectors."""
    root = logging.getLogger()
    root.setLevel(getattr(logging, level.upper()))
    for old in list(root.handlers):
        root.removeHandler(old)
    as_json = log_format == "json"
    if foreground or os.environ.get("JOURNAL_STREAM") or os.environ.get("INVOCATION_ID"):
        handler: logging.Handler = logging.StreamHandler(sys.stderr)
        if as_json:
            handler.setFormatter(JsonFormatter())
        elif os.environ.get("JOURNAL_STREAM"):
            handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        else:
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
            )
    elif os.path.exists("/dev/log"):
        from logging.handlers import SysLogHandler

        handler = SysLogHandler(address="/dev/log")
        if as_json:
            handler.setFormatter(_TaggedJson())
        else:
            handler.setFormatter(
                logging.Formatter("fusethrottle[%(process)d]: %(levelname)s %(message)s")
            )
    else:
        handler = logging.NullHandler()
    root.addHandler(handler)


class _TaggedJson(JsonFormatter):
    """syslog wants its tag before the message; the JSON object follows it."""

    def format(self, record: logging.LogRecord) -> str:
        return f"fusethrottle[{record.process}]: {super().format(record)}"


def raise_fd_limit() -> None:
    """Each inode the kernel remembers holds one O_PATH descriptor in the engine: allow many."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if os.geteuid() == 0:
        try:
            with open("/proc/sys/fs/nr_open") as f:
                target = max(hard, int(f.read()))
        except OSError:
            pass
    for limit in (target, hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, max(limit, hard)))
            return
        except (ValueError, OSError):
            continue


def fuse_options(config: Config) -> set[str]:
    """The mount options the kernel is given (what ``findmnt`` shows for the mount)."""
    options = {
        # libfuse splits options at commas and takes a backslash as an escape: a source's own
        # are escaped, so a path with any byte names the mount whole.
        "fsname=" + (config.fsname or config.source).replace("\\", "\\\\").replace(",", "\\,"),
        "subtype=fusethrottle",
    }
    if config.permissions == "kernel":
        options.add("default_permissions")
    if config.allow_other:
        options.add("allow_other")
    if config.read_only:
        options.add("ro")
    options.update(config.kernel_options)
    return options


def serve_xattrs(config: Config) -> bool:
    """xattrs=auto: exactly when the target stores them (NFSv3 and EFS do not)."""
    if config.xattrs != "auto":
        return config.xattrs == "on"
    fd = os.open(config.source, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return target_has_xattrs(fd)
    finally:
        os.close(fd)


def engine_config(config: Config, uncached: bool = False) -> EngineConfig:
    """The engine's settings for *config*; *uncached*: writes leave no page in the target's
    page cache (placement.direct_writes says why)."""
    switching = config.credentials == "caller" and can_switch()
    return EngineConfig(
        source=os.path.realpath(config.source),
        mountpoint=config.mountpoint,
        fuse_options=tuple(sorted(fuse_options(config))),
        writeback_cache=config.writeback_cache,
        attr_timeout=config.attr_timeout,
        max_threads=max(MAX_THREADS, config.threads),
        switch_credentials=switching,
        xattrs=serve_xattrs(config),
        enforce=config.mode != "off",
        # Until the first fsync has measured the target (controller.effective_window).
        window=effective_window(config.window, None),
        batch=config.batch,
        max_age=config.max_age,
        admission_timeout=config.admission_timeout,
        writeback_pieces=config.writeback_pieces,
        drop_synced=config.drop_synced,
        # The target removes set-ID bits itself only when it sees the writer: calls made as the
        # caller, or a mount nobody but the daemon's user writes to.
        killpriv_v2=switching or not config.allow_other,
        target_decides=config.permissions == "target",
        meter=profile_for(config),
        metered_limit=config.metered_limit,
        ops_limit=config.ops_limit,
        throttle_reads=config.throttle_reads,
        fleet=config.budget is not None,
        admission_bounds=ADMISSION_BUCKETS,
        uncached=uncached,
    )


def serve_placed(placement: Placement, on_ready: Callable[[], None] | None = None) -> int:
    """Mount with the engine and serve until unmounted; returns the exit code."""
    config = placement.config
    # Bound before the mount: a bad address or a port in use fails it (MetricsError, one line).
    server = bind_endpoint(config.metrics) if config.metrics else None
    libfuse: LibfuseLog | None = None
    try:
        # Before libfuse's first word: what it says goes through our log, in its format.
        libfuse = LibfuseLog()
        engine = NativeEngine.mount(engine_config(config, placement.direct_writes is not None))
    except (EngineUnavailable, OSError) as err:
        if libfuse is not None:
            write_libfuse_log(libfuse)  # its reasons first
        log.error("fusethrottle: %s", err)
        if server is not None:
            server.server_close()
        return 1
    write_libfuse_log(libfuse)
    daemon = Daemon(engine, placement, on_ready, server, libfuse)
    try:
        code = trio.run(daemon.run)
    finally:
        if not daemon.abandoned:
            engine.free()
        write_libfuse_log(libfuse)
    if daemon.abandoned:
        # Threads the target holds are inside the engine: it cannot be freed, and the
        # interpreter's exit would wait on nothing it can end. Everything is said: go.
        logging.shutdown()
        os._exit(code)
    return code


LIBFUSE_LOG = logging.getLogger("libfuse")


def write_libfuse_log(libfuse: LibfuseLog) -> None:
    """What libfuse said since the last call, through the logger (logger ``libfuse``)."""
    for level, text in libfuse.take():
        LIBFUSE_LOG.log(level, "%s", text)


class Daemon:
    """Waits on the engine's loop (in a thread) and stops it when told to."""

    def __init__(
        self,
        engine: NativeEngine,
        placement: Placement,
        on_ready: Callable[[], None] | None,
        server: MetricsServer | None = None,
        libfuse: LibfuseLog | None = None,
    ) -> None:
        self.engine = engine
        self.libfuse = libfuse
        self.placement = placement
        self.config = placement.config
        self.on_ready = on_ready
        self.exit_code = 0
        self._device: str | None = None
        self._served = trio.Event()
        #: Where serve() waits: cancelled when its threads stay stuck on the target after the
        #: connection was aborted (the loop cannot end while one of them waits).
        self._serving = trio.CancelScope()
        #: When the stop's bound (unmount_timeout) runs out: the end's fsyncs too.
        self._end_deadline: float | None = None
        #: serve() or the end's fsyncs were left to threads the target holds: the engine can
        #: be neither joined nor freed, the process exits around them.
        self.abandoned = False
        self._stopping = False
        #: The stop's stat of the mount went unanswered (see stop).
        self._poke_left = False
        self._said_stopping = False
        self.controller = make_controller(self.config)
        self.kernel_cache = KernelCache(
            enabled=self.config.writeback_cache and self.config.mode != "off",
            limit=self.config.kernel_cache,
            read_ahead=self.config.read_ahead,
        )
        self._total = effective_window(self.controller.window, self.controller.commit_rate)
        self._error_log = LogLimiter(60.0)  # a line per file a minute
        #: Files the target failed to store data of (node -> path, errno), named at exit.
        self._lost: dict[int, tuple[str, int]] = {}
        #: The injected fsyncs the engine reported, as the metrics' histograms.
        self._fsyncs = Recorder()
        #: This mount's share of the fleet budget (budget=), spent by the engine's requests.
        self.fleet = fleet.from_config(self.config)
        if self.fleet is not None:
            self.fleet.spend_through(engine)
        self.metrics = Publisher(self.config, self._snapshot)
        self._server = server
        #: The pressure guard (guard=): the backup's rate from the protected workload's stall.
        self._guard_rate: float | None = None
        self._passthrough_said: int | None = None
        #: The ceilings' time-of-day schedules (metered_limit=100M,01:00-06:00=20M).
        self._ceilings = ScheduledCeilings(self.config.metered_limit, self.config.ops_limit)
        self.schedule = ScheduleFollower(self._schedules, self._scheduled, time.time)
        #: Settings changed while serving, newest last (status shows them).
        self.changes: tuple[str, ...] = ()
        self._nursery: trio.Nursery | None = None
        self.guard: PressureGuard | None = None
        if self.config.guard:
            self.guard = PressureGuard(
                pressure_files(self.config.guard),
                GuardSettings(some=self.config.guard_some, min_rate=self.config.guard_min),
                lambda: self.engine.stats().written_bytes,
                self._guard_limit,
            )

    def _guard_limit(self, limit: float | None) -> None:
        """The guard's rate, as a ceiling on metered bytes: the tighter of it and metered_limit."""
        self._guard_rate = limit
        self._apply_ceilings()

    def _schedules(self) -> tuple[Schedule, Schedule]:
        c = self.config
        return Schedule(c.metered_limit, c.metered_schedule), Schedule(c.ops_limit, c.ops_schedule)

    def _has_schedule(self) -> bool:
        return bool(self.config.metered_schedule or self.config.ops_schedule)

    def _scheduled(self, ceilings: ScheduledCeilings) -> None:
        self._ceilings = ceilings
        self._apply_ceilings()

    def _apply_ceilings(self) -> None:
        """The engine's ceilings: the schedule's values now, the guard's rate if tighter."""
        metered, ops = self._ceilings.metered, self._ceilings.ops
        if self._guard_rate is not None:
            metered = min(metered, self._guard_rate) if metered > 0 else self._guard_rate
        self.engine.set_ceilings(metered, ops)

    # -- settings changed while serving: `fusethrottle set`, SIGHUP ------------------------

    def _respond(self, request: str) -> dict[str, Any]:
        """The status socket's requests (on the event loop): ``set key=value...`` here, the
        rest is the publisher's."""
        verb, _, rest = request.partition(" ")
        if verb != "set":
            return self.metrics.status(request)
        try:
            new, changed = apply_set(self.config, rest.split())
        except OptionError as err:
            return {"refused": str(err)}
        self._change_settings(new, changed, "fusethrottle set")
        return {"changed": [str(c) for c in changed]}

    def _reload(self) -> None:
        """SIGHUP (systemctl reload): reread the instance's file and apply what changed; an
        invalid file, or one that changes what cannot change while mounted, applies nothing."""
        path = os.environ.get(CONF_ENV, "")
        if not path:
            log.warning(
                "SIGHUP: no settings file to reread (%s is not set); nothing changed", CONF_ENV
            )
            return
        sdnotify.notify("RELOADING=1")
        try:
            with open(path) as f:
                text = f.read()
            new, changed = apply_reload(self.config, text)
        except (OSError, OptionError) as err:
            log.error("reload of %s refused, the running settings stay: %s", path, err)
        else:
            self._change_settings(new, changed, f"reload of {path}")
        sdnotify.notify("READY=1")

    def _change_settings(self, new: Config, changed: list[Change], how: str) -> None:
        """Apply *new* settings (validated) to the engine, the controller and the guard."""
        if not changed:
            log.info("%s: nothing changed", how)
            return
        old = self.config
        self.config = new
        self.placement.config = new
        keys = {c.key for c in changed}
        if keys & {"batch", "max_age", "mode"}:
            enforce = new.mode != "off"
            self.engine.set_params(new.batch, new.max_age, enforce, enforce)
        if keys & {"mode", "window"}:
            self.controller = make_controller(new)
            self._total = effective_window(self.controller.window, self.controller.commit_rate)
            assert self._nursery is not None  # (set requests come from a task of it)
            self._nursery.start_soon(self._update_kernel_cache, self._total)
            self._hand_window()
        if keys & {"metered_limit", "ops_limit"}:
            self.schedule.check()  # the new values, and the window that applies now
        if self.guard is not None and keys & {"guard_some", "guard_min"}:
            self.guard.rule.settings = dataclasses.replace(
                self.guard.rule.settings, some=new.guard_some, min_rate=new.guard_min
            )
        if new.log_level != old.log_level:
            logging.getLogger().setLevel(getattr(logging, new.log_level.upper()))
        said = ", ".join(map(str, changed))
        log.info("settings changed by %s: %s", how, said)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        self.changes = (*self.changes, f"{stamp} {how}: {said}")[-CHANGES_KEPT:]

    async def _update_kernel_cache(self, total: int) -> None:
        # A sysfs write can wait (on the bdi's lock): never on the event loop.
        await trio.to_thread.run_sync(self.kernel_cache.update, total)

    async def run(self) -> int:
        info = find_mount(self.config.mountpoint, fstype="fuse.fusethrottle")
        self._device = info.device if info else None
        await trio.to_thread.run_sync(self.kernel_cache.attach, self._device, self._total)
        self._hand_window()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if self.fleet is not None:
                await nursery.start(self.fleet.run)
            nursery.start_soon(self._signals)
            nursery.start_soon(self._control)
            if self.libfuse is not None:
                nursery.start_soon(self._libfuse_log, self.libfuse)
            await nursery.start(self.schedule.run)
            if self.guard is not None:
                await nursery.start(self.guard.run)
            await nursery.start(self.metrics.run_publisher)
            if self._server is not None:
                registry = make_registry(self.metrics)
                await nursery.start(partial(serve_endpoint, self._server, registry))
            # Before the engine serves: once the mount answers, status answers too (a query
            # right after the mount came up found no socket yet, now and then).
            await nursery.start(serve_control, self.config.mountpoint, self._respond)
            nursery.start_soon(run_diagnostics)
            nursery.start_soon(self._announce_ready)
            nursery.start_soon(self._watch_unmount)
            if sdnotify.watchdog_interval():
                nursery.start_soon(sdnotify.watchdog_task)  # pings from the event loop
            rc: int | None = None
            with self._serving:
                rc = await run_sync_abandoning(self.engine.serve)
            self._served.set()
            self._say_stopping()  # an unmount from outside ends the loop without a stop()
            nursery.cancel_scope.cancel()
        if rc is None:
            self.abandoned = True  # its threads are stuck on the target (see stop)
        elif rc not in (0, -errno.EINTR):
            log.error("the engine's request loop failed: %s", os.strerror(-rc))
            self.exit_code = 1
        await self._sync_everything()
        if self._poke_left:
            self._abort()  # nothing is left to serve: the kernel fails the stat instead
        return self.exit_code

    async def _sync_everything(self) -> None:
        """After the last request: fsync every file written since its last fsync (an unmount
        wrote the kernel's cache back first)."""
        failed: int | None = None
        # unmount_timeout bounds the whole stop, the end's fsyncs too (from the unmount when the
        # mount was taken away from outside).
        end = self._end_deadline or trio.current_time() + self.config.unmount_timeout
        with trio.move_on_at(end):
            failed = await run_sync_abandoning(self.engine.sync_all)
        if failed is None:
            # The target holds the end's fsyncs: name what it does not have, and go (the
            # threads it holds are left to it; the process exits around them).
            self.abandoned = True
            unsynced = self._name_unsynced()
            log.error(
                "%d file(s) could not be synced before exit: the target did not answer in time",
                len(unsynced),
            )
            self.exit_code = 1
            return
        stats = self.engine.stats()
        log.info(
            "%d injected fsync(s), %d failed; %d write(s) waited for room in the window, "
            "%d timed out; at most %d MiB were un-synced at once",
            stats.fsyncs,
            stats.fsync_errors,
            stats.throttled_writes,
            stats.admission_timeouts,
            stats.unsynced_high >> 20,
        )
        for event in self.engine.read_events():  # the end's own syncs
            if isinstance(event, LostEvent):
                self._lost_data(event)
        named: set[str] = set()
        if failed:
            named = self._name_unsynced()
            log.error("%d file(s) written through the mount could not be synced", failed)
            self.exit_code = 1
        else:
            log.info("all data synced")
        # Whose writers were told: the exit status does not count them, the operator needs
        # their names all the same (once: those named above are not).
        for path, error in self._lost.values():
            if path not in named:
                log.warning("incomplete on the target: %s (%s)", shown(path), os.strerror(error))

    def _name_unsynced(self) -> set[str]:
        """Log every file whose data is not on the target, one line each: their paths."""
        unsynced = self.engine.unsynced()
        for path, error in unsynced:
            reason = os.strerror(error) if error else "the target did not answer"
            log.error("not on the target: %s (%s)", shown(path), reason)
        return {path for path, _ in unsynced}

    # -- the controller ----------------------------------------------------------------------

    async def _control(self) -> None:
        """Feed the controller every injected fsync the engine reports, and hand the engine
        the window it decides (less the kernel's share of it)."""
        fd = self.engine.events_fd()
        while True:
            await trio.lowlevel.wait_readable(fd)
            with contextlib.suppress(BlockingIOError):
                os.read(fd, 8)
            if self.fleet is not None:
                self.fleet.wake()  # a request may wait for a lease (the engine pokes then)
            self._take_events()
            total = effective_window(self.controller.window, self.controller.commit_rate)
            if total != self._total:
                self._total = total
                # A sysfs write can wait (on the bdi's lock): never on the event loop.
                await trio.to_thread.run_sync(self.kernel_cache.update, total)
            self._hand_window()

    async def _libfuse_log(self, libfuse: LibfuseLog) -> None:
        """libfuse's messages while it serves (its loop's threads), as they come."""
        while True:
            await trio.lowlevel.wait_readable(libfuse.fd)
            with contextlib.suppress(BlockingIOError):
                os.read(libfuse.fd, 8)
            write_libfuse_log(libfuse)

    def _take_events(self) -> None:
        """Every event the engine queued: fsyncs to the controller and the histograms, lost
        data to the log (on the event loop)."""
        events = self.engine.read_events()
        if not events:
            return
        stats = self.engine.stats()
        for event in events:
            if isinstance(event, LostEvent):
                self._lost_data(event)
            else:
                self._sampled(event, stats.unsynced_bytes, stats.window_bytes)

    def _snapshot(self, history: RateHistory, now: float, sample: bool) -> Snapshot:
        """The mount now, as status and the metrics show it (on the event loop): the events
        queued meanwhile first, so every fsync that ended is in it."""
        self._take_events()
        stats = self.engine.stats()
        if self._passthrough_said is not None:
            self._say_passthrough(stats.passthrough)
        view = EngineView(
            stats,
            self.engine.errors(),
            self.controller,
            self._total,
            self.kernel_cache.statistics().limit_bytes,
            self.fleet.statistics(now) if self.fleet is not None else None,
            self.guard.facts(self.config.guard) if self.guard is not None else None,
            self.changes,
            describe(self._ceilings)
            if self.config.metered_schedule or self.config.ops_schedule
            else "",
        )
        # The ceilings shown are those that apply now (a schedule's window, if one does).
        shown = dataclasses.replace(
            self.config, metered_limit=self._ceilings.metered, ops_limit=self._ceilings.ops
        )
        return engine_snapshot(
            shown,
            self.placement,
            view,
            self._fsyncs,
            history,
            started=self.metrics.started,
            now=now,
            sample=sample,
        )

    def _sampled(self, event: SyncEvent, unsynced: int, window: int) -> None:
        self._fsyncs.fsync(event.reason, event.seconds, event.nbytes, event.error or None)
        if event.reason == "application":
            return  # shown; the controller learns from the fsyncs it decides on

        if event.error == 0:
            self.controller.on_sample(event.at, event.nbytes, event.seconds, unsynced, window)
            return
        if event.error == errno.ESTALE:
            log.info(
                "injected fsync (%s) of node %#x: the file is gone from the target (deleted by "
                "another writer); its %d un-synced bytes are dropped",
                event.reason,
                event.node,
                event.nbytes,
            )
            return
        self.controller.on_error(event.at, event.error)
        if self._error_log.allow(event.node, event.at):
            log.error(
                "injected fsync (%s) of node %#x failed: %s; data kept as un-synced, the error "
                "goes to the application's next fsync or close",
                event.reason,
                event.node,
                os.strerror(event.error),
            )

    def _lost_data(self, event: LostEvent) -> None:
        if event.node in self._lost:
            return
        self._lost[event.node] = (event.path, event.error)
        log.error(
            "the target failed to store data of %s: %s (the error went to its writer)",
            shown(event.path),
            os.strerror(event.error),
        )

    def _hand_window(self) -> None:
        self.engine.set_window(
            self.kernel_cache.ledger_window(self._total), self.controller.commit_rate
        )

    def _say_passthrough(self, state: int) -> None:
        """Whether the kernel reads files itself (FUSE passthrough), once and at each change
        (the kernel may refuse the first backing file): in the log's own format."""
        if state != self._passthrough_said:
            self._passthrough_said = state
            log.info("passthrough: %s", PASSTHROUGH.get(state, f"off (code {state})"))

    async def _announce_ready(self) -> None:
        mountpoint = self.config.mountpoint
        problem = await run_sync_abandoning(stat_from_child, mountpoint)
        if problem is not None:
            if self._served.is_set() or self._stopping:
                # A stop came first (a SIGTERM right after the start, on a busy host; the stop
                # refuses everything new, the check too): the mount went, it did not fail.
                log.info("the mount at %s ended before it was seen to answer", mountpoint)
                return
            log.error("mount at %s does not answer: %s", mountpoint, problem)
            return
        if self._device is not None:
            # The kernel's dirty share was set before the first request; the read-ahead only
            # holds once FUSE_INIT is answered (KernelCache.set_read_ahead), which it now is.
            await trio.to_thread.run_sync(self.kernel_cache.set_read_ahead, self._device)
        stats = self.engine.stats()
        log.info(
            "mounted %s on %s with the native engine (writeback cache %s, mode %s, window "
            "%d MiB, batch %d MiB)",
            shown(self.config.source),
            shown(mountpoint),
            "on" if stats.writeback_cache else "off",
            self.config.mode,
            self._total >> 20,
            self.config.batch >> 20,
        )
        self._say_passthrough(stats.passthrough)
        cgroup = self.placement.cgroup
        if cgroup.path is not None:
            log.info("page cache of the target is charged to the memory cgroup %s", cgroup.path)
        elif cgroup.reason:
            log.info("the daemon stays in its memory cgroup: %s", cgroup.reason)
        if self.placement.direct_writes is not None:
            log.info(
                "writes leave nothing in the target's page cache (%s)%s",
                self.placement.direct_writes,
                "" if self.config.writeback_cache else ", without the writeback cache",
            )
        sdnotify.notify("READY=1")
        if self.on_ready is not None:
            self.on_ready()

    async def _signals(self) -> None:
        with trio.open_signal_receiver(*HELD_SIGNALS) as signals:
            # Held since the process started (cli.main): one that came meanwhile is taken now.
            release_held_signals()
            async for signum in signals:
                if signum == signal.SIGHUP:
                    if not self._stopping:
                        self._reload()
                    continue
                log.info("%s: flushing and unmounting", signal.Signals(signum).name)
                await self.stop()

    async def stop(self) -> None:
        """Close the cache, have the kernel write back what it holds while the engine still
        serves (until a pass brings nothing new), unmount, and end the loop: at once if the
        kernel holds on (a file still open), by aborting the connection. Bounded by
        unmount_timeout."""
        self._say_stopping()
        self._stopping = True
        deadline = trio.current_time() + self.config.unmount_timeout
        self._end_deadline = deadline
        fd: int | None = None
        with trio.move_on_at(deadline):
            try:
                fd = await run_sync_abandoning(
                    os.open, self.config.mountpoint, os.O_RDONLY | os.O_DIRECTORY
                )
            except OSError as err:
                log.error("cannot write back the kernel's cache: %s", err)
                self.exit_code = 1
        await self._engine_call(self.engine.close_the_cache, deadline)
        try:
            if fd is not None:
                with trio.move_on_at(deadline):
                    await self._write_back(fd)
            await self._engine_call(self.engine.stop, deadline)
            if fd is not None:
                # The loop notices the stop when it takes its next request: this one (the
                # attributes were expired, so the kernel must ask; the answer is ENOTCONN, from
                # the engine alone: no call to the target, so it cannot hang this thread).
                with trio.move_on_after(LOOP_END_GRACE) as poking:
                    await run_sync_abandoning(_poke, fd)
                # Left unanswered (the loop ended before any thread read it): its thread
                # waits on this process's own connection, and would keep it from exiting.
                self._poke_left = poking.cancelled_caught
        finally:
            # Not under a stat left to its thread: the number could name another file by the
            # time it runs (it is closed with the process).
            if fd is not None and not self._poke_left:
                os.close(fd)
        await self._end_the_loop(deadline)

    async def _engine_call(self, call: Callable[[], None], deadline: float) -> None:
        """A call of the engine's on the stop path, bounded: past *deadline* (at least
        LOOP_END_GRACE from now) its thread is left, as serve()'s is, and the engine is not
        freed. A notification the kernel holds behind a request thread the target holds (an
        attribute's or a page's drop) returns only once the connection is aborted, which comes
        after it (_end_the_loop)."""
        with trio.move_on_at(max(deadline, trio.current_time() + LOOP_END_GRACE)):
            await run_sync_abandoning(call)
            return
        log.info("the engine's %s is held by the target: left to its thread", call.__name__)
        self.abandoned = True

    def _say_stopping(self) -> None:
        """Tell systemd, once, that the daemon stops (its final syncs follow, not a crash)."""
        if not self._said_stopping:
            self._said_stopping = True
            sdnotify.notify("STOPPING=1")

    async def _end_the_loop(self, deadline: float) -> None:
        """Once the loop was told to end: give it a moment, then abort the connection, then
        leave it to the threads the target holds (they cannot be ended: the engine is not
        freed, the process exits around them, *deadline* bounds the end's fsyncs)."""
        with trio.move_on_after(LOOP_END_GRACE):
            await self._served.wait()
            return
        self._abort()
        with trio.move_on_after(LOOP_END_GRACE):
            await self._served.wait()
            return
        # Their callers were answered (interrupted, or the connection aborted); what they
        # leave not on the target is named with the end's fsyncs.
        log.info("request threads stuck on the target after the connection was aborted: left to it")
        self._end_deadline = deadline
        self._serving.cancel()

    async def _watch_unmount(self) -> None:
        """An unmount from outside (umount -l, fusermount3 -uz) ends the loop only once no
        request is left; one the target holds would keep the daemon forever: bound it."""
        mountpoint, device = self.config.mountpoint, self._device
        if device is None:
            return
        while True:
            await trio.sleep(1.0)
            gone = await run_sync_abandoning(lambda: find_mount(mountpoint, device=device) is None)
            if self._stopping:
                return  # the stop ends the loop itself
            if gone:
                break
        log.info("%s was unmounted", mountpoint)
        self._say_stopping()
        await self._end_the_loop(trio.current_time() + self.config.unmount_timeout)

    async def _write_back(self, fd: int) -> None:
        """syncfs on the mount until a pass brings nothing new (a write() already copying
        into the cache when it closed may dirty pages for up to 200 ms more)."""
        try:
            while True:
                before = self.engine.stats().written_bytes
                await run_sync_abandoning(_libc.syncfs, fd)
                await trio.sleep(CACHE_QUIET_PAUSE)
                await run_sync_abandoning(_libc.syncfs, fd)
                if self.engine.stats().written_bytes == before:
                    return
        except OSError as err:
            log.error("writing back the kernel's cache failed: %s", err)
            self.exit_code = 1

    def _abort(self) -> None:
        """End a connection the loop cannot leave by itself (every thread waits on a hung
        target): the kernel fails what is still waiting, with nothing acknowledged lost."""
        if self._device is None:
            return
        minor = self._device.partition(":")[2]
        control = Path("/sys/fs/fuse/connections")
        # fusectl for the moment if nobody has it mounted, and unmounted again after.
        mounted = not (control / minor).exists() and (
            subprocess.run(
                ["mount", "-t", "fusectl", "fusectl", str(control)], capture_output=True
            ).returncode
            == 0
        )
        try:
            (control / minor / "abort").write_text("1")
            log.info("the FUSE connection %s was aborted to end the request loop", minor)
        except FileNotFoundError:
            log.info("the FUSE connection %s has ended already", minor)
        except OSError as err:
            log.error("cannot abort the FUSE connection %s: %s", minor, err)
        finally:
            if mounted:
                subprocess.run(["umount", str(control)], capture_output=True)


def _poke(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.fstat(fd)
