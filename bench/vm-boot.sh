#!/usr/bin/env bash
# The boot comparison (`bench/run --vm`), as root, in the test VM of
# tests/vm (real systemd and udev; TCG, so absolute times are several times
# a real machine's and only the ratios carry over):
#
#   bench/vm-boot.sh [--volumes N] [--rounds N] [--out DIR]
#
# Installs the newest .deb of ${CARGO_TARGET_DIR:-target}/packages (built
# when there is none; after a change, run packaging/build-packages.sh first)
# in a fresh guest, registers N ext4 volumes of 16 MiB
# (default 100), each with an fstab consumer by UUID=, and enables, for the
# same N files, the field's template unit (bench/losetup-field@.service:
# `flock … losetup --find --partscan FILE`), which runs only on boots with
# sparse_volume=off, where our generator makes no units. Then it boots the
# guest cold (poweroff, new qemu), alternating the two sides, ROUNDS times
# each (default 3; the side that goes first alternates too), and reads from
# systemd when each volume unit started and became active and when each
# consumer's mount became active. Prints medians (min..max) and ratios,
# and writes every boot's numbers to DIR/vm-boot.json (default
# ${CARGO_TARGET_DIR:-target}/bench). A boot on which any unit, mount or
# consumer's loop device is missing voids the run (exit 1).
set -euo pipefail
target=${CARGO_TARGET_DIR:-}
[[ -z $target || $target == /* ]] || target=$PWD/$target
cd "$(dirname "$0")/.."
target=${target:-$PWD/target}

volumes=100
rounds=3
size=16M
out=""
while (($#)); do
    case $1 in
        --volumes) volumes=${2:?--volumes needs a number} && shift ;;
        --rounds) rounds=${2:?--rounds needs a number} && shift ;;
        --out) out=${2:?--out needs a directory} && shift ;;
        *)
            echo "usage: $0 [--volumes N] [--rounds N] [--out DIR]" >&2
            exit 2
            ;;
    esac
    shift
done
[[ $volumes =~ ^[1-9][0-9]*$ && $rounds =~ ^[1-9][0-9]*$ ]] || {
    echo "bench/vm-boot.sh: --volumes and --rounds take a positive number" >&2
    exit 2
}
out=$(realpath -m "${out:-$target/bench}")
mkdir -p "$out"

# shellcheck source=tests/vm/lib.sh
. tests/vm/lib.sh
trap vm_cleanup EXIT

deb=$(vm_package_under_test "$target")
# shellcheck disable=SC2119 # the volumes live on the root disk
vm_start
vm_copy_in "$deb" bench/vm-boot-guest.sh bench/losetup-field@.service /root/
vm_ssh "dpkg -i /root/${deb##*/} >/dev/null" </dev/null
vm_log "registering $volumes volumes of $size with fstab consumers"
vm_ssh "/root/vm-boot-guest.sh setup $volumes $size" </dev/null

records=$out/vm-boot.jsonl
: >"$records"
for ((round = 1; round <= rounds; round++)); do
    sides=(sparse-volume losetup)
    ((round % 2)) || sides=(losetup sparse-volume)
    for side in "${sides[@]}"; do
        case $side in
            sparse-volume) vm_restart ;;
            losetup) vm_restart sparse_volume=off ;;
        esac
        vm_log "round $round, $side: waiting for the boot to finish"
        vm_ssh "/root/vm-boot-guest.sh measure $side" </dev/null | tee -a "$records" >&2
    done
done
vm_stop
python3 bench/boot_summary.py "$records" "$volumes" "$out/vm-boot.json"
