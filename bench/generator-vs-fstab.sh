#!/usr/bin/env bash
# One generator run over N volumes: sparse-volume-generator against
# systemd-fstab-generator over an fstab with N entries, side by side.
#
#   bench/generator-vs-fstab.sh [volumes] [runs]
set -euo pipefail
cd "$(dirname "$0")/.."

volumes=${1:-100}
runs=${2:-200}
cargo build --release --locked -q -p sparse-volume-generator
# Where cargo put it (CARGO_TARGET_DIR, relative to here as for cargo).
ours=$(realpath -m "${CARGO_TARGET_DIR:-target}")/release/sparse-volume-generator
theirs=$(command -v systemd-fstab-generator || echo /lib/systemd/system-generators/systemd-fstab-generator)
[ -x "$theirs" ] || { echo "systemd-fstab-generator not found (package systemd)" >&2; exit 1; }

# Generators write to /run, a tmpfs: measure there, not on a disk.
work=$(mktemp -d -p /dev/shm)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/root/etc/sparse-volume/volumes.d" "$work/out"
: > "$work/fstab"
for i in $(seq "$volumes"); do
    uuid=$(cat /proc/sys/kernel/random/uuid)
    cat > "$work/root/etc/sparse-volume/volumes.d/$uuid.toml" <<TOML
uuid = "$uuid"
path = "/var/lib/sparse-volume/$uuid"
size = 1073741824
mode = "filesystem"
fs_type = "ext4"
enabled = true
TOML
    echo "UUID=$uuid /srv/vol$i ext4 defaults 0 2" >> "$work/fstab"
done

now() { date +%s%N; }
run_ours() { rm -rf "$work/out"/*; SPARSE_VOLUME_ROOT=$work/root "$ours" "$work/out" "$work/out" "$work/out"; }
run_theirs() { rm -rf "$work/out"/*; SYSTEMD_FSTAB=$work/fstab SYSTEMD_LOG_LEVEL=err "$theirs" "$work/out" "$work/out" "$work/out"; }

measure() {
    local start end
    start=$(now)
    for _ in $(seq "$runs"); do "$@"; done
    end=$(now)
    echo $(( (end - start) / runs / 1000 ))
}

run_ours; run_theirs
ours_us=$(measure run_ours)
theirs_us=$(measure run_theirs)
printf 'generator run over %d volumes / fstab entries, %d runs each\n' "$volumes" "$runs"
printf '  sparse-volume-generator : %6d us\n' "$ours_us"
printf '  systemd-fstab-generator : %6d us\n' "$theirs_us"
awk -v a="$ours_us" -v b="$theirs_us" 'BEGIN { printf "  ratio                   : %.2fx systemd-fstab-generator\n", a / b }'
echo "  (both include the shell's rm of the output directory between runs)"
