"""sd_notify against a real AF_UNIX datagram socket standing in for systemd's notify socket."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

from fusethrottle.service import sdnotify

_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests run under whatever manager started pytest; none of its variables may leak in."""
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sdnotify, "_warned", False)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: AF_UNIX paths are limited to 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="sdn-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def manager(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A bound datagram socket named in NOTIFY_SOCKET, like the one PID 1 listens on."""
    path = short_dir / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(0)
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        yield sock


def received(sock: socket.socket) -> list[bytes]:
    """Every datagram waiting on *sock*, in order."""
    out = []
    while True:
        try:
            out.append(sock.recv(4096))
        except BlockingIOError:
            return out


def test_without_notify_socket_is_a_quiet_no_op(caplog: pytest.LogCaptureFixture) -> None:
    assert sdnotify.notify("READY=1") is False
    assert caplog.records == []


def test_ready_reaches_the_socket_verbatim(manager: socket.socket) -> None:
    assert sdnotify.notify("READY=1") is True
    assert sdnotify.notify("STATUS=flushing 3 files\nSTOPPING=1") is True
    assert received(manager) == [b"READY=1", b"STATUS=flushing 3 files\nSTOPPING=1"]


def test_abstract_socket_name(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"fusethrottle-test-{os.getpid()}-{id(monkeypatch)}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(0)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert sdnotify.notify("READY=1") is True
        assert received(sock) == [b"READY=1"]


def test_manager_sees_our_pid(manager: socket.socket) -> None:
    """systemd accepts READY=1 only from the main PID (NotifyAccess=main), which it reads from
    the socket credentials: the datagram must come from this process, not a helper."""
    manager.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    assert sdnotify.notify("READY=1")
    ucred = struct.calcsize("3i")
    message, ancdata, _flags, _addr = manager.recvmsg(4096, socket.CMSG_SPACE(ucred))
    assert message == b"READY=1"
    wanted = (socket.SOL_SOCKET, socket.SCM_CREDENTIALS)
    creds = [data for level, kind, data in ancdata if (level, kind) == wanted]
    assert len(creds) == 1
    pid, uid, _gid = struct.unpack("3i", creds[0][:ucred])
    assert (pid, uid) == (os.getpid(), os.getuid())


def test_missing_socket_returns_false_and_warns_once(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(short_dir / "gone"))
    with caplog.at_level(logging.DEBUG, logger=sdnotify.__name__):
        assert sdnotify.notify("READY=1") is False
        assert sdnotify.notify("WATCHDOG=1") is False
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "READY=1" in warnings[0].getMessage()


def test_socket_of_the_wrong_type_does_not_raise(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = short_dir / "stream"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(path))
        sock.listen()
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        assert sdnotify.notify("READY=1") is False


@pytest.mark.parametrize("value", ["vsock:2:1234", "relative/path", "@"])
def test_unsupported_address_returns_false(
    value: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", value)
    assert sdnotify.notify("READY=1") is False
    assert [r.levelno for r in caplog.records] == [logging.WARNING]


@pytest.mark.parametrize(
    ("usec", "pid", "expected"),
    [
        (None, None, None),
        ("2000000", None, 2.0),
        ("1500", "self", 0.0015),
        ("2000000", "other", None),
        ("2000000", "not-a-pid", None),
        ("0", None, None),
        ("-5", None, None),
        ("soon", None, None),
        ("", None, None),
    ],
)
def test_watchdog_interval(
    usec: str | None, pid: str | None, expected: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if usec is not None:
        monkeypatch.setenv("WATCHDOG_USEC", usec)
    if pid is not None:
        value = {"self": str(os.getpid()), "other": str(os.getpid() + 1)}.get(pid, pid)
        monkeypatch.setenv("WATCHDOG_PID", value)
    assert sdnotify.watchdog_interval() == expected


def run_watchdog_for(seconds: float) -> bool:
    """Run watchdog_task on a virtual clock for *seconds*; True if it was still running."""
    still_running = False

    async def main() -> None:
        nonlocal still_running
        async with trio.open_nursery() as nursery:
            await nursery.start(sdnotify.watchdog_task)
            await trio.sleep(seconds)
            still_running = bool(nursery.child_tasks)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return still_running


def test_watchdog_pings_at_half_the_interval(
    manager: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert run_watchdog_for(2.6) is True
    # t = 0, 0.5, 1.0, 1.5, 2.0, 2.5
    assert received(manager) == [b"WATCHDOG=1"] * 6


def test_watchdog_task_returns_at_once_without_a_watchdog(manager: socket.socket) -> None:
    assert run_watchdog_for(10.0) is False
    assert received(manager) == []


def test_watchdog_for_another_pid_stays_silent(
    manager: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert run_watchdog_for(5.0) is False
    assert received(manager) == []


def test_watchdog_survives_the_manager_going_away(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A daemon whose notify socket vanished (systemd re-executing, say) keeps serving its mount."""
    monkeypatch.setenv("NOTIFY_SOCKET", str(short_dir / "gone"))
    monkeypatch.setenv("WATCHDOG_USEC", "200000")
    assert run_watchdog_for(3.0) is True
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1


@pytest.mark.mount
def test_a_real_daemon_says_ready_pings_the_watchdog_and_says_stopping(
    manager: socket.socket, make_mount, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What fusethrottle@.service (Type=notify, WatchdogSec=) relies on, from a real daemon of
    the default data plane: READY=1 once it serves, WATCHDOG=1 while it does (a daemon without
    pings is killed by systemd as hung), STOPPING=1 when told to stop."""
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")  # no WATCHDOG_PID: meant for the daemon
    ft = make_mount()
    manager.settimeout(30)  # a hang guard: pings come every half second
    seen: list[bytes] = []
    while b"READY=1" not in seen or seen.count(b"WATCHDOG=1") < 3:
        seen.append(manager.recv(4096))
    assert ft.stop() == 0
    manager.settimeout(0)
    assert any(m.startswith(b"STOPPING=1") for m in received(manager)), seen
