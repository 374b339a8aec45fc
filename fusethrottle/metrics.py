"""Placeholder until the metrics issue lands: no endpoint, nothing recorded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .events import NullEvents
from .options import Config


def attach_metrics(
    config: Config,
) -> tuple[Any, Callable[[str, int], None] | None, Callable[[Any], list]]:
    return NullEvents(), None, lambda mount: []
