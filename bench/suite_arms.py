"""What the third-party suites' benches share: choosing their arms and mounting one of them.

`bench.fsx_fsstress` and `bench.pjdfstest` each run a suite on an ext4 target directly and
through fusethrottle mounts over fresh directories of it; this is their common part.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from bench.daemon import FuseThrottleMount, chosen_arms
from bench.system import Teardown


def pick_arms(
    prog: str, text: str, known: Mapping[str, str | None], explicit: str | None
) -> tuple[list[str], str | None] | None:
    """(arms, fusethrottle executable) of the comma-separated *text*; None after one line on
    stderr saying what is wrong with them."""
    arms, exe, wrong = chosen_arms(text, known, explicit)
    if wrong is not None:
        print(f"{prog}: {wrong}", file=sys.stderr)
        return None
    return arms, exe


def mount_arm(
    exe: str | None, arm: str, options: str, source: Path, scratch: Path, teardown: Teardown
) -> FuseThrottleMount:
    """*arm*'s fusethrottle mount of *source*, started (ArmSkipped where the machine cannot),
    its log in *scratch*/ARM.log and .err, no metrics endpoint."""
    assert exe is not None
    mnt = FuseThrottleMount(
        exe, source, scratch / f"mnt-{arm}", options, scratch / f"{arm}.log",
        teardown, None, metrics=False,
    )  # fmt: skip
    mnt.start()
    return mnt
