"""The native engine's C ABI (src/fusethrottle_engine.h) through ctypes.

The control plane calls in; no engine thread ever calls back into Python. The library is built
by ``scripts/install`` (``make -C fusethrottle/engine``); ``FUSETHROTTLE_ENGINE_LIBRARY`` names
another build (the sanitizers' in CI).
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..metering.fleet_share import Spending
from ..metering.meter import (
    NEVER_WAIT,
    PROFILES,
    UNMETERED,
    Charge,
    ClassTotals,
    MeterProfile,
    OpClass,
    op_class,
)

#: Must match FT_ENGINE_ABI of the library.
ABI = 12
#: Beside this file: make puts it there in a checkout, setup.py in an installed package.
LIBRARY = Path(__file__).with_name("libfusethrottle_engine.so")
LIBRARY_ENV = "FUSETHROTTLE_ENGINE_LIBRARY"
_ERROR_SIZE = 512


class EngineUnavailable(RuntimeError):
    """The library is missing or of another ABI; ``str()`` is the one line to print."""


#: The requests the engine counts, in the order of enum ft_engine_op (FUSE's names for them).
OPERATIONS = (
    "lookup",
    "forget",
    "getattr",
    "setattr",
    "readlink",
    "mknod",
    "mkdir",
    "unlink",
    "rmdir",
    "symlink",
    "rename",
    "link",
    "open",
    "read",
    "write",
    "flush",
    "release",
    "fsync",
    "opendir",
    "readdir",
    "readdirplus",
    "releasedir",
    "fsyncdir",
    "statfs",
    "setxattr",
    "getxattr",
    "listxattr",
    "removexattr",
    "create",
    "fallocate",
    "access",
)


#: FT_METER_* by class; FT_METER_NO_WAIT is the flag of kinds that never wait at a ceiling.
METER_CLASSES = {
    OpClass.DATA_READ: 1,
    OpClass.DATA_WRITE: 2,
    OpClass.META_READ: 3,
    OpClass.META_WRITE: 4,
}
_METER_NO_WAIT = 0x80
#: The length of the gate's histogram bounds (FT_ADMISSION_BOUNDS).
ADMISSION_BOUNDS = 16


def meter_classes() -> tuple[int, ...]:
    """The meter class of each request kind, in OPERATIONS' order, from meter.py's table."""
    out = []
    for op in OPERATIONS:
        code = 0 if op in UNMETERED else METER_CLASSES[op_class(op)]
        out.append(code | (_METER_NO_WAIT if op in NEVER_WAIT else 0))
    return tuple(out)


class _Meter(ctypes.Structure):
    _fields_ = (
        ("data_min", ctypes.c_uint64),
        ("meta_min", ctypes.c_uint64),
        ("granule", ctypes.c_uint64),
        ("read_factor", ctypes.c_double),
        ("read_units", ctypes.c_uint32),
        ("write_units", ctypes.c_uint32),
        ("classes", ctypes.c_uint8 * len(OPERATIONS)),
        ("metered_limit", ctypes.c_double),
        ("ops_limit", ctypes.c_double),
        ("throttle_reads", ctypes.c_int),
        ("fleet", ctypes.c_int),
    )


def _meter(
    profile: MeterProfile,
    metered_limit: float,
    ops_limit: float,
    reads: bool,
    fleet: bool = False,
) -> _Meter:
    return _Meter(
        profile.data_min,
        profile.meta_min,
        profile.granule,
        profile.read_factor,
        profile.read_units,
        profile.write_units,
        (ctypes.c_uint8 * len(OPERATIONS))(*meter_classes()),
        metered_limit,
        ops_limit,
        int(reads),
        int(fleet),
    )


class _MeterTotals(ctypes.Structure):
    _fields_ = (
        ("ops", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("metered_bytes", ctypes.c_uint64),
        ("units", ctypes.c_uint64),
    )


class _Error(ctypes.Structure):
    _fields_ = (("op", ctypes.c_uint32), ("error", ctypes.c_int32), ("count", ctypes.c_uint64))


class _Config(ctypes.Structure):
    _fields_ = (
        ("source", ctypes.c_char_p),
        ("mountpoint", ctypes.c_char_p),
        ("fuse_options", ctypes.c_char_p),
        ("writeback_cache", ctypes.c_int),
        ("entry_timeout", ctypes.c_double),
        ("attr_timeout", ctypes.c_double),
        ("max_threads", ctypes.c_uint),
        ("switch_credentials", ctypes.c_int),
        ("xattrs", ctypes.c_int),
        ("enforce", ctypes.c_int),
        ("inject", ctypes.c_int),
        ("window", ctypes.c_uint64),
        ("batch", ctypes.c_uint64),
        ("max_age", ctypes.c_double),
        ("admission_timeout", ctypes.c_double),
        ("writeback_pieces", ctypes.c_int),
        ("drop_synced", ctypes.c_int),
        ("sync_threads", ctypes.c_uint),
        ("killpriv_v2", ctypes.c_int),
        ("target_decides", ctypes.c_int),
        ("meter", _Meter),
        ("admission_bounds", ctypes.c_double * ADMISSION_BOUNDS),
        ("uncached", ctypes.c_int),
    )


class _Stats(ctypes.Structure):
    _fields_ = (
        ("known_files", ctypes.c_uint64),
        ("writeback_cache", ctypes.c_int),
        ("written_bytes", ctypes.c_uint64),
        ("window_bytes", ctypes.c_uint64),
        ("unsynced_bytes", ctypes.c_uint64),
        ("reserved_bytes", ctypes.c_uint64),
        ("syncing_bytes", ctypes.c_uint64),
        ("unsynced_high", ctypes.c_uint64),
        ("dirty_files", ctypes.c_uint64),
        ("oldest_age", ctypes.c_double),
        ("synced_bytes", ctypes.c_uint64),
        ("fsyncs", ctypes.c_uint64),
        ("fsync_errors", ctypes.c_uint64),
        ("fsyncs_in_flight", ctypes.c_uint64),
        ("waiting_writes", ctypes.c_uint64),
        ("throttled_writes", ctypes.c_uint64),
        ("paced_writes", ctypes.c_uint64),
        ("admission_timeouts", ctypes.c_uint64),
        ("admission_wait_seconds", ctypes.c_double),
        ("events_dropped", ctypes.c_uint64),
        ("killpriv_v2", ctypes.c_int),
        ("xattrs", ctypes.c_int),
        ("operations", ctypes.c_uint64 * len(OPERATIONS)),
        ("meter", _MeterTotals * 4),
        ("ceiling_delayed", ctypes.c_uint64),
        ("ceiling_delay_seconds", ctypes.c_double),
        ("admission_waits", ctypes.c_uint64 * (ADMISSION_BOUNDS + 1)),
        ("open_handles", ctypes.c_uint64),
        ("relief_high", ctypes.c_uint64),
        ("names_dropped", ctypes.c_uint64),
        ("page_cache_drops", ctypes.c_uint64),
        ("fleet_spent_metered", ctypes.c_double),
        ("fleet_spent_units", ctypes.c_double),
        ("fleet_waiting", ctypes.c_uint64),
        ("fleet_pacing", ctypes.c_uint64),
        ("fleet_waited", ctypes.c_uint64),
        ("fleet_wait_seconds", ctypes.c_double),
        ("passthrough", ctypes.c_int32),
        ("passthrough_opens", ctypes.c_uint64),
    )


class _Event(ctypes.Structure):
    _fields_ = (
        ("kind", ctypes.c_uint32),
        ("reason", ctypes.c_uint32),
        ("error", ctypes.c_int32),
        ("unused", ctypes.c_uint32),
        ("node", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("seconds", ctypes.c_double),
        ("at", ctypes.c_double),
        ("path", ctypes.c_char * 256),
    )


#: FT_EVENT_SYNC: an injected fsync ended.
EVENT_SYNC = 1
#: FT_EVENT_LOST: the target failed to store some of a file's data.
EVENT_LOST = 2
#: The reasons of FT_EVENT_SYNC, by code (the names the metrics use: definitions.FSYNC_REASONS).
SYNC_REASONS = {
    1: "batch",
    2: "release",
    3: "age",
    4: "window",
    5: "forget",
    6: "unmount",
    7: "application",
}
_EVENTS_AT_ONCE = 256


@dataclass(frozen=True)
class EngineConfig:
    source: str
    mountpoint: str
    fuse_options: tuple[str, ...]
    writeback_cache: bool
    attr_timeout: float
    max_threads: int
    switch_credentials: bool
    xattrs: bool
    #: The gate holds writes back (mode=off: it does not, and nothing is injected).
    enforce: bool = True
    window: int = 256 << 20
    batch: int = 64 << 20
    max_age: float = 30.0
    admission_timeout: float = 60.0
    writeback_pieces: bool = True
    drop_synced: bool = True
    sync_threads: int = 4
    #: Ask for FUSE_HANDLE_KILLPRIV_V2: only where writes reach the target as their caller.
    killpriv_v2: bool = False
    #: permissions=target: the target decides every call as its caller (no default_permissions,
    #: no name cached: a path walk must not pass a directory without asking it).
    target_decides: bool = False
    #: Metering's rules (meter.py), and the ceilings priced by them (0: none).
    meter: MeterProfile = PROFILES["efs"]
    metered_limit: float = 0.0
    ops_limit: float = 0.0
    throttle_reads: bool = False
    #: budget=: requests spend the fleet's share first, as fleet_hand_out hands it out.
    fleet: bool = False
    #: The bounds (seconds, ascending, at most ADMISSION_BOUNDS) of the histogram of writes'
    #: waits at the gate.
    admission_bounds: tuple[float, ...] = ()
    #: Writes leave no page in the target's page cache (target_io; placement.direct_writes).
    uncached: bool = False


@dataclass(frozen=True)
class EngineStats:
    known_files: int
    writeback_cache: bool
    written_bytes: int
    window_bytes: int = 0
    unsynced_bytes: int = 0
    reserved_bytes: int = 0
    syncing_bytes: int = 0
    #: The most ever un-synced at once.
    unsynced_high: int = 0
    dirty_files: int = 0
    oldest_age: float = 0.0
    synced_bytes: int = 0
    fsyncs: int = 0
    fsync_errors: int = 0
    fsyncs_in_flight: int = 0
    waiting_writes: int = 0
    throttled_writes: int = 0
    paced_writes: int = 0
    admission_timeouts: int = 0
    admission_wait_seconds: float = 0.0
    events_dropped: int = 0
    #: The INIT reply asked for FUSE_HANDLE_KILLPRIV_V2.
    killpriv_v2: bool = False
    #: Extended attributes are served.
    xattrs: bool = True
    #: Requests served so far, by FUSE operation (those served at least once).
    operations: dict[str, int] = field(default_factory=dict)
    #: What the requests sent to the target cost, by meter class (``class`` label values).
    meter: dict[str, ClassTotals] = field(default_factory=dict)
    ceiling_delayed: int = 0
    ceiling_delay_seconds: float = 0.0
    #: Writes that waited at the gate, by the bound of their wait (the last: above them all).
    admission_waits: tuple[int, ...] = ()
    open_handles: int = 0
    #: Known files at which the kernel is asked to drop names (0: no descriptor limit).
    relief_high: int = 0
    names_dropped: int = 0
    page_cache_drops: int = 0
    #: The fleet's share (budget=): what requests spent of it, and who waits for it.
    fleet_spent_metered: float = 0.0
    fleet_spent_units: float = 0.0
    fleet_waiting: int = 0
    fleet_pacing: int = 0
    fleet_waited: int = 0
    fleet_wait_seconds: float = 0.0
    #: Reads of files open for reading only served by the kernel (FUSE passthrough): one of
    #: PASSTHROUGH's keys; and the opens it served.
    passthrough: int = 0
    passthrough_opens: int = 0


#: ft_engine_stats.passthrough: on, or why off (the daemon logs it once, and on each change).
PASSTHROUGH = {
    0: "off (built against a libfuse before 3.17)",
    1: "on",
    2: "off (the kernel lacks it)",
    3: "off (writeback_cache=no turns it on)",
    4: "off (no CAP_SYS_ADMIN)",
    5: "off (FUSETHROTTLE_PASSTHROUGH=off)",
}


@dataclass(frozen=True)
class SyncEvent:
    """An injected fsync ended (FT_EVENT_SYNC)."""

    reason: str
    error: int  # 0: durable
    node: int
    nbytes: int
    seconds: float
    at: float  # time.monotonic()'s clock


@dataclass(frozen=True)
class LostEvent:
    """The target failed to store some of a file's data (its writer was told)."""

    node: int
    error: int
    path: str  # on the target


def library_path() -> Path:
    return Path(os.environ.get(LIBRARY_ENV) or LIBRARY)


def libfuse_version() -> str:
    """The version of the libfuse3 the engine runs on (the system's), or "unknown"."""
    try:
        fuse = ctypes.CDLL("libfuse3.so.3")
        fuse.fuse_pkgversion.restype = ctypes.c_char_p
        return str(fuse.fuse_pkgversion().decode())
    except (OSError, AttributeError):
        return "unknown"


#: The structures handed across, by their FT_LAYOUT_* code: the library's layout of each is
#: checked against ctypes' at load (a field of one side only would be read as another field).
#: Of ft_engine_stats only the size: it is read, never written, and its fields are many.
_LAYOUTS: dict[int, tuple[str, type[ctypes.Structure], bool]] = {
    1: ("ft_engine_config", _Config, True),
    2: ("ft_engine_meter", _Meter, True),
    3: ("ft_engine_stats", _Stats, False),
    4: ("ft_engine_event", _Event, True),
    5: ("ft_engine_error", _Error, True),
}


def ctypes_layout(structure: type[ctypes.Structure], fields: bool = True) -> tuple[int, ...]:
    """What ft_engine_layout says of a structure, as ctypes lays out *structure*: its size,
    then each field's offset."""
    offsets = [getattr(structure, name).offset for name, *_ in structure._fields_]
    return (ctypes.sizeof(structure), *(offsets if fields else ()))


def check_layouts(
    lib: ctypes.CDLL, path: Path, layouts: dict[int, tuple[str, type[ctypes.Structure], bool]]
) -> None:
    """Refuse a library whose structures are laid out other than ctypes lays out ours (a field
    added on one side only, or of another type): one EngineUnavailable line naming it."""
    lib.ft_engine_layout.restype = ctypes.c_size_t
    lib.ft_engine_layout.argtypes = (
        ctypes.c_uint32,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.c_size_t,
    )
    for code, (name, structure, fields) in layouts.items():
        want = ctypes_layout(structure, fields)
        out = (ctypes.c_size_t * (len(want) + 1))()
        n = int(lib.ft_engine_layout(code, out, len(out)))
        have = tuple(int(v) for v in out[: min(n, len(out))])
        if n != len(want):
            raise EngineUnavailable(
                f"the engine: {path} has struct {name} of {n - 1} field(s) where this control "
                f"plane has {len(want) - 1}: rebuild it"
            )
        for i, (theirs, ours) in enumerate(zip(have, want, strict=True)):
            if theirs != ours:
                what = "its size" if i == 0 else f"field {structure._fields_[i - 1][0]}"
                raise EngineUnavailable(
                    f"the engine: {path} has {what} of struct {name} at {theirs}, this control "
                    f"plane at {ours}: rebuild it"
                )


def _how_to_build() -> str:
    """A checkout builds the engine with make; an installed package has no sources for it."""
    if (LIBRARY.parent / "Makefile").exists():
        return f"run scripts/install, or make -C {LIBRARY.parent}"
    return (
        "reinstall fusethrottle with libfuse3-dev, pkg-config, g++ and make installed: "
        "pip builds it then"
    )


def load() -> ctypes.CDLL:
    path = library_path()
    if not path.exists():
        raise EngineUnavailable(f"the engine: {path} is not built ({_how_to_build()})")
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as err:
        raise EngineUnavailable(f"the engine: cannot load {path}: {err}") from None
    lib.ft_engine_abi.restype = ctypes.c_int
    if lib.ft_engine_abi() != ABI:
        raise EngineUnavailable(
            f"the engine: {path} is of ABI {lib.ft_engine_abi()}, not {ABI}: rebuild it"
        )
    check_layouts(lib, path, _LAYOUTS)
    lib.ft_engine_mount.restype = ctypes.c_void_p
    lib.ft_engine_mount.argtypes = (ctypes.POINTER(_Config), ctypes.c_char_p, ctypes.c_size_t)
    lib.ft_engine_serve.restype = ctypes.c_int
    lib.ft_engine_serve.argtypes = (ctypes.c_void_p,)
    lib.ft_engine_stop.restype = None
    lib.ft_engine_stop.argtypes = (ctypes.c_void_p,)
    lib.ft_engine_read_stats.restype = None
    lib.ft_engine_read_stats.argtypes = (ctypes.c_void_p, ctypes.POINTER(_Stats))
    lib.ft_engine_close_the_cache.restype = None
    lib.ft_engine_close_the_cache.argtypes = (ctypes.c_void_p,)
    lib.ft_engine_sync_all.restype = ctypes.c_uint64
    lib.ft_engine_sync_all.argtypes = (ctypes.c_void_p,)
    lib.ft_engine_events_fd.restype = ctypes.c_int
    lib.ft_engine_events_fd.argtypes = (ctypes.c_void_p,)
    lib.ft_engine_read_events.restype = ctypes.c_size_t
    lib.ft_engine_read_events.argtypes = (ctypes.c_void_p, ctypes.POINTER(_Event), ctypes.c_size_t)
    lib.ft_engine_set_window.restype = None
    lib.ft_engine_set_window.argtypes = (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_double)
    lib.ft_engine_set_ceilings.restype = None
    lib.ft_engine_set_ceilings.argtypes = (ctypes.c_void_p, ctypes.c_double, ctypes.c_double)
    lib.ft_engine_set_params.restype = None
    lib.ft_engine_set_params.argtypes = (
        ctypes.c_void_p,
        ctypes.c_uint64,
        ctypes.c_double,
        ctypes.c_int,
        ctypes.c_int,
    )
    lib.ft_engine_fleet_hand_out.restype = None
    lib.ft_engine_fleet_hand_out.argtypes = (ctypes.c_void_p,) + (ctypes.c_double,) * 4
    lib.ft_engine_unsynced.restype = ctypes.c_size_t
    lib.ft_engine_unsynced.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t)
    lib.ft_engine_read_errors.restype = ctypes.c_size_t
    lib.ft_engine_read_errors.argtypes = (ctypes.c_void_p, ctypes.POINTER(_Error), ctypes.c_size_t)
    lib.ft_engine_price.restype = None
    lib.ft_engine_price.argtypes = (
        ctypes.POINTER(_Meter),
        ctypes.c_uint32,
        ctypes.c_uint64,
        ctypes.POINTER(ctypes.c_uint64),
        ctypes.POINTER(ctypes.c_uint32),
    )
    lib.ft_engine_free.restype = None
    lib.ft_engine_free.argtypes = (ctypes.c_void_p,)
    lib.ft_engine_capture_libfuse_log.restype = ctypes.c_int
    lib.ft_engine_capture_libfuse_log.argtypes = ()
    lib.ft_engine_read_libfuse_log.restype = ctypes.c_int
    lib.ft_engine_read_libfuse_log.argtypes = (ctypes.c_char_p, ctypes.c_size_t)
    lib.ft_engine_libfuse_log_dropped.restype = ctypes.c_uint64
    lib.ft_engine_libfuse_log_dropped.argtypes = ()
    return lib


#: libfuse's levels (fuse_log.h: FUSE_LOG_EMERG 0 .. FUSE_LOG_DEBUG 7) as logging's.
_LIBFUSE_LEVELS = (
    logging.CRITICAL,  # EMERG
    logging.CRITICAL,  # ALERT
    logging.CRITICAL,  # CRIT
    logging.ERROR,  # ERR
    logging.WARNING,  # WARNING
    logging.INFO,  # NOTICE
    logging.INFO,  # INFO
    logging.DEBUG,  # DEBUG
)
_LIBFUSE_LONGEST = 1024  # LibfuseLog::kLongest


class LibfuseLog:
    """libfuse's own messages, which it would print on stderr as plain lines, queued by the
    engine (process-wide, from the moment this is made) for the daemon's logger."""

    def __init__(self) -> None:
        self._lib = load()
        fd = int(self._lib.ft_engine_capture_libfuse_log())
        if fd < 0:
            raise OSError(-fd, f"libfuse's log: {os.strerror(-fd)}")
        #: Readable while messages are queued (read its 8-byte counter to reset it).
        self.fd = fd
        self._dropped = 0

    def take(self) -> list[tuple[int, str]]:
        """Every message queued so far, oldest first: (logging's level, the text); a gap the
        queue's bound made is one message of its own."""
        out: list[tuple[int, str]] = []
        dropped = int(self._lib.ft_engine_libfuse_log_dropped())
        if dropped > self._dropped:
            out.append((logging.WARNING, f"{dropped - self._dropped} libfuse message(s) lost"))
            self._dropped = dropped
        buffer = ctypes.create_string_buffer(_LIBFUSE_LONGEST)
        while (level := int(self._lib.ft_engine_read_libfuse_log(buffer, len(buffer)))) >= 0:
            text = buffer.value.decode(errors="replace")
            out.append((_LIBFUSE_LEVELS[min(level, len(_LIBFUSE_LEVELS) - 1)], text))
        return out


class NativeEngine:
    """One mounted engine. ``serve`` blocks (run it in a thread); ``stop`` may come from any
    thread; ``free`` only after ``serve`` returned."""

    def __init__(self, lib: ctypes.CDLL, handle: int) -> None:
        self._lib = lib
        self._handle: int | None = handle

    @classmethod
    def mount(cls, config: EngineConfig) -> NativeEngine:
        """Mount; an OSError says why not."""
        lib = load()
        raw = _Config(
            os.fsencode(config.source),
            os.fsencode(config.mountpoint),
            os.fsencode(",".join(config.fuse_options)),
            int(config.writeback_cache),
            0.0 if config.target_decides else config.attr_timeout,
            config.attr_timeout,
            config.max_threads,
            int(config.switch_credentials),
            int(config.xattrs),
            int(config.enforce),
            int(config.enforce),
            config.window,
            config.batch,
            config.max_age,
            config.admission_timeout,
            int(config.writeback_pieces),
            int(config.drop_synced),
            config.sync_threads,
            int(config.killpriv_v2),
            int(config.target_decides),
            _meter(
                config.meter,
                config.metered_limit,
                config.ops_limit,
                config.throttle_reads,
                config.fleet,
            ),
            (ctypes.c_double * ADMISSION_BOUNDS)(*config.admission_bounds[:ADMISSION_BOUNDS]),
            int(config.uncached),
        )
        error = ctypes.create_string_buffer(_ERROR_SIZE)
        handle = lib.ft_engine_mount(ctypes.byref(raw), error, _ERROR_SIZE)
        if not handle:
            raise OSError(error.value.decode(errors="replace") or "the engine did not mount")
        return cls(lib, handle)

    def serve(self) -> int:
        assert self._handle is not None
        return int(self._lib.ft_engine_serve(self._handle))

    def stop(self) -> None:
        if self._handle is not None:
            self._lib.ft_engine_stop(self._handle)

    def stats(self) -> EngineStats:
        assert self._handle is not None
        raw = _Stats()
        self._lib.ft_engine_read_stats(self._handle, ctypes.byref(raw))
        values = {name: getattr(raw, name) for name, _ in _Stats._fields_}
        values["writeback_cache"] = bool(values["writeback_cache"])
        values["killpriv_v2"] = bool(values["killpriv_v2"])
        values["xattrs"] = bool(values["xattrs"])
        counts = values.pop("operations")
        values["operations"] = {op: int(n) for op, n in zip(OPERATIONS, counts, strict=True) if n}
        values["meter"] = {
            cls.value: ClassTotals(t.ops, t.bytes, t.metered_bytes, t.units)
            for cls, t in zip(METER_CLASSES, raw.meter, strict=True)
        }
        values["admission_waits"] = tuple(int(n) for n in raw.admission_waits)
        return EngineStats(**values)

    def errors(self) -> list[tuple[str, int, int]]:
        """The error answers so far: (operation, errno, count), errno 0 for any above 133."""
        assert self._handle is not None
        size = len(OPERATIONS) * 134
        buffer = (_Error * size)()
        n = int(self._lib.ft_engine_read_errors(self._handle, buffer, size))
        return [(OPERATIONS[e.op], int(e.error), int(e.count)) for e in buffer[:n]]

    def events_fd(self) -> int:
        """Readable while events are queued (read its 8-byte counter to reset it)."""
        assert self._handle is not None
        return int(self._lib.ft_engine_events_fd(self._handle))

    def read_events(self) -> list[SyncEvent | LostEvent]:
        """Every event queued so far, oldest first."""
        assert self._handle is not None
        out: list[SyncEvent | LostEvent] = []
        buffer = (_Event * _EVENTS_AT_ONCE)()
        while True:
            n = int(self._lib.ft_engine_read_events(self._handle, buffer, _EVENTS_AT_ONCE))
            for raw in buffer[:n]:
                if raw.kind == EVENT_SYNC:
                    reason = SYNC_REASONS.get(raw.reason, str(raw.reason))
                    out.append(
                        SyncEvent(reason, raw.error, raw.node, raw.bytes, raw.seconds, raw.at)
                    )
                elif raw.kind == EVENT_LOST:
                    out.append(LostEvent(raw.node, raw.error, os.fsdecode(raw.path)))
            if n < _EVENTS_AT_ONCE:
                return out

    def set_window(self, window: int, commit_rate: float | None) -> None:
        """The controller's decision: what the gate admits, and the pace above half of it."""
        assert self._handle is not None
        self._lib.ft_engine_set_window(self._handle, window, commit_rate or 0.0)

    def set_ceilings(self, metered_limit: float, ops_limit: float) -> None:
        """The ceilings from now on (0: none): ``fusethrottle set``, a schedule, the guard."""
        assert self._handle is not None
        self._lib.ft_engine_set_ceilings(self._handle, metered_limit, ops_limit)

    def set_params(self, batch: int, max_age: float, enforce: bool, inject: bool) -> None:
        """``fusethrottle set``: the batch, max_age and mode from now on."""
        assert self._handle is not None
        self._lib.ft_engine_set_params(self._handle, batch, max_age, int(enforce), int(inject))

    def fleet_spending(self) -> Spending:
        """What requests spent of the fleet's share, and who waits for it."""
        s = self.stats()
        return Spending(
            s.fleet_spent_metered,
            s.fleet_spent_units,
            s.fleet_waiting,
            s.fleet_pacing,
            s.fleet_waited,
            s.fleet_wait_seconds,
        )

    def fleet_hand_out(self, allowance: tuple[float, float], pace: tuple[float, float]) -> None:
        """The fleet's lease: spend up to these totals of (metered bytes, op units) (inf: no
        lease needed), at this pace per second (0: unpaced)."""
        assert self._handle is not None
        self._lib.ft_engine_fleet_hand_out(self._handle, *allowance, *pace)

    def close_the_cache(self) -> None:
        """Refuse everything new but the kernel's write-back and closes (ENOTCONN)."""
        assert self._handle is not None
        self._lib.ft_engine_close_the_cache(self._handle)

    def sync_all(self) -> int:
        """After serve: finish the syncs under way, fsync every file still un-synced (three
        tries); how many files are still un-synced."""
        assert self._handle is not None
        return int(self._lib.ft_engine_sync_all(self._handle))

    def unsynced(self) -> list[tuple[str, int]]:
        """The files that still owe the target data: (path on the target, the errno of their
        failed sync or 0 if the target did not answer). Touches nothing of the target.

        Records end at a NUL, the one byte no path holds: a name with a newline, a carriage
        return or any other byte is read whole (as os.fsdecode names it), never split."""
        assert self._handle is not None
        size = 1 << 20
        buffer = ctypes.create_string_buffer(size)
        used = int(self._lib.ft_engine_unsynced(self._handle, buffer, size))
        return parse_unsynced(buffer.raw[:used])

    def free(self) -> None:
        if self._handle is not None:
            self._lib.ft_engine_free(self._handle)
            self._handle = None


def parse_unsynced(records: bytes) -> list[tuple[str, int]]:
    """ft_engine_unsynced's records "ERRNO PATH\\0" as (path, errno); one not of that form is
    skipped (the engine never writes one), never an exception on the stop's path."""
    out = []
    for record in records.split(b"\0"):
        error, space, path = record.partition(b" ")
        if space and error.isdigit():
            out.append((os.fsdecode(path), int(error)))
    return out


def engine_price(profile: MeterProfile, cls: OpClass, nbytes: int) -> Charge:
    """What the engine charges a request of *nbytes* in *cls* under *profile* (its parity with
    meter.py is tested)."""
    lib = load()
    raw = _meter(profile, 0.0, 0.0, False)
    metered, units = ctypes.c_uint64(), ctypes.c_uint32()
    lib.ft_engine_price(
        ctypes.byref(raw), METER_CLASSES[cls], nbytes, ctypes.byref(metered), ctypes.byref(units)
    )
    return Charge(int(metered.value), int(units.value))
