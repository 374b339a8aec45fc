"""The log limiter: one line per cause per interval, and bounded memory of causes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fusethrottle.loglimit import LogLimiter


def test_one_line_per_cause_per_interval() -> None:
    limit = LogLimiter(60.0)
    assert limit.allow(("write", 5), 0.0)
    assert not limit.allow(("write", 5), 59.9)  # same cause, within the minute
    assert limit.allow(("fsync", 5), 1.0)  # another cause is not held back
    assert limit.allow(("write", 5), 60.0)


@given(st.lists(st.integers(min_value=0, max_value=10**9), min_size=1, max_size=200))
def test_memory_of_causes_is_bounded_and_new_causes_are_always_logged(keys: list[int]) -> None:
    limit = LogLimiter(60.0, max_keys=16)
    for now, key in enumerate(keys):
        first_time = key not in keys[:now]
        if first_time:
            assert limit.allow(key, float(now))
        else:
            limit.allow(key, float(now))
        assert len(limit._last) <= 16
