"""Per-phase figures of a run with a rate schedule: ``python -m bench.phases RUN_DIR SCHEDULE``.

The summary table covers a whole run; a degrading target needs each phase on its own line
(device rate, how much of the phase the target had work queued, peak Dirty+Writeback in the
shared cgroup, fusethrottle's un-synced bytes, window and fsync p50/p99, the neighbour's p99/max,
how long stat and readdir on the mount took, and the backup's worst write()). Reads the raw
samples.csv, victim.csv, writer.csv and probe.csv of RUN_DIR; prints a Markdown table, one line
per arm, repeat and phase.

Then the bytes each arm put on the target while the schedule ran, against the reference arm
(``--reference``, direct-bdi) of the same repeat. The summary's "backup vs direct-bdi" divides
by the time until the data was durable, which after the schedule's end runs at its last (fast)
rate: an arm that kept more buffered drains more of it there and shows a higher rate for it.
Over the schedule itself both arms had the same target.
"""

from __future__ import annotations

import argparse
import csv
import math
from collections import defaultdict
from pathlib import Path

from bench.analysis import histogram_quantile
from bench.plan import format_size, parse_schedule
from bench.sampler import parse_buckets
from bench.stats import percentile

MiB = 1 << 20


def _num(text: str | None) -> float | None:
    return float(text) if text not in ("", None) else None


def _read(path: Path) -> dict[str, list[dict[str, str]]]:
    rows: dict[str, list[dict[str, str]]] = defaultdict(list)
    with open(path) as f:
        for row in csv.DictReader(f):
            rows[row["cell"]].append(row)
    return rows


def _slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope: a device counter that moves in big steps (the throttle hands out
    whole bios) would make a first-to-last difference swing by a step at either end."""
    if len(points) < 2:
        return math.nan
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    return sum((t - mt) * (v - mv) for t, v in points) / var if var > 0 else math.nan


def _fsync_quantiles(before: dict[float, float], after: dict[float, float]) -> str:
    """p50 / p99 (bucket upper bounds) of the fsyncs that completed between two scrapes."""
    delta = {le: count - before.get(le, 0.0) for le, count in after.items()}
    p50, p99 = histogram_quantile(delta, 0.5), histogram_quantile(delta, 0.99)
    if p50 is None or p99 is None:
        return "-"
    return f"{p50:g} / {p99:g}"


def _arm_label(cell: str) -> str:
    """``003-seq-ft-adaptive-r2`` -> ``ft-adaptive r2``; other workloads than seq are named."""
    parts = cell.split("-", 2)
    if len(parts) < 3:
        return cell
    _, workload, rest = parts
    arm, _, repeat = rest.rpartition("-r")
    if not arm or not repeat.isdigit():
        return cell
    return f"{arm} r{repeat}" + ("" if workload == "seq" else f" ({workload})")


def phase_table(run: Path, schedule: str) -> str:
    phases, start = [], 0.0
    for step in parse_schedule(schedule):
        end = start + step.seconds
        label = "stall" if step.rate == 0 else f"{format_size(step.rate or 0)}/s"
        phases.append((label, start, end))
        start = end
    names = ("samples.csv", "victim.csv", "writer.csv", "probe.csv")
    empty: dict[str, list[dict[str, str]]] = defaultdict(list)
    samples, victim, writer, probes = (
        _read(run / n) if (run / n).exists() else empty for n in names
    )
    lines = [
        "| arm | phase | device MiB/s | target busy % | cgroup Dirty+WB peak MiB "
        "| ft un-synced peak MiB | ft window mean MiB | fsync p50 / p99 s "
        "| neighbour p99 / max ms | stat / readdir max ms | backup worst write() s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cell, rows in samples.items():
        for label, a, b in phases:
            part = [r for r in rows if a <= float(r["t"]) < b]
            if len(part) < 2:
                continue
            counter = [(float(r["t"]), v) for r in part if (v := _num(r["absorbed"])) is not None]
            device = _slope(counter) / MiB
            # Work queued for the target: the shared cgroup's Dirty+Writeback (the backup's
            # pages; the host-wide figure also counts everything else on the host).
            queued = [(_num(r["cg_dirty"]) or 0) + (_num(r["cg_writeback"]) or 0) for r in part]
            busy = 100 * sum(1 for q in queued if q >= MiB) / len(queued)
            cgroup = max((_num(r["cg_dirty"]) or 0) + (_num(r["cg_writeback"]) or 0) for r in part)
            unsynced = [v for r in part if (v := _num(r["ft_unsynced"])) is not None]
            window = [v for r in part if (v := _num(r["ft_window"])) is not None]
            before = [r for r in rows if float(r["t"]) < a and r.get("ft_fsync_buckets")]
            inside = [r for r in part if r.get("ft_fsync_buckets")]
            fsync = "-"
            if inside:
                fsync = _fsync_quantiles(
                    parse_buckets(before[-1]["ft_fsync_buckets"] if before else None),
                    parse_buckets(inside[-1]["ft_fsync_buckets"]),
                )
            neighbour = sorted(
                float(r["latency_s"]) * 1000 for r in victim[cell] if a <= float(r["t"]) < b
            )
            probe = {
                op: max(
                    (
                        float(r["latency_s"]) * 1000
                        for r in probes[cell]
                        if r["op"] == op and a <= float(r["t"]) < b
                    ),
                    default=math.nan,
                )
                for op in ("stat", "readdir")
            }
            worst = [float(r["max_s"] or 0) for r in writer[cell] if a <= float(r["t"]) < b]
            lines.append(
                f"| {_arm_label(cell)} | {label} | {device:.2f} | {busy:.0f} | {cgroup / MiB:.0f} "
                f"| {max(unsynced) / MiB if unsynced else math.nan:.0f} "
                f"| {sum(window) / len(window) / MiB if window else math.nan:.0f} | {fsync} "
                f"| {percentile(neighbour, 99):.1f} / {max(neighbour, default=math.nan):.0f} "
                f"| {probe['stat']:.0f} / {probe['readdir']:.0f} "
                f"| {max(worst) if worst else math.nan:.1f} |"
            )
    return "\n".join(lines)


def _counter_at(rows: list[dict[str, str]], t: float) -> float | None:
    """The absorbed-bytes counter at *t* (linear between the two samples around it)."""
    points = [(float(r["t"]), v) for r in rows if (v := _num(r["absorbed"])) is not None]
    before = [p for p in points if p[0] <= t]
    after = [p for p in points if p[0] >= t]
    if not before or not after:
        return None
    (t0, v0), (t1, v1) = before[-1], after[0]
    return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)


def schedule_bytes(run: Path, schedule: str, reference: str = "direct-bdi") -> str:
    """Bytes on the target between the schedule's start and end, per arm and repeat, and
    against *reference* in the same repeat: the backup's speed with the same target."""
    end = sum(step.seconds for step in parse_schedule(schedule))
    samples = _read(run / "samples.csv") if (run / "samples.csv").exists() else {}
    on_target: dict[str, dict[str, float]] = defaultdict(dict)  # arm -> repeat -> bytes
    for cell, rows in samples.items():
        first, last = _counter_at(rows, 0.0), _counter_at(rows, end)
        if first is None or last is None:
            continue
        arm, _, repeat = _arm_label(cell).rpartition(" r")
        on_target[arm][repeat] = last - first
    lines = [
        f"| arm | MiB on the target in the schedule's {end:g} s, each repeat "
        f"| vs {reference} of the same repeat (median, worst) |",
        "|---|---|---|",
    ]
    base = on_target.get(reference, {})
    for arm, repeats in on_target.items():
        if max(repeats.values()) < MiB:
            continue  # the idle arm: no backup
        order = sorted(repeats, key=int)
        ratios = sorted(repeats[r] / base[r] for r in order if base.get(r))
        vs = (
            f"{percentile(ratios, 50):.3f}, {ratios[0]:.3f}" if ratios and arm != reference else "-"
        )
        each = " ".join(f"{repeats[r] / MiB:.0f}" for r in order)
        lines.append(f"| {arm} | {each} | {vs} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.phases", description=__doc__)
    parser.add_argument("run", type=Path, help="a run directory written by python -m bench run")
    parser.add_argument("schedule", help='the rate schedule of that run, e.g. "20M:30s,1M:60s"')
    parser.add_argument(
        "--reference", default="direct-bdi", help="the arm the bytes are compared with"
    )
    args = parser.parse_args(argv)
    print(phase_table(args.run, args.schedule))
    print()
    print(schedule_bytes(args.run, args.schedule, args.reference))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
