"""Many backups at once through one mount onto a slow target (issue 13's "sixty-four backups").

``sudo .venv/bin/python -m bench.many_writers --writers 64 --seconds 60 --repeats 5``

Builds the throttled loop target of TARGETS.md recipe A (20 MiB/s by default), mounts fusethrottle
over it with its defaults, and starts N writers at once, each streaming 1 MiB ``write()`` calls
into its own file for the given time. What a user of a shared backup host asks of it:

* the window holds: the mount's un-synced bytes never exceed its window;
* no writer starves: each writer's throughput over the common interval within 2x of the mean;
* none waits past ``admission_timeout`` (no admission timeouts, worst ``write()`` below it);
* the metrics add up: written bytes counted by the daemon equal what the writers wrote, and
  every byte is on the target after unmount (file sizes).

Every repeat is reported; the summary takes the worst repeat of each number. Results go to
``bench/results/<date>-many-writers-<N>/`` (summary.json and summary.md).
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import math
import os
import sys
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.daemon import FuseThrottleMount, find_executable
from bench.plan import MiB, RateStep, TargetSpec, parse_size
from bench.system import Teardown, start
from bench.target import LoopTarget

log = logging.getLogger("bench.many_writers")
ADMISSION_TIMEOUT = 60.0  # the daemon's default admission_timeout
WINDOW_GRACE = 5.0  # how long a shrunk window's earlier admissions may take to drain


@dataclass
class Repeat:
    """One run of N writers."""

    writers: int
    seconds: float
    rates: list[float] = field(default_factory=list)  # bytes/s per writer, common interval
    written: list[int] = field(default_factory=list)  # bytes each writer says it wrote
    on_target: list[int] = field(default_factory=list)  # each file's size after unmount
    worst_write: float = 0.0
    admission_timeouts: float = float("nan")
    metrics_written: float = float("nan")  # fusethrottle_written_bytes_total at the end
    unsynced_max: float = 0.0
    window_max: float = 0.0
    over_window_samples: int = 0
    samples: int = 0
    dirty_wb_max_mib: float = 0.0
    exit_code: object = None
    started: list[float] = field(default_factory=list)  # each writer's first write, from the first
    #: Every half-second sample: what the controller saw against what the target really did.
    series: list[dict[str, float]] = field(default_factory=list)

    @property
    def mean(self) -> float:
        return sum(self.rates) / len(self.rates) if self.rates else float("nan")

    @property
    def spread(self) -> tuple[float, float]:
        """(fastest / mean, mean / slowest): both at most 2 means nobody starved."""
        if not self.rates or min(self.rates) <= 0:
            return (float("nan"), math.inf)
        return (max(self.rates) / self.mean, self.mean / min(self.rates))

    @property
    def jain(self) -> float:
        total = sum(self.rates)
        squares = sum(r * r for r in self.rates)
        return total * total / (len(self.rates) * squares) if squares else float("nan")


def scrape(url: str) -> dict[str, float]:
    """The mount's Prometheus series, summed over labels."""
    out: dict[str, float] = {}
    with urllib.request.urlopen(url, timeout=5) as response:
        for line in response.read().decode().splitlines():
            if not line or line.startswith("#"):
                continue
            name, _, value = line.rpartition(" ")
            name = name.partition("{")[0]
            try:
                out[name] = out.get(name, 0.0) + float(value)
            except ValueError:
                continue
    return out


def dirty_and_writeback_mib() -> float:
    fields: dict[str, int] = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            fields[key] = int(rest.split()[0])
    return (fields.get("Dirty", 0) + fields.get("Writeback", 0)) / 1024


def bytes_at(log_path: Path, t: float) -> float:
    """A writer's bytes written at monotonic time *t*, from its 250 ms interval log."""
    before = (float("-inf"), 0.0)
    for line in log_path.read_text().splitlines():
        entry = json.loads(line)
        if "bytes" not in entry or "writes" not in entry:
            continue
        if entry["t"] >= t:
            t0, b0 = before
            if t0 == float("-inf"):
                return 0.0
            return b0 + (entry["bytes"] - b0) * (t - t0) / (entry["t"] - t0)
        before = (entry["t"], entry["bytes"])
    return before[1]


def run_once(
    index: int,
    target: LoopTarget,
    teardown: Teardown,
    scratch: Path,
    exe: str,
    writers: int,
    seconds: float,
    options: str,
) -> Repeat:
    source = target.cell_dir(f"repeat{index}")
    mnt = FuseThrottleMount(
        exe,
        source,
        scratch / f"mnt{index}",
        options,
        scratch / f"daemon{index}.log",
        teardown,
        None,
        metrics=True,
    )
    mnt.start()
    assert mnt.metrics_url is not None
    rep = Repeat(writers, seconds)
    stop_sampling = threading.Event()

    recent_windows: collections.deque[tuple[float, float]] = collections.deque()
    began = time.monotonic()

    def sample() -> None:
        while not stop_sampling.wait(0.5):
            try:
                m = scrape(mnt.metrics_url or "")
            except OSError:
                continue
            rep.samples += 1
            unsynced = m.get("fusethrottle_unsynced_bytes", 0.0)
            window = m.get("fusethrottle_window_bytes", 0.0)
            rep.unsynced_max = max(rep.unsynced_max, unsynced)
            rep.window_max = max(rep.window_max, window)
            # An adaptive window may shrink below what it admitted earlier; that drains. What
            # must never happen is more un-synced than any window of the last few seconds.
            now = time.monotonic()
            recent_windows.append((now, window))
            while recent_windows[0][0] < now - WINDOW_GRACE:
                recent_windows.popleft()
            if unsynced > max(w for _, w in recent_windows):
                rep.over_window_samples += 1
            dwb = dirty_and_writeback_mib()
            rep.dirty_wb_max_mib = max(rep.dirty_wb_max_mib, dwb)
            rep.series.append(
                {
                    "t": round(now - began, 2),
                    "window_mib": round(window / MiB, 2),
                    "target_window_mib": round(
                        m.get("fusethrottle_controller_target_window_bytes", 0.0) / MiB, 2
                    ),
                    "unsynced_mib": round(unsynced / MiB, 2),
                    "synced_mib": round(m.get("fusethrottle_synced_bytes_total", 0.0) / MiB, 2),
                    "fsyncs": m.get("fusethrottle_fsync_duration_seconds_count", 0.0),
                    "dirty_writeback_mib": round(dwb, 1),
                }
            )

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    logs = [scratch / f"r{index}-w{i}.jsonl" for i in range(writers)]
    children = []
    for i in range(writers):
        cmd = [sys.executable, "-m", "bench.writer", "stream", "--path"]
        cmd += [str(mnt.mountpoint / f"backup{i:02d}.bin"), "--size", str(1 << 40)]
        cmd += ["--duration", str(seconds), "--log", str(logs[i]), "--seed", str(i)]
        out = scratch / f"r{index}-w{i}.out"
        children.append((start(f"writer{i}", cmd, teardown=teardown, stdout=out), out))
    reports = []
    for child, out in children:
        code = child.wait()
        teardown.forget(child.key)
        if code != 0:
            raise RuntimeError(f"a writer exited {code}: see {out.with_suffix('.err')}")
        reports.append(json.loads(out.read_text().strip().splitlines()[-1]))
    final = scrape(mnt.metrics_url)
    stop_sampling.set()
    sampler.join()
    rep.metrics_written = final.get("fusethrottle_written_bytes_total", float("nan"))
    rep.admission_timeouts = final.get("fusethrottle_admission_timeouts_total", float("nan"))
    rep.exit_code = mnt.stop(600)["exit_code"]
    rep.written = [int(r["bytes"]) for r in reports]
    rep.worst_write = max(float(r["write_max"]) for r in reports)
    rep.on_target = [(source / f"backup{i:02d}.bin").stat().st_size for i in range(writers)]
    # The common interval: from the last writer's first write to the first writer's end.
    starts, ends = [], []
    for path in logs:
        times = [json.loads(line)["t"] for line in path.read_text().splitlines()]
        starts.append(min(times))
        ends.append(max(times))
    lo, hi = max(starts), min(ends)
    rep.seconds = hi - lo
    rep.rates = [(bytes_at(p, hi) - bytes_at(p, lo)) / (hi - lo) for p in logs]
    rep.started = [round(t - min(starts), 2) for t in starts]
    target.clear(source)
    return rep


def summarize(repeats: list[Repeat], rate: int, options: str) -> dict[str, object]:
    worst = {
        "fastest_over_mean": max(r.spread[0] for r in repeats),
        "mean_over_slowest": max(r.spread[1] for r in repeats),
        "jain_min": min(r.jain for r in repeats),
        "worst_write_s": max(r.worst_write for r in repeats),
        "admission_timeouts": sum(r.admission_timeouts for r in repeats),
        "unsynced_over_window_samples": sum(r.over_window_samples for r in repeats),
        "unsynced_max_mib": max(r.unsynced_max for r in repeats) / MiB,
        "window_max_mib": max(r.window_max for r in repeats) / MiB,
        "dirty_writeback_max_mib": max(r.dirty_wb_max_mib for r in repeats),
        "metrics_equal_writers": all(r.metrics_written == sum(r.written) for r in repeats),
        "target_equals_writers": all(r.on_target == r.written for r in repeats),
        "exit_codes": [r.exit_code for r in repeats],
        "total_mib_s": [round(sum(r.rates) / MiB, 2) for r in repeats],
    }
    return {
        "target_rate_mib_s": rate / MiB,
        "options": options or "(defaults)",
        "worst": worst,
        "repeats": [
            {
                **{k: v for k, v in asdict(r).items() if k != "series"},
                "mean_mib_s": r.mean / MiB,
                "spread": r.spread,
                "jain": r.jain,
            }
            for r in repeats
        ],
    }


def write_series(out: Path, repeats: list[Repeat]) -> None:
    """One line per sample and repeat: the window against what the target committed."""
    with (out / "series.jsonl").open("w") as f:
        for index, r in enumerate(repeats):
            for point in r.series:
                f.write(json.dumps({"repeat": index + 1, **point}) + "\n")


def markdown(summary: dict[str, object], writers: int, seconds: float, repeats: int) -> str:
    w = summary["worst"]
    assert isinstance(w, dict)
    lines = [
        f"# {writers} backups at once through one mount, {summary['target_rate_mib_s']:g} MiB/s "
        f"target, {seconds:g} s, {repeats} repeats",
        "",
        f"fusethrottle options: {summary['options']}. Worst repeat of each number.",
        "",
        "| what | worst of the repeats | goal |",
        "|---|---|---|",
        f"| fastest writer / mean | {w['fastest_over_mean']:.2f} | at most 2 |",
        f"| mean / slowest writer | {w['mean_over_slowest']:.2f} | at most 2 |",
        f"| Jain's fairness index | {w['jain_min']:.3f} | (1 = equal) |",
        f"| worst write() | {w['worst_write_s']:.2f} s | below admission_timeout (60 s) |",
        f"| admission timeouts | {w['admission_timeouts']:g} | 0 |",
        f"| samples with un-synced above every window of the last {WINDOW_GRACE:g} s | "
        f"{w['unsynced_over_window_samples']} | 0 |",
        f"| largest un-synced / largest window | {w['unsynced_max_mib']:.0f} / "
        f"{w['window_max_mib']:.0f} MiB | |",
        f"| Dirty+Writeback, whole host (anything else running counts too) | "
        f"{w['dirty_writeback_max_mib']:.0f} MiB | |",
        f"| daemon's written bytes = writers' | {w['metrics_equal_writers']} | True |",
        f"| every file's size on the target = what its writer wrote | "
        f"{w['target_equals_writers']} | True |",
        f"| daemon exit codes | {w['exit_codes']} | 0 |",
        f"| total MiB/s per repeat | {w['total_mib_s']} | near the target's rate |",
        "",
        "Rerun: `sudo .venv/bin/python -m bench.many_writers "
        f"--writers {writers} --seconds {seconds:g} --repeats {repeats}`",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.many_writers", description=__doc__)
    parser.add_argument("--writers", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rate", default="20M", help="the target's write rate (default 20M)")
    parser.add_argument("--options", default="", help="fusethrottle -o options (default: none)")
    parser.add_argument("--out", type=Path, default=None, help="results directory")
    parser.add_argument("--fusethrottle", default=None, help="the daemon to run")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if os.geteuid() != 0:
        print("bench.many_writers: needs root (loop device, throttle, mount)", file=sys.stderr)
        return 2
    exe = find_executable(args.fusethrottle)
    if exe is None:
        print("bench.many_writers: no fusethrottle executable found", file=sys.stderr)
        return 2
    rate = parse_size(args.rate)
    out = args.out or Path("bench/results") / (
        time.strftime("%Y-%m-%d") + f"-many-writers-{args.writers}"
    )
    teardown = Teardown()
    workdir = Path("/var/tmp") / f"fusethrottle-many-writers-{os.getpid()}"
    scratch = Path("/dev/shm") / f"fusethrottle-many-writers-{os.getpid()}"
    repeats: list[Repeat] = []
    try:
        workdir.mkdir(parents=True)
        scratch.mkdir(parents=True)
        teardown.push("rmtree", str(workdir))
        teardown.push("rmtree", str(scratch))
        target = LoopTarget(TargetSpec("loop", schedule=(RateStep(rate, math.inf),)), workdir)
        target.setup(teardown)
        for index in range(args.repeats):
            rep = run_once(
                index, target, teardown, scratch, exe, args.writers, args.seconds, args.options
            )
            log.info(
                "repeat %d: %.2f MiB/s total, fastest/mean %.2f, mean/slowest %.2f, worst "
                "write %.2f s, timeouts %g",
                index + 1,
                sum(rep.rates) / MiB,
                *rep.spread,
                rep.worst_write,
                rep.admission_timeouts,
            )
            repeats.append(rep)
    finally:
        teardown.undo_all()
    summary = summarize(repeats, rate, args.options)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    write_series(out, repeats)
    (out / "summary.md").write_text(markdown(summary, args.writers, args.seconds, args.repeats))
    print((out / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
