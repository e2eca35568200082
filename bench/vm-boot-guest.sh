#!/bin/bash
# The guest's half of bench/vm-boot.sh (runs as root in the test VM):
#
#   vm-boot-guest.sh setup COUNT SIZE   COUNT ext4 volumes of SIZE, enabled,
#                                       each with an fstab consumer (UUID=),
#                                       and the peer's template unit enabled
#                                       for each backing file
#   vm-boot-guest.sh measure VARIANT    after a boot: one JSON line with when
#                                       the volume units and the consumers'
#                                       mounts of this boot started and
#                                       became active (VARIANT: sparse-volume
#                                       or losetup, whose units are measured)
set -euo pipefail

uuids=/root/bench-uuids
mounts=/srv/bench

setup() {
    local count=$1 size=$2 i uuid
    : >"$uuids"
    mkdir -p "$mounts"
    for ((i = 1; i <= count; i++)); do
        uuid=$(cat /proc/sys/kernel/random/uuid)
        sparse-volume create --size "$size" --uuid "$uuid" --name "bench-$i" >/dev/null
        echo "$uuid" >>"$uuids"
        mkdir -p "$mounts/$i"
        # nofail, as consumers of loop devices are usually mounted: a
        # volume that does not come is then a measured absence, not an
        # emergency shell.
        echo "UUID=$uuid $mounts/$i ext4 defaults,nofail 0 0" >>/etc/fstab
    done
    install -m 0644 /root/losetup-field@.service /etc/systemd/system/
    sed 's/^/losetup-field@/; s/$/.service/' "$uuids" | xargs systemctl enable --quiet
    sparse-volume list --json | python3 -c '
import json, sys
volumes = [v for v in json.load(sys.stdin)["volumes"] if v["enabled"]]
if len(volumes) != int(sys.argv[1]):
    sys.exit(f"{len(volumes)} enabled volumes registered, not {sys.argv[1]}")
' "$count"
}

measure() {
    local variant=$1 state units=() mount_units=() i=0 uuid
    state=$(timeout 900 systemctl is-system-running --wait || true)
    while read -r uuid; do
        i=$((i + 1))
        case $variant in
            sparse-volume) units+=("sparse-volume@$uuid.service") ;;
            losetup) units+=("losetup-field@$uuid.service") ;;
            *) echo "unknown variant $variant" >&2; exit 2 ;;
        esac
        mount_units+=("$(systemd-escape --path --suffix=mount "$mounts/$i")")
    done <"$uuids"
    # shellcheck disable=SC2016 # the program given to python3 is Python
    {
        echo "variant=$variant"
        echo "system=$state"
        echo "kernel=$(uname -r)"
        echo "systemd=$(systemctl --version | head -n 1)"
        echo "startup=$(systemd-analyze time 2>/dev/null | head -n 1)"
        # Times below are counted from here, so the kernel's and the
        # initrd's share of the boot (the same for both sides) drops out.
        systemctl show -p UserspaceTimestampMonotonic
        # Consumers mounted from a loop device, on either side.
        echo "loop_mounts=$(findmnt -rn -o SOURCE,TARGET |
            awk -v under="$mounts/" 'index($2, under) == 1 && $1 ~ /^\/dev\/loop/' | wc -l)"
        echo "units"
        systemctl show -p Id -p ActiveState -p InactiveExitTimestampMonotonic \
            -p ActiveEnterTimestampMonotonic -p CPUUsageNSec "${units[@]}"
        echo "mounts"
        systemctl show -p Id -p ActiveState -p InactiveExitTimestampMonotonic \
            -p ActiveEnterTimestampMonotonic "${mount_units[@]}"
    } | python3 -c '
import json, statistics, sys

text = sys.stdin.read()
header, _, rest = text.partition("\nunits\n")
unit_text, _, mount_text = rest.partition("\nmounts\n")
info = dict(line.split("=", 1) for line in header.splitlines())

def blocks(text):
    """`systemctl show` of several units: one block of KEY=VALUE each."""
    return [
        dict(line.split("=", 1) for line in block.splitlines())
        for block in text.strip().split("\n\n")
        if block.strip()
    ]

groups = {"units": blocks(unit_text), "mounts": blocks(mount_text)}

def cpu_seconds(entries):
    """CPU time of the units (their processes), None without accounting."""
    used = [e.get("CPUUsageNSec", "") for e in entries]
    if not used or not all(u.isdigit() for u in used):
        return None
    return sum(int(u) for u in used) / 1e9

def span(entries):
    active = [e for e in entries if e.get("ActiveState") == "active"]
    starts = [int(e["InactiveExitTimestampMonotonic"]) for e in active]
    ends = [int(e["ActiveEnterTimestampMonotonic"]) for e in active]
    return active, starts, ends

units, unit_starts, unit_ends = span(groups["units"])
mounts, _, mount_ends = span(groups["mounts"])
first = min(unit_starts) if unit_starts else None
userspace = int(info["UserspaceTimestampMonotonic"])
report = {
    "variant": info["variant"],
    "system_state": info["system"],
    "kernel": info["kernel"],
    "systemd": info["systemd"],
    "startup": info["startup"],
    "volumes": len(groups["units"]),
    "units_active": len(units),
    "mounts_active": len(mounts),
    "loop_mounts": int(info["loop_mounts"]),
    "unit_cpu_s": cpu_seconds(groups["units"]),
    "unit_median_s": statistics.median(
        (end - start) / 1e6 for start, end in zip(unit_starts, unit_ends)
    ) if units else None,
    "first_unit_started_s": (first - userspace) / 1e6 if first else None,
    "first_to_last_active_s": (max(unit_ends) - first) / 1e6 if first else None,
    "first_to_last_mounted_s": (max(mount_ends) - first) / 1e6 if first and mount_ends else None,
    "last_mounted_s": (max(mount_ends) - userspace) / 1e6 if mount_ends else None,
}
print(json.dumps(report))
'
}

case ${1:-} in
    setup) setup "$2" "$3" ;;
    measure) measure "$2" ;;
    *)
        echo "usage: $0 setup COUNT SIZE | measure sparse-volume|losetup" >&2
        exit 2
        ;;
esac
