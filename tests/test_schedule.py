"""Time-of-day schedules of the ceilings, without a mount: parsing, wall-clock windows across
midnight and DST, and the task that applies a window's value at its minute (a test clock)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
import trio
import trio.testing

from fusethrottle.metering.schedule import Schedule, Window, local_minute
from fusethrottle.service.options import OptionError, parse_options, split_options
from fusethrottle.service.schedules import Ceilings, ScheduleFollower

MiB = 1 << 20


def test_a_schedule_rides_with_its_ceiling_in_the_option_list() -> None:
    items = split_options(
        ["allow_other,metered_limit=100M,01:00-06:00=20M,22:00-23:30=0,mode=static"]
    )
    assert items == [
        "allow_other",
        "metered_limit=100M,01:00-06:00=20M,22:00-23:30=0",
        "mode=static",
    ]
    config = parse_options(items)
    assert config.metered_limit == 100 * MiB
    assert config.metered_schedule == (Window(60, 360, 20 * MiB), Window(1320, 1410, 0))


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("metered_limit=100M,01:00-25:00=20M", "not a time of day"),
        ("metered_limit=100M,01:00-01:00=20M", "empty or whole-day window"),
        ("metered_limit=100M,01:00-06:00=fast", "not a size"),
        ("ops_limit=7000,1:00-2:00", "expected HH:MM-HH:MM=VALUE"),
    ],
)
def test_a_bad_schedule_is_one_line(text: str, says: str) -> None:
    with pytest.raises(OptionError) as err:
        parse_options(split_options([text]))
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_schedule_file_gives_the_same_schedule_as_the_option(tmp_path: Path) -> None:
    limits = tmp_path / "backups.limits"
    limits.write_text(
        "# the backup's ceiling through the day, local time\n"
        "100M            # outside the windows\n"
        "\n"
        "01:00-06:00 = 20M\n"
        "22:00-23:30=0   # no ceiling late in the evening\n"
    )
    from_file = parse_options(split_options([f"allow_other,metered_limit={limits},mode=static"]))
    inline = parse_options(split_options(["metered_limit=100M,01:00-06:00=20M,22:00-23:30=0"]))
    assert (from_file.metered_limit, from_file.metered_schedule) == (
        inline.metered_limit,
        inline.metered_schedule,
    )
    limits.write_text("02:00-04:00=7000\n")  # windows only: no ceiling outside them
    ops = parse_options(split_options([f"ops_limit={limits}"]))
    assert ops.ops_limit == 0 and ops.ops_schedule == (Window(120, 240, 7000),)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (None, "No such file"),
        ("100M\n01:00-06:00 20M\n", "line 2: expected HH:MM-HH:MM = VALUE"),
        ("100M\n50M\n", "line 2: a second base value"),
        ("100M\n01:00-06:00=lots\n", "not a size"),
        ("fast\n", "not a size"),
    ],
)
def test_a_bad_schedule_file_is_one_line_naming_it(
    tmp_path: Path, text: str | None, says: str
) -> None:
    limits = tmp_path / "backups.limits"
    if text is not None:
        limits.write_text(text)
    with pytest.raises(OptionError) as err:
        parse_options(split_options([f"metered_limit={limits}"]))
    message = str(err.value)
    assert says in message and str(limits) in message and "\n" not in message, message


def test_a_window_applies_from_its_first_minute_to_before_its_last_and_may_cross_midnight() -> None:
    s = Schedule(100, (Window(22 * 60, 2 * 60, 5), Window(60, 360, 20)))
    assert [s.value_at(m) for m in (21 * 60 + 59, 22 * 60, 0, 60, 119, 120, 359, 360)] == [
        100,
        5,
        5,
        5,
        5,
        20,
        20,
        100,
    ]
    assert s.next_change(21 * 60 + 59) == 1 and s.next_change(360) == 22 * 60 - 360


@pytest.fixture
def berlin() -> Iterator[None]:
    old = time.tzname
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TZ", "Europe/Berlin")
        time.tzset()
        yield
    time.tzset()
    assert time.tzname == old


def test_wall_clock_windows_follow_the_clocks_across_dst(berlin: None) -> None:
    zone = ZoneInfo("Europe/Berlin")
    night = Schedule(100, (Window(60, 360, 20),))  # 01:00-06:00 local
    # 2026-03-29: at 02:00 the clocks jump to 03:00; the window still ends at 06:00 local,
    # four hours of real time after it started, not five.
    start = datetime(2026, 3, 29, 1, 0, tzinfo=zone).timestamp()
    end = datetime(2026, 3, 29, 6, 0, tzinfo=zone).timestamp()
    assert (end - start) / 3600 == 4
    assert night.value_at(local_minute(start)) == 20
    assert night.value_at(local_minute(end - 1)) == 20 and night.value_at(local_minute(end)) == 100
    # 2026-10-25: 02:00-03:00 happens twice; 01:00-06:00 spans six hours of real time.
    start = datetime(2026, 10, 25, 1, 0, tzinfo=zone).timestamp()
    end = datetime(2026, 10, 25, 6, 0, tzinfo=zone).timestamp()
    assert (end - start) / 3600 == 6
    assert all(night.value_at(local_minute(t)) == 20 for t in range(int(start), int(end), 600))


def test_the_follower_applies_a_window_at_its_minute(berlin: None) -> None:
    zone = ZoneInfo("Europe/Berlin")
    begin = datetime(2026, 12, 2, 0, 58, 30, tzinfo=zone).timestamp()
    applied: list[tuple[float, Ceilings]] = []

    async def main() -> None:
        def wall() -> float:
            return begin + trio.current_time()

        follower = ScheduleFollower(
            lambda: (Schedule(100 * MiB, (Window(60, 360, 20 * MiB),)), Schedule(0)),
            lambda c: applied.append((wall(), c)),
            wall,
        )
        with trio.move_on_after(3 * 3600):
            await follower.run()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    at = [(datetime.fromtimestamp(t, zone).strftime("%H:%M:%S"), c.metered) for t, c in applied]
    assert [v for _, v in at] == [100 * MiB, 20 * MiB]
    assert at[1][0].startswith("01:00:0")  # within its first seconds, not a minute late
    assert applied[1][1].metered_window == "01:00-06:00"
