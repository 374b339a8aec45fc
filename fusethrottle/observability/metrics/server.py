"""The HTTP endpoint of ``-o metrics=HOST:PORT``: bound early, served from a thread.

Binding and serving are two steps on purpose. The address is bound before anything is mounted,
so a bad address or a port in use fails the mount with one line (:class:`MetricsError`) instead
of leaving a mount nobody can watch; serving starts once the mount exists, with the registry
that reads it. The server runs in its own thread (prometheus_client's WSGI app is synchronous)
and only ever reads frozen snapshots.
"""

from __future__ import annotations

import errno as errno_mod
import logging
import socket
import threading
from socketserver import TCPServer, ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

import trio
from prometheus_client import CollectorRegistry, make_wsgi_app

log = logging.getLogger(__package__)


class MetricsError(RuntimeError):
    """The endpoint cannot be served; the message is the one line shown to the user."""


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per scrape would flood the journal

    def log_error(self, format: str, *args: Any) -> None:
        log.debug("metrics request: " + format, *args)


class MetricsServer(ThreadingMixIn, WSGIServer):
    """wsgiref's server, threaded, quiet, and without the DNS lookup at bind time."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True  # TIME_WAIT only: a port another process listens on is refused

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver prints a traceback to stderr; a scraper that hangs up is not news.
        log.debug("metrics request from %s failed", client_address, exc_info=True)

    def server_bind(self) -> None:
        # HTTPServer.server_bind asks DNS for the host's FQDN, which can hang; we need no name.
        TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)
        self.setup_environ()


_BIND_HINTS = {
    errno_mod.EADDRINUSE: "address already in use (another process listens on it)",
    errno_mod.EADDRNOTAVAIL: "not an address of this host",
    errno_mod.EACCES: "permission denied (ports below 1024 need root)",
}


def split_address(address: str) -> tuple[str, int]:
    """``"127.0.0.1:9420"``, ``"[::1]:9420"``, ``":9420"`` -> (host, port)."""
    host, _, port = address.rpartition(":")
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "127.0.0.1", int(port)


def bind_endpoint(address: str) -> MetricsServer:
    """Listen on *address* now (before anything is mounted); :func:`serve_endpoint` serves it."""
    host, port = split_address(address)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise MetricsError(
            f"metrics endpoint {address}: cannot resolve {host}: {err.strerror}"
        ) from None
    family, _, _, _, sockaddr = infos[0]
    # socketserver creates the socket from a class attribute: one subclass per address family.
    server_class = type("MetricsServer", (MetricsServer,), {"address_family": family})
    try:
        return server_class(sockaddr, _QuietHandler)
    except OSError as err:
        reason = _BIND_HINTS.get(err.errno or 0, err.strerror or str(err))
        raise MetricsError(f"metrics endpoint {address}: {reason}") from None


async def serve_endpoint(
    server: MetricsServer,
    registry: CollectorRegistry,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve *registry* on the bound *server* from a thread, for as long as this task lives."""
    server.set_app(make_wsgi_app(registry))
    thread = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": 0.2},
        name="metrics-http",
        daemon=True,
    )
    thread.start()
    host, port = server.server_address[:2]
    log.info("serving metrics on http://%s/metrics", _url_host(str(host), int(port)))
    task_status.started()
    try:
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(server.shutdown)
        server.server_close()


def _url_host(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
