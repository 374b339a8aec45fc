"""The database neighbour's verdict per arm (issue 15): every repeat counts, the worst shown.

A protection claim is about the bad night, not the median one: for each arm this table gives
the worst neighbour operation over all repeats, in how many repeats any operation took over half
a second or a whole second passed without one, and the neighbour's and the backup's throughput
as ratios paired within a repeat (the arms of one repeat run back to back, so they saw the same
machine): the neighbour's against the idle arm and against the neighbour beside the kernel's own
limit, the backup's against the kernel's own limit. On a throttled target, also the share of
the target's capacity each arm's backup used until its data was durable
(bench.plan.schedule_capacity says why bytes over time alone is not the whole story).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from bench.plan import is_idle, parse_schedule, schedule_capacity
from bench.stats import distinct, median

STALL_S = 0.5  # the issue's bound on any one neighbour operation


def capacity_used(cell: dict) -> float | None:
    """Share of the throttled target's capacity a cell's backup used until its data was
    durable; None off a throttled target or without the numbers."""
    schedule, absorbed, seconds = (cell.get(k) for k in ("schedule", "absorbed_bytes", "durable_s"))
    if not schedule or not absorbed or not seconds or not cell.get("app_bytes"):
        return None
    capacity = schedule_capacity(parse_schedule(schedule), seconds)
    return absorbed / capacity if capacity else None


def verdicts(cells: Sequence[dict], baseline: str = "direct-bdi") -> list[dict]:
    """One row per arm of a run whose neighbour reports throughput (the db victim)."""
    ok = [c for c in cells if c.get("status") == "ok" and c.get("victim_ops_per_s") is not None]
    if not ok:
        return []
    by_repeat: dict[tuple[str, int], dict[str, dict]] = defaultdict(dict)
    for c in ok:
        by_repeat[(c["workload"], c["repeat"])][c["arm"]] = c
    rows = []
    for workload in distinct(ok, "workload"):
        for arm in distinct(ok, "arm"):
            runs = [c for c in ok if c["arm"] == arm and c["workload"] == workload]
            if not runs:
                continue
            vs_idle, vs_base, victim_vs_base = [], [], []
            used = [u for u in map(capacity_used, runs) if u is not None]
            for c in runs:
                peers = by_repeat[(workload, c["repeat"])]
                idle = peers.get("idle", {}).get("victim_ops_per_s")
                if idle:
                    vs_idle.append(c["victim_ops_per_s"] / idle)
                base = peers.get(baseline, {}).get("target_mibps")
                if base and c.get("target_mibps"):
                    vs_base.append(c["target_mibps"] / base)
                base_ops = peers.get(baseline, {}).get("victim_ops_per_s")
                if base_ops and arm != baseline and not is_idle(arm):
                    victim_vs_base.append(c["victim_ops_per_s"] / base_ops)
            rows.append(
                {
                    "workload": workload,
                    "arm": arm,
                    "repeats": len(runs),
                    "victim_max_ms_worst": max(c.get("victim_max_ms") or 0 for c in runs),
                    "repeats_with_an_op_over_0.5s": sum(
                        1 for c in runs if (c.get("victim_over_500ms") or 0) > 0
                    ),
                    "repeats_with_a_second_without_ops": sum(
                        1 for c in runs if (c.get("victim_dead_seconds") or 0) > 0
                    ),
                    "victim_vs_idle_median": median(vs_idle) if vs_idle else None,
                    "victim_vs_idle_worst": min(vs_idle) if vs_idle else None,
                    "victim_vs_kernel_limit_median": median(victim_vs_base)
                    if victim_vs_base
                    else None,
                    "victim_vs_kernel_limit_worst": min(victim_vs_base) if victim_vs_base else None,
                    "backup_vs_kernel_limit_median": median(vs_base) if vs_base else None,
                    "backup_vs_kernel_limit_worst": min(vs_base) if vs_base else None,
                    "target_used_median": median(used) if used else None,
                    "target_used_worst": min(used) if used else None,
                    "backup_cache_left_mib_median": median(
                        [
                            c["cg_backup_cached_end_mib"]
                            for c in runs
                            if c.get("cg_backup_cached_end_mib") is not None
                        ]
                    ),
                    "stalled_in": stalled_in(runs),
                }
            )
    return rows


def stalled_in(runs: Sequence[dict]) -> dict[str, float]:
    """Seconds the neighbour's operations over 0.1 s spent in each kernel wait, over all
    repeats (bench.stall_stacks), most first."""
    total: dict[str, float] = defaultdict(float)
    for c in runs:
        for wait, seconds in (c.get("victim_stalled_in") or {}).items():
            total[wait] += seconds
    return dict(sorted(((w, round(s, 1)) for w, s in total.items()), key=lambda x: -x[1]))


def markdown(rows: Sequence[dict], baseline: str = "direct-bdi") -> str:
    def f(v: object, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    out = [
        "### The neighbour, every repeat (issue 15)",
        "",
        f"Worst over all repeats; ratios paired within a repeat (neighbour ops/s vs idle and vs "
        f"{baseline}, backup target MiB/s vs {baseline}), median and worst; the share of the "
        "throttled target's capacity the backup used until its data was durable; cache not the "
        "victim's left in the shared cgroup once the data is durable; where in the kernel the "
        "victim's operations over 0.1 s waited (its stack, sampled every 10 ms).",
        "",
        "| workload | arm | repeats | victim max ms (worst) | repeats with an op > 0.5 s | "
        "repeats with a second without ops | victim vs idle (median, worst) | victim vs "
        f"{baseline} (median, worst) | backup vs "
        f"{baseline} (median, worst) | target capacity used (median, worst) | "
        "backup cache left MiB (median) | where its slow operations waited (s, all repeats) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['workload']} | {r['arm']} | {r['repeats']} | "
            f"{f(r['victim_max_ms_worst'], '.0f')} | "
            f"{r['repeats_with_an_op_over_0.5s']} | {r['repeats_with_a_second_without_ops']} | "
            f"{f(r['victim_vs_idle_median'], '.3f')}, {f(r['victim_vs_idle_worst'], '.3f')} | "
            f"{f(r['victim_vs_kernel_limit_median'], '.3f')}, "
            f"{f(r['victim_vs_kernel_limit_worst'], '.3f')} | "
            f"{f(r['backup_vs_kernel_limit_median'], '.3f')}, "
            f"{f(r['backup_vs_kernel_limit_worst'], '.3f')} | "
            f"{f(r['target_used_median'], '.3f')}, {f(r['target_used_worst'], '.3f')} | "
            f"{f(r['backup_cache_left_mib_median'], '.0f')} | "
            f"{'; '.join(f'{w} {s}' for w, s in list(r['stalled_in'].items())[:3]) or '-'} |"
        )
    second_idles = [r for r in rows if r["arm"] != "idle" and is_idle(r["arm"])]
    if second_idles:
        names = ", ".join(sorted({r["arm"] for r in second_idles}))
        out += [
            "",
            f"{names}: a second run without a backup in every repeat; its ratio to idle is what "
            "this machine's noise alone does to the victim-vs-idle ratio.",
        ]
    return "\n".join(out)
