"""Settings changed while the mount serves: ``fusethrottle set`` and a reload (SIGHUP).

Pure: the daemon hands in its settings and the request (or the instance's file, as
``systemctl reload`` leaves it), and gets back the new settings and what changed, or one line
saying why nothing was applied. A reload applies all or nothing, as nginx does: an invalid
file, or one that changes what cannot change while mounted, keeps every running setting.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .options import (
    LIVE,
    SCHEDULED,
    Config,
    OptionError,
    parse_live,
    parse_options,
    read_settings_file,
    replace,
    split_options,
)

#: The settings file a reload (SIGHUP) rereads: the one ``--conf`` started the mount from
#: (fusethrottle@.service names the instance's).
CONF_ENV = "FUSETHROTTLE_CONF"

#: Every field a live key sets (a ceiling's schedule with it).
_LIVE_FIELDS = (*LIVE, *SCHEDULED.values())

#: Settings the daemon decides itself at the start (placement.py): a file does not "change" them.
_DERIVED = ("writeback_cache", "writeback_cache_auto", "foreground", "source", "mountpoint")


@dataclass(frozen=True)
class Change:
    """One setting that changed: its name and its values before and after, as shown."""

    key: str
    before: str
    after: str

    def __str__(self) -> str:
        return f"{self.key} {self.before} -> {self.after}"


def changes(before: Config, after: Config) -> list[Change]:
    """The live settings that differ between *before* and *after*, in LIVE's order."""
    return [
        Change(key, _shown(before, key), _shown(after, key))
        for key in LIVE
        if _shown(before, key) != _shown(after, key)
    ]


def _shown(config: Config, key: str) -> str:
    value = getattr(config, key)
    if value is None:
        return "learned"
    text = str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
    if key in SCHEDULED:
        for window in getattr(config, SCHEDULED[key]):
            value = window.value
            shown = str(int(value)) if float(value).is_integer() else str(value)
            text += f",{window}={shown}"
    return text


def apply_set(config: Config, items: list[str]) -> tuple[Config, list[Change]]:
    """``fusethrottle set`` with *items* (``key=value``): the new settings and the changes.
    OptionError: one line, nothing applied."""
    new = parse_live(items, config)
    return new, changes(config, new)


def read_conf(text: str) -> dict[str, str]:
    """An EnvironmentFile's ``KEY=value`` lines (as systemd reads them: comments, blank lines,
    optional quotes around the value)."""
    values: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, eq, value = line.partition("=")
        if not eq or not key.strip().isidentifier():
            raise OptionError(f"line {number}: expected KEY=value, got {line!r}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key.strip()] = value
    return values


def instance_settings(path: str) -> tuple[str, str]:
    """SOURCE and OPTIONS of the instance file at *path* (``fusethrottle --conf``).

    The daemon reads the file itself rather than systemd's EnvironmentFile=, which takes its
    path as a glob: the instance of a mount point with a dash (``mnt-ft\\x2dreload``) names a
    file whose backslash the glob drops, so the service could not start. OptionError: one line.
    """
    text = read_settings_file(path, "settings file")
    try:
        conf = read_conf(text)
    except OptionError as err:
        raise OptionError(f"{path}: {err}") from None
    source = conf.get("SOURCE", "").strip()
    if not source:
        raise OptionError(f"{path}: no SOURCE= line (the directory to pass through)")
    return source, conf.get("OPTIONS", "defaults")


def apply_reload(config: Config, text: str) -> tuple[Config, list[Change]]:
    """The instance file *text* reread: the running *config* with its live settings as the file
    says. OptionError: one line, and the running settings stay as they are, every one."""
    conf = read_conf(text)
    source = conf.get("SOURCE", config.source)
    if source != config.source:
        raise OptionError(f"SOURCE cannot change while mounted ({config.source} -> {source})")
    base = {"source": config.source, "mountpoint": config.mountpoint}
    wanted = parse_options(split_options([conf.get("OPTIONS", "defaults")]), **base)
    fixed = [
        f.name
        for f in dataclasses.fields(Config)
        if f.name not in _LIVE_FIELDS  # a ceiling's schedule changes with it
        and f.name not in _DERIVED
        and getattr(wanted, f.name) != getattr(config, f.name)
    ]
    if fixed:
        raise OptionError(f"{fixed[0]} cannot change while mounted: restart the service for it")
    new = replace(config, **{key: getattr(wanted, key) for key in _LIVE_FIELDS})
    return new, changes(config, new)
