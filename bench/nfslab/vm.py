"""Boot a lab VM with qemu and run one job in it.

The host shares two directories with the guest over 9p: its own root file system (read-only:
the guest's packages and this repository) and the job's directory (read-write: ``job.json`` in,
logs and results out). The server's disk is a fresh sparse ext4 image per run, so every run
starts from an empty export.

Acceleration is detected, not assumed: where ``/dev/kvm`` exists, a probe boot with KVM must
print its marker within :data:`KVM_PROBE_TIMEOUT`; on the machine kind this project grew up on
``/dev/kvm`` opens but a guest never runs, so the lab falls back to TCG (every instruction
translated; see probe.py for how much slower that is). The answer is cached in
``accel.json`` per host kernel and qemu version.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.nfslab.image import GUEST, Boot, LabError

log = logging.getLogger(__name__)

KVM_PROBE_TIMEOUT = 20.0
TCG_PROBE_TIMEOUT = 120.0
PROBE_MARKER = "ftlab-probe-ok"
DISK_SIZE = 8 << 30
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Command:
    """One command the guest runs (from the repository's root), with its own log."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    timeout: float = 1800.0


@dataclass(frozen=True)
class Machine:
    accel: str  # "kvm" or "tcg"
    cpus: int = 2
    memory_mib: int = 4096


def _accel_args(accel: str) -> list[str]:
    if accel == "kvm":
        return ["-accel", "kvm", "-cpu", "host"]
    return ["-accel", "tcg,thread=multi", "-cpu", "max"]


#: The two-VM layout's link: a qemu socket netdev over the host's loopback (no host root
#: networking, no tap), the server listening and the client connecting; one MAC each.
SERVER_MAC = "52:54:00:77:00:01"
CLIENT_MAC = "52:54:00:77:00:02"
#: The server VM of the two-VM layout: knfsd only, so one vCPU; its page cache holds what the
#: async export has not written to its disk yet.
SERVER_CPUS = 1
SERVER_MEMORY_MIB = 1024
#: The client's own disk in the two-VM layout (ext4, the victim's files): its root is a
#: tmpfs overlay, where fdatasync returns at once.
VICTIM_DISK_SIZE = 4 << 30
SERVER_READY_TIMEOUT = 600.0
#: What becomes PID 1 on the guest's overlay root: the lab's own script (guest/init), or
#: systemd (guest/systemd-init: systemd on cgroup v2 starting only the job's target).
INITS = {"lab": "init", "systemd": "systemd-init"}
#: Kernel arguments of each init: systemd must find the unified hierarchy whatever its build's
#: default.
INIT_KERNEL_ARGS = {"lab": "", "systemd": "systemd.unified_cgroup_hierarchy=1"}


def socket_nic(role: str, port: int) -> list[str]:
    """qemu's arguments for the two-VM link of *role* (pure)."""
    how = "listen" if role == "server" else "connect"
    mac = SERVER_MAC if role == "server" else CLIENT_MAC
    return [
        "-netdev", f"socket,id=n0,{how}=127.0.0.1:{port}",
        "-device", f"virtio-net-pci,netdev=n0,mac={mac}",
    ]  # fmt: skip


def qemu_argv(
    boot: Boot,
    machine: Machine,
    *,
    init: Path,
    console: Path,
    job_dir: Path | None = None,
    disk: Path | None = None,
    nic: list[str] | None = None,
    kernel_args: str = "",
) -> list[str]:
    """The qemu command line of a lab VM (pure); *nic*: the two-VM link (default: none)."""
    append = f"console=ttyS0 quiet panic=-1 ftlab_init={init}"
    argv = [
        "qemu-system-x86_64",
        *_accel_args(machine.accel),
        "-smp", str(machine.cpus),
        "-m", str(machine.memory_mib),
        "-display", "none", "-monitor", "none", "-no-reboot",
        "-serial", f"file:{console}",
        *(nic or ["-nic", "none"]),
        "-kernel", str(boot.kernel),
        "-initrd", str(boot.initrd),
        "-append", f"{append} {kernel_args}".rstrip(),
        "-virtfs",
        "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap",
    ]  # fmt: skip
    if job_dir is not None:
        argv += ["-virtfs", f"local,path={job_dir},mount_tag=job,security_model=none"]
    if disk is not None:
        argv += ["-drive", f"file={disk},if=virtio,format=raw,cache=none,aio=threads"]
    return argv


def _boots(boot: Boot, accel: str, timeout: float) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        console = Path(tmp) / "console"
        argv = qemu_argv(
            boot, Machine(accel, cpus=1, memory_mib=512), init=GUEST / "probe-init", console=console
        )
        try:
            subprocess.run(argv, timeout=timeout, capture_output=True, check=False)
        except subprocess.TimeoutExpired:
            return False
        return console.exists() and PROBE_MARKER in console.read_text(errors="replace")


def detect_accel(boot: Boot, lab_dir: Path) -> str:
    """KVM if a probe guest really runs with it here, else TCG (cached per host and qemu)."""
    qemu = subprocess.run(
        ["qemu-system-x86_64", "--version"], capture_output=True, text=True, check=False
    ).stdout.splitlines()[:1]
    key = f"{os.uname().release} {qemu[0] if qemu else '?'}"
    cache = lab_dir / "accel.json"
    try:
        known = json.loads(cache.read_text())
        if known.get("key") == key:
            return str(known["accel"])
    except (OSError, ValueError, KeyError):
        pass
    why = "no /dev/kvm"
    accel = "tcg"
    if os.path.exists("/dev/kvm"):
        if _boots(boot, "kvm", KVM_PROBE_TIMEOUT):
            accel, why = "kvm", "a probe guest ran with KVM"
        else:
            why = (
                f"/dev/kvm exists, but a probe guest did not run with it in "
                f"{KVM_PROBE_TIMEOUT:.0f} s"
            )
    if accel == "tcg" and not _boots(boot, "tcg", TCG_PROBE_TIMEOUT):
        raise LabError("a probe guest did not boot with TCG either: see qemu's output")
    cache.write_text(json.dumps({"key": key, "accel": accel, "why": why}, indent=2) + "\n")
    log.info("acceleration: %s (%s)", accel, why)
    return accel


def free_port() -> int:
    """A TCP port on the host's loopback that nobody listens on now (qemu takes it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_disk(path: Path, size: int = DISK_SIZE) -> None:
    """A sparse, empty ext4 image for the server's export (made on the host: fast)."""
    with open(path, "wb") as f:
        f.truncate(size)
    subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=1,lazy_journal_init=1", str(path)],
        check=True,
    )


@dataclass
class JobResult:
    exit: int | None  # the guest's own status; None: it never said (crash, timeout)
    seconds: float
    result: dict
    console: str
    guest_log: str


def run_job(
    boot: Boot,
    machine: Machine,
    profile: str,
    commands: list[Command],
    out_dir: Path,
    *,
    lab_dir: Path,
    timeout: float = 3600.0,
    layout: str = "one",
    init: str = "lab",
) -> JobResult:
    """Boot, run *commands* in the guest under *profile*, copy the results to *out_dir*.

    *layout* ``one``: server and clients in one VM (guest.py's default). ``two``: the server
    in a VM of its own, so that memory pressure in the client cannot reach the server's kernel
    (a loopback NFS server can deadlock its client under memory pressure): see
    :func:`run_pair`. *init* ``systemd``: systemd is the guest's PID 1 (one VM only)."""
    if init not in INITS:
        raise ValueError(f"unknown lab init {init!r} ({', '.join(INITS)})")
    if layout == "two":
        if init != "lab":
            raise ValueError("the two-VM layout boots the lab's own init only")
        return run_pair(boot, machine, profile, commands, out_dir, lab_dir=lab_dir, timeout=timeout)
    if layout != "one":
        raise ValueError(f"unknown lab layout {layout!r} (one, two)")
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="job-", dir=lab_dir) as tmp:
        job_dir = Path(tmp)
        job_dir.chmod(0o755)
        (job_dir / "job.json").write_text(
            json.dumps(
                {
                    "profile": profile,
                    "modules": str(boot.modules),
                    "commands": [c.__dict__ for c in commands],
                },
                indent=2,
            )
        )
        disk = job_dir.with_suffix(".disk")
        make_disk(disk)
        console = job_dir / "console.log"
        argv = qemu_argv(
            boot, machine, init=GUEST / INITS[init], console=console, job_dir=job_dir,
            disk=disk, kernel_args=INIT_KERNEL_ARGS[init],
        )  # fmt: skip
        start = time.monotonic()
        try:
            subprocess.run(argv, timeout=timeout, capture_output=True, check=False)
        except subprocess.TimeoutExpired:
            log.error("the VM did not power off within %.0f s: killed", timeout)
        finally:
            disk.unlink(missing_ok=True)
        seconds = time.monotonic() - start
        code, result = _collect(job_dir, out_dir)
        return JobResult(
            code,
            seconds,
            result,
            console.read_text(errors="replace") if console.exists() else "",
            (job_dir / "guest.log").read_text(errors="replace")
            if (job_dir / "guest.log").exists()
            else "",
        )


def _job_dir(lab_dir: Path, prefix: str, job: dict) -> Path:
    job_dir = Path(tempfile.mkdtemp(prefix=prefix, dir=lab_dir))
    job_dir.chmod(0o755)
    (job_dir / "job.json").write_text(json.dumps(job, indent=2))
    return job_dir


def _collect(job_dir: Path, out_dir: Path) -> tuple[int | None, dict]:
    out_dir.mkdir(parents=True, exist_ok=True)
    exit_file = job_dir / "guest.exit"
    code = int(exit_file.read_text().strip()) if exit_file.exists() else None
    result_file = job_dir / "result.json"
    result = json.loads(result_file.read_text()) if result_file.exists() else {}
    for name in ("console.log", "guest.log", "result.json"):
        if (job_dir / name).exists():
            shutil.copy2(job_dir / name, out_dir / name)
    if (job_dir / "out").exists():
        shutil.copytree(job_dir / "out", out_dir, dirs_exist_ok=True)
    return code, result


def run_pair(
    boot: Boot,
    machine: Machine,
    profile: str,
    commands: list[Command],
    out_dir: Path,
    *,
    lab_dir: Path,
    timeout: float = 3600.0,
) -> JobResult:
    """The two-VM layout: a server VM (knfsd exporting its own disk, :data:`SERVER_CPUS`) and
    a client VM (*machine*; the NFS client, the commands, an ext4 disk of its own at
    /var/lib/victim), linked by a qemu socket netdev on the host's loopback. Each VM shapes
    its own egress with the profile's qdiscs, so the client's tbf is what the backup's WRITEs
    cross. The server's logs go to *out_dir*/server."""
    port = free_port()
    modules = str(boot.modules)
    server_dir = _job_dir(
        lab_dir,
        "job-srv-",
        {"role": "server", "profile": profile, "modules": modules, "commands": [],
         "timeout": timeout},
    )  # fmt: skip
    client_dir = _job_dir(
        lab_dir,
        "job-cli-",
        {"role": "client", "profile": profile, "modules": modules,
         "commands": [c.__dict__ for c in commands]},
    )  # fmt: skip
    export, victim = server_dir.with_suffix(".disk"), client_dir.with_suffix(".disk")
    server = None
    start = time.monotonic()
    try:
        make_disk(export)
        make_disk(victim, VICTIM_DISK_SIZE)
        server_argv = qemu_argv(
            boot, Machine(machine.accel, SERVER_CPUS, SERVER_MEMORY_MIB),
            init=GUEST / "init", console=server_dir / "console.log", job_dir=server_dir,
            disk=export, nic=socket_nic("server", port),
        )  # fmt: skip
        with open(server_dir / "qemu.err", "w") as err:
            server = subprocess.Popen(server_argv, stdout=subprocess.DEVNULL, stderr=err)
        ready = server_dir / "server.ready"
        deadline = time.monotonic() + SERVER_READY_TIMEOUT
        while not ready.exists() and server.poll() is None and time.monotonic() < deadline:
            time.sleep(1)
        if ready.exists():
            log.info("server VM up in %.0f s (port %d)", time.monotonic() - start, port)
            client_argv = qemu_argv(
                boot, machine, init=GUEST / "init", console=client_dir / "console.log",
                job_dir=client_dir, disk=victim, nic=socket_nic("client", port),
            )  # fmt: skip
            try:
                subprocess.run(client_argv, timeout=timeout, capture_output=True, check=False)
            except subprocess.TimeoutExpired:
                log.error("the client VM did not power off within %.0f s: killed", timeout)
        else:
            log.error("the server VM was not ready (see %s/server)", out_dir)
    finally:
        (server_dir / "stop").write_text("")
        if server is not None:
            try:
                server.wait(timeout=120)
            except subprocess.TimeoutExpired:
                server.kill()  # our own qemu, by its Popen
                server.wait()
        export.unlink(missing_ok=True)
        victim.unlink(missing_ok=True)
    seconds = time.monotonic() - start
    _collect(server_dir, out_dir / "server")
    if (server_dir / "qemu.err").exists():
        shutil.copy2(server_dir / "qemu.err", out_dir / "server" / "qemu.err")
    code, result = _collect(client_dir, out_dir)
    console = client_dir / "console.log"
    guest_log = client_dir / "guest.log"
    job = JobResult(
        code,
        seconds,
        result,
        console.read_text(errors="replace") if console.exists() else "",
        guest_log.read_text(errors="replace") if guest_log.exists() else "",
    )
    shutil.rmtree(server_dir, ignore_errors=True)
    shutil.rmtree(client_dir, ignore_errors=True)
    return job
