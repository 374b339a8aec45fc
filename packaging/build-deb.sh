#!/bin/bash
# Build packaging/out/fusethrottle_<version>~deb<N>_<arch>.deb for the Debian release this runs
# on (12 or 13) from this work tree.
#
# No virtualenv is vendored: the Python package goes to /usr/lib/python3/dist-packages and
# runs on Debian's python3-trio and python3-prometheus-client (the control plane). The engine
# (fusethrottle/engine, C++ on libfuse3: the request loop) is compiled here and shipped beside
# it, which makes the package one of this machine's architecture. The tree is
# staged by hand and packed with dpkg-deb, so the build needs only dpkg-dev, gzip and python3
# (no debhelper, no network). Version and the Python dependencies come from pyproject.toml; the
# engine's libraries (libfuse3-3 on Debian 12, libfuse3-4 on 13, libstdc++6, ...) from
# dpkg-shlibdeps on the engine as built, so each release's package names its own libfuse. The
# version ends in ~deb<N> (the release's number): the two builds of one tree are distinct
# packages, and 13's sorts above 12's for an upgrade.
#
# Usage: packaging/build-deb.sh     (prints the path of the .deb on its last line)
# Environment: DEB_MAINTAINER ("Name <address>"), SOURCE_DATE_EPOCH (timestamps; defaults to
# the last commit, so two builds of one commit are byte-identical), FUSETHROTTLE_DEB_OUT
# (output directory, default packaging/out), FUSETHROTTLE_DEB_RELEASE (the version's suffix
# after ~deb; default VERSION_ID of /etc/os-release).
set -euo pipefail
umask 022

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
top=$(dirname "$here")
out=${FUSETHROTTLE_DEB_OUT:-$here/out}
maintainer=${DEB_MAINTAINER:-fusethrottle maintainers <fusethrottle@example.org>}
python=/usr/bin/python3
pyproject=$top/pyproject.toml

die() {
    echo "build-deb: $*" >&2
    exit 1
}
note() { echo "build-deb: $*" >&2; }

for tool in dpkg-deb dpkg-shlibdeps gzip md5sum "$python" make g++ pkg-config; do
    command -v "$tool" >/dev/null ||
        die "$tool is missing (apt-get install dpkg-dev gzip python3 make g++ pkg-config libfuse3-dev)"
done
arch=$(dpkg --print-architecture)
make -s -C "$top/fusethrottle/engine" >&2 || die "the native engine does not build"
[ -f "$pyproject" ] || die "no pyproject.toml at $top"
meta() { "$python" "$here/debmeta.py" "$pyproject" "$1"; }

version=$(meta version)
release=${FUSETHROTTLE_DEB_RELEASE:-$(sed -n 's/^VERSION_ID="\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' /etc/os-release 2>/dev/null)}
[[ $release =~ ^[0-9]+$ ]] ||
    die "cannot tell the Debian release (VERSION_ID in /etc/os-release); set FUSETHROTTLE_DEB_RELEASE"
deb_version=$(meta deb-version)~deb$release
depends=$(meta depends)
recommends=$(meta recommends)
dpkg --validate-version "$deb_version" 2>/dev/null || die "invalid Debian version $deb_version"

# The package's own idea of its version must agree with what the .deb says.
init_version=$(sed -n 's/^__version__ *= *["'\'']\([^"'\'']*\)["'\''].*/\1/p' \
    "$top/fusethrottle/__init__.py" 2>/dev/null || true)
if [ -n "$init_version" ] && [ "$init_version" != "$version" ]; then
    die "fusethrottle/__init__.py says $init_version but pyproject.toml says $version"
fi
[ -f "$top/fusethrottle/service/cli.py" ] ||
    note "warning: fusethrottle/service/cli.py does not exist yet; /usr/bin/fusethrottle will not run"

if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
    SOURCE_DATE_EPOCH=$(git -C "$top" log -1 --format=%ct 2>/dev/null || true)
    [ -n "$SOURCE_DATE_EPOCH" ] || SOURCE_DATE_EPOCH=$(stat -c %Y "$pyproject")
fi
export SOURCE_DATE_EPOCH

stage=$(mktemp -d "${TMPDIR:-/tmp}/fusethrottle-deb.XXXXXX")
trap 'rm -rf -- "$stage"' EXIT
root=$stage/debian/fusethrottle  # where dpkg-shlibdeps expects a package's files
pylib=$root/usr/lib/python3/dist-packages
doc=$root/usr/share/doc/fusethrottle

# --- the Python package: sources only, no byte-code (postinst compiles it) -----------------
(cd "$top" && find fusethrottle -type f \
    ! -path '*/__pycache__/*' ! -name '*.py[co]' ! -name '*~' ! -name '.*' \
    ! -path 'fusethrottle/engine/src/*' ! -name Makefile ! -name '*.tmp' -print0) |
    while IFS= read -r -d '' file; do
        install -D -m 644 "$top/$file" "$pylib/$file"
    done
[ -f "$pylib/fusethrottle/__init__.py" ] || die "fusethrottle/__init__.py is missing"
# Refuse code that Debian 12's Python 3.11 cannot even parse.
find "$pylib/fusethrottle" -name '*.py' -print0 | xargs -0 "$python" -c '
import sys
for path in sys.argv[1:]:
    with open(path, "rb") as f:
        compile(f.read(), path, "exec", dont_inherit=True)
' || die "a module does not compile with $("$python" -V 2>&1)"

distinfo=$pylib/fusethrottle-$version.dist-info
install -d "$distinfo"
meta metadata >"$distinfo/METADATA"
meta entry-points >"$distinfo/entry_points.txt"
echo fusethrottle >"$distinfo/top_level.txt"
echo dpkg >"$distinfo/INSTALLER"

# --- commands: one small script per console script of pyproject.toml ---------------------
while read -r name module function; do
    install -d "$root/usr/bin"
    cat >"$root/usr/bin/$name" <<EOF
#!/usr/bin/python3
"""$name, installed by the Debian package ($module:$function)."""

import sys

from $module import $function

sys.exit($function())
EOF
    chmod 755 "$root/usr/bin/$name"
done < <(meta scripts)
[ -x "$root/usr/bin/fusethrottle" ] || die "pyproject.toml has no fusethrottle console script"
# No /usr/sbin/mount.fuse.fusethrottle: for type fuse.fusethrottle, mount(8) falls back to
# /sbin/mount.fuse (fuse3), which runs "fusethrottle SOURCE MOUNTPOINT -o OPTIONS".

# --- systemd ------------------------------------------------------------------------------
install -D -m 644 "$top/systemd/fusethrottle@.service" \
    "$root/lib/systemd/system/fusethrottle@.service"
install -D -m 755 "$top/systemd/clear-stale-mount" \
    "$root/usr/libexec/fusethrottle/clear-stale-mount"
install -d -m 755 "$root/etc/fusethrottle"

# --- documentation -------------------------------------------------------------------------
install -D -m 644 "$top/systemd/README.md" "$doc/README.systemd.md"
for example in backups.mount backups.automount backups.conf; do
    install -D -m 644 "$top/systemd/$example" "$doc/examples/$example"
done
for file in README.md docs/DESIGN.md docs/experiments.md docs/METRICS.md; do
    [ -f "$top/$file" ] && install -m 644 "$top/$file" "$doc/${file##*/}"
done
install -m 644 "$here/debian/copyright" "$doc/copyright"
when=$(date -u -R -d "@$SOURCE_DATE_EPOCH")
printf '%s\n' \
    "fusethrottle ($deb_version) unstable; urgency=medium" "" \
    "  * Release $version, built from the fusethrottle source tree." "" \
    " -- $maintainer  $when" | gzip -9n >"$doc/changelog.gz"
install -d "$root/usr/share/man/man8"
gzip -9n <"$here/fusethrottle.8" >"$root/usr/share/man/man8/fusethrottle.8.gz"

dashboard=$top/docs/grafana-dashboard.json
if [ -f "$dashboard" ]; then
    "$python" -c 'import json, sys; json.load(open(sys.argv[1]))' "$dashboard" ||
        die "$dashboard is not valid JSON"
    install -D -m 644 "$dashboard" "$root/usr/share/fusethrottle/grafana-dashboard.json"
else
    note "no docs/grafana-dashboard.json; building without the dashboard"
fi

# --- the engine's shared libraries, as this release names them --------------------------
engine=$pylib/fusethrottle/engine/libfusethrottle_engine.so
[ -f "$engine" ] || die "the engine $engine was not staged"
printf 'Source: fusethrottle\n\nPackage: fusethrottle\nArchitecture: any\n' >"$stage/debian/control"
install -d -m 755 "$root/DEBIAN"  # how dpkg-shlibdeps finds the package's root
shlibs=$(cd "$stage" && dpkg-shlibdeps -O "${engine#"$stage"/}") || die "dpkg-shlibdeps failed on the engine"
shlibs=${shlibs#shlibs:Depends=}
grep -q 'libfuse3' <<<"$shlibs" || die "dpkg-shlibdeps named no libfuse3 package: $shlibs"
depends="$depends, $shlibs"

# --- control files -------------------------------------------------------------------------
install -d -m 755 "$root/DEBIAN"
for script in postinst prerm postrm; do
    install -m 755 "$here/debian/$script" "$root/DEBIAN/$script"
done
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z |
    xargs -0 md5sum) >"$root/DEBIAN/md5sums"
chmod 644 "$root/DEBIAN/md5sums"
installed_size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat >"$root/DEBIAN/control" <<EOF
Package: fusethrottle
Version: $deb_version
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $installed_size
Depends: $depends
Recommends: $recommends
Suggests: redis-server
Section: admin
Priority: optional
Description: back-pressure for backups written to a slow NFS or EFS target
 fusethrottle is a FUSE passthrough file system mounted in front of an NFS
 or Amazon EFS backup target. It fsyncs written data in batches and lets a
 bounded window of unsynced bytes build up; a writer that would exceed the
 window waits. A slow target then slows down the backup that writes to it,
 instead of filling the page cache with dirty pages and stalling every
 other writer on the host.
 .
 Mount it with mount -t fuse.fusethrottle, from /etc/fstab, or as the
 supervised systemd service fusethrottle@.service. Many hosts can share one
 budget of an EFS file system through Redis (budget=redis://...; needs
 python3-redis).
EOF

find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
mkdir -p "$out"
rm -f -- "$out"/fusethrottle_*.deb
deb=$out/fusethrottle_${deb_version}_${arch}.deb
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
note "built $deb"
echo "$deb"
