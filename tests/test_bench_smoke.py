"""The bench harness keeps working: a seconds-long ``--smoke`` run of the default preset, and
of the passthrough preset with libfuse's C passthrough_ll built and mounted for real.

Checks that the outputs exist and hold sane numbers (bytes written equal the workload size, the
device absorbed at least that much, every arm is recorded even when skipped) and that nothing is
left behind, also after Ctrl-C. Never checks timings: CI machines are noisy.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import json
import math
import os
import shutil
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
from bench.stats import percentile  # noqa: E402

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


#: victim.csv and writer.csv keep six significant digits of each time (bench/results.py), so
#: an operation within this of an end of the arm's window may have fallen on either side of it.
ROUNDING = 1e-3


def rows_of(path: Path, cell: str) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return [row for row in csv.DictReader(f) if row["cell"] == cell]


def arm_window(run: dict, c: dict) -> float:
    """Seconds from the arm's start that its neighbour figures cover (bench/runner.py): the
    idle time for the idle arm, else until the backup was durable."""
    return float(run["plan"]["idle_seconds"]) if c["arm"] == "idle" else float(c["durable_s"])


def check_victim_figures(out: Path, run: dict, c: dict) -> None:
    """The neighbour's figures in the cell are those of the operations it recorded in
    victim.csv that started in the arm's window: count, nearest-rank p50/p99, max, completions
    per second and whole seconds without a completion."""
    window = arm_window(run, c)
    ops = [(float(r["t"]), float(r["latency_s"])) for r in rows_of(out / "victim.csv", c["cell"])]
    sure = sorted(lat for t, lat in ops if ROUNDING <= t <= window - ROUNDING)
    maybe = sorted(lat for t, lat in ops if -ROUNDING <= t <= window + ROUNDING)
    assert sure, c
    assert len(sure) <= c["victim_ops"] <= len(maybe), (c["victim_ops"], len(sure), len(maybe))
    assert sure[-1] * (1 - 1e-6) <= c["victim_max_ms"] / 1e3 <= maybe[-1] * (1 + 1e-6)
    if len(sure) == len(maybe):  # no operation near an end: the same samples, the same numbers
        assert c["victim_p50_ms"] == pytest.approx(percentile(sure, 50) * 1e3, rel=1e-6)
        assert c["victim_p99_ms"] == pytest.approx(percentile(sure, 99) * 1e3, rel=1e-6)
        assert c["victim_max_ms"] == pytest.approx(sure[-1] * 1e3, rel=1e-6)
    done = sorted(t + lat for t, lat in ops)
    done_sure = [d for d in done if ROUNDING <= d <= window - ROUNDING]
    done_maybe = [d for d in done if -ROUNDING <= d <= window + ROUNDING]
    per_s = c["victim_ops_per_s"] * window
    assert len(done_sure) - 1e-6 <= per_s <= len(done_maybe) + 1e-6, (per_s, len(done_sure))

    def completions(lo: float, hi: float) -> bool:
        return any(lo <= d < hi for d in done_maybe)

    seconds = range(max(1, int(window)))
    surely_dead = sum(1 for k in seconds if not completions(k - ROUNDING, k + 1 + ROUNDING))
    maybe_dead = sum(1 for k in seconds if not completions(k + ROUNDING, k + 1 - ROUNDING))
    assert surely_dead <= c["victim_dead_seconds"] <= maybe_dead, c["victim_dead_seconds"]


def check_write_figures(out: Path, c: dict) -> None:
    """The backup's write() figures in the cell agree with what the writer logged every
    250 ms (writer.csv: writes, their worst and their sum per interval): the same worst write,
    every byte accounted for, and a median no more than twice the mean (at least half the
    writes took the median or longer)."""
    rows = [r for r in rows_of(out / "writer.csv", c["cell"]) if r["writes"]]
    assert rows, c
    assert int(rows[-1]["bytes"]) == c["app_bytes"]
    writes = sum(int(r["writes"]) for r in rows)
    worst = max(float(r["max_s"]) for r in rows)
    mean = sum(float(r["sum_s"]) for r in rows) / writes
    assert c["write_max_ms"] == pytest.approx(worst * 1e3, rel=1e-5)
    assert c["write_p50_ms"] <= c["write_p99_ms"] <= c["write_max_ms"]
    assert c["write_p50_ms"] <= 2 * mean * 1e3 * (1 + 1e-5)
    assert (c["writes_over_1s"] == 0) == (worst <= 1.0)


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
    # A second idle arm measures the machine's noise; it needs a plain name.
    assert parse_arms("idle,idle:again")[1].label == "idle:again"
    for bad in ("idle,idle", "idle:a=b", "direct:x"):
        with pytest.raises(PlanError):
            parse_arms(bad)


def test_schedule_capacity_is_what_the_throttled_target_could_absorb() -> None:
    from bench.plan import parse_schedule, schedule_capacity

    degrade = parse_schedule("20M:20s,1M:40s,20M:20s")
    assert schedule_capacity(degrade, 10) == 200 * MiB
    assert schedule_capacity(degrade, 80) == (400 + 40 + 400) * MiB
    # Past the end the last rate holds: a backup durable at 82 s had 2 s more at 20 MiB/s.
    assert schedule_capacity(degrade, 82) == 880 * MiB
    assert schedule_capacity(parse_schedule("5M"), 4) == 20 * MiB
    assert schedule_capacity(parse_schedule("20M:10s,none"), 20) is None
    assert schedule_capacity(parse_schedule("20M:10s,none"), 10) == 200 * MiB
    assert schedule_capacity(parse_schedule("20M:10s,0:5s,20M"), 20) == 300 * MiB


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


def test_the_phase_table_ranks_the_neighbours_p99_as_every_report_does(tmp_path: Path) -> None:
    """Nearest rank (bench.stats.percentile, the daemon's definition): of 100 operations of
    1..100 ms the p99 is the 99th, 99 ms, as in the summary and ``fusethrottle status``."""
    cell = "001-seq-idle-r1"
    columns = ("cell", "t", "absorbed", "cg_dirty", "cg_writeback", "ft_unsynced", "ft_window")
    samples = [",".join(columns)] + [f"{cell},{t},0,0,0,," for t in (0.5, 1.5)]
    (tmp_path / "samples.csv").write_text("\n".join(samples) + "\n")
    victim = ["cell,t,latency_s"] + [f"{cell},{i / 100},{i / 1000}" for i in range(1, 101)]
    (tmp_path / "victim.csv").write_text("\n".join(victim) + "\n")
    table = phases.phase_table(tmp_path, "1M:10s")
    row = next(line for line in table.splitlines() if line.startswith("| idle r1 |"))
    assert "| 99.0 / 100 |" in row, row


def test_bytes_in_the_schedule_ignore_what_an_arm_drains_after_it(tmp_path: Path) -> None:
    """Two arms with the same target over a 10 s schedule: one put 100 MiB on it by the end,
    the other 99 MiB and then drained 40 MiB more after the end (its buffer). Over the
    schedule the second did 0.99x the first, whatever its rate until durable says."""
    columns = ("cell", "t", "absorbed")
    lines = [",".join(columns)]
    for t in range(0, 15):
        lines.append(f"001-seq-direct-bdi-r1,{t},{min(t, 10) * 10 * MiB}")
        drained = t * 9.9 * MiB if t <= 10 else 99 * MiB + (t - 10) * 10 * MiB
        lines.append(f"002-seq-ft-adaptive-r1,{t},{drained}")
    (tmp_path / "samples.csv").write_text("\n".join(lines) + "\n")
    table = phases.schedule_bytes(tmp_path, "10M:10s")
    ft = next(line for line in table.splitlines() if line.startswith("| ft-adaptive |"))
    assert ft == "| ft-adaptive | 99 | 0.990, 0.990 |", table
    assert "| direct-bdi | 100 | - |" in table


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
        check_victim_figures(out, run, c)
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
            check_write_figures(out, c)
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


# --- the quick start's demo ----------------------------------------------------------------------


@pytest.mark.slow_target
@needs_root
def test_the_quick_start_demo_ends_in_a_short_verified_table(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = bench("run", "--preset", "demo", "--smoke", "--verify", "--out", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    brief = subprocess.run(
        [sys.executable, "-m", "bench.brief", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert brief.returncode == 0, brief.stderr
    assert "| backup written directly |" in brief.stdout
    assert "| through fusethrottle |" in brief.stdout
    # What the run shows is said from its numbers, whichever way they went (bench.verdict).
    assert "\nThe database: directly its worst transaction took " in brief.stdout or (
        "\nThis run shows no " in brief.stdout
    )
    assert "Every byte of every backup was read back from the target and verified." in brief.stdout
    assert "plot: " in brief.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "bench.brief", str(tmp_path / "nothing")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert missing.returncode == 1 and len(missing.stderr.strip().splitlines()) == 1


# --- issue 15: the database neighbour -----------------------------------------------------------


@pytest.mark.slow_target
@needs_root
def test_db_smoke_measures_a_neighbour_that_needs_memory(tmp_path: Path) -> None:
    """The db victim fills its cgroup, reads, allocates and commits; the report has its
    throughput, its gaps and the cgroup's cache split; the daemon's defaults took the target's
    cache out of the shared cgroup."""
    out = tmp_path / "run"
    res = bench("run", "--preset", "db", "--smoke", "--out", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    cells = {c["arm"]: c for c in map(json.loads, (out / "cells.jsonl").read_text().splitlines())}
    assert set(cells) == {"idle", "ft-adaptive"}
    run = json.loads((out / "run.json").read_text())
    for c in cells.values():
        assert c["status"] == "ok", c
        check_victim_figures(out, run, c)  # its throughput and gaps are the ones it recorded
        assert c["victim_cached_min_mib"] > 0, c  # mincore found the victim's files
        assert c["cg_backup_cached_end_mib"] is not None, c
    ft = cells["ft-adaptive"]
    assert ft["on_target_bytes"] == ft["app_bytes"] > 0
    log = "".join(p.read_text() for p in (out / "logs").glob("*-ft-adaptive-r1-daemon.*"))
    assert "charged to the memory cgroup" in log, log[-2000:]
    text = (out / "summary.md").read_text()
    assert "victim ops/s" in text and "seconds without an op" in text
    assert leftovers(run["pid"]) == []


# --- issue 11: the passthrough preset, with libfuse's C passthrough_ll as the reference -------


def c_arm_missing() -> str | None:
    """Why the C arm cannot run here (None: it can): only what is truly absent skips it."""
    from bench.daemon import PASSTHROUGH_LL

    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is absent"
    if shutil.which("gcc") is None or shutil.which("pkg-config") is None:
        return "gcc or pkg-config is not installed"
    gz = PASSTHROUGH_LL.with_name(PASSTHROUGH_LL.name + ".gz")
    if not PASSTHROUGH_LL.exists() and not gz.exists():
        return "libfuse3-dev is not installed"
    if subprocess.run(["pkg-config", "--exists", "fuse3"]).returncode != 0:
        return "pkg-config knows no fuse3"
    return None


needs_c_arm = pytest.mark.skipif(
    os.geteuid() != 0 or c_arm_missing() is not None,
    reason=f"needs root and the C arm's tools: {c_arm_missing() or 'not root'}",
)


def processes_mounting_under(pid: int) -> list[str]:
    """Command lines of live processes serving a mount in that harness's scratch directory."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"run-{pid}/mnt-" in text:
            found.append(text)
    return found


def test_passthrough_arms_and_workloads_parse() -> None:
    from bench.plan import DD_BLOCKS, PlanError, parse_arms, parse_workloads

    arms = parse_arms(
        "direct,ft-adaptive,c-ll,c-ll-wb,c-ll:xattr,c-ll-wb:xattr:default_permissions"
    )
    assert [a.is_c_passthrough for a in arms] == [False, False, True, True, True, True]
    assert [a.is_fuse for a in arms] == [False, True, True, True, True, True]
    assert [a.c_options() for a in arms[2:]] == [
        "",
        "writeback",
        "xattr",
        "writeback,xattr,default_permissions",
    ]
    with pytest.raises(PlanError, match="source="):
        parse_arms("c-ll:source=/elsewhere")
    with pytest.raises(PlanError, match="unknown arm"):
        parse_arms("c-hl")
    wl = parse_workloads("dd10k:1G,files:200,files8:64,read:16M")
    assert [(w.kind, w.size) for w in wl] == [
        ("dd10k", 1 << 30),
        ("files", 200),
        ("files8", 64),
        ("read", 16 * MiB),
    ]
    # A file count is no byte size: --size does not apply to it.
    assert [(w.kind, w.size) for w in parse_workloads("files,files8,dd4k", 4 * MiB)] == [
        ("files", 10_000),
        ("files8", 10_000),
        ("dd4k", 4 * MiB),
    ]
    assert DD_BLOCKS["dd10k"] == 10 * 1024  # tar's record


def test_the_paced_workload_writes_no_faster_than_its_rate(tmp_path: Path) -> None:
    """``paced`` stands for a backup that reads its source at 20 MiB/s; its writer must keep
    to a given rate, or it measures a flat-out stream again."""
    from bench.plan import parse_workloads

    (paced,) = parse_workloads("paced:8M")
    assert (paced.size, paced.block) == (8 * MiB, MiB)
    rate = 16 * MiB  # 8 MiB at 16 MiB/s: at least half a second
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.writer",
            "stream",
            "--path",
            str(tmp_path / "f"),
            "--size",
            str(8 * MiB),
            "--rate",
            str(rate),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    rep = json.loads(out.stdout.strip().splitlines()[-1])
    assert rep["bytes"] == 8 * MiB
    assert rep["seconds"] >= (8 * MiB - MiB) / rate  # the last write needs no wait after it


def test_passthrough_preset_measures_the_daemon_defaults() -> None:
    from bench.daemon import PassthroughLLMount
    from bench.plan import ArmSpec
    from bench.presets import build_plan
    from bench.runner import ft_mount_options

    full = build_plan("passthrough", "full")
    assert [t.kind for t in full.targets] == ["tmpfs"]
    assert [a.label for a in full.arms] == [
        "direct",
        "ft-adaptive",
        "ft-adaptive:xattrs=off",
        "c-ll",
        "c-ll-wb",
        "c-ll-wb:xattr",
        "c-ll-wb:xattr:default_permissions",  # the permission checks fusethrottle's default has
    ]
    assert [(w.kind, w.size) for w in full.workloads] == [
        *[(k, 1 << 30) for k in ("dd4k", "dd10k", "dd128k", "dd1m")],
        ("files", 10_000),
        ("files8", 10_000),
        ("read", 1 << 30),
    ]
    assert full.repeats == 3
    # No -o beyond the mode the arm is named after: the product's defaults are what is measured,
    # and no metrics endpoint either (its scrapes would cost the daemon CPU).
    assert not full.metrics
    assert ft_mount_options(full, ArmSpec("ft-adaptive")) == "mode=adaptive"
    assert ft_mount_options(full, ArmSpec("ft-static", "window=64M")) == "mode=static,window=64M"
    quick = build_plan("passthrough", "quick")
    assert quick.repeats == 2 and quick.workloads[-1].size == 256 * MiB
    smoke = build_plan("passthrough", "smoke")
    assert [a.label for a in smoke.arms] == ["direct", "ft-adaptive:xattrs=off", "c-ll"]
    assert [t.kind for t in build_plan("passthrough", "quick", targets=["rootdir"]).targets] == [
        "rootdir"
    ]
    victim = build_plan("victim", "quick")  # the other presets keep their options and metrics
    assert victim.metrics and victim.ft_options == "batch=64M,window=256M"

    mount = PassthroughLLMount(
        Path("/cache/passthrough_ll"),
        Path("/target/backing"),
        Path("/scratch/mnt-1"),
        ArmSpec("c-ll-wb").c_options(),
        Path("/scratch/log"),
        None,  # type: ignore[arg-type]  # not started: only the command line is looked at
        None,
    )
    assert mount.command == [
        "/cache/passthrough_ll",
        "-f",
        "-o",
        "source=/target/backing,writeback",
        "/scratch/mnt-1",
    ]
    assert mount.generic_command() == "passthrough_ll -f -o source=SOURCE,writeback MOUNTPOINT"


def test_c_arm_is_skipped_with_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench import daemon
    from bench.system import ArmSkipped

    with pytest.raises(ArmSkipped, match="libfuse3-dev"):
        daemon.build_passthrough_ll(tmp_path / "passthrough_ll.c", tmp_path / "cache")
    source = tmp_path / "passthrough_ll.c"
    source.write_text("int main(void) { return 0; }\n")
    real_which = shutil.which
    monkeypatch.setattr(
        daemon.shutil, "which", lambda name: None if name == "gcc" else real_which(name)
    )
    with pytest.raises(ArmSkipped, match="gcc is not installed"):
        daemon.build_passthrough_ll(source, tmp_path / "cache")


def _cell(arm: str, repeat: int, rate: float, cpu: float, **extra: object) -> dict:
    return {
        "target": "tmpfs",
        "workload": "dd4k",
        "workload_size": 1 << 30,
        "arm": arm,
        "repeat": repeat,
        "status": "ok",
        "app_mibps": rate,
        "cpu_s_per_gib": cpu,
    } | extra


def test_side_by_side_compares_like_with_like_on_xattrs() -> None:
    from bench import sidebyside

    arms = (
        "ft-adaptive",
        "ft-adaptive:xattrs=off",
        "ft-adaptive:permissions=target:xattrs=off",
        "c-ll",
        "c-ll-wb",
        "c-ll-wb:xattr",
        "c-ll-wb:xattr:default_permissions",
    )
    [table] = sidebyside.build([_cell(arm, 1, 100, 1.0) for arm in arms])
    assert table["pairs"] == [
        ("ft-adaptive", "c-ll-wb:xattr"),
        ("ft-adaptive", "c-ll-wb:xattr:default_permissions"),
        ("ft-adaptive:xattrs=off", "c-ll-wb"),
        ("ft-adaptive:xattrs=off", "c-ll"),
        ("ft-adaptive:permissions=target:xattrs=off", "c-ll-wb"),
        ("ft-adaptive:permissions=target:xattrs=off", "c-ll"),
    ]


def test_side_by_side_ratios_pair_repeats() -> None:
    from bench import sidebyside

    FT = "ft-adaptive:xattrs=off"  # serves no xattrs, like passthrough_ll without -o xattr

    cells = [
        _cell("direct", 1, 2000, 0.4),
        _cell(FT, 1, 100, 4.0),
        _cell("c-ll", 1, 200, 1.0),
        _cell("c-ll-wb", 1, 1000, 0.5),
        _cell("direct", 2, 2000, 0.4),
        _cell(FT, 2, 150, 6.0),
        _cell("c-ll", 2, 300, 1.0),
        _cell("c-ll-wb", 2, 1000, 0.5),
    ]
    files = {"target": "tmpfs", "workload": "files", "workload_size": 100, "files": 100}
    for repeat in (1, 2):
        cells.append(
            files
            | {"arm": FT, "repeat": repeat, "status": "ok", "wl_create_s": 0.5}
            | {"wl_create_cpu_s": 0.01, "wl_ls_cold_s": 1.0, "wl_ls_cold_cpu_s": 0.002}
        )
        cells.append(
            files | {"arm": "c-ll", "repeat": repeat, "status": "skipped"} | {"reason": "x"}
        )
    [table] = sidebyside.build(cells)
    assert table["pairs"] == [(FT, "c-ll-wb"), (FT, "c-ll")]
    dd = table["rows"][0]
    ratio = dd["ratios"]["ft-adaptive:xattrs=off/c-ll"]
    assert ratio["rate_of_medians"] == pytest.approx(125 / 250)
    assert sorted(ratio["rate"]) == [0.5, 0.5]  # repeat 1: 100/200, repeat 2: 150/300
    assert ratio["cpu"] == [4.0, 6.0]
    text = sidebyside.text([table])
    assert "ft-adaptive:xattrs=off/c-ll-wb" in text and "0.12x (0.10..0.15)" in text
    create = next(r for r in table["rows"] if r["row"] == "files:create")
    assert create["arms"][FT]["rate"] == [200.0, 200.0]  # 100 files / 0.5 s
    assert create["arms"][FT]["cpu"] == [pytest.approx(100.0)] * 2  # 0.01 s / 100
    assert create["arms"]["c-ll"]["status"] == "skipped"
    assert "c-ll skipped: x" in text
    assert not any(r["row"] == "files:rm" for r in table["rows"])  # no data: no row


@pytest.mark.mount
@needs_c_arm
def test_passthrough_smoke_runs_the_c_arm(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = bench("run", "--preset", "passthrough", "--smoke", "--out", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    run = json.loads((out / "run.json").read_text())
    assert run["completed"] and run["passthrough_ll"]["libfuse"]
    cells = [json.loads(line) for line in (out / "cells.jsonl").read_text().splitlines()]
    assert {c["status"] for c in cells} == {"ok"}, [c.get("reason") for c in cells]
    c_cells = [c for c in cells if c["arm"] == "c-ll"]
    assert len(c_cells) == len(run["plan"]["workloads"])
    for c in c_cells:
        assert c["daemon"] == "passthrough_ll"
        assert c["daemon_options"].startswith("source=") and "xattr" not in c["daemon_options"]
        assert c["daemon_cpu_total_s"] is not None  # reaped with wait4: it exited
        assert not Path(f"/proc/{c['daemon_pid']}/cmdline").exists() or (
            "passthrough_ll" not in Path(f"/proc/{c['daemon_pid']}/cmdline").read_text()
        )
    ft = [c for c in cells if c["arm"] == "ft-adaptive:xattrs=off"]
    # The daemon's defaults but for xattrs (like passthrough_ll's, which serves none).
    assert {c["daemon_options"] for c in ft} == {"mode=adaptive,xattrs=off"}
    files = next(c for c in cells if c["workload"] == "files" and c["arm"] == "c-ll")
    for phase in ("create", "ls_cold", "ls_warm", "stat_cold", "stat_warm", "rm"):
        assert files[f"wl_{phase}_s"] > 0 and files[f"wl_{phase}_cpu_s"] >= 0, phase
    at_once = next(c for c in cells if c["workload"] == "files8" and c["arm"] == "c-ll")
    assert at_once["files"] == 200 and at_once["wl_create_s"] > 0 and at_once["wl_rm_s"] > 0
    read = next(c for c in cells if c["workload"] == "read" and c["arm"] == "c-ll")
    assert read["app_bytes"] == 16 * MiB and read["wl_prepare_s"] > 0

    # The summary and the terminal carry the table with ratios against the C arm.
    summary = (out / "summary.md").read_text()
    header = next(line for line in summary.splitlines() if line.startswith("| workload | unit"))
    assert "ft-adaptive:xattrs=off/c-ll |" in header
    assert "ft-adaptive:xattrs=off/c-ll CPU |" in header
    rows = [line for line in summary.splitlines() if "| MiB/s, CPU-s/GiB |" in line]
    assert len(rows) == 5  # four dd block sizes and the read
    assert all(line.rstrip(" |").endswith("x") for line in rows), rows
    assert "side by side on tmpfs" in res.stdout and "ft-adaptive:xattrs=off/c-ll" in res.stdout
    assert list(out.glob("plot-*-side-by-side-rate.png"))
    summary_json = json.loads((out / "summary.json").read_text())
    assert summary_json["side_by_side"][0]["pairs"] == [["ft-adaptive:xattrs=off", "c-ll"]]

    # Torn down: no mount of type fuse.passthrough_ll (or any) left, no daemon serving one.
    mounts = Path("/proc/self/mountinfo").read_text()
    assert not [ln for ln in mounts.splitlines() if f"run-{run['pid']}" in ln]
    assert processes_mounting_under(run["pid"]) == []
    assert leftovers(run["pid"]) == []


@pytest.mark.mount
@needs_c_arm
def test_ctrl_c_during_the_c_arm_unmounts_it(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "bench", "run", "--preset", "passthrough", "--smoke"]
    cmd += ["--arms", "c-ll", "--workload", "files:30000", "--out", str(out)]
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the C arm never mounted"
            with contextlib.suppress(OSError, ValueError, KeyError):
                tag = f"run-{json.loads((out / 'run.json').read_text())['pid']}/"
                mounts = Path("/proc/self/mountinfo").read_text().splitlines()
                if any(tag in ln and "fuse.passthrough_ll" in ln for ln in mounts):
                    break
            time.sleep(0.05)
        time.sleep(0.5)  # into the workload
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    run = json.loads((out / "run.json").read_text())
    assert leftovers(run["pid"]) == []
    assert processes_mounting_under(run["pid"]) == []


def test_committed_cells_may_be_gzipped(tmp_path: Path) -> None:
    """bench/results keeps cells.jsonl gzipped where the clone's size asks for it: the report
    reads them the same."""
    from bench.results import read_cells

    cells = [{"cell": "001-seq-idle-r1", "status": "ok"}, {"cell": "002-seq-direct-r1"}]
    text = "".join(json.dumps(c) + "\n" for c in cells)
    (tmp_path / "cells.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    assert read_cells(tmp_path) == cells
    (tmp_path / "cells.jsonl").write_text(text[: text.index("\n") + 1])  # the plain one wins
    assert read_cells(tmp_path) == cells[:1]


@needs_root
def test_the_c_arm_stops_when_another_mount_namespace_holds_a_copy_of_its_mount(
    tmp_path: Path,
) -> None:
    """A run beside others (a Debian 13 root's test, a container) may copy the C example's mount
    into a private mount namespace; the host's unmount does not reach the copy, and the example
    kept reading /dev/fuse until that namespace ended: a bench cell's stop took minutes. The
    stop aborts the connection of a mount that is gone here, and the example exits 0."""
    from bench import daemon
    from bench.system import ArmSkipped, Teardown

    if shutil.which("unshare") is None:
        pytest.skip("needs util-linux's unshare")
    try:
        build = daemon.build_passthrough_ll(cache=tmp_path / "cache")
    except ArmSkipped as err:
        pytest.skip(str(err))
    (tmp_path / "backing").mkdir()
    teardown = Teardown(tmp_path / "journal")
    mount = daemon.PassthroughLLMount(
        build.binary,
        tmp_path / "backing",
        tmp_path / "mnt",
        "",
        tmp_path / "c.log",
        teardown,
        None,
    )
    holder = None
    try:
        mount.start()
        (tmp_path / "mnt" / "f").write_bytes(b"kept")
        # A namespace made now holds a copy of the mount (the host's mounts are private here;
        # where they are shared, make the copy private so the host's unmount cannot reach it).
        holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sleep", "120"]
        )
        time.sleep(0.5)
        info = mount.stop(timeout=600)  # the bench's own bound
        holder_alive = holder.poll() is None
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
        mount.close()
        teardown.undo_all()
    assert info["exit_code"] == 0, info
    # The stop did not wait for the namespace holding the copy to end.
    assert holder_alive, f"the stop waited {info['stop_seconds']:.0f} s, for the other namespace"
    assert (tmp_path / "backing" / "f").read_bytes() == b"kept"
