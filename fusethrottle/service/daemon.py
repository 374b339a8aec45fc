"""Run one mount: build the parts, serve FUSE, and shut down without losing a byte.

One nursery owns every background task (flusher, signal handling, the unmount watcher, metrics,
the watchdog). Shutdown, whichever way it starts (``fusermount3 -u``/``umount``, SIGTERM,
SIGINT), runs in one order:

1. stop taking requests; let in-flight handlers finish (bounded: a handler stuck on a hung
   target is abandoned after a grace period, so a dead server can never block unmount);
2. fsync every file that holds data written since its last fsync (bounded by
   ``unmount_timeout``; what could not be synced is logged by inode and the exit code says so);
3. unmount, if the kernel has not already done it.
"""

from __future__ import annotations

import faulthandler
import logging
import math
import os
import signal
import sys
from collections.abc import Callable

import pyfuse3
import trio

from .. import _libc
from ..adapter.kernel_pages import find_fuse_device_fd
from ..metering.meter import Meter, profile_for
from ..trio_compat import ABANDON_KW as _ABANDON_KW
from . import sdnotify
from .mount import Mount, build, fuse_options, raise_fd_limit
from .mountinfo import find_mount
from .options import Config
from .placement import place
from .readiness import stat_from_child

log = logging.getLogger(__name__)

HANDLER_GRACE = 10.0
EXTRA_TASK_START_TIMEOUT = 10.0
#: Largest request buffer (a 1 MiB FUSE write) and then some: see _libc.keep_request_buffers...
REQUEST_BUFFER_MAX = 4 << 20
#: A mount that received no request for this long gives its kept request buffers back. Short:
#: the pauses between backups can be a second (the soak's), and a trim costs a few ms of heap
#: walk plus page faults as the next burst takes its buffers again.
HEAP_TRIM_IDLE = 0.5
#: ... but at most once this often. A backup writing at a steady rate reaches the daemon in
#: bursts with gaps of about a second (the kernel writes the mount's cache back that way), and
#: a trim in every gap had each burst fault its buffers back in (docs/DESIGN.md, "Request
#: buffers").
HEAP_TRIM_INTERVAL = 10.0
#: Longer than the kernel's longest dirty-throttling pause (200 ms): see _write_back_kernel_cache.
CACHE_QUIET_PAUSE = 0.3


class Daemon:
    """Serves one Mount until it is unmounted or told to stop."""

    def __init__(self, mount: Mount, on_ready: Callable[[], None] | None = None) -> None:
        self.mount = mount
        self.on_ready = on_ready
        self.unmounted_by_kernel = False
        self.stopping: trio.Event | None = None  # created inside trio.run
        self.extra_tasks: list[Callable[..., object]] = []
        self.exit_code = 0
        self._mount_id: str | None = None
        #: When the whole shutdown must be over (set when it starts: unmount_timeout from then).
        self._stop_deadline: float | None = None

    async def run(self) -> int:
        config = self.mount.config
        self.stopping = trio.Event()
        pyfuse3.init(self.mount.ops, config.mountpoint, fuse_options(config))
        mounted = True
        try:
            info = find_mount(config.mountpoint, fstype="fuse.fusethrottle")
            self._mount_id = info.device if info else None
            device_fd = find_fuse_device_fd()
            self.mount.kernel_pages.attach(device_fd)
            if self.mount.kernel_entries is not None:
                self.mount.kernel_entries.attach(device_fd)
            async with trio.open_nursery() as nursery:
                await nursery.start(self.mount.kernel_pages.run)
                if self.mount.kernel_entries is not None:
                    await nursery.start(self.mount.kernel_entries.run)
                await nursery.start(self.mount.budget.run)
                await nursery.start(self.mount.flusher.run)
                await nursery.start(self.mount.budget.keep_kernel_share)
                await nursery.start(self.mount.ops.kills.run)
                await nursery.start(self.mount.backend.run_closer)
                if self.mount.fleet is not None:
                    await nursery.start(self.mount.fleet.run)
                nursery.start_soon(self._signals)
                nursery.start_soon(self._announce_ready, config.mountpoint)
                nursery.start_soon(self._watch_unmount)
                nursery.start_soon(self._trim_heap_when_idle)
                if sdnotify.watchdog_interval():
                    nursery.start_soon(sdnotify.watchdog_task)
                for extra in self.extra_tasks:
                    # A helper task that never reports started would leave a mount nobody
                    # serves (every access hangs); fail, and so unmount, instead.
                    with trio.fail_after(EXTRA_TASK_START_TIMEOUT):
                        await nursery.start(extra)
                with trio.CancelScope() as self._serve_scope:
                    await pyfuse3.main(max_tasks=128)
                sdnotify.notify("STOPPING=1")
                await self._flush_everything()
                nursery.cancel_scope.cancel()
        finally:
            if not self.unmounted_by_kernel:
                self.unmounted_by_kernel = (
                    find_mount(config.mountpoint, device=self._mount_id) is None
                )
            try:
                pyfuse3.close(unmount=mounted and not self.unmounted_by_kernel)
            except Exception:
                log.exception("cleaning up the FUSE session failed")
            self.mount.inodes.close_all()
        return self.exit_code

    async def _trim_heap_when_idle(self) -> None:
        """Once per quiet spell, return the heap kept for request buffers: a mount idle
        between nightly backups holds what it uses, not what its busiest minute needed."""
        ops = self.mount.ops
        seen = trimmed = ops.requests_total
        last_request = trio.current_time()
        last_trim = -math.inf
        while True:
            await trio.sleep(HEAP_TRIM_IDLE / 4)
            now = trio.current_time()
            if ops.requests_total != seen:
                seen, last_request = ops.requests_total, now
            elif seen != trimmed and heap_trim_due(now, last_request, last_trim):
                _libc.release_free_heap()
                trimmed, last_trim = seen, now

    async def _announce_ready(self, mountpoint: str) -> None:
        """Ready means the mount answers: a stat through it came back."""
        problem = await trio.to_thread.run_sync(stat_from_child, mountpoint, **_ABANDON_KW)
        if problem is not None:
            stopping = self.stopping is not None and self.stopping.is_set()
            if stopping or find_mount(mountpoint, device=self._mount_id) is None:
                # A stop or an unmount came first (a SIGTERM right after the start, on a busy
                # host): the mount went, it did not fail.
                log.info("the mount at %s ended before it was seen to answer", mountpoint)
                return
            log.error("mount at %s does not answer: %s", mountpoint, problem)
            return
        # Only now: the kernel applies what FUSE_INIT negotiated (read-ahead included) when
        # the first request is answered, which would undo settings made before it.
        self.mount.kernel_cache.attach(self._mount_id, self.mount.budget.total_window())
        log.info(
            "mounted %s on %s (mode=%s, batch=%d, window=%d)",
            self.mount.config.source,
            mountpoint,
            self.mount.config.mode,
            self.mount.config.batch,
            self.mount.config.window,
        )
        cgroup = self.mount.memory_cgroup
        if cgroup is not None and cgroup.path is not None:
            log.info(
                "page cache of the target is charged to the memory cgroup %s (limit %d MiB), "
                "not to %s",
                cgroup.path,
                cgroup.limit >> 20,
                cgroup.hierarchy.current if cgroup.hierarchy else "?",
            )
        elif cgroup is not None and cgroup.reason:
            log.info("the daemon stays in its memory cgroup: %s", cgroup.reason)
        if self.mount.direct_writes is not None:
            log.info(
                "writes leave nothing in the target's page cache (%s)%s",
                self.mount.direct_writes,
                "" if self.mount.config.writeback_cache else ", without the writeback cache",
            )
        sdnotify.notify("READY=1")
        if self.on_ready is not None:
            self.on_ready()

    async def _signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async for signum in signals:
                if signum == signal.SIGHUP:
                    continue
                log.info("%s: flushing and unmounting", signal.Signals(signum).name)
                await self._write_back_kernel_cache()
                self.request_stop()

    async def _write_back_kernel_cache(self) -> None:
        """Have the kernel hand over the mount's cached writes while requests are still served.

        With the writeback cache, a write() the application saw succeed may still sit in the
        mount's page cache. An unmount makes the kernel write it back before the mount goes;
        a signal does not. So: refuse further writes into the cache (see
        ``Operations.close_the_cache``), then syncfs on the mount, before the loop stops serving
        the FUSE_WRITEs that carry those pages (bounded like the final fsyncs). A write() that
        was already copying into the cache when it closed may go on dirtying pages (a large one,
        or one paused by the kernel's dirty throttling, at most 200 ms at a time), so syncfs is
        repeated until one that follows a quiet pause brings nothing more.
        """
        if not self.mount.config.writeback_cache:
            return
        mountpoint = self.mount.config.mountpoint
        fd: int | None = None
        try:
            # Opened before the cache closes: afterwards the kernel could not check the path.
            # The open asks this daemon, which may ask a hung target: bounded like the rest.
            deadline = self._shutdown_deadline()
            with trio.move_on_at(deadline):
                fd = await trio.to_thread.run_sync(
                    os.open, mountpoint, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, **_ABANDON_KW
                )
        except OSError as err:
            log.error("cannot write back the kernel's cache of %s: %s", mountpoint, err)
            return
        if fd is None:
            log.error(
                "cannot write back the kernel's cache of %s: the mount did not answer", mountpoint
            )
            return
        self.mount.ops.close_the_cache()
        ledger = self.mount.ledger
        try:
            with trio.move_on_at(deadline):
                await trio.to_thread.run_sync(_libc.syncfs, fd, **_ABANDON_KW)
                while True:
                    before = ledger.written_total
                    await trio.sleep(CACHE_QUIET_PAUSE)
                    await trio.to_thread.run_sync(_libc.syncfs, fd, **_ABANDON_KW)
                    if ledger.written_total == before:
                        break
        except OSError as err:
            log.error("writing back the kernel's cache of %s failed: %s", mountpoint, err)
        finally:
            os.close(fd)

    def request_stop(self) -> None:
        if self.stopping is not None and not self.stopping.is_set():
            self.stopping.set()
            pyfuse3.terminate()

    async def _watch_unmount(self) -> None:
        """Notice an unmount (or a stop request) and bound how long stuck handlers may take."""
        while True:
            with trio.move_on_after(1.0):
                await self.stopping.wait()
            if self.stopping.is_set():
                break
            gone = await trio.to_thread.run_sync(
                lambda: find_mount(self.mount.config.mountpoint, device=self._mount_id) is None
            )
            if gone:
                self.unmounted_by_kernel = True
                log.info("%s was unmounted", self.mount.config.mountpoint)
                break
        await trio.sleep(HANDLER_GRACE)
        log.warning(
            "requests still stuck on the target after %.0fs; abandoning them", HANDLER_GRACE
        )
        self._serve_scope.cancel()

    def _removed(self, nodeid: int) -> bool:
        inode = self.mount.inodes.get(nodeid)
        return inode is not None and inode.removed is not None

    def _shutdown_deadline(self) -> float:
        """unmount_timeout from when the shutdown began (a signal, or the kernel's unmount)."""
        if self._stop_deadline is None:
            self._stop_deadline = trio.current_time() + self.mount.config.unmount_timeout
        return self._stop_deadline

    async def _flush_everything(self) -> None:
        ledger = self.mount.ledger
        with trio.move_on_at(self._shutdown_deadline()) as scope:
            failed = await self.mount.flusher.flush_all("unmount")
            await self.mount.backend.closes_made()
        if scope.cancelled_caught:
            failed = [n for n, s in ledger.files.items() if s.unsynced > 0]
        # A failed injected fsync nobody was told of lost data, even if a retry then "succeeded"
        # (the target had already dropped the pages it could not write); unless the file is gone.
        failed += [
            n
            for n, s in ledger.files.items()
            if s.error is not None and n not in failed and not self._removed(n)
        ]
        if failed:
            for nodeid in failed:
                state = ledger.file(nodeid)
                error = state.error if state is not None else None
                log.error(
                    "not on the target: %s (%s)",
                    self.mount.inodes.path(nodeid),
                    os.strerror(error) if error is not None else "the target did not answer",
                )
            log.error(
                "%d file(s) could not be synced before exit: %s",
                len(failed),
                "target did not answer in time" if scope.cancelled_caught else "fsync failed",
            )
            self.exit_code = 1
        else:
            snap = self.mount.ledger.snapshot(trio.current_time())
            log.info("all data synced (%d bytes written through this mount)", snap.written_total)
        # Files the target failed to store while mounted, whose writers were told: the exit
        # status does not count them, but the operator needs their names all the same.
        for nodeid, error in ledger.lost.items():
            if nodeid not in failed and not self._removed(nodeid):
                log.warning(
                    "incomplete on the target: %s (%s; the error went to its writer)",
                    self.mount.inodes.path(nodeid),
                    os.strerror(error),
                )


def configure_logging(level: str, foreground: bool) -> None:
    root = logging.getLogger()
    root.setLevel(getattr(logging, level.upper()))
    for handler in list(root.handlers):
        root.removeHandler(handler)
    if foreground or os.environ.get("JOURNAL_STREAM") or os.environ.get("INVOCATION_ID"):
        handler: logging.Handler = logging.StreamHandler(sys.stderr)
        if os.environ.get("JOURNAL_STREAM"):
            handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        else:
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
            )
    elif os.path.exists("/dev/log"):
        from logging.handlers import SysLogHandler

        handler = SysLogHandler(address="/dev/log")
        handler.setFormatter(
            logging.Formatter("fusethrottle[%(process)d]: %(levelname)s %(message)s")
        )
    else:
        handler = logging.NullHandler()
    root.addHandler(handler)


def heap_trim_due(now: float, last_request: float, last_trim: float) -> bool:
    """Whether a mount that received requests since its last trim gives its heap back now:
    quiet for ``HEAP_TRIM_IDLE``, and no trim for ``HEAP_TRIM_INTERVAL`` (pure)."""
    return now - last_request >= HEAP_TRIM_IDLE and now - last_trim >= HEAP_TRIM_INTERVAL


def serve(config: Config, on_ready: Callable[[], None] | None = None) -> int:
    """Mount and serve until unmounted; returns the process exit code."""
    os.umask(0)  # the kernel already applied the caller's umask to every mode we receive
    raise_fd_limit()
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # Before anything touches the target: its page cache is charged to whoever writes it.
    placement = place(config)
    config = placement.config
    try:
        if config.engine == "native":
            from .native_daemon import serve_native

            return serve_native(placement, on_ready)
        _libc.keep_request_buffers_in_the_heap(REQUEST_BUFFER_MAX)
        from ..observability.metrics import attach_metrics

        meter = Meter(profile_for(config))  # one per mount: the ceilings' and the metrics'
        events, observer, extra = attach_metrics(config, meter)
        mount = build(config, events, observer, meter, placement.direct_writes)
        mount.memory_cgroup = placement.cgroup
        mount.direct_writes = placement.direct_writes
        daemon = Daemon(mount, on_ready)
        daemon.extra_tasks = extra(mount)
        try:
            return trio.run(daemon.run)
        except OSError as err:
            log.error("fusethrottle: %s", err)
            return 1
    finally:
        placement.cgroup.leave()


__all__ = ["Daemon", "Mount", "build", "configure_logging", "serve"]
