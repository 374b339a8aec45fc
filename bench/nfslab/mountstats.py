"""What an NFS mount sent over the wire: the per-operation counts of /proc/self/mountstats.

Each NFS superblock keeps, per RPC procedure, how many were sent (and bytes and times); the
difference between two readings is what a workload cost on the wire. A directory inside an
NFS mount counts into that mount's superblock, so every reading is of the whole mount.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path


def parse(text: str, mountpoint: str) -> Counter[str] | None:
    """RPCs sent by the NFS mount at *mountpoint* (its operations with a count above zero),
    plus ``write_bytes``/``read_bytes`` sent to/received from the server; None if no such
    NFS mount."""
    found = False
    counts: Counter[str] = Counter()
    inside = False
    in_ops = False
    for line in text.splitlines():
        if line.startswith("device "):
            inside = f" mounted on {mountpoint} with fstype nfs" in line
            in_ops = False
            found = found or inside
            continue
        if not inside:
            continue
        stripped = line.strip()
        if stripped.startswith("bytes:"):
            fields = stripped.split()[1:]
            # normalread normalwrite directread directwrite serverread serverwrite ...
            counts["read_bytes"] = int(fields[4])
            counts["write_bytes"] = int(fields[5])
        elif stripped.startswith("per-op statistics"):
            in_ops = True
        elif in_ops and ":" in stripped:
            name, rest = stripped.split(":", 1)
            fields = rest.split()
            if fields and fields[0].isdigit() and int(fields[0]) > 0:
                counts[name] = int(fields[0])
    return counts if found else None


def read(mountpoint: str) -> Counter[str]:
    counts = parse(Path("/proc/self/mountstats").read_text(), mountpoint)
    if counts is None:
        raise LookupError(f"no NFS mount at {mountpoint}")
    return counts


BYTES = ("read_bytes", "write_bytes")


def rpcs(before: Counter[str], after: Counter[str]) -> Counter[str]:
    """The RPCs sent between two readings (no byte counters)."""
    delta = Counter({k: after[k] - before.get(k, 0) for k in after if k not in BYTES})
    return Counter({k: v for k, v in delta.items() if v > 0})


def total(delta: Counter[str]) -> int:
    """All RPCs but the session's own keep-alives (SEQUENCE, RENEW) and the NULL ping."""
    return sum(v for k, v in delta.items() if k not in ("SEQUENCE", "RENEW", "NULL"))
