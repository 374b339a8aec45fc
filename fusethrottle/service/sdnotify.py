"""Tell systemd how the daemon is doing, without depending on libsystemd or a Python binding.

The sd_notify protocol is one datagram of ``KEY=value`` lines sent to the AF_UNIX socket named in
``$NOTIFY_SOCKET``; systemd reads the sender's PID from the socket credentials. A daemon run by
hand, from fstab or by a test has no such variable, and then every call here is a cheap no-op.

Three messages matter to ``fusethrottle@.service`` (``Type=notify``):

- ``READY=1`` once the mount answers, so units ordered after the service see a working mount;
- ``STOPPING=1`` when SIGTERM starts the final flush, so ``systemctl status`` says why it waits;
- ``WATCHDOG=1`` every half ``WatchdogSec=``, from :func:`watchdog_task`. It runs on the event
  loop, so a missing ping means the loop itself is stuck — exactly what a watchdog should catch,
  since target I/O runs in worker threads and must never block the loop.

A failure to notify must never take the mount down: :func:`notify` logs the first failure, stays
quiet after that, and returns ``False`` instead of raising.
"""

from __future__ import annotations

import logging
import os
import socket

import trio

log = logging.getLogger(__name__)

# systemd's receive queue is deep and read promptly; a short bound on the send keeps a wedged
# manager from freezing the event loop, which is where notify() is called from.
_SEND_TIMEOUT = 1.0

_warned = False


def _address(value: str) -> str | None:
    """``$NOTIFY_SOCKET`` as an address for ``sendto``: a path, or ``@name`` for the abstract
    namespace (a leading NUL byte). Other schemes (systemd 253's ``vsock:``) are not supported."""
    if value.startswith("/"):
        return value
    if value.startswith("@") and len(value) > 1:
        return "\0" + value[1:]
    return None


def _warn_once(message: str, *args: object) -> None:
    """Log the first failure as a warning and later ones at debug: a watchdog ping every few
    seconds must not fill the journal with the same line."""
    global _warned
    if _warned:
        log.debug(message, *args)
        return
    _warned = True
    log.warning(message + " (further failures are logged at debug level)", *args)


def notify(state: str) -> bool:
    """Send *state* (e.g. ``"READY=1"``, or several lines) to systemd.

    Returns ``True`` if the datagram was sent, ``False`` when not run under a notify-aware
    service manager or when the send failed. Never raises for a socket problem.
    """
    value = os.environ.get("NOTIFY_SOCKET", "")
    if not value:
        return False
    address = _address(value)
    if address is None:
        _warn_once("sd_notify: unsupported NOTIFY_SOCKET %r; not notifying systemd", value)
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(_SEND_TIMEOUT)
            sock.sendto(state.encode(), address)
    except OSError as err:  # includes TimeoutError
        _warn_once("sd_notify: sending %r to %r failed: %s", state, value, err)
        return False
    return True


def watchdog_interval() -> float | None:
    """Seconds of ``WatchdogSec=`` that systemd gave *this* process, or ``None`` for no watchdog.

    ``WATCHDOG_PID``, when present, names the process the watchdog is meant for; a child that
    inherited the environment must not ping on its parent's behalf.
    """
    pid = os.environ.get("WATCHDOG_PID", "")
    if pid:
        try:
            if int(pid) != os.getpid():
                return None
        except ValueError:
            return None
    try:
        usec = int(os.environ.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    if usec <= 0:
        return None
    return usec / 1_000_000


async def watchdog_task(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Ping ``WATCHDOG=1`` at half the watchdog interval until cancelled.

    Start it with ``nursery.start``. systemd disarms the watchdog as soon as the unit starts
    stopping, so the final flush is bounded by ``TimeoutStopSec=``, not by ``WatchdogSec=``; the
    task may be cancelled with the rest. Returns at once when no watchdog is configured.
    """
    interval = watchdog_interval()
    task_status.started()
    if interval is None:
        return
    log.debug("sd_notify: watchdog every %.3fs (WatchdogSec=%.3fs)", interval / 2, interval)
    while True:
        notify("WATCHDOG=1")
        await trio.sleep(interval / 2)
