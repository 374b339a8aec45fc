"""Settings changed while mounted (``fusethrottle set``, a reload), without a mount: what is
applied, and that a refused request or file applies nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from fusethrottle.service.live_settings import (
    apply_reload,
    apply_set,
    instance_settings,
    read_conf,
)
from fusethrottle.service.options import OptionError, parse_options

MiB = 1 << 20
RUNNING = parse_options(
    ["mode=static", "batch=16M", "window=64M", "metered_limit=50M", "allow_other"],
    source="/srv/nfs",
    mountpoint="/backups",
)


def test_set_applies_live_settings_and_says_what_changed() -> None:
    new, changed = apply_set(RUNNING, ["window=128M", "metered_limit=20M", "log_level=debug"])
    assert (new.window, new.metered_limit, new.log_level) == (128 * MiB, 20 * MiB, "debug")
    assert [c.key for c in changed] == ["window", "metered_limit", "log_level"]
    assert str(changed[0]) == f"window {64 * MiB} -> {128 * MiB}"
    assert new.allow_other and new.batch == RUNNING.batch  # the rest stays


@pytest.mark.parametrize(
    ("items", "says"),
    [
        (["allow_other=no"], "allow_other cannot change while mounted"),
        (["threads=64"], "threads cannot change while mounted"),
        (["window=8M"], "window (8388608 bytes) must be at least batch"),
        (["max_age=soon"], "option max_age: not a duration"),
        (["nonsense=1"], "unknown option: 'nonsense'"),
        (["guard_min=8M"], "guard_some and guard_min need guard="),
        ([], "nothing to change"),
    ],
)
def test_set_refuses_with_one_line_and_applies_nothing(items: list[str], says: str) -> None:
    with pytest.raises(OptionError) as err:
        apply_set(RUNNING, items)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_an_equal_value_is_no_change() -> None:
    assert apply_set(RUNNING, ["batch=16M"])[1] == []


CONF = """# /etc/fusethrottle/backups.conf
SOURCE=/srv/nfs
OPTIONS="allow_other,mode=static,batch=16M,window=32M,metered_limit=10M"
"""


def test_a_reload_applies_what_the_file_changed() -> None:
    new, changed = apply_reload(RUNNING, CONF)
    assert {c.key for c in changed} == {"window", "metered_limit"}
    assert (new.window, new.metered_limit) == (32 * MiB, 10 * MiB)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("SOURCE=/elsewhere\nOPTIONS=allow_other,mode=static,batch=16M,window=64M\n", "SOURCE"),
        ("SOURCE=/srv/nfs\nOPTIONS=mode=static,batch=16M,window=64M\n", "allow_other cannot"),
        ("SOURCE=/srv/nfs\nOPTIONS=allow_other,mode=static,window=1M\n", "must be at least batch"),
        ("SOURCE=/srv/nfs\nthis is not a setting\n", "line 2: expected KEY=value"),
    ],
)
def test_a_reload_that_cannot_apply_whole_applies_nothing(text: str, says: str) -> None:
    with pytest.raises(OptionError) as err:
        apply_reload(RUNNING, text)
    assert says in str(err.value)


def test_the_settings_file_is_read_as_systemd_reads_it() -> None:
    assert read_conf("# c\n\n; c\nA=1\nB='x y'\nC = \"z\"\n") == {"A": "1", "B": "x y", "C": "z"}


def test_an_instance_file_gives_the_source_and_the_options(tmp_path: Path) -> None:
    conf = tmp_path / "mnt-db\\x2dbackup.conf"
    conf.write_text("# /mnt/db-backup\nSOURCE=/mnt/nfs/db\nOPTIONS='window=128M,mode=static'\n")
    assert instance_settings(str(conf)) == ("/mnt/nfs/db", "window=128M,mode=static")
    conf.write_text("SOURCE=/mnt/nfs/db\n")  # OPTIONS may be left out
    assert instance_settings(str(conf)) == ("/mnt/nfs/db", "defaults")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (None, "cannot read"),
        ("OPTIONS=window=64M\n", "no SOURCE= line"),
        ("SOURCE=\n", "no SOURCE= line"),
        ("SOURCE=/x\nexport OPTIONS\n", "line 2"),
    ],
)
def test_a_bad_instance_file_is_one_line_naming_it(
    tmp_path: Path, text: str | None, says: str
) -> None:
    conf = tmp_path / "backups.conf"
    if text is not None:
        conf.write_text(text)
    with pytest.raises(OptionError) as err:
        instance_settings(str(conf))
    message = str(err.value)
    assert says in message and str(conf) in message and "\n" not in message


def test_a_reload_rereads_the_schedule_file_the_options_name(tmp_path: Path) -> None:
    limits = tmp_path / "backups.limits"
    limits.write_text("50M\n")
    text = (
        "SOURCE=/srv/nfs\n"
        f"OPTIONS=allow_other,mode=static,batch=16M,window=64M,metered_limit={limits}\n"
    )
    running, _ = apply_reload(RUNNING, text)
    limits.write_text("50M\n01:00-06:00=20M\n")  # the file changed, the options did not
    new, changed = apply_reload(running, text)
    assert [c.key for c in changed] == ["metered_limit"]
    assert new.metered_schedule[0].value == 20 * MiB


def test_a_reload_that_changes_only_a_schedules_windows_applies_them() -> None:
    """The windows live in a field of their own: a reload that changed only them was refused as
    a setting that cannot change while mounted."""
    text = "SOURCE=/srv/nfs\nOPTIONS=allow_other,mode=static,batch=16M,window=64M,{}\n"
    new, changed = apply_reload(RUNNING, text.format("metered_limit=50M,01:00-06:00=20M"))
    assert [c.key for c in changed] == ["metered_limit"]
    assert new.metered_schedule[0].value == 20 * MiB
    assert str(changed[0]) == f"metered_limit {50 * MiB} -> {50 * MiB},01:00-06:00={20 * MiB}"
