"""The engine: the C++ request loop (fusethrottle/engine) under the Python control plane.

The option rules and the status view first (pure), then real mounts: the engine really serves
them, injects fsyncs in batches while a file is written and when it is closed, a file the kernel
forgot before the end is synced on the target all the same (even with injection off), status
answers, a missing library is one clear line. Every other mount of the suite runs on it too.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import MakeMount
from mount_util import FUSETHROTTLE, status_json, wait_for

from fusethrottle.engine.native import LIBRARY_ENV, EngineStats, library_path
from fusethrottle.metering.meter import ClassTotals
from fusethrottle.observability.metrics import Recorder, families
from fusethrottle.observability.metrics.definitions import ADMISSION_BUCKETS
from fusethrottle.observability.metrics.engine_snapshot import EngineView, engine_snapshot
from fusethrottle.observability.metrics.snapshot import RateHistory
from fusethrottle.observability.status_view import format_status
from fusethrottle.service.memory_cgroup import OwnMemoryCgroup
from fusethrottle.service.options import OptionError, parse_options
from fusethrottle.service.placement import Placement
from fusethrottle.window.controller import make_controller

needs_engine = pytest.mark.skipif(
    not library_path().exists(), reason="the native engine is not built (scripts/install)"
)


def test_engine_native_from_older_mounts_still_mounts_and_python_says_it_is_gone() -> None:
    """fstab lines and units written while two data planes existed keep working; one that asks
    for the removed Python data plane is told so, not silently given the engine."""
    assert parse_options(["engine=native"]) == parse_options([])
    with pytest.raises(OptionError, match="the Python data plane was removed"):
        parse_options(["engine=python"])
    with pytest.raises(OptionError, match="'rust' is not native"):
        parse_options(["engine=rust"])


def _native_snapshot(stats: EngineStats, errors: list[tuple[str, int, int]]) -> dict[str, Any]:
    config = parse_options(
        ["mode=static", "window=64M", "metered_limit=10M"],
        source="/src",
        mountpoint="/mnt",
    )
    cgroup = OwnMemoryCgroup(1 << 30)
    cgroup.reason = "memory_cgroup=off"
    fsyncs = Recorder()
    fsyncs.fsync("batch", 0.5, 8 << 20, None)
    fsyncs.fsync("release", 2.0, 1 << 20, None)
    fsyncs.fsync("batch", 9.0, 4 << 20, errno.EIO)
    view = EngineView(stats, errors, make_controller(config), 64 << 20, 16 << 20)
    snap = engine_snapshot(
        config,
        Placement(cgroup, None, config),
        view,
        fsyncs,
        RateHistory(0.5, 10.0),
        started=0.0,
        now=1.0,
        sample=True,
    )
    # The series the exposition makes of it.
    exposed = {
        (x.name, x.labels.get("class")): x.value for m in families(snap, 0.0) for x in m.samples
    }
    metered = stats.meter.get("data_write")
    assert exposed[("fusethrottle_metered_bytes_total", "data_write")] == (
        metered.metered_bytes if metered else 0
    )
    return json.loads(json.dumps(snap.to_json()))


def test_a_native_mounts_status_is_the_same_picture_of_what_the_engine_counted() -> None:
    bounds = len(ADMISSION_BUCKETS) + 1
    stats = EngineStats(
        known_files=7,
        writeback_cache=True,
        written_bytes=900 << 20,
        window_bytes=48 << 20,
        unsynced_bytes=24 << 20,
        dirty_files=2,
        oldest_age=1.5,
        fsyncs=30,
        fsync_errors=1,
        throttled_writes=5,
        killpriv_v2=True,
        operations={"lookup": 40, "write": 900, "getxattr": 7, "forget": 3},
        meter={
            "data_read": ClassTotals(3, 3 << 10, 32 << 10, 3),
            "data_write": ClassTotals(900, 900 << 20, 900 << 20, 4500),
            "meta_read": ClassTotals(47, 0, 47 << 12, 47),
            "meta_write": ClassTotals(),
        },
        ceiling_delayed=12,
        ceiling_delay_seconds=3.5,
        admission_waits=(0, 0, 4, *([0] * (bounds - 4)), 1),
        open_handles=2,
        relief_high=15000,
        names_dropped=9,
        page_cache_drops=30,
    )
    answer = _native_snapshot(stats, [("lookup", errno.ENOENT, 3), ("write", errno.ENOSPC, 1)])
    assert answer["unsynced_bytes"] == 24 << 20
    assert answer["read_bytes"] == 3 << 10
    assert answer["target_operations"] == {"lookup": 40, "write": 900, "getxattr": 7}
    # The engine's error answers, and the injected fsync that failed.
    assert answer["target_errors"] == [
        ["fsync", "EIO", 1],
        ["lookup", "ENOENT", 3],
        ["write", "ENOSPC", 1],
    ]
    assert answer["admission_wait"]["counts"][2] == 4
    text = format_status(answer, now=60.0)
    assert text.splitlines()[0].endswith("mode static"), text
    assert "24.0 MiB of 64.0 MiB window (38%), 2 file(s)" in text, text
    assert "5 throttled, p99 wait > 2m00s" in text, text
    assert "by reason: batch 2, release 1" in text, text
    assert "data_write      900 ops   900.0 MiB   900.0 MiB metered     4.5k units" in text, text
    assert "metered 10.0 MiB/s" in text and "12 request(s) delayed, 3.5 s in all" in text, text
    assert "errors       fsync EIO x1, lookup ENOENT x3, write ENOSPC x1" in text, text
    assert "7 inodes held (bound 15000, 9 names handed back to the kernel), 2 open handles" in text
    assert "30 synced range(s) dropped" in text, text
    assert "security.capability asked once per file (FUSE_HANDLE_KILLPRIV_V2)" in text, text
    no_xattrs = _native_snapshot(
        EngineStats(known_files=0, writeback_cache=True, written_bytes=0, xattrs=False), []
    )
    assert no_xattrs["capability_question"] == "never (xattrs not served)"
    assert "errors       fsync EIO x1" in format_status(no_xattrs, now=1.0)


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def _thread_names(pid: int) -> set[str]:
    names = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            names.add((task / "comm").read_text().strip())
        except FileNotFoundError:
            continue  # a thread that just ended
    return names


@pytest.mark.mount
@needs_engine
def test_the_native_engine_serves_the_mount(make_mount: MakeMount) -> None:
    ft = make_mount(options=())
    (ft.mountpoint / "a").write_bytes(b"through the engine")
    assert ft.source is not None
    assert (ft.source / "a").read_bytes() == b"through the engine"
    assert "libfusethrottle_engine" in _maps(ft.pid)
    # `top -H`, perf and the lab's CPU count of the request threads tell them by name.
    assert {"ft-serve", "ft-sync", "ft-sync-decide"} <= _thread_names(ft.pid)
    # Logged once its own check from outside saw the mount answer: maybe after ours.
    assert wait_for(lambda: "with the native engine" in ft.log(), 30), ft.log()


@pytest.mark.mount
@needs_engine
def test_a_file_the_kernel_forgot_is_synced_on_the_target_before_the_end(
    make_memfs: Any, make_mount: MakeMount
) -> None:
    """A written, closed file whose inode the kernel evicts leaves the engine's table; its data
    must be fsynced on the target then (nothing could find the file at the end). mode=off: no
    release sync does it first."""
    target, record = make_memfs("target")
    ft = make_mount(source=target.mountpoint, options=("mode=off",), name="over-memfs")
    names = [f"f{i}" for i in range(20)]
    for name in names:
        (ft.mountpoint / name).write_bytes(name.encode() * 1000)
    Path("/proc/sys/vm/drop_caches").write_text("2")  # the kernel forgets unused inodes
    synced = lambda: all(f"fsync {n} " in record.read_text() for n in names)  # noqa: E731
    assert wait_for(synced, 30), record.read_text()[-2000:]
    assert ft.stop() == 0
    assert "all data synced" in ft.log()
    for name in names:
        assert (target.mountpoint / name).read_bytes() == name.encode() * 1000


@pytest.mark.mount
@needs_engine
def test_a_listing_with_attributes_hands_out_lookups_that_all_come_back(
    make_mount: MakeMount, workdir: Path
) -> None:
    """ls -l is served by READDIRPLUS: each entry carries its attributes and counts as a
    lookup the kernel will forget; the kernel needs no LOOKUP per entry. Miscounted, the engine
    would keep files forever (too many) or drop one the kernel still uses (too few)."""
    source = workdir / "listed"
    source.mkdir()
    for i in range(300):
        (source / f"f{i:03}").write_bytes(b"x" * i)
    ft = make_mount(source=source, options=())
    listing = subprocess.run(
        ["ls", "-ln", str(ft.mountpoint)], capture_output=True, text=True, check=True
    ).stdout.splitlines()[1:]
    sizes = {line.split()[-1]: int(line.split()[4]) for line in listing}
    assert sizes == {f"f{i:03}": i for i in range(300)}
    status = status_json(ft.mountpoint)
    assert status["operations"].get("readdirplus", 0) >= 1, status["operations"]
    assert status["operations"].get("lookup", 0) < 30, status["operations"]
    assert status["inodes"] == 300
    Path("/proc/sys/vm/drop_caches").write_text("2")  # the kernel forgets unused inodes
    assert wait_for(lambda: status_json(ft.mountpoint)["inodes"] == 0, 30)
    assert (ft.mountpoint / "f299").stat().st_size == 299  # still served after all that


@pytest.mark.mount
@needs_engine
def test_a_tree_removed_through_the_mount_leaves_nothing_held_and_a_clean_stop(
    make_mount: MakeMount,
) -> None:
    """rm -rf of files just written: the engine lets go of each file before its last name
    goes (no descriptor of a removed file stays open in the daemon: on NFS that would be a
    .nfsXXXX silly rename), and the times the kernel's cache still holds for the removed files
    are taken back at SIGTERM's syncfs without an error (it once failed the stop: exit 1)."""
    ft = make_mount(options=())
    tree = ft.mountpoint / "tree"
    tree.mkdir()
    for i in range(200):
        (tree / f"f{i}").write_bytes(b"y" * 5000)
    subprocess.run(["ls", "-lR", str(tree)], capture_output=True, check=True)
    subprocess.run(["rm", "-rf", str(tree)], check=True)
    held = [os.readlink(fd) for fd in Path(f"/proc/{ft.pid}/fd").iterdir()]
    assert not [link for link in held if link.endswith("(deleted)")], held
    ft.signal(signal.SIGTERM)
    assert ft.wait(60) == 0, ft.log()
    assert "failed" not in ft.log().replace("0 failed", ""), ft.log()
    assert ft.source is not None and list(ft.source.iterdir()) == []


@pytest.mark.mount
@pytest.mark.parametrize("foreground", [True, False], ids=["foreground", "background"])
def test_a_missing_engine_is_one_clear_line(workdir: Path, foreground: bool) -> None:
    """In the background too: the reason, not "the mount process exited" (the child's log
    goes to syslog there, where nobody who ran the command looks)."""
    (workdir / "src").mkdir()
    (workdir / "mnt").mkdir()
    env = {**os.environ, LIBRARY_ENV: str(workdir / "nowhere.so")}
    result = subprocess.run(
        [FUSETHROTTLE, str(workdir / "src"), str(workdir / "mnt"), *(["-f"] if foreground else [])],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines and "is not built" in lines[-1], result.stderr
    assert "Traceback" not in result.stderr


def _fsyncs_of(record: Path, name: str) -> int:
    return sum(1 for line in record.read_text().splitlines() if line.startswith(f"fsync {name} "))


@pytest.mark.mount
@needs_engine
def test_a_file_being_written_is_fsynced_in_batches_before_it_is_closed(
    make_memfs: Any, make_mount: MakeMount
) -> None:
    """What bounds the dirty data of a slow target: a file still open and being written is
    fsynced on the target every batch, not once at its close."""
    target, record = make_memfs("target")
    ft = make_mount(
        source=target.mountpoint,
        options=("mode=static", "batch=4M", "window=16M"),
        name="over-memfs",
    )
    block = os.urandom(1 << 20)
    with open(ft.mountpoint / "big", "wb", buffering=0) as f:
        for _ in range(48):
            f.write(block)
        assert wait_for(lambda: _fsyncs_of(record, "big") >= 3, 60), record.read_text()[-2000:]
    assert ft.stop() == 0
    assert (target.mountpoint / "big").read_bytes() == block * 48


@pytest.mark.mount
@needs_engine
def test_the_sync_of_a_closed_file_costs_the_target_no_stat(
    make_memfs: Any, make_mount: MakeMount
) -> None:
    """The sync injected once a written file is closed first asks whether the file still has a
    name: the target's client knows; asking the target (a plain stat) was a GETATTR on NFS for
    every file written and renamed (rsync's)."""
    target, record = make_memfs("target", log_attributes=True)
    ft = make_mount(source=target.mountpoint, options=(), name="over-memfs")
    (ft.mountpoint / "closed").write_bytes(b"synced once closed" * 500)
    assert wait_for(lambda: "fsync closed " in record.read_text(), 30), record.read_text()
    lines = record.read_text().splitlines()
    written = max(i for i, line in enumerate(lines) if line.startswith("write closed "))
    synced = next(i for i, line in enumerate(lines) if line.startswith("fsync closed "))
    assert "getattr closed" not in lines[written:synced], lines
    assert ft.stop() == 0
    assert (target.mountpoint / "closed").read_bytes() == b"synced once closed" * 500


@pytest.mark.mount
@needs_engine
def test_the_times_rsync_sets_cost_the_target_nothing_when_the_kernel_hands_them_back(
    make_memfs: Any, make_mount: MakeMount
) -> None:
    """rsync writes each file aside, sets its times and renames it over the name. The kernel's
    writeback cache keeps the mtime it was given and hands it back after the rename: the
    target has it already, and a stat to make sure was a GETATTR per file rsync wrote on NFS."""
    target, record = make_memfs("target", log_attributes=True)
    ft = make_mount(source=target.mountpoint, options=(), name="over-memfs")
    aside, final = ft.mountpoint / ".f.XXXXXX", ft.mountpoint / "f"
    aside.write_bytes(b"rsync's copy" * 300)
    then = 1_600_000_000_123_456_789
    os.utime(aside, ns=(then, then))
    assert "setattr .f.XXXXXX" in record.read_text()  # the times reached the target
    before = len(record.read_text().splitlines())
    os.rename(aside, final)
    os.sync()  # the kernel hands back what it holds of the file's times now
    after = record.read_text().splitlines()[before:]
    assert [line for line in after if ".f.XXXXXX" in line and "attr" in line] == []
    assert os.stat(final).st_mtime_ns == then
    assert ft.stop() == 0
    assert (target.mountpoint / "f").read_bytes() == b"rsync's copy" * 300


@pytest.mark.mount
@needs_engine
def test_a_closed_file_is_fsynced_without_waiting_for_the_end(
    make_memfs: Any, make_mount: MakeMount
) -> None:
    target, record = make_memfs("target")
    ft = make_mount(source=target.mountpoint, options=(), name="over-memfs")
    (ft.mountpoint / "small").write_bytes(b"closed, so synced" * 100)
    assert wait_for(lambda: _fsyncs_of(record, "small") >= 1, 30), record.read_text()[-2000:]
    status = subprocess.run(
        [FUSETHROTTLE, "status", str(ft.mountpoint)], capture_output=True, text=True, timeout=30
    )
    assert status.returncode == 0, status.stderr
    assert "by reason: release 1" in status.stdout, status.stdout
    assert ft.stop() == 0


@pytest.mark.mount
@needs_engine
def test_status_says_whether_the_kernel_reads_files_itself(make_mount: MakeMount) -> None:
    """FUSE passthrough needs libfuse 3.17 and the writeback cache off: status says which, so
    an operator on Debian 12 knows why a restore runs through the daemon."""
    from fusethrottle.engine.native import PASSTHROUGH, libfuse_version

    daemon = make_mount(options=["writeback_cache=no"])
    (daemon.mountpoint / "r.bin").write_bytes(b"x" * 65536)
    assert (daemon.mountpoint / "r.bin").read_bytes() == b"x" * 65536
    said = status_json(daemon.mountpoint)["passthrough"]
    major, minor = (int(p) for p in libfuse_version().split(".")[:2])
    if (major, minor) < (3, 17):
        assert said == PASSTHROUGH[0]
    else:
        assert said.startswith("on, ") or said in PASSTHROUGH.values(), said
    assert (
        "reads: kernel passthrough"
        in subprocess.run(
            [FUSETHROTTLE, "status", str(daemon.mountpoint)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
