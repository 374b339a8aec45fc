"""fusethrottle.service.mountinfo: the one /proc/self/mountinfo parser, on text written out here."""

from __future__ import annotations

import os
from pathlib import Path

from fusethrottle.service.mountinfo import MountInfo, containing_mount, mounts, parse

# Real lines' shapes: optional fields before " - ", escaped spaces, a FUSE mount's super options,
# and a line cut short (skipped, as the kernel never writes one but a test file might).
TEXT = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
42 27 7:0 / /srv/backup\\040disk rw,noatime shared:7 master:1 - ext4 /dev/loop0 rw
43 30 0:39 / /backups rw,nosuid - fuse.fusethrottle /mnt/nfs\\011b rw,user_id=0,default_permissions
44 30 0:40 / /short rw - tmpfs
45 30 0:41 / /two rw - tmpfs tmpfs
"""


def test_parse_reads_every_field_status_and_the_daemon_use() -> None:
    table = parse(TEXT)
    assert [m.mountpoint for m in table] == ["/proc", "/srv/backup disk", "/backups", "/two"]
    assert table[2] == MountInfo(
        "/backups",
        "0:39",
        "fuse.fusethrottle",
        "/mnt/nfs\tb",
        "rw,user_id=0,default_permissions",
    )
    assert table[1].fstype == "ext4" and table[1].device == "7:0"  # optional fields skipped
    assert table[3].super_options == ""  # no super options given: empty, not a failure


def test_mounts_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "mountinfo"
    path.write_text(TEXT)
    assert mounts(str(path)) == parse(TEXT)


def test_a_mount_whose_path_is_not_utf8_is_read_as_python_reads_file_names(
    tmp_path: Path,
) -> None:
    path = tmp_path / "mountinfo"
    odd = b"/tmp/mnt\xff\\040x"  # another user's mount: any bytes but NUL
    path.write_bytes(TEXT.encode() + b"46 30 0:42 / " + odd + b" rw - tmpfs tmpfs rw\n")
    table = mounts(str(path))
    assert table[-1].mountpoint == "/tmp/mnt\udcff x"
    assert os.fsencode(table[-1].mountpoint) == b"/tmp/mnt\xff x"


def test_super_option_values_flags_and_absence() -> None:
    fuse = parse(TEXT)[2]
    assert fuse.super_option("user_id") == "0"
    assert fuse.super_option("default_permissions") == ""
    assert fuse.super_option("allow_other") is None
    assert fuse.super_option("user") is None  # a prefix of user_id is not user_id
    assert MountInfo("/", "8:1", "ext4", "/dev/sda1").super_option("rw") is None


TABLE = [
    MountInfo("/", "8:1", "ext4", "/dev/sda1"),
    MountInfo("/backups", "0:52", "fuse.fusethrottle", "/mnt/nfs"),
    MountInfo("/srv", "0:60", "fuse.fusethrottle", "/a"),
    MountInfo("/srv", "0:61", "tmpfs", "tmpfs"),  # mounted on top of the one before
]


def test_containing_mount_is_the_nearest_mounted_ancestor() -> None:
    assert containing_mount("/backups", TABLE) is TABLE[1]
    assert containing_mount("/backups/db/x.tar", TABLE) is TABLE[1]
    assert containing_mount("/backups2/x", TABLE) is TABLE[0]  # a prefix is not a parent
    assert containing_mount("/etc", TABLE) is TABLE[0]


def test_containing_mount_takes_the_topmost_of_one_directory() -> None:
    assert containing_mount("/srv/x", TABLE) is TABLE[3]
    assert containing_mount("/srv/x", TABLE[:3]) is TABLE[2]
    assert containing_mount("/srv", []) is None
