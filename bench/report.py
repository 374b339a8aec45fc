"""From a run directory's raw files to summary.json, summary.md, the plots and the console table.

Works on the files alone (``python -m bench report DIR`` redoes it), so a crashed or interrupted
run still gets a report of what it measured. Repeats become median (min-max); skipped and failed
arms stay in the tables with their reason — a run is never dropped.
"""

from __future__ import annotations

import json
import logging
import math
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench import neighbour, sidebyside
from bench.plan import is_idle
from bench.results import dump_json, read_cells, read_csv, save_png
from bench.stats import distinct, finite, median

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Metric:
    key: str
    header: str
    fmt: str
    better: str  # "high", "low" or "" (no direction)


METRICS = (
    Metric("app_mibps", "app MiB/s", ".1f", "high"),
    Metric("target_mibps", "target MiB/s", ".1f", "high"),
    Metric("durable_s", "durable s", ".1f", "low"),
    Metric("dirty_wb_peak_mib", "Dirty+WB peak MiB", ".0f", "low"),
    Metric("cg_dirty_wb_peak_mib", "cgroup Dirty+WB peak MiB", ".0f", "low"),
    Metric("write_p99_ms", "backup write p99 ms", ".1f", "low"),
    Metric("write_max_ms", "backup write max ms", ".0f", "low"),
    Metric("writes_over_1s", "backup writes > 1 s", ".0f", "low"),
    Metric("writer_fsync_max_ms", "backup's own fsync max ms", ".0f", "low"),
    Metric("victim_p50_ms", "victim p50 ms", ".1f", "low"),
    Metric("victim_p99_ms", "victim p99 ms", ".1f", "low"),
    Metric("victim_max_ms", "victim max ms", ".0f", "low"),
    Metric("victim_ops_per_s", "victim ops/s", ".0f", "high"),
    Metric("victim_over_500ms", "victim ops > 0.5 s", ".0f", "low"),
    Metric("victim_dead_seconds", "victim seconds without an op", ".0f", "low"),
    Metric("victim_longest_gap_ms", "victim longest gap ms", ".0f", "low"),
    Metric("dirty_peak_mib", "Dirty peak MiB", ".0f", "low"),
    Metric("writeback_peak_mib", "Writeback peak MiB", ".0f", "low"),
    Metric("cg_dirty_peak_mib", "cgroup Dirty peak MiB", ".0f", "low"),
    Metric("cg_writeback_peak_mib", "cgroup Writeback peak MiB", ".0f", "low"),
    Metric("cg_backup_cached_peak_mib", "cgroup cache not the victim's, peak MiB", ".0f", "low"),
    Metric(
        "cg_backup_cached_end_mib", "cgroup cache not the victim's, at the end MiB", ".0f", "low"
    ),
    Metric("victim_cached_min_mib", "victim's files cached, min MiB", ".0f", "high"),
    Metric("target_cached_end_mib", "backup's files cached on the target, end MiB", ".0f", "low"),
    Metric("ft_unsynced_peak_mib", "ft unsynced peak MiB", ".0f", "low"),
    Metric("ft_window_mean_mib", "ft window mean MiB", ".0f", ""),
    Metric("ft_fsync_mean_ms", "ft fsync mean ms", ".0f", "low"),
    Metric("ft_fsync_p99_le_ms", "ft fsync p99 bucket ms", ".0f", "low"),
    Metric("cpu_s_per_gib", "CPU-s/GiB", ".2f", "low"),
    Metric("wl_create_s", "create s", ".2f", "low"),
    Metric("wl_ls_s", "ls -lR s", ".2f", "low"),  # runs before the cold/warm split
    Metric("wl_ls_cold_s", "ls -lR cold s", ".2f", "low"),
    Metric("wl_ls_warm_s", "ls -lR warm s", ".2f", "low"),
    Metric("wl_stat_cold_s", "stat cold s", ".2f", "low"),
    Metric("wl_stat_warm_s", "stat warm s", ".2f", "low"),
    Metric("wl_rm_s", "rm -rf s", ".2f", "low"),
    Metric("wl_prepare_s", "write before read s", ".2f", ""),
    Metric("absorbed_ratio", "absorbed/written", ".2f", ""),
    Metric("load1_start", "load1", ".2f", ""),
)
# What the console shows as a ratio against the direct arm.
RATIO_KEYS = ("app_mibps", "target_mibps", "dirty_wb_peak_mib", "victim_max_ms", "cpu_s_per_gib")


def _applies(key: str, cell: dict) -> bool:
    """A writer that never called fsync has no fsync latency (not a latency of 0)."""
    return key != "writer_fsync_max_ms" or bool(cell.get("writer_fsyncs"))


def aggregate(cells: Sequence[dict]) -> list[dict]:
    """One entry per (target, workload, arm): counts, reasons, and median/min/max per metric."""
    groups: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for c in cells:
        groups[(c["target"], c["workload"], c["arm"])].append(c)
    arms = distinct(cells, "arm")
    out = []
    for target in distinct(cells, "target"):
        for workload in distinct(cells, "workload"):
            for arm in arms:
                runs = groups.get((target, workload, arm))
                if not runs:
                    continue
                ok = [r for r in runs if r["status"] == "ok"]
                entry: dict = {
                    "target": target,
                    "workload": workload,
                    "arm": arm,
                    "runs": len(runs),
                    "ok": len(ok),
                    "skipped": sum(r["status"] == "skipped" for r in runs),
                    "failed": sum(r["status"] == "failed" for r in runs),
                    "reasons": sorted({r["reason"] for r in runs if r.get("reason")}),
                    "metrics": {},
                }
                for m in METRICS:
                    vals = finite([r.get(m.key) for r in ok if _applies(m.key, r)])
                    if vals:
                        entry["metrics"][m.key] = {
                            "median": median(vals),
                            "min": min(vals),
                            "max": max(vals),
                            "values": vals,
                        }
                out.append(entry)
    return out


def ratios(groups: Sequence[dict]) -> list[dict]:
    """Each arm's medians divided by the direct arm's, per (target, workload)."""
    base = {
        (g["target"], g["workload"]): g["metrics"]
        for g in groups
        if g["arm"] == "direct" and g["ok"]
    }
    out = []
    for g in groups:
        ref = base.get((g["target"], g["workload"]))
        if not ref or not g["ok"]:
            continue
        row = {"target": g["target"], "workload": g["workload"], "arm": g["arm"]}
        for key in RATIO_KEYS:
            if key in g["metrics"] and key in ref and ref[key]["median"]:
                row[key] = g["metrics"][key]["median"] / ref[key]["median"]
        out.append(row)
    return out


def _cell_text(stat: dict | None, fmt: str) -> str:
    if stat is None:
        return "-"
    med = format(stat["median"], fmt)
    if len(stat["values"]) > 1:
        return f"{med} ({format(stat['min'], fmt)}-{format(stat['max'], fmt)})"
    return med


def _sections(groups: Sequence[dict]) -> Iterator[tuple[str, str, list[dict]]]:
    """(target, workload, its groups) in report order, skipping empty combinations."""
    for target in distinct(groups, "target"):
        for workload in distinct(groups, "workload"):
            rows = [g for g in groups if g["target"] == target and g["workload"] == workload]
            if rows:
                yield target, workload, rows


def markdown_tables(groups: Sequence[dict]) -> str:
    """One Markdown table per (target, workload), showing only the columns that have data."""
    parts = []
    for target, workload, rows in _sections(groups):
        metrics = [m for m in METRICS if any(m.key in g["metrics"] for g in rows)]
        parts.append(f"### {workload} on {target}\n")
        header = ["arm", "runs", *[m.header for m in metrics]]
        parts.append("| " + " | ".join(header) + " |")
        parts.append("|" + "---|" * len(header))
        for g in rows:
            if not g["ok"]:
                status = "skipped" if g["skipped"] else "failed"
                why = "; ".join(g["reasons"]).replace("|", "/")
                cells = [f"{status}: {why}"] + [""] * (len(metrics) - 1)
                parts.append(f"| {g['arm']} | 0/{g['runs']} | " + " | ".join(cells) + " |")
                continue
            runs = f"{g['ok']}/{g['runs']}"
            cells = [_cell_text(g["metrics"].get(m.key), m.fmt) for m in metrics]
            parts.append(f"| {g['arm']} | {runs} | " + " | ".join(cells) + " |")
        reasons = [
            f"{g['arm']}: {'; '.join(g['reasons'])}" for g in rows if g["ok"] and g["reasons"]
        ]
        if reasons:
            parts.append("\nSome repeats did not complete: " + " / ".join(reasons))
        parts.append("")
    return "\n".join(parts)


def console_table(groups: Sequence[dict]) -> str:
    """Plain-text summary with ratios against direct, for the terminal."""
    rat = {(r["target"], r["workload"], r["arm"]): r for r in ratios(groups)}
    keys = [
        ("app_mibps", "app MiB/s", ".1f"),
        ("target_mibps", "target MiB/s", ".1f"),
        ("dirty_wb_peak_mib", "Dirty+WB MiB", ".0f"),
        ("cg_dirty_wb_peak_mib", "cgroup D+WB MiB", ".0f"),
        ("write_max_ms", "write max ms", ".0f"),
        ("victim_p99_ms", "victim p99", ".1f"),
        ("victim_max_ms", "victim max ms", ".0f"),
        ("cpu_s_per_gib", "CPU-s/GiB", ".2f"),
        ("wl_create_s", "create s", ".2f"),
        ("wl_ls_s", "ls -lR s", ".2f"),
    ]
    lines = []
    for target, workload, rows in _sections(groups):
        used = [k for k in keys if any(k[0] in g["metrics"] for g in rows)]
        lines.append(f"{workload} on {target}  (x = ratio to direct)")
        table = [["arm", *[h for _, h, _ in used]]]
        notes: dict[int, str] = {}  # row index -> why it has no numbers
        for g in rows:
            if not g["ok"]:
                why = "; ".join(g["reasons"])
                notes[len(table)] = f"{'skipped' if g['skipped'] else 'failed'}: {why}"
                table.append([g["arm"]])
                continue
            r = rat.get((target, workload, g["arm"]), {})
            row = [g["arm"]]
            for key, _, fmt in used:
                stat = g["metrics"].get(key)
                text = "-" if stat is None else format(stat["median"], fmt)
                if key in r and g["arm"] != "direct":
                    text += f" ({r[key]:.2f}x)"
                row.append(text)
            table.append(row)
        full = [line for i, line in enumerate(table) if i not in notes]
        widths = [max(len(line[i]) for line in full) for i in range(len(table[0]))]
        widths[0] = max(len(line[0]) for line in table)
        for i, line in enumerate(table):
            if i in notes:
                lines.append(f"  {line[0]:<{widths[0]}}  {notes[i]}")
            else:
                cells = zip(line, widths, strict=False)
                lines.append("  " + "  ".join(f"{c:<{w}}" for c, w in cells))
        lines.append("")
    return "\n".join(lines)


# --- plots ---------------------------------------------------------------------------------------


def _series(rows: list[dict[str, str]], x: str, y: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in rows:
        if r.get(x) and r.get(y):
            xs.append(float(r[x]))
            ys.append(float(r[y]))
    return xs, ys


def _rate(xs: list[float], ys: list[float], window: float = 1.0) -> tuple[list[float], list[float]]:
    """MiB/s from a cumulative byte counter, over a sliding window (counter resets ignored)."""
    out_x, out_y = [], []
    j = 0
    for i in range(len(xs)):
        while xs[i] - xs[j] > window:
            j += 1
        if i > j and xs[i] > xs[j]:
            out_x.append(xs[i])
            out_y.append(max(0.0, ys[i] - ys[j]) / (xs[i] - xs[j]) / 2**20)
    return out_x, out_y


def _bucket_max(points: list[tuple[float, float]], width: float) -> tuple[list[float], list[float]]:
    buckets: dict[int, float] = {}
    for t, v in points:
        k = math.floor(t / width)
        buckets[k] = max(buckets.get(k, 0.0), v)
    keys = sorted(buckets)
    return [k * width for k in keys], [buckets[k] for k in keys]


def plot_groups(out: Path, cells: Sequence[dict]) -> list[Path]:
    """One PNG per (target, workload): arms overlaid, first repeat bold, others faint."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
        from matplotlib.ticker import FuncFormatter, NullFormatter
    except ImportError:
        log.warning("matplotlib is not installed: no plots")
        return []
    samples = defaultdict(list)
    for r in read_csv(out / "samples.csv"):
        samples[r["cell"]].append(r)
    victim = defaultdict(list)
    for r in read_csv(out / "victim.csv"):
        victim[r["cell"]].append((float(r["t"]), float(r["latency_s"]) * 1e3))
    writer = defaultdict(list)
    for r in read_csv(out / "writer.csv"):
        writer[r["cell"]].append(r)
    probes = defaultdict(list)
    if (out / "probe.csv").exists():
        for r in read_csv(out / "probe.csv"):
            probes[r["cell"]].append((float(r["t"]), float(r["latency_s"]) * 1e3))

    arms = distinct(cells, "arm")
    colors = {a: f"C{i % 10}" for i, a in enumerate(arms)}
    made = []
    ok = [c for c in cells if c["status"] == "ok"]
    for target in distinct(ok, "target"):
        for workload in distinct(ok, "workload"):
            group = [c for c in ok if c["target"] == target and c["workload"] == workload]
            if not group:
                continue
            panels = _panels(group, samples, victim, writer, probes)
            if not panels:
                continue
            fig, axes = plt.subplots(len(panels), 1, figsize=(11, 2.6 * len(panels)), sharex=True)
            axes = [axes] if len(panels) == 1 else list(axes)
            for ax, (title, ylabel, logy, lines) in zip(axes, panels, strict=True):
                for cell, xs, ys, style in lines:
                    first = cell["repeat"] == 1
                    ax.plot(
                        xs,
                        ys,
                        style,
                        color=colors[cell["arm"]],
                        lw=1.4 if first else 0.7,
                        alpha=1.0 if first else 0.35,
                        ms=5 if style == "." else 2,
                    )
                ax.set_title(title, fontsize=10, loc="left")
                ax.set_ylabel(ylabel)
                if logy:
                    ax.set_yscale("log")
                    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                    ax.yaxis.set_minor_formatter(NullFormatter())
                ax.grid(alpha=0.3)
            limit = _rate_limit_line(group[0].get("schedule"), axes[0].get_xlim()[1])
            if limit:
                axes[0].plot(*limit, color="0.4", lw=1, ls="--", drawstyle="steps-post")
            shown = distinct(group, "arm")
            handles = [Line2D([], [], color=colors[a], lw=1.6, label=a) for a in shown]
            fig.legend(handles=handles, loc="upper right", ncol=min(7, len(shown)), fontsize=8)
            axes[-1].set_xlabel("seconds since the backup started")
            fig.suptitle(f"{workload} on {target}", fontsize=12, x=0.01, ha="left")
            fig.tight_layout(rect=(0, 0, 1, 0.97))
            safe = "".join(ch if ch.isalnum() else "-" for ch in f"{target}-{workload}")
            path = out / f"plot-{safe}.png"
            save_png(fig, path)
            plt.close(fig)
            made.append(path)
    return made


def _rate_limit_line(schedule: str | None, x_end: float) -> tuple[list, list] | None:
    """The configured write rate of the loop target over time, for the first panel."""
    from bench.plan import parse_schedule

    if not schedule:
        return None
    xs: list[float] = []
    ys: list[float] = []
    t = 0.0
    for step in parse_schedule(schedule):
        if step.rate is None:
            return None if not xs else ([*xs, x_end], [*ys, ys[-1]])
        xs.append(t)
        ys.append(step.rate / 2**20)
        if math.isinf(step.seconds):
            break
        t += step.seconds
    return [*xs, max(x_end, t)], [*ys, ys[-1]]


def _fsync_means(rows: list[dict[str, str]]) -> tuple[list[float], list[float]]:
    """Mean latency (ms) of the fsyncs that completed in each sample interval, from the
    cumulative count and sum fusethrottle exports; nothing where none completed."""
    xs, ys = [], []
    last: tuple[float, float] | None = None
    for r in rows:
        if not (r.get("ft_fsyncs") and r.get("ft_fsync_seconds")):
            continue
        count, total = float(r["ft_fsyncs"]), float(r["ft_fsync_seconds"])
        if last is not None and count > last[0]:
            xs.append(float(r["t"]))
            ys.append((total - last[1]) / (count - last[0]) * 1e3)
        last = (count, total)
    return xs, ys


def _completions_per_second(ops: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """Operations (t, latency ms) completed in each whole second; zero where none did."""
    done = [t + lat / 1e3 for t, lat in ops]
    if not done:
        return [], []
    first, last = math.floor(min(done)), math.floor(max(done))
    counts = [0] * (last - first + 1)
    for t in done:
        counts[math.floor(t) - first] += 1
    return [first + k + 0.5 for k in range(len(counts))], [float(c) for c in counts]


def _panels(
    group: list[dict], samples: dict, victim: dict, writer: dict, probes: dict | None = None
) -> list[tuple]:
    absorbed, app, dirty, ft, fsync, vic, meta, wlat = [], [], [], [], [], [], [], []
    ops, cache, wb = [], [], []
    for cell in group:
        rows = samples.get(cell["cell"], [])
        xf, yf = _fsync_means(rows)
        if xf:
            fsync.append((cell, xf, yf, "."))
        if probes and probes.get(cell["cell"]):
            meta.append((cell, *_bucket_max(probes[cell["cell"]], 0.25), "-"))
        xs, ys = _series(rows, "t", "absorbed")
        if xs and not is_idle(cell["arm"]):
            absorbed.append((cell, *_rate(xs, ys, window=2.0), "-"))
        # wchar of the writer at every tick: continuous, so a stalled write() shows as a dip
        # (the writer's own log has no line while it is stuck).
        xs, ys = _series(rows, "t", "app_written")
        if xs and not is_idle(cell["arm"]):
            app.append((cell, *_rate(xs, ys), "-"))
        xd, yd = _series(rows, "t", "dirty")
        xw, yw = _series(rows, "t", "writeback")
        if xd and len(xd) == len(xw):
            dirty.append((cell, xd, [(a + b) / 2**20 for a, b in zip(yd, yw, strict=True)], "-"))
        xc, yc = _series(rows, "t", "cg_dirty")
        xcw, ycw = _series(rows, "t", "cg_writeback")
        if xc and len(xc) == len(xcw):
            dirty.append((cell, xc, [(a + b) / 2**20 for a, b in zip(yc, ycw, strict=True)], ":"))
        xu, yu = _series(rows, "t", "ft_unsynced")
        if xu:
            ft.append((cell, xu, [v / 2**20 for v in yu], "-"))
        xwin, ywin = _series(rows, "t", "ft_window")
        if xwin:
            ft.append((cell, xwin, [v / 2**20 for v in ywin], "--"))
        if victim.get(cell["cell"]):
            vic.append((cell, *_bucket_max(victim[cell["cell"]], 0.25), "-"))
            ops.append((cell, *_completions_per_second(victim[cell["cell"]]), "-"))
        xcc, ycc = _series(rows, "t", "cg_cache")
        xv, yv = _series(rows, "t", "victim_cached")
        if xcc and len(xcc) == len(xv):
            cache.append(
                (cell, xcc, [max(0, a - b) / 2**20 for a, b in zip(ycc, yv, strict=True)], "-")
            )
            cache.append((cell, xv, [v / 2**20 for v in yv], "--"))
        if xcw and not is_idle(cell["arm"]):
            wb.append((cell, xcw, [v / 2**20 for v in ycw], "-"))
        lat = [
            (float(r["t"]), float(r["max_s"]) * 1e3)
            for r in writer.get(cell["cell"], [])
            if r.get("max_s")
        ]
        if lat:
            # Markers, not a line: a write() stuck for 10 s logs nothing until it returns, and a
            # line would draw a slope across the gap. Each dot is placed when the write returned.
            wlat.append((cell, *_bucket_max(lat, 0.25), "."))
    specs = [
        (absorbed, "what the target absorbed (device writes; dashed: its rate limit)", "MiB/s", 0),
        (app, "what the backup wrote (write() returns)", "MiB/s", 0),
        (dirty, "Dirty+Writeback, host (solid) and shared cgroup (dotted)", "MiB", 0),
        (ft, "fusethrottle un-synced (solid) and window (dashed)", "MiB", 0),
        (fsync, "fsync latency (mean of the fsyncs completing per 250 ms)", "ms", 1),
        (vic, "neighbour's worst operation per 250 ms", "ms", 1),
        (ops, "neighbour's operations completed per second", "ops/s", 0),
        (
            cache,
            "shared cgroup's page cache: not the victim's (solid), the victim's files (dashed)",
            "MiB",
            0,
        ),
        (wb, "shared cgroup's pages under writeback", "MiB", 0),
        (meta, "stat / readdir on the mount (or target), worst per 250 ms", "ms", 1),
        (wlat, "backup's worst write() per 250 ms (at the time it returned)", "ms", 1),
    ]
    # (title, unit, log scale, lines) for every panel that has something to draw
    return [(title, unit, bool(logy), lines) for lines, title, unit, logy in specs if lines]


# --- entry point -------------------------------------------------------------------------------


def build(out: Path, plots: bool = True) -> tuple[dict, str]:
    """Write summary.json, summary.md and plots; return the summary and the console text."""
    cells = read_cells(out)
    run = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else {}
    groups = aggregate(cells)
    side = sidebyside.build(cells)
    verdicts = neighbour.verdicts(cells)
    summary = {
        "run": run,
        "groups": groups,
        "ratios_vs_direct": ratios(groups),
        "side_by_side": side,
        "neighbour": verdicts,
    }
    dump_json(out / "summary.json", summary)
    made = plot_groups(out, cells) if plots else []
    side_plots = sidebyside.plot(out, side) if plots and side else []
    md = [f"# fusethrottle bench: {run.get('preset', '?')} ({run.get('scale', '?')})", ""]
    if run.get("command"):
        md += ["Command:", "", "```", run["command"], "```", ""]
    machine = run.get("machine_start", {})
    if machine:
        md.append(
            f"Machine: {machine.get('cpus')} CPUs, {machine.get('mem_total_mib')} MiB, kernel "
            f"{machine.get('kernel')}; load at start {machine.get('loadavg')}, at end "
            f"{run.get('machine_end', {}).get('loadavg', '?')}. "
            f"Started {run.get('started_at', '?')}, finished {run.get('finished_at', '?')}."
        )
        md.append("")
    for t in run.get("targets", []):
        md.append(
            f"Target {t.get('label')}: {t.get('description')}; absorbed = {t.get('absorbed')}."
        )
    plan = run.get("plan", {})
    if plan:
        md.append(
            f"Victim: {plan.get('victim')} every {plan.get('victim_interval')} s; shared memory "
            f"cgroup: {plan.get('cgroup_mem_mib') or 'none'} MiB"
            f"{' (daemon inside it)' if plan.get('daemon_in_cgroup') else ''}; "
            f"fusethrottle options: {plan.get('ft_options') or '(the daemon defaults)'}"
            f"{'' if plan.get('metrics', True) else ', metrics not scraped'}; "
            f"repeats: {plan.get('repeats')}."
        )
    if side:
        md += ["", sidebyside.markdown(side, cells, run)]
        md += [f"![{path.stem}]({path.name})" for path in side_plots]
        md += ["", "## Every arm, every number", ""]
    if verdicts:
        md += ["", neighbour.markdown(verdicts), ""]
    md += ["", "Values are medians over repeats, (min-max) when there were several.", ""]
    md.append(markdown_tables(groups))
    rat = ratios(groups)
    if rat:
        md += ["### Ratios to direct (medians)", ""]
        md.append("| workload | target | arm | " + " | ".join(RATIO_KEYS) + " |")
        md.append("|" + "---|" * (3 + len(RATIO_KEYS)))
        for r in rat:
            vals = [f"{r[k]:.2f}" if k in r else "-" for k in RATIO_KEYS]
            md.append(
                f"| {r['workload']} | {r['target']} | {r['arm']} | " + " | ".join(vals) + " |"
            )
        md.append("")
    for path in made:
        md.append(f"![{path.stem}]({path.name})")
    # A rate that changes over the run: one line per arm, repeat and phase (bench.phases).
    schedules = {c.get("schedule") for c in cells if c.get("status") == "ok"}
    if len(schedules) == 1 and (schedule := schedules.pop()) and "," in schedule:
        from bench.phases import phase_table

        table = phase_table(out, schedule)
        (out / "phases.md").write_text(table + "\n")
        md += ["", f"### Per phase ({schedule}; also in phases.md)", "", table]
    (out / "summary.md").write_text("\n".join(md) + "\n")
    console = console_table(groups)
    if side:
        console += "\n" + sidebyside.text(side)
    return summary, console
