"""The NFS lab's link and export profiles, and the commands that set them up (pure).

A profile is what the backup's NFS mount looks like from the client: protocol version, mount
options, the round trip of the link and its bandwidth, and how the server commits. The guest
(guest.py) runs the commands built here; nothing in this module touches the system, so the
tables can be read and tested on their own.

``lan``   NFSv3 over a 1 Gbit/s link with a 0.2 ms round trip: a file server in the same rack.
``efs``   NFSv4.1 with the mount options AWS recommends for EFS (``hard,noresvport``, 1 MiB
          rsize/wsize, timeo=600, retrans=2), a 0.25 ms round trip (EFS documents reads "as low
          as 250 us"), a server that commits every change before it answers (``sync`` export)
          on a disk whose writes take 2.5 ms more (EFS: writes "as low as 2.7 ms"), 500 MiB/s
          per client, and no extended attributes (v4.1 has none).
``slow``  NFSv4.1 at 20 MiB/s with a 0.2 ms round trip: the bench changes the bandwidth on a
          schedule (a degrading server), see :func:`rate_change`.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Client and server addresses on the veth pair between the client's network namespace and
#: the server's (the guest's root namespace).
SERVER_ADDR = "10.77.0.1"
CLIENT_ADDR = "10.77.0.2"
#: A second NFS client (its own network namespace, so its own client ID and caches).
CLIENT2_ADDR = "10.77.1.2"
SERVER2_ADDR = "10.77.1.1"

MIB = 1 << 20


@dataclass(frozen=True)
class Profile:
    name: str
    #: "3" or "4.1"
    version: str
    #: Round trip added by the link (netem, half on each direction), milliseconds.
    rtt_ms: float
    #: Link bandwidth in bytes/s (tbf on both directions), None: as fast as the VM goes.
    rate: int | None
    #: Extra NFS mount options (beyond vers=).
    options: tuple[str, ...]
    #: Export with ``sync`` (the server commits each change before answering) instead of async.
    sync_export: bool = False
    #: Extra latency of each write to the export's disk (dm-delay), milliseconds.
    disk_write_ms: float = 0.0
    description: str = ""


COMMON = ("hard", "timeo=600", "retrans=2", "rsize=1048576", "wsize=1048576")

PROFILES: dict[str, Profile] = {
    "lan": Profile(
        "lan",
        "3",
        0.2,
        125_000_000,
        (*COMMON, "nolock"),
        description="NFSv3, 1 Gbit/s, 0.2 ms round trip",
    ),
    "efs": Profile(
        "efs",
        "4.1",
        0.25,
        500 * MIB,
        (*COMMON, "noresvport"),
        sync_export=True,
        disk_write_ms=2.5,
        description="NFSv4.1 as EFS: 0.25 ms round trip, writes +2.5 ms, sync export, 500 MiB/s",
    ),
    "slow": Profile(
        "slow",
        "4.1",
        0.2,
        20 * MIB,
        (*COMMON,),
        description="NFSv4.1 at 20 MiB/s (the bench moves the bandwidth on a schedule)",
    ),
    # Neither latency nor a bandwidth limit: what the VM itself can do (smoke tests).
    "plain": Profile("plain", "4.1", 0.0, None, (*COMMON,), description="NFSv4.1, no shaping"),
    "plain3": Profile("plain3", "3", 0.0, None, (*COMMON, "nolock"), description="NFSv3"),
}


@dataclass(frozen=True)
class Export:
    """A directory of the server's disk, exported with its own squash rule."""

    name: str
    squash: str  # no_root_squash | root_squash | all_squash
    fsid: int


EXPORTS = (
    Export("rw", "no_root_squash", 1),
    Export("squash", "root_squash", 2),
    Export("allsquash", "all_squash", 3),
)
#: Where the server's disk is mounted. Each export is a directory of it, bind-mounted at
#: /srv/<name>: NFSv4 reaches an export through the pseudo root (a tmpfs at /srv) only where
#: the export is a mount point.
DISK_MOUNT = "/export-disk"
EXPORT_ROOT = "/srv"
#: The uid and gid all_squash (and root_squash) map to: nobody/nogroup.
ANON_ID = 65534


def exports_file(profile: Profile) -> str:
    """/etc/exports: the v4 pseudo root, then each export of the disk."""
    commit = "sync" if profile.sync_export else "async"
    lines = ["/srv *(ro,fsid=0,crossmnt,no_subtree_check,insecure)"]
    for export in EXPORTS:
        lines.append(
            f"{EXPORT_ROOT}/{export.name} *(rw,{commit},{export.squash},fsid={export.fsid},"
            f"no_subtree_check,insecure,anonuid={ANON_ID},anongid={ANON_ID})"
        )
    return "\n".join(lines) + "\n"


def server_path(profile: Profile, export: str, server: str = SERVER_ADDR) -> str:
    """What the client names in its mount: v4 paths are relative to the pseudo root."""
    if profile.version.startswith("4"):
        return f"{server}:/{export}"
    return f"{server}:{EXPORT_ROOT}/{export}"


def mount_options(profile: Profile, *extra: str) -> str:
    return ",".join((f"vers={profile.version}", *profile.options, *extra))


def _tbf(dev: str, rate: int) -> list[str]:
    # burst: at least one 1 MiB RPC plus headers, and at least 1/100 s at the rate; a burst
    # under 256 kB stalled copies in this kernel (TARGETS.md, section C).
    burst = max(2 * MIB, rate // 100)
    return ["tbf", "rate", f"{rate}bps", "burst", str(burst), "latency", "400ms"]


def qdisc_commands(dev: str, profile: Profile) -> list[list[str]]:
    """tc commands that shape one direction of the link (run for each end of the veth)."""
    delay_us = int(profile.rtt_ms * 1000 / 2)
    base = ["tc", "qdisc", "replace", "dev", dev]
    if delay_us and profile.rate:
        return [
            [*base, "root", "handle", "1:", "netem", "delay", f"{delay_us}us", "limit", "100000"],
            [*base, "parent", "1:1", "handle", "10:", *_tbf(dev, profile.rate)],
        ]
    if delay_us:
        return [[*base, "root", "netem", "delay", f"{delay_us}us", "limit", "100000"]]
    if profile.rate:
        return [[*base, "root", "handle", "1:", *_tbf(dev, profile.rate)]]
    return []


def rate_change(dev: str, profile: Profile, rate: int | None) -> list[str]:
    """The tc command that moves the link's bandwidth to *rate* (None: back to the profile's;
    0 is refused by tbf: use a very low rate for a stall)."""
    new = rate if rate is not None else profile.rate
    if new is None:
        raise ValueError(f"profile {profile.name} has no bandwidth limit to change")
    parent = ["parent", "1:1", "handle", "10:"] if profile.rtt_ms else ["root", "handle", "1:"]
    return ["tc", "qdisc", "change", "dev", dev, *parent, *_tbf(dev, max(new, 8000))]
