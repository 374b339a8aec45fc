"""The pressure guard's bench: PostgreSQL under pgbench beside pg_basebackup of its own disk.

``python -m bench.pgguard --out DIR [--repeats 5] [--seconds 40] [--scale 60]``

A real database (PostgreSQL, its data on this host's disk, in a memory cgroup of its own as a
container would hold it) serves pgbench (the TPC-B-like mix: reads, updates, WAL fsyncs) while
pg_basebackup copies that same data directory onto a target that does NOT slow down (a
directory on the same host's disk, at full speed, so the window never binds), back to back for
as long as pgbench runs. Arms, interleaved in each repeat:

* ``idle``      pgbench alone: the baseline;
* ``direct``    pg_basebackup writes straight onto the target;
* ``ft``        through fusethrottle without the guard;
* ``ft-guard``  through fusethrottle with the guard on: ``guard=`` naming the database's own
                cgroup where the host has cgroup v2 (the NFS lab's VM: ``python -m bench.nfslab
                run pgguard``), ``guard=host`` on cgroup v1, which has no per-cgroup pressure (the
                whole host's PSI is what the guard protects, the backup's own stalls included).

With ``--schedule`` (e.g. ``none:8s,15M:14s,none:30s``) the target is instead a loop device
whose write rate follows that schedule from the start of each arm's pgbench (TARGETS.md A: ext4
on a direct-io loop image, throttled by blkio): a target that dips, where the window binds too,
to show the guard and the window together are no worse for the database than the window alone.

With ``--target DIR`` the backup goes into DIR (an NFS mount, say) instead of the work directory.

Per arm: pgbench's TPS and p99 latency (from its per-transaction log), each against the idle
arm of the same repeat, and the backup's MB/s. The summary is the worst repeat. Writes
``results.json`` and ``summary.md`` under DIR. Needs root and Debian's postgresql package.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.plan import PlanError, TargetSpec, parse_schedule
from bench.system import Teardown
from bench.target import LoopTarget, ScheduleRunner
from fusethrottle.service.mountinfo import mounts

PG_BIN = Path("/usr/lib/postgresql/15/bin")
ROOT = Path(__file__).resolve().parents[1]
FUSETHROTTLE = str(ROOT / ".venv" / "bin" / "fusethrottle")
CGROUP_ROOT = Path("/sys/fs/cgroup")
DB_CGROUP = "fusethrottle-bench-db"
ARMS = ("idle", "direct", "ft", "ft-guard")


@dataclass
class Result:
    arm: str
    repeat: int
    tps: float
    p99_ms: float
    mean_ms: float
    backups: int
    backup_mb_s: float


@dataclass(frozen=True)
class DatabaseCgroup:
    """Where the database runs: its own memory cgroup, as a container or a unit would hold it.
    On cgroup v2 it is also what ``guard=`` names (its own pressure files)."""

    path: Path
    unified: bool

    @property
    def limit_file(self) -> Path:
        return self.path / ("memory.max" if self.unified else "memory.limit_in_bytes")


def database_cgroup(root: Path = CGROUP_ROOT) -> DatabaseCgroup:
    """The database's cgroup under *root*: on the unified hierarchy (v2) a directory of its own
    at the top, on v1 one in the memory controller's hierarchy."""
    if (root / "cgroup.controllers").is_file():
        return DatabaseCgroup(root / DB_CGROUP, unified=True)
    return DatabaseCgroup(root / "memory" / DB_CGROUP, unified=False)


def guard_option(guard: str, cgroup: DatabaseCgroup) -> str:
    """The ``guard=`` the ft-guard arm mounts with: ``db`` is the database's cgroup (v2 only),
    ``host`` the whole host's pressure."""
    if guard == "host":
        return "guard=host"
    if not cgroup.unified:
        raise ValueError(
            "--guard db needs cgroup v2 (per-cgroup pressure); this host is on v1: use --guard host"
        )
    return f"guard={cgroup.path}"


def run(*args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), check=True, text=True, capture_output=True, **kw)  # type: ignore[call-overload,no-any-return]


def as_postgres(*args: str) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *args]


@contextlib.contextmanager
def database(work: Path, scale: int, memory: int, cgroup: DatabaseCgroup) -> Iterator[Path]:
    """A PostgreSQL cluster in *work*, in *cgroup* limited to *memory* bytes, with pgbench's
    tables at *scale*; its socket directory."""
    data, sock = work / "pgdata", work / "pgsock"
    for d in (data, sock):
        d.mkdir(parents=True, exist_ok=True)
        shutil.chown(d, "postgres", "postgres")
    if not (data / "PG_VERSION").exists():
        run(*as_postgres(str(PG_BIN / "initdb"), "-D", str(data), "--auth=trust", "-N"))
    if cgroup.unified:  # the memory and io controllers for the root's children
        (cgroup.path.parent / "cgroup.subtree_control").write_text("+memory +io")
    cgroup.path.mkdir(exist_ok=True)
    cgroup.limit_file.write_text(str(memory))
    options = (
        f"-c listen_addresses='' -c unix_socket_directories={sock} -c shared_buffers=128MB "
        "-c max_wal_size=2GB -c wal_level=replica -c max_wal_senders=4"
    )
    start = (
        f"echo $$ > {cgroup.path}/cgroup.procs && exec runuser -u postgres -- "
        f'{PG_BIN}/pg_ctl -D {data} -o "{options}" -l {sock}/pg.log -w start'
    )
    run("sh", "-c", start)
    try:
        env = {**os.environ, "PGHOST": str(sock)}
        done = work / f"pgbench-scale-{scale}"
        if not done.exists():
            run(
                *as_postgres(str(PG_BIN / "pgbench"), "-i", "-q", "-s", str(scale), "postgres"),
                env=env,
            )
            done.touch()
        yield sock
    finally:
        subprocess.run(
            as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"),
            check=False,
            capture_output=True,
        )
        with contextlib.suppress(OSError):
            cgroup.path.rmdir()


def drop_caches() -> None:
    """Each arm starts cold: the database's files come from the disk, not from the last arm."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3")


@contextlib.contextmanager
def mounted(source: Path, mountpoint: Path, options: list[str]) -> Iterator[Path]:
    mountpoint.mkdir(parents=True, exist_ok=True)
    run(FUSETHROTTLE, str(source), str(mountpoint), "-o", ",".join(["allow_other", *options]))
    try:
        yield mountpoint
    finally:
        subprocess.run(["fusermount3", "-u", str(mountpoint)], check=False, capture_output=True)
        for _ in range(600):  # the daemon flushes, then goes
            if not any(m.mountpoint == str(mountpoint) for m in mounts()):
                break
            time.sleep(0.1)


def backups(sock: Path, into: Path, stop: threading.Event, out: list[tuple[int, float]]) -> None:
    """pg_basebackup of the cluster into *into*, one after another until *stop*: (bytes, s) of
    each. The one under way at *stop* is let finish, so that every time recorded is a whole
    backup's, the guarded arm's too (a held-back backup outlasts pgbench's run)."""
    env = {**os.environ, "PGHOST": str(sock)}
    n = 0
    while not stop.is_set():
        target = into / f"base-{n}"
        start = time.monotonic()
        proc = subprocess.run(
            as_postgres(
                str(PG_BIN / "pg_basebackup"),
                "-D",
                str(target),
                "-Ft",
                "-X",
                "none",
                "--checkpoint=fast",
                "--no-sync",
            ),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            check=False,
        )
        if proc.returncode == 0:
            size = sum(f.stat().st_size for f in target.iterdir())
            out.append((size, time.monotonic() - start))
        shutil.rmtree(target, ignore_errors=True)
        n += 1


def pgbench(sock: Path, seconds: int, log_dir: Path) -> tuple[float, list[float]]:
    """TPS and every transaction's latency (ms) of one pgbench run."""
    env = {**os.environ, "PGHOST": str(sock)}
    for old in log_dir.glob("pgbench_log*"):
        old.unlink()
    out = run(
        *as_postgres(
            str(PG_BIN / "pgbench"),
            "-c",
            "4",
            "-j",
            "2",
            "-T",
            str(seconds),
            "-l",
            f"--log-prefix={log_dir}/pgbench_log",
            "postgres",
        ),
        env=env,
        cwd=str(log_dir),
    ).stdout
    tps = next(
        float(line.split("=")[1].split()[0]) for line in out.splitlines() if line.startswith("tps")
    )
    latencies = [
        int(line.split()[2]) / 1000
        for path in log_dir.glob("pgbench_log*")
        for line in path.read_text().splitlines()
        if line.strip()
    ]
    return tps, latencies


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def one_arm(
    arm: str,
    repeat: int,
    sock: Path,
    work: Path,
    seconds: int,
    base: Path,
    guard: str,
    rate: ScheduleRunner | None = None,
) -> Result:
    """One arm of one repeat: the backup goes into *base* (the target), whose write rate follows
    *rate* from the start of pgbench, if given; *guard* is the ft-guard arm's ``guard=``."""
    target = base / "target"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir()
    shutil.chown(target, "postgres", "postgres")
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    shutil.chown(logs, "postgres", "postgres")
    drop_caches()
    with contextlib.ExitStack() as stack:
        into = target
        if arm.startswith("ft"):
            options = ["mode=adaptive"] + ([guard] if arm == "ft-guard" else [])
            into = stack.enter_context(mounted(target, work / "mnt", options))
        stop = threading.Event()
        done: list[tuple[int, float]] = []
        thread = None
        if arm != "idle":
            thread = threading.Thread(target=backups, args=(sock, into, stop, done))
            thread.start()
        if rate is not None:
            rate.start(time.monotonic())
        try:
            tps, latencies = pgbench(sock, seconds, logs)
        finally:
            stop.set()
            if thread is not None:
                thread.join()
            if rate is not None:
                rate.stop()
    total = sum(b for b, _ in done)
    spent = sum(s for _, s in done)
    return Result(
        arm,
        repeat,
        tps,
        p99(latencies),
        statistics.fmean(latencies),
        len(done),
        total / spent / 1e6 if spent else 0.0,
    )


def summary(results: list[Result]) -> str:
    """The worst repeat of each arm against the idle arm of the same repeat."""
    idle = {r.repeat: r for r in results if r.arm == "idle"}
    lines = [
        "| arm | TPS / idle (worst) | p99 / idle (worst) | p99 ms (worst) | backup MB/s (worst) |",
        "|---|---|---|---|---|",
    ]
    for arm in ARMS:
        rows = [r for r in results if r.arm == arm]
        if not rows:
            continue
        tps = min(r.tps / idle[r.repeat].tps for r in rows)
        lat = max(r.p99_ms / idle[r.repeat].p99_ms for r in rows)
        mbs = min((r.backup_mb_s for r in rows), default=0.0)
        lines.append(
            f"| {arm} | {tps:.3f} | {lat:.2f} | {max(r.p99_ms for r in rows):.1f} | "
            + (f"{mbs:.1f} |" if arm != "idle" else "- |")
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pgguard", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--work", type=Path, default=Path("/var/tmp/fusethrottle-pgguard"))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seconds", type=int, default=40)
    p.add_argument("--scale", type=int, default=60)
    p.add_argument(
        "--db-memory", default=str(1 << 30), help="the database's memory cgroup limit (bytes)"
    )
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument(
        "--guard",
        choices=("db", "host"),
        help="what the ft-guard arm protects: db, the database's cgroup (cgroup v2, the "
        "default there), or host, the whole host's pressure (the default on cgroup v1)",
    )
    p.add_argument("--target", type=Path, help="where the backup goes (default: --work)")
    p.add_argument(
        "--guard-min",
        help="the guarded arm's guard_min= (the daemon's default, 4M, when left out): a floor "
        "near what the backup reaches unthrottled leaves the guard nothing to take",
    )
    p.add_argument(
        "--schedule",
        help="a target that dips: a loop device whose write rate follows this schedule in each "
        "arm (e.g. none:8s,15M:14s,none:30s; none: unthrottled)",
    )
    args = p.parse_args(argv)
    try:
        steps = parse_schedule(args.schedule) if args.schedule else None
    except PlanError as err:
        print(f"bench.pgguard: --schedule: {err}", file=sys.stderr)
        return 2
    if os.geteuid() != 0 or not (PG_BIN / "postgres").exists():
        print(
            "bench.pgguard: needs root and Debian's postgresql (apt-get install postgresql)",
            file=sys.stderr,
        )
        return 2
    cgroup = database_cgroup()
    try:
        guard = guard_option(args.guard or ("db" if cgroup.unified else "host"), cgroup)
    except ValueError as err:
        print(f"bench.pgguard: {err}", file=sys.stderr)
        return 2
    if args.guard_min:
        guard += f",guard_min={args.guard_min}"
    if args.target is not None and steps is not None:
        print(
            "bench.pgguard: --target and --schedule: give one (a schedule is a loop device)",
            file=sys.stderr,
        )
        return 2
    arms = [a for a in args.arms.split(",") if a]
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    results: list[Result] = []
    teardown = Teardown()
    base, rate, where = args.work, None, "a directory on this host's disk, full speed"
    if args.target is not None:
        args.target.mkdir(parents=True, exist_ok=True)
        base, where = args.target, f"{args.target}, full speed"
    with contextlib.ExitStack() as stack:
        stack.callback(teardown.undo_all)
        if steps is not None:
            loop = args.work / "loop-target"
            shutil.rmtree(loop, ignore_errors=True)
            loop.mkdir()
            target = LoopTarget(TargetSpec("loop", schedule=steps), loop)
            target.setup(teardown)
            base, rate = target.root, target.schedule
            where = f"{target.description}, the schedule restarted with each arm"
        sock = stack.enter_context(database(args.work, args.scale, int(args.db_memory), cgroup))
        for repeat in range(args.repeats):
            for arm in arms:
                r = one_arm(arm, repeat, sock, args.work, args.seconds, base, guard, rate)
                results.append(r)
                print(json.dumps(asdict(r)), flush=True)
                (args.out / "results.json").write_text(
                    json.dumps([asdict(x) for x in results], indent=1)
                )
    text = summary(results)
    load = os.getloadavg()
    (args.out / "summary.md").write_text(
        f"{text}\n\ntarget: {where}; ft-guard: {guard}; repeats {args.repeats}, "
        f"{args.seconds} s each, scale {args.scale}, load {load[0]:.1f}/{load[1]:.1f}\n"
    )
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
