"""``fusethrottle set`` and a reload (SIGHUP) on a real mount while a backup writes: the new
limit holds from then on, nothing written is lost, and a refused change keeps the old one."""

from __future__ import annotations

import hashlib
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from mount_util import FUSETHROTTLE, status_json, stream_landing, wait_for

MiB = 1 << 20
#: What the engine's bucket may spend at once, in seconds of its rate (engine/src/ceilings.h).
BURST_SECONDS = 0.25


def fusethrottle_set(mountpoint: Path, *items: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [FUSETHROTTLE, "set", str(mountpoint), *items],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def write_in_background(path: Path, total: int) -> tuple[threading.Thread, list[bytes]]:
    """A backup streaming *total* bytes into *path* meanwhile: its digest when done."""
    digest: list[bytes] = []

    def run() -> None:
        h = hashlib.sha256()
        with path.open("wb") as f:
            for i in range(total // MiB):
                block = i.to_bytes(8, "little") * (MiB // 8)
                h.update(block)
                f.write(block)
            f.flush()
        digest.append(h.digest())

    thread = threading.Thread(target=run)
    thread.start()
    return thread, digest


@pytest.mark.mount
def test_set_changes_the_limit_of_a_running_backup_and_refuses_bad_values(make_mount) -> None:
    daemon = make_mount(options=["mode=static", "batch=16M", "window=64M"])
    assert daemon.source is not None
    thread, digest = write_in_background(daemon.mountpoint / "running.bin", 256 * MiB)
    # Bad values: one line, exit 2, the running settings stay.
    for items, says in (
        (["window=4M"], "must be at least batch"),
        (["allow_other=yes"], "cannot change while mounted"),
        (["metered_limit=lots"], "not a size"),
    ):
        out = fusethrottle_set(daemon.mountpoint, *items)
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and says in out.stderr, out
    assert status_json(daemon.mountpoint)["controller"]["window"] == 64 * MiB
    # A new window and a ceiling, during the backup.
    out = fusethrottle_set(daemon.mountpoint, "window=32M", "metered_limit=8M")
    assert out.returncode == 0, out.stderr
    assert (
        "window 67108864 -> 33554432" in out.stdout and "metered_limit 0 -> 8388608" in out.stdout
    )
    thread.join(timeout=300)
    assert digest, "the backup did not finish"
    snap = status_json(daemon.mountpoint)
    assert snap["controller"]["window"] == 32 * MiB
    assert snap["mount"]["metered_limit"] == 8 * MiB
    assert "fusethrottle set: window" in snap["settings_changed"][-1]
    # The ceiling holds from now on, as the ceilings' own test bounds it.
    limit, burst = 8 * MiB, max(8 * MiB * BURST_SECONDS, MiB)
    samples = stream_landing(daemon.mountpoint / "after.bin", daemon.source / "after.bin", 12 * MiB)
    for elapsed, size in samples:
        assert size <= burst + limit * elapsed + MiB, f"{size / MiB:.1f} MiB in {elapsed:.2f} s"
    # Nothing of the running backup was lost on the way.
    with (daemon.source / "running.bin").open("rb") as f:
        assert hashlib.file_digest(f, "sha256").digest() == digest[0]
    # And the ceiling can go again.
    assert fusethrottle_set(daemon.mountpoint, "metered_limit=0").returncode == 0
    assert status_json(daemon.mountpoint)["mount"]["metered_limit"] == 0


@pytest.mark.mount
def test_a_reload_applies_the_file_or_nothing(make_mount, tmp_path: Path) -> None:
    conf = tmp_path / "backups.conf"
    daemon = make_mount(
        options=["mode=static", "batch=16M", "window=64M"],
        wrapper=["env", f"FUSETHROTTLE_CONF={conf}"],
    )
    source = daemon.source
    conf.write_text(f"SOURCE={source}\nOPTIONS=mode=static,batch=16M,window=128M,max_age=5s\n")
    daemon.signal(signal.SIGHUP)
    assert wait_for(lambda: status_json(daemon.mountpoint)["controller"]["window"] == 128 * MiB, 30)
    # An invalid file: refused whole, the running settings stay.
    conf.write_text(f"SOURCE={source}\nOPTIONS=mode=static,batch=16M,window=1M,max_age=9s\n")
    daemon.signal(signal.SIGHUP)
    assert wait_for(lambda: "reload of" in daemon.log() and "refused" in daemon.log(), 30)
    daemon.expect_log_problems = True  # the refusal is logged as an error, on purpose
    snap = status_json(daemon.mountpoint)
    assert (snap["controller"]["window"], snap["mount"]["max_age"]) == (128 * MiB, 5.0)
    (daemon.mountpoint / "still.txt").write_text("serving")
    assert (source / "still.txt").read_text() == "serving"


@pytest.mark.mount
def test_a_mount_started_from_its_instance_file_rereads_that_file(
    make_mount, workdir: Path
) -> None:
    """As fusethrottle@.service starts it: ``--conf`` with the file named after the instance of
    a mount point with a dash (``mnt-ft\\x2dreload``), and no FUSETHROTTLE_CONF. systemd's
    EnvironmentFile= could not read that name (a glob drops the backslash): the service did
    not start. The source, the options and a reload all come from the one file."""
    source = workdir / "from-conf-backing"
    source.mkdir()
    conf = workdir / "mnt-ft\\x2dreload.conf"
    conf.write_text(f"# the instance's file\nSOURCE={source}\nOPTIONS='mode=static,window=64M'\n")
    daemon = make_mount(source=source, name="ft-reload", conf=conf)
    assert status_json(daemon.mountpoint)["controller"]["window"] == 64 * MiB
    (daemon.mountpoint / "through.txt").write_text("from the file's source")
    assert (source / "through.txt").read_text() == "from the file's source"
    conf.write_text(f"SOURCE={source}\nOPTIONS=mode=static,window=128M\n")
    daemon.signal(signal.SIGHUP)
    assert wait_for(lambda: status_json(daemon.mountpoint)["controller"]["window"] == 128 * MiB, 30)
    assert str(conf) in daemon.log()


def hhmm(seconds: float) -> str:
    return time.strftime("%H:%M", time.localtime(seconds))


@pytest.mark.mount
def test_a_schedule_window_holds_the_ceiling_while_it_lasts(make_mount) -> None:
    now = time.time()
    window = f"{hhmm(now - 600)}-{hhmm(now + 600)}"
    daemon = make_mount(options=["mode=off", f"metered_limit=0,{window}=8M"])
    assert daemon.source is not None
    snap = status_json(daemon.mountpoint)
    assert snap["mount"]["metered_limit"] == 8 * MiB and window in snap["schedule"], snap
    limit, burst = 8 * MiB, max(8 * MiB * BURST_SECONDS, MiB)
    samples = stream_landing(daemon.mountpoint / "night.bin", daemon.source / "night.bin", 12 * MiB)
    for elapsed, size in samples:
        assert size <= burst + limit * elapsed + MiB, f"{size / MiB:.1f} MiB in {elapsed:.2f} s"
    # The schedule goes with a new value for its ceiling.
    assert fusethrottle_set(daemon.mountpoint, "metered_limit=0").returncode == 0
    snap = status_json(daemon.mountpoint)
    assert snap["mount"]["metered_limit"] == 0 and snap["schedule"] == ""
