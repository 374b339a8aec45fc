"""``fusethrottle SOURCE MOUNTPOINT [-o opt,...] [-f]`` and ``fusethrottle status MOUNTPOINT``.

``fusethrottle --conf FILE MOUNTPOINT [-f]`` takes SOURCE and OPTIONS from an instance file
(``/etc/fusethrottle/NAME.conf``, as fusethrottle@.service starts it), and a reload rereads it.

Follows the mount.fuse convention so ``mount -t fuse.fusethrottle`` and fstab work through
fuse3's helper. Everything a user can get wrong is checked before anything is mounted and
reported as one line on stderr with a non-zero exit; no traceback reaches the user.

Without ``-f`` the process forks; the parent waits until the child's mount answers a stat and
only then exits 0 (or prints the child's error and exits 1), so ``mount`` returns when the
filesystem is usable.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
from collections.abc import Sequence

from .. import __version__
from .held_signals import HELD_SIGNALS, release_held_signals
from .live_settings import CONF_ENV, instance_settings
from .mountinfo import find_mount
from .options import Config, OptionError, parse_options, split_options
from .target_probe import can_switch

USAGE = (
    "usage: fusethrottle SOURCE MOUNTPOINT [-o opt[,opt...]] [-f]\n"
    "       fusethrottle --conf FILE MOUNTPOINT [-o opt[,opt...]] [-f]\n"
    "       fusethrottle status MOUNTPOINT [--watch] [--interval SECONDS]\n"
    "       fusethrottle set MOUNTPOINT key=value [key=value...]\n"
    "       fusethrottle budget set redis://HOST:PORT/NAME [--metered RATE] [--ops UNITS]\n"
    "       fusethrottle budget show redis://HOST:PORT/NAME\n"
    "       fusethrottle --version"
)


class UsageError(Exception):
    """Bad command line or environment; the message is the one line shown to the user."""


def parse_args(argv: Sequence[str]) -> Config:
    positional: list[str] = []
    option_groups: list[str] = []
    foreground = False
    conf: str | None = None
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-f", "--foreground"):
            foreground = True
        elif arg == "-o":
            if i + 1 >= len(args):
                raise UsageError("-o needs an option list")
            i += 1
            option_groups.append(args[i])
        elif arg.startswith("-o") and len(arg) > 2:
            option_groups.append(arg[2:])
        elif arg == "--conf":
            if i + 1 >= len(args):
                raise UsageError("--conf needs a file (SOURCE= and OPTIONS= lines)")
            i += 1
            conf = args[i]
        elif arg in ("-n", "-s", "-v"):  # mount(8) helper flags: no mtab, sloppy, verbose
            pass
        elif arg.startswith("-") and arg != "-":
            raise UsageError(f"unknown argument: {arg}")
        else:
            positional.append(arg)
        i += 1
    if conf is not None:
        if len(positional) != 1:
            raise UsageError(f"with --conf {conf}, expected only MOUNTPOINT (SOURCE is in it)")
        try:
            conf_source, conf_options = instance_settings(conf)
        except OptionError as err:
            raise UsageError(str(err)) from None
        positional.insert(0, conf_source)
        option_groups.insert(0, conf_options)  # the command line's -o comes after, and wins
        os.environ[CONF_ENV] = os.path.abspath(conf)  # what a reload (SIGHUP) rereads
    if len(positional) != 2:
        raise UsageError("expected SOURCE and MOUNTPOINT")
    if not all(p.strip() for p in positional):
        raise UsageError("SOURCE and MOUNTPOINT must not be empty")
    source, mountpoint = (os.path.realpath(p) for p in positional)
    try:
        return parse_options(
            split_options(option_groups),
            source=source,
            mountpoint=mountpoint,
            foreground=foreground,
        )
    except OptionError as err:
        raise UsageError(str(err)) from None


def fuse_mount_is_stale(mountpoint: str) -> bool:
    """Is the FUSE mount at *mountpoint* one whose daemon is gone? A stat can be answered from
    the kernel's attribute cache after the daemon died; a statfs always asks the daemon."""
    try:
        os.statvfs(mountpoint)
    except OSError as err:
        return err.errno == errno.ENOTCONN
    return False


def stale_mount(mountpoint: str) -> UsageError:
    return UsageError(
        f"mountpoint {mountpoint} is a stale FUSE mount; clear it with: fusermount3 -u {mountpoint}"
    )


def check_environment(config: Config) -> None:
    """Refuse what would fail or hang later, before anything is mounted."""
    if not os.path.exists(config.source):
        raise UsageError(f"source {config.source} does not exist")
    if not os.path.isdir(config.source):
        raise UsageError(f"source {config.source} is not a directory")
    try:
        st = os.stat(config.mountpoint)
    except FileNotFoundError:
        raise UsageError(f"mountpoint {config.mountpoint} does not exist") from None
    except OSError as err:
        if err.errno == errno.ENOTCONN:
            raise stale_mount(config.mountpoint) from None
        raise UsageError(f"mountpoint {config.mountpoint}: {err.strerror}") from None
    import stat as stat_mod

    if not stat_mod.S_ISDIR(st.st_mode):
        raise UsageError(f"mountpoint {config.mountpoint} is not a directory")
    existing = find_mount(config.mountpoint)
    if existing is not None and existing.fstype.startswith("fuse"):
        if fuse_mount_is_stale(config.mountpoint):
            raise stale_mount(config.mountpoint)
        raise UsageError(
            f"mountpoint {config.mountpoint} is busy: {existing.fstype} from {existing.source} "
            "is mounted there"
        )
    src = os.path.realpath(config.source)
    mnt = os.path.realpath(config.mountpoint)
    if mnt == src or mnt.startswith(src.rstrip("/") + "/"):
        raise UsageError("mountpoint must not be inside source (the mount would read itself)")
    if not os.path.exists("/dev/fuse"):
        raise UsageError("/dev/fuse is missing: load the fuse kernel module (modprobe fuse)")
    if not os.access("/dev/fuse", os.R_OK | os.W_OK) and os.geteuid() != 0:
        raise UsageError("no permission to open /dev/fuse")
    if config.allow_other and os.geteuid() != 0 and not _user_allow_other():
        raise UsageError("allow_other needs root, or 'user_allow_other' in /etc/fuse.conf")
    if config.permissions == "target" and not can_switch():
        raise UsageError(
            "permissions=target needs a daemon running as root (it makes each call as its "
            "caller; as anyone else, every caller would get the daemon's rights)"
        )
    if config.budget is not None:
        _check_fleet(config)
    if config.guard:
        from ..guard.pressure import PressureUnavailable, pressure_files

        try:
            pressure_files(config.guard)
        except PressureUnavailable as err:
            raise UsageError(str(err)) from None


def _check_fleet(config: Config) -> None:
    """What budget= needs locally: the Redis client and a readable password file. Redis itself
    may be down: the mount then starts on its fallback budget."""
    try:
        import redis  # noqa: F401
    except ImportError:
        raise UsageError(
            "budget= needs the Python redis client: apt install python3-redis"
        ) from None
    from ..metering.fleet_redis import PASSWORD_FILE_ENV, read_password

    named = config.budget_password_file or os.environ.get(PASSWORD_FILE_ENV, "")
    try:
        read_password(config.budget_password_file)
    except OSError as err:
        source = "budget_password_file" if config.budget_password_file else PASSWORD_FILE_ENV
        raise UsageError(f"{source} {named}: {err.strerror or err}") from None
    if config.budget_ca and not os.access(config.budget_ca, os.R_OK):
        raise UsageError(f"budget_ca {config.budget_ca}: cannot read it")


def _user_allow_other() -> bool:
    try:
        with open("/etc/fuse.conf") as f:
            return any(line.strip() == "user_allow_other" for line in f)
    except OSError:
        return False


def _fail(message: str, code: int = 1) -> int:
    print(f"fusethrottle: {message}", file=sys.stderr)
    return code


def run_mount(config: Config) -> int:
    from ..engine.native import EngineUnavailable, load
    from .daemon import configure_logging, serve

    try:  # here, not in the child: its log goes to syslog, not to whoever ran the command
        load()
    except EngineUnavailable as err:
        return _fail(str(err))
    if config.foreground:
        configure_logging(config.log_level, foreground=True, log_format=config.log_format)
        return serve(config)
    return _daemonize(config)


def _daemonize(config: Config) -> int:
    """Fork; the parent reports the child's first words: OK, or why the mount failed."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid:
        release_held_signals()  # Ctrl-C ends this wait, as before: the child has them held
        os.close(write_end)
        chunks = []
        while chunk := os.read(read_end, 4096):
            chunks.append(chunk)
        os.close(read_end)
        message = b"".join(chunks).decode(errors="replace").strip()
        if message.endswith("READY"):
            return 0
        lines = [ln for ln in message.splitlines() if ln.strip() and ln.strip() != "READY"]
        return _fail(lines[-1] if lines else "the mount process exited before the mount answered")
    # child
    os.close(read_end)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.dup2(write_end, 2)  # libfuse's own complaints reach the parent until we are ready
    from .daemon import configure_logging, serve

    configure_logging(config.log_level, foreground=False, log_format=config.log_format)

    def ready() -> None:
        os.write(write_end, b"READY")
        os.dup2(devnull, 2)
        os.close(write_end)

    code = 1
    try:
        code = serve(config, on_ready=ready)
    except Exception as err:
        with contextlib.suppress(OSError):
            os.write(write_end, f"\n{err}\n".encode())
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    # SIGUSR1 asks a daemon for its stacks (``status`` suggests it when a mount is stuck); one
    # sent while this process is still starting, or waiting for its child's mount, must not
    # end it. Ignored until the daemon installs the dump (daemon.serve); the ignore is
    # inherited by the child.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    # A stop sent while the daemon starts must stop it once mounted, not kill it half way
    # (the mount left dead) nor be dropped: the PID 1 of a container (podman stop right after
    # start) has no default action for SIGTERM, so the kernel discards one that comes before
    # trio's handler. Held (blocked, so kept pending) from here, through the fork and the
    # mount, until Daemon._signals has its handler and releases them; the other commands
    # release them at once. Blocked signals are inherited by every thread made meanwhile.
    # (Before this line, in the interpreter's start, the container's entry point holds them.)
    signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "-V", "--version", "status", "set", "budget"):
        release_held_signals()
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    if args[0] in ("-V", "--version"):
        print(f"fusethrottle {__version__}")
        return 0
    if args[0] == "status":
        from ..observability.status import main as status_main

        return status_main(args[1:])
    if args[0] == "set":
        from .set_command import main as set_main

        return set_main(args[1:])
    if args[0] == "budget":
        from ..metering.fleet_command import main as fleet_main

        return fleet_main(args[1:])
    try:
        config = parse_args(args)
        check_environment(config)
    except UsageError as err:
        release_held_signals()
        return _fail(str(err), 2)
    try:
        return run_mount(config)
    except KeyboardInterrupt:
        return 130
    except RuntimeError as err:  # a metrics address we cannot bind
        from ..observability.metrics import MetricsError

        if isinstance(err, MetricsError):
            return _fail(str(err))
        return _fail(f"cannot mount {config.mountpoint}: {err}")


if __name__ == "__main__":
    sys.exit(main())
