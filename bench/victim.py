"""The neighbour: a database-like process doing small writes on the host's own disk.

``fdatasync`` mode: 4 KiB pwrite + fdatasync at random offsets of a preallocated file, paced at a
fixed interval (a commit log). ``buffered`` mode: the same pwrite without fdatasync, which stalls
only when the kernel throttles dirtying (balance_dirty_pages) or reclaim waits on writeback.

Each operation's start time (CLOCK_MONOTONIC, shared with the harness) and latency go to a CSV
on tmpfs. The pacing never catches up after a stall: a stalled database does not get its missed
commits back either, and a burst after the stall would only measure the burst.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import sys
import time

BLOCK = 4096


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.victim")
    parser.add_argument("--path", required=True, help="file on the disk the neighbour owns")
    parser.add_argument("--mode", choices=("fdatasync", "buffered"), default="fdatasync")
    parser.add_argument("--interval", type=float, default=0.010)
    parser.add_argument("--file-size", type=int, default=16 << 20)
    parser.add_argument("--log", required=True)
    args = parser.parse_args(argv)

    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)

    rng = random.Random(4)
    payload = rng.randbytes(BLOCK)
    blocks = max(1, args.file_size // BLOCK)
    fd = os.open(args.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(args.log, "w", buffering=1 << 16) as out:
        try:
            # Preallocate and make it durable first: the measured loop overwrites in place,
            # like a database page file, so it never allocates blocks.
            chunk = payload * 256
            for off in range(0, blocks * BLOCK, len(chunk)):
                os.pwrite(fd, chunk[: min(len(chunk), blocks * BLOCK - off)], off)
            os.fsync(fd)
            out.write(f"# ready {time.monotonic():.6f}\n")
            out.flush()
            sync = args.mode == "fdatasync"
            next_at = time.monotonic()
            last_flush = next_at
            while not stop:
                t0 = time.monotonic()
                os.pwrite(fd, payload, rng.randrange(blocks) * BLOCK)
                if sync:
                    os.fdatasync(fd)
                t1 = time.monotonic()
                out.write(f"{t0:.6f},{t1 - t0:.6f}\n")
                if t1 - last_flush > 0.5:
                    out.flush()
                    last_flush = t1
                next_at += args.interval
                if next_at < t1:
                    next_at = t1  # no catch-up burst after a stall
                else:
                    time.sleep(next_at - t1)
        finally:
            os.close(fd)
            out.flush()
            with contextlib.suppress(OSError):
                os.unlink(args.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
