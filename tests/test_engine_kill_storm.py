"""A kill storm: backups writing, looking up new names and listing on a slow target, SIGKILLed at
random for STORM seconds, with and without the writeback cache. Afterwards the daemon still
serves (under the sanitized engine: no report, which would have ended it), every byte a writer
was told was synced is on the target, and once every name is removed (on the target, as by
another client) and the kernel's entries are dropped, the daemon holds no descriptor of the
target's files. It stops with exit 0 (the fixture checks).

Run in the sanitized stage of scripts/test (NATIVE_SUITE), where it means most.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import MakeMount
from mount_util import Daemon, held_by, status_json, wait_for
from test_engine_hardening_requests import mutex_check_library

from fusethrottle._libc import syncfs

pytestmark = pytest.mark.mount

STORM = 20.0  # seconds of kills
WORKERS = {"writer": 3, "looker": 2, "lister": 2}
SLOW = 0.2  # seconds each call into the target takes during the storm
HANG_GUARD = 120.0

# Writes files of CHUNK-sized blocks (block i of a file is its name's digest pattern, see
# expected()), each followed by an fsync; "NAME SIZE" once SIZE bytes of NAME are synced.
WRITER = textwrap.dedent(
    """
    import hashlib, os, sys
    root, me = sys.argv[1], sys.argv[2]
    n = 0
    while True:
        name = f"{me}-{os.getpid()}-{n}"
        n += 1
        fd = os.open(os.path.join(root, name), os.O_WRONLY | os.O_CREAT, 0o644)
        for i in range(8):
            block = hashlib.sha256(f"{name}:{i}".encode()).digest() * 512
            os.write(fd, block)
            os.fsync(fd)
            print(name, (i + 1) * len(block), flush=True)
        os.close(fd)
    """
)
CHUNK = 32 * 512

# Looks up names that are not there and names that are, makes and removes files.
LOOKER = textwrap.dedent(
    """
    import os, random, sys
    root, me = sys.argv[1], sys.argv[2]
    n = 0
    while True:
        n += 1
        try:
            os.stat(os.path.join(root, f"absent-{me}-{os.getpid()}-{n}"))
        except FileNotFoundError:
            pass
        for name in random.sample(os.listdir(root), min(3, len(os.listdir(root)))):
            try:
                os.stat(os.path.join(root, name))
            except FileNotFoundError:
                pass
        path = os.path.join(root, f"made-{me}-{os.getpid()}-{n}")
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
        os.unlink(path)
    """
)

# Lists the directory with every entry's attributes (READDIRPLUS), as ls -l and rsync do.
LISTER = textwrap.dedent(
    """
    import os, sys
    root = sys.argv[1]
    while True:
        for entry in os.scandir(root):
            try:
                entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                pass
    """
)
PROGRAMS = {"writer": WRITER, "looker": LOOKER, "lister": LISTER}


def expected(name: str, size: int) -> bytes:
    import hashlib

    return b"".join(
        hashlib.sha256(f"{name}:{i}".encode()).digest() * 512 for i in range(size // CHUNK)
    )


class Worker:
    """One worker process of *role*, its acknowledgements collected from its stdout."""

    def __init__(self, role: str, root: Path, me: str, log: Path) -> None:
        self.role = role
        self.log = log
        self.out = open(log, "ab")  # noqa: SIM115 (closed by kill)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PROGRAMS[role], str(root), me],
            stdout=self.out,
            stderr=self.out,
            start_new_session=True,
        )

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        try:
            self.proc.wait(HANG_GUARD)
        except subprocess.TimeoutExpired:
            pytest.fail(f"a killed {self.role} (pid {self.proc.pid}) never died")
        finally:
            self.out.close()


def acknowledged(logs: list[Path]) -> dict[str, int]:
    """The synced size of every file a writer named (the last complete line of each)."""
    sizes: dict[str, int] = {}
    for log in logs:
        for line in log.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit():
                sizes[parts[0]] = max(sizes.get(parts[0], 0), int(parts[1]))
    return sizes


@pytest.mark.parametrize("cache", ["yes", "no"])
def test_a_kill_storm_leaves_the_daemon_serving_every_synced_byte_and_nothing_held(
    make_memfs: Callable[..., tuple[Daemon, Path]],
    make_mount: MakeMount,
    workdir: Path,
    cache: str,
) -> None:
    switch = workdir / "slow-now"
    target, _ = make_memfs("target", slow_all_while=(switch, SLOW))
    (target.mountpoint / "work").mkdir()
    ft = make_mount(
        source=target.mountpoint,
        options=[f"writeback_cache={cache}"],
        wrapper=["env", f"LD_PRELOAD={mutex_check_library()}"],  # what ASan cannot see
    )
    root = ft.mountpoint / "work"
    rng = random.Random(0x5EED)
    logs: list[Path] = []
    workers: list[Worker] = []
    started = 0

    def start(role: str) -> None:
        nonlocal started
        started += 1
        log = workdir / f"{role}-{started}.out"
        logs.append(log)
        workers.append(Worker(role, root, f"{role[0]}{started}", log))

    switch.touch()
    try:
        for role, count in WORKERS.items():
            for _ in range(count):
                start(role)
        end = time.monotonic() + STORM
        kills = 0
        while time.monotonic() < end:
            time.sleep(rng.uniform(0.05, 0.4))
            victim = workers.pop(rng.randrange(len(workers)))
            victim.kill()
            kills += 1
            assert victim.proc.returncode == -signal.SIGKILL, (
                victim.role,
                victim.proc.returncode,
                victim.log.read_text()[-2000:],
            )
            start(victim.role)
            assert ft.proc.poll() is None, ft.log()
    finally:
        for worker in workers:
            worker.kill()
        switch.unlink(missing_ok=True)
    assert kills > 0
    assert ft.proc.poll() is None, ft.log()
    assert "AddressSanitizer" not in ft.log() and "runtime error" not in ft.log(), ft.log()
    assert ft.answers()

    # Every byte a writer was told was synced is on the target.
    synced = acknowledged(logs)
    assert synced, "no writer got as far as an fsync"
    for name, size in synced.items():
        with open(target.mountpoint / "work" / name, "rb") as f:
            assert f.read(size) == expected(name, size), name

    # What the killed writers left owing is synced (their releases), then every name goes.
    fd = os.open(ft.mountpoint, os.O_RDONLY | os.O_DIRECTORY)
    try:
        syncfs(fd)
    finally:
        os.close(fd)
    assert wait_for(lambda: status_json(ft.mountpoint)["dirty_files"] == 0, HANG_GUARD)
    for name in os.listdir(target.mountpoint / "work"):  # (the target has no rmdir)
        (target.mountpoint / "work" / name).unlink()
    Path("/proc/sys/vm/drop_caches").write_text("2")  # the kernel forgets unused inodes
    assert wait_for(lambda: not held_by(ft.pid, target.mountpoint), HANG_GUARD), held_by(
        ft.pid, target.mountpoint
    )
    assert ft.proc.poll() is None, ft.log()
