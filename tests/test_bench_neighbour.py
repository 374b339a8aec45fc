"""The neighbour verdict table: every repeat counts, ratios pair arms of the same repeat."""

from __future__ import annotations

import pytest

from bench.neighbour import markdown, verdicts


def cell(arm: str, repeat: int, ops: float, mibps: float | None, worst: float, **kw) -> dict:
    return {
        "status": "ok",
        "workload": "seq",
        "arm": arm,
        "repeat": repeat,
        "victim_ops_per_s": ops,
        "target_mibps": mibps,
        "victim_max_ms": worst,
        "victim_over_500ms": kw.get("over", 0),
        "victim_dead_seconds": kw.get("dead", 0),
        "cg_backup_cached_end_mib": kw.get("left"),
        # used: share of a 20 MiB/s target's capacity over 10 s
        "schedule": "20M" if "used" in kw else None,
        "absorbed_bytes": kw["used"] * 200 * 1024 * 1024 if "used" in kw else None,
        "durable_s": 10.0,
        "app_bytes": None if mibps is None else mibps * 10 * 1024 * 1024,
    }


def test_the_worst_repeat_shows_and_ratios_pair_within_a_repeat() -> None:
    cells = [
        cell("idle", 1, 1000, None, 20),
        cell("direct-bdi", 1, 950, 10.0, 90, left=400, used=0.998),
        cell("ft-adaptive", 1, 990, 9.0, 30, left=3, used=0.97),
        cell("idle", 2, 500, None, 20),  # a slower machine in repeat 2: pairs with its own idle
        cell("direct-bdi", 2, 450, 8.0, 700, over=1, dead=1, left=420, used=0.996),
        cell("ft-adaptive", 2, 480, 8.0, 40, left=5, used=0.99),
        {"status": "failed", "arm": "ft-adaptive", "workload": "seq", "repeat": 3},
    ]
    rows = {r["arm"]: r for r in verdicts(cells)}
    ft, bdi = rows["ft-adaptive"], rows["direct-bdi"]
    assert ft["repeats"] == 2 and ft["victim_max_ms_worst"] == 40
    assert ft["victim_vs_idle_worst"] == 0.96 and ft["victim_vs_idle_median"] == 0.975
    assert ft["backup_vs_kernel_limit_worst"] == 0.9
    assert ft["backup_vs_kernel_limit_median"] == 0.95
    assert (
        bdi["repeats_with_an_op_over_0.5s"] == 1 and bdi["repeats_with_a_second_without_ops"] == 1
    )
    assert bdi["victim_max_ms_worst"] == 700 and bdi["backup_cache_left_mib_median"] == 410
    assert ft["target_used_worst"] == pytest.approx(0.97)
    assert bdi["target_used_median"] == pytest.approx(0.997)
    table = markdown(list(rows.values()))
    # The neighbour beside fusethrottle against the neighbour beside the kernel's limit:
    # 990/950 and 480/450.
    assert ft["victim_vs_kernel_limit_worst"] == pytest.approx(990 / 950)
    assert bdi["victim_vs_kernel_limit_worst"] is None
    row = (
        "| seq | ft-adaptive | 2 | 40 | 0 | 0 | 0.975, 0.960 | 1.054, 1.042 | 0.950, 0.900 | "
        "0.980, 0.970 | 4 |"
    )
    assert row in table


def test_runs_without_the_db_neighbour_have_no_table() -> None:
    assert verdicts([{"status": "ok", "arm": "direct", "workload": "seq", "repeat": 1}]) == []


def test_a_second_idle_arm_shows_the_machines_own_noise() -> None:
    cells = [
        cell("idle", 1, 1000, None, 20),
        cell("idle:again", 1, 940, None, 25),
        cell("ft-adaptive", 1, 960, 9.0, 30),
    ]
    rows = {r["arm"]: r for r in verdicts(cells)}
    assert rows["idle:again"]["victim_vs_idle_worst"] == pytest.approx(0.94)
    assert rows["idle"]["victim_vs_idle_worst"] == 1.0
    table = markdown(list(rows.values()))
    assert "| seq | idle:again | 1 | 25 | 0 | 0 | 0.940, 0.940 | -, - | -, - |" in table
    assert "idle:again: a second run without a backup in every repeat" in table
