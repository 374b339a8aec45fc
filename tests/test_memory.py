"""Memory a backup leaves to its neighbours (issue 15), on a real ext4 loop target.

What a user cares about, in the container case (the database, the backup and the daemon in
one memory cgroup): the daemon takes the target's page cache into a memory cgroup of its own;
once the target has the data, neither the mount's nor the target's copy stays in the
application's cgroup; and an injected sync never puts a whole batch under writeback at once
(reclaim in the cgroup waits for pages under writeback). Each is checked against the option
that turns it off, in the same test, so every assertion can fail.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import MakeMount
from mount_util import FUSETHROTTLE, start_fusethrottle
from slow_target import SlowTarget, skip_reason, slow_target

from bench.system import resident_bytes

MiB = 1 << 20
MEMORY = Path("/sys/fs/cgroup/memory")


def _skip() -> str | None:
    return skip_reason() or (None if MEMORY.is_dir() else "no cgroup-v1 memory controller")


pytestmark = [
    pytest.mark.mount,
    pytest.mark.slow_target,
    pytest.mark.skipif(_skip() is not None, reason=_skip() or ""),
]


@pytest.fixture
def target() -> Iterator[SlowTarget]:
    with slow_target(size="2G", rate=0) as t:
        yield t


def _own_memory_cgroup() -> Path:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return MEMORY / path.lstrip("/")
    raise AssertionError("no memory cgroup")


@contextlib.contextmanager
def memory_cgroup(name: str, limit: int = 1 << 30) -> Iterator[Path]:
    """A memory cgroup below ours (the 'container'); emptied and removed afterwards."""
    parent = _own_memory_cgroup()
    path = parent / f"{name}-{os.getpid()}"
    path.mkdir()
    try:
        (path / "memory.limit_in_bytes").write_text(str(limit))
        yield path
    finally:
        for pid in (path / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (parent / "cgroup.procs").write_text(pid)
        with contextlib.suppress(OSError):
            (path / "memory.force_empty").write_text("0")
        with contextlib.suppress(OSError):  # made by a daemon that saw this cgroup as its root
            (path / "fusethrottle").rmdir()
        path.rmdir()


def stat_of(cgroup: Path) -> dict[str, int]:
    out = {}
    for line in (cgroup / "memory.stat").read_text().splitlines():
        key, _, value = line.partition(" ")
        out[key] = int(value)
    return out


def source_and_mountpoint(target: SlowTarget, workdir: Path, label: str) -> tuple[Path, Path]:
    """A fresh backing directory on the target and a mount point for one arm of a test."""
    source = target.mountpoint / f"backups-{label}"
    source.mkdir()
    mnt = workdir / f"mnt-{label}"
    mnt.mkdir()
    return source, mnt


def write_inside(cgroup: Path, source: Path, dest: Path, mib: int = 192) -> None:
    """Copy the first *mib* MiB of *source* to *dest* with dd from a process in *cgroup* (its
    pages are charged there), 1 MiB writes, buffered, as a backup tool writes."""
    script = (
        f"echo $$ > {cgroup}/cgroup.procs && "
        f"exec dd if={source} of={dest} bs=1M count={mib} status=none"
    )
    subprocess.run(["sh", "-c", script], check=True, timeout=300)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 * MiB):
            digest.update(chunk)
    return digest.hexdigest()


@pytest.fixture
def payload(workdir: Path) -> Path:
    path = workdir / "payload"
    with open(path, "wb") as f:
        for _ in range(192):
            f.write(os.urandom(MiB))
    return path


def wait_until_synced(mnt: Path, timeout: float = 120.0) -> dict:
    """Poll ``status --json`` until nothing is un-synced (the last sync has dropped its range)."""
    deadline = time.monotonic() + timeout
    while True:
        out = subprocess.run(
            [FUSETHROTTLE, "status", str(mnt), "--json"], capture_output=True, text=True, timeout=30
        )
        snap = json.loads(out.stdout) if out.returncode == 0 else {}
        if snap and snap["unsynced_bytes"] == 0 and snap["fsyncs_in_flight"] == 0:
            time.sleep(0.5)  # the drop messages go out right after the sync
            return snap
        assert time.monotonic() < deadline, out.stdout + out.stderr
        time.sleep(0.2)


def daemon_memory_cgroup(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return path
    return ""


def test_by_default_the_backup_leaves_no_cache_in_the_applications_cgroup(
    target: SlowTarget, workdir: Path, payload: Path
) -> None:
    """Daemon and writer start in one memory cgroup. The daemon moves to a cgroup of its own
    (with a limit), the synced data leaves both page caches, and the cgroup is gone at exit."""
    source = target.mountpoint / "backups"
    source.mkdir()
    mnt = workdir / "mnt"
    mnt.mkdir()
    with memory_cgroup("ft-container") as container:
        daemon = start_fusethrottle(source, mnt, [], cgroup=container)
        try:
            own = daemon_memory_cgroup(daemon.pid)
            assert own == f"/fusethrottle/{daemon.pid}", own
            limit = int((MEMORY / own.lstrip("/") / "memory.limit_in_bytes").read_text())
            assert limit == (2048 + 512) * MiB  # window_max + 512M, the documented default
            write_inside(container, payload, mnt / "backup.bin")
            snap = wait_until_synced(mnt)
            cached = stat_of(container)["cache"]  # the mount is still there, and its cache
            assert snap["memory_cgroup_own"] and snap["page_cache_drops"] > 0, snap
            assert daemon.stop() == 0
        finally:
            daemon.stop()
    assert not (MEMORY / own.lstrip("/")).exists(), "the daemon's cgroup outlived it"
    assert cached < 48 * MiB, f"{cached / MiB:.0f} MiB of a 192 MiB backup stayed cached"
    assert sha256_of(source / "backup.bin") == sha256_of(payload)


def test_over_a_tmpfs_target_the_daemon_takes_no_memory_limit(
    make_mount: MakeMount, workdir: Path
) -> None:
    """A tmpfs target's files are its page cache and cannot be reclaimed: under a limit of its
    own the daemon would be killed by the OOM killer once they fill it (a million small files
    did). It stays where it started and says why; the backup still arrives."""
    tmpfs = workdir / "tmpfs"
    tmpfs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(tmpfs)], check=True)
    try:
        before = daemon_memory_cgroup(os.getpid())
        mnt = make_mount(tmpfs)
        assert daemon_memory_cgroup(mnt.pid) == before
        (mnt.mountpoint / "backup.bin").write_bytes(b"x" * MiB)
        out = subprocess.run(
            [FUSETHROTTLE, "status", str(mnt.mountpoint), "--json"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        snap = json.loads(out.stdout)
        assert not snap["memory_cgroup_own"]
        assert "SOURCE is on tmpfs" in snap["memory_cgroup"], snap["memory_cgroup"]
        assert mnt.stop() == 0
        assert (tmpfs / "backup.bin").read_bytes() == b"x" * MiB
    finally:
        subprocess.run(["umount", "-l", str(tmpfs)], check=False)


def test_in_a_shared_cgroup_synced_data_is_dropped_unless_told_to_keep_it(
    target: SlowTarget, workdir: Path, payload: Path
) -> None:
    """memory_cgroup=off (a daemon confined to the container): the mount's and the target's
    copies of the backup are both charged to the container. By default they are dropped as
    the target commits them; with drop_synced=no they stay."""
    cached: dict[str, int] = {}
    shared = ["memory_cgroup=off", "target_io=buffered"]  # the target's page cache in it too
    variants = {"drop": shared, "keep": [*shared, "drop_synced=no"]}
    for label, options in variants.items():
        source, mnt = source_and_mountpoint(target, workdir, label)
        with memory_cgroup(f"ft-{label}") as container:
            daemon = start_fusethrottle(source, mnt, options, cgroup=container)
            try:
                assert daemon_memory_cgroup(daemon.pid).endswith(container.name)
                write_inside(container, payload, mnt / "backup.bin")
                wait_until_synced(mnt)
                cached[label] = stat_of(container)["cache"]  # before the unmount frees some
                assert daemon.stop() == 0
            finally:
                daemon.stop()
        assert sha256_of(source / "backup.bin") == sha256_of(payload)
    assert cached["drop"] < 48 * MiB, cached
    assert cached["keep"] > 300 * MiB, cached  # both copies, nearly whole


class WritebackPeak:
    """Largest 'writeback' of a memory cgroup, sampled every 10 ms."""

    def __init__(self, cgroup: Path) -> None:
        self.cgroup = cgroup
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            with contextlib.suppress(OSError, KeyError):
                self.peak = max(self.peak, stat_of(self.cgroup)["writeback"])

    def __enter__(self) -> WritebackPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


EXPIRE = Path("/proc/sys/vm/dirty_expire_centisecs")


@contextlib.contextmanager
def kernel_expiry_after(seconds: int) -> Iterator[None]:
    """vm.dirty_expire_centisecs raised for the block, restored after. The kernel's periodic
    write-back takes a file once it has been dirty that long (30 s by default) and puts every
    dirty page of it under write-back at once, every 5 s after: a file written without a
    pause counts from its first write, whatever the daemon synced since (an fdatasync leaves
    the inode on the flusher's list). That is the kernel's, not the daemon's: on a 1.5 MiB/s
    target, 29 MiB went under write-back at once 30 s after the first write, 2 MiB with the
    expiry raised (docs/DESIGN.md, writeback_pieces)."""
    before = EXPIRE.read_text()
    EXPIRE.write_text(str(seconds * 100))
    try:
        yield
    finally:
        EXPIRE.write_text(before)


def test_an_injected_sync_puts_pieces_under_writeback_not_the_batch(
    target: SlowTarget, workdir: Path, payload: Path
) -> None:
    """On an 8 MiB/s target with 32 MiB batches, one fsync would put 32 MiB under writeback,
    4 s of waiting for any reclaim that meets it; in pieces of a tenth of a second of the
    target's rate, a few MiB. Writeback cache off, so the cgroup's writeback pages are the
    target's alone; the kernel's own periodic write-back held off (kernel_expiry_after): this
    is about what the daemon's syncs put there."""
    target.throttle(8 * MiB)
    peaks: dict[str, int] = {}
    # The target's page cache in the shared cgroup: the daemon writes through it.
    base = ["memory_cgroup=off", "target_io=buffered", "writeback_cache=no"]
    base += ["mode=static", "window=64M", "batch=32M"]
    for label, extra in (("pieces", []), ("whole", ["writeback_pieces=no"])):
        source, mnt = source_and_mountpoint(target, workdir, label)
        with memory_cgroup(f"ft-{label}") as container, kernel_expiry_after(600):
            daemon = start_fusethrottle(source, mnt, base + extra, cgroup=container)
            try:
                with WritebackPeak(container) as sampler:
                    write_inside(container, payload, mnt / "backup.bin", 96)
                    assert daemon.stop() == 0
            finally:
                daemon.stop()
            peaks[label] = sampler.peak
        with open(payload, "rb") as f:
            first = hashlib.sha256(f.read(96 * MiB)).hexdigest()
        assert sha256_of(source / "backup.bin") == first
    assert peaks["pieces"] <= 8 * MiB, peaks
    assert peaks["whole"] >= 16 * MiB, peaks


@pytest.mark.parametrize("cache", ["auto", "yes"])
def test_a_daemon_in_the_applications_cgroup_leaves_no_target_page_in_it(
    target: SlowTarget, workdir: Path, payload: Path, cache: str
) -> None:
    """The container case (memory_cgroup=off: daemon, backup and application in one cgroup).
    The application's reclaim in a cgroup-v1 cgroup waits for any page of it under write-back:
    behind a slow target, for seconds. By default (target_io=auto) the daemon then writes to
    the target with O_DIRECT, and its last partial pages through the cache, written back and
    dropped at once: none of the target's pages stays in the cgroup, dirty, under write-back
    or at all; and the mount goes without its writeback cache (writeback_cache=auto), whose
    pages would wait for the target in the same cgroup. With target_io=buffered (the default
    where the daemon has a cgroup of its own) the target's pages pile up there until synced."""
    target.throttle(8 * MiB)
    peaks: dict[str, int] = {}
    base = ["memory_cgroup=off", "mode=static", "window=64M"]
    if cache != "auto":
        base.append(f"writeback_cache={cache}")
    for label, extra in (("auto", []), ("buffered", ["target_io=buffered"])):
        source, mnt = source_and_mountpoint(target, workdir, label)
        with memory_cgroup(f"ft-direct-{label}") as container:
            daemon = start_fusethrottle(source, mnt, base + extra, cgroup=container)
            try:
                with TargetCachePeak(source / "backup.bin") as sampler:
                    # 48 MiB and a bit: the last page is a partial one.
                    write_inside(container, payload, mnt / "backup.bin", 48)
                    with open(mnt / "backup.bin", "ab") as f:
                        f.write(b"tail" * 1000)
                    assert daemon.stop() == 0
            finally:
                daemon.stop()
            peaks[label] = sampler.peak
            if label == "auto":
                said = [line for line in daemon.log().splitlines() if "leave nothing" in line]
                assert said, daemon.log()
                assert ("without the writeback cache" in said[0]) == (cache == "auto"), said
        with open(payload, "rb") as f:
            expected = f.read(48 * MiB) + b"tail" * 1000
        assert (source / "backup.bin").read_bytes() == expected
    assert peaks["auto"] <= 1 * MiB, peaks
    assert peaks["buffered"] >= 16 * MiB, peaks


def test_a_daemon_inside_a_containers_cgroup_namespace_leaves_no_target_page_in_it(
    target: SlowTarget, workdir: Path, payload: Path
) -> None:
    """A container as Kubernetes and Docker on cgroup v2 make one: a cgroup namespace whose root
    is the container's cgroup, with its limit, and the memory hierarchy mounted from there. The
    daemon, started there with its defaults, sees itself at the hierarchy's root (and, given the
    right, makes a cgroup of its own below it, still under the container's limit): the
    database's reclaim in the container would meet the target's pages all the same. It writes
    to the target uncached and says whose limit it shares; with target_io=buffered the target's
    pages pile up in the container."""
    target.throttle(8 * MiB)
    peaks: dict[str, int] = {}
    for label, options in (
        ("auto", "mode=static,window=64M"),
        ("buffered", "mode=static,window=64M,target_io=buffered"),
    ):
        source, mnt = source_and_mountpoint(target, workdir, label)
        log = workdir / f"daemon-{label}.log"
        # The mount namespace is the container's too: the mount is used from inside it.
        inside = (
            "umount /sys/fs/cgroup/memory && mount -t cgroup -o memory ftcontainer "
            "/sys/fs/cgroup/memory && "
            f"{{ {FUSETHROTTLE} {source} {mnt} -f -o {options} > {log} 2>&1 & }} && "
            f"for i in $(seq 300); do mountpoint -q {mnt} && break; sleep 0.1; done && "
            f"dd if={payload} of={mnt}/backup.bin bs=1M count=48 status=none && "
            "kill -TERM $! && wait $!"
        )
        with memory_cgroup(f"ft-ns-{label}") as container:
            with TargetCachePeak(source / "backup.bin") as sampler:
                done = subprocess.run(
                    [
                        "sh",
                        "-c",
                        f'echo $$ > {container}/cgroup.procs && exec "$@"',
                        "sh",
                        *("unshare", "--cgroup", "--mount", "--propagation", "private"),
                        *("sh", "-c", inside),
                    ],
                    timeout=300,
                )
            peaks[label] = sampler.peak
        said = log.read_text()
        assert done.returncode == 0, said
        if label == "auto":
            assert "leave nothing" in said and "a container's" in said, said
        with open(payload, "rb") as f:
            assert sha256_of(source / "backup.bin") == hashlib.sha256(f.read(48 * MiB)).hexdigest()
    assert peaks["auto"] <= 1 * MiB, peaks
    assert peaks["buffered"] >= 16 * MiB, peaks


class TargetCachePeak:
    """Largest share of the target's copy of a file in the page cache (mincore), every 10 ms:
    pages the daemon's writes left there, charged to the daemon's memory cgroup."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, resident_bytes(self.path))

    def __enter__(self) -> TargetCachePeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
