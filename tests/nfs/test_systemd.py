"""Issue 54 under a real systemd: the lab VM booted with systemd as PID 1 on cgroup v2
(``python -m bench.nfslab run systemd``), the mount run by the repository's own
``fusethrottle@.service``, its source a directory of the lab's NFS export.

* ``systemctl reload`` during a backup: the new window and limit read back from ``status``
  while the backup still runs, an invalid ``/etc/fusethrottle/NAME.conf`` refused whole with one
  line in the unit's journal and the running settings kept, every byte on the target.
* The pressure guard naming a unit's cgroup (``guard=/sys/fs/cgroup/system.slice/...``): with
  the kernel's PSI triggers armed, it cuts the backup's rate when that unit stalls on io, and
  not when another unit does.

Elsewhere (the lab's own init, a host) these tests are skipped.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mount_util import wait_for

from fusethrottle.observability.status_client import find_mount_of, query

from .lab import IN_LAB, fresh_dir

MiB = 1 << 20
REPO = Path(__file__).resolve().parents[2]
UNDER_SYSTEMD = (
    Path("/proc/1/comm").read_text().strip() == "systemd"
    and "ftlab_init=" in Path("/proc/cmdline").read_text()
)
pytestmark = pytest.mark.skipif(
    not (IN_LAB and UNDER_SYSTEMD),
    reason="runs in the NFS lab VM booted with systemd (python -m bench.nfslab run systemd)",
)
#: The lab's export disk (guest.DISK): the protected unit's io stalls are its reads of it.
DISK = "/dev/vda"
#: How fast the stalling units may read DISK (io.max through systemd, whose K is 1000): each
#: of their reads then waits, so the unit's io pressure is near 100% while it reads.
STALL_READ_LIMIT = "256K"
#: Idle, the unit waits on a FIFO nobody writes (bash's read: no process per look; under TCG a
#: sleep(1) every 0.1 s cost a vCPU's worth).
STALL_SCRIPT = """\
fifo=/run/$$.idle
mkfifo "$fifo"
exec 3<>"$fifo"
while :; do
    if [ -e "$1" ]; then
        dd if={disk} of=/dev/null bs=64k count=8 iflag=direct status=none
    else
        read -r -t 0.2 -u 3 || true
    fi
done
"""


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if check and out.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: exit {out.returncode}: {out.stderr.strip()}")
    return out


def status_json(mountpoint: Path) -> dict[str, Any]:
    """The mount's status, asked on its status socket from this process (under TCG a
    ``fusethrottle status`` process took over 30 s to start beside a backup)."""
    return query(find_mount_of(str(mountpoint)), "status", timeout=60)


def record(name: str, facts: dict[str, Any]) -> None:
    """What a run measured, for the report (FTLAB_OUT is the job's share)."""
    print(name, json.dumps(facts))
    out = os.environ.get("FTLAB_OUT")
    if out:
        (Path(out) / f"{name}.json").write_text(json.dumps(facts, indent=2) + "\n")


@pytest.fixture(scope="module")
def unit_installed() -> None:
    """The repository's unit and helper where the package puts them, and /usr/bin/fusethrottle
    running this checkout (the guest's root is a tmpfs overlay: the host's stays untouched)."""
    shutil.copy2(REPO / "systemd" / "fusethrottle@.service", "/etc/systemd/system/")
    Path("/usr/libexec/fusethrottle").mkdir(parents=True, exist_ok=True)
    shutil.copy2(REPO / "systemd" / "clear-stale-mount", "/usr/libexec/fusethrottle/")
    wrapper = Path("/usr/bin/fusethrottle")
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -m fusethrottle "$@"\n')
    wrapper.chmod(0o755)
    Path("/etc/fusethrottle").mkdir(exist_ok=True)
    sh("systemctl", "daemon-reload")


class Service:
    """One ``fusethrottle@NAME.service`` and its settings file."""

    def __init__(self, mountpoint: Path) -> None:
        self.mountpoint = mountpoint
        name = sh("systemd-escape", "--path", str(mountpoint)).stdout.strip()
        self.unit = f"fusethrottle@{name}.service"
        self.conf = Path("/etc/fusethrottle") / f"{name}.conf"

    def write_conf(self, source: Path, options: str) -> None:
        self.conf.write_text(f"SOURCE={source}\nOPTIONS={options}\n")

    def start(self) -> None:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        out = sh("systemctl", "start", self.unit, check=False)
        assert out.returncode == 0, f"{out.stderr}\n{self.journal()}"

    def show(self, prop: str) -> str:
        return sh("systemctl", "show", "-P", prop, self.unit).stdout.strip()

    def journal(self) -> list[str]:
        """The unit's journal lines, its daemon's and systemd's about it, oldest first."""
        return sh(
            "journalctl", "-u", self.unit, "-o", "cat", "--no-pager", "-q"
        ).stdout.splitlines()

    def stop(self) -> None:
        sh("systemctl", "stop", self.unit, check=False)
        sh("systemctl", "reset-failed", self.unit, check=False)


@contextlib.contextmanager
def service(mountpoint: Path, source: Path, options: str) -> Iterator[Service]:
    svc = Service(mountpoint)
    svc.write_conf(source, options)
    try:
        svc.start()
        yield svc
    finally:
        svc.stop()


class Backup:
    """A backup writing 1 MiB blocks of known content into *path* on a thread, until *total*
    bytes or until stopped; its digest and size once done."""

    def __init__(self, path: Path, total: int | None = None) -> None:
        self.path, self.total = path, total
        self.written = 0
        self.digest = b""
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        h = hashlib.sha256()
        try:
            with self.path.open("wb") as f:
                i = 0
                while not self._stop.is_set() and (self.total is None or self.written < self.total):
                    block = i.to_bytes(8, "little") * (MiB // 8)
                    f.write(block)
                    h.update(block)
                    self.written += MiB
                    i += 1
                f.flush()
                os.fsync(f.fileno())
            self.digest = h.digest()
        except BaseException as err:  # reported by finish()
            self.error = err

    def __enter__(self) -> Backup:
        self._thread.start()
        return self

    def running(self) -> bool:
        return self._thread.is_alive()

    def finish(self, timeout: float = 600) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the backup did not finish"
        assert self.error is None, self.error

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(600)


def on_target(path: Path) -> tuple[int, bytes]:
    """The size and digest of what reached the target."""
    h, size = hashlib.sha256(), 0
    with path.open("rb") as f:
        while block := f.read(MiB):
            h.update(block)
            size += len(block)
    return size, h.digest()


def settings_of(mountpoint: Path) -> tuple[int, int]:
    snap = status_json(mountpoint)
    return int(snap["controller"]["window"]), int(snap["mount"]["metered_limit"])


def test_a_reload_during_a_backup_applies_the_new_file_and_refuses_an_invalid_one(
    unit_installed: None,
) -> None:
    source = fresh_dir("rw")[0]
    # A dash: the instance is mnt-ft\\x2dreload and so is its file's name, which systemd's
    # EnvironmentFile= (a glob) could not read: the service did not start.
    mnt = Path("/mnt/ft-reload")
    before = "mode=static,batch=16M,window=64M,metered_limit=4M"
    with service(mnt, source, before) as svc:
        assert svc.show("ActiveState") == "active"
        assert settings_of(mnt) == (64 * MiB, 4 * MiB)
        pid = svc.show("MainPID")
        with Backup(mnt / "backup.bin", 64 * MiB) as backup:
            # A new window and limit: `systemctl reload` while the backup writes.
            svc.write_conf(source, "mode=static,batch=16M,window=32M,metered_limit=16M")
            start = time.monotonic()
            sh("systemctl", "reload", svc.unit)
            assert wait_for(lambda: settings_of(mnt) == (32 * MiB, 16 * MiB), timeout=60)
            took = time.monotonic() - start
            assert backup.running(), "the backup ended before the reload: it proved nothing"
            written_at_reload = backup.written
            changed = status_json(mnt)["settings_changed"]
            assert any("reload of" in line and str(svc.conf) in line for line in changed), changed
            # Invalid files: refused whole with one line, the running settings stay.
            refusals = []
            for options, says in (
                ("mode=static,batch=16M,window=4M,metered_limit=1M", "must be at least batch"),
                ("mode=static,batch=16M,window=32M,metered_limit=lots", "not a size"),
                ("mode=static,batch=16M,window=32M,allow_other", "cannot change while mounted"),
            ):
                svc.write_conf(source, options)
                known = len(svc.journal())
                sh("systemctl", "reload", svc.unit)

                def refused(known: int = known) -> bool:
                    return any("refused" in line for line in svc.journal()[known:])

                assert wait_for(refused, timeout=120, interval=0.5), svc.journal()[-10:]
                lines = svc.journal()[known:]
                said = [line for line in lines if "refused" in line]
                assert len(said) == 1 and says in said[0], lines
                assert not [line for line in lines if "settings changed" in line], lines
                refusals.append(said[0])
                assert settings_of(mnt) == (32 * MiB, 16 * MiB)
                assert svc.show("ActiveState") == "active" and svc.show("MainPID") == pid
            backup.finish()
            assert backup.written == 64 * MiB
        # Stopped (the daemon syncs everything): every byte written is on the target.
        svc.stop()
        assert on_target(source / "backup.bin") == (64 * MiB, backup.digest)
        assert svc.show("NRestarts") == "0"
    record(
        "systemd-reload",
        {
            "reload_to_status_seconds": round(took, 3),
            "backup_written_at_reload_mib": written_at_reload // MiB,
            "backup_total_mib": 64,
            "refusals": refusals,
        },
    )


def pressure_total(cgroup: Path, kind: str = "io") -> float:
    """Seconds the cgroup's tasks stalled on *kind* (its PSI ``some`` total)."""
    first = (cgroup / f"{kind}.pressure").read_text().splitlines()[0]
    return int(first.rsplit("total=", 1)[1]) / 1e6


@contextlib.contextmanager
def stalling_unit(name: str, flag: Path) -> Iterator[Path]:
    """A service of its own that reads DISK slowly (io.max) while *flag* exists, idle
    otherwise; its cgroup's directory."""
    script = Path("/run") / f"{name}.sh"
    script.write_text(STALL_SCRIPT.format(disk=DISK))
    unit = f"{name}.service"
    sh(
        "systemd-run", f"--unit={unit}", "-p", f"IOReadBandwidthMax={DISK} {STALL_READ_LIMIT}",
        "/bin/bash", str(script), str(flag),
    )  # fmt: skip
    try:
        cgroup = Path("/sys/fs/cgroup/system.slice") / unit
        assert wait_for(lambda: (cgroup / "io.pressure").exists(), timeout=30)
        assert f"rbps={int(STALL_READ_LIMIT[:-1]) * 1000} " in (cgroup / "io.max").read_text()
        yield cgroup
    finally:
        flag.unlink(missing_ok=True)
        sh("systemctl", "stop", unit, check=False)
        sh("systemctl", "reset-failed", unit, check=False)


def watch_guard(mnt: Path, until: Callable[[], bool], timeout: float = 300) -> list[dict[str, Any]]:
    """The guard's status every 0.2 s until *until()* is true; the samples."""
    samples: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, samples[-3:]
        samples.append(status_json(mnt)["guard"])
        time.sleep(0.2)
    return samples


def test_the_guard_on_a_units_cgroup_cuts_the_backup_when_that_unit_stalls_not_another(
    unit_installed: None,
) -> None:
    source = fresh_dir("rw")[0]
    mnt = Path("/mnt/ftguard")
    db_flag, other_flag = Path("/run/ftlab-db.stall"), Path("/run/ftlab-other.stall")
    floor = 1 * MiB
    with (
        stalling_unit("ftlab-db", db_flag) as db,
        stalling_unit("ftlab-other", other_flag) as other,
    ):
        options = f"guard={db},guard_min={floor}"
        with service(mnt, source, options) as svc:
            # Idle: the guard learns the database's own pressure and opens, triggers armed.
            assert wait_for(lambda: status_json(mnt)["guard"]["state"] == "open", timeout=120)
            guard = status_json(mnt)["guard"]
            assert guard["triggers"] is True, guard
            assert guard["protects"] == str(db), guard
            assert not [line for line in svc.journal() if "polling" in line], svc.journal()
            with Backup(mnt / "backup.bin") as backup:
                # Another unit stalls (its io.pressure climbs), the database does not: the
                # backup writes on, unthrottled.
                other_flag.touch()
                other_start, db_start = pressure_total(other), pressure_total(db)
                written = backup.written
                quiet = watch_guard(mnt, lambda: pressure_total(other) - other_start >= 10)
                other_stall = pressure_total(other) - other_start
                db_stall_then = pressure_total(db) - db_start
                other_flag.unlink()
                assert backup.written > written, "the backup wrote nothing meanwhile"
                assert db_stall_then < other_stall / 10, (db_stall_then, other_stall)
                assert all(s["state"] == "open" and s["limit"] == 0 for s in quiet), quiet
                # The database stalls: the guard cuts the backup's rate, down to guard_min.
                db_flag.touch()
                db_start = pressure_total(db)
                cut = watch_guard(mnt, lambda: status_json(mnt)["guard"]["limit"] == floor)
                db_stall = pressure_total(db) - db_start
                db_flag.unlink()
                assert status_json(mnt)["guard"]["state"] == "holding"
                limits = [s["limit"] for s in cut if s["limit"]]
                assert backup.running()
            backup.finish()
            journal = svc.journal()
            assert any("guard: the protected workload stalls" in line for line in journal)
            assert not [line for line in journal if "polling" in line], journal
        assert on_target(source / "backup.bin") == (backup.written, backup.digest)
    record(
        "systemd-guard",
        {
            "protects": str(db),
            "triggers": True,
            "other_unit_stall_seconds": round(other_stall, 1),
            "db_stall_seconds_meanwhile": round(db_stall_then, 2),
            "guard_samples_while_other_stalled": len(quiet),
            "db_stall_seconds_until_guard_min": round(db_stall, 1),
            "limits_seen_mib_s": sorted({round(v / MiB, 2) for v in limits}, reverse=True),
            "backup_mib": backup.written // MiB,
        },
    )
