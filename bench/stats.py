"""Tiny statistics helpers shared by the worker processes and the report (no numpy needed)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted sequence (q in 0..100); NaN when empty.

    Nearest rank, not interpolation: p99 of 200 samples is the 2nd worst one actually seen.
    """
    n = len(sorted_values)
    if n == 0:
        return math.nan
    rank = min(n - 1, max(0, math.ceil(q / 100 * n) - 1))
    return float(sorted_values[rank])


def median(values: Sequence[float]) -> float:
    """Median of the finite values (NaN when there are none)."""
    vals = sorted(v for v in values if v is not None and math.isfinite(v))
    if not vals:
        return math.nan
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


def finite(values: Sequence[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def distinct(cells: Sequence[dict], key: str) -> list[str]:
    """The values of *key* across *cells*, each once, in order of first appearance."""
    return list(dict.fromkeys(c[key] for c in cells))
