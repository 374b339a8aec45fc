"""Build the lab's boot files once, from Debian packages, into a cache directory.

What a lab VM boots is small: Debian's own 6.12 kernel (the package
``linux-image-6.12.*+deb12-amd64-unsigned``: NFS client and server, FUSE, veth, netem, tbf,
dm-delay), its modules with a fresh ``depmod``, and a busybox initramfs whose only job is to
mount the host's root file system (shared read-only over 9p) under a tmpfs overlay. Everything
else the guest runs is the host's own installation: the Debian packages scripts/install
put there (nfs-kernel-server, fuse3, stress-ng, fio ...) and this repository with its .venv.
Nothing is downloaded but the kernel package, through apt.

The cache (``--lab-dir``, default /var/tmp/fusethrottle-lab) holds::

    kernel/vmlinuz   kernel/lib/modules/<release>/...   initrd.gz   built.json   accel.json

``built.json`` records the kernel package and the initramfs script's hash: a build with the
same inputs does nothing.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

GUEST = Path(__file__).with_name("guest")
DEFAULT_LAB_DIR = Path(os.environ.get("FTLAB_DIR", "/var/tmp/fusethrottle-lab"))
#: Debian 12's newest 6.12 kernel, as apt names it.
KERNEL_PACKAGE = re.compile(r"^linux-image-6\.12\.[0-9]+\+deb12-amd64-unsigned$")
#: Modules the initramfs loads to reach the host's root (in this order).
INITRAMFS_MODULES = (
    "fs/netfs/netfs",
    "net/9p/9pnet",
    "net/9p/9pnet_virtio",
    "fs/9p/9p",
    "fs/overlayfs/overlay",
)
#: Host programs the lab needs, by the Debian package that has them.
HOST_TOOLS = {
    "qemu-system-x86_64": "qemu-system-x86",
    "busybox": "busybox-static",
    "cpio": "cpio",
    "depmod": "kmod",
    "rpc.nfsd": "nfs-kernel-server",
    "mount.nfs": "nfs-common",
}


class LabError(RuntimeError):
    """Something the user must fix (a missing package, no kernel in apt); one line."""


@dataclass(frozen=True)
class Boot:
    """What qemu needs to boot a lab VM."""

    kernel: Path
    initrd: Path
    modules: Path  # the directory holding <release>/
    release: str


def missing_tools() -> list[str]:
    """Debian packages whose programs the lab needs and cannot find."""
    missing = []
    for tool, package in HOST_TOOLS.items():
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            missing.append(package)
    if Path("/bin/busybox").exists() and "statically linked" not in _file_kind("/bin/busybox"):
        missing.append("busybox-static")
    return sorted(set(missing))


def _file_kind(path: str) -> str:
    try:
        return subprocess.run(["file", "-b", path], capture_output=True, text=True).stdout
    except OSError:
        return "statically linked"  # no `file`: trust the package name


def newest_kernel_package() -> str:
    """The newest installable 6.12 kernel package apt knows."""
    out = subprocess.run(
        ["apt-cache", "search", "--names-only", r"^linux-image-6\.12\..*-amd64-unsigned$"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    names = [line.split(" ", 1)[0] for line in out.splitlines()]
    names = [n for n in names if KERNEL_PACKAGE.match(n)]
    if not names:
        raise LabError(
            "apt knows no linux-image-6.12.*+deb12-amd64-unsigned package "
            "(run apt-get update; Debian 12 bookworm or its security updates)"
        )
    return max(names, key=lambda n: [int(x) for x in re.findall(r"\d+", n)])


def _initramfs_inputs_hash() -> str:
    return hashlib.sha256((GUEST / "initramfs-init").read_bytes()).hexdigest()[:16]


def cached_boot(lab_dir: Path = DEFAULT_LAB_DIR) -> Boot | None:
    """The cached boot files, or None if they were not built (or are out of date)."""
    try:
        built = json.loads((lab_dir / "built.json").read_text())
    except (OSError, ValueError):
        return None
    if built.get("initramfs") != _initramfs_inputs_hash():
        return None
    boot = Boot(
        lab_dir / "kernel" / "vmlinuz",
        lab_dir / "initrd.gz",
        lab_dir / "kernel" / "lib" / "modules",
        built["release"],
    )
    if not (boot.kernel.exists() and boot.initrd.exists()):
        return None
    return boot


def build(lab_dir: Path = DEFAULT_LAB_DIR, package: str | None = None) -> Boot:
    """Download and unpack the kernel package, depmod, make the initramfs (or reuse them)."""
    missing = missing_tools()
    if missing:
        raise LabError(
            "the lab needs these Debian packages: " + " ".join(missing) + " (scripts/install)"
        )
    package = package or newest_kernel_package()
    lab_dir.mkdir(parents=True, exist_ok=True)
    built_file = lab_dir / "built.json"
    try:
        built = json.loads(built_file.read_text())
    except (OSError, ValueError):
        built = {}
    if built.get("package") != package or not (lab_dir / "kernel" / "vmlinuz").exists():
        _unpack_kernel(lab_dir, package)
        built = {"package": package}
    release = _release(lab_dir / "kernel" / "lib" / "modules")
    _make_initramfs(lab_dir, release)
    built.update(release=release, initramfs=_initramfs_inputs_hash())
    built_file.write_text(json.dumps(built, indent=2) + "\n")
    boot = cached_boot(lab_dir)
    assert boot is not None
    return boot


def _release(modules: Path) -> str:
    releases = [p.name for p in modules.iterdir() if p.is_dir()]
    if len(releases) != 1:
        raise LabError(f"expected one kernel release in {modules}, found {releases}")
    return releases[0]


def _unpack_kernel(lab_dir: Path, package: str) -> None:
    log.info("downloading %s", package)
    with tempfile.TemporaryDirectory(dir=lab_dir) as tmp:
        subprocess.run(
            ["apt-get", "download", "-q", package], cwd=tmp, check=True, capture_output=True
        )
        (deb,) = Path(tmp).glob("*.deb")
        root = Path(tmp) / "root"
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
        kernel_dir = lab_dir / "kernel"
        shutil.rmtree(kernel_dir, ignore_errors=True)
        kernel_dir.mkdir()
        (vmlinuz,) = (root / "boot").glob("vmlinuz-*")
        shutil.move(vmlinuz, kernel_dir / "vmlinuz")
        (kernel_dir / "lib").mkdir()
        shutil.move(root / "lib" / "modules", kernel_dir / "lib" / "modules")
    release = _release(lab_dir / "kernel" / "lib" / "modules")
    subprocess.run(["depmod", "-b", str(lab_dir / "kernel"), release], check=True)


def _make_initramfs(lab_dir: Path, release: str) -> None:
    modules = lab_dir / "kernel" / "lib" / "modules" / release / "kernel"
    with tempfile.TemporaryDirectory(dir=lab_dir) as tmp:
        root = Path(tmp)
        (root / "bin").mkdir()
        (root / "modules").mkdir()
        shutil.copy2("/bin/busybox", root / "bin" / "busybox")
        shutil.copy2(GUEST / "initramfs-init", root / "init")
        (root / "init").chmod(0o755)
        for module in INITRAMFS_MODULES:
            packed = modules / f"{module}.ko.xz"
            plain = modules / f"{module}.ko"
            target = root / "modules" / f"{Path(module).name}.ko"
            if packed.exists():
                subprocess.run(["xz", "-dc", str(packed)], stdout=target.open("wb"), check=True)
            else:
                shutil.copy2(plain, target)
        listing = subprocess.run(["find", "."], cwd=root, capture_output=True, check=True).stdout
        archive = subprocess.run(
            ["cpio", "-o", "-H", "newc", "--quiet"],
            cwd=root,
            input=listing,
            capture_output=True,
            check=True,
        ).stdout
    (lab_dir / "initrd.gz").write_bytes(gzip.compress(archive, compresslevel=1))
