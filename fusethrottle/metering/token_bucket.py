"""A rate limit with a burst, as a reservation (pure: time is an argument).

The rule the engine's buckets keep in C++ (the ceilings, engine/src/ceilings.h, and the fleet
share's pace, fleet_gate.h), stated where its properties are tested; the fleet tests' model of
the engine spends through it (tests/fleet_spender.py).
"""

from __future__ import annotations

import math


class TokenBucket:
    """A rate limit with a burst, as a reservation: callers are told how long to wait.

    ``delay_for(now, amount)`` takes *amount* tokens at once and returns how long the caller
    must sleep before using them. The balance may go negative (debt), for two reasons. A request
    bigger than the burst still passes, after ``amount / rate`` seconds, instead of waiting
    forever for a bucket that can never hold it. And each later caller waits behind the debt of
    the earlier ones, so callers are served in arrival order and none is starved. Tokens are
    computed from elapsed time, not counted per tick, so over a long run the amount passed is
    exactly ``burst + rate x elapsed``.

    A rate of 0 means unlimited. The bucket starts full.
    """

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if rate < 0:
            raise ValueError("rate must not be negative")
        if rate > 0 and burst <= 0:
            raise ValueError("burst must be positive")
        self.rate = float(rate)
        self.burst = float(burst)
        self._tokens = float(burst)
        self._last = now

    @property
    def unlimited(self) -> bool:
        return self.rate == 0

    def _refill(self, now: float) -> None:
        if now > self._last:
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now

    def delay_for(self, now: float, amount: float) -> float:
        """Reserve *amount* tokens; seconds to wait before they may be used (0: go now)."""
        if self.unlimited or amount <= 0:
            return 0.0
        self._refill(now)
        self._tokens -= amount
        if self._tokens >= 0:
            return 0.0
        return -self._tokens / self.rate + max(self._last - now, 0.0)

    def set_rate(self, now: float, rate: float, burst: float) -> None:
        """Change the rate from *now* on (the fleet budget's share moves); debt is kept, so the
        callers already queued keep their place. A rate of 0 makes the bucket unlimited."""
        if rate < 0:
            raise ValueError("rate must not be negative")
        was_unlimited = self.unlimited
        self._refill(now)
        self.rate = float(rate)
        self.burst = max(float(burst), 1.0) if rate > 0 else float(burst)
        self._tokens = self.burst if was_unlimited else min(self._tokens, self.burst)
        self._last = max(self._last, now)

    def refund(self, now: float, amount: float) -> None:
        """Give back a reservation that was not used (its waiter gave up or failed)."""
        if self.unlimited or amount <= 0:
            return
        self._refill(now)
        self._tokens = min(self.burst, self._tokens + amount)

    def available(self, now: float) -> float:
        """Tokens that could be taken now without waiting; negative while in debt."""
        if self.unlimited:
            return math.inf
        self._refill(now)
        return self._tokens
