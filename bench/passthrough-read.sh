#!/bin/bash
# Run in a Debian 13 root, on a directory of the host's disk bound at /bind:
#   FUSETHROTTLE_CHROOT_BIND=/var/tmp/bench packaging/test-deb-chroot.sh trixie 'REPS=5 bash bench/passthrough-read.sh'
# (put libfuse 3.17.2's example/passthrough_hp.cc and example/cxxopts.hpp in /var/tmp/bench/hp
# for the side by side with passthrough_hp; without them it is skipped). Prints MiB/s per read.
#
# Cold 1 GiB read: the target directly, fusethrottle with passthrough (writeback_cache=no),
# fusethrottle with the write-back cache (passthrough off), libfuse's passthrough_hp with and
# without its passthrough. Target: /bind/src (a directory on the host's disk).
set -u
cd /src/fusethrottle || exit 1
make -s -C fusethrottle/engine || exit 1
export PYTHONPATH=/src/fusethrottle
src=/bind/src; mnt=/tmp/mnt; mkdir -p $src $mnt
[ -f $src/big ] || head -c 1G /dev/urandom > $src/big
reps=${REPS:-3}
evict() { python3 -c 'import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED)' $src/big; }
readit() { evict; local t0 t1; t0=$(date +%s.%N); dd if="$1" of=/dev/null bs=1M status=none; t1=$(date +%s.%N); python3 -c "print(f'{1024/($t1-$t0):.0f}')"; }
run() { local name=$1 path=$2 out=""; for _ in $(seq "$reps"); do out+=" $(readit $path)"; done; echo "$name MiB/s:$out"; }
run direct $src/big
for opts in writeback_cache=no writeback_cache=yes; do
  python3 -c 'from fusethrottle.service.cli import main; import sys; sys.argv[0]="fusethrottle"; sys.exit(main())' $src $mnt -f -o $opts > /tmp/log 2>&1 &
  pid=$!
  for _ in $(seq 100); do mountpoint -q $mnt && break; sleep 0.2; done
  grep -o 'passthrough: [a-z]*' /tmp/log | head -1
  run "fusethrottle $opts" $mnt/big
  umount $mnt; wait $pid
done
ex=${HP_DIR:-/bind/hp}  # libfuse 3.17.2 example/passthrough_hp.cc and cxxopts.hpp (Debian does not ship them)
if [ -f $ex/passthrough_hp.cc ]; then
  # shellcheck disable=SC2046  # the flags are words
  g++ -O2 -std=c++17 -o /tmp/passthrough_hp -I$ex $ex/passthrough_hp.cc $(pkg-config --cflags --libs fuse3) -lpthread 2>&1 | tail -3
  for pt in "" "--nopassthrough"; do
    /tmp/passthrough_hp --foreground --nocache $pt $src $mnt &
    pid=$!
    for _ in $(seq 100); do mountpoint -q $mnt && break; sleep 0.2; done
    run "passthrough_hp ${pt:---passthrough}" $mnt/big
    umount $mnt; wait $pid
  done
fi
