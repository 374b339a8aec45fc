"""What is every task and thread doing? The answers for a mount that seems stuck.

``task_tree`` and ``thread_stacks`` answer ``fusethrottle status --tasks`` (through the status
socket); on SIGUSR1, :func:`run_diagnostics` logs the task tree while faulthandler dumps every
thread's stack. They only read, so they may be asked at any time without disturbing the mount.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from typing import Any

import trio

log = logging.getLogger(__package__)


def _await_frames(coro: Any) -> Iterator[tuple[str, int, str]]:
    """(file, line, function) down a coroutine's await chain (trio 0.22 lacks
    Task.iter_await_frames)."""
    seen = 0
    while coro is not None and seen < 200:
        frame = (
            getattr(coro, "cr_frame", None)
            or getattr(coro, "gi_frame", None)
            or getattr(coro, "ag_frame", None)
        )
        if frame is None:
            return
        yield frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name
        coro = (
            getattr(coro, "cr_await", None)
            or getattr(coro, "gi_yieldfrom", None)
            or getattr(coro, "ag_await", None)
        )
        seen += 1


_TRIO_DIR = os.path.dirname(trio.__file__) + os.sep


def task_tree() -> str:
    """Every trio task, indented under its parent, with where each one waits (event loop)."""
    lines: list[str] = []

    def walk(task: trio.lowlevel.Task, depth: int) -> None:
        pad = "  " * depth
        lines.append(f"{pad}{task.name}")
        for filename, lineno, func in _await_frames(task.coro):
            if _TRIO_DIR not in filename:  # where trio itself waits says nothing new
                lines.append(f"{pad}    {filename}:{lineno} in {func}")
        for nursery in task.child_nurseries:
            for child in nursery.child_tasks:
                walk(child, depth + 1)

    root = trio.lowlevel.current_root_task()
    if root is not None:
        walk(root, 0)
    return "\n".join(lines)


def thread_stacks() -> str:
    """Every thread's Python stack (worker threads stuck on the target show up here)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame))
        parts.append(f"thread {names.get(ident, '?')} ({ident}):\n{stack}")
    return "\n".join(parts)


async def run_diagnostics(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """On SIGUSR1, log the trio task tree (faulthandler still dumps every thread's stack).

    daemon.serve registers faulthandler on SIGUSR1, and one signal has one handler. So: take
    faulthandler off, install trio's handler, and put faulthandler back on top of it with
    ``chain=True``: its C handler dumps thread stacks even when the event loop is stuck, then
    passes the signal on to trio, which wakes this task. On exit the original arrangement is
    restored.
    """
    if threading.current_thread() is not threading.main_thread():
        task_status.started()
        return
    # typeshed says None; CPython returns whether a handler was registered
    had_faulthandler = bool(faulthandler.unregister(signal.SIGUSR1))  # type: ignore[func-returns-value]
    try:
        with trio.open_signal_receiver(signal.SIGUSR1) as signals:
            chained = _register_faulthandler(chain=True)
            task_status.started()
            try:
                async for _ in signals:
                    try:
                        tree = task_tree()
                    except Exception:
                        log.exception("could not walk the trio task tree")
                        continue
                    log.warning("SIGUSR1: trio tasks (thread stacks went to stderr):\n%s", tree)
            finally:
                if chained:
                    faulthandler.unregister(signal.SIGUSR1)
    finally:
        if had_faulthandler:
            _register_faulthandler(chain=False)


def _register_faulthandler(chain: bool) -> bool:
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True, chain=chain)
    except (ValueError, OSError, AttributeError, RuntimeError):  # stderr without a descriptor
        return False
    return True
