"""Calls against the target run as the caller (credentials.py), so a root-squashed export works.

An NFS server with root_squash treats the daemon's root as an unprivileged user. Here that
server is the local file system and the squash is real: the daemon runs under ``setpriv`` with
every capability that lets root past file permissions or ownership taken away (CAP_DAC_OVERRIDE,
CAP_DAC_READ_SEARCH, CAP_FOWNER, CAP_FSETID, CAP_CHOWN), so the target checks its root like any
other user, as a squashing server does. (The squashed id is 0 here, not nobody; what matters,
that root has no rights over other users' files, is the same.) It keeps CAP_SETUID and
CAP_SETGID, which switching to a caller needs, and CAP_SYS_ADMIN, to mount.

Unit tests of the pure parts come first; then one worker thread's real switches; then mounts.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import MakeMount
from mount_util import ENGINE, status_json

from fusethrottle.target.credentials import (
    GROUPS_TTL,
    Caller,
    Callers,
    ThreadCredentials,
    can_switch,
    parse_groups,
)

needs_switching = pytest.mark.skipif(not can_switch(), reason="switching credentials needs root")

BACKUP_USER = 1234  # plays postgres: owns the 0700 directory the backup goes to
OTHER_USER = 1235
SHARED_GROUP = 4321


# --- pure --------------------------------------------------------------------------------------
def test_groups_are_read_from_proc_status() -> None:
    status = "Name:\tpostgres\nUid:\t1234\t1234\t1234\t1234\nGroups:\t4321 1234 27 \nNgid:\t0\n"
    assert parse_groups(status) == (27, 1234, 4321)
    assert parse_groups("Name:\tx\nGroups:\t\n") == ()
    assert parse_groups("Name:\tx\n") is None


def ctx(uid: int, gid: int, pid: int = 4242) -> Any:
    return SimpleNamespace(uid=uid, gid=gid, pid=pid)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_callers_read_groups_once_per_interval_and_never_for_the_daemon() -> None:
    reads: list[int] = []
    groups = {4242: (27, 4321)}

    def read(pid: int) -> tuple[int, ...] | None:
        reads.append(pid)
        return groups.get(pid)

    clock = Clock()
    callers = Callers(True, daemon=(0, 0), read_groups=read, clock=clock)
    assert callers.of(ctx(0, 0)) is None  # the daemon's own user: nothing to switch
    assert callers.of(None) is None
    first = callers.of(ctx(1234, 1234))
    assert first == Caller(1234, 1234, (27, 4321))
    for _ in range(100):  # one tar: one read of /proc
        assert callers.of(ctx(1234, 1234)) is first
    assert reads == [4242]
    groups[4242] = (27,)  # newgrp; seen once the interval is over
    clock.now += GROUPS_TTL + 0.01
    assert callers.of(ctx(1234, 1234)) == Caller(1234, 1234, (27,))
    assert reads == [4242, 4242]


def test_a_caller_whose_process_is_gone_keeps_only_its_primary_group() -> None:
    callers = Callers(True, daemon=(0, 0), read_groups=lambda pid: None, clock=Clock())
    assert callers.of(ctx(1234, 777)) == Caller(1234, 777, (777,))


def test_without_switching_every_call_runs_as_the_daemon() -> None:
    callers = Callers(False, daemon=(0, 0), read_groups=lambda pid: (1,), clock=Clock())
    assert callers.of(ctx(1234, 1234)) is None


# --- one worker thread, real switches ------------------------------------------------------------
def in_thread(fn: Callable[[], Any]) -> Any:
    """Run *fn* in a new thread (as a worker would) and return or raise what it did."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as err:  # handed to the test thread
            out["error"] = err

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


@needs_switching
def test_a_thread_acts_as_its_caller_and_only_that_thread(workdir: Path) -> None:
    tmp_path = workdir  # every user may pass through it
    private = tmp_path / "private"
    private.mkdir(mode=0o700)  # root's
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, OTHER_USER, SHARED_GROUP)
    shared.chmod(0o770)
    creds = ThreadCredentials()
    member = Caller(BACKUP_USER, BACKUP_USER, (SHARED_GROUP,))
    stranger = Caller(BACKUP_USER, BACKUP_USER, ())

    def create_as(caller: Caller | None, path: Path) -> os.stat_result:
        def make() -> os.stat_result:
            fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600)
            os.close(fd)
            return os.stat(path)

        return creds.call_as(caller, make)

    def run() -> None:
        # As the caller: the target refuses what the caller may not do ...
        with pytest.raises(PermissionError):
            create_as(stranger, private / "no")
        with pytest.raises(PermissionError):
            create_as(stranger, shared / "no")
        # ... allows what it may (a supplementary group counts), and the file is the caller's.
        st = create_as(member, shared / "yes")
        assert (st.st_uid, st.st_gid) == (BACKUP_USER, BACKUP_USER)
        # Meanwhile the other threads are still root (checked by the test's own thread).
        switched.set()
        assert checked.wait(30)
        # Back to the daemon (None): root again.
        st = create_as(None, private / "root's")
        assert (st.st_uid, st.st_gid) == (0, 0)

    switched, checked = threading.Event(), threading.Event()
    seen_by_root: list[list[str]] = []

    def check() -> None:
        assert switched.wait(30)
        seen_by_root.append(os.listdir(private))  # while the worker is the caller
        checked.set()

    checker = threading.Thread(target=check)
    checker.start()
    in_thread(run)
    checker.join()
    assert seen_by_root == [[]]
    assert sorted(os.listdir(shared)) == ["yes"]
    assert os.listdir(private) == ["root's"]
    # The test's own thread never changed.
    assert (os.getuid(), os.geteuid()) == (0, 0)


@needs_switching
def test_a_refused_switch_fails_the_call_and_leaves_the_daemons_credentials() -> None:
    """A call must never run with the wrong credentials: if the kernel refuses the switch
    (here: a thread whose CAP_SETUID is gone), the call fails instead of running as root."""
    creds = ThreadCredentials()
    ran: list[bool] = []

    def run() -> None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        # Drop CAP_SETUID (7) and CAP_SETGID (6) from this thread's effective set only.
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)
        data = (ctypes.c_uint32 * 6)()
        assert libc.syscall(125, header, data) == 0  # capget
        data[0] &= ~((1 << 6) | (1 << 7))
        assert libc.syscall(126, header, data) == 0  # capset (this thread only)
        with pytest.raises(PermissionError):
            creds.call_as(Caller(BACKUP_USER, BACKUP_USER, ()), lambda: ran.append(True))

    if os.uname().machine != "x86_64":
        pytest.skip("the capget/capset numbers here are x86_64's")
    in_thread(run)
    assert ran == []


# --- real mounts over a squashing target ---------------------------------------------------------
SQUASHED = (
    "setpriv",
    "--bounding-set",
    "-dac_override,-dac_read_search,-fowner,-fsetid,-chown",
)

# A backup as pg_basebackup makes one: a tar written in 4 KiB and 28 KiB pieces into a temporary
# name, fsynced, renamed into place, the directory fsynced; plus a manifest of small files.
WRITER = textwrap.dedent(
    """
    import json, os, sys
    target = sys.argv[1]
    os.umask(0o077)  # as PostgreSQL's files are: nobody else may open them
    out = {}
    try:
        tmp = os.path.join(target, "base.tar.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        written = 0
        i = 0
        while written < 6 * 1024 * 1024:
            piece = bytes([i % 251]) * (4096 if i % 2 else 28672)
            written += os.write(fd, piece)
            i += 1
        os.fsync(fd)
        os.close(fd)
        os.rename(tmp, os.path.join(target, "base.tar"))
        os.mkdir(os.path.join(target, "wal"), 0o700)
        for n in range(20):
            with open(os.path.join(target, "wal", "%02d" % n), "wb") as f:
                f.write(b"w" * 8192)
        dfd = os.open(target, os.O_RDONLY)
        os.fsync(dfd)
        os.close(dfd)
        out["written"] = written
    except OSError as err:
        out["error"] = err.errno
    print(json.dumps(out))
    """
)


def as_user(uid: int, groups: tuple[int, ...] = ()) -> list[str]:
    group_arg = ["--groups=" + ",".join(map(str, groups))] if groups else ["--clear-groups"]
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", *group_arg]


def back_up(target: Path, uid: int, groups: tuple[int, ...] = ()) -> dict[str, int]:
    result = subprocess.run(
        [*as_user(uid, groups), "/usr/bin/python3", "-c", WRITER, str(target)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def expected_tar(size: int) -> bytes:
    out = bytearray()
    i = 0
    while len(out) < size:
        out += bytes([i % 251]) * (4096 if i % 2 else 28672)
        i += 1
    return bytes(out)


@pytest.fixture
def squashed_target(workdir: Path) -> Path:
    """A backing directory holding the backup user's 0700 directory, as on the export."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed")
    backing = workdir / "export"
    backing.mkdir()
    pg = backing / "pg"
    pg.mkdir(mode=0o700)
    os.chown(pg, BACKUP_USER, BACKUP_USER)
    return backing


# Small batches: the backup's data is synced by injected fsyncs while it is written, and those
# must run as the file's writer too.
OPTIONS = ("allow_other", "mode=static", "batch=1M", "window=4M")


@pytest.mark.mount
@needs_switching
def test_the_backup_user_backs_up_into_its_own_directory_on_a_squashing_target(
    make_mount: MakeMount, squashed_target: Path
) -> None:
    mnt = make_mount(squashed_target, OPTIONS, wrapper=SQUASHED)
    result = back_up(mnt.mountpoint / "pg", BACKUP_USER)
    assert "error" not in result, os.strerror(result["error"])
    pg = squashed_target / "pg"
    tar = pg / "base.tar"
    assert tar.read_bytes() == expected_tar(result["written"])
    assert not (pg / "base.tar.tmp").exists()
    wal = sorted((pg / "wal").iterdir())
    assert [p.name for p in wal] == [f"{n:02d}" for n in range(20)]
    assert all(p.read_bytes() == b"w" * 8192 for p in wal)
    for path in [tar, pg / "wal", *wal]:
        st = path.stat()
        assert (st.st_uid, st.st_gid) == (BACKUP_USER, BACKUP_USER), path


@pytest.mark.mount
@needs_switching
def test_root_through_the_mount_is_squashed_as_it_is_on_the_export(
    make_mount: MakeMount, squashed_target: Path
) -> None:
    mnt = make_mount(squashed_target, OPTIONS, wrapper=SQUASHED)
    direct = subprocess.run(
        [*SQUASHED, "ls", str(squashed_target / "pg")], capture_output=True, check=False
    )
    assert direct.returncode != 0  # the export itself refuses a squashed root
    with pytest.raises(PermissionError):
        os.listdir(mnt.mountpoint / "pg")
    with pytest.raises(PermissionError):
        (mnt.mountpoint / "pg" / "by-root").write_bytes(b"x")
    # What root creates where it may is root's (squashed root cannot give it away either).
    (mnt.mountpoint / "root-file").write_bytes(b"x")
    st = (squashed_target / "root-file").stat()
    assert (st.st_uid, st.st_gid) == (0, 0)


@pytest.mark.mount
@needs_switching
def test_supplementary_groups_reach_the_target(
    make_mount: MakeMount, squashed_target: Path
) -> None:
    team = squashed_target / "team"
    team.mkdir()
    os.chown(team, OTHER_USER, SHARED_GROUP)
    team.chmod(0o770)
    mnt = make_mount(squashed_target, OPTIONS, wrapper=SQUASHED)
    member = back_up(mnt.mountpoint / "team", BACKUP_USER, groups=(SHARED_GROUP,))
    assert "error" not in member
    assert (team / "base.tar").stat().st_uid == BACKUP_USER
    shutil.rmtree(team / "wal")
    (team / "base.tar").unlink()
    outsider = back_up(mnt.mountpoint / "team", BACKUP_USER)
    assert outsider.get("error") == errno.EACCES
    assert sorted(os.listdir(team)) == []


@pytest.mark.mount
@needs_switching
def test_as_the_daemon_the_squashed_backup_fails(
    make_mount: MakeMount, squashed_target: Path
) -> None:
    """What credentials=caller fixes: with every call made as the (squashed) daemon, the
    backup user cannot write into its own directory through the mount."""
    mnt = make_mount(squashed_target, (*OPTIONS, "credentials=daemon"), wrapper=SQUASHED)
    result = back_up(mnt.mountpoint / "pg", BACKUP_USER)
    assert result.get("error") == errno.EACCES
    assert os.listdir(squashed_target / "pg") == []


@pytest.mark.mount
@needs_switching
def test_what_posix_allows_a_caller_who_is_not_the_owner_works_through_the_mount(
    make_mount: MakeMount,
) -> None:
    """Anyone who may write a file may set its times to now (touch), as on the target itself.
    (pjdfstest's utimensat/06.t caught the native engine refusing it: with the writeback cache
    a touch reaches the daemon as explicit times, which the target lets only the owner set.)"""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed")
    mnt = make_mount(options=("allow_other",))
    assert mnt.source is not None
    shared = mnt.mountpoint / "shared"
    shared.write_bytes(b"x")
    shared.chmod(0o666)
    os.utime(shared, ns=(10**18, 10**18))  # 2001: a touch must move it
    touched = subprocess.run(
        [*as_user(OTHER_USER), "touch", str(shared)], capture_output=True, text=True, check=False
    )
    assert touched.returncode == 0, touched.stderr
    assert (mnt.source / "shared").stat().st_mtime_ns > 10**18
    shared.chmod(0o644)  # who may not write it may not touch it either
    refused = subprocess.run(
        [*as_user(OTHER_USER), "touch", str(shared)], capture_output=True, text=True, check=False
    )
    assert refused.returncode != 0


@pytest.mark.mount
@needs_switching
@pytest.mark.skipif(
    ENGINE != "native",
    reason="the Python data plane looks every entry up while listing, which needs search "
    "permission (it is being replaced by the engine, which lists without)",
)
def test_the_owner_lists_a_directory_it_may_read_but_not_search(make_mount: MakeMount) -> None:
    """As on the target: opening "." of the directory would need search permission, listing
    does not (pjdfstest's open/06.t)."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed")
    mnt = make_mount(options=("allow_other",))
    listed_dir = mnt.mountpoint / "listed"
    listed_dir.mkdir()
    (listed_dir / "entry").write_bytes(b"")
    os.chown(listed_dir, OTHER_USER, OTHER_USER)
    listed_dir.chmod(0o600)
    listed = subprocess.run(
        [*as_user(OTHER_USER), "ls", str(listed_dir)], capture_output=True, text=True, check=False
    )
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == ["entry"]


def file_capability() -> bytes:
    """A VFS_CAP_REVISION_2 security.capability value granting cap_net_bind_service."""
    import struct

    return struct.pack("<IIIII", 0x02000000, 1 << 10, 0, 0, 0)


@pytest.mark.mount
@needs_switching
@pytest.mark.parametrize("writeback_cache", ["yes", "no"])
@pytest.mark.parametrize("xattrs", ["on", "off"])
def test_a_non_owners_write_drops_set_id_bits_and_the_file_capability(
    make_mount: MakeMount, workdir: Path, writeback_cache: str, xattrs: str
) -> None:
    """As on a local file system: another user writing into root's set-user-ID program (it is
    world-writable here) must not leave a privileged program with their content in it."""
    backing = workdir / "local"
    backing.mkdir()
    program = backing / "program"
    program.write_bytes(b"#!/bin/true\n")
    program.chmod(0o6777)
    os.setxattr(program, "security.capability", file_capability())
    options = ("allow_other", f"writeback_cache={writeback_cache}", f"xattrs={xattrs}")
    mnt = make_mount(backing, options)
    result = subprocess.run(
        [
            *as_user(OTHER_USER),
            "/usr/bin/python3",
            "-c",
            "import sys; f = open(sys.argv[1], 'r+b'); f.write(b'#!/bin/sh\\n'); f.close()",
            str(mnt.mountpoint / "program"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    st = program.stat()
    assert st.st_mode & 0o7777 == 0o777
    assert "security.capability" not in os.listxattr(program)
    assert program.read_bytes().startswith(b"#!/bin/sh\n")


WRITE_TWICE = textwrap.dedent(
    """
    import os, sys, time
    path = sys.argv[1]
    with open(path, "r+b", buffering=0) as f:
        for _ in range(256):
            f.write(b"x" * 4096)
    sys.stdout.write("first\\n"); sys.stdout.flush()
    sys.stdin.readline()  # the test makes the file set-ID meanwhile
    with open(path, "r+b", buffering=0) as f:
        f.write(b"y" * 4096)
    """
)


@pytest.mark.mount
@needs_switching
@pytest.mark.parametrize("writeback_cache", ["yes", "no"])
@pytest.mark.parametrize("made_set_id", ["through the mount", "on the target"])
def test_the_kernel_stops_asking_per_write_and_set_id_bits_still_drop(
    make_mount: MakeMount, workdir: Path, writeback_cache: str, made_set_id: str
) -> None:
    """The kernel asks for security.capability before a write() only until a write found
    nothing to remove (FUSE_HANDLE_KILLPRIV_V2): 256 small writes cost no 256 round trips. A
    file made set-ID afterwards, through the mount or by another host on the target, still
    loses the bits when another user writes to it: the target removes them, because the
    write reaches it with that user's credentials."""
    backing = workdir / "local"
    backing.mkdir()
    shared = backing / "shared"
    shared.write_bytes(b"")
    shared.chmod(0o666)
    mnt = make_mount(backing, ("allow_other", f"writeback_cache={writeback_cache}"))
    writer = subprocess.Popen(
        [
            *as_user(OTHER_USER),
            "/usr/bin/python3",
            "-c",
            WRITE_TWICE,
            str(mnt.mountpoint / "shared"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None and writer.stdin is not None
        assert writer.stdout.readline() == "first\n"
        status = status_json(mnt.mountpoint)
        assert status["operations"].get("getxattr", 0) < 16, status["operations"]
        assert status["capability_question"] == "once per file (FUSE_HANDLE_KILLPRIV_V2)"
        if made_set_id == "through the mount":
            (mnt.mountpoint / "shared").chmod(0o6777)
        else:
            shared.chmod(0o6777)
        writer.stdin.write("\n")
        writer.stdin.flush()
        assert writer.wait(60) == 0
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    os.sync()
    subprocess.run(["sync", "-f", str(mnt.mountpoint / "shared")], check=True, timeout=60)
    assert shared.stat().st_mode & 0o7777 == 0o777
    assert shared.read_bytes() == b"y" * 4096 + b"x" * (255 * 4096)


#: Run as another user: what it may do through a permissions=target mount (one line each).
PROBE = textwrap.dedent(
    """
    import errno, json, os, sys
    mnt = sys.argv[1]
    out = {}
    def step(name, fn):
        try:
            fn()
            out[name] = "ok"
        except OSError as err:
            out[name] = errno.errorcode.get(err.errno, str(err.errno))
    step("read private/file", lambda: open(os.path.join(mnt, "private", "file")).read())
    step("stat private/file", lambda: os.stat(os.path.join(mnt, "private", "file")))
    step("list private", lambda: os.listdir(os.path.join(mnt, "private")))
    step("chmod others", lambda: os.chmod(os.path.join(mnt, "others"), 0o666))
    step("utime others", lambda: os.utime(os.path.join(mnt, "others"), (1, 1)))
    step("write others", lambda: open(os.path.join(mnt, "others"), "a").write("x"))
    out["access w others"] = os.access(os.path.join(mnt, "others"), os.W_OK)
    out["access r others"] = os.access(os.path.join(mnt, "others"), os.R_OK)
    step("write own", lambda: open(os.path.join(mnt, "pg", "mine"), "w").write("x"))
    print(json.dumps(out))
    """
)


@pytest.mark.mount
@needs_switching
def test_with_permissions_target_nothing_the_target_refuses_gets_through(
    make_mount: MakeMount, squashed_target: Path
) -> None:
    """permissions=target leaves every decision to the target (for exports that map ids, as
    all_squash does, where the kernel's check against the stored owner is wrong). Without the
    kernel's check, a cached name must not let a walk past a directory the caller may not
    search, and nothing the target refuses a caller may be retried with the daemon's rights."""
    private = squashed_target / "private"
    private.mkdir(mode=0o700)
    (private / "file").write_text("secret")
    (private / "file").chmod(0o644)
    others = squashed_target / "others"
    others.write_text("theirs")
    others.chmod(0o644)
    os.chown(others, OTHER_USER, OTHER_USER)
    mnt = make_mount(squashed_target, (*OPTIONS, "permissions=target"))
    assert (mnt.mountpoint / "private" / "file").read_text() == "secret"  # root's walk: cached
    result = subprocess.run(
        [*as_user(BACKUP_USER), "/usr/bin/python3", "-c", PROBE, str(mnt.mountpoint)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    seen = json.loads(result.stdout)
    assert seen == {
        "read private/file": "EACCES",
        "stat private/file": "EACCES",
        "list private": "EACCES",
        "chmod others": "EPERM",
        "utime others": "EPERM",
        "write others": "EACCES",
        "access w others": False,
        "access r others": True,
        "write own": "ok",
    }
    assert others.read_text() == "theirs" and others.stat().st_mode & 0o777 == 0o644


READ_ONLY_MEMBER = textwrap.dedent(
    """
    import os, sys
    path = sys.argv[1]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
    os.write(fd, bytes(range(256)) * 4096)  # 1 MiB of whole pages: the O_DIRECT path
    os.write(fd, b"tail" * 25)
    os.close(fd)
    """
)


@pytest.mark.mount
@needs_switching
def test_a_read_only_member_is_written_uncached_by_the_user_who_created_it(
    make_mount: MakeMount, squashed_target: Path
) -> None:
    """tar extracts a read-only member by creating it with mode 0444 and writing through the
    descriptor that open gave it; nobody else may open it for writing. Written uncached (the
    container case's target_io), the daemon's second descriptor for O_DIRECT is refused for
    that file: the write still succeeds, through the path that writes back and drops."""
    mnt = make_mount(squashed_target, ("allow_other", "target_io=direct"))
    member = mnt.mountpoint / "pg" / "readonly.bin"
    result = subprocess.run(
        [*as_user(BACKUP_USER), "/usr/bin/python3", "-c", READ_ONLY_MEMBER, str(member)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    on_target = squashed_target / "pg" / "readonly.bin"
    assert on_target.read_bytes() == bytes(range(256)) * 4096 + b"tail" * 25
    assert stat.S_IMODE(on_target.stat().st_mode) == 0o444
    assert on_target.stat().st_uid == BACKUP_USER
