"""``python -m bench.brief DIR``: a run in a few lines, for people who have not read the bench.

One row per arm (over repeats: the worst of the database's waits, the median of the rest): the
database neighbour's worst transaction, the seconds in which it finished none, its transactions per
second, the backup's bytes on the target while the target's rate schedule ran, and the pages
waiting to be written in the memory cgroup they share. Then what the run shows, in sentences
computed from these numbers (bench.verdict), never a fixed text. The quick start prints this.
"""

from __future__ import annotations

import csv
import math
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

from bench.plan import MiB, PlanError, is_idle, parse_schedule, schedule_seconds
from bench.results import read_cells
from bench.stats import median
from bench.verdict import ArmNumbers, verdict

WIDTH = 100  # the verdict's sentences, wrapped for a terminal

_ARM_NAMES = {
    "direct": "backup written directly",
    "direct-bdi": "directly, kernel per-device limit",
    "ft-adaptive": "through fusethrottle",
}


def _value(cells: list[dict], key: str) -> float | None:
    values = [c[key] for c in cells if isinstance(c.get(key), (int, float))]
    return median(values) if values else None


def _worst(cells: list[dict], key: str) -> float | None:
    values = [c[key] for c in cells if isinstance(c.get(key), (int, float))]
    return max(values) if values else None


def _fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def schedule_length(cells: list[dict]) -> float | None:
    """How long the target's rate schedule ran (None: no schedule, or one without an end)."""
    for c in cells:
        if c.get("schedule"):
            try:
                seconds = schedule_seconds(parse_schedule(c["schedule"]))
            except PlanError:
                return None
            return seconds if math.isfinite(seconds) and seconds > 0 else None
    return None


def on_target_mib(run: Path, seconds: float) -> dict[str, float]:
    """MiB each cell's backup put on the target between the schedule's start and its end, from
    the device counter in samples.csv (linear between the samples around each instant)."""
    path = run / "samples.csv"
    if not path.exists():
        return {}
    points: dict[str, list[tuple[float, float]]] = defaultdict(list)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row.get("absorbed"):
                points[row["cell"]].append((float(row["t"]), float(row["absorbed"])))
    out = {}
    for cell, pts in points.items():
        start, end = _at(pts, 0.0), _at(pts, seconds)
        if start is not None and end is not None:
            out[cell] = (end - start) / MiB
    return out


def _at(points: list[tuple[float, float]], t: float) -> float | None:
    before = [p for p in points if p[0] <= t]
    after = [p for p in points if p[0] >= t]
    if not before or not after:
        return None
    (t0, v0), (t1, v1) = before[-1], after[0]
    return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)


def _numbers(cells: list[dict], on_target: dict[str, float]) -> ArmNumbers | None:
    """An arm's numbers for the verdict (None: its neighbour was not measured)."""
    worst = _worst(cells, "victim_max_ms")
    if worst is None:
        return None
    backup = [on_target[c["cell"]] for c in cells if c.get("cell") in on_target]
    return ArmNumbers(
        worst_ms=worst,
        dead_seconds=int(_worst(cells, "victim_dead_seconds") or 0),
        ops_per_s=_value(cells, "victim_ops_per_s"),
        backup_mib=median(backup) if backup else None,
        cgroup_dirty_peak_mib=_worst(cells, "cg_dirty_wb_peak_mib"),
    )


def brief(run: Path) -> str:
    cells = [
        c for c in read_cells(run) if c.get("status") == "ok" and not is_idle(c.get("arm", ""))
    ]
    if not cells:
        raise ValueError(f"{run}: no completed arm to show")
    seconds = schedule_length(cells)
    on_target = on_target_mib(run, seconds) if seconds else {}
    arms = list(dict.fromkeys(c["arm"] for c in cells))
    backup_head = (
        f"backup MiB on the target in the {seconds:g} s" if seconds else "on the target after s"
    )
    rows = [
        "| | database's worst transaction ms | seconds it finished none | transactions/s "
        f"| {backup_head} | cgroup Dirty+Writeback peak MiB |",
        "|---|---|---|---|---|---|",
    ]
    numbers: dict[str, ArmNumbers | None] = {}
    for arm in arms:
        mine = [c for c in cells if c["arm"] == arm]
        numbers[arm] = n = _numbers(mine, on_target)
        backup = (
            _fmt(n.backup_mib if n else None) if seconds else _fmt(_value(mine, "durable_s"), 1)
        )
        rows.append(
            f"| {_ARM_NAMES.get(arm, arm)} | {_fmt(_worst(mine, 'victim_max_ms'))} "
            f"| {_fmt(_worst(mine, 'victim_dead_seconds'))} "
            f"| {_fmt(_value(mine, 'victim_ops_per_s'), 1)} | {backup} "
            f"| {_fmt(_worst(mine, 'cg_dirty_wb_peak_mib'))} |"
        )
    direct = numbers.get("direct")
    through = next((numbers[a] for a in arms if a.startswith("ft-")), None)
    if direct is not None and through is not None:
        rows.append("")
        for line in verdict(direct, through, seconds):
            rows.extend(textwrap.wrap(line, WIDTH))
    verified = [c.get("verified") for c in cells]
    if all(v is True for v in verified):
        rows.extend(["", "Every byte of every backup was read back from the target and verified."])
    elif any(v is False for v in verified):
        failed = "VERIFICATION FAILED: a backup on the target differs from what was written."
        rows.extend(["", failed])
    plots = sorted(run.glob("plot-*.png"))
    if plots:
        rows.append("")
        rows.extend(f"plot: {p}" for p in plots)
    return "\n".join(rows)


def incomplete(run: Path) -> list[str]:
    """One line for each arm that did not complete (failed or skipped), with its reason: a
    table without it must not pass for the demo's result."""
    return [
        f"{_ARM_NAMES.get(c.get('arm', ''), c.get('arm', '?'))}: {c.get('status')}"
        f" ({c.get('reason') or 'no reason recorded'})"
        for c in read_cells(run)
        if c.get("status") != "ok" and not is_idle(c.get("arm", ""))
    ]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m bench.brief RUN_DIR", file=sys.stderr)
        return 2
    try:
        print(brief(Path(args[0])))
        missing = incomplete(Path(args[0]))
    except (OSError, ValueError) as err:
        print(f"bench.brief: {err}", file=sys.stderr)
        return 1
    for line in missing:
        print(f"bench.brief: not completed: {line}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
