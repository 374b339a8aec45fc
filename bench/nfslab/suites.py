"""What ``python -m bench.nfslab run SUITE`` runs: per profile, the commands for the guest.

Commands run from the repository's root inside the VM, with the repository's .venv python;
FTLAB_NFS, FTLAB_NFS2, FTLAB_PROFILE and FTLAB_OUT tell them where the lab's mounts are
(guest.py). A suite runs one VM per profile, one after the other.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.nfslab.vm import Command

PYTEST = [
    ".venv/bin/python", "-m", "pytest", "-p", "no:cacheprovider", "-q", "-ra",
    "-o", "junit_logging=system-out",
]  # fmt: skip


@dataclass(frozen=True)
class Suite:
    description: str
    profiles: tuple[str, ...]
    commands: tuple[Command, ...]
    #: Results are worth keeping (a bench): written under bench/results/ by default.
    bench: bool = False
    #: ``one``: server and clients in one VM; ``two``: the server in a VM of its own
    #: (vm.run_pair), for tests where the client's memory pressure must not reach the server.
    layout: str = "one"
    #: ``lab``: the lab's own init is PID 1; ``systemd``: systemd is, on cgroup v2 (vm.INITS).
    init: str = "lab"


def _pytest(
    name: str, *args: str, timeout: float = 1800, env: dict[str, str] | None = None
) -> Command:
    junit = f"--junitxml=/run/ftlab/job/out/{name}.xml"
    return Command(name, [*PYTEST, *args, junit], dict(env or {}), timeout)


# Issue item 7: the neighbour beside a backup onto the real Linux NFS client, the target
# degrading 20 -> 1 -> 20 MiB/s (tc on the client's egress), the neighbour and the backup in one
# 512 MiB memory cgroup of a 4 GiB client VM, the server in a VM of its own. The steps are
# shorter than db-degrade's (TCG runs the guest ~10x slower than the host). Under TCG the
# writer's interpreter takes 4-20 s to start, so it is launched 15 s ahead and waits for the
# clock; the daemon's metrics are not scraped: one scrape cost the daemon ~0.4 CPU-s there, and
# every 250 ms that would be more than the VM's two vCPUs.
NEIGHBOUR_SCHEDULE = "20M:8s,1M:16s,20M:8s"
NEIGHBOUR_ARMS = "idle,direct,direct-bdi,ft-adaptive,ft-adaptive:memory_cgroup=off"


# Issue 36: the container case, the link dipping to a quarter of a MiB/s (the deeper the dip,
# the longer a shared cgroup's reclaim waited for the backup's pages).
CONTAINER_SCHEDULE = "20M:8s,256K:16s,20M:8s"


# Issue 54 on cgroup v2: PostgreSQL on the client VM's own disk, in a cgroup of its own that the
# guarded arm's guard= names, beside pg_basebackup onto the lab's NFS at full speed (the plain
# profile: no shaping, so the window never binds). A smaller database than on the host (TCG runs
# the guest ~10x slower); the ratios are against the idle arm of each repeat. Under TCG the
# backup reaches only ~6-10 MB/s onto the lab's NFS, so the daemon's default floor (guard_min
# 4 MiB/s) left the guard almost nothing to take (2026-12-02-nfslab-pgguard): the floor is
# scaled down with the VM's speed, as a user sets it for a slow host.
PGGUARD = Command(
    "pgguard",
    [
        ".venv/bin/python", "-m", "bench.pgguard", "--out", "/run/ftlab/job/out/pgguard",
        "--work", "/var/lib/victim/pgguard", "--target", "/mnt/nfs/rw/pgguard", "--guard", "db",
        "--repeats", "5", "--seconds", "30", "--scale", "10", "--db-memory", str(512 << 20),
        "--guard-min", "1M", "--arms", "idle,direct,ft,ft-guard",
    ],
    {},
    5400,
)  # fmt: skip


def _neighbour(
    victim: str, repeats: int = 5, schedule: str = NEIGHBOUR_SCHEDULE, name: str = ""
) -> Command:
    """``bench run`` in the client VM for one victim; its run directory is out/<name or
    victim>."""
    name = name or victim
    bench = (
        ".venv/bin/python -m bench run --preset db-degrade --target /mnt/nfs/rw "
        '--throttle "tc:$FTLAB_NET_DEV" --workdir "$FTLAB_VICTIM_DIR" '
        f"--schedule {schedule} --arms {NEIGHBOUR_ARMS} --victim {victim} "
        f"--cgroup-mem 512M --idle 32 --repeats {repeats} --no-plots --no-metrics "
        "--writer-head-start 15 --mount-timeout 120 "
        f'--out "$FTLAB_OUT/{name}"'
    )
    return Command(name, ["bash", "-c", bench], {}, 3400)


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
    "neighbour": Suite(
        "issue item 7: the fdatasync and the db neighbour beside a backup onto NFS degrading "
        f"{NEIGHBOUR_SCHEDULE}, arms {NEIGHBOUR_ARMS}, 5 repeats; the server in a VM of its own",
        ("slow",),
        (_neighbour("fdatasync"), _neighbour("db")),
        bench=True,
        layout="two",
    ),
    "neighbour-container": Suite(
        "issue 36: the db neighbour beside a backup onto NFS whose link dips to 0.25 MiB/s "
        f"({CONTAINER_SCHEDULE}), arms {NEIGHBOUR_ARMS}, 5 repeats; the server in a VM of its own",
        ("slow",),
        (_neighbour("db", schedule=CONTAINER_SCHEDULE, name="db-256K"),),
        bench=True,
        layout="two",
    ),
    "systemd": Suite(
        "issue 54 under a real systemd (PID 1, cgroup v2): systemctl reload of "
        "fusethrottle@.service during a backup, and the pressure guard naming a unit's cgroup",
        ("plain",),
        (_pytest("systemd", "tests/nfs/test_systemd.py", timeout=1500),),
        init="systemd",
    ),
    "pgguard": Suite(
        "issue 54 on cgroup v2: PostgreSQL under pgbench beside pg_basebackup onto NFS at full "
        "speed, guard= naming the database's cgroup, 5 repeats; the server in a VM of its own",
        ("plain",),
        (PGGUARD,),
        bench=True,
        layout="two",
    ),
    "neighbour-smoke": Suite(
        "the neighbour suite at 1 repeat (a check that it runs, not numbers)",
        ("slow",),
        (_neighbour("fdatasync", 1), _neighbour("db", 1)),
        layout="two",
    ),
}
