#!/usr/bin/env bash
# The encrypted I/O comparison (`bench/run --vm`), as root, in the test VM
# of tests/vm (this host's kernel may have no device-mapper; the guest's
# has). Under TCG the guest's AES and every I/O are emulated, so absolute
# numbers are far below a real machine's and only the ratio carries over:
#
#   bench/vm-crypt-io.sh [--size MIB] [--seconds N] [--rounds N] [--out DIR]
#
# Builds (once) a test image with fio, installs the newest .deb of ${CARGO_TARGET_DIR:-target}/packages in a
# fresh guest, and runs bench/io.py --encrypted there on an ext4 data disk:
# an encrypted volume of SIZE MiB (default 1024) attached by sparse-volume
# against `cryptsetup open` of the same file on `losetup --direct-io=on`
# with the same key file, fio 4k random and 1M sequential, SECONDS per run
# (default 5), ROUNDS rounds (default 3). Prints medians (min..max) and
# ratios; writes DIR/io-crypt.json (default ${CARGO_TARGET_DIR:-target}/bench).
set -euo pipefail
target=${CARGO_TARGET_DIR:-}
[[ -z $target || $target == /* ]] || target=$PWD/$target
cd "$(dirname "$0")/.."
target=${target:-$PWD/target}

size=1024
seconds=5
rounds=3
out=""
while (($#)); do
    case $1 in
        --size) size=${2:?--size needs a number of MiB} && shift ;;
        --seconds) seconds=${2:?--seconds needs a number} && shift ;;
        --rounds) rounds=${2:?--rounds needs a number} && shift ;;
        --out) out=${2:?--out needs a directory} && shift ;;
        *)
            echo "usage: $0 [--size MIB] [--seconds N] [--rounds N] [--out DIR]" >&2
            exit 2
            ;;
    esac
    shift
done
for number in "$size" "$seconds" "$rounds"; do
    [[ $number =~ ^[1-9][0-9]*$ ]] || {
        echo "bench/vm-crypt-io.sh: --size, --seconds and --rounds take a positive number" >&2
        exit 2
    }
done
((size > 32)) || {
    echo "bench/vm-crypt-io.sh: --size must be more than 32 MiB (the LUKS2 header takes 16)" >&2
    exit 2
}
out=$(realpath -m "${out:-$target/bench}")
mkdir -p "$out"

# fio is not in the test image: an image of its own (cached like it).
export SV_VM_EXTRA_PACKAGES=fio
# shellcheck source=tests/vm/lib.sh
. tests/vm/lib.sh
trap vm_cleanup EXIT

deb=$(vm_package_under_test "$target")
vm_start "$((size + 512))M"
vm_copy_in "$deb" bench/io.py /root/
vm_ssh "dpkg -i /root/${deb##*/} >/dev/null &&
    mkfs.ext4 -q /dev/vdb && mkdir -p /bench && mount /dev/vdb /bench" </dev/null
vm_log "encrypted I/O: $size MiB, $seconds s per run, $rounds rounds"
vm_ssh "mkdir -p /bench/out && python3 /root/io.py --encrypted /bench /usr/bin/sparse-volume /bench/out $size $seconds $rounds" </dev/null
vm_ssh "cat /bench/out/io-crypt.json" </dev/null >"$out/io-crypt.json"
vm_stop
