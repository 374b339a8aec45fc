"""``python -m bench.nfslab build|run|exec``: the NFS lab's two commands (and a third for
trying things by hand).

  build            download Debian's 6.12 kernel, make the initramfs, detect KVM or TCG (cached)
  run SUITE        boot one VM per profile of SUITE, run it inside, copy the results out
  exec -- CMD...   boot one VM (--profile) and run CMD in it from the repository's root

A user mistake (unknown suite, a missing package) is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
from pathlib import Path

from bench.nfslab import image, vm
from bench.nfslab.probe import cpu_probe_seconds
from bench.nfslab.profiles import PROFILES
from bench.nfslab.suites import SUITES

log = logging.getLogger("bench.nfslab")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.nfslab", description=__doc__.split("\n")[0])
    p.add_argument("--lab-dir", type=Path, default=image.DEFAULT_LAB_DIR)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="make (or check) the cached boot files")
    r = sub.add_parser("run", help="run a suite: " + ", ".join(SUITES))
    r.add_argument("suite", choices=sorted(SUITES))
    r.add_argument("--profile", action="append", help="only these of the suite's profiles")
    r.add_argument("--out", type=Path, help="where results go")
    r.add_argument("--command", action="append", help="only these of the suite's commands")
    r.add_argument("--cpus", type=int, default=2)
    r.add_argument("--memory", type=int, default=4096, help="MiB")
    r.add_argument("--timeout", type=float, default=3600, help="seconds per VM")
    e = sub.add_parser("exec", help="run one command in a lab VM")
    e.add_argument("--profile", default="plain", choices=sorted(PROFILES))
    e.add_argument("--out", type=Path, default=Path("/tmp/ftlab-exec"))
    e.add_argument("--cpus", type=int, default=2)
    e.add_argument("--memory", type=int, default=4096, help="MiB")
    e.add_argument("--timeout", type=float, default=1800)
    e.add_argument(
        "--layout", choices=("one", "two"), default="one", help="two: the server in a VM of its own"
    )
    e.add_argument(
        "--init",
        choices=sorted(vm.INITS),
        default="lab",
        help="systemd: boot systemd as PID 1 (cgroup v2) and run CMD as its one job service",
    )
    e.add_argument("argv", nargs=argparse.REMAINDER)
    return p


def _boot(lab_dir: Path) -> tuple[image.Boot, str]:
    boot = image.cached_boot(lab_dir) or image.build(lab_dir)
    return boot, vm.detect_accel(boot, lab_dir)


def _report(name: str, job: vm.JobResult, out: Path) -> bool:
    ok = job.exit == 0
    where = f"{out}"
    if job.exit is None:
        print(f"{name}: the guest never reported (see {out}/console.log)", file=sys.stderr)
        print("\n".join(job.console.splitlines()[-15:]), file=sys.stderr)
        return False
    for command in job.result.get("commands", []):
        state = "ok" if command["exit"] == 0 else f"FAILED (exit {command['exit']})"
        print(f"{name}: {command['name']} {state} in {command['seconds']} s ({where})")
        log_file = out / f"{command['name']}.log"
        if command["exit"] != 0 and log_file.exists():
            lines = log_file.read_text(errors="replace").splitlines()[-60:]
            print("\n".join(lines), file=sys.stderr)
    if not job.result:
        print(f"{name}: the guest failed before its commands:", file=sys.stderr)
        print("\n".join(job.guest_log.splitlines()[-15:]), file=sys.stderr)
    return ok


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if os.geteuid() != 0:
        print("python -m bench.nfslab: needs root (qemu, mkfs, the lab's cache)", file=sys.stderr)
        return 2
    try:
        if args.command == "build":
            boot, accel = _boot(args.lab_dir)
            print(f"lab ready: kernel {boot.release}, {accel}, in {args.lab_dir}")
            return 0
        boot, accel = _boot(args.lab_dir)
        if args.command == "exec":
            if not args.argv or args.argv[0] != "--" or len(args.argv) < 2:
                usage = "usage: python -m bench.nfslab exec [--profile P] -- CMD ..."
                print(usage, file=sys.stderr)
                return 2
            machine = vm.Machine(accel, args.cpus, args.memory)
            job = vm.run_job(
                boot, machine, args.profile, [vm.Command("exec", args.argv[1:], {}, args.timeout)],
                args.out, lab_dir=args.lab_dir, timeout=args.timeout + 120, layout=args.layout,
                init=args.init,
            )  # fmt: skip
            sys.stdout.write((args.out / "exec.log").read_text(errors="replace"))
            return 0 if _report("exec", job, args.out) else 1
        suite = SUITES[args.suite]
        profiles = args.profile or list(suite.profiles)
        unknown = [p for p in profiles if p not in PROFILES]
        if unknown:
            print(f"unknown profile: {', '.join(unknown)}", file=sys.stderr)
            return 2
        stamp = datetime.date.today().isoformat()
        default = (
            vm.REPO / "bench" / "results" / f"{stamp}-nfslab-{args.suite}"
            if suite.bench
            else Path("/tmp") / f"ftlab-{args.suite}"
        )
        out = args.out or default
        commands = [c for c in suite.commands if not args.command or c.name in args.command]
        if not commands:
            known = ", ".join(c.name for c in suite.commands)
            print(
                f"no such command in {args.suite}: {args.command} (known: {known})", file=sys.stderr
            )
            return 2
        machine = vm.Machine(accel, args.cpus, args.memory)
        host_probe = cpu_probe_seconds()
        ok = True
        summary = {
            "suite": args.suite,
            "accel": accel,
            "layout": suite.layout,
            "host_cpu_probe_seconds": host_probe,
        }
        for profile in profiles:
            job = vm.run_job(
                boot, machine, profile, commands, out / profile,
                lab_dir=args.lab_dir, timeout=args.timeout, layout=suite.layout,
                init=suite.init,
            )  # fmt: skip
            ok = _report(profile, job, out / profile) and ok
            guest_probe = job.result.get("cpu_probe_seconds")
            summary[profile] = {
                "exit": job.exit,
                "vm_seconds": round(job.seconds, 1),
                "guest_cpu_probe_seconds": guest_probe,
                "slowdown": round(guest_probe / host_probe, 1) if guest_probe else None,
            }
        (out / "lab.json").write_text(json.dumps(summary, indent=2) + "\n")
        slow = [s["slowdown"] for k, s in summary.items() if isinstance(s, dict) and s["slowdown"]]
        if slow:
            print(f"the guest ({accel}) ran the CPU probe {max(slow)}x slower than this host")
        return 0 if ok else 1
    except image.LabError as err:
        print(f"python -m bench.nfslab: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
