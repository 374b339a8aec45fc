"""Pressure stall information (PSI) of the workload the guard protects, as fractions of time.

Pure parsing and arithmetic: the kernel's ``some`` line says how long at least one task of the
workload waited for memory or for I/O; the guard compares the share of wall time so lost
between two readings with what it was while the backup was idle. The files are read at the
edge (``watcher.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: The resources the guard watches: a database stalls on both when a backup competes with it
#: (reclaim and thrashing under a shared memory limit; its own reads queued behind the backup's).
RESOURCES = ("memory", "io")


class PressureUnavailable(RuntimeError):
    """The kernel gives no pressure for what ``guard=`` names; ``str()`` is the one line."""


@dataclass(frozen=True)
class Reading:
    """One reading of the ``some`` totals (microseconds of stall since boot) at *at* seconds."""

    at: float
    totals: tuple[int, ...]  # in RESOURCES' order


def some_total(text: str) -> int:
    """The ``total=`` of the ``some`` line of a PSI file's *text* (microseconds)."""
    for line in text.splitlines():
        kind, _, fields = line.partition(" ")
        if kind != "some":
            continue
        for field in fields.split():
            key, _, value = field.partition("=")
            if key == "total" and value.isdigit():
                return int(value)
    raise ValueError(f"no 'some ... total=' line in {text!r}")


def stall_share(before: Reading, after: Reading) -> float:
    """The largest share of wall time, over the resources, that the workload spent stalled
    between two readings (0..1). A counter that went backwards (a cgroup recreated) is 0."""
    elapsed_us = (after.at - before.at) * 1e6
    if elapsed_us <= 0:
        return 0.0
    shares = (
        max(0, new - old) / elapsed_us for old, new in zip(before.totals, after.totals, strict=True)
    )
    return min(1.0, max(shares, default=0.0))


def pressure_files(
    guard: str, proc: Path = Path("/proc"), cgroup_root: Path | None = None
) -> tuple[Path, ...]:
    """The PSI files for ``guard=`` *guard*: ``host`` is ``/proc/pressure``; anything else is a
    cgroup v2 directory (absolute, or relative to the unified hierarchy's root)."""
    if guard == "host":
        directory = proc / "pressure"
        files = tuple(directory / name for name in RESOURCES)
    else:
        directory = Path(guard)
        if not directory.is_absolute():
            directory = (cgroup_root or Path("/sys/fs/cgroup")) / guard
        files = tuple(directory / f"{name}.pressure" for name in RESOURCES)
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        where = "the host" if guard == "host" else f"cgroup {directory}"
        raise PressureUnavailable(
            f"guard={guard}: the kernel reports no pressure for {where} "
            f"({missing[0]} is missing: PSI needs Linux 4.20+ with psi enabled"
            + ("" if guard == "host" else ", and a cgroup v2 directory")
            + ")"
        )
    return files
