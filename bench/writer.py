"""The backup writers the harness runs as child processes (``python -m bench.writer ...``).

A separate process, not a thread of the harness, so it can be put in the shared memory cgroup,
its CPU time is exact (wait4), and a stall in write() stalls only the writer. It times every
write() because a writer that fills the page cache looks fast while it stores up a stall: the
latency record is how the freeze shows.

Prints one JSON summary line on stdout; with ``--log`` it also appends a JSON line every 250 ms
(bytes so far, writes, worst write() in the interval) and one per fsync.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import struct
import sys
import time
from array import array
from pathlib import Path
from typing import IO

from bench.stats import percentile


class IntervalLog:
    """Append-only JSON lines, one per interval, so the harness can plot the writer's view."""

    def __init__(self, path: str | None, interval: float = 0.25) -> None:
        self.f: IO[str] | None = open(path, "a") if path else None  # noqa: SIM115
        self.interval = interval
        self.next = time.monotonic() + interval
        self.writes = 0
        self.worst = 0.0
        self.total = 0.0

    def add(self, now: float, latency: float, done: int) -> None:
        self.writes += 1
        self.total += latency
        self.worst = max(self.worst, latency)
        if now >= self.next:
            self.flush(now, done)

    def flush(self, now: float, done: int) -> None:
        if self.f is not None and self.writes:
            line = {"t": now, "bytes": done, "writes": self.writes, "max": self.worst}
            line["sum"] = self.total
            self.f.write(json.dumps(line) + "\n")
            self.f.flush()
        self.writes, self.worst, self.total = 0, 0.0, 0.0
        self.next = now + self.interval

    def event(self, **fields: float) -> None:
        if self.f is not None:
            self.f.write(json.dumps(fields) + "\n")
            self.f.flush()

    def close(self, done: int) -> None:
        self.flush(time.monotonic(), done)
        if self.f is not None:
            self.f.close()


def stream(args: argparse.Namespace) -> dict[str, object]:
    """Write one file with fixed-size buffered write() calls, like a streaming backup."""
    block = args.block
    buf = bytearray(random.Random(args.seed).randbytes(block))
    if args.start_at:
        # Launched early (the harness's head start): the clock starts at this monotonic time.
        time.sleep(max(0.0, args.start_at - time.monotonic()))
    lat = array("d")
    ilog = IntervalLog(args.log)
    fsyncs: list[float] = []
    deadline = time.monotonic() + args.duration if args.duration > 0 else float("inf")
    t_start = time.monotonic()
    fd = os.open(args.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    done = 0
    since_fsync = 0
    index = 0
    try:
        while done < args.size:
            n = min(block, args.size - done)
            struct.pack_into("<Q", buf, 0, index)
            t0 = time.monotonic()
            written = os.write(fd, buf if n == block else buf[:n])
            t1 = time.monotonic()
            lat.append(t1 - t0)
            done += written
            since_fsync += written
            index += 1
            ilog.add(t1, t1 - t0, done)
            if args.fsync_every and since_fsync >= args.fsync_every:
                os.fsync(fd)
                t2 = time.monotonic()
                fsyncs.append(t2 - t1)
                ilog.event(t=t2, fsync=t2 - t1, bytes=done)
                since_fsync = 0
            if t1 >= deadline:
                break
            if args.rate > 0:  # a backup that reads its source at a given speed
                ahead = t_start + done / args.rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
        if args.final_fsync:
            t1 = time.monotonic()
            os.fsync(fd)
            fsyncs.append(time.monotonic() - t1)
        t_close = time.monotonic()
    finally:
        os.close(fd)
    t_end = time.monotonic()
    ilog.close(done)
    lat_sorted = sorted(lat)
    result: dict[str, object] = {
        "bytes": done,
        "writes": len(lat),
        "seconds": t_end - t_start,
        "close_seconds": t_end - t_close,
        "write_p50": percentile(lat_sorted, 50),
        "write_p99": percentile(lat_sorted, 99),
        "write_max": lat_sorted[-1] if lat_sorted else float("nan"),
        "writes_over_1s": sum(1 for v in lat if v > 1.0),
        "fsyncs": len(fsyncs),
        "fsync_seconds": sum(fsyncs),
        "fsync_max": max(fsyncs, default=0.0),
    }
    if args.verify:
        result["verified"] = verify(args.path, block, done, args.seed)
    return result


def verify(path: str, block: int, size: int, seed: int) -> bool:
    """Read the file back and compare every block (catches lost or misplaced writes)."""
    expected = bytearray(random.Random(seed).randbytes(block))
    if os.stat(path).st_size != size:
        return False
    with open(path, "rb") as f:
        index = 0
        while True:
            data = f.read(block)
            if not data:
                return index * block >= size
            struct.pack_into("<Q", expected, 0, index)
            if data != expected[: len(data)]:
                return False
            index += 1


def files(args: argparse.Namespace) -> dict[str, object]:
    """mkdir the directories, then create + write + close N small files spread over them (a
    backup restoring a tree dir by dir). Timed from the first mkdir to the last close."""
    root = Path(args.dir)
    payload = b"x" * args.file_size
    dirs = max(1, args.dirs)
    t0 = time.monotonic()
    root.mkdir(parents=True, exist_ok=True)
    for d in range(dirs):
        (root / f"d{d:03d}").mkdir()
    for i in range(args.count):
        where = root / f"d{i * dirs // args.count:03d}"
        fd = os.open(where / f"f{i:06d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        if payload:
            os.write(fd, payload)
        os.close(fd)
    seconds = time.monotonic() - t0
    return {"bytes": args.count * args.file_size, "files": args.count, "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.writer")
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("stream", help="one file, fixed-size buffered writes")
    s.add_argument("--path", required=True)
    s.add_argument("--size", type=int, required=True)
    s.add_argument("--block", type=int, default=1 << 20)
    s.add_argument("--fsync-every", type=int, default=0)
    s.add_argument("--final-fsync", action="store_true")
    s.add_argument("--duration", type=float, default=0.0)
    s.add_argument("--rate", type=float, default=0.0, help="bytes/s to keep to (0: flat out)")
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--start-at", type=float, default=0.0, help="time.monotonic() to start at")
    s.add_argument("--log")
    s.add_argument("--verify", action="store_true")
    f = sub.add_parser("files", help="create many small files")
    f.add_argument("--dir", required=True)
    f.add_argument("--count", type=int, required=True)
    f.add_argument("--file-size", type=int, default=4096)
    f.add_argument("--dirs", type=int, default=100)
    args = parser.parse_args(argv)
    # The harness stops us with SIGTERM on abort: die quietly, no traceback in its logs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result = stream(args) if args.cmd == "stream" else files(args)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
