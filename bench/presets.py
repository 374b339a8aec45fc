"""Named experiments, each at three scales: full (the numbers for a note), quick (under five
minutes on two cores) and smoke (seconds, for CI). Command-line flags override any field.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from bench.plan import (
    GiB,
    MiB,
    Plan,
    PlanError,
    parse_arms,
    parse_schedule,
    parse_target,
    parse_workloads,
    schedule_seconds,
    with_schedule,
)

ALL_ARMS = "idle,direct,direct-fsync,direct-bdi,ft-off,ft-static,ft-adaptive"
# Like with like: fusethrottle's defaults on tmpfs serve xattrs (the target has them), as
# passthrough_ll does with -o xattr; with xattrs=off (what the default does on NFS/EFS, which
# have none) it compares with passthrough_ll's upstream default, which serves none. And the
# example with default_permissions: fusethrottle's default has the kernel check permissions,
# which costs a round trip per created or removed file (a directory's attributes, re-read after
# each change in it); the example checks nothing unless asked to.
PASSTHROUGH_ARMS = (
    "direct,ft-adaptive,ft-adaptive:xattrs=off,c-ll,c-ll-wb,c-ll-wb:xattr,"
    "c-ll-wb:xattr:default_permissions"
)
# Issue 15: the kernel's per-device limit, fusethrottle's default (its target I/O in a memory
# cgroup of its own) and the container case (daemon and database in one cgroup, no own cgroup).
DB_ARMS = "idle,direct-bdi,ft-adaptive,ft-adaptive:memory_cgroup=off"
SCALES = ("full", "quick", "smoke")


@dataclass(frozen=True)
class Preset:
    """Per-scale values are dicts keyed by scale name."""

    about: str
    targets: tuple[str, ...]
    schedule: dict[str, str]
    workloads: dict[str, str]
    arms: dict[str, str]
    repeats: dict[str, int]
    victim: str
    cgroup_mem: dict[str, int]
    idle: dict[str, float]
    duration_from_schedule: bool = False
    extra: dict[str, dict[str, object]] = field(default_factory=dict)
    # -o options every ft-* arm gets (--ft-options overrides); "" measures the daemon's defaults.
    ft_options: str = "batch=64M,window=256M"
    # Scrape the daemon's metrics endpoint (it costs the daemon CPU: off where CPU is compared).
    metrics: bool = True
    # The db neighbour's data file as a share of the cgroup (over 1: it reads from disk).
    victim_working_set: float = 0.5


PRESETS: dict[str, Preset] = {
    "victim": Preset(
        about=(
            "issue 3's victim scenario: a 4 KiB write+fdatasync neighbour on the root disk in the "
            "same memory cgroup as a buffered 1 MiB backup onto the 20 MiB/s loop target"
        ),
        targets=("loop",),
        schedule={"full": "20M", "quick": "20M", "smoke": "64M"},
        workloads={"full": "seq:1200M", "quick": "seq:640M", "smoke": "seq:24M,tree:4M"},
        arms={"full": ALL_ARMS, "quick": ALL_ARMS, "smoke": ALL_ARMS},
        repeats={"full": 2, "quick": 1, "smoke": 1},
        victim="fdatasync",
        cgroup_mem={"full": 1 * GiB, "quick": 384 * MiB, "smoke": 256 * MiB},
        idle={"full": 60.0, "quick": 15.0, "smoke": 1.0},
    ),
    "degrade": Preset(
        about=(
            "a degrading, stalled and recovering target: the backup writes for the length of "
            "the rate schedule, with the neighbour in its memory cgroup"
        ),
        targets=("loop",),
        schedule={
            "full": "20M:30s,1M:60s,0:30s,20M:30s",  # issue 4's scenario
            "quick": "20M:10s,1M:20s,0:5s,20M:10s",
            "smoke": "64M:1s,8M:1s,0:1s,64M:1s",
        },
        workloads={"full": "seq:64G", "quick": "seq:64G", "smoke": "seq:64G"},
        arms={
            "full": "idle,direct-bdi,ft-static,ft-adaptive",
            "quick": "direct,direct-fsync,direct-bdi,ft-static,ft-adaptive",
            "smoke": "direct,ft-static",
        },
        repeats={"full": 2, "quick": 1, "smoke": 1},
        victim="fdatasync",
        cgroup_mem={"full": 1 * GiB, "quick": 512 * MiB, "smoke": 256 * MiB},
        idle={"full": 150.0, "quick": 35.0, "smoke": 1.0},
        duration_from_schedule=True,
    ),
    "db": Preset(
        about=(
            "issue 15's database neighbour: a victim that fills its memory cgroup with cache, "
            "allocates, reads a working set of half the cgroup, writes and fdatasyncs, back to "
            "back, while a buffered 1 MiB backup writes onto the 20 MiB/s target from the same "
            "cgroup; the daemon runs with its defaults"
        ),
        targets=("loop",),
        schedule={"full": "20M", "quick": "20M", "smoke": "64M"},
        workloads={"full": "seq:1200M", "quick": "seq:480M", "smoke": "seq:24M"},
        arms={"full": DB_ARMS, "quick": DB_ARMS, "smoke": "idle,ft-adaptive"},
        repeats={"full": 10, "quick": 2, "smoke": 1},
        victim="db",
        cgroup_mem={"full": 1 * GiB, "quick": 512 * MiB, "smoke": 128 * MiB},
        idle={"full": 60.0, "quick": 25.0, "smoke": 1.0},
        ft_options="",
    ),
    "db-degrade": Preset(
        about=(
            "issue 15's scenario: the database neighbour while the target drops from 20 MiB/s "
            "to 1 MiB/s and comes back; the backup writes for the length of the schedule"
        ),
        targets=("loop",),
        schedule={
            "full": "20M:20s,1M:40s,20M:20s",
            "quick": "20M:10s,1M:20s,20M:10s",
            "smoke": "64M:1s,8M:1s,64M:1s",
        },
        workloads={"full": "seq:64G", "quick": "seq:64G", "smoke": "seq:64G"},
        arms={"full": DB_ARMS, "quick": DB_ARMS, "smoke": "idle,ft-adaptive"},
        repeats={"full": 10, "quick": 2, "smoke": 1},
        victim="db",
        cgroup_mem={"full": 1 * GiB, "quick": 512 * MiB, "smoke": 128 * MiB},
        idle={"full": 80.0, "quick": 40.0, "smoke": 1.0},
        duration_from_schedule=True,
        ft_options="",
    ),
    "fast": Preset(
        about=(
            "a healthy fast target (ext4 image on the root disk, no throttle): what throttling "
            "costs when the target keeps up"
        ),
        targets=("loop",),
        schedule={"full": "none", "quick": "none", "smoke": "none"},
        workloads={"full": "seq:4G", "quick": "seq:1G", "smoke": "seq:32M"},
        arms={
            "full": "direct,direct-fsync,ft-off,ft-static,ft-adaptive",
            "quick": "direct,direct-fsync,ft-off,ft-static,ft-adaptive",
            "smoke": "direct,direct-fsync,ft-off,ft-static",
        },
        repeats={"full": 3, "quick": 1, "smoke": 1},
        victim="none",
        cgroup_mem={"full": 0, "quick": 0, "smoke": 0},
        idle={"full": 10.0, "quick": 5.0, "smoke": 1.0},
    ),
    "demo": Preset(
        about=(
            "the quick start: a database (the db neighbour, its data 1.5 times its memory) and a "
            "backup share one 384 MiB memory cgroup, as in a container; the backup writes for "
            "40 s onto a loop target at 20 MiB/s that drops to 0.5 MiB/s for 20 s (a server "
            "under load), once directly and once through fusethrottle (its defaults); about "
            "two minutes"
        ),
        targets=("loop",),
        schedule={
            "full": "20M:10s,512K:20s,20M:10s",
            "quick": "20M:10s,512K:20s,20M:10s",
            "smoke": "64M:1s,8M:1s,64M:1s",
        },
        workloads={"full": "seq:64G", "quick": "seq:64G", "smoke": "seq:64G"},
        arms={
            "full": "direct,ft-adaptive",
            "quick": "direct,ft-adaptive",
            "smoke": "direct,ft-adaptive",
        },
        repeats={"full": 1, "quick": 1, "smoke": 1},
        victim="db",
        cgroup_mem={"full": 384 * MiB, "quick": 384 * MiB, "smoke": 128 * MiB},
        idle={"full": 5.0, "quick": 5.0, "smoke": 1.0},
        duration_from_schedule=True,
        ft_options="",
        victim_working_set=1.5,
    ),
    "passthrough": Preset(
        about=(
            "issue 11's side-by-side report: dd at 4K/10K/128K/1M, 10,000 small files (create, "
            "ls -lR and stat cold and warm, rm -rf), the same files created by 8 writers at "
            "once, and a sequential read onto tmpfs: native vs "
            "fusethrottle with its default options vs libfuse's C passthrough_ll (with and "
            "without -o writeback), MiB/s or files/s and CPU-s per GiB (writer + daemon)"
        ),
        targets=("tmpfs",),
        schedule={"full": "none", "quick": "none", "smoke": "none"},
        workloads={
            "full": "dd4k:1G,dd10k:1G,dd128k:1G,dd1m:1G,files:10000,files8:10000,read:1G",
            "quick": (
                "dd4k:256M,dd10k:256M,dd128k:256M,dd1m:256M,files:10000,files8:10000,read:256M"
            ),
            "smoke": "dd4k:2M,dd10k:2M,dd128k:8M,dd1m:16M,files:200,files8:200,read:16M",
        },
        arms={
            "full": PASSTHROUGH_ARMS,
            "quick": PASSTHROUGH_ARMS,
            "smoke": "direct,ft-adaptive:xattrs=off,c-ll",
        },
        repeats={"full": 3, "quick": 2, "smoke": 1},  # quick: ~4 min on 2 cores
        victim="none",
        cgroup_mem={"full": 0, "quick": 0, "smoke": 0},
        idle={"full": 10.0, "quick": 5.0, "smoke": 1.0},
        ft_options="",
        metrics=False,
    ),
}


def build_plan(
    preset_name: str,
    scale: str,
    *,
    targets: list[str] | None = None,
    throttle: str | None = None,
    workdir: str | None = None,
    writer_head_start: float | None = None,
    mount_timeout: float | None = None,
    schedule: str | None = None,
    workloads: str | None = None,
    size: int | None = None,
    arms: str | None = None,
    repeats: int | None = None,
    victim: str | None = None,
    victim_interval: float | None = None,
    victim_working_set: float | None = None,
    cgroup_mem: int | None = None,
    daemon_in_cgroup: bool | None = None,
    idle: float | None = None,
    ft_options: str | None = None,
    metrics: bool | None = None,
    image_size: int | None = None,
    plots: bool = True,
    verify: bool | None = None,
) -> Plan:
    """Merge a preset at a scale with the user's overrides into a validated :class:`Plan`."""
    if preset_name not in PRESETS:
        raise PlanError(f"unknown preset {preset_name!r} (known: {', '.join(PRESETS)})")
    p = PRESETS[preset_name]
    steps = parse_schedule(schedule or p.schedule[scale])
    target_specs = tuple(parse_target(t, throttle or "") for t in (targets or p.targets))
    if throttle and not any(t.throttle for t in target_specs):
        raise PlanError("--throttle tc:DEV slows a directory target (--target PATH)")
    if schedule and not any(t.throttled for t in target_specs):
        raise PlanError(
            "--schedule throttles the built-in loop target (--target loop) or a directory "
            "target with --throttle tc:DEV"
        )
    target_specs = with_schedule(target_specs, steps)
    if image_size:
        target_specs = tuple(replace(t, image_size=image_size) for t in target_specs)
    elif scale == "smoke":
        target_specs = tuple(replace(t, image_size=1 * GiB) for t in target_specs)
    wl = parse_workloads(workloads or p.workloads[scale], size)
    if p.duration_from_schedule and not workloads and not size:
        seconds = schedule_seconds(steps)
        if seconds <= 0:
            raise PlanError(f"preset {preset_name} needs a schedule with durations")
        wl = tuple(replace(w, duration=seconds) for w in wl)
    n = p.repeats[scale] if repeats is None else repeats
    if n < 1:
        raise PlanError("--repeats must be at least 1")
    smoke = scale == "smoke"
    return Plan(
        preset=preset_name,
        scale=scale,
        targets=target_specs,
        workloads=wl,
        arms=parse_arms(arms or p.arms[scale]),
        repeats=n,
        victim=victim or p.victim,
        victim_interval=victim_interval
        if victim_interval is not None
        else (0.02 if smoke else 0.01),
        victim_working_set=p.victim_working_set
        if victim_working_set is None
        else victim_working_set,
        cgroup_mem=p.cgroup_mem[scale] if cgroup_mem is None else cgroup_mem,
        daemon_in_cgroup=True if daemon_in_cgroup is None else daemon_in_cgroup,
        idle_seconds=p.idle[scale] if idle is None else idle,
        ft_options=ft_options if ft_options is not None else p.ft_options,
        metrics=p.metrics if metrics is None else metrics,
        lead_seconds=0.3 if smoke else 1.0,
        tail_seconds=0.3 if smoke else 1.0,
        verify=smoke if verify is None else verify,
        daemon_stop_timeout=60.0 if smoke else 600.0,
        plots=plots,
        workdir=workdir or "",
        writer_head_start=writer_head_start or 0.0,
        mount_timeout=mount_timeout or 30.0,
    )


def describe() -> str:
    lines = []
    for name, p in PRESETS.items():
        lines.append(f"{name}: {p.about}")
        for scale in SCALES:
            cg = f"{p.cgroup_mem[scale] // MiB}M" if p.cgroup_mem[scale] else "none"
            lines.append(
                f"  {scale:5s} targets={','.join(p.targets)} rate={p.schedule[scale]} "
                f"workloads={p.workloads[scale]} arms={p.arms[scale]} repeats={p.repeats[scale]} "
                f"victim={p.victim} cgroup={cg}"
            )
        lines.append(
            f"  ft-* options: {p.ft_options or '(the daemon defaults)'}; "
            f"metrics scraped: {'yes' if p.metrics else 'no'}"
        )
    return "\n".join(lines)
