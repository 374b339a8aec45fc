"""The run directory: raw records appended as each arm finishes, so a crash keeps what ran.

Layout (bench/README.md documents it for users):
  run.json      the plan, the command, the machine (kernel, CPUs, memory, dirty settings, load)
  cells.jsonl   one summary per arm run (status ok / skipped / failed, with the reason)
  samples.csv   every 250 ms sample of every arm (t = seconds since that arm's writer started)
  victim.csv    every neighbour operation (t, latency)
  writer.csv    the backup writer's own 250 ms intervals and fsyncs
  logs/         daemon output of the fusethrottle arms
  summary.json, summary.md, plot-*.png   derived by bench.report (``python -m bench report DIR``)

What is committed under bench/results/ is the derived part only (run.json, cells.jsonl,
summaries, phase tables, plots as 256-colour PNGs): the raw series are tens of MB a run, and the
command in run.json regenerates them. A committed cells.jsonl may be gzipped (cells.jsonl.gz, a
tenth of the size; summary.json is then left out too, ``bench report`` rebuilds it): the clone
stays under scripts/check-repo-size's limit as results accumulate.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import os
import platform
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from bench.sampler import COLUMNS
from bench.system import loadavg, meminfo, read_text


def _clean(value: object) -> object:
    """JSON has no NaN/inf: write null instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def save_png(fig: object, path: Path, dpi: int = 90) -> None:
    """Save a matplotlib figure as a 256-colour PNG: line plots lose nothing visible and the
    file is about a third of the size, which matters for results kept in git."""
    from PIL import Image

    fig.savefig(path, dpi=dpi)  # type: ignore[attr-defined]
    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)


def dump_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(_clean(data), indent=2, sort_keys=False) + "\n")


def machine_info() -> dict[str, object]:
    """What the numbers were measured on, and how busy it was."""
    mem = meminfo()
    vm = {}
    for key in (
        "dirty_ratio",
        "dirty_background_ratio",
        "dirty_bytes",
        "dirty_background_bytes",
        "dirty_expire_centisecs",
        "dirty_writeback_centisecs",
    ):
        vm[key] = read_text(f"/proc/sys/vm/{key}").strip()
    return {
        "hostname": platform.node(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "mem_total_mib": mem.get("MemTotal", 0) // (1 << 20),
        "vm": vm,
        "loadavg": read_text("/proc/loadavg").strip(),
        "load1": loadavg(),
        "python": platform.python_version(),
    }


class ResultWriter:
    """Appends one arm's raw records to the run's files."""

    def __init__(self, out: Path) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        (out / "logs").mkdir(exist_ok=True)
        self.run: dict[str, object] = {}

    def write_run(self, data: dict | None = None) -> None:
        if data is not None:
            self.run |= data
        dump_json(self.out / "run.json", self.run)

    def add_target(self, info: dict) -> None:
        self.run.setdefault("targets", []).append(info)  # type: ignore[union-attr]
        self.write_run()

    def add_cell(self, summary: dict) -> None:
        with open(self.out / "cells.jsonl", "a") as f:
            f.write(json.dumps(_clean(summary)) + "\n")

    def _append(self, name: str, header: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
        path = self.out / name
        new = not path.exists()
        with open(path, "a", newline="") as f:
            w = csv.writer(f)
            if new:
                w.writerow(header)
            for row in rows:
                w.writerow(["" if v is None else _fmt(v) for v in row])

    def add_samples(self, cell: str, rows: Sequence[dict], t0: float) -> None:
        def gen() -> Iterable[list[object]]:
            for r in rows:
                yield [cell, *(r["t"] - t0 if c == "t" else r[c] for c in COLUMNS)]

        self._append("samples.csv", ("cell", *COLUMNS), gen())

    def add_victim(self, cell: str, ops: Sequence[tuple[float, float]], t0: float) -> None:
        self._append(
            "victim.csv", ("cell", "t", "latency_s"), ([cell, t - t0, lat] for t, lat in ops)
        )

    def add_probes(self, cell: str, ops: Sequence[tuple[float, str, float]], t0: float) -> None:
        self._append(
            "probe.csv",
            ("cell", "t", "op", "latency_s"),
            ([cell, t - t0, op, lat] for t, op, lat in ops),
        )

    def add_writer(self, cell: str, lines: Sequence[dict], t0: float) -> None:
        header = ("cell", "t", "bytes", "writes", "max_s", "sum_s", "fsync_s")

        def gen() -> Iterable[list[object]]:
            for ln in lines:
                yield [
                    cell,
                    ln["t"] - t0,
                    ln.get("bytes"),
                    ln.get("writes"),
                    ln.get("max"),
                    ln.get("sum"),
                    ln.get("fsync"),
                ]

        self._append("writer.csv", header, gen())


def _fmt(v: object) -> object:
    if isinstance(v, float):
        return f"{v:.6g}" if math.isfinite(v) else ""
    return v


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def read_cells(out: Path) -> list[dict]:
    path = out / "cells.jsonl"
    if path.exists():
        text = path.read_text()
    elif (out / "cells.jsonl.gz").exists():
        text = gzip.decompress((out / "cells.jsonl.gz").read_bytes()).decode()
    else:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def read_csv(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))
