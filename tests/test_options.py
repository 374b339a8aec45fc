"""Option parsing: every user mistake is one clear OptionError, every valid spelling works."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fusethrottle.service.options import (
    FleetAddress,
    GiB,
    MiB,
    OptionError,
    memory_cgroup_limit,
    parse_duration,
    parse_options,
    parse_size,
    split_options,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4096", 4096),
        ("64M", 64 * MiB),
        ("64m", 64 * MiB),
        ("1G", GiB),
        ("1GiB", GiB),
        ("512K", 512 * 1024),
        ("1.5G", int(1.5 * GiB)),
        ("2MB", 2 * MiB),
    ],
)
def test_sizes(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("30s", 30.0), ("500ms", 0.5), ("2m", 120.0), ("1h", 3600.0), ("7", 7.0)],
)
def test_durations(text: str, expected: float) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("bad", ["", "M", "-1M", "64X", "1 2", "ten"])
def test_bad_sizes_are_refused(bad: str) -> None:
    with pytest.raises(OptionError, match="not a size"):
        parse_size(bad)


@given(st.integers(min_value=0, max_value=2**20), st.sampled_from(["", "K", "M", "G"]))
def test_size_roundtrip(n: int, unit: str) -> None:
    factor = {"": 1, "K": 1024, "M": MiB, "G": GiB}[unit]
    assert parse_size(f"{n}{unit}") == n * factor


def test_defaults_match_the_design() -> None:
    config = parse_options([])
    assert (config.mode, config.batch, config.window, config.max_age) == (
        "adaptive",
        64 * MiB,
        256 * MiB,
        30.0,
    )
    # Small writes reach the daemon coalesced; the kernel's share of the window is bounded.
    assert (config.writeback_cache, config.kernel_cache, config.xattrs) == (True, 32 * MiB, "auto")
    assert parse_options(["writeback_cache=no"]).writeback_cache is False
    # auto (the default): on, unless the daemon shares its memory cgroup (decided at mount)
    for items in ([], ["writeback_cache=auto"]):
        auto = parse_options(items)
        assert auto.writeback_cache is True and auto.writeback_cache_auto is True
    assert parse_options(["writeback_cache=yes"]).writeback_cache_auto is False
    assert parse_options(["target_io=direct"]).target_io == "direct"


def test_memory_options_and_the_own_cgroups_limit() -> None:
    """By default the target's cache goes to a cgroup of the daemon's own, limited to the
    largest window plus room for the daemon; syncs go in pieces and drop what they synced."""
    config = parse_options([])
    assert (config.memory_cgroup, config.writeback_pieces, config.drop_synced) == (
        "auto",
        True,
        True,
    )
    assert memory_cgroup_limit(config) == 2 * GiB + 512 * MiB
    assert memory_cgroup_limit(parse_options(["window_max=4G"])) == 4 * GiB + 512 * MiB
    assert memory_cgroup_limit(parse_options(["memory_cgroup_limit=1G"])) == GiB
    off = parse_options(["memory_cgroup=off", "writeback_pieces=no", "drop_synced=no"])
    assert (off.memory_cgroup, off.writeback_pieces, off.drop_synced) == ("off", False, False)


def test_xattrs_and_kernel_cache_options() -> None:
    assert parse_options(["xattrs=off", "kernel_cache=8M"]).kernel_cache == 8 * MiB
    with pytest.raises(OptionError, match="xattrs"):
        parse_options(["xattrs=maybe"])
    with pytest.raises(OptionError, match="kernel_cache"):
        parse_options(["kernel_cache=lots"])


def test_a_starting_window_outside_the_default_bounds_moves_them() -> None:
    small = parse_options(["batch=4M", "window=8M"])
    assert (small.mode, small.window, small.window_min) == ("adaptive", 8 * MiB, 8 * MiB)
    large = parse_options(["window=4G"])
    assert (large.window, large.window_max) == (4 * GiB, 4 * GiB)
    # Bounds the user set are kept, and a window outside them is refused.
    with pytest.raises(OptionError, match="between window_min and window_max"):
        parse_options(["batch=4M", "window=8M", "window_min=16M"])
    assert parse_options(["mode=static", "batch=4M", "window=8M"]).window_min == 16 * MiB


def test_full_option_set() -> None:
    config = parse_options(
        split_options(
            [
                "allow_other,mode=adaptive,batch=32M,window=128M",
                "max_age=10s,attr_timeout=500ms,metrics=9100,meter=efs-legacy,ro,noatime",
            ]
        )
    )
    assert config.allow_other and config.read_only
    assert config.mode == "adaptive"
    assert (config.batch, config.window, config.max_age) == (32 * MiB, 128 * MiB, 10.0)
    assert config.attr_timeout == 0.5
    assert config.metrics == "127.0.0.1:9100"
    assert config.kernel_options == ("noatime",)


def test_fstab_and_systemd_options_are_ignored() -> None:
    config = parse_options(
        split_options(
            ["_netdev,nofail,auto,x-systemd.requires=/mnt/nfs,x-systemd.automount,defaults,users"]
        )
    )
    assert config == parse_options([])


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["bogus"], "unknown option: 'bogus'"),
        (["batch"], "needs a value"),
        (["batch=lots"], "option batch: not a size"),
        (["batch=64M", "window=32M"], "window .* must be at least batch"),
        (["mode=fast"], "option mode: 'fast' is not one of off, static, adaptive"),
        (["max_age=soon"], "not a duration"),
        (["metrics=host:http"], "not HOST:PORT"),
        (["tolerance=0.5"], "tolerance must be at least 1.0"),
        (["allow_other=maybe"], "expected no value"),
        (["window_min=1G", "window_max=512M"], "window_min"),
        (["memory_cgroup=on"], "option memory_cgroup: 'on' is not one of auto, off"),
        (["memory_cgroup_limit=16M"], "memory_cgroup_limit must be at least 64M"),
        (["drop_synced=perhaps"], "expected no value"),
    ],
)
def test_mistakes_get_one_clear_line(items: list[str], message: str) -> None:
    with pytest.raises(OptionError, match=message) as info:
        parse_options(items)
    assert "\n" not in str(info.value)


def test_every_metering_number_can_be_overridden() -> None:
    from fusethrottle.metering.meter import Meter, OpClass, profile_for

    config = parse_options(["meter=efs", "meter_data_min=4K", "meter_write_units=3"])
    charge = Meter(profile_for(config)).charge(OpClass.DATA_WRITE, 1)
    assert (charge.metered_bytes, charge.units) == (4096, 3)  # was 32 KiB and 5 units


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("meter_read_factor=2", "read_factor must be in"),
        ("meter_data_min=lots", "option meter_data_min: not a size"),
        ("meter_write_units=-1", "must not be negative"),
        ("meter_colour=red", "unknown option"),
    ],
)
def test_bad_metering_numbers_are_refused(item: str, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        parse_options([item])


def test_budget_url_and_its_options() -> None:
    config = parse_options(
        [
            "budget=rediss://backup@redis.internal:6380/efs-prod",
            "budget_weight=2",
            "budget_fallback=20M",
            "budget_password_file=/etc/fusethrottle/redis.pw",
            "budget_ca=/etc/ssl/redis-ca.pem",
            "budget_timeout=250ms",
        ]
    )
    assert config.budget == FleetAddress("redis.internal", 6380, "efs-prod", True, "backup")
    assert str(config.budget) == "rediss://backup@redis.internal:6380/efs-prod"
    assert config.budget_weight == 2.0
    assert config.budget_fallback == 20 * MiB
    assert config.budget_timeout == 0.25
    plain = parse_options(["budget=redis://10.0.0.5/nightly", "budget_fallback=share"])
    assert plain.budget == FleetAddress("10.0.0.5", 6379, "nightly")
    assert plain.budget_fallback == 0.0
    assert parse_options([]).budget is None


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["budget=http://h:1/x"], "expected redis://HOST:PORT/NAME"),
        (["budget=redis://h:1"], "NAME .* is missing"),
        (["budget=redis://h:1/a/b"], "NAME .* is missing or invalid"),
        (["budget=redis://:6379/x"], "host is missing"),
        (["budget=redis://h:99999/x"], "expected redis://HOST:PORT/NAME"),
        (["budget=redis://h:port/x"], "expected redis://HOST:PORT/NAME"),
        (["budget=redis://u:secret@h:1/x"], "no password in the budget URL"),
        (["budget=redis://h:1/x?db=2"], "no '\\?' or '#' parts"),
        (["budget=redis://h/x", "budget_weight=0"], "budget_weight: must be a positive number"),
        (["budget=redis://h/x", "budget_weight=-1"], "budget_weight: must be a positive"),
        (["budget=redis://h/x", "budget_fallback=fast"], "expected 'share' or a rate"),
        (["budget=redis://h/x", "budget_timeout=1h"], "budget_timeout must be between"),
        (["budget=redis://h/x", "budget_ca=/ca.pem"], "budget_ca is for a rediss://"),
        (["budget_weight=2"], "budget_weight needs budget="),
        (["budget_password_file=/pw"], "budget_password_file needs budget="),
        (["budget="], "budget needs a value"),
    ],
)
def test_budget_mistakes_get_one_clear_line(items: list[str], message: str) -> None:
    with pytest.raises(OptionError, match=message) as info:
        parse_options(items)
    assert "\n" not in str(info.value)
