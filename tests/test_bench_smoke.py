"""The bench harness keeps working: a seconds-long ``--smoke`` run of the default preset.

Checks that the outputs exist and hold sane numbers (bytes written equal the workload size, the
device absorbed at least that much, every arm is recorded even when skipped) and that nothing is
left behind, also after Ctrl-C. Never checks timings: CI machines are noisy.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20
if str(REPO) not in sys.path:  # bench/ is not an installed package; import it from the tree
    sys.path.insert(0, str(REPO))

from bench import phases  # noqa: E402
from bench.sampler import format_buckets, parse_buckets  # noqa: E402

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the built-in loop target needs root")


def bench(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def leftovers(pid: int) -> list[str]:
    """Everything a harness with this pid could have left: loop devices, work directories,
    journals, mounts, cgroups."""
    found = []
    tag = f"fusethrottle-bench-{pid}"
    losetup = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    found += [line for line in losetup.splitlines() if tag in line]
    mounts = Path("/proc/self/mountinfo").read_text()
    found += [line for line in mounts.splitlines() if tag in line or f"run-{pid}" in line]
    found += [str(p) for p in Path("/var/tmp").glob(f"{tag}*")]
    found += [str(p) for p in Path("/dev/shm/fusethrottle-bench").glob(f"*{pid}*")]
    found += [str(p) for p in Path("/sys/fs/cgroup/memory").rglob(f"{tag}-*")]
    return found


def test_schedule_and_arms_parse() -> None:
    from bench.plan import PlanError, parse_arms, parse_schedule

    steps = parse_schedule("20M:30s,2M:1m,0:30s,none")
    assert [(s.rate, s.seconds) for s in steps] == [
        (20 * MiB, 30.0),
        (2 * MiB, 60.0),
        (0, 30.0),
        (None, float("inf")),
    ]
    with pytest.raises(PlanError):
        parse_schedule("20M,1M:10s")  # only the last step may omit its duration
    arms = parse_arms("idle,direct-fsync:50M,ft-static:window=128M")
    assert arms[1].fsync_every() == 50 * MiB
    assert arms[2].ft_mode == "static" and arms[2].param == "window=128M"


def test_metrics_text_is_read() -> None:
    from bench.analysis import histogram_quantile
    from bench.sampler import parse_metrics

    text = """# HELP fusethrottle_unsynced_bytes x
fusethrottle_unsynced_bytes 1048576
fusethrottle_window_bytes 2.68435456e+08
fusethrottle_fsync_duration_seconds_bucket{reason="batch",le="0.1"} 3
fusethrottle_fsync_duration_seconds_bucket{reason="batch",le="1.0"} 9
fusethrottle_fsync_duration_seconds_bucket{reason="batch",le="+Inf"} 10
fusethrottle_fsync_duration_seconds_count{reason="batch"} 10
fusethrottle_fsync_duration_seconds_sum{reason="batch"} 4.5
fusethrottle_fsync_duration_seconds_count{reason="release"} 2
"""
    snap = parse_metrics(text, 1.0)
    assert snap.unsynced == MiB and snap.window == 256 * MiB
    assert snap.fsync_count == 12 and snap.fsync_sum == 4.5
    assert histogram_quantile(snap.fsync_buckets, 0.5) == 1.0
    assert histogram_quantile(snap.fsync_buckets, 0.99) == float("inf")
    assert parse_metrics("", 0.0).unsynced is None  # no endpoint: records nothing


def test_fsync_histograms_survive_a_csv_cell_and_phases_read_them() -> None:
    buckets = {0.5: 3.0, 1.0: 7.0, math.inf: 8.0}
    assert parse_buckets(format_buckets(buckets)) == buckets
    assert format_buckets({}) is None and parse_buckets(None) == {}
    # Two scrapes: the fsyncs in between are 4 under 1 s and 1 slower.
    before = {0.5: 3.0, 1.0: 3.0, math.inf: 3.0}
    assert phases._fsync_quantiles(before, buckets) == "1 / inf"


def test_a_stepping_device_counter_gives_its_average_rate() -> None:
    # A throttle that hands out 8 MiB every 8 s: 1 MiB/s, whichever phase edge we cut at.
    points = [(t / 4, float((int(t / 4 + 3) // 8) * 8 * MiB)) for t in range(240)]
    assert phases._slope(points) / MiB == pytest.approx(1.0, rel=0.1)


def test_bad_arguments_are_one_line() -> None:
    res = bench("run", "--arms", "direct,nonsense")
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0
    assert "unknown arm 'nonsense'" in res.stderr


def test_presets_list() -> None:
    res = bench("presets")
    assert res.returncode == 0
    for name in ("victim", "degrade", "fast", "passthrough"):
        assert f"{name}:" in res.stdout


@pytest.mark.skipif(os.geteuid() == 0, reason="checks what a non-root user is told")
def test_not_root_is_one_clear_line(tmp_path: Path) -> None:
    res = bench("run", "--smoke", "--out", str(tmp_path / "run"))
    assert res.returncode == 2
    assert "needs root" in res.stderr
    assert res.stderr.strip().count("\n") == 0


@pytest.mark.slow_target
@needs_root
def test_smoke_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = bench("run", "--smoke", "--out", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    for name in ("run.json", "cells.jsonl", "samples.csv", "victim.csv", "writer.csv", "probe.csv"):
        assert (out / name).stat().st_size > 0, name
    assert "| arm |" in (out / "summary.md").read_text()
    assert list(out.glob("plot-*.png"))
    run = json.loads((out / "run.json").read_text())
    assert run["completed"]
    cells = [json.loads(line) for line in (out / "cells.jsonl").read_text().splitlines()]

    # Never dropped: every arm x workload of the plan is there, ok or skipped with a reason.
    expected = {(w.split(":")[0], a) for w in run["plan"]["workloads"] for a in run["plan"]["arms"]}
    assert {(c["workload"], c["arm"]) for c in cells} == expected
    for c in cells:
        assert c["status"] in ("ok", "skipped"), c
        if c["status"] == "skipped":
            assert c["reason"]
    ok = {(c["workload"], c["arm"]): c for c in cells if c["status"] == "ok"}
    for needed in [("seq", "direct"), ("seq", "direct-fsync"), ("seq", "idle"), ("tree", "direct")]:
        assert needed in ok, needed

    for (workload, arm), c in ok.items():
        if arm == "idle":
            assert c["app_bytes"] == 0
            assert c["victim_ops"] > 10
            continue
        size = c["workload_size"]
        assert c["app_bytes"] == size, c
        assert c["on_target_bytes"] == size, c
        # The loop device took the data plus some metadata and journal, not wildly more.
        assert size <= c["absorbed_bytes"] <= 1.5 * size + 16 * MiB, c
        assert c["target_mibps"] > 0
        assert c["dirty_wb_peak_mib"] is not None
        if workload == "seq":
            assert c["verified"] is True, c
            assert c["write_max_ms"] >= c["write_p50_ms"] >= 0
        if arm == "direct-fsync":
            assert c["writer_fsyncs"] == 0  # 24M < 100 MB: no fsync due yet
        if arm.startswith("ft-"):
            assert c["daemon_cpu_total_s"] is not None
        # The mount answered stat and readdir while the backup ran (bench.prober).
        assert c["probe_stat_ops"] > 0 and c["probe_readdir_ops"] > 0, c
        assert c["probe_readdir_max_ms"] < 60_000, c

    # The per-phase table reads the same files: one line per arm and phase that had samples.
    table = phases.phase_table(out, "64M:600s")
    assert "stat / readdir max ms" in table
    assert sum(1 for line in table.splitlines() if line.startswith("| ft-static r1 |")) == 1
    assert sum(1 for line in table.splitlines() if line.startswith("| ft-static r1 (tree) |")) == 1

    summary = json.loads((out / "summary.json").read_text())
    direct = next(g for g in summary["groups"] if g["arm"] == "direct" and g["workload"] == "seq")
    assert direct["metrics"]["app_mibps"]["median"] > 0
    assert leftovers(run["pid"]) == []


@pytest.mark.slow_target
@needs_root
def test_ctrl_c_tears_everything_down(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench", "run", "--smoke", "--out", str(out)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        cells = out / "cells.jsonl"
        while not (cells.exists() and len(cells.read_text().splitlines()) >= 2):
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "no arm finished within 120s"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    run = json.loads((out / "run.json").read_text())
    assert run["completed"] is False
    assert leftovers(run["pid"]) == []
    assert (out / "summary.md").exists()  # what was measured is still reported
