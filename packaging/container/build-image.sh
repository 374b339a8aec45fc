#!/bin/bash
# Build the fusethrottle container image with podman, from this work tree, with no registry.
#
#   1. the base: a Debian 12 root made by mmdebstrap from Debian's mirror (fuse3, python3-trio,
#      python3-prometheus-client, python3-redis), imported as localhost/fusethrottle-base; the
#      root's tarball is cached under $FUSETHROTTLE_IMAGE_CACHE and made again when the package
#      list changes or with FUSETHROTTLE_REFRESH=1 (for Debian's security updates);
#   2. packaging/build-deb.sh builds the project's .deb;
#   3. podman build --pull=never --network=none of packaging/container/Containerfile on that
#      base installs the .deb and the entry point: localhost/fusethrottle:<version> and :latest.
#
# Usage (root): packaging/container/build-image.sh   (prints the image's name on its last line)
# Needs: podman and mmdebstrap (apt-get install podman mmdebstrap), and the build tools of
# packaging/build-deb.sh.
set -euo pipefail
umask 022

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
top=$(dirname "$(dirname "$here")")
cache=${FUSETHROTTLE_IMAGE_CACHE:-/var/cache/fusethrottle/container}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
suite=bookworm
packages=fuse3,libfuse3-3,libstdc++6,python3-trio,python3-prometheus-client,python3-redis,ca-certificates
image=${FUSETHROTTLE_IMAGE:-localhost/fusethrottle}

die() {
    echo "build-image: $*" >&2
    exit 1
}
note() { echo "build-image: $*" >&2; }

[ "$(id -u)" = 0 ] || die "run as root (podman here runs rootful: FUSE mounts need it)"
for tool in podman mmdebstrap; do
    command -v "$tool" >/dev/null || die "$tool is missing (apt-get install podman mmdebstrap)"
done

key=$(printf '%s\n' "$suite" "$packages" "$mirror" "$security" | sha256sum | cut -c1-12)
base=localhost/fusethrottle-base:$suite-$key
tarball=$cache/$suite-$key.tar
if [ "${FUSETHROTTLE_REFRESH:-0}" = 1 ]; then
    rm -f -- "$tarball"
    podman image rm -f "$base" >/dev/null 2>&1 || true
fi
if ! podman image exists "$base"; then
    if [ ! -s "$tarball" ]; then
        note "making the $suite root with mmdebstrap (a few minutes; cached in $cache)"
        mkdir -p "$cache"
        mmdebstrap --quiet --variant=apt --format=tar --include="$packages" "$suite" "$tarball.tmp" \
            "deb $mirror $suite main" "deb $mirror $suite-updates main" \
            "deb $security $suite-security main" >&2 || die "mmdebstrap failed"
        mv -- "$tarball.tmp" "$tarball"
    fi
    podman import --quiet "$tarball" "$base" >/dev/null || die "podman import failed"
fi

# shellcheck source=/dev/null
. "$here/podman-flags.sh"
flags=$(podman_flags "$base") || die "podman cannot run containers on this host"
[ -z "$flags" ] || note "podman here needs: $flags"

deb=$("$top/packaging/build-deb.sh" | tail -n 1)
[ -f "$deb" ] || die "packaging/build-deb.sh made no .deb"
version=$(python3 "$top/packaging/debmeta.py" "$top/pyproject.toml" version)

context=$(mktemp -d "${TMPDIR:-/tmp}/fusethrottle-image.XXXXXX")
trap 'rm -rf -- "$context"' EXIT
cp -- "$here/Containerfile" "$here/fusethrottle-container" "$context/"
cp -- "$deb" "$context/fusethrottle.deb"
old=$(podman image inspect --format '{{.Id}}' "$image:$version" 2>/dev/null || true)
# shellcheck disable=SC2086 # flags are words
podman build --quiet --pull=never --network=none --layers=false $flags --build-arg "BASE=$base" \
    --label "org.opencontainers.image.version=$version" \
    -t "$image:$version" -t "$image:latest" -f "$context/Containerfile" "$context" >&2 ||
    die "podman build failed"
# The image this build replaced (same version, older tree) is left untagged: remove it, unless
# a container still uses it.
new=$(podman image inspect --format '{{.Id}}' "$image:$version")
if [ -n "$old" ] && [ "$old" != "$new" ]; then
    podman image rm "$old" >/dev/null 2>&1 || true
fi
echo "$image:$version"
