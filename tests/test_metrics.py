"""Metrics: the pure parts fast (names, classes, histograms, exposition), then real mounts.

The mount tests scrape a live daemon while writing through it and check that the numbers move
the way the writes say they must: bytes written, operations, fsyncs by reason, un-synced bytes
returning to zero. A bad address or a port in use must stop the mount before anything is mounted.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from engine_view import MadeUpMount
from mount_util import FUSETHROTTLE, LIFELONG_TASK, mounted, wait_for
from prometheus_client.parser import text_string_to_metric_families
from trio.testing import MockClock

import fusethrottle
from fusethrottle.engine.native import OPERATIONS
from fusethrottle.metering.meter import UNMETERED
from fusethrottle.observability import metrics
from fusethrottle.observability.metrics import (
    DEFS,
    FSYNC_BUCKETS,
    FSYNC_REASONS,
    MetricsError,
    Publisher,
    Recorder,
    bind_endpoint,
    exported_names,
    families,
    op_class,
    split_address,
)
from fusethrottle.observability.metrics.publisher import PUBLISH_INTERVAL, RATE_SPAN
from fusethrottle.observability.metrics.snapshot import Rates, recent_fsyncs
from fusethrottle.service.options import Config

REPO = Path(__file__).resolve().parent.parent
KiB = 1024
MiB = 1024 * KiB


# --- names and classes ---------------------------------------------------------------------


def test_every_metric_follows_prometheus_naming() -> None:
    for d in DEFS.values():
        assert d.name.startswith("fusethrottle_"), d.name
        assert re.fullmatch(r"[a-z_]+", d.name), d.name
        if d.kind == "counter":
            assert d.name.endswith("_total"), d.name
        else:
            assert not d.name.endswith("_total"), d.name
        if d.kind == "histogram":
            assert d.name.endswith(("_seconds", "_bytes")), d.name
        assert not re.search(r"_(ms|milliseconds|kb|mb|mib|percent)(_|$)", d.name), d.name
        assert d.help.endswith("."), d.name
        assert "le" not in d.labels and len(d.labels) <= 5, d.name


def test_every_metric_is_documented() -> None:
    text = (REPO / "docs" / "METRICS.md").read_text()
    documented = set(re.findall(r"`(fusethrottle_[a-z_]+)`", text))
    missing = [name for name in exported_names() if name not in documented]
    assert not missing, f"docs/METRICS.md does not document {missing}"
    unknown = documented - set(exported_names())
    assert not unknown, f"docs/METRICS.md documents metrics that do not exist: {unknown}"


def test_the_dashboard_plots_only_metrics_that_exist() -> None:
    import json

    dashboard = json.loads((REPO / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", []) if "expr" in t]
    used = {m for e in exprs for m in re.findall(r"\bfusethrottle_[a-z_]+", e)}
    series = set(exported_names())
    for d in DEFS.values():
        if d.kind == "histogram":
            series |= {d.name + "_bucket", d.name + "_sum", d.name + "_count"}
    assert used and used <= series, used - series
    text = "\n".join(exprs)
    for host in ("node_memory_Dirty_bytes", "node_memory_Writeback_bytes", "node_mountstats_nfs_"):
        assert host in text


def test_every_request_the_engine_sends_to_the_target_has_a_metering_class() -> None:
    # Classified on purpose, not metered by op_class's default for a kind nobody thought of.
    unclassified = set(OPERATIONS) - UNMETERED - metrics.CLASSIFIED_OPS
    assert not unclassified, f"classify {sorted(unclassified)} in meter.METADATA_CLASS"


@pytest.mark.parametrize(
    ("op", "cls"),
    [
        ("read", "data_read"),
        ("write", "data_write"),
        ("lookup", "meta_read"),
        ("getattr", "meta_read"),
        ("readdir", "meta_read"),
        ("open", "meta_read"),
        ("statfs", "meta_read"),
        ("create", "meta_write"),
        ("rename", "meta_write"),
        ("setattr", "meta_write"),
        ("fsync", "meta_write"),
        ("fallocate", "meta_write"),
        ("some_future_op", "meta_write"),
    ],
)
def test_op_class(op: str, cls: str) -> None:
    assert op_class(op).value == cls


# --- the recorder --------------------------------------------------------------------------


def test_histogram_bucket_bounds_are_inclusive_and_reach_two_minutes() -> None:
    rec = Recorder()
    for seconds in (0.001, 1.0, 119.0, 120.0, 500.0):
        rec.fsync("batch", seconds, 10, None)
    h = rec.fsync_duration["batch"].freeze()
    cumulative = dict(h.cumulative())
    assert FSYNC_BUCKETS[-1] == 120.0
    assert cumulative["0.001"] == 1
    assert cumulative["1.0"] == 2
    assert cumulative["120.0"] == 4
    assert cumulative["+Inf"] == h.count == 5
    assert h.sum == pytest.approx(0.001 + 1 + 119 + 120 + 500)


def test_fsync_accounting_by_reason() -> None:
    rec = Recorder()
    rec.fsync("batch", 0.2, 100, None)
    rec.fsync("age", 0.2, 50, errno.EIO)
    rec.fsync("application", 0.1, 7, errno.EIO)
    assert set(FSYNC_REASONS) <= set(rec.fsync_duration)
    assert rec.fsync_bytes["batch"] == 100 and rec.fsync_bytes["age"] == 0
    assert rec.fsync_errors == {**dict.fromkeys(FSYNC_REASONS, 0), "age": 1, "application": 1}
    # An injected fsync's failure is a target error; the application's own failure is among
    # the engine's error answers (merged in engine_snapshot), so not twice.
    assert dict(rec.target_errors) == {("fsync", errno.EIO): 1}


def test_recent_fsyncs_are_nearest_rank_over_five_minutes() -> None:
    now = 1000.0
    samples = [(now - 400, 99.0)] + [(now - 10, float(s)) for s in range(1, 201)]
    recent = recent_fsyncs(samples, now)
    assert recent.samples == 200  # the one of 400 s ago is out
    assert (recent.p50, recent.p99, recent.max) == (100.0, 198.0, 200.0)
    assert recent_fsyncs([], now).p99 is None


# --- snapshots and exposition (the daemon's publisher over a made-up engine, no kernel) -----


@pytest.fixture
def made_up(tmp_path: Path) -> MadeUpMount:
    """The daemon's Publisher over an engine whose statistics the test sets."""
    return MadeUpMount(Config(source=str(tmp_path), mountpoint=str(tmp_path / "mnt"), metrics=""))


def _scrape_text(m: Publisher) -> str:
    from prometheus_client import generate_latest

    return generate_latest(metrics.make_registry(m)).decode()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_snapshot_and_scrape_of_a_made_up_mount(made_up: MadeUpMount) -> None:
    publisher = made_up.publisher

    async def main() -> str:
        made_up.request("write", 1000)
        made_up.wrote(1000)
        # Recorded as the daemon records the engine's event; the controller is not fed.
        made_up.fsyncs.fsync("window", 2.0, 1000, None)
        made_up.errors.append(("lookup", errno.ENOENT, 1))
        publisher.publish(sample=True)
        return _scrape_text(publisher)

    text = trio.run(main)
    samples = _samples(text)
    assert samples[("fusethrottle_written_bytes_total", ())] == 1000
    assert samples[("fusethrottle_operations_total", (("op", "write"),))] == 1
    assert samples[("fusethrottle_target_operations_total", (("op", "write"),))] == 1
    assert samples[("fusethrottle_target_errors_total", (("errno", "ENOENT"), ("op", "lookup")))]
    assert samples[("fusethrottle_fsync_duration_seconds_count", (("reason", "window"),))] == 1
    bucket = "fusethrottle_fsync_duration_seconds_bucket"
    assert samples[(bucket, (("le", "2.5"), ("reason", "window")))] == 1
    assert samples[(bucket, (("le", "1.0"), ("reason", "window")))] == 0
    # Slow start: until an fsync has measured the target, at most 16 MiB is admitted.
    assert samples[("fusethrottle_window_bytes", ())] == min(made_up.config.window, 16 * MiB)
    assert samples[("fusethrottle_unsynced_bytes", ())] == 0
    assert samples[("fusethrottle_controller_mode", (("mode", made_up.config.mode),))] == 1
    assert made_up.config.mode == "adaptive"  # the default
    assert samples[("fusethrottle_snapshot_age_seconds", ())] < 5
    names = {name for name, _ in samples}
    for name in exported_names():
        if name.startswith(("fusethrottle_controller_target", "fusethrottle_controller_commit")):
            continue  # only once the controller has measured fsyncs
        if name.startswith("fusethrottle_budget_"):
            assert name not in names  # only on a mount with budget= (tests/test_fleet_mount.py)
            continue
        if name.startswith("fusethrottle_guard_"):
            assert name not in names  # only on a mount with guard= (tests/test_guard_mount.py)
            continue
        d = DEFS.get(name)
        assert name in names or (d and d.kind == "histogram" and name + "_count" in names), name
    build = [k for k in samples if k[0] == "fusethrottle_build_info"]
    assert dict(build[0][1])["version"] == fusethrottle.__version__
    assert "process_open_fds" in names  # the daemon's own descriptors matter (one per inode)


def test_families_without_measurements_omit_unknown_gauges(made_up: MadeUpMount) -> None:
    snap = trio.run(_publish, made_up.publisher)
    fams = {f.name: f for f in families(snap, 0.0)}
    assert not fams["fusethrottle_controller_target_window_bytes"].samples
    commit = fams["fusethrottle_controller_commit_bytes_per_second"]
    assert not commit.samples  # nothing measured yet: absent, not zero


async def _publish(m: Publisher) -> metrics.Snapshot:
    return m.publish()


def test_snapshot_is_json_ready(made_up: MadeUpMount) -> None:
    import json

    snap = trio.run(_publish, made_up.publisher)
    data = json.loads(json.dumps(snap.to_json()))
    assert data["mount"]["source"] == made_up.config.source
    assert set(FSYNC_REASONS) <= set(data["fsync_duration"])


def test_rates_come_from_published_history(made_up: MadeUpMount) -> None:
    publisher = made_up.publisher

    async def main() -> list[metrics.Snapshot]:
        snaps = [publisher.publish(sample=True)]  # the first point of the history: no rate yet
        made_up.wrote(10 * MiB)
        await trio.sleep(PUBLISH_INTERVAL / 4)
        snaps.append(publisher.publish())  # too short a span to mean anything
        await trio.sleep(1.0 - PUBLISH_INTERVAL / 4)
        snaps.append(publisher.publish())
        return snaps

    first, early, later = trio.run(main, clock=MockClock(autojump_threshold=0))
    assert first.rates == Rates() and early.rates == Rates()
    assert later.rates.span_seconds == pytest.approx(1.0)
    assert later.rates.written == pytest.approx(10 * MiB)
    assert later.rates.read == 0


def test_rates_cover_the_last_ten_seconds(made_up: MadeUpMount) -> None:
    publisher = made_up.publisher

    async def main() -> metrics.Snapshot:
        async with trio.open_nursery() as nursery:
            await nursery.start(publisher.run_publisher)  # samples at 0, 0.5, 1.0, ...
            await trio.sleep(0.25)  # write between samples, never at the same instant
            for second in range(60):  # 1 MiB/s, then 3 MiB/s for the last 10 s
                made_up.wrote(MiB if second < 50 else 3 * MiB)
                await trio.sleep(1.0)
            snap = publisher.publish()  # at 60.25 s; the oldest sample kept is 50.0 s
            nursery.cancel_scope.cancel()
        return snap

    snap = trio.run(main, clock=MockClock(autojump_threshold=0))
    assert RATE_SPAN == 10.0
    assert snap.rates.span_seconds == pytest.approx(10.25)
    # The writes at 50.25 ... 59.25 s only, not the average since the mount started.
    assert snap.rates.written == pytest.approx(30 * MiB / 10.25)


def test_fresh_snapshot_from_another_thread(made_up: MadeUpMount) -> None:
    publisher = made_up.publisher

    async def main() -> int:
        async with trio.open_nursery() as nursery:
            await nursery.start(publisher.run_publisher)
            made_up.wrote(123)  # after the last periodic publish
            snap = await trio.to_thread.run_sync(publisher.fresh)
            nursery.cancel_scope.cancel()
        assert snap is not None
        return snap.written_bytes

    assert trio.run(main) == 123


def test_a_stuck_event_loop_gives_a_stale_but_prompt_answer(made_up: MadeUpMount) -> None:
    publisher = made_up.publisher
    answers: list[int] = []

    def scrape() -> None:
        snap = publisher.fresh()
        assert snap is not None
        answers.append(snap.written_bytes)

    async def main() -> bool:
        async with trio.open_nursery() as nursery:
            await nursery.start(publisher.run_publisher)
            made_up.wrote(5)  # not yet in any snapshot
            scraper = threading.Thread(target=scrape)
            scraper.start()
            # The event loop is stuck (a blocking call where none belongs) until the scrape has
            # its answer, so a scrape that waited for the loop would never get one. The timeout
            # only keeps such a bug from hanging the test run.
            scraper.join(timeout=60)
            answered = not scraper.is_alive()
            nursery.cancel_scope.cancel()
        return answered

    assert trio.run(main), "the scrape waited for the stuck event loop"
    assert answers == [0]  # the last snapshot published before the loop got stuck


def test_task_tree_names_every_task() -> None:
    async def sleeper() -> None:
        await trio.sleep_forever()

    async def main() -> str:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sleeper, name="the-sleeper")
            await trio.sleep(0)
            tree = metrics.task_tree()
            nursery.cancel_scope.cancel()
        return tree

    tree = trio.run(main)
    assert "the-sleeper" in tree
    assert "test_metrics.py" in tree  # where it waits, in our code


# --- the endpoint --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:9420", ("127.0.0.1", 9420)),
        (":9420", ("127.0.0.1", 9420)),
        ("[::1]:9420", ("::1", 9420)),
        ("0.0.0.0:1", ("0.0.0.0", 1)),
    ],
)
def test_split_address(text: str, expected: tuple[str, int]) -> None:
    assert split_address(text) == expected


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield s.getsockname()[1]


def test_bind_refuses_a_port_in_use(busy_port: int) -> None:
    with pytest.raises(MetricsError, match="already in use"):
        bind_endpoint(f"127.0.0.1:{busy_port}")


def test_bind_refuses_an_address_of_another_host() -> None:
    with pytest.raises(MetricsError, match="not an address of this host"):
        bind_endpoint(f"192.0.2.1:{_free_port()}")


def test_bind_refuses_an_unknown_host() -> None:
    with pytest.raises(MetricsError, match="cannot resolve"):
        bind_endpoint("no-such-host.invalid:9420")


def test_endpoint_serves_and_stops(made_up: MadeUpMount) -> None:
    publisher = made_up.publisher
    port = _free_port()
    server = bind_endpoint(f"127.0.0.1:{port}")

    async def main() -> str:
        async with trio.open_nursery() as nursery:
            await nursery.start(publisher.run_publisher)
            await nursery.start(metrics.serve_endpoint, server, metrics.make_registry(publisher))
            body = await trio.to_thread.run_sync(_get, f"http://127.0.0.1:{port}/metrics")
            nursery.cancel_scope.cancel()
        return body

    body = trio.run(main)
    assert "fusethrottle_unsynced_bytes 0.0" in body
    with socket.socket() as s:  # nobody listens on the port once the task ended
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


# --- real mounts ---------------------------------------------------------------------------


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return _samples(_get(f"http://127.0.0.1:{port}/metrics"))


def _value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _fsync_count(samples: dict, reason: str) -> float:
    return _value(samples, "fusethrottle_fsync_duration_seconds_count", reason=reason)


@pytest.mark.mount
def test_scrape_follows_writes_through_a_real_mount(make_mount) -> None:
    port = _free_port()
    ft = make_mount(
        options=[
            f"metrics=127.0.0.1:{port}",
            "mode=static",
            "batch=1M",
            "window=4M",
            "max_age=60s",
            "writeback_cache=no",  # one FUSE write per write(), counted below
        ]
    )
    before = _scrape(port)
    assert _value(before, "fusethrottle_written_bytes_total") == 0
    chunk, chunks = 64 * KiB, 80  # 5 MiB: several batches of 1 MiB
    path = ft.mountpoint / "data"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for i in range(chunks):
            os.write(fd, bytes([i % 251]) * chunk)
            if i == chunks // 2:
                mid = _scrape(port)
                assert _value(mid, "fusethrottle_written_bytes_total") == (i + 1) * chunk
                assert _value(mid, "fusethrottle_unsynced_bytes") <= 4 * MiB
        # The batches' syncs run beside the writer and reach the metrics as they end (on a
        # busy machine after the last write): waited for, before the application's own.
        assert wait_for(lambda: _fsync_count(_scrape(port), "batch") >= 3, 10)  # 5 MiB, 1M
        during = _scrape(port)
        os.fsync(fd)
        after_fsync = _scrape(port)
    finally:
        os.close(fd)
    total = chunk * chunks
    assert _value(during, "fusethrottle_written_bytes_total") == total
    writes = _value(during, "fusethrottle_operations_total", op="write")
    assert writes == chunks  # no writeback cache: one FUSE write per write()
    assert _value(during, "fusethrottle_target_operations_total", op="write") == writes
    assert _fsync_count(after_fsync, "application") == _fsync_count(during, "application") + 1
    assert _value(after_fsync, "fusethrottle_operations_total", op="fsync") >= 1

    # Once closed, the rest is synced on release and un-synced returns to zero.
    assert wait_for(lambda: _value(_scrape(port), "fusethrottle_unsynced_bytes") == 0, 10)
    done = _scrape(port)
    assert _value(done, "fusethrottle_synced_bytes_total") == total
    synced_by_reason = sum(
        _value(done, "fusethrottle_fsync_bytes_total", reason=r) for r in FSYNC_REASONS
    )
    assert synced_by_reason == total
    assert _value(done, "fusethrottle_dirty_files") == 0
    errors = {
        dict(labels)["errno"]
        for (name, labels) in done
        if name == "fusethrottle_target_errors_total"
    }
    assert errors <= {"ENOENT", "ENODATA"}  # only the lookup and xattr probes of a new file
    if any(name == "fusethrottle_metered_bytes_total" for name, _ in done):
        metered = _value(done, "fusethrottle_metered_bytes_total", **{"class": "data_write"})
        assert metered >= total
        assert _value(done, "fusethrottle_efs_units_total", **{"class": "data_write"}) > 0

    # Reading it back (a fresh open drops the kernel's cached pages) is counted too.
    assert path.read_bytes()[:chunk] == bytes([0]) * chunk
    after_read = _scrape(port)
    assert _value(after_read, "fusethrottle_read_bytes_total") == total


def _run_mount(
    source: Path, mnt: Path, options: str, foreground: bool
) -> subprocess.CompletedProcess[str]:
    argv = [FUSETHROTTLE, str(source), str(mnt), "-o", options] + (["-f"] if foreground else [])
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    finally:
        if mounted(mnt):  # it must not have mounted; if it did, never leave it behind
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False)


@pytest.mark.mount
@pytest.mark.parametrize("foreground", [True, False], ids=["foreground", "daemonized"])
def test_a_port_in_use_fails_the_mount_with_one_line(
    workdir: Path, busy_port: int, foreground: bool
) -> None:
    source, mnt = workdir / "src", workdir / "mnt"
    source.mkdir()
    mnt.mkdir()
    result = _run_mount(source, mnt, f"metrics=127.0.0.1:{busy_port}", foreground)
    assert result.returncode != 0
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert f"127.0.0.1:{busy_port}" in lines[0] and "already in use" in lines[0]
    assert "Traceback" not in result.stderr
    assert not mounted(mnt)


@pytest.mark.mount
@pytest.mark.parametrize(
    ("address", "reason"),
    [("192.0.2.1:9420", "not an address of this host"), ("nohost.invalid:9420", "resolve")],
)
def test_a_bad_address_fails_the_mount_with_one_line(
    workdir: Path, address: str, reason: str
) -> None:
    source, mnt = workdir / "src", workdir / "mnt"
    source.mkdir()
    mnt.mkdir()
    result = _run_mount(source, mnt, f"metrics={address}", foreground=True)
    assert result.returncode != 0
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and reason in lines[0], result.stderr
    assert not mounted(mnt)


@pytest.mark.mount
def test_sigusr1_logs_the_task_tree_and_thread_stacks(make_mount) -> None:
    ft = make_mount()
    ft.expect_log_problems = True  # the dump is logged as a warning on purpose
    (ft.mountpoint / "f").write_bytes(b"x")
    for n in (1, 2):  # twice: the handlers stay installed after the first
        ft.signal(signal.SIGUSR1)
        assert wait_for(lambda n=n: ft.log().count("SIGUSR1: trio tasks") == n, 10)
    log = ft.log()
    assert LIFELONG_TASK in log  # a trio task, with where it waits
    assert "most recent call first" in log  # faulthandler's thread dump
    assert ft.proc.poll() is None
    assert (ft.mountpoint / "f").read_bytes() == b"x"


@pytest.mark.mount
def test_ceiling_delays_are_counted(make_mount) -> None:
    port = _free_port()
    # 100 units/s at 5 units per write: 20 writes/s once the 0.25 s burst is spent. Without the
    # writeback cache, so that each write() is one request to pay for.
    ft = make_mount(options=[f"metrics=127.0.0.1:{port}", "ops_limit=100", "writeback_cache=no"])
    started = time.monotonic()
    with open(ft.mountpoint / "small", "wb", buffering=0) as f:
        for _ in range(30):
            f.write(b"x" * 4096)
    elapsed = time.monotonic() - started
    samples = _scrape(port)
    assert _value(samples, "fusethrottle_ops_limit_units_per_second") == 100
    delayed = _value(samples, "fusethrottle_ceiling_delayed_operations_total")
    waited = _value(samples, "fusethrottle_ceiling_delay_seconds_total")
    assert delayed >= 20
    assert 0.5 <= waited <= elapsed + 0.5  # one writer: its waits add up to about its runtime
    assert _value(samples, "fusethrottle_efs_units_total", **{"class": "data_write"}) == 150
