"""What differs between the trio versions fusethrottle runs on (Debian 12 ships 0.22)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TypeVar

import trio

try:  # trio >= 0.23 renamed the keyword; Debian 12 ships 0.22.
    _ABANDON = (
        "abandon_on_cancel"
        if "abandon_on_cancel" in inspect.signature(trio.to_thread.run_sync).parameters
        else "cancellable"
    )
except (TypeError, ValueError):  # pragma: no cover - signature always available in CPython
    _ABANDON = "cancellable"
#: Keyword arguments of ``trio.to_thread.run_sync`` that let a cancelled caller leave a thread
#: stuck on the target (or on Redis) behind.
ABANDON_KW = {_ABANDON: True}


T = TypeVar("T")


async def run_sync_abandoning(
    fn: Callable[..., T], *args: object, limiter: trio.CapacityLimiter | None = None
) -> T:
    """``trio.to_thread.run_sync(fn, *args)`` that a cancelled caller may leave behind (its
    thread stuck on the target or on Redis), under either trio's keyword."""
    if _ABANDON == "abandon_on_cancel":
        return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True, limiter=limiter)
    # trio 0.22 (Debian 12) knows only this name; newer stubs no longer list it.
    legacy: dict[str, object] = {"cancellable": True, "limiter": limiter}
    return await trio.to_thread.run_sync(fn, *args, **legacy)  # type: ignore[arg-type]
