"""``python -m bench.fleet``: three mounts share one fleet budget through Redis (issue 14).

Three fusethrottle daemons on one host, each with its own writer and its own target directory on
a tmpfs (fast: the budget, not the target, must be what limits them), all with
``budget=redis://.../fleet`` and ``fusethrottle budget set ... --metered 60M``. The timeline:

====================  =========================================================================
t = 0                 all three writers start (1 MiB writes, files rotated so tmpfs stays small)
t = outage            redis-server is killed (SIGKILL)
t = outage + down     it is started again (same port, same append-only file: the budget survives)
t = stop              writer C stops; A and B should take its share
t = end               all stop
====================  =========================================================================

Every 0.25 s the bench scrapes each daemon's /metrics: metered bytes sent to the target
(``fusethrottle_metered_bytes_total{class="data_write"}``), the fallback gauge and the Redis round
trips. It writes ``summary.json`` and ``summary.md`` (a few KB, per-second rates included) under
``bench/results/<date>-fleet/``; daemon and Redis logs stay in the temporary directory.

Run as root from the repository root: ``.venv/bin/python -m bench.fleet`` (about 70 s).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from bench.model import jain_index
from bench.system import head_commit

MiB = 1 << 20
GiB = 1 << 30
REPO = Path(__file__).resolve().parent.parent
FUSETHROTTLE = str(Path(sys.executable).with_name("fusethrottle"))
SAMPLE = 0.25
#: Reaction times are judged on rates over this long (the time includes it).
REACTION = 0.5
NAMES = ("A", "B", "C")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Redis:
    """redis-server in a directory of ours; killed and restarted with its data."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.directory / "redis.log", "ab")  # noqa: SIM115 (the child keeps it)
        self.proc = subprocess.Popen(
            [
                shutil.which("redis-server") or "/usr/bin/redis-server",
                "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory),
                "--appendonly", "yes", "--appendfsync", "always", "--save", "",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()
        for _ in range(200):
            try:
                with socket.create_connection(("127.0.0.1", self.port), 0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@dataclass
class Mount:
    name: str
    source: Path
    mountpoint: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None
    writer: subprocess.Popen[str] | None = None
    errors: list[str] = field(default_factory=list)

    def start_writing(self) -> None:
        self.writer = subprocess.Popen(
            [sys.executable, "-m", "bench.fleet", "--writer", str(self.mountpoint)],
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )

    def signal_stop(self) -> None:
        """SIGTERM the writer; it finishes the write() in progress (and its close() hands the
        kernel's cached pages to the daemon: the target sees the writer stop a bit later)."""
        if self.writer is not None and self.writer.poll() is None:
            self.writer.terminate()

    def stop_writing(self) -> None:
        if self.writer is None or self.writer.returncode is not None:
            return
        self.writer.terminate()
        _, err = self.writer.communicate(timeout=120)
        self.errors += [line for line in err.splitlines() if line.strip()]
        if self.writer.returncode not in (0, -signal.SIGTERM):
            self.errors.append(f"writer exited {self.writer.returncode}")

    def scrape(self) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "fusethrottle_metered_bytes_total":
                    if s.labels.get("class") == "data_write":
                        out["metered"] = s.value
                elif s.name.startswith("fusethrottle_budget_") and not s.labels:
                    out[s.name.removeprefix("fusethrottle_budget_")] = s.value
                elif s.name == "fusethrottle_budget_share_rate":
                    if s.labels.get("resource") == "metered_bytes":
                        out["share"] = s.value
                elif s.name == "fusethrottle_written_bytes_total":
                    out["written"] = s.value
                elif s.name == "fusethrottle_snapshot_age_seconds":
                    out["age"] = s.value
        return out


def writer(directory: Path) -> int:
    """One writer process (``--writer DIR``): 1 MiB writes until SIGTERM, a new 256 MiB file each
    time, the one before removed (tmpfs stays small). Every error is one stderr line; exit 1 if
    there was any. A process, not a thread: the bench's own forks must not wait on FUSE writes.
    """
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    block = os.urandom(MiB)
    errors = index = 0
    while not stop.is_set():
        path = directory / f"part-{index}.bin"
        try:
            with open(path, "wb") as f:
                for _ in range(256):
                    if stop.is_set():
                        break
                    f.write(block)
            if index:
                (directory / f"part-{index - 1}.bin").unlink()
        except OSError as err:
            errors += 1
            print(f"{type(err).__name__}: {err}", file=sys.stderr, flush=True)
            time.sleep(0.1)
        index += 1
    return 1 if errors else 0


def value_at(samples: list[dict], name: str, t: float) -> float:
    """Mount *name*'s metered-bytes counter at time *t*, linear between the samples around it."""
    points = [(s[name]["at"], s[name]["metered"]) for s in samples]
    if t <= points[0][0]:
        return float(points[0][1])
    for (t0, a), (t1, b) in itertools.pairwise(points):
        if t0 <= t <= t1:
            return float(a + (b - a) * (t - t0) / (t1 - t0)) if t1 > t0 else float(b)
    return float(points[-1][1])


def rates(samples: list[dict], name: str, t0: float, t1: float) -> float:
    """Metered bytes/s of mount *name* between times t0 and t1."""
    if t1 <= t0:
        return 0.0
    return (value_at(samples, name, t1) - value_at(samples, name, t0)) / (t1 - t0)


def analyse(samples: list[dict], plan: dict, limit: float, errors: dict) -> dict:
    end = samples[-1]["t"]
    outage, back, stop = plan["outage"], plan["outage"] + plan["down"], plan["stop"]

    def total(t0: float, t1: float) -> float:
        return sum(rates(samples, n, t0, t1) for n in NAMES)

    # Sum of the three rates over every 10 s window (sample-aligned).
    windows = [
        (s["t"], total(s["t"], s["t"] + 10)) for s in samples if s["t"] + 10 <= end + SAMPLE / 2
    ]
    worst_t, worst = max(windows, key=lambda w: w[1])
    lowest = min(w[1] for w in windows)

    def jain(t0: float, t1: float) -> tuple[float, list[float]]:
        shares = [rates(samples, n, t0, t1) for n in NAMES]
        return jain_index(shares), shares

    steady = jain(2.0, outage)
    rejoined = jain(back + 5.0, stop)
    # Worst deviation from the equal share over 5 s windows while all three write (no outage).
    deviations = []
    t = 2.0
    while t + 5 <= outage:
        shares = [rates(samples, n, t, t + 5) for n in NAMES]
        mean = sum(shares) / 3
        deviations.append(max(abs(x - mean) / mean for x in shares))
        t += 1.0

    def first_time(after: float, until: float, ok: object) -> float | None:
        for s in samples:
            if after <= s["t"] <= until and ok(s["t"]):  # type: ignore[operator]
                return round(s["t"] - after, 2)
        return None

    def equal_again(t: float) -> bool:
        if t - REACTION < back:
            return False
        shares = [rates(samples, n, t - REACTION, t) for n in NAMES]
        mean = sum(shares) / 3
        return mean > 0 and all(abs(x - mean) / mean <= 0.10 for x in shares)

    def two_at_half(t: float) -> bool:
        return t - REACTION >= stop and all(
            rates(samples, n, t - REACTION, t) >= 0.95 * limit / 2 for n in NAMES[:2]
        )

    c_final = samples[-1]["C"]["metered"]
    c_quiet = next(
        (s["t"] for s in samples if s["t"] >= stop and s["C"]["metered"] >= c_final), None
    )

    fallback_seen = {
        n: any(s[n].get("fallback", 0) == 1 for s in samples if outage <= s["t"] <= back)
        for n in NAMES
    }
    last = samples[-1]
    round_trips = sum(last[n].get("round_trips_total", 0) for n in NAMES)
    written = sum(last[n].get("metered", 0) for n in NAMES)
    per_second = []
    t = 0.0
    while t + 1 <= end:
        per_second.append(
            [round(t + 1, 1), *(round(rates(samples, n, t, t + 1) / MiB, 1) for n in NAMES)]
        )
        t += 1.0
    return {
        "limit_mib_s": limit / MiB,
        "sum_10s_max_mib_s": round(worst / MiB, 2),
        "sum_10s_max_over_limit_percent": round(100 * (worst / limit - 1), 2),
        "sum_10s_max_window_start_s": round(worst_t, 2),
        "sum_10s_min_mib_s": round(lowest / MiB, 2),
        "jain_all_three": round(steady[0], 4),
        "shares_all_three_mib_s": [round(x / MiB, 2) for x in steady[1]],
        "worst_5s_deviation_from_equal_percent": round(100 * max(deviations), 1),
        "jain_after_rejoin": round(rejoined[0], 4),
        "shares_after_rejoin_mib_s": [round(x / MiB, 2) for x in rejoined[1]],
        "fallback_seen_during_outage": fallback_seen,
        "equal_again_after_redis_back_s": first_time(back, stop, equal_again),
        "two_at_30_after_stop_s": first_time(stop, end, two_at_half),
        "c_last_metered_after_stop_s": round(c_quiet - stop, 2) if c_quiet else None,
        "shares_after_stop_mib_s": [
            round(rates(samples, n, stop + 3.0, end) / MiB, 2) for n in NAMES[:2]
        ],
        "writer_errors": errors,
        "round_trips": int(round_trips),
        "written_gib": round(written / GiB, 3),
        "round_trips_per_gib": round(round_trips / (written / GiB), 1) if written else None,
        "per_second_mib_s": per_second,
    }


def markdown(summary: dict, plan: dict, command: str) -> str:
    s = summary
    lines = [
        "# Fleet budget: three mounts, one Redis budget of 60 MiB/s metered",
        "",
        f"`{command}` on {plan['host']} ({plan['date']}), commit {plan['commit']}.",
        f"Timeline: all three write from 0 s; Redis killed at {plan['outage']} s and started "
        f"again at {plan['outage'] + plan['down']} s; writer C stops at {plan['stop']} s; end "
        f"at {plan['end']} s. Data plane: {plan.get('engine', 'native')}. "
        f"Targets: directories on one tmpfs. Load average at the start: "
        f"{plan['load_average_at_start']:.1f} on {os.cpu_count()} CPUs (a shared machine).",
        "",
        "| claim | measured |",
        "| --- | --- |",
        f"| sum of metered rates, worst 10 s window (limit 60 MiB/s, +5% allowed) | "
        f"{s['sum_10s_max_mib_s']} MiB/s ({s['sum_10s_max_over_limit_percent']:+.1f}%), "
        f"window from {s['sum_10s_max_window_start_s']} s; lowest window "
        f"{s['sum_10s_min_mib_s']} MiB/s |",
        f"| Jain's index, all three writing (>= 0.95) | {s['jain_all_three']} "
        f"(shares {', '.join(map(str, s['shares_all_three_mib_s']))} MiB/s; worst 5 s window "
        f"{s['worst_5s_deviation_from_equal_percent']}% off equal) |",
        f"| C stops: A and B each at >= 95% of 30 MiB/s (0.5 s rates) within 2 s | "
        f"after {s['two_at_30_after_stop_s']} s (C's own traffic at the target ended "
        f"{s['c_last_metered_after_stop_s']} s after its SIGTERM: its close() hands over the "
        f"kernel's cached pages); then "
        f"{', '.join(map(str, s['shares_after_stop_mib_s']))} MiB/s |",
        f"| Redis killed: writer errors | {sum(len(v) for v in s['writer_errors'].values())} |",
        f"| Redis killed: fallback gauge seen at 1 | {s['fallback_seen_during_outage']} |",
        f"| Redis back: shares within 10% of equal (0.5 s rates) within 5 s | after "
        f"{s['equal_again_after_redis_back_s']} s; Jain {s['jain_after_rejoin']} afterwards |",
        f"| Redis round trips per GiB written (< 100) | {s['round_trips_per_gib']} "
        f"({s['round_trips']} round trips for {s['written_gib']} GiB, failed tries included) |",
        "",
        "Per-second metered rates (MiB/s):",
        "",
        "| t (s) | A | B | C |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| {t} | {a} | {b} | {c} |" for t, a, b, c in s["per_second_mib_s"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.split("\n")[0])
    p.add_argument("--metered", default="60M", help="the fleet budget (default 60M)")
    p.add_argument("--outage", type=float, default=30.0, help="kill Redis at (s)")
    p.add_argument("--down", type=float, default=10.0, help="Redis stays down this long (s)")
    p.add_argument("--stop", type=float, default=55.0, help="writer C stops at (s)")
    p.add_argument("--end", type=float, default=65.0, help="all stop at (s)")
    p.add_argument("--out", type=Path, default=None, help="results directory")
    p.add_argument("--writer", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.writer is not None:
        return writer(args.writer)
    if os.geteuid() != 0:
        print("bench.fleet: run as root (it mounts a tmpfs and three FUSE mounts)", file=sys.stderr)
        return 2
    from fusethrottle.service.options import parse_rate

    limit = parse_rate(args.metered)
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    out = args.out or REPO / "bench" / "results" / f"{date}-fleet"
    work = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    work.chmod(0o755)
    target = work / "target"
    target.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4g", "tmpfs", str(target)], check=True)
    redis = Redis(work)
    mounts: list[Mount] = []
    try:
        redis.start()
        url = f"redis://127.0.0.1:{redis.port}/fleet"
        subprocess.run([FUSETHROTTLE, "budget", "set", url, "--metered", args.metered], check=True)
        for name in NAMES:
            m = Mount(name, target / name, work / f"mnt-{name}", free_port())
            m.source.mkdir()
            m.mountpoint.mkdir()
            log = open(work / f"daemon-{name}.log", "wb")  # noqa: SIM115
            m.proc = subprocess.Popen(
                [
                    FUSETHROTTLE, str(m.source), str(m.mountpoint), "-f",
                    "-o", f"budget={url},metrics=127.0.0.1:{m.port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
            log.close()
            mounts.append(m)
        for m in mounts:
            for _ in range(200):
                try:
                    m.scrape()
                    break
                except OSError:
                    time.sleep(0.05)
        plan = {
            "outage": args.outage,
            "down": args.down,
            "stop": args.stop,
            "end": args.end,
            "host": socket.gethostname(),
            "load_average_at_start": os.getloadavg()[0],
            "date": date,
            "commit": head_commit(),
        }
        samples: list[dict] = []
        start = time.monotonic()
        for m in mounts:
            m.start_writing()
        killed = restarted = stopped = False
        while (now := time.monotonic() - start) < args.end:
            if not killed and now >= args.outage:
                redis.kill()
                killed = True
            if killed and not restarted and now >= args.outage + args.down:
                redis.start()
                restarted = True
            if not stopped and now >= args.stop:
                mounts[2].signal_stop()
                stopped = True
            row: dict = {}
            begun = time.monotonic() - start  # after the events above, which may take a while
            for m in mounts:
                row[m.name] = m.scrape()
                # When the daemon took these numbers (a busy loop answers with older ones).
                row[m.name]["at"] = time.monotonic() - start - row[m.name].get("age", 0.0)
            row["t"] = (begun + time.monotonic() - start) / 2
            samples.append(row)
            time.sleep(max(0.0, SAMPLE - (time.monotonic() - start - now)))
        for m in mounts:
            m.stop_writing()
        summary = analyse(samples, plan, limit, {m.name: m.errors for m in mounts})
        (work / "samples.json").write_text(json.dumps(samples))  # raw: stays out of the repo
        command = "sudo .venv/bin/python -m bench.fleet " + " ".join(argv or sys.argv[1:])
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps({"plan": plan, **summary}, indent=1) + "\n")
        (out / "summary.md").write_text(markdown(summary, plan, command.strip()))
        (out / "COMMAND").write_text(command.strip() + "\n")
        print((out / "summary.md").read_text())
        print(f"results in {out}; logs in {work}")
        return 0
    finally:
        for m in mounts:
            m.stop_writing()
        for m in mounts:
            subprocess.run(["fusermount3", "-u", str(m.mountpoint)], check=False)
            if m.proc is not None:
                try:
                    m.proc.wait(60)
                except subprocess.TimeoutExpired:
                    m.proc.kill()
        redis.stop()
        subprocess.run(["umount", str(target)], check=False)


if __name__ == "__main__":
    sys.exit(main())
