"""log_format=json: every line the daemon writes to stderr is one JSON object with the fields of
the text line (time, level, logger, message), for the log collectors of containers."""

from __future__ import annotations

import io
import json
import logging
import re
import signal
import sys
from pathlib import Path

import pytest
from conftest import MakeMount
from test_mount_lifecycle import assert_refused, fusethrottle

from fusethrottle.service.daemon import configure_logging
from fusethrottle.service.logformat import JsonFormatter
from fusethrottle.service.options import OptionError, parse_options

TIME_PATTERN = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$"


def record(message: str, *args: object, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise OSError(5, "Input/output error")
        except OSError:
            exc_info = sys.exc_info()
    return logging.LogRecord(
        "fusethrottle.service.daemon", logging.WARNING, __file__, 1, message, args, exc_info
    )


def test_a_record_is_one_line_of_json_with_the_text_lines_fields() -> None:
    line = JsonFormatter().format(record("not on the target: %s (%s)", "a\nb", "EIO"))
    assert "\n" not in line
    entry = json.loads(line)
    assert set(entry) == {"time", "level", "logger", "message"}
    assert entry["level"] == "WARNING"
    assert entry["logger"] == "fusethrottle.service.daemon"
    assert entry["message"] == "not on the target: a\nb (EIO)"
    assert re.match(TIME_PATTERN, entry["time"]), entry["time"]


def test_a_traceback_stays_inside_the_object() -> None:
    line = JsonFormatter().format(record("failed", exc=True))
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["exception"].startswith("Traceback")
    assert "OSError: [Errno 5] Input/output error" in entry["exception"]


def test_configure_logging_writes_json_to_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    root = logging.getLogger()
    saved = (root.level, list(root.handlers))
    try:
        configure_logging("info", foreground=True, log_format="json")
        logging.getLogger("fusethrottle.test").info("mounted %s", "/backups")
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        root.setLevel(saved[0])
        for handler in saved[1]:
            root.addHandler(handler)
    (line,) = stderr.getvalue().splitlines()
    entry = json.loads(line)
    assert entry["message"] == "mounted /backups" and entry["level"] == "INFO"


def test_log_format_is_text_or_json() -> None:
    assert parse_options([]).log_format == "text"
    assert parse_options(["log_format=json"]).log_format == "json"
    with pytest.raises(OptionError, match=r"log_format.*'xml' is not one of text, json"):
        parse_options(["log_format=xml"])


def test_a_bad_log_format_is_one_line_and_nothing_mounted(workdir: Path) -> None:
    for name in ("src", "mnt"):
        (workdir / name).mkdir()
    result = fusethrottle(str(workdir / "src"), str(workdir / "mnt"), "-f", "-o", "log_format=xml")
    assert_refused(result, workdir / "mnt", "log_format", "xml")
    assert result.returncode == 2


@pytest.mark.mount
def test_a_mount_with_log_format_json_logs_only_json_lines(make_mount: MakeMount) -> None:
    """A whole life, start to SIGTERM's final flush: every stderr line parses."""
    ft = make_mount(options=["log_format=json", "log_level=debug"])
    (ft.mountpoint / "backup.tar").write_bytes(b"x" * (3 << 20))
    ft.signal(signal.SIGTERM)
    assert ft.wait(60) == 0, ft.log()
    lines = ft.log().splitlines()
    assert lines, "the daemon logged nothing"
    entries = []
    for line in lines:
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"not a JSON line: {line!r}")
    for entry in entries:
        assert {"time", "level", "logger", "message"} <= set(entry), entry
        assert entry["level"] != "ERROR", entry
    messages = [entry["message"] for entry in entries]
    assert "SIGTERM: flushing and unmounting" in messages, messages
    assert ft.source is not None
    assert (ft.source / "backup.tar").stat().st_size == 3 << 20


@pytest.mark.mount
def test_libfuses_own_messages_are_json_lines_too(make_mount: MakeMount) -> None:
    """libfuse prints its own complaints on stderr as plain lines unless told otherwise: here
    each thread of its loop refuses the stack size FUSE_THREAD_STACK asks for (a setting
    libfuse reads itself). With log_format=json they are objects of the log like the daemon's,
    logger "libfuse", at libfuse's level."""
    ft = make_mount(options=["log_format=json"], wrapper=("env", "FUSE_THREAD_STACK=1"))
    ft.expect_log_problems = True  # libfuse's complaint is an error, on purpose
    (ft.mountpoint / "backup.tar").write_bytes(b"x" * (1 << 20))
    ft.signal(signal.SIGTERM)
    assert ft.wait(60) == 0, ft.log()
    entries = []
    for line in ft.log().splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"not a JSON line: {line!r}\n{ft.log()}")
    from_libfuse = [entry for entry in entries if entry["logger"] == "libfuse"]
    assert any(
        entry["message"] == "fuse: invalid stack size: 1" and entry["level"] == "ERROR"
        for entry in from_libfuse
    ), entries
    messages = [entry["message"] for entry in entries]
    assert "SIGTERM: flushing and unmounting" in messages, messages
    assert ft.source is not None
    assert (ft.source / "backup.tar").stat().st_size == 1 << 20
