"""The shared bucket against a real redis-server (fleet_redis.py and its Lua script).

The fair-share rule lives only in the script, so it is tested through the script. No test here
sleeps or reads the test machine's clock: the script takes its time from Redis (``TIME``), and
the tests read the same clock, or set a mount's activity to end at a time already past, instead
of waiting for it to run out.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis_util import RedisServer, make_tls_files, require_redis

from fusethrottle.metering.fleet_redis import (
    BUCKET_SECONDS,
    FleetNotSet,
    RedisFleetStore,
    StoreError,
    keys,
    read_password,
)
from fusethrottle.service.options import parse_fleet_url

MiB = 1 << 20
RATE = 60 * MiB
UNITS = 20000
#: A hold no test outlasts: a mount that should count as active does, however slow the machine.
HOLD = 600.0
_names = itertools.count()


def fleet_store(
    server: RedisServer, name: str = "fleet", password: str | None = None
) -> RedisFleetStore:
    return RedisFleetStore(parse_fleet_url(f"{server.url}/{name}"), password, timeout=0.5)


@pytest.fixture
def fleet(redis_server: RedisServer) -> RedisFleetStore:
    b = fleet_store(redis_server)
    b.set_rates(RATE, UNITS)
    return b


def redis_now(server: RedisServer) -> int:
    """Redis's clock (``TIME``, microseconds): the one the script refills and expires by."""
    import redis

    client = redis.Redis(port=server.port)
    try:
        sec, usec = client.time()
        return int(sec) * 1_000_000 + int(usec)
    finally:
        client.close()


def active_until(server: RedisServer, name: str, mount_id: str) -> float | None:
    """Until when (Redis time, microseconds) the script counts *mount_id* as active."""
    import redis

    client = redis.Redis(port=server.port)
    try:
        return client.zscore(keys(name)[2], mount_id)
    finally:
        client.close()


def hold_ran_out(server: RedisServer, name: str, mount_id: str) -> None:
    """Leave *mount_id* as its last grant would have, had it been made a hold ago: active until
    a moment that has passed on Redis's clock (the mount stopped asking)."""
    import redis

    client = redis.Redis(port=server.port)
    try:
        assert client.zadd(keys(name)[2], {mount_id: redis_now(server) - 1}, xx=True) == 0
        assert active_until(server, name, mount_id) is not None
    finally:
        client.close()


def test_a_budget_nobody_set_is_reported_as_such(redis_server: RedisServer) -> None:
    with pytest.raises(FleetNotSet):
        fleet_store(redis_server, "unset").grant("a", 1, (MiB, 0), hold=1)


def test_the_budget_is_read_back_as_set(fleet: RedisFleetStore) -> None:
    assert fleet.read_rates() == (RATE, UNITS)


def test_a_lone_mount_gets_the_whole_rate_as_its_share(fleet: RedisFleetStore) -> None:
    grant = fleet.grant("a", 1, (16 * MiB, 100), hold=1)
    assert grant.mounts == 1
    assert grant.share_metered == RATE
    assert grant.share_units == UNITS
    assert grant.fleet_metered == RATE
    assert 0 < grant.metered <= 16 * MiB
    assert grant.units == 100


def test_two_mounts_share_equally_and_weights_tilt_it(fleet: RedisFleetStore) -> None:
    fleet.grant("a", 1, (MiB, 0), hold=HOLD)
    b = fleet.grant("b", 1, (MiB, 0), hold=HOLD)
    assert b.mounts == 2
    assert b.share_metered == RATE / 2
    c = fleet.grant("c", 2, (MiB, 0), hold=HOLD)
    assert c.share_metered == pytest.approx(RATE * 2 / 4)
    assert {m.mount_id: m.weight for m in fleet.active()} == {"a": 1, "b": 1, "c": 2}


#: (weight, what the mount does after every mount has written once)
mounts = st.lists(
    st.tuples(
        st.floats(0.1, 10.0, allow_nan=False),
        st.sampled_from(["writes", "releases", "stops asking"]),
    ),
    min_size=1,
    max_size=6,
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(mounts=mounts)
def test_writing_mounts_share_the_rate_by_weight_and_an_idle_one_gives_its_share_back(
    redis_server: RedisServer, mounts: list[tuple[float, str]]
) -> None:
    """The fair-share rule, as the script applies it: while every mount writes, each one's
    share is the fleet's rate x its weight / the weights of all, and the shares add up to the
    rate. A mount that releases, or stops asking until its hold runs out, leaves: the ones
    still writing share the whole rate among themselves, by their weights."""
    name = f"share{next(_names)}"
    store = fleet_store(redis_server, name)
    store.set_rates(RATE, UNITS)
    ids = [f"m{i}" for i in range(len(mounts))]
    for mount_id, (weight, _) in zip(ids, mounts, strict=True):
        store.grant(mount_id, weight, (1, 1), hold=HOLD)

    def shares(writing: list[tuple[str, float]]) -> None:
        total = sum(weight for _, weight in writing)
        grants = [store.grant(mount_id, weight, (1, 1), hold=HOLD) for mount_id, weight in writing]
        for grant, (_, weight) in zip(grants, writing, strict=True):
            assert grant.mounts == len(writing)
            assert grant.weight_sum == pytest.approx(total, rel=1e-9)
            assert grant.share_metered == pytest.approx(RATE * weight / total, rel=1e-9)
            assert grant.share_units == pytest.approx(UNITS * weight / total, rel=1e-9)
        assert sum(g.share_metered for g in grants) == pytest.approx(RATE, rel=1e-9)
        assert sum(g.share_units for g in grants) == pytest.approx(UNITS, rel=1e-9)
        assert {m.mount_id for m in store.active()} == {mount_id for mount_id, _ in writing}

    shares([(mount_id, weight) for mount_id, (weight, _) in zip(ids, mounts, strict=True)])
    for mount_id, (weight, then) in zip(ids, mounts, strict=True):
        if then == "releases":
            store.grant(mount_id, weight, (0, 0), hold=HOLD)
        elif then == "stops asking":
            hold_ran_out(redis_server, name, mount_id)
    still = [(i, w) for i, (w, then) in zip(ids, mounts, strict=True) if then == "writes"]
    if still:
        shares(still)
    store.close()


def test_one_grant_is_capped_at_a_second_of_the_share(fleet: RedisFleetStore) -> None:
    fleet.grant("a", 1, (1, 0), hold=HOLD)
    # b alone could drain the whole bucket; with a active it gets its half (the bucket holds
    # only BUCKET_SECONDS of the rate, so the bucket is the tighter bound here).
    b = fleet.grant("b", 1, (RATE * 10, 0), hold=HOLD)
    assert b.metered <= RATE * BUCKET_SECONDS


def test_greedy_mounts_never_get_more_than_the_bucket_refills(
    redis_server: RedisServer, fleet: RedisFleetStore
) -> None:
    """Whatever the speed of the callers: granted <= one full bucket + rate x the time that
    passed on Redis's clock, the one the script refills by (a slow machine only widens it)."""
    start = redis_now(redis_server)
    granted = 0.0
    for i in range(300):
        granted += fleet.grant(f"m{i % 3}", 1, (8 * MiB, 0), hold=HOLD).metered
    elapsed = (redis_now(redis_server) - start) / 1e6
    assert granted <= RATE * (elapsed + BUCKET_SECONDS) + 1


def test_a_mount_that_stops_asking_leaves_when_its_hold_runs_out(
    redis_server: RedisServer, fleet: RedisFleetStore
) -> None:
    """A grant's *hold* is when the mount stops counting, in Redis's time; the first grant
    after that drops it, and its share goes to the others."""
    before = redis_now(redis_server)
    fleet.grant("a", 1, (MiB, 0), hold=0.25)
    after = redis_now(redis_server)
    until = active_until(redis_server, "fleet", "a")
    assert until is not None and before + 250_000 <= until <= after + 250_000
    fleet.grant("a", 1, (MiB, 0), hold=HOLD)
    assert fleet.grant("b", 1, (MiB, 0), hold=HOLD).share_metered == RATE / 2
    hold_ran_out(redis_server, "fleet", "a")
    b = fleet.grant("b", 1, (MiB, 0), hold=HOLD)
    assert b.mounts == 1
    assert b.share_metered == RATE
    assert active_until(redis_server, "fleet", "a") is None


def test_a_released_mount_leaves_at_once_and_returns_its_tokens(fleet: RedisFleetStore) -> None:
    fleet.grant("a", 1, (MiB, 0), hold=HOLD)
    fleet.grant("b", 1, (RATE, 0), hold=HOLD)  # b takes what it may
    released = fleet.grant("a", 1, (0, 0), hold=HOLD, give_back=(RATE, 0))
    assert released.metered == 0
    assert [m.mount_id for m in fleet.active()] == ["b"]
    assert fleet.grant("b", 1, (RATE, 0), hold=HOLD).metered >= RATE * BUCKET_SECONDS / 2


def test_budgets_of_different_names_are_separate(redis_server: RedisServer) -> None:
    one, two = fleet_store(redis_server, "one"), fleet_store(redis_server, "two")
    one.set_rates(10 * MiB, 0)
    two.set_rates(20 * MiB, 0)
    one.grant("a", 1, (MiB, 0), hold=HOLD)
    assert two.grant("b", 1, (MiB, 0), hold=HOLD).mounts == 1
    assert two.grant("b", 1, (MiB, 0), hold=HOLD).share_metered == 20 * MiB


def test_a_killed_redis_is_an_error_and_a_restarted_one_has_the_budget(
    redis_server: RedisServer, fleet: RedisFleetStore
) -> None:
    redis_server.kill()
    with pytest.raises(StoreError):
        fleet.grant("a", 1, (MiB, 0), hold=1)
    redis_server.start()
    assert fleet.grant("a", 1, (MiB, 0), hold=1).share_metered == RATE


def test_a_hung_redis_gives_an_error_not_a_hang(
    redis_server: RedisServer, fleet: RedisFleetStore
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
            fleet_store(server, password=None).set_rates(MiB, 0)
        with pytest.raises(StoreError):
            fleet_store(server, password="wrong").set_rates(MiB, 0)
        good = fleet_store(server, password=read_password(str(secret)))
        good.set_rates(MiB, 0)
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
        address = parse_fleet_url(f"{server.url}/tls")
        assert address.tls
        good = RedisFleetStore(address, None, timeout=2.0, ca_file=str(tls.ca))
        good.set_rates(MiB, 0)
        assert good.grant("a", 1, (MiB, 0), hold=1).share_metered == MiB
        plain = RedisFleetStore(parse_fleet_url(f"redis://127.0.0.1:{server.port}/tls"), None)
        with pytest.raises(StoreError):
            plain.read_rates()
        untrusted = RedisFleetStore(address, None, timeout=2.0)  # the system CAs do not know it
        with pytest.raises(StoreError):
            untrusted.read_rates()
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
    from fleet_spender import EngineSpender

    from fusethrottle.metering.fleet import FleetShare

    fleet_store(redis_server).set_rates(RATE, 0)  # the budget "fleet"

    def mount(name: str) -> EngineSpender:
        """A mount's share, spent by (a model of) the engine's requests."""
        return EngineSpender.attach(
            FleetShare(lambda: fleet_store(redis_server), url="test", mount_id=name)
        )

    async def write(writes: EngineSpender) -> None:
        while True:
            await writes.spend(MiB)

    async def until(predicate) -> None:  # type: ignore[no-untyped-def]
        with trio.fail_after(20):  # a hang guard, not a speed claim
            while not predicate():
                await trio.sleep(0.02)

    async def main() -> None:
        a_writes, b_writes = mount("a"), mount("b")
        a, b = a_writes.fleet, b_writes.fleet
        async with trio.open_nursery() as nursery:
            await nursery.start(a.run)
            await nursery.start(b.run)
            nursery.start_soon(write, b_writes)
            await until(lambda: b.last_grant is not None and b.last_grant.mounts == 1)
            await until(lambda: subscribers(redis_server) >= 2)  # both watchers listen
            a_writer = trio.CancelScope()

            async def write_on_a() -> None:
                with a_writer:
                    await write(a_writes)

            nursery.start_soon(write_on_a)
            await until(lambda: b.notified_total >= 1)
            await until(lambda: b.last_grant is not None and b.last_grant.mounts == 2)
            a_writer.cancel()
            await until(lambda: b.notified_total >= 2)
            await until(lambda: b.last_grant is not None and b.last_grant.mounts == 1)
            assert b.last_grant.share_metered == RATE
            nursery.cancel_scope.cancel()

    trio.run(main)
