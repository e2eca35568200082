#!/usr/bin/env bash
# Guest check (a phase of the VM scenario, copied in by scenario.sh): one
# `attach` of a block volume (GPT, one partition) must make
# the kernel announce its partition exactly once. udev watches /dev/loopN
# for IN_CLOSE_WRITE (60-block.rules OPTIONS+="watch"); when a tool closes a
# read-write fd of /dev/loopN, udevd (on_inotify -> synthesize_change ->
# blockdev_reread_partition_table) issues BLKRRPART, and the kernel drops
# and re-adds loopNp1 under a consumer (fsck, mount) that already started
# on the first one. The witness: the kernel's uevents of loopNp1.
#
#   partition-once.sh [CLI] [CYCLES]   CLI defaults to sparse-volume, CYCLES to 10
#
# Each cycle: attach (waits for udev's by-partuuid link), settle, a quiet
# pause in which a late BLKRRPART would show, settle; count loopNp1's
# `remove` and `add` kernel uevents; detach. Exit 0 when every attach shows
# exactly one `add` and no `remove`; 1 otherwise. Also run as a comparison:
# `partition-once.sh --losetup [CYCLES]` does the same with `losetup -f --show -P`
# on the same file (a tool that closes a write fd: shows the double scan).
# Works on a private SPARSE_VOLUME_ROOT, so the system's registry is untouched.
set -euo pipefail

cli=${1:-sparse-volume}
cycles=${2:-10}
pause=${SV_CHECK_PAUSE:-1.5}

work=$(mktemp -d /var/tmp/sv-race-check.XXXXXX)
monitor_pid=
cleanup() {
    [[ -n $monitor_pid ]] && kill "$monitor_pid" 2>/dev/null && wait "$monitor_pid" 2>/dev/null
    for dev in $(losetup --noheadings -O NAME -j "$work/root/var/lib/sparse-volume/$uuid" 2>/dev/null); do
        losetup -d "$dev" 2>/dev/null || true
    done
    rm -rf "$work"
}
uuid=none
trap cleanup EXIT

export SPARSE_VOLUME_ROOT=$work/root
mkdir -p "$SPARSE_VOLUME_ROOT/run/udev"
# attach waits for udev's link only when udev's control socket exists
# below SPARSE_VOLUME_ROOT; the link itself is the real one.
: >"$SPARSE_VOLUME_ROOT/run/udev/control"

creator=$cli
[[ $cli == --losetup ]] && creator=sparse-volume
uuid=$("$creator" create --size 64M --mode block --json | sed -n 's/.*"uuid":"\([^"]*\)".*/\1/p')
[[ -n $uuid ]] || { echo "FAIL: create reported no uuid"; exit 1; }
file=$SPARSE_VOLUME_ROOT/var/lib/sparse-volume/$uuid
[[ -f $file ]] || { echo "FAIL: no backing file at $file"; exit 1; }

bad=0
for ((cycle = 1; cycle <= cycles; cycle++)); do
    log=$work/monitor.$cycle
    udevadm monitor --kernel --subsystem-match=block >"$log" &
    monitor_pid=$!
    # The monitor prints its header once it listens.
    for _ in $(seq 100); do grep -q '^KERNEL' "$log" 2>/dev/null && break; sleep 0.05; done
    if [[ $cli == --losetup ]]; then
        dev=$(losetup -f --show -P --direct-io=on "$file")
        udevadm wait --timeout=10 "/dev/disk/by-partuuid/$uuid" >/dev/null
    else
        dev=$("$cli" attach "$uuid" --json | sed -n 's/.*"device":"\([^"]*\)".*/\1/p')
    fi
    [[ -n $dev ]] || { echo "FAIL: cycle $cycle: attach reported no device"; exit 1; }
    udevadm settle --timeout=30
    sleep "$pause"
    udevadm settle --timeout=30
    kill "$monitor_pid"; wait "$monitor_pid" 2>/dev/null || true; monitor_pid=
    part=${dev#/dev/}p1
    adds=$(grep -c " add .*/$part (block)" "$log" || true)
    removes=$(grep -c " remove .*/$part (block)" "$log" || true)
    verdict=ok
    if [[ $adds -ne 1 || $removes -ne 0 ]]; then verdict=DOUBLE-SCAN; bad=$((bad + 1)); fi
    echo "cycle $cycle: $dev: ${part} add=$adds remove=$removes $verdict"
    if [[ $verdict != ok ]]; then
        sed 's/^/    /' "$log"
        dmesg | grep -E "${dev#/dev/}: p1|${dev#/dev/}" | tail -n 4 | sed 's/^/    kernel: /'
    fi
    if [[ $cli == --losetup ]]; then
        losetup -d "$dev"
    else
        "$cli" detach "$uuid" >/dev/null
    fi
    udevadm settle --timeout=30
done
echo "attaches with a second partition scan: $bad of $cycles"
[[ $bad -eq 0 ]]
