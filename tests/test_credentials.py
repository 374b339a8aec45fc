"""Calls against the target run as the caller (engine/src/caller.cc), so a root-squashed export
works.

An NFS server with root_squash treats the daemon's root as an unprivileged user. Here that
server is the local file system and the squash is real: the daemon runs under ``setpriv`` with
every capability that lets root past file permissions or ownership taken away (CAP_DAC_OVERRIDE,
CAP_DAC_READ_SEARCH, CAP_FOWNER, CAP_FSETID, CAP_CHOWN), so the target checks its root like any
other user, as a squashing server does. (The squashed id is 0 here, not nobody; what matters,
that root has no rights over other users' files, is the same.) It keeps CAP_SETUID and
CAP_SETGID, which switching to a caller needs, and CAP_SYS_ADMIN, to mount.

Every test mounts: the switches are the engine's, per request thread (setfsuid, setfsgid,
setgroups).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import textwrap
from pathlib import Path

import pytest
from conftest import MakeMount
from mount_util import status_json

from fusethrottle.service.target_probe import can_switch

needs_switching = pytest.mark.skipif(not can_switch(), reason="switching credentials needs root")

BACKUP_USER = 1234  # plays postgres: owns the 0700 directory the backup goes to
OTHER_USER = 1235
SHARED_GROUP = 4321


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
