"""Where the bench's neighbour waited when it stalled (bench/stall_stacks.py): pure rules."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from bench.stall_stacks import StackSampler, classify, stall_waits

# Stacks written in the shape /proc/PID/stack has (offsets made up): a task whose page fault
# charges a cgroup-v1 memory cgroup and waits in reclaim for a page under write-back, the path
# mm/vmscan.c takes for legacy memcg reclaim; and a task asleep in nanosleep.
RECLAIM_WAIT = """[<0>] folio_wait_bit_common+0x13c/0x350
[<0>] folio_wait_writeback+0x2b/0x80
[<0>] shrink_folio_list+0xcc6/0x1040
[<0>] shrink_lruvec+0x5e4/0xba0
[<0>] shrink_node+0x2e4/0x7a0
[<0>] do_try_to_free_pages+0xc1/0x560
[<0>] try_to_free_mem_cgroup_pages+0x101/0x260
[<0>] try_charge_memcg+0x1a1/0x5f0
[<0>] __mem_cgroup_charge+0x3d/0xa0
[<0>] do_anonymous_page+0x2bd/0x790
[<0>] __handle_mm_fault+0xa3e/0xd80
"""
SLEEPING = """[<0>] hrtimer_nanosleep+0xc1/0x1b0
[<0>] __x64_sys_clock_nanosleep+0xca/0x130
"""


def test_each_wait_is_named_by_the_frames_that_make_it() -> None:
    assert classify(RECLAIM_WAIT) == "reclaim waits on write-back"
    throttled = RECLAIM_WAIT.replace("folio_wait_bit_common", "reclaim_throttle").replace(
        "folio_wait_writeback+0x2b/0x80\n[<0>] ", ""
    )
    assert classify(throttled) == "reclaim throttled"
    assert classify("[<0>] balance_dirty_pages+0x2/0x3\n[<0>] generic_perform_write+0x1/0x2\n") == (
        "dirty throttling"
    )
    # fdatasync's flush of the disk's cache, queued behind whatever else the disk is writing
    flush = "[<0>] submit_bio_wait+0x1/0x2\n[<0>] blkdev_issue_flush+0x3/0x4\n"
    assert classify(flush + "[<0>] ext4_sync_file+0x5/0x6\n") == "device cache flush"
    assert classify(SLEEPING) is None  # its own pacing: not a stall of the kernel's making
    assert classify("") is None  # running
    assert classify(
        "[<0>] pipe_read+0x1/0x2\n[<0>] vfs_read+0x3/0x4\n[<0>] ksys_read+0x5/0x6\n"
    ) == ("other wait (pipe_read < vfs_read)")


def test_only_samples_inside_slow_operations_count() -> None:
    ops = [(10.0, 0.005), (11.0, 2.0), (14.0, 0.05), (20.0, 0.5)]
    samples = [
        (10.001, "block I/O"),  # inside a fast operation
        (11.5, "reclaim waits on write-back"),
        (12.9, "reclaim waits on write-back"),
        (13.5, "memcg reclaim"),  # between operations
        (20.2, "dirty throttling"),
    ]
    assert stall_waits(ops, samples, interval=0.01) == {
        "reclaim waits on write-back": 0.02,
        "dirty throttling": 0.01,
    }
    assert stall_waits([], samples, interval=0.01) == {}


@pytest.mark.skipif(os.geteuid() != 0, reason="/proc/PID/stack is root's to read")
def test_the_sampler_sees_where_another_process_waits() -> None:
    """A child blocked reading an empty pipe waits in the kernel, not in a sleep of its own."""
    child = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.2)
        sampler = StackSampler(child.pid, interval=0.005)
        sampler.start()
        time.sleep(0.2)
        samples = sampler.stop()
    finally:
        child.kill()
        child.wait()
    assert sampler.readable
    waits = {wait for _, wait in samples}
    assert len(samples) > 10 and len(waits) == 1, waits
    assert "pipe_read" in waits.pop()  # anon_pipe_read on newer kernels
