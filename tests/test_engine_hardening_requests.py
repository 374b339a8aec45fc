"""The engine's request path where callers die and mounts stop: an interrupt that comes before
its request registered for it, a lookup whose caller was killed, and what a stop refuses.

Each test is what a user would see: a daemon that survives its callers' SIGKILL, a target file
that is not held open by the daemon once nothing names it, a call made during a stop that is
answered at once instead of waiting on a hung target.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import platform
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import MakeMount
from mount_util import Daemon, held_by, status_json, wait_for

from fusethrottle.engine.native import OPERATIONS

pytestmark = pytest.mark.mount

MUTEX_CHECK_SOURCE = Path(__file__).with_name("libfuse_mutex_check.c")
HANG_GUARD = 60.0  # what a call that should be answered at once may take on a loaded machine


def mutex_check_library() -> str:
    """tests/libfuse_mutex_check.c built (cached under the temporary directory, keyed on its
    source): preloaded, it ends a daemon whose libfuse destroys a locked mutex."""
    key = hashlib.sha256(MUTEX_CHECK_SOURCE.read_bytes()).hexdigest()[:16]
    cache = Path(tempfile.gettempdir()) / f"fusethrottle-mutex-check-{os.getuid()}-{key}"
    with contextlib.suppress(FileExistsError):
        cache.mkdir(mode=0o700)
    info = os.lstat(cache)
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise RuntimeError(f"{cache} is not a private directory of ours: remove it")
    library = cache / "libfuse_mutex_check.so"
    if not library.exists():
        partial = cache / f"check.{os.getpid()}.tmp"
        command = ["gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC"]
        built = subprocess.run(
            [*command, "-o", str(partial), str(MUTEX_CHECK_SOURCE), "-ldl"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert built.returncode == 0, built.stderr
        os.replace(partial, library)
    return str(library)


def waits_on_fuse(pid: int) -> bool:
    """Is *pid* (a process, or a thread of one) waiting for a FUSE daemon's answer?"""
    try:
        return Path(f"/proc/{pid}/wchan").read_text() == "request_wait_answer"
    except OSError:
        return False


def threads_waiting_on_fuse(pid: int) -> int:
    """How many threads of *pid* wait for a FUSE daemon's answer (the engine's, on its target)."""
    tasks = Path(f"/proc/{pid}/task")
    with contextlib.suppress(OSError):
        return sum(waits_on_fuse(int(task.name)) for task in tasks.iterdir())
    return 0


# --- an interrupt read before its request registered for it -------------------------------------
def test_a_caller_killed_before_its_request_registered_for_the_interrupt_is_answered_once(
    make_mount: MakeMount,
) -> None:
    """A SIGKILLed caller's FUSE_INTERRUPT may be read by another request thread before the
    request's own thread registered its interrupt callback; libfuse then calls the callback
    inside the registration, holding the request's lock with no reference of its own. An
    answer given there freed the request under libfuse (a locked mutex destroyed, then
    unlocked in freed memory): now the registration only marks it, and the request is answered
    EINTR after. A test-only switch of the engine delays the registration of the first lookup
    until its interrupt was read, so the interrupt comes first every time; libfuse's destroy of
    a locked mutex, which AddressSanitizer cannot see (libfuse is not instrumented), ends the
    daemon at once (tests/libfuse_mutex_check.c). The caller dies, the daemon serves on."""
    ft = make_mount(
        options=["attr_timeout=1h"],  # the root's attributes kept: the stat's one request
        wrapper=[
            "env",
            f"LD_PRELOAD={mutex_check_library()}",
            f"FUSETHROTTLE_TEST_DELAY_INTERRUPT_REGISTRATION={OPERATIONS.index('lookup')}",
        ],
    )
    victim = subprocess.Popen(
        ["stat", str(ft.mountpoint / "never-seen")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        # Its lookup was read, and waits for its registration (the engine says so).
        waits = "waits for its interrupt"
        assert wait_for(lambda: waits in ft.log(), HANG_GUARD), "the lookup never came"
        victim.kill()
        victim.wait(HANG_GUARD)
    finally:
        victim.kill()
        victim.wait()
    assert victim.returncode == -signal.SIGKILL
    # (The engine says so: the lookup delayed was the caller's, and its interrupt came first.)
    said = "registered for its interrupt after it was read"
    assert wait_for(lambda: said in ft.log() or "libfuse_mutex_check" in ft.log(), HANG_GUARD), (
        ft.log()
    )
    assert "libfuse_mutex_check" not in ft.log()
    assert said in ft.log()
    assert ft.proc.poll() is None, ft.log()
    # The mount serves on: a lookup, a file made and read back.
    (ft.mountpoint / "after").write_text("served")
    assert (ft.mountpoint / "after").read_text() == "served"
    assert ft.answers()


# --- a lookup whose caller was killed ------------------------------------------------------------
CALLERS = 4
SLOW = 3.0  # seconds each call into the target takes while it is slow


def test_a_lookup_whose_caller_was_killed_holds_nothing_of_its_file(
    make_memfs: Callable[..., tuple[Daemon, Path]],
    make_mount: MakeMount,
    workdir: Path,
) -> None:
    """Callers killed while their lookups wait on a slow target are answered EINTR at once;
    each lookup, done later, was counted, but the kernel never got its entry, so no FORGET
    would ever come for it. The count is undone: once the names are removed (on the target,
    as by another client) the daemon holds none of their files (on NFS a held removed file
    stays on the server as .nfsXXXX until the unmount)."""
    switch = workdir / "slow-now"
    target, _ = make_memfs("target", slow_all_while=(switch, SLOW))
    # A directory each: the kernel takes one lookup at a time in a directory.
    names = [Path(f"dir-{i}") / "name" for i in range(CALLERS)]
    for name in names:
        (target.mountpoint / name.parent).mkdir()
        (target.mountpoint / name).write_text(str(name))
    # Entries and attributes kept for an hour: a stat of a name asks for its lookup only.
    ft = make_mount(source=target.mountpoint, options=["attr_timeout=1h"])
    for name in names:
        assert (ft.mountpoint / name.parent).is_dir()

    def lookups_done() -> int:
        """Requests that read metadata and were done (lookups, stats)."""
        return int(status_json(ft.mountpoint)["meter"]["meta_read"]["ops"])

    before = lookups_done()
    switch.touch()
    victims = [
        subprocess.Popen(
            ["stat", str(ft.mountpoint / name)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for name in names
    ]
    try:
        # Every lookup was read and waits on the target in a request thread of the engine.
        assert wait_for(lambda: threads_waiting_on_fuse(ft.pid) >= CALLERS, HANG_GUARD), (
            f"{threads_waiting_on_fuse(ft.pid)} lookups on the target"
        )
        assert all(victim.poll() is None for victim in victims)
        for victim in victims:
            victim.kill()
        for victim in victims:
            victim.wait(HANG_GUARD)  # answered at once: the target still has their lookups
    finally:
        switch.unlink(missing_ok=True)
        for victim in victims:
            victim.kill()
            victim.wait()
    assert all(victim.returncode == -signal.SIGKILL for victim in victims)

    def held() -> list[str]:
        files = [str(target.mountpoint / name) for name in names]
        return [link for link in held_by(ft.pid, target.mountpoint) if link.split(" ")[0] in files]

    # The lookups end on the target within SLOW seconds (the meter counts each once done).
    assert wait_for(lambda: lookups_done() >= before + CALLERS, HANG_GUARD), lookups_done()
    for name in names:
        (target.mountpoint / name).unlink()
    assert held() == []
    assert ft.answers()


# --- what a stop refuses -------------------------------------------------------------------------
def _call_in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """Run *call* on a thread (it may wait on a hung target until the test thaws it): its
    result, or the OSError it raised, lands in the list."""
    result: list[object] = []

    def run() -> None:
        try:
            result.append(call())
        except OSError as err:
            result.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


_GETDENTS64 = {"x86_64": 217, "aarch64": 61}.get(platform.machine())


def getdents(fd: int) -> int:
    """One getdents64 on *fd* (what a listing's readdir does, without the fstat of
    fdopendir): the bytes of entries read."""
    if _GETDENTS64 is None:
        pytest.skip(f"getdents64's number on {platform.machine()} is not known here")
    libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(65536)
    n = libc.syscall(_GETDENTS64, fd, buffer, len(buffer))
    if n < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return int(n)


def test_a_stop_answers_every_new_request_at_once_while_the_target_hangs(
    make_memfs: Callable[..., tuple[Daemon, Path]],
    make_mount: MakeMount,
    workdir: Path,
) -> None:
    """Once a stop has begun (SIGTERM) nothing new is taken: every request but the kernel's
    write-back of its cache and the closing of open files is answered ENOTCONN by the engine
    alone. A read, an extended attribute, a listing and an O_DIRECT write through descriptors
    opened before (with the writeback cache on, which those calls pass by) were still sent to
    the target, where they waited for as long as it hung (the stop itself waits there for the
    write-back of a dirty file). Once the target is back the stop writes that file and ends."""
    backing = workdir / "backing"
    (backing / "ok").mkdir(parents=True)
    (backing / "hung").mkdir()
    frozen, _ = make_memfs("backing/hung")
    (frozen.mountpoint / "file").write_bytes(b"r" * 8192)
    (frozen.mountpoint / "dir").mkdir()
    (frozen.mountpoint / "dir" / "entry").write_text("listed")
    ft = make_mount(source=backing, name="top", options=["unmount_timeout=10m"])
    hung = ft.mountpoint / "hung"
    reader = os.open(hung / "file", os.O_RDONLY | os.O_DIRECT)
    lister = os.open(hung / "dir", os.O_RDONLY | os.O_DIRECTORY)
    direct = os.open(hung / "direct", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
    dirty = os.open(hung / "dirty", os.O_WRONLY | os.O_CREAT, 0o644)
    block = bytearray(4096)
    threads: list[threading.Thread] = []
    try:
        os.write(dirty, b"d" * 4096)  # into the kernel's cache: the stop writes it back
        frozen.freeze()
        ft.signal(signal.SIGTERM)

        def closing() -> bool:
            try:
                os.stat(ft.mountpoint / "ok")  # the stop expired its attributes: asked again
            except OSError as err:
                assert err.errno == errno.ENOTCONN, err
                return True
            return False

        assert wait_for(closing, HANG_GUARD), "the stop never began"
        calls: dict[str, Callable[[], object]] = {
            "read": lambda: os.preadv(reader, [block], 0),
            "getxattr": lambda: os.getxattr(reader, "security.fusethrottle-test"),
            "listing": lambda: getdents(lister),
            "O_DIRECT write": lambda: os.pwrite(direct, bytes(4096), 0),
        }
        started = {name: _call_in_thread(call) for name, call in calls.items()}
        threads = [thread for thread, _ in started.values()]
        results = {}
        deadline = time.monotonic() + HANG_GUARD  # one guard for all: they wait at once
        for name, (thread, result) in started.items():
            thread.join(max(0.0, deadline - time.monotonic()))
            results[name] = result[0] if result else "still waiting on the hung target"
        answered = {
            name: isinstance(got, OSError) and got.errno == errno.ENOTCONN
            for name, got in results.items()
        }
        assert all(answered.values()), results
    finally:
        frozen.signal(signal.SIGCONT)
        frozen.stopped = False
        for thread in threads:
            thread.join(HANG_GUARD)
        for fd in (reader, lister, direct, dirty):
            with contextlib.suppress(OSError):
                os.close(fd)
    assert ft.wait(HANG_GUARD) == 0, ft.log()
    assert (frozen.mountpoint / "dirty").read_bytes() == b"d" * 4096
