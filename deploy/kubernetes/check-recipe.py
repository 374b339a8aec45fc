"""What the recipe must keep, beyond the API's schemas (scripts/test-kubernetes runs this):
the DaemonSet mounts on a hostPath with Bidirectional propagation, privileged, unmounts in a
preStop, is replaced only when deleted, and gives its stop longer than unmount_timeout; the
backup takes the same hostPath with HostToContainer and waits for the mount.

Usage: python3 check-recipe.py DIR   (prints one line per broken rule; exit 1 if any)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml

#: The daemon's default unmount_timeout, in seconds (fusethrottle/service/options.py).
UNMOUNT_TIMEOUT = 600


def objects(directory: Path) -> list[dict[str, Any]]:
    found = []
    for path in sorted(directory.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            found += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def one(found: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    matches = [o for o in found if o["kind"] == kind]
    if len(matches) != 1:
        raise SystemExit(f"check-recipe: expected one {kind}, found {len(matches)}")
    return matches[0]


def host_path_mount(pod: dict[str, Any], container: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The hostPath the container mounts, and its volumeMount."""
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    mounts = [m for m in container["volumeMounts"] if m["name"] in host_paths]
    if len(mounts) != 1:
        raise SystemExit(f"check-recipe: {container['name']} mounts {len(mounts)} hostPaths")
    return host_paths[mounts[0]["name"]], mounts[0]


def check(directory: Path) -> list[str]:
    found = objects(directory)
    problems = []
    daemonset = one(found, "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    (daemon,) = pod["containers"]
    node_dir, daemon_mount = host_path_mount(pod, daemon)
    if daemon_mount.get("mountPropagation") != "Bidirectional":
        problems.append("the DaemonSet's hostPath is not mounted Bidirectional")
    if not daemon.get("securityContext", {}).get("privileged"):
        problems.append("the DaemonSet is not privileged (mount, /dev/fuse, Bidirectional)")
    if daemonset["spec"].get("updateStrategy", {}).get("type") != "OnDelete":
        problems.append("the DaemonSet's updateStrategy is not OnDelete")
    if "preStop" not in daemon.get("lifecycle", {}):
        problems.append("the DaemonSet has no preStop")
    if pod.get("terminationGracePeriodSeconds", 30) <= UNMOUNT_TIMEOUT:
        problems.append(f"terminationGracePeriodSeconds is not above {UNMOUNT_TIMEOUT} s")
    env = {e["name"]: e for e in daemon.get("env", [])}
    mountpoint = env.get("FUSETHROTTLE_MOUNTPOINT", {}).get("value", "")
    if not mountpoint.startswith(daemon_mount["mountPath"].rstrip("/") + "/"):
        problems.append("FUSETHROTTLE_MOUNTPOINT is not below the Bidirectional hostPath")
    if env.get("FUSETHROTTLE_CGROUPNS", {}).get("value") == "host" and not pod.get("hostPID"):
        problems.append("FUSETHROTTLE_CGROUPNS=host needs hostPID: true")

    cronjob = one(found, "CronJob")
    job_pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (backup,) = job_pod["containers"]
    job_dir, job_mount = host_path_mount(job_pod, backup)
    if job_dir != node_dir:
        problems.append(f"the backup mounts {job_dir}, the daemon {node_dir}")
    if job_mount.get("mountPropagation") != "HostToContainer":
        problems.append("the backup's hostPath is not mounted HostToContainer")
    inside = mountpoint[len(daemon_mount["mountPath"].rstrip("/")) :]
    job_mountpoint = job_mount["mountPath"].rstrip("/") + inside
    script = " ".join(backup.get("command", []) + backup.get("args", []))
    if not re.search(r"fuse\\?\.fusethrottle", script) or "/proc/self/mountinfo" not in script:
        problems.append("the backup does not wait for the fuse.fusethrottle mount")
    if f"mnt={job_mountpoint}" not in script:
        problems.append(f"the backup does not write at {job_mountpoint}")
    return problems


def main() -> int:
    problems = check(Path(sys.argv[1]))
    for problem in problems:
        print(f"check-recipe: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
