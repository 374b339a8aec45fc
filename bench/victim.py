"""The neighbour: a database-like process on the host's own disk, sharing the backup's memory
cgroup.

``fdatasync`` mode: 4 KiB pwrite + fdatasync at random offsets of a preallocated file, paced at a
fixed interval (a commit log). ``buffered`` mode: the same pwrite without fdatasync, which stalls
only when the kernel throttles dirtying (balance_dirty_pages) or reclaim waits on writeback.

``db`` mode behaves like a database, which allocates and reads all the time, so the kernel
reclaims inside its memory cgroup all the time. First it fills the cgroup with page cache (it
reads ``--fill``, a file about the size of the cgroup's limit: a host's memory is normally full of
cache), then it loops over transactions, back to back: allocate and touch ``--alloc`` bytes of
anonymous memory (a sort or hash buffer), read ``--reads`` random 8 KiB pages of a working set
larger than what the cgroup has free, write 4 KiB to its log and fdatasync it. Each transaction is
one operation in the log; its latency is what a client of the database waits.

Each operation's start time (CLOCK_MONOTONIC, shared with the harness) and latency go to a CSV
on tmpfs. The pacing never catches up after a stall: a stalled database does not get its missed
commits back either, and a burst after the stall would only measure the burst.
"""

from __future__ import annotations

import argparse
import contextlib
import mmap
import os
import random
import signal
import sys
import time

BLOCK = 4096
PAGE = 8192  # a database page
PAYLOAD_CHUNK = 1 << 20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.victim")
    parser.add_argument("--path", required=True, help="file on the disk the neighbour owns")
    parser.add_argument("--mode", choices=("fdatasync", "buffered", "db"), default="fdatasync")
    parser.add_argument("--interval", type=float, default=0.010, help="pacing (0: back to back)")
    parser.add_argument("--file-size", type=int, default=16 << 20)
    parser.add_argument("--working-set", type=int, default=256 << 20, help="db mode: data file")
    parser.add_argument("--fill", help="db mode: file read first, to fill the cgroup's cache")
    parser.add_argument("--reads", type=int, default=16, help="db mode: page reads per operation")
    parser.add_argument("--alloc", type=int, default=1 << 20, help="db mode: bytes allocated")
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
    data_path = args.path + ".data"
    data_fd = -1
    with open(args.log, "w", buffering=1 << 16) as out:
        try:
            # Preallocate and make it durable first: the measured loop overwrites in place,
            # like a database page file, so it never allocates blocks.
            preallocate(fd, blocks * BLOCK, payload)
            db = args.mode == "db"
            if db:
                data_fd = os.open(data_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
                preallocate(data_fd, args.working_set, payload)
                # Cold: what stays cached is what the loop keeps reading, not what was written.
                os.posix_fadvise(data_fd, 0, 0, os.POSIX_FADV_DONTNEED)
                if args.fill:
                    fill_cache(args.fill)
            out.write(f"# ready {time.monotonic():.6f}\n")
            out.flush()
            sync = args.mode != "buffered"
            pages = max(1, args.working_set // PAGE)
            next_at = time.monotonic()
            last_flush = next_at
            while not stop:
                t0 = time.monotonic()
                if db:
                    transaction_work(data_fd, pages, args.reads, args.alloc, rng)
                os.pwrite(fd, payload, rng.randrange(blocks) * BLOCK)
                if sync:
                    os.fdatasync(fd)
                t1 = time.monotonic()
                out.write(f"{t0:.6f},{t1 - t0:.6f}\n")
                if t1 - last_flush > 0.5:
                    out.flush()
                    last_flush = t1
                if args.interval <= 0:
                    continue
                next_at += args.interval
                if next_at < t1:
                    next_at = t1  # no catch-up burst after a stall
                else:
                    time.sleep(next_at - t1)
        finally:
            os.close(fd)
            if data_fd >= 0:
                os.close(data_fd)
            out.flush()
            for path in (args.path, data_path):
                with contextlib.suppress(OSError):
                    os.unlink(path)
    return 0


def preallocate(fd: int, size: int, payload: bytes) -> None:
    chunk = payload * (PAYLOAD_CHUNK // len(payload))
    for off in range(0, size, len(chunk)):
        os.pwrite(fd, chunk[: min(len(chunk), size - off)], off)
    os.fsync(fd)


def fill_cache(path: str) -> None:
    """Read *path* into this cgroup's page cache (dropped first: cached pages stay charged to
    whichever cgroup read them before, an earlier arm's)."""
    with open(path, "rb", buffering=0) as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        while f.read(PAYLOAD_CHUNK):
            pass


def transaction_work(data_fd: int, pages: int, reads: int, alloc: int, rng: random.Random) -> None:
    """The part of a transaction that needs memory: a fresh buffer, then page reads."""
    if alloc > 0:
        buf = mmap.mmap(-1, alloc)
        for off in range(0, alloc, BLOCK):  # fault every page in: that is the allocation
            buf[off] = 1
        buf.close()
    for _ in range(reads):
        os.pread(data_fd, PAGE, rng.randrange(pages) * PAGE)


if __name__ == "__main__":
    sys.exit(main())
