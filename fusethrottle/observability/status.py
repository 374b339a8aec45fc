"""``fusethrottle status MOUNTPOINT``: a human view of a running mount, once or refreshed.

The command is split by who runs what:

* status_socket   where a mount's status socket lives and what it may be asked (both sides)
* status_server   the daemon's side: answers on the socket from its event loop
* status_client   the command's side: finds the mount in mountinfo and asks its daemon
* status_view     the text an answer is shown as (documented in docs/METRICS.md)
* this module     the command line: options, the refresh loop, exit codes

Only this module and the client and view run in the command, which therefore never imports
trio: the command should start fast when someone is looking at a mount in trouble.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..service.mountinfo import MountInfo
from .status_client import CLIENT_TIMEOUT, StatusError, find_mount_of, query
from .status_view import format_status

CLEAR_SCREEN = "\x1b[H\x1b[2J"


def refresh(
    frame: Callable[[], str],
    show: Callable[[str, int], None],
    *,
    interval: float,
    count: int,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Show ``frame()`` now and then every *interval* seconds, *count* times (0: until
    interrupted); returns how many frames were shown.

    The interval is a pause after each frame, not a schedule: when the daemon is slow to
    answer, the command waits for it instead of piling requests onto it. No pause follows the
    last frame. *sleep* is the only clock, so tests can run this on a fake one.
    """
    shown = 0
    while True:
        show(frame(), shown)
        shown += 1
        if count and shown >= count:
            return shown
        sleep(interval)


@dataclass(frozen=True)
class Screen:
    """How frames follow each other on stdout: a terminal is redrawn in place; anything else
    gets them one after another, text separated by a blank line, JSON one document a line."""

    clear: bool
    blank_line: bool

    def show(self, text: str, index: int) -> None:
        if self.clear:
            sys.stdout.write(CLEAR_SCREEN)
        elif index and self.blank_line:
            print()
        print(text, flush=True)


def _format(reply: dict[str, Any], entry: MountInfo) -> str:
    try:
        return format_status(reply)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        raise StatusError(
            f"the daemon for {entry.mountpoint} answered in a form this fusethrottle does not "
            "know (a daemon from before an upgrade?); --json shows the raw answer"
        ) from None


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so every mistake is one line and exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise StatusError(f"status: {message} (see fusethrottle status --help)")


def _parser() -> _Parser:
    p = _Parser(
        prog="fusethrottle status",
        description="Show what a running fusethrottle mount holds back and why.",
    )
    p.add_argument("mountpoint", help="the mount point (or any path inside the mount)")
    p.add_argument("--watch", "-w", action="store_true", help="refresh until interrupted")
    p.add_argument(
        "--interval",
        "-n",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="seconds between refreshes with --watch (default 2)",
    )
    p.add_argument(
        "--count",
        "-c",
        type=int,
        default=0,
        metavar="N",
        help="with --watch: stop after N refreshes",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=CLIENT_TIMEOUT,
        metavar="SECONDS",
        help=f"how long to wait for the daemon (default {CLIENT_TIMEOUT:g})",
    )
    p.add_argument("--json", action="store_true", help="print the raw answer (one line each)")
    p.add_argument(
        "--tasks", action="store_true", help="print the daemon's trio task tree and thread stacks"
    )
    return p


def main(argv: Sequence[str], *, sleep: Callable[[float], None] = time.sleep) -> int:
    """``fusethrottle status``; 0 when the daemon answered, 1 when not, 2 for a bad command.

    *sleep* waits between refreshes (a fake clock in tests).
    """
    try:
        args = _parser().parse_args(list(argv))
    except StatusError as err:
        print(f"fusethrottle: {err}", file=sys.stderr)
        return 2
    if args.interval <= 0 or args.timeout <= 0 or args.count < 0:
        print(
            "fusethrottle: status: --interval and --timeout must be positive, --count not negative",
            file=sys.stderr,
        )
        return 2
    try:
        entry = find_mount_of(args.mountpoint)
        if args.tasks:
            reply = query(entry, "tasks", args.timeout)
            print(reply.get("tasks", ""))
            print()
            print(reply.get("threads", ""))
            return 0

        def frame() -> str:
            reply = query(entry, timeout=args.timeout)
            return json.dumps(reply) if args.json else _format(reply, entry)

        screen = Screen(
            clear=args.watch and not args.json and sys.stdout.isatty(),
            blank_line=not args.json,
        )
        count = args.count if args.watch else 1
        refresh(frame, screen.show, interval=args.interval, count=count, sleep=sleep)
        return 0
    except StatusError as err:
        print(f"fusethrottle: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:  # `status --watch | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
