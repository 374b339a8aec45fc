"""Inside the lab VM: the NFS server, the link, the clients' mounts, then the job's commands.

Runs as root, as the guest's main program (guest/init starts it with the host's python3, from
the repository the host shares). The job directory is a 9p share the host reads afterwards:
``job.json`` says which profile and which commands; each command's output goes to
``out/<name>.log``; ``result.json`` says how each ended.

The layout, the same in every run:

* the server: knfsd in the guest's root network namespace, exporting three directories of the
  VM's second disk (``rw``, ``squash`` and ``allsquash``, see profiles.EXPORTS);
* the backup host: NFS client 1, network namespace ``client``; the exports are mounted at
  ``/mnt/nfs/<export>``;
* another host writing to the same export: NFS client 2, network namespace ``client2``, mounts
  at ``/mnt/nfs2/<export>`` (its own client ID, caches and transport);
* the link of each client is a veth pair shaped by the profile (profiles.qdisc_commands).

The two-VM layout (``role`` in job.json, vm.run_pair) splits this: a ``server`` VM runs only
knfsd on its own disk and waits for the host's ``stop`` file; a ``client`` VM mounts the
exports at ``/mnt/nfs/<export>`` (no second client) and has an ext4 disk of its own at
``/var/lib/victim``. The two talk over a virtio NIC (``eth0``), each shaping its own egress with
the profile's qdiscs; the commands learn the device from FTLAB_NET_DEV.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.nfslab import profiles
from bench.nfslab.probe import cpu_probe_seconds

NFS = Path("/mnt/nfs")
NFS2 = Path("/mnt/nfs2")
DISK = "/dev/vda"
#: NFSv4 grace period and lease time of the lab's server, seconds (knfsd's default is 90 and its
#: least is 10). After every restart (tests/nfs/lab.py server_start) an NFSv4 server refuses new
#: opens for the grace period while clients reclaim their state; 90 s per restart made the tests
#: of a server that stops minutes long. The clients renew their lease every few seconds instead.
NFSV4_GRACE_SECONDS = 10
#: The two-VM layout: the NIC of each VM, and where the client's own disk is mounted.
NIC = "eth0"
VICTIM_DIR = Path("/var/lib/victim")
#: The virtio link's MTU. The socket netdev has no offloads (no TSO/GSO), so every frame is one
#: packet through qemu's device model, and under TCG packets, not bytes, cost the time.
NIC_MTU = int(os.environ.get("FTLAB_MTU", "9000"))


def sh(*argv: str, check: bool = True, timeout: float = 120) -> str:
    """Run a command; its output, or an error naming it."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def log(message: str) -> None:
    print(f"[{time.monotonic():8.2f}] {message}", flush=True)


def setup_modules(modules: str) -> None:
    """The lab kernel's modules (the host has its own kernel's in /lib/modules)."""
    release = os.uname().release
    target = Path("/lib/modules") / release
    target.mkdir(parents=True, exist_ok=True)
    sh("mount", "--bind", f"{modules}/{release}", str(target))


def setup_disk(profile: profiles.Profile) -> str:
    """The export's disk, behind dm-delay when the profile's writes are slow."""
    sh("modprobe", "virtio_blk")
    for _ in range(50):
        if Path(DISK).exists():
            break
        time.sleep(0.1)
    sh("modprobe", "ext4")
    device = DISK
    if profile.disk_write_ms:
        sh("modprobe", "dm_delay")
        sectors = sh("blockdev", "--getsz", DISK).strip()
        ms = str(int(profile.disk_write_ms))
        table = f"0 {sectors} delay {DISK} 0 0 {DISK} 0 {ms} {DISK} 0 {ms}"
        sh("dmsetup", "create", "exportdisk", "--table", table)
        # No udev in the guest makes /dev/mapper/exportdisk; devtmpfs has its dm-N node.
        name = sh("dmsetup", "info", "-c", "--noheadings", "-o", "blkdevname", "exportdisk")
        device = f"/dev/{name.strip()}"
    return device


def setup_network(profile: profiles.Profile) -> None:
    sh("ip", "link", "set", "lo", "up")
    sh("modprobe", "veth")
    for ns, srv_dev, cli_dev, srv_addr, cli_addr in (
        ("client", "ftsrv", "ftcli", profiles.SERVER_ADDR, profiles.CLIENT_ADDR),
        ("client2", "ftsrv2", "ftcli2", profiles.SERVER2_ADDR, profiles.CLIENT2_ADDR),
    ):
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", srv_dev, "type", "veth", "peer", "name", cli_dev)
        sh("ip", "link", "set", cli_dev, "netns", ns)
        sh("ip", "addr", "add", f"{srv_addr}/24", "dev", srv_dev)
        sh("ip", "link", "set", srv_dev, "up")
        sh("ip", "-n", ns, "addr", "add", f"{cli_addr}/24", "dev", cli_dev)
        sh("ip", "-n", ns, "link", "set", cli_dev, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        if ns == "client":  # client 2 is another host on a plain link
            for command in profiles.qdisc_commands(srv_dev, profile):
                sh(*command)
            for command in profiles.qdisc_commands(cli_dev, profile):
                sh("ip", "netns", "exec", ns, *command)


def setup_link(profile: profiles.Profile, addr: str) -> None:
    """The two-VM layout: this VM's end of the virtio link, its egress shaped by the profile."""
    sh("ip", "link", "set", "lo", "up")
    sh("modprobe", "virtio_net")
    for _ in range(100):
        if Path(f"/sys/class/net/{NIC}").exists():
            break
        time.sleep(0.1)
    sh("ip", "addr", "add", f"{addr}/24", "dev", NIC)
    sh("ip", "link", "set", NIC, "mtu", str(NIC_MTU), "up")
    for command in profiles.qdisc_commands(NIC, profile):
        sh(*command)


def setup_victim_disk() -> None:
    """The client's own ext4 disk (made on the host): the victim's fdatasync reaches a disk."""
    sh("modprobe", "virtio_blk")
    for _ in range(50):
        if Path(DISK).exists():
            break
        time.sleep(0.1)
    sh("modprobe", "ext4")
    VICTIM_DIR.mkdir(parents=True, exist_ok=True)
    sh("mount", "-o", "noatime", DISK, str(VICTIM_DIR))


def _cpu() -> tuple[int, int]:
    """(busy, total) jiffies of the whole VM, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def wait_for_stop(job_dir: Path, timeout: float, every: float = 10.0) -> None:
    """The server VM serves until the host writes ``stop`` into the job share; meanwhile it
    logs how busy its one vCPU was (is a server VM of one vCPU enough under TCG?)."""
    deadline = time.monotonic() + timeout
    last, next_log, peak, busy_sum, n = _cpu(), time.monotonic() + every, 0.0, 0.0, 0
    while not (job_dir / "stop").exists() and time.monotonic() < deadline:
        time.sleep(1)
        if time.monotonic() >= next_log:
            now = _cpu()
            busy = (now[0] - last[0]) / max(1, now[1] - last[1])
            last, next_log = now, next_log + every
            peak, busy_sum, n = max(peak, busy), busy_sum + busy, n + 1
            log(f"server cpu busy {100 * busy:.0f}% over {every:.0f} s")
    if n:
        log(f"server cpu busy: mean {100 * busy_sum / n:.0f}%, peak {100 * peak:.0f}% (of 10 s)")


def start_server(profile: profiles.Profile, device: str, max_block: int = 0) -> None:
    """knfsd with the profile's exports; *max_block*: the largest READ/WRITE it offers (0: the
    kernel's choice, which shrinks with the VM's memory: 128 KiB in a 1 GiB server VM)."""
    sh("modprobe", "nfsd")
    sh("mount", "-t", "nfsd", "nfsd", "/proc/fs/nfsd")
    if max_block:
        Path("/proc/fs/nfsd/max_block_size").write_text(str(max_block))
    sh("mount", "-t", "tmpfs", "-o", "mode=0755", "srv", "/srv")
    os.makedirs(profiles.DISK_MOUNT)
    sh("mount", device, profiles.DISK_MOUNT)
    for export in profiles.EXPORTS:
        path = Path(profiles.DISK_MOUNT) / export.name
        path.mkdir(exist_ok=True)
        # Squashed roots (nobody) and other users must be able to make their own directories.
        path.chmod(0o1777 if export.squash != "no_root_squash" else 0o755)
        where = Path(profiles.EXPORT_ROOT) / export.name
        where.mkdir()
        sh("mount", "--bind", str(path), str(where))
    Path("/etc/exports").write_text(profiles.exports_file(profile))
    Path("/etc/exports.d").mkdir(exist_ok=True)
    # The server takes a caller's supplementary groups from the RPC (AUTH_SYS: at most 16), as
    # EFS and most NFS servers do. Debian's nfs.conf sets manage-gids=y: the server then looks
    # the uid's groups up in its own group database and ignores the groups the client sent.
    Path("/etc/nfs.conf.d").mkdir(exist_ok=True)
    Path("/etc/nfs.conf.d/ftlab.conf").write_text("[mountd]\nmanage-gids=n\n")
    Path("/run/rpcbind").mkdir(exist_ok=True)
    sh("rpcbind", "-w")
    sh("exportfs", "-ra")
    sh("rpc.mountd")
    for knob in ("nfsv4gracetime", "nfsv4leasetime"):  # only while nfsd is down
        Path(f"/proc/fs/nfsd/{knob}").write_text(f"{NFSV4_GRACE_SECONDS}\n")
    sh("rpc.nfsd", "8")


def mount_clients(profile: profiles.Profile) -> None:
    sh("modprobe", "nfs")
    if profile.version == "3":
        sh("modprobe", "nfsv3")
    else:
        sh("modprobe", "nfsv4")
    for ns, root, server in (
        ("client", NFS, profiles.SERVER_ADDR),
        ("client2", NFS2, profiles.SERVER2_ADDR),
    ):
        # Two NFSv4 clients of one kernel need different identities (one per namespace).
        sh(
            "ip",
            "netns",
            "exec",
            ns,
            "sh",
            "-c",
            f"echo ftlab-{ns} > /sys/fs/nfs/net/nfs_client/identifier",
            check=False,
        )
        for export in profiles.EXPORTS:
            where = root / export.name
            where.mkdir(parents=True, exist_ok=True)
            sh(
                "nsenter", f"--net=/run/netns/{ns}", "mount", "-t", "nfs",
                "-o", profiles.mount_options(profile),
                profiles.server_path(profile, export.name, server), str(where),
                timeout=60,
            )  # fmt: skip


def mount_client(profile: profiles.Profile) -> None:
    """The two-VM layout's one client: the exports at /mnt/nfs/<export>."""
    sh("modprobe", "nfs")
    sh("modprobe", "nfsv3" if profile.version == "3" else "nfsv4")
    for export in profiles.EXPORTS:
        where = NFS / export.name
        where.mkdir(parents=True, exist_ok=True)
        sh(
            "mount", "-t", "nfs", "-o", profiles.mount_options(profile),
            profiles.server_path(profile, export.name), str(where), timeout=120,
        )  # fmt: skip


def run_commands(job: dict, job_dir: Path, extra_env: dict[str, str] | None = None) -> list[dict]:
    out = job_dir / "out"
    out.mkdir(exist_ok=True)
    results = []
    env = dict(os.environ)
    env.update(
        FTLAB="1",
        FTLAB_PROFILE=job["profile"],
        FTLAB_NFS=str(NFS),
        FTLAB_NFS2=str(NFS2),
        FTLAB_OUT=str(out),
        **(extra_env or {}),
    )
    for command in job["commands"]:
        name = command["name"]
        log(f"run {name}: {' '.join(command['argv'])}")
        start = time.monotonic()
        with open(out / f"{name}.log", "w") as f:
            try:
                done = subprocess.run(
                    command["argv"],
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    env={**env, **command.get("env", {})},
                    timeout=command.get("timeout", 1800),
                    check=False,
                )
                code = done.returncode
            except subprocess.TimeoutExpired:
                code = -1
                f.write(f"\nftlab: timed out after {command.get('timeout', 1800)} s\n")
        seconds = time.monotonic() - start
        log(f"{name}: exit {code} in {seconds:.1f} s")
        results.append({"name": name, "exit": code, "seconds": round(seconds, 1)})
    return results


def main(job_dir: Path) -> int:
    job = json.loads((job_dir / "job.json").read_text())
    profile = profiles.PROFILES[job["profile"]]
    started = time.monotonic()
    role = job.get("role", "both")
    log(f"profile {profile.name} ({role}): {profile.description}")
    setup_modules(job["modules"])
    env = {"FTLAB_LAYOUT": "one" if role == "both" else "two"}
    if role == "server":
        device = setup_disk(profile)
        setup_link(profile, profiles.SERVER_ADDR)
        start_server(profile, device, max_block=profiles.MIB)
        log(f"serving in {time.monotonic() - started:.1f} s")
        (job_dir / "server.ready").write_text("")
        wait_for_stop(job_dir, float(job.get("timeout", 7200)))
        log("stop")
        return 0
    if role == "client":
        setup_victim_disk()
        setup_link(profile, profiles.CLIENT_ADDR)
        mount_client(profile)
        env |= {"FTLAB_NET_DEV": NIC, "FTLAB_VICTIM_DIR": str(VICTIM_DIR)}
    else:
        device = setup_disk(profile)
        setup_network(profile)
        start_server(profile, device)
        mount_clients(profile)
    setup_seconds = time.monotonic() - started
    log(f"server and clients up in {setup_seconds:.1f} s")
    probe = cpu_probe_seconds()
    results = run_commands(job, job_dir, env)
    (job_dir / "result.json").write_text(
        json.dumps(
            {
                "profile": profile.name,
                "layout": env["FTLAB_LAYOUT"],
                "kernel": os.uname().release,
                "setup_seconds": round(setup_seconds, 1),
                "cpu_probe_seconds": probe,
                "commands": results,
            },
            indent=2,
        )
    )
    sh("umount", "-a", "-f", "-t", "nfs,nfs4", check=False, timeout=30)
    return 0 if all(r["exit"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
