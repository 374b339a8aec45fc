"""Where the backup goes, and how much of it the target really absorbed.

The built-in target is TARGETS.md recipe A: an ext4 image on a loop device (direct I/O, so the
host's page cache does not hold it twice) whose writes the cgroup-v1 blkio controller throttles.
Kernel writeback to it is throttled too, so Dirty/Writeback pages pile up the way they do in front
of a degraded NFS server. "Absorbed" is read from the device (written sectors) or, on NFS, from
the bytes the client sent to the server — never from how fast write() returned.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import threading
import time
from pathlib import Path

from bench.plan import RateStep, TargetSpec, format_schedule, format_size
from bench.system import (
    BLKIO_WRITE_BPS,
    ArmSkipped,
    BenchError,
    Teardown,
    read_text,
    run,
    syncfs,
    write_sysfs,
)
from bench.tc import TcThrottle, parse_throttle

log = logging.getLogger(__name__)

STALL_RATE = 1  # bytes/s: blk-throttle has no "stop"; 1 B/s is a hung server, and lifting it
# re-dispatches the queued bios at once (tried on this machine kind).


# --- what the target absorbed ----------------------------------------------------------------


class AbsorbedCounter:
    """Cumulative bytes the target took in; ``None`` where the harness cannot know."""

    description = "not measurable here"
    shared = False  # other processes write to the same device

    def read(self) -> int | None:
        return None


class BlockDeviceCounter(AbsorbedCounter):
    """Written sectors of a block device (always 512-byte units), counted on completion."""

    def __init__(self, stat_path: Path, name: str, shared: bool) -> None:
        self.stat_path = stat_path
        self.description = f"written sectors of {name}" + (" (shared device)" if shared else "")
        self.shared = shared

    def read(self) -> int | None:
        fields = read_text(self.stat_path).split()
        return int(fields[6]) * 512 if len(fields) > 6 else None


class NfsCounter(AbsorbedCounter):
    """Bytes the NFS client sent to the server in WRITE calls (/proc/self/mountstats)."""

    def __init__(self, mountpoint: str) -> None:
        self.mountpoint = mountpoint
        self.description = f"NFS server write bytes of {mountpoint}"

    def read(self) -> int | None:
        inside = False
        for line in read_text("/proc/self/mountstats").splitlines():
            if line.startswith("device "):
                inside = f" mounted on {self.mountpoint} with fstype nfs" in line
            elif inside and line.strip().startswith("bytes:"):
                # normalread normalwrite directread directwrite serverread serverwrite ...
                return int(line.split()[6])
        return None


def _mountpoint_of(path: Path) -> str:
    path = path.resolve()
    dev = path.stat().st_dev
    while path != path.parent and path.parent.stat().st_dev == dev:
        path = path.parent
    return str(path)


def counter_for(path: Path, shared: bool) -> AbsorbedCounter:
    """Pick the best absorbed-bytes source for the filesystem holding *path*."""
    st = path.stat()
    majmin = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    stat = Path(f"/sys/dev/block/{majmin}/stat")
    if stat.exists():
        return BlockDeviceCounter(stat, Path(f"/sys/dev/block/{majmin}").resolve().name, shared)
    mp = _mountpoint_of(path)
    counter = NfsCounter(mp)
    if counter.read() is not None:
        return counter
    return AbsorbedCounter()


def bdi_for(path: Path) -> str | None:
    """The /sys/class/bdi name of the filesystem holding *path* (a disk, not its partition)."""
    st = path.stat()
    majmin = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    if Path(f"/sys/class/bdi/{majmin}").exists():
        return majmin
    dev = Path(f"/sys/dev/block/{majmin}")
    for candidate in (dev / "bdi", dev.resolve().parent / "bdi"):
        if candidate.exists():
            return candidate.resolve().name
    return None


# --- the throttle and its schedule -------------------------------------------------------------


class Throttle:
    """blkio.throttle.write_bps_device for one device, at the root blkio cgroup."""

    def __init__(self, majmin: str) -> None:
        self.majmin = majmin
        self.current: int | None = None
        self._lock = threading.Lock()

    def apply(self, rate: int | None) -> None:
        value = 0 if rate is None else max(rate, STALL_RATE)
        with self._lock:
            write_sysfs(BLKIO_WRITE_BPS, f"{self.majmin} {value}")
            self.current = rate


class ScheduleRunner:
    """Applies a rate schedule from a start time, in its own thread, then holds the last rate."""

    def __init__(self, throttle: Throttle | TcThrottle, steps: tuple[RateStep, ...]) -> None:
        self.throttle = throttle
        self.steps = steps
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.changes: list[tuple[float, int | None]] = []  # (monotonic time, rate)

    def start(self, t0: float) -> None:
        self._stop.clear()
        self.changes = []
        self._thread = threading.Thread(target=self._loop, args=(t0,), daemon=True, name="rate")
        self._thread.start()

    def _loop(self, t0: float) -> None:
        at = t0
        for step in self.steps:
            if self._stop.is_set():
                return
            if at > time.monotonic() and self._stop.wait(at - time.monotonic()):
                return
            try:
                self.throttle.apply(step.rate)
                self.changes.append((time.monotonic(), step.rate))
            except BenchError as err:
                log.error("rate schedule: %s", err)
            if math.isinf(step.seconds):
                return
            at += step.seconds

    def halt(self) -> None:
        """Stop changing the rate (and leave it as it is)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def stop(self) -> None:
        """Stop and go back to the first step's rate, so the next arm starts the same way."""
        self.halt()
        self.throttle.apply(self.steps[0].rate)


# --- targets -----------------------------------------------------------------------------------


class Target:
    """A filesystem the harness may write into, inside a directory it owns and removes."""

    def __init__(self, spec: TargetSpec, workdir: Path) -> None:
        self.spec = spec
        self.workdir = workdir  # private per-harness directory on the host disk
        self.root: Path = Path()
        self.counter: AbsorbedCounter = AbsorbedCounter()
        self.bdi: str | None = None
        self.image = ""
        self.schedule: ScheduleRunner | None = None
        self.description = spec.label

    def setup(self, teardown: Teardown) -> None:
        raise NotImplementedError

    def cell_dir(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True)
        return path

    def clear(self, path: Path) -> None:
        """Remove an arm's files and sync, so the next arm starts on an empty, clean target."""
        shutil.rmtree(path, ignore_errors=True)
        syncfs(self.root)

    def sync(self) -> float:
        return syncfs(self.root)

    def bdi_skip_reason(self) -> str | None:
        if self.bdi is None:
            return f"target {self.spec.label} has no block device bdi"
        base = Path("/sys/class/bdi") / self.bdi
        if not (base / "strict_limit").exists() or not (base / "max_bytes").exists():
            return "kernel lacks /sys/class/bdi/*/max_bytes + strict_limit (Linux >= 6.2)"
        if os.geteuid() != 0:
            return "setting /sys/class/bdi needs root"
        return None

    def info(self) -> dict[str, object]:
        return {
            "label": self.spec.label,
            "kind": self.spec.kind,
            "root": str(self.root),
            "absorbed": self.counter.description,
            "bdi": self.bdi,
        }


class LoopTarget(Target):
    """TARGETS.md recipe A, built and removed by the harness."""

    def setup(self, teardown: Teardown) -> None:
        base = self.workdir / "loop"
        base.mkdir(parents=True)
        image = base / "target.img"
        with open(image, "wb") as f:
            f.truncate(self.spec.image_size)
        dev = run(["losetup", "--show", "-f", "--direct-io=on", str(image)]).strip()
        teardown.push("losetup-detach", dev, str(image))
        self.image = str(image)
        self._throttled_ext4(dev, base, teardown)
        self.description = (
            f"ext4 on {dev} ({format_size(self.spec.image_size)} image, direct-io), "
            f"write rate {self.spec.label.partition('@')[2]}"
        )
        log.info("target: %s", self.description)

    def _throttled_ext4(self, dev: str, base: Path, teardown: Teardown, *opts: str) -> None:
        """Make ext4 on *dev*, mount it under *base* and throttle its writes (blkio)."""
        name = Path(dev).name
        run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", dev])
        mnt = base / "mnt"
        mnt.mkdir()
        run(["mount", "-o", ",".join(("noatime", *opts)), dev, str(mnt)])
        teardown.push("umount", str(mnt))
        majmin = read_text(f"/sys/block/{name}/dev").strip()
        throttle = Throttle(majmin)
        teardown.push("clear-throttle", majmin, self.image, early=True)
        throttle.apply(self.spec.schedule[0].rate)
        self.schedule = ScheduleRunner(throttle, self.spec.schedule)
        self.root = mnt / "bench"
        self.root.mkdir()
        self.counter = BlockDeviceCounter(Path(f"/sys/block/{name}/stat"), name, shared=False)
        self.bdi = majmin
        self.device = dev


class ZramTarget(LoopTarget):
    """The loop target's throttled ext4 on a device of its own: a zram disk (memory the kernel
    compresses, charged to no memory cgroup). The loop image lives on the disk the neighbour
    reads and fdatasyncs on, so the neighbour's cache flushes wait behind the backup's writes
    there; a network target's writes never reach that disk, and neither do these."""

    def setup(self, teardown: Teardown) -> None:
        base = self.workdir / "zram"
        base.mkdir(parents=True)
        number = read_text("/sys/class/zram-control/hot_add").strip()
        dev = f"/dev/zram{number}"
        teardown.push("zram-remove", number)
        write_sysfs(f"/sys/block/zram{number}/disksize", str(self.spec.image_size))
        # discard: a removed arm's blocks go back to memory, not stay compressed in it.
        self._throttled_ext4(dev, base, teardown, "discard")
        self.description = (
            f"ext4 on {dev} ({format_size(self.spec.image_size)} zram disk, its own device), "
            f"write rate {self.spec.label.partition('@')[2]}"
        )
        log.info("target: %s", self.description)


class TmpfsTarget(Target):
    """A private tmpfs: the fastest backing there is, for the passthrough overhead report."""

    def setup(self, teardown: Teardown) -> None:
        mnt = self.workdir / "tmpfs"
        mnt.mkdir(parents=True)
        run(["mount", "-t", "tmpfs", "-o", f"size={self.spec.image_size}", "bench", str(mnt)])
        teardown.push("umount", str(mnt))
        self.root = mnt
        self.description = "private tmpfs (memory; nothing to absorb)"


class RootDirTarget(Target):
    """A fresh directory on the root filesystem (the host's own disk, shared with others)."""

    def setup(self, teardown: Teardown) -> None:
        self.root = self.workdir / "rootdir"
        self.root.mkdir(parents=True)
        self.counter = counter_for(self.root, shared=True)
        self.bdi = bdi_for(self.root)
        fstype = _fstype(self.root)
        self.description = f"{fstype} directory on the root disk ({self.counter.description})"


class PathTarget(Target):
    """The user's own mount (NFS, EFS, anything): the harness writes in a subdirectory only."""

    def setup(self, teardown: Teardown) -> None:
        given = Path(self.spec.path)
        if not given.is_dir():
            raise BenchError(f"--target {given}: not a directory")
        if not os.access(given, os.W_OK):
            raise BenchError(f"--target {given}: not writable")
        self.root = given / f"fusethrottle-bench-{os.getpid()}"
        self.root.mkdir()
        teardown.push("rmtree", str(self.root))
        self.counter = counter_for(self.root, shared=True)
        self.bdi = bdi_for(self.root)
        self.description = f"{_fstype(self.root)} at {given} ({self.counter.description})"
        if self.spec.throttle:
            dev = parse_throttle(self.spec.throttle)
            throttle = TcThrottle(dev)
            # early: on abort the link is opened up first, so pending flushes finish quickly.
            teardown.push("restore-tc", *throttle.setup(), early=True)
            throttle.apply(self.spec.schedule[0].rate)
            self.schedule = ScheduleRunner(throttle, self.spec.schedule)
            self.description += (
                f", egress of {dev} throttled by tc tbf, {format_schedule(self.spec.schedule)}"
            )

    def bdi_skip_reason(self) -> str | None:
        reason = super().bdi_skip_reason()
        if reason is None:
            # The bdi of someone's real mount: we restore it, but say what we touch.
            log.info("direct-bdi will set and restore /sys/class/bdi/%s", self.bdi)
        return reason


def _fstype(path: Path) -> str:
    mp = _mountpoint_of(path)
    for line in read_text("/proc/self/mounts").splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[1] == mp:
            return parts[2]
    return "unknown"


def make_target(spec: TargetSpec, workdir: Path) -> Target:
    kinds = {
        "loop": LoopTarget,
        "zram": ZramTarget,
        "tmpfs": TmpfsTarget,
        "rootdir": RootDirTarget,
    }
    return kinds.get(spec.kind, PathTarget)(spec, workdir)


# --- the kernel's own per-device limit (the direct-bdi arm) -----------------------------------


class BdiLimit:
    """Sets /sys/class/bdi/<dev>/max_bytes + strict_limit=1 and restores the old values.

    max_bytes is stored as a ratio that drifts with free memory, so the restore writes back the
    saved max_ratio_fine (the exact value), not the bytes.
    """

    def __init__(self, bdi: str, max_bytes: int, teardown: Teardown, image: str = "") -> None:
        self.base = Path("/sys/class/bdi") / bdi
        self.bdi = bdi
        self.image = image  # the loop image, when the bdi is our own loop device
        self.max_bytes = max_bytes
        self.teardown = teardown
        self.key = 0

    def apply(self) -> BdiLimit:
        """Set the limit; the teardown restores the old values."""
        try:
            ratio = read_text(self.base / "max_ratio_fine").strip()
            strict = read_text(self.base / "strict_limit").strip()
        except OSError as err:
            raise ArmSkipped(f"cannot read {self.base}: {err}") from None
        self.key = self.teardown.push("restore-bdi", self.bdi, ratio, strict, self.image)
        try:
            write_sysfs(self.base / "max_bytes", str(self.max_bytes))
            write_sysfs(self.base / "strict_limit", "1")
        except BenchError as err:
            self.teardown.undo(self.key)
            raise ArmSkipped(str(err)) from None
        log.debug("bdi %s: max_bytes=%d strict_limit=1", self.bdi, self.max_bytes)
        return self
