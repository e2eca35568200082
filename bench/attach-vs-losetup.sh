#!/usr/bin/env bash
# Attach + detach of one volume, sparse-volume against util-linux losetup,
# on the same backing file, side by side in one run. Prints per-cycle
# times and the ratio. Needs root and a release build.
#
#   bench/attach-vs-losetup.sh [cycles]
set -euo pipefail
cd "$(dirname "$0")/.."

cycles=${1:-200}
cargo build --release --locked -q -p sparse-volume
# Where cargo put it (CARGO_TARGET_DIR, relative to here as for cargo).
cli=$(realpath -m "${CARGO_TARGET_DIR:-target}")/release/sparse-volume

root=$(mktemp -d)
trap 'losetup -j "$root/var/lib/sparse-volume/$uuid" -O NAME -n | xargs -r -n1 losetup -d; rm -rf "$root"' EXIT
export SPARSE_VOLUME_ROOT=$root
uuid=$(cat /proc/sys/kernel/random/uuid)
"$cli" create --size 256M --uuid "$uuid" >/dev/null
file=$root/var/lib/sparse-volume/$uuid

now() { date +%s%N; }

time_cycles() {
    local start end
    start=$(now)
    for _ in $(seq "$cycles"); do "$@"; done
    end=$(now)
    echo $(( (end - start) / cycles / 1000 ))
}

ours() { "$cli" attach "$uuid" >/dev/null && "$cli" detach "$uuid" >/dev/null; }
theirs() { local dev; dev=$(losetup --find --show --direct-io=on "$file") && losetup -d "$dev"; }

# Warm both paths once, then alternate rounds so drift hits both alike.
ours; theirs
ours_us=0; theirs_us=0
for _ in 1 2 3; do
    ours_us=$(( ours_us + $(time_cycles ours) ))
    theirs_us=$(( theirs_us + $(time_cycles theirs) ))
done
ours_us=$(( ours_us / 3 )); theirs_us=$(( theirs_us / 3 ))

printf 'attach+detach cycle, %d cycles x 3 rounds, %s\n' "$cycles" "$(uname -r)"
printf '  sparse-volume : %6d us\n' "$ours_us"
printf '  losetup       : %6d us\n' "$theirs_us"
awk -v a="$ours_us" -v b="$theirs_us" 'BEGIN { printf "  ratio         : %.2fx losetup\n", a / b }'
echo "  (sparse-volume also reads the registry, verifies the content UUID and scans for an existing device)"
