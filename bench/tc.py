"""A rate limit on a network device's egress with tc's tbf: the throttle of an NFS target.

blkio throttles the built-in loop target; an NFS mount has no block device, so its writes are
slowed where they leave the client, on the link to the server. ``--throttle tc:DEV`` changes
the rate of the tbf qdisc on DEV (the NFS lab puts one under its netem delay), or adds one at
the root when there is none, and puts things back afterwards. Command building and parsing are
pure; only :class:`TcThrottle` runs tc.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass

from bench.system import BenchError, run

log = logging.getLogger(__name__)

MIB = 1 << 20
#: tbf refuses a rate of 0: a stalled server is this slow (bytes/s).
MIN_RATE = 8000
#: "No limit": 10 Gbit/s, far above anything the lab's link carries.
UNLIMITED = 1_250_000_000
#: The handle of a tbf the throttle adds itself (and deletes afterwards).
OWN_HANDLE = "f7:"


@dataclass(frozen=True)
class Qdisc:
    kind: str
    handle: str
    parent: str | None  # None: the root qdisc
    rate: int | None = None  # tbf: bytes/s


def parse_qdiscs(text: str) -> list[Qdisc]:
    """``tc -j qdisc show dev DEV`` -> qdiscs (pure)."""
    out = []
    for q in json.loads(text or "[]"):
        rate = q.get("options", {}).get("rate")
        out.append(
            Qdisc(
                str(q.get("kind", "")),
                str(q.get("handle", "")),
                None if q.get("root") else q.get("parent"),
                int(rate) if isinstance(rate, int | float) else None,
            )
        )
    return out


def find_tbf(qdiscs: list[Qdisc]) -> Qdisc | None:
    return next((q for q in qdiscs if q.kind == "tbf"), None)


def tbf_args(rate: int | None) -> list[str]:
    """tbf's options for *rate* bytes/s (None: unlimited; 0: as slow as tbf goes). The burst
    holds at least one 1 MiB NFS WRITE plus headers and 1/100 s at the rate: a burst under
    256 kB stalled copies in the lab's kernel."""
    rate = UNLIMITED if rate is None else max(rate, MIN_RATE)
    burst = max(2 * MIB, rate // 100)
    return ["tbf", "rate", f"{rate}bps", "burst", str(burst), "latency", "400ms"]


def _place(q: Qdisc) -> list[str]:
    where = ["root"] if q.parent is None else ["parent", q.parent]
    return [*where, "handle", q.handle]


def change_command(dev: str, q: Qdisc, rate: int | None) -> list[str]:
    """Move an existing tbf to *rate*, in place (its queue and its parent stay)."""
    return ["tc", "qdisc", "change", "dev", dev, *_place(q), *tbf_args(rate)]


def add_command(dev: str, rate: int | None) -> list[str]:
    return ["tc", "qdisc", "replace", "dev", dev, "root", "handle", OWN_HANDLE, *tbf_args(rate)]


def delete_command(dev: str) -> list[str]:
    return ["tc", "qdisc", "del", "dev", dev, "root"]


def parse_throttle(text: str) -> str:
    """``tc:DEV`` -> DEV; anything else is refused (pure)."""
    kind, _, dev = text.partition(":")
    if kind != "tc" or not dev or "/" in dev or " " in dev:
        raise ValueError(f"--throttle {text!r}: expected tc:DEV, e.g. tc:eth0")
    return dev


class TcThrottle:
    """The egress rate of one device, applied by a :class:`bench.target.ScheduleRunner`.

    :meth:`setup` records what was there; the teardown (``restore-tc``) puts the old tbf's rate
    back, or deletes the tbf the throttle added."""

    def __init__(self, dev: str) -> None:
        self.dev = dev
        self.qdisc: Qdisc | None = None
        self.added = False
        self.current: int | None = None
        self._lock = threading.Lock()

    def setup(self) -> tuple[str, str, int]:
        """Find the tbf to move (or add one): the undo's arguments (dev, how, old rate)."""
        try:
            found = find_tbf(parse_qdiscs(run(["tc", "-j", "qdisc", "show", "dev", self.dev])))
        except (ValueError, TypeError) as err:
            raise BenchError(f"tc qdisc show dev {self.dev}: {err}") from None
        if found is None:
            run(add_command(self.dev, None))
            self.added = True
            self.qdisc = Qdisc("tbf", OWN_HANDLE, None)
            return self.dev, "delete", 0
        self.qdisc = found
        log.info("throttle: tbf %s on %s (was %s B/s)", found.handle, self.dev, found.rate)
        return self.dev, json.dumps(found.__dict__), found.rate or 0

    def apply(self, rate: int | None) -> None:
        assert self.qdisc is not None, "setup first"
        with self._lock:
            run(change_command(self.dev, self.qdisc, rate))
            self.current = rate


def restore(dev: str, how: str, rate: int) -> None:
    """The teardown of a :class:`TcThrottle`: delete the added tbf or move the old one back."""
    if how == "delete":
        run(delete_command(dev), check=False)
        return
    q = Qdisc(**json.loads(how))
    run(change_command(dev, q, rate or None), check=False)
