"""Shared fixtures: real fusethrottle mounts in subprocesses (tests marked ``mount``).

Mount tests are skipped only where /dev/fuse is truly absent. Every mount made through these
fixtures is unmounted and its daemon reaped in teardown; a daemon that exits non-zero or logs a
warning, an error or a traceback fails the test that used it (stray errors are bugs, not noise),
unless the test declared them with ``daemon.expect_log_problems = True``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from mount_util import (
    Daemon,
    fusermount_unmount,
    mounts_under,
    problems_in_log,
    start_fusethrottle,
    start_memfs,
)
from redis_util import RedisServer, require_redis

HAVE_FUSE = os.path.exists("/dev/fuse")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("mount") is not None and not HAVE_FUSE:
        pytest.skip("/dev/fuse is absent: cannot mount FUSE filesystems here")


def _remove_tree(path: Path) -> None:
    """Delete a test directory, but never reach into a mount that is still there."""
    for leftover in sorted(mounts_under(path), reverse=True):
        fusermount_unmount(leftover, lazy=True)
    if mounts_under(path):
        return  # leave it rather than delete through a live mount
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def mount_base() -> Iterator[Path]:
    """A short, world-traversable directory: other users must reach allow_other mounts."""
    base = Path(tempfile.mkdtemp(prefix="fusethrottle-tests-", dir="/tmp"))
    base.chmod(0o755)
    yield base
    _remove_tree(base)


@pytest.fixture
def workdir(mount_base: Path) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(dir=mount_base))
    path.chmod(0o755)
    yield path
    _remove_tree(path)


MakeMount = Callable[..., Daemon]


@pytest.fixture
def make_mount(workdir: Path) -> Iterator[MakeMount]:
    """``make_mount(source=None, options=(), name="mnt", wrapper=(), conf=None)`` -> a serving
    fusethrottle Daemon (run under the *wrapper* command, if given; started from the instance
    file *conf*, if given)."""
    daemons: list[Daemon] = []

    def make(
        source: Path | None = None,
        options: Sequence[str] = (),
        name: str = "mnt",
        wrapper: Sequence[str] = (),
        conf: Path | None = None,
    ) -> Daemon:
        if source is None:
            source = workdir / f"{name}-backing"
            source.mkdir()
        mountpoint = workdir / name
        mountpoint.mkdir(exist_ok=True)
        daemon = start_fusethrottle(source, mountpoint, options, wrapper=wrapper, conf=conf)
        daemons.append(daemon)
        return daemon

    yield make
    failures = []
    for daemon in reversed(daemons):
        was_running = daemon.proc.poll() is None
        code = daemon.stop()
        if not was_running and code != 0 and not daemon.expect_log_problems:
            # It ended during the test: a crash shows as ENOTCONN there, its cause only here
            # (shown with the test's report if the test failed).
            sys.stderr.write(f"daemon for {daemon.mountpoint} ended with {code}:\n{daemon.log()}")
        if daemon.hung:
            failures.append(f"{daemon.mountpoint} hung; the watchdog broke it:\n{daemon.log()}")
            continue
        if daemon.expect_log_problems:
            continue
        if was_running and code != 0:
            failures.append(f"daemon for {daemon.mountpoint} exited {code}:\n{daemon.log()}")
        problems = problems_in_log(daemon.log())
        if problems:
            failures.append(f"daemon for {daemon.mountpoint} logged:\n" + "\n".join(problems))
    if failures:
        pytest.fail("\n".join(failures), pytrace=False)


@pytest.fixture
def ft(make_mount: MakeMount) -> Daemon:
    """One fusethrottle mount over an empty backing directory (``ft.source``)."""
    return make_mount()


@pytest.fixture
def make_memfs(workdir: Path) -> Iterator[Callable[..., tuple[Daemon, Path]]]:
    """``make_memfs(name, stale_unlinked=False, slow_getattr=0.0, slow_all_while=None,
    log_attributes=False)`` -> (memfs Daemon, its record file: writes and fsyncs, and with
    *log_attributes* stats and setattrs)."""
    daemons: list[Daemon] = []

    def make(
        name: str,
        stale_unlinked: bool = False,
        slow_getattr: float = 0.0,
        slow_all_while: tuple[Path, float] | None = None,
        log_attributes: bool = False,
    ) -> tuple[Daemon, Path]:
        mountpoint = workdir / name
        mountpoint.mkdir(exist_ok=True)
        record = workdir / f"{name}.record"
        record.touch()
        daemon = start_memfs(
            mountpoint,
            record,
            stale_unlinked=stale_unlinked,
            slow_getattr=slow_getattr,
            slow_all_while=slow_all_while,
            log_attributes=log_attributes,
        )
        daemons.append(daemon)
        return daemon, record

    yield make
    for daemon in reversed(daemons):
        daemon.stop()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A real redis-server on a free local port in a temporary directory (killed at teardown)."""
    require_redis()
    directory = Path(tempfile.mkdtemp(prefix="redis-", dir=tmp_path))
    server = RedisServer(directory)
    server.start()
    yield server
    if server.proc is not None:
        server.resume()  # a test may have left it stopped
    server.stop()
