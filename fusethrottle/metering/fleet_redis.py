"""The fleet budget's shared token bucket in Redis: one Lua script, one round trip per grant.

The only module that talks to Redis. Blocking (redis-py): the daemon calls it from a worker
thread with a timeout (fleet.py), the ``fusethrottle budget`` command directly.

Keys of a budget NAME (one hash tag, so a Redis Cluster keeps them in one slot):

=================================  ==========================================================
``fusethrottle:{NAME}:config``     hash: ``metered``, ``units`` (per second, 0 = no limit);
                                   written by ``fusethrottle budget set``, read by every grant
``fusethrottle:{NAME}:bucket``     hash: the tokens left (``metered``, ``units``) and the
                                   Redis ``TIME`` they were counted at (``t``, microseconds)
``fusethrottle:{NAME}:active``     sorted set: mount id -> until when it counts as active (us)
``fusethrottle:{NAME}:weights``    hash: mount id -> weight
``fusethrottle:{NAME}:changed``    pub/sub channel: the id of a mount whose grant changed the
                                   active set (joined, left, or saw others expire)
=================================  ==========================================================

Each grant, atomically on the server: drop the mounts whose activity ran out, (re)register this
one, refill the bucket from Redis's own clock (so the hosts' clocks never matter), compute this
mount's fair share (fleet rate x weight / sum of the active weights) and grant at most
``cap_seconds`` of it. The bucket holds at most ``BUCKET_SECONDS`` of the fleet rate, so the
fleet never spends more than that above its rate in any window, whatever the mounts believe
their shares to be.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..service.options import FleetAddress
from .fleet_share import BUCKET_SECONDS, GRANT_CAP_SECONDS, Grant

log = logging.getLogger(__name__)

#: Connect and per-call timeout: Redis on the same network answers in a millisecond or two.
DEFAULT_TIMEOUT = 0.5
#: How often the watcher (``watch``) looks at its stop flag.
WATCH_POLL = 0.5
#: The environment variable naming the password file (when ``budget_password_file=`` is unset).
PASSWORD_FILE_ENV = "FUSETHROTTLE_BUDGET_PASSWORD_FILE"

_GRANT_LUA = """
local id = ARGV[1]
local weight = tonumber(ARGV[2])
local want = {tonumber(ARGV[3]), tonumber(ARGV[4])}
local hold_us = tonumber(ARGV[5])
local cap_seconds = tonumber(ARGV[6])
local bucket_seconds = tonumber(ARGV[7])
local back = {tonumber(ARGV[8]), tonumber(ARGV[9])}
local channel = ARGV[10]

local config = redis.call('HMGET', KEYS[1], 'metered', 'units')
if not config[1] and not config[2] then
  return redis.error_reply('NOBUDGET budget is not set')
end
local rate = {tonumber(config[1]) or 0, tonumber(config[2]) or 0}

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])

local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
local changed = #gone
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  redis.call('HDEL', KEYS[4], unpack(gone))
end
local releasing = want[1] <= 0 and want[2] <= 0
if releasing then
  changed = changed + redis.call('ZREM', KEYS[3], id)
  redis.call('HDEL', KEYS[4], id)
else
  changed = changed + redis.call('ZADD', KEYS[3], now + hold_us, id)
  redis.call('HSET', KEYS[4], id, weight)
end
if changed > 0 then
  -- the active set changed: every mount's share did; tell them (fleet.py renews at once)
  redis.call('PUBLISH', channel, id)
end

local total = 0
local count = 0
for _, w in ipairs(redis.call('HVALS', KEYS[4])) do
  total = total + tonumber(w)
  count = count + 1
end
if releasing then
  total = total + weight
end

local state = redis.call('HMGET', KEYS[2], 'metered', 'units', 't')
local last = tonumber(state[3])
local out = {}
local tokens = {}
for i = 1, 2 do
  local cap = rate[i] * bucket_seconds
  local have = tonumber(state[i])
  if have == nil or last == nil then
    have = cap
  else
    have = math.min(cap, have + math.max(0, now - last) / 1000000 * rate[i] + back[i])
  end
  local share = rate[i] * weight / total
  local granted = 0
  if rate[i] > 0 and not releasing then
    granted = math.max(0, math.min(want[i], share * cap_seconds, have))
    have = have - granted
  end
  tokens[i] = have
  out[i] = tostring(granted)
  out[i + 2] = tostring(share)
  out[i + 4] = tostring(rate[i])
end
redis.call('HSET', KEYS[2], 'metered', tostring(tokens[1]), 'units', tostring(tokens[2]), 't', now)
out[7] = tostring(count)
out[8] = tostring(total)
return out
"""


class StoreError(Exception):
    """Redis could not be asked (down, slow, refused the password); the message says which."""


class FleetNotSet(StoreError):
    """Redis answers, but nobody ran ``fusethrottle budget set`` for this budget."""


@dataclass(frozen=True)
class ActiveMount:
    mount_id: str
    weight: float
    seconds_left: float


def keys(name: str) -> tuple[str, str, str, str]:
    """config, bucket, active, weights (see the module docstring)."""
    base = f"fusethrottle:{{{name}}}"
    return f"{base}:config", f"{base}:bucket", f"{base}:active", f"{base}:weights"


def read_password(path: str | None) -> str | None:
    """The password from *path*, else from the file the environment names, else None.

    One line; surrounding whitespace is not part of it. OSError when the file cannot be read.
    """
    path = path or os.environ.get(PASSWORD_FILE_ENV) or None
    if path is None:
        return None
    with open(path, encoding="utf-8") as f:
        return f.read().strip() or None


class RedisFleetStore:
    """The shared bucket of one fleet (the budget NAME), through one redis-py connection pool
    (thread-safe); what fleet.FleetStore asks of it."""

    def __init__(
        self,
        address: FleetAddress,
        password: str | None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        ca_file: str | None = None,
    ) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.address = address
        kwargs: dict[str, Any] = {}
        if address.tls:
            kwargs["ssl"] = True
            if ca_file:
                kwargs["ssl_ca_certs"] = ca_file
        self._redis = redis.Redis(
            host=address.host,
            port=address.port,
            username=address.username,
            password=password,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            # The caller decides what to do about a failure (fall back, retry later): one try.
            retry=Retry(NoBackoff(), 0),
            decode_responses=True,
            **kwargs,
        )
        self._keys = keys(address.name)
        self._channel = f"fusethrottle:{{{address.name}}}:changed"
        self._grant = self._redis.register_script(_GRANT_LUA)

    def grant(
        self,
        mount_id: str,
        weight: float,
        want: tuple[float, float],
        *,
        hold: float,
        give_back: tuple[float, float] = (0.0, 0.0),
        cap_seconds: float = GRANT_CAP_SECONDS,
    ) -> Grant:
        """One round trip: take up to *want* (metered, units) from the shared bucket.

        *hold*: seconds this mount counts as active without another call. A *want* of zeros
        releases the mount (it leaves the active set) and hands *give_back* to the bucket.
        """
        args: Sequence[Any] = (
            mount_id,
            repr(float(weight)),
            repr(float(want[0])),
            repr(float(want[1])),
            int(hold * 1e6),
            repr(float(cap_seconds)),
            repr(BUCKET_SECONDS),
            repr(float(give_back[0])),
            repr(float(give_back[1])),
            self._channel,
        )
        reply = self._call(lambda: self._grant(keys=list(self._keys), args=list(args)))
        values = [float(v) for v in reply]
        return Grant(
            metered=values[0],
            units=values[1],
            share_metered=values[2],
            share_units=values[3],
            fleet_metered=values[4],
            fleet_units=values[5],
            mounts=int(values[6]),
            weight_sum=values[7],
        )

    def set_rates(self, metered: float, units: float) -> None:
        """Store the fleet's rates (``fusethrottle budget set``); every grant reads them."""
        config = self._keys[0]
        self._call(lambda: self._redis.hset(config, mapping={"metered": metered, "units": units}))

    def read_rates(self) -> tuple[float, float] | None:
        """(metered/s, units/s), or None when the budget was never set."""
        values = self._call(lambda: self._redis.hmget(self._keys[0], "metered", "units"))
        if values[0] is None and values[1] is None:
            return None
        return float(values[0] or 0), float(values[1] or 0)

    def active(self) -> list[ActiveMount]:
        """The mounts that count as active now, with their weights."""

        def read() -> tuple[list[tuple[str, float]], dict[str, str], list[str]]:
            pipe = self._redis.pipeline(transaction=True)
            pipe.zrange(self._keys[2], 0, -1, withscores=True)
            pipe.hgetall(self._keys[3])
            pipe.time()
            replies: tuple[list[tuple[str, float]], dict[str, str], list[str]] = tuple(
                pipe.execute()
            )  # type: ignore[assignment]
            return replies

        members, weights, (sec, usec) = self._call(read)
        now = int(sec) * 1_000_000 + int(usec)
        return [
            ActiveMount(m, float(weights.get(m, 0)), (until - now) / 1e6)
            for m, until in members
            if until > now
        ]

    def watch(self, stop: threading.Event, on_change: Callable[[str], None]) -> None:
        """Until *stop* is set: call *on_change(mount_id)* whenever a grant changes the set of
        active mounts (the id is the mount whose call changed it). Blocking, for a worker
        thread; StoreError when Redis goes away (the caller tries again later)."""

        def listen() -> None:
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(self._channel)
                while not stop.is_set():
                    message = pubsub.get_message(timeout=WATCH_POLL)
                    if message is not None and message.get("type") == "message":
                        on_change(str(message.get("data", "")))
            finally:
                pubsub.close()

        self._call(listen)

    def close(self) -> None:
        self._redis.close()

    def _call(self, fn: Any) -> Any:
        import redis

        try:
            return fn()
        except redis.ResponseError as err:
            if str(err).startswith("NOBUDGET"):
                raise FleetNotSet(f"budget {self.address.name!r} is not set in Redis") from None
            raise StoreError(f"Redis refused: {err}") from None
        except redis.AuthenticationError as err:
            raise StoreError(f"Redis refused the password: {err}") from None
        except (redis.RedisError, OSError) as err:
            raise StoreError(f"Redis at {self.address.host}:{self.address.port}: {err}") from None
