"""The bench's teardown removes its work directories whatever else is mounted on the machine.

A quick start once left its 384 MiB work directory behind: removing it read the mount table
and failed on a line it could not split ("list index out of range"). str.splitlines() also
splits at characters the kernel does not escape in a mount's source (form feed, \\x1c-\\x1e,
\\x85, ...), so one such mount anywhere on the host cut a line in two. Pure: the mount table is
given, nothing is mounted.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # bench/ is not an installed package; import it from the tree
    sys.path.insert(0, str(REPO))

from bench import system  # noqa: E402

ROOT = "22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n"
# Someone else's FUSE mount whose source (a directory) holds a file separator (\x1c), which
# the kernel does not escape: splitlines() leaves "name rw" as a line of its own.
ODD = "95 22 0:50 / /tmp/mnt rw,relatime shared:60 - fuse /tmp/odd\x1cname rw\n"


def test_a_work_directory_goes_although_a_mount_name_splits_a_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "fusethrottle-bench-1"
    (work / "t0").mkdir(parents=True)
    (work / "fill").write_bytes(b"x" * 4096)
    real = system.read_text

    def read_text(path: str | Path, default: str = "") -> str:
        return ROOT + ODD if str(path) == "/proc/self/mountinfo" else real(path, default)

    monkeypatch.setattr(system, "read_text", read_text)
    system.ACTIONS["rmtree"](str(work))
    assert not work.exists()


def test_a_mount_left_inside_a_work_directory_keeps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "fusethrottle-bench-2"
    (work / "mnt").mkdir(parents=True)
    inside = f"96 22 0:51 / {work}/mnt rw,relatime shared:61 - tmpfs tmpfs rw\n"
    real = system.read_text

    def read_text(path: str | Path, default: str = "") -> str:
        return ROOT + ODD + inside if str(path) == "/proc/self/mountinfo" else real(path, default)

    detached: list[str] = []
    monkeypatch.setattr(system, "read_text", read_text)
    monkeypatch.setattr(system, "findmnt_type", lambda mp: "tmpfs")  # it never goes away
    monkeypatch.setattr(system.subprocess, "run", lambda cmd, **kw: detached.append(cmd[-1]))
    system.ACTIONS["rmtree"](str(work))
    assert detached == [f"{work}/mnt"]
    assert work.exists()  # never recursed through a mount
