"""pjdfstest, side by side: the target directly and through the engine.

pjdfstest (github.com/pjd/pjdfstest) checks what the file system calls promise: modes,
ownership and its changes by other users, links, renames, times, name and path limits, errors.
A passthrough must not fail a test the target itself passes. So it runs, in one go, in a fresh
directory of the target (ext4 on a loop device, as an NFS server's export would be) and through
a fresh fusethrottle mount over another directory of it per arm, and the report lists every
failed test, and those that fail through a mount but not on the target directly.

Needs root, prove (perl) and a built checkout (``autoreconf -ifs && ./configure && make
pjdfstest`` in it). Rerun:

    python -m bench.pjdfstest --pjdfstest ~/pjdfstest --out bench/results/DATE-pjdfstest
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from bench.suite_arms import mount_arm, pick_arms
from bench.system import ArmSkipped, Teardown, head_commit, scratch_ext4

log = logging.getLogger(__name__)

#: Arms: "direct" (the target itself) or fusethrottle's -o options. allow_other: most tests
#: act as another user too (pjdfstest -u 65534), whom a FUSE mount refuses without it.
ARMS = {
    "direct": None,
    "native": "allow_other",
}
ARM_TIMEOUT = 3600.0
IMAGE_SIZE = "2G"

_FILE = re.compile(r"^(\S+\.t)\s+\(Wstat: (\d+)[^)]*\)")
_FAILED = re.compile(r"^\s+Failed tests?:\s+(.*)$")
_MORE = re.compile(r"^\s+([\d][\d, -]*)$")  # a long list goes on over indented lines
_TOTALS = re.compile(r"^Files=(\d+), Tests=(\d+)")


def numbers(listed: str) -> list[int]:
    """prove's "1, 3-5, 9" as [1, 3, 4, 5, 9]."""
    out: list[int] = []
    for part in listed.replace(" ", "").split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        out.extend(range(int(low), int(high or low) + 1))
    return out


def parse_prove(output: str, tests_dir: str) -> dict[str, object]:
    """Totals and the failed tests per test file (relative to *tests_dir*) from prove's
    summary report."""
    failed: dict[str, list[int]] = {}
    crashed: list[str] = []
    current: str | None = None
    files = tests = 0
    in_report = listing = False
    for line in output.splitlines():
        if line.startswith("Test Summary Report"):
            in_report = True
            continue
        totals = _TOTALS.match(line)
        if totals:
            files, tests = int(totals.group(1)), int(totals.group(2))
            continue
        if not in_report:
            continue
        head = _FILE.match(line)
        if head:
            current = os.path.relpath(head.group(1), tests_dir)
            failed.setdefault(current, [])
            if head.group(2) != "0":
                crashed.append(current)
            listing = False
            continue
        listed = _FAILED.match(line)
        more = _MORE.match(line)
        if listed and current is not None:
            failed[current].extend(numbers(listed.group(1)))
            listing = True
        elif more and listing and current is not None:
            failed[current].extend(numbers(more.group(1)))
        else:
            listing = False  # "TODO passed:" and the like are not failures
    return {
        "files": files,
        "tests": tests,
        "failed": {k: v for k, v in sorted(failed.items()) if v},
        "bad_exit": sorted(crashed),
    }


def run_arm(pjdfstest: Path, cwd: Path) -> tuple[dict[str, object], str, float]:
    tests = str(pjdfstest / "tests")
    t0 = time.monotonic()
    proc = subprocess.run(
        ["prove", "-r", tests],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=ARM_TIMEOUT,
    )
    took = time.monotonic() - t0
    output = proc.stdout + proc.stderr
    return parse_prove(output, tests), output, took


def worse_than_direct(arm: dict, direct: dict) -> dict[str, list[int]]:
    """The tests that fail in *arm* but pass on the target directly."""
    base: dict[str, list[int]] = direct["failed"]  # type: ignore[assignment]
    out = {}
    for name, failed in arm["failed"].items():  # type: ignore[union-attr]
        extra = sorted(set(failed) - set(base.get(name, [])))
        if extra:
            out[name] = extra
    return out


def markdown(results: dict[str, dict], commit: str) -> str:
    lines = [
        "# pjdfstest: the target directly and through each data plane",
        "",
        f"Tree {commit}; target: ext4 on a loop device; `prove -r tests/` of pjdfstest as root.",
        "",
        "| arm | files | tests | failed tests | failed files | not failed directly | time |",
        "|---|---|---|---|---|---|---|",
    ]
    direct = results.get("direct")
    for arm, r in results.items():
        if "skipped" in r:
            lines.append(f"| {arm} | skipped: {r['skipped']} | | | | | |")
            continue
        failed = r["failed"]
        count = sum(len(v) for v in failed.values())
        worse = worse_than_direct(r, direct) if direct and "skipped" not in direct else {}
        worse_count = sum(len(v) for v in worse.values())
        lines.append(
            f"| {arm} | {r['files']} | {r['tests']} | {count} | {len(failed)} | "
            f"{worse_count} | {r['seconds']:.0f} s |"
        )
    for arm, r in results.items():
        if "skipped" in r:
            continue
        lines += ["", f"## {arm}: failed tests (file: test numbers)", ""]
        failed = r["failed"]
        lines += [f"- {name}: {nums}" for name, nums in failed.items()] or ["- none"]
        if direct and arm != "direct" and "skipped" not in direct:
            worse = worse_than_direct(r, direct)
            lines += ["", f"Through the mount but not directly ({arm}):", ""]
            lines += [f"- {name}: {nums}" for name, nums in worse.items()] or ["- none"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pjdfstest", description=__doc__)
    parser.add_argument("--pjdfstest", type=Path, required=True, help="a built checkout")
    parser.add_argument("--arms", default=",".join(ARMS), help="of: " + ", ".join(ARMS))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--fusethrottle", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if os.geteuid() != 0:
        print("bench.pjdfstest: needs root (pjdfstest changes owners; mount)", file=sys.stderr)
        return 2
    if not (args.pjdfstest / "pjdfstest").is_file() or not (args.pjdfstest / "tests").is_dir():
        print(f"bench.pjdfstest: no built pjdfstest in {args.pjdfstest}", file=sys.stderr)
        return 2
    picked = pick_arms("bench.pjdfstest", args.arms, ARMS, args.fusethrottle)
    if picked is None:
        return 2
    arms, exe = picked
    commit = head_commit()
    args.out.mkdir(parents=True, exist_ok=True)
    teardown = Teardown()
    results: dict[str, dict] = {}
    try:
        scratch, target = scratch_ext4("pjdfstest", IMAGE_SIZE, teardown)
        for arm in arms:
            source = target / arm
            source.mkdir()
            log.info("pjdfstest: %s", arm)
            options = ARMS[arm]
            if options is None:
                result, output, took = run_arm(args.pjdfstest, source)
            else:
                try:
                    mnt = mount_arm(exe, arm, options, source, scratch, teardown)
                except ArmSkipped as why:
                    results[arm] = {"skipped": str(why)}
                    continue
                try:
                    result, output, took = run_arm(args.pjdfstest, mnt.mountpoint)
                finally:
                    stopped = mnt.stop(120)
                result["exit_code"] = stopped["exit_code"]
            result["seconds"] = round(took, 1)
            results[arm] = result
            (args.out / f"{arm}.prove.txt").write_text(output)
    finally:
        teardown.undo_all()
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "summary.md").write_text(markdown(results, commit))
    print((args.out / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
