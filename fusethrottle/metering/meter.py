"""EFS-style metering: what each operation the daemon sends to the target costs.

Pure: no I/O and no clock, so the numbers are tested exactly. The engine prices each request by
these rules (handed to it at mount: engine/native.py) and holds a mount to a rate of these costs
at its ceilings (engine/src/ceilings.cc).

Why meter like Amazon EFS: EFS does not bill or throttle by bytes moved but by *metered*
bytes and *file-operation units*. A backup that writes many small files is therefore throttled
long before its byte rate looks high. A 1-byte write costs as much as a 32 KiB write, and each
write or metadata update costs 5 of the 35,000 units/s that a General Purpose file system allows
across all of its clients. Metering the daemon's own requests the same way shows that small-write
amplification, and optional ceilings (``metered_limit=``, ``ops_limit=``) keep one host inside a
share of those budgets.

Rules of a :class:`MeterProfile` (EFS's current rules are the ``efs`` profile):

- A data operation (read or write of file contents) is metered at ``max(size, data_min)``,
  rounded up to a whole ``granule`` (1 KiB). A metadata operation (lookup, getattr, readdir,
  create, setattr, rename, unlink, fsync...) is metered at ``max(size, meta_min)``, rounded the
  same way.
- Reads, of data or metadata, are metered at ``read_factor`` (1/3) of that, rounded up to a byte.
- File-operation units per request: ``read_units`` (1) for reading data or metadata,
  ``write_units`` (5) for writing data or updating metadata.

Profiles: ``efs`` (32 KiB data minimum, 4 KiB metadata minimum), ``efs-legacy`` (the older rule:
every request at least 4 KiB), and ``none``. ``none`` meters raw bytes (no minimum, 1-byte
granule, reads not discounted) and counts every request as one unit, so the ceilings become plain
bytes/s and operations/s. Every number can be overridden: ``profile("efs", write_units=3)``.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass
from typing import Protocol

KiB = 1024


class OpClass(enum.Enum):
    """What a request to the target does, as EFS meters it."""

    DATA_READ = "data_read"
    DATA_WRITE = "data_write"
    META_READ = "meta_read"
    META_WRITE = "meta_write"

    @property
    def is_read(self) -> bool:
        return self in (OpClass.DATA_READ, OpClass.META_READ)

    @property
    def is_data(self) -> bool:
        return self in (OpClass.DATA_READ, OpClass.DATA_WRITE)


#: The metering class of each metadata request, by FUSE operation name: the one table the
#: engine (handed it by native.py) and the metrics use. read and write are data; fsync, flush,
#: release and forget never wait at a ceiling, and anything not listed is metered as a metadata
#: write (a test checks that every request the engine sends to the target is listed).
METADATA_CLASS: dict[str, OpClass] = {
    **dict.fromkeys(
        (
            "lookup",
            "getattr",
            "readlink",
            "opendir",
            "readdir",
            "statfs",
            "getxattr",
            "listxattr",
            "open",
            "readdirplus",
            "access",
        ),
        OpClass.META_READ,
    ),
    **dict.fromkeys(
        (
            "setattr",
            "mknod",
            "mkdir",
            "symlink",
            "unlink",
            "rmdir",
            "rename",
            "link",
            "setxattr",
            "removexattr",
            "create",
            # space reserved or punched: a change of the file's layout, not data moved
            "fallocate",
            # a COMMIT of the directory on NFS
            "fsyncdir",
        ),
        OpClass.META_WRITE,
    ),
}


#: Requests that never reach the target as a request of their own (a close, a forget): not
#: metered at all.
UNMETERED = frozenset({"forget", "flush", "release", "releasedir"})
#: Requests that never wait at a ceiling: what must end for data to be durable.
NEVER_WAIT = frozenset({"fsync", "fsyncdir", *UNMETERED})


def op_class(op: str) -> OpClass:
    """The metering class of an operation on the target, by name (see METADATA_CLASS)."""
    if op == "write":
        return OpClass.DATA_WRITE
    if op == "read":
        return OpClass.DATA_READ
    return METADATA_CLASS.get(op, OpClass.META_WRITE)


@dataclass(frozen=True)
class MeterProfile:
    """How requests are metered; see the module docstring."""

    data_min: int = 32 * KiB
    meta_min: int = 4 * KiB
    granule: int = KiB
    read_factor: float = 1 / 3
    read_units: int = 1
    write_units: int = 5

    def __post_init__(self) -> None:
        if self.data_min < 0 or self.meta_min < 0:
            raise ValueError("metering minimums must not be negative")
        if self.granule < 1:
            raise ValueError("the metering granule must be at least 1 byte")
        if not 0.0 < self.read_factor <= 1.0:
            raise ValueError("read_factor must be in (0, 1]")
        if self.read_units < 0 or self.write_units < 0:
            raise ValueError("operation units must not be negative")


PROFILES: dict[str, MeterProfile] = {
    "efs": MeterProfile(),
    "efs-legacy": MeterProfile(data_min=4 * KiB, meta_min=4 * KiB),
    "none": MeterProfile(
        data_min=0, meta_min=0, granule=1, read_factor=1.0, read_units=1, write_units=1
    ),
}


def profile(name: str, **overrides: int | float) -> MeterProfile:
    """The named profile with *overrides* applied; ValueError names what was wrong."""
    try:
        base = PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown meter profile {name!r} (one of {', '.join(PROFILES)})") from None
    fields = {f.name for f in dataclasses.fields(MeterProfile)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"unknown meter setting(s): {', '.join(unknown)}")
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]


class MeterOptions(Protocol):
    """What :func:`profile_for` reads of a mount's options (options.Config, which validates
    them against this module: the dependency goes that way)."""

    @property
    def meter(self) -> str: ...

    @property
    def meter_overrides(self) -> tuple[tuple[str, float], ...]: ...


def profile_for(config: MeterOptions) -> MeterProfile:
    """The profile a mount's options ask for: ``meter=`` plus any ``meter_<field>=``."""
    return profile(config.meter, **dict(config.meter_overrides))


@dataclass(frozen=True)
class Charge:
    """What one request costs."""

    metered_bytes: int
    units: int


@dataclass(frozen=True)
class ClassTotals:
    """Counters for one :class:`OpClass`."""

    ops: int = 0
    bytes: int = 0
    metered_bytes: int = 0
    units: int = 0

    def plus(self, nbytes: int, charge: Charge) -> ClassTotals:
        return ClassTotals(
            self.ops + 1,
            self.bytes + nbytes,
            self.metered_bytes + charge.metered_bytes,
            self.units + charge.units,
        )


@dataclass(frozen=True)
class MeterSnapshot:
    """Frozen counters per class; ``snapshot[OpClass.DATA_WRITE].metered_bytes``."""

    data_read: ClassTotals = ClassTotals()
    data_write: ClassTotals = ClassTotals()
    meta_read: ClassTotals = ClassTotals()
    meta_write: ClassTotals = ClassTotals()

    def __getitem__(self, op: OpClass) -> ClassTotals:
        return getattr(self, op.value)

    @property
    def total(self) -> ClassTotals:
        parts = [self[op] for op in OpClass]
        return ClassTotals(
            sum(p.ops for p in parts),
            sum(p.bytes for p in parts),
            sum(p.metered_bytes for p in parts),
            sum(p.units for p in parts),
        )


class Meter:
    """Computes and accumulates :class:`Charge` for every request the daemon issues."""

    def __init__(self, profile: MeterProfile) -> None:
        self.profile = profile
        # Mutable [ops, bytes, metered_bytes, units] per class: record() is on the hot path
        # (every request to the target); snapshot() freezes them for readers.
        self._counts: dict[OpClass, list[int]] = {op: [0, 0, 0, 0] for op in OpClass}

    def charge(self, op: OpClass, nbytes: int) -> Charge:
        """What a request of *nbytes* would cost; records nothing."""
        p = self.profile
        size = max(int(nbytes), 0, p.data_min if op.is_data else p.meta_min)
        metered = -(-size // p.granule) * p.granule
        if op.is_read:
            return Charge(math.ceil(metered * p.read_factor), p.read_units)
        return Charge(metered, p.write_units)

    def record(self, op: OpClass, nbytes: int) -> Charge:
        """Charge a request that was issued and add it to the counters."""
        charge = self.charge(op, nbytes)
        counts = self._counts[op]
        counts[0] += 1
        counts[1] += max(int(nbytes), 0)
        counts[2] += charge.metered_bytes
        counts[3] += charge.units
        return charge

    def snapshot(self) -> MeterSnapshot:
        return MeterSnapshot(**{op.value: ClassTotals(*self._counts[op]) for op in OpClass})
