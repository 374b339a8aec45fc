"""``fusethrottle status``: formatting and mount lookup (pure, fast), the socket protocol in
process, then the command against live mounts with the metrics endpoint off."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from mount_util import FUSETHROTTLE, command_for_other_users, wait_for

from fusethrottle import daemon, status
from fusethrottle.metrics import Metrics, TargetMeter
from fusethrottle.options import Config
from fusethrottle.status import (
    MountEntry,
    StatusError,
    find_mount_of,
    fmt_bytes,
    fmt_count,
    fmt_seconds,
    format_status,
)

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
def snapshot(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A real status answer (Snapshot.to_json) of a built, unmounted mount."""
    config = Config(source=str(tmp_path), mountpoint="/backups", mode="adaptive", window=256 * MiB)
    m = Metrics(config, TargetMeter(config.meter))
    m.mount = daemon.build(config, m.recorder, m.recorder.target)
    try:
        yield trio.run(_publish, m)
    finally:
        m.mount.inodes.close_all()
        os.close(m.mount.inodes[1].path_fd)


async def _publish(m: Metrics) -> dict[str, Any]:
    rec = m.recorder
    rec.bytes_written(100 * MiB)
    rec.target("write", MiB)
    rec.target("lookup", 0)
    for seconds in (1.0, 2.0, 3.0):
        rec.fsync("batch", seconds, 32 * MiB, None)
    rec.fsync("release", 0.5, MiB, None)
    # One measured fsync ends slow start; a fast one leaves the warming window where it is.
    m.mount.controller.on_sample(1.0, 64 * MiB, 0.1, 64 * MiB)
    rec.admission_wait(0.2)
    rec.target_error("write", 5)
    return m.publish().to_json()


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


# --- finding the mount ---------------------------------------------------------------------

TABLE = [
    MountEntry("/", "8:1", "ext4", "/dev/sda1", "rw"),
    MountEntry("/backups", "0:52", "fuse.fusethrottle", "/mnt/nfs", "rw,user_id=0,group_id=0"),
    MountEntry("/srv", "0:60", "fuse.fusethrottle", "/a", "rw,user_id=1000,group_id=1000"),
    MountEntry("/srv", "0:61", "tmpfs", "tmpfs", "rw"),  # mounted on top of the fusethrottle one
]


def test_find_mount_of_the_mountpoint_and_paths_inside_it() -> None:
    assert find_mount_of("/backups", TABLE).device == "0:52"
    assert find_mount_of("/backups/", TABLE).device == "0:52"
    assert find_mount_of("/backups/db/2024/x.tar", TABLE).device == "0:52"
    assert find_mount_of("/backups", TABLE).owner == 0


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
    assert status.client_dirs(0)[0] == "/run/fusethrottle"
    user = status.client_dirs(1000)
    assert "/run/user/1000/fusethrottle" in user and "/tmp/fusethrottle-1000" in user
    assert status.socket_name("0:52") == "0:52.sock"


def test_a_socket_directory_others_could_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(OSError, match="writable by others"):
        status._make_private_dir(str(shared))
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    with pytest.raises(OSError, match="not a directory"):
        status._make_private_dir(str(link))


# --- the socket protocol, in process -------------------------------------------------------


def _serve_and_ask(path: Path, device: str, asked: MountEntry, request: str) -> dict | str:
    answers = {"status": {"unsynced_bytes": 7}, "tasks": {"tasks": "t", "threads": "th"}}

    async def main() -> dict | str:
        async with trio.open_nursery() as nursery:
            await nursery.start(status.serve_socket, str(path), device, answers.__getitem__)
            try:
                return await trio.to_thread.run_sync(status._ask, str(path), asked, request, 5.0)
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
    entry = MountEntry("/m", "0:99", "fuse.fusethrottle", "/s", "rw")
    assert _serve_and_ask(sock_path, "0:99", entry, "status") == {
        "unsynced_bytes": 7,
        "device": "0:99",
    }
    assert _serve_and_ask(sock_path, "0:99", entry, "tasks")["tasks"] == "t"  # type: ignore[index]
    assert "unknown request" in str(_serve_and_ask(sock_path, "0:99", entry, "reboot"))
    assert not sock_path.exists()  # removed when the task ends


def test_a_socket_of_another_mount_is_recognised(sock_path: Path) -> None:
    entry = MountEntry("/m", "0:98", "fuse.fusethrottle", "/s", "rw")
    assert "belongs to another mount" in str(_serve_and_ask(sock_path, "0:99", entry, "status"))


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
    assert "Flusher.run" in tasks.stdout and "thread " in tasks.stdout


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

    # Until interrupted: Ctrl-C ends it quietly.
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
        time.sleep(1.0)
    finally:
        watcher.send_signal(signal.SIGINT)
        out, err = watcher.communicate(timeout=10)
    assert watcher.returncode == 0, err
    assert out.count(f"fusethrottle on {mnt} ") >= 2


@pytest.mark.mount
def test_status_of_a_stuck_daemon_says_so(make_mount) -> None:
    ft = make_mount()
    assert wait_for(lambda: _status(str(ft.mountpoint)).returncode == 0, 10)  # fully started
    ft.signal(signal.SIGSTOP)
    ft.stopped = True  # teardown sends SIGCONT first
    started = time.monotonic()
    result = _status(str(ft.mountpoint), "--timeout", "0.5")
    assert result.returncode == 1
    assert "did not answer within 0.5 s" in result.stderr
    assert time.monotonic() - started < 10
    ft.signal(signal.SIGCONT)
    ft.stopped = False
    assert _status(str(ft.mountpoint)).returncode == 0


@pytest.mark.mount
def test_status_after_unmount(make_mount) -> None:
    ft = make_mount()
    device = json.loads(_status(str(ft.mountpoint), "--json").stdout)["device"]
    sockets = [Path(d) / f"{device}.sock" for d in status.client_dirs(os.geteuid())]
    assert any(p.exists() for p in sockets)
    assert ft.stop() == 0
    # The daemon removed its socket, unless a mount made since (by anyone on this host) got
    # the same device number, which the kernel hands out again at once.
    reused = any(entry.device == device for entry in status.mount_table())
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
    import socket

    entry = MountEntry("/m", "0:99", "fuse.fusethrottle", "/s", "rw")

    async def main() -> str:
        async with trio.open_nursery() as nursery:
            await nursery.start(status.serve_socket, str(sock_path), "0:99", lambda r: {})
            idle = []
            for _ in range(status.MAX_CLIENTS):
                s = socket.socket(socket.AF_UNIX)
                s.connect(str(sock_path))
                idle.append(s)
            await trio.sleep(0.1)
            try:
                await trio.to_thread.run_sync(status._ask, str(sock_path), entry, "status", 5.0)
            except StatusError as err:
                return str(err)
            finally:
                for s in idle:
                    s.close()
                nursery.cancel_scope.cancel()
        return "answered"

    assert "hung up without answering" in trio.run(main)


def test_sockets_of_killed_daemons_are_swept(sock_path: Path) -> None:
    import socket

    directory = sock_path.parent
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(directory / "0:1001.sock"))
    stale.close()  # the file stays, nobody listens: a daemon killed with SIGKILL
    with socket.socket(socket.AF_UNIX) as flushing:  # lazily unmounted, still flushing
        flushing.bind(str(directory / "0:1002.sock"))
        flushing.listen(1)
        status._sweep_stale(str(directory))
        assert sorted(p.name for p in directory.iterdir()) == ["0:1002.sock"]
