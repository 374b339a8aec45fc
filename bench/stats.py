"""Tiny statistics helpers shared by the worker processes and the report (no numpy needed)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from fusethrottle.stats import percentile as nearest_rank


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted sequence (q in 0..100); NaN when empty.

    The daemon's definition (:func:`fusethrottle.stats.percentile`), so a bench p99 and a
    ``fusethrottle status`` p99 are the same statistic; here in percent and as a float, with NaN
    for no samples, because reports and tables want a number in every cell.
    """
    value = nearest_rank(sorted_values, q / 100)
    return math.nan if value is None else float(value)


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
