"""The daemon's stop (TERM, INT) and reload (HUP) signals, held from the first line of
``cli.main`` until its handler takes them (``Daemon._signals``): one sent while it starts is
answered once it serves, neither lost nor fatal half way (see ``cli.main``)."""

from __future__ import annotations

import signal

HELD_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def release_held_signals() -> None:
    """Unblock them: what came while they were held goes to the handlers now in place."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD_SIGNALS)
