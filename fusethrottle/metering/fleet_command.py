"""``fusethrottle budget set|show URL``: the fleet budget's rates, set once, read by every mount.

The rates live in Redis (fleet_redis.py), not in any mount's options, so changing the fleet's
budget is one command and every mount follows at its next lease (within a second). Exit 0 on
success, 1 when Redis cannot be asked, 2 for a bad command line; every failure is one line.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..service.options import OptionError, parse_fleet_url, parse_rate
from .fleet_redis import RedisFleetStore, StoreError, read_password


class FleetCommandError(Exception):
    """A bad command line; the message is the one line shown."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise FleetCommandError(f"budget: {message} (see fusethrottle budget --help)")


def _parser() -> _Parser:
    p = _Parser(
        prog="fusethrottle budget",
        description="Set or show a fleet budget shared through Redis (mount option budget=URL).",
    )
    sub = p.add_subparsers(dest="action", required=True, parser_class=_Parser)
    common = _Parser(add_help=False)
    common.add_argument("url", help="redis://HOST:PORT/NAME or rediss://HOST:PORT/NAME")
    common.add_argument(
        "--password-file",
        metavar="FILE",
        default="",
        help="file holding the Redis password (else $FUSETHROTTLE_BUDGET_PASSWORD_FILE)",
    )
    common.add_argument("--ca", metavar="FILE", default="", help="CA file for rediss://")
    common.add_argument(
        "--timeout", type=float, default=2.0, metavar="SECONDS", help="Redis timeout (default 2)"
    )
    setter = sub.add_parser(
        "set", parents=[common], help="set the fleet's rates", description="Set the rates."
    )
    setter.add_argument(
        "--metered", default="0", metavar="RATE", help="metered bytes/s for the fleet (100M)"
    )
    setter.add_argument(
        "--ops", default="0", metavar="UNITS", help="EFS operation units/s for the fleet (20000)"
    )
    sub.add_parser(
        "show",
        parents=[common],
        help="show the rates and the active mounts",
        description="Show the rates and the active mounts.",
    )
    return p


def main(argv: Sequence[str]) -> int:
    try:
        args = _parser().parse_args(list(argv))
        address = parse_fleet_url(args.url)
        metered = units = 0.0
        if args.action == "set":
            metered, units = parse_rate(args.metered), parse_rate(args.ops)
            if metered <= 0 and units <= 0:
                raise FleetCommandError("budget set: give --metered RATE, --ops UNITS or both")
    except (FleetCommandError, OptionError) as err:
        print(f"fusethrottle: {err}", file=sys.stderr)
        return 2
    try:
        password = read_password(args.password_file)
    except OSError as err:
        print(f"fusethrottle: budget: password file: {err}", file=sys.stderr)
        return 2
    try:
        store = RedisFleetStore(address, password, timeout=args.timeout, ca_file=args.ca or None)
    except ImportError:
        print("fusethrottle: budget needs the Python redis client (python3-redis)", file=sys.stderr)
        return 1
    try:
        if args.action == "set":
            store.set_rates(metered, units)
        rates = store.read_rates()
        active = store.active()
    except StoreError as err:
        print(f"fusethrottle: budget: {err}", file=sys.stderr)
        return 1
    finally:
        store.close()
    if rates is None:
        print(f"{address}: not set (fusethrottle budget set {address} --metered RATE)")
        return 1
    print(f"{address}: {_rate(rates[0], 'B')} metered, {_rate(rates[1], 'units')}")
    total = sum(m.weight for m in active) or 1.0
    print(f"active mounts: {len(active)}")
    for m in sorted(active, key=lambda m: m.mount_id):
        share = rates[0] * m.weight / total
        print(f"  {m.mount_id}  weight {m.weight:g}  share {_rate(share, 'B')}")
    return 0


def _rate(value: float, unit: str) -> str:
    if value <= 0:
        return f"no limit on {'metered bytes' if unit == 'B' else 'units'}"
    if unit == "B":
        return f"{value / 2**20:.1f} MiB/s"
    return f"{value:.0f} units/s"
