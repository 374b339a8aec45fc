"""``python -m bench.simulate --out DIR``: window controllers against the model target.

Runs, in model time (a few seconds of CPU, deterministic for a given ``--seed``):

- degrade: the real bench's scenario (20 MiB/s, 1 MiB/s for 60 s, 20 MiB/s again), per phase;
- steps: capacity steps down and up, with how many fsyncs the window needs to settle;
- stall: 60 s with no commits at all, and the recovery;
- shared: 2 and 8 hosts on one FIFO target, joining together or a minute apart, with the same
  settings or with starting windows 64x apart, as Jain's fairness index over time.

Arms: ``static`` (window 256M, the baseline), ``adaptive`` (fusethrottle's controller),
``design-v0`` (the first controller in docs/DESIGN.md, kept here to show why it was replaced)
and ``adaptive-no-half`` (adaptive with the old flusher, which started an fsync only at
``batch`` or a full window, to show what syncing at half the window buys). Every other arm's
flusher starts an fsync at half the window, as the real one does (ledger.sync_trigger).

Writes ``summary.json`` and PNG plots to DIR and prints the headline ratios. The model and its
assumptions are in ``bench/model.py``; this is evidence about the controller, not a
measurement of the real daemon (that is ``python -m bench``).
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import statistics
import sys
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import model as sim
from bench.results import save_png
from fusethrottle.stats import percentile as nearest_rank
from fusethrottle.window.controller import (
    DEFAULT_DRAIN_S,
    AdaptiveController,
    Controller,
    ControllerState,
    StaticController,
)

MiB = 1024 * 1024
BATCH = 64 * MiB
STATIC_WINDOW = 256 * MiB
WINDOW_MIN, WINDOW_MAX = 16 * MiB, 2048 * MiB


class FirstDesignController:
    """DESIGN.md's first controller, literally, for comparison only.

    Signal: fsync seconds per MiB. Long-term baseline: slow EMA (alpha 0.05), never below the
    running minimum. Short-term: mean of the last 5 samples (hold until there are 5).
    ``g = clamp(tolerance * long / short, 0.5, 1)``; ``W = (1 - s) W + s (W g + batch)``, growing
    only while half the window is in use. A slow fsync halves the window and holds for as long
    as that fsync took.
    """

    def __init__(
        self,
        *,
        initial: int,
        minimum: int,
        maximum: int,
        batch: int,
        tolerance: float = 1.5,
        smoothing: float = 0.2,
        slow_fsync_s: float = 30.0,
    ) -> None:
        self._w = float(initial)
        self.minimum, self.maximum, self.batch = minimum, maximum, batch
        self.tolerance, self.smoothing, self.slow_fsync_s = tolerance, smoothing, slow_fsync_s
        self._short: deque[float] = deque(maxlen=5)
        self._long: float | None = None
        self._lowest = math.inf
        self._hold_until = -math.inf

    @property
    def window(self) -> int:
        return int(self._w)

    @property
    def commit_rate(self) -> float | None:
        return None  # it steered by fsync seconds per MiB, not by a rate

    @property
    def target_window(self) -> int | None:
        return None

    def on_error(self, now: float, errno: int) -> int:
        return self.window

    def snapshot(self) -> ControllerState:
        recent = sum(self._short) / len(self._short) if self._short else None
        return ControllerState("design-v0", self.window, self._long, recent, len(self._short), 0)

    def on_sample(
        self, now: float, nbytes: int, seconds: float, in_flight: int, admitted: int | None = None
    ) -> int:
        if nbytes <= 0:
            return self.window
        spm = seconds / (nbytes / MiB)
        self._short.append(spm)
        self._lowest = min(self._lowest, spm)
        self._long = spm if self._long is None else 0.95 * self._long + 0.05 * spm
        self._long = max(self._long, self._lowest)
        if seconds >= self.slow_fsync_s:
            self._w = max(self.minimum, self._w / 2)
            self._hold_until = now + seconds
            return self.window
        if len(self._short) < 5 or now < self._hold_until:
            return self.window
        short = sum(self._short) / len(self._short)
        g = min(1.0, max(0.5, self.tolerance * self._long / short))
        if g >= 1.0 and in_flight + nbytes < self._w / 2:
            return self.window
        self._w = (1 - self.smoothing) * self._w + self.smoothing * (self._w * g + self.batch)
        self._w = min(self.maximum, max(self.minimum, self._w))
        return self.window


@dataclass(frozen=True)
class Arm:
    name: str
    make: Callable[[int], Controller]
    half_window: bool = True


def adaptive(initial: int = STATIC_WINDOW) -> AdaptiveController:
    return AdaptiveController(initial=initial, minimum=WINDOW_MIN, maximum=WINDOW_MAX)


ARMS = [
    Arm("static", lambda i: StaticController(STATIC_WINDOW)),
    Arm("adaptive", lambda i: adaptive()),
    Arm(
        "design-v0",
        lambda i: FirstDesignController(
            initial=STATIC_WINDOW, minimum=WINDOW_MIN, maximum=WINDOW_MAX, batch=BATCH
        ),
    ),
    Arm("adaptive-no-half", lambda i: adaptive(), half_window=False),
]


def expected_window(capacity: float) -> float:
    return min(max(capacity * DEFAULT_DRAIN_S, WINDOW_MIN), WINDOW_MAX)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest rank of unsorted *values*, *q* in 0..1 (fusethrottle.stats.percentile)."""
    return nearest_rank(sorted(values), q)


def longest_block(trace: sim.MountTrace, start: float, end: float) -> float:
    """Longest time in ``[start, end)`` the writer was held at the window: the backup's worst
    write() in the model."""
    worst, since = 0.0, None
    for t, w, u in zip(trace.times, trace.windows, trace.unsynced, strict=True):
        if t >= end:
            break
        blocked = u >= w - 1
        if blocked and since is None:
            since = max(t, start)
        elif not blocked and since is not None:
            if t > start:
                worst = max(worst, t - since)
            since = None
    if since is not None:
        worst = max(worst, end - since)
    return worst


def phase_stats(trace: sim.MountTrace, start: float, end: float, capacity: float) -> dict:
    seconds = [s.seconds for s in trace.samples_between(start, end)]
    peak = trace.unsynced_between(start, end)
    return {
        "throughput_mib_s": round(trace.throughput(start, end) / MiB, 3),
        "capacity_mib_s": capacity / MiB,
        "peak_unsynced_mib": round(peak / MiB, 1),
        "peak_drain_s": round(peak / capacity, 1),
        "fsync_p50_s": _round(percentile(seconds, 0.5)),
        "fsync_p99_s": _round(percentile(seconds, 0.99)),
        "worst_write_wait_s": round(longest_block(trace, start, end), 2),
        "fsyncs": len(seconds),
    }


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


# --- scenarios -------------------------------------------------------------------------------

DEGRADE = [(0.0, 20 * MiB), (30.0, 1 * MiB), (90.0, 20 * MiB)]
DEGRADE_END = 210.0


def degrade(seed: int) -> tuple[dict, dict[str, sim.MountTrace]]:
    phases = [("fast", 0.0, 30.0), ("slow", 30.0, 90.0), ("recovered", 90.0, DEGRADE_END)]
    out: dict[str, Any] = {}
    traces = {}
    for arm in ARMS:
        target = sim.ModelTarget.steps(*DEGRADE, jitter=0.1, seed=seed)
        spec = sim.MountSpec(arm.make(0), batch=BATCH, half_window=arm.half_window)
        trace = sim.simulate(target, [spec], DEGRADE_END).mounts[0]
        traces[arm.name] = trace
        out[arm.name] = {
            name: phase_stats(trace, a, b, target.capacity_at(a)) for name, a, b in phases
        }
    return out, traces


STEP_PAIRS = [(100, 25), (25, 100), (100, 10), (10, 100), (20, 1), (1, 20), (50, 200), (200, 50)]


def steps(seed: int) -> tuple[list[dict], dict[str, sim.MountTrace]]:
    rows, traces = [], {}
    for before, after in STEP_PAIRS:
        for arm in (ARMS[1], ARMS[2]):
            res = sim.run_step(
                arm.make, before=before * MiB, after=after * MiB, at=300, duration=700, seed=seed
            )
            trace = res.mounts[0]
            expected = expected_window(after * MiB)
            tail = [s.window for s in trace.samples_between(500, 700)]
            rows.append(
                {
                    "arm": arm.name,
                    "before_mib_s": before,
                    "after_mib_s": after,
                    "expected_window_mib": round(expected / MiB, 1),
                    "settling_samples": sim.settling_samples(trace, 300, 700, expected),
                    "final_window_mib": round(statistics.mean(tail) / MiB, 1) if tail else None,
                    "oscillation": round(sim.oscillation(trace, 500, 700), 3),
                }
            )
            traces[f"{arm.name} {before}->{after}"] = trace
    return rows, traces


def stall(seed: int) -> tuple[dict, dict[str, sim.MountTrace]]:
    cap, at, length, end = 50 * MiB, 200.0, 60.0, 500.0
    out: dict[str, Any] = {}
    traces = {}
    for arm in ARMS:
        res = sim.run_stall(arm.make, capacity=cap, at=at, length=length, duration=end, seed=seed)
        trace = res.mounts[0]
        traces[arm.name] = trace
        before = [s.window for s in trace.samples_between(100, at)]
        settled = statistics.mean(before) if before else float(trace.window_at(at))
        after = trace.samples_between(at + length, end)
        out[arm.name] = {
            "pre_stall_window_mib": round(settled / MiB, 1),
            "post_stall_max_window_ratio": round(max(s.window for s in after) / settled, 3),
            "post_stall_unsynced_ratio": round(
                trace.unsynced_between(at + length, end) / trace.unsynced_between(100, at), 3
            ),
            "hard_signals": sum(1 for s in after if s.seconds >= 30),
            "resettle_samples": sim.settling_samples(trace, at + length, end, settled),
            "throughput_recovery_s": sim.recovery_time(trace, at + length, cap, fraction=0.9),
        }
    return out, traces


def _apart(i: int) -> AdaptiveController:
    """Starting windows 64x apart: 1 GiB for even hosts, 16 MiB for odd ones."""
    return adaptive(initial=(16 if i % 2 else 1024) * MiB)


def shared(seed: int) -> tuple[list[dict], dict[str, sim.SimResult]]:
    checkpoints = (300, 600, 1200)
    cases: list[tuple[str, Callable[[int], Any], str]] = [
        ("adaptive", ARMS[1].make, "same"),
        ("adaptive", _apart, "64x-apart"),
        ("design-v0", ARMS[2].make, "same"),
    ]
    rows, results = [], {}
    for count in (2, 8):
        for stagger in (0.0, 60.0):
            for cap in (100, 400):
                for arm, factory, starts in cases:
                    last = (count - 1) * stagger
                    end = last + max(checkpoints)
                    res = sim.run_shared(
                        factory, count, capacity=cap * MiB, stagger=stagger, duration=end, seed=seed
                    )
                    jain = {}
                    for c in checkpoints:
                        shares = [m.throughput(last + c - 100, last + c) for m in res.mounts]
                        jain[f"+{c}s"] = round(sim.jain_index(shares), 3)
                    total = sum(m.throughput(end - 100, end) for m in res.mounts)
                    windows = sum(m.window_at(end) for m in res.mounts)
                    rows.append(
                        {
                            "arm": arm,
                            "mounts": count,
                            "stagger_s": stagger,
                            "starting_windows": starts,
                            "capacity_mib_s": cap,
                            "jain_after_last_join": jain,
                            "utilisation": round(total / (cap * MiB), 3),
                            "total_window_mib": round(windows / MiB, 1),
                        }
                    )
                    results[f"{arm} n={count} stagger={stagger:g} {starts} {cap}MiB/s"] = res
    return rows, results


# --- plots -----------------------------------------------------------------------------------


def _series(trace: sim.MountTrace, end: float, step: float = 0.5) -> tuple[list, list, list]:
    ts = [i * step for i in range(int(end / step) + 1)]
    return ts, [trace.window_at(t) / MiB for t in ts], [_unsynced_at(trace, t) / MiB for t in ts]


def _unsynced_at(trace: sim.MountTrace, t: float) -> int:
    i = bisect.bisect_right(trace.times, t) - 1
    return trace.unsynced[max(i, 0)] if trace.unsynced else 0


def _throughput(trace: sim.MountTrace, end: float, span: float = 5.0) -> tuple[list, list]:
    ts = [i * span for i in range(int(end / span))]
    return [t + span / 2 for t in ts], [trace.throughput(t, t + span) / MiB for t in ts]


def plot_all(
    out: Path,
    degrade_traces: dict[str, sim.MountTrace],
    step_traces: dict[str, sim.MountTrace],
    stall_traces: dict[str, sim.MountTrace],
    shared_results: dict[str, sim.SimResult],
) -> list[str]:
    """Write the PNGs; matplotlib is imported here so the rest runs without it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    colours = {
        "static": "tab:gray",
        "adaptive": "tab:blue",
        "design-v0": "tab:red",
        "adaptive-no-half": "tab:green",
    }

    fig, axes = plt.subplots(4, 1, figsize=(11, 12), sharex=True)
    for name, trace in degrade_traces.items():
        ts, windows, unsynced = _series(trace, DEGRADE_END)
        style = "--" if name == "adaptive-no-half" else "-"
        axes[0].plot(ts, windows, style, color=colours[name], label=name)
        axes[1].plot(ts, unsynced, style, color=colours[name], label=name)
        tt, thr = _throughput(trace, DEGRADE_END)
        axes[2].plot(tt, thr, style, color=colours[name], label=name)
        fs = trace.samples_between(0, DEGRADE_END)
        times, seconds = [s.time for s in fs], [s.seconds for s in fs]
        axes[3].plot(times, seconds, "o" + style, color=colours[name], markersize=3, label=name)
    cap_t = [0, 30, 30, 90, 90, DEGRADE_END]
    cap_v = [20, 20, 1, 1, 20, 20]
    axes[2].plot(cap_t, cap_v, ":", color="black", label="capacity")
    axes[0].set_ylabel("window (MiB)")
    axes[1].set_ylabel("un-synced (MiB)")
    axes[2].set_ylabel("committed (MiB/s, 5 s)")
    axes[3].set_ylabel("fsync latency (s)")
    axes[3].set_yscale("log")
    axes[3].set_xlabel("model time (s)")
    axes[0].set_yscale("log")
    axes[0].set_title("degrade: 20 MiB/s, 1 MiB/s from 30 s to 90 s, then 20 MiB/s (model)")
    for ax in axes:
        ax.axvspan(30, 90, color="orange", alpha=0.08)
        ax.grid(True, alpha=0.3)
    axes[0].legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    save_png(fig, out / "degrade.png", dpi=110)
    plt.close(fig)
    written.append("degrade.png")

    pairs = ["100->25", "25->100", "20->1", "1->20"]
    fig, axes = plt.subplots(len(pairs), 1, figsize=(11, 10), sharex=True)
    for ax, pair in zip(axes, pairs, strict=True):
        before, after = (int(x) for x in pair.split("->"))
        for arm in ("adaptive", "design-v0"):
            ts, windows, _ = _series(step_traces[f"{arm} {pair}"], 700)
            ax.plot(ts, windows, color=colours[arm], label=arm)
        for (a, b), cap in (((0, 300), before), ((300, 700), after)):
            exp = expected_window(cap * MiB) / MiB
            ax.fill_between([a, b], exp * 0.8, exp * 1.2, color="tab:blue", alpha=0.12)
        ax.set_yscale("log")
        ax.set_ylabel("window (MiB)")
        ax.set_title(f"{before} -> {after} MiB/s at 300 s (band: capacity x drain_s +-20%)")
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    axes[-1].set_xlabel("model time (s)")
    fig.tight_layout()
    save_png(fig, out / "steps.png", dpi=110)
    plt.close(fig)
    written.append("steps.png")

    fig, axes = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    for name, trace in stall_traces.items():
        ts, windows, unsynced = _series(trace, 500)
        axes[0].plot(ts, windows, color=colours[name], label=name)
        axes[1].plot(ts, unsynced, color=colours[name], label=name)
    for ax in axes:
        ax.axvspan(200, 260, color="red", alpha=0.08)
        ax.grid(True, alpha=0.3)
        ax.set_yscale("log")
    axes[0].set_ylabel("window (MiB)")
    axes[1].set_ylabel("un-synced (MiB)")
    axes[1].set_xlabel("model time (s)")
    axes[0].set_title("60 s stall at 200 s, 50 MiB/s otherwise (model)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, out / "stall.png", dpi=110)
    plt.close(fig)
    written.append("stall.png")

    keys = [
        "adaptive n=8 stagger=60 same 100MiB/s",
        "adaptive n=8 stagger=0 64x-apart 100MiB/s",
        "design-v0 n=8 stagger=60 same 100MiB/s",
    ]
    fig, axes = plt.subplots(len(keys), 1, figsize=(11, 10), sharex=True)
    for ax, key in zip(axes, keys, strict=True):
        res = shared_results[key]
        for trace in res.mounts:
            ts, windows, _ = _series(trace, res.duration, step=1.0)
            ax.plot(ts, windows, linewidth=1)
        ax.set_yscale("log")
        ax.set_ylabel("window (MiB)")
        ax.set_title(key + " (one line per host)")
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("model time (s)")
    fig.tight_layout()
    save_png(fig, out / "shared.png", dpi=110)
    plt.close(fig)
    written.append("shared.png")
    return written


# --- main ------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.simulate",
        description="Window controllers against the model target; writes summary.json and plots.",
    )
    parser.add_argument("--out", required=True, type=Path, help="directory for results")
    parser.add_argument("--seed", type=int, default=1, help="jitter seed (default 1)")
    parser.add_argument("--no-plots", action="store_true", help="write summary.json only")
    args = parser.parse_args(argv)
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        print(f"bench.simulate: cannot create {args.out}: {err.strerror}", file=sys.stderr)
        return 2

    degrade_out, degrade_traces = degrade(args.seed)
    step_rows, step_traces = steps(args.seed)
    stall_out, stall_traces = stall(args.seed)
    shared_rows, shared_results = shared(args.seed)
    summary = {
        "model": {
            "description": "bench.model: one file per mount written at 400 MiB/s; "
            "one fsync per file covering all its dirty bytes; data reaches the target when its "
            "fsync starts; FIFO target; +-10% jitter per fsync; 20 ms base latency",
            "batch_mib": BATCH / MiB,
            "static_window_mib": STATIC_WINDOW / MiB,
            "adaptive": {
                "window_min_mib": WINDOW_MIN / MiB,
                "window_max_mib": WINDOW_MAX / MiB,
                "drain_s": DEFAULT_DRAIN_S,
                "initial_mib": STATIC_WINDOW / MiB,
            },
            "seed": args.seed,
        },
        "degrade": degrade_out,
        "steps": step_rows,
        "stall": stall_out,
        "shared": shared_rows,
    }
    plots = []
    if not args.no_plots:
        plots = plot_all(args.out, degrade_traces, step_traces, stall_traces, shared_results)
    summary["plots"] = plots
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    _print_headlines(summary, args.out)
    return 0


def _print_headlines(summary: dict, out: Path) -> None:
    d = summary["degrade"]
    print("degrade (model; 20 -> 1 -> 20 MiB/s):")
    for arm, phases in d.items():
        cells = ", ".join(
            f"{p}: {v['throughput_mib_s']:.2f} MiB/s peak {v['peak_unsynced_mib']:.0f} MiB"
            for p, v in phases.items()
        )
        print(f"  {arm:14s} {cells}")
    s, a = d["static"]["slow"], d["adaptive"]["slow"]
    peak = a["peak_unsynced_mib"] / s["peak_unsynced_mib"]
    rate = a["throughput_mib_s"] / s["throughput_mib_s"]
    print(f"  slow phase, adaptive/static: peak un-synced {peak:.2f}x, throughput {rate:.2f}x")
    settles = [r["settling_samples"] for r in summary["steps"] if r["arm"] == "adaptive"]
    oscs = [r["oscillation"] for r in summary["steps"] if r["arm"] == "adaptive"]
    v0 = [r["settling_samples"] for r in summary["steps"] if r["arm"] == "design-v0"]
    print(
        f"steps: adaptive settles in {min(settles)}-{max(s for s in settles if s is not None)} "
        f"fsyncs (never: {settles.count(None)}), oscillation <= {max(oscs):.1%}; "
        f"design-v0 never settles in {v0.count(None)}/{len(v0)}"
    )
    st = summary["stall"]["adaptive"]
    print(
        f"stall: adaptive post-stall window <= {st['post_stall_max_window_ratio']:.2f}x pre-stall, "
        f"re-settled in {st['resettle_samples']} fsyncs, throughput back in "
        f"{st['throughput_recovery_s']} s"
    )
    worst = min(
        (r for r in summary["shared"] if r["arm"] == "adaptive"),
        key=lambda r: r["jain_after_last_join"]["+1200s"],
    )
    print(
        "shared: adaptive Jain at +300 s / +1200 s after the last join, worst case "
        f"{worst['jain_after_last_join']} ({worst['mounts']} hosts, stagger "
        f"{worst['stagger_s']:g} s, {worst['starting_windows']}, {worst['capacity_mib_s']} MiB/s)"
    )
    plots = f" and {len(summary['plots'])} plots" if summary["plots"] else ""
    print(f"wrote {out / 'summary.json'}{plots}")


if __name__ == "__main__":
    sys.exit(main())
