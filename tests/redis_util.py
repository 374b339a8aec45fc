"""A real redis-server for tests: in a temporary directory, on a free local port, ours to kill.

Only the process started here is ever signalled, by pid. Data survive a kill and restart
(append-only file, fsynced on every write), as a production Redis keeps a budget that was set.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def require_redis() -> None:
    """Skip where redis-server or the client is truly absent; in CI (scripts/install puts both
    there) their absence is a failure, not a skip."""
    missing = []
    if not os.path.exists(REDIS_SERVER):
        missing.append("redis-server (apt install redis-server)")
    try:
        import redis  # noqa: F401
    except ImportError:
        missing.append("the Python redis client (apt install python3-redis)")
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs {', '.join(missing)}: run ./scripts/install")
        pytest.skip(f"{', '.join(missing)} not installed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One redis-server process; ``kill`` and ``start`` again keep the port and the data."""

    def __init__(self, directory: Path, password: str | None = None) -> None:
        self.directory = directory
        self.password = password
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> None:
        args = [
            REDIS_SERVER,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--save", "",
            "--daemonize", "no",
            "--loglevel", "warning",
        ]  # fmt: skip
        if self.password:
            args += ["--requirepass", self.password]
        log = open(self.directory / "redis.log", "ab")  # noqa: SIM115 (the child keeps it)
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"redis-server exited: {(self.directory / 'redis.log').read_text()}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    answer = s.recv(64)
                if answer.startswith((b"+PONG", b"-NOAUTH")):
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("redis-server did not answer within 10 s")

    def kill(self) -> None:
        """SIGKILL, as a crashed or fenced Redis: no goodbye to the clients."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None

    def pause(self) -> None:
        """SIGSTOP: a hung Redis (accepts connections, never answers)."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)
