"""Processes, sysfs and /proc, and the teardown that always runs.

Every resource the harness creates (loop device, throttle rule, bdi setting, cgroup, mount,
child process, scratch directory) is registered with :class:`Teardown` the moment it exists. The
registry is journaled to /dev/shm so ``python -m bench cleanup`` can undo what a harness killed
with SIGKILL left behind; a normal exit, Ctrl-C, SIGTERM or a crashed arm undo it in-process.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from fusethrottle.service.mountinfo import mounts
from fusethrottle.service.mountinfo import parse as parse_mountinfo

log = logging.getLogger(__name__)

# tmpfs: logs and the tar source never touch a disk being measured. Per user, so an
# unprivileged run against its own NFS mount does not collide with root's runs.
JOURNAL_DIR = Path(
    "/dev/shm/fusethrottle-bench" + ("" if os.geteuid() == 0 else f"-{os.geteuid()}")
)
CLK_TCK = os.sysconf("SC_CLK_TCK")
BLKIO_WRITE_BPS = Path("/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device")


class BenchError(RuntimeError):
    """An environment problem the user must fix; printed as one line."""


class ArmSkipped(Exception):
    """This arm cannot run here (daemon refuses the mode, kernel lacks a knob); ``str`` says why.
    Recorded in the results as skipped, never silently dropped."""


# --- small sysfs / procfs helpers ----------------------------------------------------------------


def head_commit() -> str:
    """The short commit of the checkout the bench runs from ("" outside one)."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def read_text(path: str | Path, default: str = "") -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return default


def write_sysfs(path: str | Path, value: str) -> None:
    """Write one value to a sysfs/procfs file; the kernel's errno becomes a readable error."""
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError as err:
        raise BenchError(f"cannot write {value!r} to {path}: {err.strerror}") from None


def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes."""
    out: dict[str, int] = {}
    for line in read_text("/proc/meminfo").splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            out[key] = int(parts[0]) * (1024 if len(parts) > 1 else 1)
    return out


def cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, for the load we record next to results."""
    fields = read_text("/proc/stat").split("\n", 1)[0].split()[1:]
    values = [float(v) for v in fields[:8]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def loadavg() -> float:
    try:
        return float(read_text("/proc/loadavg").split()[0])
    except (IndexError, ValueError):
        return float("nan")


def process_cpu_seconds(pid: int) -> float | None:
    """utime+stime of a live process (None once it is gone)."""
    text = read_text(f"/proc/{pid}/stat")
    if not text:
        return None
    fields = text.rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def process_start_ticks(pid: int) -> int | None:
    """Start time in clock ticks since boot: with the pid, it names a process uniquely."""
    text = read_text(f"/proc/{pid}/stat")
    if not text:
        return None
    return int(text.rpartition(")")[2].split()[19])


def process_wchar(pid: int) -> int | None:
    """Bytes the process passed to write() so far (what the application thinks it wrote)."""
    for line in read_text(f"/proc/{pid}/io").splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    return None


DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def drop_caches(level: int) -> None:
    """sync, then drop clean caches machine-wide: 1 the page cache, 2 dentries and inodes, 3 both.

    What makes a phase "cold": a read or a lookup must reach the filesystem (through FUSE, the
    daemon) instead of the kernel's caches. Needs root.
    """
    os.sync()
    write_sysfs(DROP_CACHES, str(level))


_libc = ctypes.CDLL(None, use_errno=True)


_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes(path: str | Path) -> int:
    """How much of the file at *path* is in the page cache (mincore of a read-only mapping).

    Opening and mapping read no data and change no page's age. 0 for a missing or empty file.
    Never call it on a FUSE file: an open there may drop the very cache it would count.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOATIME)
    except PermissionError:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return 0
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0
        addr = _libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        if addr in (None, ctypes.c_void_p(-1).value):
            return 0
        try:
            pages = (size + PAGE_SIZE - 1) // PAGE_SIZE
            vec = ctypes.create_string_buffer(pages)
            if _libc.mincore(addr, size, vec) != 0:
                return 0
            return (pages - vec.raw[:pages].count(0)) * PAGE_SIZE  # bit 0: resident
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def tree_resident_bytes(root: str | Path) -> int:
    """resident_bytes of every regular file below *root* (the backup's files on the target)."""
    total = 0
    for top, _dirs, names in os.walk(root):
        for name in names:
            total += resident_bytes(os.path.join(top, name))
    return total


def syncfs(path: str | Path) -> float:
    """syncfs(2) on the filesystem holding *path*; returns the seconds it took."""
    t0 = time.monotonic()
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _libc.syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs({path}): {os.strerror(err)}")
    finally:
        os.close(fd)
    return time.monotonic() - t0


def mount_entry(path: str | Path) -> tuple[str, str] | None:
    """(MAJ:MIN, fstype) of the mount at exactly *path*, from /proc/self/mountinfo.

    Never stat() a FUSE mountpoint to learn whether it is mounted: if the daemon does not answer,
    stat blocks in the kernel, and so would the harness.
    """
    found = None
    for entry in mounts():  # the last one mounted at *path* is the one on top
        if entry.mountpoint == str(path):
            found = (entry.device, entry.fstype)
    return found


def findmnt_type(path: str | Path) -> str:
    entry = mount_entry(path)
    return entry[1] if entry else ""


FUSECTL = Path("/sys/fs/fuse/connections")


def fuse_abort(path: str | Path) -> bool:
    """Abort a FUSE connection whose daemon no longer answers (fusectl's ``abort``).

    Every request waiting on it fails with ENOTCONN, so stuck processes (ours) can exit. Mounts
    the fusectl filesystem for the moment if nobody has, and unmounts it again.
    """
    minor = fuse_connection(path)
    return minor is not None and abort_connection(minor, str(path))


def fuse_connection(path: str | Path) -> str | None:
    """The fusectl name (the device's minor) of the FUSE mount at *path*, if it is one."""
    entry = mount_entry(path)
    if entry is None or not entry[1].startswith("fuse"):
        return None
    return entry[0].split(":")[1]


def abort_connection(minor: str, label: str) -> bool:
    """fusectl's ``abort`` of connection *minor* (*label*: what the log calls it)."""
    mounted_here = False
    if not (FUSECTL / minor).exists() and not any(FUSECTL.iterdir()):
        mounted_here = (
            subprocess.run(
                ["mount", "-t", "fusectl", "fusectl", str(FUSECTL)], capture_output=True
            ).returncode
            == 0
        )
    try:
        write_sysfs(FUSECTL / minor / "abort", "1")
        log.warning("aborted the FUSE connection of %s (daemon not answering)", label)
        return True
    except BenchError as err:
        log.error("could not abort FUSE connection of %s: %s", label, err)
        return False
    finally:
        if mounted_here:
            subprocess.run(["umount", str(FUSECTL)], capture_output=True)


def answers(path: str | Path, timeout: float) -> bool:
    """Does stat(*path*) return within *timeout*? Asked from a throwaway thread, because a stat
    on a hung FUSE mount cannot be interrupted."""
    done = threading.Event()

    def probe() -> None:
        with contextlib.suppress(OSError):
            os.stat(path)
        done.set()

    threading.Thread(target=probe, daemon=True, name="stat-probe").start()
    return done.wait(timeout)


def run(cmd: Sequence[str], timeout: float = 120, check: bool = True) -> str:
    """Run a short helper command (losetup, mkfs, mount); its stderr becomes the error."""
    try:
        res = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise BenchError(f"{cmd[0]} is not installed") from None
    except subprocess.TimeoutExpired:
        raise BenchError(f"{' '.join(cmd)} did not finish within {timeout:g}s") from None
    if check and res.returncode != 0:
        msg = (res.stderr or res.stdout).strip().splitlines()
        raise BenchError(f"{' '.join(cmd)} failed: {msg[-1] if msg else res.returncode}")
    return res.stdout


# --- child processes -----------------------------------------------------------------------------


@dataclass
class Child:
    """A process we started, reaped with wait4 so its CPU time is exact."""

    name: str
    popen: subprocess.Popen
    started: float
    start_ticks: int | None
    exit_code: int | None = None
    cpu_seconds: float | None = None
    ended: float | None = None
    key: int = 0  # teardown handle
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        """Reap without blocking; returns the exit code once the process is gone."""
        with self._lock:
            if self.exit_code is not None:
                return self.exit_code
            try:
                pid, status, usage = os.wait4(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.exit_code = self.popen.returncode if self.popen.returncode is not None else -1
                self.ended = time.monotonic()
                return self.exit_code
            if pid == 0:
                return None
            self.exit_code = os.waitstatus_to_exitcode(status)
            self.popen.returncode = self.exit_code
            self.cpu_seconds = usage.ru_utime + usage.ru_stime
            self.ended = time.monotonic()
            return self.exit_code

    def wait(self, timeout: float | None = None) -> int | None:
        """Poll until exit or *timeout*; stays interruptible by Ctrl-C (no blocking wait4)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.005
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        return code

    def alive(self) -> bool:
        return self.poll() is None

    def signal(self, sig: int) -> None:
        """Signal this process only if it is still the one we started (pid reuse guard)."""
        if self.poll() is None and process_start_ticks(self.pid) == self.start_ticks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def stop(self, grace: float = 5.0) -> int | None:
        """SIGTERM, then SIGKILL after *grace* seconds."""
        if self.poll() is not None:
            return self.exit_code
        self.signal(signal.SIGTERM)
        if self.wait(grace) is None:
            log.warning(
                "%s (pid %d) ignored SIGTERM for %gs; killing it", self.name, self.pid, grace
            )
            self.signal(signal.SIGKILL)
            self.wait(10)
        return self.exit_code


def in_cgroup(cmd: Sequence[str], procs_file: str | None) -> list[str]:
    """Wrap *cmd* so it execs inside a cgroup (recipe B): no preexec_fn, which is unsafe with
    the sampler thread running."""
    if not procs_file:
        return list(cmd)
    return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', procs_file, *cmd]


def start(
    name: str,
    cmd: Sequence[str],
    *,
    teardown: Teardown,
    cgroup_procs: str | None = None,
    stdout: str | Path | int | None = None,
    stderr: str | Path | None = None,
    stdin: int | IO[bytes] | None = subprocess.DEVNULL,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
) -> Child:
    """Start a child in its own session (Ctrl-C reaches only us, so we tear down in order)."""
    out: IO[bytes] | int
    if isinstance(stdout, int):
        out = stdout  # e.g. subprocess.PIPE for the first half of a pipeline
    else:
        out = open(stdout, "wb") if stdout else subprocess.DEVNULL  # noqa: SIM115
    err = open(stderr, "wb") if stderr else subprocess.DEVNULL  # noqa: SIM115
    # Ctrl-C between the fork and push_child below would leave a child nobody tears down (seen
    # as a neighbour left running in its cgroup): hold SIGINT until the child is registered.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        popen = subprocess.Popen(
            in_cgroup(cmd, cgroup_procs),
            stdin=stdin,
            stdout=out,
            stderr=err,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        child = Child(name, popen, time.monotonic(), process_start_ticks(popen.pid))
        child.key = teardown.push_child(child)
    except FileNotFoundError:
        raise BenchError(f"{cmd[0]} is not installed") from None
    finally:
        for f in (out, err):
            if not isinstance(f, int):
                f.close()
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    return child


# --- teardown ------------------------------------------------------------------------------------


@dataclass
class _Action:
    key: int
    kind: str
    args: tuple
    early: bool  # run first when aborting (e.g. lift the throttle so flushes can finish)
    child: Child | None = None


def loop_is_ours(majmin: str, image: str) -> bool:
    """Is device MAJ:MIN still the loop device over *image*? Loop numbers are reused at once by
    whoever asks next, and their throttle rule or bdi setting is not ours to touch."""
    backing = read_text(f"/sys/dev/block/{majmin}/loop/backing_file").strip()
    return bool(backing) and os.path.realpath(backing) == os.path.realpath(image)


def _act_clear_throttle(majmin: str, image: str = "") -> None:
    if image and not loop_is_ours(majmin, image):
        return
    write_sysfs(BLKIO_WRITE_BPS, f"{majmin} 0")


def _act_restore_bdi(bdi: str, max_ratio_fine: str, strict: str, image: str = "") -> None:
    base = Path("/sys/class/bdi") / bdi
    if not base.exists() or (image and not loop_is_ours(bdi, image)):
        return
    if strict:
        write_sysfs(base / "strict_limit", strict)
    if max_ratio_fine and (base / "max_ratio_fine").exists():
        write_sysfs(base / "max_ratio_fine", max_ratio_fine)


def _act_umount(path: str) -> None:
    if not findmnt_type(path):
        return
    for attempt in range(10):
        res = subprocess.run(["umount", path], capture_output=True, text=True)
        if res.returncode == 0 or not findmnt_type(path):
            return
        time.sleep(0.2 * (attempt + 1))
    log.warning("umount %s stayed busy; detaching it lazily", path)
    subprocess.run(["umount", "-l", path], capture_output=True)


def _act_fusermount(path: str) -> None:
    if findmnt_type(path).startswith("fuse"):
        if not answers(path, 5.0):
            fuse_abort(path)
        res = subprocess.run(["fusermount3", "-u", path], capture_output=True, timeout=60)
        if res.returncode != 0 and findmnt_type(path):
            subprocess.run(["fusermount3", "-u", "-z", path], capture_output=True, timeout=60)


def _act_losetup_detach(dev: str, image: str) -> None:
    name = Path(dev).name
    backing = read_text(f"/sys/block/{name}/loop/backing_file").strip()
    if backing and os.path.realpath(backing) == os.path.realpath(image):
        run(["losetup", "-d", dev], check=False)


ZRAM_CONTROL = Path("/sys/class/zram-control")


def _act_zram_remove(number: str) -> None:
    """Free a zram disk the harness added (its memory goes with it)."""
    if not Path(f"/sys/block/zram{number}").exists():
        return
    write_sysfs(f"/sys/block/zram{number}/reset", "1")
    write_sysfs(ZRAM_CONTROL / "hot_remove", number)


def _act_rmtree(path: str) -> None:
    """Remove a work directory, but never recurse through a mount left inside it. The mount
    table goes through the parser that skips what it cannot read: a source name with a
    character splitlines() splits at (the kernel escapes only space, tab, newline, backslash)
    cut a line short, and the directory stayed behind."""
    inside = [
        m.mountpoint
        for m in parse_mountinfo(read_text("/proc/self/mountinfo"))
        if m.mountpoint.startswith(path.rstrip("/") + "/")
    ]
    for mp in sorted(inside, reverse=True):
        log.warning("%s is still mounted inside %s; detaching it", mp, path)
        if findmnt_type(mp).startswith("fuse"):
            _act_fusermount(mp)
        else:
            subprocess.run(["umount", "-l", mp], capture_output=True)
    if any(findmnt_type(mp) for mp in inside):
        log.error("not removing %s: mounts inside it would not go away", path)
        return
    shutil.rmtree(path, ignore_errors=True)


def _act_remove_cgroup(path: str, parent_procs: str) -> None:
    """Move leftover tasks (ours) back to where we live, empty the cgroup, remove it."""
    cg = Path(path)
    if not cg.exists():
        return
    for _ in range(50):
        pids = read_text(cg / "cgroup.procs").split()
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(OSError):
                write_sysfs(parent_procs, pid)
        time.sleep(0.1)
    with contextlib.suppress(BenchError):
        write_sysfs(cg / "memory.force_empty", "0")
    for _ in range(50):
        try:
            cg.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)
    log.warning("could not remove cgroup %s", path)


def _act_restore_tc(dev: str, how: str, rate: int) -> None:
    from bench.tc import restore

    restore(dev, how, rate)


def _act_kill(pid: int, start_ticks: int) -> None:
    if process_start_ticks(pid) == start_ticks:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


ACTIONS: dict[str, Callable[..., None]] = {
    "clear-throttle": _act_clear_throttle,
    "restore-tc": _act_restore_tc,
    "restore-bdi": _act_restore_bdi,
    "umount": _act_umount,
    "fusermount": _act_fusermount,
    "losetup-detach": _act_losetup_detach,
    "zram-remove": _act_zram_remove,
    "rmtree": _act_rmtree,
    "remove-cgroup": _act_remove_cgroup,
    "kill": _act_kill,
}


class Teardown:
    """LIFO registry of undo actions, journaled so a later ``bench cleanup`` can finish them."""

    def __init__(self, journal_dir: Path = JOURNAL_DIR) -> None:
        self._actions: list[_Action] = []
        self._next = 0
        self._lock = threading.RLock()
        journal_dir.mkdir(parents=True, exist_ok=True)
        self.journal = journal_dir / f"journal-{os.getpid()}.json"
        self._write_journal()

    def push(self, kind: str, *args: object, early: bool = False) -> int:
        """Register an undo action the moment its resource exists; returns a handle."""
        if kind not in ACTIONS:
            raise ValueError(kind)
        with self._lock:
            self._next += 1
            self._actions.append(_Action(self._next, kind, tuple(args), early))
            self._write_journal()
            return self._next

    def push_child(self, child: Child) -> int:
        with self._lock:
            self._next += 1
            self._actions.append(
                _Action(self._next, "kill", (child.pid, child.start_ticks), False, child)
            )
            self._write_journal()
            return self._next

    def undo(self, key: int) -> None:
        """Run one action now (the normal, in-order release of a resource)."""
        with self._lock:
            action = next((a for a in self._actions if a.key == key), None)
            if action is None:
                return
            self._actions.remove(action)
        self._run(action)
        with self._lock:
            self._write_journal()

    def forget(self, key: int) -> None:
        """Drop an action whose resource is already gone (e.g. a child that exited)."""
        with self._lock:
            self._actions = [a for a in self._actions if a.key != key]
            self._write_journal()

    def mark(self) -> int:
        """A point to roll back to with :meth:`undo_since` (e.g. the start of one arm)."""
        with self._lock:
            return self._next

    def undo_since(self, mark: int) -> None:
        """Undo, newest first, everything registered after *mark*."""
        with self._lock:
            keys = [a.key for a in reversed(self._actions) if a.key > mark]
        for key in keys:
            self.undo(key)

    def undo_all(self, aborted: bool = False) -> None:
        """Undo everything, newest first; on abort the ``early`` ones go first."""
        with self._lock:
            actions = list(reversed(self._actions))
        if aborted:
            actions.sort(key=lambda a: not a.early)
        for action in actions:
            self._run(action)
            with self._lock:
                if action in self._actions:
                    self._actions.remove(action)
                self._write_journal()
        with contextlib.suppress(OSError):
            self.journal.unlink()
        with contextlib.suppress(OSError):
            self.journal.parent.rmdir()  # only when no other run is using it

    def _run(self, action: _Action) -> None:
        try:
            if action.child is not None:
                action.child.stop(grace=3.0)
            else:
                ACTIONS[action.kind](*action.args)
        except Exception as err:
            log.error("teardown %s%s failed: %s", action.kind, action.args, err)

    def _write_journal(self) -> None:
        data = {
            "pid": os.getpid(),
            "start_ticks": process_start_ticks(os.getpid()),
            "actions": [[a.kind, list(a.args), a.early] for a in self._actions],
        }
        tmp = self.journal.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.journal)


def scratch_ext4(name: str, size: str, teardown: Teardown) -> tuple[Path, Path]:
    """(scratch, target): a fresh /var/tmp/fusethrottle-NAME-PID directory and an ext4 of *size*
    on a loop device mounted at scratch/target, as an NFS server's export would be; both undone
    by *teardown* (the unmount first)."""
    scratch = Path("/var/tmp") / f"fusethrottle-{name}-{os.getpid()}"
    scratch.mkdir(parents=True)
    teardown.push("rmtree", str(scratch))
    image, target = scratch / "ext4.img", scratch / "target"
    subprocess.run(["truncate", "-s", size, str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    target.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(target)], check=True)
    teardown.push("umount", str(target))
    return scratch, target


def clean_stale_journals(journal_dir: Path = JOURNAL_DIR) -> list[str]:
    """Undo what dead harnesses left behind (journals whose pid no longer runs)."""
    done: list[str] = []
    if not journal_dir.exists():
        return done
    for journal in sorted(journal_dir.glob("journal-*.json")):
        try:
            data = json.loads(journal.read_text())
        except (OSError, ValueError):
            continue
        pid = data.get("pid")
        if pid and process_start_ticks(pid) == data.get("start_ticks"):
            continue  # that harness is still running
        actions = data.get("actions", [])
        actions = sorted(reversed(actions), key=lambda a: not a[2])
        for kind, args, _early in actions:
            try:
                ACTIONS[kind](*args)
                done.append(f"{kind} {' '.join(map(str, args))}")
            except Exception as err:
                log.error("cleanup %s %s failed: %s", kind, args, err)
        journal.unlink(missing_ok=True)
    return done


class Interrupted(BaseException):
    """Raised in the main thread on SIGTERM/SIGHUP so ``finally`` blocks run like on Ctrl-C."""


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into an exception, and make sure SIGINT is KeyboardInterrupt
    (a shell starts background jobs with SIGINT ignored)."""

    def handler(signum: int, _frame: object) -> None:
        raise Interrupted(signal.Signals(signum).name)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    old[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """During teardown, note further signals instead of dying half-way through it."""

    def handler(signum: int, _frame: object) -> None:
        log.warning("%s during teardown: finishing teardown first", signal.Signals(signum).name)

    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {s: signal.signal(s, handler) for s in sigs}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
