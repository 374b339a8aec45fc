"""What tests inside the NFS lab VM share: where the lab's mounts are, the server's switch,
and the wire counts.

These tests run only in the lab (``python -m bench.nfslab run smoke|correctness``), which
sets FTLAB=1 and says where its NFS mounts are; elsewhere they are skipped.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from bench.nfslab import mountstats

IN_LAB = os.environ.get("FTLAB") == "1"
NFS = Path(os.environ.get("FTLAB_NFS", "/mnt/nfs"))
NFS2 = Path(os.environ.get("FTLAB_NFS2", "/mnt/nfs2"))
PROFILE = os.environ.get("FTLAB_PROFILE", "")

needs_lab = pytest.mark.skipif(not IN_LAB, reason="runs in the NFS lab VM (python -m bench.nfslab)")


def version() -> str:
    """The NFS version of the lab's client mounts ("3" or "4.1")."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if fields[1] == str(NFS / "rw"):
            for option in fields[3].split(","):
                if option.startswith("vers="):
                    return option[5:]
    return "?"


def fresh_dir(export: str = "rw") -> tuple[Path, Path]:
    """A new empty directory on *export*: its path through client 1 and through client 2."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    path = NFS / export / name
    path.mkdir()
    path.chmod(0o777)
    return path, NFS2 / export / name


def wire(mountpoint: Path | str = NFS / "rw") -> mountstats.Counter[str]:
    return mountstats.read(str(mountpoint))


def silly_renamed(root: Path) -> list[Path]:
    """The .nfsXXXX files under *root*: files unlinked while something still held them."""
    return sorted(p for p in root.rglob(".nfs*"))


def server_stop() -> None:
    """Stop knfsd: every hard-mounted call waits from here on (rpc.nfsd 0)."""
    subprocess.run(["rpc.nfsd", "0"], check=True)


def server_start() -> None:
    subprocess.run(["rpc.nfsd", "8"], check=True)
