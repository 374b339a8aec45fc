"""The pressure guard through a real mount: a stalled workload holds the backup to guard_min.

The protected workload is a directory with the two PSI files a cgroup v2 directory has
(memory.pressure, io.pressure), whose stall totals this test moves itself: the guard reads them
exactly as it reads a real cgroup's (a regular file takes no trigger, so it polls). What the
kernel's real pressure does to a real database is the bench's to measure.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mount_util import status_json, stream_landing, wait_for

MiB = 1 << 20
#: What the engine's bucket may spend at once, in seconds of its rate (engine/src/ceilings.h).
BURST_SECONDS = 0.25


class FakePressure:
    """A cgroup's PSI files whose ``some`` total grows by *share* of the time passed."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.share = 0.0
        self.total = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._write()

    def _write(self) -> None:
        text = (
            f"some avg10=0.00 avg60=0.00 avg300=0.00 total={int(self.total)}\n"
            "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
        )
        for name in ("memory.pressure", "io.pressure"):
            tmp = self.directory / f".{name}"
            tmp.write_text(text)
            tmp.rename(self.directory / name)

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(0.05):
            now = time.monotonic()
            self.total += (now - last) * 1e6 * self.share
            last = now
            self._write()

    def __enter__(self) -> FakePressure:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture
def pressure(tmp_path: Path) -> Iterator[FakePressure]:
    directory = tmp_path / "db.scope"
    directory.mkdir()
    with FakePressure(directory) as fake:
        yield fake


def guard_of(mountpoint: Path) -> dict[str, object]:
    guard = status_json(mountpoint)["guard"]
    assert isinstance(guard, dict)
    return guard


@pytest.mark.mount
def test_a_stalled_workload_holds_the_backup_to_guard_min_and_a_calm_one_lets_it_go(
    make_mount, pressure: FakePressure
) -> None:
    floor = 4 * MiB
    daemon = make_mount(options=[f"guard={pressure.directory}", f"guard_min={floor}"])
    assert daemon.source is not None
    # Idle: the guard learns the workload's own 1% and opens.
    pressure.share = 0.01
    assert wait_for(lambda: guard_of(daemon.mountpoint)["state"] == "open", timeout=60)
    # The backup writes while the workload stalls half the time: held to guard_min.
    pressure.share = 0.5
    first = daemon.mountpoint / "warm-up.bin"
    deadline = time.monotonic() + 60
    # Each second of stall halves the backup's rate, down to guard_min: write until it is there.
    while (guard := guard_of(daemon.mountpoint))["limit"] != floor:
        assert time.monotonic() < deadline, guard
        with first.open("ab") as f:
            f.write(b"\0" * (4 * MiB))
    assert guard["state"] == "holding", guard
    # While held, the target receives no more than guard_min allows (as the ceilings' test
    # bounds it: the bound grows with the time passed, a slow machine only loosens it).
    burst = max(floor * BURST_SECONDS, MiB)
    total = 16 * MiB
    samples = stream_landing(daemon.mountpoint / "held.bin", daemon.source / "held.bin", total)
    for elapsed, size in samples:
        assert size <= burst + floor * elapsed + 2 * MiB, f"{size / MiB:.1f} MiB in {elapsed:.2f} s"
    assert (daemon.source / "held.bin").stat().st_size == total
    assert status_json(daemon.mountpoint)["ceiling_delayed"] > 0
    # Calm again: the rate climbs back and the guard opens; its time held back is counted.
    pressure.share = 0.0
    assert wait_for(lambda: guard_of(daemon.mountpoint)["state"] == "open", timeout=60)
    guard = guard_of(daemon.mountpoint)
    assert guard["limit"] == 0 and float(guard["held_seconds"]) > 0  # type: ignore[arg-type]
    assert "guard: the protected workload stalls" in daemon.log()


@pytest.mark.mount
def test_a_guard_on_a_directory_without_pressure_is_refused_in_one_line(
    tmp_path: Path, make_mount
) -> None:
    import subprocess

    from mount_util import FUSETHROTTLE

    source, mnt = tmp_path / "src", tmp_path / "mnt"
    source.mkdir()
    mnt.mkdir()
    out = subprocess.run(
        [FUSETHROTTLE, str(source), str(mnt), "-o", f"guard={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "reports no pressure" in out.stderr, out.stderr
