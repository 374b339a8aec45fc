"""Parse and validate ``-o`` mount options into one frozen :class:`Config`.

Pure: no I/O. Every user mistake becomes an :class:`OptionError` whose message is the single line
the command prints, so bad input never produces a traceback or a half-made mount.
"""

from __future__ import annotations

import dataclasses
import re
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..metering.meter import PROFILES, profile
from ..metering.schedule import ScheduleError, Window, parse_window, schedule_file_items

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


class OptionError(ValueError):
    """A mount option the user got wrong; ``str(err)`` is the one-line explanation."""


#: The largest size or rate an option takes (1024T): far above any window or target, well
#: inside the engine's 64-bit counters and their products.
MAX_SIZE = 1 << 50
#: The longest duration (30 days): far above any wait, and its nanoseconds far inside the
#: engine's clock (a longer one, max_age=9999999h, overflowed it).
MAX_DURATION = 30 * 24 * 3600.0
#: The most of a count: request threads, and the op units of one request.
MAX_COUNT = 4096
MAX_UNITS = 1_000_000


def _cut(text: str) -> str:
    """*text* quoted for an error line, cut short if long (a number of 400 digits)."""
    return repr(text) if len(text) <= 40 else repr(text[:37] + "...")


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtKMGT]?)(?:i?[bB])?\s*$")
_SIZE_UNITS = {"": 1, "k": KiB, "m": MiB, "g": GiB, "t": 1024 * GiB}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|)\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "": 1.0, "m": 60.0, "h": 3600.0}


def parse_size(text: str) -> int:
    """``64M`` -> 67108864. Binary units (K, M, G, T; an optional ``iB``/``B`` suffix)."""
    m = _SIZE_RE.match(text)
    if not m:
        raise OptionError(f"not a size: {text!r} (examples: 4096, 64M, 1G)")
    value = float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
    if not value <= MAX_SIZE:  # inf too: a number of 400 digits
        raise OptionError(f"too large: {_cut(text)} (at most 1024T)")
    return int(value)


def parse_duration(text: str) -> float:
    """``500ms`` -> 0.5, ``30s`` -> 30.0, ``2m`` -> 120.0; a bare number means seconds."""
    m = _DURATION_RE.match(text)
    if not m:
        raise OptionError(f"not a duration: {text!r} (examples: 500ms, 30s, 2m)")
    value = float(m.group(1)) * _DURATION_UNITS[m.group(2)]
    if not value <= MAX_DURATION:
        raise OptionError(f"too long: {_cut(text)} (at most 30 days, 720h)")
    return value


def parse_rate(text: str) -> float:
    """A per-second rate with an optional binary suffix: ``100M`` or ``7000``."""
    return float(parse_size(text))


@dataclass(frozen=True)
class FleetAddress:
    """Where a fleet budget lives: ``redis://HOST:PORT/NAME`` (``rediss://`` for TLS)."""

    host: str
    port: int
    name: str
    tls: bool = False
    username: str | None = None

    def __str__(self) -> str:
        user = f"{self.username}@" if self.username else ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'rediss' if self.tls else 'redis'}://{user}{host}:{self.port}/{self.name}"


_FLEET_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def parse_fleet_url(text: str) -> FleetAddress:
    """``redis://HOST:PORT/NAME`` -> FleetAddress; a password in the URL is refused (it would
    show in ps, the journal and /proc/mounts): it comes from a file."""
    form = "expected redis://HOST:PORT/NAME or rediss://HOST:PORT/NAME"
    try:
        url = urllib.parse.urlsplit(text.strip())
        port = url.port
    except ValueError as err:
        raise OptionError(f"{form}, got {text!r} ({err})") from None
    if url.scheme not in ("redis", "rediss"):
        raise OptionError(f"{form}, got {text!r}")
    if url.password is not None:
        raise OptionError(
            "no password in the budget URL (it would show in ps and the logs): "
            "use budget_password_file=FILE"
        )
    if not url.hostname:
        raise OptionError(f"{form}: the host is missing in {text!r}")
    name = url.path[1:] if url.path.startswith("/") else ""
    if not _FLEET_NAME_RE.match(name):
        raise OptionError(
            f"{form}: NAME (letters, digits, '.', '_', '-', at most 64) is missing or "
            f"invalid in {text!r}"
        )
    if url.query or url.fragment:
        raise OptionError(f"{form}: no '?' or '#' parts, got {text!r}")
    return FleetAddress(
        url.hostname, port or 6379, name, url.scheme == "rediss", url.username or None
    )


def _fleet_fallback(text: str) -> float:
    """``share`` (0: the last known share) or a metered rate such as ``20M``."""
    if text == "share":
        return 0.0
    try:
        rate = parse_rate(text)
    except OptionError:
        raise OptionError(f"expected 'share' or a rate such as 20M, got {text!r}") from None
    if rate <= 0:
        raise OptionError("a fixed fallback rate must be positive")
    return rate


def _positive_float(text: str) -> float:
    value = _float(text)
    if not value > 0:
        raise OptionError(f"must be a positive number: {text!r}")
    return value


MODES = ("off", "static", "adaptive")
METER_PROFILES = tuple(PROFILES)
LOG_LEVELS = ("debug", "info", "warning", "error")
#: log_format=json: one JSON object a line on stderr, for log collectors (logformat.py).
LOG_FORMATS = ("text", "json")
XATTR_MODES = ("auto", "on", "off")
MEMORY_CGROUP_MODES = ("auto", "off")
TARGET_IO_MODES = ("auto", "buffered", "direct")
#: Whom calls to the target run as (credentials.py): the process that asked, or the daemon.
CREDENTIAL_MODES = ("caller", "daemon")
#: Who decides whether a caller may: the kernel, from the attributes (default_permissions), or
#: the target itself, asked as the caller (an export that maps ids: all_squash, anonuid).
PERMISSION_MODES = ("kernel", "target")
#: Room in the daemon's own memory cgroup beyond the largest window: the daemon itself, the
#: target's metadata, and read cache for a restore.
MEMORY_CGROUP_HEADROOM = 512 * MiB


@dataclass(frozen=True)
class Config:
    """Everything the daemon needs to know, validated."""

    source: str = ""
    mountpoint: str = ""
    foreground: bool = False
    # FUSE / kernel
    allow_other: bool = False
    read_only: bool = False
    attr_timeout: float = 1.0
    writeback_cache: bool = True
    #: Not set by the user (writeback_cache=auto): turned off where the daemon shares its
    #: memory cgroup with the application (see service.daemon.serve).
    writeback_cache_auto: bool = True
    kernel_cache: int = 32 * MiB
    read_ahead: int = 4 * MiB
    xattrs: str = "auto"
    threads: int = 32
    fsname: str = ""
    credentials: str = "caller"
    permissions: str = "kernel"
    # memory (see memory_cgroup.py and the engine's flusher.cc)
    memory_cgroup: str = "auto"
    memory_cgroup_limit: int = 0  # 0: window_max + MEMORY_CGROUP_HEADROOM
    writeback_pieces: bool = True
    drop_synced: bool = True
    target_io: str = "auto"
    kernel_options: tuple[str, ...] = ()
    # admission
    mode: str = "adaptive"
    batch: int = 64 * MiB
    window: int = 256 * MiB
    max_age: float = 30.0
    admission_timeout: float = 60.0
    unmount_timeout: float = 600.0
    # controller (mode=adaptive)
    window_min: int = 16 * MiB
    window_max: int = 2 * GiB
    tolerance: float = 1.5
    drain: float = 2.5
    # metering and ceilings
    meter: str = "efs"
    # (MeterProfile field, value) pairs from meter_<field>= options, applied to the profile.
    meter_overrides: tuple[tuple[str, float], ...] = ()
    metered_limit: float = 0.0
    ops_limit: float = 0.0
    #: Time-of-day windows overriding them (``metered_limit=100M,01:00-06:00=20M``).
    metered_schedule: tuple[Window, ...] = ()
    ops_schedule: tuple[Window, ...] = ()
    throttle_reads: bool = False
    # the fleet budget (fleet.py): a token bucket in Redis shared with other mounts
    budget: FleetAddress | None = None
    budget_weight: float = 1.0
    budget_fallback: float = 0.0  # metered bytes/s while Redis is away; 0: the last share
    budget_password_file: str = ""  # else $FUSETHROTTLE_BUDGET_PASSWORD_FILE, else none
    budget_ca: str = ""  # CA file for rediss:// (default: the system's)
    budget_timeout: float = 0.5
    # the pressure guard (guard/): the backup yields to the protected workload's stall
    guard: str = ""  # "host", a cgroup v2 directory, or "" (off)
    guard_some: float | None = None  # the stall share that holds the backup back; None: learned
    guard_min: float = 4 * MiB  # bytes/s the guard never holds the backup below
    # observability
    metrics: str = ""
    log_level: str = "info"
    log_format: str = "text"


# Generic mount(8) options that libfuse understands and that we forward unchanged.
_KERNEL_FLAGS = frozenset(
    [
        "rw",
        "nosuid",
        "suid",
        "nodev",
        "dev",
        "noexec",
        "exec",
        "noatime",
        "atime",
        "relatime",
        "norelatime",
        "strictatime",
        "sync",
        "async",
        "dirsync",
    ]
)
# Options meant for mount(8), fstab or systemd, never for the daemon.
_IGNORED_FLAGS = frozenset(
    ["defaults", "auto", "noauto", "user", "nouser", "users", "owner", "group", "_netdev", "nofail"]
)
_IGNORED_PREFIXES = ("x-", "comment=", "_netdev", "nofail")


def _whole(text: str, most: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f"not a whole number: {text!r}") from None
    if value > most:
        raise OptionError(f"too large: {_cut(text)} (at most {most})")
    return value


def _positive_int(text: str) -> int:
    value = _whole(text, MAX_COUNT)
    if value <= 0:
        raise OptionError(f"must be positive: {text!r}")
    return value


def _positive_or_zero(text: str) -> int:
    value = _whole(text, MAX_UNITS)
    if value < 0:
        raise OptionError(f"must not be negative: {text!r}")
    return value


#: A plain number's magnitude at most: a factor, a weight, a tolerance.
_MAX_NUMBER = 1e6


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise OptionError(f"not a number: {text!r}") from None
    if not abs(value) <= _MAX_NUMBER:  # nan and inf too: every comparison after would pass
        raise OptionError(f"not a number between -1e6 and 1e6: {_cut(text)}")
    return value


def _choice(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise OptionError(f"{text!r} is not one of {', '.join(choices)}")
        return text

    return parse


def _share(text: str) -> float:
    """A share of time: ``5%`` or ``0.05``."""
    percent = text.endswith("%")
    value = _float(text[:-1] if percent else text)
    if percent:
        value /= 100
    if not 0 < value <= 1:
        raise OptionError(f"must be a share of time above 0 and at most 100%: {text!r}")
    return value


def _guard(text: str) -> str:
    """``host``, ``off``, or a cgroup v2 directory (absolute, or under /sys/fs/cgroup)."""
    if text == "off":
        return ""
    if text != "host" and ("\0" in text or ".." in text.split("/")):
        raise OptionError(f"expected host, off or a cgroup directory, got {text!r}")
    return text


def _address(text: str) -> str:
    host, _, port = text.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise OptionError(f"not HOST:PORT or PORT: {text!r}")
    return f"{host or '127.0.0.1'}:{int(port)}"


_VALUED: dict[str, Callable[[str], object]] = {
    "attr_timeout": parse_duration,
    "kernel_cache": parse_size,
    "read_ahead": parse_size,
    "xattrs": _choice(XATTR_MODES),
    "threads": _positive_int,
    "fsname": str,
    "credentials": _choice(CREDENTIAL_MODES),
    "permissions": _choice(PERMISSION_MODES),
    "memory_cgroup": _choice(MEMORY_CGROUP_MODES),
    "memory_cgroup_limit": parse_size,
    "target_io": _choice(TARGET_IO_MODES),
    "mode": _choice(MODES),
    "batch": parse_size,
    "window": parse_size,
    "max_age": parse_duration,
    "admission_timeout": parse_duration,
    "unmount_timeout": parse_duration,
    "window_min": parse_size,
    "window_max": parse_size,
    "tolerance": _float,
    "drain": parse_duration,
    "meter": _choice(METER_PROFILES),
    "metered_limit": parse_rate,
    "ops_limit": parse_rate,
    "metrics": _address,
    "log_level": _choice(LOG_LEVELS),
    "log_format": _choice(LOG_FORMATS),
    "guard": _guard,
    "guard_some": _share,
    "guard_min": parse_rate,
    "budget": parse_fleet_url,
    "budget_weight": _positive_float,
    "budget_fallback": _fleet_fallback,
    "budget_password_file": str,
    "budget_ca": str,
    "budget_timeout": parse_duration,
}
_BOOLEAN = {"allow_other", "writeback_cache", "throttle_reads", "writeback_pieces", "drop_synced"}


# meter_<field>= options override one number of the metering profile (see meter.py).
_METER_FIELDS: dict[str, Callable[[str], float]] = {
    "data_min": parse_size,
    "meta_min": parse_size,
    "granule": parse_size,
    "read_factor": _float,
    "read_units": _positive_or_zero,
    "write_units": _positive_or_zero,
}


#: The ceilings that take a time-of-day schedule, and the field the schedule goes to.
SCHEDULED = {"metered_limit": "metered_schedule", "ops_limit": "ops_schedule"}
_WINDOW_ITEM = re.compile(r"^\d{1,2}:\d{2}-")


def split_options(groups: Iterable[str]) -> list[str]:
    """Flatten several ``-o a,b=c`` arguments into ``["a", "b=c"]``; a schedule's windows
    stay with their ceiling (``metered_limit=100M,01:00-06:00=20M`` is one item)."""
    out: list[str] = []
    for item in (i.strip() for group in groups for i in group.split(",")):
        if not item:
            continue
        if _WINDOW_ITEM.match(item) and out and out[-1].partition("=")[0] in SCHEDULED:
            out[-1] += "," + item
        else:
            out.append(item)
    return out


def parse_scheduled(raw: str) -> tuple[float, tuple[Window, ...]]:
    """``100M,01:00-06:00=20M`` -> (base rate, windows); an absolute path names a schedule
    file with the same entries one per line, read now (at mount, ``set`` and each reload)."""
    if raw.startswith("/"):
        return _parse_schedule_file(raw)
    base, *windows = raw.split(",")
    try:
        return parse_rate(base), tuple(parse_window(w, parse_rate) for w in windows)
    except ScheduleError as err:
        raise OptionError(str(err)) from None


def read_settings_file(path: str, what: str) -> str:
    """The text of a file the settings name (*what*: how the one line calls it)."""
    try:
        with open(path) as f:
            return f.read()
    except OSError as err:
        raise OptionError(f"cannot read {what} {path}: {err.strerror}") from None


def _parse_schedule_file(path: str) -> tuple[float, tuple[Window, ...]]:
    text = read_settings_file(path, "schedule file")
    try:
        base, *windows = schedule_file_items(text)
        return parse_rate(base), tuple(parse_window(w, parse_rate) for w in windows)
    except (ScheduleError, OptionError) as err:
        raise OptionError(f"schedule file {path}: {err}") from None


def _check_engine(raw: str) -> None:
    """engine=native, from mounts set up while two data planes existed, still mounts (there
    is one now); engine=python names the removed one: say so rather than mount something else."""
    if raw == "python":
        raise OptionError(
            "option engine=python: the Python data plane was removed; the native engine serves "
            "every mount (drop the option)"
        )
    if raw != "native":
        raise OptionError(f"option engine: {raw!r} is not native (the only data plane)")


def parse_options(items: Iterable[str], **base: object) -> Config:
    """Build a :class:`Config` from ``key`` / ``key=value`` items, rejecting unknown ones."""
    values: dict[str, object] = dict(base)
    kernel: list[str] = []
    for item in items:
        key, eq, raw = item.partition("=")
        if key in _IGNORED_FLAGS or item.startswith(_IGNORED_PREFIXES):
            continue
        if key in _KERNEL_FLAGS and not eq:
            kernel.append(key)
            continue
        if key == "ro" and not eq:
            values["read_only"] = True
            continue
        if key == "default_permissions" and not eq:
            continue  # always on
        if key == "engine":
            _check_engine(raw)
            continue
        if key == "writeback_cache" and raw == "auto":
            values.pop(key, None)  # the default: decided with the daemon's placement
            values["writeback_cache_auto"] = True
            continue
        if key in _BOOLEAN:
            if key == "writeback_cache":
                values["writeback_cache_auto"] = False
            if eq and raw not in ("1", "0", "yes", "no", "true", "false"):
                raise OptionError(f"option {key}: expected no value or yes/no, got {raw!r}")
            values[key] = not eq or raw in ("1", "yes", "true")
            continue
        if key.startswith("meter_") and key[len("meter_") :] in _METER_FIELDS:
            if not eq or raw == "":
                raise OptionError(f"option {key} needs a value ({key}=...)")
            try:
                value = _METER_FIELDS[key[len("meter_") :]](raw)
            except OptionError as err:
                raise OptionError(f"option {key}: {err}") from None
            known = values.get("meter_overrides", ())
            assert isinstance(known, tuple)
            overrides: dict[str, object] = dict(known)
            overrides[key[len("meter_") :]] = value
            values["meter_overrides"] = tuple(sorted(overrides.items()))
            continue
        parser = _VALUED.get(key)
        if parser is None:
            raise OptionError(f"unknown option: {key!r}")
        if not eq or raw == "":
            raise OptionError(f"option {key} needs a value ({key}=...)")
        _parse_valued(key, raw, values)
    values["kernel_options"] = tuple(kernel)
    _bounds_follow_the_window(values)
    config = Config(**values)  # type: ignore[arg-type]
    validate(config)
    return config


def _parse_valued(key: str, raw: str, values: dict[str, object]) -> None:
    """One ``key=value`` into *values* (a ceiling's schedule into its own field)."""
    try:
        if key in SCHEDULED:
            values[key], values[SCHEDULED[key]] = parse_scheduled(raw)
        else:
            values[key] = _VALUED[key](raw)
    except OptionError as err:
        raise OptionError(f"option {key}: {err}") from None


def _bounds_follow_the_window(values: dict[str, object]) -> None:
    """In adaptive mode ``window`` is the starting window. One chosen outside the default
    bounds (``window=8M`` for a small host) moves the bound the user did not set, rather than
    refusing a setting that meant the same thing under ``mode=static``."""
    window = values.get("window")
    if values.get("mode", Config.mode) != "adaptive" or not isinstance(window, int):
        return
    if "window_min" not in values and window < Config.window_min:
        values["window_min"] = window
    if "window_max" not in values and window > Config.window_max:
        values["window_max"] = window


def memory_cgroup_limit(config: Config) -> int:
    """The limit of the daemon's own memory cgroup: as set, else the largest window plus room
    for the daemon itself, so the window binds before the cgroup does."""
    return config.memory_cgroup_limit or config.window_max + MEMORY_CGROUP_HEADROOM


def validate(config: Config) -> None:
    """Cross-field rules; raises :class:`OptionError` with the first problem found."""
    if 0 < config.memory_cgroup_limit < 64 * MiB:
        raise OptionError("memory_cgroup_limit must be at least 64M (the daemon lives there)")
    if config.batch <= 0:
        raise OptionError("batch must be positive")
    if config.window < config.batch:
        raise OptionError(
            f"window ({config.window} bytes) must be at least batch ({config.batch} bytes)"
        )
    if config.window_min <= 0 or config.window_min > config.window_max:
        raise OptionError("window_min must be positive and not above window_max")
    if config.mode == "adaptive" and not (config.window_min <= config.window <= config.window_max):
        raise OptionError("window must lie between window_min and window_max in mode=adaptive")
    if config.tolerance < 1.0:
        raise OptionError("tolerance must be at least 1.0")
    if config.drain <= 0:
        raise OptionError("drain must be positive")
    if config.max_age <= 0:
        raise OptionError("max_age must be positive")
    if config.attr_timeout < 0:
        raise OptionError("attr_timeout must not be negative")
    if config.permissions == "target" and config.credentials != "caller":
        raise OptionError("permissions=target needs credentials=caller")
    if config.metered_limit < 0 or config.ops_limit < 0:
        raise OptionError("metered_limit and ops_limit must not be negative")
    if any(w.value < 0 for w in (*config.metered_schedule, *config.ops_schedule)):
        raise OptionError("a scheduled metered_limit or ops_limit must not be negative")
    if config.guard_min <= 0:
        raise OptionError("guard_min must be positive (the backup must always finish)")
    if not config.guard and (config.guard_some is not None or config.guard_min != Config.guard_min):
        raise OptionError("guard_some and guard_min need guard=host or guard=CGROUP")
    if config.admission_timeout <= 0:
        raise OptionError("admission_timeout must be positive")
    if config.budget is None:
        given = [
            f"budget_{f}"
            for f in ("weight", "fallback", "password_file", "ca", "timeout")
            if getattr(config, f"budget_{f}") != getattr(Config, f"budget_{f}")
        ]
        if given:
            raise OptionError(f"{given[0]} needs budget=redis://HOST:PORT/NAME")
    if not 0.01 <= config.budget_timeout <= 10:
        raise OptionError("budget_timeout must be between 10ms and 10s")
    if config.budget_ca and (config.budget is None or not config.budget.tls):
        raise OptionError("budget_ca is for a rediss:// (TLS) budget")
    try:
        profile(config.meter, **dict(config.meter_overrides))
    except ValueError as err:
        raise OptionError(f"meter: {err}") from None


def replace(config: Config, **changes: object) -> Config:
    """A validated copy of *config* with *changes* applied."""
    new = dataclasses.replace(config, **changes)  # type: ignore[arg-type]
    validate(new)
    return new


#: What ``fusethrottle set`` may change while the mount serves (and SIGHUP rereads); a
#: ceiling's schedule changes with it.
LIVE = (
    "mode",
    "window",
    "batch",
    "max_age",
    "metered_limit",
    "ops_limit",
    "guard_some",
    "guard_min",
    "log_level",
)


def parse_live(items: Iterable[str], config: Config) -> Config:
    """*config* with ``key=value`` *items* applied, each one that may change while mounted;
    validated as at mount time. Anything else is refused with the reason, in one line."""
    changes: dict[str, object] = {}
    for item in items:
        key, eq, raw = item.partition("=")
        if key not in LIVE:
            if key in _VALUED or key in _BOOLEAN or key == "guard":
                raise OptionError(f"{key} cannot change while mounted: remount to change it")
            raise OptionError(f"unknown option: {key!r}")
        if not eq or raw == "":
            raise OptionError(f"option {key} needs a value ({key}=...)")
        _parse_valued(key, raw, changes)
    if not changes:
        raise OptionError(f"nothing to change: give key=value (one of {', '.join(LIVE)})")
    values = {"mode": config.mode, **changes}
    _bounds_follow_the_window(values)  # a window set past the default bounds moves them
    return replace(config, **values)
