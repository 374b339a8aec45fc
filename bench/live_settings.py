"""How soon a setting changed on a running mount takes effect, during a backup that keeps writing.

``python -m bench.live_settings --out DIR [--repeats 5] [--limit 8M]``

Per repeat, one mount started as fusethrottle@.service starts it (``--conf FILE MOUNTPOINT
-f``), a writer streaming 1 MiB writes through it the whole time, and the bytes landed on the
target (blocks the target allocated) sampled every 20 ms:

* ``set metered_limit=LIMIT`` (``fusethrottle set``): the time from the command until every
  half second after it lands at most 1.2x LIMIT;
* ``set metered_limit=0``: the time until half a second lands more than 3x LIMIT again;
* a reload (the file's window changed, SIGHUP): the time until ``status`` shows the new window;
* a bad value (``set window=1M``, below the batch): one line, exit 2, the running window kept.

At the end every byte the writer wrote is on the target (SHA-256 of both). Writes
``results.json`` and ``summary.md`` under DIR. Needs root (a FUSE mount with allow_other is not
needed: the writer is this process).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from fusethrottle.observability.status_client import StatusError, find_mount_of, query
from fusethrottle.service.mountinfo import mounts
from fusethrottle.service.options import OptionError, parse_size

ROOT = Path(__file__).resolve().parents[1]
FUSETHROTTLE = str(ROOT / ".venv" / "bin" / "fusethrottle")
MiB = 1 << 20
#: Sampling period of the bytes landed, and the span a rate is judged over (seconds).
SAMPLE = 0.02
SPAN = 0.5
#: Seconds each phase lasts: the backup at full speed, under the limit, after the lift.
PHASE = 4.0


@dataclass
class Result:
    repeat: int
    limit: int
    set_command_s: float  # how long `fusethrottle set` took to return
    limit_effect_s: float | None  # set -> every later span within 1.2x the limit
    lift_effect_s: float | None  # lift -> a span above 3x the limit
    reload_effect_s: float | None  # SIGHUP -> status shows the new window
    refused_one_line: bool
    window_kept: bool
    full_speed_mb_s: float
    limited_mb_s: float
    bytes_written: int
    identical: bool


def landed_between(samples: list[tuple[float, int]], start: float, end: float) -> int:
    """Bytes landed between *start* and *end*: the last sample at or before each."""

    def at(t: float) -> int:
        before = [size for when, size in samples if when <= t]
        return before[-1] if before else 0

    return at(end) - at(start)


def limit_effect(
    samples: list[tuple[float, int]], at: float, until: float, limit: float
) -> float | None:
    """Seconds after *at* from which every SPAN up to *until* landed at most 1.2x *limit*
    (plus one write of slack); None if that never held."""
    allowed = 1.2 * limit * SPAN + MiB
    step = SAMPLE
    offsets = [i * step for i in range(int((until - at - SPAN) / step) + 1)]
    over = [d for d in offsets if landed_between(samples, at + d, at + d + SPAN) > allowed]
    if not over:
        return 0.0
    last = over[-1] + step
    return last if last + SPAN <= until - at else None


def lift_effect(
    samples: list[tuple[float, int]], at: float, until: float, limit: float
) -> float | None:
    """Seconds after *at* until a SPAN first landed more than 3x *limit* (its end)."""
    d = 0.0
    while at + d + SPAN <= until:
        if landed_between(samples, at + d, at + d + SPAN) > 3 * limit * SPAN:
            return d + SPAN
        d += SAMPLE
    return None


def window_of(mountpoint: Path) -> int:
    return int(query(find_mount_of(str(mountpoint)), "status")["controller"]["window"])


@contextlib.contextmanager
def mount_from_conf(conf: Path, mountpoint: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The daemon in the foreground, started from its instance file; unmounted at the end."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [FUSETHROTTLE, "--conf", str(conf), str(mountpoint), "-f"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while not any(m.mountpoint == str(mountpoint) for m in mounts()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the mount did not come up: see {log}")
            time.sleep(0.05)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # flushes everything, unmounts, exits
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], capture_output=True)


def fusethrottle_set(mountpoint: Path, *items: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [FUSETHROTTLE, "set", str(mountpoint), *items], capture_output=True, text=True, timeout=60
    )


def one_repeat(repeat: int, work: Path, limit: int, extra: str = "") -> Result:
    source, mountpoint = work / "source", work / "mnt"
    shutil.rmtree(source, ignore_errors=True)
    source.mkdir(parents=True)
    conf = work / "mnt-live\\x2dsettings.conf"  # named as a dashed mount point's instance
    base = "mode=static,batch=8M" + (f",{extra}" if extra else "")
    conf.write_text(f"SOURCE={source}\nOPTIONS={base},window=64M\n")
    with mount_from_conf(conf, mountpoint, work / "daemon.log") as daemon:
        samples: list[tuple[float, int]] = []
        stop = threading.Event()
        digest = hashlib.sha256()
        written = [0]
        failed: list[BaseException] = []
        block = bytearray(os.urandom(MiB))

        def writer() -> None:
            try:
                fd = os.open(mountpoint / "backup.bin", os.O_WRONLY | os.O_CREAT, 0o644)
                try:
                    n = 0
                    while not stop.is_set():
                        block[:8] = n.to_bytes(8, "little")  # every MiB differs
                        os.write(fd, block)
                        digest.update(block)
                        written[0] += len(block)
                        n += 1
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except BaseException as err:
                failed.append(err)

        landed = source / "backup.bin"
        thread = threading.Thread(target=writer)
        start = time.monotonic()
        thread.start()

        def sample_until(t: float) -> None:
            while time.monotonic() - start < t:
                with contextlib.suppress(FileNotFoundError):
                    samples.append((time.monotonic() - start, landed.stat().st_blocks * 512))
                time.sleep(SAMPLE)

        sample_until(PHASE)
        at_set = time.monotonic() - start
        done = fusethrottle_set(mountpoint, f"metered_limit={limit}")
        set_seconds = time.monotonic() - start - at_set
        if done.returncode != 0:
            raise RuntimeError(f"set metered_limit: {done.stderr.strip()}")
        sample_until(2 * PHASE)
        at_lift = time.monotonic() - start
        if fusethrottle_set(mountpoint, "metered_limit=0").returncode != 0:
            raise RuntimeError("set metered_limit=0 failed")
        sample_until(3 * PHASE)
        # A reload: the file's window changes, SIGHUP as systemctl reload sends it.
        conf.write_text(f"SOURCE={source}\nOPTIONS={base},window=32M\n")
        at_reload = time.monotonic()
        daemon.send_signal(signal.SIGHUP)
        reload_seconds = None
        while time.monotonic() - at_reload < 10:
            with contextlib.suppress(StatusError):
                if window_of(mountpoint) == 32 * MiB:
                    reload_seconds = time.monotonic() - at_reload
                    break
            time.sleep(0.01)
        bad = fusethrottle_set(mountpoint, "window=1M")
        refused = bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
        kept = window_of(mountpoint) == 32 * MiB
        stop.set()
        thread.join()
        if failed:
            raise RuntimeError(f"the writer failed: {failed[0]!r}")
    with open(landed, "rb") as f:
        identical = hashlib.file_digest(f, "sha256").digest() == digest.digest()
    full = landed_between(samples, 1.0, PHASE) / (PHASE - 1.0)
    limited = landed_between(samples, at_set + 1.0, 2 * PHASE) / (2 * PHASE - at_set - 1.0)
    return Result(
        repeat,
        limit,
        round(set_seconds, 3),
        limit_effect(samples, at_set, 2 * PHASE, limit),
        lift_effect(samples, at_lift, 3 * PHASE, limit),
        None if reload_seconds is None else round(reload_seconds, 3),
        refused,
        kept,
        full / 1e6,
        limited / 1e6,
        written[0],
        identical,
    )


def summary(results: list[Result]) -> str:
    """The worst repeat of each measure."""

    def worst(values: list[float | None]) -> str:
        return "never" if any(v is None for v in values) else f"{max(v or 0 for v in values):.2f}"

    lines = [
        "| measure | worst of repeats |",
        "|---|---|",
        f"| `set metered_limit=` returns (s) | {worst([r.set_command_s for r in results])} |",
        f"| limit in effect after (s) | {worst([r.limit_effect_s for r in results])} |",
        f"| limit lifted after (s) | {worst([r.lift_effect_s for r in results])} |",
        f"| reload's window in status after (s) | {worst([r.reload_effect_s for r in results])} |",
        f"| bad value refused with one line, window kept | "
        f"{all(r.refused_one_line and r.window_kept for r in results)} |",
        f"| every byte on the target | {all(r.identical for r in results)} |",
        f"| full speed / limited (MB/s, worst) | {min(r.full_speed_mb_s for r in results):.0f} / "
        f"{max(r.limited_mb_s for r in results):.1f} (limit {results[0].limit / 1e6:.1f}) |",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.live_settings", description=__doc__.split("\n")[0]
    )
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--work", type=Path, default=Path("/var/tmp/fusethrottle-live-settings"))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--limit", default="8M", help="the metered_limit set during the backup")
    p.add_argument("--options", default="", help="more -o options for the mount")
    args = p.parse_args(argv)
    try:
        limit = parse_size(args.limit)
    except OptionError as err:
        print(f"bench.live_settings: --limit: {err}", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("bench.live_settings: needs root (a FUSE mount)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    results: list[Result] = []
    for repeat in range(args.repeats):
        r = one_repeat(repeat, args.work, limit, args.options)
        results.append(r)
        print(json.dumps(asdict(r)), flush=True)
        (args.out / "results.json").write_text(json.dumps([asdict(x) for x in results], indent=1))
    text = summary(results)
    load = os.getloadavg()
    (args.out / "summary.md").write_text(
        f"{text}\n\nrepeats {args.repeats}, load {load[0]:.1f}/{load[1]:.1f}\n"
    )
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
