"""The shared bucket against a real redis-server (fleet_redis.py and its Lua script)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from redis_util import RedisServer, make_tls_files, require_redis

from fusethrottle.fleet_redis import (
    BUCKET_SECONDS,
    BudgetNotSet,
    RedisBudget,
    StoreError,
    read_password,
)
from fusethrottle.options import parse_budget_url

MiB = 1 << 20
RATE = 60 * MiB


def budget(server: RedisServer, name: str = "fleet", password: str | None = None) -> RedisBudget:
    return RedisBudget(parse_budget_url(f"{server.url}/{name}"), password, timeout=0.5)


@pytest.fixture
def fleet(redis_server: RedisServer) -> RedisBudget:
    b = budget(redis_server)
    b.set_budget(RATE, 20000)
    return b


def test_a_budget_nobody_set_is_reported_as_such(redis_server: RedisServer) -> None:
    with pytest.raises(BudgetNotSet):
        budget(redis_server, "unset").grant("a", 1, (MiB, 0), hold=1)


def test_the_budget_is_read_back_as_set(fleet: RedisBudget) -> None:
    assert fleet.read_budget() == (RATE, 20000)


def test_a_lone_mount_gets_the_whole_rate_as_its_share(fleet: RedisBudget) -> None:
    grant = fleet.grant("a", 1, (16 * MiB, 100), hold=1)
    assert grant.mounts == 1
    assert grant.share_metered == RATE
    assert grant.share_units == 20000
    assert grant.fleet_metered == RATE
    assert 0 < grant.metered <= 16 * MiB
    assert grant.units == 100


def test_two_mounts_share_equally_and_weights_tilt_it(fleet: RedisBudget) -> None:
    fleet.grant("a", 1, (MiB, 0), hold=5)
    b = fleet.grant("b", 1, (MiB, 0), hold=5)
    assert b.mounts == 2
    assert b.share_metered == RATE / 2
    c = fleet.grant("c", 2, (MiB, 0), hold=5)
    assert c.share_metered == pytest.approx(RATE * 2 / 4)
    assert {m.mount_id: m.weight for m in fleet.active()} == {"a": 1, "b": 1, "c": 2}


def test_one_grant_is_capped_at_a_second_of_the_share(fleet: RedisBudget) -> None:
    fleet.grant("a", 1, (1, 0), hold=5)
    # b alone could drain the whole bucket; with a active it gets its half (the bucket holds
    # only BUCKET_SECONDS of the rate, so the bucket is the tighter bound here).
    b = fleet.grant("b", 1, (RATE * 10, 0), hold=5)
    assert b.metered <= RATE * BUCKET_SECONDS


def test_greedy_mounts_never_get_more_than_the_bucket_refills(fleet: RedisBudget) -> None:
    """Whatever the speed of the callers: granted <= rate x elapsed + one bucket."""
    start = time.monotonic()
    granted = 0.0
    for i in range(300):
        granted += fleet.grant(f"m{i % 3}", 1, (8 * MiB, 0), hold=5).metered
    elapsed = time.monotonic() - start
    assert granted <= RATE * (elapsed + BUCKET_SECONDS) + 1


def test_an_idle_mounts_share_goes_to_the_others(fleet: RedisBudget) -> None:
    fleet.grant("a", 1, (MiB, 0), hold=0.2)
    assert fleet.grant("b", 1, (MiB, 0), hold=5).mounts == 2
    time.sleep(0.3)
    b = fleet.grant("b", 1, (MiB, 0), hold=5)
    assert b.mounts == 1
    assert b.share_metered == RATE


def test_a_released_mount_leaves_at_once_and_returns_its_tokens(fleet: RedisBudget) -> None:
    fleet.grant("a", 1, (MiB, 0), hold=60)
    fleet.grant("b", 1, (RATE, 0), hold=60)  # b takes what it may
    released = fleet.grant("a", 1, (0, 0), hold=60, give_back=(RATE, 0))
    assert released.metered == 0
    assert [m.mount_id for m in fleet.active()] == ["b"]
    assert fleet.grant("b", 1, (RATE, 0), hold=60).metered >= RATE * BUCKET_SECONDS / 2


def test_budgets_of_different_names_are_separate(redis_server: RedisServer) -> None:
    one, two = budget(redis_server, "one"), budget(redis_server, "two")
    one.set_budget(10 * MiB, 0)
    two.set_budget(20 * MiB, 0)
    one.grant("a", 1, (MiB, 0), hold=5)
    assert two.grant("b", 1, (MiB, 0), hold=5).mounts == 1
    assert two.grant("b", 1, (MiB, 0), hold=5).share_metered == 20 * MiB


def test_a_killed_redis_is_an_error_and_a_restarted_one_has_the_budget(
    redis_server: RedisServer, fleet: RedisBudget
) -> None:
    redis_server.kill()
    with pytest.raises(StoreError):
        fleet.grant("a", 1, (MiB, 0), hold=1)
    redis_server.start()
    assert fleet.grant("a", 1, (MiB, 0), hold=1).share_metered == RATE


def test_a_hung_redis_gives_an_error_not_a_hang(
    redis_server: RedisServer, fleet: RedisBudget
) -> None:
    redis_server.pause()
    try:
        with pytest.raises(StoreError):
            fleet.grant("a", 1, (MiB, 0), hold=1)
    finally:
        redis_server.resume()


def test_password_from_a_file(tmp_path: Path) -> None:
    require_redis()
    server = RedisServer(tmp_path, password="s3cret-budget")
    server.start()
    try:
        secret = tmp_path / "pw"
        secret.write_text("s3cret-budget\n")
        with pytest.raises(StoreError):
            budget(server, password=None).set_budget(MiB, 0)
        with pytest.raises(StoreError):
            budget(server, password="wrong").set_budget(MiB, 0)
        good = budget(server, password=read_password(str(secret)))
        good.set_budget(MiB, 0)
        assert good.grant("a", 1, (MiB, 0), hold=1).share_metered == MiB
    finally:
        server.stop()


def test_password_file_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "pw"
    secret.write_text("from-env\n")
    monkeypatch.setenv("FUSETHROTTLE_BUDGET_PASSWORD_FILE", str(secret))
    assert read_password(None) == "from-env"
    assert read_password("") == "from-env"
    monkeypatch.delenv("FUSETHROTTLE_BUDGET_PASSWORD_FILE")
    assert read_password(None) is None
    with pytest.raises(OSError):
        read_password(str(tmp_path / "missing"))


def test_rediss_with_a_ca_file(tmp_path: Path) -> None:
    """rediss:// speaks TLS and checks the server against budget_ca's CA."""
    require_redis()
    tls = make_tls_files(tmp_path)
    server = RedisServer(tmp_path, tls=tls)
    server.start()
    try:
        address = parse_budget_url(f"{server.url}/tls")
        assert address.tls
        good = RedisBudget(address, None, timeout=2.0, ca_file=str(tls.ca))
        good.set_budget(MiB, 0)
        assert good.grant("a", 1, (MiB, 0), hold=1).share_metered == MiB
        plain = RedisBudget(parse_budget_url(f"redis://127.0.0.1:{server.port}/tls"), None)
        with pytest.raises(StoreError):
            plain.read_budget()
        untrusted = RedisBudget(address, None, timeout=2.0)  # the system CAs do not know it
        with pytest.raises(StoreError):
            untrusted.read_budget()
    finally:
        server.stop()


def subscribers(server: RedisServer, name: str = "fleet") -> int:
    import redis

    client = redis.Redis(port=server.port)
    try:
        return int(client.pubsub_numsub(f"fusethrottle:{{{name}}}:changed")[0][1])
    finally:
        client.close()


def test_mounts_hear_each_other_join_and_leave(redis_server: RedisServer) -> None:
    """A joining or leaving mount moves the others' shares at once (pub/sub), not at their
    next lease: b hears a join and then leave, and ends with the whole rate again."""
    import trio

    from fusethrottle.fleet import FleetBudget

    budget(redis_server).set_budget(RATE, 0)  # the budget "fleet"

    def mount(name: str) -> FleetBudget:
        return FleetBudget(lambda: budget(redis_server), budget="test", mount_id=name)

    async def write(fleet: FleetBudget) -> None:
        while True:
            await fleet.acquire(MiB, 0)

    async def until(predicate) -> None:  # type: ignore[no-untyped-def]
        with trio.fail_after(20):  # a hang guard, not a speed claim
            while not predicate():
                await trio.sleep(0.02)

    async def main() -> None:
        a, b = mount("a"), mount("b")
        async with trio.open_nursery() as nursery:
            await nursery.start(a.run)
            await nursery.start(b.run)
            nursery.start_soon(write, b)
            await until(lambda: b.last_grant is not None and b.last_grant.mounts == 1)
            await until(lambda: subscribers(redis_server) >= 2)  # both watchers listen
            a_writes = trio.CancelScope()

            async def a_writer() -> None:
                with a_writes:
                    await write(a)

            nursery.start_soon(a_writer)
            await until(lambda: b.notified_total >= 1)
            await until(lambda: b.last_grant is not None and b.last_grant.mounts == 2)
            a_writes.cancel()
            await until(lambda: b.notified_total >= 2)
            await until(lambda: b.last_grant is not None and b.last_grant.mounts == 1)
            assert b.last_grant.share_metered == RATE
            nursery.cancel_scope.cancel()

    trio.run(main)
