#!/bin/bash
# Build, install and check the Debian package for another Debian release, in a root of that
# release on this machine: packaging/test-deb.sh run inside it (build with its own libfuse and
# compiler, apt-get install, mount -t fuse.fusethrottle, write, verify, unmount, ...). The
# host's kernel and /dev/fuse serve the root.
#
# Usage: packaging/test-deb-chroot.sh [RELEASE [COMMAND]]    (default trixie, Debian 13)
# With COMMAND, that shell command runs in the root (in the copied tree) instead of the checks.
#
# The root is made once (debootstrap's minbase, then apt-get install of the build's and the
# checks' packages) under $FUSETHROTTLE_CHROOT_CACHE (default /var/cache/fusethrottle/chroot),
# with the downloaded .debs kept beside it, and reused; each run works on an overlay of it, so
# the cached root stays as it was made. Every mount (/proc,
# /sys, /dev, /dev/pts, the overlay, the checks' FUSE mounts) lives in a mount namespace of its
# own that ends with the run: nothing is left mounted on the host. The .deb is copied to
# packaging/out/<release>/. Needs root, debootstrap and util-linux's unshare.
# Environment: FUSETHROTTLE_DEBIAN_MIRROR (default http://deb.debian.org/debian),
# FUSETHROTTLE_CHROOT_BIND (a host directory to bind at /bind in the root, e.g. for a bench on a
# real disk: the root's /tmp is a tmpfs).
set -euo pipefail
umask 022

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
top=$(dirname "$here")
release=${1:-trixie}
command=${2:-packaging/test-deb.sh}
bind=${FUSETHROTTLE_CHROOT_BIND:-}
[ -z "$bind" ] || [ -d "$bind" ] || { echo "test-deb-chroot: $bind is not a directory" >&2; exit 1; }
cache=${FUSETHROTTLE_CHROOT_CACHE:-/var/cache/fusethrottle/chroot}
base=$cache/$release-root
debs=$cache/$release-debs
mirror=${FUSETHROTTLE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
out=$here/out/$release
# What the build (build-deb.sh) and the checks (test-deb.sh) use, preinstalled in the cache.
packages="dpkg-dev g++ make pkg-config libfuse3-dev fuse3 python3 python3-trio"
packages+=" python3-prometheus-client systemd man-db binutils procps"

die() {
    echo "test-deb-chroot: $*" >&2
    exit 1
}
note() { echo "test-deb-chroot: $*" >&2; }

[ "$(id -u)" -eq 0 ] || die "must run as root (it makes a root with debootstrap and mounts)"
[[ $release =~ ^[a-z]+$ ]] || die "RELEASE is a Debian code name such as trixie, not '$release'"
command -v unshare >/dev/null || die "unshare is missing (apt-get install util-linux)"
test -c /dev/fuse || die "/dev/fuse is missing (modprobe fuse)"

if [ ! -e "$base/.complete" ]; then
    command -v debootstrap >/dev/null ||
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q debootstrap >&2 ||
        die "debootstrap is missing and apt-get install debootstrap failed"
    note "making a $release root in $base with debootstrap (once; a few minutes)"
    rm -rf --one-file-system -- "$base.tmp"
    mkdir -p "$debs"
    made_log=$cache/$release-root.log
    # debootstrap resolves minbase; apt (in the root) the rest, as its dependencies want.
    debootstrap --variant=minbase --cache-dir="$debs" "$release" "$base.tmp" "$mirror" \
        >"$made_log" 2>&1 || die "debootstrap $release failed; see $made_log"
    # shellcheck disable=SC2016  # expanded by the inner shell
    ROOT=$base.tmp DEBS=$debs PACKAGES=$packages unshare --mount --propagation private -- \
        /bin/bash -euc '
        # (as below: no copy of another FUSE mount kept alive by this namespace)
        findmnt -rn -o TARGET,FSTYPE | awk "\$2 ~ /^fuse/ {print \$1}" | sort -r | xargs -r -n1 umount --lazy
        mount -t proc proc "$ROOT/proc"
        mount --bind /dev "$ROOT/dev"
        mount --bind "$DEBS" "$ROOT/var/cache/apt/archives"
        exec chroot "$ROOT" /usr/bin/env DEBIAN_FRONTEND=noninteractive /bin/sh -ec "
            apt-get update -q
            apt-get install -y -q --no-install-recommends $PACKAGES"
    ' >>"$made_log" 2>&1 ||
        die "installing the build's packages in the $release root failed; see $made_log"
    touch "$base.tmp/.complete"
    rm -rf --one-file-system -- "$base"
    mv "$base.tmp" "$base"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/fusethrottle-chroot.XXXXXX")
# shellcheck disable=SC2317  # run by the trap
cleanup() {
    local rc=$?
    # The namespace took its mounts with it; a leftover here would be a bug, so say so.
    if findmnt -rn -o TARGET | grep -qF "$work/"; then
        note "mounts were left under $work; unmounting them"
        findmnt -rn -o TARGET | grep -F "$work/" | sort -r | xargs -r -n1 umount --lazy
        rc=1
    fi
    rm -rf --one-file-system -- "$work"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir -p "$work/upper" "$work/ovl" "$work/root"

# The tree as committed plus uncommitted changes: tracked and new files, not ignored ones.
(cd "$top" && git ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do [ ! -e "$f" ] || printf '%s\0' "$f"; done |
    tar --null -T - -cf "$work/tree.tar")
epoch=$(git -C "$top" log -1 --format=%ct)

inner=$(
    cat <<'EOF'
set -eu
root=$1
# The namespace began with a copy of every host mount (this host's are private: the host's
# unmounts do not reach the copies). A copy of another FUSE file system keeps its connection
# alive after the host unmounts it: its daemon waits on /dev/fuse until this run ends (a
# fusethrottle stop, a bench's C passthrough). Let go of them first.
findmnt -rn -o TARGET,FSTYPE | awk '$2 ~ /^fuse/ {print $1}' | sort -r | xargs -r -n1 umount --lazy
mount -t overlay overlay -o "lowerdir=$BASE,upperdir=$WORK/upper,workdir=$WORK/ovl" "$root"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
mount -t tmpfs tmpfs "$root/tmp"
cp /etc/resolv.conf "$root/etc/resolv.conf"
# The host's way to the Internet, as its resolv.conf: pip's settings and the local CAs (a proxy's
# own, which apt's ca-certificates keeps in the root's bundle when it rebuilds it).
[ ! -f /etc/pip.conf ] || cp /etc/pip.conf "$root/etc/pip.conf"
if [ -d /usr/local/share/ca-certificates ]; then
    mkdir -p "$root/usr/local/share/ca-certificates" "$root/etc/ssl/certs"
    cp -r /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/"
    [ ! -f /etc/ssl/certs/ca-certificates.crt ] || cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
fi
mkdir -p "$root/src/fusethrottle"
tar -xf "$WORK/tree.tar" -C "$root/src/fusethrottle"
mkdir -p "$root/out"
mount --bind "$OUT" "$root/out"
if [ -n "$BIND" ]; then
    mkdir -p "$root/bind"
    mount --bind "$BIND" "$root/bind"
fi
exec chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
    SOURCE_DATE_EPOCH="$EPOCH" PACKAGES="$PACKAGES" COMMAND="$COMMAND" /bin/bash -c '
set -e
cd /src/fusethrottle
echo "== $(. /etc/os-release && echo "$PRETTY_NAME"), libfuse $(pkg-config --modversion fuse3)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
# shellcheck disable=SC2086  # a list of words
apt-get install -y -q --no-install-recommends $PACKAGES >/dev/null
rc=0
bash -c "$COMMAND" || rc=$?
cp packaging/out/fusethrottle_*.deb packaging/out/test-deb.log /out/ 2>/dev/null || true
exit $rc
'
EOF
)
mkdir -p "$out"
rm -f -- "$out"/fusethrottle_*.deb
rc=0
BASE=$base WORK=$work EPOCH=$epoch OUT=$out PACKAGES=$packages COMMAND=$command BIND=$bind \
    unshare --mount --propagation private -- /bin/bash -c "$inner" inner "$work/root" || rc=$?
[ "$rc" -eq 0 ] || note "the checks in the $release root failed (exit $rc); log: $out/test-deb.log"
find "$out" -name 'fusethrottle_*.deb' -printf 'test-deb-chroot: built %p\n' >&2
exit "$rc"
