"""``python -m bench.brief DIR``: a run in a few lines, for people who have not read the bench.

One row per arm (medians over repeats): how fast the backup was written and how long until it was
on the target, the host's Dirty+Writeback peak (page cache the backup held), and the neighbour's
fdatasync latency. The quick start prints this after its run.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bench.plan import is_idle
from bench.results import read_cells
from bench.stats import median

_ARM_NAMES = {
    "direct": "backup written directly",
    "direct-bdi": "directly, kernel per-device limit",
    "ft-adaptive": "through fusethrottle",
}


def _value(cells: list[dict], key: str) -> float | None:
    values = [c[key] for c in cells if isinstance(c.get(key), (int, float))]
    return median(values) if values else None


def _fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def brief(run: Path) -> str:
    cells = [
        c for c in read_cells(run) if c.get("status") == "ok" and not is_idle(c.get("arm", ""))
    ]
    if not cells:
        raise ValueError(f"{run}: no completed arm to show")
    arms = list(dict.fromkeys(c["arm"] for c in cells))
    rows = [
        "| | backup write MiB/s | on the target after s | host Dirty+Writeback peak MiB "
        "| neighbour fdatasync p99 ms | neighbour worst ms |",
        "|---|---|---|---|---|---|",
    ]
    for arm in arms:
        mine = [c for c in cells if c["arm"] == arm]
        rows.append(
            f"| {_ARM_NAMES.get(arm, arm)} | {_fmt(_value(mine, 'app_mibps'), 1)} "
            f"| {_fmt(_value(mine, 'durable_s'), 1)} | {_fmt(_value(mine, 'dirty_wb_peak_mib'))} "
            f"| {_fmt(_value(mine, 'victim_p99_ms'), 1)} | {_fmt(_value(mine, 'victim_max_ms'))} |"
        )
    verified = [c.get("verified") for c in cells]
    if all(v is True for v in verified):
        rows.extend(["", "every byte of every backup was read back from the target and verified"])
    elif any(v is False for v in verified):
        failed = "VERIFICATION FAILED: a backup on the target differs from what was written"
        rows.extend(["", failed])
    plots = sorted(run.glob("plot-*.png"))
    if plots:
        rows.append("")
        rows.extend(f"plot: {p}" for p in plots)
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m bench.brief RUN_DIR", file=sys.stderr)
        return 2
    try:
        print(brief(Path(args[0])))
    except (OSError, ValueError) as err:
        print(f"bench.brief: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
