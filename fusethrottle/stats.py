"""One definition of a percentile, so that a p99 in ``fusethrottle status`` and a p99 in a bench
report are the same statistic. Pure: no I/O, no dependencies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """The nearest-rank *q*-quantile (*q* in 0..1) of an ascending sequence; None when empty.

    Nearest rank, not interpolation: the value at rank ``ceil(q * n)``, clamped to 1..n. So the
    answer is always a sample actually seen (p99 of 200 samples is the 198th, 2 lie above it).
    The caller sorts, once for however many percentiles it asks of the same samples.
    """
    n = len(sorted_values)
    if n == 0:
        return None
    rank = min(n, max(1, math.ceil(q * n)))
    return sorted_values[rank - 1]
