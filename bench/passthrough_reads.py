"""Reads the kernel serves (FUSE passthrough), side by side with libfuse's passthrough_hp.

``python -m bench.passthrough_reads --out DIR [--repeats 5] [--work DIR]``, as root, in a
root whose libfuse is 3.17+ (Debian 13); from a Debian 12 host through its chroot::

    mkdir -p /var/tmp/ptbench && FUSETHROTTLE_CHROOT_BIND=/var/tmp/ptbench \\
        packaging/test-deb-chroot.sh trixie 'python3 -m bench.passthrough_reads --out /bind/out'

Arms, interleaved in every repeat (the order rotates from one repeat to the next), each on a
fresh mount of the same target directory (on the host's disk, /bind in the chroot):

* ``direct``     the target itself, no FUSE;
* ``ft-pt``      fusethrottle with ``writeback_cache=no``: the kernel reads files itself;
* ``ft-nopt``    the same engine and options with the kernel's reads turned off
                 (``FUSETHROTTLE_PASSTHROUGH=off``): what passthrough changes, reads and writes;
* ``ft-wbc``     fusethrottle as by default (the kernel's write-back cache, no passthrough);
* ``hp-pt``      libfuse 3.17's example/passthrough_hp as it comes (its passthrough on);
* ``hp-nopt``    the same with ``--nopassthrough`` (then it asks for the write-back cache).

Workloads, each cold (its files read once, then the target's pages of them dropped with
POSIX_FADV_DONTNEED: the read comes from the disk, which this VM's host serves from its cache
for every arm alike; the FUSE side's cache is empty as its mount is new):

* ``read-1g``    ``dd bs=1M`` of one 1 GiB file to /dev/null;
* ``small``      ``tar -cf - small | wc -c`` of 5,000 files of 16 KiB in 50 directories;
* ``restore``    ``tar -C MOUNT -cf - tree | tar -C RESTORE -xf -`` of 1,000 files of 4 KiB to
                 4 MiB (about 1.2 GB) into a tmpfs (so the restore's writes do not land on the
                 disk being read);
* ``write-1g``   ``dd bs=1M count=1024 conv=fsync`` of a new file: writes unchanged.

Per measurement: MiB/s, CPU seconds of the reader (its process tree) and of the daemon, and
the load average. ``results.json`` holds every measurement; ``summary.md`` the medians, the
worst repeat and the ratios to ``direct`` of the same repeat. passthrough_hp's source comes from
Debian's fuse3 source package (for the root's libfuse version) into ``--cache`` at run time.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("direct", "ft-pt", "ft-nopt", "ft-wbc", "hp-pt", "hp-nopt")
WORKLOADS = ("read-1g", "small", "restore", "write-1g")
MIB = 1 << 20
GIB = 1 << 30
MIRROR = "http://deb.debian.org/debian/pool/main/f/fuse3"
SMALL_FILES, SMALL_DIRS, SMALL_SIZE = 5000, 50, 16 << 10
TREE_FILES = 1000
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class Measurement:
    repeat: int
    workload: str
    arm: str
    position: int  # the arm's place in this repeat's order
    seconds: float
    bytes: int
    mib_s: float
    reader_cpu_s: float
    daemon_cpu_s: float
    cpu_s_per_gib: float
    load1: float
    passthrough: str  # what the daemon said (fusethrottle), or the arm's setting


def sh(cmd: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # type: ignore[call-overload,no-any-return]
        ["bash", "-c", cmd], check=True, text=True, capture_output=True, **kw
    )


# --- the data set -----------------------------------------------------------------------------


def tree_sizes() -> list[int]:
    """1,000 sizes from 4 KiB to 4 MiB: three in four log-uniform, one in four 2-4 MiB."""
    rng = random.Random(53)
    sizes = []
    for i in range(TREE_FILES):
        if i % 4 == 0:
            sizes.append(rng.randrange(2 * MIB, 4 * MIB + 1))
        else:
            sizes.append(int(2 ** rng.uniform(12, 22)))
    return sizes


def write_random(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        left = size
        while left:
            chunk = os.urandom(min(left, 4 * MIB))
            f.write(chunk)
            left -= len(chunk)
        os.fsync(f.fileno())


def make_target(target: Path) -> None:
    """The three read sets, made once and kept (``.complete`` says they are whole)."""
    if (target / ".complete").exists():
        return
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    write_random(target / "big", GIB)
    for i in range(SMALL_FILES):
        d = target / "small" / f"d{i % SMALL_DIRS:02}"
        d.mkdir(parents=True, exist_ok=True)
        write_random(d / f"f{i:04}", SMALL_SIZE)
    for i, size in enumerate(tree_sizes()):
        d = target / "tree" / f"d{i % 20:02}"
        d.mkdir(parents=True, exist_ok=True)
        write_random(d / f"f{i:04}.bin", size)
    (target / "w").mkdir()
    os.sync()
    (target / ".complete").touch()


def files_of(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file())


def prime_and_evict(files: list[Path]) -> None:
    """*files* read once, then the target's pages of them dropped: the next read comes from
    the disk, as served warm by this VM's host. A virtual disk's host caches what was read
    lately: without the read before, the first arm after a while reads the host's disk at a
    third of the speed of the next (bench/results/2026-12-02-passthrough-reads/NOTES.md)."""
    for p in files:
        with open(p, "rb", buffering=0) as f:
            while f.read(4 * MIB):
                pass
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# --- passthrough_hp ---------------------------------------------------------------------------


def libfuse_version() -> str:
    return sh("pkg-config --modversion fuse3").stdout.strip()


def passthrough_hp(cache: Path) -> Path:
    """libfuse's example/passthrough_hp built for this root's libfuse, from Debian's fuse3
    source package (its upstream tarball), fetched into *cache* once."""
    version = libfuse_version()
    binary = cache / f"passthrough_hp-{version}"
    if binary.exists():
        return binary
    cache.mkdir(parents=True, exist_ok=True)
    tarball = cache / f"fuse3_{version}.orig.tar.gz"
    if not tarball.exists():
        part = tarball.with_suffix(".part")
        with urllib.request.urlopen(f"{MIRROR}/{tarball.name}", timeout=120) as r:
            part.write_bytes(r.read())
        part.rename(tarball)
    src = cache / f"example-{version}"
    src.mkdir(exist_ok=True)
    with tarfile.open(tarball) as t:
        for m in t.getmembers():
            if m.name.endswith(("example/passthrough_hp.cc", "example/cxxopts.hpp")):
                f = t.extractfile(m)
                assert f is not None
                (src / Path(m.name).name).write_bytes(f.read())
    flags = sh("pkg-config --cflags --libs fuse3").stdout.split()
    source = str(src / "passthrough_hp.cc")
    cmd = ["g++", "-O2", "-std=c++17", f"-I{src}", source, *flags, "-lpthread", "-o", str(binary)]
    subprocess.run(cmd, check=True)
    return binary


# --- the arms ---------------------------------------------------------------------------------


def daemon_cpu(pid: int | None) -> float:
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def is_mounted(path: Path) -> bool:
    return subprocess.run(["mountpoint", "-q", str(path)], check=False).returncode == 0


@dataclass
class Mounted:
    root: Path  # where the workload reads and writes
    pid: int | None  # the daemon
    passthrough: str


@contextlib.contextmanager
def arm_mount(arm: str, target: Path, mnt: Path, logs: Path, hp: Path | None) -> Iterator[Mounted]:
    if arm == "direct":
        yield Mounted(target, None, "-")
        return
    mnt.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if arm.startswith("ft-"):
        cmd = [sys.executable, "-m", "fusethrottle", str(target), str(mnt), "-f"]
        if arm in ("ft-pt", "ft-nopt"):
            cmd += ["-o", "writeback_cache=no"]
        if arm == "ft-nopt":
            env["FUSETHROTTLE_PASSTHROUGH"] = "off"
    else:
        if hp is None:
            raise RuntimeError("passthrough_hp is not built")
        cmd = [str(hp), "--foreground", str(target), str(mnt)]
        if arm == "hp-nopt":
            cmd.append("--nopassthrough")
    log = logs / f"{arm}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    try:
        for _ in range(600):
            if is_mounted(mnt):
                break
            if proc.poll() is not None:
                raise RuntimeError(f"{arm} exited {proc.returncode}: {log.read_text()[-500:]}")
            time.sleep(0.05)
        else:
            raise RuntimeError(f"{arm} did not mount within 30 s")
        said = "-"
        if arm.startswith("ft-"):
            for _ in range(100):  # logged once the engine's stats are first read
                said = next(
                    (
                        ln.split("passthrough: ", 1)[1]
                        for ln in log.read_text().splitlines()
                        if "passthrough: " in ln
                    ),
                    "",
                )
                if said:
                    break
                time.sleep(0.05)
            # An arm that is not what its name says would measure something else, silently.
            wanted = {"ft-pt": "on", "ft-nopt": "off (FUSETHROTTLE_PASSTHROUGH=off)"}.get(arm)
            if wanted is not None and not said.startswith(wanted):
                raise RuntimeError(f"{arm}: the daemon says passthrough: {said or 'nothing'}")
        else:
            said = "off (--nopassthrough)" if arm == "hp-nopt" else "on (default)"
        yield Mounted(mnt, proc.pid, said or "not said")
        if arm == "hp-pt" and "disabling rw passthrough" in log.read_text():
            raise RuntimeError("hp-pt: passthrough_hp turned its passthrough off")
    finally:
        for _ in range(300):  # a reader cut short may hold it busy for a moment
            if (
                not is_mounted(mnt)
                or subprocess.run(["umount", str(mnt)], check=False).returncode == 0
            ):
                break
            time.sleep(0.1)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            subprocess.run(["umount", "-l", str(mnt)], check=False)


# --- the workloads ----------------------------------------------------------------------------


def timed(cmd: str, pid: int | None) -> tuple[float, float, str]:
    """Runs *cmd*: wall seconds, the CPU seconds of the daemon *pid* meanwhile, and its
    stdout+stderr."""
    d0 = daemon_cpu(pid)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        ["bash", "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    out, _ = proc.communicate()
    t1 = time.monotonic()
    d1 = daemon_cpu(pid)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd!r} failed ({proc.returncode}): {out[-500:]}")
    return t1 - t0, d1 - d0, out


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_workload(
    workload: str, m: Mounted, target: Path, restore: Path
) -> tuple[float, float, float, int]:
    """One cold run of *workload* on the mount *m* of *target*: seconds, reader CPU, daemon CPU
    and the bytes it moved (checked against what the target holds)."""
    if workload == "write-1g":
        out = target / "w" / "out"
        out.unlink(missing_ok=True)
        os.sync()
        cmd = f"dd if=/dev/zero of={m.root}/w/out bs=1M count=1024 conv=fsync status=none"
        size = GIB
    else:
        part = {"read-1g": "big", "small": "small", "restore": "tree"}[workload]
        files = files_of(target / part)
        size = sum(p.stat().st_size for p in files)
        prime_and_evict(files)
        if workload == "read-1g":
            cmd = f"dd if={m.root}/big of=/dev/null bs=1M"
        elif workload == "small":
            cmd = f"tar -C {m.root} -cf - small | wc -c"
        else:
            shutil.rmtree(restore, ignore_errors=True)
            restore.mkdir(parents=True)
            cmd = f"tar -C {m.root} -cf - tree | tar -C {restore} -xf -"
    c0 = children_cpu()
    seconds, daemon, said = timed(cmd, m.pid)  # the reader's CPU: its reaped process tree
    reader = children_cpu() - c0
    if workload == "read-1g" and "1024+0 records in" not in said:
        raise RuntimeError(f"read-1g read short: {said}")
    if workload == "small" and int(said.split()[-1]) < size:
        raise RuntimeError(f"small: tar wrote {said.split()[-1]} bytes of {size}")
    if workload == "restore":
        got = sum(p.stat().st_size for p in files_of(restore / "tree"))
        shutil.rmtree(restore, ignore_errors=True)
        if got != size:
            raise RuntimeError(f"restore: {got} bytes restored of {size}")
    if workload == "write-1g" and (target / "w" / "out").stat().st_size != GIB:
        raise RuntimeError("write-1g: the target's file is not 1 GiB")
    return seconds, reader, daemon, size


# --- the summary ------------------------------------------------------------------------------


def summary(results: list[Measurement], arms: list[str]) -> str:
    direct = {(r.repeat, r.workload): r for r in results if r.arm == "direct"}
    lines = []
    for w in WORKLOADS:
        rows = [r for r in results if r.workload == w]
        if not rows:
            continue
        lines += [
            f"### {w}",
            "",
            "| arm | passthrough | MiB/s median | worst | x direct median | worst "
            "| CPU s/GiB median |",
            "|---|---|---|---|---|---|---|",
        ]
        for arm in arms:
            mine = [r for r in rows if r.arm == arm]
            if not mine:
                continue
            rates = [r.mib_s for r in mine]
            ratios = [
                r.mib_s / direct[(r.repeat, w)].mib_s for r in mine if (r.repeat, w) in direct
            ]
            lines.append(
                f"| {arm} | {mine[0].passthrough} | {statistics.median(rates):.0f} | "
                f"{min(rates):.0f} | {statistics.median(ratios):.3f} | {min(ratios):.3f} | "
                f"{statistics.median(r.cpu_s_per_gib for r in mine):.2f} |"
            )
        pairs = [
            (r.mib_s / o.mib_s, r.cpu_s_per_gib / o.cpu_s_per_gib)
            for r in rows
            if r.arm == "ft-pt"
            for o in rows
            if o.arm == "ft-nopt" and o.repeat == r.repeat
        ]
        if pairs:
            lines += [
                "",
                "fusethrottle with passthrough / without (ft-pt / ft-nopt, same repeat): "
                f"rate {statistics.median(p[0] for p in pairs):.3f} median "
                f"({min(p[0] for p in pairs):.2f}-{max(p[0] for p in pairs):.2f}), "
                f"CPU per GiB {statistics.median(p[1] for p in pairs):.3f} median "
                f"({min(p[1] for p in pairs):.2f}-{max(p[1] for p in pairs):.2f})",
            ]
        lines.append("")
    by_repeat: dict[int, list[float]] = {}
    for r in results:
        by_repeat.setdefault(r.repeat, []).append(r.load1)
    lines.append(
        "Load average (1 min) per repeat, lowest-highest over its measurements: "
        + ", ".join(f"{min(v):.1f}-{max(v):.1f}" for _, v in sorted(by_repeat.items()))
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.passthrough_reads", description=__doc__.split("\n")[0]
    )
    p.add_argument("--out", required=True, type=Path)
    # In the chroot, /bind is the host's /var/tmp/ptbench (FUSETHROTTLE_CHROOT_BIND): the same
    # data set and passthrough_hp's cache as a run on the host.
    default_work = Path("/bind") if Path("/bind").is_dir() else Path("/var/tmp/ptbench")
    p.add_argument("--work", type=Path, default=default_work, help="target and cache (a disk)")
    p.add_argument("--restore", type=Path, default=Path("/tmp/ptbench-restore"))
    p.add_argument("--cache", type=Path, help="passthrough_hp's source (default WORK/cache)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument(
        "--summarize",
        action="store_true",
        help="only rewrite OUT/summary.md from its results.json (or .json.gz)",
    )
    args = p.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    if args.summarize:
        raw = args.out / "results.json"
        text = (
            raw.read_text()
            if raw.exists()
            else gzip.decompress(raw.with_suffix(".json.gz").read_bytes()).decode()
        )
        done = [Measurement(**x) for x in json.loads(text)]
        head = (args.out / "summary.md").read_text().split("\n\n", 1)[0]
        (args.out / "summary.md").write_text(f"{head}\n\n{summary(done, arms)}")
        return 0
    if os.geteuid() != 0:
        print("bench.passthrough_reads: needs root (mounts, passthrough)", file=sys.stderr)
        return 2
    workloads = [w for w in args.workloads.split(",") if w]
    args.out.mkdir(parents=True, exist_ok=True)
    logs = args.out / "logs"
    logs.mkdir(exist_ok=True)
    subprocess.run(["make", "-s", "-C", str(ROOT / "fusethrottle/engine")], check=True)
    hp = None
    if any(a.startswith("hp-") for a in arms):
        hp = passthrough_hp(args.cache or args.work / "cache")
    target = args.work / "target"
    make_target(target)
    mnt = Path("/tmp/ptbench-mnt")
    results: list[Measurement] = []
    for repeat in range(args.repeats):
        order = arms[repeat % len(arms) :] + arms[: repeat % len(arms)]
        for w in workloads:
            for pos, arm in enumerate(order):
                with arm_mount(arm, target, mnt, logs, hp) as m:
                    seconds, reader, daemon, size = run_workload(w, m, target, args.restore)
                rate = size / MIB / seconds
                r = Measurement(
                    repeat,
                    w,
                    arm,
                    pos,
                    round(seconds, 4),
                    size,
                    round(rate, 1),
                    round(reader, 3),
                    round(daemon, 3),
                    round((reader + daemon) / (size / GIB), 3),
                    os.getloadavg()[0],
                    m.passthrough,
                )
                results.append(r)
                print(json.dumps(asdict(r)), flush=True)
                (args.out / "results.json").write_text(
                    json.dumps([asdict(x) for x in results], indent=1)
                )
        (target / "w" / "out").unlink(missing_ok=True)
        text = summary(results, arms)  # after every repeat: a run cut short still says something
        (args.out / "summary.md").write_text(
            f"# bench.passthrough_reads: {repeat + 1} of {args.repeats} repeats, "
            f"libfuse {libfuse_version()}, kernel {os.uname().release}\n\n{text}"
        )
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
