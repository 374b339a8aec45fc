"""The fleet budget as a user meets it: ``fusethrottle budget``, the mount option's checks, the
status and metrics of a mount with a budget, and a real mount that writes while Redis is down.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import trio
from engine_view import MadeUpMount
from mount_util import status_json, stream_landing, wait_for
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from redis_util import RedisServer

from fusethrottle.metering.fleet_command import main as fleet_main
from fusethrottle.metering.fleet_share import PACE_BURST_SECONDS, Spending
from fusethrottle.observability import metrics
from fusethrottle.observability.metrics import Publisher
from fusethrottle.observability.status_view import format_status
from fusethrottle.service import cli
from fusethrottle.service.options import parse_options

MiB = 1 << 20


# --- fusethrottle budget set|show ------------------------------------------------------------


def test_budget_set_then_show(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"{redis_server.url}/nightly"
    assert fleet_main(["set", url, "--metered", "100M", "--ops", "20000"]) == 0
    out = capsys.readouterr().out
    assert "100.0 MiB/s metered, 20000 units/s" in out
    assert fleet_main(["show", url]) == 0
    assert "active mounts: 0" in capsys.readouterr().out


def test_budget_show_of_a_budget_never_set(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert fleet_main(["show", f"{redis_server.url}/nothing"]) == 1
    assert "not set" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["set", "http://x/y", "--metered", "1M"], "expected redis://HOST:PORT/NAME"),
        (["set", "redis://h/x"], "give --metered RATE, --ops UNITS or both"),
        (["set", "redis://h/x", "--metered", "fast"], "not a size"),
        (["set", "redis://u:pw@h/x", "--metered", "1M"], "no password in the budget URL"),
        (["show", "redis://h/x", "--password-file", "/nonexistent/pw"], "password file"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_budget_command_mistakes_are_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert fleet_main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1


def test_budget_command_with_redis_down_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from redis_util import free_port, require_redis

    require_redis()
    code = fleet_main(["show", f"redis://127.0.0.1:{free_port()}/x", "--timeout", "0.5"])
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith("fusethrottle: budget: Redis at 127.0.0.1:")
    assert err.count("\n") == 1


# --- the mount option's checks ---------------------------------------------------------------


def test_a_missing_password_file_is_refused_before_mounting(tmp_path: Path) -> None:
    config = parse_options(
        ["budget=redis://127.0.0.1/x", f"budget_password_file={tmp_path}/pw"],
        source=str(tmp_path),
        mountpoint=str(tmp_path / "mnt"),
    )
    with pytest.raises(cli.UsageError, match=f"budget_password_file {tmp_path}/pw: No such file"):
        cli._check_fleet(config)


def test_a_password_file_named_by_the_environment_must_exist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FUSETHROTTLE_BUDGET_PASSWORD_FILE", str(tmp_path / "gone"))
    config = parse_options(["budget=redis://127.0.0.1/x"])
    with pytest.raises(cli.UsageError, match=r"FUSETHROTTLE_BUDGET_PASSWORD_FILE .*gone"):
        cli._check_fleet(config)


# --- status and metrics of a mount with a budget ----------------------------------------------


def _made_up(tmp_path: Path, options: list[str]) -> MadeUpMount:
    config = parse_options(options, source=str(tmp_path), mountpoint=str(tmp_path / "mnt"))
    return MadeUpMount(config)


@dataclass
class EngineWriters:
    """The engine's requests as the fleet's spender (fleet_gate.h, as the daemon hands them to
    FleetShare.spend_through): they spend from the statistics' totals up to the allowance the
    renewer hands out, and wait for a lease beyond it. The pace is the engine's business
    (tested in C++); here only what the renewer sees."""

    mount: MadeUpMount
    allowance: float = 0.0  # nothing before the first hand-out

    def fleet_spending(self) -> Spending:
        s = self.mount.stats
        return Spending(s.fleet_spent_metered, s.fleet_spent_units, s.fleet_waiting, 0, 0, 0.0)

    def fleet_hand_out(self, allowance: tuple[float, float], pace: tuple[float, float]) -> None:
        self.allowance = allowance[0]

    async def write(self, metered: int) -> None:
        """One request of *metered* bytes (a MiB write costs a MiB under efs)."""
        share = self.mount.fleet
        assert share is not None
        while self.mount.stats.fleet_spent_metered >= self.allowance:
            self._set(fleet_waiting=1)
            share.wake()
            await trio.sleep(0.005)
        s = self.mount.stats
        self._set(fleet_waiting=0, fleet_spent_metered=s.fleet_spent_metered + metered)
        await trio.sleep(0)

    def _set(self, **changes: float) -> None:
        self.mount.stats = replace(self.mount.stats, **changes)


def _scrape(m: Publisher) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics.make_registry(m)).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_status_and_metrics_show_the_fleet_and_the_fallback(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    url = f"{redis_server.url}/status"
    assert fleet_main(["set", url, "--metered", "60M"]) == 0
    made_up = _made_up(tmp_path, [f"budget={url}", "budget_timeout=200ms"])
    fleet = made_up.fleet
    assert fleet is not None
    writers = EngineWriters(made_up)
    fleet.spend_through(writers)  # as the daemon hands it the engine
    publisher = made_up.publisher
    screens: list[str] = []
    scrapes = []

    def show() -> None:
        snap = publisher.publish(sample=True)
        screens.append(format_status(snap.to_json()))
        scrapes.append(_scrape(publisher))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(fleet.run)
            with trio.fail_after(30):  # a hang guard: the renewer hands out a lease at once
                for _ in range(8):
                    await writers.write(MiB)
            show()
            redis_server.kill()
            with trio.fail_after(30):  # a hang guard: writes go on while Redis is away
                while fleet.fallback_since is None:
                    await writers.write(MiB)
                for _ in range(4):
                    await writers.write(MiB)
            show()
            nursery.cancel_scope.cancel()

    trio.run(main)
    joined, away = screens
    assert f"  fleet        {url}: 60.0 MiB/s metered for 1 mount(s)" in joined
    assert "this mount: weight 1, share 60.0 MiB/s metered" in joined
    assert "ON FALLBACK" not in joined
    assert "ON FALLBACK (Redis at 127.0.0.1" in away
    assert "pacing at 60.0 MiB/s metered" in away  # the last known share
    ok, down = scrapes
    assert ok[("fusethrottle_budget_rate", (("resource", "metered_bytes"),))] == 60 * MiB
    assert ok[("fusethrottle_budget_share_rate", (("resource", "metered_bytes"),))] == 60 * MiB
    assert ok[("fusethrottle_budget_granted_total", (("resource", "metered_bytes"),))] >= 8 * MiB
    assert ok[("fusethrottle_budget_fallback", ())] == 0
    assert ok[("fusethrottle_budget_active_mounts", ())] == 1
    assert down[("fusethrottle_budget_fallback", ())] == 1
    assert down[("fusethrottle_budget_errors_total", ())] >= 1
    assert (
        down[("fusethrottle_budget_round_trips_total", ())]
        > ok[("fusethrottle_budget_leases_total", ())]
    )


# --- a real mount ---------------------------------------------------------------------------


@pytest.mark.mount
def test_a_mount_writes_through_a_redis_outage_and_rejoins(
    make_mount, redis_server: RedisServer
) -> None:
    """The writer never sees Redis go: its writes succeed throughout, the mount says it is on
    the fallback budget while Redis is away, and joins the fleet again when it is back."""
    url = f"{redis_server.url}/mount"
    assert fleet_main(["set", url, "--metered", "200M"]) == 0
    ft = make_mount(options=[f"budget={url}", "budget_timeout=200ms"])
    ft.expect_log_problems = True  # the outage is logged on purpose; checked below
    data = os.urandom(MiB)
    path = ft.mountpoint / "backup.bin"
    with open(path, "wb") as f:
        for _ in range(8):
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
        joined = status_json(ft.mountpoint)["fleet"]
        assert joined["fallback"] is False
        assert joined["fleet_metered"] == 200 * MiB
        assert joined["leases_total"] >= 1

        redis_server.kill()
        for _ in range(8):  # the writer never notices
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
        assert wait_for(lambda: status_json(ft.mountpoint)["fleet"]["fallback"], 30, 0.2)

        redis_server.start()
        assert wait_for(lambda: not status_json(ft.mountpoint)["fleet"]["fallback"], 30, 0.2)
        for _ in range(8):
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
    assert path.stat().st_size == 24 * MiB
    assert (ft.source / "backup.bin").read_bytes()[:MiB] == data
    ft.stop()
    log = ft.log()
    assert log.count("unavailable") == 1, log  # logged once, not once per retry
    assert "Traceback" not in log and " ERROR " not in log
    assert "is back after" in log


@pytest.mark.mount
def test_a_mount_sends_the_target_no_more_than_its_share(
    redis_server: RedisServer, make_mount
) -> None:
    """One mount alone in a fleet of 8 MiB/s: the target receives no more than the share allows
    over the time that passed (the pace's burst and one write on top), and all of it arrives.
    The lease is renewed in Python and spent by the engine's threads, so this is the hand-out's
    proof: a writer through a mount that ignored the budget would land all 12 MiB at once.
    Measured at the target, as the ceilings' test (test_ceilings.py), with the same reasons why
    no margin of time can flake."""
    rate = 8 * MiB
    url = f"{redis_server.url}/share"
    assert fleet_main(["set", url, "--metered", "8M"]) == 0
    daemon = make_mount(options=[f"budget={url}", "mode=off"])
    assert daemon.source is not None
    total = 12 * MiB  # a second and a half at the share
    samples = stream_landing(daemon.mountpoint / "share.bin", daemon.source / "share.bin", total)
    for elapsed, size in samples:
        allowed = rate * PACE_BURST_SECONDS + rate * elapsed + MiB
        assert size <= allowed, f"{size / MiB:.1f} MiB landed after {elapsed:.2f} s"
    fleet = status_json(daemon.mountpoint)["fleet"]
    assert fleet["share_metered"] == rate
    assert fleet["granted_metered_total"] >= total
