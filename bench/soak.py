"""A soak: the degrade schedule in a loop with tar, rsync and dd writing through one mount.

``sudo .venv/bin/python -m bench.soak --minutes 30``

One fusethrottle mount (defaults) over the throttled loop target, whose rate cycles 20 MiB/s for
30 s, 1 MiB/s for 40 s, 20 MiB/s for 30 s for the whole run. Cycle after cycle, three backups run
at once through the mount: ``tar -cf`` of a generated tree (small and large files), ``rsync -a``
of the same tree, and ``dd`` of a random file. After each cycle every output is checked on the
target itself (``tar -d`` against the tree, ``diff -r``, sha256), the previous cycle's outputs are
removed, and the daemon's resident memory, descriptors and threads are sampled. At the end the
daemon gets SIGTERM and must exit 0.

What a user asks of a mount left running for weeks: nothing grows (memory, descriptors and
threads at the end within 10% of their level after the first cycle), and nothing is lost
(every file of every cycle verified). Results: ``bench/results/<date>-soak/summary.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.daemon import FuseThrottleMount, find_executable
from bench.million_files import proc_numbers
from bench.plan import MiB, RateStep, TargetSpec
from bench.system import Teardown
from bench.target import LoopTarget, Throttle
from bench.workloads import make_tree

log = logging.getLogger("bench.soak")
SCHEDULE = ((20 * MiB, 30.0), (1 * MiB, 40.0), (20 * MiB, 30.0))


def cycle_rates(throttle: Throttle, stop: threading.Event) -> None:
    """Apply the degrade schedule again and again until *stop*."""
    while not stop.is_set():
        for rate, seconds in SCHEDULE:
            throttle.apply(rate)
            if stop.wait(seconds):
                return


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(MiB):
            digest.update(chunk)
    return digest.hexdigest()


def run_cycle(index: int, mnt: Path, tree: Path, blob: Path) -> dict[str, object]:
    """The three backups at once; returns their times and exit codes."""
    t0 = time.monotonic()
    out = {
        "tar": subprocess.Popen(["tar", "-cf", str(mnt / f"c{index}.tar"), "-C", str(tree), "."]),
        "rsync": subprocess.Popen(["rsync", "-a", f"{tree}/", str(mnt / f"c{index}-rsync")]),
        "dd": subprocess.Popen(
            ["dd", f"if={blob}", f"of={mnt / f'c{index}.bin'}", "bs=1M", "status=none"]
        ),
    }
    codes = {name: proc.wait() for name, proc in out.items()}
    return {"seconds": round(time.monotonic() - t0, 1), "exit": codes}


def verify_cycle(index: int, target: Path, tree: Path, blob_sum: str) -> dict[str, bool]:
    """Check what the cycle left on the target itself (not through the mount)."""
    tar = subprocess.run(
        ["tar", "-df", str(target / f"c{index}.tar"), "-C", str(tree)], capture_output=True
    )
    diff = subprocess.run(
        ["diff", "-r", "-q", str(tree), str(target / f"c{index}-rsync")], capture_output=True
    )
    return {
        "tar": tar.returncode == 0,
        "rsync": diff.returncode == 0,
        "dd": sha256(target / f"c{index}.bin") == blob_sum,
    }


def remove_cycle(index: int, mnt: Path) -> None:
    for name in (f"c{index}.tar", f"c{index}.bin"):
        (mnt / name).unlink(missing_ok=True)
    shutil.rmtree(mnt / f"c{index}-rsync", ignore_errors=True)


#: A worker thread idle this long ends (fusethrottle.target.workers.WorkerPool's default), and a
#: heap quiet for half a second is trimmed (at most every 10 s: daemon.HEAP_TRIM_INTERVAL); a sample
#: taken after this much quiet shows what the daemon keeps, not what the last ten seconds of
#: concurrency happened to start.
REST_SECONDS = 10.0 + 2.0


def rest_sample(pid: int) -> dict[str, float]:
    """The daemon's numbers after REST_SECONDS without requests."""
    time.sleep(REST_SECONDS)
    return proc_numbers(pid)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--tree", type=int, default=150, help="MiB of the tar/rsync tree")
    parser.add_argument("--blob", type=int, default=100, help="MiB of the dd file")
    parser.add_argument("--options", default="")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--fusethrottle", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if os.geteuid() != 0:
        print("bench.soak: needs root (loop device, throttle, mount)", file=sys.stderr)
        return 2
    exe = find_executable(args.fusethrottle)
    if exe is None:
        print("bench.soak: no fusethrottle executable found", file=sys.stderr)
        return 2
    out = args.out or Path("bench/results") / (time.strftime("%Y-%m-%d") + "-soak")
    teardown = Teardown()
    workdir = Path("/var/tmp") / f"fusethrottle-soak-{os.getpid()}"
    scratch = Path("/dev/shm") / f"fusethrottle-soak-{os.getpid()}"
    cycles: list[dict[str, Any]] = []
    rest: dict[str, dict[str, float]] = {}
    stop_rates = threading.Event()
    code: object = None
    try:
        for path in (workdir, scratch):
            path.mkdir(parents=True)
            teardown.push("rmtree", str(path))
        tree = scratch / "tree"
        files, nbytes = make_tree(tree, args.tree * MiB)
        blob = scratch / "blob.bin"
        blob.write_bytes(os.urandom(args.blob * MiB))
        blob_sum = sha256(blob)
        target = LoopTarget(TargetSpec("loop", schedule=(RateStep(20 * MiB, math.inf),)), workdir)
        target.setup(teardown)
        source = target.cell_dir("soak")
        mnt = FuseThrottleMount(
            exe,
            source,
            scratch / "mnt",
            args.options,
            scratch / "daemon.log",
            teardown,
            None,
            metrics=False,
        )
        mnt.start()
        assert mnt.pid is not None
        throttle = Throttle(target.bdi or "")
        rates = threading.Thread(target=cycle_rates, args=(throttle, stop_rates), daemon=True)
        rates.start()
        end = time.monotonic() + args.minutes * 60
        index = 0
        while time.monotonic() < end:
            cycle = run_cycle(index, mnt.mountpoint, tree, blob)
            cycle["verified"] = verify_cycle(index, source, tree, blob_sum)
            if index > 0:
                remove_cycle(index - 1, mnt.mountpoint)
            cycle.update(proc_numbers(mnt.pid))
            cycle["index"] = index
            cycles.append(cycle)
            log.info("cycle %d: %s", index, cycle)
            if index == 0:
                rest["after_first"] = rest_sample(mnt.pid)
            index += 1
        rest["at_end"] = rest_sample(mnt.pid)
        log.info("at rest: %s", rest)
        stop_rates.set()
        rates.join()
        throttle.apply(20 * MiB)
        code = mnt.stop(600)["exit_code"]
    finally:
        stop_rates.set()
        teardown.undo_all()
    first, last = cycles[0], cycles[-1]

    def growth(key: str) -> float:
        return float(last[key]) / float(first[key]) - 1.0

    summary = {
        "minutes": args.minutes,
        "tree": {"files": files, "bytes": nbytes},
        "blob_bytes": args.blob * MiB,
        "cycles": len(cycles),
        "all_exit_0": all(set(c["exit"].values()) == {0} for c in cycles),
        "all_verified": all(all(c["verified"].values()) for c in cycles),
        "daemon_exit": code,
        "after_first": {k: first[k] for k in ("rss_mib", "fds", "threads")},
        "at_end": {k: last[k] for k in ("rss_mib", "fds", "threads")},
        "growth": {k: round(growth(k), 3) for k in ("rss_mib", "fds", "threads")},
        "cycle_seconds": [c["seconds"] for c in cycles],
        "series": {k: [c[k] for c in cycles] for k in ("rss_mib", "fds", "threads")},
    }
    summary["at_rest"] = {
        **rest,
        "growth": {
            k: round(rest["at_end"][k] / rest["after_first"][k] - 1.0, 3)
            for k in ("rss_mib", "fds", "threads")
        },
    }
    # The pools start threads on demand, so the first cycles also show warm-up: the level
    # after a tenth of the run says whether anything grows once warm.
    warm = cycles[len(cycles) // 10]
    summary["after_warm_up"] = {k: warm[k] for k in ("rss_mib", "fds", "threads")}
    summary["growth_after_warm_up"] = {
        k: round(float(last[k]) / float(warm[k]) - 1.0, 3) for k in ("rss_mib", "fds", "threads")
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    g = summary["growth"]
    (out / "summary.md").write_text(
        "\n".join(
            [
                f"# Soak: {args.minutes:g} minutes of the degrade schedule (20 MiB/s 30 s, "
                "1 MiB/s 40 s, 20 MiB/s 30 s, looped) with tar, rsync and dd at once",
                "",
                f"{len(cycles)} cycles; each: tar -cf and rsync -a of a {files}-file tree "
                f"({nbytes / MiB:.0f} MiB) and dd of a {args.blob} MiB random file, through one "
                "mount (fusethrottle defaults).",
                "",
                f"| what | after the first cycle | after cycle {warm['index']} (a tenth of the "
                "run) | at the end | growth from the first | growth from the tenth | goal |",
                "|---|---|---|---|---|---|---|",
                *(
                    f"| {label} | {first[k]:.4g} | {warm[k]:.4g} | {last[k]:.4g} | {g[k]:+.1%} | "
                    f"{summary['growth_after_warm_up'][k]:+.1%} | within 10% |"  # type: ignore[index]
                    for label, k in (
                        ("daemon RSS (MiB)", "rss_mib"),
                        ("descriptors", "fds"),
                        ("threads", "threads"),
                    )
                ),
                "",
                f"At rest ({REST_SECONDS:g} s without requests, after the first cycle and after "
                "the last: idle worker threads have ended, the heap is trimmed):",
                "",
                "| what | after the first cycle | at the end | growth | goal |",
                "|---|---|---|---|---|",
                *(
                    f"| {label} | {rest['after_first'][k]:.4g} | {rest['at_end'][k]:.4g} | "
                    f"{rest['at_end'][k] / rest['after_first'][k] - 1.0:+.1%} | within 10% |"
                    for label, k in (
                        ("daemon RSS (MiB)", "rss_mib"),
                        ("descriptors", "fds"),
                        ("threads", "threads"),
                    )
                ),
                "",
                "The table above samples right after each cycle's backups, while worker threads "
                "started in the last 10 s are still there: its thread row follows the phase of "
                "the cycle.",
                "",
                f"Every backup exited 0: {summary['all_exit_0']}. Every output of every cycle "
                f"verified on the target (tar -d, diff -r, sha256): {summary['all_verified']}. "
                f"Daemon exit after SIGTERM: {code}.",
                "",
                f"Cycle times (s): {summary['cycle_seconds']}",
                "",
                f"Rerun: `sudo .venv/bin/python -m bench.soak --minutes {args.minutes:g}`",
                "",
            ]
        )
    )
    print((out / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
