"""No call that can reach the target runs on the daemon's event loop.

One event loop answers every request of the mount, `status` and the metrics. A system call on the
target made there (an fstat of a held descriptor, a close that writes back on NFS) waits as long
as the target does, and a slow or stopped NFS server would then freeze the whole mount: every
path, every other caller, the status socket. These tests make a target whose every call turns
slow once the files are set up, drive one kind of request into it, and check that while it waits
the mount still answers everything that does not need the slow target.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import MakeMount
from mount_util import FUSETHROTTLE, Daemon, status_json, wait_for

pytestmark = pytest.mark.mount

#: How long each call into the slow target takes. A call on the event loop freezes the mount
#: for this long per call.
SLOW = 6.0
#: How long a request that does not need the slow target may take to be answered: far above what
#: it takes (milliseconds), far below SLOW.
ANSWER_BOUND = SLOW / 2
#: What each caller does over and over into the slow part of the tree, one line per call done.
CALLERS = {
    # A name the daemon already knows, looked up again (attr_timeout=0: every stat is a LOOKUP).
    "lookup": "import os\nwhile True:\n    os.stat(f'{held}/known'); print(flush=True)",
    # Attributes of an open file (a GETATTR naming the handle).
    "getattr": "import os\nfd = os.open(f'{held}/known', os.O_RDONLY)\n"
    "while True:\n    os.fstat(fd); print(flush=True)",
    # A listing whose entries the daemon knows.
    "readdir": "import os\nwhile True:\n"
    "    [os.stat(e.path) for e in os.scandir(f'{held}/d')]; print(flush=True)",
    "open": "import os\nwhile True:\n    os.close(os.open(f'{held}/known', os.O_RDONLY)); "
    "print(flush=True)",
    # A file opened before the target turned slow, written and synced.
    "write": "import os\nfd = os.open(f'{held}/known', os.O_WRONLY)\nprint('ready', flush=True)\n"
    "while True:\n    os.write(fd, b'x' * 4096); os.fsync(fd); print(flush=True)",
}


def answers_within(argv: list[str], bound: float) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=bound).returncode == 0
    except subprocess.TimeoutExpired:
        return False


@pytest.mark.parametrize("call", list(CALLERS))
def test_a_slow_target_call_does_not_hold_up_the_rest_of_the_mount(
    make_memfs: Callable[..., tuple[Daemon, Path]],
    make_mount: MakeMount,
    workdir: Path,
    call: str,
) -> None:
    """While a caller waits on a slow target (here every call into one subtree takes 6 s), the
    mount answers statfs, `status` and reads elsewhere at once: a backup stuck on a slow NFS
    directory does not stop `df`, monitoring or the database's reads of another directory."""
    backing = workdir / "backing"
    (backing / "elsewhere").mkdir(parents=True)
    (backing / "elsewhere" / "a").write_text("fine")
    (backing / "held").mkdir()
    slow_switch = workdir / "slow-now"
    target, _ = make_memfs("backing/held", slow_all_while=(slow_switch, SLOW))
    (target.mountpoint / "known").write_text("known")
    (target.mountpoint / "d").mkdir()
    for n in range(3):
        (target.mountpoint / "d" / f"e{n}").write_text("e")
    options = ["attr_timeout=0", "writeback_cache=no"]
    ft = make_mount(source=backing, options=options, name="top")
    held = ft.mountpoint / "held"
    # The daemon learns every name the caller will use while the target is still fast.
    assert (held / "known").read_text() == "known"
    assert sorted(p.name for p in (held / "d").iterdir()) == ["e0", "e1", "e2"]
    for n in range(3):
        assert (held / "d" / f"e{n}").stat().st_size == 1

    script = textwrap.dedent(CALLERS[call]).replace("{held}", str(held))
    caller = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert caller.stdout is not None
        if call == "write":
            assert caller.stdout.readline().strip() == "ready"
        calls_done = count_lines(caller)
        slow_switch.touch()
        time.sleep(1.0)  # the caller is now inside a slow call
        probes = {
            "statfs": ["stat", "-f", str(ft.mountpoint)],
            "status": [FUSETHROTTLE, "status", str(ft.mountpoint), "--json"],
            "read elsewhere": ["cat", str(ft.mountpoint / "elsewhere" / "a")],
            "stat elsewhere": ["stat", str(ft.mountpoint / "elsewhere")],
        }
        # Probe back to back for two slow calls' time: a freeze of the event loop by any of the
        # caller's calls falls within it.
        late = set()
        deadline = time.monotonic() + 2 * SLOW
        while time.monotonic() < deadline:
            for name, argv in probes.items():
                if not answers_within(argv, ANSWER_BOUND):
                    late.add(name)
            time.sleep(0.2)
        assert caller.poll() is None, "the caller should still be calling the slow target"
        assert not late, f"not answered within {ANSWER_BOUND} s while {call} waited: {sorted(late)}"
        assert status_json(ft.mountpoint)
        # The target turns fast again: the caller's calls complete, nothing was left hanging.
        slow_switch.unlink()
        before = calls_done[0]
        assert wait_for(lambda: calls_done[0] >= before + 2, 4 * SLOW), (
            f"{call} never completed once the target was fast again"
        )
    finally:
        slow_switch.unlink(missing_ok=True)
        caller.kill()
        caller.wait(60)


def count_lines(proc: subprocess.Popen[str]) -> list[int]:
    """A counter of the lines *proc* prints, kept by a reader thread."""
    counter = [0]

    def read() -> None:
        assert proc.stdout is not None
        for _ in proc.stdout:
            counter[0] += 1

    threading.Thread(target=read, daemon=True).start()
    return counter
