"""bench.fleet's arithmetic on a made-up run whose answers are known: the numbers it reports
for issue 14 must be the run's, not the sampler's."""

from __future__ import annotations

from bench.fleet import analyse, markdown

MiB = 1 << 20
PLAN = {"outage": 30.0, "down": 10.0, "stop": 55.0, "end": 65.0, "host": "h", "date": "d"}


def made_up_run(extra_at_20: float = 0.0) -> list[dict]:
    """A, B, C at 20 MiB/s each; C stops at 55.5 s; A and B at 30 MiB/s from 56.5 s.
    The daemons answered 0.1 s late (their numbers were taken 0.1 s before the scrape)."""
    samples = []
    totals = {"A": 0.0, "B": 0.0, "C": 0.0}
    t = 0.0
    while t <= 65.0 + 1e-9:
        row: dict = {"t": round(t, 2)}
        for name in totals:
            row[name] = {"metered": totals[name], "at": round(t, 2), "fallback": 0.0}
            if 30.0 <= t <= 40.0:
                row[name]["fallback"] = 1.0
            row[name]["round_trips_total"] = t * 1.25
        samples.append(row)
        step = 0.25
        for name in totals:
            rate = 20 * MiB
            if name == "C" and t >= 55.5:
                rate = 0.0
            elif name != "C" and t >= 56.5:
                rate = 30 * MiB
            if name == "A" and 20.0 <= t < 21.0:
                rate += extra_at_20
            totals[name] += rate * step
        t += step
    return samples


def test_an_exact_run_is_reported_exactly() -> None:
    s = analyse(made_up_run(), PLAN, 60 * MiB, {"A": [], "B": [], "C": []})
    assert abs(s["sum_10s_max_mib_s"] - 60.0) < 0.01
    assert s["jain_all_three"] == 1.0
    assert s["fallback_seen_during_outage"] == {"A": True, "B": True, "C": True}
    assert s["c_last_metered_after_stop_s"] == 0.5
    # A and B reach 30 at 56.5; judged on 0.5 s rates, that shows at 57.0 (2.0 s after 55).
    assert s["two_at_30_after_stop_s"] == 2.0
    assert s["round_trips_per_gib"] is not None
    text = markdown(s, {**PLAN, "commit": "x", "load_average_at_start": 1.0}, "cmd")
    assert "(+0.0%)" in text


def test_ten_seconds_over_the_limit_anywhere_are_seen() -> None:
    s = analyse(made_up_run(extra_at_20=40 * MiB), PLAN, 60 * MiB, {"A": [], "B": [], "C": []})
    assert abs(s["sum_10s_max_over_limit_percent"] - 100 * 4 / 60) < 0.1
    assert s["jain_all_three"] < 1.0
