"""open(O_WRONLY) of a file the caller may write but not read, on NFS (issue 31, item 4).

pjdfstest open/06.t tests 30, 34 and 38 (see tests/test_open_write_only.py, the same test on
a local file system): the caller is the owner of a 0277 file, in the group of a 0727 file, or
anyone for a 0772 file. On NFS directly the open succeeds and the writes land; through the
mount it must be the same, and the file on the server the same byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from mount_util import Daemon
from test_open_write_only import CASES, REFERENCE, Case, expected_after, make_file, open_as

from .lab import on_server, record

pytestmark = [pytest.mark.mount]

MakeMount = Callable[..., Daemon]  # the make_mount fixture of tests/conftest.py


@pytest.mark.parametrize("writeback_cache", ["yes", "no"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_caller_who_may_write_but_not_read_opens_write_only_on_nfs(
    make_mount: MakeMount, nfs_dir: Path, case: Case, writeback_cache: str
) -> None:
    """A backup user's open(O_WRONLY) of a file it may write but not read succeeds through
    the mount as on the NFS export directly, and its writes reach the server byte for byte."""
    make_file(nfs_dir / "direct", case)  # as root on the no_root_squash export
    make_file(nfs_dir / "through-mount", case)
    direct = open_as(nfs_dir / "direct", case.caller)
    mnt = make_mount(nfs_dir, ("allow_other", f"writeback_cache={writeback_cache}"))
    through = open_as(mnt.mountpoint / "through-mount", case.caller)
    record(f"open-write-only[{case.name},{writeback_cache}]", direct=direct, through=through)
    assert direct == REFERENCE, "NFS itself answers differently; the case is wrong"
    assert through == direct, (
        f"mode {case.mode:04o}, owner {case.owner}, caller {case.caller}: "
        f"directly {direct}, through the mount {through}"
    )
    assert on_server(nfs_dir / "through-mount").read_bytes() == expected_after()
    assert on_server(nfs_dir / "direct").read_bytes() == expected_after()
