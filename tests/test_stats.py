"""The one percentile: nearest rank, shared by the status view and the bench."""

from __future__ import annotations

import math

import pytest

from bench import stats as bench_stats
from fusethrottle.stats import percentile


@pytest.mark.parametrize(
    ("q", "expected"),
    [(0.0, 1), (0.01, 1), (0.5, 50), (0.505, 51), (0.99, 99), (1.0, 100)],
)
def test_nearest_rank_is_a_sample_actually_seen(q: float, expected: int) -> None:
    assert percentile(list(range(1, 101)), q) == expected


def test_p99_of_200_samples_leaves_two_above_it() -> None:
    assert percentile(list(range(1, 201)), 0.99) == 198


def test_no_samples_no_percentile() -> None:
    assert percentile([], 0.5) is None


def test_the_bench_uses_the_same_definition_in_percent() -> None:
    values = [0.5, 1.0, 2.0, 9.0]
    for q in (0, 25, 50, 75, 99, 100):
        assert bench_stats.percentile(values, q) == percentile(values, q / 100)
    assert math.isnan(bench_stats.percentile([], 50))  # a report cell, never None
