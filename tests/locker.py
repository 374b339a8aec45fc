"""A process that locks a file on demand, for the lock tests (tests/test_locks.py, and the NFS
lab's tests/nfs/test_locks.py): open, then an exclusive flock or fcntl lock when told."""

from __future__ import annotations

import select
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: A process that opens *path* for writing, says "open", waits for a line, takes an exclusive
#: lock of *kind* (waiting for it, or not: "refused ERRNO"), says "locked" and keeps it until
#: its standard input closes.
LOCKER = """
import fcntl, os, sys
kind, path, wait = sys.argv[1], sys.argv[2], sys.argv[3] == "wait"
fd = os.open(path, os.O_RDWR)
print("open", flush=True)
sys.stdin.readline()
how = fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB
try:
    (fcntl.lockf if kind == "fcntl" else fcntl.flock)(fd, how)
except OSError as err:
    print("refused", err.errno, flush=True)
    sys.exit(0)
print("locked", flush=True)
sys.stdin.read()
"""

KINDS = ("fcntl", "flock")


class Locker:
    """One process of LOCKER: open, then lock on demand."""

    def __init__(self, kind: str, path: Path, wait: bool = False) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", LOCKER, kind, str(path), "wait" if wait else "try"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._line() == "open", f"could not open {path}"

    def _line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def lock(self) -> None:
        """Ask for the lock (see ``answer``)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def answers_within(self, seconds: float) -> bool:
        """Whether it says something (or ends) within *seconds*."""
        assert self.proc.stdout is not None
        readable, _, _ = select.select([self.proc.stdout], [], [], seconds)
        return bool(readable)

    def answer(self) -> str:
        """ "locked", or "refused ERRNO"."""
        return self._line()

    def release(self) -> None:
        """Close its standard input: it exits, and the kernel drops its lock."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def try_lock(kind: str, path: Path) -> str:
    locker = Locker(kind, path)
    try:
        locker.lock()
        return locker.answer()
    finally:
        locker.release()


@contextmanager
def held(kind: str, path: Path) -> Iterator[Locker]:
    """An exclusive lock of *kind* on *path*, held by another process for the block."""
    locker = Locker(kind, path)
    try:
        locker.lock()
        assert locker.answer() == "locked", f"could not lock {path}"
        yield locker
    finally:
        locker.release()
