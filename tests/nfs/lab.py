"""What tests inside the NFS lab VM share: where the lab's mounts are, the server's switch,
and the wire counts.

These tests run only in the lab (``python -m bench.nfslab run smoke|correctness``), which
sets FTLAB=1 and says where its NFS mounts are; elsewhere they are skipped.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.nfslab import mountstats, profiles
from bench.nfslab.profiles import EXPORT_ROOT

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


def nfs_mount_options() -> tuple[str, str]:
    """The options and the server of client 1's mount of the ``rw`` export (to mount another
    export the same way)."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if fields[1] == str(NFS / "rw"):
            server = fields[0].split(":", 1)[0]
            keep = [
                o
                for o in fields[3].split(",")
                if o.split("=")[0] in ("vers", "hard", "timeo", "retrans", "nolock")
            ]
            return ",".join(keep), server
    raise LookupError(f"no NFS mount at {NFS / 'rw'}")


@contextlib.contextmanager
def small_export(size_mib: int = 64, quota: bool = False) -> Iterator[Path]:
    """A small ext4 file system of its own (a loop device in the VM), exported by the lab's
    server and mounted through client 1 as the other exports are: a target that fills up.
    With *quota*, user quotas are enforced on it (see :func:`set_block_quota`).

    Yields client 1's mount point; everything is taken down again on the way out."""
    name = f"small-{uuid.uuid4().hex[:8]}"
    image = Path("/run") / f"{name}.img"
    server_dir = Path(EXPORT_ROOT) / name
    client_dir = NFS / name
    options, server = nfs_mount_options()
    with open(image, "wb") as f:
        f.truncate(size_mib << 20)
    features = ["-O", "quota"] if quota else []
    _sh("modprobe", "loop")
    if quota:
        _sh("modprobe", "quota_v2")
    _sh("mkfs.ext4", "-q", "-F", "-m", "0", *features, str(image))
    server_dir.mkdir()
    steps: list[list[str]] = []
    try:
        _sh("mount", "-o", "loop" + (",usrquota" if quota else ""), str(image), str(server_dir))
        steps.append(["umount", str(server_dir)])
        server_dir.chmod(0o1777)
        fsid = 100 + int(name[-4:], 16) % 10000
        spec = f"*:{server_dir}"
        _sh(
            "exportfs", "-o",
            f"rw,async,no_root_squash,fsid={fsid},no_subtree_check,insecure", spec,
        )  # fmt: skip
        steps.append(["exportfs", "-u", spec])
        client_dir.mkdir()
        remote = f"{server}:{server_dir}" if "vers=3" in options else f"{server}:/{name}"
        _sh(
            "nsenter", "--net=/run/netns/client",
            "mount", "-t", "nfs", "-o", options, remote, str(client_dir),
        )  # fmt: skip
        steps.append(["umount", "-f", str(client_dir)])
        yield client_dir
    finally:
        for step in reversed(steps):
            subprocess.run(step, capture_output=True, check=False, timeout=60)
        with contextlib.suppress(OSError):
            client_dir.rmdir()
        with contextlib.suppress(OSError):
            server_dir.rmdir()
        image.unlink(missing_ok=True)


def _loop_device_of(mountpoint: Path) -> str:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if fields[1] == str(mountpoint):
            return fields[0]
    raise LookupError(f"nothing mounted at {mountpoint}")


def set_block_quota(export: Path, uid: int, limit_bytes: int) -> None:
    """A hard block quota for *uid* on the small export mounted at *export* (client 1's path),
    set on the server's file system with quotactl(2) (the quota tools are not needed)."""
    server_dir = Path(EXPORT_ROOT) / export.name
    device = _loop_device_of(server_dir).encode()

    class IfDqblk(ctypes.Structure):
        _fields_ = [
            ("dqb_bhardlimit", ctypes.c_uint64),
            ("dqb_bsoftlimit", ctypes.c_uint64),
            ("dqb_curspace", ctypes.c_uint64),
            ("dqb_ihardlimit", ctypes.c_uint64),
            ("dqb_isoftlimit", ctypes.c_uint64),
            ("dqb_curinodes", ctypes.c_uint64),
            ("dqb_btime", ctypes.c_uint64),
            ("dqb_itime", ctypes.c_uint64),
            ("dqb_valid", ctypes.c_uint32),
        ]

    q_setquota, usrquota, qif_blimits = 0x800008, 0, 1
    blocks = limit_bytes // 1024  # quotactl counts blocks of 1 KiB (QIF_DQBLKSIZE)
    limits = IfDqblk(blocks, blocks, 0, 0, 0, 0, 0, 0, qif_blimits)
    libc = ctypes.CDLL(None, use_errno=True)
    cmd = (q_setquota << 8) | usrquota
    if libc.quotactl(cmd, device, uid, ctypes.byref(limits)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"quotactl Q_SETQUOTA on {device.decode()}: {os.strerror(err)}")


def _sh(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")


def open_fds(pid: int) -> int:
    """How many descriptors process *pid* holds of files, directories and placeholders: not
    counting a request loop's own (with the native engine each request thread has its clone
    of /dev/fuse and a splice pipe: their number follows the threads the load started, not
    the files the daemon holds)."""
    held = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target != "/dev/fuse" and not target.startswith("pipe:"):
            held += 1
    return held


def forget_cached_names() -> None:
    """Make the kernel drop unused dentries and inodes (FUSE then sends FORGET for them)."""
    Path("/proc/sys/vm/drop_caches").write_text("2\n")


def poll(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> float | None:
    """Seconds until *predicate* held (checked at once, then every *interval*), or None if it
    did not within *timeout*."""
    start = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - start
        if time.monotonic() - start >= timeout:
            return None
        time.sleep(interval)


def held_by(pid: int, under: Path) -> list[str]:
    """The descriptors of process *pid* on objects under *under*: "path (O_PATH)" or
    "path (open)", for a failure message saying what pins a silly-renamed file."""
    held = []
    prefix = str(under).rstrip("/") + "/"
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            where = os.readlink(f"/proc/{pid}/fd/{fd}")
            flags = int(Path(f"/proc/{pid}/fdinfo/{fd}").read_text().split()[3], 8)
        except (OSError, IndexError, ValueError):
            continue
        if where.startswith(prefix):
            kind = "O_PATH" if flags & os.O_PATH else "open"
            held.append(f"{where[len(prefix) :]} ({kind})")
    return sorted(held)


FILL_SCRIPT = """
import errno, json, os, sys
path, total, chunk = sys.argv[1], int(sys.argv[2]), 1 << 20
events = []
def step(name, fn, *args):
    try:
        fn(*args)
        events.append([name, ""])
        return True
    except OSError as err:
        events.append([name, errno.errorcode.get(err.errno, str(err.errno))])
        return False
fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
block = os.urandom(chunk)
written = 0
while written < total:
    try:
        written += os.write(fd, block)
    except OSError as err:
        events.append(["write", errno.errorcode.get(err.errno, str(err.errno))])
        break
step("fsync", os.fsync, fd)
step("fsync again", os.fsync, fd)
step("close", os.close, fd)
print(json.dumps({"written": written, "events": events}))
"""


def fill_file(path: Path, total: int, as_user: int | None = None) -> tuple[int, list[list[str]]]:
    """Write *total* bytes (1 MiB at a time) to a new file, stopping at the first failed
    write, then fsync twice and close; in a child process (as uid *as_user*, if given).
    Returns the bytes write() accepted and each step with the errno it failed with ("": ok);
    of the writes, only a failed one is listed."""
    argv = ["python3", "-c", FILL_SCRIPT, str(path), str(total)]
    if as_user is not None:
        argv = ["setpriv", f"--reuid={as_user}", f"--regid={as_user}", "--clear-groups", *argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the writer failed: {done.stderr}")
    out = json.loads(done.stdout)
    return out["written"], out["events"]


class SillyHolders:
    """While in use, samples (every few ms) which descriptors of process *pid* refer to
    silly-renamed files under *under*: what kept a removed file from going."""

    def __init__(self, pid: int | None, under: Path) -> None:
        self.pid, self.under = pid, under
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            with contextlib.suppress(OSError):
                assert self.pid is not None
                self.seen.update(
                    h for h in held_by(self.pid, self.under) if "/.nfs" in h or h.startswith(".nfs")
                )

    def __enter__(self) -> SillyHolders:
        if self.pid is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.pid is not None:
            self._thread.join()


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


@contextlib.contextmanager
def slow_link(bytes_per_second: int) -> Iterator[None]:
    """Client 1's link to the server carries at most *bytes_per_second* inside the block (a
    token bucket on its egress, where the WRITEs go). Only on the unshaped profiles."""
    rate = f"{bytes_per_second * 8}bit"
    subprocess.run(
        [*CLIENT_LINK, "add", "dev", "ftcli", "root", "tbf", "rate", rate, "burst", "256kb",
         "latency", "5s"],
        check=True,
    )  # fmt: skip
    try:
        yield
    finally:
        link_up()


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
