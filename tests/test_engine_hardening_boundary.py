"""The engine's edges: what crosses the C boundary, and what bad input does at it.

An option past its sane limit is one line, never a number the engine's clock or counters
overflow on; the library's structures are checked against ctypes' at load; a mount handed no
source fails with its reason instead of crashing the process. A file that lost its last name
before its sync is no sample of the target's commit rate. Names of every byte but NUL and '/'
pass through create, rename, extended attributes, status and the stop's report of what a hung
target does not have, which names them whole and on one line each.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from conftest import MakeMount
from mount_util import FUSETHROTTLE, status_json, wait_for

from fusethrottle.engine import native
from fusethrottle.names import shown
from fusethrottle.service.options import OptionError, parse_options

needs_engine = pytest.mark.skipif(
    not native.library_path().exists(), reason="the native engine is not built (scripts/install)"
)

#: Every byte a name may hold: all but NUL and '/' (254 of them, within NAME_MAX).
EVERY_BYTE = bytes(b for b in range(1, 256) if b != ord("/"))
#: A directory name with the characters a line or an option list is cut at, all valid UTF-8:
#: every other helper on the host reads the mount table too.
ODD_DIR = "odd\n\r\x1b[31m\x1c\x85\\ ,x\u00e9"


# -- options at and past their limits ---------------------------------------------------------

AT_THE_LIMIT = [
    "max_age=720h",
    "admission_timeout=720h",
    "unmount_timeout=720h",
    "attr_timeout=720h",
    "drain=720h",
    "kernel_cache=1024T",
    "read_ahead=1024T",
    "metered_limit=1024T",
    "ops_limit=1024T",
    "threads=4096",
    "meter_read_units=1000000",
    "meter_write_units=1000000",
    "meter_read_factor=1",
    "meter_granule=1024T",
    "tolerance=1000000",
]

PAST_THE_LIMIT = [
    ("max_age=9999999h", "option max_age: too long: '9999999h' (at most 30 days, 720h)"),
    ("max_age=721h", "option max_age: too long"),
    ("admission_timeout=" + "9" * 400, "option admission_timeout: too long: '999"),
    ("unmount_timeout=43201m", "option unmount_timeout: too long"),
    ("attr_timeout=2592001", "option attr_timeout: too long"),
    ("window=1025T", "option window: too large: '1025T' (at most 1024T)"),
    ("window=" + "9" * 400, "option window: too large: '999"),
    ("batch=99999999999999T", "option batch: too large"),
    ("window_max=2048T", "option window_max: too large"),
    ("memory_cgroup_limit=1025T", "option memory_cgroup_limit: too large"),
    ("metered_limit=" + "1" * 30, "option metered_limit: too large"),
    ("meter_granule=2000T", "option meter_granule: too large"),
    ("threads=4097", "option threads: too large: '4097' (at most 4096)"),
    ("threads=" + "9" * 30, "option threads: too large"),
    ("meter_read_units=4294967296", "option meter_read_units: too large"),
    ("meter_read_factor=nan", "option meter_read_factor: not a number between"),
    ("meter_read_factor=1e300", "option meter_read_factor: not a number between"),
    ("meter_read_factor=-0.5", "meter: read_factor must be in (0, 1]"),
    ("tolerance=inf", "option tolerance: not a number between"),
    ("tolerance=nan", "option tolerance: not a number between"),
    ("budget_weight=inf", "option budget_weight: not a number between"),
]


@pytest.mark.parametrize("option", AT_THE_LIMIT)
def test_an_option_at_its_limit_is_taken(option: str) -> None:
    parse_options([option])


@pytest.mark.parametrize(("option", "said"), PAST_THE_LIMIT)
def test_an_option_past_its_limit_is_refused_in_one_short_line(option: str, said: str) -> None:
    """Before, max_age=9999999h and tolerance=nan were taken (the first overflowed the engine's
    clock, the second passed every comparison), and a number of 400 digits was a traceback."""
    with pytest.raises(OptionError) as refused:
        parse_options([option])
    line = str(refused.value)
    assert line.startswith(said), line
    assert "\n" not in line and len(line) < 160, line


def test_a_number_past_any_option_from_the_command_is_one_line_and_no_traceback(
    workdir: Path,
) -> None:
    (workdir / "src").mkdir()
    (workdir / "mnt").mkdir()
    for option in ("window=" + "9" * 400, "max_age=9999999h"):
        run = subprocess.run(
            [FUSETHROTTLE, str(workdir / "src"), str(workdir / "mnt"), "-f", "-o", option],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert run.returncode != 0, run
        assert "Traceback" not in run.stderr, run.stderr
        assert len(run.stderr.strip().splitlines()) == 1, run.stderr
        assert not os.path.ismount(workdir / "mnt")


# -- the C boundary -----------------------------------------------------------------------------


@needs_engine
def test_the_librarys_structures_are_laid_out_as_ctypes_lays_out_ours() -> None:
    lib = native.load()  # checks every structure: a mismatch is EngineUnavailable
    out = (ctypes.c_size_t * 64)()
    n = lib.ft_engine_layout(1, out, 64)
    assert tuple(out[:n]) == native.ctypes_layout(native._Config)
    assert lib.ft_engine_layout(99, out, 64) == 0


@needs_engine
@pytest.mark.parametrize("change", ["a field less", "a field of another type"])
def test_a_library_laid_out_otherwise_is_refused_in_one_line(change: str) -> None:
    """A field added to struct ft_engine_config on one side only, or one of another type: the
    engine would read every field after it from the wrong place."""
    fields = list(native._Config._fields_)
    if change == "a field less":
        fields.pop()
    else:
        fields[fields.index(("max_threads", ctypes.c_uint))] = ("max_threads", ctypes.c_uint64)
    other = type("Other", (ctypes.Structure,), {"_fields_": fields})
    lib = native.load()
    path = native.library_path()
    with pytest.raises(native.EngineUnavailable) as refused:
        native.check_layouts(lib, path, {1: ("ft_engine_config", other, True)})
    line = str(refused.value)
    assert "\n" not in line and "struct ft_engine_config" in line and "rebuild it" in line
    if change == "a field of another type":
        assert "field switch_credentials of struct ft_engine_config at 52" in line, line


MOUNT_WITH_NOTHING = textwrap.dedent(
    """
    import ctypes, sys
    from fusethrottle.engine import native
    lib = native.load()
    error = ctypes.create_string_buffer(512)
    for config in (native._Config(), None):
        raw = ctypes.byref(config) if config is not None else None
        handle = lib.ft_engine_mount(raw, error, 512)
        print(handle or 0, error.value.decode(), flush=True)
    """
)


@needs_engine
def test_a_mount_given_no_source_fails_with_its_reason_and_the_process_lives() -> None:
    """Before, ft_engine_mount built a std::string of the NULL source: the process died of
    it (in a child here, so the test reports it)."""
    run = subprocess.run(
        [sys.executable, "-c", MOUNT_WITH_NOTHING],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "ASAN_OPTIONS": "detect_leaks=0"},
    )
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    assert run.stdout.splitlines() == ["0 no source or mountpoint given"] * 2, run.stdout


def test_the_stops_report_reads_names_of_any_byte_whole() -> None:
    names = [EVERY_BYTE, b"new\nline", b"cr\rand\x1cfs\x85", b"7 looks like a record"]
    records = b"".join(b"%d /t/%s\0" % (i, name) for i, name in enumerate(names))
    assert native.parse_unsynced(records) == [
        (os.fsdecode(b"/t/" + name), i) for i, name in enumerate(names)
    ]
    assert native.parse_unsynced(b"") == []
    assert native.parse_unsynced(b"garbage\0") == []  # never raises on the stop's path


def test_a_shown_path_is_one_line_that_names_one_path() -> None:
    path = os.fsdecode(b"/t/" + EVERY_BYTE)
    line = shown(path)
    assert line.isprintable() and "\n" not in line and "\r" not in line
    assert "\\x0a" in line and "\\x1b" in line and "\\xff" in line and "\\x7f" in line
    assert shown("/t/a\\x0a") != shown("/t/a\n")  # a backslash of the name is doubled
    assert shown("/plain/path with spaces/é") == "/plain/path with spaces/é"


# -- through real mounts ----------------------------------------------------------------------


def _fsync_bytes(status: dict[str, Any]) -> int:
    return sum(status["fsync_bytes"].values())


@needs_engine
@pytest.mark.mount
def test_a_file_with_no_name_left_is_no_fsync_sample(make_mount: MakeMount) -> None:
    """Its sync is skipped: before, its bytes were counted as synced in a few microseconds,
    a sample the controller took as the target's commit rate (4 MiB in 13 us: 300 GB/s)."""
    ft = make_mount(options=["writeback_cache=no"])
    fd = os.open(ft.mountpoint / "gone", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"x" * (4 << 20))
        os.unlink(ft.mountpoint / "gone")
    finally:
        os.close(fd)
    assert wait_for(lambda: status_json(ft.mountpoint)["unsynced_bytes"] == 0, 30)
    status = status_json(ft.mountpoint)
    assert status["fsyncs_in_flight"] == 0
    assert _fsync_bytes(status) == 0, status["fsync_bytes"]
    assert status["synced_bytes"] == 0
    # A file that keeps its name is a sample, as before.
    (ft.mountpoint / "kept").write_bytes(b"y" * (1 << 20))
    assert wait_for(lambda: _fsync_bytes(status_json(ft.mountpoint)) == 1 << 20, 30)


@needs_engine
@pytest.mark.mount
def test_names_of_every_byte_pass_create_rename_xattrs_and_status(workdir: Path) -> None:
    """Source and mountpoint with a newline, a carriage return, a comma, a backslash: before,
    the comma split the fsname= option (the mount failed) and the mount table cut the line at
    the carriage return (the mount was never found)."""
    from mount_util import running, start_fusethrottle

    source = workdir / f"src{ODD_DIR}"
    mountpoint = workdir / f"mnt{ODD_DIR}"
    source.mkdir()
    mountpoint.mkdir()
    name = os.fsdecode(EVERY_BYTE)
    renamed = os.fsdecode(EVERY_BYTE[::-1])
    with running(start_fusethrottle(source, mountpoint, ["xattrs=on"])) as ft:
        (mountpoint / name).write_bytes(b"every byte")
        os.rename(mountpoint / name, mountpoint / renamed)
        xattr = os.fsdecode(b"user." + EVERY_BYTE[:200])
        os.setxattr(mountpoint / renamed, xattr, EVERY_BYTE)
        assert os.getxattr(mountpoint / renamed, xattr) == EVERY_BYTE
        assert os.listxattr(mountpoint / renamed) == [xattr]
        assert os.listdir(mountpoint) == [renamed]
        assert (source / renamed).read_bytes() == b"every byte"
        text = subprocess.run(
            [FUSETHROTTLE, "status", str(mountpoint)], capture_output=True, timeout=30, check=True
        ).stdout.decode()
        first = text.splitlines()[0]
        assert first.startswith(f"fusethrottle on {shown(str(mountpoint))} "), first
        assert f"(source {shown(str(source))})" in first, first
        assert "\x1b" not in text and "\r" not in text
        assert json.loads(
            subprocess.run(
                [FUSETHROTTLE, "status", str(mountpoint), "--json"],
                capture_output=True,
                timeout=30,
                check=True,
            ).stdout
        )["mount"]["mountpoint"] == str(mountpoint)
        os.unlink(mountpoint / renamed)
        assert ft.stop() == 0
    log = ft.log()
    assert f"mounted {shown(str(source))} on {shown(str(mountpoint))} " in log, log


HOLDER = textwrap.dedent(
    """
    import os, sys, time
    fd = os.open(os.fsencode(sys.argv[1]) + bytes.fromhex(sys.argv[2]), os.O_RDWR | os.O_CREAT)
    os.write(fd, b"x" * (1 << 20))
    print("ready", flush=True)
    time.sleep(3600)
    """
)


@needs_engine
@pytest.mark.mount
def test_the_stop_names_files_of_every_byte_a_hung_target_does_not_have(
    workdir: Path, make_memfs: Any, make_mount: MakeMount
) -> None:
    """Before, the engine's report was split at every line break the names held (a newline,
    a carriage return, a file separator): int() of a name's piece raised on the stop's path,
    where the report matters most, and nothing was named."""
    switch = workdir / "slow-now"
    target, _ = make_memfs("target", slow_all_while=(switch, 8.0))
    ft = make_mount(
        source=target.mountpoint,
        options=["writeback_cache=no", "unmount_timeout=3s", "max_age=1h"],
        name="top",
    )
    names = [EVERY_BYTE, b"7 a record of its own\n0 forged"]
    holders = [
        subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(ft.mountpoint) + "/", name.hex()],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for name in names
    ]
    try:
        for holder in holders:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        switch.touch()
        ft.signal(signal.SIGTERM)
        assert wait_for(lambda: not ft.is_mounted(), 3 + 10), "the mount outlived the stop"
        switch.unlink()  # the target is back: the calls it holds end within 8 s
        code = ft.wait(90)
    finally:
        for holder in holders:
            holder.kill()
            holder.wait(60)
        switch.unlink(missing_ok=True)
    ft.expect_log_problems = True
    target.expect_log_problems = True
    log = ft.log()
    assert "Traceback" not in log, log
    assert code == 1, log
    for name in names:
        path = shown(os.fsdecode(os.fsencode(str(target.mountpoint)) + b"/" + name))
        line = f"not on the target: {path} (the target did not answer)"
        assert line in log, log
    assert "2 file(s) could not be synced before exit" in log, log
    assert not any(line.startswith("0 forged") for line in log.splitlines()), log
