"""fsx and fsstress (xfstests' ltp/), side by side: the target directly and through the mount.

fsx checks every byte: it applies random reads, writes, truncates, mapped reads and writes,
fallocate, hole punching, range zeroing, collapse and insert, copy_file_range, to one file and
to a copy in its own memory, and compares them after each operation; it stops at the first
difference. fsstress runs random operations of every kind (create, link, rename, unlink, mkdir,
xattrs, truncate, fsync, writes and reads) from several processes at once in a tree; it checks
little itself, so each fsstress arm is checked here: the tree through the mount, read before the
unmount, must equal the tree the target holds after it (names, kinds, sizes, modes, owners,
contents, link targets), and the daemon must exit 0.

The target is ext4 on a loop device (as an NFS server's export would be); each arm gets a fresh
directory of it. A data plane must not fail what the target itself passes.

Needs root and built fsx and fsstress. They are not in Debian 12; from an xfstests checkout
(git://git.kernel.org/pub/scm/fs/xfs/xfstests-dev.git), with ``apt-get install xfslibs-dev``,
either its own build (``make``), or the two programs alone: a ``include/config.h`` that defines
``HAVE_XFS_XFS_H``, ``HAVE_SYS_TYPES_H`` and the other ``HAVE_*_H`` of ``src/global.h`` that
glibc has, then in ``ltp/``::

    gcc -O2 -D_GNU_SOURCE -DXFS -DFALLOCATE -DHAVE_COPY_FILE_RANGE -DHAVE_RENAMEAT2 \\
        -include time.h -include getopt.h -I../include -I../src -o fsx fsx.c
    (the same with -o fsstress fsstress.c -lm)

Rerun:

    python -m bench.fsx_fsstress --tools XFSTESTS/ltp --out bench/results/DATE-fsx-fsstress
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

from bench.suite_arms import mount_arm, pick_arms
from bench.system import ArmSkipped, Teardown, head_commit, scratch_ext4

log = logging.getLogger(__name__)

#: Arms: "direct" (the target itself) or fusethrottle's -o options.
ARMS = {
    "direct": None,
    "native": "writeback_cache=yes",
    "native-nocache": "writeback_cache=no",
}
IMAGE_SIZE = "4G"
RUN_TIMEOUT = 1800.0
FSX_SEEDS = (1, 2, 3)
FSSTRESS_SEEDS = (1, 2)


def fsx_runs(ops: int) -> list[tuple[str, list[str]]]:
    """(name, fsx arguments before the file) per run: every seed with mapped I/O, and one
    without it (-R -W: reads and writes through the calls alone)."""
    runs = [(f"seed{s}", ["-N", str(ops), "-S", str(s), "-q"]) for s in FSX_SEEDS]
    runs.append(("seed1-nomap", ["-N", str(ops), "-S", "1", "-q", "-R", "-W"]))
    return runs


def run_tool(argv: list[str], cwd: Path) -> dict[str, object]:
    """Run one fsx or fsstress command: ok (exit 0), how long, and the end of its output."""
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    output = (proc.stdout + proc.stderr).strip().splitlines()
    return {
        "ok": proc.returncode == 0,
        "exit_code": proc.returncode,
        "seconds": round(time.monotonic() - t0, 1),
        "tail": output[-12:],
    }


def run_fsx(fsx: Path, where: Path, name: str, args: list[str]) -> dict[str, object]:
    """One fsx run on a fresh file in *where*."""
    return run_tool([str(fsx), *args, str(where / f"fsx-{name}")], where)


def run_fsstress(fsstress: Path, where: Path, seed: int, ops: int) -> dict[str, object]:
    """fsstress with 4 processes in a fresh tree under *where*."""
    tree = where / f"fsstress-{seed}"
    tree.mkdir()
    argv = [str(fsstress), "-d", str(tree), "-n", str(ops), "-p", "4", "-s", str(seed)]
    return run_tool(argv, where)


def manifest(root: Path) -> dict[str, tuple]:
    """Every entry under *root*: kind, mode, owner, size and a digest of the contents (or the
    link's target); directories' sizes are the file system's own and are left out."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            rel = str(path.relative_to(root))
            kind = stat.S_IFMT(st.st_mode)
            what: str | int = ""
            if stat.S_ISREG(st.st_mode):
                digest = hashlib.sha256()
                with open(path, "rb") as f:
                    while chunk := f.read(1 << 20):
                        digest.update(chunk)
                what = digest.hexdigest()
            elif stat.S_ISLNK(st.st_mode):
                what = os.readlink(path)
            size = 0 if stat.S_ISDIR(st.st_mode) else st.st_size
            mode = stat.S_IMODE(st.st_mode)
            out[rel] = (kind, mode, st.st_uid, st.st_gid, size, what, st.st_nlink)
    return out


def differences(seen: dict[str, tuple], held: dict[str, tuple], limit: int = 20) -> list[str]:
    """What the mount showed that the target does not hold after the unmount (and back)."""
    out = []
    for name in sorted(set(seen) | set(held)):
        if seen.get(name) != held.get(name):
            out.append(f"{name}: mount {seen.get(name)} target {held.get(name)}")
            if len(out) >= limit:
                break
    return out


def run_arm(tools: Path, where: Path, fsx_ops: int, stress_ops: int) -> dict[str, object]:
    result: dict[str, object] = {}
    for name, args in fsx_runs(fsx_ops):
        log.info("  fsx %s", name)
        result[f"fsx {name}"] = run_fsx(tools / "fsx", where, name, args)
    for seed in FSSTRESS_SEEDS:
        log.info("  fsstress seed %d", seed)
        result[f"fsstress seed{seed}"] = run_fsstress(tools / "fsstress", where, seed, stress_ops)
    return result


def markdown(results: dict[str, dict], commit: str, fsx_ops: int, stress_ops: int) -> str:
    lines = [
        "# fsx and fsstress: the target directly and through the mount",
        "",
        f"Tree {commit}; target: ext4 on a loop device; fsx -N {fsx_ops} per run (seeds "
        f"{', '.join(map(str, FSX_SEEDS))}, and seed 1 without mapped I/O); fsstress -n "
        f"{stress_ops} -p 4 per seed ({', '.join(map(str, FSSTRESS_SEEDS))}); through a mount, "
        "the tree read through it before the unmount is compared with the target's after it.",
        "",
        "| arm | run | result | seconds |",
        "|---|---|---|---|",
    ]
    for arm, r in results.items():
        if "skipped" in r:
            lines.append(f"| {arm} | | skipped: {r['skipped']} | |")
            continue
        for run, v in r["runs"].items():
            verdict = "ok" if v["ok"] else f"FAILED (exit {v['exit_code']})"
            lines.append(f"| {arm} | {run} | {verdict} | {v['seconds']} |")
        if "tree_differences" in r:
            diff = r["tree_differences"]
            verdict = "same" if not diff else f"DIFFERENT ({len(diff)} shown)"
            lines.append(f"| {arm} | tree after unmount | {verdict} | |")
            lines.append(f"| {arm} | daemon exit | {r['exit_code']} | |")
    for arm, r in results.items():
        for run, v in r.get("runs", {}).items():
            if not v["ok"]:
                lines += ["", f"## {arm}, {run}: the end of its output", "", "```"]
                lines += v["tail"] + ["```"]
        if r.get("tree_differences"):
            lines += ["", f"## {arm}: the tree", ""] + [f"- {d}" for d in r["tree_differences"]]
    return "\n".join(lines) + "\n"


def passed(results: dict[str, dict]) -> bool:
    """Every run of every arm ok, the trees equal and every daemon exited 0."""
    for r in results.values():
        if "skipped" in r:
            continue
        if not all(v["ok"] for v in r["runs"].values()):
            return False
        if r.get("tree_differences") or r.get("exit_code", 0) != 0:
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fsx_fsstress", description=__doc__)
    parser.add_argument("--tools", type=Path, required=True, help="where fsx and fsstress are")
    parser.add_argument("--arms", default=",".join(ARMS), help="of: " + ", ".join(ARMS))
    parser.add_argument("--fsx-ops", type=int, default=20000)
    parser.add_argument("--fsstress-ops", type=int, default=4000)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--fusethrottle", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if os.geteuid() != 0:
        print("bench.fsx_fsstress: needs root (a loop device, a mount)", file=sys.stderr)
        return 2
    missing = [t for t in ("fsx", "fsstress") if not os.access(args.tools / t, os.X_OK)]
    if missing:
        print(f"bench.fsx_fsstress: no {' or '.join(missing)} in {args.tools}", file=sys.stderr)
        return 2
    picked = pick_arms("bench.fsx_fsstress", args.arms, ARMS, args.fusethrottle)
    if picked is None:
        return 2
    arms, exe = picked
    commit = head_commit()
    args.out.mkdir(parents=True, exist_ok=True)
    teardown = Teardown()
    results: dict[str, dict] = {}
    try:
        scratch, target = scratch_ext4("fsx", IMAGE_SIZE, teardown)
        for arm in arms:
            source = target / arm
            source.mkdir()
            log.info("%s", arm)
            options = ARMS[arm]
            if options is None:
                runs = run_arm(args.tools, source, args.fsx_ops, args.fsstress_ops)
                results[arm] = {"runs": runs}
                shutil.rmtree(source, ignore_errors=True)  # each arm: the same free space
                continue
            try:
                mnt = mount_arm(exe, arm, options, source, scratch, teardown)
            except ArmSkipped as why:
                results[arm] = {"skipped": str(why)}
                continue
            try:
                runs = run_arm(args.tools, mnt.mountpoint, args.fsx_ops, args.fsstress_ops)
                seen = manifest(mnt.mountpoint)
            finally:
                stopped = mnt.stop(300)
                said = scratch / f"{arm}.err"  # the daemon's log (its stderr)
                if said.exists():
                    (args.out / f"{arm}.daemon.log").write_text(said.read_text())
            held = manifest(source)
            results[arm] = {
                "runs": runs,
                "entries": len(seen),
                "tree_differences": differences(seen, held),
                "exit_code": stopped["exit_code"],
                "daemon_said_last": stopped["stderr_tail"],
            }
            shutil.rmtree(source, ignore_errors=True)
    finally:
        teardown.undo_all()
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "summary.md").write_text(markdown(results, commit, args.fsx_ops, args.fsstress_ops))
    print((args.out / "summary.md").read_text())
    return 0 if passed(results) else 1


if __name__ == "__main__":
    sys.exit(main())
