# shellcheck shell=bash
# Sourced by build-image.sh and scripts/test-container: podman_flags IMAGE prints the flags
# that `podman run` and `podman build` need on this host, found by running IMAGE once: none on
# an ordinary host. Two kinds of host need some: cgroup v1 with a cgroup2 mount holding
# controllers ("hybrid", which crun refuses: runc then), and a root without CAP_SYS_RESOURCE
# (a sandbox), which cannot raise its limits to podman's defaults (limits of its own then).
podman_flags() {
    local image=$1 flags limits
    limits="--ulimit nofile=$(ulimit -Hn):$(ulimit -Hn) --ulimit nproc=4096:4096"
    for flags in "" "--runtime runc" "$limits" "--runtime runc $limits"; do
        # shellcheck disable=SC2086 # flags are words
        if podman run --rm --network=none $flags --entrypoint /bin/true "$image" >/dev/null 2>&1; then
            echo "$flags"
            return 0
        fi
    done
    echo "podman cannot run a container here: $(podman run --rm --network=none --entrypoint /bin/true "$image" 2>&1 | tail -n 1)" >&2
    return 1
}
