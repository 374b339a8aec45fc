"""What tests inside the NFS lab VM share: where the lab's mounts are, the server's switch,
and the wire counts.

These tests run only in the lab (``python -m bench.nfslab run smoke|correctness``), which
sets FTLAB=1 and says where its NFS mounts are; elsewhere they are skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.nfslab import mountstats, profiles

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
    wait_server_answers()


def wait_server_answers(timeout: float = 240) -> None:
    """Wait until client 1 can create and remove a file on the export again: the server is
    back and, for NFSv4, its grace period and the client's state recovery are over, so the
    next step (the next test's mount) does not start inside them. Never raises: a server
    that does not come back fails the tests that need it."""
    probe = NFS / "rw" / f".ftlab-probe-{uuid.uuid4().hex[:8]}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            done = subprocess.run(
                ["sh", "-c", f"touch {probe} && rm {probe}"], capture_output=True, timeout=30
            )
        except subprocess.TimeoutExpired:
            continue  # the child is killed; it may stay until the server answers
        if done.returncode == 0:
            return
        time.sleep(0.5)


#: The client's end of its link to the server (in network namespace "client").
CLIENT_LINK = ("ip", "netns", "exec", "client", "tc", "qdisc")


def link_down() -> None:
    """Drop every packet client 1 sends (netem loss 100%): the server runs on, unreachable.
    Only on the unshaped profiles (plain, plain3), whose link has no qdisc of its own."""
    subprocess.run(
        [*CLIENT_LINK, "add", "dev", "ftcli", "root", "netem", "loss", "100%"], check=True
    )


def link_up() -> None:
    subprocess.run([*CLIENT_LINK, "del", "dev", "ftcli", "root"], check=True)
    wait_server_answers()


#: How the server goes away: knfsd stopped (connections refused), or the link drops everything.
OUTAGES = {"server": (server_stop, server_start), "link": (link_down, link_up)}


@contextlib.contextmanager
def outage(kind: str = "server") -> Iterator[None]:
    """The server is unreachable inside the block, and back after it, whatever happened."""
    stop, start = OUTAGES[kind]
    stop()
    try:
        yield
    finally:
        start()


def on_server(path: Path) -> Path:
    """Where *path* (under either client's mount of an export) is on the server's own disk:
    owners and modes there are what the server stored, before any client shows them."""
    for root in (NFS, NFS2):
        if path.is_relative_to(root):
            return Path(profiles.DISK_MOUNT) / path.relative_to(root)
    raise ValueError(f"{path} is not on a lab export")


def nfs_mount(where: Path, *options: str, export: str = "rw") -> None:
    """Mount *export* at *where* as client 1 does (its network namespace, so its link), with
    this run's NFS version and *options* (e.g. soft,timeo=20,retrans=1)."""
    vers = version()
    source = profiles.server_path(profiles.PROFILES[PROFILE], export)
    extra = ("nolock",) if vers == "3" else ()
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            "nsenter", "--net=/run/netns/client", "mount", "-t", "nfs",
            "-o", ",".join((f"vers={vers}", "nosharecache", *extra, *options)), source, str(where),
        ],
        check=True,
        timeout=60,
    )  # fmt: skip


def nfs_unmount(where: Path) -> None:
    """Unmount *where*; forced and then lazy if the server does not answer."""
    for flags in ((), ("-f",), ("-l",)):
        done = subprocess.run(["umount", *flags, str(where)], capture_output=True, timeout=60)
        if done.returncode == 0:
            return


def as_user(uid: int, gid: int | None = None, groups: tuple[int, ...] = ()) -> list[str]:
    """The command prefix that runs a command as *uid* (primary group *gid*, default the uid;
    supplementary *groups*, default none)."""
    group_arg = "--groups=" + ",".join(map(str, groups)) if groups else "--clear-groups"
    return ["setpriv", f"--reuid={uid}", f"--regid={uid if gid is None else gid}", group_arg]


def record(name: str, **facts: Any) -> None:
    """Keep an observation for the report: one JSON line in $FTLAB_OUT/observations.jsonl."""
    out = os.environ.get("FTLAB_OUT")
    line = json.dumps({"test": name, "profile": PROFILE, "nfs": version(), **facts})
    print(line)
    if out:
        with open(Path(out) / "observations.jsonl", "a") as f:
            f.write(line + "\n")


def alive(pid: int) -> bool:
    """Whether *pid* still exists and is not a zombie (it may be stuck in the kernel)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"


def wchan(pid: int) -> str:
    """Where in the kernel *pid* sleeps, and its state (e.g. "request_wait_answer D")."""
    try:
        where = Path(f"/proc/{pid}/wchan").read_text().strip() or "-"
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
    return f"{where} {state}"


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True
