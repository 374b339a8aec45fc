"""What ``python -m bench.nfslab run SUITE`` runs: per profile, the commands for the guest.

Commands run from the repository's root inside the VM, with the repository's .venv python;
FTLAB_NFS, FTLAB_NFS2, FTLAB_PROFILE and FTLAB_OUT tell them where the lab's mounts are
(guest.py). A suite runs one VM per profile, one after the other.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.nfslab.vm import Command

PYTEST = [".venv/bin/python", "-m", "pytest", "-p", "no:cacheprovider", "-q", "-ra"]


@dataclass(frozen=True)
class Suite:
    description: str
    profiles: tuple[str, ...]
    commands: tuple[Command, ...]
    #: Results are worth keeping (a bench): written under bench/results/ by default.
    bench: bool = False


def _pytest(name: str, *args: str, timeout: float = 1800) -> Command:
    return Command(name, [*PYTEST, *args, f"--junitxml=/run/ftlab/job/out/{name}.xml"], {}, timeout)


SUITES: dict[str, Suite] = {
    "smoke": Suite(
        "CI: mount NFSv4.1 through fusethrottle, write and verify a tree, rm -rf it, no .nfs* "
        "left, unmount exit 0",
        ("plain",),
        (_pytest("smoke", "tests/nfs", "-m", "smoke", timeout=900),),
    ),
    "correctness": Suite(
        "items 1-6 of issue 31: POSIX tools, names the daemon holds, another client, "
        "credentials on squashing exports, a server that stops, a full server",
        ("plain3", "plain"),
        (_pytest("correctness", "tests/nfs", timeout=3600),),
    ),
    "wire": Suite(
        "the NFS RPCs per file and the time of each workload, through the mount and on NFS "
        "directly (and the meter's counts beside the client's own)",
        ("lan", "efs"),
        (Command("wire", [".venv/bin/python", "-m", "bench.nfslab.wire"], {}, 3600),),
        bench=True,
    ),
}
