"""What differs between the trio versions fusethrottle runs on (Debian 12 ships 0.22)."""

from __future__ import annotations

import inspect

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
