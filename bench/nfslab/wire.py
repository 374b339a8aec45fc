"""Issue items 8 and 9 in the NFS lab: what each workload makes the NFS client send, through
fusethrottle and on NFS directly, and what the daemon's own meter counted meanwhile.

Runs inside the lab VM (``python -m bench.nfslab run wire``; guest.py sets FTLAB_NFS and
FTLAB_OUT). Every workload runs in every arm, each run on a fresh directory of the export
(``$FTLAB_NFS/rw``):

1. the tree the workload starts from (if any) is written there directly, synced, and the
   client's caches are dropped (``drop_caches``): every arm starts cold;
2. a fusethrottle arm mounts a fresh daemon over that directory (default options, plus the
   arm's); the direct arm uses the directory itself;
3. the counters of the NFS mount (/proc/self/mountstats) and the daemon's status are read, the
   workload runs and is timed, things settle, the counters are read again ("work");
4. the daemon is unmounted (its exit status must be 0: everything on the target), and the
   counters are read once more ("unmount": deferred closes, final syncs, deferred removes).

RPC counts are exact (the client's own per-operation counters); times compare only with the
other arm of the same run (the VM's CPU is many times slower than a real one). Results:
``wire.json`` (everything) and ``wire.md`` (the tables) in $FTLAB_OUT.

Knobs (environment): FTLAB_WIRE_FILES (300), FTLAB_WIRE_DIRS (3), FTLAB_WIRE_SIZE (4096 bytes
per file), FTLAB_WIRE_STREAM_MIB (64), FTLAB_WIRE_REPEATS (1), FTLAB_WIRE_WORKLOADS and
FTLAB_WIRE_ARMS (comma lists, default all: direct, ft, c-ll-wb, ft-nowb, ft-attr30, ft-target),
FTLAB_WIRE_TRACE=1 (record the kernel's trace of system calls, FUSE requests and RPCs of each
fusethrottle run, for finding where an RPC comes from; slow, use with few files).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.nfslab import mountstats

NFS = Path(os.environ.get("FTLAB_NFS", "/mnt/nfs"))
EXPORT = NFS / "rw"
OUT = Path(os.environ.get("FTLAB_OUT", "/tmp/ftlab-wire"))
MOUNTS = Path("/tmp/ftwire")
FUSETHROTTLE = str(Path(sys.executable).with_name("fusethrottle"))
MIB = 1 << 20
START_TIMEOUT = 120.0
STOP_TIMEOUT = 600.0
#: After a workload, before the counters are read: background syncs and closes of released
#: files (the daemon gathers them for 20 ms), asynchronous RPCs of the client.
SETTLE = 1.0


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


@dataclass(frozen=True)
class Spec:
    files: int = 300
    dirs: int = 3
    size: int = 4096
    stream_mib: int = 64

    def names(self) -> list[str]:
        """The tree's files, relative to its root: ``d<k>/f<i>``, spread over the dirs."""
        return [f"d{i % self.dirs}/f{i}" for i in range(self.files)]


# --- the workloads ------------------------------------------------------------------------


def populate(root: Path, spec: Spec) -> None:
    """The tree some workloads start from, written directly on the target."""
    data = b"x" * spec.size
    for d in range(spec.dirs):
        (root / f"d{d}").mkdir()
    for name in spec.names():
        fd = os.open(root / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)


def write_file(path: Path, data: bytes) -> None:
    """create + write + close, as cp or tar do it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def w_create(root: Path, spec: Spec) -> None:
    data = b"x" * spec.size
    for d in range(spec.dirs):
        (root / f"d{d}").mkdir()
    for name in spec.names():
        write_file(root / name, data)


def w_ls(root: Path, spec: Spec) -> None:
    subprocess.run(["ls", "-lR", str(root)], stdout=subprocess.DEVNULL, check=True)


def w_stat(root: Path, spec: Spec) -> None:
    for name in spec.names():
        os.lstat(root / name)


def w_rm(root: Path, spec: Spec) -> None:
    dirs = [str(root / f"d{d}") for d in range(spec.dirs)]
    subprocess.run(["rm", "-rf", *dirs], check=True)


def w_rename_over(root: Path, spec: Spec) -> None:
    """rsync's pattern: a new version in a temporary name, closed, renamed over the old."""
    data = b"y" * spec.size
    for name in spec.names():
        path = root / name
        tmp = path.with_name(f".{path.name}.tmp")
        write_file(tmp, data)
        os.rename(tmp, path)


def w_rsync(root: Path, spec: Spec) -> None:
    """What rsync itself does per changed file: lstat the destination, write a new temporary
    (mkstemp: O_EXCL, 0600), close, set its mtime, rename it over the destination."""
    data = b"y" * spec.size
    mtime_ns = 1_700_000_000 * 1_000_000_000
    for name in spec.names():
        path = root / name
        os.lstat(path)
        tmp = path.with_name(f".{path.name}.Xy12ab")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.utime(tmp, ns=(mtime_ns, mtime_ns))
        os.rename(tmp, path)


def w_stream(root: Path, spec: Spec) -> None:
    block = b"z" * MIB
    fd = os.open(root / "stream", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(spec.stream_mib):
            os.write(fd, block)
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Workload:
    name: str
    run: Callable[[Path, Spec], None]
    #: Starts from the populated tree (else from an empty directory).
    tree: bool
    #: What the counts are divided by: "file" (spec.files) or "MiB" (spec.stream_mib).
    unit: str = "file"
    doc: str = ""


WORKLOADS = (
    Workload("create", w_create, False, doc="mkdir 3 dirs, then create + write + close each file"),
    Workload("ls", w_ls, True, doc="`ls -lR` of the tree, cold"),
    Workload("stat", w_stat, True, doc="lstat of every file by name, cold"),
    Workload("rm", w_rm, True, doc="`rm -rf` of the tree, cold"),
    Workload(
        "rename",
        w_rename_over,
        True,
        doc="per file: write .NAME.tmp, close, rename it over NAME (rsync), cold",
    ),
    Workload(
        "rsync",
        w_rsync,
        True,
        doc="per file as rsync: lstat NAME, write .NAME.XXXXXX (O_EXCL), close, utime, rename",
    ),
    Workload(
        "stream", w_stream, False, "MiB", doc="1 MiB writes to one file, fsync at the end, close"
    ),
)


# --- the arms -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Arm:
    name: str
    #: fusethrottle's -o options (None: the direct arm, no mount).
    options: tuple[str, ...] | None
    #: libfuse's C passthrough_ll (the bench's reference arm) instead of fusethrottle.
    c_passthrough: bool = False


ARMS = (
    Arm("direct", None),
    Arm("ft", ()),
    # The speed claims' reference: what a C FUSE passthrough costs on the same NFS client (the
    # bench's c-ll-wb:xattr arm: the writeback cache, xattrs passed through).
    Arm("c-ll-wb", ("writeback", "xattr"), c_passthrough=True),
    Arm("ft-nowb", ("writeback_cache=no",)),
    # The kernel and the daemon revalidate what they cache every attr_timeout (1 s): a GETATTR
    # per directory in use per second, which the VM's slow creates spread over few files. NFS
    # itself revalidates directories every acdirmin (30 s): this arm shows what is left then.
    Arm("ft-attr30", ("attr_timeout=30s",)),
    # The target decides permissions (no default_permissions): the kernel then has no reason to
    # re-read a directory's attributes after each change in it before the next permission check.
    Arm("ft-target", ("permissions=target",)),
)


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def _mounted(path: Path) -> bool:
    from fusethrottle.service import mountinfo

    return any(m.mountpoint == str(path) for m in mountinfo.mounts())


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its threads so far."""
    return _stat_cpu(Path(f"/proc/{pid}/stat"))


def _request_cpu_seconds(pid: int, whole: bool) -> float:
    """CPU of the threads that serve requests: the engine's (named ``ft-*``: the control
    plane's Python, a TCG guest's costliest part, is left out), or all of them (*whole*: the C
    passthrough has no other kind)."""
    if whole:
        return _cpu_seconds(pid)
    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if (task / "comm").read_text().startswith("ft-"):
                total += _stat_cpu(task / "stat")
        except OSError:
            continue  # the thread ended
    return total


def _stat_cpu(stat: Path) -> float:
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Daemon:
    mountpoint: Path
    proc: subprocess.Popen[bytes]
    log: Path

    #: libfuse's passthrough_ll: no status to read.
    c_passthrough: bool = False

    @classmethod
    def start(
        cls, source: Path, mountpoint: Path, options: tuple[str, ...], c_passthrough: bool = False
    ) -> Daemon:
        mountpoint.mkdir(parents=True, exist_ok=True)
        log = OUT / f"{mountpoint.name}.daemon.log"
        if c_passthrough:
            from bench.daemon import build_passthrough_ll

            binary = build_passthrough_ll().binary
            opts = ",".join((f"source={source}", *options))
            argv = [str(binary), "-f", "-o", opts, str(mountpoint)]
        else:
            argv = [FUSETHROTTLE, str(source), str(mountpoint), "-f"]
            if options:
                argv += ["-o", ",".join(options)]
        with open(log, "ab") as f:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=f)
        deadline = time.monotonic() + START_TIMEOUT
        while not _mounted(mountpoint):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"fusethrottle did not mount: {log.read_text()[-2000:]}")
            time.sleep(0.05)
        os.stat(mountpoint)  # answers
        return cls(mountpoint, proc, log, c_passthrough)

    def status(self) -> dict[str, Any]:
        if self.c_passthrough:
            return {}
        from fusethrottle.observability.status_client import find_mount_of, query

        return query(find_mount_of(str(self.mountpoint)), timeout=30.0)

    def stop(self) -> int:
        done = subprocess.run(["fusermount3", "-u", str(self.mountpoint)], check=False)
        try:
            code = self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        if done.returncode != 0 and _mounted(self.mountpoint):
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], check=False)
        return code


# --- the kernel's trace (FTLAB_WIRE_TRACE=1) ----------------------------------------------

TRACEFS = Path("/sys/kernel/tracing")
TRACE_EVENTS = ("sunrpc/rpc_request", "fuse/fuse_request_send", "syscalls")


def trace_start() -> None:
    if not (TRACEFS / "trace").exists():
        subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)], check=True)
    (TRACEFS / "tracing_on").write_text("0\n")
    (TRACEFS / "buffer_size_kb").write_text("65536\n")
    (TRACEFS / "trace").write_text("")
    (TRACEFS / "options/record-tgid").write_text("1\n")
    for event in TRACE_EVENTS:
        enable = TRACEFS / "events" / event / "enable"
        if enable.exists():
            enable.write_text("1\n")
    (TRACEFS / "tracing_on").write_text("1\n")


def trace_stop(path: Path, pids: set[int]) -> None:
    """Keep the events of *pids* (the daemon, the workload) and of the kernel's RPC workers."""
    (TRACEFS / "tracing_on").write_text("0\n")
    keep = []
    for line in (TRACEFS / "trace").read_text(errors="replace").splitlines():
        if line.startswith("#"):
            continue
        tgid = line[line.find("(") + 1 : line.find(")")].strip() if "(" in line else ""
        if "rpc_request" in line or (tgid.isdigit() and int(tgid) in pids):
            keep.append(line)
    path.write_text("\n".join(keep) + "\n")
    for event in TRACE_EVENTS:
        enable = TRACEFS / "events" / event / "enable"
        if enable.exists():
            enable.write_text("0\n")
    (TRACEFS / "trace").write_text("")


# --- one run ------------------------------------------------------------------------------


@dataclass
class Run:
    workload: str
    arm: str
    units: int
    seconds: float
    work: dict[str, int]
    unmount: dict[str, int] = field(default_factory=dict)
    unmount_seconds: float = 0.0
    exit: int | None = None
    daemon_cpu: float = 0.0
    #: Of that, the request threads' (see _request_cpu_seconds).
    request_cpu: float = 0.0
    #: The daemon's own view of the work phase: FUSE requests, target operations, meter.
    requests: dict[str, int] = field(default_factory=dict)
    target_ops: dict[str, int] = field(default_factory=dict)
    meter: dict[str, dict[str, int]] = field(default_factory=dict)
    write_bytes: int = 0
    error: str = ""

    def total(self) -> Counter[str]:
        return Counter(self.work) + Counter(self.unmount)


def _delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def _meter_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, int]]:
    out = {}
    for cls, now in after.items():
        was = before.get(cls, {})
        out[cls] = {k: now[k] - was.get(k, 0) for k in now}
    return out


def run_one(workload: Workload, arm: Arm, spec: Spec, tag: str, trace: bool) -> Run:
    base = EXPORT / f"wire-{workload.name}-{arm.name}-{tag}"
    base.mkdir()
    base.chmod(0o777)
    if workload.tree:
        populate(base, spec)
    drop_caches()
    daemon = None
    if arm.options is not None:
        daemon = Daemon.start(
            base, MOUNTS / f"{workload.name}-{arm.name}-{tag}", arm.options, arm.c_passthrough
        )
        root = daemon.mountpoint
    else:
        root = base
    status0 = daemon.status() if daemon else {}
    cpu0 = _cpu_seconds(daemon.proc.pid) if daemon else 0.0
    request_cpu0 = _request_cpu_seconds(daemon.proc.pid, daemon.c_passthrough) if daemon else 0.0
    if trace:
        trace_start()
    wire0 = mountstats.read(str(EXPORT))
    start = time.perf_counter()
    error = ""
    try:
        workload.run(root, spec)
    except (OSError, subprocess.CalledProcessError) as err:
        error = str(err)  # recorded, and the run goes on (the mount must still come down)
        print(f"  {workload.name}/{arm.name} failed: {err}", flush=True)
    seconds = time.perf_counter() - start
    time.sleep(SETTLE)
    wire1 = mountstats.read(str(EXPORT))
    units = spec.stream_mib if workload.unit == "MiB" else spec.files
    run = Run(workload.name, arm.name, units, seconds, dict(mountstats.rpcs(wire0, wire1)))
    run.error = error
    run.write_bytes = wire1["write_bytes"] - wire0["write_bytes"]
    if daemon is not None:
        # Before the status request, whose answer (Python) is not the workload's.
        run.daemon_cpu = _cpu_seconds(daemon.proc.pid) - cpu0
        run.request_cpu = _request_cpu_seconds(daemon.proc.pid, daemon.c_passthrough) - request_cpu0
        status1 = daemon.status()
        run.requests = _delta(status0.get("operations", {}), status1.get("operations", {}))
        run.target_ops = _delta(
            status0.get("target_operations", {}), status1.get("target_operations", {})
        )
        run.meter = _meter_delta(status0.get("meter", {}), status1.get("meter", {}))
        start = time.perf_counter()
        run.exit = daemon.stop()
        run.unmount_seconds = time.perf_counter() - start
        time.sleep(SETTLE)
        wire2 = mountstats.read(str(EXPORT))
        run.unmount = dict(mountstats.rpcs(wire1, wire2))
        daemon.mountpoint.rmdir()
    if trace:
        pids = {os.getpid()} | ({daemon.proc.pid} if daemon else set())
        trace_stop(OUT / f"trace-{workload.name}-{arm.name}-{tag}.txt", pids)
    left = sorted(str(p.relative_to(base)) for p in base.rglob(".nfs*"))
    if left:
        print(f"  {workload.name}/{arm.name}: left silly-renamed: {left[:5]}", flush=True)
    shutil.rmtree(base)
    return run


# --- the report ---------------------------------------------------------------------------

#: Not counted as RPCs of the workload: the session's heartbeat rides on every v4.1 call.
NOT_COUNTED = ("SEQUENCE", "RENEW", "NULL")

#: How the wire's RPCs map to the meter's classes (EFS meters NFS operations: reading data,
#: writing data, reading metadata, changing metadata). An OPEN here always creates (create,
#: rename); OPEN_NOATTR reopens an existing file. Open/close state, COMMIT and the session's
#: own calls have no class: the meter never sees them (EFS documents no charge for them).
WIRE_CLASS = {
    "READ": "data_read",
    "WRITE": "data_write",
    **dict.fromkeys(
        (
            "GETATTR",
            "LOOKUP",
            "LOOKUPP",
            "ACCESS",
            "READDIR",
            "READDIRPLUS",
            "READLINK",
            "FSSTAT",
            "FSINFO",
            "PATHCONF",
            "STATFS",
            "OPEN_NOATTR",
            "GETXATTR",
            "LISTXATTRS",
        ),
        "meta_read",
    ),
    **dict.fromkeys(
        (
            "OPEN",
            "CREATE",
            "MKDIR",
            "SYMLINK",
            "MKNOD",
            "REMOVE",
            "RMDIR",
            "RENAME",
            "LINK",
            "SETATTR",
            "SETXATTR",
            "REMOVEXATTR",
        ),
        "meta_write",
    ),
}
CLASSES = ("data_read", "data_write", "meta_read", "meta_write")


def counted(rpcs: Counter[str] | dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in rpcs.items() if k not in NOT_COUNTED and v}


def wire_classes(rpcs: dict[str, int]) -> dict[str, int]:
    """The wire's RPCs by meter class; what has none under "none"."""
    out: Counter[str] = Counter()
    for op, n in counted(rpcs).items():
        out[WIRE_CLASS.get(op, "none")] += n
    return dict(out)


def _median_run(runs: list[Run]) -> Run:
    ordered = sorted(runs, key=lambda r: r.seconds)
    return ordered[(len(ordered) - 1) // 2]


def _fmt(x: float) -> str:
    if x == 0:
        return "."
    return f"{x:.2f}".rstrip("0").rstrip(".") if x < 10 else f"{x:.0f}"


def report(runs: list[Run], spec: Spec, profile: str, arms: list[str]) -> str:
    by: dict[tuple[str, str], list[Run]] = {}
    for r in runs:
        by.setdefault((r.workload, r.arm), []).append(r)
    lines = [
        f"# NFS RPCs per unit, through fusethrottle and directly ({profile})",
        "",
        f"{spec.files} files of {spec.size} bytes in {spec.dirs} directories; stream: "
        f"{spec.stream_mib} MiB. Counts: RPCs of the workload plus the unmount that follows "
        f"(SEQUENCE not counted), per file (stream: per MiB). Time: the workload's own, "
        f"median of {max(len(v) for v in by.values())}; speed = direct time / arm time.",
        "",
    ]
    lines += _summary(by, arms)
    for workload in WORKLOADS:
        present = [a for a in arms if (workload.name, a) in by]
        if not present:
            continue
        chosen = {a: _median_run(by[(workload.name, a)]) for a in present}
        errors = [f"{a}: {chosen[a].error}" for a in present if chosen[a].error]
        ops = sorted({op for r in chosen.values() for op in counted(r.total())})
        lines.append(f"## {workload.name}: {workload.doc} (per {workload.unit})")
        lines.append("")
        lines.append("| RPC | " + " | ".join(present) + " |")
        lines.append("| --- |" + " ---: |" * len(present))
        for op in ops:
            cells = [_fmt(chosen[a].total()[op] / chosen[a].units) for a in present]
            lines.append(f"| {op} | " + " | ".join(cells) + " |")
        totals = {a: sum(counted(chosen[a].total()).values()) / chosen[a].units for a in present}
        lines.append("| **total** | " + " | ".join(_fmt(totals[a]) for a in present) + " |")
        direct = chosen.get("direct")
        if direct is not None and totals["direct"]:
            lines.append(
                "| RPCs vs direct | "
                + " | ".join(f"{totals[a] / totals['direct']:.2f}x" for a in present)
                + " |"
            )
        times = {a: statistics.median(r.seconds for r in by[(workload.name, a)]) for a in present}
        lines.append("| seconds | " + " | ".join(f"{times[a]:.2f}" for a in present) + " |")
        if direct is not None:
            lines.append(
                "| speed vs direct | "
                + " | ".join(f"{times['direct'] / times[a]:.2f}x" for a in present)
                + " |"
            )
        if "c-ll-wb" in times:
            lines.append(
                "| time vs C passthrough | "
                + " | ".join(f"{times[a] / times['c-ll-wb']:.2f}x" for a in present)
                + " |"
            )
        lines.append(
            "| daemon CPU s | " + " | ".join(_fmt(chosen[a].daemon_cpu) for a in present) + " |"
        )
        lines.append(
            "| of which request threads | "
            + " | ".join(_fmt(chosen[a].request_cpu) for a in present)
            + " |"
        )
        lines.append(
            "| of which at unmount | "
            + " | ".join(_fmt(sum(counted(chosen[a].unmount).values()) / chosen[a].units)
                         for a in present)
            + " |"
        )  # fmt: skip
        lines.append("")
        lines += [f"FAILED {e}" for e in errors] + ([""] if errors else [])
        lines += _meter_table(workload, chosen, present)
    return "\n".join(lines) + "\n"


def _summary(by: dict[tuple[str, str], list[Run]], arms: list[str]) -> list[str]:
    """One line per workload: RPCs per unit of each arm, and each arm against direct."""
    shown = [a for a in arms if a != "direct"]
    head = "| workload | direct RPCs | " + " | ".join(
        f"{a} RPCs | {a} RPCs/direct | {a} speed" for a in shown
    )
    out = [head + " |", "| --- |" + " ---: |" * (1 + 3 * len(shown))]
    for workload in WORKLOADS:
        if not any((workload.name, a) in by for a in arms):
            continue
        total: dict[str, float] = {}
        secs: dict[str, float] = {}
        for a in arms:
            runs = by.get((workload.name, a))
            if runs:
                r = _median_run(runs)
                total[a] = sum(counted(r.total()).values()) / r.units
                secs[a] = statistics.median(x.seconds for x in runs)
        cells = [f"{workload.name} (per {workload.unit})", _fmt(total.get("direct", 0))]
        for a in shown:
            if a not in total:
                cells += ["", "", ""]
                continue
            ratio = f"{total[a] / total['direct']:.2f}x" if total.get("direct") else ""
            speed = f"{secs['direct'] / secs[a]:.2f}x" if "direct" in secs else ""
            cells += [_fmt(total[a]), ratio, speed]
        out.append("| " + " | ".join(cells) + " |")
    return [*out, ""]


def _meter_table(workload: Workload, chosen: dict[str, Run], arms: list[str]) -> list[str]:
    """Item 8: the daemon's meter (work phase) beside the wire's RPCs of the same phase."""
    out = []
    for a in arms:
        r = chosen[a]
        if not r.meter:
            continue
        wire = wire_classes(r.work)
        out.append(
            f"meter vs wire, {a}, work phase, per {workload.unit} "
            f"(FUSE requests: {_fmt(sum(r.requests.values()) / r.units)}; "
            f"exit {r.exit}):"
        )
        out.append("")
        out.append("| class | meter ops | wire RPCs | meter units | wire units (same rules) |")
        out.append("| --- | ---: | ---: | ---: | ---: |")
        for cls in (*CLASSES, "none"):
            m = r.meter.get(cls, {})
            w = wire.get(cls, 0)
            if not m.get("ops") and not w:
                continue
            unit = 1 if cls in ("data_read", "meta_read") else (5 if cls != "none" else 0)
            out.append(
                f"| {cls} | {_fmt(m.get('ops', 0) / r.units)} | {_fmt(w / r.units)} | "
                f"{_fmt(m.get('units', 0) / r.units)} | {_fmt(w * unit / r.units)} |"
            )
        out.append("")
        out.append(
            "target ops by name: "
            + ", ".join(f"{k} {_fmt(v / r.units)}" for k, v in sorted(r.target_ops.items()))
        )
        out.append("")
        out.append(
            "FUSE requests by name: "
            + ", ".join(f"{k} {_fmt(v / r.units)}" for k, v in sorted(r.requests.items()))
        )
        out.append("")
    return out


def main() -> int:
    spec = Spec(
        files=_env_int("FTLAB_WIRE_FILES", 300),
        dirs=_env_int("FTLAB_WIRE_DIRS", 3),
        size=_env_int("FTLAB_WIRE_SIZE", 4096),
        stream_mib=_env_int("FTLAB_WIRE_STREAM_MIB", 64),
    )
    repeats = _env_int("FTLAB_WIRE_REPEATS", 1)
    wanted = os.environ.get("FTLAB_WIRE_WORKLOADS")
    workloads = [w for w in WORKLOADS if not wanted or w.name in wanted.split(",")]
    wanted_arms = os.environ.get("FTLAB_WIRE_ARMS")
    arms = [a for a in ARMS if not wanted_arms or a.name in wanted_arms.split(",")]
    trace = os.environ.get("FTLAB_WIRE_TRACE") == "1"
    profile = os.environ.get("FTLAB_PROFILE", "?")
    OUT.mkdir(parents=True, exist_ok=True)
    MOUNTS.mkdir(parents=True, exist_ok=True)
    runs: list[Run] = []
    failed = False
    for repeat in range(repeats):
        for workload in workloads:
            # The order of the arms rotates per repeat: no arm always runs first.
            order = arms[repeat % len(arms) :] + arms[: repeat % len(arms)]
            for arm in order:
                tag = f"{repeat}-{uuid.uuid4().hex[:6]}"
                run = run_one(workload, arm, spec, tag, trace and arm.options is not None)
                runs.append(run)
                total = sum(counted(run.total()).values())
                print(
                    f"{workload.name:7} {arm.name:8} {run.seconds:7.2f} s  "
                    f"{total / run.units:6.2f} RPCs/{workload.unit}  "
                    f"{dict(sorted(counted(run.total()).items()))}"
                    + (f"  exit {run.exit}" if run.exit is not None else ""),
                    flush=True,
                )
                failed = failed or run.exit not in (None, 0) or bool(run.error)
    text = report(runs, spec, profile, [a.name for a in arms])
    (OUT / "wire.md").write_text(text)
    (OUT / "wire.json").write_text(
        json.dumps(
            {
                "profile": profile,
                "spec": spec.__dict__,
                "runs": [r.__dict__ for r in runs],
            },
            indent=1,
            default=str,
        )
        + "\n"
    )
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
