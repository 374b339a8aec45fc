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
from dataclasses import dataclass
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


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    cert: Path
    key: Path


def make_tls_files(directory: Path) -> TlsFiles:
    """A throwaway CA and a server certificate for 127.0.0.1/localhost, made with openssl."""
    openssl = shutil.which("openssl")
    if openssl is None:
        if os.environ.get("CI"):
            pytest.fail("CI needs openssl: run ./scripts/install")
        pytest.skip("openssl not installed")
    ca, ca_key = directory / "ca.pem", directory / "ca.key"
    cert, key, csr = directory / "server.pem", directory / "server.key", directory / "server.csr"
    ext = directory / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
        "-keyout", str(ca_key), "-out", str(ca))  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
        "-keyout", str(key), "-out", str(csr))  # fmt: skip
    run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
        "-CAcreateserial", "-days", "1", "-extfile", str(ext), "-out", str(cert))  # fmt: skip
    return TlsFiles(ca, cert, key)


class RedisServer:
    """One redis-server process; ``kill`` and ``start`` again keep the port and the data."""

    def __init__(
        self, directory: Path, password: str | None = None, tls: TlsFiles | None = None
    ) -> None:
        self.directory = directory
        self.password = password
        self.tls = tls
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.port}"

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
        if self.tls:
            args += [
                "--port", "0",
                "--tls-port", str(self.port),
                "--tls-cert-file", str(self.tls.cert),
                "--tls-key-file", str(self.tls.key),
                "--tls-ca-cert-file", str(self.tls.ca),
                "--tls-auth-clients", "no",
            ]  # fmt: skip
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
                    if self.tls:
                        return  # listening; the TLS handshake is the client's test
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
