"""The pure parts of the NFS lab's neighbour bench: cgroup v2 (and v1) parsing, the tc throttle's
commands, a throttled directory target in the plan, and the two-VM layout's qemu arguments."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from bench import cgroup, tc
from bench.nfslab import vm
from bench.plan import PlanError, RateStep, parse_schedule, parse_target
from bench.presets import build_plan

# What `tc -j qdisc show dev eth0` printed in the lab's client VM (slow profile).
LAB_QDISCS = (
    '[{"kind":"netem","handle":"1:","root":true,"refcnt":2,"options":{"limit":100000,'
    '"delay":{"delay":9.9e-05,"jitter":0,"correlation":0},"ecn":false,"gap":0}},'
    '{"kind":"tbf","handle":"10:","parent":"1:1","options":{"rate":20971520,'
    '"burst":2097152,"lat":400000}}]'
)


def test_cgroup_v1_memory_line_wins_on_a_hybrid_host() -> None:
    text = "4:memory:/process_api/abc\n1:cpu:/\n0::/\n"
    layout = cgroup.find_layout(text, "cpu memory")
    assert layout == cgroup.Layout(1, Path("/sys/fs/cgroup/memory/process_api/abc"))
    assert layout.limit_file == "memory.limit_in_bytes"
    assert layout.usage_file == "memory.usage_in_bytes"


def test_cgroup_v2_only_and_without_a_memory_controller() -> None:
    layout = cgroup.find_layout("0::/\n", "cpuset cpu io memory pids")
    assert layout == cgroup.Layout(2, Path("/sys/fs/cgroup"))
    assert (layout.limit_file, layout.usage_file) == ("memory.max", "memory.current")
    assert cgroup.find_layout("0::/user.slice\n", "cpu io pids") is None
    assert cgroup.find_layout("", "") is None


def test_memory_stat_names_agree_across_versions() -> None:
    v1 = "cache 4096\nrss 8192\ndirty 12288\nwriteback 16384\ntotal_dirty 1\n"
    v2 = (
        "anon 8192\nfile 4096\nfile_dirty 12288\nfile_writeback 16384\n"
        "file_mapped 7\nworkingset_refault_file 3\n"
    )
    want = {"cache": 4096, "rss": 8192, "dirty": 12288, "writeback": 16384}
    assert cgroup.parse_stat(v1, 1) == want
    assert cgroup.parse_stat(v2, 2) == want


def test_memory_events_max_is_the_v2_failcnt() -> None:
    assert cgroup.parse_events_max("low 0\nhigh 0\nmax 17\noom 0\noom_kill 0\n") == 17
    assert cgroup.parse_events_max("") == 0
    events = "low 0\nhigh 0\nmax 17\noom 2\noom_kill 1\noom_group_kill 0\n"
    assert cgroup.parse_events(events)["oom_kill"] == 1
    v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"
    assert cgroup.parse_events(v1)["oom_kill"] == 3


def test_v2_parents_go_up_to_the_root() -> None:
    own = Path("/sys/fs/cgroup/user.slice/session-1.scope")
    assert cgroup.v2_parents(own) == [
        own,
        Path("/sys/fs/cgroup/user.slice"),
        Path("/sys/fs/cgroup"),
    ]
    assert cgroup.v2_parents(Path("/sys/fs/cgroup")) == [Path("/sys/fs/cgroup")]


def test_tc_finds_the_labs_tbf_under_its_netem() -> None:
    qdiscs = tc.parse_qdiscs(LAB_QDISCS)
    assert qdiscs[0] == tc.Qdisc("netem", "1:", None)
    tbf = tc.find_tbf(qdiscs)
    assert tbf == tc.Qdisc("tbf", "10:", "1:1", 20971520)
    assert tc.change_command("eth0", tbf, 1 << 20) == [
        "tc", "qdisc", "change", "dev", "eth0", "parent", "1:1", "handle", "10:",
        "tbf", "rate", "1048576bps", "burst", "2097152", "latency", "400ms",
    ]  # fmt: skip
    assert tc.find_tbf(tc.parse_qdiscs('[{"kind":"noqueue","handle":"0:","root":true}]')) is None


def test_tc_rates_at_the_edges() -> None:
    # tbf refuses 0: a stall is as slow as tbf goes; None lifts the limit.
    assert tc.tbf_args(0)[2] == f"{tc.MIN_RATE}bps"
    assert tc.tbf_args(None)[2] == f"{tc.UNLIMITED}bps"
    # the burst: 2 MiB at least, 1/100 s of a fast rate.
    assert tc.tbf_args(20 << 20)[4] == str(2 << 20)
    assert tc.tbf_args(tc.UNLIMITED)[4] == str(tc.UNLIMITED // 100)
    root = tc.Qdisc("tbf", tc.OWN_HANDLE, None)
    assert tc.change_command("eth1", root, 1000)[5:8] == ["root", "handle", tc.OWN_HANDLE]
    assert tc.add_command("eth1", None)[:8] == [
        "tc", "qdisc", "replace", "dev", "eth1", "root", "handle", tc.OWN_HANDLE,
    ]  # fmt: skip
    assert tc.delete_command("eth1") == ["tc", "qdisc", "del", "dev", "eth1", "root"]


@pytest.mark.parametrize("bad", ["eth0", "tc:", "blkio:eth0", "tc:a b", "tc:../x"])
def test_tc_throttle_spec_is_checked(bad: str) -> None:
    with pytest.raises(ValueError):
        tc.parse_throttle(bad)
    with pytest.raises(PlanError):
        parse_target("/mnt/nfs/rw", bad)
    assert tc.parse_throttle("tc:eth0") == "eth0"


def test_a_throttled_directory_target_gets_the_schedule() -> None:
    plan = build_plan(
        "db-degrade",
        "quick",
        targets=["/mnt/nfs/rw"],
        throttle="tc:eth0",
        schedule="20M:10s,1M:20s,20M:10s",
        workdir="/var/lib/victim",
    )
    (target,) = plan.targets
    assert target.throttled and target.throttle == "tc:eth0"
    assert target.schedule == parse_schedule("20M:10s,1M:20s,20M:10s")
    assert target.label == "/mnt/nfs/rw@tc:eth0@20M:10s,1M:20s,20M:10s"
    assert plan.workdir == "/var/lib/victim"
    assert plan.workloads[0].duration == 40.0
    assert "the tc:eth0 throttle" in plan.needs_root()
    # Without a throttle a directory keeps its old refusal, and a throttle needs a directory.
    with pytest.raises(PlanError, match="--throttle"):
        build_plan("db", "quick", targets=["/mnt/nfs/rw"], schedule="20M")
    with pytest.raises(PlanError, match="directory target"):
        build_plan("db", "quick", targets=["loop"], throttle="tc:eth0")
    plain = build_plan("db", "quick", targets=["/mnt/nfs/rw"])
    assert not plain.targets[0].throttled and plain.targets[0].schedule[0] == RateStep(
        20 << 20, float("inf")
    )


def test_two_vm_link_is_a_loopback_socket_with_one_mac_each() -> None:
    server, client = vm.socket_nic("server", 5555), vm.socket_nic("client", 5555)
    assert server[1] == "socket,id=n0,listen=127.0.0.1:5555"
    assert client[1] == "socket,id=n0,connect=127.0.0.1:5555"
    assert server[3].endswith(vm.SERVER_MAC) and client[3].endswith(vm.CLIENT_MAC)
    boot = vm.Boot(Path("/k"), Path("/i"), Path("/m"), "6.12")
    argv = vm.qemu_argv(
        boot, vm.Machine("tcg", 2, 4096), init=Path("/init"), console=Path("/c"), nic=client
    )
    assert "-nic" not in argv and client[1] in argv
    one = vm.qemu_argv(boot, vm.Machine("tcg"), init=Path("/init"), console=Path("/c"))
    assert one[one.index("-nic") + 1] == "none"


def test_a_systemd_guest_boots_its_init_on_the_unified_hierarchy(tmp_path: Path) -> None:
    boot = vm.Boot(Path("/k"), Path("/i"), Path("/m"), "6.12")
    init = vm.GUEST / vm.INITS["systemd"]
    argv = vm.qemu_argv(
        boot, vm.Machine("tcg"), init=init, console=Path("/c"),
        kernel_args=vm.INIT_KERNEL_ARGS["systemd"],
    )  # fmt: skip
    append = argv[argv.index("-append") + 1].split()
    assert f"ftlab_init={init}" in append and "systemd.unified_cgroup_hierarchy=1" in append
    assert init.exists() and os.access(init, os.X_OK)
    assert os.access(vm.GUEST / "systemd-job", os.X_OK)
    lab = vm.qemu_argv(boot, vm.Machine("tcg"), init=vm.GUEST / "init", console=Path("/c"))
    assert not [a for a in lab[lab.index("-append") + 1].split() if a.startswith("systemd.")]
    with pytest.raises(ValueError, match="boots the lab's own init only"):
        vm.run_job(
            boot, vm.Machine("tcg"), "plain", [], tmp_path, lab_dir=tmp_path, layout="two",
            init="systemd",
        )  # fmt: skip


def test_the_writer_waits_for_its_start_time(tmp_path: Path) -> None:
    """--start-at: launched early, the writer's clock (and its write time) starts then."""
    import json
    import subprocess
    import sys
    import time

    start_at = time.monotonic() + 1.0
    out = subprocess.run(
        [sys.executable, "-m", "bench.writer", "stream", "--path", str(tmp_path / "f"),
         "--size", str(1 << 20), "--block", "65536", "--start-at", repr(start_at)],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert time.monotonic() >= start_at
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["bytes"] == 1 << 20 and report["seconds"] < 1.0


def test_head_start_is_a_plan_setting() -> None:
    plan = build_plan("db-degrade", "smoke", writer_head_start=20.0)
    assert plan.writer_head_start == 20.0
    assert build_plan("db-degrade", "smoke").writer_head_start == 0.0


def test_a_writer_the_oom_killer_took_is_a_result(tmp_path: Path) -> None:
    """What it wrote comes from its interval log; the arm goes on to measure the neighbour."""
    from types import SimpleNamespace

    from bench.workloads import _killed_writer

    (tmp_path / "writer.jsonl").write_text(
        '{"t": 1.0, "bytes": 1048576, "writes": 1, "max": 0.5}\n'
        '{"t": 2.0, "bytes": 5242880, "writes": 4, "max": 2.5}\n'
        '{"t": 2.1, "fsync": 0.1}\n'
    )
    child = SimpleNamespace(started=100.0, ended=112.0, cpu_seconds=1.5)
    ctx = SimpleNamespace(scratch=tmp_path, start_at=102.0)
    res = _killed_writer(child, ctx)  # type: ignore[arg-type]
    assert res.bytes == 5 << 20 and res.seconds == 10.0 and res.write_max == 2.5
    assert res.extra == {"writer_killed": 1.0}


def test_the_zram_target_is_throttled_like_the_loop_target() -> None:
    """--target zram: the loop target's throttled ext4 on a device of its own, so a rate
    schedule applies to it and its label names it."""
    spec = parse_target("zram")
    assert spec.throttled
    steps = parse_schedule("20M:20s,256K:40s")
    assert replace(spec, schedule=steps).label == "zram@20M:20s,256K:40s"
    assert not parse_target("tmpfs").throttled
