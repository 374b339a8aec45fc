"""``fusethrottle status``: formatting and mount lookup (pure, fast), the refresh loop on a fake
clock, the socket protocol in process, then the command against live mounts with the metrics
endpoint off."""

from __future__ import annotations

import bisect
import errno
import json
import os
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio
from engine_view import MadeUpMount
from mount_util import FUSETHROTTLE, LIFELONG_TASK, command_for_other_users, wait_for

from fusethrottle.observability import status, status_server
from fusethrottle.observability.metrics.definitions import ADMISSION_BUCKETS
from fusethrottle.observability.status_client import StatusError, _ask, find_mount_of, owner
from fusethrottle.observability.status_socket import client_dirs, socket_name
from fusethrottle.observability.status_view import fmt_bytes, fmt_count, fmt_seconds, format_status
from fusethrottle.service import mountinfo
from fusethrottle.service.mountinfo import MountInfo
from fusethrottle.service.options import Config

MiB = 1024 * 1024


# --- formatting ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (64 * MiB, "64.0 MiB"), (3 << 30, "3.0 GiB")],
)
def test_fmt_bytes(n: int, text: str) -> None:
    assert fmt_bytes(n) == text


@pytest.mark.parametrize(
    ("s", "text"),
    [(0.0042, "4.2 ms"), (0.25, "250 ms"), (4.21, "4.2 s"), (125, "2m05s"), (7500, "2h05m")],
)
def test_fmt_seconds(s: float, text: str) -> None:
    assert fmt_seconds(s) == text


def test_fmt_count() -> None:
    assert [fmt_count(n) for n in (7, 1500, 23_700_000)] == ["7", "1.5k", "23.7M"]


@pytest.fixture
def snapshot() -> dict[str, Any]:
    """A real status answer (Snapshot.to_json) of a made-up engine, as the daemon builds it."""
    config = Config(source="/mnt/nfs/backups", mountpoint="/backups", window=256 * MiB)
    assert config.mode == "adaptive"  # the default
    m = MadeUpMount(config)
    m.wrote(100 * MiB)
    m.request("write", MiB)
    m.request("lookup")
    for seconds in (1.0, 2.0, 3.0):
        m.fsyncs.fsync("batch", seconds, 32 * MiB, None)
    m.fsyncs.fsync("release", 0.5, MiB, None)
    # One measured fsync ends slow start (fed as Daemon._sampled does); a fast one leaves the
    # warming window where it is.
    s = m.stats
    m.controller.on_sample(1.0, 64 * MiB, 0.1, s.unsynced_bytes, s.window_bytes)
    # One write waited 0.2 s at the gate (the engine counts it in the bucket of its bound).
    waits = [0] * (len(ADMISSION_BUCKETS) + 1)
    waits[bisect.bisect_left(ADMISSION_BUCKETS, 0.2)] = 1
    m.stats = replace(
        s, throttled_writes=1, admission_waits=tuple(waits), admission_wait_seconds=0.2
    )
    m.errors.append(("write", errno.EIO, 1))
    return trio.run(_publish, m)


async def _publish(m: MadeUpMount) -> dict[str, Any]:
    return m.publisher.publish().to_json()


def test_format_status_shows_what_an_sre_asks_first(snapshot: dict[str, Any]) -> None:
    snapshot["unsynced_bytes"] = 64 * MiB
    snapshot["dirty_files"] = 2
    snapshot["oldest_unsynced_age_seconds"] = 6.1
    snapshot["rates"].update(span_seconds=10.0, written=20 * MiB, synced=19 * MiB)
    text = format_status(snapshot, now=snapshot["mount"]["started"] + 7500)
    lines = text.splitlines()
    assert lines[0].startswith("fusethrottle on /backups (source ")
    assert "up 2h05m, mode adaptive" in lines[0]
    assert "64.0 MiB of 256.0 MiB window (25%), 2 file(s), oldest 6.1 s" in text
    assert "write 20.0 MiB/s" in text and "synced 19.0 MiB/s (last 10 s)" in text
    assert "p50 1.0 s, p99 3.0 s, max 3.0 s (4 in 5 min)" in text
    assert "by reason: batch 3, release 1" in text
    assert "p99 wait <= 250 ms" in text
    assert "adaptive: window 256.0 MiB in [16.0 MiB, 2.0 GiB], target " in text
    assert "meter        efs: metered" in text
    assert "ceilings     metered none, ops none" in text
    assert "write EIO x1" in text
    assert "metrics off" in text
    assert all(len(line) <= 110 for line in lines[1:]), max(lines[1:], key=len)


def test_format_status_of_a_quiet_mount(snapshot: dict[str, Any]) -> None:
    for key in ("fsync_duration", "fsync_errors", "fsync_bytes"):
        snapshot[key] = {r: v for r, v in snapshot[key].items() if False}
    snapshot["fsync_recent"] = {"samples": 0, "p50": None, "p99": None, "max": None}
    snapshot["target_errors"] = []
    snapshot["admission_wait"]["counts"] = [0] * len(snapshot["admission_wait"]["counts"])
    snapshot["mount"].update(metered_limit=100 * MiB, ops_limit=7000.0)
    text = format_status(snapshot)
    assert "fsync        none in the last 5 min" in text
    assert "by reason: none yet" in text
    assert "errors       none from the target" in text
    assert "metered 100.0 MiB/s (0% used), ops 7.0k units/s (0% used)" in text


def test_status_says_where_the_targets_cache_goes_in_the_container_case(
    snapshot: dict[str, Any],
) -> None:
    """A daemon that stayed in the application's cgroup writes uncached: status says so."""
    snapshot.update(memory_cgroup_own=False, memory_cgroup="memory_cgroup=off")
    snapshot["target_writes_uncached"] = "the daemon shares the memory cgroup /kubepods/db"
    text = format_status(snapshot)
    assert "in the cgroup it started in: memory_cgroup=off" in text
    assert "writes leave no page in the target's cache (O_DIRECT)" in text
    snapshot["target_writes_uncached"] = ""
    assert "O_DIRECT" not in format_status(snapshot)


# What docs/METRICS.md shows, as the daemon would send it (up 2h14m, on the status of a busy
# backup). Written out by hand rather than taken from a snapshot, so the documented screen is pinned
# to the view alone.
GiB = 1024 * MiB
STARTED = 1_700_000_000.0
DOCUMENTED_ANSWER: dict[str, Any] = {
    "mount": {
        "mountpoint": "/backups",
        "source": "/mnt/nfs/backups",
        "pid": 4121,
        "started": STARTED,
        "mode": "adaptive",
        "batch": 64 * MiB,
        "max_age": 30.0,
        "window_min": 16 * MiB,
        "window_max": 2 * GiB,
        "meter": "efs",
        "metered_limit": 0,
        "ops_limit": 0,
        "metrics": "127.0.0.1:9420",
    },
    "window_bytes": 256 * MiB,
    "unsynced_bytes": int(181.3 * MiB),
    "dirty_files": 2,
    "oldest_unsynced_age_seconds": 6.1,
    "kernel_cache_bytes": 0,
    "reserved_bytes": MiB,
    "syncing_bytes": 64 * MiB,
    "rates": {
        "span_seconds": 10.0,
        "written": 19.6 * MiB,
        "read": 0.0,
        "synced": 19.9 * MiB,
        "metered": 19.7 * MiB,
        "units": 3100.0,
    },
    "written_bytes": int(148.2 * GiB),
    "read_bytes": 0,
    "synced_bytes": int(148.0 * GiB),
    "fsync_duration": {
        reason: {"bounds": [1.0, 10.0], "counts": [0, n, 0], "sum": 3.0 * n}
        for reason, n in (("batch", 2371), ("window", 12), ("age", 3), ("release", 40))
    },
    "fsync_errors": {},
    "fsync_recent": {"samples": 93, "p50": 3.2, "p99": 4.1, "max": 4.6},
    "fsyncs_in_flight": 1,
    "admission_wait": {"bounds": [0.01, 0.25, 1.0], "counts": [17000, 1211, 0, 0], "sum": 90.0},
    "waiting_writes": 1,
    "throttled_writes": 18211,
    "admission_timeouts": 0,
    "controller": {
        "mode": "adaptive",
        "window": 256 * MiB,
        "target_window": int(240.6 * MiB),
        "baseline_bytes_per_second": 41.2 * MiB,
        "recent_bytes_per_second": 19.9 * MiB,
        "samples": 2426,
        "holds": 0,
    },
    "meter": {
        "data_write": {
            "ops": 4.7e6,
            "bytes": int(148.2 * GiB),
            "metered_bytes": int(148.3 * GiB) - int(13.9 * MiB),
            "units": 23.7e6 - 15_500,
        },
        "data_read": {"ops": 0, "bytes": 0, "metered_bytes": 0, "units": 0},
        "meta_read": {"ops": 3100, "bytes": 0, "metered_bytes": int(4.1 * MiB), "units": 3100},
        "meta_write": {"ops": 2500, "bytes": 0, "metered_bytes": int(9.8 * MiB), "units": 12_400},
    },
    "ceiling_delayed": 0,
    "ceiling_delay_seconds": 0.0,
    "target_errors": [["getxattr", "ENODATA", 12], ["lookup", "ENOENT", 3040]],
    "memory_cgroup_own": True,
    "memory_cgroup": "/sys/fs/cgroup/fusethrottle/4121",
    "memory_cgroup_usage_bytes": int(1.1 * GiB),
    "memory_cgroup_limit_bytes": 2 * GiB + 512 * MiB,
    "page_cache_drops": 4219,
    "inodes": 212,
    "inodes_bound": 15000,
    "names_dropped": 0,
    "capability_question": "once per file (FUSE_HANDLE_KILLPRIV_V2)",
    "open_handles": 2,
    "device": "0:52",
}


def _documented_screen() -> str:
    """The example screen in docs/METRICS.md (the fenced block that starts like one)."""
    doc = (Path(__file__).resolve().parent.parent / "docs" / "METRICS.md").read_text()
    blocks = doc.split("```")[1::2]
    screens = [b.strip("\n") for b in blocks if b.lstrip("\n").startswith("fusethrottle on ")]
    assert len(screens) == 1, "docs/METRICS.md should show exactly one status screen"
    return screens[0]


def test_the_screen_is_the_one_documented() -> None:
    shown = format_status(DOCUMENTED_ANSWER, now=STARTED + 2 * 3600 + 14 * 60 + 30)
    assert shown == _documented_screen()


# --- finding the mount ---------------------------------------------------------------------

TABLE = [
    MountInfo("/", "8:1", "ext4", "/dev/sda1", "rw"),
    MountInfo("/backups", "0:52", "fuse.fusethrottle", "/mnt/nfs", "rw,user_id=0,group_id=0"),
    MountInfo("/srv", "0:60", "fuse.fusethrottle", "/a", "rw,user_id=1000,group_id=1000"),
    MountInfo("/srv", "0:61", "tmpfs", "tmpfs", "rw"),  # mounted on top of the fusethrottle one
]


def test_find_mount_of_the_mountpoint_and_paths_inside_it() -> None:
    assert find_mount_of("/backups", TABLE).device == "0:52"
    assert find_mount_of("/backups/", TABLE).device == "0:52"
    assert find_mount_of("/backups/db/2024/x.tar", TABLE).device == "0:52"
    assert owner(find_mount_of("/backups", TABLE)) == 0


def test_the_owner_names_whose_runtime_directory_to_try() -> None:
    assert [owner(entry) for entry in TABLE] == [None, 0, 1000, None]
    assert owner(MountInfo("/m", "0:9", "fuse.fusethrottle", "/s", "rw,user_id=")) is None


def test_a_path_that_is_not_on_a_fusethrottle_mount(tmp_path: Path) -> None:
    with pytest.raises(StatusError, match=r"is not a fusethrottle mount \(it is on ext4"):
        find_mount_of(str(tmp_path), [TABLE[0]])
    with pytest.raises(StatusError, match="no such file or directory"):
        find_mount_of(str(tmp_path / "missing"), [TABLE[0]])


def test_the_topmost_mount_wins() -> None:
    # /srv is covered by a tmpfs: the fusethrottle mount beneath it is not reachable there.
    with pytest.raises(StatusError, match="tmpfs"):
        find_mount_of("/srv", TABLE)


def test_socket_locations_for_root_and_users() -> None:
    assert client_dirs(0)[0] == "/run/fusethrottle"
    user = client_dirs(1000)
    assert "/run/user/1000/fusethrottle" in user and "/tmp/fusethrottle-1000" in user
    assert socket_name("0:52") == "0:52.sock"


def test_a_socket_directory_others_could_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(OSError, match="writable by others"):
        status_server._make_private_dir(str(shared))
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    with pytest.raises(OSError, match="not a directory"):
        status_server._make_private_dir(str(link))


# --- the socket protocol, in process -------------------------------------------------------


def _serve_and_ask(path: Path, device: str, asked: MountInfo, request: str) -> dict | str:
    answers = {"status": {"unsynced_bytes": 7}, "tasks": {"tasks": "t", "threads": "th"}}

    async def main() -> dict | str:
        async with trio.open_nursery() as nursery:
            await nursery.start(status_server.serve_socket, str(path), device, answers.__getitem__)
            try:
                return await trio.to_thread.run_sync(_ask, str(path), asked, request, 5.0)
            except StatusError as err:
                return str(err)
            finally:
                nursery.cancel_scope.cancel()

    return trio.run(main)


@pytest.fixture
def sock_path() -> Iterator[Path]:
    import tempfile

    directory = Path(tempfile.mkdtemp(prefix="ftst-", dir="/tmp"))  # AF_UNIX: short paths
    yield directory / "0:99.sock"
    for child in directory.iterdir():
        child.unlink()
    directory.rmdir()


def test_socket_round_trip(sock_path: Path) -> None:
    entry = MountInfo("/m", "0:99", "fuse.fusethrottle", "/s", "rw")
    assert _serve_and_ask(sock_path, "0:99", entry, "status") == {
        "unsynced_bytes": 7,
        "device": "0:99",
    }
    assert _serve_and_ask(sock_path, "0:99", entry, "tasks")["tasks"] == "t"  # type: ignore[index]
    assert "unknown request" in str(_serve_and_ask(sock_path, "0:99", entry, "reboot"))
    assert not sock_path.exists()  # removed when the task ends


def test_a_socket_of_another_mount_is_recognised(sock_path: Path) -> None:
    entry = MountInfo("/m", "0:98", "fuse.fusethrottle", "/s", "rw")
    assert "belongs to another mount" in str(_serve_and_ask(sock_path, "0:99", entry, "status"))


def test_a_daemon_that_does_not_answer_is_reported_as_stuck(sock_path: Path) -> None:
    entry = MountInfo("/m", "0:99", "fuse.fusethrottle", "/s", "rw")
    with socket.socket(socket.AF_UNIX) as stuck:  # accepted by the kernel, never answered
        stuck.bind(str(sock_path))
        stuck.listen(1)
        with pytest.raises(StatusError, match=r"did not answer within 0\.2 s"):
            _ask(str(sock_path), entry, "status", 0.2)


# --- the command, without a mount ----------------------------------------------------------


def test_status_of_a_directory_that_is_not_a_mount(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert status.main([str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a fusethrottle mount" in err[0]


def test_status_of_a_missing_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert status.main([str(tmp_path / "nope")]) == 1
    assert "no such file or directory" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [[], ["--interval", "0", "/x"], ["--bogus", "/x"], ["/x", "/y"], ["--count", "-1", "/x"]],
)
def test_status_usage_errors_are_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert status.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fusethrottle: status:")


# --- the refresh loop, on a fake clock -----------------------------------------------------
#
# `--watch` waits with the sleep main() is given. Here that sleep only moves a fake clock, and
# Ctrl-C is a KeyboardInterrupt raised from it once the clock would pass a given time, so each
# test knows exactly how many frames the logic must produce and when each one is asked for.


class FakeClock:
    def __init__(self, interrupt_after: float = float("inf")) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []
        self.interrupt_after = interrupt_after

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if self.now + seconds > self.interrupt_after:
            raise KeyboardInterrupt  # Ctrl-C while waiting for the next frame
        self.now += seconds


class FakeDaemon:
    """Stands in for find_mount_of and query: answers the documented status, noting when."""

    entry = MountInfo("/backups", "0:52", "fuse.fusethrottle", "/mnt/nfs", "rw,user_id=0")

    def __init__(self, clock: FakeClock, gone_at: int = 0) -> None:
        self.clock = clock
        self.asked: list[float] = []
        self.gone_at = gone_at  # the query that finds the daemon gone (1-based; 0: never)

    def find_mount_of(self, path: str) -> MountInfo:
        assert path == "/backups"
        return self.entry

    def query(self, entry: MountInfo, request: str = "status", timeout: float = 5.0) -> dict:
        assert request == "status" and timeout == 5.0
        self.asked.append(self.clock.now)
        if len(self.asked) == self.gone_at:
            raise StatusError("nobody listens on /run/fusethrottle/0:52.sock")
        return DOCUMENTED_ANSWER


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> FakeDaemon:
    fake = FakeDaemon(clock)
    monkeypatch.setattr(status, "find_mount_of", fake.find_mount_of)
    monkeypatch.setattr(status, "query", fake.query)
    return fake


def _frames(out: str) -> list[str]:
    """Text frames of a pipe's output (a blank line between two)."""
    frames = out.split("\n\n")
    assert all(f.startswith("fusethrottle on /backups ") for f in frames), out
    return frames


def test_watch_shows_a_frame_every_interval_until_interrupted(
    fake: FakeDaemon, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    clock.interrupt_after = 10.0
    assert status.main(["/backups", "--watch", "--interval", "2"], sleep=clock.sleep) == 0
    assert fake.asked == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    captured = capsys.readouterr()
    assert len(_frames(captured.out.rstrip("\n"))) == 6
    assert captured.err == ""  # Ctrl-C ends it quietly


def test_watch_count_stops_without_a_last_pause(
    fake: FakeDaemon, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["/backups", "-w", "-n", "0.5", "-c", "3"]
    assert status.main(argv, sleep=clock.sleep) == 0
    assert fake.asked == [0.0, 0.5, 1.0]
    assert clock.sleeps == [0.5, 0.5]
    assert len(_frames(capsys.readouterr().out.rstrip("\n"))) == 3


def test_without_watch_one_frame_and_no_pause(
    fake: FakeDaemon, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    assert status.main(["/backups", "--count", "5"], sleep=clock.sleep) == 0
    assert fake.asked == [0.0] and clock.sleeps == []
    out = capsys.readouterr().out
    assert out.startswith("fusethrottle on /backups ") and "\n\n" not in out


def test_watch_json_is_one_document_a_line(
    fake: FakeDaemon, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    assert status.main(["/backups", "-w", "--json", "-c", "2"], sleep=clock.sleep) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line) for line in lines] == [DOCUMENTED_ANSWER] * 2


def test_watch_on_a_terminal_redraws_in_place(
    fake: FakeDaemon,
    clock: FakeClock,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert status.main(["/backups", "-w", "-c", "3"], sleep=clock.sleep) == 0
    out = capsys.readouterr().out
    assert out.count(status.CLEAR_SCREEN) == 3 and out.startswith(status.CLEAR_SCREEN)
    assert "\n\n" not in out


def test_watch_ends_with_one_line_when_the_daemon_goes_away(
    fake: FakeDaemon, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.gone_at = 3
    assert status.main(["/backups", "--watch"], sleep=clock.sleep) == 1
    captured = capsys.readouterr()
    assert len(_frames(captured.out.rstrip("\n"))) == 2
    assert captured.err == "fusethrottle: nobody listens on /run/fusethrottle/0:52.sock\n"


def test_refresh_counts_frames_per_tick() -> None:
    """The loop alone: N frames take N - 1 pauses of the interval, whatever the interval."""
    for interval, count in ((0.1, 1), (2.0, 4), (60.0, 7)):
        clock, shown = FakeClock(), []
        frames = status.refresh(
            lambda clock=clock: f"at {clock.now:g}",
            lambda text, index, shown=shown: shown.append((index, text)),
            interval=interval,
            count=count,
            sleep=clock.sleep,
        )
        assert frames == count
        assert shown == [(i, f"at {i * interval:g}") for i in range(count)]
        assert clock.sleeps == [interval] * (count - 1)


# --- the command against live mounts (metrics endpoint off) --------------------------------


def _status(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [FUSETHROTTLE, "status", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.mount
def test_status_of_a_live_mount(make_mount) -> None:
    ft = make_mount(options=["mode=static", "batch=1M", "window=8M"])
    mnt = str(ft.mountpoint)
    (ft.mountpoint / "dir").mkdir()
    with open(ft.mountpoint / "dir" / "data", "wb") as f:
        f.write(b"z" * (3 * MiB))
        f.flush()
        one = _status(mnt)
        assert one.returncode == 0, one.stderr
        assert one.stdout.startswith(f"fusethrottle on {mnt} (source {ft.source})")
        for word in ("un-synced", "throughput", "fsync", "admission", "controller", "meter"):
            assert f"  {word}" in one.stdout
        assert "metrics off" in one.stdout

        raw = _status(mnt, "--json")
        assert raw.returncode == 0
        reply = json.loads(raw.stdout)
        assert reply["written_bytes"] == 3 * MiB
        assert reply["mount"]["pid"] == ft.pid
        assert reply["unsynced_bytes"] <= 8 * MiB
        assert reply["meter"]["data_write"]["bytes"] == 3 * MiB

    inside = _status(mnt + "/dir/data")  # any path on the mount will do
    assert inside.returncode == 0 and inside.stdout.startswith(f"fusethrottle on {mnt} ")

    tasks = _status(mnt, "--tasks")
    assert tasks.returncode == 0
    assert LIFELONG_TASK in tasks.stdout and "thread " in tasks.stdout


@pytest.mark.mount
def test_status_watch_refreshes(make_mount) -> None:
    ft = make_mount()
    mnt = str(ft.mountpoint)
    counted = _status(mnt, "--watch", "--interval", "0.1", "--count", "3")
    assert counted.returncode == 0, counted.stderr
    assert counted.stdout.count(f"fusethrottle on {mnt} ") == 3

    lines = _status(mnt, "--watch", "--json", "--interval", "0.1", "--count", "2")
    assert [json.loads(line)["device"] for line in lines.stdout.splitlines()] == [
        json.loads(lines.stdout.splitlines()[0])["device"]
    ] * 2

    # Until interrupted: Ctrl-C ends it quietly. How many frames a given time brings is the
    # fake-clock tests' business; here only the real signal, once the first frame is out.
    watcher = subprocess.Popen(
        [FUSETHROTTLE, "status", mnt, "--watch", "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As from a terminal: a background job of a non-interactive shell (CI) inherits SIGINT
        # ignored, and Python then installs no KeyboardInterrupt handler.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert watcher.stdout is not None
        ready, _, _ = select.select([watcher.stdout], [], [], 60)  # a hang guard, not a bound
        first = watcher.stdout.readline() if ready else ""
    finally:
        watcher.send_signal(signal.SIGINT)
        _, err = watcher.communicate(timeout=30)
    assert first.startswith(f"fusethrottle on {mnt} "), err
    assert watcher.returncode == 0, err
    assert err == ""


@pytest.mark.mount
def test_status_of_a_stuck_daemon_says_so(make_mount) -> None:
    ft = make_mount()
    assert wait_for(lambda: _status(str(ft.mountpoint)).returncode == 0, 10)  # fully started
    ft.freeze()  # teardown sends SIGCONT first
    # The message names the timeout it waited: proof enough that --timeout reached the socket
    # (a wall-clock bound would add nothing but flakes on a loaded machine).
    result = _status(str(ft.mountpoint), "--timeout", "0.5")
    assert result.returncode == 1
    assert "did not answer within 0.5 s" in result.stderr
    ft.signal(signal.SIGCONT)
    ft.stopped = False
    assert _status(str(ft.mountpoint)).returncode == 0


@pytest.mark.mount
def test_status_after_unmount(make_mount) -> None:
    ft = make_mount()
    device = json.loads(_status(str(ft.mountpoint), "--json").stdout)["device"]
    sockets = [Path(d) / f"{device}.sock" for d in client_dirs(os.geteuid())]
    assert any(p.exists() for p in sockets)
    assert ft.stop() == 0
    # The daemon removed its socket, unless a mount made since (by anyone on this host) got
    # the same device number, which the kernel hands out again at once.
    reused = any(entry.device == device for entry in mountinfo.mounts())
    assert reused or not any(p.exists() for p in sockets)
    result = _status(str(ft.mountpoint))
    assert result.returncode == 1
    assert "is not a fusethrottle mount" in result.stderr


@pytest.mark.mount
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a command as another user")
def test_status_for_another_local_user(make_mount) -> None:
    ft = make_mount()
    as_nobody = [
        *("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"),
        *command_for_other_users(),
    ]
    shown = subprocess.run(
        [*as_nobody, "status", str(ft.mountpoint)], capture_output=True, text=True, timeout=30
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"fusethrottle on {ft.mountpoint} ")
    tasks = subprocess.run(
        [*as_nobody, "status", str(ft.mountpoint), "--tasks"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert tasks.returncode == 1
    assert "only root and the daemon's user" in tasks.stderr


def test_a_flood_of_idle_clients_is_turned_away(sock_path: Path) -> None:
    entry = MountInfo("/m", "0:99", "fuse.fusethrottle", "/s", "rw")

    async def main() -> str:
        async with trio.open_nursery() as nursery:
            await nursery.start(status_server.serve_socket, str(sock_path), "0:99", lambda r: {})
            idle = []
            for _ in range(status_server.MAX_CLIENTS):
                s = socket.socket(socket.AF_UNIX)
                s.connect(str(sock_path))
                idle.append(s)
            await trio.sleep(0.1)
            try:
                await trio.to_thread.run_sync(_ask, str(sock_path), entry, "status", 5.0)
            except StatusError as err:
                return str(err)
            finally:
                for s in idle:
                    s.close()
                nursery.cancel_scope.cancel()
        return "answered"

    assert "hung up without answering" in trio.run(main)


def test_sockets_of_killed_daemons_are_swept(sock_path: Path) -> None:
    directory = sock_path.parent
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(directory / "0:1001.sock"))
    stale.close()  # the file stays, nobody listens: a daemon killed with SIGKILL
    with socket.socket(socket.AF_UNIX) as flushing:  # lazily unmounted, still flushing
        flushing.bind(str(directory / "0:1002.sock"))
        flushing.listen(1)
        status_server._sweep_stale(str(directory))
        assert sorted(p.name for p in directory.iterdir()) == ["0:1002.sock"]
