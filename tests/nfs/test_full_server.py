"""Item 6: a full server and a user over quota. A backup that writes more than the target
takes must hear of it: ENOSPC (a full export) or EDQUOT (the user's quota on the server) from
write, fsync or close, once, as when it writes to NFS directly; never a short file nobody was
told about, never EIO; the daemon keeps serving."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from mount_util import Daemon

from .lab import fill_file, set_block_quota, version

pytestmark = pytest.mark.mount

#: More than the small export holds (64 MiB, about 51 MiB free).
FILL = 96 << 20
USER = 1000
QUOTA = 8 << 20


def _reports(events: list[list[str]]) -> list[str]:
    return [f"{step}: {name}" for step, name in events if name]


def _check(
    through: tuple[int, list[list[str]]],
    direct: tuple[int, list[list[str]]],
    want: str,
    ft_log: str,
) -> None:
    report = (
        f"NFS {version()}: through the mount {_reports(through[1]) or 'no error'} "
        f"({through[0]} bytes accepted by write()); NFS directly "
        f"{_reports(direct[1]) or 'no error'} ({direct[0]} bytes)"
    )
    logged = [line for line in ft_log.splitlines() if "WARNING" in line or "ERROR" in line]
    report += "\ndaemon log:\n" + "\n".join(logged[-12:])
    print(report)  # for the lab's report (pytest -rA)
    told = [name for _, name in through[1] if name]
    assert told, "the writer was never told: " + report
    assert set(told) == {want}, report
    # How often it is told (write, fsync, fsync again, close) is not asserted: NFS directly
    # tells it twice or three times depending on what is still dirty at each call.


def _still_serves(ft: Daemon) -> None:
    """After the failure the daemon is alive, answers, and logged no internal error (whether
    the freed space is usable at once is test_names.py's question)."""
    assert ft.proc.poll() is None and ft.answers(), ft.log()
    assert "big" in os.listdir(ft.mountpoint)
    log = ft.log()
    assert "Traceback" not in log and "internal error" not in log, log


def test_full_server_reaches_the_writer_once(
    small_nfs: tuple[Path, Path], make_mount: Callable[..., Daemon]
) -> None:
    """A backup larger than the free space: ENOSPC reaches the writer from write, fsync or
    close, as on NFS directly, and the daemon keeps serving."""
    for_mount, for_direct = small_nfs
    direct = fill_file(for_direct / "big", FILL)
    ft = make_mount(source=for_mount)
    ft.expect_log_problems = True  # the target's ENOSPC is logged
    through = fill_file(ft.mountpoint / "big", FILL)
    _check(through, direct, "ENOSPC", ft.log())
    _still_serves(ft)


def test_quota_reaches_the_writer_once(
    quota_nfs: tuple[Path, Path], make_mount: Callable[..., Daemon]
) -> None:
    """A user over their quota on the server: EDQUOT reaches them from write, fsync or close,
    as on NFS directly (the daemon makes the calls as the user: credentials=caller)."""
    for_mount, for_direct = quota_nfs
    for export in quota_nfs:
        set_block_quota(export, USER, QUOTA)
        (export / "home").mkdir()
        os.chown(export / "home", USER, USER)
    direct = fill_file(for_direct / "home" / "big", 2 * QUOTA, as_user=USER)
    ft = make_mount(source=for_mount / "home", options=["allow_other"])
    ft.expect_log_problems = True  # the target's EDQUOT is logged
    through = fill_file(ft.mountpoint / "big", 2 * QUOTA, as_user=USER)
    _check(through, direct, "EDQUOT", ft.log())
    _still_serves(ft)
