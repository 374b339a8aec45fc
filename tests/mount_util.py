"""Start FUSE daemons as subprocesses for tests, and always take them down again.

Rules every helper here keeps:

* A mount is detected in /proc/self/mountinfo, never by stat()ing the mountpoint: asking a
  mount that does not serve yet (or any more) about itself hangs or fails.
* Teardown always unmounts and reaps: ``fusermount3 -u``; if that fails, ``-uz`` (lazy) and
  SIGKILL of the daemon. A test that leaves a mount behind breaks every later test on the host.
* A mount that stops answering never hangs the test run: readiness is a stat() from a child
  process that can be killed, and every fusethrottle daemon has a watchdog that dumps its
  threads' stacks into its log (SIGUSR1, faulthandler), kills it and detaches the mount, so the
  blocked test fails with ENOTCONN instead of waiting forever.
* Only processes started here are ever signalled, by pid.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fusethrottle.service import mountinfo

# FUSETHROTTLE_BIN picks the daemon to test (scripts/test sets it for Debian's system python).
FUSETHROTTLE = os.environ.get("FUSETHROTTLE_BIN") or str(
    Path(sys.executable).with_name("fusethrottle")
)
#: The in-memory target (a libfuse program), compiled on first use by memfs_binary().
MEMFS_SOURCE = Path(__file__).with_name("memfs.c")
#: A trio task that lives as long as the mount, as the task tree names it: the controller loop.
LIFELONG_TASK = "Daemon._control"
FSTYPE = "fuse.fusethrottle"
# The NFS lab's VM (FTLAB=1) may run without KVM, many times slower, beside other VMs.
START_TIMEOUT = 120.0 if os.environ.get("FTLAB") == "1" else 30.0
STOP_TIMEOUT = 60.0
UNMOUNT_TRIES = 10  # fusermount3 -u, half a second apart, while the kernel says busy
WATCHDOG = 240.0  # no test keeps one mount this long: past it the mount is hung


def _reachable_by_others(path: Path) -> bool:
    """Could a user with no special rights read *path*? (Every parent o+x, the file o+r.)"""
    path = path.absolute()
    if not os.stat(path).st_mode & 0o004:
        return False
    return all(os.stat(parent).st_mode & 0o001 for parent in path.parents)


_OTHER_USER_COMMAND: list[str] = []


def command_for_other_users() -> list[str]:
    """How another user (nobody) runs this fusethrottle.

    A checkout in a private directory (a 0700 temporary dir, as a CI clone may be) is out of
    reach for other users. Then they run a world-readable copy of the package on the system
    python, whose Debian packages scripts/install provides.
    """
    if _OTHER_USER_COMMAND:
        return _OTHER_USER_COMMAND
    if _reachable_by_others(Path(FUSETHROTTLE)):
        _OTHER_USER_COMMAND.append(FUSETHROTTLE)
        return _OTHER_USER_COMMAND
    import atexit
    import shutil
    import tempfile

    import fusethrottle

    copy = Path(tempfile.mkdtemp(prefix="fusethrottle-other-user-"))
    atexit.register(shutil.rmtree, copy, True)
    copy.chmod(0o755)
    shutil.copytree(
        Path(fusethrottle.__file__).parent,
        copy / "fusethrottle",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for path in [copy, *copy.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    _OTHER_USER_COMMAND.extend(
        ["/usr/bin/env", f"PYTHONPATH={copy}", "/usr/bin/python3", "-m", "fusethrottle"]
    )
    return _OTHER_USER_COMMAND


class MountFailed(RuntimeError):
    """The daemon exited (or never mounted) instead of serving."""


def mount_table() -> list[tuple[str, str, str]]:
    """(mountpoint, fstype, source) of every mount this process can see."""
    return [(m.mountpoint, m.fstype, m.source) for m in mountinfo.mounts()]


def mounted(path: str | Path, fstype: str | None = None) -> bool:
    target = os.path.abspath(path)
    return any(m == target and (fstype is None or t == fstype) for m, t, _ in mount_table())


def mounts_under(path: str | Path) -> list[str]:
    prefix = os.path.abspath(path).rstrip("/") + "/"
    return [m for m, _, _ in mount_table() if m.startswith(prefix)]


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def stream_landing(path: Path, landed: Path, total: int) -> list[tuple[float, int]]:
    """Write *total* bytes (1 MiB writes, then an fsync) to *path* on a thread, sampling how
    much has landed at *landed* on the target every 50 ms until all of it has: (seconds since
    before the first write, bytes), each size read before its clock, so a bound that grows with
    the time passed can only be loosened by a slow machine. A hang guard fails after 120 s.

    Landed means stored: the blocks the target allocated, not the file's size, which a write
    further on moves past holes the kernel's other write-back requests have not filled yet."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    start = time.monotonic()
    failed: list[BaseException] = []

    def writer() -> None:
        try:
            for _ in range(total // (1 << 20)):
                os.write(fd, os.urandom(1 << 20))
            os.fsync(fd)  # all of it to the target now, not at the kernel's leisure
        except BaseException as err:
            failed.append(err)

    thread = threading.Thread(target=writer)
    thread.start()
    samples: list[tuple[float, int]] = []
    try:
        while not samples or samples[-1][1] < total:
            time.sleep(0.05)
            size = landed.stat().st_blocks * 512
            elapsed = time.monotonic() - start
            samples.append((elapsed, size))
            assert not failed, failed
            assert elapsed < 120, f"only {size / (1 << 20):.1f} MiB landed in {elapsed:.0f} s"
    finally:
        thread.join()
        os.close(fd)
    return samples


def fusermount_unmount(path: str | Path, lazy: bool = False) -> subprocess.CompletedProcess[str]:
    args = ["fusermount3", "-u", *(["-z"] if lazy else []), str(path)]  # (its reason kept)
    return subprocess.run(args, capture_output=True, text=True, timeout=STOP_TIMEOUT, check=False)


def held_by(pid: int, directory: Path) -> list[str]:
    """What the descriptors of *pid* hold under *directory* (a removed file's link ends in
    " (deleted)")."""
    held = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith(f"{directory}/"):
                held.append(target)
    return held


def status_json(mountpoint: Path) -> dict[str, Any]:
    """What ``fusethrottle status --json`` says of the mount."""
    out = subprocess.run(
        [FUSETHROTTLE, "status", str(mountpoint), "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]


@dataclass
class Daemon:
    """One FUSE daemon in the foreground, its mountpoint and its stderr."""

    mountpoint: Path
    proc: subprocess.Popen[bytes]
    log_path: Path
    fstype: str = FSTYPE
    source: Path | None = None
    stopped: bool = field(default=False)  # SIGSTOPped by a test: SIGCONT before teardown
    expect_log_problems: bool = field(default=False)  # the test provokes warnings on purpose
    hung: bool = field(default=False)  # the watchdog had to break this mount
    _watchdog: threading.Timer | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def is_mounted(self) -> bool:
        return mounted(self.mountpoint, self.fstype)

    def wait(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """The exit code, or None if the daemon is still running after *timeout*."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signum)

    def freeze(self, timeout: float = 10.0) -> None:
        """SIGSTOP, and wait until every thread of the process has stopped: a request that
        reaches one of its threads before that is still answered (the C memfs keeps ten
        threads waiting for requests, each stops only when the signal wakes it), so a test
        that goes on at once could see a frozen target answer (teardown sends SIGCONT)."""
        self.signal(signal.SIGSTOP)
        self.stopped = True
        tasks = Path(f"/proc/{self.proc.pid}/task")

        def every_thread_stopped() -> bool:
            try:
                states = [
                    (t / "stat").read_text().rsplit(")", 1)[1].split()[0] for t in tasks.iterdir()
                ]
            except (FileNotFoundError, ProcessLookupError):
                return False
            return bool(states) and all(state in ("T", "t") for state in states)

        if not wait_for(every_thread_stopped, timeout):
            raise AssertionError(f"{self.fstype} (pid {self.proc.pid}) did not stop")

    def answers(self, timeout: float = 10.0) -> bool:
        """Does the mount answer a stat? Asked from a child process, which can be killed."""
        try:
            probe = subprocess.run(
                ["stat", "-c", "%i", str(self.mountpoint)],
                capture_output=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return False
        return probe.returncode == 0

    def arm_watchdog(self, seconds: float = WATCHDOG) -> None:
        self._watchdog = threading.Timer(seconds, self.break_hang)
        self._watchdog.daemon = True
        self._watchdog.start()

    def break_hang(self) -> None:
        """Dump the daemon's stacks into its log, kill it and detach the mount."""
        self.hung = True
        if self.fstype == FSTYPE:
            self.signal(signal.SIGUSR1)  # fusethrottle registers faulthandler on SIGUSR1
            time.sleep(1.0)
        self.signal(signal.SIGKILL)
        fusermount_unmount(self.mountpoint, lazy=True)

    def _note_why_it_stays(self, unmount: subprocess.CompletedProcess[str] | None) -> None:
        """Before a daemon that outstayed its unmount is killed: what the unmount said, whether
        the mount is still there, and where each of its threads waits (the kernel's view, then
        the daemon's own, SIGUSR1 to faulthandler), appended to its log for the failure."""
        lines = ["== the daemon did not exit after the unmount: killed; what it looked like"]
        if unmount is None:
            lines.append("not unmounted by the test (it was not mounted any more)")
        else:
            said = (unmount.stderr or "").strip() or "nothing"
            lines.append(
                f"fusermount3 -u (the last of up to {UNMOUNT_TRIES} tries): exit "
                f"{unmount.returncode}, said {said}"
            )
        lines.append(f"still mounted: {self.is_mounted()}")
        for task in sorted(Path(f"/proc/{self.pid}/task").glob("*")):
            name = wchan = stack = "?"
            with contextlib.suppress(OSError):
                name = (task / "comm").read_text().strip()
                wchan = (task / "wchan").read_text().strip()
                stack = (task / "stack").read_text().strip().replace("\n", " < ")
            lines.append(f"thread {task.name} {name}: {wchan}: {stack}")
        with open(self.log_path, "a") as log:
            log.write("\n".join(lines) + "\n")
        if self.fstype == FSTYPE:
            self.signal(signal.SIGUSR1)
            time.sleep(1.0)

    def stop(self) -> int | None:
        """Unmount and reap, whatever state the daemon is in; returns its exit code."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self.stopped:
            self.signal(signal.SIGCONT)
            self.stopped = False
        unmount: subprocess.CompletedProcess[str] | None = None
        if self.is_mounted() and self.proc.poll() is None:
            unmount = fusermount_unmount(self.mountpoint)
            for _ in range(UNMOUNT_TRIES - 1):
                # Refused (busy) for a moment right after the test's last close: the daemon
                # would then wait for an unmount that never came (seen under the sanitizers).
                if unmount.returncode == 0 or not self.is_mounted():
                    break
                time.sleep(0.5)
                unmount = fusermount_unmount(self.mountpoint)
        code = self.wait(STOP_TIMEOUT if self.proc.poll() is None else 0)
        if code is None:
            self._note_why_it_stays(unmount)
            self.signal(signal.SIGKILL)
            code = self.wait()
        if self.is_mounted():
            fusermount_unmount(self.mountpoint, lazy=True)
        return code


def _start(
    argv: Sequence[str],
    mountpoint: Path,
    log_path: Path,
    fstype: str,
    timeout: float,
    cgroup: Path | None = None,
) -> Daemon:
    if cgroup is not None:  # start inside a (memory) cgroup, as a container would
        argv = ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh", *argv]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # a ^C at the terminal must not reach the daemon
        )
    daemon = Daemon(mountpoint, proc, log_path, fstype)
    if not wait_for(lambda: daemon.is_mounted() or proc.poll() is not None, timeout):
        daemon.stop()
        raise MountFailed(f"{argv[0]} did not mount {mountpoint} in {timeout}s:\n{daemon.log()}")
    if not daemon.is_mounted():
        daemon.stop()
        raise MountFailed(f"{argv[0]} exited with {proc.returncode}:\n{daemon.log()}")
    if not daemon.answers(timeout):
        daemon.break_hang()
        daemon.stop()
        raise MountFailed(f"{mountpoint} is mounted but does not answer:\n{daemon.log()}")
    return daemon


def start_fusethrottle(
    source: Path,
    mountpoint: Path,
    options: Sequence[str] = (),
    *,
    log_path: Path | None = None,
    timeout: float = START_TIMEOUT,
    cgroup: Path | None = None,
    wrapper: Sequence[str] = (),
    conf: Path | None = None,
) -> Daemon:
    """*wrapper*: a command the daemon runs under (setpriv taking capabilities away,
    ``prlimit ... --``); *conf*: started as fusethrottle@.service starts it, ``--conf FILE``
    (whose SOURCE= must be *source*) instead of SOURCE on the command line."""
    where = ["--conf", str(conf)] if conf is not None else [str(source)]
    argv = [*wrapper, FUSETHROTTLE, *where, str(mountpoint), "-f"]
    if options:
        argv += ["-o", ",".join(options)]
    log_path = log_path or mountpoint.with_name(mountpoint.name + ".log")
    daemon = _start(argv, mountpoint, log_path, FSTYPE, timeout, cgroup)
    daemon.source = source
    daemon.arm_watchdog()
    return daemon


_MEMFS_BINARY: list[str] = []


def memfs_binary() -> str:
    """memfs.c compiled, at most once per test session: the binary is kept under the temporary
    directory, keyed on the source and the build command, so later runs reuse it and an edited
    source is rebuilt. Raises with the compiler's complaint if it does not build."""
    if _MEMFS_BINARY:
        return _MEMFS_BINARY[0]
    import hashlib
    import shlex
    import stat
    import tempfile

    def pkg_config(flag: str) -> list[str]:
        out = subprocess.run(
            ["pkg-config", flag, "fuse3"], capture_output=True, text=True, check=False
        )
        if out.returncode != 0:
            raise RuntimeError(f"pkg-config {flag} fuse3 failed (libfuse3-dev?):\n{out.stderr}")
        return shlex.split(out.stdout)

    command = ["gcc", "-O2", "-Wall", "-Wextra", "-Werror", *pkg_config("--cflags")]
    command += [str(MEMFS_SOURCE), *pkg_config("--libs"), "-lpthread"]
    key = hashlib.sha256(MEMFS_SOURCE.read_bytes() + "\0".join(command).encode()).hexdigest()
    cache = Path(tempfile.gettempdir()) / f"fusethrottle-memfs-{os.getuid()}-{key[:16]}"
    with contextlib.suppress(FileExistsError):
        cache.mkdir(mode=0o700)
    # A shared /tmp: run nothing from a directory another user could have put there.
    info = os.lstat(cache)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise RuntimeError(f"{cache} is not a private directory of ours: remove it")
    binary = cache / "memfs"
    if not binary.exists():
        partial = cache / f"memfs.{os.getpid()}.tmp"  # parallel sessions each build their own
        built = subprocess.run(
            [*command, "-o", str(partial)], capture_output=True, text=True, check=False
        )
        if built.returncode != 0:
            partial.unlink(missing_ok=True)
            raise RuntimeError(
                f"{MEMFS_SOURCE.name} does not build ({shlex.join(command)}):\n{built.stderr}"
            )
        os.replace(partial, binary)
    _MEMFS_BINARY.append(str(binary))
    return str(binary)


def start_memfs(
    mountpoint: Path,
    record: Path,
    timeout: float = START_TIMEOUT,
    stale_unlinked: bool = False,
    slow_getattr: float = 0.0,
    slow_all_while: tuple[Path, float] | None = None,
    log_attributes: bool = False,
) -> Daemon:
    """The in-memory target of memfs.c; *record* receives its write/fsync log (with
    *log_attributes*, its getattr/setattr log too);
    *stale_unlinked*: removed files answer ESTALE, as on NFS after another client's delete;
    *slow_getattr*: seconds every stat takes; *slow_all_while* (PATH, SECONDS): every call
    takes SECONDS while PATH exists."""
    log_path = mountpoint.with_name(mountpoint.name + ".log")
    argv = [memfs_binary(), str(mountpoint), str(record)]
    if stale_unlinked:
        argv.append("--stale-unlinked")
    if slow_getattr:
        argv.append(f"--slow-getattr={slow_getattr}")
    if slow_all_while is not None:
        argv.append(f"--slow-all-while={slow_all_while[0]}:{slow_all_while[1]}")
    if log_attributes:
        argv.append("--log-attributes")
    return _start(argv, mountpoint, log_path, "fuse.memfs", timeout + 2 * slow_getattr)


def problems_in_log(text: str) -> list[str]:
    """Lines of a daemon log that a clean run never produces."""
    bad = ("Traceback", " ERROR ", " CRITICAL ", " WARNING ")
    return [line for line in text.splitlines() if any(word in line for word in bad)]


@contextlib.contextmanager
def running(daemon: Daemon):  # type: ignore[no-untyped-def]
    """``with running(start_fusethrottle(...)) as d:`` - stopped on the way out, always."""
    try:
        yield daemon
    finally:
        daemon.stop()
