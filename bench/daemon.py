"""Start and stop the FUSE daemon of one arm: fusethrottle, or libfuse's C passthrough_ll.

The daemon runs in the foreground (``-f``) as our child, so its CPU time is exact. fusethrottle
is stopped with SIGTERM — which makes it flush every dirty file and exit 0; passthrough_ll holds
nothing, it is unmounted with ``fusermount3 -u`` and exits. The stop time is part of the arm's
durable time: data a daemon still holds is not on the target yet.

A mode fusethrottle refuses (it exits non-zero before mounting) makes the arm *skipped* with the
daemon's own message; so does a machine without gcc or libfuse3-dev for the C arms. Anything that
fails after mounting is a *failed* arm.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from bench.system import (
    ArmSkipped,
    BenchError,
    Child,
    Teardown,
    abort_connection,
    answers,
    findmnt_type,
    fuse_abort,
    fuse_connection,
    read_text,
    start,
)

log = logging.getLogger(__name__)

#: How long the C example may go on after its mount is gone from here before its connection is
#: taken to be held by another mount namespace (see PassthroughLLMount.stop).
ORPHAN_WAIT = 10.0


def find_executable(explicit: str | None) -> str | None:
    """The fusethrottle command: --fusethrottle, else next to our Python (the venv), else PATH."""
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    beside = Path(sys.executable).parent / "fusethrottle"
    if os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("fusethrottle")


def chosen_arms(
    text: str, known: Mapping[str, str | None], explicit: str | None
) -> tuple[list[str], str | None, str | None]:
    """(arms, fusethrottle executable, error): the comma-separated arms of *text*, each a key
    of *known* (None: the target directly, needing no executable), and the executable the
    others need; *error* says what is wrong with them, in one line."""
    arms = [a for a in text.split(",") if a]
    unknown = [a for a in arms if a not in known]
    if unknown:
        return arms, None, f"unknown arm(s): {', '.join(unknown)}"
    exe = find_executable(explicit)
    if exe is None and any(known[a] for a in arms):
        return arms, None, "no fusethrottle executable found"
    return arms, exe, None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _generic(command: list[str], source: Path, mountpoint: Path) -> str:
    words = [Path(command[0]).name, *command[1:]]
    text = " ".join(words).replace(str(source), "SOURCE")
    return text.replace(str(mountpoint), "MOUNTPOINT")


def _last_line(path: Path) -> str:
    lines = [ln.strip() for ln in read_text(path).splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _await_mount(
    name: str,
    child: Child,
    mountpoint: Path,
    log_path: Path,
    teardown: Teardown,
    t0: float,
    timeout: float,
    exited: Callable[[str], Exception],
) -> float:
    """Wait until *child* has mounted *mountpoint* and a stat through it answers; returns the
    seconds since *t0*. A child that exits first raises ``exited(its last stderr line)``."""
    while not findmnt_type(mountpoint).startswith("fuse"):
        code = child.poll()
        if code is not None:
            teardown.forget(child.key)
            raise exited(_last_line(log_path.with_suffix(".err")) or f"exit status {code}")
        if time.monotonic() - t0 > timeout:
            raise BenchError(f"{name} did not mount {mountpoint} in {timeout:g}s")
        time.sleep(0.02)
    if not answers(mountpoint, timeout=10.0):
        fuse_abort(mountpoint)
        raise BenchError(f"{name} mounted {mountpoint} but stat() on it hung 10s")
    return time.monotonic() - t0


class FuseThrottleMount:
    """One mount: SOURCE (on the target) at MOUNTPOINT (on local tmpfs)."""

    name = "fusethrottle"

    def __init__(
        self,
        exe: str,
        source: Path,
        mountpoint: Path,
        options: str,
        log_path: Path,
        teardown: Teardown,
        cgroup_procs: str | None,
        metrics: bool,
    ) -> None:
        self.exe = exe
        self.source = source
        self.mountpoint = mountpoint
        self.metrics_url: str | None = None
        self.user_options = options.strip(",")  # what the arm asked for (stable across runs)
        if metrics:
            port = free_port()
            options = f"{options},metrics=127.0.0.1:{port}"
            self.metrics_url = f"http://127.0.0.1:{port}/metrics"
        self.options = options.strip(",")
        self.log_path = log_path
        self.teardown = teardown
        self.cgroup_procs = cgroup_procs
        self.child: Child | None = None
        self.mount_key = 0
        self.mount_seconds = float("nan")

    @property
    def command(self) -> list[str]:
        return [self.exe, str(self.source), str(self.mountpoint), "-o", self.options, "-f"]

    def generic_command(self) -> str:
        """The command with the arm's own paths as SOURCE and MOUNTPOINT: what the report shows."""
        return _generic(self.command, self.source, self.mountpoint)

    def start(self, timeout: float = 30.0) -> None:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        self.child = start(
            "fusethrottle",
            self.command,
            teardown=self.teardown,
            cgroup_procs=self.cgroup_procs,
            stdout=self.log_path,
            stderr=self.log_path.with_suffix(".err"),
        )
        # Registered after the child: LIFO teardown unmounts only after SIGTERM had its chance.
        self.mount_key = self.teardown.push("fusermount", str(self.mountpoint))
        self.mount_seconds = _await_mount(
            "fusethrottle",
            self.child,
            self.mountpoint,
            self.log_path,
            self.teardown,
            t0,
            timeout,
            lambda reason: ArmSkipped(f"fusethrottle refused -o {self.user_options}: {reason}"),
        )
        log.debug("mounted %s in %.2fs (pid %d)", self.mountpoint, self.mount_seconds, self.pid)

    @property
    def pid(self) -> int | None:
        return self.child.pid if self.child else None

    def close(self) -> None:
        """After a failure: make sure no daemon and no mount are left (idempotent)."""
        if self.child is not None and self.child.alive():
            self.child.signal(15)
            if self.child.wait(30) is None:
                fuse_abort(self.mountpoint)
                self.child.stop(grace=5)
            self.teardown.forget(self.child.key)
        if self.mount_key:
            self.teardown.undo(self.mount_key)

    def stop(self, timeout: float) -> dict[str, object]:
        """SIGTERM (the daemon flushes, unmounts, exits 0); returns how long and how it went."""
        assert self.child is not None
        t0 = time.monotonic()
        self.child.signal(15)
        code = self.child.wait(timeout)
        if code is None:
            log.error("fusethrottle did not exit %gs after SIGTERM; unmounting it", timeout)
            self.teardown.undo(self.mount_key)
            code = self.child.stop(grace=10)
        self.teardown.forget(self.child.key)
        if findmnt_type(self.mountpoint):
            log.error("fusethrottle exited (%s) but %s is still mounted", code, self.mountpoint)
        self.teardown.undo(self.mount_key)
        return {
            "stop_seconds": time.monotonic() - t0,
            "exit_code": code,
            "daemon_cpu_s": self.child.cpu_seconds,
            "mount_seconds": self.mount_seconds,
            "stderr_tail": _last_line(self.log_path.with_suffix(".err")),
        }


# --- libfuse's C passthrough_ll: the reference arms c-ll and c-ll-wb ---------------------------

EXAMPLES = Path("/usr/share/doc/libfuse3-dev/examples")
PASSTHROUGH_LL = EXAMPLES / "passthrough_ll.c"
HELPERS = "passthrough_helpers.h"  # included by passthrough_ll.c from its own directory


def cache_dir() -> Path:
    """Where the compiled example is kept between runs (~/.cache/fusethrottle-bench)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fusethrottle-bench"


@dataclass(frozen=True)
class CBuild:
    """The compiled example and how it was made (recorded in run.json next to the numbers)."""

    binary: Path
    source: Path
    command: str
    source_sha256: str
    fuse_version: str
    compiled: bool  # False: the cached binary was newer than the source, built the same way

    def info(self) -> dict[str, object]:
        return {
            "binary": str(self.binary),
            "source": str(self.source),
            "source_sha256": self.source_sha256,
            "command": self.command,
            "libfuse": self.fuse_version,
            "compiled_now": self.compiled,
        }


def _unpack(gz: Path, into: Path) -> Path:
    """Debian compresses big documentation files: gunzip the example (and its helper header)
    next to each other, as the compiler expects."""
    into.mkdir(parents=True, exist_ok=True)
    for name in (gz.name.removesuffix(".gz"), HELPERS):
        packed = gz.parent / f"{name}.gz"
        plain = gz.parent / name
        dest = into / name
        if plain.exists():
            shutil.copy2(plain, dest)
        elif packed.exists():
            dest.write_bytes(gzip.decompress(packed.read_bytes()))
            os.utime(dest, (packed.stat().st_mtime, packed.stat().st_mtime))
    return into / gz.name.removesuffix(".gz")


def build_passthrough_ll(source: Path = PASSTHROUGH_LL, cache: Path | None = None) -> CBuild:
    """Compile libfuse's shipped example with ``gcc -O2 -Wall FILE $(pkg-config --cflags --libs
    fuse3)`` into the cache; reuse the cached binary while it is newer than the source and was
    built by the same command (a libfuse upgrade changes both).

    Raises ArmSkipped when the source, gcc or pkg-config's fuse3 is missing (the arm is recorded
    as skipped, with what to install), BenchError when gcc fails on the source.
    """
    cache = cache or cache_dir()
    gz = source.with_name(source.name + ".gz")
    if not source.exists() and not gz.exists():
        raise ArmSkipped(f"libfuse3-dev is not installed: no {source} (apt install libfuse3-dev)")
    for tool in ("gcc", "pkg-config"):
        if shutil.which(tool) is None:
            raise ArmSkipped(f"{tool} is not installed (apt install {tool}): cannot build {source}")
    flags = subprocess.run(
        ["pkg-config", "--cflags", "--libs", "fuse3"], capture_output=True, text=True
    )
    if flags.returncode != 0:
        raise ArmSkipped("pkg-config knows no fuse3 (apt install libfuse3-dev)")
    version = subprocess.run(
        ["pkg-config", "--modversion", "fuse3"], capture_output=True, text=True
    ).stdout.strip()
    cache.mkdir(parents=True, exist_ok=True)
    if not source.exists():
        source = _unpack(gz, cache / "src")
    # The binary's name becomes the mount's type: fuse.passthrough_ll in findmnt.
    binary = cache / "passthrough_ll"
    cmd = ["gcc", "-O2", "-Wall", str(source), *shlex.split(flags.stdout), "-o", str(binary)]
    command = shlex.join(cmd)
    stamp = cache / "passthrough_ll.cmd"
    inputs = [source, *source.parent.glob(HELPERS)]
    newest = max(p.stat().st_mtime for p in inputs)
    fresh = (
        binary.exists() and binary.stat().st_mtime >= newest and read_text(stamp).strip() == command
    )
    if not fresh:
        # Build beside it and rename: a concurrent run never executes a half-written binary.
        tmp = cache / f".passthrough_ll.{os.getpid()}"
        t0 = time.monotonic()
        res = subprocess.run([*cmd[:-1], str(tmp)], capture_output=True, text=True, timeout=300)
        (cache / "passthrough_ll.build.log").write_text(f"{command}\n{res.stdout}{res.stderr}")
        if res.returncode != 0:
            tmp.unlink(missing_ok=True)
            lines = [ln for ln in res.stderr.splitlines() if "error" in ln] or [res.stderr]
            raise BenchError(f"gcc could not build {source}: {lines[0].strip()[:300]}")
        os.replace(tmp, binary)
        stamp.write_text(command + "\n")
        log.info("built %s in %.1fs (libfuse %s)", binary, time.monotonic() - t0, version)
    return CBuild(
        binary=binary,
        source=source,
        command=command,
        source_sha256=hashlib.sha256(source.read_bytes()).hexdigest(),
        fuse_version=version,
        compiled=not fresh,
    )


class PassthroughLLMount:
    """libfuse's passthrough_ll serving SOURCE at MOUNTPOINT, in the foreground as our child.

    Run with its upstream defaults: ``cache=auto`` (entry and attribute timeout 1 s, the page
    cache of a file dropped when it is opened again), the multi-threaded loop, no writeback cache
    unless the arm adds ``-o writeback``, and no xattrs (``-o xattr`` is off: it answers ENOSYS,
    after which the kernel stops sending it xattr requests at all). Stopped the way its users stop
    it: ``fusermount3 -u``, after which it exits 0.
    """

    name = "passthrough_ll"
    metrics_url: str | None = None

    def __init__(
        self,
        binary: Path,
        source: Path,
        mountpoint: Path,
        options: str,
        log_path: Path,
        teardown: Teardown,
        cgroup_procs: str | None,
    ) -> None:
        self.binary = binary
        self.source = source
        self.mountpoint = mountpoint
        self.user_options = options.strip(",")
        self.options = ",".join(o for o in (f"source={source}", self.user_options) if o)
        self.log_path = log_path
        self.teardown = teardown
        self.cgroup_procs = cgroup_procs
        self.child: Child | None = None
        self.mount_key = 0
        self.mount_seconds = float("nan")
        self.connection: str | None = None  # its fusectl name, once mounted

    @property
    def command(self) -> list[str]:
        return [str(self.binary), "-f", "-o", self.options, str(self.mountpoint)]

    def generic_command(self) -> str:
        return _generic(self.command, self.source, self.mountpoint)

    @property
    def pid(self) -> int | None:
        return self.child.pid if self.child else None

    def start(self, timeout: float = 30.0) -> None:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        self.child = start(
            self.name,
            self.command,
            teardown=self.teardown,
            cgroup_procs=self.cgroup_procs,
            stdout=self.log_path,
            stderr=self.log_path.with_suffix(".err"),
        )
        # Pushed after the child, so undone before it: unmounting is what makes it exit.
        self.mount_key = self.teardown.push("fusermount", str(self.mountpoint))
        self.mount_seconds = _await_mount(
            "passthrough_ll",
            self.child,
            self.mountpoint,
            self.log_path,
            self.teardown,
            t0,
            timeout,
            lambda reason: BenchError(f"passthrough_ll exited before mounting: {reason}"),
        )
        self.connection = fuse_connection(self.mountpoint)
        log.debug("mounted %s in %.2fs (pid %d)", self.mountpoint, self.mount_seconds, self.pid)

    def _unmount(self) -> bool:
        """fusermount3 -u, retried briefly while the mount is busy; True once it is gone."""
        for attempt in range(10):
            if not findmnt_type(self.mountpoint):
                return True
            res = subprocess.run(
                ["fusermount3", "-u", str(self.mountpoint)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            if res.returncode == 0:
                return True
            log.debug("fusermount3 -u %s: %s", self.mountpoint, res.stderr.strip())
            time.sleep(0.1 * (attempt + 1))
        return not findmnt_type(self.mountpoint)

    def stop(self, timeout: float) -> dict[str, object]:
        """Unmount, wait for the daemon to exit; returns how long and how it went."""
        assert self.child is not None
        t0 = time.monotonic()
        if not self._unmount():
            log.error("fusermount3 -u %s failed; aborting the connection", self.mountpoint)
            fuse_abort(self.mountpoint)
            self.teardown.undo(self.mount_key)
        code = self.child.wait(min(timeout, ORPHAN_WAIT))
        if code is None and self.connection and not findmnt_type(self.mountpoint):
            # Unmounted here, but its connection lives on: a copy of the mount in another mount
            # namespace made before the unmount (this host's mounts are private, so the unmount
            # does not reach it) keeps the example reading /dev/fuse until that namespace ends.
            log.warning(
                "passthrough_ll still running %gs after %s was unmounted (another mount "
                "namespace holds a copy of it); aborting its connection",
                ORPHAN_WAIT,
                self.mountpoint,
            )
            abort_connection(self.connection, str(self.mountpoint))
        if code is None:
            code = self.child.wait(max(0.0, timeout - (time.monotonic() - t0)))
        if code is None:
            log.error("passthrough_ll did not exit %gs after its unmount; stopping it", timeout)
            code = self.child.stop(grace=10)
        self.teardown.forget(self.child.key)
        self.teardown.undo(self.mount_key)  # no-op when it is gone, as it should be
        if findmnt_type(self.mountpoint):
            log.error("passthrough_ll exited (%s) but %s is still mounted", code, self.mountpoint)
        return {
            "stop_seconds": time.monotonic() - t0,
            "exit_code": code,
            "daemon_cpu_s": self.child.cpu_seconds,
            "mount_seconds": self.mount_seconds,
            "stderr_tail": _last_line(self.log_path.with_suffix(".err")),
        }

    def close(self) -> None:
        """After a failure: no daemon and no mount left (idempotent)."""
        if self.mount_key:
            self.teardown.undo(self.mount_key)
        if self.child is not None:
            if self.child.wait(10) is None:
                self.child.stop(grace=5)
            self.teardown.forget(self.child.key)
