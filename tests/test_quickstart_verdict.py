"""What the quick start says about its run is computed from that run's numbers (bench.verdict),
and bench.brief feeds it the right ones from a run directory. Pure: no mount, no root."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # bench/ is not an installed package; import it from the tree
    sys.path.insert(0, str(REPO))

from bench.brief import brief, main, on_target_mib  # noqa: E402
from bench.verdict import ArmNumbers, verdict  # noqa: E402

MiB = 1 << 20


def arm(
    worst_ms: float,
    dead: int = 0,
    ops: float | None = 80.0,
    backup: float | None = 400.0,
    dirty: float | None = 10.0,
) -> ArmNumbers:
    return ArmNumbers(
        worst_ms=worst_ms,
        dead_seconds=dead,
        ops_per_s=ops,
        backup_mib=backup,
        cgroup_dirty_peak_mib=dirty,
    )


def text(direct: ArmNumbers, through: ArmNumbers, seconds: float | None = 40.0) -> str:
    return " ".join(verdict(direct, through, seconds))


def test_a_frozen_database_directly_and_not_through_the_mount_is_said_with_both_numbers() -> None:
    said = text(arm(16016, dead=28, ops=24.8, backup=404, dirty=356), arm(272, ops=91.3))
    assert said.startswith("The database: directly its worst transaction took 16.0 s, through ")
    assert "fusethrottle 272 ms, 59 times less." in said
    assert "finished no transaction: 28 directly, none through fusethrottle." in said
    assert "91.3 transactions a second through fusethrottle, 24.8 directly (3.7 times as many)" in (
        said
    )
    assert "peaked at 356 MiB directly, 10 MiB through fusethrottle." in said
    assert (
        "400 MiB on the target in the 40 s through fusethrottle, 404 MiB directly (1.0% less)"
        in (said)
    )
    assert "no difference" not in said


def test_no_stall_directly_says_plainly_there_was_nothing_to_protect() -> None:
    said = text(arm(120), arm(60))
    assert said.startswith("This run shows no difference: directly its worst transaction took ")
    assert "120 ms, through fusethrottle 60 ms." in said
    assert "nothing to protect it from" in said
    assert "times less" not in said


def test_a_worst_wait_not_clearly_shorter_through_the_mount_is_no_difference() -> None:
    said = text(arm(900, dead=1), arm(600, dead=1))
    assert said.startswith("This run shows no difference: ")
    assert "900 ms, through fusethrottle 600 ms, not 2 times less." in said


def test_a_longer_wait_through_the_mount_is_said_to_be_longer() -> None:
    said = text(arm(800), arm(2500, dead=2))
    assert said.startswith("This run shows no protection: ")
    assert "800 ms, through fusethrottle 2500 ms, longer." in said
    assert "2 through fusethrottle" in said


def test_a_stall_left_through_the_mount_is_not_hidden_by_the_ratio() -> None:
    said = text(arm(20000, dead=15), arm(1200, dead=1))
    assert "20.0 s, through fusethrottle 1200 ms, 17 times less" in said
    assert "Through fusethrottle too a transaction took 1200 ms: less, not nothing." in said


def test_numbers_not_measured_leave_their_sentence_out() -> None:
    lines = verdict(arm(5000, ops=None, dirty=None), arm(100, ops=None, dirty=None), None)
    assert len(lines) == 1 and lines[0].startswith("The database: ")


# --- bench.brief: the numbers from a run directory ------------------------------------------------


def write_run(run: Path) -> None:
    """A run of the demo preset's shape: two arms, a 4 s schedule, samples every second."""
    cells = [
        {
            "cell": "001-seq-direct-r1",
            "arm": "direct",
            "status": "ok",
            "schedule": "20M:2s,512K:2s",
            "victim_max_ms": 3000.0,
            "victim_dead_seconds": 3,
            "victim_ops_per_s": 20.0,
            "cg_dirty_wb_peak_mib": 300.0,
            "verified": True,
        },
        {
            "cell": "002-seq-ft-adaptive-r1",
            "arm": "ft-adaptive",
            "status": "ok",
            "schedule": "20M:2s,512K:2s",
            "victim_max_ms": 100.0,
            "victim_dead_seconds": 0,
            "victim_ops_per_s": 80.0,
            "cg_dirty_wb_peak_mib": 10.0,
            "verified": True,
        },
    ]
    (run / "cells.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cells))
    with open(run / "samples.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["cell", "t", "absorbed"])
        for t in (-1, 0, 1, 2, 3, 4, 5):  # 10 MiB a second, from 100 MiB at t=0
            w.writerow(["001-seq-direct-r1", t, (100 + 10 * t) * MiB])
        for at in (-0.5, 0.5, 4.5):  # 8 MiB a second, between samples at both ends
            w.writerow(["002-seq-ft-adaptive-r1", at, int((50 + 8 * at) * MiB)])


def test_on_target_counts_the_bytes_between_the_schedules_start_and_end(tmp_path: Path) -> None:
    write_run(tmp_path)
    got = on_target_mib(tmp_path, 4.0)
    assert got["001-seq-direct-r1"] == 40.0
    assert abs(got["002-seq-ft-adaptive-r1"] - 32.0) < 1e-6


def test_brief_prints_the_table_then_the_verdict_of_its_numbers(tmp_path: Path) -> None:
    write_run(tmp_path)
    out = brief(tmp_path)
    assert "| backup written directly | 3000 | 3 | 20.0 | 40 | 300 |" in out
    assert "| through fusethrottle | 100 | 0 | 80.0 | 32 | 10 |" in out
    said = " ".join(out.split("\n\n")[1].split())
    assert said.startswith(
        "The database: directly its worst transaction took 3000 ms, through fusethrottle 100 ms, "
        "30 times less."
    )
    assert "32 MiB on the target in the 4 s through fusethrottle, 40 MiB directly (20% less)" in (
        said
    )
    assert "Every byte of every backup was read back from the target and verified." in out


def test_an_arm_that_did_not_complete_fails_the_brief_with_its_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The quick start once printed the direct row alone and exited 0 when the command it
    installed could not start: the missing arm is named, with its reason, and the exit is 1."""
    write_run(tmp_path)
    cells = [json.loads(line) for line in (tmp_path / "cells.jsonl").read_text().splitlines()]
    cells[1] |= {"status": "failed", "reason": "MountFailed: fusethrottle exited with 1"}
    (tmp_path / "cells.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cells))
    assert main([str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "| backup written directly | 3000 |" in captured.out
    assert "through fusethrottle" not in captured.out.split("\n\n")[0]
    assert (
        "not completed: through fusethrottle: failed (MountFailed: fusethrottle exited with 1)"
        in captured.err
    )


def test_a_complete_run_passes_the_brief(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_run(tmp_path)
    assert main([str(tmp_path)]) == 0
    assert capsys.readouterr().err == ""
