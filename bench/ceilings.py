"""Does a ceiling hold the rate it is given? With the writeback cache and without, on tmpfs.

A mount with ``metered_limit=RATE`` (``meter=none``: metered bytes are the bytes written) takes
a backup of SIZE in 1 MiB writes, fsynced; the rate it got is SIZE less the ceiling's burst
(a quarter of a second of it) over the seconds it took. Each arm's rate over the limit should be
close to 1.0: above it the ceiling leaks, well below it the ceiling costs throughput. The arms
alternate within each repeat, as the main harness does.

    python -m bench.ceilings --out DIR [--rate 64M] [--size 512M] [--repeats 3]

Writes DIR/ceilings.json and DIR/ceilings.md. Needs root (FUSE mounts, allow_other not used).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fusethrottle.service.options import parse_size

#: Arms: name -> the -o options they add (the writeback cache changes who waits for the ceiling:
#: the kernel's write-back or the writer's own write()).
ARMS = {"cache": "writeback_cache=yes", "nocache": "writeback_cache=no"}
BURST_SECONDS = 0.25  # the engine's bucket (engine/src/ceilings.h)


def expected_seconds(size: int, rate: float) -> float:
    """How long SIZE takes at RATE once the burst is spent (pure)."""
    return max(size - rate * BURST_SECONDS, 0.0) / rate


def one_backup(arm: str, rate: int, size: int, base: Path) -> float:
    """Seconds a fsynced backup of *size* took through a fresh mount of *arm*."""
    work = Path(tempfile.mkdtemp(dir=base))
    source, mnt = work / "src", work / "mnt"
    source.mkdir()
    mnt.mkdir()
    fusethrottle = str(Path(sys.executable).with_name("fusethrottle"))
    options = f"{ARMS[arm]},meter=none,metered_limit={rate}"
    daemon = subprocess.Popen(
        [fusethrottle, str(source), str(mnt), "-f", "-o", options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            if os.path.ismount(mnt):
                break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"{arm}: the mount did not come up")
        start = time.monotonic()
        subprocess.run(
            [
                "dd",
                "if=/dev/zero",
                f"of={mnt}/backup",
                "bs=1M",
                f"count={size >> 20}",
                "conv=fsync",
            ],
            check=True,
            capture_output=True,
        )
        return time.monotonic() - start
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], check=False, capture_output=True)
        daemon.wait(60)
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rate", default="64M", help="metered_limit= (bytes/s)")
    parser.add_argument("--size", default="512M")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--base", type=Path, default=Path("/dev/shm"))
    args = parser.parse_args(argv)
    rate, size = parse_size(args.rate), parse_size(args.size)
    args.out.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, object]] = []
    for repeat in range(args.repeats):
        order = list(ARMS) if repeat % 2 == 0 else list(ARMS)[::-1]
        for arm in order:
            seconds = one_backup(arm, rate, size, args.base)
            got = max(size - rate * BURST_SECONDS, 0) / seconds
            runs.append({"arm": arm, "repeat": repeat, "seconds": seconds, "rate": got})
            print(f"{arm:>7} repeat {repeat}: {seconds:.2f} s, {got / rate:.3f} of the limit")
    expected = expected_seconds(size, rate)
    lines = [
        f"# metered_limit={args.rate}, meter=none, {args.size} of 1 MiB writes, fsynced, tmpfs",
        "",
        f"Expected at the limit: {expected:.2f} s. Rate over the limit, each repeat:",
        "",
        "| arm | rate / limit (each repeat) | min | max |",
        "|---|---|---|---|",
    ]
    for arm in ARMS:
        ratios = [float(r["rate"]) / rate for r in runs if r["arm"] == arm]  # type: ignore[arg-type]
        shown = ", ".join(f"{x:.3f}" for x in ratios)
        lines.append(f"| {ARMS[arm]} | {shown} | {min(ratios):.3f} | {max(ratios):.3f} |")
    (args.out / "ceilings.md").write_text("\n".join(lines) + "\n")
    (args.out / "ceilings.json").write_text(
        json.dumps(
            {"rate": rate, "size": size, "expected_seconds": expected, "runs": runs}, indent=1
        )
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
