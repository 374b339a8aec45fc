"""``python -m bench run|report|cleanup|presets``: the one command users run.

User mistakes (a bad flag, not root, a missing tool) are one line on stderr and exit status 2;
an interrupted run (Ctrl-C, SIGTERM) tears everything down, still writes the report of what it
measured, and exits 130.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
import time
from pathlib import Path

from bench.plan import VICTIMS, Plan, PlanError, format_schedule, parse_duration, parse_size
from bench.presets import PRESETS, build_plan, describe

log = logging.getLogger("bench")

REPO = Path(__file__).resolve().parent.parent


def _size_or_none(text: str) -> int:
    return 0 if text.lower() in ("none", "0", "off") else parse_size(text)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a benchmark (needs root for the built-in targets)")
    r.add_argument("--preset", default="victim", help=f"one of {', '.join(PRESETS)}")
    scale = r.add_mutually_exclusive_group()
    scale.add_argument("--quick", action="store_true", help="under 5 minutes on 2 cores")
    scale.add_argument("--smoke", action="store_true", help="seconds; what CI runs")
    r.add_argument(
        "--target",
        action="append",
        help="loop (built-in throttled ext4), zram (the same on a device of its own, not the "
        "neighbour's disk), tmpfs, rootdir, or a directory such as your NFS mount (repeatable)",
    )
    r.add_argument(
        "--throttle",
        help="tc:DEV: a directory target's rate (--rate/--schedule) is DEV's egress, set with "
        "tc tbf (an NFS mount whose link to the server is yours, as in the NFS lab)",
    )
    r.add_argument(
        "--workdir",
        help="where the victim's files and the loop image go (default /var/tmp; must be a real "
        "disk: fdatasync on tmpfs returns at once)",
    )
    r.add_argument(
        "--writer-head-start",
        type=parse_duration,
        help="launch the backup writer this long before its clock and schedule start (it "
        "waits): where an interpreter takes seconds to start, as in a TCG guest",
    )
    r.add_argument(
        "--mount-timeout",
        type=parse_duration,
        help="seconds a FUSE daemon may take to mount (default 30)",
    )
    r.add_argument("--rate", help="target write rate, e.g. 20M (none: unthrottled)")
    r.add_argument("--schedule", help='rate over time, e.g. "20M:30s,1M:60s,0:30s,20M:30s"')
    r.add_argument(
        "--arms",
        help="comma list: idle,direct,direct-fsync[:100M],direct-bdi[:64M],ft-off,"
        "ft-static[:opts],ft-adaptive[:opts],c-ll[:opts],c-ll-wb[:opts] (c-ll: libfuse's C "
        "passthrough_ll example, compiled at run time; -wb: with -o writeback; idle:NAME: a "
        "second idle run, the noise floor of victim vs idle)",
    )
    r.add_argument(
        "--workload",
        help="comma list of NAME[:SIZE]: seq, small4k, small10k, tree, tarball, fio, fio-rand, "
        "dd4k, dd10k, dd128k, dd1m, files[:COUNT], read",
    )
    r.add_argument("--size", type=parse_size, help="size of every workload without its own")
    r.add_argument("--repeats", type=int)
    r.add_argument("--victim", choices=VICTIMS)
    r.add_argument("--victim-interval", type=parse_duration)
    r.add_argument(
        "--victim-working-set",
        type=float,
        help="db neighbour: its data file, as a fraction of the shared cgroup (default 0.5; "
        "above 1 the database is larger than its memory and reads from disk all the time)",
    )
    r.add_argument("--cgroup-mem", type=_size_or_none, help="shared memory cgroup limit or none")
    r.add_argument(
        "--daemon-in-cgroup",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run fusethrottle inside the shared cgroup (default: yes, like a sidecar)",
    )
    r.add_argument("--idle", type=parse_duration, help="length of the idle arm")
    r.add_argument(
        "--ft-options",
        help="-o options for every ft-* arm (default: the preset's, batch=64M,window=256M; "
        "none for passthrough, which measures the daemon's defaults)",
    )
    r.add_argument("--fusethrottle", help="path of the fusethrottle command")
    r.add_argument(
        "--metrics",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="scrape fusethrottle's metrics endpoint (default: yes, except in passthrough, where "
        "the scraping would add to the daemon CPU being compared)",
    )
    r.add_argument("--image-size", type=parse_size, help="loop image / tmpfs size (default 8G)")
    r.add_argument("--no-plots", action="store_true")
    r.add_argument("--verify", action=argparse.BooleanOptionalAction, default=None)
    r.add_argument("--out", type=Path, help="run directory (default bench/runs/DATE-PRESET)")
    r.add_argument("-v", "--verbose", action="store_true")
    rep = sub.add_parser("report", help="redo summary and plots of a run directory")
    rep.add_argument("dir", type=Path)
    rep.add_argument("--no-plots", action="store_true")
    sub.add_parser("cleanup", help="undo what killed runs left behind (loop, throttle, mounts)")
    sub.add_parser("presets", help="list the presets")
    return p


def make_plan(args: argparse.Namespace) -> Plan:
    scale = "smoke" if args.smoke else "quick" if args.quick else "full"
    if args.rate and args.schedule:
        raise PlanError("give --rate or --schedule, not both")
    return build_plan(
        args.preset,
        scale,
        targets=args.target,
        throttle=args.throttle,
        workdir=args.workdir,
        writer_head_start=args.writer_head_start,
        mount_timeout=args.mount_timeout,
        schedule=args.schedule or args.rate,
        workloads=args.workload,
        size=args.size,
        arms=args.arms,
        repeats=args.repeats,
        victim=args.victim,
        victim_interval=args.victim_interval,
        victim_working_set=args.victim_working_set,
        cgroup_mem=args.cgroup_mem,
        daemon_in_cgroup=args.daemon_in_cgroup,
        idle=args.idle,
        ft_options=args.ft_options,
        metrics=args.metrics,
        image_size=args.image_size,
        plots=not args.no_plots,
        verify=args.verify,
    )


def plan_record(plan: Plan) -> dict[str, object]:
    return {
        "targets": [t.label for t in plan.targets],
        "schedules": [format_schedule(t.schedule) for t in plan.targets if t.throttled],
        "throttles": [t.throttle for t in plan.targets if t.throttle],
        "workdir": plan.workdir or "/var/tmp",
        "writer_head_start": plan.writer_head_start,
        "workloads": [
            f"{w.kind}:{w.size}" + (f" for {w.duration:g}s" if w.duration else "")
            for w in plan.workloads
        ],
        "arms": [a.label for a in plan.arms],
        "repeats": plan.repeats,
        "victim": plan.victim,
        "victim_interval": plan.victim_interval,
        "victim_working_set": plan.victim_working_set,
        "cgroup_mem_mib": plan.cgroup_mem // (1 << 20),
        "daemon_in_cgroup": plan.daemon_in_cgroup,
        "idle_seconds": plan.idle_seconds,
        "ft_options": plan.ft_options,
        "metrics": plan.metrics,
        "sample_interval": plan.sample_interval,
    }


def preflight(plan: Plan) -> None:
    """Fail before touching anything: root, tools, kernel interfaces."""
    from bench.plan import THROTTLED_DEVICES
    from bench.system import BLKIO_WRITE_BPS, ZRAM_CONTROL, BenchError

    why = plan.needs_root()
    if why and os.geteuid() != 0:
        raise BenchError(f"needs root for {', '.join(why)}: run it as root (sudo)")
    tools = set()
    if any(t.kind in THROTTLED_DEVICES for t in plan.targets):
        tools |= {"mkfs.ext4", "mount", "umount"}
        if any(t.kind == "loop" for t in plan.targets):
            tools.add("losetup")
        if any(t.kind == "zram" for t in plan.targets) and not ZRAM_CONTROL.exists():
            raise BenchError("--target zram: no zram module (modprobe zram)")
        if not BLKIO_WRITE_BPS.exists():
            raise BenchError(f"no cgroup-v1 blkio throttle at {BLKIO_WRITE_BPS}")
    kinds = {w.kind for w in plan.workloads}
    if kinds & {"fio", "fio-rand"}:
        tools.add("fio")
    if kinds & {"tree", "tarball"}:
        tools.add("tar")
    if any(t.throttle for t in plan.targets):
        tools.add("tc")
    if any(a.is_fuse for a in plan.arms):
        tools.add("fusermount3")
    if kinds & {"files", "files8"}:
        tools |= {"ls", "find", "stat", "rm"}
    import shutil

    missing = sorted(t for t in tools if shutil.which(t) is None)
    if missing:
        raise BenchError(f"missing tools: {', '.join(missing)} (apt install them)")
    if plan.cgroup_mem:
        from bench.cgroup import memory_cgroup_skip_reason

        reason = memory_cgroup_skip_reason()
        if reason:
            raise BenchError(reason)


def code_version(exe: str | None) -> dict[str, object]:
    """Which fusethrottle was measured: the git commit (and whether the tree was dirty) and
    what the executable says."""
    import subprocess

    from bench.daemon import find_executable

    def out(cmd: list[str]) -> str:
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=10, cwd=REPO)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return res.stdout.strip() if res.returncode == 0 else ""

    path = find_executable(exe)
    return {
        "git_head": out(["git", "rev-parse", "--short", "HEAD"]),
        "git_dirty": bool(out(["git", "status", "--porcelain", "--untracked-files=no"])),
        "fusethrottle": path,
        "fusethrottle_version": out([path, "--version"]) if path else "",
    }


def setup_logging(out: Path | None, verbose: bool) -> None:
    root = logging.getLogger()
    root.setLevel(logging.DEBUG)
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(logging.DEBUG if verbose else logging.INFO)
    console.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    root.addHandler(console)
    if out is not None:
        fh = logging.FileHandler(out / "bench.log")
        fh.setLevel(logging.DEBUG)
        fh.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        root.addHandler(fh)
    for noisy in ("matplotlib", "PIL"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def cmd_run(args: argparse.Namespace, argv: list[str]) -> int:
    from bench import report
    from bench.results import ResultWriter, machine_info, now_iso
    from bench.runner import Runner
    from bench.system import (
        BenchError,
        Interrupted,
        Teardown,
        clean_stale_journals,
        signals_deferred,
        signals_raise,
    )

    plan = make_plan(args)
    preflight(plan)
    out = args.out or REPO / "bench" / "runs" / (
        time.strftime("%Y%m%d-%H%M%S")
        + f"-{plan.preset}"
        + ("" if plan.scale == "full" else f"-{plan.scale}")
    )
    if out.exists() and any(out.iterdir()):
        raise BenchError(f"--out {out} exists and is not empty")
    out.mkdir(parents=True, exist_ok=True)
    setup_logging(out, args.verbose)
    if os.geteuid() == 0:
        for done in clean_stale_journals():
            log.warning("cleaned up after a dead run: %s", done)

    writer = ResultWriter(out)
    command = "python -m bench " + " ".join(shlex.quote(a) for a in argv)
    writer.write_run(
        {
            "preset": plan.preset,
            "scale": plan.scale,
            "command": command,
            "cwd": os.getcwd(),
            "pid": os.getpid(),
            "started_at": now_iso(),
            "plan": plan_record(plan),
            "machine_start": machine_info(),
        }
    )
    (out / "COMMAND").write_text(f"# run as root from {os.getcwd()}\n{command}\n")
    writer.write_run({"code": code_version(args.fusethrottle)})
    log.info("run directory: %s", out)
    teardown = Teardown()
    aborted = False
    status = 0
    t_start = time.monotonic()
    try:
        with signals_raise():
            Runner(plan, writer, teardown, args.fusethrottle).run()
    except (KeyboardInterrupt, Interrupted) as err:
        aborted = True
        status = 130
        log.warning("interrupted (%s): tearing down", type(err).__name__ if not str(err) else err)
    except BenchError as err:
        aborted = True
        status = 2
        log.error("bench: %s", err)
    except Exception:
        aborted = True
        status = 1
        log.exception("bench: internal error")
    finally:
        with signals_deferred():
            teardown.undo_all(aborted=aborted)
    writer.write_run(
        {
            "finished_at": now_iso(),
            "seconds": round(time.monotonic() - t_start, 1),
            "completed": not aborted,
            "machine_end": machine_info(),
        }
    )
    summary, text = report.build(out, plots=plan.plots)
    print(text)
    print(f"results: {out}/summary.md")
    if status == 0 and any(g["failed"] for g in summary["groups"]):
        status = 1
    return status


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parser().parse_args(argv)
    except PlanError as err:  # raised by type= converters
        print(f"bench: {err}", file=sys.stderr)
        return 2
    from bench.system import BenchError

    try:
        if args.command == "presets":
            print(describe())
            return 0
        if args.command == "cleanup":
            from bench.system import clean_stale_journals

            if os.geteuid() != 0:
                raise BenchError("cleanup needs root")
            setup_logging(None, False)
            done = clean_stale_journals()
            print("\n".join(done) if done else "nothing to clean up")
            return 0
        if args.command == "report":
            from bench import report

            setup_logging(None, False)
            _, text = report.build(args.dir, plots=not args.no_plots)
            print(text)
            return 0
        return cmd_run(args, argv)
    except (PlanError, BenchError) as err:
        print(f"bench: {err}", file=sys.stderr)
        return 2
