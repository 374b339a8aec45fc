"""A file the caller may write but not read opens write-only through the mount, as it does on
the target (pjdfstest open/06.t, tests 30, 34 and 38).

A backup tool that appends to a log or a spool file of mode 0200 (or 0620 with the tool in the
group) opens it ``O_WRONLY``. With ``credentials=caller`` the target checks that open as the
caller, so the daemon must not ask the target for more than the caller asked for: an ``O_RDWR``
in the caller's name is refused (EACCES) where the caller's ``O_WRONLY`` is allowed. The write
through such a handle must still land byte for byte (the kernel's writeback cache would like
to read a page before writing part of it, and the caller may not read).

Each case is run directly on the backing directory first (the reference) and then through the
mount, as the same user; both must give the same answers and the same file.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from mount_util import Daemon

from fusethrottle.service.target_probe import can_switch

pytestmark = [
    pytest.mark.mount,
    pytest.mark.skipif(not can_switch(), reason="credentials=caller needs the daemon as root"),
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) is needed"),
]

MakeMount = Callable[..., Daemon]  # the make_mount fixture (tests/conftest.py)

OWNER = 1234
OTHER = 1235
GROUP = 4321


@dataclass(frozen=True)
class Case:
    """A file of *mode* owned by *owner*, opened by a caller (*uid*, *gid*) who may write to it
    through exactly one class of its mode bits, and not read."""

    name: str
    mode: int
    owner: tuple[int, int]
    caller: tuple[int, int]


#: pjdfstest open/06.t: 30 (the owner, 0277), 34 (the group, 0727), 38 (others, 0772).
CASES = (
    Case("owner-0277", 0o277, (OWNER, OWNER), (OWNER, OWNER)),
    Case("group-0727", 0o727, (OWNER, GROUP), (OTHER, GROUP)),
    Case("other-0772", 0o772, (OWNER, OWNER), (OTHER, OTHER)),
)

#: What the file holds before the caller writes to it: more than two pages.
BEFORE = bytes(range(251)) * 40
#: The caller's writes: part of a page in the middle, then past the end (leaving a hole).
WRITES = ((5000, b"w" * 100), (len(BEFORE) + 3000, b"e" * 10))

#: Run as the caller: each open's errno name ("ok" when it opened); the writes go through the
#: O_WRONLY descriptor.
CALLER = textwrap.dedent(
    """
    import errno, json, os, sys
    path, writes = sys.argv[1], json.loads(sys.argv[2])
    out = {}
    for name, flags in (("O_RDONLY", os.O_RDONLY), ("O_RDWR", os.O_RDWR),
                        ("O_WRONLY", os.O_WRONLY)):
        try:
            fd = os.open(path, flags)
        except OSError as err:
            out[name] = errno.errorcode.get(err.errno, str(err.errno))
            continue
        out[name] = "ok"
        if name != "O_WRONLY":
            os.close(fd)
            continue
        try:
            for offset, text in writes:
                os.pwrite(fd, text.encode(), offset)
            os.fsync(fd)
            out["write"] = "ok"
        except OSError as err:
            out["write"] = errno.errorcode.get(err.errno, str(err.errno))
        try:
            os.close(fd)
        except OSError as err:
            out["close"] = errno.errorcode.get(err.errno, str(err.errno))
    print(json.dumps(out))
    """
)


def expected_after() -> bytes:
    data = bytearray(BEFORE)
    for offset, text in WRITES:
        if len(data) < offset:
            data += bytes(offset - len(data))
        data[offset : offset + len(text)] = text
    return bytes(data)


def make_file(path: Path, case: Case) -> None:
    """The case's file, as root on the target (its owner could not write it at that mode)."""
    path.write_bytes(BEFORE)
    os.chown(path, *case.owner)
    path.chmod(case.mode)


def open_as(path: Path, caller: tuple[int, int], python: str = "/usr/bin/python3") -> dict:
    """Run CALLER as *caller* (no supplementary groups) on *path*; its answers."""
    uid, gid = caller
    argv = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
    writes = json.dumps([(offset, text.decode()) for offset, text in WRITES])
    done = subprocess.run(
        [*argv, python, "-c", CALLER, str(path), writes],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


#: What the target itself answers in every case.
REFERENCE = {"O_RDONLY": "EACCES", "O_RDWR": "EACCES", "O_WRONLY": "ok", "write": "ok"}


@pytest.mark.parametrize("writeback_cache", ["yes", "no"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_caller_who_may_write_but_not_read_opens_write_only(
    make_mount: MakeMount, workdir: Path, case: Case, writeback_cache: str
) -> None:
    """A backup user's open(O_WRONLY) of a file it may write but not read succeeds through
    the mount exactly as on the target, and its writes land byte for byte."""
    backing = workdir / "target"
    backing.mkdir()
    backing.chmod(0o755)
    make_file(backing / "direct", case)
    make_file(backing / "through-mount", case)
    direct = open_as(backing / "direct", case.caller)
    assert direct == REFERENCE, "the target itself answers differently; the case is wrong"
    mnt = make_mount(backing, ("allow_other", f"writeback_cache={writeback_cache}"))
    through = open_as(mnt.mountpoint / "through-mount", case.caller)
    assert through == direct, (
        f"mode {case.mode:04o}, owner {case.owner}, caller {case.caller}: "
        f"directly {direct}, through the mount {through}"
    )
    assert (backing / "through-mount").read_bytes() == expected_after()
    assert (backing / "direct").read_bytes() == expected_after()


def test_the_reference_answers_are_what_posix_says() -> None:
    """The cases above assume a plain POSIX permission check (no ACLs): keep them honest."""
    for case in CASES:
        uid, gid = case.caller
        shift = 6 if uid == case.owner[0] else 3 if gid == case.owner[1] else 0
        bits = (case.mode >> shift) & 0o7
        assert bits & 0o2 and not bits & 0o4, case
    assert errno.errorcode[errno.EACCES] == "EACCES"
