#!/bin/bash
# Build the .deb, install it with apt on this machine and use it the way an operator would:
# mount -t fuse.fusethrottle, an fstab line, the Type=notify contract of fusethrottle@.service,
# clearing a stale mount after a crash, systemd-analyze verify on the units, and removal.
#
# Needs root on Debian 12 or 13 with /dev/fuse (CI runs it as is on 12, and in a Debian 13 root
# through packaging/test-deb-chroot.sh). Prints "ok: ..." or one
# "FAIL: ..." line per check, then "test-deb: N passed, N failed"; details of failed commands
# go to packaging/out/test-deb.log. Exits 1 if any check failed.
#
# Everything it creates is removed on exit, failure or not: mounts, daemons it started (by PID),
# temporary directories, and the package itself unless it was installed before the test or
# FUSETHROTTLE_KEEP_DEB=1 is set.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
top=$(dirname "$here")
python=/usr/bin/python3
out=$here/out
log=$out/test-deb.log
mount_timeout=60

passed=0
failed=0
work=""
daemon_pids=()
installed_here=0
finished=0

ok() {
    passed=$((passed + 1))
    echo "ok: $*"
}
fail() {
    failed=$((failed + 1))
    echo "FAIL: $*"
}

# check DESCRIPTION CMD...: run CMD, log its output, and print one line for the result. A
# failure line ends with the last line the command printed, which usually says why.
check() {
    local what=$1 output rc=0
    shift
    output=$("$@" 2>&1) || rc=$?
    {
        echo "=== $what (exit $rc): $*"
        [ -z "$output" ] || printf '%s\n' "$output"
    } >>"$log"
    if [ "$rc" -eq 0 ]; then
        ok "$what"
    elif [ "$rc" -eq 124 ]; then
        fail "$what: timed out"
    else
        fail "$what: ${output:+${output##*$'\n'} }(exit $rc)"
    fi
    return "$rc"
}

fstype_at() { findmnt -rn -M "$1" -o FSTYPE 2>/dev/null | tail -n 1 || true; }
mounts_at() { findmnt -rn -M "$1" -o TARGET 2>/dev/null | wc -l || true; }

# PIDs of fusethrottle daemons serving MOUNTPOINT (the ones mount(8) started detach from us).
pids_serving() {
    local dir args
    for dir in /proc/[0-9]*; do
        args=$(tr '\0' ' ' 2>/dev/null <"$dir/cmdline") || continue
        case $args in
            *"/usr/bin/fusethrottle "*" $1 "* | *"/usr/bin/fusethrottle "*" $1") echo "${dir#/proc/}" ;;
        esac
    done
}

# same WHAT ACTUAL EXPECTED: succeed if equal, else say what was found instead.
same() {
    [ "$2" = "$3" ] && return 0
    echo "$1 is '$2', expected '$3'"
    return 1
}

wait_gone() { # wait_gone PID SECONDS
    local i
    for ((i = 0; i < $2 * 10; i++)); do
        kill -0 "$1" 2>/dev/null || return 0
        sleep 0.1
    done
    return 1
}

cleanup() {
    local rc=$? pid mnt
    set +e
    [ "$finished" = 1 ] || fail "test-deb.sh stopped before its last check (exit $rc)"
    for pid in "${daemon_pids[@]}"; do
        kill -0 "$pid" 2>/dev/null && { kill -KILL "$pid" && wait "$pid"; } 2>/dev/null
    done
    if [ -n "$work" ] && [ -d "$work" ]; then
        for mnt in "$work"/mnt*; do
            while [ -n "$(fstype_at "$mnt")" ]; do
                umount --lazy "$mnt" || break
            done
        done
        rm -rf --one-file-system -- "$work"
    fi
    if [ "$installed_here" = 1 ] && [ "${FUSETHROTTLE_KEEP_DEB:-0}" != 1 ]; then
        if dpkg-query -W -f='${Status}' fusethrottle 2>/dev/null | grep -q 'ok installed'; then
            DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 purge -y -q fusethrottle >>"$log" 2>&1 ||
                fail "cleanup: apt-get purge fusethrottle"
        fi
    fi
    echo "test-deb: $passed passed, $failed failed"
    [ "$failed" -eq 0 ] || rc=1
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ "$(id -u)" -ne 0 ]; then
    fail "test-deb.sh must run as root (it installs a package and mounts)"
    exit 1
fi
mkdir -p "$out"
: >"$log"
work=$(mktemp -d /tmp/fusethrottle-test-deb.XXXXXX)
mkdir "$work/src" "$work/mnt" "$work/mnt-fstab" "$work/mnt-notify" "$work/mnt-stale" "$work/units"

# --- static checks ---------------------------------------------------------------------------
if command -v shellcheck >/dev/null; then
    check "shellcheck of the packaging and systemd scripts" shellcheck \
        "$here/build-deb.sh" "$here/test-deb.sh" "$here/test-deb-chroot.sh" "$here"/debian/post* \
        "$here/debian/prerm" \
        "$top/systemd/clear-stale-mount" || true
else
    echo "skip: shellcheck is not installed"
fi
man_page_is_clean() {
    local warnings
    warnings=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -E UTF-8 -l "$1" 2>&1 >/dev/null)
    [ -z "$warnings" ] || {
        printf '%s\n' "$warnings"
        return 1
    }
}
check "man page renders without warnings" man_page_is_clean "$here/fusethrottle.8" || true

# --- build -----------------------------------------------------------------------------------
if ! check "build the .deb" bash "$here/build-deb.sh"; then
    exit 1
fi
debs=("$out"/fusethrottle_*_"$(dpkg --print-architecture)".deb)
deb=${debs[0]}
version=$("$python" "$here/debmeta.py" "$top/pyproject.toml" version)
depends=$(dpkg-deb -f "$deb" Depends)
expected_depends="python3 (>= 3.11), python3-trio (>= 0.22), python3-prometheus-client (>= 0.16), fuse3"
check "Depends: starts with Debian's python3, trio, prometheus-client and fuse3" \
    same "Depends' start" "${depends:0:${#expected_depends}}" "$expected_depends" || true
# The libfuse the engine was built against: the package holding the soname it links
# (libfuse3-3 on Debian 12, libfuse3-4 on 13), which a .deb built on the other release lacks.
libfuse_package() {
    local so
    so=$(objdump -p "$top/fusethrottle/engine/libfusethrottle_engine.so" | awk '$1 == "NEEDED" && $2 ~ /^libfuse3\.so/ {print $2}')
    [ -n "$so" ] || return 1
    dpkg -S "*/$so" | head -n 1 | cut -d: -f1
}
libfuse=$(libfuse_package) || libfuse="(no libfuse3 linked)"
depends_on_own_libfuse() {
    local only
    only=$(tr ',' '\n' <<<"$depends" | grep -o 'libfuse3-[0-9]*' | sort -u | tr '\n' ' ')
    same "libfuse packages in Depends" "${only% }" "$libfuse"
}
check "Depends: names this release's libfuse ($libfuse) and no other" depends_on_own_libfuse || true
release=$(sed -n 's/^VERSION_ID="\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' /etc/os-release)
check "the version ends in ~deb$release, this release's" \
    same "version" "$(dpkg-deb -f "$deb" Version | grep -o '~deb[0-9]*$')" "~deb$release" || true
check "Recommends: python3-redis (budget=), not Depends" \
    same Recommends "$(dpkg-deb -f "$deb" Recommends)" "python3-redis (>= 4.3)" || true
contents=$(dpkg-deb -c "$deb" | awk '{print $6}')
missing=""
for path in ./usr/bin/fusethrottle \
    ./usr/lib/python3/dist-packages/fusethrottle/__init__.py \
    ./usr/lib/python3/dist-packages/fusethrottle/service/cli.py \
    ./usr/lib/python3/dist-packages/fusethrottle/service/sdnotify.py \
    ./lib/systemd/system/fusethrottle@.service \
    ./usr/libexec/fusethrottle/clear-stale-mount \
    ./usr/share/man/man8/fusethrottle.8.gz \
    ./usr/share/doc/fusethrottle/copyright \
    ./usr/share/doc/fusethrottle/examples/backups.mount \
    ./usr/share/doc/fusethrottle/examples/backups.automount; do
    grep -qxF "$path" <<<"$contents" || missing+=" $path"
done
if [ -f "$top/docs/METRICS.md" ]; then
    grep -qxF ./usr/share/doc/fusethrottle/METRICS.md <<<"$contents" ||
        missing+=" ./usr/share/doc/fusethrottle/METRICS.md"
fi
if [ -f "$top/docs/grafana-dashboard.json" ]; then
    grep -qxF ./usr/share/fusethrottle/grafana-dashboard.json <<<"$contents" ||
        missing+=" ./usr/share/fusethrottle/grafana-dashboard.json"
fi
check "the .deb holds the command, the package, the units, the man page and the docs" \
    same "missing" "${missing# }" "" || true
no_foreign_files() { ! grep -E '(\.venv|site-packages|__pycache__|\.pyc$)' <<<"$contents"; }
check "no virtualenv, site-packages or byte-code in the .deb" no_foreign_files || true
# The controller's model and the bench are development tools, not runtime code.
no_bench_code() { ! grep -E '/(simulation|model|simulate)\.py$|/bench/' <<<"$contents"; }
check "no bench code or controller model in the .deb" no_bench_code || true
if command -v lintian >/dev/null; then
    no_lintian_errors() {
        local report
        report=$(lintian "$deb" 2>&1) || true
        ! grep '^E:' <<<"$report"
    }
    check "lintian reports no errors" no_lintian_errors || true
else
    echo "skip: lintian is not installed"
fi

# --- install ---------------------------------------------------------------------------------
if ! dpkg-query -W -f='${Status}' fusethrottle 2>/dev/null | grep -q 'ok installed'; then
    installed_here=1
fi
# apt_install ARGS...: apt-get install, refreshing the package lists once if that fails (a
# fresh machine may have none, and the .deb's dependencies may need fetching).
apt_install() {
    (cd "$top" && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q "$@") ||
        { DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -q &&
            (cd "$top" && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q "$@"); }
}
# --reinstall: the same version may already be installed from an earlier build.
install_deb() { apt_install --reinstall "./${deb#"$top"/}"; }
if ! check "apt-get install ./packaging/out/$(basename "$deb")" install_deb; then
    exit 1
fi
check "fusethrottle --version is $version" \
    same "fusethrottle --version" "$(fusethrottle --version 2>&1)" "fusethrottle $version" || true
installed_copy_is_imported() {
    # From /, with Debian's python3: the installed files, not this work tree, must be found.
    (cd / && "$python" - "$version" <<'PY')
import importlib.metadata
import sys

import fusethrottle
import fusethrottle.service.cli
import fusethrottle.service.daemon
import fusethrottle.service.sdnotify

where = fusethrottle.__file__
assert where.startswith("/usr/lib/python3/dist-packages/fusethrottle/"), where
assert importlib.metadata.version("fusethrottle") == sys.argv[1], importlib.metadata.version(
    "fusethrottle"
)
PY
}
check "the installed package is the one imported, with its metadata" installed_copy_is_imported ||
    true

# --- systemd-analyze verify --------------------------------------------------------------------
# Works without systemd as PID 1. Instances are checked through their template; the example
# mount units need the NFS mount unit they require, which fstab would generate on a real host.
cp /lib/systemd/system/fusethrottle@.service /usr/share/doc/fusethrottle/examples/backups.mount \
    /usr/share/doc/fusethrottle/examples/backups.automount "$work/units/"
cat >"$work/units/mnt-nfs-backups.mount" <<'EOF'
[Mount]
What=nfs.example:/export/backups
Where=/mnt/nfs/backups
Type=nfs4
EOF
verify() {
    local output
    output=$(systemd-analyze verify "$@" 2>&1) || {
        printf '%s\n' "$output"
        return 1
    }
    [ -z "$output" ] || {
        printf '%s\n' "$output"
        return 1
    }
}
command -v systemd-analyze >/dev/null ||
    apt_install systemd >>"$log" 2>&1 || true
if command -v systemd-analyze >/dev/null; then
    man_flag=--man=yes
    command -v man >/dev/null && man -w fusethrottle >/dev/null 2>&1 || man_flag=--man=no
    check "systemd-analyze verify fusethrottle@backups.service backups.mount backups.automount" \
        verify "$man_flag" "$work/units/fusethrottle@backups.service" \
        "$work/units/backups.mount" "$work/units/backups.automount" || true
else
    fail "systemd-analyze is missing (apt-get install systemd)"
fi

# At boot, systemd-fstab-generator turns fstab into mount units. Run it on the fstab line of the
# README (after an NFS line) and check the unit it makes: a remote mount, pulled in by
# remote-fs.target without failing the boot (nofail), after the NFS mount.
generator=/lib/systemd/system-generators/systemd-fstab-generator
fstab_unit_is_remote() {
    local gen=$work/generator
    mkdir -p "$gen/out" "$gen/early" "$gen/late"
    printf '%s\n' \
        "nfs.example:/export/backups /mnt/nfs/backups nfs4 _netdev 0 0" \
        "/mnt/nfs/backups /backups fuse.fusethrottle batch=64M,allow_other,_netdev,nofail,x-systemd.requires-mounts-for=/mnt/nfs/backups 0 0" \
        >"$gen/fstab"
    SYSTEMD_FSTAB=$gen/fstab SYSTEMD_PROC_CMDLINE="" "$generator" "$gen/out" "$gen/early" \
        "$gen/late" || return 1
    test -L "$gen/out/remote-fs.target.wants/backups.mount" ||
        { echo "backups.mount is not in remote-fs.target.wants" && return 1; }
    if ! grep -qx 'Type=fuse.fusethrottle' "$gen/out/backups.mount" ||
        ! grep -qx 'RequiresMountsFor=/mnt/nfs/backups' "$gen/out/backups.mount"; then
        echo "unexpected unit: $(tr '\n' ' ' <"$gen/out/backups.mount")"
        return 1
    fi
    verify --man=no "$gen/out/backups.mount" "$gen/out/mnt-nfs-backups.mount"
}
if [ -x "$generator" ] && command -v systemd-analyze >/dev/null; then
    check "the fstab line becomes a remote, nofail mount unit after the NFS mount (fstab-generator)" \
        fstab_unit_is_remote || true
else
    fail "systemd-fstab-generator or systemd-analyze is missing (apt-get install systemd)"
fi

# --- mount -t fuse.fusethrottle ----------------------------------------------------------------
check "/dev/fuse is a character device (the mount checks need it)" test -c /dev/fuse || true
src=$work/src
mnt=$work/mnt
mounted=0
check "mount -t fuse.fusethrottle SRC MNT -o (with fstab-only options)" \
    timeout "$mount_timeout" mount -t fuse.fusethrottle "$src" "$mnt" \
    -o batch=1M,window=4M,_netdev,nofail,defaults,x-systemd.automount,comment=test && mounted=1
# Whether or not mount(8) succeeded, a daemon may be left: remember it for the cleanup.
mapfile -t pids < <(pids_serving "$mnt")
daemon_pids+=("${pids[@]}")
if [ "$mounted" = 1 ]; then
    check "the mount shows as type fuse.fusethrottle" \
        same "type" "$(fstype_at "$mnt")" fuse.fusethrottle || true
    # Every access through the mount is bounded in time: a hung daemon fails a check, not CI.
    head -c 3M /dev/urandom >"$work/payload"
    check "write a file through the mount" timeout 60 cp "$work/payload" "$mnt/payload" || true
    check "read it back through the mount" timeout 60 cmp "$work/payload" "$mnt/payload" || true
    check "it is in SOURCE, byte for byte" cmp "$work/payload" "$src/payload" || true
    namespace_ops() {
        mkdir "$mnt/d" && echo hi >"$mnt/d/a" && mv "$mnt/d/a" "$mnt/d/b" &&
            test "$(cat "$src/d/b")" = hi && rm "$mnt/d/b" && rmdir "$mnt/d" && test ! -e "$src/d"
    }
    export -f namespace_ops
    export mnt src
    check "mkdir, rename and unlink through the mount" timeout 60 bash -c namespace_ops || true
    check "umount" timeout 60 umount "$mnt" || true
    for pid in "${pids[@]}"; do
        check "the daemon (pid $pid) exits after umount" wait_gone "$pid" 60 || true
    done
fi

# --- reads the kernel serves (FUSE passthrough) ------------------------------------------------
# With libfuse 3.17+ (Debian 13) and without the write-back cache, files open for reading only
# are read by the kernel; a libfuse before 3.17 (Debian 12) says so once. Either way the data
# reads back, and a writer is refused while the kernel reads the file, not mixed in.
pt=$work/mnt-passthrough
mkdir -p "$pt"
head -c 1M /dev/urandom >"$work/pt-payload"
cp "$work/pt-payload" "$src/pt-file"
# A mount at $pt without the write-back cache (where reads may be the kernel's), its log in
# $work/passthrough.log; arguments: environment settings for the daemon (VAR=value...).
mount_for_passthrough() {
    env "$@" fusethrottle "$src" "$pt" -f -o writeback_cache=no >"$work/passthrough.log" 2>&1 &
    pt_pid=$!
    daemon_pids+=("$pt_pid")
    for ((i = 0; i < mount_timeout * 10; i++)); do
        [ -n "$(fstype_at "$pt")" ] && break
        kill -0 "$pt_pid" 2>/dev/null || break
        sleep 0.1
    done
}
mount_for_passthrough
case $libfuse in
    libfuse3-3) expected_passthrough="passthrough: off (built against a libfuse before 3.17" ;;
    *) expected_passthrough="passthrough: on" ;;
esac
says_passthrough() {
    # Said once the control plane first reads the engine's stats, a moment after the mount.
    for ((i = 0; i < 100; i++)); do
        grep -qF "passthrough:" "$work/passthrough.log" && break
        sleep 0.1
    done
    grep -F "passthrough:" "$work/passthrough.log" || true
    [ "$(grep -c "passthrough:" "$work/passthrough.log")" -eq 1 ] &&
        grep -qF "$expected_passthrough" "$work/passthrough.log"
}
check "writeback_cache=no with $libfuse says '$expected_passthrough...' once" says_passthrough || true
check "the file reads back through it" timeout 60 cmp "$work/pt-payload" "$pt/pt-file" || true
# shellcheck disable=SC2016  # the inner shell expands $1
append() { timeout 10 bash -c 'echo more >>"$1"' _ "$1"; }
writer_waits_for_reader() {
    local rc=0 reader
    exec {reader}<"$pt/pt-file"
    append "$pt/pt-file" 2>&1 || rc=$?
    exec {reader}<&-
    if [ "$expected_passthrough" = "passthrough: on" ]; then
        [ "$rc" -ne 0 ] || { echo "a writer was let in while the kernel read the file" && return 1; }
    else
        [ "$rc" -eq 0 ] || return 1
    fi
    append "$pt/pt-file" && timeout 60 cmp -n 1048576 "$work/pt-payload" "$pt/pt-file"
}
check "a writer beside a reader: refused with passthrough, let in without; after the reader, let in" \
    writer_waits_for_reader || true
timeout 60 umount "$pt" || fail "umount of the writeback_cache=no mount"
wait_gone "$pt_pid" 60 || fail "the writeback_cache=no mount's daemon (pid $pt_pid) exits after umount"
# FUSETHROTTLE_PASSTHROUGH=off (what bench.passthrough_reads compares against) leaves the reads
# to the engine where the kernel would take them: said so, and a writer beside a reader is let in.
if [ "$expected_passthrough" = "passthrough: on" ]; then
    mount_for_passthrough FUSETHROTTLE_PASSTHROUGH=off
    expected_passthrough="passthrough: off (FUSETHROTTLE_PASSTHROUGH=off)"
    check "FUSETHROTTLE_PASSTHROUGH=off says '$expected_passthrough' once" says_passthrough || true
    check "with it off, a writer beside a reader is let in" writer_waits_for_reader || true
    timeout 60 umount "$pt" || fail "umount of the FUSETHROTTLE_PASSTHROUGH=off mount"
    wait_gone "$pt_pid" 60 || fail "that mount's daemon (pid $pt_pid) exits after umount"
fi

# --- a mount set up for the removed Python data plane -------------------------------------------
# fstab lines written while two data planes existed may say engine=python: one clear line, a
# non-zero exit, nothing mounted and no daemon left behind.
refuses_engine_python() {
    local out rc=0
    out=$(timeout "$mount_timeout" mount -t fuse.fusethrottle "$src" "$mnt" -o engine=python 2>&1) || rc=$?
    echo "$out"
    [ "$rc" -ne 0 ] && [ "$(printf '%s\n' "$out" | grep -c .)" -eq 1 ] &&
        printf '%s' "$out" | grep -q "Python data plane was removed" &&
        ! printf '%s' "$out" | grep -q Traceback && ! mountpoint -q "$mnt"
}
check "mount -o engine=python is refused with one line, nothing mounted" refuses_engine_python || true
mapfile -t pids < <(pids_serving "$mnt")
daemon_pids+=("${pids[@]}")
check "no daemon is left serving after the refused mount" test "${#pids[@]}" -eq 0 || true

# --- fstab --------------------------------------------------------------------------------------
# mount --fstab reads another file with fstab's syntax: /etc/fstab is never touched.
fstab=$work/fstab
printf '%s %s fuse.fusethrottle %s 0 0\n' "$src" "$work/mnt-fstab" \
    "batch=64M,allow_other,_netdev,nofail,x-systemd.requires-mounts-for=$src" >"$fstab"
mounted=0
check "mount MNT from an fstab line with _netdev,nofail,x-systemd.*" \
    timeout "$mount_timeout" mount --fstab "$fstab" "$work/mnt-fstab" && mounted=1
mapfile -t pids < <(pids_serving "$work/mnt-fstab")
daemon_pids+=("${pids[@]}")
if [ "$mounted" = 1 ]; then
    allow_other_set() { [[ ,$(findmnt -rn -M "$work/mnt-fstab" -o OPTIONS), == *,allow_other,* ]]; }
    check "allow_other from fstab reached the kernel" allow_other_set || true
    check "the file written earlier reads through the fstab mount" \
        timeout 60 cmp "$work/payload" "$work/mnt-fstab/payload" || true
    check "umount of the fstab mount" timeout 60 umount "$work/mnt-fstab" || true
    for pid in "${pids[@]}"; do
        wait_gone "$pid" 60 || fail "the fstab mount's daemon (pid $pid) exits after umount"
    done
fi

# --- Type=notify, as fusethrottle@.service runs it ---------------------------------------------
echo "--- sd_notify contract (check-notify.py)" >>"$log"
notify_out=$("$python" "$here/check-notify.py" "$src" "$work/mnt-notify" 2>>"$log") || true
while IFS= read -r line; do
    case $line in
        ok:*) ok "sd_notify: ${line#ok: }" ;;
        FAIL:*) fail "sd_notify: ${line#FAIL: }" ;;
        *) echo "$line" ;;
    esac
done <<<"$notify_out"

# --- a crashed daemon's stale mount, as Restart= meets it ------------------------------------
stale=$work/mnt-stale
fusethrottle "$src" "$stale" -f -o batch=1M,window=4M >>"$log" 2>&1 &
crash_pid=$!
daemon_pids+=("$crash_pid")
answers=no
deadline=$((SECONDS + mount_timeout))
while ((SECONDS < deadline)); do
    if [ -n "$(fstype_at "$stale")" ] && timeout 5 stat -f "$stale" >/dev/null 2>&1; then
        answers=yes
        break
    fi
    kill -0 "$crash_pid" 2>/dev/null || break
    sleep 0.1
done
if check "fusethrottle -f mounts in the foreground, and the mount answers" \
    same "type, answers" "$(fstype_at "$stale"), $answers" "fuse.fusethrottle, yes"; then
    refuses_live_mount() {
        local rc=0
        /usr/libexec/fusethrottle/clear-stale-mount "$stale" || rc=$?
        [ "$rc" -eq 1 ]
    }
    check "clear-stale-mount refuses to touch a live mount (exit 1)" refuses_live_mount || true
    kill -KILL "$crash_pid" 2>/dev/null || true
    wait "$crash_pid" 2>/dev/null || true
    is_stale() {
        local err
        err=$(LC_ALL=C timeout 10 stat -f "$stale" 2>&1) && return 1
        [[ $err == *"Transport endpoint is not connected"* ]]
    }
    check "after kill -9 the mount is stale (Transport endpoint is not connected)" is_stale || true
    check "clear-stale-mount removes the stale mount" /usr/libexec/fusethrottle/clear-stale-mount \
        "$stale" || true
    check "nothing is left mounted at the mount point" \
        same "mounts at $stale" "$(mounts_at "$stale")" 0 || true
    mounted=0
    check "a new daemon mounts there again" \
        timeout "$mount_timeout" mount -t fuse.fusethrottle "$src" "$stale" && mounted=1
    mapfile -t pids < <(pids_serving "$stale")
    daemon_pids+=("${pids[@]}")
    if [ "$mounted" = 1 ]; then
        check "exactly one mount at the mount point, not a stack" \
            same "mounts at $stale" "$(mounts_at "$stale")" 1 || true
        check "the remount serves the data" timeout 60 cmp "$work/payload" "$stale/payload" || true
        timeout 60 umount "$stale" || fail "umount of the remount"
    fi
fi

# --- removal -------------------------------------------------------------------------------------
if [ "$installed_here" = 1 ] && [ "${FUSETHROTTLE_KEEP_DEB:-0}" != 1 ]; then
    purge() {
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 purge -y -q fusethrottle &&
            test ! -e /usr/bin/fusethrottle &&
            test ! -e /usr/lib/python3/dist-packages/fusethrottle &&
            test ! -e /lib/systemd/system/fusethrottle@.service
    }
    check "apt-get purge removes every file, byte-code included" purge || true
fi
finished=1
