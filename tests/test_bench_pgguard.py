"""bench.pgguard's own decisions: which cgroup holds the database and what ``guard=`` the guarded
arm mounts with on each cgroup hierarchy, and that its summary reports the worst repeat.

A guard naming a cgroup v1 directory would be refused by the daemon (no per-cgroup pressure
there), and a summary that kept the best repeat would hide the very run the issue asks about.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # bench/ is not an installed package; import it from the tree
    sys.path.insert(0, str(REPO))

from bench.pgguard import (  # noqa: E402
    DB_CGROUP,
    Result,
    database_cgroup,
    guard_option,
    main,
    summary,
)


def test_the_database_gets_a_cgroup_of_its_own_on_either_hierarchy(tmp_path: Path) -> None:
    v1 = database_cgroup(tmp_path)
    assert not v1.unified
    assert v1.path == tmp_path / "memory" / DB_CGROUP
    assert v1.limit_file.name == "memory.limit_in_bytes"
    (tmp_path / "cgroup.controllers").write_text("cpu io memory pids\n")
    v2 = database_cgroup(tmp_path)
    assert v2.unified
    assert v2.path == tmp_path / DB_CGROUP
    assert v2.limit_file.name == "memory.max"


def test_the_guard_names_the_databases_cgroup_only_where_it_has_pressure(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("memory io\n")
    v2 = database_cgroup(tmp_path)
    assert guard_option("db", v2) == f"guard={tmp_path / DB_CGROUP}"
    assert guard_option("host", v2) == "guard=host"
    v1 = database_cgroup(tmp_path / "v1")
    assert guard_option("host", v1) == "guard=host"
    with pytest.raises(ValueError, match="cgroup v2"):
        guard_option("db", v1)


def test_the_summary_keeps_each_arms_worst_repeat_against_its_own_idle() -> None:
    results = [
        Result("idle", 0, 1000.0, 4.0, 2.0, 0, 0.0),
        Result("ft-guard", 0, 990.0, 5.0, 2.1, 3, 50.0),
        Result("idle", 1, 500.0, 8.0, 4.0, 0, 0.0),
        Result("ft-guard", 1, 400.0, 20.0, 5.0, 1, 10.0),
    ]
    row = next(line for line in summary(results).splitlines() if line.startswith("| ft-guard"))
    # repeat 1 is the worst: 400/500 TPS, 20/8 p99, 10 MB/s
    assert row == "| ft-guard | 0.800 | 2.50 | 20.0 | 10.0 |"


def test_bad_arguments_get_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--out", "/nonexistent/x", "--schedule", "fast"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bench.pgguard: --schedule:")
