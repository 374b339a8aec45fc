"""The backup jobs: what runs, with which arguments, and how its own report is read back.

Every job is one or more child processes started in the shared memory cgroup when there is one.
The sampler is told which process is "the writer" so it can follow its write() progress
(/proc/PID/io wchar) — the application's view, which the report sets against the device's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.plan import (
    DD_BLOCKS,
    PACED_RATE,
    PARALLEL_WRITERS,
    ArmSpec,
    MiB,
    WorkloadSpec,
    fsync_skip_reason,
)
from bench.system import BenchError, Child, Teardown, drop_caches, start

log = logging.getLogger(__name__)


@dataclass
class WorkloadResult:
    """What the backup did, in its own terms."""

    bytes: int = 0
    files: int = 0
    seconds: float = float("nan")  # from first exec to last exit: the backup's wall time
    cpu_s: float = 0.0  # user+system of every process of the job (wait4)
    write_p50: float | None = None
    write_p99: float | None = None
    write_max: float | None = None
    writes_over_1s: int | None = None
    fsyncs: int | None = None
    fsync_max: float | None = None
    verified: bool | None = None
    extra: dict[str, float] = field(default_factory=dict)


@dataclass
class JobContext:
    """What every job needs from the harness."""

    teardown: Teardown
    scratch: Path  # tmpfs directory for logs
    python: list[str]  # command prefix that runs a bench module
    env: dict[str, str]
    cgroup_procs: str | None
    set_writer_pid: Callable[[int | None], None]
    tree_source: Callable[[int], tuple[Path, int, int]]  # size -> (dir, files, bytes)
    verify: bool = False
    # utime+stime of the arm's FUSE daemon so far (None: no daemon), so a job with several
    # phases can charge each its own share: "CPU = writer + daemon" per phase.
    daemon_cpu: Callable[[], float | None] = lambda: None
    # When the backup's clock starts (time.monotonic(); None: at once): the stream writer is
    # launched early and waits for it, any other job is launched then.
    start_at: float | None = None


def skip_reason(workload: WorkloadSpec, arm: ArmSpec) -> str | None:
    """Why this workload cannot run in this arm (None: it can)."""
    if arm.kind == "direct-fsync":
        return fsync_skip_reason(workload)
    if workload.kind == "read" and os.geteuid() != 0:
        return "read drops the page cache before reading (/proc/sys/vm/drop_caches): needs root"
    return None


def prepare_workload(workload: WorkloadSpec, dest: Path, ctx: JobContext) -> dict[str, float]:
    """What a job needs in place before its timed part starts (before t0, outside every number
    of the arm): the file that ``read`` reads, written through the same mount, then every clean
    cache dropped so the read has to go through the daemon to the target."""
    if workload.kind != "read":
        return {}
    count = max(1, workload.size // MiB)
    cmd = ["dd", "if=/dev/zero", f"of={dest / 'read.bin'}", "bs=1M", f"count={count}"]
    t0 = time.monotonic()
    child = _run_one("read-prepare", [*cmd, "status=none"], ctx)
    _wait(child, ctx, "dd (writing the file to read)")
    written = time.monotonic() - t0
    drop_caches(3)
    return {"prepare_s": written}


def run_workload(
    workload: WorkloadSpec, arm: ArmSpec, dest: Path, ctx: JobContext
) -> WorkloadResult:
    """Run the job into *dest* (a directory on the target or on the fusethrottle mount)."""
    kind = workload.kind
    if kind in ("seq", "paced", "small4k", "small10k"):
        return _stream(workload, arm, dest, ctx)
    if ctx.start_at is not None:
        time.sleep(max(0.0, ctx.start_at - time.monotonic()))
    if kind in ("fio", "fio-rand"):
        return _fio(workload, arm, dest, ctx)
    if kind in ("tree", "tarball"):
        return _tar(workload, dest, ctx)
    if kind in DD_BLOCKS:
        return _dd(workload, dest, ctx)
    if kind == "files":
        return _files(workload, dest, ctx)
    if kind == "files8":
        return _files_at_once(workload, dest, ctx)
    if kind == "read":
        return _read(workload, dest, ctx)
    raise BenchError(f"no runner for workload {kind}")


def _wait(child: Child, ctx: JobContext, what: str) -> int:
    code = child.wait()
    ctx.teardown.forget(child.key)
    if code != 0:
        raise BenchError(f"{what} exited with status {code}")
    return code


def _run_one(name: str, cmd: list[str], ctx: JobContext, out: Path | None = None) -> Child:
    child = start(
        name,
        cmd,
        teardown=ctx.teardown,
        cgroup_procs=ctx.cgroup_procs,
        stdout=out,
        stderr=ctx.scratch / f"{name}.err",
        env=ctx.env,
    )
    ctx.set_writer_pid(child.pid)
    return child


def _tail(path: Path) -> str:
    try:
        lines = path.read_text().strip().splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""


def _stream(workload: WorkloadSpec, arm: ArmSpec, dest: Path, ctx: JobContext) -> WorkloadResult:
    out = ctx.scratch / "writer.out"
    cmd = [*ctx.python, "bench.writer", "stream", "--path", str(dest / "backup.bin")]
    cmd += ["--size", str(workload.size), "--block", str(workload.block)]
    cmd += ["--log", str(ctx.scratch / "writer.jsonl")]
    if arm.kind == "direct-fsync":
        cmd += ["--fsync-every", str(arm.fsync_every())]
    if workload.duration > 0:
        cmd += ["--duration", str(workload.duration)]
    if ctx.start_at is not None:
        cmd += ["--start-at", repr(ctx.start_at)]
    if workload.kind == "paced":
        cmd += ["--rate", str(PACED_RATE)]
    if ctx.verify:
        cmd.append("--verify")
    child = _run_one("writer", cmd, ctx, out)
    code = child.wait()
    ctx.teardown.forget(child.key)
    if code == -9:
        return _killed_writer(child, ctx)
    if code != 0:
        raise BenchError(f"writer exited {code}: {_tail(ctx.scratch / 'writer.err')}")
    rep = json.loads(out.read_text().strip().splitlines()[-1])
    return WorkloadResult(
        bytes=rep["bytes"],
        files=1,
        seconds=rep["seconds"],
        cpu_s=child.cpu_seconds or 0.0,
        write_p50=rep["write_p50"],
        write_p99=rep["write_p99"],
        write_max=rep["write_max"],
        writes_over_1s=rep["writes_over_1s"],
        fsyncs=rep["fsyncs"],
        fsync_max=rep["fsync_max"],
        verified=rep.get("verified"),
        extra={"close_s": rep["close_seconds"]},
    )


def _killed_writer(child: Child, ctx: JobContext) -> WorkloadResult:
    """A writer SIGKILLed (by the OOM killer of a full memory cgroup: the harness kills only
    after the arm) is a result, not a broken arm: what it wrote by then is in its interval
    log, and the neighbour's numbers around the kill are what the arm is about."""
    done, worst = 0, 0.0
    with contextlib.suppress(OSError):
        for line in (ctx.scratch / "writer.jsonl").read_text().splitlines():
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                done = max(done, int(rec.get("bytes") or 0))
                worst = max(worst, float(rec.get("max") or 0.0))
    end = child.ended if child.ended is not None else time.monotonic()
    log.warning("  the writer was killed (SIGKILL: the OOM killer?) after %d MiB", done >> 20)
    return WorkloadResult(
        bytes=done,
        files=1,
        seconds=end - max(child.started, ctx.start_at or 0.0),
        cpu_s=child.cpu_seconds or 0.0,
        write_max=worst or None,
        extra={"writer_killed": 1.0},
    )


def _fio(workload: WorkloadSpec, arm: ArmSpec, dest: Path, ctx: JobContext) -> WorkloadResult:
    out = ctx.scratch / "fio.json"
    cmd = ["fio", "--name=backup", f"--directory={dest}", f"--size={workload.size}"]
    cmd += ["--ioengine=psync", "--thread", "--output-format=json", f"--output={out}"]
    if workload.kind == "fio":
        cmd += ["--rw=write", "--bs=1M"]
        writes_per_fsync = max(1, arm.fsync_every() // MiB)
    else:
        cmd += ["--rw=randwrite", "--bsrange=4k-64k", "--randrepeat=1"]
        writes_per_fsync = max(1, arm.fsync_every() // (34 * 1024))  # mean block ~34 KiB
    if arm.kind == "direct-fsync":
        cmd.append(f"--fsync={writes_per_fsync}")
    if workload.duration > 0:
        cmd.append(f"--runtime={workload.duration:g}")
    t0 = time.monotonic()
    child = _run_one("fio", cmd, ctx)
    code = child.wait()
    ctx.teardown.forget(child.key)
    seconds = time.monotonic() - t0
    if code != 0:
        raise BenchError(f"fio exited {code}: {_tail(ctx.scratch / 'fio.err')}")
    job = json.loads(out.read_text())["jobs"][0]["write"]
    clat = job.get("clat_ns", {})
    pct = clat.get("percentile", {})
    ns = 1e-9
    runtime = job.get("runtime", 0) / 1000  # ms of I/O, without fio's own start-up
    return WorkloadResult(
        bytes=int(job["io_bytes"]),
        files=1,
        seconds=runtime if runtime > 0 else seconds,
        cpu_s=child.cpu_seconds or 0.0,
        write_p50=pct.get("50.000000", 0) * ns if pct else None,
        write_p99=pct.get("99.000000", 0) * ns if pct else None,
        write_max=clat.get("max", 0) * ns if clat else None,
    )


def _tar(workload: WorkloadSpec, dest: Path, ctx: JobContext) -> WorkloadResult:
    src, files, total = ctx.tree_source(workload.size)
    t0 = time.monotonic()
    if workload.kind == "tarball":
        archive = dest / "backup.tar"
        child = _run_one("tar", ["tar", "-C", str(src), "-cf", str(archive), "."], ctx)
        _wait(child, ctx, "tar -c")
        seconds = time.monotonic() - t0
        return WorkloadResult(
            bytes=archive.stat().st_size, files=files, seconds=seconds, cpu_s=child.cpu_seconds or 0
        )
    target = dest / "tree"
    target.mkdir()
    reader = start(
        "tar-c",
        ["tar", "-C", str(src), "-cf", "-", "."],
        teardown=ctx.teardown,
        cgroup_procs=ctx.cgroup_procs,
        stdout=subprocess.PIPE,
        stderr=ctx.scratch / "tar-c.err",
    )
    writer = start(
        "tar-x",
        ["tar", "-C", str(target), "-xf", "-"],
        teardown=ctx.teardown,
        cgroup_procs=ctx.cgroup_procs,
        stdin=reader.popen.stdout,
        stderr=ctx.scratch / "tar-x.err",
    )
    if reader.popen.stdout is not None:
        reader.popen.stdout.close()
    ctx.set_writer_pid(writer.pid)
    _wait(writer, ctx, f"tar -x ({_tail(ctx.scratch / 'tar-x.err')})")
    _wait(reader, ctx, "tar -c")
    seconds = time.monotonic() - t0
    cpu = (reader.cpu_seconds or 0.0) + (writer.cpu_seconds or 0.0)
    return WorkloadResult(bytes=total, files=files, seconds=seconds, cpu_s=cpu)


def _dd(workload: WorkloadSpec, dest: Path, ctx: JobContext) -> WorkloadResult:
    """dd if=/dev/zero: timed until dd exits (its close() included, which with a FUSE
    writeback cache waits for the kernel to hand the file's dirty pages to the daemon)."""
    bs = DD_BLOCKS[workload.kind]
    count = max(1, workload.size // bs)
    cmd = ["dd", "if=/dev/zero", f"of={dest / 'dd.bin'}", f"bs={bs}", f"count={count}"]
    return _timed_dd(cmd, bs * count, ctx, "dd")


def _read(workload: WorkloadSpec, dest: Path, ctx: JobContext) -> WorkloadResult:
    """Sequential read of the file prepare_workload wrote, cold (the page cache was dropped)."""
    count = max(1, workload.size // MiB)
    cmd = ["dd", f"if={dest / 'read.bin'}", "of=/dev/null", "bs=1M", f"count={count}"]
    return _timed_dd(cmd, count * MiB, ctx, "dd (reading)")


def _timed_dd(cmd: list[str], nbytes: int, ctx: JobContext, what: str) -> WorkloadResult:
    """Run one dd and time it until it exits; its CPU from wait4."""
    t0 = time.monotonic()
    child = _run_one("dd", [*cmd, "status=none"], ctx)
    _wait(child, ctx, what)
    return WorkloadResult(
        bytes=nbytes, files=1, seconds=time.monotonic() - t0, cpu_s=child.cpu_seconds or 0.0
    )


# The files job's phases, in order; each leaves wl_<phase>_s and wl_<phase>_cpu_s in its cell.
FILES_PHASES = ("create", "ls_cold", "ls_warm", "stat_cold", "stat_warm", "rm")


def _phase(
    name: str, cmd: list[str], ctx: JobContext, cold: bool
) -> tuple[float, float, float] | None:
    """One timed phase as its own process: (seconds, its CPU, the daemon's CPU meanwhile).

    Cold phases first drop dentries and inodes (``echo 2 > drop_caches``): every name must be
    looked up again, through the daemon on a FUSE mount. That needs root; without it the cold
    phases are left out (None) rather than measured warm under a cold label.
    """
    if cold:
        if os.geteuid() != 0:
            return None
        drop_caches(2)
    d0 = ctx.daemon_cpu()
    t0 = time.monotonic()
    child = _run_one(name, cmd, ctx)
    _wait(child, ctx, f"{name} ({_tail(ctx.scratch / f'{name}.err')})")
    seconds = time.monotonic() - t0
    d1 = ctx.daemon_cpu()
    daemon = d1 - d0 if d0 is not None and d1 is not None else 0.0
    return seconds, child.cpu_seconds or 0.0, daemon


def _files(workload: WorkloadSpec, dest: Path, ctx: JobContext) -> WorkloadResult:
    """mkdir x100 + create/write 4 KiB/close N files; then ls -lR cold and warm, stat of every
    file cold and warm, rm -rf: each phase a process of its own, timed and charged on its own
    (``wl_<phase>_s``, ``wl_<phase>_cpu_s`` = that process + the daemon meanwhile)."""
    count = workload.size
    tree = dest / "files"
    out = ctx.scratch / "files.out"
    cmd = [*ctx.python, "bench.writer", "files", "--dir", str(tree)]
    cmd += ["--count", str(count), "--dirs", "100", "--file-size", "4096"]
    d0 = ctx.daemon_cpu()
    child = _run_one("files", cmd, ctx, out)
    _wait(child, ctx, f"small-file writer ({_tail(ctx.scratch / 'files.err')})")
    d1 = ctx.daemon_cpu()
    rep = json.loads(out.read_text().strip().splitlines()[-1])
    create_daemon = d1 - d0 if d0 is not None and d1 is not None else 0.0
    extra: dict[str, float] = {
        "create_s": rep["seconds"],
        "create_cpu_s": (child.cpu_seconds or 0.0) + create_daemon,
        "create_daemon_cpu_s": create_daemon,
    }
    writer_cpu = child.cpu_seconds or 0.0
    ls = ["ls", "-lR", str(tree)]
    stat = ["find", str(tree), "-type", "f", "-exec", "stat", "-c", "%s", "{}", "+"]
    for name, phase_cmd, cold in (
        ("ls_cold", ls, True),
        ("ls_warm", ls, False),
        ("stat_cold", stat, True),
        ("stat_warm", stat, False),
        ("rm", ["rm", "-rf", str(tree)], False),
    ):
        got = _phase(name, phase_cmd, ctx, cold)
        if got is None:
            log.warning("  %s left out: dropping dentries needs root", name)
            continue
        seconds, cpu, daemon = got
        extra |= {f"{name}_s": seconds, f"{name}_cpu_s": cpu + daemon}
        extra[f"{name}_daemon_cpu_s"] = daemon
        writer_cpu += cpu
    return WorkloadResult(
        bytes=rep["bytes"],
        files=count,
        seconds=rep["seconds"],  # the create: what a restore of many small files waits for
        cpu_s=writer_cpu,
        extra=extra,
    )


def _files_at_once(workload: WorkloadSpec, dest: Path, ctx: JobContext) -> WorkloadResult:
    """``files``' create by PARALLEL_WRITERS writers at once, each its share of the files in
    directories of its own (parallel restores, a tree copied by several workers): does the
    mount serve them side by side, or one at a time? Timed from the first start to the last
    close (``wl_create_s``); CPU = the writers + the daemon meanwhile; then rm -rf."""
    count = workload.size
    tree = dest / "files8"
    writers = PARALLEL_WRITERS
    d0 = ctx.daemon_cpu()
    t0 = time.monotonic()
    children = []
    for k in range(writers):
        share = count // writers + (1 if k < count % writers else 0)
        cmd = [*ctx.python, "bench.writer", "files", "--dir", str(tree / f"w{k}")]
        cmd += ["--count", str(share), "--dirs", str(max(1, 100 // writers)), "--file-size", "4096"]
        children.append(_run_one(f"files8-{k}", cmd, ctx, ctx.scratch / f"files8-{k}.out"))
    for k, child in enumerate(children):
        _wait(child, ctx, f"small-file writer {k} ({_tail(ctx.scratch / f'files8-{k}.err')})")
    seconds = time.monotonic() - t0
    d1 = ctx.daemon_cpu()
    daemon = d1 - d0 if d0 is not None and d1 is not None else 0.0
    writer_cpu = sum(child.cpu_seconds or 0.0 for child in children)
    extra: dict[str, float] = {
        "create_s": seconds,
        "create_cpu_s": writer_cpu + daemon,
        "create_daemon_cpu_s": daemon,
    }
    got = _phase("rm", ["rm", "-rf", str(tree)], ctx, False)
    if got is not None:
        extra |= {"rm_s": got[0], "rm_cpu_s": got[1] + got[2], "rm_daemon_cpu_s": got[2]}
        writer_cpu += got[1]
    return WorkloadResult(
        bytes=count * 4096, files=count, seconds=seconds, cpu_s=writer_cpu, extra=extra
    )


# --- the tree that tar backs up ----------------------------------------------------------------


def make_tree(root: Path, size: int, seed: int = 7) -> tuple[int, int]:
    """Generate a source tree of about *size* bytes on tmpfs: mostly small files, a few large.

    The mix (70% 1-16 KiB, 25% 16-256 KiB, 5% 256 KiB-2 MiB) is a home directory or a source
    tree, where per-file metadata costs as much as the data. Returns (files, bytes).
    """
    rng = random.Random(seed)
    pool = rng.randbytes(4 * MiB)
    files = 0
    total = 0
    while total < size:
        r = rng.random()
        if r < 0.70:
            n = rng.randint(1024, 16 * 1024)
        elif r < 0.95:
            n = rng.randint(16 * 1024, 256 * 1024)
        else:
            n = rng.randint(256 * 1024, 2 * MiB)
        n = min(n, size - total) or 1
        d = root / f"d{files // 10000:02d}" / f"e{files // 100 % 100:02d}"
        if files % 100 == 0:
            d.mkdir(parents=True, exist_ok=True)
        off = rng.randrange(len(pool) - n) if n < len(pool) else 0
        (d / f"f{files:06d}.dat").write_bytes(pool[off : off + n])
        files += 1
        total += n
    return files, total
