"""Run the plan: for each target, each repeat, each workload, every arm in turn (interleaved,
so all arms see the same machine), each in a clean state, each torn down before the next.

One arm ("cell") goes:
  fresh cgroup -> bdi limit or fusethrottle mount -> neighbour ready -> sampler + lead-in ->
  t0: rate schedule starts, backup runs -> backup exits -> daemon flushes and exits ->
  syncfs(target) = durable -> tail -> everything undone -> the target emptied and synced.
A crashed arm is recorded as failed and the run goes on; Ctrl-C and SIGTERM tear down and stop.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import analysis
from bench.cgroup import MemoryCgroup
from bench.daemon import (
    CBuild,
    FuseThrottleMount,
    PassthroughLLMount,
    build_passthrough_ll,
    find_executable,
)
from bench.plan import ArmSpec, MiB, Plan, WorkloadSpec, format_schedule
from bench.prober import MetadataProber
from bench.results import ResultWriter, now_iso
from bench.sampler import Sampler
from bench.stall_stacks import StackSampler, stall_waits
from bench.system import (
    JOURNAL_DIR,
    ArmSkipped,
    BenchError,
    Child,
    Teardown,
    cpu_times,
    loadavg,
    meminfo,
    process_cpu_seconds,
    resident_bytes,
    start,
    tree_resident_bytes,
)
from bench.target import BdiLimit, NfsCounter, Target, make_target
from bench.workloads import (
    JobContext,
    WorkloadResult,
    make_tree,
    prepare_workload,
    run_workload,
    skip_reason,
)

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent

Daemon = FuseThrottleMount | PassthroughLLMount


def ft_mount_options(plan: Plan, arm: ArmSpec) -> str:
    """The -o options an ft-* arm mounts with, before the metrics endpoint the harness may add:
    the mode the arm is named after, the plan's --ft-options, the arm's own (several joined by
    ``:``, since commas separate arms). With empty --ft-options (the passthrough preset) that
    is ``mode=...`` alone: the daemon's defaults."""
    opts = f"mode={arm.ft_mode},{plan.ft_options},{arm.param.replace(':', ',')}"
    return ",".join(o for o in opts.split(",") if o)


class Runner:
    """Owns the work directories and runs every cell of a :class:`Plan`."""

    def __init__(self, plan: Plan, writer: ResultWriter, teardown: Teardown, exe: str | None):
        self.plan = plan
        self.results = writer
        self.teardown = teardown
        self.exe = find_executable(exe)
        self.exe_reason = "fusethrottle executable not found (--fusethrottle PATH)"
        pid = os.getpid()
        # Host-disk work area (loop image, victim file) and a tmpfs one (logs, tar source).
        self.workdir = Path(plan.workdir or "/var/tmp") / f"fusethrottle-bench-{pid}"
        self.scratch = JOURNAL_DIR / f"run-{pid}"
        self._trees: dict[int, tuple[Path, int, int]] = {}
        self._daemon: Daemon | None = None
        self._c_build: CBuild | ArmSkipped | BenchError | None = None
        self.order = 0
        self.env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
        self.python = [sys.executable, "-m"]

    def run(self) -> None:
        self.workdir.mkdir(parents=True)
        self.teardown.push("rmtree", str(self.workdir))
        self.scratch.mkdir(parents=True)
        self.teardown.push("rmtree", str(self.scratch))
        total = self.plan.cells_per_repeat() * self.plan.repeats
        for spec in self.plan.targets:
            mark = self.teardown.mark()
            target = make_target(spec, self.workdir / f"t{self.plan.targets.index(spec)}")
            target.setup(self.teardown)
            self.results.add_target(target.info() | {"description": target.description})
            for repeat in range(self.plan.repeats):
                for workload in self.plan.workloads:
                    # Rotate the arm order each repeat so no arm always goes first.
                    k = repeat % len(self.plan.arms)
                    arms = self.plan.arms[k:] + self.plan.arms[:k]
                    for arm in arms:
                        self.order += 1
                        log.info(
                            "[%d/%d] %s %s %s repeat %d",
                            *(self.order, total, target.spec.label),
                            *(workload.label, arm.label, repeat + 1),
                        )
                        self.run_cell(target, workload, arm, repeat)
            # (Not in a finally: on Ctrl-C the global teardown lifts the throttle first.)
            self.teardown.undo_since(mark)

    # --- one arm ---------------------------------------------------------------------------

    def run_cell(self, target: Target, workload: WorkloadSpec, arm: ArmSpec, repeat: int) -> None:
        cell = f"{self.order:03d}-{workload.kind}-{arm.label.replace(':', '_')}-r{repeat + 1}"
        if len(self.plan.targets) > 1:
            cell = f"{self.order:03d}-{target.spec.kind}-{cell[4:]}"
        summary: dict[str, object] = {
            "cell": cell,
            "order": self.order,
            "target": target.spec.label,
            "schedule": format_schedule(target.spec.schedule) if target.spec.throttled else None,
            "workload": workload.label,
            "workload_size": workload.size,
            "arm": arm.label,
            "repeat": repeat + 1,
            "started_at": now_iso(),
        }
        reason = self.skip_reason(target, workload, arm)
        if reason:
            log.info("  skipped: %s", reason)
            self.results.add_cell(summary | {"status": "skipped", "reason": reason})
            return
        summary["host_dirty_before_mib"] = settle_host_writeback()
        mark = self.teardown.mark()
        scratch = self.scratch / cell
        scratch.mkdir()
        dest = target.cell_dir(cell)
        try:
            summary |= self._run(target, workload, arm, cell, scratch, dest)
            summary["status"] = "ok"
        except ArmSkipped as err:
            self._close_daemon(target)
            log.info("  skipped: %s", err)
            summary |= {"status": "skipped", "reason": str(err)}
        except Exception as err:
            self._close_daemon(target)
            log.error("  arm failed: %s", err)
            log.debug("%s", traceback.format_exc())
            summary |= {"status": "failed", "reason": f"{type(err).__name__}: {err}"}
        except BaseException:
            # Ctrl-C / SIGTERM: record the arm, leave the undoing to the global teardown, which
            # lifts the throttle first so a daemon's final flush does not crawl.
            if target.schedule:
                target.schedule.halt()
            self.results.add_cell(summary | {"status": "failed", "reason": "interrupted"})
            raise
        self._daemon = None
        # Back to the first rate before undoing, so a failed arm's flush is not stuck in a stall.
        if target.schedule:
            target.schedule.stop()
        self.teardown.undo_since(mark)
        with contextlib.suppress(OSError):
            target.clear(dest)
        shutil.rmtree(scratch, ignore_errors=True)
        self.results.add_cell(summary)
        if summary["status"] == "ok":
            log.info("  %s", _one_line(summary))

    def _close_daemon(self, target: Target) -> None:
        """After a failed arm: the first rate back (no flush into a stall), then SIGTERM the
        daemon and give it the chance to flush before the hard undo."""
        if target.schedule:
            target.schedule.stop()
        if self._daemon is not None:
            self._daemon.close()

    def skip_reason(self, target: Target, workload: WorkloadSpec, arm: ArmSpec) -> str | None:
        if arm.kind == "idle":
            return None
        reason = skip_reason(workload, arm)
        if reason:
            return reason
        if arm.kind == "direct-bdi":
            return target.bdi_skip_reason()
        if arm.is_fusethrottle and self.exe is None:
            return self.exe_reason
        if arm.is_c_passthrough:
            if not os.path.exists("/dev/fuse"):
                return "/dev/fuse is absent: no FUSE mounts here"
            build = self.c_build()
            if isinstance(build, ArmSkipped):
                return str(build)
        return None

    def c_build(self) -> CBuild | ArmSkipped | BenchError:
        """libfuse's passthrough_ll, compiled (or found up to date) once per run; a missing tool
        is remembered as the reason every C arm is skipped, a compile error as why it failed."""
        if self._c_build is None:
            try:
                self._c_build = build_passthrough_ll(cache=None)
                self.results.write_run({"passthrough_ll": self._c_build.info()})
            except (ArmSkipped, BenchError) as err:
                log.warning("c-ll arms: %s", err)
                self._c_build = err
        return self._c_build

    def _run(
        self,
        target: Target,
        workload: WorkloadSpec,
        arm: ArmSpec,
        cell: str,
        scratch: Path,
        dest: Path,
    ) -> dict[str, object]:
        plan = self.plan
        with contextlib.ExitStack() as stack:
            # Everything below registers its undo with self.teardown; run_cell undoes it after
            # the arm (or the global teardown on Ctrl-C, throttle first).
            cg = None
            if plan.cgroup_mem:
                name = f"fusethrottle-bench-{os.getpid()}-{self.order}"
                cg = MemoryCgroup(name, plan.cgroup_mem, self.teardown).create()
            procs = cg.procs if cg else None
            if arm.kind == "direct-bdi":
                assert target.bdi is not None
                BdiLimit(target.bdi, arm.bdi_max_bytes(), self.teardown, target.image).apply()

            daemon: Daemon | None = None
            write_dir = dest
            if arm.is_fuse:
                backing = dest / "backing"
                backing.mkdir()
                daemon = self._make_daemon(arm, cell, backing, procs)
                self._daemon = daemon  # closed gently by run_cell if the arm fails
                daemon.start(timeout=plan.mount_timeout)
                write_dir = daemon.mountpoint

            ctx = JobContext(
                teardown=self.teardown,
                scratch=scratch,
                python=self.python,
                env=self.env,
                cgroup_procs=procs,
                set_writer_pid=lambda pid: None,  # the sampler follows the writer from t0 on
                tree_source=self._tree,
                verify=plan.verify,
                daemon_cpu=lambda: (
                    process_cpu_seconds(daemon.pid) if daemon and daemon.pid else None
                ),
            )
            prepared = {} if arm.kind == "idle" else prepare_workload(workload, write_dir, ctx)

            victim_log = scratch / "victim.csv"
            victim = None
            stacks = None
            if plan.victim != "none":
                victim = self._start_victim(cell, victim_log, procs)
                if os.geteuid() == 0:
                    stacks = StackSampler(victim.pid, STACK_INTERVAL)
                    stacks.start()
                    stack.callback(stacks.stop)

            sampler = Sampler(
                plan.sample_interval,
                target.counter.read,
                cg.stat if cg else None,
                daemon.pid if daemon else None,
                daemon.metrics_url if daemon else None,
                self._residency(cell, dest, target) if cg and victim else None,
            )
            sampler.start()
            stack.callback(sampler.stop)
            prober = None
            if plan.victim != "none":
                prober = MetadataProber(write_dir, plan.sample_interval)
                prober.start()
                stack.callback(prober.stop)
            time.sleep(plan.lead_seconds)

            # t0: the backup starts, and the schedule with it. With a head start the writer is
            # launched that much earlier and waits for t0 itself, so its interpreter's start-up
            # (seconds in a TCG guest) falls before the clock, not into the schedule's steps.
            t0 = time.monotonic() + plan.writer_head_start
            at_t0: dict[str, Any] = {}

            def clock_starts() -> None:
                at_t0["load"] = loadavg()
                at_t0["busy"] = cpu_times()
                at_t0["absorbed"] = target.counter.read()
                at_t0["daemon_cpu"] = (
                    process_cpu_seconds(daemon.pid) if daemon and daemon.pid else None
                )
                sampler.mark()

            starter = threading.Timer(max(0.0, t0 - time.monotonic()), clock_starts)
            starter.daemon = True
            if plan.writer_head_start > 0:
                ctx.start_at = t0
                starter.start()
            else:
                clock_starts()
            if target.schedule:
                target.schedule.start(t0)
            if arm.kind == "idle":
                time.sleep(max(0.0, t0 - time.monotonic()) + plan.idle_seconds)
                wres = WorkloadResult(seconds=plan.idle_seconds)
            else:
                ctx.set_writer_pid = lambda pid: setattr(sampler, "writer_pid", pid)
                wres = run_workload(workload, arm, write_dir, ctx)
            if plan.writer_head_start > 0:
                starter.join()
            load_start = at_t0["load"]
            busy0 = at_t0["busy"]
            absorbed0 = at_t0["absorbed"]
            daemon_cpu0 = at_t0["daemon_cpu"]
            t_written = time.monotonic()
            sampler.writer_pid = None
            probes = prober.stop() if prober else []  # before the daemon goes away
            daemon_cpu1 = process_cpu_seconds(daemon.pid) if daemon and daemon.pid else None
            stop_info: dict[str, object] = {}
            if daemon:
                stop_info = daemon.stop(timeout=plan.daemon_stop_timeout)
                if stop_info["exit_code"] != 0:
                    how = "on SIGTERM" if arm.is_fusethrottle else "after its unmount"
                    raise BenchError(
                        f"{daemon.name} exited {stop_info['exit_code']} {how}: "
                        f"{stop_info['stderr_tail']}"
                    )
            t_flushed = time.monotonic()
            sync_s = target.sync()
            sampler.mark()
            t_durable = time.monotonic()
            absorbed1 = target.counter.read()
            busy1 = cpu_times()
            load_end = loadavg()
            on_target = _tree_bytes(dest)
            time.sleep(plan.tail_seconds)
            sampler.stop()
            victim_ops: list[tuple[float, float]] = []
            stack_samples = stacks.stop() if stacks else []
            if victim:
                victim.stop(grace=30)
                self.teardown.forget(victim.key)
                victim_ops = _read_victim(victim_log)
            cg_failcnt = cg.failcnt() if cg else None
            cg_oom_kills = cg.oom_kills() if cg else None

        # --- numbers -------------------------------------------------------------------------
        t_end = t0 + (plan.idle_seconds if arm.kind == "idle" else t_durable - t0)
        absorbed = (
            absorbed1 - absorbed0 if absorbed0 is not None and absorbed1 is not None else None
        )
        durable_s = t_durable - t0
        out: dict[str, object] = {
            "app_bytes": wres.bytes,
            "files": wres.files,
            "on_target_bytes": on_target,
            "write_s": wres.seconds,
            "app_mibps": analysis.rate(wres.bytes, wres.seconds) if wres.bytes else None,
            "durable_s": durable_s,
            "flush_s": t_flushed - t_written,
            "sync_s": sync_s,
            "absorbed_bytes": absorbed,
            "absorbed_by": target.counter.description,
            "target_mibps": analysis.rate(absorbed, durable_s) if wres.bytes else None,
            "absorbed_ratio": absorbed / wres.bytes
            if absorbed is not None and wres.bytes
            else None,
            "write_p50_ms": _ms(wres.write_p50),
            "write_p99_ms": _ms(wres.write_p99),
            "write_max_ms": _ms(wres.write_max),
            "writes_over_1s": wres.writes_over_1s,
            "writer_fsyncs": wres.fsyncs,
            "writer_fsync_max_ms": _ms(wres.fsync_max) if wres.fsyncs else None,
            "verified": wres.verified,
            "writer_cpu_s": wres.cpu_s,
            "load1_start": load_start,
            "load1_end": load_end,
            "machine_busy_pct_arm": 100 * (busy1[0] - busy0[0]) / max(1.0, busy1[1] - busy0[1]),
            "cgroup_failcnt": cg_failcnt,
            "cgroup_oom_kills": cg_oom_kills,
            "t0_monotonic": t0,
        }
        out |= {f"wl_{k}": v for k, v in (prepared | wres.extra).items()}
        if daemon:
            during = (
                daemon_cpu1 - daemon_cpu0
                if daemon_cpu0 is not None and daemon_cpu1 is not None
                else None
            )
            out |= {
                "daemon_cpu_s": during,
                "daemon_cpu_total_s": stop_info.get("daemon_cpu_s"),
                "daemon_stop_s": stop_info.get("stop_seconds"),
                "daemon_mount_s": stop_info.get("mount_seconds"),
                "daemon_options": daemon.options,
                "daemon": daemon.name,
                "daemon_pid": daemon.pid,
                "daemon_command": " ".join(daemon.command),
                "daemon_invocation": daemon.generic_command(),
            }
        cpu = wres.cpu_s + (out.get("daemon_cpu_s") or 0.0)  # type: ignore[operator]
        out["cpu_s_per_gib"] = analysis.cpu_per_gib(cpu, wres.bytes)
        out |= analysis.sample_stats(sampler.rows, t0, t_end)
        out |= analysis.victim_stats(victim_ops, t0, t_end)
        if stacks is not None and stacks.readable:
            # Where the neighbour's operations longer than 0.1 s waited, in seconds per wait.
            during = [(t, lat) for t, lat in victim_ops if t0 <= t <= t_end]
            out["victim_stalled_in"] = stall_waits(during, stack_samples, STACK_INTERVAL)
        if sampler.scraper:
            out |= analysis.metrics_stats(sampler.scraper.snapshots, t0, t_end)
            out["metrics_answered"] = bool(sampler.scraper.snapshots)

        self.results.add_samples(cell, sampler.rows, t0)
        self.results.add_victim(cell, victim_ops, t0)
        self.results.add_probes(cell, probes, t0)
        out |= analysis.probe_stats(probes)
        self.results.add_writer(cell, _read_jsonl(scratch / "writer.jsonl"), t0)
        return out

    def _make_daemon(self, arm: ArmSpec, cell: str, backing: Path, procs: str | None) -> Daemon:
        """The arm's FUSE daemon over *backing* (on the target), not started yet."""
        mountpoint = self.scratch / f"mnt-{self.order}"
        log_path = self.results.out / "logs" / f"{cell}-daemon.log"
        cgroup = procs if self.plan.daemon_in_cgroup else None
        if arm.is_fusethrottle:
            assert self.exe is not None
            return FuseThrottleMount(
                self.exe,
                backing,
                mountpoint,
                ft_mount_options(self.plan, arm),
                log_path,
                self.teardown,
                cgroup,
                self.plan.metrics,
            )
        build = self.c_build()
        if not isinstance(build, CBuild):
            raise build
        return PassthroughLLMount(
            build.binary, backing, mountpoint, arm.c_options(), log_path, self.teardown, cgroup
        )

    def _residency(self, cell: str, dest: Path, target: Target) -> Callable[[], dict[str, int]]:
        files = self.victim_files(cell)
        # Not on NFS: opening a file someone is writing there waits for its dirty pages to reach
        # the server (the client flushes to get c/mtime right), and a sampler waiting on that
        # took 10 samples in 45 s of a direct arm in the NFS lab, missing its Dirty peaks.
        on_nfs = isinstance(target.counter, NfsCounter)

        def sample() -> dict[str, int]:
            out = {"victim_cached": sum(resident_bytes(f) for f in files)}
            if not on_nfs:
                out["target_cached"] = tree_resident_bytes(dest)
            return out

        return sample

    def victim_files(self, cell: str) -> list[Path]:
        """The victim's files on the host disk: its log, its data, the cache filler."""
        base = self.workdir / f"victim-{cell}.dat"
        return [base, Path(f"{base}.data"), self.workdir / "fill"]

    def _start_victim(self, cell: str, log_path: Path, procs: str | None) -> Child:
        plan = self.plan
        path, _data, fill = self.victim_files(cell)
        cmd = [*self.python, "bench.victim", "--path", str(path), "--mode", plan.victim]
        cmd += ["--log", str(log_path)]
        if plan.victim == "db":
            # Back to back (its throughput is the measure); a working set of a share of the
            # cgroup (half by default), which the filler has made full of cache before the
            # first transaction; over 1, it never fits and every transaction reads from disk.
            working_set = int(plan.cgroup_mem * plan.victim_working_set)
            cmd += ["--interval", "0", "--working-set", str(working_set)]
            if plan.cgroup_mem:
                self._make_fill(fill, plan.cgroup_mem)
                cmd += ["--fill", str(fill)]
        else:
            cmd += ["--interval", str(plan.victim_interval)]
        child = start(
            "victim",
            cmd,
            teardown=self.teardown,
            cgroup_procs=procs,
            stderr=log_path.with_suffix(".err"),
            env=self.env,
        )
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError), open(log_path) as f:
                if f.readline().startswith("# ready"):
                    return child
            if child.poll() is not None:
                raise BenchError(f"victim exited {child.exit_code} before it was ready")
            if time.monotonic() > deadline:
                raise BenchError("victim not ready after 60s")
            time.sleep(0.02)

    def _make_fill(self, path: Path, size: int) -> None:
        """The file the db victim reads to fill its cgroup with cache, made once per run."""
        if path.exists() and path.stat().st_size == size:
            return
        block = os.urandom(1 << 20)
        with open(path, "wb") as f:
            for _ in range(size >> 20):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())

    def _tree(self, size: int) -> tuple[Path, int, int]:
        """The source tree for tar workloads, generated once per size on tmpfs."""
        if size not in self._trees:
            root = self.scratch / f"tree-{size}"
            t = time.monotonic()
            files, total = make_tree(root, size)
            log.info(
                "  generated a %d-file tree (%d MiB) in %.1fs",
                files,
                total >> 20,
                time.monotonic() - t,
            )
            self._trees[size] = (root, files, total)
        return self._trees[size]


def settle_host_writeback() -> float:
    """Write the host's dirty pages back before an arm starts, and say how many MiB there were.

    Whatever ran before the arm (a package install, the setup of the run, a file deleted by
    the last arm) can leave hundreds of MiB dirty; written back during the arm, that is I/O the
    arm did not make, and it lands on the neighbour: a first idle arm once started with 242 MiB
    dirty and its neighbour saw a 213 ms operation, against 57-121 ms in the other idle arms.
    """
    mem = meminfo()
    os.sync()
    return round((mem.get("Dirty", 0) + mem.get("Writeback", 0)) / MiB, 1)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def _tree_bytes(path: Path) -> int:
    """Apparent size of everything the arm left on the target (checks nothing was lost)."""
    total = 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


#: How often the neighbour's kernel stack is sampled (bench.stall_stacks).
STACK_INTERVAL = 0.01


def _read_victim(path: Path) -> list[tuple[float, float]]:
    ops = []
    with contextlib.suppress(OSError), open(path) as f:
        for line in f:
            if line.startswith("#"):
                continue
            t, _, lat = line.partition(",")
            with contextlib.suppress(ValueError):
                ops.append((float(t), float(lat)))
    return ops


def _read_jsonl(path: Path) -> list[dict]:
    out = []
    with contextlib.suppress(OSError), open(path) as f:
        for line in f:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


def _one_line(s: dict) -> str:
    def f(key: str, fmt: str) -> str:
        v = s.get(key)
        return "-" if v is None else format(v, fmt)

    return (
        f"app {f('app_mibps', '.1f')} MiB/s, target {f('target_mibps', '.1f')} MiB/s, "
        f"durable {f('durable_s', '.1f')} s, Dirty+WB peak {f('dirty_wb_peak_mib', '.0f')} MiB, "
        f"write max {f('write_max_ms', '.0f')} ms, victim p99/max "
        f"{f('victim_p99_ms', '.1f')}/{f('victim_max_ms', '.0f')} ms"
    )
