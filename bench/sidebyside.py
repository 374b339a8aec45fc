"""Issue 11's report: every arm side by side, one table per target, with fusethrottle's ratios
to libfuse's C passthrough_ll (the c-ll and c-ll-wb arms).

One row per thing a user waits for — dd at 4K/10K/128K/1M, the small-file phases (create, ls -lR
and stat cold and warm, rm -rf), the cold sequential read — and per arm its rate (MiB/s, or
files/s for the metadata phases) and its CPU (writer + daemon; per GiB, or per file). The ratio
columns divide fusethrottle's median by the C arm's: a rate ratio of 0.5 is half the C speed, a
CPU ratio of 2 is twice its CPU. Repeats are paired by number for the ratios' min..max: arms of
one repeat ran back to back, so they saw the same machine.

Reads only cells.jsonl records, so ``python -m bench report DIR`` rebuilds it, also for runs
made before these rows existed (their missing rows are simply absent).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.plan import is_idle
from bench.results import save_png
from bench.stats import distinct, median

log = logging.getLogger(__name__)

C_ARMS = ("c-ll-wb", "c-ll")  # the ratio columns' order: writeback first, as issue 11 asks


@dataclass(frozen=True)
class Row:
    """One line of the table: a workload, or one phase of the ``files`` workload."""

    workload: str
    label: str
    phase: str = ""  # files: create, ls_cold, ...; "" for a data row

    @property
    def key(self) -> str:
        return f"{self.workload}:{self.phase}" if self.phase else self.workload

    @property
    def rate_unit(self) -> str:
        return "files/s" if self.phase else "MiB/s"

    @property
    def cpu_unit(self) -> str:
        return "CPU-us/file" if self.phase else "CPU-s/GiB"

    def title(self, size: int) -> str:
        if self.phase:
            return f"{size} files: {self.label}"
        if self.workload == "read":
            return f"{human(size)} read, cold, dd"
        return f"{self.label} ({human(size)})"

    def rate(self, cell: dict) -> float | None:
        if not self.phase:
            return _num(cell.get("app_mibps"))
        seconds = _num(cell.get(f"wl_{self.phase}_s"))
        files = cell.get("files") or cell.get("workload_size")
        return files / seconds if seconds and files else None

    def cpu(self, cell: dict) -> float | None:
        if not self.phase:
            return _num(cell.get("cpu_s_per_gib"))
        cpu = _num(cell.get(f"wl_{self.phase}_cpu_s"))
        files = cell.get("files") or cell.get("workload_size")
        return cpu / files * 1e6 if cpu is not None and files else None


ROWS = (
    Row("dd4k", "4 KiB writes, dd"),
    Row("dd10k", "10 KiB writes, dd"),
    Row("dd128k", "128 KiB writes, dd"),
    Row("dd1m", "1 MiB writes, dd"),
    Row("files", "create + 4 KiB write", "create"),
    Row("files", "ls -lR, cold", "ls_cold"),
    Row("files", "ls -lR, warm", "ls_warm"),
    Row("files", "stat each, cold", "stat_cold"),
    Row("files", "stat each, warm", "stat_warm"),
    Row("files", "rm -rf", "rm"),
    Row("files8", "create + 4 KiB write, 8 writers at once", "create"),
    Row("read", "sequential read"),
)


def human(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and v == v else None  # NaN != NaN


def fmt(v: float) -> str:
    """Three significant digits or so, never exponent notation."""
    a = abs(v)
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 0.1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def _stat(values: list[float], ratio: bool = False) -> str:
    """Median, and min..max when there are several repeats."""
    suffix = "x" if ratio else ""
    text = f"{fmt(median(values))}{suffix}"
    if len(values) > 1:
        text += f" ({fmt(min(values))}..{fmt(max(values))})"
    return text


def fusethrottle_arms(arms: Sequence[str]) -> list[str]:
    return [a for a in arms if a.startswith("ft-")]


def c_arms(arms: Sequence[str]) -> list[str]:
    """The C reference arms present, c-ll-wb before c-ll (and any parameterised variants)."""
    return [a for kind in C_ARMS for a in arms if a.split(":")[0] == kind]


def offers_xattrs(arm: str) -> bool:
    """Whether the arm's mount serves xattrs (on tmpfs, where the target has them).

    Ratios compare like with like: a mount that serves xattrs is asked for security.capability
    before every write() and for two xattrs per file by ``ls -l``; one that answers ENOSYS once
    (fusethrottle's xattrs=off, what its default does on NFS/EFS; passthrough_ll without
    ``-o xattr``, its upstream default) is never asked again.
    """
    kind, _, param = arm.partition(":")
    # Several options are joined by ":" in an arm's label (c-ll-wb:xattr:default_permissions).
    options = {o.strip() for o in param.replace(",", ":").split(":")}
    if kind.startswith("ft-"):
        return "xattrs=off" not in options
    return "xattr" in options


def build(cells: Sequence[dict]) -> list[dict]:
    """Per target: its rows, each arm's per-repeat rate and CPU, and the ratio columns."""
    out = []
    for target in distinct(cells, "target"):
        mine = [c for c in cells if c["target"] == target]
        arms = distinct(mine, "arm")
        arms = [a for a in arms if not is_idle(a)]
        pairs = [
            (f, c)
            for f in fusethrottle_arms(arms)
            for c in c_arms(arms)
            if offers_xattrs(f) == offers_xattrs(c)
        ]
        rows = []
        for row in ROWS:
            of_row = [c for c in mine if c["workload"] == row.workload]
            if not of_row:
                continue
            entry: dict = {
                "row": row.key,
                "title": row.title(int(of_row[0]["workload_size"])),
                "rate_unit": row.rate_unit,
                "cpu_unit": row.cpu_unit,
                "arms": {},
                "ratios": {},
            }
            per_arm: dict[str, dict[int, tuple[float | None, float | None]]] = {}
            for arm in arms:
                runs = [c for c in of_row if c["arm"] == arm]
                ok = [c for c in runs if c["status"] == "ok"]
                by_repeat = {c["repeat"]: (row.rate(c), row.cpu(c)) for c in ok}
                per_arm[arm] = by_repeat
                rates = [v[0] for v in by_repeat.values() if v[0] is not None]
                cpus = [v[1] for v in by_repeat.values() if v[1] is not None]
                entry["arms"][arm] = {
                    "runs": len(runs),
                    "ok": len(ok),
                    "status": "ok" if ok else (runs[0]["status"] if runs else "absent"),
                    "reasons": sorted({c["reason"] for c in runs if c.get("reason")}),
                    "rate": rates,
                    "cpu": cpus,
                }
            measured = [a for a in entry["arms"].values() if a["ok"]]
            if measured and not any(a["rate"] or a["cpu"] for a in measured):
                continue  # a run from before this row existed
            for f, c in pairs:
                ratio: dict[str, Any] = {"rate": [], "cpu": []}
                for i, what in enumerate(("rate", "cpu")):
                    for repeat, fv in per_arm[f].items():
                        cv = per_arm[c].get(repeat)
                        if fv[i] is not None and cv is not None and cv[i]:
                            ratio[what].append(fv[i] / cv[i])  # type: ignore[operator]
                    fm, cm = entry["arms"][f][what], entry["arms"][c][what]
                    ratio[f"{what}_of_medians"] = (
                        median(fm) / median(cm) if fm and cm and median(cm) else None
                    )
                entry["ratios"][f"{f}/{c}"] = ratio
            rows.append(entry)
        if rows:
            out.append({"target": target, "arms": arms, "pairs": pairs, "rows": rows})
    return out


def _table(t: dict) -> tuple[list[str], list[list[str]], list[str]]:
    """Header, body and notes of one target's table (shared by Markdown and the console)."""
    header = ["workload", "unit"]
    for arm in t["arms"]:
        header += [arm, f"{arm} CPU"]
    for f, c in t["pairs"]:
        header += [f"{f}/{c}", f"{f}/{c} CPU"]
    body: list[list[str]] = []
    notes: dict[str, None] = {}
    for r in t["rows"]:
        line = [r["title"], f"{r['rate_unit']}, {r['cpu_unit']}"]
        for arm in t["arms"]:
            a = r["arms"][arm]
            if not a["ok"]:
                line += [a["status"], ""]
                if a["reasons"]:
                    notes[f"{arm} {a['status']}: {'; '.join(a['reasons'])}"] = None
                continue
            line.append(_stat(a["rate"]) if a["rate"] else "-")
            line.append(_stat(a["cpu"]) if a["cpu"] else "-")
        for f, c in t["pairs"]:
            ratio = r["ratios"][f"{f}/{c}"]
            for what in ("rate", "cpu"):
                of_medians = ratio[f"{what}_of_medians"]
                if of_medians is None:
                    line.append("-")
                    continue
                text = f"{fmt(of_medians)}x"
                if len(ratio[what]) > 1:
                    text += f" ({fmt(min(ratio[what]))}..{fmt(max(ratio[what]))})"
                line.append(text)
        body.append(line)
    return header, body, list(notes)


def _repeats(t: dict) -> int:
    return max((a["ok"] for r in t["rows"] for a in r["arms"].values()), default=0)


def _caption(t: dict) -> str:
    n = _repeats(t)
    reps = f"median of {n} repeats (min..max)" if n > 1 else "1 repeat"
    return (
        f"rate: higher is better; CPU = the writer's + the daemon's user+system seconds, lower is "
        f"better; {reps}. A/B columns: A's median / B's median (rate < 1: A is slower; "
        f"CPU > 1: A uses more CPU). A dd row's time ends when dd exits; the daemon's stop and "
        f"the target's syncfs after it are in durable s of the per-workload tables"
    )


def arm_lines(cells: Sequence[dict], run: dict | None = None) -> list[str]:
    """What each arm ran exactly: the daemon's command line, from the first cell that has one."""
    out = []
    for arm in distinct(cells, "arm"):
        mine = [c for c in cells if c["arm"] == arm]
        cmd = next((c.get("daemon_invocation") for c in mine if c.get("daemon_invocation")), None)
        if cmd:
            out.append(f"{arm}: `{cmd}`")
        elif arm == "direct":
            out.append("direct: no FUSE, the workload runs on the target itself")
    built = (run or {}).get("passthrough_ll")
    if built and any(a.split(":")[0] in C_ARMS for a in distinct(cells, "arm")):
        out.append(
            f"passthrough_ll is libfuse {built.get('libfuse')}'s example "
            f"{built.get('source')} (sha256 {str(built.get('source_sha256'))[:12]}), built with "
            f"`{built.get('command')}`. Upstream defaults: cache=auto (entry and attribute "
            "timeout 1 s, a file's page cache dropped when it is opened), multi-threaded, no "
            "writeback cache unless -o writeback, xattrs off (ENOSYS, after which the kernel "
            "stops asking it for xattrs at all)"
        )
    return out


def markdown(tables: list[dict], cells: Sequence[dict], run: dict | None = None) -> str:
    parts = []
    for t in tables:
        header, body, notes = _table(t)
        parts += [f"### Side by side on {t['target']}", "", _caption(t) + ".", ""]
        parts.append("| " + " | ".join(header) + " |")
        parts.append("|" + "---|" * len(header))
        for line in body:
            parts.append("| " + " | ".join(cell.replace("|", "/") for cell in line) + " |")
        parts.append("")
        for note in notes:
            parts.append(f"- {note}")
        if notes:
            parts.append("")
    lines = arm_lines(cells, run)
    if lines:
        parts += ["Arms (daemon command lines as run):", ""]
        parts += [f"- {ln}" for ln in lines]
        parts.append("")
    return "\n".join(parts)


def text(tables: list[dict]) -> str:
    """The same tables for the terminal, columns aligned."""
    out = []
    for t in tables:
        header, body, notes = _table(t)
        out.append(f"side by side on {t['target']}: {_caption(t)}")
        rows = [header, *body]
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        for r in rows:
            out.append("  " + "  ".join(f"{c:<{w}}" for c, w in zip(r, widths, strict=True)))
        out += [f"  {n}" for n in notes]
        out.append("")
    return "\n".join(out)


def plot(out: Path, tables: list[dict]) -> list[Path]:
    """Bars per arm for every row (median, whiskers min..max): one PNG for the rates, one for
    CPU, per target. Each row has its own axis: the units and scales differ."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed: no side-by-side plots")
        return []
    made = []
    for t in tables:
        arms = t["arms"]
        colors = {a: f"C{i % 10}" for i, a in enumerate(arms)}
        for what in ("rate", "cpu"):
            rows = t["rows"]
            ncols = 4
            nrows = (len(rows) + ncols - 1) // ncols
            fig, axes = plt.subplots(nrows, ncols, figsize=(3.2 * ncols, 2.8 * nrows))
            flat = list(axes.flat) if hasattr(axes, "flat") else [axes]
            for ax, r in zip(flat, rows, strict=False):
                xs, hs, lo, hi, cs = [], [], [], [], []
                for i, arm in enumerate(arms):
                    vals = r["arms"][arm][what]
                    if not vals:
                        continue
                    m = median(vals)
                    xs.append(i)
                    hs.append(m)
                    lo.append(m - min(vals))
                    hi.append(max(vals) - m)
                    cs.append(colors[arm])
                bars = ax.bar(xs, hs, color=cs, yerr=[lo, hi], capsize=3)
                ax.bar_label(bars, labels=[fmt(h) for h in hs], fontsize=6, padding=2)
                ax.margins(y=0.18)  # room for the labels above the whiskers
                ax.set_xticks(range(len(arms)), arms, rotation=30, ha="right", fontsize=7)
                unit = r["rate_unit"] if what == "rate" else r["cpu_unit"]
                ax.set_title(f"{r['title']}\n{unit}", fontsize=8)
                ax.tick_params(axis="y", labelsize=7)
                ax.grid(axis="y", alpha=0.3)
            for ax in flat[len(rows) :]:
                ax.axis("off")
            better = "higher is better" if what == "rate" else "writer + daemon, lower is better"
            fig.suptitle(f"{t['target']}: {'rate' if what == 'rate' else 'CPU'} ({better})")
            fig.tight_layout()
            safe = "".join(ch if ch.isalnum() else "-" for ch in t["target"])
            path = out / f"plot-{safe}-side-by-side-{what}.png"
            save_png(fig, path)
            plt.close(fig)
            made.append(path)
    return made
