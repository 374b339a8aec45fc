"""``fusethrottle status MOUNTPOINT``: a human view of a running mount, and the socket behind it.

Transport: every daemon listens on a per-mount Unix stream socket, whether or not the metrics
endpoint is on. Its name is the mount's device number from /proc/self/mountinfo (FUSE mounts get
an anonymous ``0:NN`` that is unique among live mounts), in a runtime directory:

* ``/run/fusethrottle/0:NN.sock``                 daemon running as root (the systemd service)
* ``$XDG_RUNTIME_DIR/fusethrottle/0:NN.sock``     an unprivileged daemon with a runtime dir
* ``/tmp/fusethrottle-UID/0:NN.sock``             otherwise (directory 0700, checked on use)

The client finds the mount's device and owner (``user_id=`` in its super options) in mountinfo,
without touching the mountpoint (a hung or stale mount would hang the command), and tries those
directories. The protocol is one request line (``status`` or ``tasks``) answered by one JSON
document and a close, so ``socat - UNIX-CONNECT:/run/fusethrottle/0:NN.sock <<<status`` works
too. The answer is described in docs/METRICS.md.

Why not an xattr on the mount root: reading it is a FUSE request, which queues behind whatever
the mount is stuck on; the socket is answered by the event loop directly.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import socket
import stat
import struct
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

FSTYPE = "fuse.fusethrottle"
RUN_DIR = "/run/fusethrottle"
REQUEST_TIMEOUT = 5.0  # seconds a client gets to send its request line
CLIENT_TIMEOUT = 5.0  # seconds the command waits for an answer
MAX_CLIENTS = 8
REQUESTS = ("status", "tasks")


# --- where the socket lives ----------------------------------------------------------------


def socket_name(device: str) -> str:
    return f"{device}.sock"


def daemon_dir() -> str:
    """The directory this process (a daemon) puts its socket in."""
    uid = os.geteuid()
    if uid == 0:
        return RUN_DIR
    xdg = os.environ.get("XDG_RUNTIME_DIR", "")
    if xdg and os.path.isabs(xdg) and os.path.isdir(xdg):
        return os.path.join(xdg, "fusethrottle")
    return f"/tmp/fusethrottle-{uid}"


def client_dirs(owner: int | None) -> list[str]:
    """Where a daemon run by *owner* (None: unknown) may have put its socket, best first."""
    dirs = [RUN_DIR]
    uids = [owner] if owner is not None else []
    if os.geteuid() not in uids:
        uids.append(os.geteuid())
    for uid in uids:
        dirs.append(f"/run/user/{uid}/fusethrottle")
        if uid == os.geteuid() and os.environ.get("XDG_RUNTIME_DIR"):
            dirs.append(os.path.join(os.environ["XDG_RUNTIME_DIR"], "fusethrottle"))
        dirs.append(f"/tmp/fusethrottle-{uid}")
    return list(dict.fromkeys(dirs))


def _make_private_dir(path: str) -> None:
    """Create *path* for our sockets; refuse one that someone else could have prepared."""
    public = path == RUN_DIR or not path.startswith("/tmp/")
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o755 if public else 0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(f"{path} is not a directory")
    if st.st_uid != os.geteuid():
        raise OSError(f"{path} belongs to uid {st.st_uid}, not to us")
    if st.st_mode & 0o022:
        raise OSError(f"{path} is writable by others")


# --- the daemon's side ---------------------------------------------------------------------


async def serve_control(
    mountpoint: str,
    respond: Callable[[str], dict[str, Any]],
    *,
    task_status: Any = None,
) -> None:
    """Answer status requests for the mount at *mountpoint* until cancelled.

    *respond* runs on the event loop and returns a JSON-ready dict. A socket that cannot be
    created costs the status command, never the mount: it is logged and this task idles.
    """
    import trio

    from .mountinfo import find_mount

    task_status = task_status or trio.TASK_STATUS_IGNORED
    info = find_mount(mountpoint, fstype=FSTYPE)
    if info is None:  # not mounted by pyfuse3 (unit tests): nothing to name the socket after
        task_status.started()
        return
    directory = daemon_dir()
    with contextlib.suppress(OSError):
        _sweep_stale(directory)
    path = os.path.join(directory, socket_name(info.device))
    await serve_socket(path, info.device, respond, task_status=task_status)


def _sweep_stale(directory: str) -> None:
    """Remove sockets left by daemons that were killed: their mount is gone and nobody
    listens. A daemon still flushing after a lazy unmount keeps listening and is left alone."""
    live = {entry.device for entry in mount_table()}
    for name in os.listdir(directory):
        device = name.removesuffix(".sock")
        if not name.endswith(".sock") or device in live:
            continue
        path = os.path.join(directory, name)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.setblocking(False)
            try:
                probe.connect(path)
            except ConnectionRefusedError:
                with contextlib.suppress(OSError):
                    os.unlink(path)
                    log.debug("removed stale status socket %s", path)
            except OSError:
                pass


async def serve_socket(
    path: str,
    device: str,
    respond: Callable[[str], dict[str, Any]],
    *,
    task_status: Any = None,
) -> None:
    """Listen on *path*, answering every request with ``respond(request)`` tagged *device*."""
    import trio

    task_status = task_status or trio.TASK_STATUS_IGNORED
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        _make_private_dir(os.path.dirname(path))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # left by a daemon that died; device numbers are reused
        await sock.bind(path)
        os.chmod(path, 0o666)  # read-only numbers: any local user may ask
        sock.listen(MAX_CLIENTS)
        bound = os.stat(path).st_ino
    except OSError as err:
        sock.close()
        log.warning(
            "status socket %s unavailable (%s); `fusethrottle status` will not work", path, err
        )
        task_status.started()
        return
    limiter = trio.CapacityLimiter(MAX_CLIENTS)
    try:
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                try:
                    conn, _ = await sock.accept()
                except OSError as err:  # EMFILE and the like: try again shortly
                    log.debug("status socket accept: %s", err)
                    await trio.sleep(0.5)
                    continue
                try:  # a flood of clients is turned away, not queued
                    limiter.acquire_on_behalf_of_nowait(conn)
                except trio.WouldBlock:
                    conn.close()
                    continue
                nursery.start_soon(_answer, conn, respond, device, limiter)
    finally:
        sock.close()
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == bound:
                os.unlink(path)


async def _answer(
    conn: Any, respond: Callable[[str], dict[str, Any]], device: str, limiter: Any
) -> None:
    import trio

    try:
        with conn, trio.move_on_after(REQUEST_TIMEOUT):
            try:
                request = (await _read_line(conn)).strip() or "status"
                if request not in REQUESTS:
                    reply: dict[str, Any] = {"error": f"unknown request {request!r}"}
                elif request == "tasks" and _peer_uid(conn) not in (0, os.geteuid()):
                    reply = {"error": "only root and the daemon's user may list its tasks"}
                else:
                    reply = respond(request)
                reply["device"] = device
                data = (json.dumps(reply, separators=(",", ":")) + "\n").encode()
                while data:
                    sent = await conn.send(data)
                    data = data[sent:]
            except OSError as err:  # the client went away
                log.debug("status client: %s", err)
            except Exception:
                log.exception("internal error answering a status request; the mount is fine")
    finally:
        limiter.release_on_behalf_of(conn)


async def _read_line(conn: Any, limit: int = 1024) -> str:
    buf = b""
    while b"\n" not in buf and len(buf) < limit:
        chunk = await conn.recv(limit)
        if not chunk:
            break
        buf += chunk
    return buf.split(b"\n", 1)[0].decode(errors="replace")


def _peer_uid(conn: Any) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


# --- the command's side --------------------------------------------------------------------


class StatusError(Exception):
    """Why there is no status to show; ``str()`` is the one line printed."""


@dataclass(frozen=True)
class MountEntry:
    mountpoint: str
    device: str
    fstype: str
    source: str
    super_options: str

    @property
    def owner(self) -> int | None:
        for opt in self.super_options.split(","):
            if opt.startswith("user_id="):
                with contextlib.suppress(ValueError):
                    return int(opt[len("user_id=") :])
        return None


def mount_table(path: str = "/proc/self/mountinfo") -> list[MountEntry]:
    from .mountinfo import _unescape

    entries = []
    with open(path) as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            if len(fields) < 5 or len(rest) < 3:
                continue
            entries.append(
                MountEntry(_unescape(fields[4]), fields[2], rest[0], _unescape(rest[1]), rest[2])
            )
    return entries


def find_mount_of(path: str, table: Sequence[MountEntry] | None = None) -> MountEntry:
    """The mount *path* is on (the mountpoint itself or inside it), without stat()ing the
    mount: only the parent directory is resolved. Raises StatusError with the reason."""
    table = mount_table() if table is None else table
    absolute = os.path.abspath(path)
    best = _containing(absolute, table)
    if best is not None and best.fstype == FSTYPE:
        return best
    parent, name = os.path.split(absolute)  # a symlink on the way, e.g. /backups -> /srv/b
    best = _containing(os.path.join(os.path.realpath(parent), name), table)
    if best is not None and best.fstype == FSTYPE:
        return best
    if not os.path.lexists(absolute):
        raise StatusError(f"{path}: no such file or directory")
    best = _containing(os.path.realpath(absolute), table)
    if best is None or best.fstype != FSTYPE:
        where = f" (it is on {best.fstype} mounted at {best.mountpoint})" if best else ""
        raise StatusError(f"{path} is not a fusethrottle mount{where}")
    return best


def _containing(path: str, table: Sequence[MountEntry]) -> MountEntry | None:
    best: MountEntry | None = None
    for entry in table:  # later entries are mounted on top of earlier ones
        mp = entry.mountpoint
        if (path == mp or path.startswith(mp.rstrip("/") + "/")) and (
            best is None or len(mp) >= len(best.mountpoint)
        ):
            best = entry
    return best


def query(entry: MountEntry, request: str = "status", timeout: float = CLIENT_TIMEOUT) -> dict:
    """Ask the daemon serving *entry*; raises StatusError when nobody answers properly."""
    tried = []
    for directory in client_dirs(entry.owner):
        path = os.path.join(directory, socket_name(entry.device))
        if not os.path.exists(path):
            tried.append(directory)
            continue
        return _ask(path, entry, request, timeout)
    raise StatusError(
        f"no status socket for {entry.mountpoint} (device {entry.device}) in "
        f"{', '.join(tried)}: is its daemon from an older fusethrottle, or in another "
        "mount namespace?"
    )


def _ask(path: str, entry: MountEntry, request: str, timeout: float) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(path)
            sock.sendall(request.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except TimeoutError:
            raise StatusError(
                f"the daemon for {entry.mountpoint} did not answer within {timeout:g} s "
                "(its event loop is stuck; SIGUSR1 dumps its stacks)"
            ) from None
        except ConnectionRefusedError:
            raise StatusError(
                f"nobody listens on {path}: the daemon for {entry.mountpoint} is gone "
                "(a stale mount? clear it with fusermount3 -u)"
            ) from None
        except PermissionError:
            raise StatusError(f"no permission to connect to {path}") from None
        except (ConnectionResetError, BrokenPipeError):
            chunks = []  # turned away: reported below
        except OSError as err:
            raise StatusError(f"{path}: {err.strerror or err}") from None
    if not chunks:
        raise StatusError(
            f"the daemon for {entry.mountpoint} hung up without answering (too many status "
            "clients at once?)"
        )
    try:
        reply = json.loads(b"".join(chunks))
    except ValueError:
        raise StatusError(f"the daemon for {entry.mountpoint} sent a garbled answer") from None
    if not isinstance(reply, dict):
        raise StatusError(f"the daemon for {entry.mountpoint} sent a garbled answer")
    if reply.get("device") != entry.device:
        raise StatusError(f"{path} belongs to another mount (a stale socket)")
    if "error" in reply:
        raise StatusError(str(reply["error"]))
    return reply


# --- formatting (pure) ---------------------------------------------------------------------


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} PiB"  # pragma: no cover


def fmt_rate(n: float | None) -> str:
    return "-" if n is None else fmt_bytes(n) + "/s"


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1:
        return f"{s * 1000:.0f} ms" if s >= 0.0095 else f"{s * 1000:.1f} ms"
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    if s < 86400:
        return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    return f"{int(s // 86400)}d{int(s % 86400 // 3600):02d}h"


def fmt_count(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}" if float(n).is_integer() else f"{n:.1f}"


def _bucket_quantile(hist: dict[str, Any], q: float) -> float | None:
    """Upper bound of the histogram bucket holding quantile *q* (None: no samples)."""
    counts = hist.get("counts") or []
    total = sum(counts)
    if not total:
        return None
    running = 0
    for bound, n in zip([*hist.get("bounds", []), float("inf")], counts, strict=False):
        running += n
        if running >= q * total:
            return bound
    return float("inf")


def format_status(s: dict[str, Any], now: float | None = None) -> str:
    """The human view of one status answer (a Snapshot as JSON)."""
    now = time.time() if now is None else now
    m, c, r, fr = s["mount"], s["controller"], s["rates"], s["fsync_recent"]
    window = s["window_bytes"] or 1
    lines = [
        f"fusethrottle on {m['mountpoint']} (source {m['source']}), pid {m['pid']}, "
        f"up {fmt_seconds(max(0.0, now - m['started']))}, mode {m['mode']}",
    ]
    used = 100.0 * s["unsynced_bytes"] / window
    oldest = fmt_seconds(s["oldest_unsynced_age_seconds"]) if s["dirty_files"] else "-"
    lines.append(
        f"  un-synced    {fmt_bytes(s['unsynced_bytes'])} of {fmt_bytes(s['window_bytes'])} "
        f"window ({used:.0f}%), {s['dirty_files']} file(s), oldest {oldest}"
    )
    commit_rate = c["recent_bytes_per_second"]
    if s["unsynced_bytes"] and commit_rate:
        lines[-1] += f"; drains in ~{fmt_seconds(s['unsynced_bytes'] / commit_rate)}"
    if s.get("kernel_cache_bytes"):
        lines.append(
            f"               + up to {fmt_bytes(s['kernel_cache_bytes'])} in the kernel's cache "
            "of this mount (writeback cache), part of the window"
        )
    lines.append(
        f"               in flight to target {fmt_bytes(s['reserved_bytes'])}, being synced "
        f"{fmt_bytes(s['syncing_bytes'])}; batch {fmt_bytes(m['batch'])}, "
        f"max_age {fmt_seconds(m['max_age'])}"
    )
    span = f"last {r['span_seconds']:.0f} s" if r["span_seconds"] else "no history yet"
    lines.append(
        f"  throughput   write {fmt_rate(r['written'])}, read {fmt_rate(r['read'])}, "
        f"synced {fmt_rate(r['synced'])} ({span})"
    )
    lines.append(
        f"  totals       written {fmt_bytes(s['written_bytes'])}, read "
        f"{fmt_bytes(s['read_bytes'])}, synced {fmt_bytes(s['synced_bytes'])}"
    )
    durations = s["fsync_duration"]
    by_reason = ", ".join(
        f"{reason} {sum(h['counts'])}" for reason, h in durations.items() if sum(h["counts"])
    )
    errors = sum(s["fsync_errors"].values())
    if fr["samples"]:
        recent = (
            f"p50 {fmt_seconds(fr['p50'])}, p99 {fmt_seconds(fr['p99'])}, max "
            f"{fmt_seconds(fr['max'])} ({fr['samples']} in 5 min)"
        )
    else:
        recent = "none in the last 5 min"
    lines.append(f"  fsync        {recent}; {s['fsyncs_in_flight']} in flight, {errors} failed")
    lines.append(f"               by reason: {by_reason or 'none yet'}")
    wait_p99 = _bucket_quantile(s["admission_wait"], 0.99)
    if wait_p99 is None:
        wait_text = ""
    elif wait_p99 == float("inf"):
        wait_text = f", p99 wait > {fmt_seconds(s['admission_wait']['bounds'][-1])}"
    else:
        wait_text = f", p99 wait <= {fmt_seconds(wait_p99)}"
    lines.append(
        f"  admission    {s['waiting_writes']} write(s) waiting now; {s['throttled_writes']} "
        f"throttled{wait_text}, {s['admission_timeouts']} timed out"
    )
    ctl = f"window {fmt_bytes(c['window'])}"
    if c["mode"] == "adaptive":
        ctl += f" in [{fmt_bytes(m['window_min'])}, {fmt_bytes(m['window_max'])}]"
    if c["target_window"] is not None:
        ctl += f", target {fmt_bytes(c['target_window'])}"
    lines.append(f"  controller   {c['mode']}: {ctl}")
    measured = f"{c['samples']} samples, {c['holds']} halvings"
    if c["baseline_bytes_per_second"] or c["recent_bytes_per_second"]:
        measured = (
            f"commit rate best {fmt_rate(c['baseline_bytes_per_second'])}, recent "
            f"{fmt_rate(c['recent_bytes_per_second'])}; {measured}"
        )
    lines.append(f"               {measured}")
    meter = s["meter"]
    if meter is not None:
        metered = sum(t["metered_bytes"] for t in meter.values())
        units = sum(t["units"] for t in meter.values())
        lines.append(
            f"  meter        {m['meter']}: metered {fmt_bytes(metered)} "
            f"({fmt_rate(r['metered'])}), {fmt_count(units)} units ({fmt_count(r['units'])}/s)"
        )
        for label, t in meter.items():
            if t["ops"]:
                lines.append(
                    f"               {label:<11}{fmt_count(t['ops']):>8} ops "
                    f"{fmt_bytes(t['bytes']):>11} {fmt_bytes(t['metered_bytes']):>11} metered "
                    f"{fmt_count(t['units']):>8} units"
                )
    ceilings = _ceilings(m, r)
    if s["ceiling_delayed"]:
        ceilings += (
            f"; {s['ceiling_delayed']} request(s) delayed, "
            f"{fmt_seconds(s['ceiling_delay_seconds'])} in all"
        )
    lines.append(f"  ceilings     {ceilings}")
    target_errors = s["target_errors"]
    if target_errors:
        shown = ", ".join(f"{op} {name} x{n}" for op, name, n in target_errors[:8])
        more = f" (+{len(target_errors) - 8} more)" if len(target_errors) > 8 else ""
        lines.append(f"  errors       {shown}{more}")
    else:
        lines.append("  errors       none from the target")
    lines += _memory_lines(s)
    lines.append(
        f"  daemon       {s['inodes']} inodes held, {s['open_handles']} open handles; "
        f"metrics {'http://' + m['metrics'] + '/metrics' if m['metrics'] else 'off'}"
    )
    return "\n".join(lines)


def _memory_lines(s: dict[str, Any]) -> list[str]:
    """Where the target's page cache is charged, and what the mount dropped once synced."""
    if s.get("memory_cgroup_own"):
        usage = s.get("memory_cgroup_usage_bytes")
        used = fmt_bytes(usage) if usage is not None else "?"
        first = (
            f"  memory       target's cache charged to {s['memory_cgroup']} ({used} of "
            f"{fmt_bytes(s['memory_cgroup_limit_bytes'])})"
        )
    else:
        why = s.get("memory_cgroup") or "started there"
        first = f"  memory       in the cgroup it started in: {why}"
    first = first if len(first) <= 110 else first[:107] + "..."
    drops = s.get("page_cache_drops", 0)
    return [first, f"               {drops} synced range(s) dropped from the page cache"]


def _ceilings(m: dict[str, Any], r: dict[str, Any]) -> str:
    parts = []
    if m["metered_limit"]:
        used = 100.0 * r["metered"] / m["metered_limit"]
        parts.append(f"metered {fmt_rate(m['metered_limit'])} ({used:.0f}% used)")
    else:
        parts.append("metered none")
    if m["ops_limit"]:
        used = 100.0 * r["units"] / m["ops_limit"]
        parts.append(f"ops {fmt_count(m['ops_limit'])} units/s ({used:.0f}% used)")
    else:
        parts.append("ops none")
    return ", ".join(parts)


# --- the command ---------------------------------------------------------------------------


def _format(reply: dict[str, Any], entry: MountEntry) -> str:
    try:
        return format_status(reply)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        raise StatusError(
            f"the daemon for {entry.mountpoint} answered in a form this fusethrottle does not "
            "know (a daemon from before an upgrade?); --json shows the raw answer"
        ) from None


class _Parser(argparse.ArgumentParser):
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


def main(argv: Sequence[str]) -> int:
    """``fusethrottle status``; 0 when the daemon answered, 1 when not, 2 for a bad command."""
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
        shown = 0
        clear = args.watch and not args.json and sys.stdout.isatty()
        while True:
            reply = query(entry, timeout=args.timeout)
            text = json.dumps(reply) if args.json else _format(reply, entry)
            if clear:
                sys.stdout.write("\x1b[H\x1b[2J")
            elif shown and not args.json:
                print()
            print(text, flush=True)
            shown += 1
            if not args.watch or (args.count and shown >= args.count):
                return 0
            time.sleep(args.interval)
    except StatusError as err:
        print(f"fusethrottle: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:  # `status --watch | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
