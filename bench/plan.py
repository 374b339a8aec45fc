"""What one invocation runs: targets x workloads x repeats x arms, parsed and validated up front.

Pure (no I/O): a typo in ``--arms`` or ``--schedule`` must fail in a millisecond with one line,
not after a loop device was built and two arms ran.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from fusethrottle.service import options

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


class PlanError(ValueError):
    """A user mistake on the command line; ``str(err)`` is the one line to print."""


def parse_size(text: str) -> int:
    """``64M`` -> 67108864: the same binary units as fusethrottle's own options."""
    try:
        return options.parse_size(text)
    except options.OptionError as err:
        raise PlanError(str(err)) from None


def parse_duration(text: str) -> float:
    """``500ms`` -> 0.5, ``30s`` -> 30.0; a bare number is seconds."""
    try:
        return options.parse_duration(text)
    except options.OptionError as err:
        raise PlanError(str(err)) from None


def format_size(n: float) -> str:
    """Short binary size for labels: 67108864 -> ``64M``."""
    for unit, scale in (("G", GiB), ("M", MiB), ("K", KiB)):
        if n >= scale and n % scale == 0:
            return f"{int(n // scale)}{unit}"
    return str(int(n))


# --- the target's write rate over time -------------------------------------------------------


@dataclass(frozen=True)
class RateStep:
    """Hold the target at ``rate`` bytes/s for ``seconds``. None: unthrottled; 0: stalled."""

    rate: int | None
    seconds: float


def parse_schedule(text: str) -> tuple[RateStep, ...]:
    """``"20M:30s,1M:60s,0:30s"`` -> steps; a lone ``"20M"`` holds for ever.

    ``0`` stalls the target (a hung NFS server); ``none`` removes the throttle. The last rate is
    held after the schedule ends, so a run longer than the schedule never speeds up by surprise.
    """
    steps: list[RateStep] = []
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise PlanError("empty --schedule")
    for i, part in enumerate(parts):
        rate_text, colon, dur_text = part.partition(":")
        rate = None if rate_text.lower() in ("none", "off") else parse_size(rate_text)
        if colon:
            seconds = parse_duration(dur_text)
            if seconds <= 0:
                raise PlanError(f"schedule step {part!r}: duration must be positive")
        elif i == len(parts) - 1:
            seconds = math.inf
        else:
            raise PlanError(f"schedule step {part!r} needs a duration (RATE:DURATION)")
        steps.append(RateStep(rate, seconds))
    return tuple(steps)


def schedule_seconds(steps: tuple[RateStep, ...]) -> float:
    """Length of the finite part of a schedule (0 for a single held rate)."""
    return sum(s.seconds for s in steps if math.isfinite(s.seconds))


def schedule_capacity(steps: tuple[RateStep, ...], seconds: float) -> float | None:
    """Bytes the throttled target can absorb in the schedule's first *seconds* (the last rate
    held after its end); None if the target is unthrottled at any time in them.

    The backup's share of this is what a time-bounded backup made of the target: bytes over
    time alone favours an arm that still holds more unwritten data when the writer stops,
    since the throttled target drains it after the deadline at the last step's rate.
    """
    total, start = 0.0, 0.0
    for i, step in enumerate(steps):
        length = math.inf if i == len(steps) - 1 else step.seconds
        used = min(length, seconds - start)
        if used <= 0:
            break
        if step.rate is None:
            return None
        total += step.rate * used
        start += used
    return total


def format_schedule(steps: tuple[RateStep, ...]) -> str:
    """Inverse of :func:`parse_schedule`, for labels and run.json."""
    out = []
    for s in steps:
        rate = "none" if s.rate is None else format_size(s.rate)
        out.append(rate if math.isinf(s.seconds) else f"{rate}:{s.seconds:g}s")
    return ",".join(out)


# --- arms ---------------------------------------------------------------------------------------

ARM_KINDS = (
    "idle",
    "direct",
    "direct-fsync",
    "direct-bdi",
    "ft-off",
    "ft-static",
    "ft-adaptive",
    "c-ll",
    "c-ll-wb",
)
# The C reference arms: libfuse's own example passthrough_ll.c, built by the harness at run time,
# with the -o options each adds to the upstream defaults (see bench/daemon.py).
C_ARM_OPTIONS = {"c-ll": "", "c-ll-wb": "writeback"}


@dataclass(frozen=True)
class ArmSpec:
    """One way of running the backup. ``param`` refines it: the fsync interval for direct-fsync,
    max_bytes for direct-bdi, extra ``-o`` options for the ft-* and c-ll* arms, and a name for a
    second idle arm (``idle:again``), whose ratio to ``idle`` is the machine's own noise."""

    kind: str
    param: str = ""

    @property
    def label(self) -> str:
        return self.kind if not self.param else f"{self.kind}:{self.param}"

    @property
    def is_fusethrottle(self) -> bool:
        return self.kind.startswith("ft-")

    @property
    def is_c_passthrough(self) -> bool:
        """libfuse's C passthrough_ll: the reference a FUSE passthrough can hope to reach."""
        return self.kind in C_ARM_OPTIONS

    @property
    def is_fuse(self) -> bool:
        return self.is_fusethrottle or self.is_c_passthrough

    @property
    def ft_mode(self) -> str:
        return self.kind.removeprefix("ft-")

    def c_options(self) -> str:
        """passthrough_ll's ``-o`` options besides ``source=``: the arm's own plus ``param``
        (several joined by ``:``, as the ft arms', since ``,`` separates arms:
        ``c-ll-wb:xattr:default_permissions``)."""
        return ",".join(o for o in (C_ARM_OPTIONS[self.kind], self.param.replace(":", ",")) if o)

    def fsync_every(self) -> int:
        """Bytes between the writer's own fsyncs in the direct-fsync arm (the published fix)."""
        return parse_size(self.param) if self.param else 100 * 1000 * 1000

    def bdi_max_bytes(self) -> int:
        return parse_size(self.param) if self.param else 64 * MiB


def is_idle(label: str) -> bool:
    """Is this arm label a run without a backup (``idle``, or a second one: ``idle:again``)?"""
    return label.partition(":")[0] == "idle"


def parse_arms(text: str) -> tuple[ArmSpec, ...]:
    """``"idle,direct,ft-static:window=128M"`` -> specs (order kept, duplicates refused)."""
    arms: list[ArmSpec] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        kind, _, param = part.partition(":")
        if kind not in ARM_KINDS:
            raise PlanError(f"unknown arm {kind!r} (known: {', '.join(ARM_KINDS)})")
        arm = ArmSpec(kind, param)
        if kind == "direct-fsync" and param:
            parse_size(param)
        if kind == "direct-bdi" and param:
            parse_size(param)
        if kind == "direct" and param:
            raise PlanError("arm direct takes no parameter")
        if kind == "idle" and param and not param.isalnum():
            raise PlanError(f"arm {part!r}: a second idle arm takes a plain name (idle:again)")
        if arm.is_c_passthrough and any(o.strip().startswith("source=") for o in param.split(",")):
            raise PlanError(f"arm {part!r}: the harness sets source= itself")
        if arm in arms:
            raise PlanError(f"arm {part!r} given twice")
        arms.append(arm)
    if not arms:
        raise PlanError("no arms given")
    # ft-static:a and ft-static:b are both allowed, but then labels must differ (they do).
    return tuple(arms)


# --- workloads ----------------------------------------------------------------------------------

#: The pace of the ``paced`` workload: the rate the degrade and db presets' target keeps up with.
PACED_RATE = 20 * MiB

WORKLOAD_KINDS = {
    # name: (default size, what it is)
    "seq": (1 * GiB, "one file, buffered 1 MiB write() calls (a streaming backup)"),
    "paced": (
        512 * MiB,
        "seq at 20 MiB/s (a backup reading its source that fast): the CPU it costs at a pace "
        "the target keeps up with",
    ),
    "small4k": (256 * MiB, "one file, buffered 4 KiB write() calls"),
    "small10k": (256 * MiB, "one file, buffered 10 KiB write() calls (tar's record size)"),
    "tree": (
        256 * MiB,
        "tar | tar: a generated tree of many small files extracted onto the target",
    ),
    "tarball": (256 * MiB, "tar -cf onto the target of a generated tree (10 KiB records)"),
    "fio": (1 * GiB, "fio: sequential buffered 1 MiB writes, psync engine"),
    "fio-rand": (256 * MiB, "fio: random buffered writes of 4-64 KiB into one file"),
    "dd4k": (1 * GiB, "dd if=/dev/zero bs=4k"),
    "dd10k": (1 * GiB, "dd if=/dev/zero bs=10k (tar's record size)"),
    "dd128k": (1 * GiB, "dd if=/dev/zero bs=128k"),
    "dd1m": (1 * GiB, "dd if=/dev/zero bs=1M"),
    "files": (
        10_000,
        "N files (a count, not bytes) of 4 KiB in 100 directories; then ls -lR and stat of "
        "every file, cold and warm; then rm -rf, each phase timed on its own",
    ),
    "files8": (
        10_000,
        "N files (a count) of 4 KiB created by 8 writers at once, each in 100/8 directories of "
        "its own: timed from the first start to the last close, then rm -rf",
    ),
    "read": (1 * GiB, "a file written through the mount, page cache dropped, read by dd bs=1M"),
}
#: Workloads whose size is a count of files, not bytes.
FILE_COUNT_KINDS = ("files", "files8")
#: How many writers files8 runs at once.
PARALLEL_WRITERS = 8
DD_BLOCKS = {"dd4k": 4 * KiB, "dd10k": 10 * KiB, "dd128k": 128 * KiB, "dd1m": MiB}


@dataclass(frozen=True)
class WorkloadSpec:
    """A backup job. ``size`` is bytes (a file count for FILE_COUNT_KINDS); ``duration`` caps
    the writer in seconds (0: no cap) so a rate schedule can define the run's length."""

    kind: str
    size: int
    duration: float = 0.0

    @property
    def label(self) -> str:
        return self.kind

    @property
    def block(self) -> int:
        return {"seq": MiB, "paced": MiB, "small4k": 4 * KiB, "small10k": 10 * KiB}.get(
            self.kind, MiB
        )


def parse_workloads(text: str, default_size: int | None = None) -> tuple[WorkloadSpec, ...]:
    """``"seq:2G,tree"`` -> specs; ``default_size`` replaces the built-in size where none given."""
    out: list[WorkloadSpec] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        kind, colon, size_text = part.partition(":")
        if kind not in WORKLOAD_KINDS:
            raise PlanError(f"unknown workload {kind!r} (known: {', '.join(WORKLOAD_KINDS)})")
        if colon:
            size = parse_size(size_text)
        elif default_size is not None and kind not in FILE_COUNT_KINDS:
            size = default_size
        else:
            size = WORKLOAD_KINDS[kind][0]
        if size <= 0:
            raise PlanError(f"workload {part!r}: size must be positive")
        if any(w.kind == kind for w in out):
            raise PlanError(f"workload {kind!r} given twice")
        out.append(WorkloadSpec(kind, size))
    if not out:
        raise PlanError("no workloads given")
    return tuple(out)


def fsync_skip_reason(workload: WorkloadSpec) -> str | None:
    """Why a workload cannot fsync every N bytes itself (None when it can)."""
    if workload.kind in ("seq", "paced", "small4k", "small10k", "fio", "fio-rand"):
        return None
    return f"{workload.kind} has no way to fsync every N bytes in the writer"


# --- targets ------------------------------------------------------------------------------------

BUILTIN_TARGETS = ("loop", "zram", "tmpfs", "rootdir")
#: The built-in targets the harness throttles (blkio on their block device).
THROTTLED_DEVICES = ("loop", "zram")


@dataclass(frozen=True)
class TargetSpec:
    """Where the backup goes: the built-in throttled loop device, a private tmpfs, a fresh
    directory on the root filesystem, or the user's own mount (``path``). ``throttle``
    (``tc:DEV``) lets a path target's rate follow the schedule on a network device's egress:
    an NFS mount in a lab, where the link to the server is ours to slow down."""

    kind: str
    path: str = ""
    schedule: tuple[RateStep, ...] = (RateStep(20 * MiB, math.inf),)
    image_size: int = 8 * GiB
    throttle: str = ""

    @property
    def throttled(self) -> bool:
        """Does the harness set this target's rate (and so its schedule apply)?"""
        return self.kind in THROTTLED_DEVICES or bool(self.throttle)

    @property
    def label(self) -> str:
        if self.kind in THROTTLED_DEVICES:
            return f"{self.kind}@{format_schedule(self.schedule)}"
        if self.throttle:
            return f"{self.path}@{self.throttle}@{format_schedule(self.schedule)}"
        return self.kind if self.kind != "path" else self.path


def parse_target(text: str, throttle: str = "") -> TargetSpec:
    """``loop``/``zram``/``tmpfs``/``rootdir`` are built in; anything containing ``/`` is a
    directory, which *throttle* (``tc:DEV``) makes a throttled one."""
    if text in BUILTIN_TARGETS:
        return TargetSpec(text)
    if "/" not in text:
        raise PlanError(
            f"--target {text!r}: use one of {', '.join(BUILTIN_TARGETS)} or a directory path "
            "(write ./NAME for a relative one)"
        )
    if throttle:
        from bench.tc import parse_throttle

        try:
            parse_throttle(throttle)
        except ValueError as err:
            raise PlanError(str(err)) from None
    return TargetSpec("path", path=text, throttle=throttle)


# --- the whole invocation -----------------------------------------------------------------------

VICTIMS = ("fdatasync", "buffered", "db", "none")


@dataclass(frozen=True)
class Plan:
    """Everything one ``bench run`` does, after presets and flags are merged."""

    preset: str
    scale: str  # full | quick | smoke
    targets: tuple[TargetSpec, ...]
    workloads: tuple[WorkloadSpec, ...]
    arms: tuple[ArmSpec, ...]
    repeats: int = 1
    victim: str = "fdatasync"
    victim_interval: float = 0.010
    #: The db neighbour's data file as a fraction of the shared cgroup's limit.
    victim_working_set: float = 0.5
    cgroup_mem: int = 0  # 0: no shared memory cgroup
    daemon_in_cgroup: bool = True
    idle_seconds: float = 30.0
    ft_options: str = "batch=64M,window=256M"
    metrics: bool = True
    sample_interval: float = 0.25
    lead_seconds: float = 1.0
    tail_seconds: float = 1.0
    tree_files_hint: int = 0  # 0: derived from the tree size
    verify: bool = False
    plots: bool = True
    daemon_stop_timeout: float = 600.0  # SIGTERM flushes; a stalled target may take this long
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: Where the victim's files and the loop image go ("": /var/tmp); a real disk, since
    #: fdatasync on tmpfs (the NFS lab's root) returns at once.
    workdir: str = ""
    #: Seconds the backup writer is launched before the clock (t0) starts; it waits for t0.
    writer_head_start: float = 0.0
    #: Seconds a FUSE daemon may take to mount (a TCG guest on a busy host needs more than 30).
    mount_timeout: float = 30.0

    def needs_root(self) -> list[str]:
        """Reasons this plan needs root; empty when an unprivileged user can run it."""
        why = [f"the built-in {t.kind} target" for t in self.targets if t.kind != "path"]
        why += [f"the {t.throttle} throttle" for t in self.targets if t.throttle]
        if self.cgroup_mem:
            why.append("the shared memory cgroup (--cgroup-mem)")
        return why

    def cells_per_repeat(self) -> int:
        return len(self.targets) * len(self.workloads) * len(self.arms)


def with_schedule(targets: tuple[TargetSpec, ...], steps: tuple[RateStep, ...]) -> tuple:
    """Apply a rate schedule to the targets the harness can throttle (loop, ``tc:DEV``)."""
    return tuple(replace(t, schedule=steps) if t.throttled else t for t in targets)
