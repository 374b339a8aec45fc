"""Per-phase figures of a run with a rate schedule: ``python -m bench.phases RUN_DIR SCHEDULE``.

The summary table covers a whole run; a degrading target needs each phase on its own line
(device rate, peak Dirty+Writeback in the shared cgroup, fusethrottle's un-synced bytes, window
and fsync time, the neighbour's p99/max and the backup's worst write()). Reads the raw
samples.csv, victim.csv and writer.csv of RUN_DIR; prints a Markdown table.
"""

from __future__ import annotations

import argparse
import csv
import math
from collections import defaultdict
from pathlib import Path

from bench.plan import format_size, parse_schedule

MiB = 1 << 20


def _num(text: str | None) -> float | None:
    return float(text) if text not in ("", None) else None


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _read(path: Path) -> dict[str, list[dict[str, str]]]:
    rows: dict[str, list[dict[str, str]]] = defaultdict(list)
    with open(path) as f:
        for row in csv.DictReader(f):
            rows[row["cell"]].append(row)
    return rows


def phase_table(run: Path, schedule: str) -> str:
    phases, start = [], 0.0
    for step in parse_schedule(schedule):
        end = start + step.seconds
        label = "stall" if step.rate == 0 else f"{format_size(step.rate or 0)}/s"
        phases.append((label, start, end))
        start = end
    samples, victim, writer = (_read(run / n) for n in ("samples.csv", "victim.csv", "writer.csv"))
    lines = [
        "| arm | phase | device MiB/s | cgroup Dirty+WB peak MiB | ft un-synced peak MiB "
        "| ft window mean MiB | fsync mean s | neighbour p99 / max ms | backup worst write() s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for cell, rows in samples.items():
        arm = cell.split("-", 2)[-1].rsplit("-r", 1)[0]
        for label, a, b in phases:
            part = [r for r in rows if a <= float(r["t"]) < b]
            if len(part) < 2:
                continue
            first, last = _num(part[0]["absorbed"]), _num(part[-1]["absorbed"])
            span = float(part[-1]["t"]) - float(part[0]["t"])
            device = (
                (last - first) / span / MiB if first is not None and last is not None else math.nan
            )
            cgroup = max((_num(r["cg_dirty"]) or 0) + (_num(r["cg_writeback"]) or 0) for r in part)
            unsynced = [v for r in part if (v := _num(r["ft_unsynced"])) is not None]
            window = [v for r in part if (v := _num(r["ft_window"])) is not None]
            fsyncs = [(_num(r["ft_fsyncs"]), _num(r["ft_fsync_seconds"])) for r in part]
            fsyncs = [(n, s) for n, s in fsyncs if n is not None and s is not None]
            fsync_mean = "-"
            if len(fsyncs) > 1 and fsyncs[-1][0] > fsyncs[0][0]:
                mean = (fsyncs[-1][1] - fsyncs[0][1]) / (fsyncs[-1][0] - fsyncs[0][0])
                fsync_mean = f"{mean:.1f}"
            neighbour = [
                float(r["latency_s"]) * 1000 for r in victim[cell] if a <= float(r["t"]) < b
            ]
            worst = [float(r["max_s"] or 0) for r in writer[cell] if a <= float(r["t"]) < b]
            lines.append(
                f"| {arm} | {label} | {device:.1f} | {cgroup / MiB:.0f} "
                f"| {max(unsynced) / MiB if unsynced else math.nan:.0f} "
                f"| {sum(window) / len(window) / MiB if window else math.nan:.0f} | {fsync_mean} "
                f"| {_quantile(neighbour, 0.99):.1f} / {max(neighbour, default=math.nan):.0f} "
                f"| {max(worst) if worst else math.nan:.1f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.phases", description=__doc__)
    parser.add_argument("run", type=Path, help="a run directory written by python -m bench run")
    parser.add_argument("schedule", help='the rate schedule of that run, e.g. "20M:30s,1M:60s"')
    args = parser.parse_args(argv)
    print(phase_table(args.run, args.schedule))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
