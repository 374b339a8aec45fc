"""A tree of a million small files through one mount: memory and descriptors over time.

``sudo .venv/bin/python -m bench.million_files --files 1000000``

Mounts fusethrottle (defaults) over a private tmpfs, then, timed phase by phase: creates the tree
(1,000 directories, 1 KiB per file, the bench writer's ``files`` job), lists it with
``find -ls``, has the kernel drop its cached names and inodes (``echo 2 >
/proc/sys/vm/drop_caches``, which sends the daemon FORGET for each), and removes it with
``rm -rf``. Every second it samples the daemon's resident memory, open descriptors and threads,
the inode table (metrics), the names the daemon handed back to the kernel to stay within its
descriptors, and the kernel's FUSE inodes (``fuse_inode`` in /proc/slabinfo, every FUSE mount on
the host). Writes ``timeline.csv``-like JSON and a summary to ``bench/results/<date>-files-<N>/``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.daemon import FuseThrottleMount, find_executable
from bench.many_writers import scrape
from bench.system import Teardown

log = logging.getLogger("bench.million_files")


def proc_numbers(pid: int) -> dict[str, float]:
    """Resident memory (MiB), threads and open descriptors of process *pid*."""
    out: dict[str, float] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key == "VmRSS":
                out["rss_mib"] = int(rest.split()[0]) / 1024
            elif key == "Threads":
                out["threads"] = int(rest)
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return out


def fuse_inodes_in_kernel() -> float | None:
    """Active fuse_inode objects (all FUSE mounts of the host), or None if not readable."""
    try:
        with open("/proc/slabinfo") as f:
            for line in f:
                if line.startswith("fuse_inode "):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


class Sampler:
    """Samples the daemon once a second, each sample tagged with the phase running."""

    def __init__(self, pid: int, metrics_url: str) -> None:
        self.pid = pid
        self.url = metrics_url
        self.phase = "start"
        self.samples: list[dict[str, object]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.t0 = time.monotonic()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def take(self) -> dict[str, object]:
        sample: dict[str, object] = {"t": round(time.monotonic() - self.t0, 1), "phase": self.phase}
        with contextlib.suppress(OSError):  # the daemon has exited
            sample.update(proc_numbers(self.pid))
        try:
            metrics = scrape(self.url)
            sample["inodes"] = metrics.get("fusethrottle_inodes")
            sample["names_dropped"] = metrics.get("fusethrottle_kernel_names_dropped_total")
            sample["inodes_bound"] = metrics.get("fusethrottle_inodes_bound")
        except OSError:
            pass
        sample["kernel_fuse_inodes"] = fuse_inodes_in_kernel()
        self.samples.append(sample)
        return sample

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            self.take()


def run_phase(name: str, cmd: list[str], sampler: Sampler, phases: dict[str, dict]) -> None:
    sampler.phase = name
    t0 = time.monotonic()
    result = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.monotonic() - t0
    after = sampler.take()
    phases[name] = {"seconds": round(seconds, 1), "exit": result.returncode, "after": after}
    if result.returncode != 0:
        phases[name]["stderr"] = result.stderr[-2000:]
    log.info("%s: %.1f s, exit %d, then %s", name, seconds, result.returncode, after)


def summarize(samples: list[dict], phases: dict[str, dict], files: int) -> dict[str, object]:
    def peak(key: str) -> float:
        return max((float(s[key]) for s in samples if s.get(key) is not None), default=0.0)

    base = samples[0]
    peak_inodes = peak("inodes")
    rss_growth = peak("rss_mib") - float(base.get("rss_mib", 0.0))
    out: dict[str, object] = {
        "files": files,
        "phases": phases,
        "baseline": base,
        "peak_rss_mib": peak("rss_mib"),
        "peak_fds": peak("fds"),
        "peak_threads": peak("threads"),
        "peak_inodes": peak_inodes,
        "inodes_bound": peak("inodes_bound"),
        "names_dropped": peak("names_dropped"),
        "peak_kernel_fuse_inodes": peak("kernel_fuse_inodes"),
        "rss_kib_per_peak_inode": round(rss_growth * 1024 / peak_inodes, 2)
        if peak_inodes
        else None,
        "create_files_per_s": round(files / phases["create"]["seconds"], 1),
    }
    return out


def markdown(summary: dict, fd_limit: int) -> str:
    phases = summary["phases"]
    rows = []
    for name, p in phases.items():
        a = p["after"]
        rows.append(
            f"| {name} | {p['seconds']} s | {p['exit']} | {a.get('rss_mib', 0):.0f} MiB | "
            f"{a.get('fds')} | {a.get('inodes')} | {a.get('names_dropped')} |"
        )
    return "\n".join(
        [
            f"# {summary['files']:,} files through one mount (tmpfs target)",
            "",
            f"Daemon descriptor limit here: {fd_limit} (the container's hard limit); the inode "
            f"table's bound: {summary['inodes_bound']:.0f}.",
            "",
            "| phase | time | exit | daemon RSS after | descriptors after | inodes after | "
            "names handed back so far |",
            "|---|---|---|---|---|---|---|",
            *rows,
            "",
            f"Peaks over the run: RSS {summary['peak_rss_mib']:.0f} MiB, descriptors "
            f"{summary['peak_fds']:.0f}, threads {summary['peak_threads']:.0f}, inode table "
            f"{summary['peak_inodes']:.0f}, kernel fuse_inode objects "
            f"{summary['peak_kernel_fuse_inodes']:.0f}.",
            f"RSS growth per inode held at the peak: {summary['rss_kib_per_peak_inode']} KiB "
            "(one O_PATH descriptor each).",
            f"Create: {summary['create_files_per_s']} files/s.",
            "",
            f"Rerun: `sudo .venv/bin/python -m bench.million_files --files {summary['files']}`",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.million_files", description=__doc__)
    parser.add_argument("--files", type=int, default=1_000_000)
    parser.add_argument("--dirs", type=int, default=1000)
    parser.add_argument("--options", default="", help="fusethrottle -o options")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--fusethrottle", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if os.geteuid() != 0:
        print("bench.million_files: needs root (tmpfs, mount, drop_caches)", file=sys.stderr)
        return 2
    exe = find_executable(args.fusethrottle)
    if exe is None:
        print("bench.million_files: no fusethrottle executable found", file=sys.stderr)
        return 2
    out = args.out or Path("bench/results") / (time.strftime("%Y-%m-%d") + f"-files-{args.files}")
    teardown = Teardown()
    scratch = Path("/dev/shm") / f"fusethrottle-files-{os.getpid()}"
    target = Path("/var/tmp") / f"fusethrottle-files-target-{os.getpid()}"
    phases: dict[str, dict] = {}
    try:
        scratch.mkdir(parents=True)
        teardown.push("rmtree", str(scratch))
        target.mkdir(parents=True)
        teardown.push("rmtree", str(target))
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=16G,nr_inodes=0", "tmpfs", str(target)], check=True
        )
        teardown.push("umount", str(target))
        mnt = FuseThrottleMount(
            exe,
            target,
            scratch / "mnt",
            args.options,
            scratch / "daemon.log",
            teardown,
            None,
            metrics=True,
        )
        mnt.start()
        assert mnt.pid is not None and mnt.metrics_url is not None
        fd_limit = int(
            Path(f"/proc/{mnt.pid}/limits").read_text().split("Max open files")[1].split()[0]
        )
        sampler = Sampler(mnt.pid, mnt.metrics_url)
        sampler.take()
        sampler.start()
        tree = mnt.mountpoint / "tree"
        writer = [sys.executable, "-m", "bench.writer", "files", "--dir", str(tree)]
        writer += ["--count", str(args.files), "--file-size", "1024", "--dirs", str(args.dirs)]
        run_phase("create", writer, sampler, phases)
        run_phase("find -ls", ["find", str(tree), "-ls"], sampler, phases)
        run_phase(
            "forget (drop_caches 2)",
            ["sh", "-c", "sync; echo 2 > /proc/sys/vm/drop_caches"],
            sampler,
            phases,
        )
        time.sleep(5)  # the FORGETs arrive asynchronously
        phases["forget (drop_caches 2)"]["after"] = sampler.take()
        run_phase("rm -rf", ["rm", "-rf", str(tree)], sampler, phases)
        sampler.stop()
        stop = mnt.stop(600)
        phases["unmount"] = {
            "seconds": round(float(stop["stop_seconds"]), 1),  # type: ignore[arg-type]
            "exit": stop["exit_code"],
            "after": {},
        }
    finally:
        teardown.undo_all()
    summary = summarize(sampler.samples, phases, args.files)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    (out / "timeline.json").write_text(json.dumps(sampler.samples) + "\n")
    (out / "summary.md").write_text(markdown(summary, fd_limit))
    print((out / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
