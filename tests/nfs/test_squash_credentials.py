"""Credentials on squashing NFS exports (issue 31, item 4): through the mount as on NFS directly.

A backup runs as a non-root user (postgres, a backup account) into its own 0700 directory on an
export that squashes root (``root_squash``, the default) or everyone (``all_squash``). Each case
is run twice in one test, on two twin trees of the same export: directly on the client's NFS
mount (the reference) and through a fusethrottle mount (``allow_other``) over the same
directory. The callers' answers must be the same, and so must what the server stored (owners
and modes as on the server's own disk, before any client shows them).

The users are numeric (uid 1000 and a few made-up ids): AUTH_SYS sends numbers, and the
server checks them against the numbers it stored.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from mount_util import Daemon

from .lab import as_user, fresh_dir, on_server, record

pytestmark = [pytest.mark.mount]

MakeMount = Callable[..., Daemon]  # the make_mount fixture of tests/conftest.py

USER = 1000  # the backup user (has a passwd entry; its home is made in the test)
OTHER = 1001
ANON = 65534  # what the exports squash to

#: The user's backup into *home* (made 0700 here), as pg_basebackup makes one: a tar written
#: in 28 KiB pieces into a temporary name, fsynced, renamed; a 0700 directory of small files;
#: then the user reads its own backup back. Prints each step's outcome ("ok" or an errno name).
BACKUP = textwrap.dedent(
    """
    import errno, hashlib, json, os, sys
    home = sys.argv[1]
    os.umask(0o077)
    out = {}

    def step(name, fn):
        try:
            value = fn()
        except OSError as err:
            out[name] = errno.errorcode.get(err.errno, str(err.errno))
            return None
        out[name] = "ok"
        return value

    def write_tar():
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        fd = os.open(os.path.join(home, "base.tar.tmp"), flags, 0o600)
        try:
            for i in range(96):
                os.write(fd, bytes([i % 251]) * 28672)
            os.fsync(fd)
        finally:
            os.close(fd)

    def write_wal():
        with open(os.path.join(home, "wal", "01"), "wb") as f:
            f.write(b"w" * 8192)

    def read_tar():
        with open(os.path.join(home, "base.tar"), "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()

    step("mkdir home 0700", lambda: os.mkdir(home, 0o700))
    step("write base.tar.tmp", write_tar)
    step("rename", lambda: os.rename(os.path.join(home, "base.tar.tmp"),
                                     os.path.join(home, "base.tar")))
    step("mkdir wal 0700", lambda: os.mkdir(os.path.join(home, "wal"), 0o700))
    step("write wal/01", write_wal)
    out["listing"] = step("list home", lambda: sorted(os.listdir(home)))
    out["sha256"] = step("read base.tar", read_tar)
    step("stat wal/01", lambda: os.stat(os.path.join(home, "wal", "01")))
    print(json.dumps(out))
    """
)

TAR = b"".join(bytes([i % 251]) * 28672 for i in range(96))


def run_python(prefix: list[str], script: str, *args: str) -> dict:
    """Run *script* with /usr/bin/python3 under the command *prefix* (a setpriv, or nothing
    for root); its JSON answer."""
    done = subprocess.run(
        [*prefix, "/usr/bin/python3", "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd="/",
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def on_server_stat(path: Path) -> tuple[int, int, str]:
    st = on_server(path).stat()
    return st.st_uid, st.st_gid, oct(st.st_mode & 0o7777)


#: (export, permissions=): an all_squash export stores every caller's files as nobody's, so
#: the kernel's own check against the stored owner (permissions=kernel, default_permissions)
#: would refuse the user its own directory: there the target must decide (README).
CASES = [("squash", "kernel"), ("squash", "target"), ("allsquash", "target")]


@pytest.mark.parametrize(("export", "permissions"), CASES)
def test_a_backup_user_backs_up_through_the_mount_as_on_the_export_directly(
    make_mount: MakeMount, export: str, permissions: str
) -> None:
    """The backup user's backup into its own 0700 directory works through the mount wherever
    it works on the export directly, and the server stores the same owners and modes: on a
    root_squash export the files are the user's, not nobody's."""
    base, _ = fresh_dir(export)
    mnt = make_mount(source=base, options=("allow_other", f"permissions={permissions}"))
    direct = run_python(as_user(USER), BACKUP, str(base / "home-direct"))
    through = run_python(as_user(USER), BACKUP, str(mnt.mountpoint / "home-mount"))
    record(
        f"backup-user[{export}-{permissions}]",
        direct=direct,
        through=through,
        server_direct=on_server_stat(base / "home-direct"),
        server_mount=on_server_stat(base / "home-mount"),
    )
    steps = [k for k in direct if k not in ("listing", "sha256")]
    assert all(direct[k] == "ok" for k in steps), f"directly on the {export} export: {direct}"
    assert direct["sha256"] == hashlib.sha256(TAR).hexdigest()
    assert through == direct, f"on the {export} export: directly {direct}, through {through}"
    for name in ("", "base.tar", "wal", "wal/01"):
        at_direct = on_server_stat(base / "home-direct" / name)
        at_mount = on_server_stat(base / "home-mount" / name)
        assert at_mount == at_direct, f"{name or 'home'}: {at_direct} directly, {at_mount}"
        if export == "squash":
            assert at_mount[:2] == (USER, USER), f"{name or 'home'} is not the user's"
    assert on_server(base / "home-mount" / "base.tar").read_bytes() == TAR


#: Made by the backup user in *side* (a 0777 directory of theirs): what root then probes.
USER_TREE = textwrap.dedent(
    """
    import json, os, sys
    side = sys.argv[1]
    os.umask(0)
    os.mkdir(side, 0o777)
    os.mkdir(os.path.join(side, "home"), 0o700)
    os.mkdir(os.path.join(side, "open"), 0o755)
    for name, mode in (("secret", 0o600), ("public", 0o644), ("home/inner", 0o600)):
        fd = os.open(os.path.join(side, name), os.O_WRONLY | os.O_CREAT, mode)
        os.write(fd, name.encode())
        os.close(fd)
    print(json.dumps({}))
    """
)

#: Root's probes of the user's tree under *side*; each "ok" or an errno name.
ROOT_PROBES = textwrap.dedent(
    """
    import errno, json, os, sys
    side = sys.argv[1]
    p = lambda *names: os.path.join(side, *names)
    out = {}

    def probe(name, fn):
        try:
            fn()
            out[name] = "ok"
        except OSError as err:
            out[name] = errno.errorcode.get(err.errno, str(err.errno))

    def create(path):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))

    def read(path):
        with open(path, "rb") as f:
            f.read()

    def write(path):
        with open(path, "r+b") as f:
            f.write(b"root")

    probe("list 0700 dir", lambda: os.listdir(p("home")))
    probe("stat in 0700 dir", lambda: os.stat(p("home", "inner")))
    probe("create in 0755 dir", lambda: create(p("open", "by-root")))
    probe("mkdir in 0755 dir", lambda: os.mkdir(p("open", "dir-by-root")))
    probe("read 0600 file", lambda: read(p("secret")))
    probe("read 0644 file", lambda: read(p("public")))
    probe("write 0644 file", lambda: write(p("public")))
    probe("chmod 0644 file", lambda: os.chmod(p("public"), 0o666))
    probe("chown 0644 file", lambda: os.chown(p("public"), 0, 0))
    probe("create in 0777 dir", lambda: create(p("root-file")))
    probe("unlink in 0777 dir", lambda: os.unlink(p("secret")))
    print(json.dumps(out))
    """
)


@pytest.mark.parametrize(("export", "permissions"), CASES)
def test_root_through_the_mount_is_refused_exactly_where_squashed_root_is_on_the_export(
    make_mount: MakeMount, export: str, permissions: str
) -> None:
    """Root (the operator, a root cron job) through the mount gets exactly the refusals and
    permissions the squashed root gets on the export directly: the mount neither lends root
    rights the server denies nor takes away what the server allows."""
    base, _ = fresh_dir(export)
    mnt = make_mount(source=base, options=("allow_other", f"permissions={permissions}"))
    for side in ("direct", "mount"):
        run_python(as_user(USER), USER_TREE, str(base / side))
    direct = run_python([], ROOT_PROBES, str(base / "direct"))
    through = run_python([], ROOT_PROBES, str(mnt.mountpoint / "mount"))
    record(f"squashed-root[{export}-{permissions}]", direct=direct, through=through)
    if export == "squash":  # the reference itself: the server squashes root
        assert direct["read 0600 file"] == "EACCES" and direct["list 0700 dir"] == "EACCES"
    assert through == direct, f"on the {export} export: directly {direct}, through {through}"
    if direct["create in 0777 dir"] == "ok":
        made_direct = on_server_stat(base / "direct" / "root-file")
        made_mount = on_server_stat(base / "mount" / "root-file")
        assert made_mount == made_direct
        assert made_mount[:2] == (ANON, ANON), "root's new file is not the squashed id's"


#: As the caller: create a file in, and list, each directory named on the command line.
GROUP_PROBES = textwrap.dedent(
    """
    import errno, json, os, sys
    out = {}
    for d in sys.argv[1:]:
        for what, fn in (("create", lambda: os.close(os.open(os.path.join(d, "f"),
                                                              os.O_WRONLY | os.O_CREAT, 0o644))),
                         ("list", lambda: os.listdir(d))):
            try:
                fn()
                out[f"{what} {os.path.basename(d)}"] = "ok"
            except OSError as err:
                name = errno.errorcode.get(err.errno, str(err.errno))
                out[f"{what} {os.path.basename(d)}"] = name
    print(json.dumps(out))
    """
)

#: A caller in 20 supplementary groups: AUTH_SYS carries the first 16 (of the sorted list).
MANY_GROUPS = tuple(range(2001, 2021))


def test_a_caller_in_more_than_16_groups_gets_the_same_answers_as_directly(
    make_mount: MakeMount,
) -> None:
    """AUTH_SYS carries at most 16 supplementary groups: a backup user whose access to a
    directory comes from its 20th group is refused by the server directly. Through the mount
    the answers must be the same (not more rights from the kernel's own check, not fewer)."""
    base, _ = fresh_dir("rw")  # no_root_squash: root hands the directories to their groups
    mnt = make_mount(source=base, options=("allow_other",))
    for side in ("direct", "mount"):
        (base / side).mkdir(mode=0o755)
        for name, group in (("first-group", MANY_GROUPS[0]), ("twentieth", MANY_GROUPS[-1])):
            d = base / side / name
            d.mkdir()
            os.chown(d, OTHER, group)
            d.chmod(0o770)
    who = as_user(USER, USER, MANY_GROUPS)
    direct = run_python(
        who, GROUP_PROBES, *(str(base / "direct" / n) for n in ("first-group", "twentieth"))
    )
    through = run_python(
        who,
        GROUP_PROBES,
        *(str(mnt.mountpoint / "mount" / n) for n in ("first-group", "twentieth")),
    )
    record("groups>16", direct=direct, through=through)
    assert direct["create first-group"] == "ok"
    assert through == direct, f"directly {direct}, through the mount {through}"
